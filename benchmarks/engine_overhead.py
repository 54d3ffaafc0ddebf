"""The engine's own cost per step, against another checkout of the package (a regression check).

On W2's network (1-20-20-1 tanh ``BayesianMLP``, 32 points, full batch) the gradient is a few
small batched matrix products, so a step's time is mostly the engine around it: the update rule,
the noise, the divergence checks, the bookkeeping. This script times 8 SGHMC chains
(``step_size=3e-4``, ``friction=0.3``, thinning 10) for 1000 steps through ``run_chains``, for
this checkout and for the one given with ``--against``, in alternating child processes (one
thread each, pinned to the same core when ``taskset`` exists), and prints the per-round ratio.
With ``--defaults`` the chains run SGHMC's defaults instead (thinning 10): the adaptive warm-up
chooses the step, the preconditioner and the friction, which the sampling steps then use.

Make the other checkout with ``git worktree add --detach /tmp/first-release 3200f91`` (the
first release's engine, before the kernels and ``run_chains`` shared one), then run
``python benchmarks/engine_overhead.py --against /tmp/first-release``; writes
``results/engine_overhead.json``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from _common import load_average, print_table, write_json

HERE = Path(__file__).resolve().parent
STEPS, CHAINS = 1000, 8


def child(tree: str, repeats: int, defaults: bool = False) -> None:
    """In a fresh process: import the package from ``tree`` and print the sampling times."""
    sys.path[:0] = [tree, str(Path(tree) / "benchmarks")]
    import torch

    torch.set_num_threads(1)
    from _common import sinusoid_w2, w2_model
    from pyro.infer.autoguide.initialization import init_to_uniform

    import pyro_sgmcmc
    from pyro_sgmcmc.inference.vectorized import run_chains

    assert Path(pyro_sgmcmc.__file__).resolve().is_relative_to(Path(tree).resolve())
    data = sinusoid_w2()
    options = {"step_size": 3e-4, "friction": 0.3, "num_steps_per_sample": 10,
               "init_strategy": init_to_uniform}  # fmt: skip
    if defaults:  # the adaptive warm-up's frozen settings: its step, preconditioner, friction
        options = {"num_steps_per_sample": 10, "init_strategy": init_to_uniform}
    warmup, draws = STEPS // 40, STEPS // 10 - STEPS // 40
    first_release = "model" in inspect.signature(run_chains).parameters

    def run() -> float:
        if first_release:  # run_chains(model, x, y, kernel=...) before the engine was shared
            result = run_chains(w2_model(), data["x"], data["y"], num_chains=CHAINS,
                                num_samples=draws, warmup_steps=warmup, seed=0, kernel="sghmc",
                                **options)  # fmt: skip
        else:
            kernel = pyro_sgmcmc.SGHMC(w2_model(), seed=0, **options)
            result = run_chains(kernel, data["x"], data["y"], num_chains=CHAINS,
                                num_samples=draws, warmup_steps=warmup)  # fmt: skip
        return result.sampling_time

    run()  # warm caches and lazy imports
    print(json.dumps(sorted(run() for _ in range(repeats))))


def timed(tree: Path, repeats: int, core: str | None, defaults: bool) -> list[float]:
    command = [sys.executable, str(HERE / "engine_overhead.py"), "--child", str(tree),
               "--repeats", str(repeats), *(["--defaults"] if defaults else [])]  # fmt: skip
    if core is not None:
        command = ["taskset", "-c", core, *command]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def commit(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)  # fmt: skip
    return out.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="another checkout of the package")
    parser.add_argument("--rounds", type=int, default=4, help="alternations of the two trees")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per child process")
    parser.add_argument("--defaults", action="store_true",
                        help="SGHMC with its adaptive warm-up's step, preconditioner and friction "
                             "(after 250 warm-up steps) instead of a hand-given step")  # fmt: skip
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.repeats, args.defaults)
        return
    if args.against is None:  # e.g. under `nox -s benchmarks`, which passes no arguments
        print("engine_overhead: skipped, give --against PATH (see the module docstring)")
        return
    if not (args.against / "pyro_sgmcmc").is_dir():
        parser.error(f"--against must be a checkout of pyro_sgmcmc, got {args.against}")
    here = HERE.parent
    core = "1" if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else None
    load_before = load_average()
    ours, theirs, ratios = [], [], []
    for _ in range(args.rounds):
        other = statistics.median(timed(args.against, args.repeats, core, args.defaults))
        this = statistics.median(timed(here, args.repeats, core, args.defaults))
        theirs.append(other)
        ours.append(this)
        ratios.append(this / other)
    rows = [
        {"tree": f"this checkout ({commit(here)})", "s per 1000 steps (median of rounds)":
         f"{statistics.median(ours):.3f}", "fastest round": f"{min(ours):.3f}"},
        {"tree": f"{args.against} ({commit(args.against)})", "s per 1000 steps (median of rounds)":
         f"{statistics.median(theirs):.3f}", "fastest round": f"{min(theirs):.3f}"},
    ]  # fmt: skip
    settings = "the adaptive warm-up's settings" if args.defaults else "a hand-given step"
    print(f"W2 network, {CHAINS} SGHMC chains, {STEPS} steps with {settings}, one thread; "
          f"load {load_before}")  # fmt: skip
    print_table(rows, list(rows[0]))
    ratio = statistics.median(ratios)
    print(f"this / other per round: {', '.join(f'{r:.3f}' for r in ratios)} (median {ratio:.3f})")
    write_json("engine_overhead", {"rows": rows, "ratios": ratios, "ratio": ratio,
                                   "defaults": args.defaults,
                                   "against": str(args.against), "load_average": load_before,
                                   "load_average_after": load_average()})  # fmt: skip


if __name__ == "__main__":
    main()
