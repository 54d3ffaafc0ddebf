r"""Stochastic gradient Langevin dynamics (Welling & Teh, 2011)."""

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

#: The integrators of the Langevin diffusion that :func:`sgld_step` offers.
INTEGRATORS = ("euler", "leimkuhler_matthews")

#: The integrator the kernels use when none is given (the pure rules keep ``"euler"``).
DEFAULT_INTEGRATOR = "leimkuhler_matthews"


class SGLDState(NamedTuple):
    """State of an SGLD chain: the position, and for the Leimkuhler-Matthews integrator the
    standard normal draws of the last step (``None`` before the first heated step)."""

    position: TensorDict
    previous_noise: TensorDict | None = None


def sgld_init(position: Mapping[str, torch.Tensor]) -> SGLDState:
    """Start an SGLD chain at ``position``."""
    return SGLDState(dict(position))


def sgld_step(
    state: SGLDState,
    gradient: Mapping[str, torch.Tensor],
    step_size: StepSize,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    *,
    noise: Mapping[str, torch.Tensor] | None = None,
    preconditioner: Mapping[str, torch.Tensor] | None = None,
    gradient_noise: float | Mapping[str, torch.Tensor] = 0.0,
    integrator: str = "euler",
    constants: SGLDConstants | None = None,
) -> SGLDState:
    r"""One (preconditioned) SGLD step.

    .. math::

        \theta_{t+1} = \theta_t - \epsilon_t P \nabla \tilde U(\theta_t)
                       + \sqrt{2 \epsilon_t P\, (T - \hat\beta)_+}\; \xi_t,
                       \qquad \xi_t \sim \mathcal N(0, I),

    where :math:`\tilde U` is an unbiased minibatch estimate of the potential
    :math:`U(\theta) = -\log p(\theta) - \sum_{i=1}^N \log p(y_i \mid \theta)` (the likelihood of a
    batch of :math:`B` points scaled by :math:`N/B`), :math:`\epsilon_t` multiplies the
    *full-data* gradient, :math:`P` is a constant diagonal preconditioner (default :math:`I`) and
    :math:`\hat\beta = \epsilon P \hat V / 2` an optional estimate of the variance that the
    stochastic gradient itself adds (:math:`\hat V` its variance; default 0). (Welling & Teh write
    the plain update with :math:`\epsilon/2` in front of the gradient and noise variance
    :math:`\epsilon`.)

    **Stationary distribution.** As :math:`\epsilon_t \to 0` (e.g. a
    :class:`~pyro_sgmcmc.inference.schedules.PolynomialDecay` schedule) the iterates sample
    :math:`\pi_T(\theta) \propto \exp(-U(\theta)/T)`; ``T = 1`` is the posterior. A *constant*
    :math:`P` needs no correction term (:math:`\Gamma = 0`). With a constant step size the chain is
    biased by :math:`O(\epsilon)` (for a Gaussian of curvature :math:`\kappa` in the preconditioned
    coordinates the variance is :math:`T/(\kappa(1 - \epsilon\kappa/2))`); there is no
    Metropolis-Hastings correction. Subtracting :math:`\hat\beta` keeps the total variance of a
    step, injected plus gradient noise, at :math:`2\epsilon P T` (the SGHMC correction of Chen et
    al. with unit friction).

    **Leimkuhler-Matthews integrator** (``integrator="leimkuhler_matthews"``): the noise of a step
    is the average of this step's and the last step's draws,

    .. math::

        \theta_{t+1} = \theta_t - \epsilon P \nabla \tilde U(\theta_t)
                       + \sqrt{2 \epsilon P\, (T - \hat\beta)_+}\;
                         \tfrac12 (\xi_{t-1} + \xi_t),

    at the cost of an Euler step (the draws are kept in :attr:`SGLDState.previous_noise`). It is
    the high-friction limit of the BAOAB Langevin splitting, and its invariant measure is exact
    for a Gaussian target at any step with :math:`\epsilon\kappa < 2` (variance
    :math:`T/\kappa`, against Euler's :math:`T/(\kappa(1 - \epsilon\kappa/2))`) and accurate
    to :math:`O(\epsilon^2)` for smooth targets (Euler: :math:`O(\epsilon)`), so that it can
    take steps ten times larger for the same bias. White gradient noise of variance :math:`V`,
    with :math:`\hat\beta = \epsilon V/2` subtracted, adds
    :math:`\epsilon^2 V / (2(2 - \epsilon\kappa))` to the Gaussian variance. The first step
    with noise (no earlier draws) is an Euler step; a step without noise (``T = 0``) forgets the
    draws.

    Parameters
    ----------
    state:
        Current state.
    gradient:
        :math:`\nabla \tilde U(\theta_t)`, one tensor per entry of ``state.position``.
    step_size:
        :math:`\epsilon_t \ge 0`: a float, or a tensor broadcasting against the positions (one
        step size per chain).
    temperature:
        :math:`T \ge 0`; ``T = 0`` gives plain gradient descent.
    generator:
        Source of the Gaussian noise.
    noise:
        Standard normal draws :math:`\xi_t` to use instead of the generator (for exact tests).
    preconditioner:
        :math:`P`, one positive tensor per entry (a diagonal), a
        :class:`~pyro_sgmcmc.dynamics.metric.DenseMetric` per entry, or ``None`` (the identity).
    gradient_noise:
        :math:`\hat\beta \ge 0`, a float or one tensor per entry; the injected variance is
        clamped at zero.
    integrator:
        ``"euler"`` (Welling and Teh's update) or ``"leimkuhler_matthews"``.
    constants:
        :func:`sgld_constants` of these arguments, computed once for many steps with the same
        settings (a sampler's frozen settings); computed here when ``None``.

    References
    ----------
    M. Welling and Y. W. Teh, "Bayesian learning via stochastic gradient Langevin dynamics",
    ICML 2011.

    B. Leimkuhler and C. Matthews, "Rational construction of stochastic numerical methods for
    molecular sampling", Applied Mathematics Research eXpress, 2013; B. Leimkuhler,
    C. Matthews and G. Stoltz, "The computation of averages from equilibrium and nonequilibrium
    Langevin molecular dynamics", IMA Journal of Numerical Analysis, 2016.
    """
    check_rule_arguments(step_size=step_size, temperature=temperature)
    check_integrator(integrator)
    position = state.position
    if constants is None:
        constants = sgld_constants(position, step_size, temperature, gradient_noise, preconditioner)
    stds = constants.noise_std
    xi = None if stds is None else resolve_noise(position, generator, noise)
    kick, remembered = integrator_noise(xi, state.previous_noise, integrator)
    new_position = {}
    for name, theta in position.items():
        new_position[name] = preconditioned_move(
            theta, gradient[name], step_size, entry(preconditioner, name),
            None if stds is None else stds[name], None if kick is None else kick[name],
        )  # fmt: skip
    return SGLDState(new_position, remembered)


class SGLDConstants(NamedTuple):
    """What an SGLD step computes from its settings alone, not from the state."""

    noise_std: dict[str, StepSize] | None
    r"""Per site, the factor of the standard normal draw,
    :math:`\sqrt{2\epsilon\,(T - \hat\beta)_+}` times :math:`P^{1/2}` for a diagonal
    :math:`P` (``noise_stds``); ``None``: the step injects no noise."""


def sgld_constants(
    position: Mapping[str, torch.Tensor],
    step_size: StepSize,
    temperature: float,
    gradient_noise: float | Mapping[str, torch.Tensor],
    preconditioner: Mapping[str, torch.Tensor] | None,
) -> SGLDConstants:
    """The :class:`SGLDConstants` of :func:`sgld_step`'s arguments (for the sites of
    ``position``)."""
    return SGLDConstants(
        noise_stds(position, step_size, temperature, gradient_noise, preconditioner)
    )


def integrator_noise(
    xi: Mapping[str, torch.Tensor] | None,
    previous_noise: Mapping[str, torch.Tensor] | None,
    integrator: str,
) -> tuple[Mapping[str, torch.Tensor] | None, TensorDict | None]:
    r"""The standard normal vector a Langevin step injects, and the draws it must remember.

    Euler: this step's draws :math:`\xi_t`, nothing remembered. Leimkuhler-Matthews:
    :math:`\tfrac12(\xi_{t-1} + \xi_t)`, remembering :math:`\xi_t` (the first heated step,
    with no :math:`\xi_{t-1}`, injects :math:`\xi_t`); a step without noise (``xi`` is
    ``None``) remembers nothing.
    """
    if integrator == "euler" or xi is None:
        return xi, None
    if previous_noise is None:
        return xi, dict(xi)
    return {name: 0.5 * (previous_noise[name] + xi[name]) for name in xi}, dict(xi)


def check_integrator(integrator: str) -> str:
    """``integrator`` if it is one of :data:`INTEGRATORS`; else a message naming them."""
    if integrator not in INTEGRATORS:
        raise ValueError(f"integrator must be one of {list(INTEGRATORS)}, got {integrator!r}")
    return integrator


def preconditioned_move(
    theta: torch.Tensor,
    gradient: torch.Tensor,
    step_size: StepSize,
    preconditioner: torch.Tensor | DenseMetric | None,
    std: StepSize | None,
    xi: torch.Tensor | None,
) -> torch.Tensor:
    r""":math:`\theta - \epsilon P g + s P^{1/2} \xi` on a fresh tensor (inputs untouched); a
    tensor :math:`P` is diagonal (element-wise), a :class:`~.metric.DenseMetric` a matrix.
    ``std`` is the factor of the draw (``noise_std`` of :math:`s` and :math:`P`): :math:`s
    P^{1/2}` for a diagonal :math:`P`, :math:`s` for a dense one, whose root multiplies
    :math:`\xi` here."""
    dense = isinstance(preconditioner, DenseMetric)
    if preconditioner is None:
        drift = gradient
    else:
        drift = preconditioner.apply(gradient) if dense else preconditioner * gradient
    if is_scalar(step_size):
        moved = torch.add(theta, drift, alpha=-step_size)
    else:
        moved = theta - step_size * drift
    if xi is not None:
        if dense:
            xi = preconditioner.apply_root(xi)
        if is_scalar(std):
            moved.add_(xi, alpha=std)
        else:
            moved.addcmul_(std, xi)
    return moved
