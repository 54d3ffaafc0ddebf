r"""Compare NUTS, SG-MCMC (SGHMC, SGLD, pSGLD) and mean-field SVI on one Bayesian MLP and data set.

:func:`run_comparison` is the engine behind ``pyro-sgmcmc compare``; it is usable from Python:

>>> from pyro_sgmcmc.compare import CompareConfig, run_comparison
>>> results = run_comparison(CompareConfig(dataset="sinusoid", out=None))  # doctest: +SKIP
>>> print(results.table())  # doctest: +SKIP

The data are a built-in set (:func:`pyro_sgmcmc.datasets.list_datasets`) or your own table
(``CompareConfig(data="table.csv", target="y")``, read by
:func:`pyro_sgmcmc.datasets.load_table`). For each method it measures the wall time of
inference, the test metrics of the posterior predictive (RMSE and log-likelihood in the
*original* units of the target for regression; accuracy, negative log-likelihood and expected
calibration error for classification) and the convergence diagnostics of the draws (maximum
split R-hat and minimum bulk ESS over every scalar parameter, ESS per second, divergences).

With an output directory it writes one netCDF ``InferenceData`` per method, ``summary.json``,
``summary.md`` and PNG figures, and lists them in a manifest (:data:`MANIFEST_NAME`). A later
run into the same directory deletes exactly those files first, so no result of an earlier run
is left beside a new summary; a directory holding other files is refused unless
``overwrite=True`` (see :class:`OutputDirectory`).

A method that raises (for instance :class:`~pyro_sgmcmc.SamplerDivergedError`) is recorded with
status ``"failed"`` and the message; the other methods still run and are saved.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.mcmc.util import initialize_model

from . import _arviz, metrics, plots
from ._validation import check_interval, check_positive, check_positive_int
from .datasets import Dataset, dataset_task, list_datasets, load_dataset, load_table
from .diagnostics import ESS_PER_CHAIN, FUNCTION_RHAT_BOUND, RHAT_BOUND, convergence_report
from .errors import SamplerDivergedError
from .export import HMCStatsCollector, to_inference_data
from .kernels import PSGLD, SGHMC, SGLD
from .nn import BayesianMLP, GammaPrecision, NormalLikelihood, NormalPrior, ScaleMixturePrior
from .predictive import ClassificationPrediction, RegressionPrediction, posterior_predictive
from .svi import fit_svi
from .vectorized import run_chains

__all__ = [
    "MANIFEST_NAME",
    "METHODS",
    "CompareConfig",
    "ComparisonResults",
    "MethodOutcome",
    "MethodResult",
    "OutputDirectory",
    "load_data",
    "run_comparison",
    "run_method",
    "sample_to_file",
    "torch_threads",
]

#: Inference methods known to :func:`run_comparison`, in their default order.
METHODS = ("nuts", "sghmc", "sgld", "psgld", "svi")
#: Activations of the hidden layers.
ACTIVATIONS = ("tanh", "relu", "sigmoid", "softplus")
#: Weight priors: i.i.d. Normal, Blundell's scale mixture, Neal's per-layer Gamma precision.
PRIORS = ("normal", "scale_mixture", "gamma_precision")
#: Observation noise of regression models: a Gamma-distributed precision (Gibbs-updated by the
#: SG-MCMC kernels), a half-Normal scale, or a fixed scale.
NOISES = ("auto", "known", "gamma", "halfnormal", "fixed")
#: A method whose kept draws had a divergent step this often gets a note in the results.
DIVERGENT_SHARE = 0.1
#: Tasks of a data file (``None`` infers the task from the target column).
TASKS = ("regression", "classification")
#: The file that marks a directory as written by :func:`run_comparison` and lists its files.
MANIFEST_NAME = "pyro-sgmcmc-manifest.json"
_MANIFEST_TEMPORARY = f".{MANIFEST_NAME}.tmp"

TensorDict = dict[str, torch.Tensor]


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class CompareConfig:
    """Everything one comparison needs; every field is checked when the object is created.

    Parameters
    ----------
    dataset:
        A name from :func:`pyro_sgmcmc.datasets.list_datasets`; ``None`` means ``"sinusoid"``
        unless ``data`` is given (give one or the other).
    data:
        Your own table instead of a built-in set: a ``.csv``/``.tsv``/``.txt``, ``.npz`` or
        ``.parquet`` file read by :func:`pyro_sgmcmc.datasets.load_table` (every column but
        ``target`` is a numeric feature).
    target:
        The column of ``data`` to predict (required with ``data``).
    task:
        ``"regression"`` or ``"classification"`` for ``data``; ``None`` infers it from the
        target column. For a built-in set it is filled in from the set (and must agree).
    methods:
        Subset of :data:`METHODS`, run in the given order.
    chains:
        Chains per MCMC method (run one after the other on a machine with 2 cores).
    seed:
        Seed of the data split and of every method (``pyro.set_rng_seed`` before each).
    out:
        Output directory, or ``None`` to write nothing. An empty string is refused.
    overwrite:
        Write into ``out`` even when it holds files that no earlier comparison wrote (they are
        left in place, except files named like this command's outputs, which are replaced).
    hidden:
        Hidden layer widths.
    activation:
        One of :data:`ACTIVATIONS`.
    prior:
        One of :data:`PRIORS`.
    prior_scale:
        Scale of the Normal prior (and of the wide component of the scale mixture).
    noise:
        Observation noise of a regression model, one of :data:`NOISES`.
    noise_scale:
        The scale of ``noise="fixed"`` and of the half-Normal prior, in standardised units.
    num_samples, warmup:
        Kept draws and warm-up draws per chain of the SG-MCMC methods.
    nuts_num_samples, nuts_warmup:
        The same for NUTS (``None``: as the SG-MCMC methods).
    max_tree_depth:
        Bound of NUTS's tree depth (at most :math:`2^d - 1` leapfrog steps per draw).
    nuts_target_accept:
        NUTS's target acceptance probability during step-size adaptation, in ``(0, 1)``.
    nuts_init_steps:
        Adam steps from each NUTS chain's random start towards its nearest mode before warm-up
        (see :func:`nuts_starts`); 0 starts at the random point.
    sgld_learning_rate, sghmc_learning_rate, psgld_learning_rate:
        ``None`` (default): the kernels' adaptive warm-up chooses the step size and a diagonal
        preconditioner (see :mod:`pyro_sgmcmc.engine.adaptation`). A number: a per-datum
        learning rate instead (the step size multiplying the gradient of the full-data potential
        is ``learning_rate / N``).
    friction:
        SGHMC's friction :math:`\\alpha \\in (0, 1]`, or ``None`` (the kernel's default).
    batch_size:
        Minibatch size of the SG-MCMC methods and SVI (capped at ``N``).
    num_steps_per_sample:
        Gradient steps per kept SG-MCMC draw (the thinning), or ``None``: chosen by each
        chain's warm-up from its autocorrelation (see :class:`~pyro_sgmcmc.SGLD`).
    target_ess:
        Run the SG-MCMC methods until converged (:func:`~pyro_sgmcmc.run_chains`'s
        ``target_ess``): after ``num_samples`` draws, keep drawing in rounds until the
        verdict is ``converged`` with this total ESS, or ``max_seconds`` are spent; ``None``
        draws ``num_samples`` only.
    max_seconds:
        Sampling seconds per SG-MCMC method for those rounds (``None``: no limit).
    svi_steps, svi_learning_rate:
        Adam steps and learning rate of mean-field SVI; SVI keeps ``chains * num_samples``
        independent draws of its guide.
    time_budget:
        Seconds for the whole comparison, or ``None``. A method that would start after the
        budget is spent is skipped (status ``"skipped"``); a method already running is not
        interrupted, so size the draws to the budget.
    test_fraction, max_train, max_test:
        Passed to :func:`~pyro_sgmcmc.datasets.load_dataset`.
    data_dir:
        Directory of the Fashion-MNIST files.
    distributed:
        ``None`` (default), or run the SG-MCMC methods (only) over the ranks of
        ``torch.distributed``'s process group with :func:`~pyro_sgmcmc.run_chains`: ``"data"``
        splits every minibatch over the ranks (``data_parallel=True``), ``"chains"`` shares the
        chains among them (``distribute_chains=True``); see :mod:`pyro_sgmcmc.engine.distributed`.
    threads:
        Torch intra-op threads while the comparison runs (restored afterwards), or ``None`` to
        leave torch's setting. The default 1 suits the small networks compared here: extra
        threads cost more in synchronisation than they gain, on a busy machine by a factor of
        five and more.
    progress:
        Show progress bars.
    figures:
        Write PNG figures.
    """

    dataset: str | None = None
    data: Path | None = None
    target: str | None = None
    task: str | None = None
    methods: tuple[str, ...] = METHODS
    chains: int = 2
    seed: int = 0
    out: Path | None = Path("results")
    overwrite: bool = False
    hidden: tuple[int, ...] = (10, 10)
    activation: str = "tanh"
    prior: str = "normal"
    prior_scale: float = 1.0
    noise: str = "auto"
    noise_scale: float = 0.5
    num_samples: int = 200
    warmup: int = 200
    nuts_num_samples: int | None = 200
    nuts_warmup: int | None = 100
    max_tree_depth: int = 7
    nuts_target_accept: float = 0.8
    nuts_init_steps: int = 1000
    sgld_learning_rate: float | None = None
    sghmc_learning_rate: float | None = None
    psgld_learning_rate: float | None = None
    friction: float | None = None
    batch_size: int = 32
    num_steps_per_sample: int | None = None
    target_ess: float | None = 400.0
    max_seconds: float | None = 60.0
    svi_steps: int = 2000
    svi_learning_rate: float = 0.03
    time_budget: float | None = None
    test_fraction: float = 0.2
    max_train: int | None = None
    max_test: int | None = None
    data_dir: Path | None = None
    threads: int | None = 1
    distributed: str | None = None
    progress: bool = True
    figures: bool = True

    def __post_init__(self) -> None:
        self._check_data()
        methods = tuple(self.methods)
        if not methods:
            raise ValueError(f"methods must name at least one of {', '.join(METHODS)}")
        unknown = [m for m in methods if m not in METHODS]
        if unknown:
            raise ValueError(
                f"methods: unknown method(s) {', '.join(map(repr, unknown))}; "
                f"valid ones are {', '.join(METHODS)}"
            )
        if len(set(methods)) != len(methods):
            raise ValueError(f"methods must not repeat a method, got {', '.join(methods)}")
        object.__setattr__(self, "methods", methods)
        if self.distributed not in (None, "data", "chains"):
            raise ValueError(
                f"distributed must be None, 'data' or 'chains'; got {self.distributed!r}"
            )
        if self.distributed is not None and set(methods) - {"sgld", "sghmc", "psgld"}:
            raise ValueError(
                "distributed runs the SG-MCMC methods sgld, sghmc and psgld only; methods has "
                f"{', '.join(m for m in methods if m not in ('sgld', 'sghmc', 'psgld'))}"
            )
        for name in ("chains", "num_samples", "svi_steps"):
            check_positive_int(name, getattr(self, name))
        if self.num_steps_per_sample is not None:
            check_positive_int("num_steps_per_sample", self.num_steps_per_sample)
        for name in ("target_ess", "max_seconds"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        for name in ("warmup", "nuts_init_steps"):
            check_positive_int(name, getattr(self, name), minimum=0)
        check_positive_int("seed", self.seed, minimum=0)
        check_positive_int("batch_size", self.batch_size)
        check_interval("max_tree_depth", self.max_tree_depth, 1, 15)
        check_positive_int("max_tree_depth", self.max_tree_depth)
        check_interval(
            "nuts_target_accept", self.nuts_target_accept, 0.0, 1.0, low_open=True, high_open=True
        )
        if self.threads is not None:
            check_positive_int("threads", self.threads)
        if self.nuts_num_samples is not None:
            check_positive_int("nuts_num_samples", self.nuts_num_samples)
        if self.nuts_warmup is not None:
            check_positive_int("nuts_warmup", self.nuts_warmup, minimum=0)
        hidden = tuple(self.hidden)
        for width in hidden:
            check_positive_int("hidden", width)
        object.__setattr__(self, "hidden", hidden)
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {', '.join(ACTIVATIONS)}; got {self.activation!r}"
            )
        if self.prior not in PRIORS:
            raise ValueError(f"prior must be one of {', '.join(PRIORS)}; got {self.prior!r}")
        if self.noise not in NOISES:
            raise ValueError(f"noise must be one of {', '.join(NOISES)}; got {self.noise!r}")
        for name in ("prior_scale", "noise_scale", "svi_learning_rate"):
            check_positive(name, getattr(self, name))
        for name in ("sgld_learning_rate", "sghmc_learning_rate", "psgld_learning_rate"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if self.friction is not None:
            check_interval("friction", self.friction, 0.0, 1.0, low_open=True)
        if self.time_budget is not None:
            check_positive("time_budget", self.time_budget)
        check_interval("test_fraction", self.test_fraction, 0.0, 1.0, low_open=True, high_open=True)
        if self.max_train is not None:
            check_positive_int("max_train", self.max_train, minimum=2)
        if self.max_test is not None:
            check_positive_int("max_test", self.max_test)
        if self.out is not None:
            if not isinstance(self.out, str | os.PathLike):
                raise TypeError(f"out must be a path or None, got {type(self.out).__name__}")
            if not os.fspath(self.out).strip():
                raise ValueError(
                    "out must name a directory, got an empty string; use out=None "
                    "(--no-output) to write nothing"
                )
            object.__setattr__(self, "out", Path(self.out))
        if self.data_dir is not None:
            object.__setattr__(self, "data_dir", Path(self.data_dir))

    def _check_data(self) -> None:
        if self.task is not None and self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)} or None; got {self.task!r}")
        if self.data is None:
            if self.target is not None:
                raise ValueError("target names a column of data: give data (--data FILE) too")
            dataset = "sinusoid" if self.dataset is None else self.dataset
            if dataset not in list_datasets():
                raise ValueError(
                    f"dataset must be one of {', '.join(list_datasets())}; got {dataset!r}"
                )
            if self.task is not None and self.task != dataset_task(dataset):
                raise ValueError(
                    f"task: the data set {dataset!r} is a {dataset_task(dataset)} set, got "
                    f"task={self.task!r} (task chooses the task of a data file)"
                )
            object.__setattr__(self, "dataset", dataset)
            object.__setattr__(self, "task", dataset_task(dataset))
            return
        if self.dataset is not None:
            raise ValueError(
                f"give either dataset (--dataset {self.dataset}) or data (--data {self.data}), "
                "not both"
            )
        if not isinstance(self.data, str | os.PathLike) or not os.fspath(self.data).strip():
            raise ValueError(f"data must be the path of a table, got {self.data!r}")
        if not isinstance(self.target, str) or not self.target:
            raise ValueError(
                f"target must name the column of {str(self.data)!r} to predict (--target COLUMN), "
                f"got {self.target!r}"
            )
        object.__setattr__(self, "data", Path(self.data))

    def nuts_draws(self) -> tuple[int, int]:
        """NUTS's (kept draws, warm-up draws) per chain."""
        samples = self.num_samples if self.nuts_num_samples is None else self.nuts_num_samples
        warmup = self.warmup if self.nuts_warmup is None else self.nuts_warmup
        return samples, warmup

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the settings."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = (
                str(value)
                if isinstance(value, Path)
                else list(value)
                if isinstance(value, tuple)
                else value
            )
        return out


# --------------------------------------------------------------------------- results


@dataclass
class MethodResult:
    """The outcome of one method.

    Attributes
    ----------
    method:
        Name from :data:`METHODS`.
    status:
        The verdict on the draws, ``"converged"`` or ``"not converged"``
        (:mod:`pyro_sgmcmc.diagnostics`; ``"fitted"`` for SVI, whose draws are independent
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
            ("ess_per_second", "ESS/s", ".2f"),
            ("max_rhat_output", "R-hat f(x)", ".3f"),
            ("min_ess_bulk_output", "ESS f(x)", ".1f"),
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
                else:
                    row.append(format(value, fmt))
            rows.append(row)
        return rows

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
            "parameters; ESS/s divides the minimum bulk ESS by the wall time. In weight space a "
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


# --------------------------------------------------------------------------- output directory


def check_output_dir(out: Path) -> None:
    """Create ``out`` if needed and check that a file can be written there.

    Raises
    ------
    OSError
        With a message naming the directory, before any sampling starts.
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as error:
        raise OSError(f"output directory {str(out)!r} cannot be written: {error}") from error


def output_names(methods: tuple[str, ...] = METHODS) -> set[str]:
    """Every file name a comparison of ``methods`` can write (besides the manifest)."""
    names = {"summary.json", "summary.md"}
    names |= {"reliability_diagram.png", "predictive_bands.png", "predicted_vs_observed.png"}
    for method in methods:
        names |= {f"{method}.nc", *plots.diagnostic_figure_names(method)}
    return names


def _read_manifest(path: Path) -> list[str] | None:
    """The file names listed by the manifest in ``path``, or ``None`` if it has no valid one."""
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if manifest.get("tool") != "pyro-sgmcmc" or not isinstance(files, list):
        return None
    # only plain names inside the directory: a manifest never reaches outside it
    return [name for name in files if isinstance(name, str) and name == Path(name).name]


def _written_before_manifests(path: Path) -> bool:
    """Whether ``path`` holds only a comparison's outputs from before manifests were written.

    That is: every file is named like an output of :func:`run_comparison` and ``summary.json``
    is a summary it wrote (it names the data set, the settings and the methods).
    """
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    if "summary.json" not in names or not names <= output_names():
        return False
    try:
        summary = json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and {"dataset", "config", "methods"} <= set(summary)


class OutputDirectory:
    """A results directory that lists every file written into it in a manifest.

    :meth:`prepare` checks the directory before any sampling starts: a missing or empty directory
    is created and claimed; a directory holding a manifest (:data:`MANIFEST_NAME`) from an
    earlier run is reused after the files that manifest lists are deleted, so no result of that
    run survives beside the new ones (a directory of outputs written before manifests existed,
    with its ``summary.json``, is treated the same); any other non-empty directory is refused unless
    ``overwrite`` is true (then the files named like this command's outputs are deleted and the
    others left in place). :meth:`claim` adds a name to the manifest *before* the file is
    written, so an interrupted run still leaves every file it wrote listed.

    Attributes
    ----------
    path:
        The directory.
    files:
        Names written (claimed) so far, in order.
    kept:
        Names of files that were there before and are left in place (only with ``overwrite``).
    """

    def __init__(self, path: Path, files: list[str], kept: list[str]) -> None:
        self.path = Path(path)
        self.files = files
        self.kept = kept

    @classmethod
    def prepare(cls, path: Path, *, overwrite: bool = False) -> OutputDirectory:
        """Check, clean and claim ``path``; see the class description.

        Raises
        ------
        FileExistsError
            For a non-empty directory without a manifest, or with files its manifest does not
            list, when ``overwrite`` is false; the message lists some of those files.
        OSError
            When ``path`` is a file or cannot be written.
        """
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(f"output directory {str(path)!r} exists and is a file")
        present = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        listed = _read_manifest(path) if MANIFEST_NAME in present else None
        if listed is None and MANIFEST_NAME not in present and _written_before_manifests(path):
            listed = present  # results of a version that wrote no manifest yet
        internal = {MANIFEST_NAME, _MANIFEST_TEMPORARY}
        ours = internal | set(listed) if listed is not None else {_MANIFEST_TEMPORARY}
        foreign = [name for name in present if name not in ours]
        if foreign and not overwrite:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            if listed is not None:
                why = f"its manifest {MANIFEST_NAME} does not list {shown}"
            elif MANIFEST_NAME in present:
                why = f"its {MANIFEST_NAME} is not a valid manifest"
            else:
                why = f"it holds {shown} and no {MANIFEST_NAME}"
            raise FileExistsError(
                f"output directory {str(path)!r} is not empty and was not written by pyro-sgmcmc "
                f"({why}); choose another directory or pass --overwrite (overwrite=True)"
            )
        check_output_dir(path)
        replaced = set(listed or ()) | (output_names() & set(foreign))
        for name in sorted(replaced):
            target = path / name
            if target.is_file() or target.is_symlink():
                target.unlink()
        kept = [name for name in foreign if name not in replaced and name not in internal]
        directory = cls(path, [], kept)
        directory._write_manifest()
        return directory

    def claim(self, name: str) -> Path:
        """Record ``name`` in the manifest and return its path; call it before writing."""
        if name != Path(name).name or name == MANIFEST_NAME:
            raise ValueError(
                f"name must be a plain file name other than the manifest, got {name!r}"
            )
        if name not in self.files:
            self.files.append(name)
            self._write_manifest()
        return self.path / name

    def _write_manifest(self) -> None:
        manifest = {
            "tool": "pyro-sgmcmc",
            "command": "compare",
            "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "files": self.files,
        }
        temporary = self.path / _MANIFEST_TEMPORARY
        temporary.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(temporary, self.path / MANIFEST_NAME)


# --------------------------------------------------------------------------- the model


def build_model(config: CompareConfig, data: Dataset) -> BayesianMLP:
    """The :class:`~pyro_sgmcmc.nn.BayesianMLP` of ``config`` for ``data``.

    Regression heads (standardised targets): ``noise="known"`` is the data set's own noise level
    when it declares one (``metadata["noise"]``, in the target's units: the toy sinusoid's
    :math:`\\sigma = 1`), as in Blundell et al.'s regression example; ``"auto"`` (default) is
    ``"known"`` when the data set declares its noise and ``"gamma"`` otherwise;
    ``noise="gamma"`` is a latent precision
    :math:`\\tau \\sim \\mathrm{Gamma}(2, 2 s^2)` (prior mean of :math:`\\sigma` about ``s`` =
    ``noise_scale``; Gibbs-updated by the SG-MCMC kernels), ``"halfnormal"`` a latent
    :math:`\\sigma \\sim \\mathrm{HalfNormal}(s)`, ``"fixed"`` :math:`\\sigma = s`.
    """
    noise = config.noise
    if noise == "auto":
        noise = "known" if "noise" in data.metadata else "gamma"
    if data.task == "classification":
        likelihood: Any = "categorical"
    elif noise == "known":
        if "noise" not in data.metadata:
            raise ValueError(
                f"noise='known' needs a data set that declares its noise level; "
                f"{data.name!r} does not: use noise='gamma', 'halfnormal' or 'fixed'"
            )
        likelihood = NormalLikelihood(scale=float(data.metadata["noise"]) / data.y_scale)
    elif noise == "gamma":
        likelihood = NormalLikelihood(precision=GammaPrecision(2.0, 2.0 * config.noise_scale**2))
    elif noise == "halfnormal":
        likelihood = NormalLikelihood(scale=dist.HalfNormal(config.noise_scale))
    else:
        likelihood = NormalLikelihood(scale=config.noise_scale)
    if config.prior == "normal":
        prior: Any = NormalPrior(config.prior_scale)
    elif config.prior == "scale_mixture":
        prior = ScaleMixturePrior(0.5, config.prior_scale, config.prior_scale * math.exp(-6))
    else:
        prior = GammaPrecision(1.0, 1.0)
    return BayesianMLP(
        data.num_features,
        list(config.hidden),
        data.output_dim,
        activation=config.activation,
        likelihood=likelihood,
        prior=prior,
    )


# --------------------------------------------------------------------------- methods


@dataclass
class _Run:
    """What a method returns: its ``InferenceData`` source and notes for the table."""

    source: Any
    hmc_stats: HMCStatsCollector | None = None
    notes: str = ""
    num_draws: int = 0


def _mcmc(
    kernel, config: CompareConfig, num_samples: int, warmup: int, hook=None, **options: Any
) -> MCMC:
    with warnings.catch_warnings():
        # On few cores Pyro runs the chains one after the other and says so.
        warnings.filterwarnings("ignore", message="num_chains=.*sequentially")
        return MCMC(
            kernel,
            num_samples=num_samples,
            warmup_steps=warmup,
            num_chains=config.chains,
            disable_progbar=not config.progress,
            hook_fn=hook,
            **options,
        )


def _run_mcmc(mcmc: MCMC, data: Dataset) -> None:
    mcmc.run(data.x_train, data.y_train)


def nuts_potential(
    model: BayesianMLP, data: Dataset
) -> tuple[Callable[[TensorDict], torch.Tensor], dict[str, Any], str]:
    r"""The full-data potential of ``model`` in unconstrained space, for ``NUTS(potential_fn=...)``.

    .. math::

        U(z) = -\log p(\theta, y \mid x) - \log \left|\det \partial\theta/\partial z\right|,
        \qquad \theta = T^{-1}(z),

    with Pyro's transforms ``T`` of each site's support. The density comes from
    :meth:`BayesianMLP.log_joint` (plain torch; for the small networks of this module it halves
    the cost of a leapfrog step against Pyro's trace) when it agrees with the log density of the
    model's Pyro trace at two test points, and from the trace otherwise: NUTS always samples the
    model's own posterior. NUTS itself is Pyro's, unchanged.

    Returns
    -------
    (potential, transforms, source)
        ``potential`` maps a dict of unconstrained site values to :math:`U(z)`; ``transforms``
        maps each site to the transform from constrained to unconstrained values; ``source`` is
        ``"log_joint"`` or ``"trace"``.
    """
    x, y = data.x_train, data.y_train
    start, trace_potential, transforms, _ = initialize_model(model, model_args=(x, y))

    def potential(unconstrained: TensorDict) -> torch.Tensor:
        params = {name: transforms[name].inv(value) for name, value in unconstrained.items()}
        log_det = sum(
            transforms[name].inv.log_abs_det_jacobian(value, params[name]).sum()
            for name, value in unconstrained.items()
        )
        return -(model.log_joint(params, None, x, y) + log_det)

    generator = torch.Generator().manual_seed(0)
    shifted = {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in start.items()}
    with torch.no_grad():
        for point in (start, shifted):
            ours, theirs = float(potential(point)), float(trace_potential(point))
            # float32 sums of a few thousand terms: agree to ~1e-5 relative when the same
            if not abs(ours - theirs) <= 1e-4 * max(1.0, abs(theirs)) + 1e-2:
                return trace_potential, transforms, "trace"
    return potential, transforms, "log_joint"


def nuts_starts(
    model: BayesianMLP,
    data: Dataset,
    potential: Callable[[TensorDict], torch.Tensor],
    num_chains: int,
    num_steps: int,
) -> TensorDict:
    """Independent starting points for ``num_chains`` NUTS chains, in unconstrained space.

    Each chain starts from its own draw of Pyro's ``init_to_uniform`` (uniform on
    :math:`[-2, 2]` in unconstrained space) and descends ``num_steps`` Adam steps (learning rate
    0.01) on ``potential`` towards the mode nearest to it. The chains thus start in different
    modes, as over-dispersed as before, but warm-up adapts the step size and mass matrix instead
    of spending its draws on the descent.

    Returns
    -------
    dict
        One tensor per site with a leading chain dimension.
    """
    starts: dict[str, list[torch.Tensor]] = {}
    for _ in range(num_chains):
        start, _, _, _ = initialize_model(model, model_args=(data.x_train, data.y_train))
        point = {name: value.detach().clone().requires_grad_(True) for name, value in start.items()}
        if num_steps:
            optimiser = torch.optim.Adam(list(point.values()), lr=0.01)
            for _ in range(num_steps):
                optimiser.zero_grad()
                potential(point).backward()
                optimiser.step()
        for name, value in point.items():
            starts.setdefault(name, []).append(value.detach())
    return {name: torch.stack(values) for name, values in starts.items()}


_POTENTIAL_SOURCES = {"log_joint": "BayesianMLP.log_joint", "trace": "the Pyro trace"}


def _run_nuts(model, data: Dataset, config: CompareConfig) -> _Run:
    samples, warmup = config.nuts_draws()
    potential, transforms, source = nuts_potential(model, data)
    starts = nuts_starts(model, data, potential, config.chains, config.nuts_init_steps)
    kernel = NUTS(
        potential_fn=potential,
        transforms=transforms,
        max_tree_depth=config.max_tree_depth,
        target_accept_prob=config.nuts_target_accept,
    )
    collector = HMCStatsCollector()
    mcmc = _mcmc(
        kernel,
        config,
        samples,
        warmup,
        hook=collector,
        initial_params=starts if config.chains > 1 else {k: v[0] for k, v in starts.items()},
        transforms=transforms,
    )
    mcmc.run()
    notes = (
        f"Pyro NUTS, max_tree_depth={config.max_tree_depth} (<= "
        f"{2**config.max_tree_depth - 1} leapfrog steps per draw), {samples} draws after {warmup} "
        f"warm-up per chain, each chain started {config.nuts_init_steps} Adam steps from its own "
        f"random point; potential from {_POTENTIAL_SOURCES[source]}"
    )
    return _Run(mcmc, hmc_stats=collector, notes=notes)


def _run_sgmcmc(method: str, model, data: Dataset, config: CompareConfig) -> _Run:
    common = {
        "batch_size": min(config.batch_size, data.num_train),
        "num_steps_per_sample": config.num_steps_per_sample,
        "seed": config.seed,
        "data_parallel": config.distributed == "data",
    }
    if method == "sgld":
        kernel = SGLD(model, learning_rate=config.sgld_learning_rate, **common)
    elif method == "sghmc":
        kernel = SGHMC(
            model, learning_rate=config.sghmc_learning_rate, friction=config.friction, **common
        )
    else:
        kernel = PSGLD(model, learning_rate=config.psgld_learning_rate, **common)
    # with no learning rate the kernels adapt their step size and thinning during warm-up;
    # the chains run stacked, and go on in rounds until converged (target_ess)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="run_chains: .* not converged")
        result = run_chains(
            kernel, data.x_train, data.y_train, num_chains=config.chains,
            num_samples=config.num_samples, warmup_steps=config.warmup,
            distribute_chains=config.distributed == "chains", target_ess=config.target_ess,
            max_seconds=config.max_seconds if config.target_ess is not None else None,
        )  # fmt: skip
    thinning = [report["num_steps_per_sample"] for report in result.chain_reports]
    notes = f"{result.num_draws} draws per chain, {thinning} gradient steps per draw"
    return _Run(result, notes=notes)


def _run_svi(model, data: Dataset, config: CompareConfig) -> _Run:
    result = fit_svi(
        model,
        data.x_train,
        data.y_train,
        num_steps=config.svi_steps,
        batch_size=min(config.batch_size, data.num_train),
        learning_rate=config.svi_learning_rate,
        num_fits=config.chains,
        seed=config.seed,
        progress_bar=config.progress,
        estimator="local_reparameterization",
        num_threads=1,
    )
    notes = (
        f"mean-field Normal guide (local reparameterisation), {config.chains} independent "
        f"fit(s) of {config.svi_steps} "
        f"Adam steps, {config.num_samples} guide draws each; R-hat compares the fits, ESS "
        "of independent draws is not shown"
    )
    return _Run(result, notes=notes, num_draws=config.num_samples)


# --------------------------------------------------------------------------- prediction and metrics

Prediction = RegressionPrediction | ClassificationPrediction


def posterior_samples(idata: Any) -> TensorDict:
    """The posterior draws of ``idata`` as torch tensors of shape ``(chain, draw, ...)``."""
    dtype = torch.get_default_dtype()
    return {
        str(name): torch.as_tensor(np.asarray(var.values), dtype=dtype)
        for name, var in _arviz.get_group(idata, "posterior").data_vars.items()
    }


def predictive_metrics(prediction: Prediction, data: Dataset) -> dict[str, float]:
    """Test metrics of a posterior predictive at ``data.x_test``.

    Regression: ``rmse`` and ``log_likelihood`` (mean log predictive density per test point) in
    the original units of the target, and ``rmse_standardised``. Classification: ``accuracy``,
    ``nll`` (mean negative log predictive probability) and ``ece`` (15 bins).
    """
    if isinstance(prediction, RegressionPrediction):
        error = metrics.rmse(prediction.mean.reshape(-1), data.y_test)
        # p(y) = p(z) / y_scale for y = y_mean + y_scale * z
        ll = metrics.predictive_log_likelihood(prediction.log_predictive_density)
        return {
            "rmse": error * data.y_scale,
            "log_likelihood": ll - math.log(data.y_scale),
            "rmse_standardised": error,
        }
    return {
        "accuracy": metrics.accuracy(prediction.probs, data.y_test),
        "nll": metrics.negative_log_likelihood(prediction.probs, data.y_test),
        "ece": metrics.expected_calibration_error(prediction.probs, data.y_test),
    }


# --------------------------------------------------------------------------- diagnostics


def convergence(idata, method: str, wall_time: float) -> dict[str, Any]:
    """Worst split R-hat and bulk ESS over all scalar parameters, ESS/s and divergences, the
    same for a network's outputs at the test inputs, and the verdict (``"verdict"``: on the
    outputs for a network, else on the parameters)."""
    report = convergence_report(idata, method, wall_time=wall_time, function_space=False)
    independent = method == "svi"
    result = {
        "max_rhat": report.max_rhat,
        "min_ess_bulk": None if independent else report.min_ess_bulk,
        "min_ess_tail": None if independent else report.min_ess_tail,
        "ess_per_second": None if independent else report.ess_bulk_per_second,
        "divergences": None if independent else report.divergences,
        "max_rhat_output": None,
        "min_ess_bulk_output": None,
        "verdict": report.verdict,
    }
    # Function space: the network outputs at the test inputs are identified (unlike weights).
    if _arviz.has_group(idata, "predictions") and "output" in _arviz.get_group(
        idata, "predictions"
    ):
        output = convergence_report(
            idata, method, wall_time=wall_time, group="predictions", var_names=["output"],
            function_space=True,
        )  # fmt: skip
        result["max_rhat_output"] = output.max_rhat
        result["min_ess_bulk_output"] = None if independent else output.min_ess_bulk
        if _arviz.get_group(idata, "posterior").attrs.get("function_space"):
            result["verdict"] = output.verdict
    return result


def _divergence_note(idata, method: str) -> str:
    """What to say when at least :data:`DIVERGENT_SHARE` of the kept draws had a divergent step
    (empty otherwise): the table's numbers for such a run come from chains that were put back
    again and again, e.g. never left their starting points."""
    has_stats = _arviz.has_group(idata, "sample_stats")
    stats = _arviz.get_group(idata, "sample_stats") if has_stats else None
    if stats is None or "diverging" not in stats.data_vars:
        return ""
    share = float(stats["diverging"].values.mean())
    if share < DIVERGENT_SHARE:
        return ""
    what = "every kept draw" if share == 1.0 else f"{share:.0%} of the kept draws"
    if method == "nuts":
        return f"{what} of NUTS diverged: its numbers are not to be trusted"
    return (
        f"{what} had a divergent step (a diverged step is undone, so the chains barely moved): "
        f"give a smaller --{method}-lr, or leave it unset for the adaptive warm-up"
    )


# --------------------------------------------------------------------------- the runner

_RUNNERS = {
    "nuts": _run_nuts,
    "sghmc": lambda *a: _run_sgmcmc("sghmc", *a),
    "sgld": lambda *a: _run_sgmcmc("sgld", *a),
    "psgld": lambda *a: _run_sgmcmc("psgld", *a),
    "svi": _run_svi,
}


def load_data(config: CompareConfig) -> Dataset:
    """The data of ``config``: its built-in set, or its data file read by ``load_table``.

    Raises
    ------
    ValueError, ImportError, FileNotFoundError
        When the data cannot be loaded (the message says why).
    """
    if config.data is not None:
        return load_table(
            config.data,
            config.target,
            task=config.task,
            seed=config.seed,
            test_fraction=config.test_fraction,
            max_train=config.max_train,
            max_test=config.max_test,
        )
    return load_dataset(
        config.dataset,
        seed=config.seed,
        test_fraction=config.test_fraction,
        max_train=config.max_train,
        max_test=config.max_test,
        data_dir=config.data_dir,
    )


@dataclass
class MethodOutcome:
    """What :func:`run_method` produced: the table row and, on success, the draws' products.

    Attributes
    ----------
    result:
        The method's row (status, wall time, metrics, diagnostics).
    idata:
        The exported ``InferenceData`` (``None`` if the method failed).
    prediction, grid_prediction:
        The posterior predictive at the test inputs and on ``data.x_grid`` (``None`` where it
        does not apply or the method failed).
    data:
        The data set the method was fitted on.
    """

    result: MethodResult
    data: Dataset
    idata: Any = None
    prediction: Prediction | None = None
    grid_prediction: Prediction | None = None


def run_method(
    config: CompareConfig,
    data: Dataset,
    method: str,
    *,
    log: Callable[[str], None] | None = None,
) -> MethodOutcome:
    """Fit one method of :data:`METHODS` on ``data``, export, predict and diagnose it.

    A failure of the method (it diverges, or raises) is caught and recorded in the result's
    ``status`` and ``message``; set ``PYRO_SGMCMC_DEBUG=1`` to print its traceback.

    Parameters
    ----------
    config:
        The settings (model, sampler settings, seed; ``config.methods`` is not consulted).
    data:
        From :func:`load_data`.
    method:
        One of :data:`METHODS`.
    log:
        Called with one line of text at each phase.

    Returns
    -------
    MethodOutcome
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    say = log or (lambda _line: None)
    result = MethodResult(method)
    outcome = MethodOutcome(result, data)
    pyro.clear_param_store()
    pyro.set_rng_seed(config.seed)
    model = build_model(config, data)
    began = time.perf_counter()
    try:
        run = _RUNNERS[method](model, data, config)
        result.wall_time = time.perf_counter() - began
        result.message = run.notes
        say(f"[{method}] exporting and predicting")
        idata = to_inference_data(
            run.source,
            model,
            data.x_train,
            data.y_train,
            test=(data.x_test, data.y_test),
            num_draws=max(run.num_draws, 1),
            hmc_stats=run.hmc_stats,
            wall_time=result.wall_time,
            seed=config.seed,
        )
        idata.posterior.attrs["method"] = method
        samples = posterior_samples(idata)
        outcome.prediction = posterior_predictive(model, samples, data.x_test, data.y_test)
        result.metrics = predictive_metrics(outcome.prediction, data)
        if data.x_grid is not None:
            outcome.grid_prediction = posterior_predictive(model, samples, data.x_grid)
        result.diagnostics = convergence(idata, method, result.wall_time)
        verdict = result.diagnostics.pop("verdict")
        if method != "svi":
            result.status = "converged" if verdict.converged else "not converged"
        notes = (
            result.message,
            "" if verdict.converged or method == "svi" else str(verdict),
            _divergence_note(idata, method),
        )
        result.message = "; ".join(note for note in notes if note)
        outcome.idata = idata
    except Exception as error:  # any failure of one method is reported, the others go on
        if math.isnan(result.wall_time):
            result.wall_time = time.perf_counter() - began
        result.status = "failed"
        kind = "diverged" if isinstance(error, SamplerDivergedError) else type(error).__name__
        result.message = f"{kind}: {error}".splitlines()[0][:300]
        say(f"[{method}] failed: {result.message}")
        if os.environ.get("PYRO_SGMCMC_DEBUG"):
            traceback.print_exc()
        return MethodOutcome(result, data)
    say(f"[{method}] done in {result.wall_time:.1f} s")
    return outcome


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the body with ``threads`` torch intra-op threads (``None``: unchanged), then restore."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def run_comparison(
    config: CompareConfig, *, log: Callable[[str], None] | None = None
) -> ComparisonResults:
    """Run every method of ``config`` on its data and write the outputs.

    Parameters
    ----------
    config:
        The settings (checked when the :class:`CompareConfig` was created).
    log:
        Called with one line of text at each phase (default: silent).

    Returns
    -------
    ComparisonResults

    Raises
    ------
    OSError
        When ``config.out`` cannot be written, or holds files no comparison wrote and
        ``config.overwrite`` is false (:class:`FileExistsError`); checked before any sampling.
    ValueError, ImportError, FileNotFoundError
        When the data cannot be loaded; nothing has been sampled then.
    """
    say = log or (lambda _line: None)
    start = time.perf_counter()
    deadline = None if config.time_budget is None else start + config.time_budget
    data = load_data(config)
    out = None
    if config.out is not None:
        out = OutputDirectory.prepare(config.out, overwrite=config.overwrite)
        if out.kept:
            shown = ", ".join(out.kept[:5]) + (", ..." if len(out.kept) > 5 else "")
            say(f"--overwrite: left in place files pyro-sgmcmc did not write: {shown}")
    if config.batch_size > data.num_train:
        say(f"batch size {config.batch_size} > N = {data.num_train}: using full batches")
    results = ComparisonResults(
        config=config,
        dataset=data.name,
        task=data.task,
        num_train=data.num_train,
        num_test=data.num_test,
        methods=[],
    )
    source = data.metadata.get("task_source")
    say(
        f"{data!r}"
        + (f" ({source})" if source else "")
        + f"; BNN {data.num_features}-{'-'.join(map(str, config.hidden))}-"
        f"{data.output_dim} ({config.activation}, {config.prior} prior)"
    )
    predictions: dict[str, Prediction] = {}
    grid_predictions: dict[str, Prediction] = {}
    with torch_threads(config.threads):
        for index, method in enumerate(config.methods):
            if deadline is not None and time.perf_counter() > deadline:
                result = MethodResult(method, status="skipped")
                result.message = f"time budget of {config.time_budget:g} s spent before it started"
                results.methods.append(result)
                say(f"[{method}] skipped: time budget spent")
                continue
            say(f"[{method}] running ({index + 1}/{len(config.methods)})")
            outcome = run_method(config, data, method, log=say)
            results.methods.append(outcome.result)
            if outcome.idata is None:
                continue
            predictions[method] = outcome.prediction
            if outcome.grid_prediction is not None:
                grid_predictions[method] = outcome.grid_prediction
            if out is not None:
                _write_method(outcome, out, config.figures)
        thinning = config.num_steps_per_sample or "the warm-up's chosen"
        rounds = (
            f", then rounds until converged (ESS {config.target_ess:g}, at most "
            f"{config.max_seconds:g} s)"
            if config.target_ess is not None and config.max_seconds is not None
            else ""
        )
        results.notes.append(
            f"seed {config.seed}; {config.chains} chain(s); SG-MCMC: {config.num_samples} draws "
            f"after {config.warmup} warm-up per chain{rounds}, {thinning} steps per draw, batch "
            f"size {min(config.batch_size, data.num_train)} of N = {data.num_train}"
        )
        if out is not None:
            if config.figures and predictions:
                name = plots.predictive_figure_name(data, grid=bool(grid_predictions))
                out.claim(name)
                results.files += plots.predictive_figures(
                    data, predictions, grid_predictions, out.path
                )
            summary_json, summary_md = out.claim("summary.json"), out.claim("summary.md")
            results.files += [str(summary_json), str(summary_md)]
            results.total_time = time.perf_counter() - start
            summary_md.write_text(results.markdown())
            summary_json.write_text(json.dumps(results.to_dict(), indent=2) + "\n")
    results.total_time = time.perf_counter() - start
    return results


def _write_method(outcome: MethodOutcome, out: OutputDirectory, figures: bool) -> None:
    """Write a method's netCDF file (and figures) into ``out``, recording them first."""
    result = outcome.result
    path = out.claim(f"{result.method}.nc")
    _arviz.to_netcdf(outcome.idata, path)
    result.files.append(str(path))
    if figures:
        for name in plots.diagnostic_figure_names(result.method):
            out.claim(name)
        result.files += plots.diagnostic_figures(outcome.idata, result.method, out.path)


def sample_to_file(
    config: CompareConfig,
    method: str,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    log: Callable[[str], None] | None = None,
) -> MethodOutcome:
    """Fit one method on the data of ``config`` and write its ``InferenceData`` to ``path``.

    The engine of ``pyro-sgmcmc sample``: the same model, settings, export and diagnostics as
    one row of :func:`run_comparison`, written as one netCDF file.

    Parameters
    ----------
    config:
        The settings; ``config.out`` and ``config.methods`` are not used.
    method:
        One of :data:`METHODS`.
    path:
        The netCDF file to write (suffix ``.nc``).
    overwrite:
        Replace an existing file (otherwise it is refused before anything runs).
    log:
        Called with one line of text at each phase.

    Returns
    -------
    MethodOutcome
        With the written path in ``result.files`` when the method succeeded.

    Raises
    ------
    FileExistsError
        When ``path`` exists and ``overwrite`` is false.
    ValueError, ImportError, FileNotFoundError, OSError
        For an unusable ``path``, method or data; nothing has been sampled then.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if not os.fspath(path).strip():
        raise ValueError("output must name a netCDF file (FILE.nc), got an empty string")
    path = Path(path)
    if path.suffix != ".nc":
        raise ValueError(f"output must be a netCDF file ending in .nc, got {str(path)!r}")
    if path.is_dir():
        raise IsADirectoryError(f"output {str(path)!r} is a directory; name a file FILE.nc")
    if path.exists() and not overwrite:
        raise FileExistsError(
            f"output {str(path)!r} exists; choose another file or pass --overwrite (overwrite=True)"
        )
    check_output_dir(path.parent if str(path.parent) else Path("."))
    data = load_data(config)
    with torch_threads(config.threads):
        outcome = run_method(config, data, method, log=log)
    if outcome.idata is not None:
        temporary = path.with_name(f".{path.name}.tmp")
        _arviz.to_netcdf(outcome.idata, temporary)
        os.replace(temporary, path)
        outcome.result.files.append(str(path))
    return outcome
