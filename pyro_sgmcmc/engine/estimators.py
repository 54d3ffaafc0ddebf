r"""Gradient estimators: what a sampler uses as :math:`\nabla U` at each step.

:class:`MinibatchGradient` is the plain minibatch estimate :math:`\nabla\tilde U_S(z)`;
:class:`ControlVariateGradient` is the control-variate estimator of SGLD-CV / SGHMC-CV (Baker et
al. 2019), for tall data. Both evaluate ``C`` chains at once through a
:class:`~pyro_sgmcmc.models.potentials.Potential` and carry no randomness of their own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import SamplerDivergedError
from ..models.potentials import Potential

__all__ = ["AutoControlVariate", "ControlVariateGradient", "MinibatchGradient", "find_centre"]


class MinibatchGradient:
    r""":math:`\tilde U_S(z)` and :math:`\nabla \tilde U_S(z)` of each chain on its own rows."""

    def __init__(self, potential: Potential) -> None:
        self.potential = potential

    def __call__(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.potential.value_and_grad(flat, fixed, rows)

    def refresh(self, fixed: Mapping[str, torch.Tensor]) -> None:
        """Called after the fixed (Gibbs-updated) sites change; nothing to do."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore."""


class ControlVariateGradient(MinibatchGradient):
    r"""The control-variate gradient estimator of SGLD-CV / SGHMC-CV (Baker et al. 2019).

    .. math::

        \hat\nabla U(z) = \nabla U(\hat z) + \nabla \tilde U_S(z) - \nabla \tilde U_S(\hat z)
        = \nabla U(\hat z) - \nabla \log p(z) + \nabla \log p(\hat z)
        + \frac{N}{B}\sum_{i \in S}\bigl[\nabla u_i(z) - \nabla u_i(\hat z)\bigr]

    (:math:`u_i = -\log p(y_i \mid z)`; the Jacobian term is treated like the prior). It is
    unbiased for any centre :math:`\hat z`; its variance is :math:`O(\lVert z - \hat z\rVert^2)`
    instead of :math:`O(1)`, so near a mode it stays small however large :math:`N/B` is. Each
    step evaluates the minibatch at :math:`z` and at :math:`\hat z`, stacked as :math:`2C` chains
    in one call (about twice the cost of a plain step); :math:`\nabla U(\hat z)` costs one pass
    over the data at set-up and one more after each Gibbs step (the Gibbs sites enter it).

    Parameters
    ----------
    potential:
        The minibatch potential.
    centre:
        :math:`\hat z`, a flat ``(D,)`` unconstrained vector shared by the chains.
    num_chains:
        :math:`C`.
    chunk_size:
        Rows per call in the full-data passes.
    """

    def __init__(
        self, potential: Potential, centre: torch.Tensor, num_chains: int, chunk_size: int
    ) -> None:
        super().__init__(potential)
        self.chunk_size = chunk_size
        self.centre = centre.detach()
        self.num_chains = num_chains
        self.centre_gradient: torch.Tensor | None = None
        self.full_data_passes = 0

    def refresh(self, fixed: Mapping[str, torch.Tensor]) -> None:
        r"""(Re)compute :math:`\nabla U(\hat z)` for every chain (its own fixed sites)."""
        # without fixed (Gibbs) sites every chain shares the centre's gradient: one pass
        count = self.num_chains if fixed else 1
        centre = self.centre.expand(count, -1)
        _, grad = self.potential.full_data_value_and_grad(centre, fixed, self.chunk_size)
        self.centre_gradient = grad.expand(self.num_chains, -1)
        self.full_data_passes += 1

    def __call__(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if rows is None:  # full batch: the exact gradient, nothing to reduce
            return self.potential.value_and_grad(flat, fixed, None)
        if self.centre_gradient is None:
            self.refresh(fixed)
        num_chains = flat.shape[0]
        both = torch.cat([flat, self.centre.expand(num_chains, -1)])
        doubled = {name: torch.cat([value, value]) for name, value in fixed.items()}
        value, grad = self.potential.value_and_grad(both, doubled, torch.cat([rows, rows]))
        estimate = grad[:num_chains] - grad[num_chains:] + self.centre_gradient
        return value[:num_chains], estimate

    def state_dict(self) -> dict[str, Any]:
        return {"centre": self.centre, "full_data_passes": self.full_data_passes}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take the saved centre; its full-data gradient is recomputed on first use."""
        self.centre = state["centre"]
        self.full_data_passes = state["full_data_passes"]
        self.centre_gradient = None


class AutoControlVariate(MinibatchGradient):
    r"""The plain minibatch gradient, or the control-variate estimator of
    :class:`ControlVariateGradient` for the chains whose gradient noise it reduces -- chosen by
    the adaptive warm-up (``control_variate="auto"``, the default).

    The warm-up gives each chain its own centre :math:`\hat z_c` (the mean of the chain's
    positions over an adaptation window, near the posterior mean: the control variate's
    variance grows with the squared distance from it), measures both estimators' noise at the
    same positions and minibatches (:meth:`noise_pair`), and :meth:`activate`\ s the control
    variate for the chains where it allows steps :data:`~pyro_sgmcmc.engine.adaptation.CV_GAIN`
    times larger (a control-variate step evaluates the minibatch twice). It is unbiased for any
    centre, so the choice changes the speed of mixing, not the target.

    Parameters
    ----------
    potential:
        The minibatch potential.
    chunk_size:
        Rows per call in the full-data passes (one per chain, at the centre).
    """

    def __init__(self, potential: Potential, chunk_size: int) -> None:
        super().__init__(potential)
        self.chunk_size = chunk_size
        self.centre: torch.Tensor | None = None
        self.centre_gradient: torch.Tensor | None = None
        self.active = None
        self.fixed: Mapping[str, torch.Tensor] = {}
        self.full_data_passes = 0

    @property
    def active(self) -> torch.Tensor | None:
        """The ``(C,)`` mask of the chains that use the control variate (``None``: none, the
        choice not made yet)."""
        return self._active

    @active.setter
    def active(self, chains: torch.Tensor | None) -> None:
        # what every step reads of the mask, kept with it: whether any, or every, chain uses
        # the control variate, and the mask as a column on the device of the last step
        self._active = chains
        self._used = chains is not None and bool(chains.any())
        self._everywhere = chains is not None and bool(chains.all())
        self._column: torch.Tensor | None = None

    def set_centre(self, centre: torch.Tensor, fixed: Mapping[str, torch.Tensor]) -> None:
        """Use the ``(C, D)`` centres (one full-data pass per chain)."""
        self.centre = centre.detach()
        self.refresh(fixed)

    def refresh(self, fixed: Mapping[str, torch.Tensor]) -> None:
        self.fixed = fixed
        if self.centre is None:
            return
        _, grad = self.potential.full_data_value_and_grad(self.centre, fixed, self.chunk_size)
        self.centre_gradient = grad
        self.full_data_passes += 1

    def activate(self, chains: torch.Tensor) -> None:
        """Use the control variate for the chains of the ``(C,)`` mask from now on."""
        self.active = chains.to(torch.bool, copy=True)  # what it derives from the mask holds

    @property
    def used(self) -> bool:
        """Whether some chain uses the control variate."""
        return self._used

    def noise_pair(
        self,
        flat: torch.Tensor,
        fixed: Mapping[str, torch.Tensor],
        rows: torch.Tensor,
        other: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""``(C, D)`` each: the difference :math:`g_S - g_{S'}` of the plain and of the
        control-variate gradient at ``flat`` between the minibatches ``rows`` and ``other``
        (half its square estimates the gradient noise)."""
        count = flat.shape[0]
        both = torch.cat([flat, self.centre.expand(count, -1)])
        doubled = {name: torch.cat([value, value]) for name, value in fixed.items()}
        # two evaluations of the shape every control-variate step evaluates (one recorded
        # graph, :mod:`~pyro_sgmcmc.models.graph_capture`), rather than one of twice its size
        _, grad = self.potential.value_and_grad(both, doubled, torch.cat([rows, rows]))
        _, grad_other = self.potential.value_and_grad(both, doubled, torch.cat([other, other]))
        at, centred = grad.split(count)
        at_other, centred_other = grad_other.split(count)
        return at - at_other, (at - centred) - (at_other - centred_other)

    def __call__(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if rows is None or not self.used:
            return self.potential.value_and_grad(flat, fixed, rows)
        if self.centre_gradient is None:
            self.refresh(fixed)
        count = flat.shape[0]
        both = torch.cat([flat, self.centre.expand(count, -1)])
        doubled = {name: torch.cat([value, value]) for name, value in fixed.items()}
        value, grad = self.potential.value_and_grad(both, doubled, torch.cat([rows, rows]))
        plain = grad[:count]
        estimate = plain - grad[count:] + self.centre_gradient
        if self._everywhere:
            return value[:count], estimate
        if self._column is None or self._column.device != flat.device:
            self._column = self._active.to(flat.device).reshape(-1, 1)
        return value[:count], torch.where(self._column, estimate, plain)

    def state_dict(self) -> dict[str, Any]:
        return {
            "centre": self.centre,
            "active": self.active,
            "full_data_passes": self.full_data_passes,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take the saved centres and choice; their full-data gradients are recomputed on first
        use."""
        self.centre, self.active = state["centre"], state["active"]
        self.full_data_passes = state["full_data_passes"]
        self.centre_gradient = None


def find_centre(
    potential: Potential,
    start: torch.Tensor,
    fixed: Mapping[str, torch.Tensor],
    chunk_size: int,
    max_iterations: int,
    history: int = 10,
    tolerance: float = 1e-4,
) -> torch.Tensor:
    r"""A mode of the full-data potential, by L-BFGS with a backtracking line search.

    The search direction is :math:`d = -H g` with :math:`H` the L-BFGS inverse-Hessian estimate
    (two-loop recursion over the last ``history`` pairs; Nocedal and Wright 2006, Alg. 7.4) and
    the step the largest of :math:`1, 1/2, \dots` that satisfies Armijo's condition (where
    the change of the potential is below its rounding error: that reduces the directional
    derivative by 10%). It stops when the quasi-Newton decrement :math:`g^\top H g` falls below
    ``tolerance``: near a mode it is the squared distance to the mode in units of the
    posterior's standard deviations (:math:`H \approx \nabla^2 U^{-1} \approx` posterior
    covariance), which is what sets the variance of the control-variate gradient; it is
    scale-free, so it needs no tuning with :math:`N`. Written out rather than taken from
    ``torch.optim.LBFGS``, whose first use imports ``torch._dynamo`` (seconds of set-up).

    ``start`` is a flat ``(D,)`` vector and ``fixed`` the ``(1, ...)`` fixed sites of one chain.
    """

    def evaluate(position: torch.Tensor) -> tuple[float, torch.Tensor]:
        value, grad = potential.full_data_value_and_grad(position.unsqueeze(0), fixed, chunk_size)
        return float(value[0]), grad[0].double()

    z = start.detach().double()
    value, grad = evaluate(z.to(start.dtype))
    pairs: list[tuple[torch.Tensor, torch.Tensor, float]] = []
    for _ in range(max_iterations):
        if not (math.isfinite(value) and bool(torch.isfinite(grad).all())):
            break
        q, decrement = _lbfgs_direction(grad, pairs)
        if pairs and decrement < tolerance:
            break
        found = _line_search(evaluate, z, q, value, decrement, start.dtype)
        if found is None:
            break  # no decrease at floating-point resolution: as close as it gets
        candidate, new_value, new_grad = found
        s, y = candidate - z, new_grad - grad
        curvature = float(s @ y)
        if curvature > 1e-12 * float(y @ y):
            pairs = [*pairs[-(history - 1) :], (s, y, 1.0 / curvature)]
        z, value, grad = candidate, new_value, new_grad
    centre = z.to(start.dtype)
    if not torch.isfinite(centre).all():
        raise SamplerDivergedError(
            "the search for the control-variate centre diverged; pass the centre yourself "
            "(control_variate={site: value})",
            iteration=0,
            sites=list(potential.layout.names),
            draws={},
            constrained_draws={},
        )
    return centre


def _lbfgs_direction(
    grad: torch.Tensor, pairs: list[tuple[torch.Tensor, torch.Tensor, float]]
) -> tuple[torch.Tensor, float]:
    """The L-BFGS direction :math:`Hg` (two-loop recursion) and the decrement :math:`g^T H g`;
    steepest descent (at most a unit move) without history or when not a descent direction."""
    q = grad.clone()
    alphas = []
    for s, y, rho in reversed(pairs):
        alpha = rho * float(s @ q)
        q -= alpha * y
        alphas.append(alpha)
    if pairs:
        s, y, _ = pairs[-1]
        q *= float(s @ y) / float(y @ y)
    else:
        q /= max(1.0, float(grad.abs().max()))
    for (s, y, rho), alpha in zip(pairs, reversed(alphas), strict=True):
        q += (alpha - rho * float(y @ q)) * s
    decrement = float(grad @ q)
    if decrement <= 0:
        pairs.clear()
        q = grad / max(1.0, float(grad.abs().max()))
        decrement = float(grad @ q)
    return q, decrement


def _line_search(evaluate, z, q, value, decrement, dtype):
    """Backtracking from a unit step: Armijo's condition, or (within rounding of the potential,
    a sum of N terms) a 10% reduction of the directional derivative."""
    resolution = 64 * torch.finfo(dtype).eps * max(abs(value), 1.0)
    step = 1.0
    while step > 1e-8:
        candidate = z - step * q
        new_value, new_grad = evaluate(candidate.to(dtype))
        if math.isfinite(new_value) and (
            new_value <= value - 1e-4 * step * decrement
            or (new_value <= value + resolution and abs(float(new_grad @ q)) <= 0.9 * decrement)
        ):
            return candidate, new_value, new_grad
        step *= 0.5
    return None
