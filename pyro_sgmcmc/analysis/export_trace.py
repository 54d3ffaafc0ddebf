"""Log-likelihood and predictive draws: the model traced once per draw and chunk of rows.

For every draw of a run the model is traced with its latent sites conditioned on the draw and
its observations un-conditioned (module docstring of :mod:`pyro_sgmcmc.analysis.export`,
"Log-likelihood and predictive draws"); a pass (:func:`_run_pass`) reads from each trace the
pointwise log-likelihood, the predictive draws, the log joint and the observed values, on the
training data or on a test set (:func:`_test_pass`). :mod:`~pyro_sgmcmc.analysis.export_groups`
stores what a pass returns as the ``log_likelihood``, ``posterior_predictive``, ``observed_data``,
``predictions`` and ``sample_stats`` groups.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.poutine.uncondition_messenger import UnconditionMessenger
from pyro.poutine.util import site_is_subsample

from ..errors import ModelContractError
from ..models.structure import MissingPlateError, plate_chunks, plate_frame, rows_log_prob
from .export_checks import _check_finite, _check_support, _check_test_like_training, _DataError
from .export_xarray import _numpy

__all__ = ["OUTPUT", "location", "plate_axes", "returned_output"]

#: The variable of ``posterior_predictive`` and ``predictions`` holding a model's outputs
#: (its return value, or its own site of that name): what networks are judged on.
OUTPUT = "output"


#: Distributions around another one, whose location is the other's.
_WRAPPERS = (
    dist.MaskedDistribution,
    dist.ExpandedDistribution,
    torch.distributions.Independent,
)


def returned_output(trace: poutine.Trace, latents: Collection[str] = ()) -> Any:
    """The outputs :math:`f(x)` a traced model returns: its return value, except where that is
    the value of one of its observed sites (not one of ``latents``, conditioned on a draw) --
    ``return pyro.sample("obs", ..., obs=y)``, as Pyro's examples end a model -- whose
    observations (or, with them removed, a draw of their noise) are not the network's outputs:
    then that site's distribution's :func:`location`."""
    returned = trace.nodes.get("_RETURN", {}).get("value")
    if not isinstance(returned, torch.Tensor):
        return returned
    for name, site in trace.nodes.items():
        if site["type"] == "sample" and name not in latents and site["value"] is returned:
            if site["infer"].get("_deterministic", False):
                return returned
            return location(site["fn"])
    return returned


def location(fn: Any) -> torch.Tensor | None:
    """A distribution's mean; a categorical's class probabilities (its mean is NaN); the
    location of a Cauchy or Student's t (whose mean may not exist); ``None`` for one without a
    mean. Wrappers (``.mask()``, ``.to_event()``, ``.expand()``) are seen through."""
    base = fn
    while isinstance(base, _WRAPPERS):
        base = base.base_dist
    shape = (*fn.batch_shape, *fn.event_shape)
    if isinstance(base, torch.distributions.Categorical):
        return base.probs.expand(*shape, base.probs.shape[-1])
    if isinstance(base, torch.distributions.OneHotCategorical):
        return base.probs.expand(shape)
    if isinstance(base, (torch.distributions.StudentT, torch.distributions.Cauchy)):
        return base.loc.expand(shape)
    try:
        return fn.mean
    except NotImplementedError:  # e.g. a TransformedDistribution: no outputs to judge
        return None


def _plate_axis_of_value(site: Mapping[str, Any], frame: Any) -> int:
    """The axis of the plate's rows in a site's value; ``0`` for a ``pyro.deterministic`` site
    whose every dimension is an event dimension (Pyro's default ``event_dim``), rows first."""
    return max(0, site["value"].dim() - site["fn"].event_dim + frame.dim)


class _Unconditioned(UnconditionMessenger):
    """Pyro's ``uncondition``: observed sites draw from their distributions (the observations
    kept in ``infer["obs"]``), except ``pyro.deterministic`` sites, which keep the value the
    model computed. Drawn from their ``Delta``, a deterministic site inside a plate (whose
    ``event_dim`` defaults to all its dimensions) would be broadcast against the plate: an
    ``(N, N)`` value, and every site computed from it ``(N, N)`` too."""

    def _pyro_sample(self, msg) -> None:
        if msg["is_observed"] and msg["infer"] and msg["infer"].get("_deterministic", False):
            msg["infer"]["was_observed"] = True
            msg["infer"]["obs"] = msg["value"]
            return
        super()._pyro_sample(msg)


def _discrete_as_integers(site: Mapping[str, Any], value: torch.Tensor) -> torch.Tensor:
    """``value`` of a site with a discrete support as integers (``int64``), as ArviZ stores
    counts and labels and its discrete checks and plots expect (Pyro's Bernoulli, Binomial and
    Poisson take and draw floats); any other value as it is."""
    if not value.is_floating_point():
        return value
    try:
        discrete = bool(site["fn"].support.is_discrete)
    except (AttributeError, NotImplementedError):  # a support that depends on the parameters
        return value
    return value.long() if discrete else value


def _first_rows(value: torch.Tensor, axis: int | None, num_rows: int | None) -> torch.Tensor:
    """``value`` cut to its first ``num_rows`` rows along the plate ``axis``: a plate that
    subsamples itself is padded to its own size
    (:meth:`~pyro_sgmcmc.models.structure.DataPlate.bind`)."""
    if axis is None or num_rows is None or value.dim() <= axis or value.shape[axis] <= num_rows:
        return value
    return value.narrow(axis, 0, num_rows)


class _Pass:
    """Outputs of one pass over the draws for one data set (training or test).

    The per-draw values of the ``num_draws`` draws (all chains, chain-major) are written into
    one array per site, allocated at the first draw: a list of per-draw arrays stacked at the
    end held every value twice (the export of 4 chains x 2,000 draws of 50,000 rows, 4.8 GB of
    groups, peaked at 13 GB).
    """

    def __init__(self, num_draws: int) -> None:
        self.num_draws = num_draws
        self.filled = 0  # the draws stored so far
        self.stored: dict[int, int] = {}  # id of a site's array -> the draws written to it
        self.log_likelihood: dict[str, np.ndarray] = {}
        self.predictive: dict[str, np.ndarray] = {}
        self.log_joint: list[float] = []
        self.observed: dict[str, np.ndarray] = {}
        self.plate_axis: dict[str, int | None] = {}
        # site -> {axis: plate} for the other plates its value spans (read on the first trace)
        self.plate_axes: dict[str, dict[int, str]] = {}
        # observed site -> (rows,) whether each row is in its likelihood, for the sites of which
        # poutine.mask leaves rows out (read on the first draw)
        self.observed_rows: dict[str, np.ndarray] = {}

    def put(self, group: dict[str, np.ndarray], name: str, value: np.ndarray) -> None:
        """Store the current draw's ``value`` of site ``name`` in ``group``: a site must be
        there, with one shape and dtype, in every draw (nothing is filled in or cast)."""
        if name not in group:
            if self.filled:
                raise _missing_site(name, 0)
            group[name] = np.empty((self.num_draws, *value.shape), dtype=value.dtype)
        stored = group[name]
        if value.shape != stored.shape[1:] or value.dtype != stored.dtype:
            raise ValueError(
                f"the export needs the same sites in every draw: site {name!r} has shape "
                f"{tuple(value.shape)} and dtype {value.dtype} in draw {self.filled}, "
                f"{tuple(stored.shape[1:])} and {stored.dtype} in the first"
            )
        stored[self.filled] = value
        self.stored[id(stored)] = self.filled + 1

    def check_complete(self, groups: tuple[dict[str, np.ndarray], ...]) -> None:
        """Raise if a site was left out of a draw after the first (its row never written)."""
        for group in groups:
            for name, stored in group.items():
                if self.stored.get(id(stored)) != self.filled:
                    raise _missing_site(name, self.stored.get(id(stored), 0))


def _missing_site(name: str, draw: int) -> ValueError:
    return ValueError(
        f"the export needs the same sites in every draw: site {name!r} is missing from draw "
        f"{draw} (a site the model visits only for some values of its latent sites)"
    )


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
        self.observed_rows: dict[str, list[torch.Tensor]] = {}
        self.log_joint = 0.0

    def add_fast_log_likelihood(self, value: torch.Tensor | Mapping[str, torch.Tensor]) -> None:
        if isinstance(value, torch.Tensor):
            value = {"__single__": value}
        for name, v in value.items():
            self.log_likelihood.setdefault(name, []).append(v.detach())

    def read(self, trace, latents, plate_name, wants: _Wants, chunk, keep, plate_axis) -> None:
        """Read one trace (chunk ``chunk`` of the rows, of which the first ``keep`` are real)."""
        if wants.predictive and wants.rows is not None:
            self._read_output(trace, latents, keep or wants.rows, plate_axis)
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
                        _discrete_as_integers(site, _first_rows(site["value"], axis, keep))
                    )
                continue
            if frame is None and chunk > 0:
                continue
            if site["infer"].get("is_auxiliary", False):
                self._read_factor(name, site, frame, wants, keep)
                continue
            self._read_observed(name, site, frame, wants, keep, plate_axis)

    def _read_factor(self, name, site, frame, wants: _Wants, keep) -> None:
        """``pyro.factor``: a term of the log density, not an observation. Inside the data plate
        its rows are pointwise log-likelihood terms; outside it, a term of the prior, in the log
        joint only. Neither has draws or observed values."""
        if frame is None:
            if wants.log_joint:
                self.log_joint += float(site["fn"].log_prob(site["infer"]["obs"]).sum())
            return
        if wants.log_likelihood or wants.log_joint:
            rows_lp = rows_log_prob(site, site["infer"]["obs"], frame)[: keep or None]
            if wants.log_likelihood:
                self.log_likelihood.setdefault(name, []).append(rows_lp)
            self.log_joint += float(rows_lp.sum())

    def _read_output(self, trace, latents, rows: int, plate_axis) -> None:
        """The model's return value as ``output`` -- a network's outputs :math:`f(x)`, one per
        row -- where the model returns a tensor with a leading axis of the rows and has no site
        of that name itself."""
        returned = returned_output(trace, latents)
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
            drawn = _first_rows(site["value"], axis, keep)
            self.predictive.setdefault(name, []).append(_discrete_as_integers(site, drawn))
        if self.first_draw:
            self.observed.setdefault(name, []).append(_discrete_as_integers(site, obs))
            if frame is not None:
                rows = _observed_rows(site, frame, obs.shape[axis])[: keep or None]
                self.observed_rows.setdefault(name, []).append(rows)

    def store(self, result: _Pass, want_log_joint: bool) -> None:
        for name, parts in self.log_likelihood.items():
            # float64: az.loo / az.compare lose the log-likelihood's precision in float32
            values = torch.cat([part.reshape(-1) for part in parts]).double()
            result.put(result.log_likelihood, name, _numpy(values))
        for name, parts in self.predictive.items():
            axis = result.plate_axis[name]
            joined = parts[0] if axis is None else torch.cat(parts, dim=axis)
            result.put(result.predictive, name, _numpy(joined))
        for name, parts in self.observed.items():
            axis = result.plate_axis[name]
            result.observed[name] = _numpy(parts[0] if axis is None else torch.cat(parts, axis))
        if want_log_joint:
            result.log_joint.append(self.log_joint)
        for name, parts in self.observed_rows.items():
            rows = torch.cat(parts)
            if not bool(rows.all()):
                result.observed_rows[name] = _numpy(rows)
        result.filled += 1
        result.check_complete((result.log_likelihood, result.predictive))


def _observed_rows(site: Mapping[str, Any], frame: Any, num_rows: int) -> torch.Tensor:
    """``(rows,)``: whether each row of the plate is in the site's likelihood, i.e. not left
    out altogether (every entry of the row masked) by ``poutine.mask`` or by a masked
    distribution (``dist.Normal(...).mask(m)``, also inside ``to_event``)."""
    observed = torch.ones(num_rows, dtype=torch.bool)
    for mask, batch_shape, dim in _masks(site, frame):
        if not isinstance(mask, torch.Tensor):
            if mask is False:
                observed = torch.zeros_like(observed)
            continue
        if len(batch_shape) < -dim:
            continue
        rows = torch.broadcast_to(mask, batch_shape).movedim(len(batch_shape) + dim, 0)
        observed = observed & rows.reshape(rows.shape[0], -1).any(-1).cpu()[:num_rows]
    return observed


def _masks(site: Mapping[str, Any], frame: Any) -> list[tuple[Any, torch.Size, int]]:
    """Each mask on a site with the batch shape it applies to and the plate's (negative) dim
    in that shape: ``poutine.mask``'s, then those of masked distributions among the wrappers
    (``to_event`` moves the plate's dim to the right by its reinterpreted dims)."""
    fn, dim = site["fn"], frame.dim
    found = [(site.get("mask"), fn.batch_shape, dim)]
    while isinstance(fn, (dist.MaskedDistribution, dist.Independent)):
        if isinstance(fn, dist.MaskedDistribution):
            found.append((fn._mask, fn.batch_shape, dim))
        else:
            dim -= fn.reinterpreted_batch_ndims
        fn = fn.base_dist
    return found


def _data_plate_size(model, latents, args, kwargs, plate_name) -> int:
    return _plate_chunks(model, latents, args, kwargs, plate_name, None)[0].num_data


def _plate_chunks(model, latents, args, kwargs, plate_name, chunk_size):
    try:
        return plate_chunks(model, args, kwargs, plate_name, latents, chunk_size)
    except MissingPlateError as error:
        raise error.naming("plate_name") from None
    except ModelContractError as error:
        if chunk_size is None:
            raise
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
    num_chains, num_draws = next(iter(draws.values())).shape[:2]
    result = _Pass(num_chains * num_draws)
    first = {name: value[0, 0] for name, value in draws.items()}
    plate, chunks = _plate_chunks(model, first, args, kwargs, plate_name, chunk_size)
    fast = use_fast_path and want_log_likelihood and hasattr(model, "pointwise_log_likelihood")
    # the plates' names, from one trace whatever the pass reads (the posterior's dims too), its
    # draws of the observations left out of the generator's stream (the pass's draws unchanged)
    with torch.random.fork_rng(devices=[]):
        first_model = model if chain_models is None else chain_models[0]
        trace = _trace_rows(first_model, plate, first, args, kwargs, chunks[0])
    result.plate_axes = plate_axes(trace, plate_name)
    wants = _Wants(
        log_likelihood=want_log_likelihood and not fast,
        predictive=want_predictive,
        log_joint=want_log_joint,
        label=label,
        rows=plate.num_data if read_output else None,
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
                    trace = _trace_rows(chain_model, plate, latents, args, kwargs, rows)
                    keep = None if rows is None else len(rows)
                    parts.read(trace, latents, plate_name, wants, k, keep, result.plate_axis)
            parts.store(result, want_log_joint)
    if not wants.any:  # no trace read per draw: ``observed_data`` still names its rows
        result.plate_axis.update(_observed_plate_axes(trace, plate_name))
    if fast and "__single__" in result.log_likelihood:
        _name_the_single_log_likelihood(result, model, first, args, kwargs, plate_name)
    if want_log_likelihood and not result.log_likelihood:
        raise ValueError("the model has no observed site: there is no log-likelihood to export")
    return result


def _observed_plate_axes(trace: poutine.Trace, plate_name: str) -> dict[str, int | None]:
    """Per observed site of a trace of :func:`_trace_rows`, the axis of its observations that
    the data plate ``plate_name`` spans (``None`` outside it), as :meth:`_DrawParts.read` finds
    it."""
    axes: dict[str, int | None] = {}
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site_is_subsample(site):
            continue
        if site["infer"].get("was_observed", False):
            frame = plate_frame(site, plate_name)
            axes[name] = None if frame is None else _plate_axis_of_value(site, frame)
    return axes


def plate_axes(trace: poutine.Trace, plate_name: str) -> dict[str, dict[int, str]]:
    """Per sample site of a trace of :func:`_trace_rows`, the axes of its value that a plate
    other than the data plate ``plate_name`` spans, named after that plate: ``{site: {axis:
    plate}}``, as NumPyro's ArviZ converter names them. The axis is the plate's dim counted from
    the value's batch dimensions (from its last dimension for a ``pyro.deterministic`` site,
    whose dimensions are all event dimensions by default). A plate that subsamples, an axis
    along which a value is broadcast (not of the plate's size), and an observed site whose
    observations have another shape than its draws name nothing (the axis keeps
    ``<site>_dim_<k>`` in every group); nor do plates named ``chain`` or ``draw``. (Pyro refuses
    two plates of one name.)"""
    axes: dict[str, dict[int, str]] = {}
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site_is_subsample(site) or site.get("fn") is None:
            continue
        value = site["value"]
        observed = site["infer"].get("obs", value) if site["infer"].get("was_observed") else value
        if not (isinstance(value, torch.Tensor) and isinstance(observed, torch.Tensor)):
            continue
        if observed.shape != value.shape:
            continue
        for frame in site["cond_indep_stack"]:
            if frame.name in (plate_name, "chain", "draw") or frame.dim is None:
                continue
            axis = _other_plate_axis(site, frame)
            full = frame.size if frame.full_size is None else frame.full_size
            if 0 <= axis < value.dim() and frame.size == full and value.shape[axis] == full:
                axes.setdefault(name, {})[axis] = frame.name
    return axes


def _other_plate_axis(site: Mapping[str, Any], frame: Any) -> int:
    """The axis of a plate's dim ``frame.dim`` in a site's value: counted from the value's batch
    dimensions, or from its last for a ``pyro.deterministic`` site, whose dimensions are all
    event dimensions by default (as :func:`_plate_axis_of_value` places the rows)."""
    value, fn = site["value"], site["fn"]
    axis = value.dim() - fn.event_dim + frame.dim
    if axis < 0 and site["infer"].get("_deterministic", False):
        axis = value.dim() + frame.dim
    return axis


def _trace_rows(model, plate, latents, args, kwargs, rows) -> Any:
    """One trace of ``model`` on the rows ``rows`` of the data plate (``None``: all), its latent
    sites conditioned on ``latents`` and its observed sites un-conditioned."""
    bound, call_args, call_kwargs = plate.bind(_Unconditioned()(model), args, kwargs, rows)
    with torch.no_grad():
        return poutine.trace(poutine.condition(bound, data=dict(latents))).get_trace(
            *call_args, **call_kwargs
        )


def _name_the_single_log_likelihood(
    result: _Pass, model, latents, args, kwargs, plate_name: str
) -> None:
    """File the one tensor a ``pointwise_log_likelihood`` returned under the name of the only
    observed site in the plate (refused if there are several)."""
    plated = [n for n, a in result.plate_axis.items() if a is not None] or _observed_in_plate(
        model, latents, args, kwargs, plate_name
    )
    if len(plated) != 1:
        raise ValueError(
            "pointwise_log_likelihood returned one tensor but the model has "
            f"{len(plated)} observed sites in the plate {plate_name!r}: {plated}; return a "
            "mapping from site name to tensor"
        )
    result.log_likelihood[plated[0]] = result.log_likelihood.pop("__single__")


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


def _test_pass(
    model, samples, test, test_kwargs, args, *, plate_name, chunk_size, read_output=False,
    chain_models=None,
) -> _Pass:  # fmt: skip
    """The predictive pass on ``test``, with the test set checked first and the model's own
    failures on it reported as a ``ValueError`` naming ``test`` (not a tensor dump);
    ``chain_models`` as for :func:`_run_pass`."""
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
            chain_models=chain_models,
        )
    except _DataError:
        raise
    except (RuntimeError, ValueError, IndexError, TypeError) as error:
        first_line = str(error).splitlines()[0] if str(error) else ""
        reason = _fewer_rows_than_subsample(first_line, plate_name)
        raise ValueError(
            f"the model fails on the test set {_shapes_of(test, test_kwargs)}: "
            f"{reason or type(error).__name__ + ': ' + first_line}"
        ) from error


def _fewer_rows_than_subsample(message: str, plate_name: str) -> str | None:
    """Pyro's refusal of a plate whose ``subsample_size`` exceeds its rows, reworded for a
    test set (``None`` for another error): Pyro's own message blames a guide."""
    found = re.match(r"subsample_size does not match len\(subsample\), (\d+) vs (\d+)", message)
    if found is None:
        return None
    size, rows = found.groups()
    return (
        f"a plate of the model (the data plate {plate_name!r}?) draws subsample_size={size} of "
        f"its {rows} rows on the test set, and a Pyro plate cannot draw more rows than it has: "
        f"give at least {size} test rows, or write the plate as pyro.plate({plate_name!r}, "
        f"len(x), subsample_size=min({size}, len(x)))"
    )


def _shapes_of(test: tuple, test_kwargs: Mapping[str, Any]) -> str:
    """``test=`` and ``test_kwargs=`` by their shapes, for a message."""

    def shape(value: Any) -> Any:
        return tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__

    described = f"test= (shapes {[shape(value) for value in test]})"
    if test_kwargs:
        keyword = {name: shape(value) for name, value in test_kwargs.items()}
        described += f" and test_kwargs= (shapes {keyword})"
    return described


def _observed_values(model, samples, args, kwargs) -> dict[str, np.ndarray]:
    latents = {n: v[0, 0] for n, v in samples.items()}
    trace = poutine.trace(poutine.condition(model, data=latents)).get_trace(*args, **kwargs)
    return {
        name: _numpy(_discrete_as_integers(site, site["value"]))
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and site["is_observed"]
        and not site_is_subsample(site)
        and name not in latents
        and not site["infer"].get("_deterministic", False)
        and not site["infer"].get("is_auxiliary", False)  # pyro.factor
    }
