"""The kept draws and per-draw statistics of ``C`` chains, for both drivers."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .engine import DrawStats

__all__ = ["DrawRecorder"]

TensorDict = dict[str, torch.Tensor]

#: The per-draw statistics, as ArviZ names them in ``sample_stats``.
STAT_NAMES = ("lp", "step_size", "temperature", "diverging")


class DrawRecorder:
    """Collects kept draws (unconstrained, ``(C, ...)`` per site) and their statistics.

    Parameters
    ----------
    num_chains:
        :math:`C`.
    keep_draws:
        Keep the draws themselves (``False``: statistics only, for streaming runs).
    """

    def __init__(self, num_chains: int, keep_draws: bool = True) -> None:
        self.num_chains = num_chains
        self.keep_draws = keep_draws
        self.draws: list[TensorDict] = []
        self._stats: list[list[np.ndarray]] = [[] for _ in STAT_NAMES]
        #: ``(time.perf_counter(), count)`` at the first draw recorded in this process: the
        #: draws after it time a kept draw (a run until converged sizes its rounds with it)
        self.clock: tuple[float, int] | None = None

    @property
    def count(self) -> int:
        """Draws recorded so far."""
        return len(self._stats[0])

    def add(self, draw: TensorDict, stats: DrawStats) -> None:
        """Record one draw of every chain (the engine never changes a state in place, so the
        tensors are kept as they are)."""
        values = (
            -stats.potential_energy,
            stats.step_size,
            np.full(self.num_chains, stats.temperature),
            stats.diverging,
        )
        for column, value in zip(self._stats, values, strict=True):
            column.append(np.asarray(value))
        if self.keep_draws:
            self.draws.append(draw)
        if self.clock is None:
            self.clock = (time.perf_counter(), self.count)

    def stacked(self) -> TensorDict:
        """``(C, draws so far, ...)`` per site (empty without kept draws)."""
        if not self.draws:
            return {}
        return {name: torch.stack([d[name] for d in self.draws], 1) for name in self.draws[0]}

    def stats(self) -> dict[str, np.ndarray]:
        """``(C, draws so far)`` per statistic: ``lp`` (minus the minibatch potential),
        ``step_size``, ``temperature``, ``diverging``."""
        out = {}
        for name, column in zip(STAT_NAMES, self._stats, strict=True):
            dtype = bool if name == "diverging" else np.float64
            out[name] = (
                np.stack(column, 1).astype(dtype)
                if column
                else np.zeros((self.num_chains, 0), dtype=dtype)
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        """Draws and statistics so far, as tensors."""
        return {
            "draws": self.stacked(),
            "stats": {name: torch.from_numpy(value) for name, value in self.stats().items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (replacing what was recorded)."""
        stats = {name: value.numpy() for name, value in state["stats"].items()}
        self._stats = [[stats[name][:, i] for i in range(stats[name].shape[1])]
                       for name in STAT_NAMES]  # fmt: skip
        draws = state["draws"]
        count = next(iter(draws.values())).shape[1] if draws else 0
        self.draws = [{name: value[:, i] for name, value in draws.items()} for i in range(count)]
