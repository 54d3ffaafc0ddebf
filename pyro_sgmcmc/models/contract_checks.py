"""Checks of the model contract that name what is wrong: an observation that broadcasts its
distribution, a plate asking for more rows than it has, a prior computed from data that are
sliced to each minibatch, a latent site inside the data plate, data that are not finite, or of
another floating dtype than the model, observations whose log-likelihood cannot be computed
(integer labels for a ``Bernoulli``). :mod:`.structure` runs them while it inspects a model."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from pyro import poutine
from pyro.poutine.messenger import Messenger
from pyro.poutine.trace_struct import Trace
from pyro.poutine.util import site_is_subsample

from ..errors import ModelContractError


class SlicedPlate(Protocol):
    """What :func:`check_priors_ignore_slicing` reads of a data plate
    (:class:`~pyro_sgmcmc.models.structure.DataPlate`)."""

    num_data: int
    data_args: tuple[int | str, ...]

    def bind(
        self, model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any], rows: Any
    ) -> tuple[Callable[..., Any], tuple, dict[str, Any]]: ...


class CheckSubsampleSize(Messenger):
    """Refuse a plate whose ``subsample_size`` exceeds its size, by name (Pyro's own error blames
    a guide: "Did you accidentally use different subsample_size in the model and guide?")."""

    def _pyro_sample(self, msg) -> None:
        fn = msg["fn"]
        if site_is_subsample(msg) and (fn.subsample_size or 0) > fn.size > 0:
            raise ModelContractError(
                f"pyro.plate({msg['name']!r}, {fn.size}, subsample_size={fn.subsample_size}): "
                f"subsample_size must be at most the plate's size {fn.size} (it is the largest "
                "minibatch; the kernel's batch_size may be smaller)"
            )


def check_observation_shape(name: str, site: Mapping[str, Any]) -> None:
    """Refuse an observation that broadcasts its distribution to more log-likelihood terms than
    the distribution has (e.g. ``y`` of shape ``(N, 1)`` against a mean of shape ``(N,)``: the
    log-likelihood would be ``(N, N)``, every target paired with every row's mean)."""
    fn, value = site["fn"], site["value"]
    if not isinstance(value, torch.Tensor):
        return
    event_dim = len(fn.event_shape)
    value_batch = value.shape[: value.dim() - event_dim] if event_dim else value.shape
    try:
        terms = torch.broadcast_shapes(value_batch, fn.batch_shape)
    except RuntimeError:
        return  # Pyro's own shape error follows, naming the shapes
    if terms != fn.batch_shape:
        raise ModelContractError(
            f"observed site {name!r}: the observations have shape {tuple(value.shape)} but the "
            f"distribution ({type(fn).__name__}) has batch shape {tuple(fn.batch_shape)} and "
            f"event shape {tuple(fn.event_shape)}, so its log-likelihood would broadcast to "
            f"{tuple(terms)} terms, each observation paired with every row. Give the "
            "observations the distribution's shape (e.g. y.squeeze(-1), or a mean with "
            "a trailing dimension)"
        )


def check_priors_ignore_slicing(
    plate: SlicedPlate,
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    rows: torch.Tensor,
    trace: Trace,
    latent: Sequence[str],
) -> None:
    """Refuse an idiom (a) model whose prior of a latent site is computed from the data it
    receives (e.g. ``Normal(y.mean(), 1)`` outside the plate): sliced to a minibatch, those data
    change on every step, and with them the prior the chain samples."""
    bound, bound_args, bound_kwargs = plate.bind(model, args, kwargs, rows)
    values = {name: trace.nodes[name]["value"] for name in latent}
    with torch.no_grad():
        probe = poutine.trace(poutine.condition(bound, data=values)).get_trace(
            *bound_args, **bound_kwargs
        )
        for name in latent:
            if name not in probe.nodes:  # drawn only on some data: nothing to compare
                continue
            whole = trace.nodes[name]["fn"].log_prob(values[name]).sum()
            cut = probe.nodes[name]["fn"].log_prob(values[name]).sum()
            if not torch.isclose(whole, cut, rtol=1e-5, atol=1e-6):
                sliced = ", ".join(
                    f"args[{key}]" if isinstance(key, int) else key for key in plate.data_args
                )
                raise ModelContractError(
                    f"the prior of latent site {name!r} depends on the data arguments "
                    f"({sliced}), which are sliced to each minibatch (a plate sized "
                    f"from the data): its log-density at the same value is {float(whole):.6g} on "
                    f"all {plate.num_data} rows and {float(cut):.6g} on {len(rows)} rows, so the "
                    "chain would sample a prior that changes every step. Compute the prior's "
                    "parameters outside the model and pass them in, or index the plate "
                    "(`with pyro.plate('data', N) as idx: ... obs=y[idx]`), which leaves the "
                    "arguments whole"
                )


def latent_in_data_plate(name: str, plate_name: str, trace: Trace) -> ModelContractError:
    """The refusal of latent site ``name`` inside the data plate, with the rewrite that fits: a
    plate of its own for per-group values, ``poutine.mask`` for the latent that ``obs_mask``
    creates."""
    base = name.removesuffix("_unobserved")
    if base != name and f"{base}_observed" in trace.nodes:
        return ModelContractError(
            f"latent site {name!r} is the one Pyro creates for the rows that obs_mask marks "
            f"missing in {base!r} (one value per masked row, imputed by sampling); SG-MCMC "
            "samples global latent sites only. To leave the masked rows out of the likelihood "
            "instead, mask them: `with poutine.mask(mask=mask[idx]): pyro.sample("
            f"{base!r}, ..., obs=y[idx])` (any placeholder value in y's masked rows)."
        )
    fn = trace.nodes[name]["fn"]
    if fn.support.is_discrete:  # a per-row assignment (a mixture's z): no plate of its own helps
        return ModelContractError(
            f"latent site {name!r} inside the data plate {plate_name!r} is discrete "
            f"({type(fn).__name__}), one value per row: SG-MCMC kernels need continuous global "
            "latent sites. Marginalise it out (a mixture: `dist.MixtureSameFamily`, or sum "
            "its log-probabilities with `torch.logsumexp` in a `pyro.factor`), or use Pyro's "
            "NUTS with enumeration (`@config_enumerate`, `infer={'enumerate': 'parallel'}`)."
        )
    return ModelContractError(
        f"latent site {name!r} is inside the data plate {plate_name!r}: its prior would be "
        "scaled by N/B on every minibatch. SG-MCMC supports global latent sites only: sample "
        "it before the plate; one value per group or row (eight schools' theta) goes in a plate "
        "of its own before the data plate, `with pyro.plate('groups', J): theta = "
        "pyro.sample(...)`, indexed by the data plate's rows: `with pyro.plate('data', N) as "
        "idx: ... theta[group[idx]] ..., obs=y[idx])`."
    )


def named_arguments(args: tuple, kwargs: Mapping[str, Any]) -> list[tuple[int | str, str, Any]]:
    """The model's arguments as ``(key, name, value)``: the position or keyword, the name
    messages give it (``args[0]``, ``kwargs['x']``), and the value."""
    return [(i, f"args[{i}]", a) for i, a in enumerate(args)] + [
        (k, f"kwargs[{k!r}]", v) for k, v in kwargs.items()
    ]


def model_dtype(model: Callable[..., Any]) -> torch.dtype:
    """The floating dtype a model computes in before it has run: that of a module's first
    floating parameter or buffer, else the default dtype, which ``PyroSample`` priors built
    from Python floats draw in."""
    if isinstance(model, torch.nn.Module):
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point():
                return tensor.dtype
    return torch.get_default_dtype()


def dtype_mismatch(args: tuple, kwargs: Mapping[str, Any], dtype: torch.dtype) -> str | None:
    """The floating argument whose dtype is not ``dtype``, the model's, named (float64 data
    for a float32 ``nn.Linear`` fail inside torch, as 'mat1 and mat2 must have the same
    dtype'; where the model's operations promote them, mid-run); ``None`` where every one
    has it."""
    for _, name, value in named_arguments(args, kwargs):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
            return (
                f"model argument {name} has dtype {value.dtype}, but the model computes in "
                f"{dtype}: convert the data (e.g. .to({dtype})) or build the model under "
                f"torch.set_default_dtype({value.dtype})"
            )
    return None


def check_finite_data(args: tuple, kwargs: Mapping[str, Any]) -> None:
    """Refuse tensors in the model arguments that contain NaN or infinity, are empty, or live on
    the ``meta`` device (no values)."""
    for _, name, value in named_arguments(args, kwargs):
        if isinstance(value, np.ndarray) and value.dtype.kind in "fc":
            value = torch.from_numpy(value)
        if isinstance(value, torch.Tensor):
            if value.is_meta:
                raise ValueError(
                    f"model argument {name} is on the 'meta' device, which holds shapes but no "
                    "values: give the data on 'cpu' or 'cuda'"
                )
            if value.numel() == 0:
                raise ValueError(f"model argument {name} is an empty tensor: the data set is empty")
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                bad = int((~torch.isfinite(value)).sum())
                raise ValueError(
                    f"model argument {name} contains {bad} NaN or infinite values; "
                    "clean or impute the data before sampling"
                )


def unscorable_observation(
    model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any], latents: Mapping[str, Any]
) -> ModelContractError | None:
    """The refusal of an observed site whose log-likelihood cannot be computed on the data as
    given -- e.g. integer labels for a ``Bernoulli``, whose log-probability torch computes in
    floating point -- naming the site, the observations' dtype and the distribution's error;
    ``None`` where every observed site's can (or the model fails before any is reached)."""
    try:
        with torch.no_grad():
            trace = poutine.trace(poutine.condition(model, data=dict(latents))).get_trace(
                *args, **kwargs
            )
    except Exception:
        return None
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or not site["is_observed"] or name in latents:
            continue
        if site_is_subsample(site):
            continue
        try:
            with torch.no_grad():
                site["fn"].log_prob(site["value"])
        except Exception as error:
            return _unscorable(name, site, error)
    return None


def _unscorable(name: str, site: Mapping[str, Any], error: Exception) -> ModelContractError:
    value = site["value"]
    distribution = type(site["fn"]).__name__
    first_line = str(error).splitlines()[0] if str(error) else ""
    advice = "Check that the observations match the distribution's support and dtype."
    integers = isinstance(value, torch.Tensor) and not value.is_floating_point()
    if integers and "cast" in first_line:  # torch's "result type Float can't be cast to ..."
        advice = (
            f"{distribution} scores its observations in floating point: pass them as floats "
            "(e.g. y.float())."
        )
    dtype = getattr(value, "dtype", type(value).__name__)
    return ModelContractError(
        f"the log-likelihood of observed site {name!r} ({distribution}) cannot be computed on "
        f"the data given, observations of dtype {dtype} ({type(error).__name__}: "
        f"{first_line}). {advice}"
    )
