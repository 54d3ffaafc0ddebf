r"""What the step controls, the warm-up and the meters may read and call of the chain engine.

:class:`~pyro_sgmcmc.engine.engine.ChainEngine` calls its step control
(:mod:`~pyro_sgmcmc.engine.controls`, :mod:`~pyro_sgmcmc.engine.adaptation`) and its thinning
meter (:mod:`~pyro_sgmcmc.engine.thinning`) after every warm-up step, and they look back at the
engine: its position, gradient, minibatch stream, divergence monitor. :class:`EngineView` is that
look, written down as a protocol: the controls and meters depend on it, not on the engine's
module, so the engine's imports go one way (engine -> controls, thinning -> view) and the
contract between them is on one page. ``ChainEngine`` satisfies it structurally.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from ..dynamics.registry import Algorithm
from .divergence import DivergenceMonitor
from .estimators import MinibatchGradient
from .layout import FlatLayout
from .minibatch import Minibatcher
from .virial import VirialMeter


class ControlView(Protocol):
    """The step control as the engine's readers see it (every control has these)."""

    def step_size(self, t: int) -> float | torch.Tensor:
        """Step size of gradient step ``t`` (a float, or one per chain)."""

    def unit_step(self, engine: EngineView) -> torch.Tensor | None:
        """Per-coordinate step of a unit step size (the preconditioner), or ``None``."""

    def posterior_scale(self) -> torch.Tensor | None:
        """Per-coordinate posterior scale measured in warm-up, or ``None``."""


class EngineView(Protocol):
    r"""The chain engine's state and services, for its controls and meters.

    Attributes
    ----------
    t, draws_done:
        Gradient steps and draws done so far (warm-up included).
    num_chains, num_data:
        :math:`C` and the number of data rows :math:`N`.
    position, value, grad:
        ``(C, D)`` position, ``(C,)`` minibatch potential and ``(C, D)`` gradient at it.
    fixed, rows, state, anchor:
        Values of the Gibbs-updated sites, the current minibatch's rows, the update rule's
        state, and the state kept by :meth:`keep_anchor`.
    options, layout, estimator, batches, monitor, virial, control:
        The update rule's options, the flat layout of the moving sites, the gradient
        estimator, the minibatch stream, the divergence monitor, the virial meter and the
        step control.
    algorithm, temperature:
        The update rule and the temperature :math:`T` of the target it samples.
    """

    t: int
    draws_done: int
    num_data: int
    position: torch.Tensor
    value: torch.Tensor | None
    grad: torch.Tensor | None
    fixed: dict[str, torch.Tensor]
    rows: torch.Tensor | None
    state: Any
    anchor: dict[str, Any] | None
    options: Any
    layout: FlatLayout
    estimator: MinibatchGradient
    batches: Minibatcher
    monitor: DivergenceMonitor
    virial: VirialMeter
    control: ControlView
    algorithm: Algorithm
    temperature: float

    @property
    def num_chains(self) -> int:
        """:math:`C`."""

    @property
    def thinning(self) -> list[int] | None:
        """Gradient steps per kept draw of each chain (``None`` until the warm-up chose them)."""

    @property
    def thinning_meter(self) -> Any:
        """The meter that chooses the thinning, or ``None``."""

    @property
    def restarted_units(self) -> list[int]:
        """Per chain, the units started afresh at the planned end of warm-up."""

    def probe_gradient(self) -> torch.Tensor:
        """The gradient at the position on a fresh, independent minibatch per chain."""

    def gradient_on_last_rows(self, flat: torch.Tensor) -> torch.Tensor:
        """The gradient at ``flat`` on the current minibatch's rows."""

    def gradients_around_position(self, shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradients at the position and at ``position + shift`` on one fresh minibatch."""

    def rademacher(self) -> torch.Tensor:
        """Random signs shaped like the position, each chain from its own generator."""

    def refresh_gradient(self) -> None:
        """Evaluate the potential and gradient at the position on the current rows again."""

    def rest_auxiliary(self, where: torch.Tensor | None = None) -> None:
        """Put the momenta at rest: every chain's, or those of the ``(C, D)`` mask ``where``."""

    def keep_anchor(self) -> None:
        """Remember every chain's current state, to go back to with :meth:`restore_anchor`."""

    def return_to(
        self, chains: torch.Tensor, flat: torch.Tensor, fixed: dict[str, torch.Tensor]
    ) -> None:
        """Put the chains of the ``(C,)`` mask at their rows of ``flat`` and ``fixed``, momenta
        at rest, with the potential and gradient evaluated there."""

    def restore_anchor(self, chains: torch.Tensor) -> None:
        """Put the chains of the ``(C,)`` mask back at the remembered state, momenta at rest."""


__all__ = ["ControlView", "EngineView"]
