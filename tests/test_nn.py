"""BayesianMLP: Pyro path vs fast path, the data-plate contract, and every inference engine."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

from pyro_sgmcmc import PSGLD, SGHMC, SGLD
from pyro_sgmcmc.engine.layout import FlatLayout
from pyro_sgmcmc.models.initialization import find_map, init_to_prior
from pyro_sgmcmc.models.potentials import LogJointPotential, TracePotential
from pyro_sgmcmc.models.structure import inspect_model
from pyro_sgmcmc.nn import (
    BayesianMLP,
    CategoricalLikelihood,
    GammaPrecision,
    HeteroscedasticNormalLikelihood,
    NormalLikelihood,
    NormalPrior,
    ScaleMixtureNormal,
    ScaleMixturePrior,
)

HEADS = {
    "normal-fixed": lambda: NormalLikelihood(0.7),
    "normal-latent-scale": lambda: NormalLikelihood(scale=dist.LogNormal(0.0, 1.0)),
    "normal-gamma-precision": lambda: NormalLikelihood(precision=GammaPrecision(2.0, 0.5)),
    "heteroscedastic": HeteroscedasticNormalLikelihood,
    "categorical": CategoricalLikelihood,
}
PRIORS = {
    "normal": lambda: NormalPrior(0.8),
    "scale-mixture": lambda: ScaleMixturePrior(0.3, 1.0, 0.1),
    "gamma-precision": lambda: GammaPrecision(2.0, 3.0),
}


def make_data(head: str, num_data: int = 24, out_features: int = 1, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_data, 3, generator=generator)
    if head == "categorical":
        return x, torch.randint(0, 3, (num_data,), generator=generator), 3
    shape = (num_data,) if out_features == 1 else (num_data, out_features)
    return x, torch.randn(shape, generator=generator), out_features


def make_model(head: str, prior: str, out_features: int = 1):
    x, y, out = make_data(head, out_features=out_features)
    model = BayesianMLP(
        3, [4], out, activation="tanh", likelihood=HEADS[head](), prior=PRIORS[prior]()
    )
    return model, x, y


def prior_draw(model, x, y, seed=1):
    pyro.set_rng_seed(seed)
    trace = poutine.trace(model).get_trace(x, y)
    return {name: trace.nodes[name]["value"].detach() for name in model.latent_sites}


@pytest.mark.parametrize("prior", sorted(PRIORS))
@pytest.mark.parametrize("head", sorted(HEADS))
@pytest.mark.parametrize("minibatch", [False, True])
def test_fast_path_equals_trace_potential(head, prior, minibatch):
    model, x, y = make_model(head, prior)
    params = prior_draw(model, x, y)
    subsample = torch.tensor([3, 17, 5, 11, 0]) if minibatch else None

    data = dict(params)
    if subsample is not None:
        data["data"] = subsample
    trace = poutine.trace(poutine.condition(model, data=data)).get_trace(x, y)
    expected = trace.log_prob_sum()
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    fast = model.log_joint(leaves, subsample, x, y)
    assert torch.allclose(fast, expected, rtol=1e-5, atol=1e-4), (float(fast), float(expected))

    # Gradients of the two paths, through the potentials the kernels use (unconstrained space).
    structure = inspect_model(model, (x, y), {})
    from pyro.infer.mcmc.util import initialize_model

    _, _, transforms, _ = initialize_model(model, model_args=(x, y))
    z = {k: transforms[k](v).unsqueeze(0) for k, v in params.items()}
    layout = FlatLayout({k: v.shape[1:] for k, v in z.items()})
    rows = None if subsample is None else subsample.unsqueeze(0)
    grads = []
    for potential in (
        LogJointPotential(model, (x, y), {}, transforms, layout, x.shape[0]),
        TracePotential(model, (x, y), {}, transforms, layout, x.shape[0]),
    ):
        _, grad = potential.value_and_grad(layout.flatten(z), {}, rows)
        grads.append(layout.unflatten(grad[0]))
    for name in structure.latent_sites:
        assert torch.allclose(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-4), name


@pytest.mark.parametrize("head", ["normal-fixed", "normal-gamma-precision", "categorical"])
def test_likelihood_temperature_powers_only_the_likelihood(head):
    """log p(theta) + (1/T) (N/B) sum log p(y | theta) in the trace, the fast path and the
    closed-form gradient; the prior keeps scale 1."""
    x, y, out = make_data(head)
    temperature = 0.25
    model = BayesianMLP(
        3, [4], out, activation="tanh", likelihood=HEADS[head](), prior=NormalPrior(0.8),
        likelihood_temperature=temperature,
    )  # fmt: skip
    untempered = BayesianMLP(
        3, [4], out, activation="tanh", likelihood=HEADS[head](), prior=NormalPrior(0.8)
    )
    params = prior_draw(model, x, y)
    subsample = torch.tensor([3, 17, 5, 11, 0])
    trace = poutine.trace(poutine.condition(model, data={**params, "data": subsample})).get_trace(
        x, y
    )
    trace.compute_log_prob()
    assert trace.nodes["obs"]["scale"] == pytest.approx(x.shape[0] / 5 / temperature)
    assert all(trace.nodes[name]["scale"] == 1.0 for name in model.latent_sites)
    log_prior = untempered.log_prior(params)
    log_lik = untempered.log_joint(params, subsample, x, y) - log_prior
    expected = log_prior + log_lik / temperature
    assert torch.allclose(trace.log_prob_sum(), expected, rtol=1e-5, atol=1e-3)
    assert torch.allclose(model.log_joint(params, subsample, x, y), expected, rtol=1e-5, atol=1e-3)
    if model.has_analytic_gradient:
        stacked = {k: v.unsqueeze(0) for k, v in params.items()}
        value, grads = model.log_joint_and_gradient(stacked, subsample.unsqueeze(0), x, y)
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        autograd = torch.autograd.grad(
            model.log_joint(leaves, subsample, x, y), list(leaves.values())
        )
        assert torch.allclose(value[0], expected, rtol=1e-5, atol=1e-3)
        for name, g in zip(leaves, autograd, strict=True):
            assert torch.allclose(grads[name][0], g, rtol=1e-4, atol=1e-4), name
    if head == "normal-gamma-precision":  # the Gibbs conditional of the noise precision
        (update,) = model.gibbs_updates()
        conditional = update.conditional(params, x, y)
        residuals = model.residuals(params, slice(None), x, y)
        alpha, beta = 2.0, 0.5
        torch.testing.assert_close(
            conditional.concentration.double(),
            torch.tensor(alpha + 0.5 * residuals.numel() / temperature, dtype=torch.float64),
        )
        torch.testing.assert_close(
            conditional.rate.double(),
            beta + 0.5 * residuals.double().square().sum() / temperature,
        )


def test_multi_output_regression_fast_path():
    model, x, y = make_model("normal-fixed", "normal", out_features=2)
    params = prior_draw(model, x, y)
    trace = poutine.trace(poutine.condition(model, data=params)).get_trace(x, y)
    assert torch.allclose(model.log_joint(params, None, x, y), trace.log_prob_sum(), rtol=1e-5)


@pytest.mark.parametrize("prior", sorted(PRIORS))
@pytest.mark.parametrize("head", ["normal-gamma-precision", "heteroscedastic", "categorical"])
def test_priors_are_never_scaled_by_the_minibatch_factor(head, prior):
    model, x, y = make_model(head, prior)
    params = prior_draw(model, x, y)
    subsample = torch.tensor([2, 9, 4])
    trace = poutine.trace(poutine.condition(model, data={**params, "data": subsample})).get_trace(
        x, y
    )
    trace.compute_log_prob()
    num_data, batch = x.shape[0], subsample.shape[0]
    for name in model.latent_sites:
        site = trace.nodes[name]
        assert site["scale"] == 1.0, name
        assert not site["cond_indep_stack"], name
        unscaled = site["fn"].log_prob(site["value"]).sum()
        assert torch.allclose(site["log_prob_sum"], unscaled), name
        assert site["value"].shape == model.site_shapes()[name]
    assert trace.nodes["obs"]["scale"] == pytest.approx(num_data / batch)
    # The whole prior part equals the fast path's prior with no N/B factor.
    prior_sum = sum(trace.nodes[name]["log_prob_sum"] for name in model.latent_sites)
    assert torch.allclose(prior_sum, model.log_prior(params), rtol=1e-5, atol=1e-4)


def test_site_names_and_predictive_output():
    model = BayesianMLP(3, [4, 2], 3, likelihood="categorical", prior=GammaPrecision(1.0, 1.0))
    assert model.latent_sites == (
        "layers.0.weight_precision",
        "layers.0.weight",
        "layers.0.bias_precision",
        "layers.0.bias",
        "layers.1.weight_precision",
        "layers.1.weight",
        "layers.1.bias_precision",
        "layers.1.bias",
        "layers.2.weight_precision",
        "layers.2.weight",
        "layers.2.bias_precision",
        "layers.2.bias",
    )
    x = torch.randn(7, 3)
    draws = [prior_draw(model, x, None, seed=s) for s in range(5)]
    draws = {name: torch.stack([d[name] for d in draws]) for name in model.latent_sites}
    samples = pyro.infer.Predictive(model, posterior_samples=draws)(x)
    assert samples["output"].shape == (5, 7, 3)
    assert samples["obs"].shape == (5, 7)
    assert torch.allclose(model.functional_forward(draws, x), samples["output"], atol=1e-5)


def test_scale_mixture_distribution():
    d = ScaleMixtureNormal(0.25, 2.0, 0.1)
    w = torch.linspace(-3, 3, 11)
    expected = torch.log(
        0.25 * dist.Normal(0.0, 2.0).log_prob(w).exp()
        + 0.75 * dist.Normal(0.0, 0.1).log_prob(w).exp()
    )
    assert torch.allclose(d.log_prob(w), expected, atol=1e-5)
    # Sample variance vs pi s1^2 + (1 - pi) s2^2, within 5 standard errors.
    torch.manual_seed(0)
    draws = d.expand((200_000,)).sample()
    var = float(d.variance)
    fourth = 3 * (0.25 * 2.0**4 + 0.75 * 0.1**4)
    se = math.sqrt((fourth - var**2) / draws.numel())
    assert abs(float(draws.square().mean()) - var) < 5 * se
    assert d.expand((3, 2)).batch_shape == (3, 2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(in_features=0, hidden_features=[2], out_features=1), "in_features"),
        (dict(in_features=2, hidden_features=[0], out_features=1), "hidden_features"),
        (dict(in_features=2, hidden_features=[2], out_features=1, activation="nope"), "activation"),
        (
            dict(in_features=2, hidden_features=[2], out_features=1, likelihood="poisson"),
            "likelihood",
        ),
        (dict(in_features=2, hidden_features=[2], out_features=1, prior="laplace"), "prior"),
        (
            dict(in_features=2, hidden_features=[2], out_features=1, likelihood_temperature=0.0),
            "likelihood_temperature must be > 0",
        ),
        (
            dict(in_features=2, hidden_features=[2], out_features=1, likelihood="categorical"),
            "out_features",
        ),
    ],
)
def test_constructor_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BayesianMLP(**kwargs)


@pytest.mark.parametrize(
    "factory, message",
    [
        (lambda: NormalPrior(0.0), "scale"),
        (lambda: ScaleMixturePrior(1.0, 1.0, 0.1), "mixture_weight"),
        (lambda: ScaleMixturePrior(0.5, -1.0, 0.1), "scale1"),
        (lambda: GammaPrecision(0.0, 1.0), "alpha"),
        (lambda: GammaPrecision(1.0, -2.0), "beta"),
        (lambda: NormalLikelihood(scale=-1.0), "scale"),
        (lambda: NormalLikelihood(scale=dist.Normal(0.0, 1.0)), "positive support"),
        (lambda: NormalLikelihood(1.0, precision=GammaPrecision()), "at most one"),
    ],
)
def test_prior_and_head_validation(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


ENGINE_CASES = [(head, "normal") for head in sorted(HEADS)] + [
    ("categorical", "scale-mixture"),
    ("normal-gamma-precision", "gamma-precision"),
]


def _check_draws(samples, model, num):
    assert set(samples) >= set(model.latent_sites)
    for name in model.latent_sites:
        assert samples[name].shape == (num, *model.site_shapes()[name])
        assert torch.isfinite(samples[name]).all()


@pytest.mark.parametrize("head, prior", ENGINE_CASES)
def test_runs_under_nuts(head, prior):
    model, x, y = make_model(head, prior)
    pyro.set_rng_seed(0)
    mcmc = MCMC(NUTS(model, max_tree_depth=2), num_samples=3, warmup_steps=2, disable_progbar=True)
    mcmc.run(x, y)
    _check_draws(mcmc.get_samples(), model, 3)


@pytest.mark.parametrize("kernel_class", [SGLD, SGHMC, PSGLD])
@pytest.mark.parametrize("head, prior", ENGINE_CASES)
def test_runs_under_sgmcmc_kernels(head, prior, kernel_class):
    model, x, y = make_model(head, prior)
    step = dict(learning_rate=1e-3) if kernel_class is PSGLD else dict(step_size=1e-4)
    kernel = kernel_class(model, batch_size=8, num_steps_per_sample=2, seed=3, **step)
    mcmc = MCMC(kernel, num_samples=4, warmup_steps=2, disable_progbar=True)
    mcmc.run(x, y)
    _check_draws(mcmc.get_samples(), model, 4)


@pytest.mark.parametrize("head, prior", ENGINE_CASES)
def test_runs_under_svi_with_autonormal(head, prior):
    model, x, y = make_model(head, prior)
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    guide = AutoNormal(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    losses = [svi.step(x, y) for _ in range(5)]
    assert all(math.isfinite(v) for v in losses)
    assert set(guide().keys()) == set(model.latent_sites)


def test_gibbs_updates_are_used_automatically():
    model, x, y = make_model("normal-gamma-precision", "gamma-precision")
    kernel = SGLD(model, step_size=1e-4, batch_size=8, seed=0)
    kernel.setup(0, x, y)
    engine = kernel._chains.engine
    assert set(engine.gibbs.sites) == {s for s in model.latent_sites if s.endswith("precision")}
    assert set(engine.fixed) == set(engine.gibbs.sites)
    assert isinstance(kernel._chains.potential, LogJointPotential)


def _log_joint_potential(model, x, y):
    """The kernels' ``log_joint`` potential of ``model`` over all its sites (unconstrained)."""
    from pyro.infer.mcmc.util import initialize_model

    _, _, transforms, _ = initialize_model(model, model_args=(x, y))
    shapes = {name: model.site_shapes()[name] for name in model.latent_sites}
    layout = FlatLayout(shapes)
    return LogJointPotential(model, (x, y), {}, transforms, layout, x.shape[0]), layout


@pytest.mark.parametrize(
    "head, prior",
    [
        ("normal-gamma-precision", "normal"),
        ("normal-latent-scale", "normal"),
        ("normal-fixed", "scale-mixture"),
    ],
)
def test_log_joint_potential_replays_a_recorded_graph_bit_for_bit(head, prior):
    """Without a closed form, the value and gradient are replayed on the CPU from one recorded
    graph per signature (rows, chains), with the bits of autograd through ``log_joint``."""
    model, x, y = make_model(head, prior)
    potential, layout = _log_joint_potential(model, x, y)
    generator = torch.Generator().manual_seed(1)
    flat = 0.3 * torch.randn(3, layout.dimension, generator=generator)
    for call in range(4):
        moved = flat + 0.1 * call
        rows = torch.randint(0, x.shape[0], (3, 8), generator=generator)
        value, grad = potential.value_and_grad(moved, {}, rows)
        eager_value, eager_grad = potential._autograd_value_and_grad(moved, {}, rows)
        assert torch.equal(value, eager_value) and torch.equal(grad, eager_grad), call
    captured = potential.captured
    assert captured is not None and captured.failure is None
    assert len(captured.graphs) == 1  # the first call was eager, the second recorded


class _DecidesOnAValue:
    """A ``log_joint`` that branches in Python on a latent value: it cannot be recorded."""

    def log_joint(self, params, subsample, x, y):
        w = params["w"]
        scale = 1.0 if float(w.detach().sum()) > 0 else 2.0
        residual = y[subsample] - (x[subsample] @ w.unsqueeze(-1)).squeeze(-1)
        return -0.5 * w.square().sum(-1) - 0.5 * scale * residual.square().sum(-1)


def test_log_joint_potential_that_cannot_be_recorded_stays_eager():
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 2, generator=generator), torch.randn(20, generator=generator)
    identity = torch.distributions.transforms.identity_transform
    layout = FlatLayout({"w": torch.Size([2])})
    potential = LogJointPotential(_DecidesOnAValue(), (x, y), {}, {"w": identity}, layout, 20)
    rows = torch.arange(5).expand(1, -1)
    for sign in (1.0, -1.0, 1.0, -1.0):  # the branch taken changes with the value
        flat = torch.full((1, 2), sign)
        value, _ = potential.value_and_grad(flat, {}, rows)
        assert torch.equal(value, potential(layout.unflatten(flat), rows))
    assert potential.captured.failure is not None and potential.captured.graphs == {}


def test_heteroscedastic_head_recovers_input_dependent_noise():
    # y = sin(2x) + eps, sd(x) = 0.1 + 0.25 (x + 1): 0.1 at x = -1, 0.6 at x = 1.
    generator = torch.Generator().manual_seed(0)
    num_data = 2000
    x = torch.rand(num_data, 1, generator=generator) * 2 - 1
    true_sd = 0.1 + 0.25 * (x.squeeze(-1) + 1)
    y = torch.sin(2 * x.squeeze(-1)) + true_sd * torch.randn(num_data, generator=generator)
    model = BayesianMLP(1, [16], 1, likelihood="heteroscedastic", prior=NormalPrior(1.0))
    values = find_map(
        model,
        x,
        y,
        num_steps=300,
        learning_rate=5e-2,
        seed=0,
        init_strategy=init_to_prior(0.1),
        return_values=True,
    )
    grid = torch.tensor([[-0.8], [-0.4], [0.0], [0.4], [0.8]])
    _, log_var = HeteroscedasticNormalLikelihood.split(model.functional_forward(values, grid), 1)
    fitted_sd = (0.5 * log_var.squeeze(-1)).exp()
    expected_sd = 0.1 + 0.25 * (grid.squeeze(-1) + 1)
    # About 200 rows fall within +-0.1 of each grid point: the relative standard error of a local
    # sd estimate is about 1/sqrt(2 * 200) = 5%; allow 4 of them = 20%.
    relative = (fitted_sd - expected_sd).abs() / expected_sd
    assert (relative < 0.2).all(), (fitted_sd, expected_sd)
    # A homoscedastic fit could not pass: the true sd varies by a factor 3.7 over the grid.
    assert fitted_sd[-1] / fitted_sd[0] > 2.5


def test_fused_scale_mixture_log_density_has_no_cancellation():
    """With a narrow component (sigma_2 = e^-6) the fused density must equal the mixture's
    log-sum-exp: summing a_2 + softplus(a_1 - a_2) over many weights lost about 1 nat in float32."""
    prior = ScaleMixturePrior(0.5, 1.0, math.exp(-6))
    weights = torch.randn(200, 100, generator=torch.Generator().manual_seed(0))
    fused = prior.log_prob({"w": weights}, "w")
    exact = prior.distribution().log_prob(weights.double()).sum()
    assert abs(float(fused) - float(exact)) < 1e-2
    leaf = weights.clone().requires_grad_(True)
    prior.log_prob({"w": leaf}, "w").backward()
    reference = weights.double().requires_grad_(True)
    prior.distribution().log_prob(reference).sum().backward()
    # float32 near the components' crossover, where the gradient changes fastest
    scale = float(reference.grad.abs().max())
    torch.testing.assert_close(leaf.grad.double(), reference.grad, rtol=1e-3, atol=1e-5 * scale)
