r"""Signal-to-noise pruning of a mean-field Gaussian posterior (Blundell et al., 2015, table 1).

For a weight with variational posterior :math:`\mathcal N(\mu_j, \sigma_j^2)` the signal-to-noise
ratio is :math:`\mathrm{SNR}_j = |\mu_j| / \sigma_j`. Pruning a fraction :math:`f` of the weights
replaces the posterior of the :math:`\lceil fD \rceil` weights with the lowest SNR by the constant
zero; the network is then evaluated at the posterior means of the remaining weights. Blundell et
al. report that removing 95% of the weights of an MNIST classifier barely changes its test error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import torch

from .._validation import check_interval

__all__ = ["PruningRow", "format_pruning_table", "prune_by_snr", "snr_pruning_table"]

TensorDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class PruningRow:
    """One row of the pruning table."""

    fraction_removed: float
    num_removed: int
    snr_threshold: float
    score: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def prune_by_snr(
    locs: Mapping[str, torch.Tensor],
    scales: Mapping[str, torch.Tensor],
    fraction: float,
    sites: Sequence[str] | None = None,
) -> tuple[TensorDict, float, int]:
    r"""Zero the fraction ``fraction`` of weights with the lowest :math:`|\mu|/\sigma`.

    Parameters
    ----------
    locs, scales:
        :math:`\mu` and :math:`\sigma` per site, e.g. from
        :meth:`pyro_sgmcmc.variational.svi.SVIResult.loc_and_scale`.
    fraction:
        Fraction in ``[0, 1]`` of the pooled weights of ``sites`` to remove.
    sites:
        Sites to prune (default: all); the others keep their means.

    Returns
    -------
    params, threshold, num_removed
        The pruned means, the SNR at the cut (``nan`` if nothing is removed) and the number of
        weights removed. Ties at the threshold are broken by order, so exactly
        :math:`\lceil fD\rceil` weights are removed.
    """
    fraction = check_interval("fraction", fraction, 0.0, 1.0)
    sites = list(locs) if sites is None else list(sites)
    unknown = [s for s in sites if s not in locs or s not in scales]
    if unknown:
        raise ValueError(f"sites must name sites present in locs and scales, got unknown {unknown}")
    negative = [s for s in sites if bool((scales[s] <= 0).any())]
    if negative:
        raise ValueError(f"scales must be > 0 (allowed range (0, inf)); not so at sites {negative}")
    snr = torch.cat([(locs[s].abs() / scales[s]).reshape(-1) for s in sites])
    num_removed = math.ceil(fraction * snr.numel() - 1e-9)
    keep = torch.ones_like(snr, dtype=torch.bool)
    threshold = math.nan
    if num_removed > 0:
        order = torch.argsort(snr)
        keep[order[:num_removed]] = False
        threshold = float(snr[order[num_removed - 1]])
    params = {name: value.detach().clone() for name, value in locs.items()}
    offset = 0
    for s in sites:
        size = params[s].numel()
        mask = keep[offset : offset + size].reshape(params[s].shape)
        params[s] = torch.where(mask, params[s], torch.zeros_like(params[s]))
        offset += size
    return params, threshold, num_removed


def snr_pruning_table(
    locs: Mapping[str, torch.Tensor],
    scales: Mapping[str, torch.Tensor],
    evaluate: Callable[[TensorDict], float],
    fractions: Sequence[float] = (0.0, 0.5, 0.75, 0.95, 0.98, 0.99),
    sites: Sequence[str] | None = None,
) -> list[PruningRow]:
    """Score (e.g. test accuracy) of the pruned posterior mean for each fraction removed.

    Parameters
    ----------
    locs, scales:
        Variational means and scales per site; for an SVI fit
        ``result.loc_and_scale()`` (unconstrained space, which is the weight space for weights
        with real support).
    evaluate:
        ``params -> score``, e.g. the test accuracy of the network with weights ``params``.
    fractions:
        Fractions in ``[0, 1]`` to remove.
    sites:
        Sites to prune (default: all; pass the weight sites only to keep biases and noise
        scales intact).

    Returns
    -------
    list of PruningRow
        One row per fraction, in the order given.
    """
    if len(fractions) == 0:
        raise ValueError("fractions must contain at least one value in [0, 1]")
    rows = []
    for fraction in fractions:
        params, threshold, removed = prune_by_snr(locs, scales, fraction, sites)
        rows.append(PruningRow(float(fraction), removed, threshold, float(evaluate(params))))
    return rows


def format_pruning_table(rows: Sequence[PruningRow], score_name: str = "score") -> str:
    """A plain-text table of :func:`snr_pruning_table` rows."""
    lines = [f"{'removed':>8}  {'weights':>8}  {'SNR cut':>8}  {score_name:>10}"]
    for row in rows:
        cut = "-" if math.isnan(row.snr_threshold) else f"{row.snr_threshold:.3g}"
        lines.append(
            f"{100 * row.fraction_removed:7.1f}%  {row.num_removed:8d}  {cut:>8}  {row.score:10.4f}"
        )
    return "\n".join(lines)
