"""The checked arguments of :func:`~pyro_sgmcmc.variational.svi.fit_svi`: every option validated,
the data converted and the model's structure read, before any fit starts.

:func:`~pyro_sgmcmc.variational.svi.fit_svi` puts its arguments into a :class:`FitPlan` as given;
:func:`check_plan` validates them (in a fixed order, so the first error reported does not depend
on how the code is arranged), converts the data to tensors, inspects the model's data plate
(:func:`~pyro_sgmcmc.models.structure.inspect_model`) and decides which loss the fits use
(the plain-torch fast path of a ``BayesianMLP``, or the Bayesian layers of another
``PyroModule``). The checked plan is what the fit loop of :mod:`pyro_sgmcmc.variational.svi_fit`
runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from pyro.nn import PyroModule

from .._validation import (
    as_tensor_arguments,
    check_model_kwargs,
    check_positive,
    check_positive_int,
)
from ..errors import ModelContractError
from ..models.contract_checks import check_finite_data
from ..models.model_params import param_sites
from ..models.structure import (
    DataPlate,
    data_mismatch,
    inspect_model,
    resolve_batch_size,
)
from ..nn.mlp import BayesianMLP
from .flipout_estimators import check_estimator
from .flipout_modules import BayesianLayer, check_layer_model
from .svi_prior import LearnableScaleMixturePrior, _resolve_prior

__all__ = ["FitPlan", "check_plan"]

OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]

#: The options of ``fit_svi``; its other keyword arguments go to the model.
_OPTIONS = (
    "num_steps",
    "batch_size",
    "learning_rate",
    "optimizer",
    "lr_scheduler",
    "num_particles",
    "analytic_kl",
    "estimator",
    "prior",
    "init_scale",
    "init_loc_fn",
    "guide_factory",
    "num_fits",
    "seed",
    "plate_name",
    "progress_bar",
    "callback",
    "num_threads",
)


@dataclass(frozen=True)
class FitPlan:
    """The arguments of :func:`~pyro_sgmcmc.variational.svi.fit_svi` (see there), and what they
    imply.

    Built from ``fit_svi``'s arguments as given; :func:`check_plan` returns a copy with every
    option checked, the data as tensors and the fields below the options filled in.

    Attributes
    ----------
    model, args, kwargs:
        The model (as :func:`~pyro_sgmcmc.models.structure.inspect_model` returns it, once
        checked) and its arguments.
    num_steps, batch_size, ..., num_threads:
        The options of ``fit_svi``; ``batch_size`` is ``B`` once checked.
    learnable:
        The learnable prior that ``prior`` names, or ``None``.
    plate, num_data:
        The data plate and its size ``N``.
    prior_sites:
        The sites that carry the learnable prior (empty without one).
    fast:
        Whether the loss is the plain-torch one of a ``BayesianMLP`` with the default guide.
    layers:
        The Bayesian layers of a ``PyroModule`` for the per-example estimators, else ``None``.
    params:
        The model's own parameters (``pyro.param``, ``PyroParam``) in its structure's trace,
        which the fits optimise with the guide's: their values there and constraints.
    """

    model: Callable[..., Any]
    args: tuple
    kwargs: dict[str, Any]
    num_steps: int
    batch_size: int | None
    learning_rate: float
    optimizer: OptimizerFactory | None
    lr_scheduler: SchedulerFactory | None
    num_particles: int
    analytic_kl: bool
    estimator: str
    prior: str | LearnableScaleMixturePrior | None
    init_scale: float
    init_loc_fn: Callable
    guide_factory: Callable[[Callable[..., Any]], Callable[..., Any]] | None
    num_fits: int
    seed: int | None
    plate_name: str
    progress_bar: bool
    callback: Callable[[int, int, Callable[..., Any], float], None] | None
    num_threads: int | None
    learnable: LearnableScaleMixturePrior | None = None
    plate: DataPlate | None = None
    num_data: int = 0
    prior_sites: tuple[str, ...] = ()
    fast: bool = False
    layers: Mapping[str, BayesianLayer] | None = None
    params: Mapping[str, tuple[torch.Tensor, Any]] = field(default_factory=dict)


def check_plan(plan: FitPlan) -> FitPlan:
    """``plan`` with its options checked, its data converted and its model inspected.

    Raises
    ------
    TypeError, ValueError
        As documented by :func:`~pyro_sgmcmc.variational.svi.fit_svi`.
    """
    return _with_data(_with_checked_options(plan))


def _with_checked_options(plan: FitPlan) -> FitPlan:
    """``plan`` with every option that does not depend on the data checked."""
    if not callable(plan.model):
        raise TypeError(f"model must be a callable Pyro model, got {type(plan.model).__name__}")
    check_model_kwargs("fit_svi", _OPTIONS, plan.model, plan.kwargs)
    num_steps = check_positive_int("num_steps", plan.num_steps)
    learning_rate = check_positive("learning_rate", plan.learning_rate)
    num_particles = check_positive_int("num_particles", plan.num_particles)
    estimator = check_estimator(plan.estimator)
    learnable = _resolve_prior(plan.prior)
    _check_callables(plan)
    if estimator != "reparameterization":
        _check_estimator_model(plan.model, estimator, plan.guide_factory, plan.plate_name)
    init_scale = check_positive("init_scale", plan.init_scale)
    num_fits = check_positive_int("num_fits", plan.num_fits)
    seed, num_threads = plan.seed, plan.num_threads
    if seed is not None:
        seed = check_positive_int("seed", seed, minimum=0)
    if num_threads is not None:
        num_threads = check_positive_int("num_threads", num_threads)
    return replace(
        plan,
        num_steps=num_steps,
        learning_rate=learning_rate,
        num_particles=num_particles,
        estimator=estimator,
        learnable=learnable,
        init_scale=init_scale,
        num_fits=num_fits,
        seed=seed,
        num_threads=num_threads,
    )


def _check_callables(plan: FitPlan) -> None:
    """Refuse a ``callback``, ``init_loc_fn`` or ``guide_factory`` that cannot be called."""
    if plan.callback is not None and not callable(plan.callback):
        raise TypeError(f"callback must be callable or None, got {plan.callback!r}")
    if not callable(plan.init_loc_fn):
        raise TypeError(
            f"init_loc_fn must be a Pyro init strategy (callable), got {plan.init_loc_fn!r}"
        )
    if plan.guide_factory is not None and not callable(plan.guide_factory):
        raise TypeError(
            f"guide_factory must be callable (model -> guide), got {plan.guide_factory!r}"
        )


def _check_estimator_model(
    model: Callable[..., Any],
    estimator: str,
    guide_factory: Callable[[Callable[..., Any]], Callable[..., Any]] | None,
    plate_name: str,
) -> None:
    """Refuse a model, guide or plate that the per-example ``estimator`` cannot handle."""
    if not isinstance(model, BayesianMLP | PyroModule):
        raise TypeError(
            f"estimator={estimator!r} needs model to be a pyro_sgmcmc.nn.BayesianMLP or a "
            "pyro.nn.PyroModule whose latent sites include the weight/bias PyroSample "
            "attributes of PyroModule[nn.Linear] or [nn.Conv1d/2d/3d] layers, got "
            f"{type(model).__name__}; use estimator='reparameterization' for other models"
        )
    if guide_factory is not None:
        raise ValueError(
            f"guide_factory must be None with estimator={estimator!r}: the estimator "
            "trains the parameters of the default AutoNormal guide"
        )
    if isinstance(model, BayesianMLP) and plate_name != "data":
        raise ValueError(f"plate_name must be 'data' for a BayesianMLP, got {plate_name!r}")


def _with_data(plan: FitPlan) -> FitPlan:
    """``plan`` with its data as checked tensors, its model's structure and minibatch size, the
    sites of its learnable prior and the loss its fits use."""
    args, kwargs = as_tensor_arguments(plan.args, plan.kwargs)
    check_finite_data(args, kwargs)
    try:
        structure = inspect_model(plan.model, args, kwargs, plan.plate_name)
    except ModelContractError:
        raise
    except (IndexError, RuntimeError, TypeError) as error:  # not the torch error and trace dump
        raise data_mismatch(
            plan.model, args, kwargs, plan.plate_name, error, "fit_svi(...)"
        ) from error
    model, plate, num_data = structure.model, structure.plate, structure.num_data
    batch_size = plan.batch_size
    if batch_size is not None:
        batch_size = check_positive_int("batch_size", batch_size)
    batch_size = resolve_batch_size(batch_size, num_data, plan.plate_name, plate)
    learnable = plan.learnable
    prior_sites = () if learnable is None else learnable.resolve_sites(model, structure.trace)
    fast = (
        isinstance(model, BayesianMLP) and plan.guide_factory is None and plan.plate_name == "data"
    )
    layers = None
    if plan.estimator != "reparameterization" and not fast:
        layers = check_layer_model(model, structure.trace)
    return replace(
        plan,
        model=model,
        args=args,
        kwargs=kwargs,
        batch_size=batch_size,
        plate=plate,
        num_data=num_data,
        prior_sites=prior_sites,
        fast=fast,
        layers=layers,
        params=param_sites(structure.trace),
    )
