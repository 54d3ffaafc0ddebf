"""What a long run holds in memory: the growth of the process's resident memory over the
sampling phase, against the draws' own bytes, in fresh processes.

A run keeps its draws (a 784-100-10 network's 79,510 weights: 0.32 MB a draw in float32) and
little else that grows. Each command samples the network of ``w3_fashion_mnist.py`` with SGHMC's
defaults (one chain, batch 32, 3,000 random rows) for ``--steps`` gradient steps per kept draw
(1,875: one epoch of Fashion-MNIST's 60,000 images) and ``--draws`` draws after a 20-draw
warm-up, in a fresh Python process, sampling the process's resident set size (``/proc``, so
Linux only) every half second; the table gives its growth from the first kept draw to the last,
per kept draw, and the draws' own bytes. With ``--against DIR`` (another checkout, e.g. ``git
worktree add --detach /tmp/before 6891f5b``, before the configurational temperature meter kept
running statistics instead of every term) the same run is made from that checkout too.

Run: ``python benchmarks/run_memory.py [--draws 40] [--steps 1875] [--against DIR]``; writes
``benchmarks/results/run_memory.json``.
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
import json, sys, threading, time, warnings
sys.path.insert(0, {checkout!r})
import torch
from pyro_sgmcmc import SGHMC, run_chains
from pyro_sgmcmc.nn import BayesianMLP, NormalPrior

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

torch.set_num_threads(1)
generator = torch.Generator().manual_seed(0)
x = torch.rand(3000, 784, generator=generator)
y = torch.randint(0, 10, (3000,), generator=generator)
model = BayesianMLP(784, [100], 10, activation="sigmoid", likelihood="categorical",
                    prior=NormalPrior(1.0))
kernel = SGHMC(model, batch_size=32, num_steps_per_sample={steps}, seed=0)
marks = []
def mark(draw, values):
    marks.append(resident())
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    result = run_chains(kernel, x, y, num_chains=1, num_samples={draws}, warmup_steps=20,
                        callback=mark)
weights = sum(v[0, 0].numel() for v in result.get_samples(group_by_chain=True).values())
print(json.dumps({{"first": marks[0], "last": marks[-1], "weights": weights}}))
"""


def measure(checkout: Path, draws: int, steps: int) -> dict:
    """One fresh process's resident memory at the first and last kept draw."""
    code = CHILD.format(checkout=str(checkout), draws=draws, steps=steps)
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, cwd=tempfile.gettempdir())  # fmt: skip
    found = json.loads(done.stdout.strip().splitlines()[-1])
    growth = found["last"] - found["first"]
    own = 4 * found["weights"] * (draws - 1) / 2**20
    return {"draws": draws, "steps_per_draw": steps, "growth_mb": round(growth, 1),
            "per_draw_mb": round(growth / (draws - 1), 2), "draws_own_mb": round(own, 1),
            "ratio_to_own": round(growth / own, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=40)
    parser.add_argument("--steps", type=int, default=1875, help="gradient steps per kept draw")
    parser.add_argument("--against", type=Path, help="another checkout, run the same way")
    args = parser.parse_args()
    rows = [{"checkout": name, **measure(path, args.draws, args.steps)}
            for name, path in checkouts(args.against).items()]  # fmt: skip
    print_table(rows, ["checkout", "draws", "steps_per_draw", "growth_mb", "per_draw_mb",
                       "draws_own_mb", "ratio_to_own"])  # fmt: skip
    print(f"load {load_average()}")
    path = write_json("run_memory", {"settings": {k: str(v) for k, v in vars(args).items()},
                                     "rows": rows})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
