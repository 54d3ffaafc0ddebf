r"""The fast path for any Pyro model: its log joint through one light handler, chains at once.

:class:`~pyro_sgmcmc.models.potentials.TracePotential` runs the model under ``poutine.condition``
and ``poutine.trace`` and sums the trace's log-densities: it builds a trace data structure, one
message per handler and site, and evaluates one chain at a time. For a model whose structure is
fixed (the same sample sites on every call), none of that is needed. :class:`LogDensity` is a single
handler that, at each sample site,

* gives a latent site its value (and the data plate's index site the minibatch rows), and
* adds the site's log-density, weighted as Pyro weights it (the plate's :math:`N/B`, masks),

so one call of the model *is* its minibatch log joint
:math:`\log p(\theta) + \frac{N}{B}\sum_{i\in S}\log p(y_i\mid\theta)`, differentiable by
autograd. :class:`FunctionalPotential` evaluates it for ``C`` chains in one call with
``torch.func.vmap`` over the chain axis (each chain its own parameters and rows), falling back to
one call per chain when the model's code cannot be vectorised (e.g. Python control flow on a
sampled value), and to the trace path, with a one-line notice, if the set of sites changes
between calls. Its values and gradients equal the trace path's (tested).

The usual prior of a Bayesian network, a ``Normal`` with constant parameters on every weight
(``PyroSample(dist.Normal(0, s).expand(shape).to_event(...))``), is taken out of the autograd
graph: :class:`~pyro_sgmcmc.models.potentials.GaussianPrior` adds its potential and gradient in
closed form on the flat position, one fused pass over the weights instead of a graph of element-wise
operations whose backward pass costs as much as a layer. The handler checks at every call that each
such site is still drawn from the very distribution object it was found with (a ``PyroSample`` prior
is stored on the module, so it is), and gives the closed form up for good otherwise.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.subsample_messenger import _Subsample
from torch.distributions import Independent, Normal

from ..errors import SamplerWarning
from .graph_capture import CapturedGraph
from .potentials import _HALF_LOG_TWO_PI, GaussianPrior, Potential, TracePotential
from .structure import DataPlate

__all__ = ["FunctionalPotential", "LogDensity", "StructureChanged", "find_gaussian_prior"]

TensorDict = dict[str, torch.Tensor]


class StructureChanged(RuntimeError):
    """The model visited other sample sites than on the first call."""


class PriorChanged(Exception):
    """A site whose prior is added in closed form was drawn from another distribution."""


class LogDensity(Messenger):
    r"""Run a model at given latent values and rows, accumulating its weighted log-density.

    Parameters
    ----------
    values:
        Constrained values of the latent sites.
    plate:
        The model's data plate.
    rows:
        The minibatch rows (``None``: all rows). For an indexed plate they become the plate's
        indices; for a sliced plate the caller has already sliced the data and the plate's
        sites are weighted here by :math:`N/B`.
    expected:
        The names of the sample sites the model must visit, in order; anything else raises
        :class:`StructureChanged`.
    analytic:
        Latent sites whose log-density the caller adds in closed form, each with the
        distribution object it must be drawn from (else :class:`PriorChanged` is raised); they
        add nothing to :attr:`total`.

    Attributes
    ----------
    total:
        :math:`\sum_{\text{sites}} \text{scale} \cdot \log p`, after the model ran.
    priors:
        The distribution of each latent site drawn with scale 1, no mask and outside every
        plate (candidates for the closed form), after the model ran.
    """

    def __init__(
        self,
        values: Mapping[str, torch.Tensor],
        plate: DataPlate,
        rows: torch.Tensor | None,
        expected: tuple[str, ...] | None = None,
        analytic: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.values, self.plate, self.rows = values, plate, rows
        self.expected = expected
        self.analytic = analytic or {}
        self.priors: dict[str, Any] = {}
        self.visited: list[str] = []
        self.total: torch.Tensor | float = 0.0
        self.factor, self.keep = 1.0, None
        if rows is not None:
            self._plan_weights(rows)

    def _plan_weights(self, rows: torch.Tensor) -> None:
        plate, kept = self.plate, rows.shape[-1]
        if plate.mode == "sliced":
            self.factor = plate.num_data / kept
        elif plate.subsample_size is not None and kept < plate.subsample_size:
            size = plate.subsample_size
            self.rows = torch.cat([rows, rows.new_zeros(size - kept)])
            self.factor = size / kept
            self.keep = torch.arange(size, device=rows.device) < kept

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        name = msg["name"]
        if isinstance(msg["fn"], _Subsample):
            if name == self.plate.name and self.rows is not None and self.plate.mode == "indexed":
                msg["value"], msg["is_observed"] = self.rows, True
            return
        value = self.values.get(name)
        if value is not None:
            msg["value"], msg["is_observed"] = value, True

    def _pyro_post_sample(self, msg: dict[str, Any]) -> None:
        name = msg["name"]
        if isinstance(msg["fn"], _Subsample):
            return
        self.visited.append(name)
        expected = self.expected
        if expected is not None and (
            len(self.visited) > len(expected) or expected[len(self.visited) - 1] != name
        ):
            raise StructureChanged(f"sample site {name!r} where the first call had another")
        scale = msg["scale"]
        plain = (
            isinstance(scale, float | int)
            and scale == 1.0
            and msg["mask"] is None
            and not msg["cond_indep_stack"]
        )
        if name in self.analytic:
            if msg["fn"] is not self.analytic[name] or not plain:
                raise PriorChanged(name)
            return  # added in closed form by the caller
        if plain and name in self.values:
            self.priors[name] = msg["fn"]
        self.total = self.total + self._weighted_log_prob(msg)

    def _weighted_log_prob(self, msg: dict[str, Any]) -> torch.Tensor:
        log_prob = site_log_prob(msg["fn"], msg["value"])
        mask, scale = msg["mask"], msg["scale"]
        frame = next((f for f in msg["cond_indep_stack"] if f.name == self.plate.name), None)
        if frame is not None:
            scale = scale * self.factor
            if self.keep is not None and frame.dim is not None:
                keep = self.keep.reshape((-1,) + (1,) * (-1 - frame.dim))
                mask = keep if mask is None or mask is True else keep & mask
        if mask is not None and mask is not True:
            if mask is False:
                return log_prob.new_zeros(())
            log_prob = torch.where(mask, log_prob, log_prob.new_zeros(()))
        return (log_prob * scale).sum() if torch.is_tensor(scale) else log_prob.sum() * scale


class FunctionalPotential(Potential):
    r""":math:`\tilde U` of ``C`` chains through :class:`LogDensity`, vectorised over chains.

    Parameters
    ----------
    model, args, kwargs:
        The Pyro model and its arguments (full data).
    *base:
        ``transforms``, ``layout``, ``num_data`` (see
        :class:`~pyro_sgmcmc.models.potentials.Potential`).
    plate:
        The model's data plate.
    sites:
        The sample sites of the model, in the order it visits them (from its trace); by default
        those of the first call.
    """

    def __init__(
        self,
        model: Callable[..., Any],
        args: tuple,
        kwargs: Mapping[str, Any],
        *base: Any,
        plate: DataPlate,
        sites: tuple[str, ...] | None = None,
    ) -> None:
        super().__init__(*base)
        self.model, self.args, self.kwargs = model, tuple(args), dict(kwargs)
        self.plate, self.sites = plate, sites
        self.data_keys = plate.data_args if plate.mode == "sliced" else ()
        self.vectorized = True
        self.fallback: TracePotential | None = None
        #: The closed-form Gaussian prior: ``None`` until the first call has found the priors,
        #: ``False`` where there is none (or it was given up).
        self.gaussian_prior: GaussianPrior | bool | None = None
        self._analytic: Mapping[str, Any] = {}
        self._found_priors: dict[str, Any] = {}
        self._first_priors: dict[str, Any] | None = None
        self.captured: CapturedGraph | None = CapturedGraph(self._eager_value_and_grad)

    def compile(self) -> None:
        """Compile the recorded graphs with TorchInductor
        (:class:`~pyro_sgmcmc.models.graph_capture.CapturedGraph`); a model that cannot be recorded
        stays eager."""
        if self.captured is not None:
            self.captured.compile = True

    def value_and_grad(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`Potential.value_and_grad`, replayed from a recorded graph
        (:class:`~pyro_sgmcmc.models.graph_capture.CapturedGraph`) once the first call has found the
        model's sites and priors; eager where the model cannot be recorded."""
        captured = self.captured
        if captured is not None and self.gaussian_prior is not None and self.fallback is None:
            decided = (self.vectorized, self.gaussian_prior)
            result = captured(flat, fixed, rows)
            if result is not None:
                return result
            self.vectorized, self.gaussian_prior = decided  # a failed recording decides nothing
        return self._eager_value_and_grad(flat, fixed, rows)

    def _eager_value_and_grad(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Autograd through the handler, with the Gaussian priors of the moving sites
        (:class:`~pyro_sgmcmc.models.potentials.GaussianPrior`) in closed form once the first call
        has found them."""
        prior = self.gaussian_prior
        if prior is None or prior is False or self.fallback is not None:
            value, grad = super().value_and_grad(flat, fixed, rows)
            if prior is None:
                self._decide_gaussian_prior(flat)
            return value, grad
        self._analytic = prior.sites
        try:
            value, grad = super().value_and_grad(flat, fixed, rows)
        except PriorChanged:
            self._analytic, self.gaussian_prior = {}, False  # e.g. a prior built at every call
            return super().value_and_grad(flat, fixed, rows)
        finally:
            self._analytic = {}
        prior_value, prior_grad = prior(flat)
        return value + prior_value, grad.add_(prior_grad)

    def _decide_gaussian_prior(self, like: torch.Tensor) -> None:
        """After the first two calls: the closed form for the sites drawn from the very same
        distribution object in both (a ``PyroSample`` prior stored on the module; a prior
        built at every call, e.g. from another latent value, is never the same object)."""
        seen, self._found_priors = self._found_priors, {}
        if self._first_priors is None:
            self._first_priors = seen
            return
        same = {name: fn for name, fn in seen.items() if self._first_priors.get(name) is fn}
        self._first_priors = {}
        prior = find_gaussian_prior(same, self.layout, self.non_identity)
        if prior is not None:
            prior.move_to(like)
        self.gaussian_prior = prior or False

    @property
    def max_rows(self) -> int:
        return self.plate.max_rows

    def log_joint(self, constrained: Mapping[str, torch.Tensor], rows: torch.Tensor | None):
        if self.fallback is None:
            try:
                # the model was checked with validation on (inspection, first trace); here the
                # checks would cost a pass over every value, and cannot run under vmap
                with pyro.validation_enabled(False):
                    return self._vectorized_or_not(constrained, rows)
            except StructureChanged as error:
                self._fall_back(str(error))
        return self.fallback.log_joint(constrained, rows)

    def _vectorized_or_not(self, constrained, rows) -> torch.Tensor:
        """``vmap`` over several chains while the model's code allows it (the first call
        decides), else one call per chain."""
        if self.vectorized and next(iter(constrained.values())).shape[0] > 1:
            try:
                return self._all_chains(constrained, rows)
            except StructureChanged:
                raise
            except (RuntimeError, ValueError, TypeError, IndexError):
                self.vectorized = False  # e.g. Python control flow on a sampled value
        return self._chain_by_chain(constrained, rows)

    def _chain_by_chain(self, constrained, rows) -> torch.Tensor:
        sliced = self._sliced(rows)
        num_chains = next(iter(constrained.values())).shape[0]
        # unbind, not indexing: one backward node per site, not one full-size copy per chain
        values = {name: _chains(value) for name, value in constrained.items()}
        chain_rows = [None] * num_chains if rows is None else _chains(rows)
        chain_data = [_chains(d) for d in sliced]
        return torch.stack(
            [
                self._one_chain(
                    {name: value[c] for name, value in values.items()},
                    chain_rows[c],
                    tuple(d[c] for d in chain_data),
                )
                for c in range(num_chains)
            ]
        )

    def _all_chains(self, constrained, rows) -> torch.Tensor:
        """One vectorised call: ``vmap`` over the chain axis of the values, rows and data."""
        batched = torch.func.vmap(
            self._one_chain, in_dims=(0, None if rows is None else 0, 0), randomness="error"
        )
        return batched(dict(constrained), rows, self._sliced(rows))

    def _one_chain(
        self, params: TensorDict, rows: torch.Tensor | None, data: tuple
    ) -> torch.Tensor:
        args, kwargs = self._arguments(data)
        handler = LogDensity(params, self.plate, rows, self.sites, self._analytic)
        with handler:
            self.model(*args, **kwargs)
        if self.gaussian_prior is None:
            self._found_priors = handler.priors
        if self.sites is None:
            self.sites = tuple(handler.visited)
        elif len(handler.visited) != len(self.sites):
            raise StructureChanged(
                f"{len(handler.visited)} sample sites where the first call had {len(self.sites)}"
            )
        total = handler.total
        return total if torch.is_tensor(total) else torch.zeros(())

    def _sliced(self, rows: torch.Tensor | None) -> tuple:
        """The data arguments restricted to each chain's rows, ``(C, B, ...)`` each (none
        without rows: the model then takes the full data)."""
        if not self.data_keys or rows is None:
            return ()
        values = [self._argument(key) for key in self.data_keys]
        flat_rows = rows.reshape(-1)
        return tuple(
            v.index_select(0, flat_rows.to(v.device)).reshape(*rows.shape, *v.shape[1:])
            for v in values
        )

    def _argument(self, key: int | str) -> torch.Tensor:
        return self.args[key] if isinstance(key, int) else self.kwargs[key]

    def _arguments(self, data: tuple) -> tuple[tuple, dict[str, Any]]:
        if not data:
            return self.args, self.kwargs
        given = dict(zip(self.data_keys, data, strict=True))
        args = tuple(given.get(i, value) for i, value in enumerate(self.args))
        kwargs = {k: given.get(k, value) for k, value in self.kwargs.items()}
        return args, kwargs

    def _fall_back(self, reason: str) -> None:
        warnings.warn(
            f"the model's structure changes between calls ({reason}): sampling it through "
            "Pyro's trace path, which is slower",
            SamplerWarning,
            stacklevel=4,
        )
        self.fallback = TracePotential(
            self.model,
            self.args,
            self.kwargs,
            self.transforms,
            self.layout,
            self.num_data,
            plate=self.plate,
        )


def _chains(value: torch.Tensor) -> Sequence[torch.Tensor]:
    """The chains of a ``(C, ...)`` tensor, as views whose backward pass copies nothing for
    ``C = 1`` (a squeeze) and one stack otherwise (an unbind)."""
    return (value.squeeze(0),) if value.shape[0] == 1 else value.unbind(0)


def find_gaussian_prior(
    priors: Mapping[str, Any], layout: Any, non_identity: Mapping[str, Any]
) -> GaussianPrior | None:
    """The closed form (:class:`~pyro_sgmcmc.models.potentials.GaussianPrior`) for the sites of
    ``layout`` whose prior in ``priors`` (site -> distribution, as the model drew them)
    qualifies; ``None`` if none does. A site qualifies when it is unconstrained (identity
    transform), drawn with scale 1, no mask and outside every plate, from a ``Normal``
    (possibly ``expand``-ed and ``to_event``-ed) whose ``loc`` and ``scale`` do not depend on
    other latent values and whose shape is the site's. The drivers call it after two calls of
    the model: a site is a candidate only if both drew it from the same distribution object,
    so its parameters cannot depend on latent values."""
    covered, locs, scales = {}, [], []
    for name, shape in layout.shapes.items():
        fn = priors.get(name)
        found = None if fn is None or name in non_identity else _normal_parameters(fn, shape)
        if found is not None:
            covered[name] = fn
        size = math.prod(shape)
        if found is None:  # not covered: precision 0, no normaliser
            found = (torch.zeros(()), torch.full((), math.inf))
        loc, scale = (part.detach().to("cpu", torch.float64) for part in found)
        locs.append(loc.expand(shape).reshape(size))
        scales.append(scale.expand(shape).reshape(size))
    if not covered:
        return None
    loc, scale = torch.cat(locs), torch.cat(scales)
    precision = scale.square().reciprocal()  # 0 where a site is not covered
    kept = torch.isfinite(scale)
    log_normaliser = (scale[kept].log() + _HALF_LOG_TWO_PI).sum()
    if bool((loc == 0).all()):
        loc = None
    if bool((precision == precision[0]).all()):
        precision = float(precision[0])
    return GaussianPrior(covered, loc, precision, log_normaliser)


def _normal_parameters(fn: Any, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(loc, scale)`` of a ``Normal`` prior (through ``Independent`` wrappers) whose parameters
    are constants and whose batch and event shapes make up ``shape``; else ``None``."""
    if tuple(fn.batch_shape) + tuple(fn.event_shape) != tuple(shape):
        return None
    base = fn
    while isinstance(base, Independent):
        base = base.base_dist
    if type(base) not in (Normal, dist.Normal):
        return None
    loc, scale = base.loc, base.scale
    if loc.requires_grad or scale.requires_grad:
        return None  # it depends on values being differentiated
    return loc, scale


def site_log_prob(fn: Any, value: torch.Tensor) -> torch.Tensor:
    r"""``fn.log_prob(value)`` without argument validation (the drivers check values and data
    once, not per step), and for a ``Normal`` prior whose ``loc`` and ``scale`` are one number
    expanded to the site's shape (``dist.Normal(0, s).expand(shape)``, the usual ``PyroSample``
    prior) evaluated with those numbers, :math:`-\tfrac12 ((v - \mu)/s)^2 - \log s -
    \tfrac12 \log 2\pi`: the same values, without materialising ``scale ** 2`` and
    ``log(scale)`` over every weight."""
    events = 0
    base = fn
    while isinstance(base, Independent):
        events += base.reinterpreted_batch_ndims
        base = base.base_dist
    if (
        type(base) in (Normal, dist.Normal)
        and _is_expanded_number(base.loc)
        and _is_expanded_number(base.scale)
    ):
        loc, scale = base.loc.reshape(-1)[0], base.scale.reshape(-1)[0]
        log_prob = -0.5 * ((value - loc) / scale).square() - (scale.log() + _HALF_LOG_TWO_PI)
        log_prob = log_prob.expand(torch.broadcast_shapes(log_prob.shape, base.batch_shape))
        return log_prob.sum(tuple(range(-events, 0))) if events else log_prob
    validate, fn._validate_args = getattr(fn, "_validate_args", False), False
    try:
        return fn.log_prob(value)
    finally:
        fn._validate_args = validate


def _is_expanded_number(tensor: torch.Tensor) -> bool:
    """A tensor that is one number broadcast to its shape (every stride zero)."""
    return torch.is_tensor(tensor) and all(stride == 0 for stride in tensor.stride())
