"""A sampler's set-up runs the model on all ``N`` rows at most once.

``pyro.infer.MCMC`` and ``run_chains`` inspect the model (its sites, the data plate and its
idiom), look for Gibbs blocks and draw every chain's start before the first step. Only the
inspection needs the full data (the plate's size); the idiom probes, the Gibbs discovery and
Pyro's ``initialize_model`` run on a few rows, since the latent sites are global: the starts and
the draws are the same as with set-up runs on all rows.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro_tutorial_models import DocsBNN, WeightsInsidePlate, classification_data, regression_data
from torch import nn

import pyro_sgmcmc.models.structure as model_structure
import pyro_sgmcmc.nn.mlp as mlp
from pyro_sgmcmc import SGHMC, SGLD, run_chains
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision

N, BATCH = 400, 20


class FullRuns:
    """Counts the model's evaluations on all ``N`` rows."""

    def __init__(self) -> None:
        self.count = 0

    def rows(self, rows: int) -> None:
        self.count += int(rows == N)


def sized(runs: FullRuns):
    """Idiom (a), with a Normal-Gamma pair for the Gibbs discovery."""

    def model(x, y=None):
        tau = pyro.sample("tau", dist.Gamma(2.0, 1.0))
        w = pyro.sample("w", dist.Normal(0.0, tau.rsqrt()).expand([x.shape[1]]).to_event(1))
        runs.rows(x.shape[0])
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(x @ w, 1.0), obs=y)

    return model


def indexed(runs: FullRuns, subsample_size: int | None = None):
    """Idiom (b), or (c) with ``subsample_size``."""

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
            runs.rows(len(idx))
            pyro.sample("obs", dist.Normal(x[idx] @ w, 1.0), obs=None if y is None else y[idx])

    return model


def counted(module: nn.Module, runs: FullRuns) -> nn.Module:
    """``module`` with its first linear layer counting the rows it computed on."""
    first = next(m for m in module.modules() if isinstance(m, nn.Linear))
    first.register_forward_hook(lambda _, inputs, __: runs.rows(inputs[0].shape[0]))
    return module


def bayesian_mlp(runs: FullRuns, monkeypatch):
    """A ``BayesianMLP`` (its fast path) counting the rows its network is evaluated on."""
    take_rows = mlp._take_rows

    def counting_take_rows(data, rows):
        taken = take_rows(data, rows)
        if data.dim() == 2:
            runs.rows(taken.shape[0])
        return taken

    monkeypatch.setattr(mlp, "_take_rows", counting_take_rows)
    return BayesianMLP(3, [6], 1, prior=GammaPrecision(2.0, 1.0))


def case(name: str, runs: FullRuns, monkeypatch):
    regression, classification = regression_data(N), classification_data(N)
    if name == "a_sized_with_gibbs":
        return sized(runs), regression
    if name == "b_indexed":
        return indexed(runs), regression
    if name == "c_subsample_size":
        return indexed(runs, subsample_size=BATCH), regression
    if name == "a_docs_bnn":
        return counted(DocsBNN(3, 8, 3), runs), classification
    if name == "a_weights_inside_plate":
        return counted(WeightsInsidePlate(3), runs), regression
    if name == "bayesian_mlp":
        return bayesian_mlp(runs, monkeypatch), regression
    raise KeyError(name)


CASES = ["a_sized_with_gibbs", "b_indexed", "c_subsample_size", "a_docs_bnn",
         "a_weights_inside_plate", "bayesian_mlp"]  # fmt: skip


@pytest.mark.parametrize("driver", ["mcmc", "run_chains"])
@pytest.mark.parametrize("name", CASES)
def test_the_set_up_runs_the_model_on_all_rows_at_most_once(name, driver, monkeypatch):
    runs = FullRuns()
    model, data = case(name, runs, monkeypatch)
    kernel = SGHMC(model, 1e-4, batch_size=BATCH, seed=0)
    if driver == "mcmc":
        MCMC(kernel, num_samples=2, warmup_steps=0, num_chains=1, disable_progbar=True).run(*data)
    else:
        run_chains(kernel, *data, num_chains=3, num_samples=2, warmup_steps=0)
    assert runs.count <= 1


@pytest.mark.parametrize("name", CASES)
def test_set_up_rows_give_the_starts_and_draws_of_all_rows(name, monkeypatch):
    """With set-up runs on all rows (``SETUP_ROWS`` above ``N``), the same starts and draws."""

    def draws():
        pyro.set_rng_seed(0)  # classification_data draws its labels from torch's generator
        model, data = case(name, FullRuns(), monkeypatch)
        kernel = SGLD(model, 1e-4, batch_size=BATCH, seed=4)
        result = run_chains(kernel, *data, num_chains=2, num_samples=3)
        mcmc = MCMC(kernel, num_samples=3, warmup_steps=1, num_chains=1, disable_progbar=True)
        mcmc.run(*data)
        return result.samples, mcmc.get_samples()

    few = draws()
    monkeypatch.setattr(model_structure, "SETUP_ROWS", 10 * N)
    every = draws()
    for ours, theirs in zip(few, every, strict=True):
        assert set(ours) == set(theirs)
        for site, value in ours.items():
            assert torch.equal(value, theirs[site]), site
