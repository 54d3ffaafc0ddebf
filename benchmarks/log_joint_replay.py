"""What replaying a recorded graph is worth for a model's own ``log_joint``: ``run_chains``
with the value and gradient replayed and with autograd at every step.

A :class:`~pyro_sgmcmc.nn.BayesianMLP` without a closed-form gradient -- a Normal likelihood
whose noise precision is latent (``GammaPrecision``, Gibbs-updated: the model of
``uci_regression.py`` and ``scale_family.py``, and the CLI's ``noise="auto"`` on a user's data)
-- is differentiated by autograd through its ``log_joint``
(:class:`~pyro_sgmcmc.models.potentials.LogJointPotential`). On the CPU its value and gradient
are now recorded once per signature and replayed. Two problems:

* ``sinusoid``: the demo's 1-10-10-1 tanh network on its 32 rows (full batch: a Gibbs draw of
  the precision after every step);
* ``teacher``: a 8-50-1 tanh network on 10,000 rows of a smooth teacher function with noise
  sd 0.3, batch 32.

SGHMC ``run_chains`` (2 chains, ``--draws`` draws after 100, 10 steps per draw), once replayed
(the package's default) and once with autograd at every step, alternating, ``--repeats`` times
each in one process after a first call of each that is not timed. The table gives the median
seconds of each, their ratio, and whether both give the same draws bit for bit (they must).

Run: ``python benchmarks/log_joint_replay.py [--problems sinusoid teacher] [--draws 300]
[--repeats 2]``; writes ``benchmarks/results/log_joint_replay.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import pyro
import torch
from _common import load_average, print_table, write_json

import pyro_sgmcmc
from pyro_sgmcmc.data.datasets import load_dataset
from pyro_sgmcmc.models.potentials import LogJointPotential
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision, NormalLikelihood, NormalPrior


def sinusoid() -> tuple[torch.Tensor, torch.Tensor, list[int], int]:
    data = load_dataset("sinusoid", seed=0, standardize=True)
    return data.x_train, data.y_train, [10, 10], 32


def teacher() -> tuple[torch.Tensor, torch.Tensor, list[int], int]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(10_000, 8, generator=generator)
    y = x[:, :3].sin().sum(1) + 0.3 * torch.randn(10_000, generator=generator)
    return x, y, [50], 32


PROBLEMS = {"sinusoid": sinusoid, "teacher": teacher}


def run(problem: str, replay: bool, draws: int) -> tuple[float, dict[str, torch.Tensor]]:
    """Seconds and draws of one ``run_chains`` call, replayed or with autograd at every step."""
    x, y, hidden, batch_size = PROBLEMS[problem]()
    model = BayesianMLP(
        x.shape[1],
        hidden,
        1,
        activation="tanh",
        likelihood=NormalLikelihood(precision=GammaPrecision(2.0, 2.0 * 0.5**2)),
        prior=NormalPrior(1.0),
    )
    kernel = pyro_sgmcmc.SGHMC(model, batch_size=batch_size, num_steps_per_sample=10)
    eager_calls = []

    def eager(potential, flat, fixed, rows):
        eager_calls.append(1)
        return potential._autograd_value_and_grad(flat, fixed, rows)

    if not replay:  # the eager path of every LogJointPotential the kernel builds
        LogJointPotential.value_and_grad = eager
    pyro.set_rng_seed(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            started = time.perf_counter()
            result = pyro_sgmcmc.run_chains(
                kernel, x, y, num_chains=2, num_samples=draws, warmup_steps=100
            )
            seconds = time.perf_counter() - started
    finally:
        LogJointPotential.value_and_grad = REPLAYED
    assert replay or eager_calls, "the model did not run on LogJointPotential"
    return seconds, result.samples


REPLAYED = LogJointPotential.value_and_grad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for problem in args.problems:
        seconds: dict[bool, list[float]] = {True: [], False: []}
        draws = {}
        for replay in (False, True):  # not timed: imports and first recordings
            run(problem, replay, args.draws)
        for _ in range(args.repeats):
            for replay in (False, True):
                elapsed, draws[replay] = run(problem, replay, args.draws)
                seconds[replay].append(elapsed)
        same = all(torch.equal(draws[False][k], draws[True][k]) for k in draws[False])
        before, after = statistics.median(seconds[False]), statistics.median(seconds[True])
        rows.append({
            "problem": problem,
            "autograd_s": round(before, 2),
            "replayed_s": round(after, 2),
            "ratio": round(after / before, 3),
            "same_draws": same,
        })  # fmt: skip
        print(f"problem {problem} done", flush=True)
    print_table(rows, ["problem", "autograd_s", "replayed_s", "ratio", "same_draws"])
    payload = {"rows": rows, "load_average": load_average(), "draws": args.draws}
    path = write_json("log_joint_replay", {**payload, "repeats": args.repeats})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
