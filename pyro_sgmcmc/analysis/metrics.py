r"""Predictive metrics for regression and classification.

Point and probabilistic metrics of a posterior predictive, and the two metrics of the NeurIPS
2021 approximate-inference competition that compare a predictive with a reference one (such as
long HMC chains): top-1 *agreement* and *total variation*
(Wilson et al. 2022, "Evaluating approximate inference in Bayesian deep learning").

All functions take torch tensors and return Python floats.

References
----------
C. Guo, G. Pleiss, Y. Sun and K. Q. Weinberger, "On calibration of modern neural networks",
ICML 2017 (expected calibration error).

A. G. Wilson, P. Izmailov, M. D. Hoffman, Y. Gal, Y. Li, M. F. Pradier, S. Vikram, A. Foong,
S. Lotfi and S. Farquhar, "Evaluating approximate inference in Bayesian deep learning",
NeurIPS 2021 Competition and Demonstration Track, PMLR 176, 2022.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_positive_int

__all__ = [
    "accuracy",
    "agreement",
    "expected_calibration_error",
    "log_mean_exp",
    "mae",
    "negative_log_likelihood",
    "predictive_log_likelihood",
    "rmse",
    "total_variation",
]


def _same_rows(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"{what}: {a.shape[0]} predictions but {b.shape[0]} targets")
    if a.shape[0] == 0:
        raise ValueError(f"{what}: no rows")
    for name, value in (("predictions", a), ("targets", b)):
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{what}: the {name} contain NaN or infinite values")


def _check_probs(probs: torch.Tensor, what: str, num_classes_from: torch.Tensor | None = None):
    """Rows of ``probs`` must be probability vectors; labels must index their classes."""
    if probs.dim() != 2:
        raise ValueError(f"{what}: probs must have shape (N, K), got {tuple(probs.shape)}")
    if bool((probs < 0).any()) or not torch.allclose(
        probs.double().sum(-1), torch.ones(probs.shape[0], dtype=torch.float64), atol=1e-4
    ):
        raise ValueError(f"{what}: probs rows must be non-negative and sum to 1")
    if num_classes_from is not None:
        labels = num_classes_from
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= probs.shape[-1]):
            raise ValueError(
                f"{what}: labels must lie in [0, {probs.shape[-1] - 1}], got "
                f"[{int(labels.min())}, {int(labels.max())}]"
            )


def rmse(mean: torch.Tensor, y: torch.Tensor) -> float:
    r"""Root mean squared error :math:`\sqrt{\frac1N\sum_i \lVert y_i - \hat y_i\rVert^2 / D}`."""
    _same_rows(mean, y, "rmse")
    return float((mean - y.reshape(mean.shape)).double().square().mean().sqrt())


def mae(mean: torch.Tensor, y: torch.Tensor) -> float:
    r"""Mean absolute error :math:`\frac1{ND}\sum_i \lVert y_i - \hat y_i\rVert_1`."""
    _same_rows(mean, y, "mae")
    return float((mean - y.reshape(mean.shape)).double().abs().mean())


def log_mean_exp(values: torch.Tensor, dim: int = 0) -> torch.Tensor:
    r""":math:`\log \frac1S \sum_s e^{v_s}` along ``dim``, computed stably."""
    return torch.logsumexp(values, dim=dim) - math.log(values.shape[dim])


def predictive_log_likelihood(pointwise_log_likelihood: torch.Tensor) -> float:
    r"""Mean test log predictive density from per-draw, per-point log-likelihoods.

    .. math::

        \frac1N \sum_i \log \frac1S \sum_s p(y_i \mid x_i, \theta_s)

    Parameters
    ----------
    pointwise_log_likelihood:
        Shape ``(S, N)``: :math:`\log p(y_i \mid x_i, \theta_s)`; or shape ``(N,)``: already the
        pointwise log predictive density (e.g. ``prediction.log_predictive_density``).
    """
    values = pointwise_log_likelihood.double()
    if values.dim() == 2:
        values = log_mean_exp(values, dim=0)
    elif values.dim() != 1:
        raise ValueError(
            f"pointwise_log_likelihood must have shape (S, N) or (N,), got {tuple(values.shape)}"
        )
    return float(values.mean())


def accuracy(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows whose most probable class is the label."""
    _same_rows(probs, y, "accuracy")
    _check_probs(probs, "accuracy", y)
    return float((probs.argmax(-1) == y).double().mean())


def negative_log_likelihood(probs: torch.Tensor, y: torch.Tensor) -> float:
    r"""Mean negative log predictive probability :math:`-\frac1N\sum_i \log \bar p_{y_i}(x_i)`.

    Probabilities are clamped below at the smallest positive float of their dtype.
    """
    _same_rows(probs, y, "negative_log_likelihood")
    _check_probs(probs, "negative_log_likelihood", y)
    p = probs.double().gather(-1, y.long().reshape(-1, 1)).squeeze(-1)
    return float(-p.clamp_min(torch.finfo(torch.float64).tiny).log().mean())


def expected_calibration_error(probs: torch.Tensor, y: torch.Tensor, num_bins: int = 15) -> float:
    r"""Expected calibration error with equal-width confidence bins (Guo et al. 2017).

    .. math::

        \mathrm{ECE} = \sum_{b=1}^{M} \frac{|B_b|}{N}
                       \left| \mathrm{acc}(B_b) - \mathrm{conf}(B_b) \right|,

    where :math:`B_b` holds the rows whose confidence :math:`\max_k \bar p_k` lies in
    :math:`((b-1)/M, b/M]`. Even a perfectly calibrated predictor has a positive ECE of order
    :math:`\sum_b \frac{|B_b|}{N}\sqrt{\mathrm{conf}(1-\mathrm{conf})/|B_b|}` on a finite sample.

    Parameters
    ----------
    num_bins:
        :math:`M \ge 1` (15 by convention).
    """
    num_bins = check_positive_int("num_bins", num_bins)
    _same_rows(probs, y, "expected_calibration_error")
    _check_probs(probs, "expected_calibration_error", y)
    confidence, predicted = probs.double().max(-1)
    correct = (predicted == y).double()
    bins = torch.clamp(torch.ceil(confidence * num_bins).long() - 1, 0, num_bins - 1)
    sum_conf = torch.bincount(bins, weights=confidence, minlength=num_bins)
    sum_correct = torch.bincount(bins, weights=correct, minlength=num_bins)
    return float((sum_correct - sum_conf).abs().sum() / confidence.shape[0])


def agreement(probs: torch.Tensor, reference_probs: torch.Tensor) -> float:
    r"""Top-1 agreement with a reference predictive: :math:`\frac1N\sum_i
    [\arg\max_k p_{ik} = \arg\max_k q_{ik}]`."""
    _same_rows(probs, reference_probs, "agreement")
    return float((probs.argmax(-1) == reference_probs.argmax(-1)).double().mean())


def total_variation(probs: torch.Tensor, reference_probs: torch.Tensor) -> float:
    r"""Mean total variation distance to a reference predictive:
    :math:`\frac1N\sum_i \frac12 \sum_k |p_{ik} - q_{ik}|`."""
    _same_rows(probs, reference_probs, "total_variation")
    return float(0.5 * (probs.double() - reference_probs.double()).abs().sum(-1).mean())
