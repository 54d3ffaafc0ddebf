"""What the warm-up's thinning measurement costs for a warm-up of any length: seconds and peak
memory of ``ThinningMeter.measure`` in fresh processes.

With the thinning left to the kernel, the warm-up records a few series per chain over its last
quarter (4 random projections of the position and their squares; for a network, the potential
on fixed rows) and estimates their autocorrelation time. Each measurement here records 4 chains
of AR(1) series (coefficient 0.95) over the window of a warm-up of ``--warmups`` gradient steps
(and a network's single series over ``--network-warmup`` steps) and times ``measure()``; the
peak resident memory it adds comes from ``getrusage`` (Linux: KiB). With ``--against DIR``
(another checkout, e.g. ``git worktree add --detach /tmp/before 669ab8a``, when the measurement
used Pyro's ``effective_sample_size``, whose cumulative minimum forms an n/2 x n/2 matrix per
series) the same measurements are made from that checkout too. Mind the memory: the old
estimator needs about 7.6 GB at 80,000 steps and grows with the square of the warm-up.

Run: ``python benchmarks/thinning_measurement.py [--warmups 4000 40000 80000]
[--network-warmup 125000] [--against DIR]``; writes
``benchmarks/results/thinning_measurement.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import load_average, print_table, write_json

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {checkout!r})
import torch
from pyro_sgmcmc.engine.thinning import ThinningMeter

network = {network}
meter = ThinningMeter({warmup}, function_space=network)
shape = (4, 1) if network else (4, 4)
generator = torch.Generator().manual_seed(0)
value = torch.zeros(shape, dtype=torch.float64)
rows = []
for _ in range(meter.end - meter.start):
    value = 0.95 * value + torch.randn(shape, generator=generator, dtype=torch.float64)
    rows.append(value)
if hasattr(meter, "record"):
    for row in rows:
        meter.record(row)
else:  # checkouts before the buffer kept a list
    meter.series = rows
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
times = meter.measure()
seconds = time.perf_counter() - start
added = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({{"measured": len(rows), "seconds": seconds, "added_mb": added / 1024,
                  "times": [float(t) for t in times]}}))
"""


def measure(checkout: Path, warmup: int, network: bool) -> dict:
    """One fresh process's measurement of a warm-up of ``warmup`` gradient steps."""
    code = CHILD.format(checkout=str(checkout), warmup=warmup, network=network)
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, cwd=tempfile.gettempdir())  # fmt: skip
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {"warmup_steps": warmup, "series": "network" if network else "projections",
            "measured_steps": found["measured"], "seconds": round(found["seconds"], 3),
            "added_mb": round(found["added_mb"], 1),
            "median_time": round(sorted(found["times"])[len(found["times"]) // 2], 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmups", type=int, nargs="+", default=[4000, 40000, 80000])
    parser.add_argument("--network-warmup", type=int, default=125000)
    parser.add_argument("--against", type=Path, help="another checkout, measured the same way")
    args = parser.parse_args()
    checkouts = {"this checkout": Path(__file__).resolve().parent.parent}
    if args.against is not None:
        checkouts[f"{args.against}"] = args.against.resolve()
    cases = [(warmup, False) for warmup in args.warmups] + [(args.network_warmup, True)]
    rows = [{"checkout": name, **measure(path, warmup, network)}
            for warmup, network in cases for name, path in checkouts.items()]  # fmt: skip
    print_table(rows, ["checkout", "warmup_steps", "series", "measured_steps", "seconds",
                       "added_mb", "median_time"])  # fmt: skip
    print(f"load {load_average()}")
    settings = {k: str(v) for k, v in vars(args).items()}
    path = write_json("thinning_measurement", {"settings": settings, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
