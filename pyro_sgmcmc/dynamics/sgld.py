r"""Stochastic gradient Langevin dynamics (Welling & Teh, 2011)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import torch

from ._common import TensorDict, check_rule_arguments, resolve_noise


class SGLDState(NamedTuple):
    """State of an SGLD chain: the position only."""

    position: TensorDict


def sgld_init(position: Mapping[str, torch.Tensor]) -> SGLDState:
    """Start an SGLD chain at ``position``."""
    return SGLDState(dict(position))


def sgld_step(
    state: SGLDState,
    gradient: Mapping[str, torch.Tensor],
    step_size: float,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    *,
    noise: Mapping[str, torch.Tensor] | None = None,
) -> SGLDState:
    r"""One SGLD step.

    .. math::

        \theta_{t+1} = \theta_t - \epsilon_t \, \nabla \tilde U(\theta_t)
                       + \sqrt{2 \epsilon_t T}\, \xi_t, \qquad \xi_t \sim \mathcal N(0, I),

    where :math:`\tilde U` is an unbiased minibatch estimate of the potential
    :math:`U(\theta) = -\log p(\theta) - \sum_{i=1}^N \log p(y_i \mid \theta)` (the likelihood of a
    batch of :math:`B` points scaled by :math:`N/B`) and :math:`\epsilon_t` multiplies the
    *full-data* gradient. (Welling & Teh write the same update with
    :math:`\epsilon/2` in front of the gradient and noise variance :math:`\epsilon`.)

    **Stationary distribution.** As :math:`\epsilon_t \to 0` (e.g. a
    :class:`~pyro_sgmcmc.schedules.PolynomialDecay` schedule) the iterates sample
    :math:`\pi_T(\theta) \propto \exp(-U(\theta)/T)`; ``T = 1`` is the posterior. With a constant
    step size the chain is biased by :math:`O(\epsilon)`; there is no Metropolis-Hastings
    correction.

    Parameters
    ----------
    state:
        Current state.
    gradient:
        :math:`\nabla \tilde U(\theta_t)`, one tensor per entry of ``state.position``.
    step_size:
        :math:`\epsilon_t \ge 0`.
    temperature:
        :math:`T \ge 0`; ``T = 0`` gives plain gradient descent.
    generator:
        Source of the Gaussian noise.
    noise:
        Standard normal draws :math:`\xi_t` to use instead of the generator (for exact tests).

    References
    ----------
    M. Welling and Y. W. Teh, "Bayesian learning via stochastic gradient Langevin dynamics",
    ICML 2011.
    """
    check_rule_arguments(step_size=step_size, temperature=temperature)
    position = state.position
    scale = math.sqrt(2.0 * step_size * temperature)
    xi = resolve_noise(position, generator, noise) if scale > 0 else None
    new_position = {}
    for name, theta in position.items():
        moved = torch.add(theta, gradient[name], alpha=-step_size)
        if xi is not None:
            moved.add_(xi[name], alpha=scale)
        new_position[name] = moved
    return SGLDState(new_position)
