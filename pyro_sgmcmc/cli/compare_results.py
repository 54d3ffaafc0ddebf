"""The results of a comparison and their forms: the table, ``summary.json`` and ``summary.md``.

Part of :mod:`pyro_sgmcmc.cli.compare` (whose names these are): :class:`MethodResult` is one
method's row, filled in by :func:`~pyro_sgmcmc.cli.compare.run_method`; :class:`ComparisonResults`
holds every row with the run's settings and renders them as an aligned text table (printed by
the command line), a JSON-ready dict and Markdown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.diagnostics import ESS_PER_CHAIN, FUNCTION_RHAT_BOUND, RHAT_BOUND, rhat_text
from .compare_config import CompareConfig


@dataclass
class MethodResult:
    """The outcome of one method.

    Attributes
    ----------
    method:
        Name from :data:`METHODS`.
    status:
        The verdict on the draws, ``"converged"`` or ``"not converged"``
        (:mod:`pyro_sgmcmc.analysis.diagnostics`; ``"fitted"`` for SVI, whose draws are independent
        draws of its guide), or ``"failed"`` or ``"skipped"``.
    message:
        Why it failed, was skipped or has not converged, or notes such as NUTS's bounds.
    wall_time:
        Seconds of inference (sampling or optimisation), excluding prediction and output.
    metrics:
        Test metrics (see :func:`predictive_metrics`).
    diagnostics:
        ``max_rhat``, ``min_ess_bulk``, ``ess_per_second``, ``divergences`` (``None`` where they
        do not apply, e.g. R-hat of SVI's independent draws).
    files:
        Paths written for this method.
    """

    method: str
    status: str = "fitted"
    message: str = ""
    wall_time: float = math.nan
    metrics: dict[str, float] = field(default_factory=dict)
    diagnostics: dict[str, float | int | None] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the method produced draws."""
        return self.status not in ("failed", "skipped")


#: The bound each R-hat column is read against.
_RHAT_BOUNDS = {"max_rhat": RHAT_BOUND, "max_rhat_output": FUNCTION_RHAT_BOUND}


@dataclass
class ComparisonResults:
    """All methods' results plus the run's settings and the files written."""

    config: CompareConfig
    dataset: str
    task: str
    num_train: int
    num_test: int
    methods: list[MethodResult]
    notes: list[str] = field(default_factory=list)
    #: Files in the output directory that pyro-sgmcmc did not write, left in place (--overwrite).
    kept_files: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    total_time: float = math.nan

    @property
    def all_failed(self) -> bool:
        """True when no method produced results (the CLI then exits with status 1)."""
        return not any(m.ok for m in self.methods)

    def columns(self) -> list[tuple[str, str, str]]:
        """The table's columns: (key, header, format); keys index metrics or diagnostics."""
        if self.task == "regression":
            metric_cols = [("rmse", "test RMSE", ".3f"), ("log_likelihood", "test LL", ".3f")]
        else:
            metric_cols = [
                ("accuracy", "accuracy", ".3f"),
                ("nll", "test NLL", ".3f"),
                ("ece", "ECE", ".3f"),
            ]
        return [
            ("wall_time", "wall [s]", ".1f"),
            *metric_cols,
            ("max_rhat", "max R-hat", ".3f"),
            ("min_ess_bulk", "min ESS", ".1f"),
            ("max_rhat_output", "R-hat f(x)", ".3f"),
            ("min_ess_bulk_output", "ESS f(x)", ".1f"),
            ("ess_per_second", "ESS/s", ".2f"),
            ("divergences", "div.", "d"),
        ]

    def rows(self) -> list[list[str]]:
        """The table body as strings, one row per method (``-`` where not applicable)."""
        rows = []
        for m in self.methods:
            values = {"wall_time": m.wall_time, **m.metrics, **m.diagnostics}
            row = [m.method, m.status]
            for key, _, fmt in self.columns():
                value = values.get(key)
                if value is None or (isinstance(value, float) and not math.isfinite(value)):
                    row.append("-")
                elif key in _RHAT_BOUNDS:  # digits enough to show a value above its bound
                    row.append(rhat_text(value, _RHAT_BOUNDS[key]))
                else:
                    row.append(format(value, fmt))
            rows.append(row)
        return rows

    def kept_files_line(self) -> str:
        """Which files of the user's ``--overwrite`` left in place in the output directory."""
        shown = ", ".join(self.kept_files[:5]) + (", ..." if len(self.kept_files) > 5 else "")
        return f"--overwrite: left in place files pyro-sgmcmc did not write: {shown}"

    def table(self, markdown: bool = False) -> str:
        """The per-method table as aligned text, or as a Markdown table."""
        headers = ["method", "status"] + [h for _, h, _ in self.columns()]
        rows = self.rows()
        if markdown:
            lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
            lines += ["| " + " | ".join(r) + " |" for r in rows]
            return "\n".join(lines)
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
        fmt = "  ".join(f"{{:<{w}}}" if i < 2 else f"{{:>{w}}}" for i, w in enumerate(widths))
        lines = [fmt.format(*headers), "  ".join("-" * w for w in widths)]
        lines += [fmt.format(*r) for r in rows]
        return "\n".join(lines)

    def messages(self) -> list[str]:
        """One line per method that has a message (failures, skips, verdicts, bounds)."""
        return [f"{m.method}: {m.message}" for m in self.methods if m.message]

    def criterion(self) -> str:
        """What the status column judges, in one line."""
        if self.config.hidden:
            return (
                "status: judged on the network's outputs at the test inputs (R-hat f(x) <= "
                f"{FUNCTION_RHAT_BOUND}, ESS f(x) >= {ESS_PER_CHAIN} per chain): hidden units "
                "can be permuted between chains, so the weights' R-hat is large even when the "
                "predictions agree"
            )
        return (
            f"status: R-hat <= {RHAT_BOUND} and bulk and tail ESS >= {ESS_PER_CHAIN} per chain "
            "over every parameter (Vehtari et al. 2021)"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (NaN becomes ``None``)."""
        return _json_safe(
            {
                "dataset": self.dataset,
                "task": self.task,
                "num_train": self.num_train,
                "num_test": self.num_test,
                "total_time": self.total_time,
                "config": self.config.to_dict(),
                "notes": self.notes,
                "methods": {m.method: asdict(m) for m in self.methods},
                "files": self.files,
            }
        )

    def markdown(self) -> str:
        """The content of ``summary.md``."""
        lines = [
            f"# pyro-sgmcmc compare: {self.dataset} ({self.task})",
            "",
            f"{self.num_train} training rows, {self.num_test} test rows; "
            f"total {self.total_time:.1f} s.",
            "",
            self.table(markdown=True),
            "",
        ]
        if self.task == "regression":
            lines.append(
                "RMSE and log-likelihood (mean per test point of the log posterior predictive "
                "density) are in the original units of the target."
            )
        else:
            lines.append(
                "NLL: mean negative log posterior predictive probability of the test labels; "
                "ECE: expected calibration error over 15 equal-width confidence bins."
            )
        lines.append(self.criterion() + ".")
        lines.append(
            "R-hat (rank-normalised split R-hat) and bulk ESS are the worst over all scalar "
            "parameters; ESS/s divides the smallest bulk ESS of what the verdict judges (a "
            "network's outputs f(x), else the parameters) by the wall time. In weight space a "
            "BNN posterior has many equivalent modes (hidden units can be permuted or flip "
            "sign), so chains started apart rarely agree there and R-hat stays large even when "
            "the predictive distributions agree. R-hat f(x) and ESS f(x) diagnose the network "
            "outputs at the test inputs instead, which are identified: use them to judge mixing."
        )
        lines += ["", *[f"- {line}" for line in self.notes + self.messages()]]
        return "\n".join(lines) + "\n"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    if isinstance(value, Path):
        return str(value)
    return value
