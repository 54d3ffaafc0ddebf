r"""Divergences of SG-MCMC chains: detection, per-chain bookkeeping and the give-up rule.

A step *diverges* for a chain when its new potential, gradient or position is not finite, or
when the potential blows up: it jumps far above its running level (the analogue of NUTS's
energy error), see :class:`BlowUpDetector`. The engine then puts the chain back to its last good
state; :class:`DivergenceMonitor` counts what happened so that the statistics mark it, and
raises :class:`~pyro_sgmcmc.SamplerDivergedError` when a chain diverges
``max_consecutive`` times in a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..errors import SamplerDivergedError
from .layout import FlatLayout

__all__ = ["BlowUpDetector", "DivergenceMonitor"]


class BlowUpDetector:
    r"""Flags a potential that jumps far above where the chain just was.

    Per chain it keeps the last accepted potential :math:`U_{t}` and an exponential moving
    average :math:`s_t` of the step-to-step changes :math:`|U_{t} - U_{t-1}|` (memory
    ``1/(1 - decay)`` steps). A new value :math:`U` is a blow-up when

    .. math::

        U - U_t > \max(k\, s_t,\; \Delta_{\min}),

    a rise by ``k`` typical changes and by at least ``minimum_jump`` nats in one step (NUTS
    declares a divergence at an energy error of 1000). Minibatch potentials on different
    minibatches differ by :math:`O(N/\sqrt{B})`, which :math:`s_t` measures, so ordinary
    minibatch noise is not flagged; a gradual rise (a chain leaving a mode for the typical set)
    is made of small changes and is not flagged either. The first ``burn_in`` steps only set the
    scale.
    """

    def __init__(
        self,
        num_chains: int,
        *,
        factor: float = 20.0,
        minimum_jump: float = 1000.0,
        decay: float = 0.98,
        burn_in: int = 10,
    ) -> None:
        self.factor, self.minimum_jump = factor, minimum_jump
        self.decay, self.burn_in = decay, burn_in
        self.previous = torch.zeros(num_chains, dtype=torch.float64)
        self.spread = torch.zeros(num_chains, dtype=torch.float64)
        self.count = 0

    def blown_up(self, value: torch.Tensor) -> torch.Tensor:
        """``(C,)`` mask of chains whose new potential ``value`` is a blow-up."""
        if self.count < self.burn_in:
            return torch.zeros_like(self.previous, dtype=torch.bool)
        jump = (self.factor * self.spread).clamp_min(self.minimum_jump)
        return value.detach().double().cpu() - self.previous > jump

    def accept(self, value: torch.Tensor, chains: torch.Tensor | None = None) -> None:
        """Record the accepted ``value`` (of the chains in the mask, if given)."""
        value = value.detach().double().cpu()
        if self.count == 0:
            change = torch.zeros_like(value)
        else:
            change = (value - self.previous).abs()
        weight = 1.0 / (self.count + 1) if self.count < self.burn_in else 1.0 - self.decay
        spread = self.spread + weight * (change - self.spread)
        if chains is None:
            self.previous, self.spread = value, spread
        else:
            keep = chains.cpu()
            self.previous = torch.where(keep, value, self.previous)
            self.spread = torch.where(keep, spread, self.spread)
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"previous": self.previous, "spread": self.spread, "count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.previous, self.spread, self.count = state["previous"], state["spread"], state["count"]


class DivergenceMonitor:
    """Per-chain divergence bookkeeping.

    Parameters
    ----------
    num_chains:
        :math:`C`.
    max_consecutive:
        A chain that diverges this many steps in a row makes :meth:`raise_if_stuck` raise.
    algorithm:
        Name of the update rule, for messages.
    blow_up:
        The blow-up detector, or ``None`` to flag only non-finite values.
    chain_ids:
        The run's index of each chain, for messages (default ``0, ..., C - 1``).
    """

    def __init__(
        self,
        num_chains: int,
        max_consecutive: int,
        algorithm: str,
        blow_up: BlowUpDetector | None = None,
        chain_ids: list[int] | None = None,
    ) -> None:
        self.chain_ids = list(range(num_chains)) if chain_ids is None else list(chain_ids)
        self.max_consecutive = max_consecutive
        self.algorithm = algorithm
        self.blow_up = blow_up
        self.consecutive = torch.zeros(num_chains, dtype=torch.long)
        self.steps: list[list[int]] = [[] for _ in range(num_chains)]
        self.warmup_steps: list[int] = [0] * num_chains
        self.draw_diverged = torch.zeros(num_chains, dtype=torch.bool)
        self.last_bad_sites: list[str] = []
        self.last_step = 0
        self.last_reason = ""

    @staticmethod
    def non_finite(value: torch.Tensor, grad: torch.Tensor, position: torch.Tensor):
        """``(C,)`` mask of chains with a non-finite potential, gradient or position (one
        reduction: a sum is finite only if every term is)."""
        total = value + grad.sum(1) + position.sum(1)
        return ~torch.isfinite(total).cpu()

    def start_draw(self) -> None:
        self.draw_diverged.zero_()

    def check(
        self,
        value: torch.Tensor,
        grad: torch.Tensor,
        position: torch.Tensor,
        step: int,
        warmup: bool,
    ) -> torch.Tensor | None:
        """The ``(C,)`` mask of chains that diverged at ``step``, or ``None`` if none did."""
        bad = self.non_finite(value, grad, position)
        reason = "non-finite values"
        if self.blow_up is not None:
            blown = self.blow_up.blown_up(value)
            if bool((blown & ~bad).any()):
                reason = "a blow-up of the potential" if not bool(bad.any()) else reason
            bad = bad | blown
        if not bool(bad.any()):
            self.consecutive.zero_()
            if self.blow_up is not None:
                self.blow_up.accept(value)
            return None
        self._record(bad, value, grad, position, step, warmup, reason)
        return bad

    def _record(self, bad, value, grad, position, step, warmup, reason) -> None:
        good = ~bad
        self.consecutive = torch.where(
            bad, self.consecutive + 1, torch.zeros_like(self.consecutive)
        )
        self.draw_diverged |= bad
        for c in bad.nonzero().flatten().tolist():
            self.steps[c].append(step)
            if warmup:
                self.warmup_steps[c] += 1
        if self.blow_up is not None and bool(good.any()):
            self.blow_up.accept(value, good)
        self.last_step, self.last_reason = step, reason
        self._bad_values = (grad[bad], position[bad])

    def raise_if_stuck(self, layout: FlatLayout) -> None:
        """Raise :class:`~pyro_sgmcmc.SamplerDivergedError` when a chain has diverged
        ``max_consecutive`` steps in a row (the drivers attach the draws collected so far)."""
        stuck = self.consecutive >= self.max_consecutive
        if not bool(stuck.any()):
            return
        grad, position = self._bad_values
        sites = layout.sites_where(~torch.isfinite(grad)) or layout.sites_where(
            ~torch.isfinite(position)
        )
        chains = [self.chain_ids[c] for c in stuck.nonzero().flatten().tolist()]
        raise SamplerDivergedError(
            f"{self.algorithm} diverged: chain(s) {chains} had {self.max_consecutive} divergent "
            f"steps in a row up to step {self.last_step} (last: {self.last_reason}"
            + (f" at sites {sites}" if sites else "")
            + "). Give a smaller step_size or learning_rate, or leave both unset for the adaptive "
            "warm-up, or check the model.",
            iteration=self.last_step,
            sites=sites or ["<potential energy>"],
            draws={},
            constrained_draws={},
            chains=chains,
        )

    @property
    def total(self) -> int:
        """Divergent steps of all chains so far."""
        return sum(len(steps) for steps in self.steps)

    def state_dict(self) -> dict[str, Any]:
        return {
            "consecutive": self.consecutive.clone(),
            "steps": [list(s) for s in self.steps],
            "warmup_steps": list(self.warmup_steps),
            "draw_diverged": self.draw_diverged.clone(),
            "blow_up": None if self.blow_up is None else self.blow_up.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.consecutive = state["consecutive"].clone()
        self.steps = [list(s) for s in state["steps"]]
        self.warmup_steps = list(state["warmup_steps"])
        self.draw_diverged = state["draw_diverged"].clone()
        if self.blow_up is not None and state["blow_up"] is not None:
            self.blow_up.load_state_dict(state["blow_up"])
