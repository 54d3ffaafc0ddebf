"""Figures of ``pyro-sgmcmc compare``: predictive bands, reliability diagrams, traces and ranks.

Every function writes a PNG file and returns its path. The figures are built as
:class:`matplotlib.figure.Figure` objects that ``pyplot`` never sees, so importing this module or
calling its functions leaves the caller's Matplotlib backend and open figures alone: nothing is
shown in a notebook or a window, and nothing needs closing. (ArviZ 1.x's ``arviz_plots`` creates
its figures through ``pyplot``: :mod:`pyro_sgmcmc.analysis._arviz` creates them with interactive
mode off and closes them in ``pyplot`` before they are drawn and saved here.)
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure

from . import _arviz
from .judged_outputs import judged_outputs
from .metrics import expected_calibration_error

if TYPE_CHECKING:
    from ..data.datasets import Dataset
    from .predictive import ClassificationPrediction, RegressionPrediction

    Prediction = RegressionPrediction | ClassificationPrediction

__all__ = [
    "diagnostic_figure_names",
    "diagnostic_figures",
    "has_outputs",
    "predicted_vs_observed",
    "predictive_bands",
    "predictive_figure_name",
    "predictive_figures",
    "reliability_bins",
    "reliability_diagram",
]

#: Scalar components shown in trace and rank plots (a BNN has too many to show all).
MAX_TRACE_COMPONENTS = 6


def _save(fig: Figure, path: Path) -> str:
    # Figure.savefig attaches an Agg canvas of its own: no pyplot, no backend switch.
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return str(path)


def _panels(count: int, width: float = 4.0, height: float = 3.2) -> tuple[Figure, np.ndarray]:
    columns = min(count, 3)
    rows = -(-count // columns)
    fig = Figure(figsize=(width * columns, height * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False, sharey=True)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, axes.flat


def predictive_bands(data: Dataset, grid_predictions: Mapping[str, Prediction], path: Path) -> str:
    """Predictive mean with epistemic and total two-sd bands on ``data.x_grid``.

    The darker band is :math:`\\pm 2` epistemic standard deviations (spread of the per-draw
    means), the lighter one :math:`\\pm 2` total standard deviations (epistemic plus noise); the
    training points and the noise-free function are drawn on top. Original units.
    """
    x = data.x_to_original(data.x_grid)[:, 0].numpy()
    x_train = data.x_to_original(data.x_train)[:, 0].numpy()
    y_train = data.y_to_original(data.y_train).numpy()
    fig, axes = _panels(len(grid_predictions))
    for ax, (method, pred) in zip(axes, grid_predictions.items(), strict=False):
        mean = data.y_to_original(pred.mean.reshape(-1)).numpy()
        epistemic = data.y_scale_to_original(pred.epistemic_variance.sqrt().reshape(-1)).numpy()
        total = data.y_scale_to_original(pred.std.reshape(-1)).numpy()
        ax.fill_between(x, mean - 2 * total, mean + 2 * total, color="C0", alpha=0.2, lw=0)
        ax.fill_between(x, mean - 2 * epistemic, mean + 2 * epistemic, color="C0", alpha=0.45, lw=0)
        ax.plot(x, mean, color="C0", lw=1.5, label="predictive mean")
        if data.f_grid is not None:
            ax.plot(x, data.f_grid.numpy(), color="k", lw=1, ls="--", label="true function")
        ax.scatter(x_train, y_train, s=10, color="C3", zorder=3, label="training data")
        ax.set_title(method)
        ax.set_xlabel(data.feature_names[0])
    axes[0].set_ylabel("y")
    span = np.ptp(y_train)
    axes[0].set_ylim(y_train.min() - 1.5 * span, y_train.max() + 1.5 * span)
    axes[0].legend(loc="upper left", fontsize=7)
    fig.suptitle(f"{data.name}: mean, ±2 sd epistemic (dark) and total (light)")
    return _save(fig, path)


def predicted_vs_observed(data: Dataset, predictions: Mapping[str, Prediction], path: Path) -> str:
    """Test targets against predictive means with :math:`\\pm 2` total-sd bars, original units."""
    y = data.y_to_original(data.y_test).numpy()
    fig, axes = _panels(len(predictions))
    for ax, (method, pred) in zip(axes, predictions.items(), strict=False):
        mean = data.y_to_original(pred.mean.reshape(-1)).numpy()
        total = data.y_scale_to_original(pred.std.reshape(-1)).numpy()
        ax.errorbar(y, mean, yerr=2 * total, fmt="o", ms=2, lw=0.5, alpha=0.6)
        low, high = float(min(y.min(), mean.min())), float(max(y.max(), mean.max()))
        ax.plot([low, high], [low, high], color="k", lw=0.8)
        ax.set_title(method)
        ax.set_xlabel("observed")
    axes[0].set_ylabel("predicted (±2 sd)")
    fig.suptitle(f"{data.name}: test predictions")
    return _save(fig, path)


def reliability_bins(
    probs: torch.Tensor, labels: torch.Tensor, num_bins: int = 15
) -> dict[str, np.ndarray]:
    """Per-bin counts, accuracy and mean confidence of the top label (bins ``((b-1)/M, b/M]``).

    The binning of :func:`pyro_sgmcmc.analysis.metrics.expected_calibration_error`, whose value is
    :math:`\\sum_b \\frac{n_b}{n}|\\mathrm{acc}_b - \\mathrm{conf}_b|`.
    """
    confidence, predicted = probs.double().max(-1)
    correct = (predicted == labels).double()
    bins = torch.clamp(torch.ceil(confidence * num_bins).long() - 1, 0, num_bins - 1)
    counts = torch.bincount(bins, minlength=num_bins).double()
    safe = counts.clamp(min=1)
    return {
        "edges": np.linspace(0.0, 1.0, num_bins + 1),
        "counts": counts.numpy(),
        "accuracy": (torch.bincount(bins, weights=correct, minlength=num_bins) / safe).numpy(),
        "confidence": (torch.bincount(bins, weights=confidence, minlength=num_bins) / safe).numpy(),
    }


def reliability_diagram(
    data: Dataset, predictions: Mapping[str, Prediction], path: Path, num_bins: int = 15
) -> str:
    """Accuracy against confidence per bin of the top-label probability, one panel per method."""
    fig, axes = _panels(len(predictions))
    for ax, (method, pred) in zip(axes, predictions.items(), strict=False):
        ece = expected_calibration_error(pred.probs, data.y_test, num_bins)
        bins = reliability_bins(pred.probs, data.y_test, num_bins)
        edges = bins["edges"]
        centres, width = (edges[:-1] + edges[1:]) / 2, edges[1] - edges[0]
        filled = bins["counts"] > 0
        ax.bar(
            centres[filled],
            bins["accuracy"][filled],
            width=width,
            edgecolor="k",
            lw=0.5,
            label="accuracy",
        )
        ax.bar(
            centres[filled],
            (bins["confidence"] - bins["accuracy"])[filled],
            bottom=bins["accuracy"][filled],
            width=width,
            color="C3",
            alpha=0.3,
            label="gap",
        )
        ax.plot([0, 1], [0, 1], color="k", ls="--", lw=0.8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(f"{method} (ECE {ece:.3f})")
        ax.set_xlabel("confidence")
    axes[0].set_ylabel("accuracy")
    axes[0].legend(loc="upper left", fontsize=7)
    fig.suptitle(f"{data.name}: reliability diagram")
    return _save(fig, path)


def predictive_figure_name(data: Dataset, grid: bool = True) -> str:
    """The file name :func:`predictive_figures` writes for ``data``.

    ``reliability_diagram.png`` for classification, ``predictive_bands.png`` for 1-D regression
    with a plotting grid (when ``grid`` predictions are available), ``predicted_vs_observed.png``
    for other regression.
    """
    if data.task == "classification":
        return "reliability_diagram.png"
    if data.num_features == 1 and data.x_grid is not None and grid:
        return "predictive_bands.png"
    return "predicted_vs_observed.png"


def predictive_figures(
    data: Dataset,
    predictions: Mapping[str, Prediction],
    grid_predictions: Mapping[str, Prediction],
    out: Path,
) -> list[str]:
    """The predictive figure that applies to ``data`` (see :func:`predictive_figure_name`).

    Returns
    -------
    list of str
        The paths written (one).
    """
    name = predictive_figure_name(data, grid=bool(grid_predictions))
    path = Path(out) / name
    if name == "reliability_diagram.png":
        return [reliability_diagram(data, predictions, path)]
    if name == "predictive_bands.png":
        return [predictive_bands(data, grid_predictions, path)]
    return [predicted_vs_observed(data, predictions, path)]


def _trace_subset(idata: Any) -> Any:
    """A few scalar components: the first element of each site, scalar sites first."""
    posterior = _arviz.get_group(idata, "posterior")
    names = sorted(posterior.data_vars, key=lambda n: (posterior[n].ndim > 2, n))
    chosen: dict[str, np.ndarray] = {}
    for name in names[:MAX_TRACE_COMPONENTS]:
        values = posterior[name].values
        flat = values.reshape(*values.shape[:2], -1)
        label = name if values.ndim == 2 else f"{name}[0]"
        chosen[label] = flat[..., 0]
    return _arviz.from_samples(chosen)


def has_outputs(idata: Any) -> bool:
    """Whether ``idata`` holds a network's outputs at the test inputs (``predictions.output``)."""
    return _arviz.has_group(idata, "predictions") and (
        "output" in _arviz.get_group(idata, "predictions").data_vars
    )


def _output_subset(idata: Any) -> Any:
    """The outputs :math:`f(x)` at the few test inputs whose split R-hat is largest.

    These are what a network's convergence is judged by (:mod:`~pyro_sgmcmc.analysis.diagnostics`):
    the worst of them show whether the chains agree on the predictions. Each is labelled
    ``f(x_i)`` by its test row ``i`` (and ``[k]`` by its output index when there are several).
    A classifier's are its class probabilities, as its verdict judges them (the posterior's
    attribute ``output_link``: :mod:`.judged_outputs`).
    """
    attrs = _arviz.get_group(idata, "posterior").attrs
    predictions = _arviz.get_group(idata, "predictions")[["output"]]
    output = judged_outputs(predictions, attrs, at_judged_rows=False)["output"]
    values = output.values
    flat = values.reshape(*values.shape[:2], -1)
    order = np.arange(flat.shape[-1])
    if values.shape[0] > 1 and values.shape[1] >= 4:
        rhat = np.nan_to_num(_arviz.rhat(output.to_dataset())["output"].values.reshape(-1))
        order = np.argsort(-rhat, kind="stable")
    chosen: dict[str, np.ndarray] = {}
    for index in order[:MAX_TRACE_COMPONENTS]:
        row, *rest = np.unravel_index(index, values.shape[2:])
        shown = [k for k, size in zip(rest, values.shape[3:], strict=True) if size > 1]
        label = f"f(x_{row})" + "".join(f"[{k}]" for k in shown)
        chosen[label] = flat[..., index]
    return _arviz.from_samples(chosen)


def _output_link(idata: Any) -> str | None:
    link = _arviz.get_group(idata, "posterior").attrs.get("output_link")
    return None if link is None else str(link)


def diagnostic_figure_names(method: str, outputs: bool = True) -> list[str]:
    """The file names :func:`diagnostic_figures` writes for ``method``.

    ``{method}_trace.png`` and ``{method}_rank.png`` (a few parameters), and with ``outputs``
    (a network's outputs at the test inputs, :func:`has_outputs`) ``{method}_trace_fx.png`` and
    ``{method}_rank_fx.png``.
    """
    names = [f"{method}_trace.png", f"{method}_rank.png"]
    return names + ([f"{method}_trace_fx.png", f"{method}_rank_fx.png"] if outputs else [])


def diagnostic_figures(idata: Any, method: str, out: Path) -> list[str]:
    """ArviZ trace and rank plots of a few parameters and, for a network, of its outputs.

    The outputs :math:`f(x)` at the test inputs are identified where the weights are not (hidden
    units can be permuted between chains), so their figures are the ones to judge mixing by;
    see :func:`diagnostic_figure_names` for the files.
    """
    with warnings.catch_warnings():
        # ArviZ 0.23 calls a Matplotlib API deprecated in 3.11, once per axis; and its density
        # estimate warns about a component that stays constant (a short run), drawn all the same
        warnings.simplefilter("ignore", matplotlib.MatplotlibDeprecationWarning)
        warnings.filterwarnings("ignore", message="Your data appears to have a single value")
        out = Path(out)
        names = diagnostic_figure_names(method, outputs=has_outputs(idata))
        paths = _trace_and_rank(_trace_subset(idata), f"{method}: parameters", names[:2], out)
        if len(names) > 2:
            shown = "outputs f(x) (class probabilities)" if _output_link(idata) else "outputs f(x)"
            what = f"{method}: {shown} at the test inputs with the largest R-hat"
            paths += _trace_and_rank(_output_subset(idata), what, names[2:], out)
        return paths


def _trace_and_rank(subset: Any, title: str, names: list[str], out: Path) -> list[str]:
    count = len(_arviz.get_group(subset, "posterior").data_vars)
    fig = _arviz.plot_trace(subset, figsize=(9, 1.6 * count + 0.6))
    _label_trace_axes(fig, _arviz.get_group(subset, "posterior").sizes["draw"])
    fig.suptitle(f"{title}: traces (left: density of each chain, right: value by draw)")
    paths = [_save(fig, out / names[0])]
    rows = -(-count // min(count, 2))
    fig = _arviz.plot_rank(subset, figsize=(9, 2.2 * rows + 0.6), columns=2)
    _small_titles(fig)
    fig.suptitle(f"{title}: ranks (flat and alike across chains when they mix)")
    paths.append(_save(fig, out / names[1]))
    return paths


def _label_trace_axes(fig: Figure, num_draws: int) -> None:
    """Name the axes of a trace figure: a panel whose lines run over the draw index is a trace,
    the panel beside it a density (left unnamed if no trace panel is recognised)."""
    draws = np.arange(num_draws)
    traces = [
        ax
        for ax in fig.axes
        if any(np.array_equal(np.asarray(line.get_xdata()), draws) for line in ax.get_lines())
    ]
    for ax in fig.axes if traces else []:
        trace = ax in traces
        ax.set_xlabel("draw" if trace else "value", fontsize=8)
        ax.set_ylabel("value" if trace else "density", fontsize=8)
    _small_titles(fig)


def _small_titles(fig: Figure) -> None:
    """Panel titles and axis labels at a size that fits small panels (ArviZ's default is large)."""
    for ax in fig.axes:
        ax.title.set_fontsize(9)
        ax.xaxis.label.set_fontsize(8)
        ax.yaxis.label.set_fontsize(8)
