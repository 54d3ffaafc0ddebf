"""Helpers shared by the update rules: dictionaries of tensors and Gaussian noise."""

from __future__ import annotations

from collections.abc import Mapping

import torch

TensorDict = dict[str, torch.Tensor]


def standard_normal_like(
    tensors: Mapping[str, torch.Tensor], generator: torch.Generator | None
) -> TensorDict:
    """Draw one standard normal tensor of the same shape, dtype and device for each entry."""
    return {
        name: torch.randn(value.shape, generator=generator, dtype=value.dtype, device=value.device)
        for name, value in tensors.items()
    }


def resolve_noise(
    like: Mapping[str, torch.Tensor],
    generator: torch.Generator | None,
    noise: Mapping[str, torch.Tensor] | None,
) -> Mapping[str, torch.Tensor]:
    """Use the standard normal draws given in ``noise`` (for exact tests) or draw fresh ones."""
    if noise is not None:
        return noise
    return standard_normal_like(like, generator)
