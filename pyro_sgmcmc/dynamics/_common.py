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


def check_rule_arguments(**values: float) -> None:
    """Cheap scalar checks for the update rules; each message names the argument and range.

    ``step_size``, ``temperature`` and ``num_data`` must be ``>= 0`` (``num_data > 0``),
    ``friction`` and ``persistence`` lie in ``[0, 1]``, ``decay`` in ``[0, 1)``, ``epsilon > 0``.
    """
    for name, value in values.items():
        if name in ("step_size", "temperature") and not value >= 0:
            raise ValueError(f"{name} must be >= 0 (allowed range [0, inf)), got {value}")
        if name in ("friction", "persistence") and not 0 <= value <= 1:
            raise ValueError(f"{name} must lie in [0, 1], got {value}")
        if name == "decay" and not 0 <= value < 1:
            raise ValueError(f"decay must lie in [0, 1), got {value}")
        if name in ("epsilon", "num_data") and not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
