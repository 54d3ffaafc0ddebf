"""The rounds of a run until converged: judge the draws, and size the next round.

:func:`~pyro_sgmcmc.inference.vectorized.run_chains` with ``target_ess`` or ``max_seconds``
judges its draws after its ``num_samples``
(:func:`~pyro_sgmcmc.analysis.function_space.run_verdict`) and, while they have not converged,
draws on in rounds: each as long as the verdict asks, at least a tenth and at most
:data:`ROUND_GROWTH` of the draws so far (in a run with a time budget, longer where judging so
short a round would cost more than about :data:`JUDGE_SHARE` of its time), within that budget
or :data:`ROUNDS_LIMIT` times the draws a chain needs. With the chains shared among the ranks of
a process group, every rank judges all chains and the ranks agree on each round.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ..analysis.diagnostics import Verdict
from ..analysis.function_space import HeldOutOutputDraws, OutputDraws, run_verdict, where_judged
from ..engine.distributed import gather_objects
from ..errors import DistributedRunError

__all__ = ["JUDGE_SHARE", "ROUNDS_LIMIT", "ROUND_GROWTH"]

#: Without ``max_seconds``, a run until converged (``target_ess``) stops at this many times
#: ``max(num_samples, target_ess / num_chains)`` draws per chain (a run that cannot converge
#: must still end).
ROUNDS_LIMIT = 10

#: A round adds at most this share of the draws so far. The verdict's "run about k times
#: longer" extrapolates the ESS in proportion to the draws; just after warm-up it grows faster
#: than that (the first draws still carry the chains' approach to each other), so a round of
#: the full k overshoots: on the demo's network, SGHMC's 200 draws asked for 327 more and the
#: run ended at an ESS of f(x) of 393 where 200 was asked; judged again after a quarter more
#: draws, it stopped at 313 draws (ESS 250), in 16 s instead of 26.
ROUND_GROWTH = 0.25

#: ... unless, in a run with a time budget (``max_seconds``), judging it would then take more
#: than about this share of the round's time, estimated from the last verdict's seconds per
#: draw, the new draws' outputs left out (they are evaluated once, however the rounds are
#: cut; the statistics over thousands of a classifier's outputs take seconds): the
#: round is then long enough for that share, or as long as the verdict asks or the budget
#: allows if that is shorter. Without a time budget the rounds depend on the verdicts alone, not
#: on timings, so that a resumed or distributed run draws the same rounds.
JUDGE_SHARE = 0.1


class _Rounds:
    """Judges a run after its draws and, for a run until converged, sizes its next round.

    With the chains shared among the ranks of a process group (``shared``: the run's
    checkpoint saver, which says where a failed run resumes from), every rank judges the draws
    of all chains (gathered), the ranks take rank 0's verdict and agree on each round's size,
    the smallest any rank's time budget allows: every rank draws the same rounds and stops
    together, with the verdict of the whole run.
    """

    def __init__(
        self, chains, recorder, target_ess, max_seconds, started: float, num_samples: int,
        num_chains: int, outputs: OutputDraws | HeldOutOutputDraws, shared: Any = None,
    ) -> None:  # fmt: skip
        self.shared = shared
        self.chains, self.recorder = chains, recorder
        # without a time budget, the rounds stop at ROUNDS_LIMIT times the draws a chain needs
        needed = max(num_samples, math.ceil((target_ess or 0) / num_chains))
        self.max_draws = None if max_seconds is not None else ROUNDS_LIMIT * needed
        self.target_ess, self.max_seconds = target_ess, max_seconds
        self.wanted = target_ess is not None or max_seconds is not None
        self.started = started
        # the kept draws' pace from the first one this process recorded (not from now: the
        # first round would be sized by the time of a verdict alone, and overrun the budget)
        self.kept_since = recorder.clock or (time.perf_counter(), recorder.count)
        self.outputs = outputs
        self.spent = False
        #: The time budget was spent by the run this one resumes: no more rounds.
        self.ended = False
        self.judged_at: list[int] = []
        #: seconds of the last verdict, and its draws per chain: a verdict over many outputs
        #: (a classifier's at a few hundred test rows) takes seconds, in proportion to draws
        self.last_judge: tuple[float, int] = (0.0, 1)
        #: the same, less the outputs of the new draws (each draw's are evaluated once): what
        #: judging all the draws again costs
        self.last_statistics: tuple[float, int] = (0.0, 1)

    def judge(self) -> Verdict:
        began = time.perf_counter()
        outputs_before = getattr(self.outputs, "seconds", 0.0)
        self.judged_at.append(self.recorder.count)
        samples = self.chains.constrain_kept(self.recorder.stacked())  # the result's bits
        if not samples:  # keep_draws=False: nothing to judge
            return Verdict(True, None, math.nan, math.nan, 1.0)
        if self.shared is not None:
            mine = {name: value.cpu() for name, value in samples.items()}
            parts = self._gather(mine, "gathering every rank's draws to judge them")
            device = next(iter(samples.values())).device
            samples = {
                name: torch.cat([part[name] for part in parts]).to(device) for name in samples
            }
        verdict = run_verdict(samples, self.chains.structure.model, self.outputs,
                              min_ess=self.target_ess)  # fmt: skip
        if self.shared is not None:  # one verdict for all: a network's outputs evaluated on
            # different devices may differ in the last bits, and the ranks must stop together
            verdict = self._gather(verdict, "agreeing on the verdict")[0]
        seconds, judged = time.perf_counter() - began, max(self.recorder.count, 1)
        self.last_judge = (seconds, judged)
        outputs_seconds = getattr(self.outputs, "seconds", 0.0) - outputs_before
        self.last_statistics = (max(seconds - outputs_seconds, 0.0), judged)
        return verdict

    def more_draws(self, verdict: Verdict) -> int:
        """As many draws as the verdict asks for (at least a tenth more, at most what
        :meth:`_round_cap` allows), within the budget
        (every rank's, where the chains are shared among ranks)."""
        more = self._more_draws(verdict)
        if self.shared is not None:
            more = min(self._gather(more, "agreeing on the next round's draws"))
            self.spent = self.spent or more == 0
        return more

    def any_rank(self, flag: bool, what: str) -> bool:
        """Whether ``flag`` holds on this process or, where the chains are shared among
        ranks, on any rank (every rank gets the same answer)."""
        return flag if self.shared is None else any(self._gather(flag, what))

    def _gather(self, value: Any, what: str) -> list[Any]:
        try:
            return gather_objects(value, what)
        except DistributedRunError as error:
            raise self.shared.failed(error) from error

    def _more_draws(self, verdict: Verdict) -> int:
        count = self.recorder.count
        per_draw = self._pace(count)
        # chains that do not move (an infinite R-hat): rounds of a finite size all the same
        longer = verdict.longer if math.isfinite(verdict.longer) else ROUNDS_LIMIT
        wanted = max(math.ceil(count * 1.1 * (longer - 1.0)), math.ceil(count / 10), 1)
        wanted = min(wanted, self._round_cap(count, per_draw))
        if self.max_draws is not None:
            if count >= self.max_draws:
                self.spent = True
                return 0
            return min(wanted, self.max_draws - count)
        if self.ended:
            self.spent = True
            return 0
        left = self.max_seconds - (time.perf_counter() - self.started)
        judge_seconds, judged = self.last_judge
        per_judged_draw = judge_seconds / judged  # the round's own verdict fits in the budget
        if per_draw is not None:
            room = left - per_judged_draw * count
            per_new_draw = per_draw + per_judged_draw
            fits = int(room / per_new_draw) if per_new_draw > 0 else wanted
        else:  # no draw timed in this process (resumed after its last one): a short round
            fits = math.ceil(count / 10) if left > 0 else 0
        if fits < math.ceil(count / 10):  # what is left is too short to change the verdict
            self.spent = True
            return 0
        return min(wanted, fits)

    def _pace(self, count: int) -> float | None:
        """Seconds per kept draw since the last round was sized, its verdict left out (``None``
        where no draw was timed in this process: resumed after its last one)."""
        now = time.perf_counter()
        since, drawn = self.kept_since
        self.kept_since = (now, count)
        if count <= drawn:
            return None
        return max(now - since - self.last_judge[0], 0.0) / (count - drawn)

    def _round_cap(self, count: int, per_draw: float | None) -> int | float:
        """The most draws the next round adds (see :data:`ROUND_GROWTH`, :data:`JUDGE_SHARE`;
        ``math.inf``: as many as the verdict asks, within the budget)."""
        cap = max(math.ceil(count * ROUND_GROWTH), 1)
        statistics_seconds, judged = self.last_statistics
        if self.max_seconds is None or per_draw is None or statistics_seconds <= 0.0:
            return cap
        # the next verdict's statistics, over count + n draws, at the last one's seconds per
        # draw (the new draws' outputs are evaluated however the rounds are cut):
        # per_judged * (count + n) <= JUDGE_SHARE * per_draw * n
        per_judged = statistics_seconds / judged
        spare = JUDGE_SHARE * per_draw - per_judged
        if spare <= 0.0:  # no round is long enough: the verdict and the budget decide
            return math.inf
        return max(cap, math.ceil(per_judged * count / spare))

    def message(self, verdict: Verdict) -> str:
        """The end-of-run warning of an unconverged run."""
        count = self.recorder.count
        text = f"run_chains: {count} draws per chain, {verdict}"
        if self.spent and self.max_draws is not None:
            text += (
                f" (stopped at {ROUNDS_LIMIT} times max(num_samples, target_ess / num_chains) "
                "draws; give max_seconds for a budget in time instead)"
            )
        elif self.spent:
            text += f" (the budget of max_seconds={self.max_seconds:g} is spent)"
        elif not self.wanted and verdict.longer_run_helps:
            text += " (run_chains(..., target_ess=...) draws until it has)"
        return text + where_judged(self.outputs, verdict)
