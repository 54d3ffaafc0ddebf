"""Reference posterior predictive for workload W2: a long Pyro NUTS run, made once.

Stores the predictive mean draws f_s(x_test) of shape (S, 200) and the run's conditions in
``benchmarks/results/w2_reference.pt`` / ``w2_reference.json``; ``w2_small_bnn.py`` reads them.
Skips the run if the reference exists (``--force`` to redo it).

Run: ``python benchmarks/w2_reference.py [--warmup 200 --samples 200]``.
"""

from __future__ import annotations

import argparse
import time

import pyro
import torch
from _common import RESULTS, load_average, sinusoid_w2, w2_model, write_json
from pyro.infer import MCMC, NUTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    path = RESULTS / "w2_reference.pt"
    if path.exists() and not args.force:
        print(f"{path} exists; use --force to recompute")
        return
    data = sinusoid_w2()
    model = w2_model()
    pyro.set_rng_seed(args.seed)
    load_before = load_average()
    mcmc = MCMC(NUTS(model), num_samples=args.samples, warmup_steps=args.warmup)
    start = time.perf_counter()
    mcmc.run(data["x"], data["y"])
    seconds = time.perf_counter() - start
    samples = mcmc.get_samples()
    with torch.no_grad():
        f = model.functional_forward(samples, data["x_test"]).squeeze(-1)  # (S, 200)
    RESULTS.mkdir(parents=True, exist_ok=True)
    torch.save({"f_test": f, "samples": samples}, path)
    write_json(
        "w2_reference",
        {
            "sampler": "pyro NUTS (1 chain)",
            "warmup": args.warmup,
            "samples": args.samples,
            "seconds": seconds,
            "load_average_before": load_before,
            "load_average_after": load_average(),
        },
    )
    print(f"NUTS {args.warmup}+{args.samples}: {seconds:.1f} s; wrote {path}")


if __name__ == "__main__":
    main()
