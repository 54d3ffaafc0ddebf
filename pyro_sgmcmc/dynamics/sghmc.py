r"""Stochastic gradient Hamiltonian Monte Carlo with friction (Chen, Fox & Guestrin, 2014)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from ._common import (
    StepSize,
    TensorDict,
    check_rule_arguments,
    entry,
    is_scalar,
    noise_stds,
    resolve_noise,
)
from .metric import DenseMetric
from .sgld import preconditioned_move

#: The integrators of SGHMC's dynamics that :func:`sghmc_step` offers.
SGHMC_INTEGRATORS = ("euler", "baoab")

#: The integrator the kernel uses when none is given (the pure rule keeps ``"euler"``).
DEFAULT_SGHMC_INTEGRATOR = "baoab"


class GradientNoiseEstimate(NamedTuple):
    r"""Running moments of the stochastic gradient, used to estimate its noise variance
    :math:`\hat V` element-wise by exponential moving averages."""

    mean: TensorDict
    variance: TensorDict
    count: int


class SGHMCState(NamedTuple):
    """State of an SGHMC chain: position, momentum (in velocity units, :math:`v`) and, when the
    gradient noise is estimated on the fly, its running moments (else ``None``)."""

    position: TensorDict
    momentum: TensorDict
    noise_estimate: GradientNoiseEstimate | None = None


class SGHMCConstants(NamedTuple):
    """What an SGHMC step computes from its settings alone, not from the state."""

    decay: StepSize
    r""":math:`1 - \alpha`, the share of the momentum a step keeps."""
    noise_std: dict[str, StepSize] | None
    r"""Per site, the factor of the standard normal draw,
    :math:`\sqrt{2\eta\,(\alpha T - \hat\beta)_+}` (Euler's step; BAOAB's
    :math:`\sqrt{\eta\,(\alpha(2 - \alpha) T - (2 - \alpha)^2\hat\beta / 2)_+}`) times
    :math:`P^{1/2}` for a diagonal :math:`P` (``noise_stds``); ``None``: the step injects no
    noise."""


def sghmc_constants(
    position: Mapping[str, torch.Tensor],
    step_size: StepSize,
    friction: StepSize,
    temperature: float,
    gradient_noise: float | Mapping[str, torch.Tensor],
    preconditioner: Mapping[str, torch.Tensor] | None,
    integrator: str = "euler",
) -> SGHMCConstants:
    r"""The :class:`SGHMCConstants` of :func:`sghmc_step`'s arguments (for the sites of
    ``position``). Euler's step injects :math:`2\eta P(\alpha T - \hat\beta)`; BAOAB's friction
    step :math:`\eta P \alpha(2 - \alpha) T`, which keeps :math:`v \sim \mathcal N(0, \eta T P)`
    exactly under :math:`v \mapsto (1-\alpha) v`, less the gradient noise's share
    :math:`\eta P (2 - \alpha)^2 \hat\beta / 2`."""
    check_sghmc_integrator(integrator)
    budget = friction * temperature
    if integrator == "baoab":
        budget = budget * (1.0 - 0.5 * friction)
        # the kick moves the position by (2 - alpha)/2 of the gradient's noise and the friction
        # keeps 1 - alpha of it: over many steps the position diffuses as with
        # eta P (2 - alpha)^2 V / 2 more injected variance (at alpha = 1 the Leimkuhler-Matthews
        # SGLD's correction), so (2 - alpha)^2 / 4 of beta is subtracted
        share = 0.25 * (2.0 - friction) ** 2
        if is_scalar(gradient_noise):
            budget, gradient_noise = budget - share * gradient_noise, 0.0
        else:
            gradient_noise = {name: share * beta for name, beta in gradient_noise.items()}
    stds = noise_stds(position, step_size, budget, gradient_noise, preconditioner)
    return SGHMCConstants(1.0 - friction, stds)


def check_sghmc_integrator(integrator: str) -> str:
    """``integrator`` if it is one of :data:`SGHMC_INTEGRATORS`; else a message naming them."""
    if integrator not in SGHMC_INTEGRATORS:
        raise ValueError(f"integrator must be one of {list(SGHMC_INTEGRATORS)}, got {integrator!r}")
    return integrator


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
    step_size: StepSize,
    friction: StepSize,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    *,
    gradient_noise: float | Mapping[str, torch.Tensor] = 0.0,
    noise: Mapping[str, torch.Tensor] | None = None,
    preconditioner: Mapping[str, torch.Tensor] | None = None,
    constants: SGHMCConstants | None = None,
    integrator: str = "euler",
) -> SGHMCState:
    r"""One SGHMC step in the :math:`(\eta, \alpha)` parameterisation of Chen et al. (eq. 15).

    .. math::

        v_{t+1} &= (1 - \alpha)\, v_t - \eta\, P \nabla \tilde U(\theta_t)
                   + \sqrt{2 \eta P\, (\alpha T - \hat\beta)_+}\; \xi_t,
                   \qquad \xi_t \sim \mathcal N(0, I), \\
        \theta_{t+1} &= \theta_t + v_{t+1},

    with learning rate :math:`\eta = \epsilon^2` (it multiplies the *full-data* gradient of the
    minibatch potential :math:`\tilde U`), a constant diagonal inverse mass :math:`P = M^{-1}`
    (default :math:`I`), friction :math:`\alpha = \epsilon C M^{-1} \in (0, 1]` and
    :math:`\hat\beta = \eta P \hat V / 2` an estimate of the noise that the stochastic gradient
    itself injects (:math:`\hat V` its variance; ``0`` ignores it, as Chen et al. do in their
    experiments). Without the friction term the stochastic-gradient noise makes "naive" SGHMC
    diverge from the target; with it the dynamics are a discretised second-order Langevin
    diffusion.

    The momentum is updated with the gradient at the current position and the position with the
    new momentum (semi-implicit Euler), which is Chen et al.'s Algorithm 2 shifted by half a step
    and needs one gradient per step. With ``friction = 1`` the update reduces to SGLD with
    step size :math:`\eta`.

    **BAOAB** (``integrator="baoab"``, Leimkuhler and Matthews 2013; the kernel's default) splits
    the step into a kick, half a drift, the friction with its noise, and half a drift:

    .. math::

        v' &= v_t - \eta P \nabla \tilde U(\theta_t), \qquad
        \theta' = \theta_t + \tfrac12 v', \\
        v_{t+1} &= (1 - \alpha)\, v'
                   + \sqrt{\eta P\, (\alpha(2 - \alpha) T - (2 - \alpha)^2\hat\beta/2)_+}
                   \;\xi_t, \qquad \theta_{t+1} = \theta' + \tfrac12 v_{t+1}.

    The kick is BAOAB's closing half kick of the last step and opening half kick of this one,
    both with this gradient (the state's momentum is the one before the closing half), so the
    step also needs one gradient. The friction step maps :math:`\mathcal N(0, \eta T P)` to
    itself exactly. On a Gaussian the positions' stationary variance is exact,
    :math:`T/\kappa`, at any friction and step with :math:`\eta\kappa < 4`, where Euler's is
    :math:`T / (\kappa (1 - \eta\kappa / (2(2 - \alpha))))`; with ``friction = 1`` BAOAB is
    the Leimkuhler-Matthews SGLD (:func:`~.sgld_step`) with step size :math:`\eta / 2`.

    **Stationary distribution.** For :math:`\eta \to 0` the position samples
    :math:`\pi_T(\theta) \propto \exp(-U(\theta)/T)` (``T = 1`` is the posterior) and
    :math:`v \sim \mathcal N(0, \eta T P)`. A constant :math:`P` needs no correction term. With a
    finite step size Euler's bias is :math:`O(\eta)` (for a Gaussian of curvature :math:`\kappa` in
    the preconditioned coordinates the position variance is about :math:`(1 + \eta\kappa/4)\,
    T/\kappa` for small friction; BAOAB's is exact, below); no Metropolis-Hastings correction is
    made.

    Parameters
    ----------
    state:
        Current state.
    gradient:
        :math:`\nabla \tilde U(\theta_t)`.
    step_size:
        :math:`\eta \ge 0`: a float, or a tensor broadcasting against the positions (one step size
        per chain).
    friction:
        :math:`\alpha \in [0, 1]` (``0`` is the naive, frictionless SGHMC: for demonstrations):
        a float, or a tensor broadcasting against the positions (one friction per chain).
    temperature:
        :math:`T \ge 0`.
    generator:
        Source of the Gaussian noise.
    gradient_noise:
        :math:`\hat\beta`, a float or one tensor per site; the injected variance is clamped at 0.
    noise:
        Standard normal draws :math:`\xi_t` to use instead of the generator (for exact tests).
    preconditioner:
        :math:`P`, one positive tensor per site (a diagonal), a
        :class:`~pyro_sgmcmc.dynamics.metric.DenseMetric` per site, or ``None`` (the identity).
    constants:
        :func:`sghmc_constants` of these arguments, computed once for many steps with the same
        settings (a sampler's frozen settings); computed here when ``None``.
    integrator:
        ``"euler"`` (default, the update above) or ``"baoab"``.

    References
    ----------
    T. Chen, E. B. Fox and C. Guestrin, "Stochastic gradient Hamiltonian Monte Carlo",
    ICML 2014.

    B. Leimkuhler and C. Matthews, "Rational construction of stochastic numerical methods for
    molecular sampling", Applied Mathematics Research eXpress 2013(1), 2013.
    """
    check_rule_arguments(step_size=step_size, friction=friction, temperature=temperature)
    check_sghmc_integrator(integrator)
    position, momentum = state.position, state.momentum
    if constants is None:
        constants = sghmc_constants(
            position, step_size, friction, temperature, gradient_noise, preconditioner,
            integrator,
        )  # fmt: skip
    stds = constants.noise_std
    xi = None if stds is None else resolve_noise(position, generator, noise)
    if integrator == "baoab":
        return _baoab_step(state, gradient, step_size, preconditioner, constants, xi)
    new_position, new_momentum = {}, {}
    for name, theta in position.items():
        # v is an SGLD move that starts from (1 - alpha) v: the same fused update
        v = preconditioned_move(
            momentum[name] * constants.decay, gradient[name], step_size,
            entry(preconditioner, name), None if stds is None else stds[name],
            None if xi is None else xi[name],
        )  # fmt: skip
        new_momentum[name] = v
        new_position[name] = theta + v
    return SGHMCState(new_position, new_momentum, state.noise_estimate)


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


def _baoab_step(
    state: SGHMCState,
    gradient: Mapping[str, torch.Tensor],
    step_size: StepSize,
    preconditioner: Mapping[str, torch.Tensor] | None,
    constants: SGHMCConstants,
    xi: Mapping[str, torch.Tensor] | None,
) -> SGHMCState:
    r"""The BAOAB step of :func:`sghmc_step`: a whole kick, half a drift, the friction and
    its noise, half a drift (the state's momentum waits for the next step's first half kick).
    The two half drifts are fused: :math:`\theta_{t+1} = \theta_t + \tfrac12 (2 - \alpha) v'
    + \tfrac12 s \xi_t`."""
    stds, decay = constants.noise_std, constants.decay
    drift = 0.5 * (1.0 + decay)
    new_position, new_momentum = {}, {}
    for name, theta in state.position.items():
        kicked = preconditioned_move(
            state.momentum[name], gradient[name], step_size, entry(preconditioner, name),
            None, None,
        )  # fmt: skip
        if xi is None:
            new_momentum[name] = kicked * decay
            new_position[name] = theta + drift * kicked
            continue
        noise = _scaled_noise(stds[name], xi[name], entry(preconditioner, name))
        if is_scalar(decay):
            new_momentum[name] = torch.add(noise, kicked, alpha=decay)
            new_position[name] = theta.add(kicked, alpha=drift).add_(noise, alpha=0.5)
        else:
            new_momentum[name] = noise + decay * kicked
            new_position[name] = theta + drift * kicked + 0.5 * noise
    return SGHMCState(new_position, new_momentum, state.noise_estimate)


def _scaled_noise(
    std: StepSize, xi: torch.Tensor, preconditioner: torch.Tensor | DenseMetric | None
) -> torch.Tensor:
    r""":math:`s P^{1/2} \xi` from ``std`` (see :func:`~.sgld.preconditioned_move`)."""
    if isinstance(preconditioner, DenseMetric):
        xi = preconditioner.apply_root(xi)
    return std * xi
