"""Minibatches of the data plate, one stream per chain, saveable.

Every chain draws its rows from its own ``torch.Generator``, so chain ``c`` gets the same
minibatches whether it runs alone or stacked with others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

__all__ = ["BatchSampling", "Minibatcher"]

BatchSampling = Literal["epoch", "independent"]


class Minibatcher:
    """Row indices of ``C`` chains' minibatches, shape ``(C, B)``.

    ``"epoch"`` sampling cuts a fresh random permutation of the ``N`` rows into
    ``N // B`` batches (the remainder is dropped, so every batch has the same size and the
    likelihood the same ``N / B`` scale, and every row is equally likely in every batch);
    ``"independent"`` draws every batch afresh (rows distinct within a batch), so consecutive
    batches are independent and the minibatch noise is white in time, as the theory of constant
    SGD (Mandt et al., 2017) assumes. With epoch-wise reshuffling the noise of one epoch's batches
    sums to nearly zero, which shrinks the stationary spread of noise-free methods.

    Gradient measurements (the warm-up's noise and curvature probes) take their rows from
    :meth:`probe`, a second walk of the same kind through permutations of their own: each probe
    batch is a uniformly random set of ``B`` distinct rows, independent of the batches the chains
    step on, at the cost of one permutation per ``N // B`` probes rather than per probe.

    Parameters
    ----------
    num_data:
        ``N``.
    batch_size:
        ``B`` in ``[1, N]``; ``B = N`` gives the full data (:meth:`next` returns ``None``).
    generators:
        One generator per chain.
    sampling:
        ``"epoch"`` or ``"independent"``.
    """

    def __init__(
        self,
        num_data: int,
        batch_size: int,
        generators: Sequence[torch.Generator],
        sampling: BatchSampling = "epoch",
    ) -> None:
        self.num_data = num_data
        self.batch_size = batch_size
        self.generators = list(generators)
        self.sampling = sampling
        self.batches_per_epoch = num_data // batch_size
        self._permutations: torch.Tensor | None = None
        self._position = 0
        self._probe_permutations: torch.Tensor | None = None
        self._probe_position = 0

    @property
    def full_batch(self) -> bool:
        """Whether every batch is the whole data set."""
        return self.batch_size >= self.num_data

    def _permute(self) -> torch.Tensor:
        """One fresh permutation of the rows per chain, ``(C, N)``."""
        device = self.generators[0].device
        rows = [torch.randperm(self.num_data, generator=g, device=device) for g in self.generators]
        return rows[0].unsqueeze(0) if len(rows) == 1 else torch.stack(rows)

    def next(self) -> torch.Tensor | None:
        """The rows of every chain's next minibatch, ``(C, B)``; ``None`` for the full data."""
        if self.full_batch:
            return None
        if self.sampling == "independent":
            return self.independent()
        batch, self._permutations, self._position = self._walk(self._permutations, self._position)
        return batch

    def independent(self) -> torch.Tensor:
        """A batch drawn afresh for every chain, outside the epoch walk, ``(C, B)``."""
        return self._permute()[:, : self.batch_size]

    def probe(self) -> torch.Tensor:
        """Rows of every chain's next measurement batch, ``(C, B)``: ``B`` distinct rows
        uniformly at random, from a walk through permutations apart from the chains' batches
        (consecutive probe batches are disjoint until the walk needs a new permutation)."""
        batch, self._probe_permutations, self._probe_position = self._walk(
            self._probe_permutations, self._probe_position
        )
        return batch

    def _walk(
        self, permutations: torch.Tensor | None, position: int
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The next ``B`` rows of a walk through per-chain permutations (a fresh one when the
        current one has fewer than ``B`` rows left), the walk's permutations and new position."""
        if permutations is None or position + self.batch_size > self.num_data:
            permutations, position = self._permute(), 0
        end = position + self.batch_size
        return permutations[:, position:end], permutations, end

    def state_dict(self) -> dict:
        """The positions in the current epoch and probe walk (for checkpoints)."""
        return {
            "permutations": self._permutations,
            "position": self._position,
            "probe_permutations": self._probe_permutations,
            "probe_position": self._probe_position,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` (a state saved without a probe walk starts one)."""
        self._permutations = state["permutations"]
        self._position = state["position"]
        self._probe_permutations = state.get("probe_permutations")
        self._probe_position = state.get("probe_position", 0)
