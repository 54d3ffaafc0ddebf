r"""Thinning chosen by the warm-up, and the per-chain cadence of kept draws.

A kernel given no ``num_steps_per_sample`` keeps one draw every :math:`k_c` gradient steps of
chain :math:`c`, with :math:`k_c` the chain's integrated autocorrelation time measured over the
last quarter of its warm-up (:class:`ThinningMeter`), scaled by how much slower the frozen
settings of the sampling phase mix than those of that quarter (the warm-up's last window end
re-estimates the step, the preconditioner and SGHMC's friction):

.. math::

    \tau = 1 + 2 \sum_{l \ge 1} \rho_l, \qquad k = \lceil \tau \rceil,

estimated with Geyer's initial monotone sequence on the one chain
(:func:`~pyro_sgmcmc.analysis.rank_diagnostics.ess_of_draws`, the verdicts' estimator without
their split and ranks; Pyro's ``effective_sample_size`` forms an :math:`n/2 \times n/2` matrix
per series for its cumulative minimum: 2 GB and 7 s for a warm-up of 40,000 steps, 15 GB for
one of 125,000), so that one kept draw is worth about one effective draw: for an AR(1) series,
thinning by :math:`\tau` leaves a lag-one correlation of :math:`e^{-2}` between kept draws and
:math:`(1 - e^{-2}) / (1 + e^{-2}) \approx 0.76` effective draws per draw. The measured series
are, per chain, a few random projections of the position in units of the posterior standard
deviations the warm-up measured, and their centred squares (the mean and the spread of the
draws); for a network, whose weights are not identified (hidden units can be permuted), the
potential on a fixed set of rows instead, a function-space quantity. R's ``posterior`` package
thins the same way, by :math:`S / \min(\text{ESS}_\text{bulk}, \text{ESS}_\text{tail})`.

Budget: :math:`1 \le k \le` :data:`MAX_THINNING`, and the warm-up takes at least
:data:`MIN_WARMUP_STEPS` gradient steps (``warmup_steps`` draws of
:func:`warmup_steps_per_draw` steps each), so that the measurement window holds about a
thousand steps. A measurement shorter than :data:`RELIABLE_LENGTH` autocorrelation times of some
chain underestimates them, and says that the chain may not have arrived: the engine then doubles
the warm-up, with the adaptation windows run once more and a new measurement over the last half
of the new steps (:meth:`ThinningMeter.wants_longer`, :meth:`ThinningMeter.lengthen`), up to
:data:`LONGEST_WARMUP` times its planned length.

Chains stacked in one engine keep their own cadence (:class:`DrawCadence`): every chain steps at
every step, and chain :math:`c`'s state is kept at its own steps :math:`W + j k_c`, exactly the
draws it keeps when it runs alone (``pyro.infer.MCMC`` runs one chain per engine).

References
----------
C. J. Geyer, "Practical Markov chain Monte Carlo", Statistical Science 7(4), 1992.

T. Säilynoja, P.-C. Bürkner and A. Vehtari, "Graphical test for discrete uniformity and its
applications in goodness-of-fit evaluation and multiple sample comparison", Statistics and
Computing 32, 2022 (the ``posterior`` package's thinning).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..analysis.rank_diagnostics import ess_of_draws
from .controls import median_steps
from .view import EngineView

__all__ = [
    "LONGEST_WARMUP",
    "MAX_THINNING",
    "MIN_WARMUP_STEPS",
    "DrawCadence",
    "ThinningMeter",
    "warmup_steps_per_draw",
]

#: The warm-up of a kernel that chooses its thinning takes at least this many gradient steps.
MIN_WARMUP_STEPS = 4000
#: The largest thinning a kernel chooses (gradient steps per kept draw).
MAX_THINNING = 100
#: A chain whose autocorrelation time is at least this many times its thinning, at its largest,
#: is told that more draws, not a longer warm-up, are the first cure (each kept draw is worth at
#: most about half an effective draw: :meth:`ThinningMeter.thinning_advice`).
CAPPED_RATIO = 2.0
#: The measurement covers the warm-up from this fraction on (the adaptive warm-up's last window,
#: whose settings are those of the sampling phase) ...
MEASURE_FROM = 0.75
#: ... after the ramp that starts each adaptation window.
RAMP_STEPS = 20
#: Random projections of the position measured per chain.
PROJECTIONS = 4
#: A measurement shorter than this many autocorrelation times underestimates them.
RELIABLE_LENGTH = 20
#: A warm-up whose measurement is shorter than that is doubled, one more adaptation window at a
#: time, up to this many times its planned length (:meth:`ThinningMeter.wants_longer`).
LONGEST_WARMUP = 8


def warmup_steps_per_draw(warmup_draws: int) -> int:
    """Gradient steps per warm-up draw of a kernel that chooses its thinning: enough for
    :data:`MIN_WARMUP_STEPS` in all, at least one."""
    if warmup_draws <= 0:
        return 1
    return max(1, math.ceil(MIN_WARMUP_STEPS / warmup_draws))


class ThinningMeter:
    """Records each chain's measured series over the last quarter of warm-up and chooses its
    thinning (see the module docstring).

    Parameters
    ----------
    warmup_steps:
        Gradient steps of warm-up.
    function_space:
        Measure the potential on fixed rows (networks) instead of projections of the position.
    """

    def __init__(self, warmup_steps: int, function_space: bool) -> None:
        self.start = int(MEASURE_FROM * warmup_steps) + RAMP_STEPS
        if self.start >= warmup_steps:
            self.start = int(MEASURE_FROM * warmup_steps)
        self.end = warmup_steps
        self.function_space = function_space
        # the recorded series, one row per step, in a buffer allocated once per measurement
        # (a list of one small tensor per step fragments the heap over a long warm-up)
        self.buffer: torch.Tensor | None = None
        self.recorded = 0
        self.directions: torch.Tensor | None = None
        self.rows: torch.Tensor | None = None
        self.autocorrelation_time: np.ndarray | None = None
        #: The autocorrelation times under the sampling phase's settings (:meth:`choose`).
        self.sampling_times: np.ndarray | None = None
        self.thinning: list[int] | None = None

    def observe(self, engine: EngineView) -> None:
        """Record the series at the engine's new state (called after every warm-up step)."""
        if not self.start < engine.t <= self.end:
            return
        if self.directions is None:
            self._begin(engine)
        if self.function_space:
            value, _ = engine.estimator.potential.value_and_grad(
                engine.position, engine.fixed, self.rows
            )
            self.record(value.detach().reshape(-1, 1))
        else:
            scaled = engine.position / self.scale
            self.record(torch.einsum("cd,cdk->ck", scaled, self.directions))

    @property
    def series(self) -> torch.Tensor:
        """``(n, C, K)`` float64: the values recorded so far, one row per step (``n = 0``
        before the first)."""
        if self.buffer is None:
            return torch.zeros(0, 0, 0, dtype=torch.float64)
        return self.buffer[: self.recorded]

    def record(self, values: torch.Tensor) -> None:
        """Append one step's ``(C, K)`` values to the series, in place: the buffer holds the
        whole measurement window and doubles if a step beyond it comes."""
        if self.buffer is None or self.recorded == self.buffer.shape[0]:
            capacity = max(self.end - self.start, 4, 2 * self.recorded)
            grown = values.new_empty((capacity, *values.shape), dtype=torch.float64)
            if self.buffer is not None:
                grown[: self.recorded] = self.buffer
            self.buffer = grown
        self.buffer[self.recorded] = values.detach()
        self.recorded += 1

    def _clear(self) -> None:
        self.buffer, self.recorded = None, 0

    def _begin(self, engine: EngineView) -> None:
        position = engine.position
        signs = torch.stack([engine.rademacher() for _ in range(PROJECTIONS)], -1)
        self.directions = signs / math.sqrt(position.shape[1])
        scale = engine.control.posterior_scale()
        self.scale = torch.ones_like(position) if scale is None else scale
        if self.function_space and not engine.batches.full_batch:
            self.rows = engine.batches.probe()

    def choose(self, slowdown: torch.Tensor | None) -> list[int]:
        r"""Per chain, :math:`k_c = \lceil \tau_c \cdot r_c \rceil` within the budget, where
        :math:`r_c \ge 1` is how many times slower the sampling phase's settings mix than those
        the measurement ran with (``None``: the same): the autocorrelation time of Langevin
        dynamics is inversely proportional to its step (SGHMC's: to step over friction)."""
        times = self.measure()
        self._clear()
        if times is None:
            self.thinning = [1] * (1 if slowdown is None else slowdown.shape[0])
            return self.thinning
        change = np.ones(len(times))
        if slowdown is not None:
            change = np.maximum(slowdown.detach().reshape(-1).double().cpu().numpy(), 1.0)
        self.sampling_times = times * change
        self.thinning = [int(min(MAX_THINNING, max(1, math.ceil(t)))) for t in self.sampling_times]
        return self.thinning

    def measure(self) -> np.ndarray | None:
        """Per chain, the autocorrelation time of the series recorded so far, in gradient steps
        (``None`` with fewer than four steps recorded); also kept as ``autocorrelation_time``."""
        if self.recorded < 4:
            self.autocorrelation_time = None
            return None
        series = self.series.cpu()  # (n, C, K)
        if not self.function_space:  # the spread as well as the mean
            series = torch.cat([series, (series - series.mean(0)).square()], -1)
        length = series.shape[0]
        times = np.ones(series.shape[1])
        for c, chain in enumerate(series.unbind(1)):  # one chain at a time: memory ~ n K
            with np.errstate(invalid="ignore", divide="ignore"):  # a non-finite series: time 1
                ess = ess_of_draws(chain.unsqueeze(0).numpy())
            ess = ess[np.isfinite(ess) & (ess > 0)]
            if ess.size:
                times[c] = max(1.0, length / float(ess.min()))
        self.autocorrelation_time = times
        return times

    def wants_longer(self) -> bool:
        """Whether the measurement so far spans fewer than :data:`RELIABLE_LENGTH`
        autocorrelation times of some chain, so that the warm-up should go on (never for a
        network: its chains explore their own regions however long the warm-up)."""
        if self.function_space or self.measure() is None:
            return False
        return not all(self.reliable())

    def lengthen(self, start: int, end: int) -> None:
        """Measure afresh over the lengthened warm-up's last window, from step ``start`` (after
        the window's ramp) to step ``end``, along new random projections in units of the
        posterior scale measured by then."""
        self.start, self.end = int(start) + RAMP_STEPS, int(end)
        self.directions = None
        self._clear()

    def reliable(self) -> list[bool]:
        """Per chain, whether the measurement spanned :data:`RELIABLE_LENGTH` autocorrelation
        times (a shorter one underestimates them)."""
        if self.autocorrelation_time is None:
            return []
        length = self.end - self.start
        return [bool(length >= RELIABLE_LENGTH * t) for t in self.autocorrelation_time]

    def warmup_advice(self) -> str:
        """What to add to the warning of an unconverged run whose measurement spanned fewer
        than :data:`RELIABLE_LENGTH` autocorrelation times of some chain (``""`` otherwise, and
        for a network, whose chains explore their own regions however long the warm-up): the
        ``warmup_steps`` whose last quarter (after the ramp) would span them; from
        :data:`MIN_WARMUP_STEPS` warm-up draws on, :func:`warmup_steps_per_draw` is one. A
        measurement that short underestimates the time, and a chain that mixes this slowly may
        not have arrived when the warm-up ended (on a non-centred hierarchical model of 40
        groups: 330 steps measured over 1,030, R-hat 1.19; with 20,000 warm-up steps,
        converged)."""
        if self.function_space or all(self.reliable()):
            return ""
        length = self.end - self.start
        slowest = float(np.max(self.autocorrelation_time))
        needed = math.ceil((RELIABLE_LENGTH * slowest + RAMP_STEPS) / (1.0 - MEASURE_FROM))
        give = (
            "If each chain's draws still drift (arviz.plot_trace), they had not: give "
            if self.capped_chains()  # the first cure is then more draws (thinning_advice)
            else "Give "
        )
        return (
            f"; the warm-up measured an autocorrelation time of {slowest:,.0f} gradient steps "
            f"over its last {length:,} steps, fewer than the {RELIABLE_LENGTH} autocorrelation "
            "times a measurement needs: the time is likely longer, and the chains may not have "
            f"arrived when the warm-up ended. {give}warmup_steps={needed} or more (warm-up "
            f"draws: from {MIN_WARMUP_STEPS:,} on, each is one gradient step while the kernel "
            f"chooses the thinning; the warm-up took {self.end:,} gradient steps)"
        )

    def capped_chains(self) -> list[int]:
        """The chains whose kept draws are much closer than their autocorrelation time (under
        the sampling phase's settings, :attr:`sampling_times`): their thinning at its largest,
        :data:`MAX_THINNING`, at most half that time (each draw worth at most about half an
        effective draw). Never for a network, whose measurement is of the potential, not of
        its parameters."""
        times, thinning = self.sampling_times, self.thinning
        if self.function_space or times is None or thinning is None:
            return []
        return [
            c
            for c, (time, steps) in enumerate(zip(times, thinning, strict=True))
            if steps >= MAX_THINNING and time >= CAPPED_RATIO * steps
        ]

    def thinning_advice(self) -> str:
        r"""What to add to the warning of an unconverged run whose kept draws are closer than
        some chain's autocorrelation time (:meth:`capped_chains`; ``""`` otherwise): each draw
        is worth a fraction of an effective draw, and more draws are the first cure. On a
        non-centred model of 50 groups and 10,000 rows (2026-12-07; an autocorrelation time of
        648 steps), a warm-up six times longer, as the short measurement asked, left
        :math:`\hat R` at 1.11 and the bulk ESS at 46 for 300 draws per chain, where the chains
        had arrived (the hyperparameters' means within 0.05 posterior standard deviations of
        the exact ones)."""
        capped = self.capped_chains()
        if not capped:
            return ""
        slowest = max(float(self.sampling_times[c]) for c in capped)
        steps = self.thinning[capped[0]]
        return (
            f"; the kept draws are {steps} gradient steps apart (the largest thinning), closer "
            f"than the chains' autocorrelation time of about {slowest:,.0f} steps (measured in "
            f"warm-up): each is worth about {steps / slowest:.2g} effective draws, and chains "
            "this slow disagree in R-hat until they have run many autocorrelation times, which "
            f"more draws cure (num_steps_per_sample={math.ceil(slowest)} keeps draws about "
            "independent, at the same cost per effective draw)"
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "series": self.series.clone(),
            "directions": self.directions,
            "scale": getattr(self, "scale", None),
            "rows": self.rows,
            "autocorrelation_time": None
            if self.autocorrelation_time is None
            else torch.from_numpy(self.autocorrelation_time),
            "thinning": self.thinning,
            "sampling_times": None
            if self.sampling_times is None
            else torch.from_numpy(self.sampling_times),
            "window": (self.start, self.end),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.start, self.end = state.get("window", (self.start, self.end))  # a lengthened warm-up
        self.directions, self.rows = state["directions"], state["rows"]
        if state["scale"] is not None:
            self.scale = state["scale"]
        times = state["autocorrelation_time"]
        self.autocorrelation_time = None if times is None else times.numpy()
        self.thinning = None if state["thinning"] is None else list(state["thinning"])
        times = state.get("sampling_times")  # an earlier checkpoint: the measured times
        self.sampling_times = self.autocorrelation_time if times is None else times.numpy()
        series = state["series"]
        if isinstance(series, list):  # a checkpoint of the earlier format: one tensor a step
            series = torch.stack(series) if series else torch.zeros(0, 0, 0)
        self._clear()
        if series.shape[0]:
            capacity = max(self.end - self.start, series.shape[0])
            self.buffer = series.new_empty((capacity, *series.shape[1:]), dtype=torch.float64)
            self.buffer[: series.shape[0]] = series
            self.recorded = series.shape[0]


#: How many of its last kept states a chain remembers as places to go back to.
RETREAT_DEPTH = 2


class DrawCadence:
    """Chain :math:`c` keeps its state every :math:`k_c` gradient steps of a sampling phase.

    The engine steps every chain at every step; a chain that reaches a kept state before the
    others queues it, so each chain's kept draws are those it keeps when run alone. The last
    :data:`RETREAT_DEPTH` kept states of each chain whose draws had no divergent step are
    remembered as places to go back to (:meth:`retreat_point`).

    Parameters
    ----------
    thinning:
        :math:`k_c` per chain.
    """

    def __init__(self, thinning: Sequence[int]) -> None:
        self.thinning = [int(k) for k in thinning]
        num_chains = len(self.thinning)
        self.since = [0] * num_chains
        self.diverged = [False] * num_chains
        self.queues: list[deque[dict[str, Any]]] = [deque() for _ in range(num_chains)]
        self.recent: list[list[dict[str, Any]]] = [[] for _ in range(num_chains)]

    @property
    def ready(self) -> bool:
        """Whether every chain has a kept state waiting."""
        return all(self.queues)

    def after_step(self, engine: EngineView, sampling: bool) -> None:
        """Count the step; queue the state of the chains whose draw it completes."""
        diverged = engine.monitor.draw_diverged.tolist()
        engine.monitor.start_draw()
        step_size = None
        for c, k in enumerate(self.thinning):
            self.since[c] += 1
            self.diverged[c] = self.diverged[c] or diverged[c]
            if self.since[c] < k or not sampling:
                continue
            if step_size is None:
                step_size = median_steps(engine)
            kept = {
                "flat": engine.position[c],
                "fixed": {name: value[c] for name, value in engine.fixed.items()},
                "value": engine.value[c],
                "step_size": float(step_size[c]),
                "diverged": self.diverged[c],
            }
            self.queues[c].append(kept)
            if not kept["diverged"]:
                self.recent[c] = [*self.recent[c], kept][-RETREAT_DEPTH:]
            self.since[c], self.diverged[c] = 0, False

    def retreat_point(self, chain: int) -> dict[str, Any] | None:
        """Where a chain whose steps all diverge goes back to: the oldest of its last
        :data:`RETREAT_DEPTH` kept states whose draws had no divergent step (``None`` before it
        has one). Not the last one: the step that ends a draw can be the one that reached the
        state from which every later step diverges."""
        recent = self.recent[chain]
        return recent[0] if recent else None

    def pop(self) -> list[dict[str, Any]]:
        """The oldest kept state of every chain."""
        return [queue.popleft() for queue in self.queues]

    def state_dict(self) -> dict[str, Any]:
        return {
            "thinning": list(self.thinning),
            "since": list(self.since),
            "diverged": list(self.diverged),
            "queues": [list(queue) for queue in self.queues],
            "recent": [list(kept) for kept in self.recent],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.thinning = list(state["thinning"])
        self.since, self.diverged = list(state["since"]), list(state["diverged"])
        self.queues = [deque(queue) for queue in state["queues"]]
        self.recent = [list(kept) for kept in state.get("recent", [[] for _ in self.thinning])]
