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

import numpy as np
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
        # (C,) float64 NumPy arrays: the bookkeeping runs on the host at every step, where a
        # NumPy operation on a few numbers costs a fraction of a torch one
        self.level = np.zeros(num_chains)
        self.spread = np.zeros(num_chains)
        self.lowest = np.full(num_chains, math.inf)
        self.count = 0
        self.pending_rebase = False
        self._update_ceiling()

    def blown_up(self, value: Any) -> np.ndarray:
        """``(C,)`` mask of chains whose new potential ``value`` is a blow-up."""
        return _host(value) > self.ceiling

    def _update_ceiling(self) -> None:
        """The ``(C,)`` potential above which a new value is a blow-up (kept up to date by
        :meth:`accept`, so that the per-step test is one comparison)."""
        if self.count == 0:
            self.ceiling = np.full(self.level.shape, math.inf)
            return
        ceiling = self._grown_above(self.lowest)
        if self.count < self.burn_in:
            # no scale yet: only a rise by orders of magnitude (a far too large first step)
            self.ceiling = np.minimum(ceiling, self._grown_above(self.level))
        else:
            self.ceiling = np.minimum(ceiling, self.level + self._jump())

    def _grown_above(self, base: np.ndarray) -> np.ndarray:
        r"""``base`` plus a rise by ``BURN_IN_GROWTH`` times its size and at least
        ``TYPICAL_SET_MARGIN`` nats per coordinate (far beyond the typical set's
        :math:`D/2 \pm \sqrt{D/2}` above a mode): a slow, growing oscillation that the running
        level would follow; no ceiling where ``base`` is not finite."""
        floor = max(self.minimum_jump, TYPICAL_SET_MARGIN * self.dimension)
        above = base + np.maximum(BURN_IN_GROWTH * np.abs(base), floor)
        return np.where(np.isfinite(base), above, math.inf)

    def _jump(self) -> np.ndarray:
        return np.maximum(self.factor * self.spread, self.minimum_jump)

    def exceeds(self, rise: Any) -> np.ndarray:
        """``(C,)`` mask of rises of the potential beyond the blow-up threshold."""
        return _host(rise) > self._jump()

    def rebase(self) -> None:
        """Restart the level at the next accepted value (the spread is kept)."""
        self.pending_rebase = True

    def accept(self, value: Any, chains: np.ndarray | None = None) -> None:
        """Record the accepted ``value`` (of the chains in the mask, if given)."""
        value = _host(value)
        if chains is not None:  # some chains diverged: update the others only
            keep = _host(chains, bool)
            before = (self.level, self.spread, self.lowest)
            self.accept(value)
            self.level = np.where(keep, self.level, before[0])
            self.spread = np.where(keep, self.spread, before[1])
            self.lowest = np.where(keep, self.lowest, before[2])
        elif self.pending_rebase:
            self.level, self.lowest = value.copy(), value.copy()
            self.pending_rebase = False
        else:
            if self.count == 0:
                self.level = value.copy()
            self.lowest = np.minimum(self.lowest, value)
            weight = 1.0 / (self.count + 1) if self.count < self.burn_in else 1.0 - self.decay
            deviation = value - self.level
            self.spread = self.spread + weight * (np.abs(deviation) - self.spread)
            self.level = self.level + weight * deviation
            self.count += 1
        self._update_ceiling()

    def state_dict(self) -> dict[str, Any]:
        return {
            "level": torch.from_numpy(self.level.copy()),
            "spread": torch.from_numpy(self.spread.copy()),
            "lowest": torch.from_numpy(self.lowest.copy()),
            "count": self.count,
            "pending_rebase": self.pending_rebase,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.level, self.spread = _host(state["level"]), _host(state["spread"])
        self.count = state["count"]
        self.lowest = _host(state.get("lowest", np.full(self.level.shape, math.inf)))
        self.pending_rebase = state["pending_rebase"]
        self._update_ceiling()


def _checksum(value: torch.Tensor, grad: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``(C,)`` sums that are finite only if every potential, gradient and position entry is."""
    return value + grad.sum(1) + position.sum(1)


def _move_summaries(move: torch.Tensor, variance: Any) -> list[torch.Tensor]:
    r"""``(C,)`` summaries of a move from which :func:`_largest_ratio` finds the largest squared
    move per unit of injected variance, :math:`\max_i m_i^2/v_i`: that ratio itself for a
    variance per coordinate; else the largest and smallest move and the chain's variance (two
    reductions, no ``(C, D)`` temporary)."""
    if isinstance(variance, torch.Tensor) and variance.shape[-1] > 1:
        return [(move.square() / variance).amax(1)]
    if isinstance(variance, torch.Tensor):  # one variance per chain, ``(C, 1)``
        variance = variance.reshape(-1).to(move.dtype)
    else:
        variance = move.new_full(move.shape[:1], variance)
    return [move.amax(1), move.amin(1), variance]


def _largest_ratio(summaries: np.ndarray) -> np.ndarray:
    """The ``(C,)`` largest ratios from the host copy of :func:`_move_summaries`."""
    if len(summaries) == 1:
        return summaries[0]
    largest, smallest, variance = summaries
    with np.errstate(over="ignore", invalid="ignore"):  # a blown-up move: inf or nan, flagged
        return np.maximum(largest, -smallest) ** 2 / variance


def _host(values: Any, dtype: type = np.float64) -> np.ndarray:
    """A ``(C,)`` tensor or array as a host NumPy array of ``dtype``."""
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float64 if dtype is np.float64 else torch.bool)
        return values.numpy()
    return np.asarray(values, dtype=dtype)


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
        self.consecutive = np.zeros(num_chains, dtype=np.int64)
        self.steps: list[list[int]] = [[] for _ in range(num_chains)]
        self.warmup_steps: list[int] = [0] * num_chains
        self.draw_diverged = torch.zeros(num_chains, dtype=torch.bool)
        self.move_level = np.ones(num_chains)
        self.move_count = np.zeros(num_chains, dtype=np.int64)
        self.last_bad_sites: list[str] = []
        self.last_step = 0
        self.last_reason = ""

    @staticmethod
    def non_finite(value: torch.Tensor, grad: torch.Tensor, position: torch.Tensor):
        """``(C,)`` mask of chains with a non-finite potential, gradient or position (one
        reduction: a sum is finite only if every term is)."""
        return ~torch.isfinite(_checksum(value, grad, position)).cpu()

    def _rising(self, value: np.ndarray) -> np.ndarray:
        """``(C,)`` mask of chains whose potential is more than :data:`RUNAWAY_RISE` typical
        deviations above its running level (all chains before the blow-up detector has a
        scale): a large move that leaves the potential where it was is the tail of the
        momentum's distribution, not an unstable step."""
        detector = self.blow_up
        if detector is None or detector.count < detector.burn_in:
            return np.ones(value.shape, dtype=bool)
        return value - detector.level > RUNAWAY_RISE * detector.spread

    def _update_move_level(self, largest: np.ndarray, accepted: np.ndarray) -> None:
        """Running level (geometric mean over about ten steps) of the largest move ratio."""
        largest = np.maximum(largest, 1e-30)
        if self.move_count.all():  # the common case: every chain has a level
            level = self.move_level**0.9 * largest**0.1
        else:
            level = np.where(self.move_count == 0, largest, self.move_level**0.9 * largest**0.1)
        self.move_level = level if accepted.all() else np.where(accepted, level, self.move_level)
        self.move_count = self.move_count + accepted

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
        (:data:`RUNAWAY_RISE` typical deviations above its level). A flagged ratio becomes the
        chain's level, so that the same move repeated from the restored state (a momentum
        building up from rest far from equilibrium) is not flagged forever.

        ``confirm()``, when given, returns the ``(C,)`` rise of
        the potential from the old to the new position *on the same minibatch*: a jump is a
        blow-up only if that rise is one too, so that a minibatch holding rows the chain fits
        badly (heavy-tailed data) is not mistaken for an unstable step.
        """
        value = value.detach()
        judged = move is not None and move_variance is not None
        # one transfer to the host; the per-chain bookkeeping below is NumPy on C numbers
        if judged:
            columns = [value, grad.sum(1), *_move_summaries(move, move_variance)]
        else:
            columns = [value, grad.sum(1), position.sum(1)]
        host = torch.stack(columns).to("cpu", torch.float64).numpy()
        level = host[0]
        largest = _largest_ratio(host[2:]) if judged else None
        # a non-finite position makes the move, hence its largest ratio, non-finite
        bad = ~np.isfinite(level + host[1] + (host[2] if largest is None else largest))
        self.runaway: torch.Tensor | None = None
        limit = np.maximum(RUNAWAY_GROWTH * self.move_level, RUNAWAY) if judged else None
        suspect = bad if largest is None else bad | (largest > limit)
        if self.blow_up is not None:
            suspect = suspect | self.blow_up.blown_up(level)
        if not suspect.any():  # the common case: every chain's step is good
            if largest is not None:
                self._update_move_level(largest, np.ones(bad.shape, dtype=bool))
            self.consecutive[:] = 0
            if self.blow_up is not None:
                self.blow_up.accept(level)
            return None
        return self._judge(level, largest, limit, bad, grad, position, step, warmup, move,
                           move_variance, confirm)  # fmt: skip

    def _judge(
        self, level, largest, limit, bad, grad, position, step, warmup, move, move_variance,
        confirm,
    ) -> torch.Tensor | None:  # fmt: skip
        """:meth:`check` for a step on which some chain looks suspect: which chains diverged,
        and why."""
        reason = "non-finite values"
        if largest is not None:
            runaway = largest > limit
            if runaway.any():  # rare: the other conditions only then
                runaway &= ~bad & (self.move_count > 0) & self._rising(level)
            self._update_move_level(largest, ~(bad | runaway))
            if runaway.any():
                bound = torch.as_tensor(limit, dtype=move.dtype, device=move.device)
                self.runaway = move.square() / move_variance > bound.reshape(-1, 1)
                # the level takes the flagged ratio: a repeat of the same move from the restored
                # state (a momentum building up from rest, far from equilibrium) is not flagged
                # again, a growing oscillation is within a few steps
                self.move_level = np.where(runaway, largest, self.move_level)
                reason = "a runaway move" if not bad.any() else reason
                bad = bad | runaway
        if self.blow_up is not None:
            blown = self.blow_up.blown_up(level) & ~bad
            if blown.any() and confirm is not None:
                blown = blown & self.blow_up.exceeds(confirm())
            if blown.any():
                reason = "a blow-up of the potential" if not bad.any() else reason
            bad = bad | blown
        if not bad.any():
            self.consecutive[:] = 0
            if self.blow_up is not None:
                self.blow_up.accept(level)
            return None
        mask = torch.from_numpy(bad)
        self._record(mask, level, grad, position, step, warmup, reason)
        return mask

    def _record(self, bad, value, grad, position, step, warmup, reason) -> None:
        good = ~bad
        self.consecutive = np.where(bad.numpy(), self.consecutive + 1, 0)
        self.draw_diverged |= bad
        for c in bad.nonzero().flatten().tolist():
            self.steps[c].append(step)
            if warmup:
                self.warmup_steps[c] += 1
        if self.blow_up is not None and bool(good.any()):
            self.blow_up.accept(value, good.numpy())
        self.last_step, self.last_reason = step, reason
        self._bad_values = (grad[bad], position[bad])

    def raise_if_stuck(self, layout: FlatLayout) -> None:
        """Raise :class:`~pyro_sgmcmc.SamplerDivergedError` when a chain has diverged
        ``max_consecutive`` steps in a row (the drivers attach the draws collected so far)."""
        stuck = self.consecutive >= self.max_consecutive
        if not stuck.any():
            return
        grad, position = self._bad_values
        sites = layout.sites_where(~torch.isfinite(grad)) or layout.sites_where(
            ~torch.isfinite(position)
        )
        chains = [self.chain_ids[c] for c in np.flatnonzero(stuck).tolist()]
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
            "consecutive": torch.from_numpy(self.consecutive.copy()),
            "steps": [list(s) for s in self.steps],
            "warmup_steps": list(self.warmup_steps),
            "draw_diverged": self.draw_diverged.clone(),
            "move_level": torch.from_numpy(self.move_level.copy()),
            "move_count": torch.from_numpy(self.move_count.copy()),
            "blow_up": None if self.blow_up is None else self.blow_up.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.consecutive = np.asarray(state["consecutive"], dtype=np.int64).copy()
        self.steps = [list(s) for s in state["steps"]]
        self.warmup_steps = list(state["warmup_steps"])
        self.draw_diverged = state["draw_diverged"].clone()
        self.move_level = _host(state["move_level"])
        self.move_count = np.asarray(state["move_count"], dtype=np.int64).copy()
        if self.blow_up is not None and state["blow_up"] is not None:
            self.blow_up.load_state_dict(state["blow_up"])
