"""Inspect a Pyro model and check the data-plate contract the SG-MCMC kernels rely on.

The contract (see the "model contract" page of the docs):

* the observations sit inside one ``pyro.plate`` named ``subsample_plate`` (``"data"`` by default),
  declared with its full size ``N`` and **without** ``subsample_size``;
* the model indexes its data with the indices the plate yields, so that when the kernel
  conditions the plate's index site on a minibatch, only those rows are used and Pyro scales the
  likelihood by ``N / B``;
* every latent site lies outside that plate (a prior inside it would be scaled by ``N / B``) and
  is continuous.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pyro import poutine
from pyro.poutine.trace_struct import Trace
from pyro.poutine.util import site_is_subsample

from .errors import ModelContractError


@dataclass(frozen=True)
class ModelStructure:
    """What the kernels need to know about a model.

    Attributes
    ----------
    latent_sites:
        Names of the latent sample sites, in the order the model visits them.
    num_data:
        ``N``, the full size of the data plate.
    plate_name:
        Name of the data plate.
    observed_sites:
        Observed sites that sit inside the data plate.
    trace:
        A trace of the model on the full data with latent values drawn from the prior.
    """

    latent_sites: tuple[str, ...]
    num_data: int
    plate_name: str
    observed_sites: tuple[str, ...]
    trace: Trace


def _plate_names(trace: Trace) -> list[str]:
    names = []
    for site in trace.nodes.values():
        if site["type"] != "sample":
            continue
        for frame in site["cond_indep_stack"]:
            if frame.vectorized and frame.name not in names:
                names.append(frame.name)
    return names


def _in_plate(site: Mapping[str, Any], plate_name: str) -> bool:
    return any(frame.name == plate_name for frame in site["cond_indep_stack"])


def check_finite_data(args: tuple, kwargs: Mapping[str, Any]) -> None:
    """Refuse tensors in the model arguments that contain NaN or infinity, or are empty."""
    named = [(f"args[{i}]", a) for i, a in enumerate(args)] + [
        (f"kwargs[{k!r}]", v) for k, v in kwargs.items()
    ]
    for name, value in named:
        if isinstance(value, np.ndarray) and value.dtype.kind in "fc":
            value = torch.from_numpy(value)
        if isinstance(value, torch.Tensor):
            if value.numel() == 0:
                raise ValueError(f"model argument {name} is an empty tensor: the data set is empty")
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                bad = int((~torch.isfinite(value)).sum())
                raise ValueError(
                    f"model argument {name} contains {bad} NaN or infinite values; "
                    "clean or impute the data before sampling"
                )


def inspect_model(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    plate_name: str = "data",
) -> ModelStructure:
    """Trace ``model`` once and check the data-plate contract.

    Raises
    ------
    ModelContractError
        If there is no plate named ``plate_name``, if it was declared with a ``subsample_size``,
        if a latent site sits inside it, if a latent site is discrete, if the model has no latent
        site, or if the observations are not indexed by the plate's indices.
    """
    trace = poutine.trace(model).get_trace(*args, **kwargs)
    plate_site = trace.nodes.get(plate_name)
    if plate_site is None or not site_is_subsample(plate_site):
        raise ModelContractError(
            f"the model has no pyro.plate named {plate_name!r} (subsample_plate={plate_name!r}); "
            f"plates found: {_plate_names(trace) or 'none'}. Put the observations inside "
            f"`with pyro.plate({plate_name!r}, N) as idx:` or pass subsample_plate=<name>."
        )
    fn = plate_site["fn"]
    num_data = int(fn.size)
    if fn.subsample_size is not None and fn.subsample_size < fn.size:
        raise ModelContractError(
            f"pyro.plate({plate_name!r}, {num_data}, subsample_size={fn.subsample_size}) "
            "subsamples by itself; declare it without subsample_size: the kernel draws the "
            "minibatches (and the same model then runs under NUTS on the full data)."
        )
    if num_data < 1:
        raise ModelContractError(f"the data plate {plate_name!r} has size {num_data}: no data")
    _check_rows_against_plate(args, kwargs, plate_name, num_data)

    latent, observed = [], []
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site_is_subsample(site):
            continue
        if site["is_observed"]:
            if _in_plate(site, plate_name):
                observed.append(name)
            continue
        if _in_plate(site, plate_name):
            raise ModelContractError(
                f"latent site {name!r} is inside the data plate {plate_name!r}: its prior would be "
                "scaled by N/B on every minibatch. SG-MCMC supports global latent sites only; "
                "compute network outputs outside the plate and enter it only for observations."
            )
        support = site["fn"].support
        if support.is_discrete:
            raise ModelContractError(
                f"latent site {name!r} is discrete ({type(site['fn']).__name__}); SG-MCMC kernels "
                "need continuous latent sites (marginalise it out or make it observed)."
            )
        latent.append(name)
    if not latent:
        raise ModelContractError("the model has no latent sample sites to sample")
    if not observed:
        raise ModelContractError(
            f"no observed site sits inside the data plate {plate_name!r}; the kernels scale the "
            "likelihood of the observations in that plate by N/B."
        )
    _check_plate_indexing(model, args, kwargs, plate_name, num_data, trace, observed)
    return ModelStructure(tuple(latent), num_data, plate_name, tuple(observed), trace)


def _check_rows_against_plate(
    args: tuple, kwargs: Mapping[str, Any], plate_name: str, num_data: int
) -> None:
    """Refuse data with more rows than the plate: the model would silently use only some."""
    named = [(f"args[{i}]", a) for i, a in enumerate(args)] + [
        (f"kwargs[{k!r}]", v) for k, v in kwargs.items()
    ]
    for name, value in named:
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] > num_data:
            raise ModelContractError(
                f"model argument {name} has {value.shape[0]} rows but the data plate "
                f"{plate_name!r} has size {num_data}: only the first {num_data} rows would be "
                f"used. Declare pyro.plate({plate_name!r}, {value.shape[0]}) or pass fewer rows."
            )


def _check_plate_indexing(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    plate_name: str,
    num_data: int,
    trace: Trace,
    observed: list[str],
) -> None:
    """Run the model on a two-point minibatch and check that the observations follow it."""
    if num_data < 2:
        return
    probe = torch.tensor([0, num_data - 1])
    latent_values = {
        name: site["value"]
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
    }
    conditioned = poutine.condition(model, data={**latent_values, plate_name: probe})
    try:
        probe_trace = poutine.trace(conditioned).get_trace(*args, **kwargs)
        probe_trace.compute_log_prob()
    except (RuntimeError, ValueError, IndexError) as error:
        raise ModelContractError(
            f"the model fails when the plate {plate_name!r} is restricted to a minibatch "
            f"({type(error).__name__}: {error}). Index the data with the plate's indices: "
            f"`with pyro.plate({plate_name!r}, N) as idx: pyro.sample(..., obs=y[idx])`."
        ) from error
    for name in observed:
        site = probe_trace.nodes[name]
        frame = next(f for f in site["cond_indep_stack"] if f.name == plate_name)
        value = site["value"]
        dim = frame.dim - site["fn"].event_dim if frame.dim is not None else 0
        if value.dim() >= -dim and value.shape[dim] not in (1, len(probe)):
            raise ModelContractError(
                f"observed site {name!r} keeps {value.shape[dim]} rows along the plate "
                f"{plate_name!r} when the plate is restricted to {len(probe)} indices: the data "
                "are not indexed by the plate. Use `with pyro.plate(...) as idx: ... obs=y[idx]`."
            )


def resolve_batch_size(batch_size: int | None, num_data: int, plate_name: str = "data") -> int:
    """The minibatch size: ``batch_size`` checked against ``[1, N]``, or ``N`` if ``None``."""
    if batch_size is None:
        return num_data
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an integer in [1, N] or None, got {batch_size!r}")
    if not 1 <= batch_size <= num_data:
        raise ValueError(
            f"batch_size must lie in [1, N] = [1, {num_data}] (N is the size of the data plate "
            f"{plate_name!r}), got {batch_size}"
        )
    return batch_size
