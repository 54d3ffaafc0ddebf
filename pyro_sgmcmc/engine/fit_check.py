r"""A chain whose fit to the training data got far worse during warm-up than it had been.

The warm-up's descent ends near a mode of the posterior; the chains then sample at temperature
:math:`T`. Where the posterior is close to Gaussian in its :math:`D` coordinates, the data's
log-likelihood at a draw lies below its maximum by :math:`T\chi^2_D/2`: :math:`TD/2` on average,
with standard deviation :math:`T\sqrt{D/2}` (Wilks). A chain whose log-likelihood at the end of
warm-up lies below the best it had at the warm-up's milestones (the end of the descent, the ends
of the first adaptation windows) by far more,

.. math::

    \bar d - z\,\mathrm{se}(\bar d) \;>\; \frac{T\,(D/2 + 10\sqrt{D/2})}{N} + m
    \quad\text{nats per row},

has left the posterior. :math:`\bar d` is the mean over rows of the paired difference of the
rows' log-likelihoods (the same :data:`ROWS` rows spread evenly over the data at every
milestone), :math:`z =` :data:`Z`, :math:`m =` :data:`MARGIN`. The test is made twice, on the
differences and on the differences winsorised at their :data:`TAIL` and :math:`1 -`
:data:`TAIL` quantiles, and a chain that fails either is named: a few rows fitted
catastrophically badly (a ReLU unit woken for a handful of rows far out in the inputs, with a
residual of 80 target standard deviations) inflate :math:`\mathrm{se}(\bar d)` so much that the
plain test passes, while the noise precision those rows drag down makes every other row fit
worse -- which the winsorised mean sees with a small standard error. The usual cause is a divergence
that threw the chain to where the likelihood is nearly flat -- a noise scale grown to the whole
spread of the targets -- and steps measured there too small to bring it back: its draws can
still look settled (R-hat needs other chains to see it; a single chain has none).

The check runs once, at the end of warm-up, for the adaptive warm-up (the milestones are kept
by :class:`~pyro_sgmcmc.engine.adaptation.AdaptiveControl`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from pyro import poutine

from ..models.structure import ModelStructure, plate_frame, rows_log_prob, spread_rows

__all__ = ["MARGIN", "ROWS", "TAIL", "Z", "check_fit", "rows_log_likelihood"]

#: Rows of the data evaluated (at most; spread evenly over the data).
ROWS = 512
#: Nats per row by which a chain must fall short of its best fit, beyond what sampling explains.
MARGIN = 0.5
#: Standard errors (of the mean over rows) the shortfall must clear.
Z = 5.0
#: The robust test winsorises the differences at this quantile and its complement.
TAIL = 0.1


def rows_log_likelihood(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    structure: ModelStructure,
    constrained: Mapping[str, torch.Tensor],
) -> torch.Tensor | None:
    """``(n,)``: each row's log-likelihood (summed over the observed sites in the data plate) for
    one chain's constrained values; ``model, args, kwargs`` are bound to the rows evaluated.
    ``None`` when no observed site lies in the plate."""
    with torch.no_grad():
        trace = poutine.trace(poutine.condition(model, data=dict(constrained))).get_trace(
            *args, **kwargs
        )
    total = None
    for name in structure.observed_sites:
        site = trace.nodes.get(name)
        frame = None if site is None else plate_frame(site, structure.plate.name)
        if frame is None:
            continue
        rows = rows_log_prob(site, site["value"], frame).double()
        total = rows if total is None else total + rows
    return total


def check_fit(
    structure: ModelStructure,
    args: tuple,
    kwargs: Mapping[str, Any],
    milestones: Sequence[tuple[str, Mapping[str, torch.Tensor]]],
    now: Mapping[str, torch.Tensor],
    temperature: float,
    chain_ids: list[int],
) -> list[str]:
    """Messages about chains whose fit fell far short of their best (see the module docstring).

    Parameters
    ----------
    structure, args, kwargs:
        The model as the engine sees it and its full-data arguments.
    milestones:
        ``(label, values)`` per milestone: constrained values of every latent site, ``(C, ...)``.
    now:
        The constrained values at the end of warm-up, ``(C, ...)`` per site.
    temperature:
        :math:`T`.
    chain_ids:
        The run's index of each chain, for the messages.
    """
    if not milestones:
        return []
    plate = structure.plate
    size = min(plate.num_data, plate.max_rows, ROWS)
    device = next(iter(now.values())).device
    rows = None if size == plate.num_data else spread_rows(size, plate.num_data, device)
    model, args, kwargs = plate.bind(structure.model, args, kwargs, rows)
    dimension = sum(value[0].numel() for value in now.values())
    allowed = temperature * (dimension / 2 + 10 * math.sqrt(dimension / 2)) / plate.num_data
    allowed += MARGIN
    messages = []
    for chain, chain_id in enumerate(chain_ids):

        def fit(values: Mapping[str, torch.Tensor], chain: int = chain) -> torch.Tensor | None:
            one = {name: value[chain] for name, value in values.items()}
            return rows_log_likelihood(model, args, kwargs, structure, one)

        current = fit(now)
        if current is None:
            return []
        if current.numel() < 2 or not bool(torch.isfinite(current).all()):
            continue
        found = _shortfall(current, [(label, fit(values)) for label, values in milestones])
        if found is not None and _clears(found[1], allowed):
            messages.append(_message(chain_id, current, found, allowed))
    return messages


def _shortfall(
    current: torch.Tensor, earlier: list[tuple[str, torch.Tensor | None]]
) -> tuple[str, torch.Tensor, float] | None:
    """The best earlier fit: its label, the per-row shortfall of ``current`` from it and its
    mean log-likelihood per row."""
    finite = [(label, rows) for label, rows in earlier if rows is not None]
    finite = [(label, rows) for label, rows in finite if bool(torch.isfinite(rows).all())]
    if not finite:
        return None
    label, best = max(finite, key=lambda item: float(item[1].mean()))
    return label, best - current, float(best.mean())


def _clears(difference: torch.Tensor, allowed: float) -> bool:
    """Whether the mean per-row shortfall, plain or winsorised at :data:`TAIL`, exceeds
    ``allowed`` by :data:`Z` standard errors."""
    low, high = torch.quantile(difference, torch.tensor([TAIL, 1.0 - TAIL]).to(difference))
    for values in (difference, difference.clamp(low, high)):
        error = float(values.std()) / math.sqrt(values.numel())
        if float(values.mean()) - Z * error > allowed:
            return True
    return False


def _message(
    chain_id: int, current: torch.Tensor, found: tuple[str, torch.Tensor, float], allowed: float
) -> str:
    label, _, best = found
    return (
        f"chain {chain_id} fits the training data far worse at the end of warm-up than it did "
        f"at {label}: log-likelihood {float(current.mean()):.3g} per row now, {best:.3g} then "
        f"(on {current.numel()} rows; sampling the posterior costs at most {allowed:.2g} per "
        "row). It has left the posterior -- typically after a divergence, to where the "
        "likelihood is nearly flat -- and its draws do not describe the posterior even if they "
        "look settled. Leave the chain out, or run again with more warm-up draws, a larger "
        "batch_size or another seed"
    )
