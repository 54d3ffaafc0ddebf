"""The flat layout of the sampled sites: ``C`` chains' positions as one ``(C, D)`` tensor.

Concatenating the sites of each chain into one row lets the element-wise update rules act on the
whole state in a handful of kernel launches per step, whatever the number of sites.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import torch

__all__ = ["FlatLayout"]


@dataclass(frozen=True)
class FlatLayout:
    """Names and shapes of the sites that make up a flat position vector.

    Attributes
    ----------
    shapes:
        Shape of one chain's value of each site, in order.
    """

    shapes: dict[str, torch.Size]

    @property
    def names(self) -> tuple[str, ...]:
        """The site names, in order."""
        return tuple(self.shapes)

    @cached_property
    def sizes(self) -> list[int]:
        """Number of coordinates of each site."""
        return [math.prod(shape) for shape in self.shapes.values()]

    @cached_property
    def _items(self) -> tuple[tuple[str, torch.Size], ...]:
        return tuple(self.shapes.items())

    @property
    def dimension(self) -> int:
        """``D``, the total number of coordinates."""
        return sum(self.sizes)

    @cached_property
    def _vectors(self) -> frozenset[str]:
        """The sites whose values are vectors: their rows of a ``(C, D)`` tensor need no
        reshaping (a per-step saving of one call each)."""
        return frozenset(name for name, shape in self.shapes.items() if len(shape) == 1)

    def flatten(self, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(C, D)`` from per-site values of shape ``(C, *shape)``."""
        parts = [values[name] for name in self.shapes]
        parts = [part if part.dim() == 2 else part.reshape(part.shape[0], -1) for part in parts]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-site views ``(..., *shape)`` of a ``(..., D)`` tensor."""
        parts = torch.split_with_sizes(flat, self.sizes, dim=-1)  # no Python-level wrapper
        if flat.dim() == 2:
            vectors = self._vectors
            return {
                name: part if name in vectors else part.reshape(part.shape[0], *shape)
                for (name, shape), part in zip(self._items, parts, strict=True)
            }
        lead = flat.shape[:-1]
        return {
            name: part.reshape(lead + shape)
            for (name, shape), part in zip(self._items, parts, strict=True)
        }

    def sites_where(self, mask: torch.Tensor) -> list[str]:
        """Names of the sites with at least one ``True`` coordinate in the ``(..., D)`` mask."""
        parts = mask.reshape(-1, self.dimension).any(0).split(self.sizes)
        return [name for name, part in zip(self.shapes, parts, strict=True) if bool(part.any())]
