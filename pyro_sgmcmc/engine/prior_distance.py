r"""A network's coordinates that stay far outside their prior: a chain that is not sampling the
posterior there, whether they move or not.

A coordinate :math:`\theta_i` with prior mean :math:`m_i` and standard deviation :math:`s_i` at
:math:`z_i = |\theta_i - m_i| / s_i` pays :math:`z_i^2/2` nats of prior (a Gaussian prior; more
for lighter tails). In a network whose inputs and outputs are on the prior's scale no data set
pays :math:`20^2/2 = 200` nats for one weight: the units of a layer can share a large product
(ReLU units are unchanged when one layer's weights are scaled by :math:`c` and the next by
:math:`1/c`), and the posterior prefers the shares the prior likes best. A chain whose kept
draws hold a weight or bias more than :data:`FAR_FROM_PRIOR` prior standard deviations out in
every draw examined is therefore held in a corner with next to no posterior mass. On the
50,000-row regression family (heavy-tailed inputs, ReLU units) the warm-up's descent leaves
first-layer biases at -26 to -66 under :math:`\mathcal N(0, 1)`: units switched off on all but a
few extreme training rows, held there because bringing the bias back switches the unit on where
its output weight hurts the fit, and by steps too small to cross that in one run. Their draws
are not the posterior's, and a test row that switches such a unit on is predicted far off: one
such run (2026-12-07, seed 2) ended at 1.20 times the reference's test RMSE with no other
warning, and an earlier run with Euler's step at 80 times (first-layer weights of 73-290 and a
bias of -713, moving by a few times :math:`10^{-9}` per step). The frozen-coordinate check
(:mod:`.health`) names such coordinates only when they do not move at all. The adaptive warm-up
asks the same question at its planned end and starts such units afresh (:mod:`.unit_restart`);
this check names what is left.

Only the weights and biases of networks (:func:`~pyro_sgmcmc.models.hidden_units.has_hidden_units`)
are checked, not their sites of shape ``()``: a noise precision is identified by every row, and
where a network fits well it lies far above a prior set for standardised targets (on the UCI
energy set, hundreds of prior standard deviations above a :math:`\mathrm{Gamma}(2, 0.5)`), as
the coefficient of a regression on unstandardised inputs can lie far out under a prior on the
wrong scale; their posterior is still what the model says (R-hat and ESS judge it). The prior's
mean and standard deviation are those of each site's distribution as the model builds it at the
draw (so a prior scale that is itself sampled counts at its drawn value); sites whose prior has
no finite mean or standard deviation (a Cauchy) are not checked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from pyro import poutine

from ..models.structure import DataPlate
from .health import _index

__all__ = ["FAR_FROM_PRIOR", "check_prior_distance", "prior_distances"]

#: A coordinate further than this many prior standard deviations from the prior's mean in every
#: draw examined is reported.
FAR_FROM_PRIOR = 20.0
#: The draws examined per chain, spread evenly over its kept draws.
DRAWS_EXAMINED = 10


def check_prior_distance(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    draws: Mapping[str, torch.Tensor],
    plate: DataPlate,
    chain_ids: list[int],
) -> list[str]:
    """Messages about coordinates far outside their prior in every draw examined (see the module
    docstring), one per chain and site.

    Parameters
    ----------
    model, args, kwargs:
        The Pyro model and its full-data arguments (the model is evaluated on one row).
    draws:
        Constrained kept draws of every latent site, ``(C, S, ...)`` per site.
    plate:
        The model's data plate.
    chain_ids:
        The run's index of each chain, for the messages.
    """
    if not draws or next(iter(draws.values())).shape[1] == 0:
        return []
    device = next(iter(draws.values())).device
    model, args, kwargs = plate.bind(model, args, kwargs, torch.arange(1, device=device))
    messages = []
    for chain, chain_id in enumerate(chain_ids):
        found = _far_coordinates(model, args, kwargs, {n: v[chain] for n, v in draws.items()})
        messages += [_message(chain_id, name, *details) for name, details in found.items()]
    return messages


def prior_distances(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    draws: Mapping[str, torch.Tensor],
) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per site judged (see the module docstring; ``draws`` are constrained, ``(S, ...)`` per
    site, the model bound to one row): each coordinate's smallest distance from the prior's
    mean over the examined draws, in prior standard deviations, and the prior's mean and
    standard deviation at the last one, all shaped like the site."""
    count = next(iter(draws.values())).shape[0]
    picks = torch.linspace(0, count - 1, min(count, DRAWS_EXAMINED)).round().long().unique()
    found: dict[str, tuple[torch.Tensor, ...]] = {}
    for pick in picks.tolist():
        values = {name: value[pick] for name, value in draws.items()}
        for name, (mean, sd) in _prior_moments(model, args, kwargs, values).items():
            if values[name].dim() == 0:  # a noise or prior scale: identified, see above
                continue
            z = ((values[name] - mean).abs() / sd).double()
            if name in found:
                z = torch.minimum(found[name][0], z)
            found[name] = (z, mean.expand_as(z), sd.expand_as(z))
    return found


def _far_coordinates(model, args, kwargs, draws) -> dict[str, tuple]:
    """Per site with coordinates far out in every examined draw: how many, of how many, and the
    furthest one's index, last value, prior mean, prior sd and distance in prior sds."""
    found = {}
    for name, (z, mean, sd) in prior_distances(model, args, kwargs, draws).items():
        far = z > FAR_FROM_PRIOR
        if bool(far.any()):
            index = _index(int(torch.where(far, z, -1.0).argmax()), z.shape)
            found[name] = (int(far.sum()), far.numel(), index, float(draws[name][-1][index]),
                           float(mean[index]), float(sd[index]), float(z[index]))  # fmt: skip
    return found


def _prior_moments(model, args, kwargs, values) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The prior mean and standard deviation of each latent site at ``values``, where finite."""
    with torch.no_grad():
        trace = poutine.trace(poutine.condition(model, data=dict(values))).get_trace(
            *args, **kwargs
        )
    moments = {}
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or name not in values:  # conditioned: latent sites only
            continue
        try:
            mean, sd = site["fn"].mean, site["fn"].stddev
        except NotImplementedError:
            continue
        if bool(torch.isfinite(mean).all() & torch.isfinite(sd).all() & (sd > 0).all()):
            moments[name] = (mean.detach(), sd.detach())
    return moments


def _message(chain_id, name, count, total, index, value, mean, sd, z) -> str:
    return (
        f"chain {chain_id}: {count} of {total} coordinates of site {name!r} lie more than "
        f"{FAR_FROM_PRIOR:g} prior standard deviations from the prior's mean in every draw "
        f"examined, e.g. {name}{list(index)} = {value:.4g} where the prior is {mean:.3g} +- "
        f"{sd:.3g} ({z:.0f} standard deviations, a prior cost of {z * z / 2:.0f} nats). A "
        "network's posterior puts next to no mass there: the chain is held where the warm-up "
        "left it (typically a unit switched off on all but a few extreme training rows, which "
        "it cannot leave in this run), and its predictions can be far off on inputs that "
        "switch that unit on. Run again with more warm-up draws or another seed, and "
        "standardise the inputs and targets if they are not"
    )
