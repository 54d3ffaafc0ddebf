"""Helpers shared by the update rules: dictionaries of tensors, Gaussian noise, step sizes.

A step size may be a float (shared by every chain and coordinate) or a tensor that broadcasts
against the positions, e.g. shape ``(C, 1)`` for one step size per chain of a ``(C, D)`` stack.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import torch

from .metric import DenseMetric

TensorDict = dict[str, torch.Tensor]
StepSize = float | torch.Tensor


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


def is_scalar(value: object) -> bool:
    """Whether ``value`` is a plain real number (not a tensor)."""
    kind = type(value)
    if kind is float or kind is int:  # the common case, without the abstract-class check
        return True
    return isinstance(value, numbers.Real) and kind is not bool


def sqrt(value: StepSize) -> StepSize:
    """Square root of a float or a tensor (the noise scales of the update rules)."""
    return math.sqrt(value) if is_scalar(value) else value.sqrt()


def entry(values: float | Mapping[str, torch.Tensor] | None, name: str) -> StepSize | None:
    """The entry ``name`` of a per-site mapping, or the shared value itself."""
    if values is None or is_scalar(values) or isinstance(values, torch.Tensor):
        return values
    return values[name]


def noise_scale(
    step_size: StepSize, budget: StepSize, gradient_noise: float | Mapping[str, torch.Tensor]
) -> StepSize | dict[str, torch.Tensor]:
    r""":math:`\sqrt{2\epsilon (b - \hat\beta)_+}` before the preconditioner, shared or per entry.

    ``budget`` :math:`b` is the variance the dynamics must inject per unit step: :math:`T` for SGLD,
    :math:`\alpha T` for SGHMC with friction :math:`\alpha`; :math:`\hat\beta` is the part the
    stochastic gradient already supplies.
    """
    if is_scalar(gradient_noise):
        if not is_scalar(budget):  # one budget per chain (an adapted friction)
            return (2.0 * step_size * (budget - gradient_noise)).clamp_min(0.0).sqrt()
        if budget <= gradient_noise:  # nothing to inject (e.g. T = 0): no noise is drawn
            return 0.0
        return sqrt(2.0 * step_size * (budget - gradient_noise))
    return {
        name: (2.0 * step_size * (budget - beta)).clamp_min(0.0).sqrt()
        for name, beta in gradient_noise.items()
    }


def noise_std(scale: StepSize, preconditioner: torch.Tensor | DenseMetric | None) -> StepSize:
    r"""The factor of the standard normal draw of a preconditioned move: :math:`s P^{1/2}` for a
    diagonal :math:`P` (element-wise), :math:`s` itself for the identity or a dense metric (whose
    root then multiplies the draw)."""
    if preconditioner is None or isinstance(preconditioner, DenseMetric):
        return scale
    return scale * preconditioner.sqrt()


def noise_stds(
    position: Mapping[str, torch.Tensor],
    step_size: StepSize,
    budget: StepSize,
    gradient_noise: float | Mapping[str, torch.Tensor],
    preconditioner: Mapping[str, torch.Tensor | DenseMetric] | None,
) -> dict[str, StepSize] | None:
    r"""Per site of ``position``, :func:`noise_std` of the :func:`noise_scale` of a step that
    injects the variance ``budget`` :math:`b` per unit step, :math:`\sqrt{2\epsilon\,(b -
    \hat\beta)_+}`, and of the site's preconditioner; ``None`` if the step injects no noise."""
    scale = noise_scale(step_size, budget, gradient_noise)
    if not has_noise(scale):
        return None
    return {name: noise_std(entry(scale, name), entry(preconditioner, name)) for name in position}


def has_noise(scale: StepSize | Mapping[str, torch.Tensor]) -> bool:
    """Whether a noise scale may be non-zero (a tensor is assumed to be)."""
    return not is_scalar(scale) or scale > 0


def check_rule_arguments(**values: float | torch.Tensor) -> None:
    """Cheap scalar checks for the update rules; each message names the argument and range.

    ``step_size``, ``temperature`` and ``num_data`` must be ``>= 0`` (``num_data > 0``),
    ``friction`` and ``persistence`` lie in ``[0, 1]``, ``decay`` in ``[0, 1)``, ``epsilon > 0``.
    Tensors (per-chain step sizes) are produced by the samplers themselves and not checked here.
    """
    for name, value in values.items():
        if not is_scalar(value):
            continue
        if name in ("step_size", "temperature") and not value >= 0:
            raise ValueError(f"{name} must be >= 0 (allowed range [0, inf)), got {value}")
        if name in ("friction", "persistence") and not 0 <= value <= 1:
            raise ValueError(f"{name} must lie in [0, 1], got {value}")
        if name == "decay" and not 0 <= value < 1:
            raise ValueError(f"decay must lie in [0, 1), got {value}")
        if name in ("epsilon", "num_data") and not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
