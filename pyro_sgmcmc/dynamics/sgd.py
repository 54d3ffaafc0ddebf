r"""Constant-rate SGD as approximate posterior sampling (Mandt, Hoffman & Blei, 2017)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from ._common import StepSize, TensorDict, check_rule_arguments, entry, resolve_noise


class SGDState(NamedTuple):
    """State of a constant-SGD chain: the position only."""

    position: TensorDict


def sgd_init(position: Mapping[str, torch.Tensor]) -> SGDState:
    """Start a constant-SGD chain at ``position``."""
    return SGDState(dict(position))


def sgd_step(
    state: SGDState,
    gradient: Mapping[str, torch.Tensor],
    step_size: StepSize | Mapping[str, torch.Tensor],
) -> SGDState:
    r"""One step of SGD with a constant rate and no injected noise.

    .. math::

        \theta_{t+1} = \theta_t - H \, \nabla \tilde U(\theta_t),

    with :math:`H = \eta I` (a float ``step_size``) or a diagonal :math:`H` (one tensor per site).
    The only noise is that of the minibatch gradient, with covariance
    :math:`\frac{N^2}{B} C(\theta)` where :math:`C` is the covariance of the per-datum gradients.

    **Stationary distribution.** Near a mode where :math:`U` is quadratic with Hessian :math:`A`
    and :math:`C` is constant, the iterates are approximately Gaussian with covariance
    :math:`\Sigma` solving :math:`A\Sigma + \Sigma A = \eta \frac{N^2}{B} C` (scalar rate). The
    rate :math:`\eta^* = 2 B D / (N^2 \operatorname{Tr} C)` minimises the KL divergence from this
    Gaussian to the Laplace approximation of the posterior, and matches it exactly when
    :math:`C \propto A`; the diagonal :math:`H^*_{kk} = 2 B / (N^2 C_{kk})` is the
    preconditioned version (Mandt et al., eq. 15 and 18 in their per-datum units,
    :math:`\epsilon = N \eta`). No temperature: the spread is set by the rate alone.

    References
    ----------
    S. Mandt, M. D. Hoffman and D. M. Blei, "Stochastic gradient descent as approximate Bayesian
    inference", JMLR 18, 2017.
    """
    check_rule_arguments(step_size=step_size)
    new_position = {}
    for name, theta in state.position.items():
        new_position[name] = theta - entry(step_size, name) * gradient[name]
    return SGDState(new_position)


def optimal_constant_rates(
    mean_square_difference: Mapping[str, torch.Tensor],
    num_data: int,
    *,
    diagonal: bool = False,
    batch_ndim: int = 0,
) -> float | torch.Tensor | TensorDict:
    r"""Mandt et al.'s optimal constant rates from the gradient noise of two minibatches.

    For two disjoint minibatches of size :math:`B` drawn at the same :math:`\theta`, the
    difference :math:`\Delta = \nabla\tilde U_1 - \nabla\tilde U_2` of the (``N/B``-scaled)
    minibatch gradients has :math:`E[\Delta_k^2] = \frac{2 N^3}{B (N-1)} C_{kk}`. Substituting in
    :math:`\eta^* = 2BD/(N^2 \operatorname{Tr} C)` and :math:`H^*_{kk} = 2B/(N^2 C_{kk})` gives

    .. math::

        \eta^* = \frac{4 D N}{(N-1) \sum_k E[\Delta_k^2]}, \qquad
        H^*_{kk} = \frac{4 N}{(N-1) E[\Delta_k^2]},

    free of :math:`B`. ``mean_square_difference`` holds the running means of
    :math:`\Delta_k^2`, one tensor per site. With ``batch_ndim`` leading chain dimensions the
    scalar rate is computed per chain and returned as a tensor of shape ``(C, 1, ...)`` that
    broadcasts against the sites.
    """
    check_rule_arguments(num_data=num_data)
    correction = 4.0 * num_data / max(num_data - 1, 1)
    if diagonal:
        return {
            name: correction / value.clamp_min(torch.finfo(value.dtype).tiny)
            for name, value in mean_square_difference.items()
        }
    values = list(mean_square_difference.values())
    dimension = sum(value[(0,) * batch_ndim].numel() for value in values)
    total = sum(value.flatten(batch_ndim).sum(-1) for value in values)
    if not bool(torch.all(torch.as_tensor(total) > 0)):
        raise ValueError(
            "mean_square_difference is zero: the minibatch gradients show no noise, so the "
            "optimal constant rate is undefined (use a smaller batch_size or a fixed rate)"
        )
    if batch_ndim == 0:
        return correction * dimension / float(total)
    return (correction * dimension / total).reshape(*total.shape, 1)


def partial_momentum_refresh(
    momentum: Mapping[str, torch.Tensor],
    persistence: float,
    scale: StepSize | Mapping[str, torch.Tensor],
    generator: torch.Generator | None = None,
    *,
    noise: Mapping[str, torch.Tensor] | None = None,
) -> TensorDict:
    r"""Partial momentum refreshment (Horowitz 1991; Neal 2011, section 5.3).

    .. math::

        p' = a\, p + \sqrt{1 - a^2}\; s\, \xi, \qquad \xi \sim \mathcal N(0, I),

    with persistence :math:`a \in [0, 1]` (``0`` draws a fresh momentum, ``1`` keeps it) and
    :math:`s` the standard deviation of the momentum's stationary law :math:`\mathcal N(0, s^2 I)`,
    which the map leaves invariant exactly (a float, a tensor, or one tensor per site). In
    SGHMC's velocity units :math:`s^2 = \eta T P`.
    """
    check_rule_arguments(persistence=persistence)
    xi = resolve_noise(momentum, generator, noise)
    fresh = (1.0 - persistence**2) ** 0.5
    return {
        name: persistence * p + fresh * entry(scale, name) * xi[name]
        for name, p in momentum.items()
    }
