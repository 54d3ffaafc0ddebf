r"""Posterior predictive summaries with the epistemic/aleatoric split.

Given draws :math:`\theta_s, s = 1..S` (MCMC, SG-MCMC or a variational guide):

**Regression**, with per-draw mean :math:`\mu_s(x)` and noise variance :math:`\sigma^2_s(x)`, by
the law of total variance

.. math::

    \mathrm{Var}[y \mid x, D] = \underbrace{\mathrm{Var}_s[\mu_s(x)]}_{\text{epistemic}}
                              + \underbrace{\mathrm{E}_s[\sigma^2_s(x)]}_{\text{aleatoric}},
    \qquad \mathrm{E}[y \mid x, D] = \mathrm{E}_s[\mu_s(x)].

**Classification**, with per-draw class probabilities :math:`p_s(x)` and their mean
:math:`\bar p(x)`, the entropy of the predictive splits as (Depeweg et al. 2018)

.. math::

    \underbrace{H[\bar p]}_{\text{total}} = \underbrace{\mathrm{E}_s H[p_s]}_{\text{aleatoric}}
        + \underbrace{H[\bar p] - \mathrm{E}_s H[p_s]}_{\text{epistemic: mutual information}}.

With targets :math:`y`, the pointwise log predictive density
:math:`\log \frac1S \sum_s p(y_i \mid \theta_s)` is accumulated too (a log-mean-exp over draws).

Everything is computed in chunks of draws and rows with running (Chan et al. 1979) moments, so a
10 000-row test set with 200 draws needs only a chunk's worth of memory. For
:class:`~pyro_sgmcmc.nn.BayesianMLP` the draws go through a batched functional forward pass; any
other Pyro model is run under ``poutine.condition`` once per draw, and the moments are read from
its observed site's distribution (``pyro.infer.Predictive`` would only return samples of
:math:`y`, from which the split could only be estimated).

References
----------
S. Depeweg, J. M. Hernandez-Lobato, F. Doshi-Velez and S. Udluft, "Decomposition of uncertainty
in Bayesian deep learning for efficient and risk-sensitive learning", ICML 2018.

T. F. Chan, G. H. Golub and R. J. LeVeque, "Updating formulae and a pairwise algorithm for
computing sample variances", 1979.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample

from .._validation import _as_tensor, check_interval, check_positive_int
from ..models.structure import DataPlate, plate_chunks, with_global_sites
from ..nn.mlp import BayesianMLP
from .metrics import accuracy, expected_calibration_error, negative_log_likelihood

__all__ = [
    "ClassificationPrediction",
    "RegressionPrediction",
    "classification_report",
    "classify_with_cutoff",
    "flatten_draws",
    "posterior_predictive",
    "sample_guide",
]

REFUSED = -1


@dataclass(frozen=True)
class RegressionPrediction:
    """Predictive summaries of a regression model (shapes ``(N,)`` or ``(N, D)``).

    Attributes
    ----------
    mean:
        :math:`\\mathrm{E}_s[\\mu_s(x)]`.
    epistemic_variance:
        :math:`\\mathrm{Var}_s[\\mu_s(x)]` (population variance over the draws).
    aleatoric_variance:
        :math:`\\mathrm{E}_s[\\sigma^2_s(x)]`.
    log_predictive_density:
        Pointwise :math:`\\log \\frac1S\\sum_s p(y_i\\mid\\theta_s)` (summed over the responses of a
        row), or ``None`` when no targets were given.
    num_draws:
        :math:`S`.
    """

    mean: torch.Tensor
    epistemic_variance: torch.Tensor
    aleatoric_variance: torch.Tensor
    log_predictive_density: torch.Tensor | None
    num_draws: int

    @property
    def total_variance(self) -> torch.Tensor:
        """Epistemic plus aleatoric variance, the variance of the predictive distribution."""
        return self.epistemic_variance + self.aleatoric_variance

    @property
    def std(self) -> torch.Tensor:
        """Predictive standard deviation."""
        return self.total_variance.sqrt()


@dataclass(frozen=True)
class ClassificationPrediction:
    """Predictive summaries of a classifier.

    Attributes
    ----------
    probs:
        :math:`\\bar p(x)`, shape ``(N, K)``.
    total_entropy:
        :math:`H[\\bar p(x)]` in nats, shape ``(N,)``.
    expected_entropy:
        :math:`\\mathrm{E}_s H[p_s(x)]`, the aleatoric part.
    log_predictive_density:
        Pointwise :math:`\\log \\bar p_{y_i}(x_i)`, or ``None`` without targets.
    num_draws:
        :math:`S`.
    """

    probs: torch.Tensor
    total_entropy: torch.Tensor
    expected_entropy: torch.Tensor
    log_predictive_density: torch.Tensor | None
    num_draws: int

    @property
    def mutual_information(self) -> torch.Tensor:
        """:math:`H[\\bar p] - \\mathrm{E}_s H[p_s]`, the epistemic part (>= 0)."""
        return self.total_entropy - self.expected_entropy

    def predict(self, threshold: float = 0.0) -> torch.Tensor:
        """Predicted labels; ``-1`` where the top probability is below ``threshold``."""
        return classify_with_cutoff(self.probs, threshold)


def classify_with_cutoff(probs: torch.Tensor, threshold: float = 0.2) -> torch.Tensor:
    r"""Labels :math:`\arg\max_k \bar p_k`, or ``-1`` (refused) when :math:`\max_k \bar p_k <`
    ``threshold``.

    The default 0.2 refuses inputs on which a 10-class model is close to uniform, e.g. images of
    pure noise.

    Parameters
    ----------
    probs:
        Predictive probabilities, shape ``(..., K)``.
    threshold:
        Cut-off in ``[0, 1]``.
    """
    threshold = check_interval("threshold", threshold, 0.0, 1.0)
    top, labels = probs.max(dim=-1)
    return torch.where(top < threshold, torch.full_like(labels, REFUSED), labels)


def classification_report(
    probs: torch.Tensor,
    y: torch.Tensor,
    noise_probs: torch.Tensor | None = None,
    threshold: float = 0.2,
) -> dict[str, float]:
    """Accuracy, NLL, ECE and the share of refused inputs of a classifier's predictive.

    Parameters
    ----------
    probs:
        Predictive probabilities of the test inputs, ``(rows, K)``.
    y:
        Their labels.
    noise_probs:
        Optional predictive probabilities of inputs that belong to no class (e.g. noise images).
    threshold:
        The cut-off of :func:`classify_with_cutoff`.

    Returns
    -------
    dict
        ``"accuracy"``, ``"NLL"`` (mean per input), ``"ECE"`` (15 bins; see
        :mod:`pyro_sgmcmc.analysis.metrics`), ``"test refused"`` and, with ``noise_probs``,
        ``"noise refused"``: the shares of inputs whose top probability is below ``threshold``.
    """
    report = {
        "accuracy": accuracy(probs, y),
        "NLL": negative_log_likelihood(probs, y),
        "ECE": expected_calibration_error(probs, y),
        "test refused": _refused_share(probs, threshold),
    }
    if noise_probs is not None:
        report["noise refused"] = _refused_share(noise_probs, threshold)
    return report


def _refused_share(probs: torch.Tensor, threshold: float) -> float:
    return float((classify_with_cutoff(probs, threshold) == REFUSED).double().mean())


def _site_shapes_of(
    model: Callable[..., Any], x: torch.Tensor, plate_name: str
) -> dict[str, torch.Size]:
    """Shapes of the global latent sites (the model run without targets samples ``obs``)."""
    if isinstance(model, BayesianMLP):
        return model.site_shapes()
    trace = poutine.trace(model).get_trace(x)
    return {
        name: site["value"].shape
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and not site["is_observed"]
        and not site_is_subsample(site)
        and not any(frame.name == plate_name for frame in site["cond_indep_stack"])
    }


def flatten_draws(
    draws: Mapping[str, Any], site_shapes: Mapping[str, torch.Size]
) -> dict[str, torch.Tensor]:
    """Keep the latent sites of ``draws`` and merge a leading chain dimension into the draws.

    Each value must have shape ``(S, *site_shape)`` or ``(C, S, *site_shape)``; the result has
    shape ``(C * S, *site_shape)``. Keys that are not latent sites (e.g. ``obs``) are dropped.
    """
    flat: dict[str, torch.Tensor] = {}
    num = None
    for name, shape in site_shapes.items():
        if name not in draws:
            raise ValueError(f"draws have no values for the latent site {name!r}")
        value = draws[name]
        # an ArviZ posterior group (xarray) holds its values as NumPy arrays
        value = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
        extra = value.dim() - len(shape)
        if extra not in (1, 2) or tuple(value.shape[extra:]) != tuple(shape):
            raise ValueError(
                f"draws[{name!r}] has shape {tuple(value.shape)}; expected "
                f"(draws, *{tuple(shape)}) or (chains, draws, *{tuple(shape)})"
            )
        value = value.reshape(-1, *shape)
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad = int((~torch.isfinite(value)).reshape(value.shape[0], -1).any(-1).sum())
            raise ValueError(
                f"draws[{name!r}] has NaN or infinite values in {bad} of {value.shape[0]} draws "
                "(a diverged chain?); drop those draws first"
            )
        if num is not None and value.shape[0] != num:
            raise ValueError("every site must have the same number of draws")
        num = value.shape[0]
        flat[name] = value
    if not num:
        raise ValueError("draws are empty")
    return flat


def sample_guide(
    guide: Callable[..., Any], num_draws: int, *args: Any, **kwargs: Any
) -> dict[str, torch.Tensor]:
    """Draw ``num_draws`` constrained latent values from a variational guide (e.g. ``AutoNormal``).

    Returns a dict keyed by site name with a leading draw dimension, the same format as
    ``mcmc.get_samples()``.
    """
    num_draws = check_positive_int("num_draws", num_draws)
    collected: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        for _ in range(num_draws):
            trace = poutine.trace(guide).get_trace(*args, **kwargs)
            for name, site in trace.nodes.items():
                if site["type"] == "sample" and not site_is_subsample(site):
                    if not site["infer"].get("is_auxiliary", False):
                        collected.setdefault(name, []).append(site["value"].detach())
    return {name: torch.stack(values) for name, values in collected.items()}


class _Moments:
    """Running mean and sum of squared deviations over draws (Chan et al. pairwise update)."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: torch.Tensor | float = 0.0
        self.m2: torch.Tensor | float = 0.0

    def update(self, values: torch.Tensor) -> None:
        n = values.shape[0]
        mean = values.mean(0)
        m2 = (values - mean).square().sum(0)
        if self.count == 0:
            self.count, self.mean, self.m2 = n, mean, m2
            return
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta.square() * (self.count * n / total)
        self.count = total

    @property
    def variance(self) -> torch.Tensor:
        return self.m2 / self.count


class _Accumulator:
    """Sums over draws for one chunk of rows."""

    def __init__(self, classify: bool) -> None:
        self.classify = classify
        self.moments = _Moments()
        self.sum_probs_or_variance: torch.Tensor | float = 0.0
        self.sum_entropy: torch.Tensor | float = 0.0
        self.log_sum: torch.Tensor | None = None

    def add_log_density(self, log_density: torch.Tensor) -> None:
        chunk = torch.logsumexp(log_density, dim=0)
        self.log_sum = chunk if self.log_sum is None else torch.logaddexp(self.log_sum, chunk)

    def add_classification(self, log_probs: torch.Tensor, y: torch.Tensor | None) -> None:
        probs = log_probs.exp()
        self.sum_probs_or_variance = self.sum_probs_or_variance + probs.sum(0)
        entropy = -(probs * log_probs).sum(-1)
        self.sum_entropy = self.sum_entropy + entropy.sum(0)
        if y is not None:
            _check_class_labels(y, log_probs.shape[-1])
            index = y.long().reshape(1, -1, 1).expand(log_probs.shape[0], -1, 1)
            self.add_log_density(log_probs.gather(-1, index).squeeze(-1))

    def add_regression(self, mean: torch.Tensor, var: torch.Tensor, y: torch.Tensor | None) -> None:
        self.moments.update(mean)
        self.sum_probs_or_variance = self.sum_probs_or_variance + var.sum(0)
        if y is not None:
            log_density = -0.5 * ((y - mean).square() / var + var.log() + math.log(2 * math.pi))
            self.add_log_density(log_density.sum(-1))


def _chunks(n: int, size: int):
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def _mlp_draw_chunk(
    model: BayesianMLP, draws: Mapping[str, torch.Tensor], x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    output = model.functional_forward(draws, x)
    if model.head.is_classifier:
        return torch.log_softmax(output, dim=-1)
    return model.head.mean_and_variance(output, draws, model.out_features)


_WRAPPERS = (dist.Independent, dist.MaskedDistribution, dist.ExpandedDistribution)


def _generic_draw_chunk(
    model: Callable[..., Any],
    draws: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    rows: torch.Tensor | None,
    obs_site: str,
    plate: DataPlate,
) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    num = next(iter(draws.values())).shape[0]
    bound, args, _ = plate.bind(model, (x,), {}, rows)
    keep = x.shape[0] if rows is None else len(rows)
    outputs = []
    for s in range(num):
        data = {name: value[s] for name, value in draws.items()}
        trace = poutine.trace(poutine.condition(bound, data=data)).get_trace(*args)
        if obs_site not in trace.nodes:
            sampled = [
                n for n, site in trace.nodes.items()
                if site["type"] == "sample" and not site_is_subsample(site) and n not in data
            ]  # fmt: skip
            raise ValueError(
                f"obs_site={obs_site!r}: the model has no observed site {obs_site!r}; its sites "
                f"outside the draws are {sampled}"
            )
        fn = trace.nodes[obs_site]["fn"]
        while isinstance(fn, _WRAPPERS):
            fn = fn.base_dist
        if isinstance(fn, torch.distributions.Categorical):
            outputs.append(torch.log_softmax(fn.logits, dim=-1)[:keep])
        else:
            mean, var = torch.broadcast_tensors(fn.mean, fn.variance)
            if mean.dim() == 1:
                mean, var = mean.unsqueeze(-1), var.unsqueeze(-1)
            outputs.append((mean[:keep], var[:keep]))
    if isinstance(outputs[0], tuple):
        return torch.stack([o[0] for o in outputs]), torch.stack([o[1] for o in outputs])
    return torch.stack(outputs)


def posterior_predictive(
    model: Callable[..., Any],
    draws: Mapping[str, Any],
    x: torch.Tensor,
    y: torch.Tensor | None = None,
    *,
    draw_chunk_size: int = 50,
    row_chunk_size: int = 2048,
    obs_site: str = "obs",
    plate_name: str = "data",
) -> RegressionPrediction | ClassificationPrediction:
    """Posterior predictive summaries of ``model`` at inputs ``x`` from posterior draws.

    Parameters
    ----------
    model:
        A :class:`~pyro_sgmcmc.nn.BayesianMLP` (fast batched path) or any Pyro model
        ``model(x, y=None)`` following the data-plate contract, whose observed site ``obs_site``
        is Normal-like (has ``mean`` and ``variance``; regression) or Categorical.
    draws:
        Constrained draws keyed by site name with a leading draw dimension, or leading
        ``(chain, draw)`` dimensions: ``mcmc.get_samples()``, ``mcmc.get_samples(group_by_chain=
        True)``, :func:`sample_guide`, or an export's posterior group (an ``xarray.Dataset``
        or ``DataTree`` node, ``idata.posterior``).
    x:
        Test inputs, first dimension the rows (NumPy arrays and lists of numbers are converted
        to tensors of torch's default dtype). For a ``BayesianMLP``, shape
        ``(rows, in_features)`` and the draws' dtype.
    y:
        Optional test targets, one per row of ``x`` (class labels: integers in ``[0, K)``):
        adds the pointwise log predictive density.

    Raises
    ------
    ValueError
        For draws that miss a site, have the wrong shape or NaN values, an unknown
        ``obs_site``, and inputs or targets that do not fit the model (named in the message).
    draw_chunk_size, row_chunk_size:
        Chunk sizes (``>= 1``) that bound memory to about
        ``draw_chunk_size * row_chunk_size * outputs`` numbers.
    obs_site, plate_name:
        The observed site and data plate of a generic model.

    Returns
    -------
    :class:`RegressionPrediction` or :class:`ClassificationPrediction`.
    """
    draw_chunk_size = check_positive_int("draw_chunk_size", draw_chunk_size)
    row_chunk_size = check_positive_int("row_chunk_size", row_chunk_size)
    x, y = _check_inputs(x, y)
    is_mlp = isinstance(model, BayesianMLP)
    if not is_mlp:
        model = with_global_sites(model, (x,), {}, plate_name)
    flat = flatten_draws(draws, _site_shapes_of(model, x, plate_name))
    if is_mlp:
        model.check_data(x, y, dtype=next(iter(flat.values())).dtype)
    num_draws = next(iter(flat.values())).shape[0]
    num_rows = x.shape[0]
    if is_mlp:
        row_slices = list(_chunks(num_rows, row_chunk_size))
    else:
        first = {name: value[0] for name, value in flat.items()}
        plate, indices = plate_chunks(model, (x,), {}, plate_name, first, row_chunk_size)
        row_slices = [
            slice(None) if i is None else slice(int(i[0]), int(i[-1]) + 1) for i in indices
        ]
    results = []
    with torch.no_grad():
        for k, rows in enumerate(row_slices):
            y_rows = None if y is None else y[rows]
            acc: _Accumulator | None = None
            for draw_slice in _chunks(num_draws, draw_chunk_size):
                chunk = {name: value[draw_slice] for name, value in flat.items()}
                if is_mlp:
                    out = _mlp_draw_chunk(model, chunk, x[rows])
                else:
                    out = _generic_draw_chunk(model, chunk, x, indices[k], obs_site, plate)
                if acc is None:
                    acc = _Accumulator(classify=not isinstance(out, tuple))
                if acc.classify:
                    acc.add_classification(out, y_rows)
                else:
                    mean, var = out
                    target = None
                    if y_rows is not None:
                        target = y_rows.reshape(y_rows.shape[0], -1).to(mean.dtype)
                    acc.add_regression(mean, var.expand_as(mean), target)
            results.append(acc)
    return _assemble(results, num_draws, y is not None)


def _check_inputs(x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` and ``y`` as tensors (NumPy arrays and lists of numbers are converted), ``y`` with
    one row per row of ``x``."""
    x = _as_tensor("x", x)
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        raise TypeError(f"x must be a tensor of test inputs with rows first, got {x!r}")
    if y is None:
        return x, None
    y = _as_tensor("y", y)
    if not isinstance(y, torch.Tensor) or y.dim() == 0 or y.shape[0] != x.shape[0]:
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"y must hold one target per row of x ({x.shape[0]} rows), got {shape}")
    if y.is_floating_point() and not bool(torch.isfinite(y).all()):
        raise ValueError("y contains NaN or infinite values; clean the test targets first")
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ValueError("x contains NaN or infinite values; clean the test inputs first")
    return x, y


def _check_class_labels(y: torch.Tensor, num_classes: int) -> None:
    """Test labels must be integers in ``[0, num_classes)``."""
    if y.is_floating_point() and not bool((y == y.round()).all()):
        raise ValueError(f"y must hold integer class labels in [0, {num_classes}), got {y.dtype}")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        bad = y[(y < 0) | (y >= num_classes)]
        raise ValueError(
            f"y holds {bad.numel()} label(s) outside the classes [0, {num_classes}) of the model, "
            f"e.g. {bad[0].item():g}"
        )


def _assemble(
    results: list[_Accumulator], num_draws: int, has_targets: bool
) -> RegressionPrediction | ClassificationPrediction:
    log_norm = math.log(num_draws)
    lpd = torch.cat([r.log_sum for r in results]) - log_norm if has_targets else None
    if results[0].classify:
        probs = torch.cat([r.sum_probs_or_variance for r in results]) / num_draws
        expected_entropy = torch.cat([r.sum_entropy for r in results]) / num_draws
        log_probs = probs.clamp_min(torch.finfo(probs.dtype).tiny).log()
        total_entropy = -(probs * log_probs).sum(-1)
        return ClassificationPrediction(probs, total_entropy, expected_entropy, lpd, num_draws)
    mean = torch.cat([r.moments.mean for r in results])
    epistemic = torch.cat([r.moments.variance for r in results])
    aleatoric = torch.cat([r.sum_probs_or_variance for r in results]) / num_draws
    if mean.shape[-1] == 1:
        mean, epistemic, aleatoric = mean.squeeze(-1), epistemic.squeeze(-1), aleatoric.squeeze(-1)
    return RegressionPrediction(mean, epistemic, aleatoric, lpd, num_draws)
