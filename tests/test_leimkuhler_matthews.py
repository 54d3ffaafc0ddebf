"""SGLD and pSGLD with the Leimkuhler-Matthews integrator (their default): the exact one-step
rules, the exact Gaussian variance at large steps (where Euler's is visibly inflated), the
documented effect of gradient noise, and the kernels' defaults and validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pyro_sgmcmc import PSGLD, SGLD
from pyro_sgmcmc.dynamics import psgld_init, psgld_step, sgld_init, sgld_step
from pyro_sgmcmc.dynamics.psgld import rmsprop_preconditioner
from pyro_sgmcmc.dynamics.registry import PSGLDOptions, SGLDOptions

THETA = {"a": torch.tensor([1.0, -2.0]), "b": torch.tensor(0.5)}
GRAD = {"a": torch.tensor([0.3, -0.1]), "b": torch.tensor(2.0)}
XI_BEFORE = {"a": torch.tensor([-0.4, 0.9]), "b": torch.tensor(1.1)}
XI = {"a": torch.tensor([0.7, -1.2]), "b": torch.tensor(0.4)}
LM = "leimkuhler_matthews"


# ----------------------------------------------------------------------------- exact one-step
def test_one_step_exact_with_preconditioner_and_gradient_noise():
    eps, temperature = 0.01, 2.0
    precond = {"a": torch.tensor([2.0, 0.5]), "b": torch.tensor(3.0)}
    beta = {"a": torch.tensor([0.1, 0.3]), "b": torch.tensor(0.0)}
    state = sgld_init(THETA)._replace(previous_noise=XI_BEFORE)
    new = sgld_step(state, GRAD, eps, temperature, noise=XI, preconditioner=precond,
                    gradient_noise=beta, integrator=LM)  # fmt: skip
    for k in THETA:
        scale = torch.sqrt(2 * eps * (temperature - beta[k]) * precond[k])
        expected = THETA[k] - eps * precond[k] * GRAD[k] + scale * 0.5 * (XI_BEFORE[k] + XI[k])
        torch.testing.assert_close(new.position[k], expected)
        torch.testing.assert_close(new.previous_noise[k], XI[k])


def test_psgld_one_step_exact_with_a_frozen_capped_preconditioner():
    r"""pSGLD's step with the preconditioner frozen (the adaptive warm-up's sampling phase) and
    capped: the same averaged noise, through :math:`\sqrt{2 \epsilon T G}`."""
    eps, temperature, num_data = 0.01, 1.5, 100
    square = {"a": torch.tensor([4.0, 0.25]), "b": torch.tensor(1e-12)}
    cap = {"a": torch.tensor([10.0, 1.0]), "b": torch.tensor(5.0)}
    state = psgld_init(THETA)._replace(square_average=square, previous_noise=XI_BEFORE)
    new = psgld_step(state, GRAD, eps, temperature, num_data=num_data, noise=XI, adapt=False,
                     max_gain=cap, integrator=LM)  # fmt: skip
    for k in THETA:
        gain = torch.minimum(rmsprop_preconditioner(square[k], 1e-5), cap[k])
        scale = torch.sqrt(2 * eps * temperature * gain)
        expected = THETA[k] - eps * gain * GRAD[k] + scale * 0.5 * (XI_BEFORE[k] + XI[k])
        torch.testing.assert_close(new.position[k], expected)
        torch.testing.assert_close(new.previous_noise[k], XI[k])
        torch.testing.assert_close(new.square_average[k], square[k])
    euler = psgld_step(state, GRAD, eps, temperature, num_data=num_data, noise=XI, adapt=False)
    assert euler.previous_noise is None


def test_the_kernels_default_to_leimkuhler_matthews():
    assert SGLD(lambda: None, batch_size=10).options.integrator == LM
    assert PSGLD(lambda: None, batch_size=10).options.integrator == LM
    assert PSGLD(lambda: None, batch_size=10, integrator="euler").options.integrator == "euler"


def test_first_heated_step_is_an_euler_step_and_remembers_its_noise():
    eps, temperature = 0.01, 2.0
    lm = sgld_step(sgld_init(THETA), GRAD, eps, temperature, noise=XI, integrator=LM)
    euler = sgld_step(sgld_init(THETA), GRAD, eps, temperature, noise=XI)
    for k in THETA:
        torch.testing.assert_close(lm.position[k], euler.position[k])
        torch.testing.assert_close(lm.previous_noise[k], XI[k])
    assert euler.previous_noise is None


def test_a_step_without_noise_forgets_the_previous_noise():
    state = sgld_init(THETA)._replace(previous_noise=XI_BEFORE)
    new = sgld_step(state, GRAD, 0.01, 0.0, integrator=LM)
    assert new.previous_noise is None
    for k in THETA:
        torch.testing.assert_close(new.position[k], THETA[k] - 0.01 * GRAD[k])


def test_integrator_is_validated_with_its_allowed_values():
    with pytest.raises(ValueError, match=r"integrator must be one of .*'euler'.*got 'midpoint'"):
        SGLDOptions(integrator="midpoint")
    with pytest.raises(ValueError, match="integrator must be one of"):
        sgld_step(sgld_init(THETA), GRAD, 0.01, 1.0, noise=XI, integrator="midpoint")
    with pytest.raises(ValueError, match=r"integrator must be one of .*got 'rk4'"):
        SGLD(lambda: None, batch_size=10, integrator="rk4")
    with pytest.raises(ValueError, match=r"integrator must be one of .*got 'rk4'"):
        PSGLD(lambda: None, batch_size=10, integrator="rk4")
    with pytest.raises(ValueError, match="integrator must be one of"):
        PSGLDOptions(integrator="heun")


# ----------------------------------------------------------------------------- statistics
NUM_CHAINS = 4000


def _run(curvature, eps, integrator, steps=300, gradient_sd=0.0, seed=0):
    """Final states of ``NUM_CHAINS`` independent chains on independent Gaussian coordinates of
    the given curvatures (started at the exact target), with white gradient noise of standard
    deviation ``gradient_sd`` subtracted from the injected noise as the samplers do."""
    generator = torch.Generator().manual_seed(seed)
    h = torch.tensor(curvature, dtype=torch.float64)
    start = torch.randn(NUM_CHAINS, len(curvature), generator=generator, dtype=torch.float64)
    state = sgld_init({"x": start / h.sqrt()})
    beta = 0.5 * eps * gradient_sd**2
    for _ in range(steps):
        x = state.position["x"]
        grad = h * x + gradient_sd * torch.randn(x.shape, generator=generator, dtype=x.dtype)
        state = sgld_step(state, {"x": grad}, eps, 1.0, generator, gradient_noise=beta,
                          integrator=integrator)  # fmt: skip
    return state.position["x"].numpy(), h.numpy()


def _run_psgld(curvature, gain, eps, integrator, steps=300, seed=0):
    """As :func:`_run` for pSGLD with its RMSprop diagonal frozen at ``gain`` per coordinate."""
    generator = torch.Generator().manual_seed(seed)
    h = torch.tensor(curvature, dtype=torch.float64)
    g = torch.tensor(gain, dtype=torch.float64)
    start = torch.randn(NUM_CHAINS, len(curvature), generator=generator, dtype=torch.float64)
    square = {"x": (1.0 / g - 1e-5).square().expand(NUM_CHAINS, -1)}  # G = 1/(sqrt(V) + 1e-5)
    state = psgld_init({"x": start / h.sqrt()})._replace(square_average=square)
    for _ in range(steps):
        state = psgld_step(state, {"x": h * state.position["x"]}, eps, 1.0, generator,
                           num_data=1, adapt=False, integrator=integrator)  # fmt: skip
    return state.position["x"].numpy(), h.numpy()


def _variance_ratio_bound(n: int) -> float:
    """Five standard errors of a Gaussian sample variance over its true value."""
    return 5.0 * math.sqrt(2.0 / n)


def test_the_gaussian_variance_is_exact_at_steps_where_euler_is_inflated():
    """For a Gaussian coordinate of curvature H, Euler's SGLD has variance
    1 / (H (1 - eH/2)) (1.08, 1.43 and 4 times too large at eH = 0.15, 0.6, 1.5); the
    Leimkuhler-Matthews chain has exactly 1 / H for every eH < 2."""
    eps, curvature = 0.15, [1.0, 4.0, 10.0]
    lm, h = _run(curvature, eps, LM)
    euler, _ = _run(curvature, eps, "euler")
    ratio_lm = lm.var(0) * h
    ratio_euler = euler.var(0) * h
    bound = _variance_ratio_bound(NUM_CHAINS)
    np.testing.assert_array_less(np.abs(ratio_lm - 1.0), bound)
    np.testing.assert_array_less(np.abs(lm.mean(0)) * np.sqrt(h), 5.0 / math.sqrt(NUM_CHAINS))
    expected_euler = 1.0 / (1.0 - eps * h / 2.0)
    np.testing.assert_array_less(np.abs(ratio_euler / expected_euler - 1.0), bound)
    assert ratio_euler[1] > 1.3  # the test can tell the two integrators apart


def test_psgld_gaussian_variance_is_exact_with_a_frozen_preconditioner():
    """pSGLD with G frozen: the preconditioned step e G H of 0.2, 0.9 and 1.6 (Euler's variance
    1.11, 1.82 and 5 times too large) leaves the Leimkuhler-Matthews variance at 1 / H."""
    curvature, gain, eps = [1.0, 3.0, 40.0], [2.0, 3.0, 0.4], 0.1
    lm, h = _run_psgld(curvature, gain, eps, LM)
    euler, _ = _run_psgld(curvature, gain, eps, "euler")
    step = eps * np.asarray(gain) * h
    bound = _variance_ratio_bound(NUM_CHAINS)
    np.testing.assert_array_less(np.abs(lm.var(0) * h - 1.0), bound)
    expected_euler = 1.0 / (1.0 - step / 2.0)
    np.testing.assert_array_less(np.abs(euler.var(0) * h / expected_euler - 1.0), bound)


def test_gradient_noise_adds_what_the_docstring_says():
    r"""With white gradient noise of variance V and :math:`\hat\beta = eV/2` subtracted, the
    variance is :math:`1/H + e^2 V / (2 (2 - eH))`."""
    eps, curvature, gradient_sd = 0.1, [2.0, 10.0], 4.0
    lm, h = _run(curvature, eps, LM, gradient_sd=gradient_sd, seed=1)
    v = gradient_sd**2
    expected = 1.0 / h + eps**2 * v / (2.0 * (2.0 - eps * h))
    ratio = lm.var(0) / expected
    np.testing.assert_array_less(np.abs(ratio - 1.0), _variance_ratio_bound(NUM_CHAINS))
    assert expected[1] * h[1] > 1.3  # the noise term is large enough to be seen


def test_lag_one_autocorrelation_is_that_of_the_arma_process():
    """x' = (1 - eH) x + s (xi + xi'), an ARMA(1, 1) process: lag-one autocorrelation
    (2 - eH) / 2, 0.75 at eH = 0.5 (its integrated autocorrelation time 2 / (eH) is Euler's: what
    the integrator gains is the step it allows, ten times Euler's for the same bias)."""
    eps, curvature = 0.5, [1.0]
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(NUM_CHAINS, 1, generator=generator, dtype=torch.float64)
    state = sgld_init({"x": x})
    for _ in range(50):
        state = sgld_step(state, {"x": state.position["x"]}, eps, 1.0, generator, integrator=LM)
    before = state.position["x"].clone()
    state = sgld_step(state, {"x": state.position["x"]}, eps, 1.0, generator, integrator=LM)
    after = state.position["x"]
    correlation = float(np.corrcoef(before.numpy()[:, 0], after.numpy()[:, 0])[0, 1])
    expected = (2.0 - eps * curvature[0]) / 2.0
    assert abs(correlation - expected) < 5.0 * (1.0 - expected**2) / math.sqrt(NUM_CHAINS)
