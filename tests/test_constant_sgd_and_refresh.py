"""Constant SGD (Mandt et al.) and partial momentum refreshment."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pyro.infer import MCMC
from pyro_tutorial_models import BayesianRegression
from stats_helpers import ConjugateLinearRegression, regression_data

from pyro_sgmcmc import SGHMC, ConstantSGD, SamplerDivergedError, run_chains
from pyro_sgmcmc.dynamics import (
    optimal_constant_rates,
    partial_momentum_refresh,
    sgd_init,
    sgd_step,
)


def test_sgd_step_exact_scalar_and_diagonal():
    theta = {"a": torch.tensor([1.0, 2.0])}
    grad = {"a": torch.tensor([0.5, -1.0])}
    torch.testing.assert_close(
        sgd_step(sgd_init(theta), grad, 0.1).position["a"], torch.tensor([0.95, 2.1])
    )
    rates = {"a": torch.tensor([0.1, 0.01])}
    torch.testing.assert_close(
        sgd_step(sgd_init(theta), grad, rates).position["a"], torch.tensor([0.95, 2.01])
    )


def test_optimal_rates_formula():
    msd = {"a": torch.tensor([2.0, 6.0]), "b": torch.tensor([4.0])}
    n = 101
    eta = optimal_constant_rates(msd, n)
    assert eta == pytest.approx(4 * 3 * n / (n - 1) / 12.0)
    diagonal = optimal_constant_rates(msd, n, diagonal=True)
    torch.testing.assert_close(diagonal["a"], 4 * n / (n - 1) / torch.tensor([2.0, 6.0]))


@pytest.mark.parametrize("persistence", [0.0, 0.5, 0.95])
def test_partial_momentum_refresh_leaves_gaussian_invariant(persistence):
    generator = torch.Generator().manual_seed(0)
    scale, n = 0.3, 200_000
    p = {"p": scale * torch.randn(n, generator=generator, dtype=torch.float64)}
    for _ in range(5):
        p = partial_momentum_refresh(p, persistence, scale, generator)
    values = p["p"].numpy()
    # independent draws: se(mean) = s / sqrt(n), se(var) = s^2 sqrt(2 / n)
    assert abs(values.mean()) < 4 * scale / np.sqrt(n)
    assert abs(values.var() - scale**2) < 4 * scale**2 * np.sqrt(2 / n)


def test_partial_refresh_one_step_exact():
    p = {"p": torch.tensor([1.0, -2.0])}
    xi = {"p": torch.tensor([0.5, 0.1])}
    out = partial_momentum_refresh(p, 0.6, 2.0, noise=xi)
    torch.testing.assert_close(out["p"], 0.6 * p["p"] + 0.8 * 2.0 * xi["p"])


def _fit_constant_sgd(multiplier, preconditioner="scalar", learning_rate=0.01):
    x, y = regression_data(n=2000, d=5, seed=3)
    model = ConjugateLinearRegression()
    _, cov = model.posterior(x, y)
    kernel = ConstantSGD(
        model,
        learning_rate=learning_rate,
        batch_size=100,
        num_steps_per_sample=20,
        rate_multiplier=multiplier,
        preconditioner=preconditioner,
        seed=4,
    )
    mcmc = MCMC(kernel, num_samples=400, warmup_steps=100, disable_progbar=True)
    mcmc.run(x, y)
    draws = mcmc.get_samples()["w"].double().numpy()
    sample_cov = np.cov(draws, rowvar=False)
    return np.linalg.norm(sample_cov - cov) / np.linalg.norm(cov), mcmc


def test_constant_sgd_at_optimal_rate_matches_posterior_covariance_and_10x_does_not():
    """For linear regression with Gaussian inputs the gradient noise is proportional to the
    Hessian, so at the optimal rate the stationary covariance equals the posterior's up to
    discretisation (factor 1/(1 - eta A / 2) ~ 1.05 at B/N = 0.05) and sampling error (Frobenius
    relative error of a 5x5 covariance from ~400 draws with ESS ~ 200: about 0.15). We allow
    0.35; at 10x the rate the spread is an order of magnitude too large."""
    error, mcmc = _fit_constant_sgd(1.0)
    error_10x, _ = _fit_constant_sgd(10.0)
    assert error < 0.35, error
    assert error_10x > 3.0, error_10x
    diag = mcmc.diagnostics()
    assert diag["optimal_rate"]["chain 0"] > 0


def test_constant_sgd_given_nothing_but_a_batch_size_spreads_as_the_posterior():
    """The adaptive warm-up chooses the step; the draws keep the minibatch noise that is their
    spread (the control variate, the other kernels' default, once removed it: the weights' sd
    came out about 40 times too small)."""
    error, mcmc = _fit_constant_sgd(1.0, learning_rate=None)
    assert error < 0.35, error
    assert mcmc.diagnostics()["control_variate"]["chain 0"] is False


def test_a_constant_sgd_that_diverges_after_warmup_is_pointed_at_its_rate():
    """Pyro's tutorial regression with a small hand-given warm-up step: Mandt et al.'s rate,
    unbounded by any measured curvature, diverges on the noise scale; the advice is about that
    rate (a smaller warm-up step, the generic advice, makes it worse)."""

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(400, 3, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 + 0.5 * torch.randn(400, generator=generator)
    kernel = ConstantSGD(BayesianRegression(3), step_size=1e-4, batch_size=40, seed=0)
    with pytest.raises(SamplerDivergedError, match=r"then runs at Mandt et al.'s rate"):
        run_chains(kernel, x, y, num_chains=2, num_samples=100, warmup_steps=100)


def test_diagonal_preconditioner_runs_and_is_close():
    error, mcmc = _fit_constant_sgd(1.0, preconditioner="diagonal")
    assert error < 0.35, error
    assert set(mcmc.diagnostics()["optimal_rate"]["chain 0"]) == {"w"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": 2.0}, "no temperature"),
        ({"preconditioner": "full"}, "preconditioner must be"),
        ({"rate_multiplier": 0.0}, "rate_multiplier must be > 0"),
        ({"control_variate": "auto"}, "ConstantSGD takes no control_variate"),
        ({"control_variate": True}, "ConstantSGD takes no control_variate"),
    ],
)
def test_constant_sgd_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ConstantSGD(ConjugateLinearRegression(), step_size=1e-3, **kwargs)


def test_constant_sgd_needs_warmup_and_minibatches():
    x, y = regression_data(n=100, d=2)
    with pytest.raises(ValueError, match="warmup_steps must be >= 2"):
        MCMC(
            ConstantSGD(ConjugateLinearRegression(), step_size=1e-3, batch_size=10),
            5,
            0,
            disable_progbar=True,
        ).run(x, y)
    with pytest.raises(ValueError, match="needs minibatches"):
        MCMC(
            ConstantSGD(ConjugateLinearRegression(), step_size=1e-3), 5, 4, disable_progbar=True
        ).run(x, y)


def test_sghmc_with_momentum_refresh_samples_posterior_mean():
    x, y = regression_data(n=1000, d=3)
    model = ConjugateLinearRegression()
    mean, cov = model.posterior(x, y)
    kernel = SGHMC(
        model,
        step_size=4e-7,
        friction=0.1,
        batch_size=250,
        num_steps_per_sample=20,
        resample_momentum_every=10,
        momentum_persistence=0.5,
        seed=2,
    )
    mcmc = MCMC(kernel, num_samples=200, warmup_steps=100, disable_progbar=True)
    mcmc.run(x, y)
    draws = mcmc.get_samples()["w"].double().numpy()
    sd = np.sqrt(np.diag(cov))
    assert np.all(np.abs(draws.mean(0) - mean) < 4 * sd / np.sqrt(50))


def test_sghmc_refresh_arguments_validated():
    with pytest.raises(ValueError, match="resample_momentum_every must be an integer >= 1"):
        SGHMC(ConjugateLinearRegression(), step_size=1e-3, resample_momentum_every=0)
    with pytest.raises(ValueError, match=r"momentum_persistence must lie in \[0.0, 1.0\)"):
        SGHMC(ConjugateLinearRegression(), step_size=1e-3, momentum_persistence=1.0)
