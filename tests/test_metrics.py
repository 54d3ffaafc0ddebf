"""Predictive metrics: known values, and calibration error with sampling-error tolerances."""

from __future__ import annotations

import math

import pytest
import torch

from pyro_sgmcmc.analysis.metrics import (
    accuracy,
    agreement,
    expected_calibration_error,
    log_mean_exp,
    mae,
    negative_log_likelihood,
    predictive_log_likelihood,
    rmse,
    total_variation,
)


def test_regression_metrics_known_values():
    mean = torch.tensor([1.0, 2.0, 3.0, 4.0])
    y = torch.tensor([1.0, 0.0, 3.0, 5.0])
    assert rmse(mean, y) == pytest.approx(math.sqrt(5 / 4))
    assert mae(mean, y) == pytest.approx(3 / 4)
    with pytest.raises(ValueError, match="predictions"):
        rmse(mean, y[:3])


def test_predictive_log_likelihood_is_log_mean_exp_then_mean():
    log_lik = torch.log(torch.tensor([[0.2, 0.5], [0.4, 0.1]]))  # (S=2, N=2)
    expected = (math.log(0.3) + math.log(0.3)) / 2
    assert predictive_log_likelihood(log_lik) == pytest.approx(expected)
    assert predictive_log_likelihood(log_mean_exp(log_lik, 0)) == pytest.approx(expected)
    # log-mean-exp is stable where exp underflows.
    big = torch.tensor([[-1000.0], [-1000.0]])
    assert float(log_mean_exp(big)) == pytest.approx(-1000.0)


def test_classification_metrics_known_values():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4], [0.5, 0.4, 0.1]])
    y = torch.tensor([0, 1, 0, 1])
    assert accuracy(probs, y) == pytest.approx(0.5)
    assert negative_log_likelihood(probs, y) == pytest.approx(
        -(math.log(0.7) + math.log(0.6) + math.log(0.3) + math.log(0.4)) / 4
    )
    reference = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4], [0.1, 0.8, 0.1]])
    assert agreement(probs, reference) == pytest.approx(0.5)
    tv = (0.5 * (0.1 + 0.1 + 0.0) + 0.5 * (0.1 + 0.4 + 0.3) + 0.0 + 0.5 * (0.4 + 0.4 + 0.0)) / 4
    assert total_variation(probs, reference) == pytest.approx(tv)
    assert total_variation(probs, probs) == 0.0 and agreement(probs, probs) == 1.0


def test_ece_known_value():
    # Two rows in bin (0.6, 0.667] with confidence 0.65, one right: |0.5 - 0.65| * 2/4;
    # two rows in the top bin with confidence 0.95, both right: |1 - 0.95| * 2/4.
    probs = torch.tensor([[0.65, 0.35], [0.35, 0.65], [0.95, 0.05], [0.05, 0.95]])
    y = torch.tensor([0, 0, 0, 1])
    assert expected_calibration_error(probs, y) == pytest.approx(0.15 * 0.5 + 0.05 * 0.5)
    with pytest.raises(ValueError, match="num_bins"):
        expected_calibration_error(probs, y, num_bins=0)


def calibrated_sample(num_rows: int, num_classes: int, generator, sharpen: float = 1.0):
    """Probabilities p and labels y ~ Categorical(p); ``sharpen != 1`` reports p**sharpen."""
    logits = 2.0 * torch.randn(num_rows, num_classes, generator=generator, dtype=torch.float64)
    probs = torch.softmax(logits, -1)
    y = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    reported = probs**sharpen
    return reported / reported.sum(-1, keepdim=True), y


def ece_sampling_tolerance(probs: torch.Tensor, num_bins: int = 15, z: float = 4.0) -> float:
    r"""Upper bound on the ECE of a calibrated predictor from sampling error alone.

    In bin :math:`b` the accuracy is a mean of :math:`n_b` Bernoullis with mean conf_b, so
    :math:`E|acc_b - conf_b| \le \sqrt{\bar v_b / n_b}` with :math:`\bar v_b` the mean of
    :math:`c(1-c)`; the ECE is a weighted sum of such terms, and its fluctuation is smaller than
    its mean. ``z`` times the bound on the mean is a generous but finite tolerance.
    """
    confidence = probs.max(-1).values
    bins = torch.clamp(torch.ceil(confidence * num_bins).long() - 1, 0, num_bins - 1)
    bound = 0.0
    for b in range(num_bins):
        c = confidence[bins == b]
        if c.numel():
            bound += (
                c.numel() / confidence.numel() * math.sqrt(float((c * (1 - c)).mean()) / c.numel())
            )
    return z * bound


def test_perfectly_calibrated_predictor_has_ece_near_zero():
    generator = torch.Generator().manual_seed(0)
    probs, y = calibrated_sample(20_000, 10, generator)
    tolerance = ece_sampling_tolerance(probs)
    assert tolerance < 0.05
    assert expected_calibration_error(probs, y) < tolerance
    # The same labels with over-confident reported probabilities exceed the tolerance, so the
    # test can fail.
    sharp, _ = calibrated_sample(20_000, 10, torch.Generator().manual_seed(0), sharpen=2.0)
    assert expected_calibration_error(sharp, y) > 3 * ece_sampling_tolerance(sharp)
