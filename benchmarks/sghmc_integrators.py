"""What SGHMC's default step costs and buys: Leimkuhler and Matthews' BAOAB splitting against
Chen et al.'s semi-implicit Euler step (``integrator="euler"``), in one run.

Three measurements, each taken with both steps in turn in one process:

* ``step``: the cost of a step. The demo's sinusoid network (``pyro-sgmcmc compare``'s model and
  data), four stacked chains through ``run_chains`` with a hand-given step, friction 0.05 and 20
  steps per draw (400 draws after 10), so the warm-up does not run; microseconds per step, the
  best of ``--repeats`` runs.
* ``network``: effective draws per second with the defaults. The same network, ``run_chains``
  with nothing given but a batch size of 32, 4 chains x 500 draws after 200, one seed per
  repeat: seconds, R-hat and bulk ESS of the outputs f(x) at the test inputs, ESS per second,
  the verdict.
* ``schools``: what the step does to a posterior. Rubin's eight schools, non-centred, four
  schools per minibatch (the warm-up sets a friction of 1 there, where the gradient noise
  binds), the defaults, 4 chains x 1000 draws: the mean of ``tau`` against its exact posterior
  mean by quadrature, in Monte Carlo standard errors, and its sd over the exact sd.

Run: ``python benchmarks/sghmc_integrators.py [--repeats 3] [--parts step network schools]``;
writes ``benchmarks/results/sghmc_integrators.json``. One thread; run it alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import arviz as az
import torch
from _common import load_average, print_table, write_json

from pyro_sgmcmc import SGHMC, run_chains
from pyro_sgmcmc.cli.compare import CompareConfig, build_model, load_data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# the tests' eight schools and its quadrature
from pyro_tutorial_models import (
    SCHOOLS_SIGMA,
    SCHOOLS_Y,
    eight_schools,
    exact_schools_tau,
)

INTEGRATORS = ("baoab", "euler")
CHAINS = 4


def quietly(function, *args, **kwargs):
    """``function(*args, **kwargs)`` with its warnings silenced; its value and the seconds."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        value = function(*args, **kwargs)
        return value, time.perf_counter() - start


def step_cost(data, config, integrator: str, seed: int) -> float:
    """Microseconds per step of four stacked chains with a hand-given step."""
    kernel = SGHMC(build_model(config, data), step_size=1e-6, friction=0.05, batch_size=32,
                   num_steps_per_sample=20, seed=seed, integrator=integrator)  # fmt: skip
    _, seconds = quietly(run_chains, kernel, data.x_train, data.y_train, num_chains=CHAINS,
                         num_samples=400, warmup_steps=10, target_ess=None)  # fmt: skip
    return seconds / (410 * 20) * 1e6


def network_row(data, config, integrator: str, seed: int) -> dict:
    """The defaults on the demo's network: f(x)'s R-hat and bulk ESS, per second."""
    model = build_model(config, data)
    kernel = SGHMC(model, batch_size=32, seed=seed, integrator=integrator)
    result, seconds = quietly(run_chains, kernel, data.x_train, data.y_train, num_chains=CHAINS,
                              num_samples=500, warmup_steps=200, target_ess=None)  # fmt: skip
    flat = {k: v.float().reshape(-1, *v.shape[2:]) for k, v in result.samples.items()}
    outputs = model.functional_forward(flat, data.x_test).reshape(CHAINS, -1, len(data.x_test))
    dataset = az.convert_to_dataset({"f": outputs.double().numpy()})
    ess = float(az.ess(dataset)["f"].min())
    return {"part": "network", "integrator": integrator, "seed": seed,
            "seconds": round(seconds, 1), "rhat_fx": round(float(az.rhat(dataset)["f"].max()), 3),
            "ess_fx": round(ess), "ess_per_second": round(ess / seconds, 1),
            "verdict": str(result.verdict).split(";")[0]}  # fmt: skip


def schools_row(integrator: str, seed: int, exact: tuple[float, float]) -> dict:
    """The defaults on the eight schools, half the schools per minibatch: tau against exact."""
    kernel = SGHMC(eight_schools, batch_size=4, seed=seed, integrator=integrator)
    result, seconds = quietly(run_chains, kernel, SCHOOLS_SIGMA, SCHOOLS_Y, num_chains=CHAINS,
                              num_samples=1000, target_ess=None)  # fmt: skip
    tau = result.samples["tau"].double().numpy()
    mcse = float(az.mcse(tau, method="mean"))
    return {"part": "schools", "integrator": integrator, "seed": seed,
            "seconds": round(seconds, 1), "tau_mean": round(float(tau.mean()), 3),
            "exact_mean": round(exact[0], 3), "z_mcse": round((tau.mean() - exact[0]) / mcse, 2),
            "sd_ratio": round(float(tau.std()) / exact[1], 3),
            "verdict": str(result.verdict).split(";")[0]}  # fmt: skip


def step_rows(repeats: int) -> list[dict]:
    """Both steps' cost per step, taken in turn; the best of ``repeats`` and all of them."""
    config = CompareConfig(out=None, figures=False, progress=False)
    data = load_data(config)
    times: dict[str, list[float]] = {name: [] for name in INTEGRATORS}
    for seed in range(repeats):
        for integrator in INTEGRATORS:
            times[integrator].append(step_cost(data, config, integrator, seed))
    euler = min(times["euler"])
    return [
        {"part": "step", "integrator": name, "us_per_step": round(min(values), 1),
         "all_us": [round(v, 1) for v in values], "vs_euler": round(min(values) / euler, 3)}
        for name, values in times.items()
    ]  # fmt: skip


#: The column a part's median is printed of.
MEDIAN_OF = {"network": "ess_per_second", "schools": "z_mcse"}


def print_part(rows: list[dict]) -> None:
    """One part's table, and the median of its headline column per integrator."""
    print_table(rows, [key for key in rows[0] if key != "all_us"])
    key = MEDIAN_OF.get(rows[0]["part"])
    if key:
        medians = {
            name: float(statistics.median(r[key] for r in rows if r["integrator"] == name))
            for name in INTEGRATORS
        }
        print(f"median {key}: {medians}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="seeds 0 .. repeats - 1")
    parser.add_argument("--parts", nargs="+", default=["step", "network", "schools"],
                        choices=["step", "network", "schools"])  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows: list[dict] = []
    if "step" in args.parts:
        rows += step_rows(args.repeats)
    if "network" in args.parts:
        config = CompareConfig(out=None, figures=False, progress=False)
        data = load_data(config)
        rows += [network_row(data, config, integrator, seed)
                 for seed in range(args.repeats) for integrator in INTEGRATORS]  # fmt: skip
    if "schools" in args.parts:
        exact = exact_schools_tau()
        rows += [schools_row(integrator, seed, exact)
                 for seed in range(args.repeats) for integrator in INTEGRATORS]  # fmt: skip
    for part in args.parts:
        print_part([row for row in rows if row["part"] == part])
    path = write_json("sghmc_integrators", {"load_average": load_average(), "rows": rows,
                                            "settings": vars(args)})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
