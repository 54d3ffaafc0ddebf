"""LeNet5: a PyroModule CNN with PyroSample priors -- shapes, sites, prior, potentials, sampling."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import MCMC
from pyro.infer.mcmc.util import initialize_model

from pyro_sgmcmc import SGHMC
from pyro_sgmcmc.engine.layout import FlatLayout
from pyro_sgmcmc.models.functional_potential import FunctionalPotential
from pyro_sgmcmc.models.potential_choice import make_potential
from pyro_sgmcmc.models.potentials import TracePotential
from pyro_sgmcmc.models.structure import inspect_model
from pyro_sgmcmc.nn import LeNet5

SHAPES = {
    "conv1.weight": (6, 1, 5, 5),
    "conv1.bias": (6,),
    "conv2.weight": (16, 6, 5, 5),
    "conv2.bias": (16,),
    "fc1.weight": (120, 400),
    "fc1.bias": (120,),
    "fc2.weight": (84, 120),
    "fc2.bias": (84,),
    "fc3.weight": (10, 84),
    "fc3.bias": (10,),
}


@pytest.fixture
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _images(n: int, seed: int = 0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 784, generator=generator, dtype=dtype)
    y = torch.randint(0, 10, (n,), generator=generator)
    return x, y


def test_sites_shapes_and_logits():
    model = LeNet5()
    x, y = _images(5)
    trace = poutine.trace(model).get_trace(x, y)
    latent = {
        name: tuple(trace.nodes[name]["value"].shape)
        for name in trace.stochastic_nodes
        if name != "data"  # the plate's own site
    }
    assert latent == SHAPES
    assert sum(math.prod(s) for s in SHAPES.values()) == 61706
    obs = trace.nodes["obs"]
    assert obs["is_observed"] and [f.name for f in obs["cond_indep_stack"]] == ["data"]
    assert isinstance(obs["fn"], dist.Categorical)
    for shape in [(5, 784), (5, 28, 28), (5, 1, 28, 28)]:
        assert model(x.reshape(shape)).shape == (5, 10)
    assert LeNet5(num_classes=3, activation="tanh")(x).shape == (5, 3)
    assert LeNet5(in_channels=3)(torch.rand(2, 3, 28, 28)).shape == (2, 10)


def test_prior_is_normal_with_the_given_scale():
    model = LeNet5(prior_scale=0.5)
    trace = poutine.trace(model).get_trace(*_images(3))
    trace.compute_log_prob()
    for name, shape in SHAPES.items():
        site = trace.nodes[name]
        fn = site["fn"]
        assert fn.event_shape == shape and fn.batch_shape == ()
        value = site["value"]
        expected = dist.Normal(0.0, 0.5).log_prob(value).sum()
        torch.testing.assert_close(site["log_prob_sum"], expected)
    draws = torch.stack([poutine.trace(model).get_trace(*_images(3)).nodes["fc1.weight"]["value"]
                         for _ in range(3)])  # fmt: skip
    assert abs(float(draws.std()) - 0.5) < 0.01


@pytest.mark.parametrize("bad", [{"prior_scale": 0.0}, {"prior_scale": -1}, {"activation": "elu"}])
def test_bad_arguments_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        LeNet5(**bad)


def _potentials(model, data, num_chains=2):
    structure = inspect_model(model, data, {})
    model = structure.model
    setup = structure.plate.bind_for_setup(model, data, {})
    starts = []
    for c in range(num_chains):
        pyro.set_rng_seed(c)
        initial, _, transforms, _ = initialize_model(setup[0], setup[1], setup[2])
        starts.append(initial)
    start = {name: torch.stack([s[name] for s in starts]) for name in structure.latent_sites}
    layout = FlatLayout({name: value.shape[1:] for name, value in start.items()})
    trace = TracePotential(model, data, {}, transforms, layout, structure.num_data,
                           plate=structure.plate)  # fmt: skip
    auto = make_potential("auto", model, data, {}, transforms, layout, structure.plate, start,
                          structure.sample_sites)  # fmt: skip
    return structure, trace, auto, layout.flatten(start)


def test_functional_potential_equals_trace_potential(float64):
    x, y = _images(24, dtype=torch.float64)
    _, trace, auto, flat = _potentials(LeNet5(), (x, y))
    assert isinstance(auto, FunctionalPotential)  # what the kernels pick for this model
    generator = torch.Generator().manual_seed(1)
    rows = torch.stack([torch.randperm(24, generator=generator)[:8] for _ in range(2)])
    value_t, grad_t = trace.value_and_grad(flat, {}, rows)
    value_f, grad_f = auto.value_and_grad(flat, {}, rows)
    assert value_f.dtype == torch.float64 and value_f.shape == (2,)
    assert grad_f.shape == flat.shape
    torch.testing.assert_close(value_f, value_t, rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(grad_f, grad_t, rtol=1e-10, atol=1e-8)
    assert auto.fallback is None


def test_potential_is_prior_plus_scaled_minibatch_likelihood(float64):
    x, y = _images(24, dtype=torch.float64)
    _, _, auto, flat = _potentials(LeNet5(), (x, y), num_chains=1)
    rows = torch.tensor([[2, 5, 11, 17]])
    value, _ = auto.value_and_grad(flat, {}, rows)
    params = {k: v[0] for k, v in auto.layout.unflatten(flat).items()}
    log_prior = sum(dist.Normal(0.0, 1.0).log_prob(v).sum() for v in params.values())
    logits = torch.func.functional_call(_plain_net(), params, (x[rows[0]],))
    log_lik = dist.Categorical(logits=logits).log_prob(y[rows[0]]).sum()
    torch.testing.assert_close(value[0], -(log_prior + 24 / 4 * log_lik))


def _plain_net():
    """A deterministic torch LeNet-5 with LeNet5's parameter names (for functional_call)."""
    from torch import nn

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.fc1, self.fc2, self.fc3 = (
                nn.Linear(400, 120),
                nn.Linear(120, 84),
                nn.Linear(84, 10),
            )

        def forward(self, x):
            pool, relu = torch.nn.functional.max_pool2d, torch.relu
            h = pool(relu(self.conv1(x.reshape(-1, 1, 28, 28))), 2)
            h = pool(relu(self.conv2(h)), 2)
            return self.fc3(relu(self.fc2(relu(self.fc1(h.flatten(1))))))

    return Plain()


# random labels: the warm-up's check rightly says the classifier is no better than chance
CHANCE = "ignore:.*no better than always predicting"


@pytest.mark.filterwarnings(CHANCE)
def test_short_sghmc_run_through_mcmc_is_finite():
    x, y = _images(64)
    kernel = SGHMC(LeNet5(), learning_rate=1e-2, batch_size=16, num_steps_per_sample=2, seed=0)
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=2, disable_progbar=True)
    mcmc.run(x, y)
    samples = mcmc.get_samples()
    assert set(samples) == set(SHAPES)
    for name, shape in SHAPES.items():
        assert samples[name].shape == (5, *shape)
        assert torch.isfinite(samples[name]).all()
    assert not torch.equal(samples["fc3.bias"][0], samples["fc3.bias"][-1])


@pytest.mark.filterwarnings(CHANCE)
def test_adaptive_warmup_runs_on_lenet():
    """No step size: the adaptive warm-up picks one; the draws stay finite."""
    x, y = _images(64)
    kernel = SGHMC(LeNet5(), batch_size=16, num_steps_per_sample=4, seed=0)
    mcmc = MCMC(kernel, num_samples=3, warmup_steps=10, disable_progbar=True)
    mcmc.run(x, y)
    samples = mcmc.get_samples()
    assert all(torch.isfinite(v).all() for v in samples.values())
