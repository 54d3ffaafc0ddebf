"""Refuse draws, models and data that do not belong together, and fingerprint a model.

The export (:mod:`pyro_sgmcmc.analysis.export`) computes every group by tracing the model given with
the draws of a run: these checks make sure that the draws are draws of that model's latent sites,
that the model is the run's (:func:`model_fingerprint`), and that the training and test data are
finite, shaped like each other and inside the support of their distributions (module docstring of
:mod:`pyro_sgmcmc.analysis.export`, "Checks"). A data problem is a :class:`_DataError`, a
``ValueError`` the trace pass (:mod:`~pyro_sgmcmc.analysis.export_trace`) passes on unwrapped.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from pyro import poutine
from pyro.distributions import constraints as dist_constraints
from pyro.poutine.messenger import unwrap
from pyro.poutine.util import site_is_subsample

from .._validation import as_tensor_arguments
from ..errors import ModelMismatchError, ModelMismatchWarning
from ..models.structure import GlobalSitesFirst
from ..nn.mlp import ACTIVATIONS, BayesianMLP
from .export_xarray import _argument_names

__all__ = ["checked_test_set", "model_fingerprint"]


class _DataError(ValueError):
    """A data problem the export found and described itself (not wrapped again)."""


def _activation_name(activation: Callable[..., Any]) -> str:
    for name, fn in ACTIVATIONS.items():
        if fn is activation:
            return name
    return model_fingerprint(activation)  # a user's callable: its name and a hash of its code


def model_fingerprint(model: Callable[..., Any]) -> str:
    """A text that identifies what ``model`` computes, as far as it can be read off the object.

    * :class:`~pyro_sgmcmc.nn.BayesianMLP`: its ``repr`` (layer sizes, likelihood, prior,
      likelihood temperature) and its activation: everything its density depends on.
    * another ``torch.nn.Module``: its class and ``repr`` (sub-modules and their sizes).
    * a function: its qualified name and a hash of its byte code, constants and names.
    * a function wrapped in Pyro handlers: ``wrapped`` and the fingerprint of the function.
    * :class:`~pyro_sgmcmc.models.structure.GlobalSitesFirst` (what NUTS runs a module as): the
      fingerprint of its module, whose density it is.
    """
    if isinstance(model, GlobalSitesFirst):
        return model_fingerprint(model.module)
    if isinstance(model, BayesianMLP):
        return f"{model!r} activation={_activation_name(model.activation)}"
    if isinstance(model, torch.nn.Module):
        return f"{type(model).__module__}.{type(model).__qualname__}: {model!r}"
    base = unwrap(model)
    if base is not model:
        return f"wrapped {model_fingerprint(base)}"
    code = getattr(model, "__code__", None)
    name = f"{getattr(model, '__module__', '?')}.{getattr(model, '__qualname__', repr(model))}"
    if code is None:
        return name
    text = code.co_code + repr((code.co_consts, code.co_names)).encode()
    digest = hashlib.sha256(text).hexdigest()[:12]
    return f"{name} (code {digest})"


def _latent_shapes(model, args, kwargs) -> dict[str, tuple[int, ...]]:
    """Shape of one draw of each latent site the model samples (enumerated sites left out)."""
    with torch.no_grad():
        trace = poutine.trace(model).get_trace(*args, **kwargs)
    return {
        name: tuple(site["value"].shape)
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and not site["is_observed"]
        and not site_is_subsample(site)
        and not site["infer"].get("enumerate")
    }


def _check_draws_match_model(model, samples: Mapping[str, torch.Tensor], args, kwargs) -> None:
    """Refuse draws that are not draws of ``model``'s latent sites (names and shapes)."""
    expected = _latent_shapes(model, args, kwargs)
    missing = sorted(set(expected) - set(samples))
    unknown = sorted(set(samples) - set(expected))
    wrong = {
        name: (tuple(samples[name].shape[2:]), shape)
        for name, shape in expected.items()
        if name in samples and tuple(samples[name].shape[2:]) != shape
    }
    if not (missing or unknown or wrong):
        return
    problems = []
    if missing:
        problems.append(
            f"the model samples {missing}, which the draws lack (they would be redrawn from the "
            "prior for every draw)"
        )
    if unknown:
        problems.append(f"the draws hold {unknown}, which the model does not sample")
    for name, (got, want) in wrong.items():
        problems.append(f"site {name!r} has draws of shape {got}, the model's has shape {want}")
    raise ModelMismatchError(
        "the model is not the model of these draws: " + "; ".join(problems) + ". Pass the model "
        "the inference ran on (and all its sites: no MCMC save_params subset)."
    )


def _check_same_model(model, source_model) -> None:
    """Refuse (BayesianMLP) or warn about a model other than the run's with another fingerprint."""
    if source_model is None or model is source_model:
        return
    given, original = model_fingerprint(model), model_fingerprint(source_model)
    if given == original:
        return
    message = (
        f"the model passed ({given}) differs from the model of the run ({original}); the "
        "log-likelihood and predictive groups are computed with the model passed"
    )
    if isinstance(model, BayesianMLP) and isinstance(source_model, BayesianMLP):
        raise ModelMismatchError(
            f"{message}, which for two BayesianMLP means another density. Pass the run's model, "
            "or check_model=False if this is intended."
        )
    warnings.warn(
        f"{message}; pass check_model=False if this is intended.",
        ModelMismatchWarning,
        # the caller of to_inference_data: through _inputs, build_groups and its decorator
        stacklevel=6,
    )


def _check_finite(label: str, values: tuple, kwargs: Mapping[str, Any]) -> None:
    """Refuse empty tensors and NaN or infinite values in ``label`` (``args`` or ``test``)."""
    keywords = "model_kwargs" if label == "args" else f"{label}_kwargs"
    named = [(f"{label}[{i}]", v) for i, v in enumerate(values)]
    named += [(f"{keywords}[{k!r}]", v) for k, v in kwargs.items()]
    for name, value in named:
        if not isinstance(value, torch.Tensor):
            continue
        if value.numel() == 0:
            raise _DataError(f"{name} is an empty tensor (shape {tuple(value.shape)})")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).sum())
            raise _DataError(
                f"{name} contains {bad} NaN or infinite value(s) of {value.numel()}; clean or "
                "impute the data before exporting"
            )


def checked_test_set(
    model: Callable[..., Any], test: Any, test_kwargs: Any, args: tuple
) -> tuple[tuple, dict[str, Any]] | None:
    """``(test, test_kwargs)`` as tensors (``None`` without ``test``), refused before a run
    rather than after it if they cannot be a test set of the training arguments ``args``.

    Raises
    ------
    ValueError
        ``test`` not a tuple of model arguments, ``test_kwargs`` not a mapping or given without
        ``test``, an empty tensor, NaN or infinite values, or a test tensor whose dimensions
        other than the rows differ from its training argument's.
    """
    if test is None:
        if test_kwargs is not None:
            raise ValueError("test_kwargs was given without test: give test=(x_test, ...) too")
        return None
    if not isinstance(test, tuple):  # as the export refuses it
        raise ValueError(f"test must be a tuple of model arguments, got {type(test).__name__}")
    if test_kwargs is not None and not isinstance(test_kwargs, Mapping):
        raise ValueError(f"test_kwargs must be a mapping or None, got {type(test_kwargs).__name__}")
    test, test_kwargs = as_tensor_arguments(test, dict(test_kwargs or {}))
    _check_finite("test", test, test_kwargs)
    _check_test_like_training(model, test, args)
    return test, test_kwargs


def _check_test_like_training(model, test: tuple, args: tuple) -> None:
    """Every test tensor must have the training tensor's dimensions apart from the rows, and
    test tensors whose training tensors share their rows (inputs and targets) the same rows."""
    names = _argument_names(model, len(args))
    paired = []
    for i, (value, train) in enumerate(zip(test, args, strict=False)):
        if not (isinstance(value, torch.Tensor) and isinstance(train, torch.Tensor)):
            continue
        if value.dim() != train.dim() or value.shape[1:] != train.shape[1:]:
            raise _DataError(
                f"test[{i}] has shape {tuple(value.shape)} but the training argument "
                f"{names[i]!r} has shape {tuple(train.shape)}: every dimension but the first "
                "(the rows) must agree"
            )
        if value.dim() > 0:
            paired.append((i, value.shape[0], train.shape[0]))
    first: dict[int, tuple[int, int]] = {}  # training rows -> the first test tensor with them
    for j, rows_j, train_rows in paired:
        i, rows_i = first.setdefault(train_rows, (j, rows_j))
        if rows_i != rows_j:
            raise _DataError(
                f"test[{i}] has {rows_i} rows but test[{j}] has {rows_j}: the training "
                f"arguments {names[i]!r} and {names[j]!r} have the same rows ({train_rows}), "
                "so the test set's must agree"
            )


def _check_support(label: str, name: str, site: Mapping[str, Any], obs: torch.Tensor) -> None:
    """Refuse observed values outside the support of their distribution (e.g. a class label
    outside ``[0, K)`` for a Categorical)."""
    fn = site["fn"]
    try:
        inside = fn.support.check(obs)
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        return
    if bool(torch.as_tensor(inside).all()):
        return
    outside = ~torch.as_tensor(inside)
    values = obs[outside] if outside.shape == obs.shape else obs
    example = values.reshape(-1)[:3].tolist()
    hint = ""
    if isinstance(fn.support, dist_constraints.integer_interval):
        hint = " (class labels must be integers in [0, K) for K classes)"
    raise _DataError(
        f"{label}: the observed site {name!r} has {int(outside.sum())} value(s) outside the "
        f"support {fn.support} of its {type(fn).__name__} distribution{hint}, e.g. {example}"
    )
