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
* **a chain still trending**: a scalar site (one coordinate: a noise scale, a prior scale, an
  intercept) whose mean over the last quarter of a chain's kept draws (at least
  :data:`TREND_MIN_DRAWS`) differs from its mean over the first quarter by more than
  :data:`TREND` times its draw-to-draw fluctuation -- the comparison of early and late
  segments of Geweke (1992), *Evaluating the accuracy of sampling-based approaches to the
  calculation of posterior moments*, measured against the successive-difference scale of von
  Neumann (1941), *Distribution of the ratio of the mean square successive difference to the
  variance*, which a drift does not inflate as it inflates the variance. A stationary chain's
  quarters differ by about :math:`\sqrt{2\tau/q}` of its standard deviation (:math:`q`
  draws per quarter, :math:`\tau` its autocorrelation time), far below the bound unless
  :math:`\tau` is as long as the run; a chain still on its way to the posterior (its fit
  still improving, a noise precision still rising) moves further between the quarters than
  between any two draws. A slowly mixing chain sampled far more finely than it decorrelates
  (one gradient step per draw) can pass that bound too, so where the warm-up measured the
  site's posterior standard deviation :math:`\sigma` the site must also have moved more than
  :data:`TREND` :math:`\sigma` -- further than a chain in its typical set goes unless its
  posterior correlations exceed about 0.95. In a network only the sites of shape ``()`` (noise
  and prior scales) are checked: its weights and biases -- the output bias too, a tensor of
  one element -- are not identified (a shift of the output bias is taken up by the hidden
  units), and on the 5,000-row regression family the output bias of 6 of 20 healthy SGHMC
  chains drifted past both bounds while the fit stayed put. The verdict (R-hat, ESS) cannot
  tell a drifting chain from a slowly mixing one when every chain of a network mixes slowly in
  :math:`f(x)`;
* **a chain that is too hot**: its configurational temperature
  (:class:`~pyro_sgmcmc.engine.virial.VirialMeter`) over the sampling phase exceeds
  :math:`1.5\,T` by four standard errors -- a step size too large for the curvature, or gradient
  noise the dynamics do not absorb, and draws spread far wider than the posterior;
* **a classifier at chance after warm-up**: the predicted class (the largest logit of a
  categorical observation site) is right no more often than always guessing the most frequent
  class, on up to 2000 training rows -- a network that has not left its starting point.

A network's coordinates that stay far outside their prior, moving or not, are named by
:mod:`.prior_distance`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import pyro.distributions as dist
import torch
from pyro import poutine

from ..errors import SamplerWarning, user_stacklevel
from ..models.structure import DataPlate

__all__ = [
    "FROZEN",
    "FROZEN_MIN_DRAWS",
    "TREND",
    "TREND_MIN_DRAWS",
    "check_classifier",
    "check_draws",
    "warn_all",
]

#: A scalar site whose last-quarter mean differs from its first-quarter mean by more than this
#: many times its draw-to-draw fluctuation (root mean square successive difference over
#: :math:`\sqrt 2`) is reported as still trending.
TREND = 10.0
#: ... when there are at least this many kept draws (five per quarter).
TREND_MIN_DRAWS = 20
#: A coordinate whose kept draws spread less than this fraction of its posterior standard
#: deviation (as the warm-up measured it) is reported as frozen.
FROZEN = 1e-3
#: ... when there are at least this many kept draws (independent draws of a coordinate spread
#: that little with probability about ``FROZEN ** (S - 1)``).
FROZEN_MIN_DRAWS = 10


def warn_all(messages: list[str]) -> None:
    """Emit each message as a :class:`SamplerWarning`, attributed to the user's line that
    started the run (the first frame outside this package, Pyro and PyTorch), not to ours."""
    for message in messages:
        warnings.warn(message, SamplerWarning, stacklevel=user_stacklevel())


def check_draws(
    draws: Mapping[str, torch.Tensor],
    virial: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    temperature: float,
    chain_ids: list[int],
    posterior_scales: Mapping[str, torch.Tensor] | None = None,
    network: bool = False,
) -> list[str]:
    """Messages about chains or coordinates that did not move, chains still trending, and
    chains that ran too hot (see the module docstring).

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
    network:
        Whether the model is a network with hidden units: then only its sites of shape ``()``
        are checked for a trend, not its weights and biases (see the module docstring).
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
    judged = {n: v for n, v in draws.items() if not network or v.dim() == 2}
    messages += _trending_sites(judged, chain_ids, still, posterior_scales or {})
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


def trend_ratios(draws: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per scalar site with at least :data:`TREND_MIN_DRAWS` draws, a ``(3, C)`` stack: the
    first- and last-quarter means of each chain's draws and their difference in draw-to-draw
    fluctuations (the largest float for a chain that moved in one direction only, 0 for one
    that did not move)."""
    ratios = {}
    for name, value in draws.items():
        if value.shape[1] < TREND_MIN_DRAWS or value[0, 0].numel() != 1:
            continue
        series = value.reshape(value.shape[0], -1).double()
        quarter = series.shape[1] // 4
        first, last = series[:, :quarter].mean(1), series[:, -quarter:].mean(1)
        jitter = (series.diff(dim=1).square().mean(1) / 2).sqrt()
        ratio = (last - first).abs() / jitter
        ratios[name] = torch.stack([first, last, ratio.nan_to_num(0.0)])
    return ratios


def _trending_sites(
    draws: Mapping[str, torch.Tensor],
    chain_ids: list[int],
    skip: set[int],
    scales: Mapping[str, torch.Tensor],
) -> list[str]:
    """One message per chain with a scalar site still trending (the site furthest past
    :data:`TREND`, and how many others are); a site whose posterior standard deviation the
    warm-up measured must also have moved :data:`TREND` of them."""
    messages = []
    ratios = trend_ratios(draws)
    for chain in range(len(chain_ids)):
        found = {}
        for name, (first, last, ratio) in ratios.items():
            scale = scales.get(name)
            moved = abs(float(last[chain] - first[chain]))
            if scale is not None and moved <= TREND * float(scale[chain].reshape(-1)[0]):
                continue
            if float(ratio[chain]) > TREND and chain not in skip:
                found[name] = (float(first[chain]), float(last[chain]), float(ratio[chain]))
        if found:
            messages.append(_trending_message(chain_ids[chain], found))
    return messages


def _trending_message(chain_id: int, found: Mapping[str, tuple[float, float, float]]) -> str:
    name, (first, last, ratio) = max(found.items(), key=lambda item: item[1][2])
    count = len(found) - 1
    others = f" (and {count} other scalar site{'s' * (count > 1)})" if count else ""
    return (
        f"chain {chain_id} is still trending: site {name!r}{others} moved from a mean of "
        f"{first:.4g} over the first quarter of its kept draws to {last:.4g} over the last "
        f"(unconstrained), {ratio:.0f} times its draw-to-draw fluctuation (bound {TREND:g}). "
        "The chain has not reached a stationary state -- it is still on its way to the "
        "posterior, or mixes far more slowly than the run is long -- so its draws are not yet "
        "from the posterior. Give more warm-up draws, or draw more "
        "(run_chains(..., target_ess=...))"
    )


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
