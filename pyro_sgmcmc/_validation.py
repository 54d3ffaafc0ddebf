"""Argument checks shared by every public entry point.

Each check raises :class:`ValueError` (or :class:`TypeError`) whose message names the argument,
the value received and the allowed range, so that a user can fix the call without reading code.
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_real(name: str, value: Any) -> float:
    """Return ``value`` as a float, refusing non-numbers, NaN and infinities."""
    if not _is_real(value):
        raise TypeError(
            f"{name} must be a real number, got {value!r} of type {type(value).__name__}"
        )
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def check_positive(name: str, value: Any) -> float:
    """Return ``value`` as a float after checking that it lies in ``(0, inf)``."""
    value = check_real(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0 (allowed range (0, inf)), got {value}")
    return value


def check_nonnegative(name: str, value: Any) -> float:
    """Return ``value`` as a float after checking that it lies in ``[0, inf)``."""
    value = check_real(name, value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0 (allowed range [0, inf)), got {value}")
    return value


def check_interval(
    name: str,
    value: Any,
    low: float,
    high: float,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Return ``value`` as a float after checking that it lies in the stated interval."""
    value = check_real(name, value)
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must lie in {interval}, got {value}")
    return value


def check_positive_int(name: str, value: Any, *, minimum: int = 1) -> int:
    """Return ``value`` after checking that it is an integer ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value
