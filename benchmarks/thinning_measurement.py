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
series) the same measurements are made from that checkout too. ``--whole-run W`` adds a whole
run per checkout: ``run_chains(SGHMC(model, batch_size=20, seed=0), y, num_chains=2,
num_samples=50, warmup_steps=W)`` on a normal mean with 200 rows, the thinning chosen by the
warm-up (its wall time and peak resident memory). Mind the memory: the old
estimator needs about 7.6 GB at 80,000 steps and grows with the square of the warm-up.

Run: ``python benchmarks/thinning_measurement.py [--warmups 4000 40000 80000]
[--network-warmup 125000] [--whole-run 100000] [--against DIR]``; writes
``benchmarks/results/thinning_measurement.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import checkouts, load_average, print_table, write_json

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

WHOLE_RUN = """
import json, resource, sys, time, warnings
sys.path.insert(0, {checkout!r})
import pyro, pyro.distributions as dist, torch
from pyro_sgmcmc import SGHMC, run_chains

def model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y)

torch.set_num_threads(1)
y = torch.randn(200, generator=torch.Generator().manual_seed(0)) + 3.0
start = time.perf_counter()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    result = run_chains(SGHMC(model, batch_size=20, seed=0), y, num_chains=2, num_samples=50,
                        warmup_steps={warmup})
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"seconds": seconds, "peak_mb": peak,
                  "thinning": result.attrs["num_steps_per_sample"]}}))
"""


def _child(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, cwd=tempfile.gettempdir())  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def whole_run(checkout: Path, warmup: int) -> dict:
    """One fresh process's whole run with a warm-up of ``warmup`` one-step draws."""
    found = _child(WHOLE_RUN.format(checkout=str(checkout), warmup=warmup))
    return {"warmup_steps": warmup, "seconds": round(found["seconds"], 1),
            "peak_mb": round(found["peak_mb"]), "thinning": found["thinning"]}  # fmt: skip


def measure(checkout: Path, warmup: int, network: bool) -> dict:
    """One fresh process's measurement of a warm-up of ``warmup`` gradient steps."""
    found = _child(CHILD.format(checkout=str(checkout), warmup=warmup, network=network))
    return {"warmup_steps": warmup, "series": "network" if network else "projections",
            "measured_steps": found["measured"], "seconds": round(found["seconds"], 3),
            "added_mb": round(found["added_mb"], 1),
            "median_time": round(sorted(found["times"])[len(found["times"]) // 2], 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmups", type=int, nargs="+", default=[4000, 40000, 80000])
    parser.add_argument("--network-warmup", type=int, default=125000)
    parser.add_argument("--whole-run", type=int, metavar="W", help="warm-up of a whole run")
    parser.add_argument("--against", type=Path, help="another checkout, measured the same way")
    args = parser.parse_args()
    cases = [(warmup, False) for warmup in args.warmups] + [(args.network_warmup, True)]
    measured = checkouts(args.against)
    rows = [{"checkout": name, **measure(path, warmup, network)}
            for warmup, network in cases for name, path in measured.items()]  # fmt: skip
    print_table(rows, ["checkout", "warmup_steps", "series", "measured_steps", "seconds",
                       "added_mb", "median_time"])  # fmt: skip
    runs = []
    if args.whole_run is not None:
        runs = [{"checkout": name, **whole_run(path, args.whole_run)}
                for name, path in checkouts(args.against).items()]  # fmt: skip
        print_table(runs, ["checkout", "warmup_steps", "seconds", "peak_mb", "thinning"])
    print(f"load {load_average()}")
    settings = {k: str(v) for k, v in vars(args).items()}
    path = write_json("thinning_measurement",
                      {"settings": settings, "rows": rows, "whole_runs": runs})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
