r"""Compare NUTS, SG-MCMC (SGHMC, SGLD, pSGLD) and mean-field SVI on one Bayesian MLP and data set.

:func:`run_comparison` is the engine behind ``pyro-sgmcmc compare``; it is usable from Python:

>>> from pyro_sgmcmc.compare import CompareConfig, run_comparison
>>> results = run_comparison(CompareConfig(dataset="sinusoid", out=None))  # doctest: +SKIP
>>> print(results.table())  # doctest: +SKIP

For each method it measures the wall time of inference, the test metrics of the posterior
predictive (RMSE and log-likelihood in the *original* units of the target for regression;
accuracy, negative log-likelihood and expected calibration error for classification) and the
convergence diagnostics of the draws (maximum split R-hat and minimum bulk ESS over every
scalar parameter, ESS per second, divergences). With an output directory it writes one netCDF
``InferenceData`` per method, ``summary.json``, ``summary.md`` and PNG figures.

A method that raises (for instance :class:`~pyro_sgmcmc.SamplerDivergedError`) is recorded with
status ``"failed"`` and the message; the other methods still run and are saved.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS

from . import metrics, plots
from ._validation import check_interval, check_positive, check_positive_int
from .datasets import Dataset, dataset_task, list_datasets, load_dataset
from .diagnostics import convergence_report
from .errors import SamplerDivergedError
from .export import HMCStatsCollector, to_inference_data
from .kernels import PSGLD, SGHMC, SGLD
from .nn import BayesianMLP, GammaPrecision, NormalLikelihood, NormalPrior, ScaleMixturePrior
from .predictive import ClassificationPrediction, RegressionPrediction, posterior_predictive
from .svi import fit_svi

__all__ = [
    "METHODS",
    "CompareConfig",
    "ComparisonResults",
    "MethodResult",
    "run_comparison",
]

#: Inference methods known to :func:`run_comparison`, in their default order.
METHODS = ("nuts", "sghmc", "sgld", "psgld", "svi")
#: Activations of the hidden layers.
ACTIVATIONS = ("tanh", "relu", "sigmoid", "softplus")
#: Weight priors: i.i.d. Normal, Blundell's scale mixture, Neal's per-layer Gamma precision.
PRIORS = ("normal", "scale_mixture", "gamma_precision")
#: Observation noise of regression models: a Gamma-distributed precision (Gibbs-updated by the
#: SG-MCMC kernels), a half-Normal scale, or a fixed scale.
NOISES = ("gamma", "halfnormal", "fixed")

TensorDict = dict[str, torch.Tensor]


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class CompareConfig:
    """Everything one comparison needs; every field is checked when the object is created.

    Parameters
    ----------
    dataset:
        A name from :func:`pyro_sgmcmc.datasets.list_datasets`.
    methods:
        Subset of :data:`METHODS`, run in the given order.
    chains:
        Chains per MCMC method (run one after the other on a machine with 2 cores).
    seed:
        Seed of the data split and of every method (``pyro.set_rng_seed`` before each).
    out:
        Output directory, or ``None`` to write nothing.
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
    sgld_learning_rate, sghmc_learning_rate, psgld_learning_rate:
        Per-datum learning rates: the step size multiplying the gradient of the full-data
        potential is ``learning_rate / N``.
    friction:
        SGHMC's friction :math:`\\alpha \\in (0, 1]`.
    batch_size:
        Minibatch size of the SG-MCMC methods and SVI (capped at ``N``).
    num_steps_per_sample:
        Gradient steps per kept SG-MCMC draw (the thinning).
    svi_steps, svi_learning_rate:
        Adam steps and learning rate of mean-field SVI; SVI keeps ``chains * num_samples``
        independent draws of its guide.
    time_budget:
        Seconds for the whole comparison, or ``None``. A method that would start after the
        budget is spent is skipped (status ``"skipped"``); a method already running is not
        interrupted, so size the draws to the budget (the defaults fit in 5 minutes).
    test_fraction, max_train, max_test:
        Passed to :func:`~pyro_sgmcmc.datasets.load_dataset`.
    data_dir:
        Directory of the Fashion-MNIST files.
    progress:
        Show progress bars.
    figures:
        Write PNG figures.
    """

    dataset: str = "sinusoid"
    methods: tuple[str, ...] = METHODS
    chains: int = 2
    seed: int = 0
    out: Path | None = Path("results")
    hidden: tuple[int, ...] = (10, 10)
    activation: str = "tanh"
    prior: str = "normal"
    prior_scale: float = 1.0
    noise: str = "gamma"
    noise_scale: float = 0.5
    num_samples: int = 200
    warmup: int = 200
    nuts_num_samples: int | None = 100
    nuts_warmup: int | None = 100
    max_tree_depth: int = 5
    sgld_learning_rate: float = 1e-3
    sghmc_learning_rate: float = 1e-3
    psgld_learning_rate: float = 1e-3
    friction: float = 0.1
    batch_size: int = 32
    num_steps_per_sample: int = 10
    svi_steps: int = 1500
    svi_learning_rate: float = 0.01
    time_budget: float | None = None
    test_fraction: float = 0.2
    max_train: int | None = None
    max_test: int | None = None
    data_dir: Path | None = None
    progress: bool = True
    figures: bool = True

    def __post_init__(self) -> None:
        if self.dataset not in list_datasets():
            raise ValueError(
                f"dataset must be one of {', '.join(list_datasets())}; got {self.dataset!r}"
            )
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
        for name in ("chains", "num_samples", "num_steps_per_sample", "svi_steps"):
            check_positive_int(name, getattr(self, name))
        for name in ("warmup",):
            check_positive_int(name, getattr(self, name), minimum=0)
        check_positive_int("seed", self.seed, minimum=0)
        check_positive_int("batch_size", self.batch_size)
        check_interval("max_tree_depth", self.max_tree_depth, 1, 15)
        check_positive_int("max_tree_depth", self.max_tree_depth)
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
        for name in (
            "prior_scale",
            "noise_scale",
            "sgld_learning_rate",
            "sghmc_learning_rate",
            "psgld_learning_rate",
            "svi_learning_rate",
        ):
            check_positive(name, getattr(self, name))
        check_interval("friction", self.friction, 0.0, 1.0, low_open=True)
        if self.time_budget is not None:
            check_positive("time_budget", self.time_budget)
        check_interval("test_fraction", self.test_fraction, 0.0, 1.0, low_open=True, high_open=True)
        if self.max_train is not None:
            check_positive_int("max_train", self.max_train, minimum=2)
        if self.max_test is not None:
            check_positive_int("max_test", self.max_test)
        if self.out is not None:
            object.__setattr__(self, "out", Path(self.out))
        if self.data_dir is not None:
            object.__setattr__(self, "data_dir", Path(self.data_dir))

    @property
    def task(self) -> str:
        """``"regression"`` or ``"classification"``, from the data set."""
        return dataset_task(self.dataset)

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
        ``"ok"``, ``"failed"`` or ``"skipped"``.
    message:
        Why it failed or was skipped (empty when ``"ok"``), or notes such as NUTS's bounds.
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
    status: str = "ok"
    message: str = ""
    wall_time: float = math.nan
    metrics: dict[str, float] = field(default_factory=dict)
    diagnostics: dict[str, float | int | None] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the method produced draws."""
        return self.status == "ok"


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
        """One line per method that has a message (failures, skips, bounds)."""
        return [f"{m.method}: {m.message}" for m in self.methods if m.message]

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


# --------------------------------------------------------------------------- the model


def build_model(config: CompareConfig, data: Dataset) -> BayesianMLP:
    """The :class:`~pyro_sgmcmc.nn.BayesianMLP` of ``config`` for ``data``.

    Regression heads (standardised targets): ``noise="gamma"`` is a latent precision
    :math:`\tau \\sim \\mathrm{Gamma}(2, 2 s^2)` (prior mean of :math:`\\sigma` about ``s`` =
    ``noise_scale``; Gibbs-updated by the SG-MCMC kernels), ``"halfnormal"`` a latent
    :math:`\\sigma \\sim \\mathrm{HalfNormal}(s)`, ``"fixed"`` :math:`\\sigma = s`.
    """
    if data.task == "classification":
        likelihood: Any = "categorical"
    elif config.noise == "gamma":
        likelihood = NormalLikelihood(precision=GammaPrecision(2.0, 2.0 * config.noise_scale**2))
    elif config.noise == "halfnormal":
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


def _mcmc(kernel, config: CompareConfig, num_samples: int, warmup: int, hook=None) -> MCMC:
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
        )


def _run_mcmc(mcmc: MCMC, data: Dataset) -> None:
    mcmc.run(data.x_train, data.y_train)


def _run_nuts(model, data: Dataset, config: CompareConfig) -> _Run:
    samples, warmup = config.nuts_draws()
    kernel = NUTS(model, max_tree_depth=config.max_tree_depth, target_accept_prob=0.8)
    collector = HMCStatsCollector()
    mcmc = _mcmc(kernel, config, samples, warmup, hook=collector)
    _run_mcmc(mcmc, data)
    notes = (
        f"bounded to fit the time budget: max_tree_depth={config.max_tree_depth} "
        f"(<= {2**config.max_tree_depth - 1} leapfrog steps per draw), {samples} draws after "
        f"{warmup} warm-up per chain"
    )
    return _Run(mcmc, hmc_stats=collector, notes=notes)


def _run_sgmcmc(method: str, model, data: Dataset, config: CompareConfig) -> _Run:
    common = {
        "batch_size": min(config.batch_size, data.num_train),
        "num_steps_per_sample": config.num_steps_per_sample,
        "seed": config.seed,
    }
    if method == "sgld":
        kernel = SGLD(model, learning_rate=config.sgld_learning_rate, **common)
    elif method == "sghmc":
        kernel = SGHMC(
            model, learning_rate=config.sghmc_learning_rate, friction=config.friction, **common
        )
    else:
        kernel = PSGLD(model, learning_rate=config.psgld_learning_rate, **common)
    mcmc = _mcmc(kernel, config, config.num_samples, config.warmup)
    _run_mcmc(mcmc, data)
    return _Run(mcmc)


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
    )
    notes = (
        f"mean-field Normal guide, {config.chains} independent fit(s) of {config.svi_steps} "
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
        for name, var in idata.posterior.data_vars.items()
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


def convergence(idata, method: str, wall_time: float) -> dict[str, float | int | None]:
    """Worst split R-hat and bulk ESS over all scalar parameters, ESS/s and divergences."""
    report = convergence_report(idata, method, wall_time=wall_time)
    independent = method == "svi"
    result = {
        "max_rhat": report.max_rhat,
        "min_ess_bulk": None if independent else report.min_ess_bulk,
        "min_ess_tail": None if independent else report.min_ess_tail,
        "ess_per_second": None if independent else report.ess_bulk_per_second,
        "divergences": None if independent else report.divergences,
        "max_rhat_output": None,
        "min_ess_bulk_output": None,
    }
    # Function space: the network outputs at the test inputs are identified (unlike weights).
    if "predictions" in idata.groups() and "output" in idata.predictions.data_vars:
        output = convergence_report(
            idata, method, wall_time=wall_time, group="predictions", var_names=["output"]
        )
        result["max_rhat_output"] = output.max_rhat
        result["min_ess_bulk_output"] = None if independent else output.min_ess_bulk
    return result


# --------------------------------------------------------------------------- the runner

_RUNNERS = {
    "nuts": _run_nuts,
    "sghmc": lambda *a: _run_sgmcmc("sghmc", *a),
    "sgld": lambda *a: _run_sgmcmc("sgld", *a),
    "psgld": lambda *a: _run_sgmcmc("psgld", *a),
    "svi": _run_svi,
}


def run_comparison(
    config: CompareConfig, *, log: Callable[[str], None] | None = None
) -> ComparisonResults:
    """Run every method of ``config`` on its data set and write the outputs.

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
        When ``config.out`` cannot be written (checked before any sampling).
    ValueError, ImportError, FileNotFoundError
        When the data set cannot be loaded; nothing has been sampled then.
    """
    say = log or (lambda _line: None)
    start = time.perf_counter()
    deadline = None if config.time_budget is None else start + config.time_budget
    if config.out is not None:
        check_output_dir(config.out)
    data = load_dataset(
        config.dataset,
        seed=config.seed,
        test_fraction=config.test_fraction,
        max_train=config.max_train,
        max_test=config.max_test,
        data_dir=config.data_dir,
    )
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
    say(
        f"{data!r}; BNN {data.num_features}-{'-'.join(map(str, config.hidden))}-"
        f"{data.output_dim} ({config.activation}, {config.prior} prior)"
    )
    predictions: dict[str, Prediction] = {}
    grid_predictions: dict[str, Prediction] = {}
    for index, method in enumerate(config.methods):
        result = MethodResult(method)
        results.methods.append(result)
        if deadline is not None and time.perf_counter() > deadline:
            result.status = "skipped"
            result.message = f"time budget of {config.time_budget:g} s spent before it started"
            say(f"[{method}] skipped: time budget spent")
            continue
        say(f"[{method}] running ({index + 1}/{len(config.methods)})")
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
            prediction = posterior_predictive(model, samples, data.x_test, data.y_test)
            predictions[method] = prediction
            result.metrics = predictive_metrics(prediction, data)
            if data.x_grid is not None:
                grid_predictions[method] = posterior_predictive(model, samples, data.x_grid)
            result.diagnostics = convergence(idata, method, result.wall_time)
            if config.out is not None:
                path = config.out / f"{method}.nc"
                idata.to_netcdf(str(path))
                result.files.append(str(path))
                if config.figures:
                    result.files += plots.diagnostic_figures(idata, method, config.out)
        except Exception as error:  # any failure of one method is reported, the others go on
            if math.isnan(result.wall_time):
                result.wall_time = time.perf_counter() - began
            result.status = "failed"
            kind = "diverged" if isinstance(error, SamplerDivergedError) else type(error).__name__
            result.message = f"{kind}: {error}".splitlines()[0][:300]
            say(f"[{method}] failed: {result.message}")
            if os.environ.get("PYRO_SGMCMC_DEBUG"):
                traceback.print_exc()
            continue
        say(f"[{method}] done in {result.wall_time:.1f} s")
    results.notes.append(
        f"seed {config.seed}; {config.chains} chain(s); SG-MCMC: {config.num_samples} draws after "
        f"{config.warmup} warm-up per chain, {config.num_steps_per_sample} steps per draw, "
        f"batch size {min(config.batch_size, data.num_train)} of N = {data.num_train}"
    )
    if config.out is not None:
        if config.figures and predictions:
            results.files += plots.predictive_figures(
                data, predictions, grid_predictions, config.out
            )
        results.total_time = time.perf_counter() - start
        results.files += [str(config.out / "summary.json"), str(config.out / "summary.md")]
        (config.out / "summary.md").write_text(results.markdown())
        (config.out / "summary.json").write_text(json.dumps(results.to_dict(), indent=2) + "\n")
    results.total_time = time.perf_counter() - start
    return results
