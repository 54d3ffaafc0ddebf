"""A network's coordinates that stay far outside their prior are named, moving or not; draws
inside the prior, a coordinate out for a moment, and models without hidden units are not."""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import torch
from pyro_tutorial_models import BayesianRegression

from pyro_sgmcmc import SGHMC, run_chains
from pyro_sgmcmc.engine.prior_distance import FAR_FROM_PRIOR, check_prior_distance
from pyro_sgmcmc.errors import SamplerWarning
from pyro_sgmcmc.models.structure import inspect_model
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision, NormalLikelihood, NormalPrior


def _network_and_prior_draws(num_draws: int = 40, seed: int = 0):
    """A 3-8-1 ReLU network with N(0, 2^2) weights, its data, and two chains of prior draws."""
    generator = torch.Generator().manual_seed(seed)
    likelihood = NormalLikelihood(precision=GammaPrecision(2.0, 0.5))
    model = BayesianMLP(3, [8], 1, activation="relu", prior=NormalPrior(2.0), likelihood=likelihood)
    x, y = torch.randn(50, 3, generator=generator), torch.randn(50, generator=generator)
    pyro.clear_param_store()
    structure = inspect_model(model, (x, y), {})
    shapes = {"layers.0.weight": (8, 3), "layers.0.bias": (8,), "layers.1.weight": (1, 8),
              "layers.1.bias": (1,)}  # fmt: skip
    draws = {
        name: 2.0 * torch.randn(2, num_draws, *shape, generator=generator)
        for name, shape in shapes.items()
    }
    # a noise precision far above its Gamma(2, 0.5) prior (mean 4, sd 2.8), as a network that
    # fits well puts it: identified by every row, not named
    draws["noise_precision"] = 1000.0 + torch.rand(2, num_draws, generator=generator)
    return model, (x, y), structure.plate, draws


def test_a_weight_far_outside_its_prior_is_named_though_it_moves():
    model, args, plate, draws = _network_and_prior_draws()
    assert check_prior_distance(model, args, {}, draws, plate, [0, 1]) == []
    # chain 1: one first-layer weight at 290 under N(0, 2^2), still moving (Euler's SGHMC on
    # the 50,000-row family); the bias of another unit far out too
    draws["layers.0.weight"][1, :, 4, 2] = 290.0 + torch.linspace(0.0, 3.0, 40)
    draws["layers.0.bias"][1, :, 6] = -713.0
    messages = check_prior_distance(model, args, {}, draws, plate, [0, 7])
    assert len(messages) == 2
    weight = next(m for m in messages if "'layers.0.weight'" in m)
    assert weight.startswith("chain 7: 1 of 24 coordinates of site 'layers.0.weight' lie more")
    assert "layers.0.weight[4, 2] = 293" in weight and "0 +- 2 (" in weight
    assert "(145 standard deviations" in weight
    assert any("layers.0.bias[6] = -713" in m for m in messages)


def test_a_coordinate_far_out_for_a_moment_is_not_named():
    model, args, plate, draws = _network_and_prior_draws()
    draws["layers.1.weight"][0, ::2, 0, 3] = 100.0  # far out in every other draw only
    assert check_prior_distance(model, args, {}, draws, plate, [0, 1]) == []
    # just inside the bound in every draw: not named; just outside: named
    draws["layers.1.weight"][0, :, 0, 3] = 2.0 * FAR_FROM_PRIOR - 0.01
    assert check_prior_distance(model, args, {}, draws, plate, [0, 1]) == []
    draws["layers.1.weight"][0, :, 0, 3] = 2.0 * FAR_FROM_PRIOR + 0.01
    assert len(check_prior_distance(model, args, {}, draws, plate, [0, 1])) == 1


def _scale_mixture_network(x, y):
    """A one-hidden-layer network whose first layer has a sampled prior scale and whose output
    weights have a Cauchy prior (no mean or standard deviation)."""
    scale = pyro.sample("scale", dist.HalfNormal(1.0))
    w1 = pyro.sample("w1", dist.Normal(0.0, scale).expand([3, 8]).to_event(2))
    w2 = pyro.sample("w2", dist.Cauchy(0.0, 1.0).expand([8, 1]).to_event(2))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal((torch.relu(x @ w1) @ w2).squeeze(-1), 1.0), obs=y)


def test_the_prior_is_taken_at_the_draw_and_priors_without_moments_are_skipped():
    generator = torch.Generator().manual_seed(2)
    x, y = torch.randn(30, 3, generator=generator), torch.randn(30, generator=generator)
    plate = inspect_model(_scale_mixture_network, (x, y), {}).plate
    draws = {
        "scale": torch.full((1, 20), 0.01),
        "w1": 0.01 * torch.randn(1, 20, 3, 8, generator=generator),
        "w2": torch.full((1, 20, 8, 1), 1e4),  # a Cauchy's tail: not judged
    }
    assert check_prior_distance(_scale_mixture_network, (x, y), {}, draws, plate, [0]) == []
    draws["w1"][0, :, 1, 1] = 0.5  # 0.5 is 50 sds out where the scale is 0.01
    (message,) = check_prior_distance(_scale_mixture_network, (x, y), {}, draws, plate, [0])
    assert "site 'w1'" in message and "(50 standard deviations" in message


def _far_messages(caught) -> list[str]:
    return [
        str(w.message)
        for w in caught
        if issubclass(w.category, SamplerWarning) and "prior standard deviations" in str(w.message)
    ]


def test_a_regression_coefficient_far_outside_a_misjudged_prior_is_its_posterior():
    """No hidden units: a coefficient of 60 under N(0, 1) is what the data say, not a sick
    chain, and is not named."""
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(500, 3, generator=generator)
    y = x @ torch.tensor([60.0, -2.0, 0.5]) + 0.5 * torch.randn(500, generator=generator)
    sampler = SGHMC(BayesianRegression(3), batch_size=50, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_chains(sampler, x, y, num_chains=1, num_samples=50, warmup_steps=200)
    weight = result.get_samples()["linear.weight"]
    assert float(weight[:, 0, 0].mean()) > 40.0  # far out under N(0, 1): the check would fire
    assert _far_messages(caught) == []


def test_a_healthy_network_run_is_not_named():
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(400, 2, generator=generator)
    y = torch.sin(2.0 * x[:, 0]) + 0.1 * torch.randn(400, generator=generator)
    model = BayesianMLP(2, [16], 1, activation="tanh")
    sampler = SGHMC(model, batch_size=50, seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_chains(sampler, x, y, num_chains=2, num_samples=40, warmup_steps=200)
    assert _far_messages(caught) == []
