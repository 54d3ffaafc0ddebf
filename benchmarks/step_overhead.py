"""Seconds per SGHMC step through ``pyro.infer.MCMC`` against a plain torch SGD step.

Workload (issue W1): MLP 784-100-10, sigmoid hidden layer, N(0, 1) priors, Fashion-MNIST train
(60000 rows, pixels / 255; synthetic data of the same shape when the data set is missing), batch
500. The baseline is a plain torch step on the same net and batch: zero_grad, forward,
cross-entropy x N/B + Gaussian prior, backward, ``torch.optim.SGD.step``. Both fetch their
minibatch rows by index. The two are interleaved, ``--repeats`` x ``--steps`` steps each; the
table reports medians and their ratio. SGHMC is timed inside ``MCMC.run`` with its ``hook_fn``
(from the first kept draw to the last), so set-up is excluded from the steady-state figure and
reported separately.

``BayesianMLP`` gives the kernel its gradient in closed form (no autograd graph) and gathers the
minibatch rows with ``index_select``; a second baseline gathers its rows that way too (the ratio
against it is shown beside the main one), and the row "autograd log_joint" times the kernel with
the closed-form gradient switched off, the path of a model that defines only ``log_joint``.
Both draw the 79,510 Gaussians of the SGHMC noise every step (about 0.28 ms here), which the
noise-free SGD step does not.

Run: ``python benchmarks/step_overhead.py [--steps 500 --repeats 5]``; writes
``benchmarks/results/step_overhead.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _common import (
    fashion_mnist_or_synthetic,
    load_average,
    print_table,
    time_torch_sgd_step,
    write_json,
)
from pyro.infer import MCMC

from pyro_sgmcmc import SGHMC
from pyro_sgmcmc.nn import BayesianMLP

TARGET = 1.15


class AutogradMLP(BayesianMLP):
    """The same network with its closed-form gradient switched off: autograd through
    ``log_joint``, the path of any model that defines ``log_joint`` but no gradient."""

    @property
    def has_analytic_gradient(self) -> bool:
        return False


def time_baseline(x, y, batch_size, steps, generator, gather="index") -> float:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(784, 100), torch.nn.Sigmoid(), torch.nn.Linear(100, 10)
    )
    return time_torch_sgd_step(net, x, y, batch_size, steps, generator, gather)


def time_sghmc(model, x, y, batch_size, steps, potential) -> tuple[float, float]:
    steps_per_sample = 50
    draws = steps // steps_per_sample + 1
    stamps: list[float] = []
    kernel = SGHMC(
        model,
        learning_rate=1e-3,
        friction=0.05,
        batch_size=batch_size,
        num_steps_per_sample=steps_per_sample,
        potential=potential,
        seed=0,
    )
    mcmc = MCMC(
        kernel,
        num_samples=draws,
        warmup_steps=0,
        disable_progbar=True,
        hook_fn=lambda *args: stamps.append(time.perf_counter()),
    )
    start = time.perf_counter()
    mcmc.run(x, y)
    total = time.perf_counter() - start
    per_step = (stamps[-1] - stamps[0]) / ((draws - 1) * steps_per_sample)
    setup = stamps[0] - start - per_step * steps_per_sample
    return per_step, setup if total > 0 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--trace", action="store_true", help="also time Pyro's trace potential")
    parser.add_argument(
        "--no-autograd", action="store_true", help="skip the autograd log_joint row"
    )
    args = parser.parse_args()

    x, y, source = fashion_mnist_or_synthetic()
    model = BayesianMLP(784, [100], 10, activation="sigmoid", likelihood="categorical")
    autograd_model = AutogradMLP(784, [100], 10, activation="sigmoid", likelihood="categorical")
    generator = torch.Generator().manual_seed(0)
    baseline, baseline_select, fast, autograd, trace, setups = [], [], [], [], [], []
    for _ in range(args.repeats):
        baseline.append(time_baseline(x, y, args.batch_size, args.steps, generator))
        baseline_select.append(
            time_baseline(x, y, args.batch_size, args.steps, generator, "index_select")
        )
        per_step, setup = time_sghmc(model, x, y, args.batch_size, args.steps, "auto")
        fast.append(per_step)
        setups.append(setup)
        if not args.no_autograd:
            autograd.append(
                time_sghmc(autograd_model, x, y, args.batch_size, args.steps, "log_joint")[0]
            )
        if args.trace:
            trace.append(time_sghmc(model, x, y, args.batch_size, args.steps, "trace")[0])

    base = statistics.median(baseline)
    base_select = statistics.median(baseline_select)
    rows = [
        {"method": "torch SGD step (baseline)", "ms/step": f"{1e3 * base:.3f}", "ratio": "1.00"},
        {
            "method": "torch SGD step, index_select gather",
            "ms/step": f"{1e3 * base_select:.3f}",
            "ratio": f"{base_select / base:.2f}",
        },
        {
            "method": "SGHMC via MCMC, fast path",
            "ms/step": f"{1e3 * statistics.median(fast):.3f}",
            "ratio": f"{statistics.median(fast) / base:.2f} "
            f"({statistics.median(fast) / base_select:.2f} vs index_select SGD)",
            "target": f"<= {TARGET}",
            "pass": statistics.median(fast) / base <= TARGET,
        },
    ]
    if autograd:
        rows.append(
            {
                "method": "SGHMC via MCMC, autograd log_joint",
                "ms/step": f"{1e3 * statistics.median(autograd):.3f}",
                "ratio": f"{statistics.median(autograd) / base:.2f}",
            }
        )
    if trace:
        rows.append(
            {
                "method": "SGHMC via MCMC, Pyro trace",
                "ms/step": f"{1e3 * statistics.median(trace):.3f}",
                "ratio": f"{statistics.median(trace) / base:.2f}",
            }
        )
    print(f"data: {source}; batch {args.batch_size}; {args.repeats} x {args.steps} steps")
    print(f"SGHMC set-up (model inspection, initialisation): {statistics.median(setups):.2f} s")
    print_table(rows, ["method", "ms/step", "ratio", "target", "pass"])
    path = write_json(
        "step_overhead",
        {
            "data": source,
            "batch_size": args.batch_size,
            "steps": args.steps,
            "repeats": args.repeats,
            "baseline_s_per_step": baseline,
            "baseline_index_select_s_per_step": baseline_select,
            "ratio_fast_vs_index_select_baseline": statistics.median(fast) / base_select,
            "sghmc_fast_s_per_step": fast,
            "sghmc_autograd_s_per_step": autograd,
            "sghmc_trace_s_per_step": trace,
            "sghmc_setup_s": setups,
            "ratio_fast": statistics.median(fast) / base,
            "ratio_autograd": statistics.median(autograd) / base if autograd else None,
            "ratio_trace": statistics.median(trace) / base if trace else None,
            "target": TARGET,
            "load_average": load_average(),
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
