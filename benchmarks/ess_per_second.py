"""Effective draws per second with the defaults: our kernels against Pyro's and NumPyro's NUTS.

Four problems, each sampled by every method in the same run, with 4 chains:

(i)   Pyro's tutorial Bayesian regression (``PyroModule[nn.Linear]``, ``PyroSample`` priors,
      ``sigma ~ Uniform(0, 10)``) on 500 rows shaped like the tutorial's ruggedness data
      (an intercept near 9, uncentred inputs: posterior correlations up to 0.8); the SG-MCMC
      kernels exactly as a NUTS user calls them, ``MCMC(KERNEL(model, batch_size=50),
      num_samples=1000, warmup_steps=200, num_chains=4)``, and stacked with ``run_chains``;
(ii)  logistic regression, N = 100,000 rows, 20 features (batch 500, 0.5% of the rows;
      ``--batch-ii 100 250 500 1000`` runs our kernels at each batch size);
(iii) hierarchical varying intercepts, J = 8 groups, N = 2,000 rows (batch 100);
(iv)  the sinusoid network of ``pyro-sgmcmc compare`` (a BayesianMLP 1-10-10-1, tanh, 32
      rows), against Pyro's NUTS as that command runs it (``max_tree_depth=7``, the network's
      plain-torch potential, chains started from Adam descents: with Pyro's defaults one
      chain took 35 minutes).

Score: the smallest bulk ESS over every parameter (over the network's outputs at the test
inputs for (iv), whose weights are not identified) divided by the wall time, set-up and
compilation included (JAX's for NumPyro). Each row also says whether the run passes its
verdict (R-hat and ESS bounds of :mod:`pyro_sgmcmc.analysis.diagnostics`), and its accuracy:
the largest distance of a posterior mean from NUTS's in Monte Carlo standard errors and the
largest relative error of a posterior sd -- for (i) against a long Pyro NUTS run, for (ii) and
(iii) against the Pyro NUTS row of the same run (the standard error then combines both runs').
SGLD and pSGLD run their default integrator (Leimkuhler and Matthews'); ``SGLD-Euler`` is SGLD
with ``integrator="euler"`` (Welling and Teh's step, SGLD's default until late on 2026-11-29);
SGHMC runs its default integrator (BAOAB), ``SGHMC-Euler`` Chen et al.'s step (SGHMC's default
until 2026-12-06).

NumPyro is optional (``pip install numpyro``): without it its rows are skipped. Pyro runs its
chains one after the other on a machine with fewer than five cores, and so does NumPyro here
(``chain_method="sequential"``), as do our kernels under ``MCMC``.

With ``--repeats K`` every method of a problem runs K times, seeded 0, ..., K-1 (Pyro's NUTS
included: one run's minimum bulk ESS is a noisy estimate, and where NUTS's draws are
anti-correlated, e.g. (ii)'s, with an ESS above the number of draws, it moved by 30% between two
seeds). A row then gives the medians over the repeats, ``vs_pyro_nuts`` the median of each
repeat's ratio, and ``vs_pyro_nuts_range`` the smallest and largest.

Run: ``python benchmarks/ess_per_second.py [--problems i ii iii iv] [--quick]
[--batch-ii B ...] [--repeats K]``; prints a table and writes
``benchmarks/results/ess_per_second.json``.
"""

from __future__ import annotations

import argparse
import functools
import math
import time
import warnings

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import torch
from _common import load_average, print_table, write_json
from pyro.infer import MCMC, NUTS
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyro_sgmcmc
from pyro_sgmcmc.analysis.diagnostics import judge

CHAINS = 4
#: The seed of every method's run (the repeat's index with ``--repeats``).
SEED = 0
KERNELS = {
    "SGLD": pyro_sgmcmc.SGLD,
    "SGLD-Euler": functools.partial(pyro_sgmcmc.SGLD, integrator="euler"),
    "SGHMC": pyro_sgmcmc.SGHMC,
    "SGHMC-Euler": functools.partial(pyro_sgmcmc.SGHMC, integrator="euler"),
    "pSGLD": pyro_sgmcmc.PSGLD,
}


# ------------------------------------------------------------------------------- problems
class TutorialRegression(PyroModule):
    """Pyro's "Bayesian regression" tutorial model."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.linear = PyroModule[nn.Linear](in_features, 1)
        self.linear.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, in_features]).to_event(2))
        self.linear.bias = PyroSample(dist.Normal(0.0, 10.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        sigma = pyro.sample("sigma", dist.Uniform(0.0, 10.0))
        mean = self.linear(x).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mean, sigma), obs=y)
        return mean


def rugged_like(n: int = 500, seed: int = 0):
    """Rows shaped like the tutorial's: continent indicator, ruggedness, their product."""
    generator = torch.Generator().manual_seed(seed)
    africa = (torch.rand(n, generator=generator) < 0.3).float()
    rugged = torch._standard_gamma(torch.full((n,), 1.5), generator=generator) / 1.2
    x = torch.stack([africa, rugged, africa * rugged], 1)
    noise = 0.9 * torch.randn(n, generator=generator)
    y = 9.2 - 1.9 * africa - 0.2 * rugged + 0.4 * africa * rugged + noise
    return x, y


def logistic_model(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 5.0))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Bernoulli(logits=x @ w + b), obs=y)


def logistic_data(n: int = 100_000, d: int = 20, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=generator)
    w = torch.randn(d, generator=generator) * 0.5
    y = (torch.rand(n, generator=generator) < torch.sigmoid(x @ w - 0.3)).float()
    return x, y


def varying_intercepts(group, x, num_groups, y=None):
    mu = pyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = pyro.sample("tau", dist.HalfNormal(2.0))
    beta = pyro.sample("beta", dist.Normal(0.0, 1.0))
    sigma = pyro.sample("sigma", dist.HalfNormal(2.0))
    with pyro.plate("groups", num_groups):
        alpha = pyro.sample("alpha", dist.Normal(mu, tau))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(alpha[group] + beta * x, sigma), obs=y)


def hierarchical_data(num_groups: int = 8, n: int = 2000, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    group = torch.randint(0, num_groups, (n,), generator=generator)
    alpha = 1.0 + 0.7 * torch.randn(num_groups, generator=generator)
    x = torch.randn(n, generator=generator)
    y = alpha[group] + 0.5 * x + torch.randn(n, generator=generator)
    return group, x, num_groups, y


# ------------------------------------------------------------------------------- NumPyro twins
def numpyro_problems() -> dict:
    """The same models in NumPyro (``None`` where NumPyro is not installed)."""
    try:
        import jax.numpy as jnp
        import numpyro
        import numpyro.distributions as ndist
    except ImportError:
        return {}

    def regression(x, y):
        w = numpyro.sample("linear.weight", ndist.Normal(0.0, 1.0).expand([1, x.shape[1]]))
        b = numpyro.sample("linear.bias", ndist.Normal(0.0, 10.0).expand([1]))
        sigma = numpyro.sample("sigma", ndist.Uniform(0.0, 10.0))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("obs", ndist.Normal(x @ w[0] + b[0], sigma), obs=y)

    def logistic(x, y):
        w = numpyro.sample("w", ndist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
        b = numpyro.sample("b", ndist.Normal(0.0, 5.0))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("obs", ndist.Bernoulli(logits=x @ w + b), obs=y)

    def hierarchical(group, x, num_groups, y):
        mu = numpyro.sample("mu", ndist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", ndist.HalfNormal(2.0))
        beta = numpyro.sample("beta", ndist.Normal(0.0, 1.0))
        sigma = numpyro.sample("sigma", ndist.HalfNormal(2.0))
        with numpyro.plate("groups", num_groups):
            alpha = numpyro.sample("alpha", ndist.Normal(mu, tau))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("obs", ndist.Normal(alpha[group] + beta * x, sigma), obs=y)

    def convert(args):
        return tuple(jnp.asarray(a.numpy()) if isinstance(a, torch.Tensor) else a for a in args)

    return {"i": regression, "ii": logistic, "iii": hierarchical, "convert": convert}


# ------------------------------------------------------------------------------- scoring
def score(samples: dict[str, np.ndarray], seconds: float, network: bool = False) -> dict:
    """Minimum bulk ESS, ESS per second and the verdict of ``(chain, draw, ...)`` draws."""
    dataset = az.from_dict(posterior=samples).posterior
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bulk = min(float(np.nanmin(v.values)) for v in az.ess(dataset).data_vars.values())
        tail = min(
            float(np.nanmin(v.values)) for v in az.ess(dataset, method="tail").data_vars.values()
        )
        rhat = max(float(np.nanmax(v.values)) for v in az.rhat(dataset).data_vars.values())
    verdict = judge(rhat, bulk, tail, CHAINS, function_space=network)
    return {
        "seconds": round(seconds, 1),
        "max_rhat": round(rhat, 3),
        "min_ess_bulk": round(bulk),
        "min_ess_tail": round(tail),
        "ess_per_second": round(bulk / seconds, 2),
        "verdict": "converged"
        if verdict.converged
        else str(verdict).replace("not converged: ", "no: "),
    }


def grouped(samples: dict[str, torch.Tensor], chains: int = CHAINS) -> dict[str, np.ndarray]:
    return {
        name: value.reshape(chains, -1, *value.shape[1:]).double().numpy()
        for name, value in samples.items()
    }


def run_pyro_nuts(model, args, num_samples, warmup) -> tuple[dict, float]:
    pyro.set_rng_seed(SEED)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc = MCMC(NUTS(model), num_samples=num_samples, warmup_steps=warmup,
                    num_chains=CHAINS, disable_progbar=True)  # fmt: skip
        mcmc.run(*args)
    seconds = time.perf_counter() - start
    return {
        k: v.double().numpy() for k, v in mcmc.get_samples(group_by_chain=True).items()
    }, seconds


def run_demo_nuts(model, data, num_samples, warmup) -> tuple[dict, float]:
    """Pyro's NUTS as ``pyro-sgmcmc compare`` runs it on a network (faster than Pyro's defaults:
    ``max_tree_depth=7``, the network's plain-torch potential, chains started from Adam
    descents; with Pyro's defaults one chain of 700 iterations took 35 minutes)."""
    from pyro_sgmcmc.cli.compare import CompareConfig
    from pyro_sgmcmc.cli.compare_fit import _run_nuts

    config = CompareConfig(out=None, figures=False, progress=False, chains=CHAINS,
                           nuts_num_samples=num_samples, nuts_warmup=warmup)  # fmt: skip
    pyro.set_rng_seed(SEED)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = _run_nuts(model, data, config)
    seconds = time.perf_counter() - start
    samples = run.source.get_samples(group_by_chain=True)
    return {k: v.double().numpy() for k, v in samples.items()}, seconds


def run_numpyro_nuts(model, args, num_samples, warmup) -> tuple[dict, float]:
    import jax
    from numpyro.infer import MCMC as NMCMC
    from numpyro.infer import NUTS as NNUTS

    start = time.perf_counter()
    mcmc = NMCMC(NNUTS(model), num_warmup=warmup, num_samples=num_samples, num_chains=CHAINS,
                 chain_method="sequential", progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(SEED), *args)
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    return samples, time.perf_counter() - start


def run_ours_mcmc(kernel, args, num_samples, warmup) -> tuple[dict, float]:
    pyro.set_rng_seed(SEED)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, num_chains=CHAINS,
                    disable_progbar=True)  # fmt: skip
        mcmc.run(*args)
    seconds = time.perf_counter() - start
    return {
        k: v.double().numpy() for k, v in mcmc.get_samples(group_by_chain=True).items()
    }, seconds


def run_ours_chains(kernel, args, num_samples, warmup) -> tuple[object, float]:
    pyro.set_rng_seed(SEED)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = pyro_sgmcmc.run_chains(kernel, *args, num_chains=CHAINS, num_samples=num_samples,
                                        warmup_steps=warmup)  # fmt: skip
    return result, time.perf_counter() - start


# ------------------------------------------------------------------------------- the problems
def problem_i(quick: bool, numpyro: dict, reference: dict | None) -> list[dict]:
    x, y = rugged_like()
    num_samples, warmup = (200, 100) if quick else (1000, 200)
    rows = []
    nuts, seconds = run_pyro_nuts(TutorialRegression(3), (x, y), num_samples, warmup)
    rows.append({"method": "Pyro NUTS", **score(nuts, seconds), **_accuracy(nuts, reference)})
    if numpyro:
        args = numpyro["convert"]((x, y))
        samples, seconds = run_numpyro_nuts(numpyro["i"], args, num_samples, warmup)
        rows.append({"method": "NumPyro NUTS", **score(samples, seconds),
                     **_accuracy(samples, reference)})  # fmt: skip
    for name, kernel_class in KERNELS.items():
        samples, seconds = run_ours_mcmc(kernel_class(TutorialRegression(3), batch_size=50),
                                         (x, y), num_samples, warmup)  # fmt: skip
        rows.append({"method": f"{name} (MCMC)", **score(samples, seconds),
                     **_accuracy(samples, reference)})  # fmt: skip
    result, seconds = run_ours_chains(pyro_sgmcmc.SGHMC(TutorialRegression(3), batch_size=50),
                                      (x, y), num_samples, warmup)  # fmt: skip
    samples = {k: v.double().numpy() for k, v in result.samples.items()}
    rows.append({"method": "SGHMC (run_chains)", **score(samples, seconds),
                 **_accuracy(samples, reference)})  # fmt: skip
    return rows


def reference_i(quick: bool) -> dict:
    """Posterior means, sds and MCSEs of (i) from a long Pyro NUTS run (4 x 4000 draws)."""
    x, y = rugged_like()
    samples, _ = run_pyro_nuts(TutorialRegression(3), (x, y), 1000 if quick else 4000, 500)
    return _moments(samples)


def _moments(samples: dict) -> dict:
    """Per site, the posterior means, sds and Monte Carlo standard errors of the means."""
    mcse = az.mcse(az.from_dict(posterior=samples).posterior)
    moments = {}
    for name, value in samples.items():
        flat = value.reshape(-1, *value.shape[2:])
        moments[name] = (flat.mean(0), flat.std(0), mcse[name].values)
    return moments


def _accuracy(samples: dict, reference: dict | None) -> dict:
    """Largest |mean - reference mean| in the two runs' combined MCSE, and largest relative
    error of a posterior sd, over every coordinate of the reference's sites."""
    if reference is None:
        return {}
    ours = _moments(samples)
    worst_z, worst_sd = 0.0, 0.0
    for name, (mean, sd, se) in reference.items():
        if name not in ours:
            continue
        value_mean, value_sd, value_se = ours[name]
        error = np.abs(value_mean - mean) / np.maximum(np.hypot(value_se, se), 1e-12)
        worst_z = max(worst_z, float(np.max(error)))
        worst_sd = max(worst_sd, float(np.max(np.abs(value_sd / sd - 1.0))))
    return {"mean_err_mcse": round(worst_z, 1), "sd_rel_err": round(worst_sd, 3)}


def problem_ii(quick: bool, numpyro: dict, batch_sizes: tuple[int, ...] = (500,)) -> list[dict]:
    x, y = logistic_data(20_000 if quick else 100_000)
    num_samples, warmup = (100, 100) if quick else (500, 200)
    rows = []
    nuts, seconds = run_pyro_nuts(logistic_model, (x, y), num_samples, warmup)
    rows.append({"method": "Pyro NUTS", **score(nuts, seconds)})
    reference = _moments(nuts)
    if numpyro:
        samples, seconds = run_numpyro_nuts(numpyro["ii"], numpyro["convert"]((x, y)),
                                            num_samples, warmup)  # fmt: skip
        rows.append({"method": "NumPyro NUTS", **score(samples, seconds),
                     **_accuracy(samples, reference)})  # fmt: skip
    for batch_size in batch_sizes:
        label = "run_chains" if len(batch_sizes) == 1 else f"run_chains, batch {batch_size}"
        for name, kernel_class in KERNELS.items():
            result, seconds = run_ours_chains(kernel_class(logistic_model, batch_size=batch_size),
                                              (x, y), num_samples, warmup)  # fmt: skip
            samples = {k: v.double().numpy() for k, v in result.samples.items()}
            rows.append({"method": f"{name} ({label})", **score(samples, seconds),
                         **_accuracy(samples, reference)})  # fmt: skip
    return rows


def problem_iii(quick: bool, numpyro: dict) -> list[dict]:
    args = hierarchical_data()
    num_samples, warmup = (200, 100) if quick else (1000, 200)
    rows = []
    nuts, seconds = run_pyro_nuts(varying_intercepts, args, num_samples, warmup)
    rows.append({"method": "Pyro NUTS", **score(nuts, seconds)})
    reference = _moments(nuts)
    if numpyro:
        samples, seconds = run_numpyro_nuts(numpyro["iii"], numpyro["convert"](args),
                                            num_samples, warmup)  # fmt: skip
        rows.append({"method": "NumPyro NUTS", **score(samples, seconds),
                     **_accuracy(samples, reference)})  # fmt: skip
    for name, kernel_class in KERNELS.items():
        result, seconds = run_ours_chains(kernel_class(varying_intercepts, batch_size=100), args,
                                          num_samples, warmup)  # fmt: skip
        samples = {k: v.double().numpy() for k, v in result.samples.items()}
        rows.append({"method": f"{name} (run_chains)", **score(samples, seconds),
                     **_accuracy(samples, reference)})  # fmt: skip
    return rows


def problem_iv(quick: bool) -> list[dict]:
    from pyro_sgmcmc.cli.compare import CompareConfig, build_model, load_data

    config = CompareConfig(out=None, figures=False, progress=False)
    data = load_data(config)
    num_samples, warmup = (100, 100) if quick else (500, 200)
    rows = []

    def outputs(model, samples):
        """The network's outputs at the test inputs, ``(chain, draw, rows)``."""
        draws = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in samples.items()}
        flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in draws.items()}
        values = model.functional_forward(flat, data.x_test)
        return {"output": values.reshape(CHAINS, -1, *values.shape[1:]).double().numpy()}

    model = build_model(config, data)
    nuts, seconds = run_demo_nuts(model, data, num_samples, warmup)
    rows.append({"method": "Pyro NUTS", **score(outputs(model, nuts), seconds, network=True)})
    for name, kernel_class in KERNELS.items():
        model = build_model(config, data)
        args = (data.x_train, data.y_train)
        kernel = kernel_class(model, batch_size=32)
        result, seconds = run_ours_chains(kernel, args, num_samples, warmup)
        samples = {k: v.double().numpy() for k, v in result.samples.items()}
        rows.append({"method": f"{name} (run_chains)",
                     **score(outputs(model, samples), seconds, network=True)})  # fmt: skip
    return rows


COLUMNS = ["problem", "method", "seconds", "max_rhat", "min_ess_bulk", "min_ess_tail",
           "ess_per_second", "vs_pyro_nuts", "vs_pyro_nuts_range", "mean_err_mcse", "sd_rel_err",
           "verdict"]  # fmt: skip


def run_problem(problem: str, args, numpyro: dict, reference: dict | None) -> list[dict]:
    if problem == "i":
        return problem_i(args.quick, numpyro, reference)
    if problem == "ii":
        return problem_ii(args.quick, numpyro, tuple(args.batch_ii))
    if problem == "iii":
        return problem_iii(args.quick, numpyro)
    return problem_iv(args.quick)


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row's ESS per second over Pyro NUTS's in the same run (``vs_pyro_nuts``)."""
    nuts = next(row for row in rows if row["method"] == "Pyro NUTS")["ess_per_second"]
    for row in rows:
        row["vs_pyro_nuts"] = round(row["ess_per_second"] / nuts, 2) if nuts else math.nan
    return rows


def medians(repeats: list[list[dict]]) -> list[dict]:
    """One row per method: the median of each number over the repeats (the verdict: how many
    repeats converged), the range of ``vs_pyro_nuts``, and every repeat's row under ``runs``."""
    rows = []
    for runs in zip(*repeats, strict=True):
        row = {"method": runs[0]["method"], "repeats": len(runs), "runs": list(runs)}
        for key, value in runs[0].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                row[key] = round(float(np.median([run[key] for run in runs])), 3)
        ratios = [run["vs_pyro_nuts"] for run in runs]
        row["vs_pyro_nuts_range"] = f"{min(ratios):.2f}-{max(ratios):.2f}"
        converged = sum(run["verdict"] == "converged" for run in runs)
        row["verdict"] = f"{converged}/{len(runs)} converged"
        rows.append(row)
    return rows


def main() -> None:
    global SEED
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="+", default=["i", "ii", "iii", "iv"])
    parser.add_argument("--quick", action="store_true", help="fewer draws and rows (a smoke run)")
    parser.add_argument("--kernels", nargs="+", choices=sorted(KERNELS), default=sorted(KERNELS),
                        help="our kernels to run (default: all)")  # fmt: skip
    parser.add_argument("--batch-ii", type=int, nargs="+", default=[500],
                        help="(ii): our kernels' batch size(s) (default: 500)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of every method, seeded 0, 1, ... (default: 1)")  # fmt: skip
    parser.add_argument("--no-reference", action="store_true",
                        help="(i) without the long NUTS run behind its accuracy")  # fmt: skip
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    for name in set(KERNELS) - set(args.kernels):
        del KERNELS[name]
    torch.set_num_threads(1)
    numpyro = numpyro_problems()
    if not numpyro:
        print("NumPyro not installed (pip install numpyro): its rows are skipped")
    load_before = load_average()
    table: list[dict] = []
    for problem in args.problems:
        start = time.perf_counter()
        reference = None
        if problem == "i" and not args.no_reference:
            SEED = 0  # one long run, seed 0, whatever the repeats
            reference = reference_i(args.quick)
        repeats = []
        for seed in range(args.repeats):
            SEED = seed
            repeats.append(with_ratios(run_problem(problem, args, numpyro, reference)))
        rows = repeats[0] if args.repeats == 1 else medians(repeats)
        for row in rows:
            row["problem"] = problem
        table += rows
        print(f"problem ({problem}) done in {time.perf_counter() - start:.0f} s", flush=True)
        print_table(rows, COLUMNS)
        # after every problem, so that a long run that is stopped keeps what it measured
        path = write_json("ess_per_second", {
            "quick": args.quick, "kernels": args.kernels, "reference": not args.no_reference,
            "repeats": args.repeats, "batch_ii": args.batch_ii,
            "load_before": load_before, "load_after": load_average(),
            "rows": table,
        })  # fmt: skip
    print_table(table, COLUMNS)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
