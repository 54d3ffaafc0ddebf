r"""Latent sites the likelihood's gradient cannot see.

SG-MCMC moves every latent site along the gradient of the potential and has no Metropolis
correction. A continuous site that enters the likelihood only through a step -- a comparison,
``torch.where``, rounding, an index (a change point ``tau`` in
``torch.where(idx < tau * N, rate1, rate2)``) -- has a likelihood gradient that is exactly
zero wherever it is defined, so the kernels sample its prior and bias every site that depends
on it, and R-hat and ESS look fine.

The check, before sampling: at two draws from the prior, each latent site's likelihood gradient
(on the unconstrained scale, over :data:`ROWS` rows spread evenly over the data) is exactly zero
in every coordinate, yet the likelihood changes when the site moves by :data:`SHIFT` on that
scale. Sites that the likelihood ignores altogether are not flagged (their posterior is their
prior), nor are sites drawn by exact Gibbs updates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from pyro import poutine
from torch.distributions import biject_to

from ..models.structure import ModelStructure
from .seeds import seeded

__all__ = ["ROWS", "SHIFT", "blind_site_messages", "find_blind_sites"]

#: Rows of the data the check evaluates (at most; spread evenly over the data).
ROWS = 512
#: How far each site moves, on its unconstrained scale, to see whether the likelihood changes.
SHIFT = 0.5
#: Prior draws the gradient must vanish at.
DRAWS = 2


def find_blind_sites(
    structure: ModelStructure,
    args: tuple,
    kwargs: Mapping[str, Any],
    skip: Iterable[str] = (),
    device: torch.device | None = None,
) -> list[str]:
    """The latent sites (in the model's order) whose likelihood gradient is exactly zero at
    :data:`DRAWS` prior draws while the likelihood depends on them (see the module docstring);
    ``device``: that of the data."""
    plate = structure.plate
    # rows spread evenly over the data (a step at row tau * N falls among them), fewer than N:
    # the set-up runs the model on all rows once only
    size = max(1, min(plate.num_data - 1, plate.max_rows, ROWS))
    rows = torch.linspace(0, plate.num_data - 1, size, device=device)
    rows = rows.round().long().unique()
    model, args, kwargs = plate.bind(structure.model, args, kwargs, rows)
    candidates = [name for name in structure.latent_sites if name not in set(skip)]
    blind = set(candidates)
    for draw in range(DRAWS):
        with seeded(draw, device):
            blind &= set(_blind_at_a_prior_draw(model, args, kwargs, structure, candidates))
        if not blind:
            return []
    return [name for name in candidates if name in blind]


def _blind_at_a_prior_draw(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    structure: ModelStructure,
    candidates: list[str],
) -> list[str]:
    trace = poutine.trace(model).get_trace(*args, **kwargs)
    transforms = {name: biject_to(trace.nodes[name]["fn"].support) for name in candidates}
    free = {
        name: transforms[name].inv(trace.nodes[name]["value"]).detach().requires_grad_()
        for name in candidates
    }

    def log_likelihood(unconstrained: Mapping[str, torch.Tensor]) -> torch.Tensor:
        values = {name: transforms[name](value) for name, value in unconstrained.items()}
        for name in structure.latent_sites:
            values.setdefault(name, trace.nodes[name]["value"])
        conditioned = poutine.trace(poutine.condition(model, data=values))
        run = conditioned.get_trace(*args, **kwargs)
        run.compute_log_prob(lambda name, _: name in structure.observed_sites)
        return sum(run.nodes[name]["log_prob_sum"] for name in structure.observed_sites)

    value = log_likelihood(free)
    grads: tuple[torch.Tensor | None, ...] = (None,) * len(free)
    if value.requires_grad:
        grads = torch.autograd.grad(value, list(free.values()), allow_unused=True)
    blind = []
    with torch.no_grad():
        for (name, start), grad in zip(free.items(), grads, strict=True):
            # None: no differentiable path at all (a comparison cuts the graph)
            if (grad is not None and bool(grad.ne(0).any())) or not bool(torch.isfinite(value)):
                continue
            for shift in (SHIFT, -SHIFT):
                moved = log_likelihood({**free, name: start + shift})
                if torch.isfinite(moved) and bool((moved - value).abs() > 1e-6 * (1 + value.abs())):
                    blind.append(name)
                    break
    return blind


def blind_site_messages(sites: list[str]) -> list[str]:
    """One message per site found by :func:`find_blind_sites`."""
    return [
        f"latent site {name!r}: the likelihood's gradient with respect to it is exactly zero at "
        "every point tried, yet the likelihood changes when it moves (it enters through a step: "
        "a comparison, torch.where, rounding or an index). SG-MCMC follows the gradient and has "
        f"no Metropolis correction, so its draws of {name!r} will follow the prior and bias the "
        "sites that depend on it. Use NUTS (its accept step corrects what the gradient misses), "
        f"or marginalise {name!r} out of the model (e.g. a sum over its possible values)"
        for name in sites
    ]
