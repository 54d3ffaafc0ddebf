r"""Preconditioned SGLD with an RMSprop diagonal (Li, Chen, Carlson & Carin, 2016)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from ._common import (
    StepSize,
    TensorDict,
    check_rule_arguments,
    noise_stds,
    resolve_noise,
)
from .sgld import check_integrator, integrator_noise, preconditioned_move


class PSGLDState(NamedTuple):
    r"""State of a pSGLD chain: the position, the running average :math:`V` of the squared
    per-datum gradient (``None`` before the first step) and, for the Leimkuhler-Matthews
    integrator, the standard normal draws of the last step (``None`` before the first heated
    step)."""

    position: TensorDict
    square_average: TensorDict | None
    previous_noise: TensorDict | None = None


def psgld_init(position: Mapping[str, torch.Tensor]) -> PSGLDState:
    """Start a pSGLD chain at ``position``; the preconditioner is set from the first gradient."""
    return PSGLDState(dict(position), None)


def psgld_step(
    state: PSGLDState,
    gradient: Mapping[str, torch.Tensor],
    step_size: StepSize,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    *,
    num_data: int,
    decay: float = 0.99,
    epsilon: float = 1e-5,
    noise: Mapping[str, torch.Tensor] | None = None,
    adapt: bool = True,
    gradient_variance: Mapping[str, torch.Tensor] | None = None,
    max_gain: Mapping[str, torch.Tensor] | None = None,
    integrator: str = "euler",
    constants: PSGLDConstants | None = None,
) -> PSGLDState:
    r"""One pSGLD step.

    .. math::

        \bar g_t &= \nabla \tilde U(\theta_t) / N, \\
        V_t &= \beta\, V_{t-1} + (1 - \beta)\, \bar g_t \odot \bar g_t
              \quad (V_0 = \bar g_0 \odot \bar g_0), \\
        G_t &= \operatorname{diag}\!\left(\min\!\left(1 \oslash (\lambda + \sqrt{V_t}),\;
               c\right)\right), \\
        \theta_{t+1} &= \theta_t - \epsilon_t\, G_t \nabla \tilde U(\theta_t)
                        + \sqrt{2 \epsilon_t T\, G_t}\; \xi_t,
                        \qquad \xi_t \sim \mathcal N(0, I).

    :math:`\bar g` is the per-datum average gradient (as in Li et al.), so :math:`G` does not
    grow with :math:`N` and :math:`\epsilon` has the same scale as in SGLD. With
    ``integrator="leimkuhler_matthews"`` the noise :math:`\xi_t` is replaced by
    :math:`\tfrac12(\xi_{t-1} + \xi_t)`, as in :func:`~pyro_sgmcmc.dynamics.sgld_step`: for a
    frozen :math:`G` the Gaussian invariant measure is then exact at any stable step.

    **Stationary distribution.** The exact preconditioned Langevin diffusion needs the drift
    correction :math:`\Gamma_i(\theta) = \sum_j \partial G_{ij}/\partial\theta_j`. Like Li et al.
    in their experiments we **drop** :math:`\Gamma`: it is small when :math:`V` changes slowly
    (``decay`` close to 1), and leaving it out biases the stationary distribution away from
    :math:`\pi_T(\theta) \propto \exp(-U(\theta)/T)` by a term that vanishes as
    :math:`\epsilon \to 0` and :math:`\beta \to 1`. There is no Metropolis-Hastings correction.

    Parameters
    ----------
    state:
        Current state.
    gradient:
        :math:`\nabla \tilde U(\theta_t)`, the gradient of the full-data (N/B-scaled) potential.
    step_size:
        :math:`\epsilon_t \ge 0`.
    temperature:
        :math:`T \ge 0`.
    generator:
        Source of the Gaussian noise.
    num_data:
        :math:`N`, the number of data points, used to form :math:`\bar g`.
    decay:
        :math:`\beta \in [0, 1)`, the RMSprop decay.
    epsilon:
        :math:`\lambda > 0`, the diagonal bias that keeps :math:`G` bounded.
    noise:
        Standard normal draws :math:`\xi_t` to use instead of the generator (for exact tests).
    gradient_variance:
        :math:`\hat\Sigma`, an estimate of the variance of the minibatch gradient per entry:
        the injected variance becomes :math:`2\epsilon_t G (T - \hat\beta)_+` with
        :math:`\hat\beta = \epsilon_t G \hat\Sigma / 2`, so that injected plus gradient noise
        add up to :math:`2\epsilon_t G T` (Chen et al.'s correction). ``None``: no correction.
    adapt:
        Update :math:`V` (default). ``False`` freezes it (and so :math:`G`): the chain is then a
        preconditioned SGLD with a *constant* :math:`G`, for which :math:`\Gamma = 0` exactly and
        the stationary distribution is :math:`\pi_T` up to the :math:`O(\epsilon)` step-size bias.
        The samplers' adaptive warm-up adapts :math:`V` during warm-up and freezes it after.
    max_gain:
        :math:`c`, a cap on each entry of :math:`G` (shaped like the position; ``None``: no
        cap, :math:`c = \infty`). The adaptive warm-up sets it so that no coordinate's step
        :math:`\epsilon_t G_{ii}` exceeds the stability and noise bounds it measured for that
        coordinate: RMSprop's gain is :math:`1/\lambda` for a coordinate whose gradient is
        nearly zero (a ReLU unit inactive on every row) and too large for a stiff one, and
        one such coordinate would otherwise set :math:`\epsilon_t` for all. A constant cap
        leaves the stationary distribution of the frozen sampler unchanged.
    integrator:
        ``"euler"`` (the update above) or ``"leimkuhler_matthews"``.
    constants:
        With ``adapt=False`` only: :func:`psgld_constants` of these arguments and of the
        state's frozen :math:`V`, computed once for many steps (a sampler's frozen settings);
        computed here when ``None``.

    References
    ----------
    C. Li, C. Chen, D. Carlson and L. Carin, "Preconditioned stochastic gradient Langevin
    dynamics for deep neural networks", AAAI 2016.

    B. Leimkuhler and C. Matthews, "Rational construction of stochastic numerical methods for
    molecular sampling", Applied Mathematics Research eXpress, 2013.
    """
    check_rule_arguments(
        step_size=step_size,
        temperature=temperature,
        num_data=num_data,
        decay=decay,
        epsilon=epsilon,
    )
    check_integrator(integrator)
    if not adapt and state.square_average is None:
        raise ValueError("psgld_step(adapt=False) needs a state whose square_average is set")
    position = state.position
    averages = {
        name: _running_average(state, name, gradient[name], num_data, decay, adapt)
        for name in position
    }
    if constants is None or adapt:
        constants = psgld_constants(
            averages, step_size, temperature, epsilon, gradient_variance, max_gain
        )
    preconditioners, stds = constants.preconditioner, constants.noise_std
    xi = None if stds is None else resolve_noise(position, generator, noise)
    kick, remembered = integrator_noise(xi, state.previous_noise, integrator)
    new_position = {
        name: preconditioned_move(
            theta,
            gradient[name],
            step_size,
            preconditioners[name],
            None if stds is None else stds[name],
            None if kick is None else kick[name],
        )
        for name, theta in position.items()
    }
    return PSGLDState(new_position, averages, remembered)


class PSGLDConstants(NamedTuple):
    """What a pSGLD step computes from its settings and its running average :math:`V`: constant
    while :math:`V` is frozen."""

    preconditioner: dict[str, torch.Tensor]
    r"""Per entry, :math:`G` (capped by ``max_gain``)."""
    noise_std: dict[str, torch.Tensor] | None
    r"""Per entry, the factor of the standard normal draw,
    :math:`\sqrt{2\epsilon_t\,(T - \hat\beta)_+}\,G^{1/2}` (``noise_stds``); ``None``: the
    step injects no noise."""


def psgld_constants(
    square_average: Mapping[str, torch.Tensor],
    step_size: StepSize,
    temperature: float,
    epsilon: float,
    gradient_variance: Mapping[str, torch.Tensor] | None = None,
    max_gain: Mapping[str, torch.Tensor] | None = None,
) -> PSGLDConstants:
    """The :class:`PSGLDConstants` of :func:`psgld_step`'s arguments, for the running average
    :math:`V` (``square_average``) the step uses."""
    preconditioners = {
        name: rmsprop_preconditioner(v, epsilon) for name, v in square_average.items()
    }
    if max_gain is not None:
        preconditioners = {
            name: torch.minimum(gain, max_gain[name]) for name, gain in preconditioners.items()
        }
    beta: float | dict[str, torch.Tensor] = 0.0
    if gradient_variance is not None:
        beta = {
            name: 0.5 * step_size * preconditioners[name] * variance
            for name, variance in gradient_variance.items()
        }
    stds = noise_stds(preconditioners, step_size, temperature, beta, preconditioners)
    return PSGLDConstants(preconditioners, stds)


def _running_average(state, name, gradient, num_data, decay, adapt) -> torch.Tensor:
    """:math:`V_t` of one entry (kept as it is when ``adapt`` is false)."""
    if not adapt:
        return state.square_average[name]
    square = (gradient / num_data).square()
    if state.square_average is None:
        return square
    return torch.lerp(square, state.square_average[name], decay)


def rmsprop_preconditioner(square_average: torch.Tensor, epsilon: float) -> torch.Tensor:
    r""":math:`G = 1 \oslash (\lambda + \sqrt{V})`, the RMSprop diagonal of Li et al."""
    return (square_average.sqrt() + epsilon).reciprocal()
