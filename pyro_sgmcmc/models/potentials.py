r"""Minibatch potential energies :math:`\tilde U(z)` of ``C`` chains in unconstrained space.

For latent sites :math:`\theta = T^{-1}(z)` (Pyro's ``biject_to(support)``) and a minibatch
:math:`S` of :math:`B` indices out of :math:`N`,

.. math::

    \tilde U(z) = -\log p(\theta) - \frac{N}{B} \sum_{i \in S} \log p(y_i \mid \theta)
                  - \log \left| \det \frac{\partial \theta}{\partial z} \right|,

an unbiased estimate of the full-data potential. Every potential here evaluates ``C`` chains at
once: positions carry a leading chain axis, each chain has its own rows ``rows[c]``, and the
result has shape ``(C,)``. Since chain :math:`c'` does not depend on :math:`z_c`,

.. math::

    \nabla_{z_c} \sum_{c'=1}^{C} \tilde U_{c'}(z_{c'}) = \nabla_{z_c} \tilde U_c(z_c),

so one backward pass gives every chain its own gradient. Three implementations:

* :class:`ClosedFormPotential` calls a model's hand-written ``log_joint_and_gradient`` (e.g.
  :class:`pyro_sgmcmc.nn.BayesianMLP` in common settings): no autograd graph at all;
* :class:`LogJointPotential` differentiates a model's own ``log_joint(params, subsample, ...)``
  (the fast path: plain torch, no effect handlers), batched over chains when the model accepts a
  chain axis, else one chain at a time, and replays it from a recorded graph on the CPU;
* :class:`TracePotential` runs the model under Pyro's effect handlers (``condition`` on the latent
  values and on the data plate's rows, then ``trace``): any model that follows the data-plate
  contract, one chain at a time.

Their agreement is tested.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import pyro
import torch
from pyro import poutine
from torch.distributions.transforms import ComposeTransform, IndependentTransform, Transform

from ..engine.layout import FlatLayout
from .graph_capture import CapturedGraph
from .structure import DataPlate

TensorDict = dict[str, torch.Tensor]

__all__ = [
    "ClosedFormPotential",
    "LogJointPotential",
    "Potential",
    "SupportsLogJoint",
    "TracePotential",
    "closed_form_gradient_covers",
    "is_identity",
]


@runtime_checkable
class SupportsLogJoint(Protocol):
    """A model that computes its own minibatch log joint density (the fast path).

    ``log_joint(params, subsample, *args, **kwargs)`` must return
    :math:`\\log p(\\theta) + \\frac{N}{B}\\sum_{i\\in S} \\log p(y_i\\mid\\theta)` for constrained
    latent values ``params`` (a dict keyed by site name), the minibatch indices ``subsample``
    (``None`` means all ``N`` rows) and the same ``*args, **kwargs`` as the model: a scalar, or,
    when ``params`` carry a leading chain axis ``C`` and ``subsample`` has shape ``(C, B)``, one
    value per chain (shape ``(C,)``). It must agree with the model's Pyro trace; tests compare
    the two. On the CPU it is recorded once per argument signature and replayed
    (:class:`LogJointPotential`), so what it computes must depend on its arguments and the
    values only through tensor operations: Python state that changes between calls (a counter,
    a global flag) is not seen by the replays (``potential="trace"`` runs the Pyro model
    instead).
    """

    def log_joint(
        self, params: Mapping[str, torch.Tensor], subsample: torch.Tensor | None, *args, **kwargs
    ) -> torch.Tensor: ...


def is_identity(transform: Transform) -> bool:
    """Whether ``transform`` is the identity: ``biject_to`` of ``real`` or ``real_vector``, or the
    inverse of one (Pyro stores constrained-to-unconstrained transforms as ``biject_to(s).inv``)."""
    for candidate in (transform, transform.inv):
        while isinstance(candidate, IndependentTransform):
            candidate = candidate.base_transform
        if isinstance(candidate, ComposeTransform) and not candidate.parts:
            return True
    return False


class Potential:
    r"""Base class: :math:`\tilde U` of ``C`` chains, and its gradient by autograd.

    Parameters
    ----------
    transforms:
        Pyro's transforms from constrained to unconstrained space, one per latent site.
    layout:
        The sites that move (concatenated into the flat ``(C, D)`` positions); the others are
        held fixed (e.g. Gibbs-updated) and passed separately.
    num_data:
        :math:`N`, the size of the data plate.
    """

    def __init__(
        self, transforms: Mapping[str, Transform], layout: FlatLayout, num_data: int
    ) -> None:
        self.transforms = dict(transforms)
        self.non_identity = {k: t for k, t in self.transforms.items() if not is_identity(t)}
        self.layout = layout
        self.num_data = num_data

    @property
    def max_rows(self) -> int:
        """The most rows one evaluation may take (:math:`N` unless the model fixes fewer)."""
        return self.num_data

    def constrain(self, unconstrained: Mapping[str, torch.Tensor]) -> tuple[TensorDict, Any]:
        """Map ``(C, ...)`` values to constrained space; also return the ``(C,)`` log-Jacobian of
        the inverse transforms (``0.0`` when every site given is unconstrained)."""
        constrained = dict(unconstrained)
        log_det: torch.Tensor | float = 0.0
        for name, transform in self.non_identity.items():
            if name not in unconstrained:
                continue
            z = unconstrained[name]
            theta = transform.inv(z)
            constrained[name] = theta
            ladj = transform.inv.log_abs_det_jacobian(z, theta)
            log_det = log_det + ladj.reshape(z.shape[0], -1).sum(-1)
        return constrained, log_det

    def unconstrain(self, constrained: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Map constrained values (any leading dimensions) to unconstrained space."""
        unconstrained = dict(constrained)
        for name, transform in self.non_identity.items():
            if name in constrained:
                unconstrained[name] = transform(constrained[name])
        return unconstrained

    def log_joint(self, constrained: Mapping[str, torch.Tensor], rows: torch.Tensor | None):
        """The ``(C,)`` minibatch log joint densities at constrained values."""
        raise NotImplementedError  # pragma: no cover - abstract

    def compile(self) -> None:
        """Compile the computation with ``torch.compile`` (the first call compiles it): the
        potential that autograd differentiates, or the whole closed-form value and gradient."""
        self._evaluate = torch.compile(self._evaluate, dynamic=False)

    def _evaluate(
        self, unconstrained: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> torch.Tensor:
        constrained, log_det = self.constrain(unconstrained)
        return -(self.log_joint(constrained, rows) + log_det)

    def __call__(
        self, unconstrained: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> torch.Tensor:
        """:math:`\\tilde U` per chain, shape ``(C,)``, for ``(C, ...)`` values of every site."""
        return self._evaluate(unconstrained, rows)

    def value_and_grad(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:math:`\\tilde U` of each chain and its gradient with respect to the flat positions.

        Parameters
        ----------
        flat:
            ``(C, D)`` unconstrained positions of the moving sites (:attr:`layout`).
        fixed:
            ``(C, ...)`` unconstrained values of the other latent sites.
        rows:
            ``(C, B)`` minibatch rows of each chain, or ``None`` for all ``N`` rows.
        """
        leaf = flat.detach().requires_grad_(True)
        value = self({**self.layout.unflatten(leaf), **fixed}, rows)
        (grad,) = torch.autograd.grad(value.sum(), (leaf,))
        return value.detach(), grad

    def full_data_value_and_grad(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], chunk_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Full-data :math:`U(z)` and :math:`\nabla U(z)`, in chunks of ``chunk_size`` rows.

        The minibatch potential of the rows :math:`S_k` (:math:`|S_k| = B_k`) is
        :math:`\tilde U_{S_k} = -\log p(\theta) - \frac{N}{B_k}\sum_{i \in S_k} \log p(y_i \mid
        \theta) - \log|J|`, so :math:`\sum_k \frac{B_k}{N} \tilde U_{S_k} = U` exactly when the
        chunks partition the rows; memory is that of one chunk.
        """
        num_data = self.num_data
        chunk_size = min(chunk_size, self.max_rows)
        if chunk_size >= num_data:
            return self.value_and_grad(flat, fixed, None)
        value = flat.new_zeros(flat.shape[0])
        grad = torch.zeros_like(flat)
        for start in range(0, num_data, chunk_size):
            rows = torch.arange(start, min(start + chunk_size, num_data), device=flat.device)
            weight = rows.numel() / num_data
            chunk_value, chunk_grad = self.value_and_grad(
                flat, fixed, rows.expand(flat.shape[0], -1)
            )
            value += weight * chunk_value
            grad += weight * chunk_grad
        return value, grad


_HALF_LOG_TWO_PI = 0.5 * math.log(2 * math.pi)


class GaussianPrior:
    r"""The potential of constant Gaussian priors on moving sites, in closed form on the flat
    position.

    For the coordinates :math:`j` of the covered sites, with prior
    :math:`\theta_j \sim \mathcal N(\mu_j, \sigma_j^2)` (constants) and
    :math:`\lambda_j = \sigma_j^{-2}`,

    .. math::

        U_0(\theta) = \tfrac12 \sum_j \lambda_j (\theta_j - \mu_j)^2
                      + \sum_j \big(\log\sigma_j + \tfrac12 \log 2\pi\big), \qquad
        \nabla_{\theta_j} U_0 = \lambda_j (\theta_j - \mu_j),

    and nothing for the other coordinates (:math:`\lambda_j = 0`). A site is covered when it
    is unconstrained (identity transform), drawn with scale 1, no mask and outside every plate,
    from a ``Normal`` (possibly ``expand``-ed and ``to_event``-ed) whose ``loc`` and ``scale``
    do not depend on other latent values and whose shape is the site's.

    Attributes
    ----------
    sites:
        The covered sites and the distribution object each is drawn from.
    """

    def __init__(
        self,
        sites: Mapping[str, Any],
        loc: torch.Tensor | None,
        precision: torch.Tensor | float,
        log_normaliser: torch.Tensor | float,
    ) -> None:
        self.sites = dict(sites)
        self.loc, self.precision, self.log_normaliser = loc, precision, log_normaliser
        self._like: tuple[torch.dtype, torch.device] | None = None

    def __call__(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:math:`U_0` and :math:`\nabla U_0` of ``(C, D)`` positions (the gradient may be
        ``flat`` itself: for a standard normal prior it is the position)."""
        if self._like != (flat.dtype, flat.device):
            self.move_to(flat)
        loc, precision = self.loc, self.precision
        centred = flat if loc is None else flat - loc
        grad = centred if isinstance(precision, float) and precision == 1.0 else centred * precision
        value = torch.linalg.vecdot(centred, grad).mul_(0.5)
        return value.add_(self.log_normaliser), grad

    def move_to(self, like: torch.Tensor) -> None:
        """Keep the constants in the dtype and on the device of ``like`` (positions)."""
        for name in ("loc", "precision", "log_normaliser"):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(like))
        self._like = (like.dtype, like.device)


class ClosedFormPotential(Potential):
    r"""The model's hand-written gradient: ``log_joint_and_gradient(params, rows, *args)``.

    Applies when :func:`closed_form_gradient_covers` the moving sites: each is unconstrained and
    among the model's ``analytic_gradient_sites``; the fixed sites (e.g. Gibbs-updated
    precisions) are only read. No autograd graph is recorded, which removes most of the per-step
    overhead of a small network.

    A model whose prior is one Gaussian :math:`N(0, 1/\lambda)` over all the moving sites
    (``flat_gaussian_prior`` gives :math:`\lambda` and the log normaliser per coordinate) and
    which offers ``log_likelihood_and_gradient`` has its prior added here by
    :class:`GaussianPrior`, on the flat position :math:`z` in one reduction:
    :math:`U = \frac{\lambda}{2}|z|^2 + D\,\mathrm{log\_norm} - \frac{N}{B}\log p(y_S \mid z)`
    and :math:`\nabla U = \lambda z - \nabla \frac{N}{B} \log p(y_S \mid z)`, instead of one
    prior term per site inside the model.
    """

    #: Eager calls before the computation is recorded (the first moves the prior's constants).
    EAGER_CALLS = 2

    def __init__(self, model: Any, args: tuple, kwargs: Mapping[str, Any], *base: Any) -> None:
        super().__init__(*base)
        self.model, self.args, self.kwargs = model, args, dict(kwargs)
        self.flat_prior = _flat_gaussian_prior(model, self.layout)
        self.captured: CapturedGraph | None = CapturedGraph(self._closed_form)
        self._eager_calls = 0

    def log_joint(self, constrained: Mapping[str, torch.Tensor], rows: torch.Tensor | None):
        return self.model.log_joint(constrained, rows, *self.args, **self.kwargs)

    def compile(self) -> None:
        self.captured = None
        self._closed_form = torch.compile(self._closed_form, dynamic=False)

    def value_and_grad(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The closed form, replayed on the CPU from a recorded graph after the first calls
        (:class:`~pyro_sgmcmc.models.graph_capture.CapturedGraph`: the same operations without
        the Python around them); eager where it cannot be recorded, and on other devices (where
        the replay has not been measured)."""
        with torch.no_grad():
            recorded = self.captured is not None and flat.device.type == "cpu"
            if recorded and self._eager_calls >= self.EAGER_CALLS:
                result = self.captured(flat, fixed, rows)
                if result is not None:
                    return result
            self._eager_calls += 1
            return self._closed_form(flat, fixed, rows)

    def _closed_form(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        constrained_fixed, log_det = self.constrain(fixed)
        params = {**self.layout.unflatten(flat), **constrained_fixed}
        if self.flat_prior is None:
            log_joint, grads = self.model.log_joint_and_gradient(
                params, rows, *self.args, **self.kwargs
            )
            grad = self.layout.flatten(grads).neg_()
        else:  # the likelihood from the model, the Gaussian prior on the flat position
            log_joint, grads = self.model.log_likelihood_and_gradient(
                params, rows, *self.args, **self.kwargs
            )
            prior_value, prior_grad = self.flat_prior(flat)
            log_joint = log_joint.sub_(prior_value)  # the log joint: likelihood plus prior
            grad = torch.sub(prior_grad, self.layout.flatten(grads))
        value = log_joint.neg_() if isinstance(log_det, float) else (log_joint + log_det).neg_()
        return value, grad


class LogJointPotential(Potential):
    """Autograd through the model's own ``log_joint`` (see :class:`SupportsLogJoint`).

    ``batched`` says whether the model accepts a leading chain axis; if not, the chains are
    evaluated one after the other (a model whose ``log_joint`` handles one set of parameters).

    On the CPU, the value and gradient -- forward pass and autograd's backward pass together --
    are replayed from a recorded graph after a signature's first call
    (:class:`~pyro_sgmcmc.models.graph_capture.CapturedGraph`), the same operations in the same
    order without the Python around them: the same bits, in about half the time for
    a :class:`~pyro_sgmcmc.nn.BayesianMLP` with a Gamma noise precision (``docs/performance.md``).
    A ``log_joint`` that cannot be recorded (Python control flow on a latent value) stays eager.
    """

    def __init__(
        self,
        model: SupportsLogJoint,
        args: tuple,
        kwargs: Mapping[str, Any],
        *base: Any,
        batched: bool = True,
    ) -> None:
        super().__init__(*base)
        self.model, self.args, self.kwargs = model, args, dict(kwargs)
        self.batched = batched
        self.captured: CapturedGraph | None = CapturedGraph(self._autograd_value_and_grad)

    def compile(self) -> None:
        """Compile the potential with ``torch.compile`` instead of replaying recorded graphs."""
        self.captured = None
        super().compile()

    def value_and_grad(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`Potential.value_and_grad`, replayed on the CPU from a recorded graph; eager
        where it cannot be recorded, and on other devices (where the replay has not been
        measured)."""
        if self.captured is not None and flat.device.type == "cpu":
            result = self.captured(flat, fixed, rows)
            if result is not None:
                return result
        return self._autograd_value_and_grad(flat, fixed, rows)

    def _autograd_value_and_grad(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # the model was checked with validation on (inspection, the chain-axis probe); here a
        # distribution's support check would decide in Python on a value, which cannot be
        # recorded (e.g. the log density of a latent noise scale under a HalfNormal prior)
        with pyro.validation_enabled(False):
            return super().value_and_grad(flat, fixed, rows)

    def log_joint(self, constrained: Mapping[str, torch.Tensor], rows: torch.Tensor | None):
        if self.batched:
            return self.model.log_joint(constrained, rows, *self.args, **self.kwargs)
        return _per_chain(
            lambda params, chain_rows: self.model.log_joint(
                params, chain_rows, *self.args, **self.kwargs
            ),
            constrained,
            rows,
        )


class TracePotential(Potential):
    """The general path: each chain's model trace under Pyro's effect handlers.

    The latent sites are conditioned on the chain's values and the model is restricted to the
    chain's rows by its data plate (:meth:`~pyro_sgmcmc.models.structure.DataPlate.bind`: the
    plate's indices conditioned, or the data arguments sliced), with the plate's sites weighted
    by ``N/B``.

    Parameters
    ----------
    model, args, kwargs:
        The Pyro model and its arguments (full data).
    *base:
        ``transforms``, ``layout``, ``num_data`` (see :class:`Potential`).
    plate:
        The model's data plate (:class:`~pyro_sgmcmc.models.structure.DataPlate`), or its name
        for a plate indexed by its indices.
    """

    def __init__(
        self,
        model: Callable[..., Any],
        args: tuple,
        kwargs: Mapping[str, Any],
        *base: Any,
        plate: DataPlate | str = "data",
    ) -> None:
        super().__init__(*base)
        self.model, self.args, self.kwargs = model, args, dict(kwargs)
        self.plate = DataPlate(plate, self.num_data) if isinstance(plate, str) else plate

    @property
    def max_rows(self) -> int:
        return self.plate.max_rows

    def log_joint(self, constrained: Mapping[str, torch.Tensor], rows: torch.Tensor | None):
        return _per_chain(self._one_chain, constrained, rows)

    def _one_chain(self, params: TensorDict, rows: torch.Tensor | None) -> torch.Tensor:
        model, args, kwargs = self.plate.bind(self.model, self.args, self.kwargs, rows)
        conditioned = poutine.condition(model, data=params)
        return poutine.trace(conditioned).get_trace(*args, **kwargs).log_prob_sum()


def _per_chain(
    log_joint: Callable[[TensorDict, torch.Tensor | None], torch.Tensor],
    constrained: Mapping[str, torch.Tensor],
    rows: torch.Tensor | None,
) -> torch.Tensor:
    """Stack ``log_joint`` of each chain's values and rows into a ``(C,)`` tensor."""
    num_chains = next(iter(constrained.values())).shape[0]
    values = [
        log_joint(
            {name: value[c] for name, value in constrained.items()},
            None if rows is None else rows[c],
        )
        for c in range(num_chains)
    ]
    return torch.stack(values)


def _flat_gaussian_prior(model: Any, layout: FlatLayout) -> GaussianPrior | None:
    """The closed form of the model's ``flat_gaussian_prior`` (precision, log normaliser per
    coordinate) when it has one and ``log_likelihood_and_gradient``, and its prior covers
    exactly the flat position's sites: the potential then adds the prior on the position."""
    prior = getattr(model, "flat_gaussian_prior", None)
    covered = getattr(model, "analytic_gradient_sites", None)
    if (
        prior is None
        or not callable(getattr(model, "log_likelihood_and_gradient", None))
        or covered is None
        or set(covered) != set(layout.names)
    ):
        return None
    precision, log_norm = prior
    sites = dict.fromkeys(layout.names, model.prior)
    return GaussianPrior(sites, None, precision, layout.dimension * log_norm)


def closed_form_gradient_covers(
    model: Any, sites: tuple[str, ...], non_identity: Mapping[str, Transform]
) -> bool:
    """Whether ``model``'s closed-form gradient (``has_analytic_gradient``,
    ``log_joint_and_gradient``) can replace autograd for ``sites``: each is unconstrained (not in
    ``non_identity``) and among the model's ``analytic_gradient_sites`` (when it declares them);
    the other sites are only read."""
    declared = getattr(model, "analytic_gradient_sites", None)
    return (
        bool(getattr(model, "has_analytic_gradient", False))
        and callable(getattr(model, "log_joint_and_gradient", None))
        and not any(name in non_identity for name in sites)
        and (declared is None or set(sites) <= set(declared))
    )
