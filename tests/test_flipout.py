"""Local reparameterisation and Flipout for the SVI baseline (pyro_sgmcmc.variational.flipout).

Statistical checks use replicate draws on a fixed guide and minibatch: the estimators must agree
in expectation (z-tests with standard errors from the replicates) and the per-example estimators
must have a clearly smaller gradient variance than one weight draw per minibatch.
"""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoDiagonalNormal, AutoNormal

from pyro_sgmcmc.analysis import _arviz
from pyro_sgmcmc.analysis.export import to_inference_data
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision, NormalLikelihood, ScaleMixturePrior
from pyro_sgmcmc.variational.flipout import (
    ESTIMATORS,
    autonormal_loc_and_scale,
    guide_negative_elbo,
    mean_field_negative_elbo,
    sample_preactivations,
)
from pyro_sgmcmc.variational.pruning import prune_by_snr
from pyro_sgmcmc.variational.svi import fit_svi, minibatch_elbo_loss

#: Two-sided z threshold of every equality test; with the ~30 tests in this file the chance of a
#: false alarm is below 1e-3.
Z = 4.5


@pytest.fixture(autouse=True)
def _one_thread():
    """Small matrices: one thread avoids contention on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _classification_data(num_rows: int, num_features: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_rows, num_features, generator=generator)
    y = (x[:, :3] + 0.5 * torch.randn(num_rows, 3, generator=generator)).argmax(-1)
    return x, y


def _random_guide(model, x, y, seed: int = 0, log_scale_mean: float = -1.5) -> AutoNormal:
    """An AutoNormal guide with random means and scales (a guide in mid-training)."""
    guide = AutoNormal(model)
    guide(x, y)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in guide.locs.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=generator))
        for p in guide.scales.parameters():
            p.copy_(log_scale_mean + 0.3 * torch.randn(p.shape, generator=generator))
    return guide


def _replicates(loss_fn, params, num_replicates: int, directions: torch.Tensor):
    """Per replicate: the loss, the gradient projected on ``directions``, and the gradient."""
    scalars, grads = [], []
    for _ in range(num_replicates):
        loss = loss_fn()
        grad = torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)])
        scalars.append(torch.cat([loss.detach().reshape(1), directions @ grad]))
        grads.append(grad)
    return torch.stack(scalars).double(), torch.stack(grads).double()


def _z_scores(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    se = (a.var(0) / a.shape[0] + b.var(0) / b.shape[0]).sqrt()
    return (a.mean(0) - b.mean(0)) / se


MODELS = {
    "normal-prior-categorical": lambda: BayesianMLP(4, [12], 3, likelihood="categorical"),
    "scale-mixture-gamma-noise": lambda: BayesianMLP(
        4,
        [8],
        1,
        prior=ScaleMixturePrior(0.5, 1.0, 0.2),
        likelihood=NormalLikelihood(precision=GammaPrecision(3.0, 3.0)),
    ),
    "cold-likelihood-categorical": lambda: BayesianMLP(
        4, [12], 3, likelihood="categorical", likelihood_temperature=0.5
    ),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_estimators_agree_with_pyro_in_expectation(name):
    """E[loss] and E[gradient] (projected on 4 random directions) equal Pyro's ELBO's.

    The reference is Pyro's TraceMeanField_ELBO on the conditioned model (closed-form KL for the
    Normal prior, Monte Carlo for the scale mixture and the Gamma noise precision). The last
    assertion shows the test's power: scales 50% larger change the expected loss by many
    standard errors.
    """
    x, y = _classification_data(96, 4)
    model = MODELS[name]()
    if not model.head.is_classifier:
        y = x[:, 0] - x[:, 1] + 0.3 * torch.randn(96, generator=torch.Generator().manual_seed(1))
    guide = _random_guide(model, x, y)
    params = list(guide.parameters())
    subsample = torch.randperm(96, generator=torch.Generator().manual_seed(2))[:24]
    num_params = sum(p.numel() for p in params)
    directions = torch.randn(4, num_params, generator=torch.Generator().manual_seed(3))
    directions /= directions.norm(dim=1, keepdim=True)

    def ours(estimator, scale_factor=1.0):
        def loss():
            loc, scale, supports = autonormal_loc_and_scale(guide)
            scale = {k: v * scale_factor for k, v in scale.items()}
            return mean_field_negative_elbo(
                model, loc, scale, x, y, subsample, estimator=estimator, supports=supports
            )

        return loss

    def pyro_loss():
        return minibatch_elbo_loss(model, guide, subsample, x, y)

    reference, _ = _replicates(pyro_loss, params, 300, directions)
    for estimator in ESTIMATORS:
        stats, _ = _replicates(ours(estimator), params, 400, directions)
        z = _z_scores(stats, reference)
        assert z.abs().max() < Z, (estimator, z)
    if "cold" in name:  # the weight 1/T is applied: the untempered ELBO is far away
        untempered = BayesianMLP(4, [12], 3, likelihood="categorical")
        plain, _ = _replicates(
            lambda: minibatch_elbo_loss(untempered, guide, subsample, x, y), params, 300, directions
        )
        assert _z_scores(plain, reference).abs().max() > Z
        return
    wider, _ = _replicates(ours("flipout", 1.5), params, 400, directions)
    assert _z_scores(wider, reference).abs().max() > Z


def test_flipout_and_local_reparameterisation_lower_the_gradient_variance():
    """Total variance of the gradient over all guide parameters, 256 examples per minibatch.

    V = E||g - E g||^2 is estimated from R replicates by the mean of d_r = ||g_r - mean g||^2;
    its standard error is sd(d_r)/sqrt(R). Required: V_plain - V_other exceeds Z combined
    standard errors, and the ratio is below 1/2 (measured: about 0.06 for local
    reparameterisation and 0.09 for Flipout on this network).
    """
    x, y = _classification_data(1024, 8)
    model = BayesianMLP(8, [32], 3, likelihood="categorical")
    guide = _random_guide(model, x, y)
    params = list(guide.parameters())
    subsample = torch.randperm(1024, generator=torch.Generator().manual_seed(2))[:256]
    none = torch.zeros(0, sum(p.numel() for p in params))
    variance = {}
    for estimator in ESTIMATORS:

        def loss(estimator=estimator):
            return guide_negative_elbo(model, guide, x, y, subsample, estimator=estimator)

        _, grads = _replicates(loss, params, 150, none)
        d = (grads - grads.mean(0)).square().sum(1)
        variance[estimator] = (d.mean().item(), d.std().item() / math.sqrt(len(d)))
    plain, plain_se = variance["reparameterization"]
    for estimator in ("local_reparameterization", "flipout"):
        value, se = variance[estimator]
        assert plain - value > Z * math.hypot(plain_se, se), (estimator, variance)
        assert value / plain < 0.5, (estimator, variance)


def test_preactivations_have_the_marginal_of_a_weight_draw():
    """Mean and variance of a_n per example equal M h_n + m and Sigma^2 h_n^2 + s^2."""
    generator = torch.Generator().manual_seed(0)
    h = torch.randn(5, 3, generator=generator)
    w_loc, w_scale = torch.randn(2, 3, generator=generator), torch.rand(2, 3, generator=generator)
    b_loc, b_scale = torch.randn(2, generator=generator), torch.rand(2, generator=generator)
    mean = h @ w_loc.T + b_loc
    var = h.square() @ w_scale.square().T + b_scale.square()
    draws = 20000
    for estimator in ESTIMATORS:
        a = torch.stack(
            [
                sample_preactivations(h, w_loc, w_scale, b_loc, b_scale, estimator, generator)
                for _ in range(draws)
            ]
        ).double()
        z_mean = (a.mean(0) - mean) / (var / draws).sqrt()
        # the sample variance of a Gaussian has standard error var * sqrt(2 / (n - 1))
        z_var = (a.var(0) - var) / (var * math.sqrt(2 / (draws - 1)))
        assert z_mean.abs().max() < Z and z_var.abs().max() < Z, estimator


def test_flipout_decorrelates_examples_in_a_minibatch():
    """Two identical inputs: one shared draw gives equal outputs, Flipout and LRT do not."""
    generator = torch.Generator().manual_seed(0)
    h = torch.randn(1, 4, generator=generator).expand(2, 4)
    w_loc, w_scale = torch.zeros(3, 4), torch.ones(3, 4)
    b_loc, b_scale = torch.zeros(3), torch.full((3,), 1e-3)
    samples = {
        e: torch.stack(
            [
                sample_preactivations(h, w_loc, w_scale, b_loc, b_scale, e, generator)
                for _ in range(2000)
            ]
        )
        for e in ESTIMATORS
    }
    plain = samples["reparameterization"]
    # rows of one float32 matmul: equal up to the order of its sums (values up to about 11)
    assert torch.allclose(plain[:, 0], plain[:, 1], atol=1e-5)
    for estimator in ("local_reparameterization", "flipout"):
        a = samples[estimator]
        corr = np.corrcoef(a[:, 0, 0].numpy(), a[:, 1, 0].numpy())[0, 1]
        assert abs(corr) < Z / math.sqrt(2000), (estimator, corr)


@pytest.mark.parametrize("estimator", ["local_reparameterization", "flipout"])
def test_fit_svi_with_estimator_trains_the_usual_guide(estimator):
    """Same guide parameters as plain SVI: sampling, export and pruning work unchanged."""
    x, y = _classification_data(200, 4)
    model = BayesianMLP(4, [16], 3, likelihood="categorical")
    kwargs = dict(num_steps=150, batch_size=50, learning_rate=0.03, progress_bar=False, seed=4)
    result = fit_svi(model, x, y, estimator=estimator, **kwargs)
    again = fit_svi(model, x, y, estimator=estimator, **kwargs)
    np.testing.assert_array_equal(result.losses, again.losses)
    assert result.losses[0, -20:].mean() < 0.7 * result.losses[0, :20].mean()
    draws = result.sample_posterior(5, seed=0)
    assert draws["layers.0.weight"].shape == (1, 5, 16, 4)
    idata = to_inference_data(result, model, x, y, num_draws=5)
    assert _arviz.has_group(idata, "log_likelihood")
    assert idata.posterior.attrs["svi_estimator"] == estimator == result.estimator
    locs, scales = result.loc_and_scale()
    pruned, _, removed = prune_by_snr(locs, scales, 0.5)
    assert removed == math.ceil(0.5 * sum(v.numel() for v in locs.values()))
    assert (pruned["layers.0.weight"] == 0).any()


def test_fit_svi_estimators_reach_similar_accuracy():
    x, y = _classification_data(300, 4)
    accuracy = {}
    for estimator in ESTIMATORS:
        model = BayesianMLP(4, [16], 3, likelihood="categorical")
        result = fit_svi(
            model,
            x,
            y,
            estimator=estimator,
            num_steps=300,
            batch_size=60,
            learning_rate=0.03,
            progress_bar=False,
            seed=1,
        )
        loc, _ = result.loc_and_scale()
        probs = model.functional_forward(loc, x).softmax(-1)
        accuracy[estimator] = (probs.argmax(-1) == y).double().mean().item()
    assert min(accuracy.values()) > 0.75, accuracy


def _regression_model(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("obs", dist.Normal((x @ w)[idx], 1.0), obs=None if y is None else y[idx])


def test_bad_arguments_are_refused_naming_the_argument():
    x, y = _classification_data(20, 4)
    model = BayesianMLP(4, [5], 3, likelihood="categorical")
    with pytest.raises(ValueError, match="estimator must be one of"):
        fit_svi(model, x, y, num_steps=1, estimator="flip", progress_bar=False)
    with pytest.raises(TypeError, match=r"model to be a pyro_sgmcmc\.nn\.BayesianMLP"):
        fit_svi(_regression_model, x, y.float(), num_steps=1, estimator="flipout")
    with pytest.raises(ValueError, match="guide_factory must be None"):
        fit_svi(model, x, y, num_steps=1, estimator="flipout", guide_factory=AutoDiagonalNormal)
    guide = AutoNormal(model)
    with pytest.raises(ValueError, match="call guide"):
        autonormal_loc_and_scale(guide)
    with pytest.raises(TypeError, match="guide must be"):
        autonormal_loc_and_scale(AutoDiagonalNormal(model))
    guide(x, y)
    loc, scale, _ = autonormal_loc_and_scale(guide)
    with pytest.raises(ValueError, match="num_particles"):
        mean_field_negative_elbo(model, loc, scale, x, y, num_particles=0)
    with pytest.raises(ValueError, match="estimator must be one of"):
        mean_field_negative_elbo(model, loc, scale, x, y, estimator="lrt")
    with pytest.raises(ValueError, match="y must be given"):
        mean_field_negative_elbo(model, loc, scale, x, None)
    with pytest.raises(ValueError, match="loc and scale must hold"):
        mean_field_negative_elbo(model, {}, scale, x, y)
    with pytest.raises(TypeError, match=r"model must be a pyro_sgmcmc\.nn\.BayesianMLP"):
        mean_field_negative_elbo(_regression_model, loc, scale, x, y)
    noisy = BayesianMLP(4, [5], 1, likelihood=NormalLikelihood(precision=GammaPrecision(1, 1)))
    noisy_guide = AutoNormal(noisy)
    noisy_guide(x, x[:, 0])
    loc, scale, _ = autonormal_loc_and_scale(noisy_guide)
    with pytest.raises(ValueError, match=r"supports must give.*noise_precision"):
        mean_field_negative_elbo(noisy, loc, scale, x, x[:, 0])
