r"""Send a chain whose fit collapsed during warm-up back to where it last fitted the data.

On realistic data a chain can leave the posterior during the adaptive warm-up's first windows:
on heavy-tailed inputs a cascade of runaway moves throws it to where the likelihood is nearly
flat, a Gibbs-sampled noise precision follows the bad fit down, and no later step brings it
back. The fit check (:mod:`.fit_check`) names such a chain at the end of warm-up; this module
repairs it while there is still warm-up left.

:class:`FitRecovery` averages each chain's minibatch potential :math:`\tilde U` over the last
quarter of the descent and of each adaptation window. At the end of the first two windows a
chain whose average lies above the lowest one it had at an earlier milestone by more than
sampling explains,

.. math::

    \bar U_\text{now} - \bar U_\text{best} > T\,\bigl(D/2 + 10\sqrt{D/2}\bigr) + N/2
    + 5\,\sqrt{s^2_\text{now} + s^2_\text{best}},

(a posterior draw's potential lies :math:`T\chi^2_D/2` above its minimum; half a nat per row
more; five standard errors of the two averages) is put back at that milestone's position and
Gibbs values, momenta at rest. If it also diverged in the window, the warm-up drops the
window's measurements for it (probes taken along a runaway cascade would freeze the chain) and
halves its step; if it did not, it had heated up steadily with steps too large for where
sampling took it, and the window's measurements, which shrink them, are kept. The report at the
end of warm-up says which chains went back, from where and to where. A healthy chain is never
moved, so its path is the same as without this module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

# the fit check's margin (nats per row beyond sampling) and standard errors to clear
from .fit_check import MARGIN, Z

#: Fewest potentials in a segment for its average to be compared.
MIN_COUNT = 10


class FitRecovery:
    """Averages of each chain's minibatch potential before each window end, and which chains
    collapsed since their best milestone.

    Parameters
    ----------
    window_ends:
        The gradient steps at which the descent and the adaptation windows end (the last is the
        end of warm-up); a milestone is kept at each but the last.
    num_chains, dimension, num_data:
        :math:`C`, the number of moving coordinates :math:`D` and of data rows :math:`N`.
    temperature:
        :math:`T`.
    """

    def __init__(
        self,
        window_ends: Sequence[int],
        num_chains: int,
        dimension: int,
        num_data: int,
        temperature: float,
    ) -> None:
        self.set_window_ends(window_ends)
        self.allowed = temperature * (dimension / 2 + 10 * math.sqrt(dimension / 2))
        self.allowed += MARGIN * num_data
        zeros = torch.zeros(num_chains, dtype=torch.float64)
        self.sum, self.square, self.count = zeros.clone(), zeros.clone(), 0
        # per milestone: (C,) average and (C,) standard error of the potential before it
        self.levels: list[tuple[torch.Tensor, torch.Tensor]] | None = []
        # (chain index, step, average now, best average, milestone index): chains sent back
        self.returns: list[tuple[int, int, float, float, int]] = []
        self._pending: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)

    def set_window_ends(self, window_ends: Sequence[int]) -> None:
        """The window ends, and the last quarter of each window, whose potentials are averaged
        (again where the warm-up was lengthened with more windows)."""
        self.window_ends = list(window_ends)
        starts = [0, *self.window_ends[:-1]]
        self.segment_starts = [end - max(1, (end - start) // 4) for start, end in
                               zip(starts, self.window_ends, strict=True)]  # fmt: skip

    def observe(self, t: int, value: torch.Tensor | None) -> None:
        """Add step ``t``'s ``(C,)`` minibatch potentials if ``t`` lies in a measured segment."""
        if value is None or self.levels is None:
            return
        measured = zip(self.segment_starts[:-1], self.window_ends[:-1], strict=True)
        if any(start < t <= end for start, end in measured):
            value = value.detach().double()  # summed on its device: no copy per step
            if self.sum.device != value.device:
                self.sum, self.square = self.sum.to(value.device), self.square.to(value.device)
            self.sum += value
            self.square += value.square()
            self.count += 1

    def collapsed(self, t: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """At window end ``t``: the ``(C,)`` mask of chains whose fit collapsed and, for each,
        the index of its best earlier milestone; ``None`` when none did (or there is too little
        to compare). Closes the segment either way: call :meth:`keep` next."""
        level, error = self._close_segment()
        self._pending = (level, error)
        if level is None or not self.levels:
            return None
        averages = torch.stack([average for average, _ in self.levels])
        errors = torch.stack([spread for _, spread in self.levels])
        best = averages.argmin(0)
        chains = torch.arange(averages.shape[1])
        rise = level - averages[best, chains]
        bound = self.allowed + Z * (error.square() + errors[best, chains].square()).sqrt()
        mask = rise > bound
        if not bool(mask.any()):
            return None
        for c in mask.nonzero().flatten().tolist():
            index = int(best[c])
            self.returns.append((c, t, float(level[c]), float(averages[index, c]), index))
        level[mask] = averages[best, chains][mask]
        error[mask] = errors[best, chains][mask]
        return mask, best

    def keep(self) -> None:
        """Record the segment just closed as the level of the milestone kept now."""
        level, error = self._pending
        if self.levels is None:
            return
        if level is None:  # too few steps to measure: this milestone is never the best
            level = torch.full_like(self.sum, math.inf)
            error = torch.zeros_like(self.sum)
        self.levels.append((level, error))

    def forget(self, chains: torch.Tensor) -> None:
        """Never send the chains of the ``(C,)`` mask back to a milestone kept so far: they were
        moved on purpose (a network's units started afresh, :mod:`.unit_restart`), and a place they
        were before is not where they should return to."""
        if not self.levels:
            return
        chains = chains.to(torch.bool).cpu()
        self.levels = [
            (torch.where(chains, math.inf, level), torch.where(chains, 0.0, error))
            for level, error in self.levels
        ]

    def _close_segment(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        count = self.count
        mean = self.sum / max(count, 1)
        variance = (self.square / max(count, 1) - mean.square()).clamp_min(0.0)
        self.sum, self.square, self.count = torch.zeros_like(mean), torch.zeros_like(mean), 0
        if count < MIN_COUNT or self.levels is None:
            return None, None
        return mean.cpu(), (variance / count).sqrt().cpu()

    def report(self, labels: Sequence[str], chain_ids: Sequence[int]) -> list[str]:
        """One line per chain sent back: from where, to where, the two averages."""
        lines = []
        for c, t, now, then, index in self.returns:
            fraction = 100 * t / self.window_ends[-1]
            lines.append(
                f"chain {chain_ids[c]} left the posterior during warm-up: its average "
                f"minibatch potential rose from {then:.6g} at {labels[index]} to {now:.6g} at "
                f"{fraction:.0f}% of warm-up, more than sampling explains (T (D/2 + 10 "
                f"sqrt(D/2)) + N/2 = {self.allowed:.6g}); it was put back where it was at "
                f"{labels[index]} and warmed up again from there"
            )
        return lines

    def state_dict(self) -> dict[str, Any]:
        return {
            "sum": self.sum.clone(), "square": self.square.clone(), "count": self.count,
            "levels": None if self.levels is None else list(self.levels),
            "returns": list(self.returns),
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Load a state; ``None`` (a checkpoint written before this module) turns recovery off
        for the rest of the warm-up, as its milestones have no levels."""
        if state is None:
            self.levels = None
            return
        self.sum, self.square = state["sum"].clone(), state["square"].clone()
        self.count = state["count"]
        self.levels = None if state["levels"] is None else list(state["levels"])
        self.returns = [tuple(entry) for entry in state["returns"]]
