r"""Stochastic gradient Hamiltonian Monte Carlo with friction (Chen, Fox & Guestrin, 2014)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import torch

from ._common import TensorDict, check_rule_arguments, resolve_noise


class SGHMCState(NamedTuple):
    """State of an SGHMC chain: position and momentum (in velocity units, :math:`v`)."""

    position: TensorDict
    momentum: TensorDict


class GradientNoiseEstimate(NamedTuple):
    r"""Running moments of the stochastic gradient, used to estimate its noise variance
    :math:`\hat V` element-wise by exponential moving averages."""

    mean: TensorDict
    variance: TensorDict
    count: int


def sghmc_init(
    position: Mapping[str, torch.Tensor], momentum: Mapping[str, torch.Tensor] | None = None
) -> SGHMCState:
    """Start an SGHMC chain at ``position`` with the given momentum (default: zero)."""
    position = dict(position)
    if momentum is None:
        momentum = {name: torch.zeros_like(value) for name, value in position.items()}
    return SGHMCState(position, dict(momentum))


def sghmc_step(
    state: SGHMCState,
    gradient: Mapping[str, torch.Tensor],
    step_size: float,
    friction: float,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    *,
    gradient_noise: float | Mapping[str, torch.Tensor] = 0.0,
    noise: Mapping[str, torch.Tensor] | None = None,
) -> SGHMCState:
    r"""One SGHMC step in the :math:`(\eta, \alpha)` parameterisation of Chen et al. (eq. 15).

    .. math::

        v_{t+1} &= (1 - \alpha)\, v_t - \eta\, \nabla \tilde U(\theta_t)
                   + \sqrt{2 \eta\, (\alpha T - \hat\beta)_+}\; \xi_t,
                   \qquad \xi_t \sim \mathcal N(0, I), \\
        \theta_{t+1} &= \theta_t + v_{t+1},

    with learning rate :math:`\eta = \epsilon^2 M^{-1}` (it multiplies the *full-data*
    gradient of the minibatch potential :math:`\tilde U`), friction
    :math:`\alpha = \epsilon M^{-1} C \in (0, 1]` and :math:`\hat\beta = \eta \hat V / 2` an
    estimate of the noise that the stochastic gradient itself injects (:math:`\hat V` its
    variance; ``0`` ignores it, as Chen et al. do in their experiments). Without the friction
    term the stochastic-gradient noise makes "naive" SGHMC diverge from the target; with it the
    dynamics are a discretised second-order Langevin diffusion.

    The momentum is updated with the gradient at the current position and the position with the
    new momentum (semi-implicit Euler), which is Chen et al.'s Algorithm 2 shifted by half a step
    and needs one gradient per step. With ``friction = 1`` the update reduces to SGLD with
    step size :math:`\eta`.

    **Stationary distribution.** For :math:`\eta \to 0` the position samples
    :math:`\pi_T(\theta) \propto \exp(-U(\theta)/T)` (``T = 1`` is the posterior) and
    :math:`v \sim \mathcal N(0, \eta T I)`. With a finite step size the bias is :math:`O(\eta)`;
    no Metropolis-Hastings correction is made.

    Parameters
    ----------
    state:
        Current state.
    gradient:
        :math:`\nabla \tilde U(\theta_t)`.
    step_size:
        :math:`\eta \ge 0`.
    friction:
        :math:`\alpha \in [0, 1]` (``0`` is the naive, frictionless SGHMC: for demonstrations).
    temperature:
        :math:`T \ge 0`.
    generator:
        Source of the Gaussian noise.
    gradient_noise:
        :math:`\hat\beta`, a float or one tensor per site; the injected variance is clamped at 0.
    noise:
        Standard normal draws :math:`\xi_t` to use instead of the generator (for exact tests).

    References
    ----------
    T. Chen, E. B. Fox and C. Guestrin, "Stochastic gradient Hamiltonian Monte Carlo",
    ICML 2014.
    """
    check_rule_arguments(step_size=step_size, friction=friction, temperature=temperature)
    position, momentum = state.position, state.momentum
    xi = resolve_noise(position, generator, noise) if temperature > 0 else None
    scalar_std = None
    if isinstance(gradient_noise, float | int):
        scalar_std = math.sqrt(2.0 * step_size * max(friction * temperature - gradient_noise, 0.0))
    new_position, new_momentum = {}, {}
    decay = 1.0 - friction
    for name, theta in position.items():
        # Fused multiply-adds on a fresh tensor; the inputs are never modified.
        v = torch.add(momentum[name] * decay, gradient[name], alpha=-step_size)
        if xi is not None:
            if scalar_std is not None:
                if scalar_std > 0:
                    v.add_(xi[name], alpha=scalar_std)
            else:
                beta = gradient_noise[name]
                std = (2.0 * step_size * (friction * temperature - beta)).clamp_min(0.0).sqrt()
                v.addcmul_(std, xi[name])
        new_momentum[name] = v
        new_position[name] = theta + v
    return SGHMCState(new_position, new_momentum)


def update_gradient_noise_estimate(
    estimate: GradientNoiseEstimate | None,
    gradient: Mapping[str, torch.Tensor],
    decay: float = 0.99,
) -> GradientNoiseEstimate:
    r"""Update element-wise running estimates of the mean and variance of the stochastic gradient.

    .. math::

        m_t = \rho\, m_{t-1} + (1 - \rho)\, g_t, \qquad
        \hat V_t = \rho\, \hat V_{t-1} + (1 - \rho)\, (g_t - m_{t-1})(g_t - m_t).

    The variance of successive minibatch gradients mixes the gradient noise with the drift of
    :math:`\theta` itself, so :math:`\hat V` over-estimates the noise; :func:`sghmc_step` clamps
    the injected variance at zero, which keeps the update well defined in that case.
    """
    if estimate is None:
        zeros = {name: torch.zeros_like(g) for name, g in gradient.items()}
        return GradientNoiseEstimate({k: g.clone() for k, g in gradient.items()}, zeros, 1)
    mean, variance = {}, {}
    for name, g in gradient.items():
        old_mean = estimate.mean[name]
        new_mean = decay * old_mean + (1.0 - decay) * g
        variance[name] = decay * estimate.variance[name] + (1.0 - decay) * (g - old_mean) * (
            g - new_mean
        )
        mean[name] = new_mean
    return GradientNoiseEstimate(mean, variance, estimate.count + 1)
