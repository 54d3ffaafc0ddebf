"""Tall data with the defaults: Pyro's tutorial regression (``BayesianRegression``) on 20,000
rows, called as a NUTS user calls it, gives converged draws of the right posterior (over 100
epochs of sampling).

With 20,000 rows the posterior is Gaussian to a fraction of a percent (Bernstein-von Mises): the
weights' mean is the least-squares fit with covariance :math:`\\hat\\sigma^2 (X^\\top X)^{-1}`,
and the noise scale's mean is the residuals' RMS with standard deviation
:math:`\\hat\\sigma / \\sqrt{2N}`. On such data the control variate's noise grows once the chain
explores the posterior, the last warm-up window's end raises SGHMC's friction, and a thinning
measured before that change would keep draws a third as informative as it claims.
"""

from __future__ import annotations

import warnings

import numpy as np
import pyro
import pytest
import torch
from pyro.infer import MCMC
from pyro_tutorial_models import BayesianRegression
from stats_helpers import assert_mean_close, effective_sample_size

from pyro_sgmcmc import PSGLD, SGHMC, SGLD

pytestmark = pytest.mark.slow

ROWS = 20_000


@pytest.fixture(scope="module")
def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, 3, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 3.0 + 0.7 * torch.randn(ROWS, generator=generator)
    return x, y


def _large_sample_posterior(x, y):
    design = torch.cat([x, torch.ones(ROWS, 1)], 1).double()
    coefficients = torch.linalg.lstsq(design, y.double().unsqueeze(-1)).solution.squeeze(-1)
    residual = y.double() - design @ coefficients
    sigma = float(residual.square().mean().sqrt())
    covariance = sigma**2 * torch.linalg.inv(design.T @ design)
    return coefficients.numpy(), covariance.diagonal().sqrt().numpy(), sigma


#: Kept draws per chain, enough for over 100 epochs of sampling (200 steps each): every kernel
#: keeps one draw per ~8 steps here (SGHMC once kept one per ~30; with 600 draws it then
#: sampled for 44 epochs, under the hundred this test is about).
NUM_SAMPLES = {"SGHMC": 2500, "SGLD": 2500, "PSGLD": 2500}


@pytest.mark.parametrize("kernel", [SGHMC, SGLD, PSGLD], ids=lambda k: k.__name__)
def test_the_defaults_converge_on_twenty_thousand_rows(data, kernel):
    x, y = data
    pyro.set_rng_seed(1)
    num_samples = NUM_SAMPLES[kernel.__name__]
    mcmc = MCMC(kernel(BayesianRegression(3), batch_size=100), num_samples=num_samples,
                warmup_steps=200, num_chains=2, disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not converged", no sampler warning
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        mcmc.run(x, y)
    samples = mcmc.get_samples(group_by_chain=True)
    draws = (
        torch.cat(
            [samples["linear.weight"].reshape(2, -1, 3), samples["linear.bias"].reshape(2, -1, 1)],
            -1,
        )
        .double()
        .numpy()
    )
    sigma_draws = samples["sigma"].double().numpy()[..., None]
    mean, sd, sigma = _large_sample_posterior(x, y)
    # one kept draw is worth about one effective draw
    assert effective_sample_size(draws).min() >= 0.3 * 2 * num_samples
    assert effective_sample_size(sigma_draws).min() >= 0.3 * 2 * num_samples
    assert_mean_close(draws, mean, z=4.0)
    assert_mean_close(sigma_draws, np.array([sigma]), z=4.0)
    # spreads within the stated bias of the rules plus Monte Carlo error (ESS >= 360)
    np.testing.assert_allclose(draws.reshape(-1, 4).std(0), sd, rtol=0.2)
    np.testing.assert_allclose(sigma_draws.std(), sigma / np.sqrt(2 * ROWS), rtol=0.2)
    steps = mcmc.diagnostics()["num_steps"]["chain 0"]
    assert steps * 100 / ROWS >= 100  # over a hundred epochs
