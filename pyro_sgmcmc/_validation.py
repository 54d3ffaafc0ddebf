"""Argument checks shared by every public entry point.

Each check raises :class:`ValueError` (or :class:`TypeError`) whose message names the argument,
the value received and the allowed range, so that a user can fix the call without reading code.
"""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch


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


def _as_tensor(name: str, value: Any) -> Any:
    if isinstance(value, list):
        try:
            array = np.asarray(value)
        except ValueError as error:  # ragged nested lists
            raise ValueError(
                f"model argument {name} is a list that is not a rectangular array of numbers "
                f"({error}); pass a torch.Tensor"
            ) from error
        if array.dtype.kind not in "biuf":
            raise TypeError(
                f"model argument {name} is a list of {array.dtype} values; pass numbers (it is "
                "converted to a torch.Tensor) or a torch.Tensor"
            )
        value = array
    if isinstance(value, np.ndarray):
        kind = value.dtype.kind
        if kind == "f":
            return torch.as_tensor(value, dtype=torch.get_default_dtype())
        if kind in "iu":
            return torch.as_tensor(value.astype(np.int64))
        if kind == "b":
            return torch.as_tensor(value)
        raise TypeError(
            f"model argument {name} is a NumPy array of dtype {value.dtype}; only boolean, "
            "integer and floating arrays are converted to torch tensors"
        )
    return value


def as_tensor_arguments(args: tuple, kwargs: Mapping[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The model arguments with NumPy arrays and lists of numbers converted to torch tensors.

    Floating arrays become tensors of torch's default dtype (``float32`` unless changed, the dtype
    of the model's parameters), integer arrays ``int64`` (class labels, indices), boolean arrays
    ``bool``. Tensors and every other value are passed through unchanged; tuples are left alone
    (they are often settings, not data).

    Raises
    ------
    TypeError
        For an array or list of non-numeric values (strings, objects), naming the argument.
    ValueError
        For a ragged nested list.
    """
    converted = tuple(_as_tensor(f"args[{i}]", a) for i, a in enumerate(args))
    return converted, {k: _as_tensor(f"kwargs[{k!r}]", v) for k, v in kwargs.items()}


def check_options_not_model_parameters(
    caller: str, model: Callable[..., Any], given: Mapping[str, Any]
) -> None:
    """Refuse options of ``caller`` given a value (not ``None``) that are also parameters of the
    model: ``caller`` keeps them, so the model could never receive them.

    Raises
    ------
    TypeError
        Naming the option and the model's parameter of the same name.
    """
    signature = model_signature(model)
    if signature is None:
        return
    for name, value in given.items():
        if value is not None and name in signature.parameters:
            raise TypeError(
                f"{caller}: {name}= is an option of {caller}, but the model also has a "
                f"parameter {name!r}, which {caller} could then never pass to it: rename the "
                "model's parameter"
            )


def model_signature(model: Callable[..., Any]) -> inspect.Signature | None:
    """The signature a model is called with (a module's ``forward``), or ``None`` where it
    cannot be read."""
    target = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def check_model_kwargs(
    caller: str, options: Iterable[str], model: Callable[..., Any], kwargs: Mapping[str, Any]
) -> None:
    """Refuse keyword arguments that are neither options of ``caller`` nor model parameters.

    ``caller`` forwards its unknown keyword arguments to the model, so a misspelt option (e.g.
    ``num_step=5``) would otherwise reach the model and fail there, or worse, be swallowed by a
    model that takes ``**kwargs`` (then nothing can be checked and nothing is refused).

    Raises
    ------
    TypeError
        Naming the unknown argument, the closest option or parameter name, the caller's options
        and the model's parameters.
    """
    signature = model_signature(model)
    if signature is None:
        return
    parameters = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    accepted = [
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    options = sorted(options)
    for name in kwargs:
        if name in accepted:
            continue
        close = difflib.get_close_matches(name, [*options, *accepted], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TypeError(
            f"{caller}() got an unknown keyword argument {name!r}{hint} It is neither an option "
            f"of {caller} ({', '.join(options)}) nor a parameter of the model "
            f"({', '.join(accepted) or 'none'}), to which {caller} passes its other keyword "
            "arguments."
        )
