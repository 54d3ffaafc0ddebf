r"""Inspect a Pyro model: its latent sites and its data plate, and how to restrict it to rows.

The contract (see the "model contract" page of the docs): **one data plate** (by default named
``"data"``) holds the observations, and **every latent site is continuous and outside it**. Any
of the three ways Pyro's tutorials write that plate works:

(a) *sized from the data*: ``with pyro.plate("data", x.shape[0]): pyro.sample("obs", ...,
    obs=y)``. A minibatch slices the model's data arguments -- those whose leading size is
    :math:`N` (or the ones named by ``data_args``) -- so the network runs on :math:`B` rows, and
    the plate's sites are scaled by :math:`N/B`;
(b) *indexed by the plate*: ``with pyro.plate("data", N) as idx: ... obs=y[idx]``. A minibatch
    conditions the plate's index site; Pyro scales by :math:`N/B` itself;
(c) *subsampled by the plate*: ``pyro.plate("data", N, subsample_size=B)`` (Pyro's SVI idiom).
    As (b), with the sampler supplying the indices (and ``B`` the model's).

:class:`DataPlate` records which idiom a model uses (found by running it on a two-row minibatch)
and restricts it to any rows (:meth:`DataPlate.bind`): the kernels, SVI, the export and the
predictive all go through it. ``PyroSample`` weights of a ``PyroModule`` first touched *inside*
the data plate are sampled before the model runs (:class:`GlobalSitesFirst`), so that they stay
the global sites they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pyro import poutine
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger
from pyro.poutine.trace_struct import Trace
from pyro.poutine.util import site_is_subsample

from ..errors import ModelContractError
from .contract_checks import (
    CheckSubsampleSize,
    check_observation_shape,
    check_priors_ignore_slicing,
    dtype_mismatch,
    latent_in_data_plate,
    model_dtype,
    named_arguments,
    unscorable_observation,
)

__all__ = [
    "DataPlate",
    "GlobalSitesFirst",
    "ModelStructure",
    "check_plate_fits_data",
    "find_data_plate",
    "inspect_model",
    "plate_chunks",
    "plate_frame",
    "resolve_batch_size",
    "rows_log_prob",
    "with_global_sites",
]

ArgumentKey = int | str

#: How many rows the set-up runs of a model evaluate (:meth:`DataPlate.bind_for_setup`).
SETUP_ROWS = 64
#: How many leading rows of the data the first probe of the indexed idiom keeps.
_PROBE_ROWS = 3


def spread_rows(count: int, num_data: int, device: torch.device | None = None) -> torch.Tensor:
    """``count`` row indices spread evenly over ``num_data`` rows, the first and last included."""
    return torch.arange(count, device=device) * (num_data - 1) // max(count - 1, 1)


class _ScalePlate(Messenger):
    """Multiply the log-density scale of every site inside the plate ``name`` by ``factor`` and,
    given ``keep`` (a boolean per row of the plate), mask the rows where it is false."""

    def __init__(self, name: str, factor: float, keep: torch.Tensor | None = None) -> None:
        super().__init__()
        self.name, self.factor, self.keep = name, factor, keep

    def _process_message(self, msg) -> None:
        frame = next((f for f in msg["cond_indep_stack"] if f.name == self.name), None)
        if frame is None:
            return
        msg["scale"] = self.factor * msg["scale"]
        if self.keep is not None and frame.dim is not None:
            keep = self.keep.reshape((-1,) + (1,) * (-1 - frame.dim))
            mask = msg["mask"]
            msg["mask"] = keep if mask is None or mask is True else keep & mask


@dataclass(frozen=True)
class DataPlate:
    """The data plate of a model and how to restrict the model to some of its rows.

    Attributes
    ----------
    name:
        The plate's name.
    num_data:
        :math:`N`, its full size.
    mode:
        ``"indexed"`` (idioms (b) and (c): condition the plate's index site) or ``"sliced"``
        (idiom (a): slice the data arguments and scale the plate's sites by :math:`N/B`).
    subsample_size:
        The model's own minibatch size for idiom (c), else ``None``.
    data_args:
        Positions (for ``*args``) and names (for ``**kwargs``) of the data arguments sliced in
        ``"sliced"`` mode: those whose leading size is :math:`N`.
    """

    name: str
    num_data: int
    mode: Literal["indexed", "sliced"] = "indexed"
    subsample_size: int | None = None
    data_args: tuple[ArgumentKey, ...] = field(default=())

    @property
    def max_rows(self) -> int:
        """The most rows :meth:`bind` evaluates at once: the model's own minibatch size for a
        plate that subsamples itself (Pyro refuses other sizes), else :math:`N`."""
        return self.subsample_size or self.num_data

    def bind(
        self,
        model: Callable[..., Any],
        args: tuple,
        kwargs: Mapping[str, Any],
        rows: torch.Tensor | None,
    ) -> tuple[Callable[..., Any], tuple, dict[str, Any]]:
        """The model and arguments that evaluate only ``rows`` (``None``: all :math:`N` rows),
        with the plate's sites weighted by :math:`N/B`.

        For a plate that subsamples itself (idiom (c)), ``rows`` may be fewer than its
        ``subsample_size``: they are padded to that size with masked rows and the plate's sites
        reweighted, so the result is the same as a plate of ``len(rows)`` rows.
        """
        if rows is None:
            if self.subsample_size is not None:
                raise ValueError(
                    f"the plate {self.name!r} subsamples itself (subsample_size="
                    f"{self.subsample_size}): evaluate it in chunks of at most that many rows"
                )
            return model, args, dict(kwargs)
        if self.mode == "indexed":
            return self._bind_indexed(model, rows), args, dict(kwargs)
        sliced_args = tuple(
            _take(value, rows) if i in self.data_args else value for i, value in enumerate(args)
        )
        sliced_kwargs = {
            k: _take(value, rows) if k in self.data_args else value for k, value in kwargs.items()
        }
        factor = self.num_data / rows.shape[-1]
        return _ScalePlate(self.name, factor)(model), sliced_args, sliced_kwargs

    def bind_for_setup(
        self, model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]
    ) -> tuple[Callable[..., Any], tuple, dict[str, Any]]:
        """The model on the rows that set-up runs (Pyro's ``initialize_model``, the discovery
        of Gibbs blocks) evaluate: for a plate that subsamples itself, which
        ``initialize_model`` refuses, its first ``subsample_size`` rows; else
        :data:`SETUP_ROWS` rows spread over the data (all rows if there are no more).

        The latent sites are global (the data-plate contract), so these runs give them the
        same distributions and draw the same values as runs on all rows, at the cost of a few
        rows.
        """
        tensors = (v for _, _, v in named_arguments(args, kwargs) if isinstance(v, torch.Tensor))
        device = next((v.device for v in tensors), None)
        if self.subsample_size is not None:
            rows = torch.arange(self.subsample_size, device=device)
        elif self.num_data > SETUP_ROWS:
            rows = spread_rows(SETUP_ROWS, self.num_data, device)
        else:
            return model, args, dict(kwargs)
        return self.bind(model, args, kwargs, rows)

    def _bind_indexed(self, model: Callable[..., Any], rows: torch.Tensor) -> Callable[..., Any]:
        size = self.subsample_size
        if size is None or rows.shape[-1] == size:
            return poutine.condition(model, data={self.name: rows})
        if rows.shape[-1] > size:
            raise ValueError(
                f"{rows.shape[-1]} rows given to the plate {self.name!r}, whose model fixes "
                f"subsample_size={size}"
            )
        kept = rows.shape[-1]
        padded = torch.cat([rows, rows.new_zeros(size - kept)])
        keep = torch.arange(size, device=rows.device) < kept
        conditioned = poutine.condition(model, data={self.name: padded})
        return _ScalePlate(self.name, size / kept, keep)(conditioned)


def _take(value: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return value.index_select(0, rows.to(value.device))


class GlobalSitesFirst:
    """A ``PyroModule`` model whose ``PyroSample`` attributes are all sampled before it runs.

    ``PyroModule`` caches the value of a ``PyroSample`` attribute for the duration of a call, so
    touching every such attribute first, in the same call context, makes a weight that the
    model's code first touches *inside* the data plate a global site (sampled once, outside the
    plate), as it is meant to be, rather than a site broadcast over the plate and scaled by
    :math:`N/B`. The wrapped model has the same sites, values and densities otherwise.
    """

    def __init__(self, module: PyroModule) -> None:
        if not isinstance(module, PyroModule):
            raise TypeError(
                "GlobalSitesFirst wraps a PyroModule (its PyroSample attributes are what it "
                f"samples first), got {type(module).__name__}: a model function samples its "
                "global sites itself; call pyro.sample for them before the data plate"
            )
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.module._pyro_context:
            for module in self.module.modules():
                for name in getattr(module, "_pyro_samples", {}):
                    getattr(module, name)
            return self.module(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)


@dataclass(frozen=True)
class ModelStructure:
    """What the samplers need to know about a model.

    Attributes
    ----------
    latent_sites:
        Names of the latent sample sites, in the order the model visits them.
    plate:
        The data plate (:class:`DataPlate`).
    observed_sites:
        Observed sites that sit inside the data plate.
    trace:
        A trace of the model on the full data with latent values drawn from the prior (the one
        run of the model on all rows that :func:`inspect_model` makes).
    model:
        The model to run: the given one, or it wrapped in :class:`GlobalSitesFirst`.
    """

    latent_sites: tuple[str, ...]
    plate: DataPlate
    observed_sites: tuple[str, ...]
    trace: Trace
    model: Callable[..., Any]

    @property
    def num_data(self) -> int:
        return self.plate.num_data

    @property
    def plate_name(self) -> str:
        return self.plate.name

    @property
    def sample_sites(self) -> tuple[str, ...]:
        """Every sample site but the plates' index sites, in the order the model visits them."""
        return tuple(
            name
            for name, site in self.trace.nodes.items()
            if site["type"] == "sample" and not site_is_subsample(site)
        )


def _plate_names(trace: Trace) -> list[str]:
    names = []
    for site in trace.nodes.values():
        if site["type"] != "sample":
            continue
        for frame in site["cond_indep_stack"]:
            if frame.vectorized and frame.name not in names:
                names.append(frame.name)
    return names


def plate_frame(site: Mapping[str, Any], plate_name: str) -> Any:
    """The frame of the plate ``plate_name`` in a trace site's stack (``None``: not in it)."""
    return next((f for f in site["cond_indep_stack"] if f.name == plate_name), None)


def rows_log_prob(site: Mapping[str, Any], obs: torch.Tensor, frame: Any) -> torch.Tensor:
    r"""Unscaled :math:`\log p(y_n \mid \theta)` of a trace site per row :math:`n` of the plate
    whose ``frame`` is given (masked rows count zero; other batch dimensions are summed); a site
    outside the plate (``frame=None``) gives its whole log-probability as one entry."""
    log_prob = site["fn"].log_prob(obs)
    mask = site.get("mask")
    if mask is not None and mask is not True:
        log_prob = torch.where(torch.as_tensor(mask), log_prob, torch.zeros_like(log_prob))
    if frame is None:
        return log_prob.sum().reshape(1)
    batch_dims = len(site["fn"].batch_shape)
    log_prob = log_prob.expand(site["fn"].batch_shape) if log_prob.dim() < batch_dims else log_prob
    axis = log_prob.dim() + frame.dim
    moved = log_prob.movedim(axis, 0)
    return moved.reshape(moved.shape[0], -1).sum(-1)


def _in_plate(site: Mapping[str, Any], plate_name: str) -> bool:
    return any(frame.name == plate_name for frame in site["cond_indep_stack"])


def inspect_model(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    plate_name: str = "data",
    data_args: Sequence[ArgumentKey] | None = None,
    *,
    stop_early: bool = False,
) -> ModelStructure:
    """Trace ``model`` once on all rows, find its data plate's idiom and check the contract.

    The plate's size and the sites are read from that trace; the idiom is found on probes of
    two or three rows (:func:`find_data_plate`).

    Parameters
    ----------
    model, args, kwargs:
        The model and its full-data arguments.
    plate_name:
        Name of the data plate.
    data_args:
        For a plate sized from the data (idiom (a)): the positions or names of the arguments to
        slice to a minibatch; default: every tensor argument whose leading size is :math:`N`.
    stop_early:
        Stop a ``PyroModule`` at its first weight drawn inside the data plate and trace it
        wrapped in :class:`GlobalSitesFirst` at once, rather than after a run on all the data.
        The random draws then differ from a full run's: for callers that fork torch's
        generator around this call.

    Raises
    ------
    ModelContractError
        If there is no such plate, a latent site sits inside it (and the model is not a
        ``PyroModule`` whose weights can be sampled first), a latent site is discrete, there is
        no latent or no observed site, a call is missing the observations, or the model cannot
        be restricted to a minibatch by any of the three idioms.
    """
    model, trace = _trace_global_sites_first(model, args, kwargs, plate_name, stop_early)
    fn = _plate_site(trace, plate_name)["fn"]
    latent, observed = _classify_sites(trace, plate_name)
    latents = _latent_values(trace)
    if fn.subsample_size is not None and fn.subsample_size < fn.size:
        # a plate that subsamples itself draws its rows on every run: run it again (on those
        # rows only), as find_data_plate does, so that the random draws that follow stay the same
        fn = _traced_plate(model, args, kwargs, plate_name, latents)
    plate = _data_plate(model, args, kwargs, plate_name, fn, latents, data_args)
    if plate.mode == "sliced":
        rows = spread_rows(min(2, plate.num_data), plate.num_data)
        check_priors_ignore_slicing(plate, model, args, kwargs, rows, trace, latent)
    return ModelStructure(tuple(latent), plate, tuple(observed), trace, model)


def with_global_sites(
    model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any], plate_name: str = "data"
) -> Callable[..., Any]:
    """``model`` wrapped in :class:`GlobalSitesFirst` if it is a ``PyroModule`` whose weights
    are first touched inside the data plate, else ``model`` itself."""
    if not isinstance(model, PyroModule):
        return model
    with torch.no_grad():
        return _trace_global_sites_first(model, args, kwargs, plate_name)[0]


class _LatentInPlate(Exception):
    """A latent site was drawn inside the data plate (raised by :class:`_StopAtLatentInPlate`)."""


class _StopAtLatentInPlate(Messenger):
    """Stop a model at its first latent site inside the plate ``name``."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def _pyro_post_sample(self, msg) -> None:
        if not msg["is_observed"] and not site_is_subsample(msg) and _in_plate(msg, self.name):
            raise _LatentInPlate


def _trace(model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]) -> Trace:
    return poutine.trace(CheckSubsampleSize()(model)).get_trace(*args, **kwargs)


def _trace_global_sites_first(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    plate_name: str,
    stop_early: bool = False,
) -> tuple[Callable[..., Any], Trace]:
    """A trace of ``model`` from its prior, and the model to use: a ``PyroModule`` whose
    ``PyroSample`` weights are first touched inside the data plate (they then land in the plate,
    or break the layer's shapes) is wrapped in :class:`GlobalSitesFirst` (with ``stop_early``,
    as soon as the first such weight is drawn; see :func:`inspect_model`)."""
    if not isinstance(model, PyroModule):
        return model, _trace(model, args, kwargs)
    wrapped = GlobalSitesFirst(model)
    try:
        trace = _trace(
            _StopAtLatentInPlate(plate_name)(model) if stop_early else model, args, kwargs
        )
    except _LatentInPlate:
        try:
            return wrapped, _trace(wrapped, args, kwargs)
        except Exception:
            # the wrapped model fails too: raise what the run without stopping raises
            return _trace_global_sites_first(model, args, kwargs, plate_name)
    except (RuntimeError, ValueError, IndexError, TypeError) as error:
        try:
            return wrapped, _trace(wrapped, args, kwargs)
        except (RuntimeError, ValueError, IndexError, TypeError):
            raise error from None
    if not _latent_in_plate(trace, plate_name):
        return model, trace
    return wrapped, _trace(wrapped, args, kwargs)


def find_data_plate(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    plate_name: str,
    latents: Mapping[str, torch.Tensor],
    data_args: Sequence[ArgumentKey] | None = None,
) -> DataPlate:
    """The data plate of ``model`` called on ``args, kwargs`` (training data, or new inputs
    without targets) with the latent sites fixed to ``latents``: its size and idiom.

    Raises
    ------
    ModelContractError
        If there is no plate ``plate_name`` or no idiom restricts the model to a minibatch.
    """
    fn = _traced_plate(model, args, kwargs, plate_name, latents)
    return _data_plate(model, args, kwargs, plate_name, fn, latents, data_args)


def _traced_plate(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    plate_name: str,
    latents: Mapping[str, torch.Tensor],
) -> Any:
    """The plate's ``_Subsample`` distribution in a trace of ``model`` at ``latents``."""
    with torch.no_grad():
        trace = poutine.trace(poutine.condition(model, data=dict(latents))).get_trace(
            *args, **kwargs
        )
    return _plate_site(trace, plate_name)["fn"]


def _data_plate(model, args, kwargs, plate_name, fn, latents, data_args) -> DataPlate:
    """The :class:`DataPlate` of a model whose plate ``plate_name`` is ``fn`` (its
    ``_Subsample`` distribution): the size checked against the data, the idiom probed."""
    num_data = int(fn.size)
    if num_data < 1:
        raise ModelContractError(f"the data plate {plate_name!r} has size {num_data}: no data")
    own = fn.subsample_size
    subsample_size = own if own is not None and own < num_data else None
    _check_rows_against_plate(args, kwargs, plate_name, num_data)
    return _find_idiom(
        model, args, kwargs, plate_name, num_data, subsample_size, latents, data_args
    )


def plate_chunks(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    plate_name: str,
    latents: Mapping[str, torch.Tensor],
    chunk_size: int | None,
) -> tuple[DataPlate, list[torch.Tensor | None]]:
    """The data plate of ``model`` on ``args, kwargs`` and the chunks of its rows to evaluate it
    on (each through :meth:`DataPlate.bind`): all rows at once (``[None]``), or consecutive
    chunks of at most ``chunk_size`` rows and at most the model's own ``subsample_size``.

    Raises
    ------
    ModelContractError
        If there is no plate ``plate_name``, or chunks are needed and no idiom restricts the
        model to them.
    """
    fn = _traced_plate(model, args, kwargs, plate_name, latents)
    num_rows, own = int(fn.size), fn.subsample_size
    limit = min(chunk_size or num_rows, own or num_rows)
    if limit >= num_rows:
        return DataPlate(plate_name, num_rows), [None]
    try:
        plate = find_data_plate(model, args, kwargs, plate_name, latents)
    except ModelContractError as error:
        raise ModelContractError(
            f"the model's {num_rows} rows cannot be split into chunks of {limit}: {error}"
        ) from error
    return plate, list(torch.arange(num_rows).split(limit))


class MissingPlateError(ModelContractError):
    """The model has no plate of the name asked for; ``found`` lists the plates it has (so that
    a caller can name its own argument, e.g. the export's ``plate_name``)."""

    def __init__(self, message: str, plate_name: str, found: list[str]) -> None:
        super().__init__(message)
        self.plate_name, self.found = plate_name, found

    def naming(self, option: str) -> ModelContractError:
        """The same refusal worded for a caller whose argument ``option`` names the plate."""
        advice = "put the observations in a pyro.plate over the data rows"
        if self.found:
            advice = f"pass {option}= one of them (the plate of the observations' rows)"
        return ModelContractError(
            f"{option}={self.plate_name!r}: the model has no pyro.plate named "
            f"{self.plate_name!r}; plates found: {self.found or 'none'}; {advice}"
        )


def _plate_site(trace: Trace, plate_name: str) -> Mapping[str, Any]:
    plate_site = trace.nodes.get(plate_name)
    if plate_site is None or not site_is_subsample(plate_site):
        found = _plate_names(trace)
        raise MissingPlateError(
            f"the model has no pyro.plate named {plate_name!r} (subsample_plate={plate_name!r}); "
            f"plates found: {found or 'none'}. Put the observations inside "
            f"`with pyro.plate({plate_name!r}, x.shape[0]):` or pass subsample_plate=<name>.",
            plate_name,
            found,
        )
    return plate_site


def _latent_in_plate(trace: Trace, plate_name: str) -> bool:
    return any(
        site["type"] == "sample"
        and not site["is_observed"]
        and not site_is_subsample(site)
        and _in_plate(site, plate_name)
        for site in trace.nodes.values()
    )


def _classify_sites(trace: Trace, plate_name: str) -> tuple[list[str], list[str]]:
    """The latent and the observed (in-plate) sites; refuses latent sites that break the
    contract, naming them."""
    latent, observed, unobserved_in_plate = [], [], []
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site_is_subsample(site):
            continue
        if site["is_observed"]:
            if _in_plate(site, plate_name) and not site["infer"].get("_deterministic", False):
                check_observation_shape(name, site)
                observed.append(name)
            continue
        if _in_plate(site, plate_name):
            unobserved_in_plate.append(name)
            continue
        if site["fn"].support.is_discrete:
            raise ModelContractError(
                f"latent site {name!r} is discrete ({type(site['fn']).__name__}); the SG-MCMC "
                "kernels and fit_svi need continuous latent sites (marginalise it out or make "
                "it observed)."
            )
        latent.append(name)
    if unobserved_in_plate and not observed:
        raise ModelContractError(
            f"site(s) {unobserved_in_plate} inside the data plate {plate_name!r} have no observed "
            "value: were the targets passed to run(...)? (e.g. mcmc.run(x, y), not mcmc.run(x))"
        )
    if unobserved_in_plate:
        raise latent_in_data_plate(unobserved_in_plate[0], plate_name, trace)
    if not latent:
        raise ModelContractError("the model has no latent sample sites to sample")
    if not observed:
        raise ModelContractError(
            f"no observed site sits inside the data plate {plate_name!r}; the samplers scale the "
            "likelihood of the observations in that plate by N/B."
        )
    return latent, observed


def data_mismatch(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    plate_name: str,
    error: Exception,
    call: str,
) -> ModelContractError:
    """The refusal of data the model fails on (``error``, raised by the model run inside
    ``call``, e.g. ``"run(...)"``): rows that do not fit the plate are named first
    (:func:`check_plate_fits_data` raises), else the model's own error in one line."""
    check_plate_fits_data(model, args, kwargs, plate_name)
    if (dtypes := dtype_mismatch(args, kwargs, model_dtype(model))) is not None:
        return ModelContractError(f"the model fails on the data given to {call}: {dtypes}")
    first_line = str(error).splitlines()[0] if str(error) else ""
    return ModelContractError(
        f"the model fails on the data given to {call} ({type(error).__name__}: {first_line}). "
        "Check that the data match the model: plate sizes, numbers of rows and features, dtypes."
    )


def check_plate_fits_data(
    model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any], plate_name: str
) -> None:
    """For a model that failed on its data: run it on the plate's first row only, read the
    plate's size, and refuse data with another number of rows by name (a plate larger than the
    data fails with an index error that does not say so). Does nothing if that run fails too."""
    try:
        with torch.no_grad():
            conditioned = poutine.condition(model, data={plate_name: torch.tensor([0])})
            trace = poutine.trace(conditioned).get_trace(*args, **kwargs)
        size = int(_plate_site(trace, plate_name)["fn"].size)
    except Exception:
        return
    _check_rows_against_plate(args, kwargs, plate_name, size)


def _check_rows_against_plate(
    args: tuple, kwargs: Mapping[str, Any], plate_name: str, num_data: int
) -> None:
    """Refuse data with more rows than the plate (the model would silently use only some), or
    with a few rows fewer (between half the plate and the plate: the minibatches would index
    rows that do not exist, or wrap around)."""
    for _, name, value in named_arguments(args, kwargs):
        if not (isinstance(value, torch.Tensor) and value.dim() >= 1):
            continue
        rows = value.shape[0]
        if rows > num_data:
            raise ModelContractError(
                f"model argument {name} has {rows} rows but the data plate "
                f"{plate_name!r} has size {num_data}: only the first {num_data} rows would be "
                f"used. Declare pyro.plate({plate_name!r}, {rows}) or pass fewer rows."
            )
        if num_data / 2 <= rows < num_data:
            raise ModelContractError(
                f"model argument {name} has {rows} rows but the data plate {plate_name!r} has "
                f"size {num_data}: the plate's rows {rows}..{num_data - 1} have no data. Size "
                f"the plate from the data, e.g. pyro.plate({plate_name!r}, y.shape[0])."
            )


def _find_idiom(
    model, args, kwargs, plate_name, num_data, subsample_size, latents, data_args
) -> DataPlate:
    """Which idiom restricts the model to a minibatch: the plate's indices (b, c), or sliced
    data arguments (a); checked on a two-row probe (or the model's own minibatch size).

    The plate's indices are first tried on the data cut to its first rows
    (:func:`_leading_rows`), so that a model of idiom (a), which ignores them, fails on three
    rows rather than on all :math:`N`; if that fails and slicing does too, on all the data.
    """
    size = subsample_size or 2
    if num_data < 2 and subsample_size is None:
        return DataPlate(plate_name, num_data)
    probe = spread_rows(size, num_data)
    indexed = DataPlate(plate_name, num_data, "indexed", subsample_size)
    keys = tuple(data_args) if data_args is not None else _row_arguments(args, kwargs, num_data)
    candidates = [indexed]
    if subsample_size is None and keys:
        candidates.append(DataPlate(plate_name, num_data, "sliced", None, keys))
    first = _leading_rows(args, kwargs, keys, num_data) if len(candidates) > 1 else None
    if first is not None:
        if _follows_on(indexed, model, first, latents):
            return indexed
        candidates.reverse()  # not on three rows: slicing next, the indices on all rows last
    for plate in candidates:
        if _follows(plate, model, args, kwargs, probe, latents):
            return plate
    if (failure := unscorable_observation(model, args, kwargs, latents)) is not None:
        raise failure
    raise ModelContractError(
        f"the model cannot be restricted to a minibatch of the plate {plate_name!r}: neither by "
        "conditioning the plate's indices (`with pyro.plate(name, N) as idx: ... obs=y[idx]`) "
        "nor by slicing its data arguments (`with pyro.plate(name, x.shape[0]): ... obs=y`, "
        "arguments whose leading size is N; name them with data_args=...). Check that every "
        "data tensor has the plate's rows first."
    )


def _row_arguments(args, kwargs, num_data) -> tuple[ArgumentKey, ...]:
    return tuple(
        key
        for key, _, value in named_arguments(args, kwargs)
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == num_data
    )


def _leading_rows(
    args: tuple, kwargs: Mapping[str, Any], keys: tuple[ArgumentKey, ...], num_data: int
) -> tuple[tuple, dict[str, Any], torch.Tensor] | None:
    """The arguments with the data ones (``keys`` with :math:`N` rows) cut to their first
    :data:`_PROBE_ROWS` rows, and two of those rows to condition the plate on; ``None`` when
    that cuts nothing."""
    cut = set(keys) & set(_row_arguments(args, kwargs, num_data))
    if num_data <= _PROBE_ROWS or not cut:
        return None
    args = tuple(v[:_PROBE_ROWS] if i in cut else v for i, v in enumerate(args))
    kwargs = {k: v[:_PROBE_ROWS] if k in cut else v for k, v in kwargs.items()}
    return args, kwargs, spread_rows(2, _PROBE_ROWS)


def _follows_on(plate: DataPlate, model, probe: tuple, latents) -> bool:
    """:func:`_follows` on ``probe`` (``args, kwargs, rows``); any error is a no."""
    try:
        return _follows(plate, model, *probe, latents)
    except Exception:
        return False


def _latent_values(trace: Trace) -> dict[str, torch.Tensor]:
    return {
        name: site["value"]
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
    }


def _follows(plate: DataPlate, model, args, kwargs, rows, latents) -> bool:
    """Whether, restricted by ``plate`` to ``rows``, every site in the plate (observed, or drawn
    when the model is called without targets) keeps exactly those rows (or broadcasts)."""
    bound, bound_args, bound_kwargs = plate.bind(model, args, kwargs, rows)
    try:
        with torch.no_grad():
            probe = poutine.trace(poutine.condition(bound, data=dict(latents))).get_trace(
                *bound_args, **bound_kwargs
            )
            probe.compute_log_prob()
    except (RuntimeError, ValueError, IndexError):
        return False
    in_plate = [
        site
        for name, site in probe.nodes.items()
        if site["type"] == "sample"
        and not site_is_subsample(site)
        and name not in latents
        and _in_plate(site, plate.name)
    ]
    return bool(in_plate) and all(_rows_of(site, plate.name) in (1, len(rows)) for site in in_plate)


def _rows_of(site: Mapping[str, Any], plate_name: str) -> int:
    frame = next(f for f in site["cond_indep_stack"] if f.name == plate_name)
    value = site["value"]
    dim = frame.dim - site["fn"].event_dim if frame.dim is not None else 0
    return value.shape[dim] if value.dim() >= -dim else 1


def resolve_batch_size(
    batch_size: int | None, num_data: int, plate_name: str = "data", plate: DataPlate | None = None
) -> int:
    """The minibatch size: ``batch_size`` checked against ``[1, N]``, or ``N`` if ``None``; for
    a plate that subsamples itself (idiom (c)), at most the plate's own ``subsample_size`` (its
    default)."""
    own = None if plate is None else plate.subsample_size
    if batch_size is None:
        return own if own is not None else num_data
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an integer in [1, N] or None, got {batch_size!r}")
    if not 1 <= batch_size <= num_data:
        raise ValueError(
            f"batch_size must lie in [1, N] = [1, {num_data}] (N is the size of the data plate "
            f"{plate_name!r}), got {batch_size}"
        )
    if own is not None and batch_size > own:
        raise ValueError(
            f"batch_size={batch_size} exceeds the model's own subsample_size={own} of the plate "
            f"{plate_name!r}: leave batch_size unset, or raise the model's subsample_size"
        )
    return batch_size
