r"""The injected Gaussian noise of ``C`` chains, drawn from each chain's generator in blocks.

Every SG-MCMC step draws :math:`\xi_t \sim \mathcal N(0, I_D)` per chain. For a small network
the cost of a step is mostly per-call overhead, and one ``torch.randn`` call per chain and step
is a good part of it. :class:`GaussianNoise` draws ``K`` steps at a time per chain (``K`` from
the dimension alone, so a chain draws the same numbers whatever number of chains runs beside
it) and hands out one ``(C, D)`` slice per step. The numbers come from the chain's own
generator, which also draws its minibatches and Gibbs updates; the block not yet used is part
of the engine's state, so a resumed chain continues with exactly the noise it would have had.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["BLOCK_ENTRIES", "GaussianNoise"]

#: Numbers per chain in one block (at least one step's worth): 256 KiB of float32.
BLOCK_ENTRIES = 65536


class GaussianNoise:
    """Standard normal ``(C, D)`` draws, one per call, from ``C`` generators.

    Parameters
    ----------
    generators:
        One generator per chain.
    """

    def __init__(self, generators: Sequence[torch.Generator]) -> None:
        self.generators = list(generators)
        self.block: torch.Tensor | None = None  # (K, C, D)
        self.used = 0

    @staticmethod
    def steps_per_block(dimension: int) -> int:
        """``K``: as many steps as fit in :data:`BLOCK_ENTRIES` numbers, at least one."""
        return max(1, BLOCK_ENTRIES // max(dimension, 1))

    def __call__(self, like: torch.Tensor) -> torch.Tensor:
        """The next ``(C, D)`` draw, shaped, typed and placed like ``like``."""
        block = self.block
        if block is None or self.used == block.shape[0] or block.shape[1:] != like.shape:
            block = self.block = self._draw_block(like)
            self.used = 0
        self.used += 1
        return block[self.used - 1]

    def _draw_block(self, like: torch.Tensor) -> torch.Tensor:
        size = (self.steps_per_block(like.shape[1]), *like.shape[1:])
        draws = [
            torch.randn(size, generator=g, dtype=like.dtype, device=like.device)
            for g in self.generators
        ]
        return torch.stack(draws, dim=1)

    def state_dict(self) -> dict[str, Any]:
        """The draws of the current block not used yet (``None`` when there are none)."""
        left = None
        if self.block is not None and self.used < self.block.shape[0]:
            left = self.block[self.used :].clone()
        return {"left": left}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.block, self.used = state.get("left"), 0
