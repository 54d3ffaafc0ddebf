r"""Compare NUTS, SG-MCMC (SGHMC, SGLD, pSGLD) and mean-field SVI on one Bayesian MLP and data set.

:func:`run_comparison` is the engine behind ``pyro-sgmcmc compare``; it is usable from Python:

>>> from pyro_sgmcmc.cli.compare import CompareConfig, run_comparison
>>> results = run_comparison(CompareConfig(dataset="sinusoid", out=None))  # doctest: +SKIP
>>> print(results.table())  # doctest: +SKIP

The data are a built-in set (:func:`pyro_sgmcmc.data.datasets.list_datasets`) or your own table
(``CompareConfig(data="table.csv", target="y")``, read by
:func:`pyro_sgmcmc.data.datasets.load_table`). For each method it measures the wall time of
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

This module runs the comparison and writes its files; the parts live beside it, one job each,
and their names are importable from here: the settings and their checks
(:mod:`.compare_config`), the model and each method's inference (:mod:`.compare_fit`), one
method from fit to table row (:mod:`.compare_method`), running the methods in turn or several
at once (:mod:`.compare_jobs`), the results and their table, JSON and
Markdown (:mod:`.compare_results`), and the output directory with its manifest
(:mod:`.compare_output`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..analysis import _arviz, plots
from ..analysis.advice import NETWORK_ADVICE, OVERDAMPED_KERNELS
from ..data.datasets import Dataset
from .compare_config import ACTIVATIONS as ACTIVATIONS
from .compare_config import METHODS, SGMCMC_METHODS, CompareConfig, load_data
from .compare_config import NOISES as NOISES
from .compare_config import PRIORS as PRIORS
from .compare_config import TASKS as TASKS
from .compare_fit import TensorDict as TensorDict
from .compare_fit import build_model as build_model
from .compare_fit import nuts_potential as nuts_potential
from .compare_fit import nuts_starts as nuts_starts
from .compare_jobs import run_methods
from .compare_method import DIVERGENT_SHARE as DIVERGENT_SHARE
from .compare_method import MethodOutcome, Prediction, run_method, torch_threads
from .compare_method import convergence as convergence
from .compare_method import posterior_samples as posterior_samples
from .compare_method import predictive_metrics as predictive_metrics
from .compare_output import MANIFEST_NAME, OutputDirectory, check_output_dir
from .compare_output import output_names as output_names
from .compare_results import ComparisonResults, MethodResult

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
    out = _prepare_output(config)
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
    if out is not None and out.kept:  # the user's files: said with the results, and noted
        results.kept_files = list(out.kept)
        results.notes.append(results.kept_files_line())
    say(_describe(data, config))
    with torch_threads(config.threads):
        predictions, grid_predictions = _run_methods(config, data, results, out, deadline, say)
        results.notes.append(_settings_note(config, data))
        if out is not None:
            _write_summary(results, data, predictions, grid_predictions, out, start)
    results.total_time = time.perf_counter() - start
    return results


def _prepare_output(config: CompareConfig) -> OutputDirectory | None:
    """The prepared output directory of ``config`` (``None`` for none)."""
    if config.out is None:
        return None
    return OutputDirectory.prepare(config.out, overwrite=config.overwrite)


def _describe(data: Dataset, config: CompareConfig) -> str:
    """One line naming the data and the network of a comparison."""
    source = data.metadata.get("task_source")
    return (
        f"{data!r}"
        + (f" ({source})" if source else "")
        + f"; BNN {data.num_features}-{'-'.join(map(str, config.hidden))}-"
        f"{data.output_dim} ({config.activation}, {config.prior} prior)"
    )


def _run_methods(
    config: CompareConfig,
    data: Dataset,
    results: ComparisonResults,
    out: OutputDirectory | None,
    deadline: float | None,
    say: Callable[[str], None],
) -> tuple[dict[str, Prediction], dict[str, Prediction]]:
    """Run the methods of ``config`` (in turn, or ``config.jobs`` at a time), adding their rows
    to ``results`` in the order of ``config.methods`` and their files to ``out``; a method that
    would start after ``deadline`` is skipped.

    Returns
    -------
    (predictions, grid_predictions)
        The posterior predictive of each method that produced draws, at the test inputs and
        on ``data.x_grid`` (where the data set has one).
    """
    predictions: dict[str, Prediction] = {}
    grid_predictions: dict[str, Prediction] = {}
    for outcome in run_methods(config, data, deadline, say):
        results.methods.append(outcome.result)
        if outcome.idata is None:
            continue
        method = outcome.result.method
        predictions[method] = outcome.prediction
        if outcome.grid_prediction is not None:
            grid_predictions[method] = outcome.grid_prediction
        if out is not None:
            _write_method(outcome, out, config.figures)
    _drop_refuted_advice(results.methods)
    return predictions, grid_predictions


def _drop_refuted_advice(rows: list[MethodResult]) -> None:
    """Take the advice that SGHMC mixes a network's outputs faster out of the notes of the SGLD
    and pSGLD rows where this comparison's own SGHMC row did not (fewer effective draws per
    second, or no draws): the table beside it would say otherwise."""
    by_method = {row.method: row for row in rows}
    sghmc = by_method.get("sghmc")
    sghmc_rate = sghmc.diagnostics.get("ess_per_second") if sghmc and sghmc.ok else None
    for method in OVERDAMPED_KERNELS:
        row = by_method.get(method)
        if sghmc is None or row is None or NETWORK_ADVICE not in row.message:
            continue
        rate = row.diagnostics.get("ess_per_second")
        if sghmc_rate is None or rate is None or sghmc_rate <= rate:
            row.message = row.message.replace(NETWORK_ADVICE, "")


def _settings_note(config: CompareConfig, data: Dataset) -> str:
    """The note of the results that states the seed, chains, draws per chain and batch size."""
    thinning = config.num_steps_per_sample or "the warm-up's chosen"
    rounds = (
        f", then rounds until converged (ESS {config.target_ess:g}, at most "
        f"{config.max_seconds:g} s)"
        if config.target_ess is not None and config.max_seconds is not None
        else ""
    )
    jobs = min(config.jobs, len(config.methods))
    at_once = (
        f"; {jobs} methods at a time, each in its own process with {config.threads or 'default'}"
        " torch thread(s)"
        if jobs > 1
        else ""
    )
    sgmcmc = (
        f"; SG-MCMC: {config.num_samples} draws after {config.warmup} warm-up per "
        f"chain{rounds}, {thinning} steps per draw, batch size "
        f"{min(config.batch_size, data.num_train)} of N = {data.num_train}"
        if set(config.methods) & set(SGMCMC_METHODS)
        else ""
    )
    return f"seed {config.seed}; {config.chains} chain(s){sgmcmc}{at_once}"


def _write_summary(
    results: ComparisonResults,
    data: Dataset,
    predictions: dict[str, Prediction],
    grid_predictions: dict[str, Prediction],
    out: OutputDirectory,
    start: float,
) -> None:
    """Write the predictive figures (if wanted), ``summary.md`` and ``summary.json`` into ``out``.

    ``results.total_time`` is set first, from ``start``, so that the summaries state it.
    """
    if results.config.figures and predictions:
        name = plots.predictive_figure_name(data, grid=bool(grid_predictions))
        out.claim(name)
        results.files += plots.predictive_figures(data, predictions, grid_predictions, out.path)
    summary_json, summary_md = out.claim("summary.json"), out.claim("summary.md")
    results.files += [str(summary_json), str(summary_md)]
    results.total_time = time.perf_counter() - start
    summary_md.write_text(results.markdown())
    summary_json.write_text(json.dumps(results.to_dict(), indent=2) + "\n")


def _write_method(outcome: MethodOutcome, out: OutputDirectory, figures: bool) -> None:
    """Write a method's netCDF file (and figures) into ``out``, recording them first."""
    result = outcome.result
    path = out.claim(f"{result.method}.nc")
    _arviz.to_netcdf(outcome.idata, path)
    result.files.append(str(path))
    if figures:
        outputs = plots.has_outputs(outcome.idata)
        for name in plots.diagnostic_figure_names(result.method, outputs=outputs):
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
