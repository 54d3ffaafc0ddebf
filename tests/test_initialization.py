"""Starting points: over-dispersed prior draws and the MAP fit."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.infer.mcmc.util import initialize_model

from pyro_sgmcmc import SGHMC
from pyro_sgmcmc.models.initialization import find_map, init_to_prior
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision


def test_init_to_prior_spreads_draws_by_scale():
    model = BayesianMLP(2, [50], 1, prior="normal")
    x, y = torch.randn(5, 2), torch.randn(5)
    pyro.set_rng_seed(0)

    def weights(scale):
        params, *_ = initialize_model(model, model_args=(x, y), init_strategy=init_to_prior(scale))
        return params["layers.0.weight"].flatten()

    base = torch.cat([weights(1.0) for _ in range(4)])
    wide = torch.cat([weights(3.0) for _ in range(4)])
    # The prior is N(0, 1) and its median 0: draws with scale s have sd s (up to the sample
    # median's noise). 400 draws: the sd estimate has relative standard error 1/sqrt(800).
    tolerance = 4.5 / math.sqrt(2 * base.numel())
    assert abs(float(base.std()) - 1.0) < tolerance + 0.05
    assert abs(float(wide.std()) / 3.0 - 1.0) < tolerance + 0.05


def test_init_to_prior_keeps_positive_sites_positive():
    model = BayesianMLP(2, [3], 1, prior=GammaPrecision(2.0, 2.0))
    pyro.set_rng_seed(1)
    for _ in range(5):
        _, _, transforms, _ = initialize_model(
            model, model_args=(torch.randn(4, 2), torch.randn(4))
        )
        params, *_ = initialize_model(
            model, model_args=(torch.randn(4, 2), torch.randn(4)), init_strategy=init_to_prior(5.0)
        )
        precision = transforms["layers.0.weight_precision"].inv(params["layers.0.weight_precision"])
        assert float(precision) > 0


def test_find_map_matches_closed_form_ridge_regression():
    # y = X w + N(0, s^2), w ~ N(0, t^2): the MAP is (X'X + s^2/t^2 I)^-1 X'y.
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 2.0).expand([3]).to_event(1))
        with pyro.plate("data", x.shape[0]) as idx:
            pyro.sample("obs", dist.Normal(x[idx] @ w, 0.5), obs=None if y is None else y[idx])

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.5 * torch.randn(200, generator=generator)
    ridge = torch.linalg.solve(x.T @ x + (0.25 / 4.0) * torch.eye(3), x.T @ y)
    values = find_map(model, x, y, num_steps=200, learning_rate=0.1, seed=0, return_values=True)
    assert torch.allclose(values["w"], ridge, atol=2e-3)
    assert values.losses[-1] < values.losses[0]

    # As an init strategy of a kernel, the chain starts at the MAP.
    kernel = SGHMC(model, step_size=1e-5, init_strategy=values.init_strategy(), seed=0)
    mcmc = MCMC(kernel, num_samples=1, warmup_steps=0, disable_progbar=True)
    mcmc.run(x, y)
    assert torch.allclose(mcmc.get_samples()["w"][0], ridge, atol=0.05)


def test_find_map_with_minibatches_returns_init_strategy():
    model = BayesianMLP(2, [4], 1)
    x, y = torch.randn(50, 2), torch.randn(50)
    strategy = find_map(model, x, y, num_steps=20, batch_size=10, seed=0)
    assert callable(strategy)
    kernel = SGHMC(model, step_size=1e-4, batch_size=10, init_strategy=strategy, seed=0)
    kernel.setup(0, x, y)
    assert set(kernel.initial_params) == set(model.latent_sites)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, x, y: find_map(m, x, y, num_steps=0), "num_steps"),
        (lambda m, x, y: find_map(m, x, y, learning_rate=0.0), "learning_rate"),
        (lambda m, x, y: find_map(m, x, y, batch_size=500), "batch_size"),
        (lambda m, x, y: init_to_prior(scale=-1.0), "scale"),
    ],
)
def test_validation(call, message):
    model = BayesianMLP(2, [3], 1)
    with pytest.raises(ValueError, match=message):
        call(model, torch.randn(10, 2), torch.randn(10))
