"""Posterior predictive summaries: identities, chunking, generic models, guides, cut-off."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

from pyro_sgmcmc.analysis.export import from_draws
from pyro_sgmcmc.analysis.metrics import predictive_log_likelihood
from pyro_sgmcmc.analysis.predictive import (
    ClassificationPrediction,
    RegressionPrediction,
    classify_with_cutoff,
    posterior_predictive,
    sample_guide,
)
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision, NormalLikelihood


def prior_draws(model, x, num, seed=0):
    pyro.set_rng_seed(seed)
    traces = [poutine.trace(model).get_trace(x) for _ in range(num)]
    return {n: torch.stack([t.nodes[n]["value"] for t in traces]) for n in model.latent_sites}


@pytest.mark.parametrize("likelihood", ["heteroscedastic", "normal-precision"])
def test_regression_split_matches_direct_computation_and_samples(likelihood):
    head = (
        "heteroscedastic"
        if likelihood == "heteroscedastic"
        else NormalLikelihood(precision=GammaPrecision(3.0, 1.0))
    )
    model = BayesianMLP(2, [6], 1, likelihood=head)
    x = torch.randn(37, 2)
    draws = prior_draws(model, x, 23)
    pred = posterior_predictive(model, draws, x, draw_chunk_size=5, row_chunk_size=8)
    assert isinstance(pred, RegressionPrediction) and pred.mean.shape == (37,)

    # Direct, unchunked: per-draw means and variances from the model's own trace.
    means, variances = [], []
    for s in range(23):
        trace = poutine.trace(
            poutine.condition(model, data={k: v[s] for k, v in draws.items()})
        ).get_trace(x)
        fn = trace.nodes["obs"]["fn"]
        means.append(fn.mean)
        variances.append(fn.variance.expand_as(fn.mean))
    means, variances = torch.stack(means), torch.stack(variances)
    assert torch.allclose(pred.mean, means.mean(0), atol=1e-5)
    assert torch.allclose(
        pred.epistemic_variance, means.var(0, unbiased=False), rtol=1e-4, atol=1e-6
    )
    assert torch.allclose(pred.aleatoric_variance, variances.mean(0), rtol=1e-5)

    # Law of total variance against samples y ~ p(y | x, theta_s): the sample variance of 9200
    # replicates has relative standard error sqrt(2 / 9200) = 1.5% for a Gaussian; the excess
    # kurtosis of a scale mixture can double it: 4 standard errors of 3% = 12%.
    replicates = torch.distributions.Normal(means, variances.sqrt()).sample((400,))
    sample_var = replicates.reshape(-1, 37).var(0)
    assert torch.allclose(sample_var, pred.total_variance, rtol=0.12)
    assert torch.equal(pred.total_variance, pred.epistemic_variance + pred.aleatoric_variance)


def test_classification_split_and_chain_dimension():
    model = BayesianMLP(3, [5], 4, likelihood="categorical")
    x, y = torch.randn(29, 3), torch.randint(0, 4, (29,))
    draws = prior_draws(model, x, 12)
    pred = posterior_predictive(model, draws, x, y, draw_chunk_size=5, row_chunk_size=10)
    assert isinstance(pred, ClassificationPrediction)
    probs = torch.softmax(model.functional_forward(draws, x), -1)  # (S, N, K)
    mean = probs.mean(0)
    entropy = lambda p: -(p * p.log()).sum(-1)  # noqa: E731
    assert torch.allclose(pred.probs, mean, atol=1e-6)
    assert torch.allclose(pred.total_entropy, entropy(mean), atol=1e-5)
    assert torch.allclose(pred.expected_entropy, entropy(probs).mean(0), atol=1e-5)
    assert torch.allclose(
        pred.total_entropy, pred.expected_entropy + pred.mutual_information, atol=1e-6
    )
    assert (pred.mutual_information > -1e-6).all()
    # Pointwise log predictive density agrees with the metric on per-draw log-likelihoods.
    log_lik = probs.log().gather(-1, y.reshape(1, -1, 1).expand(12, -1, 1)).squeeze(-1)
    assert pred.log_predictive_density.mean().item() == pytest.approx(
        predictive_log_likelihood(log_lik), abs=1e-5
    )
    # Draws with a (chain, draw) leading shape give the same result.
    by_chain = {k: v.reshape(3, 4, *v.shape[1:]) for k, v in draws.items()}
    again = posterior_predictive(model, by_chain, x, y)
    assert torch.allclose(again.probs, pred.probs, atol=1e-6)
    # Identical draws carry no epistemic uncertainty.
    same = {k: v[:1].expand(5, *v.shape[1:]) for k, v in draws.items()}
    assert posterior_predictive(model, same, x).mutual_information.abs().max() < 1e-5


def test_generic_model_path_matches_the_fast_path():
    model = BayesianMLP(2, [4], 1, likelihood="heteroscedastic")

    def generic(x, y=None):
        return model(x, y)

    x, y = torch.randn(15, 2), torch.randn(15)
    draws = prior_draws(model, x, 6)
    fast = posterior_predictive(model, draws, x, y)
    slow = posterior_predictive(generic, draws, x, y, row_chunk_size=4, draw_chunk_size=4)
    for field in ("mean", "epistemic_variance", "aleatoric_variance", "log_predictive_density"):
        assert torch.allclose(getattr(fast, field), getattr(slow, field), rtol=1e-4, atol=1e-5)

    classifier = BayesianMLP(2, [4], 3, likelihood="categorical")
    draws = prior_draws(classifier, x, 6)
    fast = posterior_predictive(classifier, draws, x)
    slow = posterior_predictive(lambda x, y=None: classifier(x, y), draws, x)
    assert torch.allclose(fast.probs, slow.probs, atol=1e-6)


def test_guide_draws_feed_the_predictive():
    model = BayesianMLP(2, [4], 3, likelihood="categorical")
    x, y = torch.randn(20, 2), torch.randint(0, 3, (20,))
    pyro.clear_param_store()
    guide = AutoNormal(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    for _ in range(3):
        svi.step(x, y)
    draws = sample_guide(guide, 7, x, y)
    assert {k: v.shape[0] for k, v in draws.items()} == {k: 7 for k in model.latent_sites}
    pred = posterior_predictive(model, draws, x, y)
    assert pred.probs.shape == (20, 3) and pred.num_draws == 7


def test_an_exported_posterior_group_feeds_the_predictive():
    """The draws a user holds after exporting: ``idata.posterior`` (xarray), chains first."""
    model = BayesianMLP(2, [4], 1, likelihood="heteroscedastic")
    x, y = torch.randn(15, 2), torch.randn(15)
    draws = {k: v.reshape(2, 3, *v.shape[1:]) for k, v in prior_draws(model, x, 6).items()}
    posterior = from_draws(draws).posterior
    from_tensors = posterior_predictive(model, draws, x, y)
    for given in (posterior, posterior.to_dataset() if hasattr(posterior, "to_dataset") else None):
        if given is None:
            continue
        from_export = posterior_predictive(model, given, x, y)
        assert torch.equal(from_export.mean, from_tensors.mean)
        assert torch.equal(from_export.log_predictive_density, from_tensors.log_predictive_density)


def test_probability_cutoff_refuses_uncertain_inputs():
    probs = torch.tensor([[0.9, 0.05, 0.05], [0.15, 0.15, 0.7], [0.34, 0.33, 0.33]])
    assert classify_with_cutoff(probs, 0.5).tolist() == [0, 2, -1]
    assert classify_with_cutoff(probs, 0.0).tolist() == [0, 2, 0]
    uniform = torch.full((4, 10), 0.1)
    assert (classify_with_cutoff(uniform).eq(-1)).all()  # default 0.2 refuses noise (seed 004)
    with pytest.raises(ValueError, match="threshold"):
        classify_with_cutoff(probs, 1.5)


def test_draws_must_match_the_sites():
    model = BayesianMLP(2, [4], 1)
    x = torch.randn(5, 2)
    draws = prior_draws(model, x, 3)
    with pytest.raises(ValueError, match="latent site"):
        posterior_predictive(model, {k: v for k, v in draws.items() if "bias" not in k}, x)
    bad = dict(draws, **{"layers.0.weight": draws["layers.0.weight"][..., :1]})
    with pytest.raises(ValueError, match="shape"):
        posterior_predictive(model, bad, x)
    assert math.isfinite(float(posterior_predictive(model, draws, x).mean.sum()))


def test_classification_report_counts_refusals_and_matches_the_metrics():
    from pyro_sgmcmc.analysis.metrics import (
        accuracy,
        expected_calibration_error,
        negative_log_likelihood,
    )
    from pyro_sgmcmc.analysis.predictive import classification_report

    probs = torch.tensor([[0.9, 0.05, 0.05], [0.3, 0.4, 0.3], [0.1, 0.1, 0.8], [0.5, 0.2, 0.3]])
    y = torch.tensor([0, 2, 2, 1])
    noise = torch.tensor([[0.34, 0.33, 0.33], [0.6, 0.2, 0.2]])
    report = classification_report(probs, y, noise, threshold=0.35)
    assert report["accuracy"] == accuracy(probs, y) == 0.5
    assert report["NLL"] == negative_log_likelihood(probs, y)
    assert report["ECE"] == expected_calibration_error(probs, y)
    assert report["test refused"] == 0.0  # every top probability is >= 0.35
    assert report["noise refused"] == 0.5
    assert "noise refused" not in classification_report(probs, y)
    assert classification_report(probs, y, threshold=0.45)["test refused"] == 0.25
