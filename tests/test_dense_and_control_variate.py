"""The dense preconditioner (exact one-step updates, its estimate from rank-one curvature
probes, and the friction chosen with it) and the control variate the warm-up turns on itself."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from stats_helpers import (
    ConjugateLinearRegression,
    assert_covariance_close,
    assert_mean_close,
    effective_sample_size,
    regression_data,
)

from pyro_sgmcmc import SGHMC, SGLD, run_chains
from pyro_sgmcmc.dynamics import sghmc_init, sghmc_step, sgld_init, sgld_step
from pyro_sgmcmc.dynamics.metric import DenseMetric
from pyro_sgmcmc.engine.adaptation import FULL_BATCH_NETWORK_FRICTION
from pyro_sgmcmc.engine.build import prepare_chains
from pyro_sgmcmc.engine.dense import (
    RESIDUAL_CONDITION,
    DenseAdaptation,
    choose_friction,
)
from pyro_sgmcmc.engine.estimators import AutoControlVariate
from pyro_sgmcmc.nn import BayesianMLP

MATRIX = torch.tensor([[[2.0, 0.6, 0.0], [0.6, 1.0, -0.3], [0.0, -0.3, 0.5]]])
THETA = {"z": torch.tensor([[1.0, -2.0, 0.5]])}
GRAD = {"z": torch.tensor([[0.3, -0.1, 2.0]])}
XI = {"z": torch.tensor([[0.7, -1.2, 0.4]])}


def test_dense_metric_root_squares_to_the_matrix():
    metric = DenseMetric.from_matrix(MATRIX)
    torch.testing.assert_close(metric.root @ metric.root, MATRIX)
    torch.testing.assert_close(metric.root, metric.root.transpose(-1, -2))
    torch.testing.assert_close(metric.diagonal(), torch.tensor([[2.0, 1.0, 0.5]]))
    factor = torch.tensor([[1.0, 0.5, 2.0]])
    expected = factor.unsqueeze(-1) * MATRIX * factor.unsqueeze(-2)
    torch.testing.assert_close(metric.scaled(factor).matrix, expected)


def test_sgld_one_step_with_a_dense_metric_is_exact():
    eps, temperature = 0.01, 2.0
    metric = DenseMetric.from_matrix(MATRIX)
    state = sgld_step(sgld_init(THETA), GRAD, eps, temperature, noise=XI,
                      preconditioner={"z": metric})  # fmt: skip
    drift = (MATRIX @ GRAD["z"].unsqueeze(-1)).squeeze(-1)
    noise = (metric.root @ XI["z"].unsqueeze(-1)).squeeze(-1)
    expected = THETA["z"] - eps * drift + math.sqrt(2 * eps * temperature) * noise
    torch.testing.assert_close(state.position["z"], expected)


def test_sghmc_one_step_with_a_dense_metric_and_a_friction_per_chain_is_exact():
    eta, temperature = 0.01, 1.5
    friction = torch.tensor([[0.3]])
    momentum = {"z": torch.tensor([[0.2, 0.1, -0.3]])}
    metric = DenseMetric.from_matrix(MATRIX)
    new = sghmc_step(sghmc_init(THETA, momentum), GRAD, eta, friction, temperature, noise=XI,
                     preconditioner={"z": metric})  # fmt: skip
    drift = (MATRIX @ GRAD["z"].unsqueeze(-1)).squeeze(-1)
    noise = (metric.root @ XI["z"].unsqueeze(-1)).squeeze(-1)
    v = (1 - 0.3) * momentum["z"] - eta * drift + math.sqrt(2 * eta * 0.3 * temperature) * noise
    torch.testing.assert_close(new.momentum["z"], v)
    torch.testing.assert_close(new.position["z"], THETA["z"] + v)


def test_rank_one_probes_average_to_the_hessian_and_the_metric_whitens_it():
    """``u (delta / epsilon)^T`` with ``u = H (epsilon * delta)``: over all sign patterns the
    average is ``H`` exactly, and ``P0^{1/2} H P0^{1/2} = I``."""
    hessian = torch.tensor([[4.0, 1.5, 0.0], [1.5, 2.0, 0.4], [0.0, 0.4, 1.0]])
    epsilon = torch.tensor([[0.1, 0.2, 0.05]])
    adaptation = DenseAdaptation(torch.zeros(1, 3))
    patterns = torch.tensor(
        [[a, b, c] for a in (-1.0, 1.0) for b in (-1.0, 1.0) for c in (-1.0, 1.0)]
    )
    for sign in patterns:
        change = (hessian @ (epsilon[0] * sign)).unsqueeze(0)
        adaptation.add_curvature(change, (sign / epsilon[0]).unsqueeze(0))
    probes = torch.full((1, 1), float(len(patterns)))
    metric = adaptation.metric(probes)
    torch.testing.assert_close(metric.matrix[0], torch.linalg.inv(hessian), rtol=1e-5, atol=1e-6)
    whitened = metric.root[0] @ hessian @ metric.root[0]
    torch.testing.assert_close(whitened, torch.eye(3), rtol=1e-5, atol=1e-5)


def _sghmc_matrix(curvature_step: float, friction: float) -> torch.Tensor:
    """The linear map ``(theta, v) -> (theta', v')`` of one noiseless SGHMC step on the Gaussian
    ``U = theta^2 / 2`` with step ``curvature_step``, read off ``sghmc_step`` itself."""
    columns = []
    for theta, v in ((1.0, 0.0), (0.0, 1.0)):
        state = sghmc_init({"z": torch.tensor([[theta]], dtype=torch.float64)},
                           {"z": torch.tensor([[v]], dtype=torch.float64)})  # fmt: skip
        new = sghmc_step(state, {"z": state.position["z"]}, curvature_step, friction, 0.0)
        columns.append(torch.cat([new.position["z"][0], new.momentum["z"][0]]))
    return torch.stack(columns, dim=1)


def _stationary_covariance(A: torch.Tensor, curvature_step: float, friction: float):
    """``S = A S A^T + Q`` for the step's noise ``Q`` (it enters v, and theta through v)."""
    Q = torch.full((2, 2), 2 * curvature_step * friction, dtype=torch.float64)
    eye = torch.eye(4, dtype=torch.float64)
    return torch.linalg.solve(eye - torch.kron(A, A), Q.reshape(4)).reshape(2, 2)


def _autocorrelation_times(curvature_step: float, friction: float) -> tuple[float, float]:
    """Exact integrated autocorrelation times of theta and theta^2 of stationary SGHMC on that
    Gaussian: ``rho_k = (A^k S)_00 / S_00`` (theta^2's is ``rho_k^2``), summed in closed form
    over the eigenvalues ``mu`` of ``A``."""
    A = _sghmc_matrix(curvature_step, friction)
    S = _stationary_covariance(A, curvature_step, friction)
    mu, V = torch.linalg.eig(A)
    # rho_k = sum_j c_j mu_j^k
    c = V[0, :] * torch.linalg.solve(V, S.to(V.dtype))[:, 0] / S[0, 0]
    single = (c * mu / (1 - mu)).sum().real
    pairs = mu.unsqueeze(0) * mu.unsqueeze(1)
    square = (c.unsqueeze(0) * c.unsqueeze(1) * pairs / (1 - pairs)).sum().real
    return float(1 + 2 * single), float(1 + 2 * square)


def test_sghmc_autocorrelation_times_match_the_lag_by_lag_sum():
    """The closed form of ``_autocorrelation_times`` against the autocorrelations summed lag by
    lag (a check of the algebra, not of the sampler)."""
    A = _sghmc_matrix(0.1, 0.3)
    S = _stationary_covariance(A, 0.1, 0.3)
    column, rho = S[:, 0].clone(), []
    for _ in range(2000):
        rho.append(float(column[0] / S[0, 0]))
        column = A @ column
    rho = torch.tensor(rho[1:], dtype=torch.float64)
    expected = (1 + 2 * float(rho.sum()), 1 + 2 * float(rho.square().sum()))
    assert _autocorrelation_times(0.1, 0.3) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("curvature_step", [0.1, 0.025, 0.004])
def test_friction_omega_minimises_the_slower_of_the_mean_and_the_variance(curvature_step):
    """Along a Gaussian direction of frequency omega = sqrt(a lambda) per step, the larger of the
    autocorrelation times of theta (bulk ESS) and theta^2 (variances, tails) is smallest near
    alpha = omega: within 10% of its minimum over a fine grid, and at least 1.5 times smaller
    than at the continuous-time critical damping 2 omega (the old rule) for theta."""
    omega = math.sqrt(curvature_step)
    grid = [omega * k / 20 for k in range(6, 41)]
    slower = [max(_autocorrelation_times(curvature_step, alpha)) for alpha in grid]
    at_omega = max(_autocorrelation_times(curvature_step, omega))
    assert at_omega <= 1.1 * min(slower)
    assert at_omega < max(_autocorrelation_times(curvature_step, 2 * omega)) / 1.5


def test_the_friction_damps_the_softest_directions_or_lets_the_noise_bound_grow():
    quiet = choose_friction(0.1, torch.tensor([[1e-6]]), 0.1, 1.0, 0.05)
    # omega of the directions RESIDUAL_CONDITION times softer than the stiffest (c_H)
    assert float(quiet) == pytest.approx(math.sqrt(0.1 / RESIDUAL_CONDITION))
    noisy = choose_friction(0.1, torch.tensor([[0.5]]), 0.1, 1.0, 0.05)
    assert float(noisy) == pytest.approx(0.5)  # c_H lambda_V / (c_V T): the bounds meet
    assert float(choose_friction(0.1, torch.tensor([[50.0]]), 0.1, 1.0, 0.05)) == 1.0


def test_a_small_model_gets_a_dense_metric_and_an_adapted_friction():
    x, y = regression_data(n=400, d=3)
    kernel = SGHMC(ConjugateLinearRegression(), batch_size=50, num_steps_per_sample=2, seed=0)
    chains = prepare_chains(kernel.settings, kernel.rule, kernel.options, kernel.model, (x, y),
                            {}, chains=[0, 1], warmup_draws=300)  # fmt: skip
    engine = chains.engine
    for _ in range(301):
        engine.draw()
    control = engine.control
    assert isinstance(control.preconditioner["z"], DenseMetric)
    assert control.friction.shape == (2, 1)
    assert bool(((control.friction >= 0.05) & (control.friction <= 1.0)).all())
    # a friction given by the user is kept
    fixed = SGHMC(ConjugateLinearRegression(), batch_size=50, friction=0.2, seed=0)
    assert not fixed.options.adapt_friction and fixed.options.friction == 0.2


def _friction_after_the_descent(batch_size: int, **options) -> torch.Tensor | None:
    """SGHMC's adapted friction (``None``: the rule's own) on the demo's 1-10-10-1 network
    (141 weights: the diagonal path) over its 32 rows, once the first window has begun."""
    generator = torch.Generator().manual_seed(0)
    x = torch.linspace(-2.0, 2.0, 32).unsqueeze(-1)
    y = torch.sin(2.0 * x.squeeze(-1)) + 0.1 * torch.randn(32, generator=generator)
    model = BayesianMLP(1, [10, 10], 1)
    kernel = SGHMC(model, batch_size=batch_size, seed=0, **options)
    chains = prepare_chains(kernel.settings, kernel.rule, kernel.options, model, (x, y), {},
                            chains=[0, 1], warmup_draws=100)  # fmt: skip
    engine = chains.engine
    control = engine.control
    if not hasattr(control, "descent_end"):
        return control.friction
    while engine.t < control.descent_end:
        assert control.friction is None  # the descent keeps the rule's friction
        engine.step()
    return control.friction  # set by the descent's last step, for the first window's steps


def test_a_network_on_full_batches_samples_with_the_low_friction():
    friction = _friction_after_the_descent(batch_size=32)
    assert friction is not None and friction.shape == (2, 1)
    assert bool((friction == FULL_BATCH_NETWORK_FRICTION).all())
    # on minibatches the noise bound ties the step to the friction: the default is kept
    assert _friction_after_the_descent(batch_size=8) is None
    # a friction given by the user is kept
    assert _friction_after_the_descent(batch_size=32, friction=0.1) is None


def _strongly_correlated(n: int = 2000, correlation: float = 0.95, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 2, generator=generator)
    x = torch.stack([z[:, 0], correlation * z[:, 0] + (1 - correlation**2) ** 0.5 * z[:, 1]], 1)
    y = x @ torch.tensor([1.0, -0.5]) + 0.5 * torch.randn(n, generator=generator)
    return x, y


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sgld", "sghmc"])
def test_a_correlated_posterior_mixes_with_the_defaults(name):
    """Issue target: posterior correlation 0.95 on minibatches, defaults only: bulk ESS at
    least 20% of the kept draws (the dense metric undoes the correlation)."""
    from stats_helpers import effective_sample_size

    x, y = _strongly_correlated()
    model = ConjugateLinearRegression()
    _, cov = model.posterior(x, y)
    kernel = (SGLD if name == "sgld" else SGHMC)(model, batch_size=100, seed=3)
    result = run_chains(kernel, x, y, num_chains=4, num_samples=500, warmup_steps=200)
    draws = result.samples["w"].double().numpy()
    ess = effective_sample_size(draws)
    assert ess.min() >= 0.2 * draws.shape[0] * draws.shape[1], ess
    assert_covariance_close(draws, cov, z=4.0, relative_bias=0.15)


# ------------------------------------------------------------------------------- control variate
def mean_model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])


def test_the_control_variate_with_centres_per_chain_is_unbiased():
    """Over the minibatches of one epoch (a partition of the rows) the control-variate gradients
    average to the full-data gradient, whatever each chain's centre."""
    y = torch.randn(40, generator=torch.Generator().manual_seed(0)) + 2.0
    kernel = SGLD(mean_model, batch_size=10, seed=0)
    chains = prepare_chains(kernel.settings, kernel.rule, kernel.options, kernel.model, (y,), {},
                            chains=[0, 1], warmup_draws=10)  # fmt: skip
    estimator = chains.engine.estimator
    assert isinstance(estimator, AutoControlVariate)
    potential = estimator.potential
    estimator.set_centre(torch.tensor([[1.0], [3.0]]), {})
    estimator.activate(torch.tensor([True, True]))
    position = torch.tensor([[0.5], [2.5]])
    rows = torch.arange(40).reshape(4, 10)
    estimates = [estimator(position, {}, rows[k].expand(2, -1))[1] for k in range(4)]
    _, full = potential.full_data_value_and_grad(position, {}, 1000)
    torch.testing.assert_close(torch.stack(estimates).mean(0), full, rtol=1e-5, atol=1e-4)
    plain, controlled = estimator.noise_pair(position, {}, rows[0].expand(2, -1),
                                             rows[1].expand(2, -1))  # fmt: skip
    assert float(controlled.abs().max()) < float(plain.abs().max())


def test_the_control_variate_serves_only_the_chains_that_use_it():
    """A chain outside the mask gets the plain minibatch gradient, one inside the control
    variate's, whatever the mask was before (the estimator keeps what it derives from it)."""
    y = torch.randn(40, generator=torch.Generator().manual_seed(0)) + 2.0
    kernel = SGLD(mean_model, batch_size=10, seed=0)
    chains = prepare_chains(kernel.settings, kernel.rule, kernel.options, kernel.model, (y,), {},
                            chains=[0, 1], warmup_draws=10)  # fmt: skip
    estimator = chains.engine.estimator
    estimator.set_centre(torch.tensor([[1.0], [3.0]]), {})
    position, rows = torch.tensor([[0.5], [2.5]]), torch.arange(10).expand(2, -1)
    plain = estimator.potential.value_and_grad(position, {}, rows)[1]
    estimator.activate(torch.tensor([True, True]))
    controlled = estimator(position, {}, rows)[1]
    assert not torch.equal(controlled, plain)
    estimator.activate(torch.tensor([False, True]))
    mixed = estimator(position, {}, rows)[1]
    assert torch.equal(mixed[0], plain[0]) and torch.equal(mixed[1], controlled[1])
    estimator.active = None
    assert not estimator.used and torch.equal(estimator(position, {}, rows)[1], plain)


def test_the_warmup_turns_the_control_variate_on_where_it_helps():
    """Tall data, a unimodal posterior: the control variate's noise is a small fraction of the
    plain gradient's, and every chain uses it; with Gibbs blocks or a hand step it stays off."""
    x, y = regression_data(n=2000, d=3)
    result = run_chains(SGHMC(ConjugateLinearRegression(), batch_size=20, num_steps_per_sample=2,
                              seed=0), x, y, num_chains=2, num_samples=20, warmup_steps=400,
                        target_ess=None)  # fmt: skip
    assert all(report["control_variate"] for report in result.chain_reports)
    hand = run_chains(SGHMC(ConjugateLinearRegression(), step_size=1e-6, batch_size=20, seed=0),
                      x, y, num_chains=1, num_samples=2, warmup_steps=2)  # fmt: skip
    assert not hand.chain_reports[0]["control_variate"]


class _RegressionJudgedAsANetwork(ConjugateLinearRegression):
    """A known Gaussian posterior that says it is a network (``function_space``), so that SGHMC
    takes the full-batch network friction on it."""

    function_space = True


@pytest.mark.slow
def test_the_full_batch_network_friction_samples_the_known_posterior():
    x, y = regression_data(n=200, d=120, seed=3)  # 120 coordinates: the diagonal path
    model = _RegressionJudgedAsANetwork()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the verdict on a model with no outputs is not tested
        result = run_chains(SGHMC(model, batch_size=200, seed=0), x, y, num_chains=4,
                            num_samples=300, warmup_steps=100)  # fmt: skip
    mean, covariance = model.posterior(x, y)
    draws = result.samples["w"].double().numpy()
    assert_mean_close(draws, mean, z=4.5)
    sd = draws.reshape(-1, draws.shape[-1]).std(0)
    ratio = sd / np.sqrt(np.diag(covariance))
    # an sd estimated from ESS draws has a relative error of about 1/sqrt(2 ESS); 4.5 of those,
    # plus SGHMC's variance bias of at most c_H / 4 = 2.5% (1.3% of an sd)
    tolerance = 4.5 / np.sqrt(2.0 * effective_sample_size(draws)) + 0.013
    assert np.all(np.abs(ratio - 1.0) < tolerance), (ratio, tolerance)
