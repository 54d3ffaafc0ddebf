"""Refuse training data given to the export that are not the data the result was fitted on.

``observed_data``, ``constant_data`` and ``log_likelihood`` (and with them ``az.loo`` and
``az.compare``) describe the data the posterior was fitted to; computed on other data they would
pass for them without a word. Every result keeps its data (``SVIResult.args``, a Pyro ``MCMC``
object's ``_args``, ``VectorizedResult.args``), so the export needs none. Given some anyway, it
compares them with the result's, argument by argument (:func:`check_fitted_data`): both calls
are bound to the model's signature with its defaults filled in, so the same data passed
positionally or by keyword, with a default spelled out, as NumPy arrays or Python numbers, inside
a dict, list or tuple, in another floating-point dtype (compared at the narrower one: NumPy data
are converted to float32) or on another device count as the same. Held-out data go in ``test=``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from .._validation import as_tensor_arguments, model_signature
from .export_xarray import _argument_names

__all__ = ["check_fitted_data", "describe_value"]

ADVICE = (
    "observed_data and log_likelihood (and az.loo on them) must describe the data the posterior "
    "was fitted to, and the result keeps them: leave out the data (to_inference_data(result) or "
    "to_inference_data(result, model)) to export the fit's own, pass held-out data as "
    "test=(x_test, y_test) (the predictions group), or sample or fit on these data to export them"
)


class _Argument(NamedTuple):
    """A model argument's value, and how the call passed it (for messages)."""

    value: Any
    label: str


def check_fitted_data(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    fitted_args: tuple,
    fitted_kwargs: Mapping[str, Any],
    fit: str,
) -> None:
    """Refuse the training arguments ``args``/``kwargs`` given to the export of a result fitted
    on ``fitted_args``/``fitted_kwargs`` unless they hold the same data (module docstring).

    Parameters
    ----------
    fit:
        What the result is, for the message: ``"the SVI fit"``, ``"the MCMC run"``, ...

    Raises
    ------
    ValueError
        Naming the first model argument that differs (``args[i] ('x')``, ``model_kwargs['y']``),
        how, and what to pass instead.
    """
    args, kwargs = as_tensor_arguments(tuple(args), dict(kwargs))
    fitted_args, fitted_kwargs = as_tensor_arguments(tuple(fitted_args), dict(fitted_kwargs))
    given = _bound(model, args, kwargs)
    fitted = _bound(model, fitted_args, fitted_kwargs)
    if given is None or fitted is None:  # the signature cannot take both: compare as passed
        given = _as_passed(model, args, kwargs)
        fitted = _as_passed(model, fitted_args, fitted_kwargs)
    for name in [*fitted, *(n for n in given if n not in fitted)]:
        problem = _problem(given.get(name), fitted.get(name), fit)
        if problem is not None:
            raise ValueError(f"{problem}. {ADVICE}")


def _bound(
    model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]
) -> dict[str, _Argument] | None:
    """The call's arguments by parameter name (``args[i]`` for those of ``*args``, the keyword
    for those of ``**kwargs``), defaults filled in; ``None`` where the signature cannot be read
    or does not take the call."""
    signature = model_signature(model)
    try:
        bound = signature.bind(*args, **kwargs) if signature is not None else None
    except TypeError:
        bound = None
    if bound is None:
        return None
    passed = set(bound.arguments)
    bound.apply_defaults()
    named: dict[str, _Argument] = {}
    position = 0
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            for item in value:
                named[f"args[{position}]"] = _Argument(item, f"args[{position}]")
                position += 1
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.update({k: _Argument(v, f"model_kwargs[{k!r}]") for k, v in value.items()})
        elif name in kwargs:
            named[name] = _Argument(value, f"model_kwargs[{name!r}]")
        elif name in passed:
            named[name] = _Argument(value, f"args[{position}] ({name!r})")
            position += 1
        else:
            named[name] = _Argument(value, f"model argument {name!r} (left out: its default)")
    return named


def _as_passed(
    model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]
) -> dict[str, _Argument]:
    """The call's arguments by the names of the model's leading parameters, or by keyword."""
    names = _argument_names(model, len(args))
    pairs = enumerate(zip(names, args, strict=True))
    named = {n: _Argument(v, f"args[{i}] ({n!r})") for i, (n, v) in pairs}
    named.update({k: _Argument(v, f"model_kwargs[{k!r}]") for k, v in kwargs.items()})
    return named


def _problem(given: _Argument | None, fitted: _Argument | None, fit: str) -> str | None:
    """How one argument of the export differs from the result's (``None`` if it does not)."""
    if given is None:
        kept = describe_value(fitted.value)
        return f"{fitted.label} is missing, but {fit} was fitted with {kept}"
    if fitted is None:
        return f"{given.label} was not an argument of {fit}"
    if _same_value(given.value, fitted.value):
        return None
    label, value, kept = given.label, given.value, fitted.value
    if _is_array(value) and _is_array(kept):
        given_values, fitted_values = _aligned(value, kept)
        if given_values.shape == fitted_values.shape:
            unequal = given_values != fitted_values
            return (
                f"{label} holds other values than the data {fit} was fitted on "
                f"({int(unequal.sum())} of {unequal.numel()} entries differ, shape "
                f"{tuple(unequal.shape)})"
            )
    if describe_value(value) == describe_value(kept):
        return f"{label} holds other values than {fit} was fitted on ({describe_value(kept)})"
    return f"{label} is {describe_value(value)}, but {fit} was fitted on {describe_value(kept)}"


def _is_array(value: Any) -> bool:
    return isinstance(value, torch.Tensor | np.ndarray)


def _same_value(given: Any, fitted: Any) -> bool:
    """Whether ``given`` holds the result's value ``fitted``: arrays, tensors and numbers of the
    same shape and values (:func:`_aligned`), dicts, lists and tuples item by item, any other
    value by ``==``."""
    if _is_array(given) or _is_array(fitted):
        try:
            given_values, fitted_values = _aligned(given, fitted)
        except (TypeError, ValueError, RuntimeError):  # not numbers
            return False
        return given_values.shape == fitted_values.shape and torch.equal(
            given_values, fitted_values
        )
    if isinstance(given, Mapping) and isinstance(fitted, Mapping):
        return given.keys() == fitted.keys() and all(
            _same_value(given[k], fitted[k]) for k in fitted
        )
    if isinstance(given, list | tuple) and isinstance(fitted, list | tuple):
        return len(given) == len(fitted) and all(map(_same_value, given, fitted))
    if given is fitted:
        return True
    try:
        return bool(given == fitted)
    except (TypeError, ValueError, RuntimeError):
        return False


def _aligned(given: Any, fitted: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Both values as tensors on the result's device, floating-point ones in the narrower of
    their two dtypes (a float64 array given again as NumPy is converted to float32), others in
    the dtype both promote to."""
    given_values = torch.as_tensor(given).detach()
    fitted_values = torch.as_tensor(fitted).detach()
    if given_values.is_floating_point() and fitted_values.is_floating_point():
        dtype = min(given_values.dtype, fitted_values.dtype, key=lambda d: torch.finfo(d).bits)
    else:
        dtype = torch.promote_types(given_values.dtype, fitted_values.dtype)
    return given_values.to(fitted_values.device, dtype), fitted_values.to(dtype)


def describe_value(value: Any) -> str:
    """A short description: shapes of arrays, sizes of containers, else a clipped ``repr``."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape}"
    if isinstance(value, Mapping):
        return f"a dict of {len(value)} entries ({', '.join(map(repr, list(value)[:5]))})"
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
