"""Peak memory of a long SG-MCMC run on a large problem: 1e6 rows, ~1e5 parameters.

A BayesianMLP (200 inputs, 500 tanh units, one output: 101,001 weights) on 1,000,000 synthetic
regression rows, sampled by SGHMC with minibatches of 1000 through
:class:`pyro_sgmcmc.inference.checkpoint.ResumableMCMC`. What keeps the memory down:

* thinning (``num_steps_per_sample``): only every 10th position is kept;
* ``keep_draws=False``: the kernel holds no second reference to the kept draws;
* ``draw_dtype=torch.float16``: the kept draws are stored at 2 bytes a number;
* a checkpoint file that holds the whole state, written atomically at the end of each chain.

Peak resident memory (``resource.getrusage``, the maximum over the process's life) is printed and
written with the settings to ``benchmarks/results/memory_large_run.json``. The data alone take
0.8 GB; the kernel's set-up evaluates the model once on the full data, which is the largest
transient (one full forward pass: 1e6 x 500 activations).

Run: ``python benchmarks/memory_large_run.py`` (``--rows 100000`` for a quick look).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from pyro_sgmcmc import SGHMC
from pyro_sgmcmc.inference.checkpoint import ResumableMCMC
from pyro_sgmcmc.nn import BayesianMLP

RESULTS = Path(__file__).resolve().parent / "results"
LIMIT_GIB = 24.0


def peak_rss_gib() -> float:
    """Peak resident set size of this process so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024
    return peak * scale / 2**30


def synthetic_regression(rows: int, features: int, seed: int = 0):
    """Rows from a random tanh teacher network plus Gaussian noise (float32)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, features, generator=generator)
    teacher = torch.randn(features, 8, generator=generator) / features**0.5
    y = torch.tanh(x @ teacher).sum(1) + 0.1 * torch.randn(rows, generator=generator)
    return x, y


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--steps-per-sample", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--samples", type=int, default=25)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    start = time.perf_counter()
    x, y = synthetic_regression(args.rows, args.features)
    after_data = peak_rss_gib()
    model = BayesianMLP(args.features, [args.hidden], 1, activation="tanh")
    num_parameters = args.features * args.hidden + 2 * args.hidden + 1
    kernel = SGHMC(
        model,
        learning_rate=1e-3,
        friction=0.1,
        batch_size=args.batch_size,
        num_steps_per_sample=args.steps_per_sample,
        keep_draws=False,
        seed=0,
    )
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = Path(directory) / "large.ckpt"
        mcmc = ResumableMCMC(
            kernel,
            num_samples=args.samples,
            warmup_steps=args.warmup,
            disable_progbar=True,
            checkpoint_path=checkpoint,
            draw_dtype=torch.float16,
        )
        sampling_start = time.perf_counter()
        mcmc.run(x, y)
        sampling_seconds = time.perf_counter() - sampling_start
        checkpoint_mib = checkpoint.stat().st_size / 2**20
    samples = mcmc.get_samples()
    stored = sum(v.numel() * v.element_size() for v in samples.values())
    steps = (args.warmup + args.samples) * args.steps_per_sample
    result = {
        "rows": args.rows,
        "features": args.features,
        "hidden": args.hidden,
        "parameters": num_parameters,
        "batch_size": args.batch_size,
        "gradient_steps": steps,
        "kept_draws": args.samples,
        "draw_dtype": "float16",
        "stored_draws_mib": stored / 2**20,
        "checkpoint_mib": checkpoint_mib,
        "data_gib": (x.numel() + y.numel()) * 4 / 2**30,
        "peak_rss_after_data_gib": after_data,
        "peak_rss_gib": peak_rss_gib(),
        "limit_gib": LIMIT_GIB,
        "sampling_seconds": sampling_seconds,
        "total_seconds": time.perf_counter() - start,
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
    }
    assert samples["layers.0.weight"].shape[0] == args.samples
    print(json.dumps(result, indent=2))
    print(
        f"peak RSS {result['peak_rss_gib']:.2f} GiB for {args.rows:,} rows x {num_parameters:,} "
        f"parameters ({steps} steps, {result['sampling_seconds']:.0f} s); limit {LIMIT_GIB} GiB"
    )
    if args.rows == 1_000_000:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "memory_large_run.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
