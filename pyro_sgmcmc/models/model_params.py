"""A model's own parameters (``pyro.param``, ``PyroParam``): read once, held at those values.

A model may read point parameters from Pyro's parameter store as well as draw latent sites:
``s = pyro.param("s", torch.tensor(0.5), constraint=positive)``, or a ``PyroParam`` attribute
of a ``PyroModule``. Pyro's ``MCMC`` (HMC, NUTS) holds them at their values in the store during
the run, and so do the SG-MCMC kernels and :func:`~pyro_sgmcmc.run_chains`; Pyro's ``SVI``
optimises them with the guide's parameters, and so does :func:`~pyro_sgmcmc.fit_svi`.

The store is global and may change after a run (another fit, ``pyro.clear_param_store()``):
a result keeps the values its run used (:func:`param_values`), and the export
(:func:`~pyro_sgmcmc.to_inference_data`: log-likelihood, predictive groups, predictions) runs
the model with them substituted (:func:`with_params`; an SVI fit's with each fit's own,
``SVIResult.fitted_model``), not with whatever the store holds at that time. Pyro's own
``Predictive`` reads the store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from pyro import poutine
from pyro.poutine import Trace
from torch.distributions.constraints import real

__all__ = ["param_sites", "param_values", "with_params"]

TensorDict = dict[str, torch.Tensor]


def param_values(trace: Trace) -> TensorDict:
    """The (constrained) values of the parameter sites of a model's trace, detached copies."""
    return {
        name: site["value"].detach().clone()
        for name, site in trace.nodes.items()
        if site["type"] == "param"
    }


def param_sites(trace: Trace) -> dict[str, tuple[torch.Tensor, Any]]:
    """The (constrained) value and the constraint of each parameter site of a trace."""
    return {
        name: (site["value"].detach().clone(), site["kwargs"].get("constraint", real))
        for name, site in trace.nodes.items()
        if site["type"] == "param"
    }


def with_params(model: Callable[..., Any], params: Mapping[str, torch.Tensor] | None) -> Any:
    """``model`` with its parameter sites held at ``params`` (``poutine.substitute``); ``model``
    itself where there are none."""
    if not params:
        return model
    return poutine.substitute(model, data=dict(params))
