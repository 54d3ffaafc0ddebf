"""The result of :func:`~pyro_sgmcmc.variational.svi.fit_svi`: the fitted guides and what can be
asked of them.

:class:`SVIResult` holds each independent fit's guide, parameter store, loss history, wall time,
seed and learnable prior, and draws from the fitted guides (:meth:`SVIResult.sample_posterior`,
which :mod:`pyro_sgmcmc.analysis.export` turns into chains); :func:`full_data_negative_elbo`
evaluates a fit's bound on all the data with
:func:`~pyro_sgmcmc.variational.svi_loss.minibatch_elbo_loss`. Public names are re-exported by
:mod:`pyro_sgmcmc.variational.svi`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pyro import poutine
from pyro.infer.autoguide import AutoNormal
from torch.distributions import biject_to

from .._validation import check_positive_int
from ..models.model_params import with_params
from ..models.structure import DataPlate
from .svi_loss import minibatch_elbo_loss
from .svi_prior import ScaleMixtureParameters, _SubstitutePrior
from .svi_store import _param_scope, global_param_mode

__all__ = ["SVIResult", "full_data_negative_elbo"]

TensorDict = dict[str, torch.Tensor]


@dataclass
class SVIResult:
    """Independent SVI fits of one model (each fit is exported as one chain).

    Attributes
    ----------
    model:
        The model.
    guides:
        One fitted guide per fit.
    param_states:
        The private parameter-store state of each fit; call guide ``k`` inside
        ``pyro.get_param_store().scope(param_states[k])``.
    losses:
        ``(num_fits, num_steps)`` array: the loss (negative ELBO estimate) of every step.
    wall_times:
        Seconds each fit took.
    seeds:
        The seed of each fit.
    args, kwargs:
        The model's training arguments.
    plate_name, batch_size, num_data:
        The data plate, the minibatch size ``B`` and ``N``.
    plate:
        How a minibatch restricts the model (:class:`~pyro_sgmcmc.models.structure.DataPlate`).
    estimator:
        The gradient estimator of the fits (:data:`pyro_sgmcmc.variational.flipout.ESTIMATORS`).
    prior_parameters:
        With a learnable prior, each fit's fitted :class:`ScaleMixtureParameters`; else ``None``.
    prior_sites:
        The sites that carry the learnable prior (empty without one).
    model_params:
        Each fit's fitted values of the model's own parameters (``pyro.param``, ``PyroParam``),
        which the fits optimise with their guides as Pyro's ``SVI`` does; ``None`` for a model
        without any.
    """

    model: Callable[..., Any]
    guides: list[Callable[..., Any]]
    losses: np.ndarray
    wall_times: list[float]
    seeds: list[int]
    args: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)
    param_states: list[dict] | None = None
    plate_name: str = "data"
    batch_size: int = 1
    num_data: int = 1
    estimator: str = "reparameterization"
    prior_parameters: list[ScaleMixtureParameters] | None = None
    prior_sites: tuple[str, ...] = ()
    plate: DataPlate | None = None
    model_params: list[TensorDict] | None = None

    @property
    def guide(self) -> Callable[..., Any]:
        """The guide of the first fit."""
        return self.guides[0]

    @property
    def loss_history(self) -> np.ndarray:
        """The loss per step of the first fit."""
        return self.losses[0]

    @property
    def wall_time(self) -> float:
        """Total seconds of all fits."""
        return float(sum(self.wall_times))

    @property
    def num_fits(self) -> int:
        return len(self.guides)

    def fitted_model(self, fit: int = 0) -> Callable[..., Any]:
        """The model as fit ``fit`` saw it: with its fitted learnable prior and its own fitted
        parameters, if it had them."""
        model = self.model
        if self.model_params is not None:
            model = with_params(model, self.model_params[fit])
        if self.prior_parameters is None:
            return model
        return _SubstitutePrior(self.prior_sites, self.prior_parameters[fit])(model)

    def prior_values(self) -> list[dict[str, float]] | None:
        r"""The fitted :math:`\pi, \sigma_1, \sigma_2` of each fit (``None`` without a learnable
        prior)."""
        if self.prior_parameters is None:
            return None
        return [parameters.values() for parameters in self.prior_parameters]

    def loc_and_scale(self, fit: int = 0) -> tuple[TensorDict, TensorDict]:
        """Variational means :math:`\\mu` and scales :math:`\\sigma` (unconstrained space)."""
        guide = self.guides[fit]
        if not isinstance(guide, AutoNormal):
            raise TypeError("loc_and_scale needs an AutoNormal guide")
        locs, scales = {}, {}
        for name, _ in guide.prototype_trace.iter_stochastic_nodes():
            locs[name] = guide._get_loc_and_scale(name)[0].detach()
            scales[name] = guide._get_loc_and_scale(name)[1].detach()
        return locs, scales

    @global_param_mode
    def sample_posterior(self, num_draws: int, seed: int | None = None) -> TensorDict:
        """Draw from every fitted guide: constrained values shaped ``(num_fits, num_draws, ...)``.

        For an :class:`~pyro.infer.autoguide.AutoNormal` guide the draws are
        :math:`\\theta = T^{-1}(\\mu + \\sigma\\odot\\epsilon)` computed in one vectorised step
        (:math:`T` = ``biject_to(support)``); other guides are run once per draw.
        """
        num_draws = check_positive_int("num_draws", num_draws)
        generator = torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        per_fit = []
        for k, guide in enumerate(self.guides):
            if isinstance(guide, AutoNormal):
                locs, scales = self.loc_and_scale(k)
                draws = {}
                for name, site in guide.prototype_trace.iter_stochastic_nodes():
                    shape = (num_draws, *locs[name].shape)
                    eps = torch.randn(shape, generator=generator, dtype=locs[name].dtype)
                    eps = eps.to(locs[name].device)  # drawn on the CPU: the same on any device
                    z = locs[name] + scales[name] * eps
                    draws[name] = biject_to(site["fn"].support)(z)
            else:
                draws_list = []
                state = None if self.param_states is None else self.param_states[k]
                with _param_scope(state), torch.random.fork_rng(devices=[]), torch.no_grad():
                    torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
                    for _ in range(num_draws):
                        trace = poutine.trace(guide).get_trace(*self.args, **self.kwargs)
                        draws_list.append(
                            {
                                n: s["value"].detach()
                                for n, s in trace.nodes.items()
                                if s["type"] == "sample"
                                and not s["is_observed"]
                                and not s["infer"].get("is_auxiliary", False)
                            }
                        )
                draws = {n: torch.stack([d[n] for d in draws_list]) for n in draws_list[0]}
            per_fit.append(draws)
        return {name: torch.stack([d[name] for d in per_fit]) for name in per_fit[0]}


@global_param_mode
def full_data_negative_elbo(result: SVIResult, fit: int = 0, num_particles: int = 100) -> float:
    """Full-data negative ELBO estimate of one fit (``num_particles`` guide samples), under the
    fit's own (fitted, if learnable) prior."""
    num_particles = check_positive_int("num_particles", num_particles)
    state = None if result.param_states is None else result.param_states[fit]
    with torch.no_grad(), _param_scope(state):
        loss = minibatch_elbo_loss(
            result.fitted_model(fit),
            result.guides[fit],
            None,
            *result.args,
            plate=result.plate or result.plate_name,
            num_particles=num_particles,
            **result.kwargs,
        )
    return float(loss)
