r"""Divergences of SG-MCMC chains: detection, per-chain bookkeeping and the give-up rule.

A step *diverges* for a chain when its new potential, gradient or position is not finite, when
a coordinate runs away (moves many standard deviations of the step's injected noise: an unstable
step), or when the potential blows up: it jumps far above where the chain just was (the analogue
of NUTS's energy error), see :class:`BlowUpDetector`. The engine then puts the chain back to
its last good state; :class:`DivergenceMonitor` counts what happened so that the statistics
mark it, and raises :class:`~pyro_sgmcmc.SamplerDivergedError` when a chain diverges
``max_consecutive`` times in a row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import SamplerDivergedError
from .layout import FlatLayout

__all__ = ["RUNAWAY", "RUNAWAY_GROWTH", "BlowUpDetector", "DivergenceMonitor"]

#: A move larger than ``sqrt(RUNAWAY)`` standard deviations of a step's injected noise (in one
#: coordinate), and ``RUNAWAY_GROWTH`` times the chain's running level, is a runaway (see
#: :meth:`DivergenceMonitor.check`).
RUNAWAY, RUNAWAY_GROWTH = 200.0, 25.0
#: ... while the potential rose by more than this many typical deviations above its level.
RUNAWAY_RISE = 2.0
#: Before the blow-up detector has a scale, a rise of the potential by more than this multiple
#: of its level is a blow-up.
BURN_IN_GROWTH = 100.0
#: ... and, above the lowest potential seen, by more than this many nats per coordinate.
TYPICAL_SET_MARGIN = 50.0


class BlowUpDetector:
    r"""Flags a potential that jumps far above its running level.

    Per chain it keeps exponential moving averages (memory ``1/(1 - decay)`` steps) of the
    accepted potential, :math:`m_t`, and of its absolute deviation from that level,
    :math:`s_t`. A new value :math:`U` is a blow-up when

    .. math::

        U - m_t > \max(k\, s_t,\; \Delta_{\min}),

    a rise by ``k`` typical deviations and by at least ``minimum_jump`` nats (NUTS declares a
    divergence at an energy error of 1000). Minibatch potentials on different minibatches differ
    by :math:`O(N/\sqrt{B})`, which :math:`s_t` measures, so ordinary minibatch noise is not
    flagged; a gradual rise (a chain leaving a mode for the typical set) moves the level with it.
    Comparing with the level rather than with the last value means that one lucky minibatch
    cannot make every later one look like a jump. Over the first ``burn_in`` steps, which set
    the scale, only a rise by more than ``BURN_IN_GROWTH`` times :math:`|m_t|` (and at least
    ``minimum_jump``) is a blow-up: a first step far too large for the model. At every step, a
    rise above the lowest accepted potential :math:`U_{\min}` by more than
    ``BURN_IN_GROWTH`` :math:`|U_{\min}|` and ``TYPICAL_SET_MARGIN`` nats per coordinate is
    one too: an oscillation that grows slowly enough for the running level to follow it.
    """

    def __init__(
        self,
        num_chains: int,
        *,
        factor: float = 20.0,
        minimum_jump: float = 1000.0,
        decay: float = 0.95,
        burn_in: int = 10,
        dimension: int = 1,
    ) -> None:
        self.factor, self.minimum_jump = factor, minimum_jump
        self.decay, self.burn_in = decay, burn_in
        self.dimension = dimension
        self.level = torch.zeros(num_chains, dtype=torch.float64)
        self.spread = torch.zeros(num_chains, dtype=torch.float64)
        self.lowest = torch.full((num_chains,), math.inf, dtype=torch.float64)
        self.count = 0
        self.pending_rebase = False

    def blown_up(self, value: torch.Tensor) -> torch.Tensor:
        """``(C,)`` mask of chains whose new potential ``value`` is a blow-up."""
        value = value.detach().double().cpu()
        if self.count == 0:
            return torch.zeros_like(self.level, dtype=torch.bool)
        growth = self._grown(value, self.lowest)
        if self.count < self.burn_in:
            # no scale yet: only a rise by orders of magnitude (a far too large first step)
            return growth | self._grown(value, self.level)
        return growth | self.exceeds(value - self.level)

    def _grown(self, value: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        r"""A rise above ``base`` by more than ``BURN_IN_GROWTH`` times its size and
        ``TYPICAL_SET_MARGIN`` nats per coordinate (far beyond the typical set's
        :math:`D/2 \pm \sqrt{D/2}` above a mode): a slow, growing oscillation that the running
        level would follow."""
        floor = max(self.minimum_jump, TYPICAL_SET_MARGIN * self.dimension)
        jump = (BURN_IN_GROWTH * base.abs()).clamp_min(floor)
        return torch.isfinite(base) & (value - base > jump)

    def exceeds(self, rise: torch.Tensor) -> torch.Tensor:
        """``(C,)`` mask of rises of the potential beyond the blow-up threshold."""
        jump = (self.factor * self.spread).clamp_min(self.minimum_jump)
        return rise.detach().double().cpu() > jump

    def rebase(self) -> None:
        """Restart the level at the next accepted value (the spread is kept)."""
        self.pending_rebase = True

    def accept(self, value: torch.Tensor, chains: torch.Tensor | None = None) -> None:
        """Record the accepted ``value`` (of the chains in the mask, if given)."""
        value = value.detach().double().cpu()
        if self.pending_rebase:
            keep = torch.ones_like(self.level, dtype=torch.bool) if chains is None else chains
            self.level = torch.where(keep.cpu(), value, self.level)
            self.lowest = torch.where(keep.cpu(), value, self.lowest)
            self.pending_rebase = False
            return
        if self.count == 0:
            self.level = value.clone()
        self.lowest = torch.minimum(self.lowest, value if chains is None else
                                    torch.where(chains.cpu(), value, self.lowest))  # fmt: skip
        weight = 1.0 / (self.count + 1) if self.count < self.burn_in else 1.0 - self.decay
        spread = self.spread + weight * ((value - self.level).abs() - self.spread)
        level = self.level + weight * (value - self.level)
        if chains is None:
            self.level, self.spread = level, spread
        else:
            keep = chains.cpu()
            self.level = torch.where(keep, level, self.level)
            self.spread = torch.where(keep, spread, self.spread)
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "spread": self.spread,
            "lowest": self.lowest,
            "count": self.count,
            "pending_rebase": self.pending_rebase,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.level, self.spread, self.count = state["level"], state["spread"], state["count"]
        self.lowest = state.get("lowest", torch.full_like(self.level, math.inf))
        self.pending_rebase = state["pending_rebase"]


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
        self.move_level = torch.ones(num_chains, dtype=torch.float64)
        self.move_count = torch.zeros(num_chains, dtype=torch.long)
        self.last_bad_sites: list[str] = []
        self.last_step = 0
        self.last_reason = ""

    @staticmethod
    def non_finite(value: torch.Tensor, grad: torch.Tensor, position: torch.Tensor):
        """``(C,)`` mask of chains with a non-finite potential, gradient or position (one
        reduction: a sum is finite only if every term is)."""
        total = value + grad.sum(1) + position.sum(1)
        return ~torch.isfinite(total).cpu()

    def _rising(self, value: torch.Tensor) -> torch.Tensor:
        """``(C,)`` mask of chains whose potential is more than :data:`RUNAWAY_RISE` typical
        deviations above its running level (all chains before the blow-up detector has a
        scale): a large move that leaves the potential where it was is the tail of the
        momentum's distribution, not an unstable step."""
        detector = self.blow_up
        if detector is None or detector.count < detector.burn_in:
            return torch.ones(value.shape[0], dtype=torch.bool)
        rise = value.detach().double().cpu() - detector.level
        return rise > RUNAWAY_RISE * detector.spread

    def _update_move_level(self, largest: torch.Tensor, accepted: torch.Tensor) -> None:
        """Running level (geometric mean over about ten steps) of the largest move ratio."""
        log = largest.clamp_min(1e-30).log()
        first = self.move_count == 0
        level = torch.where(first, log, 0.9 * self.move_level.log() + 0.1 * log).exp()
        self.move_level = torch.where(accepted, level, self.move_level)
        self.move_count = self.move_count + accepted.long()

    def start_draw(self) -> None:
        self.draw_diverged.zero_()

    def check(
        self,
        value: torch.Tensor,
        grad: torch.Tensor,
        position: torch.Tensor,
        step: int,
        warmup: bool,
        move: torch.Tensor | None = None,
        move_variance: Any = None,
        rebase: bool = False,
        confirm: Any = None,
    ) -> torch.Tensor | None:
        r"""The ``(C,)`` mask of chains that diverged at ``step``, or ``None`` if none did.

        ``move`` (the ``(C, D)`` change of position) and ``move_variance`` (the variance of the
        noise the step injected, per coordinate) flag a *runaway*, the first sign of an unstable
        step (an oscillation that grows), seen before the potential explodes: a coordinate whose
        squared move, in units of the injected variance, exceeds both :data:`RUNAWAY` and
        :data:`RUNAWAY_GROWTH` times the chain's running level of that largest ratio. At
        equilibrium the largest of ``D`` such ratios is about :math:`2 \log D`, far below 200;
        far from equilibrium the drift dominates and the ratio is large but steady, which the
        running level absorbs; a growing oscillation multiplies it within a few steps. Once the
        blow-up detector has a scale, the potential must also have risen
        (:data:`RUNAWAY_RISE` typical deviations above its level).

        ``rebase`` (the step also redrew the Gibbs-updated sites, which shifts the potential by
        an exact conditional draw) skips the blow-up test for this step and restarts the
        potential's running level there. ``confirm()``, when given, returns the ``(C,)`` rise of
        the potential from the old to the new position *on the same minibatch*: a jump is a
        blow-up only if that rise is one too, so that a minibatch holding rows the chain fits
        badly (heavy-tailed data) is not mistaken for an unstable step.
        """
        bad = self.non_finite(value, grad, position)
        reason = "non-finite values"
        self.runaway: torch.Tensor | None = None
        if move is not None and move_variance is not None:
            ratio = move.square() / move_variance
            largest = ratio.amax(1).detach().double().cpu()
            limit = (RUNAWAY_GROWTH * self.move_level).clamp_min(RUNAWAY)
            runaway = (largest > limit) & ~bad & (self.move_count > 0) & self._rising(value)
            self._update_move_level(largest, ~(bad | runaway))
            if bool(runaway.any()):
                self.runaway = ratio > limit.to(ratio.device, ratio.dtype).reshape(-1, 1)
                reason = "a runaway move" if not bool(bad.any()) else reason
                bad = bad | runaway
        if self.blow_up is not None and rebase:
            self.blow_up.rebase()
        elif self.blow_up is not None:
            blown = self.blow_up.blown_up(value) & ~bad
            if bool(blown.any()) and confirm is not None:
                blown = blown & self.blow_up.exceeds(confirm())
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
            "move_level": self.move_level.clone(),
            "move_count": self.move_count.clone(),
            "blow_up": None if self.blow_up is None else self.blow_up.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.consecutive = state["consecutive"].clone()
        self.steps = [list(s) for s in state["steps"]]
        self.warmup_steps = list(state["warmup_steps"])
        self.draw_diverged = state["draw_diverged"].clone()
        self.move_level = state["move_level"].clone()
        self.move_count = state["move_count"].clone()
        if self.blow_up is not None and state["blow_up"] is not None:
            self.blow_up.load_state_dict(state["blow_up"])
