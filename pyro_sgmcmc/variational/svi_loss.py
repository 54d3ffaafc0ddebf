r"""The differentiable loss of one minibatch: Pyro's ELBO, or the plain-torch estimators.

:func:`minibatch_elbo_loss` is the minibatch estimate :math:`\hat L_S` of the docstring of
:mod:`pyro_sgmcmc.variational.svi` through Pyro's ELBO on the model restricted to a minibatch (any
model and guide). :func:`_step_loss` chooses, once per fit, the function ``subsample -> loss`` that
the optimisation loop of :mod:`pyro_sgmcmc.variational.svi_fit` calls every step: that one, the
plain-torch loss of a ``BayesianMLP`` (:func:`~pyro_sgmcmc.variational.flipout.guide_negative_elbo`)
or the per-example estimators of another ``PyroModule``
(:mod:`pyro_sgmcmc.variational.flipout_modules`), with the learnable prior of
:mod:`pyro_sgmcmc.variational.svi_prior` substituted where there is one.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal

from ..models.structure import DataPlate
from .flipout_mlp import guide_negative_elbo
from .flipout_modules import BayesianLayer, _layer_negative_elbo
from .svi_prior import ScaleMixtureParameters, _SubstitutePrior

__all__ = ["minibatch_elbo_loss"]


def minibatch_elbo_loss(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    subsample: torch.Tensor | None,
    *args: Any,
    plate: DataPlate | str = "data",
    num_particles: int = 1,
    analytic_kl: bool = True,
    **kwargs: Any,
) -> torch.Tensor:
    r"""Differentiable :math:`\hat L_S` (module docstring) on the minibatch ``subsample``.

    ``subsample=None`` gives the full-data negative ELBO estimate (for a plate that subsamples
    itself, :math:`\sum_k \frac{|S_k|}{N} \hat L_{S_k}` over chunks :math:`S_k` of the rows,
    equally unbiased). ``plate`` is the model's :class:`~pyro_sgmcmc.models.structure.DataPlate`
    (how a minibatch restricts it), or the name of a plate indexed by its indices. With
    ``analytic_kl`` the estimator is Pyro's ``TraceMeanField_ELBO``: :math:`\mathrm{KL}(q_j\,\|
    \,p_j)` in closed form for every site where torch registers it (e.g. Normal guide and Normal
    prior), the Monte Carlo term :math:`\log q - \log p` elsewhere (e.g. the scale-mixture
    prior); otherwise ``Trace_ELBO`` (Monte Carlo everywhere). Both are unbiased for the same loss.
    """
    if isinstance(plate, str):
        plate = DataPlate(plate, 0)
    elbo_class = TraceMeanField_ELBO if analytic_kl else Trace_ELBO
    elbo = elbo_class(num_particles=num_particles)
    if subsample is None and plate.subsample_size is not None:
        chunks = torch.arange(plate.num_data).split(plate.subsample_size)
        return sum(
            len(rows)
            / plate.num_data
            * minibatch_elbo_loss(
                model,
                guide,
                rows,
                *args,
                plate=plate,
                num_particles=num_particles,
                analytic_kl=analytic_kl,
                **kwargs,
            )
            for rows in chunks
        )
    bound, bound_args, bound_kwargs = plate.bind(model, args, kwargs, subsample)
    return elbo.differentiable_loss(bound, guide, *bound_args, **bound_kwargs)


def _fast_path_data(
    model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    return bound.arguments["x"], bound.arguments.get("y")


def _step_loss(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    *,
    plate: DataPlate,
    estimator: str,
    num_particles: int,
    analytic_kl: bool,
    fast: bool,
    prior: ScaleMixtureParameters | None,
    prior_sites: tuple[str, ...],
    layers: Mapping[str, BayesianLayer] | None = None,
) -> Callable[[torch.Tensor | None], torch.Tensor]:
    """``subsample -> loss`` of one optimisation step: Pyro's ELBO or the plain-torch one.

    ``fast`` (a BayesianMLP with the default AutoNormal guide) uses
    :func:`~pyro_sgmcmc.variational.flipout.guide_negative_elbo` for every estimator; otherwise
    plain reparameterisation goes through :func:`minibatch_elbo_loss` (any model and guide), and the
    per-example estimators on another ``PyroModule`` (its Bayesian ``layers``, from
    :func:`~pyro_sgmcmc.variational.flipout.check_layer_model`) through
    :func:`~pyro_sgmcmc.variational.flipout.module_negative_elbo`'s handler.
    """
    if not fast:
        target = model if prior is None else _SubstitutePrior(prior_sites, prior)(model)
        options = {"plate": plate, "num_particles": num_particles, "analytic_kl": analytic_kl}
        return _model_step_loss(target, guide, args, kwargs, estimator, layers, **options)
    x, y = _fast_path_data(model, args, kwargs)
    if y is None:
        raise ValueError(f"estimator={estimator!r} needs the targets y among the model arguments")
    return functools.partial(
        guide_negative_elbo,
        model,
        guide,
        x,
        y,
        estimator=estimator,
        num_particles=num_particles,
        analytic_kl=analytic_kl,
        prior=prior,
    )


def _model_step_loss(
    target: Callable[..., Any],
    guide: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    estimator: str,
    layers: Mapping[str, BayesianLayer] | None,
    *,
    plate: DataPlate,
    num_particles: int,
    analytic_kl: bool,
) -> Callable[[torch.Tensor | None], torch.Tensor]:
    """:func:`_step_loss` of any model but the fast path's: Pyro's ELBO for plain
    reparameterisation, the handler of :func:`~pyro_sgmcmc.variational.flipout.module_negative_elbo`
    on the Bayesian ``layers`` for the per-example estimators (``target``: the model, with its
    learnable prior substituted if it has one)."""
    if estimator != "reparameterization":
        if not isinstance(guide, AutoNormal):
            raise TypeError(
                f"estimator={estimator!r} needs the default AutoNormal guide, got "
                f"{type(guide).__name__}"
            )
        return functools.partial(
            _layer_negative_elbo,
            target,
            layers,
            guide,
            args=args,
            kwargs=kwargs,
            plate=plate,
            estimator=estimator,
            num_particles=num_particles,
            analytic_kl=analytic_kl,
            generator=None,
        )

    def pyro_loss(subsample: torch.Tensor | None) -> torch.Tensor:
        return minibatch_elbo_loss(
            target,
            guide,
            subsample,
            *args,
            plate=plate,
            num_particles=num_particles,
            analytic_kl=analytic_kl,
            **kwargs,
        )

    return pyro_loss
