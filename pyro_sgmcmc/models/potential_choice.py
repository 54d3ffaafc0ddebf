r"""Choose the potential of a model: closed-form gradient, batched ``log_joint``, functional, trace.

The samplers (:func:`~pyro_sgmcmc.engine.build.prepare_chains`) and the MAP fit
(:func:`~pyro_sgmcmc.models.initialization.find_map`) ask :func:`make_potential` for the potential
energy of a model; the ``potential`` option of every sampler names the choice
(:data:`POTENTIAL_CHOICES`). The candidates live in :mod:`pyro_sgmcmc.models.potentials` (closed
form, ``log_joint``, trace) and :mod:`pyro_sgmcmc.models.functional_potential` (the fast path for
any model); this module is the one place that knows all of them, so neither of those imports the
other back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.distributions.transforms import Transform

from ..engine.layout import FlatLayout
from .functional_potential import FunctionalPotential
from .potentials import (
    ClosedFormPotential,
    LogJointPotential,
    Potential,
    SupportsLogJoint,
    TracePotential,
    closed_form_gradient_covers,
    is_identity,
)
from .structure import DataPlate

__all__ = ["POTENTIAL_CHOICES", "make_potential"]


#: The ``potential`` choices of the samplers.
POTENTIAL_CHOICES = ("auto", "closed_form", "log_joint", "functional", "trace")


def make_potential(
    choice: str,
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    transforms: Mapping[str, Transform],
    layout: FlatLayout,
    plate: DataPlate,
    probe: Mapping[str, torch.Tensor],
    sites: tuple[str, ...] | None = None,
) -> Potential:
    """The potential for ``choice`` (one of :data:`POTENTIAL_CHOICES`).

    ``"auto"`` takes the model's closed-form gradient when it covers the moving sites, else its
    ``log_joint`` (batched over chains if it accepts a chain axis, which ``probe`` -- ``(C, ...)``
    unconstrained values of every latent site -- is used to check), else the functional path
    (:class:`~pyro_sgmcmc.models.functional_potential.FunctionalPotential`: one light handler,
    chains vectorised), which turns to Pyro's trace (``"trace"``) if the model's structure changes.
    """
    base = (transforms, layout, plate.num_data)
    non_identity = {k: t for k, t in transforms.items() if not is_identity(t)}
    covers = closed_form_gradient_covers(model, layout.names, non_identity)
    if choice == "closed_form" and not covers:
        raise ValueError(
            "potential='closed_form' needs a model with a closed-form gradient "
            "(has_analytic_gradient, log_joint_and_gradient) covering the sampled sites "
            f"{list(layout.names)}, e.g. BayesianMLP with a Normal or GammaPrecision prior"
        )
    if choice == "log_joint" and not isinstance(model, SupportsLogJoint):
        raise ValueError(
            "potential='log_joint' needs a model with a log_joint(params, subsample, *args, "
            "**kwargs) method (e.g. pyro_sgmcmc.nn.BayesianMLP)"
        )
    if choice == "closed_form" or (choice == "auto" and covers):
        return ClosedFormPotential(model, args, kwargs, *base)
    if choice == "log_joint" or (choice == "auto" and isinstance(model, SupportsLogJoint)):
        potential = LogJointPotential(model, args, kwargs, *base)
        potential.batched = _accepts_chain_axis(potential, probe)
        return potential
    if choice == "trace":
        return TracePotential(model, args, kwargs, *base, plate=plate)
    return FunctionalPotential(model, args, kwargs, *base, plate=plate, sites=sites)


def _accepts_chain_axis(potential: LogJointPotential, probe: Mapping[str, torch.Tensor]) -> bool:
    """Whether the model's ``log_joint`` returns one value per chain for ``(C, ...)`` values."""
    num_chains = next(iter(probe.values())).shape[0]
    rows = torch.zeros(num_chains, 1, dtype=torch.long)
    try:
        with torch.no_grad():
            value = potential(probe, rows)
    except (RuntimeError, ValueError, IndexError, TypeError):
        return False
    return tuple(value.shape) == (num_chains,)
