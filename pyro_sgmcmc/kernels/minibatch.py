"""Minibatches drawn epoch by epoch without replacement."""

from __future__ import annotations

import torch


class EpochBatches:
    """Indices of minibatches of ``batch_size`` rows out of ``num_data``.

    Each epoch is a fresh random permutation cut into ``num_data // batch_size`` batches of equal
    size; the remainder of a permutation is dropped, so every batch has the same size (and the
    likelihood the same ``N / B`` scale) and each row is equally likely in every batch.

    Parameters
    ----------
    num_data:
        ``N``.
    batch_size:
        ``B`` in ``[1, N]``; ``B = N`` gives the full data (``next()`` returns ``None``).
    generator:
        Source of the permutations.
    """

    def __init__(self, num_data: int, batch_size: int, generator: torch.Generator) -> None:
        self.num_data = num_data
        self.batch_size = batch_size
        self.generator = generator
        self.batches_per_epoch = num_data // batch_size
        self._permutation: torch.Tensor | None = None
        self._position = 0

    @property
    def full_batch(self) -> bool:
        return self.batch_size >= self.num_data

    def next(self) -> torch.Tensor | None:
        """The indices of the next minibatch, or ``None`` for the full data set."""
        if self.full_batch:
            return None
        if self._permutation is None or self._position + self.batch_size > self.num_data:
            self._permutation = torch.randperm(self.num_data, generator=self.generator)
            self._position = 0
        batch = self._permutation[self._position : self._position + self.batch_size]
        self._position += self.batch_size
        return batch

    def state_dict(self) -> dict:
        """The position in the current epoch (for checkpoints)."""
        return {"permutation": self._permutation, "position": self._position}

    def load_state_dict(self, state: dict) -> None:
        self._permutation = state["permutation"]
        self._position = state["position"]


class IndependentBatches(EpochBatches):
    """Minibatches drawn independently at every step (rows distinct within a batch).

    Unlike :class:`EpochBatches`, consecutive batches are independent, so the minibatch gradient
    noise is white in time, as the theory of constant SGD (Mandt et al., 2017) assumes. (With
    epoch-wise reshuffling the noise of one epoch's batches sums to nearly zero, which shrinks
    the stationary spread of noise-free methods.)
    """

    def next(self) -> torch.Tensor | None:
        if self.full_batch:
            return None
        return torch.randperm(self.num_data, generator=self.generator)[: self.batch_size]
