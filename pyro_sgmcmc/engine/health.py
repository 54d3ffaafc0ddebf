r"""Checks of a run that say, with the numbers, when its draws should not be trusted.

Divergences are recorded step by step (:mod:`.divergence`); these checks look at the run as a
whole and warn (:class:`SamplerWarning`):

* **a chain that does not move**: during sampling every coordinate of every site stayed where it
  was (to within :math:`10^{-12}` of its scale) -- a step size far too small, or a chain stuck
  in divergences;
* **coordinates that do not move**: with the adaptive warm-up, which measures each coordinate's
  posterior standard deviation :math:`\sigma_i`, coordinates whose kept draws (at least
  :data:`FROZEN_MIN_DRAWS`) spread less than :data:`FROZEN` :math:`\sigma_i` -- the step chosen
  for them cannot move them in this run (the outgoing weights of a ReLU unit that is off on every
  training row, left by the descent far from where the prior would pull them). Moving one
  :math:`\sigma_i` takes about :math:`1/(e_i H_{ii})` steps of size :math:`e_i`; a spread of
  :math:`10^{-3}\sigma_i` over the run means :math:`e_i H_{ii}` times the run's length is below
  about :math:`10^{-6}`;
* **a chain that is too hot**: its configurational temperature
  (:class:`~pyro_sgmcmc.engine.virial.VirialMeter`) over the sampling phase exceeds
  :math:`1.5\,T` by four standard errors -- a step size too large for the curvature, or gradient
  noise the dynamics do not absorb, and draws spread far wider than the posterior;
* **a classifier at chance after warm-up**: the predicted class (the largest logit of a
  categorical observation site) is right no more often than always guessing the most frequent
  class, on up to 2000 training rows -- a network that has not left its starting point.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import pyro.distributions as dist
import torch
from pyro import poutine

from ..errors import SamplerWarning
from ..models.structure import DataPlate

__all__ = ["FROZEN", "FROZEN_MIN_DRAWS", "check_classifier", "check_draws", "warn_all"]

#: A coordinate whose kept draws spread less than this fraction of its posterior standard
#: deviation (as the warm-up measured it) is reported as frozen.
FROZEN = 1e-3
#: ... when there are at least this many kept draws (independent draws of a coordinate spread
#: that little with probability about ``FROZEN ** (S - 1)``).
FROZEN_MIN_DRAWS = 10


def warn_all(messages: list[str], stacklevel: int = 3) -> None:
    """Emit each message as a :class:`SamplerWarning`."""
    for message in messages:
        warnings.warn(message, SamplerWarning, stacklevel=stacklevel)


def check_draws(
    draws: Mapping[str, torch.Tensor],
    virial: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    temperature: float,
    chain_ids: list[int],
    posterior_scales: Mapping[str, torch.Tensor] | None = None,
) -> list[str]:
    """Messages about chains or coordinates that did not move, and chains that ran too hot
    (see the module docstring).

    Parameters
    ----------
    draws:
        Kept draws, ``(C, S, ...)`` per site (unconstrained).
    virial:
        The sampling phase's configurational temperatures, their standard errors, and the mask
        of chains too hot (:meth:`~pyro_sgmcmc.engine.virial.VirialMeter.too_hot`), ``(C,)``
        each.
    temperature:
        The chains' target temperature :math:`T`.
    chain_ids:
        The run's index of each chain, for the messages.
    posterior_scales:
        Per moving site, ``(C, ...)`` posterior standard deviations of its coordinates as the
        warm-up measured them (``None``: unknown, no per-coordinate check).
    """
    messages = []
    still = set()
    if draws and next(iter(draws.values())).shape[1] >= 2:
        spread = torch.stack(
            [
                (value.std(1) / (value.abs().mean(1) + 1.0)).reshape(value.shape[0], -1).amax(1)
                for value in draws.values()
            ]
        ).amax(0)
        for index in (spread < 1e-12).nonzero().flatten().tolist():
            still.add(index)
            messages.append(
                f"chain {chain_ids[index]} did not move during sampling (largest relative spread "
                f"of a coordinate {float(spread[index]):.1e}): its step size is far too small, "
                "or every step diverged"
            )
    if posterior_scales is not None:
        messages += _frozen_coordinates(draws, posterior_scales, chain_ids, skip=still)
    if virial is not None:
        value, error, hot = virial
        for index in hot.nonzero().flatten().tolist():
            messages.append(
                f"chain {chain_ids[index]} samples at a configurational temperature of "
                f"{float(value[index]):.3g} +- {float(error[index]):.2g}, far above its target "
                f"T = {temperature:g}: its draws are spread wider than the posterior. Give a "
                "smaller step_size (or learning_rate) or a larger batch_size, or leave the step "
                "size unset for the adaptive warm-up"
            )
    return messages


def _frozen_coordinates(
    draws: Mapping[str, torch.Tensor],
    scales: Mapping[str, torch.Tensor],
    chain_ids: list[int],
    skip: set[int],
) -> list[str]:
    """Messages about the coordinates whose draws spread less than :data:`FROZEN` of their
    posterior standard deviation, one per chain and site."""
    messages = []
    for name, scale in scales.items():
        value = draws.get(name)
        if value is None or value.shape[1] < FROZEN_MIN_DRAWS:
            continue
        spread = value.double().std(1)
        frozen = spread < FROZEN * scale.to(spread)
        for chain in range(value.shape[0]):
            count = int(frozen[chain].sum())
            if chain in skip or count == 0:
                continue
            # the one furthest from zero, as an example (where a descent left it)
            where = torch.where(frozen[chain], value[chain, -1].abs().double(), -1.0)
            index = _index(int(where.argmax()), value.shape[2:])
            messages.append(
                f"chain {chain_ids[chain]}: {count} of {frozen[chain].numel()} coordinates of "
                f"site {name!r} did not move during sampling, e.g. {name}{index} = "
                f"{float(value[chain, -1][index]):.4g} (unconstrained) in all "
                f"{value.shape[1]} kept draws, spread {float(spread[chain][index]):.2g} for a "
                f"posterior standard deviation of about {float(scale[chain][index]):.2g}: their "
                "draws are a single point, not the posterior. The warm-up chose steps too small "
                "to move them (a ReLU unit that is off on every training row has no likelihood "
                "gradient for its outgoing weights). Run again with more warm-up draws or "
                "another seed"
            )
    return messages


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    """The multi-index of position ``flat`` in an array of ``shape`` (row-major)."""
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def check_classifier(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    constrained: Mapping[str, torch.Tensor],
    plate: DataPlate,
    chain_ids: list[int],
    max_rows: int = 2000,
) -> list[str]:
    """Messages about chains whose classifier predicts no better than the most frequent class.

    ``constrained`` holds every chain's current values, ``(C, ...)`` per latent site; the model
    is evaluated on its first ``max_rows`` rows. Models without a categorical observation site in
    the data plate give no message, nor do models whose class probabilities are the same for
    every row (no inputs: always predicting the most frequent class is then right).
    """
    size = min(plate.num_data, plate.max_rows, max_rows)
    device = next((v.device for v in constrained.values()), None)
    rows = None if size == plate.num_data else torch.arange(size, device=device)
    model, args, kwargs = plate.bind(model, args, kwargs, rows)
    messages = []
    for chain, chain_id in enumerate(chain_ids):
        values = {name: value[chain] for name, value in constrained.items()}
        found = _accuracy(model, args, kwargs, values, plate.name)
        if found is None:
            return []
        accuracy, chance = found
        if accuracy <= chance + 0.01:
            messages.append(
                f"chain {chain_id}: after warm-up the classifier's accuracy on the training "
                f"rows is {accuracy:.3f}, no better than always predicting the most frequent "
                f"class ({chance:.3f}): the network has not left its starting point. Use more "
                "warm-up draws, or check the model and the step size"
            )
    return messages


def _accuracy(model, args, kwargs, values, plate_name) -> tuple[float, float] | None:
    """Training accuracy and majority-class rate of the first categorical observation site."""
    with torch.no_grad():
        trace = poutine.trace(poutine.condition(model, data=dict(values))).get_trace(
            *args, **kwargs
        )
    for site in trace.nodes.values():
        if site["type"] != "sample" or not site["is_observed"]:
            continue
        if not any(frame.name == plate_name for frame in site["cond_indep_stack"]):
            continue
        fn = site["fn"]
        while isinstance(fn, dist.Independent | dist.MaskedDistribution):
            fn = fn.base_dist
        if not isinstance(fn, torch.distributions.Categorical):
            continue
        if _same_for_every_row(fn._param):
            return None  # no inputs: the most frequent class is the best prediction there is
        labels = site["value"].reshape(-1)
        predicted = fn.logits.reshape(-1, fn.logits.shape[-1]).argmax(-1)
        accuracy = float((predicted == labels).double().mean())
        chance = float(torch.bincount(labels).max()) / labels.numel()
        return accuracy, chance
    return None


def _same_for_every_row(parameter: torch.Tensor) -> bool:
    """Whether the class probabilities (or logits, as given) are broadcast along the rows: a
    model without inputs, e.g. a Dirichlet-categorical one, whose plate expands one vector."""
    if parameter.dim() == 1:
        return True
    rows = parameter.reshape(-1, parameter.shape[-1])
    return rows.shape[0] == 1 or rows.stride(0) == 0
