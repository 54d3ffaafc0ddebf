r"""Every result as an ArviZ ``InferenceData``: MCMC (NUTS, HMC, SG-MCMC) and SVI.

:func:`to_inference_data` builds the groups directly from xarray datasets, without
``arviz.from_pyro`` (which, in ArviZ 0.23, needs a ``divergences`` diagnostic, silently drops the
log-likelihood of ``PyroModule`` networks whose vectorised trace fails, and which ArviZ 1.x no
longer has).

Groups
------
=============================  ==============================================================
group                          content
=============================  ==============================================================
``posterior``                  constrained draws of every latent site, dims
                               ``(chain, draw, <site>_dim_0, ...)``
``sample_stats``               per-draw statistics, see the table below
``log_likelihood``             :math:`\log p(y_i \mid \theta^{(c,s)})` per observation ``i`` of
                               the full training set, one variable per observed site
``posterior_predictive``       :math:`\tilde y \sim p(y \mid \theta^{(c,s)})` on the training
                               inputs, and every ``pyro.deterministic`` site (e.g. the
                               network output) per draw
``observed_data``              the observed sites of the model on the training data
``constant_data``              the tensor arguments of the model that are not observed values
``predictions``                :math:`\tilde y \sim p(y \mid x_\ast, \theta^{(c,s)})` on ``test``
``predictions_constant_data``  every tensor argument of the test call (inputs and targets)
``svi_loss``                   SVI only: the loss (negative ELBO estimate) per step, dims
                               ``(chain, svi_step)``; one chain per independent fit
=============================  ==============================================================

``sample_stats`` uses ArviZ's names where one exists:

* NUTS / HMC (with :class:`HMCStatsCollector` as ``hook_fn``): ``step_size``,
  ``acceptance_rate`` (the Metropolis acceptance probability of the transition; for NUTS the
  average over the tree), ``lp`` (minus Pyro's potential energy: the log joint in unconstrained
  space, log-Jacobian included) and ``diverging``. Pyro does not keep the kinetic energy of the
  momentum, so ``energy`` (and hence ``az.bfmi``) is not available; nor is NUTS' tree depth.
  Without the collector only ``diverging`` (from ``MCMC.diagnostics()``) is exported, and the
  mean acceptance rate per chain goes to the attributes.
* SG-MCMC kernels: ``step_size``, ``temperature``, ``lp`` (minus the *minibatch* potential
  energy at the last gradient step of the draw: a noisy, unbiased estimate) and ``diverging``.
* SVI: ``lp``, the full-data log joint :math:`\log p(\theta) + \sum_i \log p(y_i\mid\theta)` in
  constrained space (no Jacobian), computed in the same pass as the log-likelihood.
* any other ``MCMCKernel``: ``diverging`` if it reports ``divergences``, and every diagnostic that
  is an array with one entry per draw.

Log-likelihood and predictive draws
-----------------------------------
For each draw the model is traced with its latent sites conditioned on the draw and the
observations un-conditioned (``poutine.condition(poutine.uncondition(model), draw)``): the
observed site then carries both the distribution, whose ``log_prob`` of the observation is the
log-likelihood, and a fresh predictive sample. Rows are processed in chunks of ``chunk_size`` by
conditioning the data plate's index site on each chunk, as the kernels do with minibatches (the
``N/B`` scale Pyro then applies is ignored: the unscaled ``fn.log_prob`` is used). Batch dimensions
of an observation other than the plate's are summed, so there is one value per row of the plate,
which is what ``az.loo`` needs. A model with a method
``pointwise_log_likelihood(params, subsample, *args, **kwargs)`` (returning a tensor of shape
``(B,)``, or a mapping from observed-site name to such tensors) is used instead of the trace for
the log-likelihood (the *fast path*). Nothing is ever dropped silently: a failure raises.

Moving to ArviZ 1.x
-------------------
ArviZ 1.x stores results as an ``xarray.DataTree`` with the same group names. Every group here is
built as an ``xarray.Dataset`` first (:func:`build_groups` returns them), so the move is
``xarray.DataTree.from_dict({"/" + name: ds for name, ds in groups.items()})`` in place of
``az.InferenceData(**groups)`` (:func:`to_datatree` does this today);
``DataTree.to_netcdf`` / ``xarray.open_datatree`` replace ``idata.to_netcdf`` /
``az.from_netcdf``; ``az.summary``, ``az.rhat``, ``az.ess``, ``az.loo``, ``az.compare`` keep their
names (in ``arviz_stats``, re-exported by ``arviz``) and accept a DataTree; plots move to
``arviz_plots`` (``plot_trace_dist``, ``plot_rank``). The custom group ``svi_loss`` is allowed
there too. Nothing in the kernels needs to change.
"""

from __future__ import annotations

import inspect
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import arviz as az
import numpy as np
import torch
import xarray as xr
from pyro import poutine
from pyro.infer import MCMC
from pyro.infer.mcmc import HMC
from pyro.poutine.util import site_is_subsample

from ._validation import check_positive_int
from .kernels.base import StochasticGradientKernel
from .svi import SVIResult, global_param_mode

__all__ = ["HMCStatsCollector", "build_groups", "to_datatree", "to_inference_data"]

TensorDict = dict[str, torch.Tensor]


# ---------------------------------------------------------------------------------------------
# per-draw statistics of Pyro's HMC and NUTS
# ---------------------------------------------------------------------------------------------
class HMCStatsCollector:
    r"""A ``hook_fn`` for ``pyro.infer.MCMC`` that records per-draw HMC / NUTS statistics.

    ``pyro.infer.MCMC`` keeps only the draws; HMC and NUTS expose their running state after each
    transition, which this hook reads: the step size, the potential energy of the new state (minus
    ``lp``), whether the transition diverged, and the acceptance probability, recovered from
    Pyro's running mean :math:`\bar a_n = \bar a_{n-1} + (a_n - \bar a_{n-1})/n` as
    :math:`a_n = n\bar a_n - (n-1)\bar a_{n-1}`.

    Chains run in worker processes (``num_chains <= cpu_count - 1``) call the hook in the worker,
    so nothing is recorded; pass ``mp_context`` and run them sequentially (or on a machine with
    fewer cores than chains) to collect statistics.

    Examples
    --------
    >>> collector = HMCStatsCollector()                       # doctest: +SKIP
    >>> mcmc = MCMC(NUTS(model), 200, warmup_steps=200, hook_fn=collector)   # doctest: +SKIP
    >>> mcmc.run(x, y)                                        # doctest: +SKIP
    >>> idata = to_inference_data(mcmc, model, x, y, hmc_stats=collector)  # doctest: +SKIP
    """

    _FIELDS = ("step_size", "acceptance_rate", "lp", "diverging")

    def __init__(self, hook: Callable[..., Any] | None = None) -> None:
        self.hook = hook
        self.chains: list[dict[str, list]] = []
        self._previous_mean = 0.0
        self._last_stage = ""

    def _chain_for(self, stage: str, i: int) -> dict[str, list] | None:
        match = re.search(r"\[(\d+)\]", stage)
        if match is not None:
            index = int(match.group(1))
            while len(self.chains) <= index:
                self.chains.append({field: [] for field in self._FIELDS})
            return self.chains[index]
        starts_chain = i == 0 and (
            stage.startswith("Warmup") or not self._last_stage.startswith("Warmup")
        )
        if starts_chain or not self.chains:
            self.chains.append({field: [] for field in self._FIELDS})
        return self.chains[-1]

    def __call__(self, kernel: Any, params: Mapping[str, torch.Tensor], stage: str, i: int) -> None:
        chain = self._chain_for(stage, i)
        self._last_stage = stage
        if stage.startswith("Sample") and isinstance(kernel, HMC):
            n = i + 1
            mean = float(kernel._mean_accept_prob)
            previous = self._previous_mean if n > 1 else 0.0
            chain["acceptance_rate"].append(n * mean - (n - 1) * previous)
            self._previous_mean = mean
            chain["step_size"].append(float(kernel.step_size))
            energy = getattr(kernel, "_potential_energy_last", None)
            chain["lp"].append(-float(energy) if energy is not None else math.nan)
            divergences = getattr(kernel, "_divergences", [])
            chain["diverging"].append(bool(divergences) and divergences[-1] == i)
        if self.hook is not None:
            self.hook(kernel, params, stage, i)

    def stats(self, num_chains: int, num_draws: int) -> dict[str, np.ndarray] | None:
        """The statistics as ``(chain, draw)`` arrays, or ``None`` if they are incomplete."""
        chains = [c for c in self.chains if c["step_size"]]
        if len(chains) != num_chains or any(len(c["step_size"]) != num_draws for c in chains):
            return None
        return {
            field: np.asarray(
                [c[field] for c in chains], dtype=bool if field == "diverging" else float
            )
            for field in self._FIELDS
        }


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _default_dims(name: str, ndim: int, start: int = 0) -> list[str]:
    return [f"{name}_dim_{k}" for k in range(start, start + ndim)]


def _dataset(
    variables: Mapping[str, np.ndarray],
    leading: Sequence[str],
    dims: Mapping[str, Sequence[str]],
    attrs: Mapping[str, Any] | None = None,
    axis_names: Mapping[str, Mapping[int, str]] | None = None,
) -> xr.Dataset:
    """An xarray dataset; ``axis_names[var][k]`` names axis ``k`` (after the leading dims)."""
    data_vars = {}
    for name, array in variables.items():
        array = np.asarray(array)
        ndim = array.ndim - len(leading)
        if name in dims:
            names = list(dims[name])
            if len(names) != ndim:
                raise ValueError(
                    f"dims[{name!r}] must name {ndim} dimensions (shape "
                    f"{array.shape[len(leading) :]}), got {names}"
                )
        else:
            names = _default_dims(name, ndim)
            for axis, axis_name in (axis_names or {}).get(name, {}).items():
                names[axis] = axis_name
        data_vars[name] = (list(leading) + names, array)
    dataset = xr.Dataset(data_vars)
    for leading_dim in leading:
        if leading_dim in dataset.dims:
            dataset = dataset.assign_coords({leading_dim: np.arange(dataset.sizes[leading_dim])})
    dataset.attrs.update(attrs or {})
    return dataset


def _argument_names(model: Callable[..., Any], num_args: int) -> list[str]:
    target = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for k in range(num_args):
        if k < len(params) and params[k].kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            names.append(params[k].name)
        else:
            names.append(f"arg{k}")
    return names


def _tensor_arguments(
    model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    named = dict(zip(_argument_names(model, len(args)), args, strict=True))
    named.update(kwargs)
    return {name: _numpy(v) for name, v in named.items() if isinstance(v, torch.Tensor)}


def _plate_frame(site: Mapping[str, Any], plate_name: str) -> Any:
    return next((f for f in site["cond_indep_stack"] if f.name == plate_name), None)


def _plate_axis_of_value(site: Mapping[str, Any], frame: Any) -> int:
    return site["value"].dim() - site["fn"].event_dim + frame.dim


def _rows_log_prob(site: Mapping[str, Any], obs: torch.Tensor, frame: Any) -> torch.Tensor:
    """Unscaled :math:`\\log p(y\\mid\\theta)` per row of the plate; other batch dims summed."""
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


class _Pass:
    """Outputs of one pass over the draws for one data set (training or test)."""

    def __init__(self) -> None:
        self.log_likelihood: dict[str, list[np.ndarray]] = {}
        self.predictive: dict[str, list[np.ndarray]] = {}
        self.log_joint: list[float] = []
        self.observed: dict[str, np.ndarray] = {}
        self.plate_axis: dict[str, int | None] = {}


def _row_chunks(num_rows: int, chunk_size: int | None) -> list[torch.Tensor | None]:
    if chunk_size is None or chunk_size >= num_rows:
        return [None]
    return list(torch.arange(num_rows).split(chunk_size))


def _data_plate_size(model, latents, args, kwargs, plate_name) -> int:
    trace = poutine.trace(poutine.condition(model, data=latents)).get_trace(*args, **kwargs)
    site = trace.nodes.get(plate_name)
    if site is None or not site_is_subsample(site):
        raise ValueError(
            f"the model has no pyro.plate named {plate_name!r} (plate_name={plate_name!r})"
        )
    return int(site["fn"].size)


def _run_pass(
    model: Callable[..., Any],
    draws: Mapping[str, torch.Tensor],
    args: tuple,
    kwargs: Mapping[str, Any],
    *,
    plate_name: str,
    chunk_size: int | None,
    want_log_likelihood: bool,
    want_predictive: bool,
    want_log_joint: bool,
    use_fast_path: bool,
) -> _Pass:
    """Trace the model once per draw (and row chunk); see the module docstring."""
    result = _Pass()
    num_chains, num_draws = next(iter(draws.values())).shape[:2]
    first = {name: value[0, 0] for name, value in draws.items()}
    num_rows = _data_plate_size(model, first, args, kwargs, plate_name)
    chunks = _row_chunks(num_rows, chunk_size)
    fast = use_fast_path and want_log_likelihood and hasattr(model, "pointwise_log_likelihood")
    trace_for_log_lik = want_log_likelihood and not fast
    need_trace = want_predictive or trace_for_log_lik or want_log_joint
    for c in range(num_chains):
        for s in range(num_draws):
            latents = {name: value[c, s] for name, value in draws.items()}
            log_lik_parts: dict[str, list[torch.Tensor]] = {}
            predictive_parts: dict[str, list[torch.Tensor]] = {}
            observed_parts: dict[str, list[torch.Tensor]] = {}
            log_joint = 0.0
            for k, rows in enumerate(chunks):
                if fast:
                    with torch.no_grad():
                        value = model.pointwise_log_likelihood(latents, rows, *args, **kwargs)
                    if isinstance(value, torch.Tensor):
                        value = {"__single__": value}
                    for name, v in value.items():
                        log_lik_parts.setdefault(name, []).append(v.detach())
                if not need_trace:
                    continue
                data = dict(latents)
                if rows is not None:
                    data[plate_name] = rows
                with torch.no_grad():
                    trace = poutine.trace(
                        poutine.condition(poutine.uncondition(model), data=data)
                    ).get_trace(*args, **kwargs)
                for name, site in trace.nodes.items():
                    if site["type"] != "sample" or site_is_subsample(site):
                        continue
                    was_observed = site["infer"].get("was_observed", False)
                    if not was_observed:
                        if want_log_joint and k == 0 and name in latents:
                            log_joint += float(site["fn"].log_prob(site["value"]).sum())
                        frame = _plate_frame(site, plate_name)
                        if want_predictive and name not in latents and frame is not None:
                            # called without targets (e.g. model(x_test)): a predictive draw
                            result.plate_axis[name] = _plate_axis_of_value(site, frame)
                            predictive_parts.setdefault(name, []).append(site["value"])
                        continue
                    frame = _plate_frame(site, plate_name)
                    if frame is None and k > 0:
                        continue
                    obs = site["infer"]["obs"]
                    result.plate_axis[name] = (
                        None if frame is None else _plate_axis_of_value(site, frame)
                    )
                    if site["infer"].get("_deterministic", False):
                        # pyro.deterministic: a function of the draw, not an observation
                        if want_predictive:
                            predictive_parts.setdefault(name, []).append(obs)
                        continue
                    if trace_for_log_lik or want_log_joint:
                        rows_lp = _rows_log_prob(site, obs, frame)
                        if trace_for_log_lik:
                            log_lik_parts.setdefault(name, []).append(rows_lp)
                        log_joint += float(rows_lp.sum())
                    if want_predictive:
                        predictive_parts.setdefault(name, []).append(site["value"])
                    if c == 0 and s == 0:
                        observed_parts.setdefault(name, []).append(obs)
            for name, parts in log_lik_parts.items():
                result.log_likelihood.setdefault(name, []).append(_numpy(torch.cat(parts)))
            for name, parts in predictive_parts.items():
                axis = result.plate_axis[name]
                joined = parts[0] if axis is None else torch.cat(parts, dim=axis)
                result.predictive.setdefault(name, []).append(_numpy(joined))
            for name, parts in observed_parts.items():
                axis = result.plate_axis[name]
                result.observed[name] = _numpy(parts[0] if axis is None else torch.cat(parts, axis))
            if want_log_joint:
                result.log_joint.append(log_joint)
    if fast and "__single__" in result.log_likelihood:
        plated = [n for n, a in result.plate_axis.items() if a is not None] or _observed_in_plate(
            model, first, args, kwargs, plate_name
        )
        if len(plated) != 1:
            raise ValueError(
                "pointwise_log_likelihood returned one tensor but the model has "
                f"{len(plated)} observed sites in the plate {plate_name!r}: {plated}; return a "
                "mapping from site name to tensor"
            )
        result.log_likelihood[plated[0]] = result.log_likelihood.pop("__single__")
    if want_log_likelihood and not result.log_likelihood:
        raise ValueError("the model has no observed site: there is no log-likelihood to export")
    return result


def _observed_in_plate(model, latents, args, kwargs, plate_name) -> list[str]:
    trace = poutine.trace(poutine.condition(model, data=latents)).get_trace(*args, **kwargs)
    return [
        name
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and site["is_observed"]
        and not site_is_subsample(site)
        and _plate_frame(site, plate_name) is not None
        and not site["infer"].get("_deterministic", False)
    ]


def _reshape_draws(values: list[np.ndarray], num_chains: int, num_draws: int) -> np.ndarray:
    stacked = np.stack(values)
    return stacked.reshape((num_chains, num_draws, *stacked.shape[1:]))


def _axis_names(plate_axis: Mapping[str, int | None], dim_name: str) -> dict[str, dict[int, str]]:
    return {name: {axis: dim_name} for name, axis in plate_axis.items() if axis is not None}


# ---------------------------------------------------------------------------------------------
# sources: MCMC and SVI
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


def _mcmc_source(
    mcmc: MCMC, hmc_stats: HMCStatsCollector | None
) -> tuple[TensorDict, dict[str, np.ndarray], dict[str, Any]]:
    samples = mcmc.get_samples(group_by_chain=True)
    if not samples:
        raise ValueError("the MCMC object has no samples: call mcmc.run(...) first")
    num_chains, num_draws = next(iter(samples.values())).shape[:2]
    kernel = mcmc.kernel
    diagnostics = _per_chain_diagnostics(mcmc, num_chains)

    def per_chain(key: str) -> list[Any]:
        return [diagnostics[key][f"chain {c}"] for c in range(num_chains)]

    stats: dict[str, np.ndarray] = {}
    attrs: dict[str, Any] = {"method": type(kernel).__name__}
    if "divergences" in diagnostics:
        diverging = np.zeros((num_chains, num_draws), dtype=bool)
        for c, indices in enumerate(per_chain("divergences")):
            indices = [int(i) for i in indices if 0 <= int(i) < num_draws]
            diverging[c, indices] = True
        stats["diverging"] = diverging
    if isinstance(kernel, StochasticGradientKernel):
        stats["step_size"] = np.stack([_numpy(v) for v in per_chain("step_size")])
        stats["temperature"] = np.stack([_numpy(v) for v in per_chain("temperature")])
        stats["lp"] = -np.stack([_numpy(v) for v in per_chain("potential_energy")])
        attrs["num_gradient_steps"] = int(sum(per_chain("num_steps")))
        attrs["warmup_divergences"] = int(sum(per_chain("warmup_divergences")))
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
            attrs["mean_acceptance_rate"] = [float(a) for a in per_chain("acceptance rate")]
    else:
        for key, by_chain in diagnostics.items():
            if key in ("divergences", "r_hat", "n_eff") or not isinstance(by_chain, dict):
                continue
            values = [by_chain.get(f"chain {c}") for c in range(num_chains)]
            arrays = [np.asarray(_numpy(v)) if v is not None else None for v in values]
            if all(a is not None and a.shape[:1] == (num_draws,) for a in arrays):
                stats[key.replace(" ", "_")] = np.stack(arrays)
    return samples, stats, attrs


def _svi_source(fits: Any, num_draws: int, seed: int | None) -> tuple[TensorDict, dict]:
    if not isinstance(fits, SVIResult):
        raise TypeError(f"expected an SVIResult, got {type(fits).__name__}")
    samples = fits.sample_posterior(num_draws, seed=seed)
    return samples, {"method": "SVI", "svi_estimator": fits.estimator}


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------
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
    plate_name: str = "data",
    chunk_size: int | None = None,
    use_fast_path: bool = True,
    seed: int | None = 0,
    dims: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, xr.Dataset]:
    """The groups of :func:`to_inference_data` as a dict of ``xarray.Dataset`` (same arguments)."""
    if not isinstance(plate_name, str) or not plate_name:
        raise ValueError(f"plate_name must be a non-empty string, got {plate_name!r}")
    if chunk_size is not None:
        chunk_size = check_positive_int("chunk_size", chunk_size)
    if wall_time is not None and not (isinstance(wall_time, (int, float)) and wall_time >= 0):
        raise ValueError(f"wall_time must be a number of seconds >= 0, got {wall_time!r}")
    if test is not None and not isinstance(test, tuple):
        raise ValueError(f"test must be a tuple of model arguments, got {type(test).__name__}")
    dims = dict(dims or {})
    kwargs = dict(model_kwargs or {})
    extra_groups: dict[str, xr.Dataset] = {}

    if isinstance(source, MCMC):
        samples, stats, attrs = _mcmc_source(source, hmc_stats)
        model = model if model is not None else source.kernel.model
        if not args and not kwargs:
            args = tuple(getattr(source, "_args", ()))
            kwargs = dict(getattr(source, "_kwargs", {}) or {})
    elif isinstance(source, SVIResult):
        num_draws = check_positive_int("num_draws", num_draws)
        samples, attrs = _svi_source(source, num_draws, seed)
        stats = {}
        model = model if model is not None else source.model
        if not args and not kwargs:
            args, kwargs = tuple(source.args), dict(source.kwargs)
        wall_time = source.wall_time if wall_time is None else wall_time
        extra_groups["svi_loss"] = _dataset(
            {"loss": source.losses},
            ("chain", "svi_step"),
            {},
            attrs={"description": "negative ELBO estimate per optimisation step"},
        )
    else:
        raise TypeError(
            "source must be a pyro.infer.MCMC run or a pyro_sgmcmc.svi.SVIResult, got "
            f"{type(source).__name__}"
        )
    if model is None or not callable(model):
        raise ValueError("model must be the Pyro model that produced the result")

    samples = {name: value.detach() for name, value in samples.items()}
    num_chains, draws_per_chain = next(iter(samples.values())).shape[:2]
    attrs.update(
        {
            "inference_library": "pyro",
            "inference_library_version": __import__("pyro").__version__,
            "creator": "pyro_sgmcmc.export",
            "num_chains": int(num_chains),
            "num_draws": int(draws_per_chain),
        }
    )
    if wall_time is not None:
        attrs["sampling_time"] = float(wall_time)

    groups: dict[str, xr.Dataset] = {}
    groups["posterior"] = _dataset(
        {name: _numpy(value) for name, value in samples.items()}, ("chain", "draw"), dims, attrs
    )

    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        train = _run_pass(
            model,
            samples,
            args,
            kwargs,
            plate_name=plate_name,
            chunk_size=chunk_size,
            want_log_likelihood=log_likelihood,
            want_predictive=posterior_predictive,
            want_log_joint=isinstance(source, SVIResult),
            use_fast_path=use_fast_path,
        )
        if test is not None:
            test_pass = _run_pass(
                model,
                samples,
                test,
                dict(test_kwargs or {}),
                plate_name=plate_name,
                chunk_size=chunk_size,
                want_log_likelihood=False,
                want_predictive=True,
                want_log_joint=False,
                use_fast_path=False,
            )
    axis_names = _axis_names(train.plate_axis, plate_name)
    if train.log_joint:
        stats["lp"] = np.asarray(train.log_joint).reshape(num_chains, draws_per_chain)
    if stats:
        groups["sample_stats"] = _dataset(stats, ("chain", "draw"), {}, attrs)
    if log_likelihood:
        groups["log_likelihood"] = _dataset(
            {
                name: _reshape_draws(v, num_chains, draws_per_chain)
                for name, v in train.log_likelihood.items()
            },
            ("chain", "draw"),
            {},
            attrs,
            {name: {0: plate_name} for name in train.log_likelihood},
        )
    if posterior_predictive:
        groups["posterior_predictive"] = _dataset(
            {
                name: _reshape_draws(v, num_chains, draws_per_chain)
                for name, v in train.predictive.items()
            },
            ("chain", "draw"),
            dims,
            attrs,
            axis_names,
        )
    if train.observed:
        groups["observed_data"] = _dataset(train.observed, (), dims, {}, axis_names)
    else:
        # the observed values come from the trace pass, which the fast path alone skips
        observed = _observed_values(model, samples, args, kwargs)
        groups["observed_data"] = _dataset(observed, (), dims, {}, axis_names)
    num_rows = _data_plate_size(
        model, {n: v[0, 0] for n, v in samples.items()}, args, kwargs, plate_name
    )
    constant = {
        name: value
        for name, value in _tensor_arguments(model, args, kwargs).items()
        if not any(
            value.shape == obs.shape and np.array_equal(value, obs)
            for obs in groups["observed_data"].data_vars.values()
        )
    }
    if constant:
        groups["constant_data"] = _dataset(
            constant, (), {}, {}, _leading_plate_axis(constant, num_rows, plate_name)
        )
    if test is not None:
        test_axis_names = _axis_names(test_pass.plate_axis, plate_name)
        groups["predictions"] = _dataset(
            {
                name: _reshape_draws(v, num_chains, draws_per_chain)
                for name, v in test_pass.predictive.items()
            },
            ("chain", "draw"),
            dims,
            attrs,
            test_axis_names,
        )
        test_rows = _data_plate_size(
            model,
            {n: v[0, 0] for n, v in samples.items()},
            test,
            dict(test_kwargs or {}),
            plate_name,
        )
        test_constant = _tensor_arguments(model, test, dict(test_kwargs or {}))
        if test_constant:
            groups["predictions_constant_data"] = _dataset(
                test_constant, (), {}, {}, _leading_plate_axis(test_constant, test_rows, plate_name)
            )
    groups.update(extra_groups)
    return groups


def _leading_plate_axis(
    variables: Mapping[str, np.ndarray], num_rows: int, plate_name: str
) -> dict[str, dict[int, str]]:
    return {
        name: {0: plate_name}
        for name, value in variables.items()
        if value.ndim >= 1 and value.shape[0] == num_rows
    }


def _observed_values(model, samples, args, kwargs) -> dict[str, np.ndarray]:
    latents = {n: v[0, 0] for n, v in samples.items()}
    trace = poutine.trace(poutine.condition(model, data=latents)).get_trace(*args, **kwargs)
    return {
        name: _numpy(site["value"])
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and site["is_observed"]
        and not site_is_subsample(site)
        and name not in latents
        and not site["infer"].get("_deterministic", False)
    }


def to_inference_data(
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
    plate_name: str = "data",
    chunk_size: int | None = None,
    use_fast_path: bool = True,
    seed: int | None = 0,
    dims: Mapping[str, Sequence[str]] | None = None,
) -> az.InferenceData:
    r"""Convert an MCMC run or an SVI fit into an ``arviz.InferenceData``.

    Parameters
    ----------
    source:
        A ``pyro.infer.MCMC`` after ``run`` (NUTS, HMC, :class:`~pyro_sgmcmc.SGLD`,
        :class:`~pyro_sgmcmc.SGHMC`, :class:`~pyro_sgmcmc.PSGLD` or any ``MCMCKernel``; one or
        several chains), or a :class:`~pyro_sgmcmc.svi.SVIResult` (each independent fit becomes a
        chain of ``num_draws`` independent draws from its guide).
    model:
        The model; defaults to ``mcmc.kernel.model`` or ``result.model``.
    *args, model_kwargs:
        The model's training arguments (full data); default to those of the run.
    test, test_kwargs:
        Positional (and keyword) model arguments of a test set, e.g. ``(x_test, y_test)`` or
        ``(x_test,)``: fills ``predictions`` and ``predictions_constant_data``.
    num_draws:
        Draws per SVI fit, an integer >= 1 (ignored for MCMC).
    hmc_stats:
        The :class:`HMCStatsCollector` passed as ``hook_fn`` to ``MCMC`` for NUTS/HMC.
    wall_time:
        Seconds the inference took; stored as the ``sampling_time`` attribute (used for ESS per
        second by :func:`pyro_sgmcmc.diagnostics.convergence_report`). SVI fits record their own.
    log_likelihood, posterior_predictive:
        Whether to compute those groups (one model trace per draw and row chunk).
    plate_name:
        Name of the data plate; also the name of the observation dimension.
    chunk_size:
        Rows of the data plate per trace (``None``: all at once); bounds memory for large data.
    use_fast_path:
        Use the model's ``pointwise_log_likelihood`` method for ``log_likelihood`` if it has one.
    seed:
        Seed of the predictive draws (and of the SVI guide draws); ``None`` uses torch's global
        generator. The global generator's state is left untouched otherwise.
    dims:
        Dimension names (without ``chain``/``draw``) per variable, overriding the defaults
        ``<name>_dim_<k>`` and ``plate_name`` for the plate axis.

    Returns
    -------
    arviz.InferenceData
        With the groups listed in the module docstring.

    Raises
    ------
    ValueError
        On invalid arguments, or a model without observed sites.

    References
    ----------
    R. Kumar, C. Carroll, A. Hartikainen and O. Martin, "ArviZ a unified library for exploratory
    analysis of Bayesian models in Python", JOSS 4(33), 2019.

    A. Vehtari, A. Gelman and J. Gabry, "Practical Bayesian model evaluation using leave-one-out
    cross-validation and WAIC", Statistics and Computing 27, 2017 (why ``log_likelihood`` is per
    observation).
    """
    groups = build_groups(
        source,
        model,
        *args,
        model_kwargs=model_kwargs,
        test=test,
        test_kwargs=test_kwargs,
        num_draws=num_draws,
        hmc_stats=hmc_stats,
        wall_time=wall_time,
        log_likelihood=log_likelihood,
        posterior_predictive=posterior_predictive,
        plate_name=plate_name,
        chunk_size=chunk_size,
        use_fast_path=use_fast_path,
        seed=seed,
        dims=dims,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*svi_loss.*")
        return az.InferenceData(**groups)


def to_datatree(
    source: Any, model: Callable[..., Any] | None = None, /, *args: Any, **options: Any
):
    """The groups of :func:`to_inference_data` as an ``xarray.DataTree`` (ArviZ 1.x layout).

    Takes the same arguments as :func:`to_inference_data`.
    """
    groups = build_groups(source, model, *args, **options)
    return xr.DataTree.from_dict({f"/{name}": dataset for name, dataset in groups.items()})
