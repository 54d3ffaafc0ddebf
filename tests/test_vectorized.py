"""The vectorised multi-chain runner: statistics, independence of chains, shapes, export, errors."""

from __future__ import annotations

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_sgmcmc import PSGLD, SGHMC, SGLD, CheckpointError, ConstantSGD, _arviz
from pyro_sgmcmc.engine.estimators import ControlVariateGradient
from pyro_sgmcmc.engine.layout import FlatLayout
from pyro_sgmcmc.inference.vectorized import VectorizedResult, run_chains
from pyro_sgmcmc.models.potentials import LogJointPotential
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision, NormalLikelihood, ScaleMixturePrior

NUM_DATA, DIM = 50, 2
KERNELS = {"sgld": SGLD, "sghmc": SGHMC, "psgld": PSGLD, "constant_sgd": ConstantSGD}
RUN_OPTIONS = (
    "num_chains", "num_samples", "warmup_steps", "initial_params", "callback", "checkpoint_path",
    "checkpoint_every", "checkpoint_seconds", "resume_from", "overwrite",
)  # fmt: skip


def run(model, *args, kernel="sghmc", **options):
    """``run_chains`` of ``KERNELS[kernel](model, **kernel options)`` with the run options."""
    run_options = {k: options.pop(k) for k in RUN_OPTIONS if k in options}
    return run_chains(KERNELS[kernel](model, **options), *args, **run_options)


class GaussianMean:
    r"""``mu ~ N(0, I_2)``, ``y_i ~ N(mu, I_2)``: the posterior is ``N(sum y / (N+1), I/(N+1))``.

    ``log_joint`` accepts ``mu`` with a leading chain dimension and ``subsample`` of shape
    ``(C, B)``; it records the subsamples it was given.
    """

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def __call__(self, y: torch.Tensor) -> None:
        mu = pyro.sample("mu", dist.Normal(torch.zeros(DIM), 1.0).to_event(1))
        with pyro.plate("data", y.shape[0]) as idx:
            pyro.sample("obs", dist.Normal(mu, 1.0).to_event(1), obs=y[idx])

    def log_joint(self, params, subsample, y):
        mu = params["mu"]
        batched = mu.dim() == 2
        if subsample is not None:
            self.seen.append(subsample)
            yb, scale = y[subsample], y.shape[0] / subsample.shape[-1]
        else:
            yb, scale = (y.expand(mu.shape[0], *y.shape) if batched else y), 1.0
        prior = -0.5 * mu.square().sum(-1)
        residual = yb - (mu.unsqueeze(-2) if batched else mu)
        return prior - 0.5 * scale * residual.square().sum((-1, -2))


def pyro_gaussian_mean(y: torch.Tensor) -> None:
    """:class:`GaussianMean`'s model without its ``log_joint``."""
    mu = pyro.sample("mu", dist.Normal(torch.zeros(DIM), 1.0).to_event(1))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mu, 1.0).to_event(1), obs=y[idx])


@pytest.fixture
def gaussian_data():
    generator = torch.Generator().manual_seed(1)
    y = 1.5 + torch.randn(NUM_DATA, DIM, generator=generator)
    mean = y.sum(0) / (NUM_DATA + 1)
    return y, mean, 1.0 / (NUM_DATA + 1)


def _effective_z(draws: torch.Tensor, exact_mean: torch.Tensor, exact_var: float) -> torch.Tensor:
    """z-scores of the chain-averaged mean error; chains' means are independent estimates."""
    chain_means = draws.mean(1)  # (C, DIM)
    se = chain_means.std(0) / math.sqrt(chain_means.shape[0])
    return (chain_means.mean(0) - exact_mean) / se.clamp_min(1e-3 * math.sqrt(exact_var))


@pytest.mark.parametrize("kernel", ["sgld", "sghmc", "psgld"])
def test_matches_exact_gaussian_posterior(gaussian_data, kernel):
    y, mean, var = gaussian_data
    options = {"friction": 0.2} if kernel == "sghmc" else {}
    step = {"sgld": 2e-3, "sghmc": 2e-3, "psgld": 2e-3}[kernel]
    result = run(
        GaussianMean(),
        y,
        kernel=kernel,
        num_chains=8,
        num_samples=300,
        warmup_steps=50,
        num_steps_per_sample=5,
        step_size=step,
        batch_size=10,
        seed=0,
        **options,
    )
    draws = result.samples["mu"]
    assert draws.shape == (8, 300, DIM)
    assert (_effective_z(draws, mean, var).abs() < 4).all()
    # the stationary variance of a constant-step SG-MCMC is biased by O(step size): up to 35%
    # here, plus the Monte Carlo error of the estimate (from the spread of the chains' variances)
    relative = draws.reshape(-1, DIM).var(0).sub(var).abs().div(var)
    standard_error = draws.var(1).std(0) / math.sqrt(draws.shape[0]) / var
    assert (relative < 0.35 + 4 * standard_error).all()


def test_chains_are_independent_and_reproducible(gaussian_data):
    y, _, _ = gaussian_data
    options = {"num_chains": 3, "num_samples": 20, "step_size": 1e-3, "batch_size": 10}
    first = run(GaussianMean(), y, seed=0, **options).samples["mu"]
    again = run(GaussianMean(), y, seed=0, **options).samples["mu"]
    other = run(GaussianMean(), y, seed=1, **options).samples["mu"]
    assert torch.equal(first, again)
    assert not torch.allclose(first, other)
    # different chains: different starts and different paths
    assert not torch.allclose(first[0], first[1])
    assert not torch.allclose(first[1], first[2])


@pytest.mark.usefixtures("eager_log_joint")  # the model keeps the rows of every call
def test_each_chain_draws_its_own_minibatches(gaussian_data):
    y, _, _ = gaussian_data
    model = GaussianMean()
    run(model, y, num_chains=4, num_samples=5, step_size=1e-3, batch_size=10, seed=0)
    subsample = model.seen[-1]
    assert subsample.shape == (4, 10)
    assert len({tuple(sorted(row.tolist())) for row in subsample}) == 4
    # within an epoch (N / B = 5 steps) each chain sees every row once (the first call is the
    # set-up's check that log_joint takes a chain axis)
    epoch = torch.cat(model.seen[1:6], dim=1)
    for row in epoch:
        assert sorted(row.tolist()) == list(range(NUM_DATA))


def test_bnn_shapes_stats_and_export():
    x = torch.linspace(-1, 1, 24).unsqueeze(-1)
    y = torch.sin(3 * x.squeeze(-1))
    model = BayesianMLP(1, [5], 1, prior=GammaPrecision(1.0, 1.0))
    result = run(
        model, x, y, kernel="sghmc", num_chains=3, num_samples=7, warmup_steps=2,
        learning_rate=1e-2, batch_size=8, gibbs_every=3, seed=0,
    )  # fmt: skip
    assert isinstance(result, VectorizedResult)
    assert result.samples["layers.0.weight"].shape == (3, 7, 5, 1)
    precision = result.samples["layers.0.weight_precision"]
    assert precision.shape == (3, 7) and (precision > 0).all()
    assert not torch.equal(precision[0], precision[1])  # per-chain Gibbs draws
    assert set(result.samples) == set(model.latent_sites)
    for name in ("lp", "step_size", "temperature", "diverging"):
        assert result.sample_stats[name].shape == (3, 7)
    assert result.sample_stats["step_size"][0, 0] == pytest.approx(1e-2 / 24)
    assert result.num_gradient_steps == 9
    idata = result.to_inference_data()
    assert idata.posterior["layers.0.weight"].shape == (3, 7, 5, 1)
    assert idata.posterior.attrs["sampling_time"] > 0
    assert "lp" in idata.sample_stats
    assert _arviz.rhat(_arviz.get_group(idata, "posterior"))["layers.0.bias"].shape == (5,)
    flat = result.get_samples()
    assert flat["layers.0.bias"].shape == (21, 5)


@pytest.mark.parametrize(
    "head, prior",
    [
        ("normal", "normal"),
        ("categorical", ScaleMixturePrior(0.5, 1.0, 0.1)),
        ("heteroscedastic", GammaPrecision(2.0, 1.0)),
        (NormalLikelihood(precision=GammaPrecision(2.0, 0.5)), "normal"),
        (NormalLikelihood(scale=dist.HalfNormal(1.0)), "normal"),
    ],
)
def test_batched_log_joint_equals_per_chain(head, prior):
    pyro.set_rng_seed(0)
    model = BayesianMLP(3, [4], 3, likelihood=head, prior=prior)
    x = torch.randn(12, 3)
    y = torch.randint(0, 3, (12,)) if model.head.is_classifier else torch.randn(12, 3)
    chains = []
    for _ in range(3):
        trace = pyro.poutine.trace(model).get_trace(x)
        chains.append({name: trace.nodes[name]["value"].detach() for name in model.latent_sites})
    stacked = {name: torch.stack([c[name] for c in chains]) for name in model.latent_sites}
    subsample = torch.stack([torch.randperm(12)[:5] for _ in range(3)])
    batched = model.log_joint(stacked, subsample, x, y)
    expected = torch.stack([model.log_joint(c, subsample[i], x, y) for i, c in enumerate(chains)])
    assert batched.shape == (3,)
    torch.testing.assert_close(batched, expected, rtol=1e-5, atol=1e-4)
    full = model.log_joint(stacked, None, x, y)
    torch.testing.assert_close(
        full, torch.stack([model.log_joint(c, None, x, y) for c in chains]), rtol=1e-5, atol=1e-4
    )


@pytest.mark.parametrize(
    "options, argument",
    [
        ({"num_chains": 0}, "num_chains"),
        ({"num_samples": 0}, "num_samples"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"batch_size": 51}, "batch_size"),
        ({"friction": 1.5}, "friction"),
        ({"temperature": 0.0}, "temperature"),
        ({"num_steps_per_sample": 0}, "num_steps_per_sample"),
        ({"step_size": -1.0}, "step_size"),
        ({"learning_rate": 1e-2}, "step_size"),
        ({"gradient_noise": 0.5, "friction": 0.1}, "gradient_noise"),
        ({"initial_params": {"nope": torch.zeros(2)}}, "initial_params"),
        ({"control_variate": {"mu": torch.zeros(3)}}, "control_variate"),
        ({"control_variate": {"nope": torch.zeros(2)}}, "control_variate"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"centre_iterations": 0}, "centre_iterations"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(gaussian_data, options, argument):
    y, _, _ = gaussian_data
    call = {"num_chains": 2, "num_samples": 2, "step_size": 1e-3, **options}
    with pytest.raises(ValueError, match=argument):
        run(GaussianMean(), y, **call)


def test_run_chains_takes_a_kernel_and_refuses_anything_else(gaussian_data):
    y, _, _ = gaussian_data
    with pytest.raises(TypeError, match=r"run_chains takes an SG-MCMC kernel.*got function"):
        run_chains(GaussianMean().__call__.__func__, y)
    with pytest.raises(TypeError, match="control_variate must be 'auto', True, False or a mapping"):
        run(GaussianMean(), y, step_size=1e-3, control_variate="map")
    with pytest.raises(TypeError, match="callback must be callable"):
        run(GaussianMean(), y, step_size=1e-3, callback=3)


def test_the_default_warmup_is_num_samples_as_in_pyro_mcmc(gaussian_data):
    """``run_chains(kernel, y)`` with every default works for the adaptive warm-up (a warm-up
    of 0 draws refused it): it warms up for ``num_samples`` draws, as ``pyro.infer.MCMC``
    does, and draws what the same warm-up given by hand draws; a warm-up of 0 stays refused."""
    y = gaussian_data[0]

    def draws(**options):
        kernel = SGHMC(pyro_gaussian_mean, batch_size=10, seed=3)
        return run_chains(kernel, y, num_chains=2, num_samples=40, **options)

    by_default = draws()
    assert torch.equal(by_default.samples["mu"], draws(warmup_steps=40).samples["mu"])
    assert by_default.num_draws == 40 and by_default.verdict is not None
    with pytest.raises(ValueError, match="needs at least 20 warm-up gradient steps"):
        draws(warmup_steps=0)


def test_models_without_a_batched_fast_path_run_chain_by_chain(gaussian_data):
    """Any model the kernels accept runs in run_chains: a trace-only model, and a model whose
    log_joint takes one set of parameters, both evaluated one chain at a time."""
    y, _, _ = gaussian_data

    def plain_model(y):
        GaussianMean()(y)

    class Unbatched(GaussianMean):
        def log_joint(self, params, subsample, y):
            if params["mu"].dim() != 1:
                raise ValueError("one set of parameters at a time")
            return super().log_joint(params, subsample, y)

    options = {"num_chains": 2, "num_samples": 3, "step_size": 1e-3, "batch_size": 10, "seed": 1}
    trace = run(plain_model, y, **options).samples["mu"]
    unbatched = run(Unbatched(), y, **options).samples["mu"]
    batched = run(GaussianMean(), y, **options).samples["mu"]
    assert trace.shape == unbatched.shape == batched.shape == (2, 3, DIM)
    torch.testing.assert_close(trace, batched)
    torch.testing.assert_close(unbatched, batched)


# ----------------------------------------------------------------------------- control variates
class LogisticRegression:
    """``w ~ N(0, I)``, ``y_i ~ Bernoulli(sigmoid(x_i w))``: a non-quadratic potential, so the
    control-variate gradient is random (for a Gaussian model it would be exact)."""

    def __call__(self, x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0]) as idx:
            pyro.sample("obs", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    def log_joint(self, params, subsample, x, y):
        w = params["w"]  # (C, D)
        if subsample is None:
            xb, yb, scale = x.expand(w.shape[0], *x.shape), y, 1.0
        else:
            xb, yb, scale = x[subsample], y[subsample], x.shape[0] / subsample.shape[-1]
        logits = (xb @ w.unsqueeze(-1)).squeeze(-1)
        log_lik = -torch.nn.functional.binary_cross_entropy_with_logits(
            logits, yb.expand_as(logits), reduction="none"
        ).sum(-1)
        return -0.5 * w.square().sum(-1) + scale * log_lik


def _logistic_data(num_data=400, dim=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_data, dim, generator=generator, dtype=torch.float64)
    logits = x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    y = (torch.rand(num_data, generator=generator, dtype=torch.float64) < logits.sigmoid()).double()
    return x, y


def _potential(model, args, dim):
    identity = torch.distributions.transforms.identity_transform
    layout = FlatLayout({"w": torch.Size([dim])})
    return LogJointPotential(model, args, {}, {"w": identity}, layout, args[0].shape[0])


def test_chunked_full_data_gradient_equals_one_pass():
    x, y = _logistic_data()
    potential = _potential(LogisticRegression(), (x, y), 3)
    z = torch.randn(4, 3, dtype=torch.float64)
    value, grad = potential.value_and_grad(z, {}, None)
    chunked_value, chunked_grad = potential.full_data_value_and_grad(z, {}, chunk_size=33)
    assert torch.allclose(value, chunked_value) and torch.allclose(grad, chunked_grad)


def test_control_variate_gradient_is_unbiased_and_less_noisy():
    x, y = _logistic_data()
    num_data, batch, points, repeats = x.shape[0], 8, 4, 2000
    potential = _potential(LogisticRegression(), (x, y), 3)
    centre = torch.tensor([0.8, -1.7, 0.4], dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    # 4 points about one posterior standard deviation (~0.1 here) from the centre, each repeated
    # as 2000 "chains" with their own minibatches: 2000 draws of the estimator in one call
    z = centre + 0.05 * torch.randn(points, 3, generator=generator, dtype=torch.float64)
    z_rep = z.repeat(repeats, 1)
    control = ControlVariateGradient(potential, centre, z_rep.shape[0], chunk_size=num_data)
    rows = torch.rand(z_rep.shape[0], num_data, generator=generator).argsort(-1)[:, :batch]
    estimates = control(z_rep, {}, rows)[1].reshape(repeats, points, 3)
    plain = potential.value_and_grad(z_rep, {}, rows)[1].reshape(repeats, points, 3)
    _, exact = potential.value_and_grad(z, {}, None)
    standard_error = estimates.std(0) / math.sqrt(repeats)
    # E[estimate] = full-data gradient (rows drawn without replacement), within MC error
    assert ((estimates.mean(0) - exact).abs() / standard_error < 4.5).all()
    assert ((plain.mean(0) - exact).abs() / (plain.std(0) / math.sqrt(repeats)) < 4.5).all()
    # near the centre, the variance is far below that of the plain minibatch gradient
    assert (estimates.var(0) < 0.05 * plain.var(0)).all()


def test_control_variate_recovers_posterior_where_plain_sgld_is_too_wide():
    num_data, batch = 2000, 5
    generator = torch.Generator().manual_seed(2)
    y = 1.5 + torch.randn(num_data, DIM, generator=generator)
    mean, var = y.sum(0) / (num_data + 1), 1.0 / (num_data + 1)
    options = {"kernel": "sgld", "num_chains": 8, "num_samples": 200, "warmup_steps": 50,
               "num_steps_per_sample": 5, "learning_rate": 0.05, "batch_size": batch, "seed": 0,
               "initial_params": {"mu": torch.full((DIM,), 1.5)}}  # fmt: skip
    # plain SGLD: the minibatch noise inflates the variance by about 1 + c N / (2 B) = 11
    plain = run(GaussianMean(), y, **options).samples["mu"].reshape(-1, DIM)
    assert (plain.var(0) / var > 3).all()
    result = run(GaussianMean(), y, control_variate=True, **options)
    draws = result.samples["mu"]
    assert torch.allclose(result.control_variate_centre["mu"], mean, atol=1e-2 * math.sqrt(var))
    assert (_effective_z(draws, mean, var).abs() < 4).all()
    # left: discretisation bias c / 2 and Monte Carlo error of 1600 autocorrelated draws
    ratio = draws.reshape(-1, DIM).var(0) / var
    assert ((ratio > 0.75) & (ratio < 1.3)).all()
    # a centre given by the user is used as is
    given = run(GaussianMean(), y, control_variate={"mu": mean}, **options)
    assert torch.equal(given.control_variate_centre["mu"], mean)


@pytest.mark.parametrize(
    ("likelihood", "activation", "out"),
    [("normal", "tanh", 1), ("normal", "sigmoid", 2), ("categorical", "relu", 3)],
)
@pytest.mark.parametrize("rows", ["minibatch", "all"])
def test_analytic_gradient_equals_autograd(likelihood, activation, out, rows):
    model = BayesianMLP(3, [5, 4], out, activation=activation, likelihood=likelihood)
    assert model.has_analytic_gradient
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(20, 3, generator=generator, dtype=torch.float64)
    if likelihood == "categorical":
        y = torch.randint(0, out, (20,), generator=generator)
    else:
        y = torch.randn(20, generator=generator, dtype=torch.float64)
        y = y if out == 1 else y.unsqueeze(-1).expand(20, out)
    chains = 4
    params = {name: torch.randn(chains, *shape, generator=generator, dtype=torch.float64)
              for name, shape in model.site_shapes().items()}  # fmt: skip
    subsample = None
    if rows == "minibatch":
        subsample = torch.rand(chains, 20, generator=generator).argsort(-1)[:, :6]
    value, grads = model.log_joint_and_gradient(params, subsample, x, y)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    expected = model.log_joint(leaves, subsample, x, y)
    expected_grads = torch.autograd.grad(expected.sum(), list(leaves.values()))
    assert torch.allclose(value, expected.detach())
    for name, expected_grad in zip(leaves, expected_grads, strict=True):
        assert torch.allclose(grads[name], expected_grad), name


@pytest.mark.parametrize("likelihood", ["normal", "categorical"])
def test_analytic_gradient_with_gamma_precisions_held_fixed(likelihood):
    out = 3 if likelihood == "categorical" else 1
    model = BayesianMLP(3, [5], out, activation="sigmoid", likelihood=likelihood,
                        prior=GammaPrecision(2.0, 0.5), likelihood_temperature=0.5)  # fmt: skip
    assert model.has_analytic_gradient
    assert set(model.analytic_gradient_sites) == {
        "layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"
    }  # fmt: skip
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(20, 3, generator=generator, dtype=torch.float64)
    if likelihood == "categorical":
        y = torch.randint(0, out, (20,), generator=generator)
    else:
        y = torch.randn(20, generator=generator, dtype=torch.float64)
    params = {}
    for name, shape in model.site_shapes().items():
        draw = torch.randn(4, *shape, generator=generator, dtype=torch.float64)
        params[name] = draw.exp() if name.endswith("_precision") else draw
    subsample = torch.rand(4, 20, generator=generator).argsort(-1)[:, :6]
    value, grads = model.log_joint_and_gradient(params, subsample, x, y)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    expected = model.log_joint(leaves, subsample, x, y)
    sites = list(model.analytic_gradient_sites)
    expected_grads = torch.autograd.grad(expected.sum(), [leaves[s] for s in sites])
    assert set(grads) == set(sites)
    assert torch.allclose(value, expected.detach())
    for name, expected_grad in zip(sites, expected_grads, strict=True):
        assert torch.allclose(grads[name], expected_grad), name


def test_run_chains_uses_the_closed_form_gradient_with_gibbs_sites():
    """Gibbs-updated precisions are read by the closed-form gradient, not differentiated."""
    model = BayesianMLP(2, [4], 1, prior=GammaPrecision(2.0, 1.0))
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=generator)
    y = x[:, 0] + 0.1 * torch.randn(40, generator=generator)
    calls = []
    original = model.log_joint_and_gradient

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    model.log_joint_and_gradient = spy
    result = run(model, x, y, kernel="sghmc", num_chains=2, num_samples=5, warmup_steps=1,
                 step_size=1e-3, batch_size=10, seed=0)  # fmt: skip
    assert calls
    assert torch.isfinite(result.samples["layers.0.weight_precision"]).all()
    assert (result.samples["layers.0.weight_precision"] > 0).all()


def test_analytic_gradient_is_refused_where_it_does_not_apply():
    model = BayesianMLP(2, [3], 1, prior=ScaleMixturePrior())
    assert not model.has_analytic_gradient
    params = {k: torch.zeros(2, *s) for k, s in model.site_shapes().items()}
    with pytest.raises(ValueError, match="NormalPrior"):
        model.log_joint_and_gradient(params, None, torch.zeros(4, 2), torch.zeros(4))


def test_control_variate_with_gibbs_sites_and_bnn():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(60, 2, generator=generator)
    y = x.sum(-1) + 0.1 * torch.randn(60, generator=generator)
    model = BayesianMLP(2, [4], 1, prior=GammaPrecision(1.0, 1.0))
    result = run(model, x, y, num_chains=3, num_samples=10, num_steps_per_sample=3,
                 learning_rate=1e-3, batch_size=10, seed=0, control_variate=True,
                 gibbs_every=4, centre_iterations=20)  # fmt: skip
    assert set(result.control_variate_centre) == {
        f"layers.{i}.{p}" for i in range(2) for p in ("weight", "bias")
    }
    assert all(torch.isfinite(v).all() for v in result.samples.values())


@pytest.mark.slow
def test_compiled_closed_form_gradient_follows_the_eager_chain():
    """``compile=True`` compiles the closed-form gradient; the chain is the same up to rounding,
    with minibatches and Gibbs-updated precisions (slow: the first compile takes 10-20 s)."""
    model = BayesianMLP(1, [6], 1, activation="tanh", prior=GammaPrecision(2.0, 1.0))
    generator = torch.Generator().manual_seed(0)
    x = torch.linspace(-1, 1, 16).unsqueeze(-1)
    y = torch.sin(3 * x.squeeze(-1)) + 0.1 * torch.randn(16, generator=generator)
    options = dict(kernel="sghmc", num_chains=3, num_samples=10, warmup_steps=2, step_size=1e-3,
                   friction=0.3, num_steps_per_sample=5, batch_size=8, seed=4)  # fmt: skip
    eager = run(model, x, y, **options)
    compiled = run(model, x, y, compile=True, **options)
    assert compiled.setup_time > eager.setup_time  # the compilation is counted as set-up
    for name, value in eager.samples.items():
        torch.testing.assert_close(compiled.samples[name], value, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- checkpoints
def _interrupt_after(draws: int):
    """A callback that raises KeyboardInterrupt after the given kept draw."""

    def callback(index, draw):
        if index + 1 == draws:
            raise KeyboardInterrupt

    return callback


def test_run_chains_checkpoint_resumes_bit_identically(gaussian_data, tmp_path):
    y, _, _ = gaussian_data
    options = {"num_chains": 3, "num_samples": 12, "warmup_steps": 4, "step_size": 1e-3,
               "batch_size": 10, "seed": 5, "friction": 0.2}  # fmt: skip
    reference = run(GaussianMean(), y, **options)
    path = tmp_path / "chains.ckpt"
    # interrupted by an error after 5 kept draws: the checkpoint of draw 8 (4 + 4) stays
    with pytest.raises(KeyboardInterrupt):
        run(GaussianMean(), y, checkpoint_path=path, checkpoint_every=4,
            callback=_interrupt_after(5), **options)  # fmt: skip
    resumed = run(GaussianMean(), y, resume_from=path, checkpoint_path=path, **options)
    for name, draws in reference.samples.items():
        assert torch.equal(resumed.samples[name], draws)
    for name, stats in reference.sample_stats.items():
        assert (resumed.sample_stats[name] == stats).all(), name
    # the finished run's checkpoint resumes to the same result without drawing anything
    again = run(GaussianMean(), y, resume_from=path, checkpoint_path=path, **options)
    assert torch.equal(again.samples["mu"], reference.samples["mu"])


@pytest.mark.parametrize("warmup_steps", [0, None])
def test_a_resumed_run_without_warmup_steps_takes_its_checkpoints(gaussian_data, tmp_path,
                                                                  warmup_steps):  # fmt: skip
    """Resumed without ``warmup_steps``, a run takes the warm-up its checkpoint records: that of
    a run from before 0.3.0, when the default was 0 (given here by hand), or the default's."""
    y, _, _ = gaussian_data
    options = {"num_chains": 2, "num_samples": 8, "step_size": 1e-3, "batch_size": 10, "seed": 5}
    started = {} if warmup_steps is None else {"warmup_steps": warmup_steps}
    reference = run(GaussianMean(), y, **started, **options)
    path = tmp_path / "chains.ckpt"
    with pytest.raises(KeyboardInterrupt):
        run(GaussianMean(), y, checkpoint_path=path, checkpoint_every=2,
            callback=_interrupt_after(3), **started, **options)  # fmt: skip
    resumed = run(GaussianMean(), y, resume_from=path, **options)
    assert torch.equal(resumed.samples["mu"], reference.samples["mu"])
    with pytest.raises(CheckpointError, match="written by a run with warmup_steps="):
        run(GaussianMean(), y, resume_from=path, warmup_steps=3, **options)


def test_run_chains_refuses_another_runs_checkpoint(gaussian_data, tmp_path):
    from pyro_sgmcmc import CheckpointError

    y, _, _ = gaussian_data
    options = {"num_chains": 2, "num_samples": 4, "step_size": 1e-3, "batch_size": 10}
    path = tmp_path / "chains.ckpt"
    run(GaussianMean(), y, seed=1, checkpoint_path=path, **options)
    with pytest.raises(CheckpointError, match="already holds the checkpoint of a run"):
        run(GaussianMean(), y, seed=1, checkpoint_path=path, **options)
    with pytest.raises(CheckpointError, match=r"config\.seed: saved '1', now '2'"):
        run(GaussianMean(), y, seed=2, resume_from=path, **options)
    with pytest.raises(CheckpointError, match="num_chains=2, this one has num_chains=3"):
        run(GaussianMean(), y, seed=1, resume_from=path, **{**options, "num_chains": 3})
    with pytest.raises(CheckpointError, match="data given to run_chains differ"):
        run(GaussianMean(), y + 1, seed=1, resume_from=path, **options)
    other = tmp_path / "notes.txt"
    other.write_text("keep me")
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        run(GaussianMean(), y, seed=1, checkpoint_path=other, **options)
    assert other.read_text() == "keep me"


def test_ctrl_c_stops_run_chains_at_a_draw_boundary_with_a_checkpoint(gaussian_data, tmp_path):
    import os
    import signal

    y, _, _ = gaussian_data
    options = {"num_chains": 2, "num_samples": 10, "warmup_steps": 2, "step_size": 1e-3,
               "batch_size": 10, "seed": 3}  # fmt: skip
    reference = run(GaussianMean(), y, **options)
    path = tmp_path / "chains.ckpt"

    def press_ctrl_c(index, draw):
        if index == 3:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.warns(UserWarning, match="interrupted after 6 draws per chain; a checkpoint"):
        with pytest.raises(KeyboardInterrupt):
            run(GaussianMean(), y, checkpoint_path=path, callback=press_ctrl_c, **options)
    resumed = run(GaussianMean(), y, resume_from=path, checkpoint_path=path, **options)
    assert torch.equal(resumed.samples["mu"], reference.samples["mu"])


def test_a_result_summarises_and_diagnoses_its_draws_as_mcmc_does(capsys):
    """``summary()`` and ``diagnostics()`` as ``pyro.infer.MCMC`` has them, through Pyro's own
    functions, plus the divergent steps and the verdict."""
    from pyro.infer import MCMC
    from pyro.infer.mcmc.util import diagnostics

    def mean_model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 5.0))
        with pyro.plate("data", y.shape[0]) as idx:
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])

    y = torch.randn(100, generator=torch.Generator().manual_seed(0)) + 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_chains(SGLD(mean_model, batch_size=20, seed=0), y, num_chains=2,
                            num_samples=60, warmup_steps=60)  # fmt: skip
    result.summary(prob=0.8)
    printed = capsys.readouterr().out
    assert "10.0%" in printed and "90.0%" in printed and "n_eff" in printed and "mu" in printed
    assert "Number of divergent steps: 0" in printed and f"Verdict: {result.verdict}" in printed
    found = result.diagnostics()
    expected = diagnostics(result.samples, group_by_chain=True)
    assert torch.equal(found["mu"]["r_hat"], expected["mu"]["r_hat"])
    assert found["divergences"] == {"chain 0": [], "chain 1": []}
    # the per-chain entries as pyro.infer.MCMC gives them for the same kernel and chains
    mcmc = MCMC(SGLD(mean_model, batch_size=20, seed=0), num_samples=60, warmup_steps=60,
                num_chains=2, disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(y)
    reference = mcmc.diagnostics()
    for key in ("divergences", "divergent_steps", "num_steps_per_sample", "warmup_gradient_steps"):
        assert found[key] == reference[key], key
