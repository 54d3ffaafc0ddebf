"""What ``to_inference_data`` holds in memory: the peak resident memory of the export against
the bytes of the groups it builds, in fresh processes.

The export's large groups have one value per draw and data row: ``log_likelihood`` (float64,
what ``az.loo`` needs) and ``posterior_predictive`` (the model's dtype). Each command builds
Pyro's tutorial-style regression (5 features, ``sigma ~ HalfNormal``, ``obs=y`` in a plate sized
from the data) on ``--rows`` rows and exports ``--chains`` x ``--draws`` draws of it (a chains
source with fixed draws: no sampling), in a fresh Python process; the table gives the groups'
bytes, the growth of the process's peak resident set over the export, and their ratio. With
``--against DIR`` (another checkout, e.g. ``git worktree add --detach /tmp/before 1a7b0c7``,
before the export wrote each draw into one array per site instead of stacking per-draw arrays at
the end) the same export is made from that checkout too.

Run: ``python benchmarks/export_memory.py [--rows 20000] [--chains 4] [--draws 500]
[--against DIR]``; writes ``benchmarks/results/export_memory.json``.
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
import json, resource, sys, time, warnings
sys.path.insert(0, {checkout!r})
from dataclasses import dataclass, field
from typing import Any
import numpy as np, pyro, pyro.distributions as dist, torch
from pyro_sgmcmc import to_inference_data

torch.set_num_threads(1)
generator = torch.Generator().manual_seed(0)
x = torch.randn({rows}, 5, generator=generator)
y = x @ torch.ones(5) + torch.randn({rows}, generator=generator)

def model(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([5]).to_event(1))
    s = pyro.sample("s", dist.HalfNormal(1.0))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(x @ w, s), obs=y)

@dataclass
class Chains:
    samples: dict
    sample_stats: dict
    model: Any
    args: tuple
    kwargs: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)

shape = ({chains}, {draws})
w = 1.0 + 0.01 * torch.randn(*shape, 5, generator=generator)
source = Chains({{"w": w, "s": torch.ones(shape)}}, {{"lp": np.zeros(shape)}}, model, (x, y))
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
before, began = peak(), time.perf_counter()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    idata = to_inference_data(source)
seconds = time.perf_counter() - began
groups = sum(
    value.nbytes for group in ("log_likelihood", "posterior_predictive")
    for value in idata[group].data_vars.values()
) / 2**20
print(json.dumps({{"before": before, "after": peak(), "groups": groups, "seconds": seconds}}))
"""


def measure(checkout: Path, rows: int, chains: int, draws: int) -> dict:
    """One fresh process's peak resident memory before and after the export."""
    code = CHILD.format(checkout=str(checkout), rows=rows, chains=chains, draws=draws)
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, cwd=tempfile.gettempdir())  # fmt: skip
    found = json.loads(done.stdout.strip().splitlines()[-1])
    growth = found["after"] - found["before"]
    return {"rows": rows, "chains": chains, "draws": draws,
            "groups_mb": round(found["groups"], 1), "peak_growth_mb": round(growth, 1),
            "ratio_to_groups": round(growth / found["groups"], 2),
            "seconds": round(found["seconds"], 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--draws", type=int, default=500)
    parser.add_argument("--against", type=Path, help="another checkout, run the same way")
    args = parser.parse_args()
    rows = [{"checkout": name, **measure(path, args.rows, args.chains, args.draws)}
            for name, path in checkouts(args.against).items()]  # fmt: skip
    print_table(rows, ["checkout", "rows", "chains", "draws", "groups_mb", "peak_growth_mb",
                       "ratio_to_groups", "seconds"])  # fmt: skip
    print(f"load {load_average()}")
    path = write_json("export_memory", {"settings": {k: str(v) for k, v in vars(args).items()},
                                        "rows": rows})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
