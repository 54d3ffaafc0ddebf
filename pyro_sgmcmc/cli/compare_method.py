"""One method of a comparison, from data to table row: fit, export, predict and diagnose.

Part of :mod:`pyro_sgmcmc.cli.compare` (whose names these are): :func:`run_method` fits one method
with its runner from :mod:`pyro_sgmcmc.cli.compare_fit`, exports the draws to ``InferenceData``,
computes the test metrics of the posterior predictive (:func:`predictive_metrics`) and the
convergence diagnostics (:func:`convergence`), and fills in a
:class:`~pyro_sgmcmc.cli.compare.MethodResult`; a failure of the method is recorded there, not
raised. Both :func:`~pyro_sgmcmc.cli.compare.run_comparison` and
:func:`~pyro_sgmcmc.cli.compare.sample_to_file` call it.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyro
import torch

from ..analysis import _arviz, metrics
from ..analysis.advice import advice
from ..analysis.diagnostics import convergence_report
from ..analysis.export import to_inference_data
from ..analysis.predictive import (
    ClassificationPrediction,
    RegressionPrediction,
    posterior_predictive,
)
from ..data.datasets import Dataset
from ..errors import SamplerDivergedError
from ..nn import BayesianMLP
from .compare_config import METHODS, SGMCMC_METHODS, CompareConfig
from .compare_fit import _RUNNERS, TensorDict, _Run, build_model
from .compare_results import MethodResult

#: A method whose kept draws had a divergent step this often gets a note in the results.
DIVERGENT_SHARE = 0.1

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


def convergence(
    idata, method: str, wall_time: float, min_ess: float | None = None
) -> dict[str, Any]:
    """Worst split R-hat and bulk ESS over all scalar parameters, ESS/s and divergences, the
    same for a network's outputs at the test inputs, and the verdict (``"verdict"``: on the
    outputs for a network, else on the parameters; ``min_ess``: the total ESS the SG-MCMC
    rounds drew for, required besides the default bound, as the rounds required it). ESS/s is
    that of what the verdict judges: a network's outputs, else its parameters."""
    report = convergence_report(
        idata, method, wall_time=wall_time, function_space=False, min_ess=min_ess
    )
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
            function_space=True, min_ess=min_ess,
        )  # fmt: skip
        result["max_rhat_output"] = output.max_rhat
        result["min_ess_bulk_output"] = None if independent else output.min_ess_bulk
        if _arviz.get_group(idata, "posterior").attrs.get("function_space"):
            result["verdict"] = output.verdict
            result["ess_per_second"] = None if independent else output.ess_bulk_per_second
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
        exporting = time.perf_counter()
        idata = _export(run, model, data, config, method, result.wall_time)
        rounds_ess = config.target_ess if method in SGMCMC_METHODS else None
        _predict_and_diagnose(outcome, model, idata, rounds_ess)
        outcome.idata = idata
        after = f"exported, predicted and judged in {time.perf_counter() - exporting:.1f} s"
        result.message = "; ".join(note for note in (result.message, after) if note)
    except Exception as error:  # any failure of one method is reported, the others go on
        _record_failure(result, error, began, say)
        return MethodOutcome(result, data)
    say(f"[{method}] done in {result.wall_time:.1f} s")
    return outcome


def _export(
    run: _Run,
    model: BayesianMLP,
    data: Dataset,
    config: CompareConfig,
    method: str,
    wall_time: float,
) -> Any:
    """The ``InferenceData`` of a method's run, with the test data and the method's name."""
    idata = to_inference_data(
        run.source,
        model,
        data.x_train,
        data.y_train,
        test=(data.x_test, data.y_test),
        num_draws=max(run.num_draws, 1),
        hmc_stats=run.hmc_stats,
        wall_time=wall_time,
        seed=config.seed,
    )
    idata.posterior.attrs["method"] = method
    return idata


def _predict_and_diagnose(
    outcome: MethodOutcome, model: BayesianMLP, idata: Any, min_ess: float | None
) -> None:
    """Fill in the predictions of ``outcome`` and its row's metrics, diagnostics, status, notes
    (``min_ess``: the total ESS its rounds drew for, see :func:`convergence`)."""
    result, data, method = outcome.result, outcome.data, outcome.result.method
    samples = posterior_samples(idata)
    outcome.prediction = posterior_predictive(model, samples, data.x_test, data.y_test)
    result.metrics = predictive_metrics(outcome.prediction, data)
    if data.x_grid is not None:
        outcome.grid_prediction = posterior_predictive(model, samples, data.x_grid)
    result.diagnostics = convergence(idata, method, result.wall_time, min_ess)
    verdict = result.diagnostics.pop("verdict")
    if method != "svi":
        result.status = "converged" if verdict.converged else "not converged"
    notes = (
        result.message,
        ""
        if (verdict.converged and not verdict.caveat) or method == "svi"
        else str(verdict) + advice(method, verdict),
        _divergence_note(idata, method),
    )
    result.message = "; ".join(note for note in notes if note)


def _record_failure(
    result: MethodResult, error: Exception, began: float, say: Callable[[str], None]
) -> None:
    """Record in ``result`` that its method raised ``error``; call it while handling ``error``."""
    if math.isnan(result.wall_time):
        result.wall_time = time.perf_counter() - began
    result.status = "failed"
    kind = "diverged" if isinstance(error, SamplerDivergedError) else type(error).__name__
    result.message = f"{kind}: {error}".splitlines()[0][:300]
    say(f"[{result.method}] failed: {result.message}")
    if os.environ.get("PYRO_SGMCMC_DEBUG"):
        traceback.print_exc()


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
