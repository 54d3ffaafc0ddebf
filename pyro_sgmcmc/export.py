r"""Every result as an ArviZ result object: MCMC (NUTS, HMC, SG-MCMC) and SVI.

Under ArviZ 0.x the result is an ``arviz.InferenceData``, under ArviZ 1.x an ``xarray.DataTree``;
both hold the groups below, with the same variables, dimensions, dtypes and attributes.

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
  space, log-Jacobian included), ``energy`` (the Hamiltonian of the transition, see
  :class:`HMCStatsCollector`; what ``az.plot_energy`` and ``az.bfmi`` read) and ``diverging``.
  NUTS' tree depth is not available. Without the collector only ``diverging`` (from
  ``MCMC.diagnostics()``) is exported, and the mean acceptance rate per chain goes to the
  attributes.
* SG-MCMC kernels: ``step_size``, ``temperature``, ``lp`` (minus the *minibatch* potential
  energy at the last gradient step of the draw: a noisy, unbiased estimate) and ``diverging``.
* SVI: ``lp``, the full-data log joint :math:`\log p(\theta) + \sum_i \log p(y_i\mid\theta)` in
  constrained space (no Jacobian), computed in the same pass as the log-likelihood; with a
  learnable prior (``fit_svi(prior=...)``) each fit's fitted prior.
* a chains source (:func:`~pyro_sgmcmc.run_chains`): the statistics it recorded.
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
which is what ``az.loo`` needs. The values are stored in ``float64`` whatever the model's dtype:
ArviZ runs its Pareto smoothing in the dtype of the array, and a ``float32`` SGHMC export was
reported to give NaN in ``az.loo`` / ``az.compare`` where the same values in ``float64`` did not.
A model that does not index its data with the plate's indices (``pyro.plate("data",
len(x))`` with ``obs=y``) is chunked by slicing its row-aligned tensor arguments instead (every
tensor argument whose first dimension has ``N`` rows). A model with a method
``pointwise_log_likelihood(params, subsample, *args, **kwargs)`` (returning a tensor of shape
``(B,)``, or a mapping from observed-site name to such tensors) is used instead of the trace for
the log-likelihood (the *fast path*). Nothing is ever dropped silently: a failure raises.

Checks
------
The draws must be draws of the model's latent sites: a site the model samples but the draws lack
(it would be redrawn from its prior for every draw), a draw of a site the model does not have,
or a shape that differs raises :class:`ModelMismatchError`. The posterior attributes keep a
fingerprint of the model (``model``: for a :class:`~pyro_sgmcmc.nn.BayesianMLP` its
architecture, activation, prior, likelihood and temperature; for another ``torch.nn.Module`` its
class and ``repr``; for a function its qualified name and a hash of its code). When the model
passed differs from the model of the run (another object) with another fingerprint, the export
raises :class:`ModelMismatchError` for two ``BayesianMLP`` (whose fingerprint determines the
density), and warns otherwise (a different function or module can compute the same density,
e.g. a subclass that adds a fast path); ``check_model=False`` turns this check off. Observed values
outside the support of their distribution (a class label outside ``[0, K)``), NaN or infinite
values, and a test set whose columns differ from the training data's are refused with a
``ValueError`` that names ``test`` (or the training arguments).

ArviZ 0.x and 1.x
-----------------
Every group is built as an ``xarray.Dataset`` first (:func:`build_groups` returns them);
:func:`to_inference_data` puts them into the result object of the installed ArviZ through
:mod:`pyro_sgmcmc._arviz` (0.x: ``az.InferenceData(**groups)``; 1.x:
``xarray.DataTree.from_dict``), and :func:`to_datatree` always builds a ``DataTree``. Read a result
the same way under both lines with ``pyro_sgmcmc._arviz`` (``group_names``, ``get_group``,
``to_netcdf``, ``load_netcdf``, ``loo``, ...), or with each line's own API: 0.x ``idata.groups()``,
``az.from_netcdf``; 1.x ``list(tree.children)``, ``xarray.open_datatree``, and ``arviz_stats`` /
``arviz_plots`` (``az.summary``, ``az.loo``, ``az.plot_trace_dist``, ``az.plot_rank``). The
custom group ``svi_loss`` is kept by both. Nothing in the kernels depends on the line.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xarray as xr
from pyro import poutine
from pyro.distributions import constraints as dist_constraints
from pyro.infer import MCMC
from pyro.infer.mcmc import HMC
from pyro.poutine.messenger import unwrap
from pyro.poutine.util import site_is_subsample

from . import _arviz
from ._validation import as_tensor_arguments, check_positive_int
from .errors import ModelContractError, ModelMismatchError, ModelMismatchWarning
from .kernels.base import StochasticGradientKernel
from .model_structure import (
    has_hidden_units,
    plate_chunks,
    plate_frame,
    rows_log_prob,
    with_global_sites,
)
from .nn.mlp import ACTIVATIONS, BayesianMLP
from .svi import SVIResult, global_param_mode

__all__ = [
    "HMCStatsCollector",
    "ModelMismatchError",
    "ModelMismatchWarning",
    "build_groups",
    "from_draws",
    "model_fingerprint",
    "to_datatree",
    "to_inference_data",
]

TensorDict = dict[str, torch.Tensor]


# ---------------------------------------------------------------------------------------------
# per-draw statistics of Pyro's HMC and NUTS
# ---------------------------------------------------------------------------------------------
class _MomentumProbe:
    """Stands in for an HMC/NUTS kernel's ``_sample_r``: records the Hamiltonian at the start of
    each transition, :math:`U(q) + K(r)`, with the freshly drawn momentum (picklable, so that a
    probed kernel can still be sent to worker processes)."""

    def __init__(self, kernel: HMC, collector: HMCStatsCollector) -> None:
        sample_r = kernel._sample_r
        # another collector's probe: wrap what it wraps, not the probe
        self.sample_r = sample_r.sample_r if isinstance(sample_r, _MomentumProbe) else sample_r
        self.kernel = kernel
        self.collector = collector

    def __call__(self, name: str) -> Any:
        r, r_unscaled = self.sample_r(name)
        # "r_t=<t>" is the momentum of transition t; "r_presample_<k>" the step-size search's
        if name.startswith("r_t="):
            potential = self.kernel._potential_energy_last
            kinetic = self.kernel._kinetic_energy(r_unscaled)
            self.collector._pending_energy = float(potential + kinetic)
        return r, r_unscaled


class HMCStatsCollector:
    r"""A ``hook_fn`` for ``pyro.infer.MCMC`` that records per-draw HMC / NUTS statistics.

    ``pyro.infer.MCMC`` keeps only the draws; HMC and NUTS expose their running state after each
    transition, which this hook reads: the step size, the potential energy of the new state (minus
    ``lp``), whether the transition diverged, and the acceptance probability, recovered from
    Pyro's running mean :math:`\bar a_n = \bar a_{n-1} + (a_n - \bar a_{n-1})/n` as
    :math:`a_n = n\bar a_n - (n-1)\bar a_{n-1}`.

    ``energy`` is the Hamiltonian

    .. math::

        H_n = U(q_{n-1}) + \tfrac12\, r_n^\top M^{-1} r_n ,

    at the start of transition :math:`n`: the potential energy of the previous state plus the
    kinetic energy of the momentum :math:`r_n \sim \mathcal N(0, M)` just drawn (Pyro's
    ``energy_current``, whose conservation along the trajectory the Metropolis or slice step
    tests). Pyro keeps no momentum after a transition, so on its first call the collector wraps
    the kernel's momentum draw (``_sample_r``) to read it; the first warm-up transition of a
    kernel, which happens before that call, has no energy, the ones after do. Stan and PyMC
    report the Hamiltonian at the selected state of the trajectory instead; the two differ by the
    integrator's energy error at that state (small unless the transition diverges), and the
    energy-transition statistics computed from either estimate the same E-BFMI
    :math:`\sum_n (H_n - H_{n-1})^2 / \sum_n (H_n - \bar H)^2` (Betancourt 2016), which
    ``az.bfmi`` and ``az.plot_energy`` read.

    Chains run in worker processes (``num_chains <= cpu_count - 1``) call the hook in the worker,
    so nothing is recorded; pass ``mp_context`` and run them sequentially (or on a machine with
    fewer cores than chains) to collect statistics.

    Examples
    --------
    >>> collector = HMCStatsCollector()                       # doctest: +SKIP
    >>> mcmc = MCMC(NUTS(model), 200, warmup_steps=200, hook_fn=collector)   # doctest: +SKIP
    >>> mcmc.run(x, y)                                        # doctest: +SKIP
    >>> idata = to_inference_data(mcmc, model, x, y, hmc_stats=collector)  # doctest: +SKIP

    References
    ----------
    M. Betancourt, "Diagnosing suboptimal cotangent disintegrations in Hamiltonian Monte Carlo",
    arXiv:1604.00695, 2016.
    """

    _FIELDS = ("step_size", "acceptance_rate", "lp", "energy", "diverging")

    def __init__(self, hook: Callable[..., Any] | None = None) -> None:
        if hook is not None and not callable(hook):
            raise TypeError(f"hook must be callable or None, got {hook!r}")
        self.hook = hook
        self.chains: list[dict[str, list]] = []
        self._previous_mean = 0.0
        self._last_stage = ""
        self._pending_energy = math.nan

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
        if isinstance(kernel, HMC):
            probe = kernel.__dict__.get("_sample_r")
            if not (isinstance(probe, _MomentumProbe) and probe.collector is self):
                kernel._sample_r = _MomentumProbe(kernel, self)
        if stage.startswith("Sample") and isinstance(kernel, HMC):
            n = i + 1
            mean = float(kernel._mean_accept_prob)
            previous = self._previous_mean if n > 1 else 0.0
            chain["acceptance_rate"].append(n * mean - (n - 1) * previous)
            self._previous_mean = mean
            chain["step_size"].append(float(kernel.step_size))
            energy = getattr(kernel, "_potential_energy_last", None)
            chain["lp"].append(-float(energy) if energy is not None else math.nan)
            chain["energy"].append(self._pending_energy)
            divergences = getattr(kernel, "_divergences", [])
            chain["diverging"].append(bool(divergences) and divergences[-1] == i)
        self._pending_energy = math.nan
        if self.hook is not None:
            self.hook(kernel, params, stage, i)

    def stats(self, num_chains: int, num_draws: int) -> dict[str, np.ndarray] | None:
        """The statistics as ``(chain, draw)`` arrays, or ``None`` if they are incomplete.

        ``energy`` is left out (with a warning) if a draw lacks it: with ``warmup_steps=0`` the
        first draw of the first chain precedes the collector's first call.
        """
        chains = [c for c in self.chains if c["step_size"]]
        if len(chains) != num_chains or any(len(c["step_size"]) != num_draws for c in chains):
            return None
        stats = {
            field: np.asarray(
                [c[field] for c in chains], dtype=bool if field == "diverging" else float
            )
            for field in self._FIELDS
        }
        if not np.isfinite(stats["energy"]).all():
            missing = int((~np.isfinite(stats["energy"])).sum())
            warnings.warn(
                f"HMCStatsCollector: {missing} draw(s) have no energy (the collector first sees "
                "a kernel after its first transition; use warmup_steps >= 1); exporting without "
                "`energy`",
                stacklevel=3,
            )
            del stats["energy"]
        return stats


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


def _plate_axis_of_value(site: Mapping[str, Any], frame: Any) -> int:
    return site["value"].dim() - site["fn"].event_dim + frame.dim


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
    """
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
        stacklevel=5,
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


def _check_test_like_training(model, test: tuple, args: tuple) -> None:
    """Every test tensor must have the training tensor's dimensions apart from the rows."""
    names = _argument_names(model, len(args))
    for i, (value, train) in enumerate(zip(test, args, strict=False)):
        if not (isinstance(value, torch.Tensor) and isinstance(train, torch.Tensor)):
            continue
        if value.dim() != train.dim() or value.shape[1:] != train.shape[1:]:
            raise _DataError(
                f"test[{i}] has shape {tuple(value.shape)} but the training argument "
                f"{names[i]!r} has shape {tuple(train.shape)}: every dimension but the first "
                "(the rows) must agree"
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


def _first_rows(value: torch.Tensor, axis: int | None, num_rows: int | None) -> torch.Tensor:
    """``value`` cut to its first ``num_rows`` rows along the plate ``axis``: a plate that
    subsamples itself is padded to its own size
    (:meth:`~pyro_sgmcmc.model_structure.DataPlate.bind`)."""
    if axis is None or num_rows is None or value.dim() <= axis or value.shape[axis] <= num_rows:
        return value
    return value.narrow(axis, 0, num_rows)


class _Pass:
    """Outputs of one pass over the draws for one data set (training or test)."""

    def __init__(self) -> None:
        self.log_likelihood: dict[str, list[np.ndarray]] = {}
        self.predictive: dict[str, list[np.ndarray]] = {}
        self.log_joint: list[float] = []
        self.observed: dict[str, np.ndarray] = {}
        self.plate_axis: dict[str, int | None] = {}


@dataclass(frozen=True)
class _Wants:
    """What a pass reads from each trace (``label`` names the data in error messages)."""

    log_likelihood: bool
    predictive: bool
    log_joint: bool
    label: str
    rows: int | None = None  # the rows of the whole pass (None: no ``output`` is read)

    @property
    def any(self) -> bool:
        return self.log_likelihood or self.predictive or self.log_joint


class _DrawParts:
    """The outputs of one draw, gathered over the chunks of rows."""

    def __init__(self, first_draw: bool) -> None:
        self.first_draw = first_draw
        self.log_likelihood: dict[str, list[torch.Tensor]] = {}
        self.predictive: dict[str, list[torch.Tensor]] = {}
        self.observed: dict[str, list[torch.Tensor]] = {}
        self.log_joint = 0.0

    def add_fast_log_likelihood(self, value: torch.Tensor | Mapping[str, torch.Tensor]) -> None:
        if isinstance(value, torch.Tensor):
            value = {"__single__": value}
        for name, v in value.items():
            self.log_likelihood.setdefault(name, []).append(v.detach())

    def read(self, trace, latents, plate_name, wants: _Wants, chunk, keep, plate_axis) -> None:
        """Read one trace (chunk ``chunk`` of the rows, of which the first ``keep`` are real)."""
        if wants.predictive and wants.rows is not None:
            self._read_output(trace, keep or wants.rows, plate_axis)
        for name, site in trace.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site):
                continue
            frame = plate_frame(site, plate_name)
            if not site["infer"].get("was_observed", False):
                if wants.log_joint and chunk == 0 and name in latents:
                    self.log_joint += float(site["fn"].log_prob(site["value"]).sum())
                if wants.predictive and name not in latents and frame is not None:
                    # called without targets (e.g. model(x_test)): a predictive draw
                    plate_axis[name] = axis = _plate_axis_of_value(site, frame)
                    self.predictive.setdefault(name, []).append(
                        _first_rows(site["value"], axis, keep)
                    )
                continue
            if frame is None and chunk > 0:
                continue
            self._read_observed(name, site, frame, wants, keep, plate_axis)

    def _read_output(self, trace, rows: int, plate_axis) -> None:
        """The model's return value as ``output`` -- a network's outputs :math:`f(x)`, one per
        row -- where the model returns a tensor with a leading axis of the rows and has no site
        of that name itself."""
        returned = trace.nodes.get("_RETURN", {}).get("value")
        if OUTPUT in trace.nodes or not isinstance(returned, torch.Tensor):
            return
        if returned.dim() == 0 or returned.shape[0] < rows:
            return
        plate_axis[OUTPUT] = 0
        self.predictive.setdefault(OUTPUT, []).append(returned.detach()[:rows])

    def _read_observed(self, name, site, frame, wants: _Wants, keep, plate_axis) -> None:
        axis = None if frame is None else _plate_axis_of_value(site, frame)
        plate_axis[name] = axis
        obs = _first_rows(site["infer"]["obs"], axis, keep)
        if site["infer"].get("_deterministic", False):
            # pyro.deterministic: a function of the draw, not an observation
            if wants.predictive:
                self.predictive.setdefault(name, []).append(obs)
            return
        if self.first_draw:
            _check_support(wants.label, name, site, site["infer"]["obs"])
        if wants.log_likelihood or wants.log_joint:
            rows_lp = rows_log_prob(site, site["infer"]["obs"], frame)[: keep or None]
            if wants.log_likelihood:
                self.log_likelihood.setdefault(name, []).append(rows_lp)
            self.log_joint += float(rows_lp.sum())
        if wants.predictive:
            self.predictive.setdefault(name, []).append(_first_rows(site["value"], axis, keep))
        if self.first_draw:
            self.observed.setdefault(name, []).append(obs)

    def store(self, result: _Pass, want_log_joint: bool) -> None:
        for name, parts in self.log_likelihood.items():
            # float64: az.loo / az.compare lose the log-likelihood's precision in float32
            values = torch.cat([part.reshape(-1) for part in parts]).double()
            result.log_likelihood.setdefault(name, []).append(_numpy(values))
        for name, parts in self.predictive.items():
            axis = result.plate_axis[name]
            joined = parts[0] if axis is None else torch.cat(parts, dim=axis)
            result.predictive.setdefault(name, []).append(_numpy(joined))
        for name, parts in self.observed.items():
            axis = result.plate_axis[name]
            result.observed[name] = _numpy(parts[0] if axis is None else torch.cat(parts, axis))
        if want_log_joint:
            result.log_joint.append(self.log_joint)


def _data_plate_size(model, latents, args, kwargs, plate_name) -> int:
    return _plate_chunks(model, latents, args, kwargs, plate_name, None)[0].num_data


def _plate_chunks(model, latents, args, kwargs, plate_name, chunk_size):
    try:
        return plate_chunks(model, args, kwargs, plate_name, latents, chunk_size)
    except ModelContractError as error:
        raise ValueError(f"chunk_size={chunk_size}: {error}; pass chunk_size=None") from error


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
    label: str = "the training data",
    chain_models: Sequence[Callable[..., Any]] | None = None,
    read_output: bool = False,
) -> _Pass:
    """Trace the model once per draw (and row chunk); see the module docstring.

    ``chain_models[c]`` replaces ``model`` in the traces of chain ``c`` (an SVI fit's model with
    its fitted prior); ``label`` names the data in error messages; ``read_output`` records the
    model's return value as :data:`OUTPUT` (a network's outputs).
    """
    result = _Pass()
    num_chains, num_draws = next(iter(draws.values())).shape[:2]
    first = {name: value[0, 0] for name, value in draws.items()}
    plate, chunks = _plate_chunks(model, first, args, kwargs, plate_name, chunk_size)
    fast = use_fast_path and want_log_likelihood and hasattr(model, "pointwise_log_likelihood")
    wants = _Wants(
        log_likelihood=want_log_likelihood and not fast,
        predictive=want_predictive,
        log_joint=want_log_joint,
        label=label,
        rows=plate.num_data if read_output and plate.subsample_size is None else None,
    )
    for c in range(num_chains):
        chain_model = model if chain_models is None else chain_models[c]
        for s in range(num_draws):
            latents = {name: value[c, s] for name, value in draws.items()}
            parts = _DrawParts(first_draw=c == 0 and s == 0)
            for k, rows in enumerate(chunks):
                if fast:
                    with torch.no_grad():
                        value = model.pointwise_log_likelihood(latents, rows, *args, **kwargs)
                    parts.add_fast_log_likelihood(value)
                if wants.any:
                    bound, call_args, call_kwargs = plate.bind(
                        poutine.uncondition(chain_model), args, kwargs, rows
                    )
                    with torch.no_grad():
                        trace = poutine.trace(
                            poutine.condition(bound, data=dict(latents))
                        ).get_trace(*call_args, **call_kwargs)
                    keep = None if rows is None else len(rows)
                    parts.read(trace, latents, plate_name, wants, k, keep, result.plate_axis)
            parts.store(result, want_log_joint)
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
        and plate_frame(site, plate_name) is not None
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
    attrs: dict[str, Any] = {"method": "SVI", "svi_estimator": fits.estimator}
    values = fits.prior_values()
    if values is not None:
        for key in ("mixture_weight", "scale1", "scale2"):
            attrs[f"svi_prior_{key}"] = [v[key] for v in values]
    return samples, attrs


#: The attributes a chains source (the vectorised runner's result) must have.
#: The variable of ``posterior_predictive`` and ``predictions`` holding a model's outputs
#: (its return value, or its own site of that name): what networks are judged on.
OUTPUT = "output"
CHAINS_SOURCE_ATTRIBUTES = ("samples", "sample_stats", "model", "args", "kwargs")


def _is_chains_source(source: Any) -> bool:
    return all(hasattr(source, name) for name in CHAINS_SOURCE_ATTRIBUTES)


def _chains_source(source: Any) -> tuple[TensorDict, dict[str, np.ndarray], dict[str, Any]]:
    """Draws, statistics and attributes of a chains source (duck-typed, see build_groups)."""
    samples = source.samples
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
    return dict(samples), stats, attrs


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
    check_model: bool = True,
) -> dict[str, xr.Dataset]:
    """The groups of :func:`to_inference_data` as a dict of ``xarray.Dataset`` (same arguments).

    Besides ``pyro.infer.MCMC`` runs and :class:`~pyro_sgmcmc.svi.SVIResult` fits, ``source``
    may be any object with the attributes ``samples`` (site name to constrained draws shaped
    ``(chain, draw, ...)``), ``sample_stats`` (name to an array shaped ``(chain, draw)``),
    ``model``, ``args``, ``kwargs`` and optionally ``attrs`` (extra posterior attributes), such
    as the result of :func:`~pyro_sgmcmc.run_chains`.
    """
    if not isinstance(plate_name, str) or not plate_name:
        raise ValueError(f"plate_name must be a non-empty string, got {plate_name!r}")
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
            "hmc_stats must be the pyro_sgmcmc.export.HMCStatsCollector passed as hook_fn to "
            f"MCMC, or None; got {hmc_stats!r} ({type(hmc_stats).__name__})"
        )
    if not isinstance(check_model, bool):
        raise TypeError(f"check_model must be True or False, got {check_model!r}")
    dims = dict(dims or {})
    kwargs = dict(model_kwargs or {})
    extra_groups: dict[str, xr.Dataset] = {}
    chain_models = None

    if isinstance(source, MCMC):
        samples, stats, attrs = _mcmc_source(source, hmc_stats)
        source_model = source.kernel.model
        if not args and not kwargs:
            args = tuple(getattr(source, "_args", ()))
            kwargs = dict(getattr(source, "_kwargs", {}) or {})
    elif isinstance(source, SVIResult):
        num_draws = check_positive_int("num_draws", num_draws)
        samples, attrs = _svi_source(source, num_draws, seed)
        stats = {}
        source_model = source.model
        if source.prior_parameters is not None:
            chain_models = [source.fitted_model(k) for k in range(source.num_fits)]
        if not args and not kwargs:
            args, kwargs = tuple(source.args), dict(source.kwargs)
        wall_time = source.wall_time if wall_time is None else wall_time
        extra_groups["svi_loss"] = _dataset(
            {"loss": source.losses},
            ("chain", "svi_step"),
            {},
            attrs={"description": "negative ELBO estimate per optimisation step"},
        )
    elif _is_chains_source(source):
        samples, stats, attrs = _chains_source(source)
        source_model = source.model
        if not args and not kwargs:
            args, kwargs = tuple(source.args), dict(source.kwargs or {})
    else:
        raise TypeError(
            "source must be a pyro.infer.MCMC run, a pyro_sgmcmc.svi.SVIResult or a chains "
            f"result with the attributes {', '.join(CHAINS_SOURCE_ATTRIBUTES)}; got "
            f"{type(source).__name__}"
        )
    if model is None:
        model = source_model
    if model is None or not callable(model):
        raise ValueError("model must be the Pyro model that produced the result")
    if chain_models is not None and model is not source_model:
        chain_models = None  # another model object: trace the model given, as for other sources
    args, kwargs = as_tensor_arguments(tuple(args), kwargs)
    if test is not None:
        test, test_kwargs = as_tensor_arguments(test, dict(test_kwargs or {}))

    samples = {name: value.detach() for name, value in samples.items()}
    _check_finite("args", args, kwargs)
    if check_model:
        _check_same_model(model, source_model)
    fingerprint = model_fingerprint(model)
    model = with_global_sites(model, args, kwargs, plate_name)
    _check_draws_match_model(model, samples, args, kwargs)
    num_chains, draws_per_chain = next(iter(samples.values())).shape[:2]
    network = has_hidden_units(model, {n: v.shape[2:] for n, v in samples.items()})
    attrs.setdefault("inference_library", "pyro")
    attrs.update(
        {
            "inference_library_version": __import__("pyro").__version__,
            "creator": "pyro_sgmcmc.export",
            "num_chains": int(num_chains),
            "num_draws": int(draws_per_chain),
            "model": fingerprint,
            # 1 for a network: its convergence is judged on its outputs (pyro_sgmcmc.diagnostics)
            "function_space": int(network),
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
            label="the training data (args)",
            chain_models=chain_models,
            read_output=network,
        )
        if test is not None:
            test_pass = _test_pass(
                model,
                samples,
                test,
                test_kwargs,
                args,
                plate_name=plate_name,
                chunk_size=chunk_size,
                read_output=network,
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


def _test_pass(
    model, samples, test, test_kwargs, args, *, plate_name, chunk_size, read_output=False
) -> _Pass:
    """The predictive pass on ``test``, with the test set checked first and the model's own
    failures on it reported as a ``ValueError`` naming ``test`` (not a tensor dump)."""
    test_kwargs = dict(test_kwargs or {})
    _check_finite("test", test, test_kwargs)
    _check_test_like_training(model, test, args)
    try:
        return _run_pass(
            model,
            samples,
            test,
            test_kwargs,
            plate_name=plate_name,
            chunk_size=chunk_size,
            want_log_likelihood=False,
            want_predictive=True,
            want_log_joint=False,
            use_fast_path=False,
            label="test",
            read_output=read_output,
        )
    except _DataError:
        raise
    except (RuntimeError, ValueError, IndexError, TypeError) as error:
        first_line = str(error).splitlines()[0] if str(error) else ""
        shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in test]
        raise ValueError(
            f"the model fails on the test set test= (shapes {shapes}): "
            f"{type(error).__name__}: {first_line}"
        ) from error


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
    check_model: bool = True,
) -> Any:
    r"""Convert an MCMC run or an SVI fit into an ``arviz.InferenceData`` (ArviZ 0.x) or an
    ``xarray.DataTree`` (ArviZ 1.x).

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
        The model's training arguments (full data); default to those of the run. NumPy arrays
        and lists of numbers are converted to tensors
        (:func:`~pyro_sgmcmc._validation.as_tensor_arguments`).
    test, test_kwargs:
        Positional (and keyword) model arguments of a test set, e.g. ``(x_test, y_test)`` or
        ``(x_test,)``: fills ``predictions`` and ``predictions_constant_data``. Each tensor must
        have the training tensor's dimensions but the rows, finite values, and observed values
        in the support of their distribution.
    num_draws:
        Draws per SVI fit, an integer >= 1 (ignored for MCMC).
    hmc_stats:
        The :class:`HMCStatsCollector` passed as ``hook_fn`` to ``MCMC`` for NUTS/HMC (any other
        object is a ``TypeError``).
    wall_time:
        Seconds the inference took; stored as the ``sampling_time`` attribute (used for ESS per
        second by :func:`pyro_sgmcmc.diagnostics.convergence_report`). SVI fits record their own.
    log_likelihood, posterior_predictive:
        Whether to compute those groups (one model trace per draw and row chunk).
    plate_name:
        Name of the data plate; also the name of the observation dimension.
    chunk_size:
        Rows of the data plate per trace (``None``: all at once); bounds memory for large data.
        Works for models that index their data with the plate's indices and for models that size
        the plate from the data (``obs=y``; their row-aligned tensor arguments are sliced).
    use_fast_path:
        Use the model's ``pointwise_log_likelihood`` method for ``log_likelihood`` if it has one.
    seed:
        Seed of the predictive draws (and of the SVI guide draws); ``None`` uses torch's global
        generator. The global generator's state is left untouched otherwise.
    dims:
        Dimension names (without ``chain``/``draw``) per variable, overriding the defaults
        ``<name>_dim_<k>`` and ``plate_name`` for the plate axis.
    check_model:
        Compare the fingerprint of ``model`` with the run's model when they are different
        objects (module docstring, "Checks"); ``False`` skips this comparison (never the check
        of the latent sites).

    Returns
    -------
    arviz.InferenceData or xarray.DataTree
        With the groups listed in the module docstring (a ``DataTree`` under ArviZ 1.x, whose
        children are these groups).

    Raises
    ------
    ModelMismatchError
        When ``model`` does not have the draws' latent sites and shapes, or is another
        ``BayesianMLP`` than the run's.
    ValueError
        On invalid arguments, a model without observed sites, data with NaN or infinite values,
        observed values outside their distribution's support (e.g. labels outside the classes), a
        test set whose columns differ from the training data's, or a model that fails on it.
    TypeError
        For an unknown source or an ``hmc_stats`` that is not an :class:`HMCStatsCollector`.

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
        check_model=check_model,
    )
    return _arviz.from_datasets(groups)


def to_datatree(
    source: Any, model: Callable[..., Any] | None = None, /, *args: Any, **options: Any
):
    """The groups of :func:`to_inference_data` as an ``xarray.DataTree`` (ArviZ 1.x layout).

    Takes the same arguments as :func:`to_inference_data`.
    """
    groups = build_groups(source, model, *args, **options)
    return xr.DataTree.from_dict({f"/{name}": dataset for name, dataset in groups.items()})


def from_draws(posterior: Mapping[str, Any], **groups: Mapping[str, Any]) -> Any:
    """The installed ArviZ's result object built from arrays of draws, e.g. of quantities
    derived from a run's samples.

    ArviZ 0.x spells this ``az.from_dict(posterior=...)`` and ArviZ 1.x
    ``az.from_dict({"posterior": ...})``; this call works under both.

    Parameters
    ----------
    posterior:
        Variable name to draws shaped ``(chain, draw, ...)`` (tensors or arrays); the other
        dimensions are named ``<name>_dim_<k>``.
    **groups:
        Other groups the same way, e.g. ``posterior_predictive={"obs": ...}``;
        ``observed_data`` and ``constant_data`` without ``chain`` and ``draw``.

    Returns
    -------
    arviz.InferenceData or xarray.DataTree
        ``InferenceData`` under ArviZ 0.x, ``DataTree`` under 1.x, for ``az.summary``,
        ``az.ess``, :func:`~pyro_sgmcmc.diagnostics.convergence_report` and the rest.

    Examples
    --------
    >>> import numpy as np
    >>> from pyro_sgmcmc.export import from_draws
    >>> idata = from_draws({"sigma": np.ones((2, 100))})
    >>> idata.posterior["sigma"].dims
    ('chain', 'draw')
    """
    as_arrays = {name: _numpy_draws(values) for name, values in groups.items()}
    return _arviz.from_samples(_numpy_draws(posterior), **as_arrays)


def _numpy_draws(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {
        name: value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        for name, value in variables.items()
    }
