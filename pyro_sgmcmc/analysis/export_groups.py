"""The groups of the export as ``xarray.Dataset`` objects: :func:`build_groups`.

The heart of :func:`~pyro_sgmcmc.analysis.export.to_inference_data`: check the options, read the
source (:mod:`~pyro_sgmcmc.analysis.export_sources`), resolve and check the model and data
(:mod:`~pyro_sgmcmc.analysis.export_checks`), trace the model per draw on the training data and the
test set (:mod:`~pyro_sgmcmc.analysis.export_trace`) and store the results as datasets
(:mod:`~pyro_sgmcmc.analysis.export_xarray`). :mod:`pyro_sgmcmc.analysis.export` puts the groups
into the result object of the installed ArviZ; its docstring describes each group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xarray as xr
from pyro.infer import MCMC

from .._validation import as_tensor_arguments, check_positive_int
from .._version import __version__
from ..models.hidden_units import has_hidden_units
from ..models.model_params import with_params
from ..models.structure import with_global_sites
from ..variational.svi import SVIResult, global_param_mode
from .export_checks import (
    _check_draws_match_model,
    _check_finite,
    _check_same_model,
    model_fingerprint,
)
from .export_hmc_stats import HMCStatsCollector
from .export_sources import (
    CHAINS_SOURCE_ATTRIBUTES,
    TensorDict,
    _chains_source,
    _is_chains_source,
    _mcmc_source,
    _Source,
    _svi_source,
)
from .export_trace import _data_plate_size, _observed_values, _Pass, _run_pass, _test_pass
from .export_xarray import (
    _axis_names,
    _batch_dims,
    _dataset,
    _draws_dataset,
    _leading_plate_axis,
    _numpy_dict,
    _reshape_draws,
    _tensor_arguments,
)
from .judged_outputs import traced_output_link

__all__ = ["build_groups"]


@global_param_mode
def build_groups(
    source: Any,
    model: Callable[..., Any] | None = None,
    /,
    *args: Any,
    model_kwargs: Mapping[str, Any] | None = None,
    test: tuple | None = None,
    test_kwargs: Mapping[str, Any] | None = None,
    num_draws: int = 500,
    hmc_stats: HMCStatsCollector | None = None,
    wall_time: float | None = None,
    log_likelihood: bool = True,
    posterior_predictive: bool = True,
    plate_name: str | None = None,
    chunk_size: int | None = None,
    use_fast_path: bool = True,
    seed: int | None = 0,
    dims: Mapping[str, Sequence[str]] | None = None,
    check_model: bool = True,
) -> dict[str, xr.Dataset]:
    """Every group of the result as an ``xarray.Dataset``, by group name.

    Takes the arguments of :func:`~pyro_sgmcmc.analysis.export.to_inference_data`. Besides
    ``pyro.infer.MCMC`` runs and :class:`~pyro_sgmcmc.variational.svi.SVIResult` fits, ``source``
    may be any object with the attributes ``samples`` (site name to constrained draws shaped
    ``(chain, draw, ...)``), ``sample_stats`` (name to an array shaped ``(chain, draw)``),
    ``model``, ``args``, ``kwargs`` and optionally ``attrs`` (extra posterior attributes), such as
    the result of :func:`~pyro_sgmcmc.run_chains`.

    Returns
    -------
    dict of str to xarray.Dataset
        The groups listed in the module docstring of :mod:`pyro_sgmcmc.analysis.export`, in that
        order (those that the source and the options call for).
    """
    chunk_size, seed = _checked_options(
        plate_name, chunk_size, seed, wall_time, test, hmc_stats, check_model
    )
    dims = dict(dims or {})
    kwargs = dict(model_kwargs or {})
    if isinstance(source, MCMC):
        run = _mcmc_source(source, hmc_stats, args, kwargs)
    elif isinstance(source, SVIResult):
        num_draws = check_positive_int("num_draws", num_draws)
        run = _svi_source(source, num_draws, seed, args, kwargs)
    elif _is_chains_source(source):
        run = _chains_source(source, args, kwargs)
        if test is None and test_kwargs is None and getattr(source, "test_set", None):
            test, test_kwargs = source.test_set  # where run_chains judged the run
    else:
        raise TypeError(
            "source must be a pyro.infer.MCMC run, a pyro_sgmcmc.SVIResult or a chains "
            f"result with the attributes {', '.join(CHAINS_SOURCE_ATTRIBUTES)}; got "
            f"{type(source).__name__}"
        )
    if plate_name is None:  # the plate the run subsampled, or the contract's default name
        plate_name = run.plate_name or "data"
    inputs = _inputs(run, model, test, test_kwargs, plate_name, check_model)
    attrs = _posterior_attrs(run, inputs, run.wall_time if wall_time is None else wall_time)
    train, test_pass = _trace_passes(
        inputs,
        seed=seed,
        chunk_size=chunk_size,
        log_likelihood=log_likelihood,
        posterior_predictive=posterior_predictive,
        log_joint=isinstance(source, SVIResult),
        use_fast_path=use_fast_path,
    )
    posterior = _numpy_dict(inputs.samples)
    groups = {"posterior": _dataset(posterior, ("chain", "draw"), dims, attrs, train.plate_axes)}
    groups.update(
        _draw_groups(inputs, train, run.stats, attrs, dims, log_likelihood, posterior_predictive)
    )
    groups.update(_data_groups(inputs, train, dims))
    if test_pass is not None:
        groups.update(_prediction_groups(inputs, test_pass, attrs, dims))
    groups.update(run.extra_groups)
    return groups


def _checked_options(
    plate_name: Any,
    chunk_size: Any,
    seed: Any,
    wall_time: Any,
    test: Any,
    hmc_stats: Any,
    check_model: Any,
) -> tuple[int | None, int | None]:
    """Refuse invalid options of :func:`build_groups`; return ``chunk_size`` and ``seed``."""
    if plate_name is not None and (not isinstance(plate_name, str) or not plate_name):
        raise ValueError(f"plate_name must be a non-empty string or None, got {plate_name!r}")
    if chunk_size is not None:
        chunk_size = check_positive_int("chunk_size", chunk_size)
    if seed is not None:
        seed = check_positive_int("seed", seed, minimum=0)
    if wall_time is not None and not (isinstance(wall_time, (int, float)) and wall_time >= 0):
        raise ValueError(f"wall_time must be a number of seconds >= 0, got {wall_time!r}")
    if test is not None and not isinstance(test, tuple):
        raise ValueError(f"test must be a tuple of model arguments, got {type(test).__name__}")
    if hmc_stats is not None and not isinstance(hmc_stats, HMCStatsCollector):
        raise TypeError(
            "hmc_stats must be the pyro_sgmcmc.HMCStatsCollector passed as hook_fn to "
            f"MCMC, or None; got {hmc_stats!r} ({type(hmc_stats).__name__})"
        )
    if not isinstance(check_model, bool):
        raise TypeError(f"check_model must be True or False, got {check_model!r}")
    return chunk_size, seed


@dataclass(frozen=True)
class _Inputs:
    """The model to trace (its global sites marked), its draws and arguments, checked.

    ``fingerprint`` is the fingerprint of the model as given; ``chain_models`` the models with
    each SVI fit's fitted prior (traced instead of ``model`` for their chain); ``network``
    whether the model has hidden units (its outputs are then exported as ``output``).
    """

    model: Callable[..., Any]
    samples: TensorDict
    args: tuple
    kwargs: dict[str, Any]
    test: tuple | None
    test_kwargs: Mapping[str, Any] | None
    plate_name: str
    chain_models: list[Callable[..., Any]] | None
    network: bool
    fingerprint: str

    @property
    def shape(self) -> tuple[int, int]:
        """``(chain, draw)``."""
        num_chains, num_draws = next(iter(self.samples.values())).shape[:2]
        return num_chains, num_draws

    @property
    def first(self) -> TensorDict:
        """The first draw of the first chain."""
        return {name: value[0, 0] for name, value in self.samples.items()}


def _inputs(
    run: _Source,
    model: Callable[..., Any] | None,
    test: tuple | None,
    test_kwargs: Mapping[str, Any] | None,
    plate_name: str,
    check_model: bool,
) -> _Inputs:
    """The model (default: the run's), draws and arguments as tensors, with every check of
    :mod:`~pyro_sgmcmc.analysis.export_checks` that needs no trace pass."""
    if model is None:
        model = run.model
    if model is None or not callable(model):
        raise ValueError("model must be the Pyro model that produced the result")
    chain_models = run.chain_models
    if chain_models is not None and model is not run.model:
        chain_models = None  # another model object: trace the model given, as for other sources
    args, kwargs = as_tensor_arguments(tuple(run.args), run.kwargs)
    if test is not None:
        test, test_kwargs = as_tensor_arguments(test, dict(test_kwargs or {}))
    samples = {name: value.detach() for name, value in run.samples.items()}
    _check_finite("args", args, kwargs)
    if check_model:
        _check_same_model(model, run.model)
    fingerprint = model_fingerprint(model)
    model = with_global_sites(model, args, kwargs, plate_name)
    _check_draws_match_model(model, samples, args, kwargs)
    network = has_hidden_units(model, {n: v.shape[2:] for n, v in samples.items()})
    model = with_params(model, run.params)  # as the run held them, not as the store holds now
    return _Inputs(
        model=model,
        samples=samples,
        args=args,
        kwargs=kwargs,
        test=test,
        test_kwargs=test_kwargs,
        plate_name=plate_name,
        chain_models=chain_models,
        network=network,
        fingerprint=fingerprint,
    )


def _library_version(library: str) -> str:
    """The version of the library that drew the samples: this package's for ``run_chains``
    (``pyro_sgmcmc.run_chains``), Pyro's for ``pyro.infer.MCMC`` and SVI."""
    if library.startswith("pyro_sgmcmc"):
        return __version__
    return __import__("pyro").__version__


def _posterior_attrs(run: _Source, inputs: _Inputs, wall_time: float | None) -> dict[str, Any]:
    """The source's attributes completed with the run's size, the model and ``wall_time``."""
    num_chains, num_draws = inputs.shape
    attrs = run.attrs
    library = attrs.setdefault("inference_library", "pyro")
    attrs.update(
        {
            "inference_library_version": _library_version(library),
            "creator": "pyro_sgmcmc.analysis.export",
            "num_chains": int(num_chains),
            "num_draws": int(num_draws),
            "model": inputs.fingerprint,
            # 1 for a network: its convergence is judged on its outputs
            # (pyro_sgmcmc.analysis.diagnostics)
            "function_space": int(inputs.network),
        }
    )
    if inputs.network:
        link = traced_output_link(_first_model(inputs), inputs.first, inputs.args, inputs.kwargs)
        if link is not None:  # a classifier: judged on softmax/sigmoid of its outputs
            attrs["output_link"] = link
    if wall_time is not None:
        attrs["sampling_time"] = float(wall_time)
    return attrs


def _first_model(inputs: _Inputs) -> Callable[..., Any]:
    """The model traced for the first chain."""
    return inputs.model if inputs.chain_models is None else inputs.chain_models[0]


def _trace_passes(
    inputs: _Inputs,
    *,
    seed: int | None,
    chunk_size: int | None,
    log_likelihood: bool,
    posterior_predictive: bool,
    log_joint: bool,
    use_fast_path: bool,
) -> tuple[_Pass, _Pass | None]:
    """The pass on the training data and, with a test set, on the test set: one fork of torch's
    generator, seeded with ``seed``, for both (the global generator is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        train = _run_pass(
            inputs.model,
            inputs.samples,
            inputs.args,
            inputs.kwargs,
            plate_name=inputs.plate_name,
            chunk_size=chunk_size,
            want_log_likelihood=log_likelihood,
            want_predictive=posterior_predictive,
            want_log_joint=log_joint,
            # a model's pointwise_log_likelihood would read its parameters from the store,
            # not the fits' (the per-chain models substitute them): traced instead
            use_fast_path=use_fast_path and inputs.chain_models is None,
            label="the training data (args)",
            chain_models=inputs.chain_models,
            read_output=inputs.network,
        )
        if inputs.test is None:
            return train, None
        test_pass = _test_pass(
            inputs.model,
            inputs.samples,
            inputs.test,
            inputs.test_kwargs,
            inputs.args,
            plate_name=inputs.plate_name,
            chunk_size=chunk_size,
            read_output=inputs.network,
            chain_models=inputs.chain_models,
        )
    return train, test_pass


def _draw_groups(
    inputs: _Inputs,
    train: _Pass,
    stats: dict[str, np.ndarray],
    attrs: Mapping[str, Any],
    dims: Mapping[str, Sequence[str]],
    log_likelihood: bool,
    posterior_predictive: bool,
) -> dict[str, xr.Dataset]:
    """``sample_stats`` (with the pass's log joint as ``lp``), ``log_likelihood`` and
    ``posterior_predictive``: the groups of the training pass with one value per draw."""
    num_chains, num_draws = inputs.shape
    plate_name = inputs.plate_name
    groups = {}
    if train.log_joint:
        stats["lp"] = np.asarray(train.log_joint).reshape(num_chains, num_draws)
    if stats:
        groups["sample_stats"] = _dataset(stats, ("chain", "draw"), {}, attrs)
    rows = _ObservedRows(train, plate_name)
    if log_likelihood:
        values = _draws_arrays(train.log_likelihood, num_chains, num_draws)
        groups["log_likelihood"] = rows.dataset(
            values, ("chain", "draw"), _batch_dims(dims, train.log_likelihood), attrs,
            {name: {0: plate_name} for name in values}, {name: 0 for name in values},
        )  # fmt: skip
    if posterior_predictive:
        axis_names = _axis_names(train.plate_axis, plate_name, train.plate_axes)
        values = _draws_arrays(train.predictive, num_chains, num_draws)
        groups["posterior_predictive"] = rows.dataset(
            values, ("chain", "draw"), dims, attrs, axis_names
        )
    return groups


def _draws_arrays(
    values: Mapping[str, np.ndarray], num_chains: int, num_draws: int
) -> dict[str, np.ndarray]:
    """Per-draw values listed in chain-major order as ``(chain, draw, ...)`` arrays."""
    return {name: _reshape_draws(parts, num_chains, num_draws) for name, parts in values.items()}


class _ObservedRows:
    """The rows each observed site's data-shaped groups keep: all, but for a site of which
    ``poutine.mask`` or a masked distribution leaves rows out of the likelihood.

    Masked rows are not observations of the site: ``az.loo``, ``az.waic`` and ``az.compare``
    would count each, and ``az.loo_pit`` and posterior predictive checks need the site's
    ``log_likelihood``, ``posterior_predictive`` and ``observed_data`` on the same rows. Those
    groups keep the observed rows only, on a dimension of their own, ``<rows>_observed``
    (``<rows>_observed_<site>`` where masked sites keep different rows), whose coordinates are
    the kept rows' numbers in the plate.
    """

    def __init__(self, train: _Pass, plate_name: str) -> None:
        self.kept = {name: np.flatnonzero(rows) for name, rows in train.observed_rows.items()}
        self.plate_axis = train.plate_axis
        self.plate_name = plate_name
        self.per_site = len({rows.tobytes() for rows in train.observed_rows.values()}) > 1

    def dataset(
        self,
        values: Mapping[str, np.ndarray],
        leading: Sequence[str],
        dims: Mapping[str, Sequence[str]],
        attrs: Mapping[str, Any],
        axis_names: Mapping[str, Mapping[int, str]],
        row_axis: Mapping[str, int | None] | None = None,
    ) -> xr.Dataset:
        """``values`` as a dataset (:func:`_dataset`), each masked site's rows (its axis
        ``row_axis[name]`` after the ``leading`` ones; default: the plate's) the kept ones."""
        row_axis = self.plate_axis if row_axis is None else row_axis
        values, dims = dict(values), {name: list(names) for name, names in dims.items()}
        axis_names = {name: dict(names) for name, names in axis_names.items()}
        coords = {}
        for name, kept in self.kept.items():
            axis = row_axis.get(name)
            if name not in values or axis is None:
                continue
            values[name] = np.take(values[name], kept, axis=len(leading) + axis)
            own = dims[name][axis] if name in dims else self.plate_name
            dim = f"{own}_observed" + (f"_{name}" if self.per_site else "")
            if name in dims:
                dims[name][axis] = dim
            axis_names.setdefault(name, {})[axis] = dim
            coords[dim] = kept
        return _dataset(values, leading, dims, attrs, axis_names).assign_coords(coords)


def _data_groups(
    inputs: _Inputs, train: _Pass, dims: Mapping[str, Sequence[str]]
) -> dict[str, xr.Dataset]:
    """``observed_data`` and ``constant_data``: the training data."""
    if train.observed:
        observed = train.observed
    else:
        # the observed values come from the trace pass, which the fast path alone skips
        observed = _observed_values(inputs.model, inputs.samples, inputs.args, inputs.kwargs)
    axis_names = _axis_names(train.plate_axis, inputs.plate_name, train.plate_axes)
    rows = _ObservedRows(train, inputs.plate_name)
    groups = {"observed_data": rows.dataset(observed, (), dims, {}, axis_names)}
    constant = _arguments_dataset(inputs, inputs.args, inputs.kwargs, dims, observed.values())
    if constant is not None:
        groups["constant_data"] = constant
    return groups


def _prediction_groups(
    inputs: _Inputs, test_pass: _Pass, attrs: Mapping[str, Any], dims: Mapping[str, Sequence[str]]
) -> dict[str, xr.Dataset]:
    """``predictions`` and ``predictions_constant_data``: the groups of the test set."""
    num_chains, num_draws = inputs.shape
    axis_names = _axis_names(test_pass.plate_axis, inputs.plate_name, test_pass.plate_axes)
    groups = {
        "predictions": _draws_dataset(
            test_pass.predictive, num_chains, num_draws, dims, attrs, axis_names
        )
    }
    constant = _arguments_dataset(inputs, inputs.test, dict(inputs.test_kwargs or {}), dims)
    if constant is not None:
        groups["predictions_constant_data"] = constant
    return groups


def _arguments_dataset(
    inputs: _Inputs,
    args: tuple,
    kwargs: Mapping[str, Any],
    dims: Mapping[str, Sequence[str]],
    observed: Iterable[Any] = (),
) -> xr.Dataset | None:
    """The tensor arguments of a model call, leaving out those equal to an ``observed`` value,
    with the rows of the data plate named after it unless ``dims`` names the argument's
    dimensions (``None`` if there are none)."""
    model, plate_name = inputs.model, inputs.plate_name
    num_rows = _data_plate_size(model, inputs.first, args, kwargs, plate_name)
    variables = {
        name: value
        for name, value in _tensor_arguments(model, args, kwargs).items()
        if not any(value.shape == obs.shape and np.array_equal(value, obs) for obs in observed)
    }
    if not variables:
        return None
    return _dataset(variables, (), dims, {}, _leading_plate_axis(variables, num_rows, plate_name))
