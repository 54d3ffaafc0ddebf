"""The SVI baseline: exactness on a conjugate model, minibatch ELBO, reproducibility, pruning."""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoNormal
from pyro.infer.autoguide.initialization import init_to_uniform

from pyro_sgmcmc.variational.pruning import format_pruning_table, prune_by_snr, snr_pruning_table
from pyro_sgmcmc.variational.svi import (
    SVIResult,
    fit_svi,
    full_data_negative_elbo,
    minibatch_elbo_loss,
)

PRIOR_SCALE, NOISE = 1.0, 1.0


def conjugate_regression(x, y=None):
    """w ~ N(0, PRIOR_SCALE^2 I), y | w ~ N(x w, NOISE^2): the posterior is Gaussian."""
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), PRIOR_SCALE).to_event(1))
    mean = x @ w
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mean[idx], NOISE), obs=None if y is None else y[idx])


@pytest.fixture(scope="module")
def correlated_data():
    """Two inputs with correlation 0.8, so that mean-field visibly shrinks the variances."""
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(50, 2, generator=generator)
    x = torch.stack([z[:, 0], 0.8 * z[:, 0] + 0.6 * z[:, 1]], dim=-1)
    y = x @ torch.tensor([1.0, -0.5]) + NOISE * torch.randn(50, generator=generator)
    x64, y64 = x.double().numpy(), y.double().numpy()
    precision = np.eye(2) / PRIOR_SCALE**2 + x64.T @ x64 / NOISE**2
    covariance = np.linalg.inv(precision)
    mean = covariance @ x64.T @ y64 / NOISE**2
    return x, y, mean, covariance, precision


def _check_against_exact(result: SVIResult, mean, covariance, precision):
    """Means exact; mean-field sd = 1/sqrt(Lambda_jj) < posterior sd = sqrt(Sigma_jj).

    The tolerance of the means comes from the spread between independent fits (their standard
    error) plus 5% of the posterior sd for the bias left by the final learning rate.
    """
    fits = [result.loc_and_scale(k) for k in range(result.num_fits)]
    locs = np.stack([loc["w"].numpy() for loc, _ in fits])
    scales = np.stack([scale["w"].numpy() for _, scale in fits])
    posterior_sd = np.sqrt(np.diag(covariance))
    standard_error = locs.std(axis=0, ddof=1) / math.sqrt(len(locs))
    error = np.abs(locs.mean(axis=0) - mean)
    assert np.all(error <= 4 * standard_error + 0.05 * posterior_sd), (error, standard_error)
    mean_field_sd = 1 / np.sqrt(np.diag(precision))
    assert np.all(scales < posterior_sd), "mean-field must underestimate the marginal variances"
    np.testing.assert_allclose(scales.mean(axis=0), mean_field_sd, rtol=0.1)
    return locs, scales


def _decay_to(final_lr: float, lr: float, steps: int):
    gamma = (final_lr / lr) ** (1 / steps)
    return lambda optimizer: torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma)


def test_svi_recovers_exact_posterior_mean_on_conjugate_regression(correlated_data):
    x, y, mean, covariance, precision = correlated_data
    steps = 300
    result = fit_svi(
        conjugate_regression,
        x,
        y,
        num_steps=steps,
        batch_size=10,
        learning_rate=0.05,
        lr_scheduler=_decay_to(0.003, 0.05, steps),
        num_fits=2,
        seed=1,
        progress_bar=False,
    )
    _check_against_exact(result, mean, covariance, precision)
    assert result.losses.shape == (2, steps)
    assert result.losses[:, -50:].mean() < result.losses[:, :10].mean()


@pytest.mark.slow
def test_svi_conjugate_regression_long_run(correlated_data):
    x, y, mean, covariance, precision = correlated_data
    steps = 2000
    result = fit_svi(
        conjugate_regression,
        x,
        y,
        num_steps=steps,
        batch_size=10,
        learning_rate=0.05,
        lr_scheduler=_decay_to(0.0005, 0.05, steps),
        num_particles=4,
        num_fits=4,
        seed=2,
        progress_bar=False,
    )
    locs, _ = _check_against_exact(result, mean, covariance, precision)
    np.testing.assert_allclose(
        locs.mean(axis=0), mean, atol=0.02 * np.sqrt(np.diag(covariance)).min()
    )


def _fixed_guide(x, y, seed=0):
    guide = AutoNormal(conjugate_regression, init_scale=0.1)
    guide(x, y)
    with torch.no_grad():
        guide.locs.w_unconstrained.copy_(torch.tensor([1.0, -0.5]))
    return guide


@pytest.mark.parametrize("analytic_kl", [True, False])
def test_minibatch_losses_over_an_epoch_average_to_the_full_data_loss(correlated_data, analytic_kl):
    """With the guide draw held fixed, the mean of L_S over the M disjoint minibatches of an epoch
    is exactly the full-data loss: KL enters once per minibatch with weight 1 (= M x 1/M), the
    likelihood of each minibatch with weight N/B = M."""
    x, y, *_ = correlated_data
    guide = _fixed_guide(x, y)
    batches = torch.randperm(50, generator=torch.Generator().manual_seed(3)).split(10)

    def loss(rows):
        torch.manual_seed(11)  # the same guide draw for every minibatch
        with torch.no_grad():
            return float(
                minibatch_elbo_loss(
                    conjugate_regression, guide, rows, x, y, analytic_kl=analytic_kl
                )
            )

    per_batch = [loss(rows) for rows in batches]
    full = loss(None)
    assert np.mean(per_batch) == pytest.approx(full, rel=1e-5)
    assert np.std(per_batch) > 1e-3 * abs(full), "the minibatches must differ"


def test_minibatch_elbo_is_unbiased_for_the_full_data_elbo(correlated_data):
    """Random minibatches and guide draws: E[L_S] = full-data negative ELBO within 4 std. errors.

    The reference is the exact full-data negative ELBO of the Gaussian model, computed in closed
    form for the fixed guide.
    """
    x, y, *_ = correlated_data
    guide = _fixed_guide(x, y)
    loc = guide.locs.w.detach().double().numpy()
    scale = guide.scales.w.detach().double().numpy()
    x64, y64 = x.double().numpy(), y.double().numpy()
    # E_q log N(y_i | x_i w, s^2) = log N(y_i | x_i mu, s^2) - (x_i^2 . sigma^2) / (2 s^2)
    expected_log_lik = (
        -0.5 * np.log(2 * np.pi * NOISE**2) * len(y64)
        - 0.5 * np.sum((y64 - x64 @ loc) ** 2) / NOISE**2
        - 0.5 * np.sum(x64**2 @ scale**2) / NOISE**2
    )
    kl = np.sum(np.log(PRIOR_SCALE / scale) + (scale**2 + loc**2) / (2 * PRIOR_SCALE**2) - 0.5)
    exact = kl - expected_log_lik
    generator = torch.Generator().manual_seed(4)
    losses = []
    with torch.no_grad():
        for _ in range(400):
            rows = torch.randperm(50, generator=generator)[:10]
            losses.append(float(minibatch_elbo_loss(conjugate_regression, guide, rows, x, y)))
    losses = np.asarray(losses)
    standard_error = losses.std(ddof=1) / math.sqrt(len(losses))
    assert abs(losses.mean() - exact) < 4 * standard_error
    # full_data_negative_elbo averages 200 draws of the guide: 4 of its standard errors.
    result = SVIResult(conjugate_regression, [guide], np.zeros((1, 1)), [0.0], [0], (x, y))
    single = [full_data_negative_elbo(result, num_particles=1) for _ in range(30)]
    tolerance = 4 * np.std(single, ddof=1) / math.sqrt(200)
    assert abs(full_data_negative_elbo(result, num_particles=200) - exact) < tolerance
    # Weighting the KL by 1/M on top of Pyro's N/B scaling would be biased by (1 - 1/M) KL.
    assert (1 - 10 / 50) * kl > 4 * standard_error


def test_fits_are_reproducible_and_independent(correlated_data):
    x, y, *_ = correlated_data
    kwargs = dict(num_steps=20, batch_size=10, learning_rate=0.05, progress_bar=False, num_fits=2)
    first = fit_svi(conjugate_regression, x, y, seed=7, **kwargs)
    second = fit_svi(conjugate_regression, x, y, seed=7, **kwargs)
    np.testing.assert_array_equal(first.losses, second.losses)
    assert not np.array_equal(first.losses[0], first.losses[1])
    assert first.seeds[0] != first.seeds[1]
    loc0, _ = first.loc_and_scale(0)
    loc1, _ = first.loc_and_scale(1)
    assert not torch.equal(loc0["w"], loc1["w"])
    draws = first.sample_posterior(25, seed=1)
    assert draws["w"].shape == (2, 25, 2)
    np.testing.assert_array_equal(draws["w"], first.sample_posterior(25, seed=1)["w"])
    assert first.wall_time > 0 and len(first.wall_times) == 2


def test_zero_learning_rate_schedule_leaves_the_guide_at_its_start(correlated_data):
    x, y, *_ = correlated_data
    result = fit_svi(
        conjugate_regression,
        x,
        y,
        num_steps=5,
        lr_scheduler=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: 0.0),
        init_scale=0.2,
        progress_bar=False,
    )
    loc, scale = result.loc_and_scale()
    # init_to_feasible starts real-valued sites at 0.
    np.testing.assert_array_equal(loc["w"].numpy(), 0.0)
    np.testing.assert_allclose(scale["w"].numpy(), 0.2, rtol=1e-6)


def test_constrained_draws_and_custom_guide():
    def model(x, y=None):
        s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]) as idx:
            pyro.sample("obs", dist.Normal(0.0, s), obs=None if y is None else y[idx])

    x = torch.zeros(30)
    y = 2.0 * torch.randn(30, generator=torch.Generator().manual_seed(0))
    result = fit_svi(model, x, y, num_steps=100, learning_rate=0.05, progress_bar=False)
    draws = result.sample_posterior(50)
    assert (draws["s"] > 0).all() and draws["s"].shape == (1, 50)
    from pyro.infer.autoguide import AutoDelta

    custom = fit_svi(
        model, x, y, num_steps=5, guide_factory=AutoDelta, progress_bar=False, num_fits=2
    )
    assert custom.sample_posterior(3)["s"].shape == (2, 3)
    with pytest.raises(TypeError, match="AutoNormal"):
        custom.loc_and_scale()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_steps": 0}, "num_steps"),
        ({"batch_size": 51}, "batch_size"),
        ({"batch_size": 0}, "batch_size"),
        ({"learning_rate": -1.0}, "learning_rate"),
        ({"num_particles": 0}, "num_particles"),
        ({"num_fits": 0}, "num_fits"),
        ({"init_scale": 0.0}, "init_scale"),
    ],
)
def test_argument_validation(correlated_data, kwargs, match):
    x, y, *_ = correlated_data
    with pytest.raises(ValueError, match=match):
        fit_svi(conjugate_regression, x, y, progress_bar=False, **kwargs)


# ---------------------------------------------------------------------------------------------
# Bayes by Backprop with the scale-mixture prior, and signal-to-noise pruning
# ---------------------------------------------------------------------------------------------
def test_prune_by_snr_removes_the_lowest_ratios():
    locs = {"a": torch.tensor([1.0, -0.1, 3.0]), "b": torch.tensor([[0.5, -2.0]])}
    scales = {"a": torch.tensor([1.0, 1.0, 1.0]), "b": torch.tensor([[0.1, 4.0]])}
    # SNR: a = [1, 0.1, 3], b = [5, 0.5]
    pruned, threshold, removed = prune_by_snr(locs, scales, 0.4)
    assert removed == 2 and threshold == pytest.approx(0.5)
    assert pruned["a"].tolist() == [1.0, 0.0, 3.0]
    assert pruned["b"].tolist() == [[0.5, 0.0]]
    only_b, _, removed_b = prune_by_snr(locs, scales, 0.5, sites=["b"])
    assert removed_b == 1 and torch.equal(only_b["a"], locs["a"])
    with pytest.raises(ValueError, match="fraction"):
        prune_by_snr(locs, scales, 1.5)
    with pytest.raises(ValueError, match="sites"):
        prune_by_snr(locs, scales, 0.5, sites=["c"])


def _blobs(num: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (num,), generator=generator)
    centres = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    return centres[labels] + 0.6 * torch.randn(num, 2, generator=generator), labels


def _mixture_prior(shape):
    try:
        from pyro_sgmcmc.nn.priors import ScaleMixtureNormal
    except ImportError:  # pragma: no cover - the nn package is written in parallel
        pytest.skip("pyro_sgmcmc.nn.priors.ScaleMixtureNormal is not available")
    return ScaleMixtureNormal(0.5, 1.0, math.exp(-6)).expand(shape).to_event(len(shape))


def bbb_classifier(x, y=None, hidden=16):
    """A 2-hidden-3 classifier with the scale-mixture prior of Blundell et al. on every weight."""
    w1 = pyro.sample("w1", _mixture_prior([x.shape[1], hidden]))
    b1 = pyro.sample("b1", _mixture_prior([hidden]))
    w2 = pyro.sample("w2", _mixture_prior([hidden, 3]))
    b2 = pyro.sample("b2", _mixture_prior([3]))
    logits = torch.relu(x @ w1 + b1) @ w2 + b2
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("obs", dist.Categorical(logits=logits[idx]), obs=None if y is None else y[idx])


def _accuracy(params, x, y):
    hidden = torch.relu(x @ params["w1"] + params["b1"])
    return float(((hidden @ params["w2"] + params["b2"]).argmax(-1) == y).float().mean())


def test_bayes_by_backprop_scale_mixture_and_pruning_table():
    x, y = _blobs(300, 0)
    x_test, y_test = _blobs(500, 1)
    result = fit_svi(
        bbb_classifier,
        x,
        y,
        num_steps=300,
        batch_size=50,
        learning_rate=0.03,
        init_scale=0.05,
        init_loc_fn=init_to_uniform(radius=0.5),
        progress_bar=False,
        seed=0,
    )
    locs, scales = result.loc_and_scale()
    rows = snr_pruning_table(
        locs,
        scales,
        lambda params: _accuracy(params, x_test, y_test),
        fractions=(0.0, 0.5, 0.9),
        sites=["w1", "w2"],
    )
    table = format_pruning_table(rows, "accuracy")
    assert len(table.splitlines()) == 4
    assert [r.num_removed for r in rows] == [0, 40, 72]
    # 500 test points: the accuracy has standard error <= 0.023; the Bayes error here is ~1%.
    assert rows[0].score > 0.9
    assert rows[1].score > rows[0].score - 4 * math.sqrt(0.25 / 500)
    assert rows[0].to_dict()["fraction_removed"] == 0.0


@pytest.mark.parametrize("built_local", [False, True])
def test_any_bayesian_mlp_works_whatever_module_local_params_says(built_local):
    """Regression: '_Context' object has no attribute 'param_state'.

    Pyro's PyroModule context creates its local parameter state only when
    ``module_local_params`` is on at construction but checks the setting again at every call.
    SVI (fit, draws, full-data ELBO, export) must work for a model built in either mode and
    called in the other, and leave the caller's setting as it found it.
    """
    from pyro_sgmcmc.analysis.export import to_inference_data
    from pyro_sgmcmc.nn import BayesianMLP

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(30, 2, generator=generator)
    y = x.sum(-1)
    with pyro.settings.context(module_local_params=built_local):
        model = BayesianMLP(2, [4], 1)
    with pyro.settings.context(module_local_params=not built_local):
        result = fit_svi(model, x, y, num_steps=3, batch_size=10, progress_bar=False)
        assert np.isfinite(full_data_negative_elbo(result, num_particles=2))
        idata = to_inference_data(result, model, x, y, num_draws=4)
        assert pyro.settings.get("module_local_params") is (not built_local)
    assert idata.posterior["layers.0.weight"].shape == (1, 4, 4, 2)
    assert pyro.settings.get("module_local_params") is False
