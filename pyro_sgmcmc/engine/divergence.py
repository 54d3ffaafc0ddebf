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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import SamplerDivergedError
from .layout import FlatLayout

__all__ = ["RETREAT_EVERY", "RUNAWAY", "RUNAWAY_GROWTH", "BlowUpDetector", "DivergenceMonitor"]

#: A chain that diverges this many steps in a row (and again after as many more) goes back to an
#: earlier state: during warm-up to where the adaptation window began (with half the step),
#: while sampling to a draw it kept before (:meth:`DivergenceMonitor.due_for_retreat`).
RETREAT_EVERY = 10
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

    The bookkeeping is plain Python on one float per chain: it runs on the host at every step,
    where a few arithmetic operations per chain cost less than one array operation.
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
        self.floor = max(minimum_jump, TYPICAL_SET_MARGIN * dimension)
        self.level = [0.0] * num_chains
        self.spread = [0.0] * num_chains
        self.lowest = [math.inf] * num_chains
        self.count = 0
        self.pending_rebase = False
        self._update_ceiling()

    def blown_up(self, values: Any) -> list[bool]:
        """Per chain, whether its new potential is a blow-up."""
        return [v > top for v, top in zip(_floats(values), self.ceiling, strict=True)]

    def _grown_above(self, base: float) -> float:
        r"""``base`` plus a rise by ``BURN_IN_GROWTH`` times its size and at least
        ``TYPICAL_SET_MARGIN`` nats per coordinate (far beyond the typical set's
        :math:`D/2 \pm \sqrt{D/2}` above a mode): a slow, growing oscillation that the running
        level would follow; no ceiling where ``base`` is not finite."""
        if not math.isfinite(base):
            return math.inf
        return base + max(BURN_IN_GROWTH * abs(base), self.floor)

    def _jump(self, spread: float) -> float:
        return max(self.factor * spread, self.minimum_jump)

    def _update_ceiling(self) -> None:
        """The potential above which a new value is a blow-up, per chain (kept up to date by
        :meth:`accept`, so that the per-step test is one comparison)."""
        self.above_lowest = [self._grown_above(low) for low in self.lowest]
        if self.count == 0:
            self.ceiling = [math.inf] * len(self.level)
            return
        self.ceiling = [self._ceiling_of(c) for c in range(len(self.level))]

    def _ceiling_of(self, chain: int) -> float:
        if self.count < self.burn_in:  # no scale yet: only a rise by orders of magnitude
            top = self._grown_above(self.level[chain])
        else:
            top = self.level[chain] + self._jump(self.spread[chain])
        return min(self.above_lowest[chain], top)

    def drifted(self) -> list[bool]:
        """Per chain, whether its running level itself -- an average over about
        ``1/(1 - decay)`` minibatches after the first ``burn_in`` -- is above the ceiling over its
        lowest potential: an oscillation that grew a little at every step, each step's rise too
        small to count as a jump, confirms itself. A step of such a chain is refused only while
        it climbs (:meth:`DivergenceMonitor.check`), so the chain can come back down."""
        return [level > top for level, top in zip(self.level, self.above_lowest, strict=True)]

    def exceeds(self, rises: Any) -> list[bool]:
        """Per chain, whether its rise of the potential is beyond the blow-up threshold."""
        return [r > self._jump(sd) for r, sd in zip(_floats(rises), self.spread, strict=True)]

    def rebase(self) -> None:
        """Restart the level at the next accepted value (the spread is kept)."""
        self.pending_rebase = True

    def accept(self, values: Any, chains: Sequence[bool] | None = None) -> None:
        """Record the accepted ``values`` (of the chains set in ``chains``, if given)."""
        values = _floats(values)
        keep = [True] * len(values) if chains is None else [bool(k) for k in chains]
        if self.pending_rebase:
            for c, value in enumerate(values):
                if keep[c]:
                    self.level[c] = self.lowest[c] = value
            self.pending_rebase = False
        else:
            self._follow(values, keep)
            return
        self._update_ceiling()

    def _follow(self, values: list[float], keep: list[bool]) -> None:
        """Move the kept chains' level, spread, lowest value and ceiling with their new
        ``values`` (the per-step update: plain arithmetic per chain)."""
        if self.count < self.burn_in:
            weight = 1.0 / (self.count + 1)
            if self.count == 0:
                pairs = zip(values, keep, self.level, strict=True)
                self.level = [v if k else old for v, k, old in pairs]
        else:
            weight = 1.0 - self.decay
        self.count += 1
        # the common case (every chain accepted, the scale set) updates each ceiling in place
        in_place = self.count > self.burn_in and all(keep)
        for c, value in enumerate(values):
            if not keep[c]:
                continue
            if value < self.lowest[c]:
                self.lowest[c], self.above_lowest[c] = value, self._grown_above(value)
            deviation = value - self.level[c]
            self.spread[c] += weight * (abs(deviation) - self.spread[c])
            self.level[c] += weight * deviation
            if in_place:
                self.ceiling[c] = self._ceiling_of(c)
        if not in_place:
            self._update_ceiling()

    def state_dict(self) -> dict[str, Any]:
        return {
            "level": torch.tensor(self.level, dtype=torch.float64),
            "spread": torch.tensor(self.spread, dtype=torch.float64),
            "lowest": torch.tensor(self.lowest, dtype=torch.float64),
            "count": self.count,
            "pending_rebase": self.pending_rebase,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.level, self.spread = _floats(state["level"]), _floats(state["spread"])
        self.count = state["count"]
        lowest = state.get("lowest")
        self.lowest = [math.inf] * len(self.level) if lowest is None else _floats(lowest)
        self.pending_rebase = state["pending_rebase"]
        self._update_ceiling()


def _checksum(value: torch.Tensor, grad: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``(C,)`` sums that are finite only if every potential, gradient and position entry is."""
    return value + grad.sum(1) + position.sum(1)


def _move_columns(move: torch.Tensor, variance: Any) -> list[torch.Tensor]:
    r"""``(C,)`` summaries of a move from which :func:`_largest_ratios` finds the largest squared
    move per unit of injected variance, :math:`\max_i m_i^2/v_i`: that ratio itself for a
    variance per coordinate; else the largest absolute move (and the chain's variance when it
    is a tensor), squared and divided on the host in float64, where it cannot overflow."""
    if isinstance(variance, torch.Tensor) and variance.shape[-1] > 1:
        return [(move.square() / variance).amax(1)]
    largest = move.abs().amax(1)
    if isinstance(variance, torch.Tensor):  # one variance per chain, ``(C, 1)``
        return [largest, variance.reshape(-1).to(move.dtype)]
    return [largest]


def _largest_ratios(rows: list[list[float]], variance: Any) -> list[float]:
    """Per chain, the largest ratio from the host rows of :func:`_move_columns`."""
    if isinstance(variance, torch.Tensor):
        if len(rows) == 1:
            return rows[0]
        return [_ratio(m, v) for m, v in zip(rows[0], rows[1], strict=True)]
    return [_ratio(m, variance) for m in rows[0]]


def _ratio(move: float, variance: float) -> float:
    """``move**2 / variance`` in float64 (a vanishing variance: zero or infinite)."""
    if variance > 0:
        return move * move / variance
    return 0.0 if move == 0 else math.inf


def _floats(values: Any) -> list[float]:
    """A ``(C,)`` tensor, array or sequence as a list of Python floats."""
    if isinstance(values, torch.Tensor | np.ndarray):
        return values.tolist()
    return [float(v) for v in values]


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
    adaptive:
        Whether the adaptive warm-up chose the step (no step size given), for the advice.
    """

    def __init__(
        self,
        num_chains: int,
        max_consecutive: int,
        algorithm: str,
        blow_up: BlowUpDetector | None = None,
        chain_ids: list[int] | None = None,
        adaptive: bool = False,
    ) -> None:
        self.adaptive = adaptive
        self.chain_ids = list(range(num_chains)) if chain_ids is None else list(chain_ids)
        self.max_consecutive = max_consecutive
        self.algorithm = algorithm
        self.blow_up = blow_up
        self.consecutive = np.zeros(num_chains, dtype=np.int64)
        self.steps: list[list[int]] = [[] for _ in range(num_chains)]
        self.warmup_steps: list[int] = [0] * num_chains
        self.draw_diverged = torch.zeros(num_chains, dtype=torch.bool)
        self.move_level = [1.0] * num_chains
        self.move_count = [0] * num_chains
        self.move_limit = [RUNAWAY] * num_chains
        self.any_consecutive = False
        self.last_bad_sites: list[str] = []
        self.last_step = 0
        self.last_reason = ""

    @staticmethod
    def non_finite(value: torch.Tensor, grad: torch.Tensor, position: torch.Tensor):
        """``(C,)`` mask of chains with a non-finite potential, gradient or position (one
        reduction: a sum is finite only if every term is)."""
        return ~torch.isfinite(_checksum(value, grad, position)).cpu()

    def _rising(self, values: list[float]) -> list[bool]:
        """Per chain, whether its potential is more than :data:`RUNAWAY_RISE` typical
        deviations above its running level (all chains before the blow-up detector has a
        scale): a large move that leaves the potential where it was is the tail of the
        momentum's distribution, not an unstable step."""
        detector = self.blow_up
        if detector is None or detector.count < detector.burn_in:
            return [True] * len(values)
        return [
            value - level > RUNAWAY_RISE * spread
            for value, level, spread in zip(values, detector.level, detector.spread, strict=True)
        ]

    def _update_move_level(self, largest: list[float], accepted: list[bool] | None) -> None:
        """Running level (geometric mean over about ten steps) of the largest move ratio of
        the ``accepted`` chains (all if ``None``), and the runaway limit it sets."""
        for c, ratio in enumerate(largest):
            if accepted is not None and not accepted[c]:
                continue
            ratio = max(ratio, 1e-30)
            if self.move_count[c]:
                ratio = self.move_level[c] ** 0.9 * ratio**0.1
            self._set_move_level(c, ratio)
            self.move_count[c] += 1

    def _set_move_level(self, chain: int, level: float) -> None:
        self.move_level[chain] = level
        self.move_limit[chain] = max(RUNAWAY_GROWTH * level, RUNAWAY)

    def _set_consecutive(self, consecutive: np.ndarray) -> None:
        self.consecutive = consecutive
        self.any_consecutive = bool(consecutive.any())

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
        judged = move is not None and move_variance is not None
        third = _move_columns(move, move_variance) if judged else [position.sum(1)]
        # one transfer to the host; the per-chain bookkeeping below is Python on C floats
        rows = torch.stack([value.detach(), grad.sum(1), *third]).tolist()
        values = rows[0]
        # a non-finite position makes the move, hence its largest ratio, non-finite
        bad = [not math.isfinite(v + g + m) for v, g, m in zip(*rows[:3], strict=True)]
        largest = _largest_ratios(rows[2:], move_variance) if judged else None
        self.runaway: torch.Tensor | None = None
        if not self._suspect(values, largest, bad):  # the common case: every step is good
            if largest is not None:
                self._update_move_level(largest, None)
            if self.any_consecutive:
                self._set_consecutive(np.zeros_like(self.consecutive))
            if self.blow_up is not None:
                self.blow_up.accept(values)
            return None
        bad, reason = self._runaways(values, largest, bad, move, move_variance)
        bad, reason = self._blow_ups(values, bad, confirm, reason)
        if not any(bad):
            self._set_consecutive(np.zeros_like(self.consecutive))
            if self.blow_up is not None:
                self.blow_up.accept(values)
            return None
        mask = torch.tensor(bad)
        self._record(mask, values, grad, position, step, warmup, reason)
        return mask

    def _suspect(self, values: list[float], largest: list[float] | None, bad: list[bool]) -> bool:
        """Whether some chain's step is not finite, moved beyond its runaway limit or has a
        potential above its blow-up ceiling (then :meth:`check` looks closer)."""
        if any(bad):
            return True
        if largest is not None and any(
            not r <= limit for r, limit in zip(largest, self.move_limit, strict=True)
        ):
            return True
        ceiling = None if self.blow_up is None else self.blow_up.ceiling
        return ceiling is not None and any(
            not v <= top for v, top in zip(values, ceiling, strict=True)
        )

    def _runaways(self, values, largest, bad, move, move_variance) -> tuple[list[bool], str]:
        """:meth:`check`'s runaway rule on a suspect step: ``bad`` with the runaways added
        (``self.runaway`` holds their coordinates) and the reason; the move levels take the
        step."""
        reason = "non-finite values"
        if largest is None:
            return bad, reason
        limits = list(self.move_limit)  # the limits this step is judged by
        runaway = [not r <= limit for r, limit in zip(largest, limits, strict=True)]
        if any(runaway):  # rare: the other conditions only then
            rising = self._rising(values)
            runaway = [
                flagged and not bad[c] and self.move_count[c] > 0 and rising[c]
                for c, flagged in enumerate(runaway)
            ]
        self._update_move_level(largest, [not (b or r) for b, r in zip(bad, runaway, strict=True)])
        if not any(runaway):
            return bad, reason
        bound = torch.tensor(limits, dtype=move.dtype, device=move.device)
        self.runaway = move.square() / move_variance > bound.reshape(-1, 1)
        # the level takes the flagged ratio: a repeat of the same move from the restored state
        # (a momentum building up from rest, far from equilibrium) is not flagged again, a
        # growing oscillation is within a few steps
        for c, flagged in enumerate(runaway):
            if flagged:
                self._set_move_level(c, largest[c])
        reason = "a runaway move" if not any(bad) else reason
        return [b or r for b, r in zip(bad, runaway, strict=True)], reason

    def _blow_ups(self, values, bad, confirm, reason) -> tuple[list[bool], str]:
        """:meth:`check`'s blow-up rule on a suspect step: ``bad`` with the blow-ups added,
        each confirmed (when ``confirm`` is given) by the rise on the same minibatch, and the
        reason."""
        if self.blow_up is None:
            return bad, reason
        blown = [b and not old for b, old in zip(self.blow_up.blown_up(values), bad, strict=True)]
        if any(blown) and confirm is not None:
            rises = _floats(confirm())  # one transfer to the host
            exceeds = self.blow_up.exceeds(rises)
            # a drifted chain's step is a blow-up only while it climbs on, so that a step back
            # down (a descent's, or a sample's) is never refused: the chain can recover
            climbing = [r > 0.0 for r in rises]
            drifted = [d and c for d, c in zip(self.blow_up.drifted(), climbing, strict=True)]
            blown = [b and (e or d) for b, e, d in zip(blown, exceeds, drifted, strict=True)]
        if any(blown) and not any(bad):
            reason = "a blow-up of the potential"
        return [b or x for b, x in zip(bad, blown, strict=True)], reason

    def _record(self, bad, values, grad, position, step, warmup, reason) -> None:
        good = ~bad
        self._set_consecutive(np.where(bad.numpy(), self.consecutive + 1, 0))
        self.draw_diverged |= bad
        for c in bad.nonzero().flatten().tolist():
            self.steps[c].append(step)
            if warmup:
                self.warmup_steps[c] += 1
        if self.blow_up is not None and bool(good.any()):
            self.blow_up.accept(values, good.tolist())
        self.last_step, self.last_reason = step, reason
        self._bad_values = (grad[bad], position[bad])

    def due_for_retreat(self, chains: torch.Tensor) -> torch.Tensor:
        """The ``(C,)`` mask of the chains of ``chains`` that have now diverged a multiple of
        :data:`RETREAT_EVERY` steps in a row: going back one step (what every divergence does)
        cannot help a chain whose accepted states have drifted, a little at a time, to where no
        step is stable."""
        consecutive = torch.from_numpy(self.consecutive)
        return chains.cpu() & (consecutive > 0) & (consecutive % RETREAT_EVERY == 0)

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
            + "). "
            + _advice(self.algorithm, self.adaptive),
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
            "move_level": torch.tensor(self.move_level, dtype=torch.float64),
            "move_count": torch.tensor(self.move_count, dtype=torch.int64),
            "blow_up": None if self.blow_up is None else self.blow_up.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._set_consecutive(np.asarray(state["consecutive"], dtype=np.int64).copy())
        self.steps = [list(s) for s in state["steps"]]
        self.warmup_steps = list(state["warmup_steps"])
        self.draw_diverged = state["draw_diverged"].clone()
        self.move_count = [int(n) for n in state["move_count"]]
        for c, level in enumerate(_floats(state["move_level"])):
            self._set_move_level(c, level)
        if self.blow_up is not None and state["blow_up"] is not None:
            self.blow_up.load_state_dict(state["blow_up"])


def _advice(algorithm: str, adaptive: bool) -> str:
    """What to change after a chain diverged for good (``adaptive``: the warm-up chose the
    step, so leaving it unset is no advice)."""
    if algorithm == "constant SGD":
        # its sampling rate is Mandt et al.'s, not the given step: a smaller warm-up step only
        # measures the noise further from the mode
        return (
            "ConstantSGD warms up with the given step and then runs at Mandt et al.'s rate, "
            "which only the adaptive warm-up bounds by the curvature it measures: leave "
            "step_size and learning_rate unset (or, diverged in warm-up, give a smaller one; "
            "after it, pass rate_multiplier < 1 or optimal_rate=False), or check the model."
        )
    if adaptive:
        return (
            "The adaptive warm-up chooses the step: a chain that diverges with the steps it "
            "chose has usually run to where the model's scales are extreme (the warnings before "
            "this error name the site). Standardise the features and the target, give a longer "
            "warm-up (warmup_steps) or a smaller step_size, or check the model and its priors."
        )
    return (
        "Give a smaller step_size or learning_rate, or leave both unset for the adaptive "
        "warm-up, or check the model."
    )
