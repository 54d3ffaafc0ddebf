"""A Bayesian network written the Pyro way, sampled at plain-torch speed.

Workload: the network of Pyro's documentation, written as it is there -- a ``PyroModule`` with
``PyroModule[nn.Linear]`` layers, ``PyroSample`` N(0, 1) priors on every weight and bias, the
logits computed on the rows given and ``with pyro.plate("data", x.shape[0]): pyro.sample("obs",
dist.Categorical(logits=logits), obs=y)`` (the plate sized from the data) -- 784-100-10 with a
tanh hidden layer, on Fashion-MNIST (60000 rows, pixels / 255; synthetic data of the same shape
when the data set is missing), batch 500.

Rows:

* the baseline, a plain torch step on the same net and batch: zero_grad, forward, cross-entropy
  x N/B + Gaussian prior, backward, ``torch.optim.SGD.step``, rows fetched with ``index_select``
  (about twice as fast as ``x[idx]``: the stronger baseline);
* SGHMC through ``pyro.infer.MCMC`` on the model above, the default (functional) potential and,
  for comparison, Pyro's trace path (``potential="trace"``);
* ``run_chains`` with 1 and 8 chains (seconds per step of all chains together).

Steady-state seconds per step are timed inside the run (from the first kept draw to the last),
the rows interleaved ``--repeats`` times; the table reports medians and ratios.

Run: ``python benchmarks/w1g_pyro_module.py [--steps 300 --repeats 3]``; writes
``benchmarks/results/w1g_pyro_module.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyro
import pyro.distributions as dist
import torch
from _common import (
    fashion_mnist_or_synthetic,
    load_average,
    print_table,
    time_torch_sgd_step,
    write_json,
)
from pyro.infer import MCMC
from pyro.nn import PyroModule, PyroSample
from torch import nn

from pyro_sgmcmc import SGHMC, run_chains

STEP_TARGET, CHAINS_TARGET = 1.2, 2.0


class DocsBNN(PyroModule):
    """The Bayesian network of Pyro's documentation, 784-100-10."""

    def __init__(self, in_dim: int = 784, hidden: int = 100, out_dim: int = 10) -> None:
        super().__init__()
        self.activation = nn.Tanh()
        self.layer1 = PyroModule[nn.Linear](in_dim, hidden)
        self.layer2 = PyroModule[nn.Linear](hidden, out_dim)
        self.layer1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([hidden, in_dim]).to_event(2))
        self.layer1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        self.layer2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([out_dim, hidden]).to_event(2))
        self.layer2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([out_dim]).to_event(1))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.layer2(self.activation(self.layer1(x)))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def time_baseline(x, y, batch_size, steps, generator) -> float:
    net = nn.Sequential(nn.Linear(784, 100), nn.Tanh(), nn.Linear(100, 10))
    return time_torch_sgd_step(net, x, y, batch_size, steps, generator)


def _kernel(batch_size: int, potential: str, steps_per_sample: int) -> SGHMC:
    return SGHMC(
        DocsBNN(),
        learning_rate=1e-3,
        batch_size=batch_size,
        num_steps_per_sample=steps_per_sample,
        potential=potential,
        seed=0,
    )


def time_mcmc(x, y, batch_size, steps, potential) -> float:
    steps_per_sample = 25
    draws = max(steps // steps_per_sample, 2) + 1
    stamps: list[float] = []
    mcmc = MCMC(
        _kernel(batch_size, potential, steps_per_sample),
        num_samples=draws,
        warmup_steps=0,
        disable_progbar=True,
        hook_fn=lambda *args: stamps.append(time.perf_counter()),
    )
    mcmc.run(x, y)
    return (stamps[-1] - stamps[0]) / ((draws - 1) * steps_per_sample)


def time_chains(x, y, batch_size, steps, num_chains) -> float:
    steps_per_sample = 25
    draws = max(steps // steps_per_sample, 2) + 1
    stamps: list[float] = []
    run_chains(
        _kernel(batch_size, "auto", steps_per_sample),
        x,
        y,
        num_chains=num_chains,
        num_samples=draws,
        warmup_steps=0,
        callback=lambda *args: stamps.append(time.perf_counter()),
    )
    return (stamps[-1] - stamps[0]) / ((draws - 1) * steps_per_sample)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    x, y, source = fashion_mnist_or_synthetic()
    generator = torch.Generator().manual_seed(0)
    timings: dict[str, list[float]] = {
        "baseline": [], "functional": [], "trace": [], "one chain": [], "many chains": []
    }  # fmt: skip
    for _ in range(args.repeats):
        timings["baseline"].append(time_baseline(x, y, args.batch_size, args.steps, generator))
        timings["functional"].append(time_mcmc(x, y, args.batch_size, args.steps, "auto"))
        timings["trace"].append(time_mcmc(x, y, args.batch_size, args.steps, "trace"))
        timings["one chain"].append(time_chains(x, y, args.batch_size, args.steps, 1))
        timings["many chains"].append(time_chains(x, y, args.batch_size, args.steps, args.chains))
    median = {name: statistics.median(values) for name, values in timings.items()}
    base = median["baseline"]
    step_ratio = median["functional"] / base
    chains_ratio = median["many chains"] / median["one chain"]
    rows = [
        {"method": "torch SGD step (baseline)", "ms/step": f"{1e3 * base:.3f}", "ratio": "1.00"},
        {
            "method": "SGHMC via MCMC, default potential",
            "ms/step": f"{1e3 * median['functional']:.3f}",
            "ratio": f"{step_ratio:.2f}",
            "target": f"<= {STEP_TARGET}",
            "pass": step_ratio <= STEP_TARGET,
        },
        {
            "method": "SGHMC via MCMC, Pyro trace",
            "ms/step": f"{1e3 * median['trace']:.3f}",
            "ratio": f"{median['trace'] / base:.2f}",
        },
        {
            "method": "run_chains, 1 chain",
            "ms/step": f"{1e3 * median['one chain']:.3f}",
            "ratio": f"{median['one chain'] / base:.2f}",
        },
        {
            "method": f"run_chains, {args.chains} chains (all chains per step)",
            "ms/step": f"{1e3 * median['many chains']:.3f}",
            "ratio": f"{chains_ratio:.2f} x one chain",
            "target": f"<= {CHAINS_TARGET} x one chain",
            "pass": chains_ratio <= CHAINS_TARGET,
        },
    ]
    print(f"data: {source}; batch {args.batch_size}; {args.repeats} x {args.steps} steps; "
          f"{args.threads} thread(s); load {load_average()}")  # fmt: skip
    print_table(rows, ["method", "ms/step", "ratio", "target", "pass"])
    path = write_json(
        "w1g_pyro_module",
        {
            "data": source,
            "batch_size": args.batch_size,
            "steps": args.steps,
            "repeats": args.repeats,
            "chains": args.chains,
            "threads": args.threads,
            "s_per_step": timings,
            "ratio_step": step_ratio,
            "ratio_chains": chains_ratio,
            "targets": {"step": STEP_TARGET, "chains": CHAINS_TARGET},
            "load_average": load_average(),
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
