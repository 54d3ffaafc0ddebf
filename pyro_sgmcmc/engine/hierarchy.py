r"""Latent sites whose spread another latent site sets: joint densities without a mode.

In a centred hierarchical model a group's effects are drawn with a scale that is itself a
latent site, ``theta ~ Normal(mu, tau)`` in a plate over the groups, ``tau ~ HalfNormal(1)``
(or a concentration, ``phi ~ Beta(m * kappa, (1 - m) * kappa)``). As ``tau`` shrinks with every
``theta`` at ``mu``, the joint density grows without bound (the neck of Neal's funnel): the
posterior is proper, but the joint density has no mode. The warm-up's descent
(:mod:`~pyro_sgmcmc.engine.adaptation`) runs at temperature 0 towards a mode, so where the data
do not hold the scale away from zero it climbs into the neck (measured: ``tau`` from about 1 to
0.002 in 900 steps of a 40-group logistic model whose posterior is 0.29 +- 0.05), and the
sampling steps adapted there are too small ever to leave it. Where the data do hold it (8
groups of 250 rows), the descent ends at a mode of the group scale, and the windows that
follow need that good start: a descent of 200 steps there cost SGLD's bulk ESS a factor of 90.

So the warm-up watches the *children* found here, the sites whose spread another sets: if the
spread of a child's coordinates (the group effects around their mean, unconstrained) shrank
more than :data:`FUNNEL_SHRINK` times between step :data:`HIERARCHY_DESCENT_STEPS` and the
descent's end in some chain -- every effect drawn onto the mean, the neck -- the engine goes
back to its start and warms up again with a descent of :data:`HIERARCHY_DESCENT_STEPS` steps,
the windows at temperature 1 doing the rest
(:meth:`~pyro_sgmcmc.engine.engine.ChainEngine.draw`). A model whose descent stays away from
the neck runs as before, bit for bit. (Watching the parents instead -- a group scale that moved
far -- also caught a conjugate regression started far from its noise scale, whose descent
needed no second start.)

The test, before sampling, at a draw from the prior: a latent site is a *child* of another
latent site (its *parent*) where the child's entropy -- what its distribution's spread
contributes to the peak of the joint density -- has a nonzero gradient with respect to the
parent's unconstrained value. A location parent (``theta ~ Normal(mu, 1)``) leaves the entropy
unchanged and is not one; nor is a site drawn by exact Gibbs updates (a network's
``GammaPrecision``), which the descent holds fixed. Distributions without an entropy are
skipped.

Reference: M. Betancourt and M. Girolami, "Hamiltonian Monte Carlo for hierarchical models",
in *Current Trends in Bayesian Methodology with Applications*, CRC Press, 2015.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from pyro import poutine
from torch.distributions import biject_to

from ..models.structure import ModelStructure
from .seeds import seeded

__all__ = ["FUNNEL_SHRINK", "HIERARCHY_DESCENT_STEPS", "find_scale_parents"]

#: The descent of a warm-up that starts again after running into a funnel: long enough for the
#: other sites to leave a poor starting point (about 4 units per coordinate at the descent's
#: rate), too short to fall into the neck; also the step from which the children's spread is
#: watched.
HIERARCHY_DESCENT_STEPS = 200
#: How many times the spread of a child's coordinates (its group effects around their mean,
#: unconstrained) may shrink after that step before the descent counts as running into the
#: funnel's neck.
FUNNEL_SHRINK = 20.0
#: Rows of the data the test evaluates (the latent sites' distributions do not depend on them).
ROWS = 2


def find_scale_parents(
    structure: ModelStructure,
    args: tuple,
    kwargs: Mapping[str, Any],
    skip: Iterable[str] = (),
    device: torch.device | None = None,
) -> dict[str, list[str]]:
    """Each latent site whose spread (entropy) depends on other latent sites, with those sites
    in the model's order (see the module docstring); sites in ``skip`` (Gibbs-updated) are
    neither children nor parents. ``device``: that of the data."""
    plate = structure.plate
    rows = torch.arange(max(1, min(plate.num_data, ROWS)), device=device)
    model, args, kwargs = plate.bind(structure.model, args, kwargs, rows)
    skipped = set(skip)
    candidates = [name for name in structure.latent_sites if name not in skipped]
    if len(candidates) < 2:
        return {}
    with seeded(0, device):
        trace = poutine.trace(model).get_trace(*args, **kwargs)
    free, run = _rerun_with_free_values(model, args, kwargs, trace, structure, candidates)
    parents = {}
    for child in candidates:
        entropy = _entropy(run.nodes[child]["fn"])
        if entropy is None or not entropy.requires_grad:
            continue
        others = [name for name in candidates if name != child]
        grads = torch.autograd.grad(
            entropy, [free[name] for name in others], allow_unused=True, retain_graph=True
        )
        found = [name for name, grad in zip(others, grads, strict=True) if _nonzero(grad)]
        if found:
            parents[child] = found
    return parents


def _rerun_with_free_values(model, args, kwargs, trace, structure, candidates):
    """The model run again at the prior draw ``trace`` with the candidates' unconstrained values
    as leaves of the autograd graph: ``(leaves, trace)``."""
    transforms = {name: biject_to(trace.nodes[name]["fn"].support) for name in candidates}
    free = {
        name: transforms[name].inv(trace.nodes[name]["value"]).detach().requires_grad_()
        for name in candidates
    }
    values = {name: transforms[name](value) for name, value in free.items()}
    for name in structure.latent_sites:
        values.setdefault(name, trace.nodes[name]["value"].detach())
    conditioned = poutine.trace(poutine.condition(model, data=values))
    return free, conditioned.get_trace(*args, **kwargs)


def _entropy(fn: Any) -> torch.Tensor | None:
    """The summed entropy of a site's distribution, unwrapped from Pyro's ``Independent``,
    ``Expanded`` and ``Masked`` wrappers; ``None`` where it has none."""
    while hasattr(fn, "base_dist"):
        fn = fn.base_dist
    try:
        return fn.entropy().sum()
    except (NotImplementedError, AttributeError, TypeError, ValueError, RuntimeError):
        return None


def _nonzero(grad: torch.Tensor | None) -> bool:
    return grad is not None and bool((grad.ne(0) & torch.isfinite(grad)).any())
