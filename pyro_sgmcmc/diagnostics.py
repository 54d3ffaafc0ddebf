r"""Convergence report: R-hat, bulk and tail ESS, ESS per second and divergences per method.

For every scalar coordinate of every posterior variable ArviZ computes the rank-normalised split
:math:`\hat R` and the bulk and tail effective sample sizes of Vehtari et al. (2021); the report
keeps the worst of each (largest :math:`\hat R`, smallest ESS) and divides the smallest bulk ESS by
the wall time. Rules of thumb (Vehtari et al.): :math:`\hat R < 1.01` and bulk/tail ESS > 100 per
quantity before trusting posterior summaries; both need at least two chains to detect a stuck
chain.

For SVI the "chains" are independent fits, each with independent draws from its guide:
:math:`\hat R` then measures the agreement between fits, and the ESS is close to the number of
draws by construction (it says nothing about the quality of the approximation).

References
----------
A. Vehtari, A. Gelman, D. Simpson, B. Carpenter and P.-C. Bürkner, "Rank-normalization, folding,
and localization: an improved R-hat for assessing convergence of MCMC", Bayesian Analysis 16(2),
2021.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import arviz as az
import numpy as np

__all__ = ["ConvergenceReport", "convergence_report", "format_reports", "reports_table"]


@dataclass(frozen=True)
class ConvergenceReport:
    """Worst-case convergence statistics of one inference result.

    Attributes
    ----------
    method:
        Name of the method (e.g. ``"NUTS"``, ``"SGHMC"``, ``"SVI"``).
    num_chains, num_draws:
        Chains and draws per chain.
    max_rhat:
        Largest rank-normalised split :math:`\\hat R` over all scalar quantities (``nan`` with a
        single chain: R-hat compares chains).
    min_ess_bulk, min_ess_tail:
        Smallest bulk and tail ESS over all scalar quantities.
    wall_time:
        Seconds of inference (``nan`` if unknown).
    ess_bulk_per_second:
        ``min_ess_bulk / wall_time`` (``nan`` if the wall time is unknown or zero).
    divergences:
        Post-warm-up draws flagged ``diverging`` in ``sample_stats`` (0 if not recorded).
    """

    method: str
    num_chains: int
    num_draws: int
    max_rhat: float
    min_ess_bulk: float
    min_ess_tail: float
    wall_time: float
    ess_bulk_per_second: float
    divergences: int

    def to_dict(self) -> dict[str, float | int | str]:
        """The fields as a plain dict (JSON-serialisable)."""
        return asdict(self)

    @property
    def converged(self) -> bool:
        """``max_rhat < 1.01`` and both minimum ESS above 100 (Vehtari et al., 2021)."""
        return self.max_rhat < 1.01 and self.min_ess_bulk > 100 and self.min_ess_tail > 100

    def __str__(self) -> str:
        return format_reports([self])


def _min_or_nan(dataset) -> float:
    values = np.concatenate([np.ravel(v.values) for v in dataset.data_vars.values()] or [[]])
    values = values[np.isfinite(values)]
    return float(values.min()) if values.size else math.nan


def convergence_report(
    idata: az.InferenceData,
    method: str | None = None,
    *,
    wall_time: float | None = None,
    var_names: Sequence[str] | None = None,
    group: str = "posterior",
) -> ConvergenceReport:
    """Summarise the convergence of ``idata.posterior`` (or of another group).

    Parameters
    ----------
    idata:
        An ``InferenceData`` with a ``posterior`` group (e.g. from
        :func:`pyro_sgmcmc.export.to_inference_data`).
    method:
        Name shown in the table; defaults to the ``method`` attribute of the posterior.
    wall_time:
        Seconds of inference, >= 0; defaults to the ``sampling_time`` attribute.
    var_names:
        Variables to include (default: all).
    group:
        The group whose draws are diagnosed (default ``"posterior"``). For Bayesian neural
        networks, weight-space R-hat is large even for well-mixed chains (hidden units can be
        permuted and sign-flipped between chains); ``group="predictions"`` with
        ``var_names=["output"]`` diagnoses the network's outputs at the test inputs instead,
        which are identified.

    Returns
    -------
    ConvergenceReport
    """
    if not hasattr(idata, "posterior"):
        raise ValueError("idata must have a posterior group")
    if group not in idata.groups():
        raise ValueError(f"group must be one of {idata.groups()}, got {group!r}")
    posterior = getattr(idata, group)
    if var_names is not None:
        missing = [v for v in var_names if v not in posterior.data_vars]
        if missing:
            raise ValueError(
                f"var_names must name variables of the {group} group "
                f"{sorted(posterior.data_vars)}, got unknown {missing}"
            )
        posterior = posterior[list(var_names)]
    if wall_time is None:
        wall_time = idata.posterior.attrs.get("sampling_time", math.nan)
    wall_time = float(wall_time)
    if not (math.isnan(wall_time) or wall_time >= 0):
        raise ValueError(f"wall_time must be >= 0 seconds, got {wall_time}")
    if method is None:
        method = str(idata.posterior.attrs.get("method", "unknown"))
    num_chains, num_draws = posterior.sizes["chain"], posterior.sizes["draw"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with np.errstate(invalid="ignore", divide="ignore"):
            # R-hat compares chains: with one chain ArviZ logs a warning and returns nan, so it
            # is not asked (the report shows nan)
            rhat = az.rhat(posterior) if num_chains > 1 else None
            ess_bulk = az.ess(posterior, method="bulk")
            ess_tail = az.ess(posterior, method="tail")
    max_rhat = math.nan
    if rhat is not None:
        rhat_values = np.concatenate([np.ravel(v.values) for v in rhat.data_vars.values()])
        finite = rhat_values[np.isfinite(rhat_values)]
        if finite.size == rhat_values.size and finite.size:
            max_rhat = float(finite.max())
        elif finite.size:
            max_rhat = math.inf  # a constant coordinate within chains but not across them
    min_bulk = _min_or_nan(ess_bulk)
    per_second = min_bulk / wall_time if wall_time and wall_time > 0 else math.nan
    divergences = 0
    if hasattr(idata, "sample_stats") and "diverging" in idata.sample_stats:
        divergences = int(idata.sample_stats["diverging"].values.sum())
    return ConvergenceReport(
        method=method,
        num_chains=int(num_chains),
        num_draws=int(num_draws),
        max_rhat=max_rhat,
        min_ess_bulk=min_bulk,
        min_ess_tail=_min_or_nan(ess_tail),
        wall_time=wall_time,
        ess_bulk_per_second=per_second,
        divergences=divergences,
    )


_COLUMNS = (
    ("method", "method", "{}"),
    ("chains", "num_chains", "{:d}"),
    ("draws", "num_draws", "{:d}"),
    ("max R-hat", "max_rhat", "{:.3f}"),
    ("min ESS bulk", "min_ess_bulk", "{:.0f}"),
    ("min ESS tail", "min_ess_tail", "{:.0f}"),
    ("time [s]", "wall_time", "{:.2f}"),
    ("ESS/s", "ess_bulk_per_second", "{:.2f}"),
    ("divergences", "divergences", "{:d}"),
)


def format_reports(reports: Iterable[ConvergenceReport]) -> str:
    """A plain-text table with one row per report (for tutorials and the CLI)."""
    reports = list(reports)
    if not reports:
        raise ValueError("reports must contain at least one ConvergenceReport")
    rows = [[title for title, _, _ in _COLUMNS]]
    for report in reports:
        row = []
        for _, attribute, fmt in _COLUMNS:
            value = getattr(report, attribute)
            if isinstance(value, float) and not math.isfinite(value):
                row.append("inf" if value == math.inf else "-")
            else:
                row.append(fmt.format(value))
        rows.append(row)
    widths = [max(len(row[k]) for row in rows) for k in range(len(_COLUMNS))]
    lines = []
    for i, row in enumerate(rows):
        cells = [
            cell.ljust(width) if k == 0 else cell.rjust(width)
            for k, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def reports_table(reports: Iterable[ConvergenceReport]) -> Any:
    """The table of :func:`format_reports` as a ``pandas.DataFrame``, one row per method.

    A notebook renders it as an HTML table. The columns carry the same titles as the text
    table; values are numbers (``NaN`` where a statistic does not apply), not strings.

    Returns
    -------
    pandas.DataFrame
        Indexed by method.
    """
    import pandas as pd  # an ArviZ dependency, imported here to keep this module light

    reports = list(reports)
    if not reports:
        raise ValueError("reports must contain at least one ConvergenceReport")
    rows = [
        {title: getattr(report, attribute) for title, attribute, _ in _COLUMNS}
        for report in reports
    ]
    return pd.DataFrame(rows).set_index("method")
