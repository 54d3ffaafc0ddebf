"""Exact one-step tests of the update rules, property tests, and many-chain statistical tests."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_sgmcmc.dynamics import (
    psgld_init,
    psgld_step,
    sghmc_init,
    sghmc_step,
    sgld_init,
    sgld_step,
    update_gradient_noise_estimate,
)

THETA = {"a": torch.tensor([1.0, -2.0]), "b": torch.tensor(0.5)}
GRAD = {"a": torch.tensor([0.3, -0.1]), "b": torch.tensor(2.0)}
XI = {"a": torch.tensor([0.7, -1.2]), "b": torch.tensor(0.4)}


# ----------------------------------------------------------------------------- exact one-step
def test_sgld_one_step_exact():
    eps, temperature = 0.01, 2.0
    state = sgld_step(sgld_init(THETA), GRAD, eps, temperature, noise=XI)
    for k in THETA:
        expected = THETA[k] - eps * GRAD[k] + math.sqrt(2 * eps * temperature) * XI[k]
        torch.testing.assert_close(state.position[k], expected)


def test_sghmc_one_step_exact():
    eta, alpha, temperature, beta = 0.01, 0.1, 1.5, 0.05
    momentum = {"a": torch.tensor([0.2, 0.1]), "b": torch.tensor(-0.3)}
    state = sghmc_init(THETA, momentum)
    new = sghmc_step(state, GRAD, eta, alpha, temperature, gradient_noise=beta, noise=XI)
    for k in THETA:
        v = (1 - alpha) * momentum[k] - eta * GRAD[k]
        v = v + math.sqrt(2 * eta * (alpha * temperature - beta)) * XI[k]
        torch.testing.assert_close(new.momentum[k], v)
        torch.testing.assert_close(new.position[k], THETA[k] + v)


def test_sghmc_tensor_gradient_noise_clamps_variance_at_zero():
    eta, alpha = 0.01, 0.1
    beta = {"a": torch.tensor([0.05, 0.5]), "b": torch.tensor(0.0)}
    new = sghmc_step(sghmc_init(THETA), GRAD, eta, alpha, 1.0, gradient_noise=beta, noise=XI)
    expected_a = -eta * GRAD["a"] + torch.tensor([math.sqrt(2 * eta * 0.05), 0.0]) * XI["a"]
    torch.testing.assert_close(new.momentum["a"], expected_a)


def test_sghmc_with_unit_friction_is_sgld():
    eta = 0.02
    sghmc = sghmc_step(sghmc_init(THETA), GRAD, eta, 1.0, 1.0, noise=XI)
    sgld = sgld_step(sgld_init(THETA), GRAD, eta, 1.0, noise=XI)
    for k in THETA:
        torch.testing.assert_close(sghmc.position[k], sgld.position[k])


def test_sghmc_baoab_one_step_exact():
    eta, alpha, temperature, beta = 0.01, 0.1, 1.5, 0.05
    momentum = {"a": torch.tensor([0.2, 0.1]), "b": torch.tensor(-0.3)}
    state = sghmc_init(THETA, momentum)
    new = sghmc_step(
        state, GRAD, eta, alpha, temperature, gradient_noise=beta, noise=XI, integrator="baoab"
    )
    for k in THETA:
        kicked = momentum[k] - eta * GRAD[k]
        injected = alpha * (2 - alpha) * temperature - (2 - alpha) ** 2 * beta / 2
        noise = math.sqrt(eta * injected) * XI[k]
        v = (1 - alpha) * kicked + noise
        torch.testing.assert_close(new.momentum[k], v)
        torch.testing.assert_close(new.position[k], THETA[k] + 0.5 * kicked + 0.5 * v)


def test_sghmc_baoab_with_unit_friction_is_leimkuhler_matthews_sgld_of_half_the_step():
    eta = 0.02
    generator = torch.Generator().manual_seed(0)
    draws = [{k: torch.randn(v.shape, generator=generator) for k, v in THETA.items()}
             for _ in range(3)]  # fmt: skip
    sghmc, sgld = sghmc_init(THETA), sgld_init(THETA)
    # BAOAB's first step starts at rest: as Leimkuhler-Matthews's first step, which
    # injects sqrt(2 eps) xi alone, only if SGLD's first draw is sqrt(2) times BAOAB's
    sgld = sgld_step(sgld, GRAD, eta / 2, 1.0, noise=draws[0], integrator="leimkuhler_matthews")
    sghmc = sghmc_step(sghmc, GRAD, eta, 1.0, 1.0, noise=draws[0], integrator="baoab")
    for k in THETA:
        # the first steps differ only by SGLD's first noise (sqrt(eta) xi vs sqrt(eta) xi / 2)
        torch.testing.assert_close(
            sgld.position[k] - sghmc.position[k], 0.5 * math.sqrt(eta) * draws[0][k]
        )
    sgld = sgld._replace(position=dict(sghmc.position))
    for noise in draws[1:]:
        gradient = {k: 0.3 * v for k, v in sghmc.position.items()}
        sghmc = sghmc_step(sghmc, gradient, eta, 1.0, 1.0, noise=noise, integrator="baoab")
        sgld = sgld_step(
            sgld, gradient, eta / 2, 1.0, noise=noise, integrator="leimkuhler_matthews"
        )
        for k in THETA:
            torch.testing.assert_close(sghmc.position[k], sgld.position[k])


@pytest.mark.parametrize("friction", [0.2, 1.0])
def test_sghmc_baoab_samples_a_gaussian_exactly_where_euler_is_too_wide(friction):
    """On N(0, 1/kappa) with eta kappa = 1, BAOAB's positions have the exact variance; Euler's
    have 1 / (1 - eta kappa / (2 (2 - alpha))) times it (Lyapunov), 1.385 and 2 times here."""
    eta, kappa, chains, steps = 1.0, 1.0, 20000, 400
    variances = {}
    for integrator in ("baoab", "euler"):
        generator = torch.Generator().manual_seed(3)
        start = torch.randn(chains, generator=generator, dtype=torch.float64)
        state = sghmc_init({"x": start})
        for _ in range(steps):
            grad = {"x": kappa * state.position["x"]}
            state = sghmc_step(state, grad, eta, friction, 1.0, generator, integrator=integrator)
        variances[integrator] = float(state.position["x"].var())
    standard_error = math.sqrt(2.0 / chains)  # of a Gaussian sample variance, relative
    assert abs(variances["baoab"] * kappa - 1.0) < 4 * standard_error, variances
    euler = 1.0 / (1.0 - eta * kappa / (2 * (2 - friction)))
    assert abs(variances["euler"] * kappa / euler - 1.0) < 4 * standard_error, variances


@pytest.mark.parametrize(("friction", "eta", "variance"), [(1.0, 0.05, 10.0), (0.5, 0.1, 4.0)])
def test_sghmc_baoab_subtracts_the_gradient_noise_it_is_told(friction, eta, variance):
    """N(0, 1) sampled with gradients of noise variance V and gradient_noise = eta V / 2: BAOAB
    subtracts (2 - alpha)^2 / 2 of it from the friction step's noise, and the positions keep
    the exact variance (1.0016 and 1.008 by Lyapunov; 0.63 and 0.77 subtracting 2 beta; 1.13 and
    1.15 subtracting nothing). The friction is a tensor, one per chain."""
    chains, steps = 20000, 600
    generator = torch.Generator().manual_seed(4)
    state = sghmc_init({"x": torch.randn(chains, generator=generator, dtype=torch.float64)})
    alpha = torch.full((chains,), friction, dtype=torch.float64)
    for _ in range(steps):
        x = state.position["x"]
        noisy = x + math.sqrt(variance) * torch.randn(chains, generator=generator, dtype=x.dtype)
        state = sghmc_step(state, {"x": noisy}, eta, alpha, 1.0, generator,
                           gradient_noise=eta * variance / 2, integrator="baoab")  # fmt: skip
    standard_error = math.sqrt(2.0 / chains)
    assert abs(float(state.position["x"].var()) - 1.0) < 4 * standard_error + 0.01


def test_sghmc_integrator_is_checked():
    with pytest.raises(ValueError, match=r"integrator must be one of \['euler', 'baoab'\]"):
        sghmc_step(sghmc_init(THETA), GRAD, 0.01, 0.1, integrator="leapfrog")


def test_psgld_one_step_exact_and_running_average():
    eps, temperature, n, decay, lam = 1e-3, 1.0, 100, 0.9, 1e-4
    state = psgld_step(
        psgld_init(THETA), GRAD, eps, temperature, num_data=n, decay=decay, epsilon=lam, noise=XI
    )
    for k in THETA:
        v = (GRAD[k] / n) ** 2
        g = 1.0 / (lam + v.sqrt())
        expected = THETA[k] - eps * g * GRAD[k] + (2 * eps * temperature * g).sqrt() * XI[k]
        torch.testing.assert_close(state.position[k], expected)
        torch.testing.assert_close(state.square_average[k], v)
    grad2 = {k: 2 * v for k, v in GRAD.items()}
    state2 = psgld_step(
        state, grad2, eps, temperature, num_data=n, decay=decay, epsilon=lam, noise=XI
    )
    for k in THETA:
        v2 = decay * (GRAD[k] / n) ** 2 + (1 - decay) * (grad2[k] / n) ** 2
        g2 = 1.0 / (lam + v2.sqrt())
        expected = (
            state.position[k] - eps * g2 * grad2[k] + (2 * eps * temperature * g2).sqrt() * XI[k]
        )
        torch.testing.assert_close(state2.position[k], expected)


def test_psgld_max_gain_caps_the_rmsprop_diagonal_entry_by_entry():
    eps, temperature, n, lam = 1e-3, 1.0, 100, 1e-4
    caps = {k: torch.full_like(v, 50.0) for k, v in THETA.items()}
    state = psgld_step(psgld_init(THETA), GRAD, eps, temperature, num_data=n, epsilon=lam,
                       noise=XI, max_gain=caps)  # fmt: skip
    for k in THETA:
        g = torch.minimum(1.0 / (lam + (GRAD[k] / n).abs()), caps[k])
        expected = THETA[k] - eps * g * GRAD[k] + (2 * eps * temperature * g).sqrt() * XI[k]
        torch.testing.assert_close(state.position[k], expected)
    # RMSprop's gains: "a" 322 and 909 (capped at 50), "b" 49.8 (kept)
    uncapped = psgld_step(psgld_init(THETA), GRAD, eps, temperature, num_data=n, epsilon=lam,
                          noise=XI)  # fmt: skip
    assert not torch.allclose(uncapped.position["a"], state.position["a"])
    torch.testing.assert_close(uncapped.position["b"], state.position["b"])


def test_gradient_noise_estimate_matches_exponential_moments():
    g1 = {"a": torch.tensor([1.0, 2.0])}
    g2 = {"a": torch.tensor([3.0, 0.0])}
    est = update_gradient_noise_estimate(None, g1, decay=0.5)
    est = update_gradient_noise_estimate(est, g2, decay=0.5)
    torch.testing.assert_close(est.mean["a"], torch.tensor([2.0, 1.0]))
    # V = 0.5 * 0 + 0.5 * (g2 - m1) * (g2 - m2) = 0.5 * [2 * 1, -2 * -1]
    torch.testing.assert_close(est.variance["a"], torch.tensor([1.0, 1.0]))


def test_zero_temperature_draws_no_noise():
    generator = torch.Generator().manual_seed(0)
    state = sgld_step(sgld_init(THETA), GRAD, 0.1, 0.0, generator)
    before = generator.get_state()
    for k in THETA:
        torch.testing.assert_close(state.position[k], THETA[k] - 0.1 * GRAD[k])
    assert torch.equal(before, generator.get_state())


def test_generator_makes_steps_reproducible():
    a = sgld_step(sgld_init(THETA), GRAD, 0.1, 1.0, torch.Generator().manual_seed(3))
    b = sgld_step(sgld_init(THETA), GRAD, 0.1, 1.0, torch.Generator().manual_seed(3))
    c = sgld_step(sgld_init(THETA), GRAD, 0.1, 1.0, torch.Generator().manual_seed(4))
    assert torch.equal(a.position["a"], b.position["a"])
    assert not torch.equal(a.position["a"], c.position["a"])


# ----------------------------------------------------------------------------- properties
finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
steps = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(theta=finite, grad=finite, eps=steps, temperature=st.floats(0.0, 10.0))
def test_sgld_finite_inputs_give_finite_outputs(theta, grad, eps, temperature):
    state = sgld_step(
        sgld_init({"x": torch.tensor([theta])}),
        {"x": torch.tensor([grad])},
        eps,
        temperature,
        torch.Generator().manual_seed(0),
    )
    assert torch.isfinite(state.position["x"]).all()


@settings(max_examples=60, deadline=None)
@given(theta=finite, grad=finite, temperature=st.floats(0.0, 10.0))
def test_sgld_zero_step_size_leaves_position_unchanged(theta, grad, temperature):
    start = {"x": torch.tensor([theta])}
    state = sgld_step(
        sgld_init(start), {"x": torch.tensor([grad])}, 0.0, temperature, torch.Generator()
    )
    assert torch.equal(state.position["x"], start["x"])


@settings(max_examples=60, deadline=None)
@given(theta=finite, grad=finite, eps=steps, friction=st.floats(0.0, 1.0), v=finite)
def test_sghmc_finite_inputs_give_finite_outputs(theta, grad, eps, friction, v):
    state = sghmc_init({"x": torch.tensor([theta])}, {"x": torch.tensor([v])})
    new = sghmc_step(state, {"x": torch.tensor([grad])}, eps, friction, 1.0, torch.Generator())
    assert torch.isfinite(new.position["x"]).all() and torch.isfinite(new.momentum["x"]).all()


@settings(max_examples=60, deadline=None)
@given(theta=finite, grad=finite, eps=steps, decay=st.floats(0.0, 0.999))
def test_psgld_finite_inputs_give_finite_outputs(theta, grad, eps, decay):
    state = psgld_step(
        psgld_init({"x": torch.tensor([theta])}),
        {"x": torch.tensor([grad])},
        eps,
        1.0,
        torch.Generator(),
        num_data=10,
        decay=decay,
    )
    assert torch.isfinite(state.position["x"]).all()


# ----------------------------------------------------------------------------- statistics
# Target: 2-D Gaussian with correlation 0.9. Each of many independent chains is run to
# stationarity; the final states are independent draws, so the Monte Carlo standard error uses
# n_eff = number of chains exactly. Gradients carry Gaussian noise (as minibatch gradients do).
COVARIANCE = np.array([[1.0, 0.9], [0.9, 1.0]])
MEAN = np.array([1.0, -1.0])
PRECISION = torch.tensor(np.linalg.inv(COVARIANCE), dtype=torch.float64)
NUM_CHAINS = 4000


def _noisy_gradient(theta, generator, noise_sd):
    grad = (theta - torch.tensor(MEAN)) @ PRECISION
    return grad + noise_sd * torch.randn(theta.shape, generator=generator, dtype=theta.dtype)


def _check_gaussian(final: torch.Tensor, relative_bias: float) -> None:
    draws = final.numpy()
    n = draws.shape[0]
    mean_se = np.sqrt(np.diag(COVARIANCE) / n)
    assert np.all(np.abs(draws.mean(0) - MEAN) <= 4 * mean_se + relative_bias), draws.mean(0)
    cov = np.cov(draws, rowvar=False)
    se = np.sqrt((COVARIANCE**2 + np.outer(np.diag(COVARIANCE), np.diag(COVARIANCE))) / n)
    assert np.all(np.abs(cov - COVARIANCE) <= 4 * se + relative_bias), cov


def _sgld_discrete_covariance(eps: float, noise_sd: float) -> np.ndarray:
    """Exact stationary covariance of the discretised SGLD chain on this Gaussian (Lyapunov)."""
    a = np.linalg.inv(COVARIANCE)
    m = np.eye(2) - eps * a
    q = (2 * eps + eps**2 * noise_sd**2) * np.eye(2)
    s = q.copy()
    for _ in range(20000):
        s = m @ s @ m.T + q
    return s


@pytest.mark.parametrize("rule", ["sgld", "sghmc", "psgld"])
def test_rules_sample_correlated_gaussian(rule):
    eps, noise_sd, num_steps = 2e-3, 1.0, 6000
    if rule == "psgld":
        # pSGLD drops the drift correction Gamma, exact only for a constant preconditioner. With
        # gradient noise dominating V (as minibatch noise does), G is nearly constant; with a
        # V that tracks |grad U(theta)| the chain is visibly biased (see the test below).
        eps, noise_sd, num_steps = 5e-3, 5.0, 10000
    if rule == "sgld":
        # The analytic stationary covariance of the discretised chain tells the bias we accept.
        bias = np.abs(_sgld_discrete_covariance(eps, noise_sd) - COVARIANCE).max()
        assert bias < 0.02
    generator = torch.Generator().manual_seed(1)
    start = {"t": torch.randn(NUM_CHAINS, 2, generator=generator, dtype=torch.float64) * 3}
    if rule == "sgld":
        state = sgld_init(start)
    elif rule == "sghmc":
        state = sghmc_init(start)
    else:
        state = psgld_init(start)
    for _ in range(num_steps):
        grad = {"t": _noisy_gradient(state.position["t"], generator, noise_sd)}
        if rule == "sgld":
            state = sgld_step(state, grad, eps, 1.0, generator)
        elif rule == "sghmc":
            state = sghmc_step(state, grad, eps * 0.1, 0.1, 1.0, generator)
        else:
            state = psgld_step(state, grad, eps, 1.0, generator, num_data=1, decay=0.999)
    _check_gaussian(state.position["t"], relative_bias=0.02)


def test_naive_sghmc_without_friction_is_wrong():
    """The control: frictionless SGHMC with noisy gradients does not keep the target.

    Between momentum resamplings every 50 steps the gradient noise (sd 5) adds a kinetic energy
    of about 50 eta^2 s^2 = 2.5 times the resampled one; nothing removes it, so the chain heats.
    """
    generator = torch.Generator().manual_seed(2)
    state = sghmc_init({"t": torch.randn(NUM_CHAINS, 2, generator=generator, dtype=torch.float64)})
    for step in range(3000):
        grad = {"t": _noisy_gradient(state.position["t"], generator, 5.0)}
        state = sghmc_step(state, grad, 2e-3, 0.0, 1.0, generator)
        if step % 50 == 49:  # momentum resampling, as in Chen et al.'s naive SGHMC
            fresh = torch.randn(NUM_CHAINS, 2, generator=generator, dtype=torch.float64)
            state = state._replace(momentum={"t": math.sqrt(2e-3) * fresh})
    cov = np.cov(state.position["t"].numpy(), rowvar=False)
    assert np.trace(cov) > 1.5 * np.trace(COVARIANCE)


def test_psgld_state_dependent_preconditioner_is_biased_without_gamma():
    """Documented limitation: when V follows |grad U(theta)|, dropping Gamma biases pSGLD."""
    generator = torch.Generator().manual_seed(3)
    state = psgld_init({"t": torch.randn(NUM_CHAINS, 2, generator=generator, dtype=torch.float64)})
    for _ in range(6000):
        grad = {"t": _noisy_gradient(state.position["t"], generator, 0.0)}
        state = psgld_step(state, grad, 2e-3, 1.0, generator, num_data=1, decay=0.99)
    cov = np.cov(state.position["t"].numpy(), rowvar=False)
    assert abs(np.trace(cov) - np.trace(COVARIANCE)) > 0.2 * np.trace(COVARIANCE)
