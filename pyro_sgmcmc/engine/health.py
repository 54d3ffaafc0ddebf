r"""Checks of a run that say, with the numbers, when its draws should not be trusted.

Divergences are recorded step by step (:mod:`.divergence`); these checks look at the run as a
whole and warn (:class:`SamplerWarning`):

* **a chain that does not move**: during sampling every coordinate of every site stayed where it
  was (to within :math:`10^{-12}` of its scale) -- a step size far too small, or a chain stuck
  in divergences;
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
from ..model_structure import DataPlate

__all__ = ["check_classifier", "check_draws", "warn_all"]


def warn_all(messages: list[str], stacklevel: int = 3) -> None:
    """Emit each message as a :class:`SamplerWarning`."""
    for message in messages:
        warnings.warn(message, SamplerWarning, stacklevel=stacklevel)


def check_draws(
    draws: Mapping[str, torch.Tensor],
    virial: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    temperature: float,
    chain_ids: list[int],
) -> list[str]:
    """Messages about chains that did not move or ran too hot (see the module docstring).

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
    """
    messages = []
    if draws and next(iter(draws.values())).shape[1] >= 2:
        spread = torch.stack(
            [
                (value.std(1) / (value.abs().mean(1) + 1.0)).reshape(value.shape[0], -1).amax(1)
                for value in draws.values()
            ]
        ).amax(0)
        for index in (spread < 1e-12).nonzero().flatten().tolist():
            messages.append(
                f"chain {chain_ids[index]} did not move during sampling (largest relative spread "
                f"of a coordinate {float(spread[index]):.1e}): its step size is far too small, "
                "or every step diverged"
            )
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
