"""What a source of draws holds: draws, statistics, attributes, model and arguments of a run.

The export (:mod:`pyro_sgmcmc.analysis.export`) takes three kinds of source, each read by one
function here into a :class:`_Source`: a finished ``pyro.infer.MCMC`` run (:func:`_mcmc_source`: the
draws, and the per-draw statistics of its kernel), a :class:`~pyro_sgmcmc.variational.svi.SVIResult`
(:func:`_svi_source`: draws from each fit's guide, the losses as the ``svi_loss`` group) and a
chains source such as :func:`~pyro_sgmcmc.run_chains`' result (:func:`_chains_source`, duck-typed by
:data:`CHAINS_SOURCE_ATTRIBUTES`). :func:`~pyro_sgmcmc.analysis.export.build_groups` picks the
reader and builds the groups from what it returns.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import xarray as xr
from pyro.infer import MCMC
from pyro.infer.mcmc import HMC

from ..kernels.base import StochasticGradientKernel
from ..variational.svi import SVIResult
from .diagnostics import temperature_attrs
from .export_hmc_stats import HMCStatsCollector
from .export_xarray import _dataset, _numpy
from .fitted_data import check_fitted_data

__all__ = ["CHAINS_SOURCE_ATTRIBUTES", "TensorDict"]

TensorDict = dict[str, torch.Tensor]

#: The attributes a chains source (the vectorised runner's result) must have.
CHAINS_SOURCE_ATTRIBUTES = ("samples", "sample_stats", "model", "args", "kwargs")


@dataclass
class _Source:
    """What the export reads from a source.

    ``samples`` are the constrained draws shaped ``(chain, draw, ...)``, ``stats`` the per-draw
    statistics shaped ``(chain, draw)``, ``attrs`` the posterior attributes, ``model`` the run's
    model, ``args`` and ``kwargs`` the model's training arguments (the caller's, or the run's
    if the caller gave none). An SVI fit and an SG-MCMC kernel's ``MCMC`` run add their
    ``wall_time``; an SVI fit also the models with each fit's
    fitted prior or parameters (``chain_models``) and the ``svi_loss`` group
    (``extra_groups``). ``params`` are the model's own parameters as an SG-MCMC run held them
    (:mod:`pyro_sgmcmc.models.model_params`), ``None`` where the source does not record them.
    ``plate_name`` is the data plate the run subsampled (an SG-MCMC kernel's
    ``subsample_plate``, ``fit_svi``'s ``plate_name``), ``None`` where the source does not say.
    """

    samples: TensorDict
    stats: dict[str, np.ndarray]
    attrs: dict[str, Any]
    model: Callable[..., Any] | None
    args: tuple
    kwargs: dict[str, Any]
    wall_time: float | None = None
    chain_models: list[Callable[..., Any]] | None = None
    extra_groups: dict[str, xr.Dataset] = field(default_factory=dict)
    params: TensorDict | None = None
    plate_name: str | None = None


# ---------------------------------------------------------------------------------------------
# pyro.infer.MCMC
# ---------------------------------------------------------------------------------------------
def _per_chain_diagnostics(mcmc: MCMC, num_chains: int) -> dict[str, dict[str, Any]]:
    """The kernel's per-chain diagnostics, ``{key: {"chain c": value}}``, without R-hat or ESS.

    ``MCMC.diagnostics()`` first computes Pyro's split R-hat and ESS of every site, and
    ``split_gelman_rubin`` asserts at least 4 draws per chain: it fails on a short run that the
    export can handle (ArviZ computes R-hat and ESS later, with its own small-sample rules). The
    per-chain kernel diagnostics it merges in are kept by ``MCMC`` in ``_diagnostics`` (one dict
    per chain, pyro-ppl 1.x); read them there, falling back to ``diagnostics()`` minus the
    per-site entries if a Pyro version stores them elsewhere.
    """
    by_chain = getattr(mcmc, "_diagnostics", None)
    if isinstance(by_chain, list | tuple) and len(by_chain) == num_chains and by_chain[0]:
        return {
            key: {f"chain {c}": by_chain[c][key] for c in range(num_chains)} for key in by_chain[0]
        }
    try:
        merged = mcmc.diagnostics()
    except AssertionError:  # too few draws for Pyro's split R-hat
        return {}
    return {
        key: value
        for key, value in merged.items()
        if isinstance(value, Mapping) and "chain 0" in value
    }


def _per_chain(diagnostics: Mapping[str, Mapping[str, Any]], key: str, num_chains: int) -> list:
    """The diagnostic ``key`` of each chain, in chain order."""
    return [diagnostics[key][f"chain {c}"] for c in range(num_chains)]


def _mcmc_source(
    mcmc: MCMC, hmc_stats: HMCStatsCollector | None, args: tuple, kwargs: dict[str, Any]
) -> _Source:
    """Draws, statistics and attributes of an MCMC run; ``args``/``kwargs`` default to the run's.

    The statistics depend on the kernel (module docstring of :mod:`pyro_sgmcmc.analysis.export`):
    those an SG-MCMC kernel reports, those ``hmc_stats`` recorded for HMC and NUTS, and every
    per-draw diagnostic of any other kernel; ``diverging`` for all that report divergences.
    """
    samples = mcmc.get_samples(group_by_chain=True)
    if not samples:
        raise ValueError("the MCMC object has no samples: call mcmc.run(...) first")
    num_chains, num_draws = next(iter(samples.values())).shape[:2]
    kernel = mcmc.kernel
    diagnostics = _per_chain_diagnostics(mcmc, num_chains)
    stats: dict[str, np.ndarray] = {}
    attrs: dict[str, Any] = {"method": type(kernel).__name__}
    if "divergences" in diagnostics:
        divergences = _per_chain(diagnostics, "divergences", num_chains)
        stats["diverging"] = _diverging(divergences, num_draws)
    wall_time, plate_name = None, None
    if isinstance(kernel, StochasticGradientKernel):
        plate_name = kernel.settings.subsample_plate
        _add_sgmcmc_stats(diagnostics, num_chains, stats, attrs)
        rows, of_rows = kernel.judged_rows  # those of the end-of-run warning
        if rows:
            attrs["judged_rows"], attrs["judged_of_rows"] = list(rows), of_rows
        wall_time = _sgmcmc_sampling_time(diagnostics, num_chains, attrs)
    elif isinstance(kernel, HMC):
        collected = None if hmc_stats is None else hmc_stats.stats(num_chains, num_draws)
        if collected is not None:
            stats.update(collected)
        elif hmc_stats is not None:
            warnings.warn(
                "HMCStatsCollector recorded no complete statistics (were the chains run in "
                "worker processes?); exporting only `diverging`",
                stacklevel=3,
            )
        if "acceptance rate" in diagnostics:
            accepted = _per_chain(diagnostics, "acceptance rate", num_chains)
            attrs["mean_acceptance_rate"] = [float(a) for a in accepted]
    else:
        stats.update(_per_draw_diagnostics(diagnostics, num_chains, num_draws))
    args, kwargs = _fitted_or_checked(
        kernel.model, args, kwargs, getattr(mcmc, "_args", None), getattr(mcmc, "_kwargs", None),
        "the MCMC run",
    )  # fmt: skip
    params = getattr(kernel, "model_params", None)
    return _Source(samples, stats, attrs, kernel.model, args, kwargs, wall_time, params=params,
                   plate_name=plate_name)  # fmt: skip


def _sgmcmc_sampling_time(
    diagnostics: Mapping[str, Mapping[str, Any]], num_chains: int, attrs: dict[str, Any]
) -> float | None:
    """Seconds the chains of an SG-MCMC kernel's ``MCMC`` run sampled (warm-up and kept draws):
    their sum where they ran one after the other, the longest where they ran in parallel worker
    processes; their set-up seconds go to ``attrs["setup_time"]`` the same way. ``None`` for a
    run restored from a checkpoint that did not record them."""
    keys, chains = ("sampling_seconds", "setup_seconds"), [f"chain {c}" for c in range(num_chains)]
    if not all(chain in diagnostics.get(key, {}) for key in keys for chain in chains):
        return None
    sampling = [float(s) for s in _per_chain(diagnostics, "sampling_seconds", num_chains)]
    setup = [float(s) for s in _per_chain(diagnostics, "setup_seconds", num_chains)]
    parallel = any(_per_chain(diagnostics, "in_parallel_worker", num_chains))
    total = max if parallel else sum
    attrs["setup_time"] = float(total(setup))
    return float(total(sampling))


def _fitted_or_checked(
    model: Any, args: tuple, kwargs: dict[str, Any], fitted_args: Any, fitted_kwargs: Any,
    fit: str,
) -> tuple[tuple, dict[str, Any]]:  # fmt: skip
    """The data a result was fitted on, where the export is given none or the same data in
    another form (NumPy float32 copies of float64 tensors would not fit the run's model), else
    a ``ValueError`` (:func:`~.fitted_data.check_fitted_data`); the data given where the result
    keeps none."""
    fitted_args = tuple(fitted_args or ())
    fitted_kwargs = dict(fitted_kwargs or {})
    if not fitted_args and not fitted_kwargs:
        return args, kwargs
    if args or kwargs:
        check_fitted_data(model, args, kwargs, fitted_args, fitted_kwargs, fit)
    return fitted_args, fitted_kwargs


def _diverging(divergences: list, num_draws: int) -> np.ndarray:
    """``(chain, draw)`` flags from each chain's indices of divergent draws."""
    diverging = np.zeros((len(divergences), num_draws), dtype=bool)
    for c, indices in enumerate(divergences):
        indices = [int(i) for i in indices if 0 <= int(i) < num_draws]
        diverging[c, indices] = True
    return diverging


def _add_sgmcmc_stats(
    diagnostics: Mapping[str, Mapping[str, Any]],
    num_chains: int,
    stats: dict[str, np.ndarray],
    attrs: dict[str, Any],
) -> None:
    """Add what an SG-MCMC kernel reports per draw to ``stats``, its run totals to ``attrs``."""

    def per_chain(key: str) -> list[Any]:
        return _per_chain(diagnostics, key, num_chains)

    stats["step_size"] = np.stack([_numpy(v) for v in per_chain("step_size")])
    stats["temperature"] = np.stack([_numpy(v) for v in per_chain("temperature")])
    stats["lp"] = -np.stack([_numpy(v) for v in per_chain("potential_energy")])
    attrs["num_gradient_steps"] = int(sum(per_chain("num_steps")))
    attrs["warmup_divergences"] = int(sum(per_chain("warmup_divergences")))
    if "configurational_temperature" in diagnostics:  # the chains' reports
        temperatures, hot = per_chain("configurational_temperature"), per_chain("too_hot")
        cold = per_chain("too_cold") if "too_cold" in diagnostics else [False] * len(hot)
        reports = [
            {"configurational_temperature": t, "too_hot": h, "too_cold": c}
            for t, h, c in zip(temperatures, hot, cold, strict=True)
        ]
        attrs.update(temperature_attrs(reports))


def _per_draw_diagnostics(
    diagnostics: Mapping[str, Any], num_chains: int, num_draws: int
) -> dict[str, np.ndarray]:
    """Every diagnostic of another kernel that has one entry per draw in every chain."""
    stats = {}
    for key, by_chain in diagnostics.items():
        if key in ("divergences", "r_hat", "n_eff") or not isinstance(by_chain, dict):
            continue
        values = [by_chain.get(f"chain {c}") for c in range(num_chains)]
        arrays = [np.asarray(_numpy(v)) if v is not None else None for v in values]
        if all(a is not None and a.shape[:1] == (num_draws,) for a in arrays):
            stats[key.replace(" ", "_")] = np.stack(arrays)
    return stats


# ---------------------------------------------------------------------------------------------
# SVI fits and chains sources
# ---------------------------------------------------------------------------------------------
def _svi_source(
    fits: Any, num_draws: int, seed: int | None, args: tuple, kwargs: dict[str, Any]
) -> _Source:
    """``num_draws`` draws from each fit's guide (one chain per fit), drawn with ``seed``."""
    if not isinstance(fits, SVIResult):
        raise TypeError(f"expected an SVIResult, got {type(fits).__name__}")
    samples = fits.sample_posterior(num_draws, seed=seed)
    attrs: dict[str, Any] = {"method": "SVI", "svi_estimator": fits.estimator}
    values = fits.prior_values()
    if values is not None:
        for key in ("mixture_weight", "scale1", "scale2"):
            attrs[f"svi_prior_{key}"] = [v[key] for v in values]
    chain_models = None
    if fits.prior_parameters is not None or fits.model_params is not None:
        chain_models = [fits.fitted_model(k) for k in range(fits.num_fits)]
    args, kwargs = _fitted_or_checked(fits.model, args, kwargs, fits.args, fits.kwargs,
                                      "the SVI fit")  # fmt: skip
    loss = _dataset(
        {"loss": fits.losses},
        ("chain", "svi_step"),
        {},
        attrs={"description": "negative ELBO estimate per optimisation step"},
    )
    return _Source(
        samples,
        {},
        attrs,
        fits.model,
        args,
        kwargs,
        wall_time=fits.wall_time,
        chain_models=chain_models,
        extra_groups={"svi_loss": loss},
        plate_name=fits.plate_name,
    )


def _is_chains_source(source: Any) -> bool:
    return all(hasattr(source, name) for name in CHAINS_SOURCE_ATTRIBUTES)


def _chains_source(source: Any, args: tuple, kwargs: dict[str, Any]) -> _Source:
    """Draws, statistics and attributes of a chains source (duck-typed, see build_groups)."""
    samples = source.samples
    leading = _chain_draw_shape(samples)
    stats = {}
    for name, value in dict(source.sample_stats or {}).items():
        array = np.asarray(_numpy(value))
        if array.shape != leading:
            raise ValueError(
                f"source.sample_stats[{name!r}] must have shape (chain, draw) = {leading}, got "
                f"{array.shape}"
            )
        stats[name] = array
    attrs = dict(getattr(source, "attrs", None) or {})
    attrs.setdefault("method", type(source).__name__)
    name = type(source).__name__
    fit = "the run_chains result" if name == "VectorizedResult" else f"the {name} run"
    args, kwargs = _fitted_or_checked(source.model, args, kwargs, source.args, source.kwargs,
                                      fit)  # fmt: skip
    params = getattr(source, "model_params", None)
    plate_name = getattr(source, "plate_name", None)
    return _Source(dict(samples), stats, attrs, source.model, args, kwargs, params=params,
                   plate_name=plate_name if isinstance(plate_name, str) else None)  # fmt: skip


def _chain_draw_shape(samples: Any) -> tuple[int, ...]:
    """The ``(chain, draw)`` shape shared by the tensors of a chains source's ``samples``."""
    if not isinstance(samples, Mapping) or not samples:
        raise ValueError(
            "source.samples must be a non-empty dict from site name to a tensor of shape "
            f"(chain, draw, ...), got {type(samples).__name__}"
        )
    shapes = {}
    for name, value in samples.items():
        if not isinstance(value, torch.Tensor) or value.dim() < 2:
            raise ValueError(
                f"source.samples[{name!r}] must be a torch.Tensor of shape (chain, draw, ...), "
                f"got {type(value).__name__} {tuple(getattr(value, 'shape', ()))}"
            )
        shapes[name] = tuple(value.shape[:2])
    leading = next(iter(shapes.values()))
    if any(shape != leading for shape in shapes.values()):
        raise ValueError(f"source.samples disagree on (chain, draw): {shapes}")
    return leading
