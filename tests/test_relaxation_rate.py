"""Where the minibatch gradient noise binds the step, a coordinate relaxes about :math:`c_V T`
times per epoch, whatever the kernel (docs/export-diagnostics.md, "Why a network on thousands of
rows is told 'not converged'").

The target is the mean of :math:`N` unit-variance rows. Its curvature is :math:`H = N` and the
noise of a minibatch gradient :math:`V = N^2 / B` per unit variance, so :math:`H = (B/N) V`
exactly, the step the bound allows is :math:`e = c_V b T / V` and a draw kept every epoch
(:math:`N/B` steps) has autocorrelation :math:`(1 - e H / b)^{N/B} \\approx \\exp(-c_V T)`. With
the control variate the gradient noise of this linear-Gaussian likelihood vanishes, the bound no
longer binds, and the draws kept every epoch are about independent.
"""

from __future__ import annotations

import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import SGHMC, SGLD, run_chains
from pyro_sgmcmc.engine.adaptation import NOISE_BOUND

pytestmark = pytest.mark.slow

ROWS, BATCH, CHAINS, DRAWS = 10_000, 32, 4, 200


def gaussian_mean(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y)


def _epoch_autocorrelation(kernel_class, control_variate) -> float:
    y = 3.0 + torch.randn(ROWS, generator=torch.Generator().manual_seed(0))
    kernel = kernel_class(
        gaussian_mean,
        batch_size=BATCH,
        num_steps_per_sample=ROWS // BATCH,
        control_variate=control_variate,
        seed=1,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the short run's verdict, not what is tested here
        result = run_chains(kernel, y, num_chains=CHAINS, num_samples=DRAWS, warmup_steps=20)
    draws = result.samples["mu"].reshape(CHAINS, DRAWS).double().numpy()
    return float(np.mean([np.corrcoef(chain[:-1], chain[1:])[0, 1] for chain in draws]))


@pytest.mark.parametrize("kernel_class", [SGLD, SGHMC], ids=lambda k: k.__name__)
def test_a_noise_bound_coordinate_relaxes_about_c_v_t_per_epoch(kernel_class):
    # lag-one autocorrelation of an AR(1) with rho = 0.9 from 4 x 200 draws: standard error
    # about sqrt((1 - rho^2) / 800) = 0.015, and a downward bias of about (1 + 4 rho) / 200
    expected = float(np.exp(-NOISE_BOUND))
    assert abs(_epoch_autocorrelation(kernel_class, False) - expected) < 0.06


@pytest.mark.parametrize("kernel_class", [SGLD, SGHMC], ids=lambda k: k.__name__)
def test_the_control_variate_lifts_the_bound_on_a_linear_gaussian_likelihood(kernel_class):
    # independent draws: the estimate's standard error is 1 / sqrt(800) = 0.035
    assert abs(_epoch_autocorrelation(kernel_class, "auto")) < 0.15
