"""The learnable scale-mixture prior (empirical Bayes) and the random initial locations of fit_svi.

The learnable prior is checked three ways: the plain-torch BayesianMLP loss agrees with Pyro's ELBO
on the model with the substituted prior in expectation, gradients of the prior parameters included
(z-tests from replicate draws); maximising the ELBO over the prior recovers the mixture that
generated the weights; and every wrong use is refused naming the argument.
"""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoNormal
from pyro.infer.autoguide.initialization import init_to_feasible

from pyro_sgmcmc.models.initialization import init_to_fan_in
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision, NormalLikelihood
from pyro_sgmcmc.variational.flipout import (
    ESTIMATORS,
    autonormal_loc_and_scale,
    guide_negative_elbo,
)
from pyro_sgmcmc.variational.svi import (
    LearnableScaleMixturePrior,
    _SubstitutePrior,
    fit_svi,
    full_data_negative_elbo,
    minibatch_elbo_loss,
)

#: Two-sided z threshold; with the ~10 z-tests here a false alarm has probability below 1e-4.
Z = 4.5


def _regression_data(num_rows: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_rows, 3, generator=generator)
    y = torch.tanh(x[:, 0]) - 0.5 * x[:, 1] + 0.2 * torch.randn(num_rows, generator=generator)
    return x, y


def _random_guide(model, x, y, seed: int = 0) -> AutoNormal:
    guide = AutoNormal(model)
    guide(x, y)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in guide.locs.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=generator))
        for p in guide.scales.parameters():
            p.copy_(-1.5 + 0.3 * torch.randn(p.shape, generator=generator))
    return guide


def _replicates(loss_fn, params, directions, num_replicates):
    rows = []
    for _ in range(num_replicates):
        loss = loss_fn()
        grad = torch.cat([g.flatten() for g in torch.autograd.grad(loss, params)])
        rows.append(torch.cat([loss.detach().reshape(1), directions @ grad]))
    return torch.stack(rows).double()


def _z(a, b):
    return (a.mean(0) - b.mean(0)) / (a.var(0) / len(a) + b.var(0) / len(b)).sqrt()


def test_fast_loss_with_learnable_prior_agrees_with_pyro_in_expectation():
    """Loss and gradient (guide and prior parameters, on 4 random directions) agree with Pyro's
    TraceMeanField_ELBO on the model whose weight prior is the learnable mixture."""
    x, y = _regression_data(64)
    model = BayesianMLP(3, [6], 1, likelihood=NormalLikelihood(precision=GammaPrecision(2.0, 1.0)))
    guide = _random_guide(model, x, y)
    prior = LearnableScaleMixturePrior(0.3, 1.5, 0.2).new_parameters()
    sites = LearnableScaleMixturePrior().resolve_sites(
        model, pyro.poutine.trace(model).get_trace(x)
    )
    assert sites == ("layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias")
    params = [*guide.parameters(), *prior.parameters()]
    num = sum(p.numel() for p in params)
    directions = torch.randn(4, num, generator=torch.Generator().manual_seed(1))
    directions /= directions.norm(dim=1, keepdim=True)
    # the prior's own gradient must be tested, not only the guide's: one direction on it alone
    directions[0] = 0.0
    directions[0, -3:] = 1.0 / math.sqrt(3)
    subsample = torch.randperm(64, generator=torch.Generator().manual_seed(2))[:16]
    substituted = _SubstitutePrior(sites, prior)(model)
    reference = _replicates(
        lambda: minibatch_elbo_loss(substituted, guide, subsample, x, y), params, directions, 300
    )
    for estimator in ESTIMATORS:
        ours = _replicates(
            lambda e=estimator: guide_negative_elbo(
                model, guide, x, y, subsample, estimator=e, prior=prior
            ),
            params,
            directions,
            200,
        )
        assert _z(ours, reference).abs().max() < Z, estimator
    # power: another value of the prior parameters is many standard errors away
    other = LearnableScaleMixturePrior(0.3, 1.5, 0.6).new_parameters()
    moved = _replicates(
        lambda: guide_negative_elbo(model, guide, x, y, subsample, prior=other),
        [*guide.parameters(), *other.parameters()],
        directions,
        200,
    )
    assert _z(moved, reference).abs().max() > Z


def test_empirical_bayes_recovers_the_mixture_that_generated_the_weights():
    """Each of D weights is observed 4 times with noise 0.02: q(w) is nearly a point at the
    weight, so maximising the ELBO over psi is maximum likelihood of the mixture on the weights.
    Tolerances: 4 standard errors of that estimate (pi: sqrt(pi (1 - pi) / D) ~ 0.015) plus the
    small shrinkage of q's own variance (0.01^2 against sigma_2^2 = 0.05^2)."""
    num_weights, slab_fraction = 1000, 0.3
    generator = torch.Generator().manual_seed(0)
    slab = torch.rand(num_weights, generator=generator) < slab_fraction
    weights = torch.where(
        slab,
        2.0 * torch.randn(num_weights, generator=generator),
        0.05 * torch.randn(num_weights, generator=generator),
    )
    y = weights + 0.02 * torch.randn(4, num_weights, generator=generator)

    def model(y):
        w = pyro.sample("w", dist.Normal(torch.zeros(num_weights), 1.0).to_event(1))
        with pyro.plate("data", y.shape[0]) as idx:
            pyro.sample("obs", dist.Normal(w, 0.02).to_event(1), obs=y[idx])

    result = fit_svi(
        model,
        y,
        num_steps=600,
        learning_rate=0.05,
        prior=LearnableScaleMixturePrior(0.5, 1.0, 0.5),
        progress_bar=False,
    )
    (fitted,) = result.prior_values()
    assert result.prior_sites == ("w",)
    assert abs(fitted["mixture_weight"] - float(slab.float().mean())) < 0.06
    assert fitted["scale1"] == pytest.approx(2.0, rel=0.15)
    assert fitted["scale2"] == pytest.approx(0.05, rel=0.2)
    # the fitted prior is the one the full-data ELBO uses
    elbo_fitted = full_data_negative_elbo(result, num_particles=20)
    with torch.no_grad():
        own = minibatch_elbo_loss(model, result.guide, None, y, num_particles=20)
    assert elbo_fitted < float(own) - 100.0


def test_fit_with_learnable_prior_on_a_bayesian_mlp():
    x, y = _regression_data(48)
    model = BayesianMLP(3, [5], 1, likelihood=NormalLikelihood(scale=0.3))
    result = fit_svi(
        model,
        x,
        y,
        num_steps=60,
        learning_rate=0.05,
        prior="learnable_scale_mixture",
        num_fits=2,
        progress_bar=False,
    )
    values = result.prior_values()
    assert len(values) == 2 and values[0] != values[1]
    assert values[0] != {"mixture_weight": 0.2, "scale1": 1.0, "scale2": 0.1}
    assert np.isfinite(result.losses).all()
    trace = pyro.poutine.trace(result.fitted_model(1)).get_trace(x, y)
    prior = trace.nodes["layers.0.weight"]["fn"].base_dist
    assert torch.allclose(prior.scale1.detach(), torch.tensor(values[1]["scale1"]))
    assert fit_svi(model, x, y, num_steps=2, progress_bar=False).prior_values() is None


@pytest.mark.parametrize(
    ("prior", "error", "match"),
    [
        ("mixture", ValueError, "prior must be None.*'learnable_scale_mixture'"),
        (3, TypeError, "prior must be None.*got int"),
        (LearnableScaleMixturePrior(sites=["nope"]), ValueError, "names \\['nope'\\].*w, s|nope"),
        (LearnableScaleMixturePrior(sites=["s"]), ValueError, "support is not the real line"),
    ],
)
def test_wrong_learnable_priors_are_refused(prior, error, match):
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]) as idx:
            pyro.sample("obs", dist.Normal((x @ w)[idx], s), obs=None if y is None else y[idx])

    x, y = _regression_data(20)
    with pytest.raises(error, match=match):
        fit_svi(model, x, y, num_steps=2, prior=prior, progress_bar=False)


def test_learnable_prior_refuses_a_hierarchical_bayesian_mlp_and_bad_values():
    x, y = _regression_data(20)
    model = BayesianMLP(3, [4], 1, prior=GammaPrecision(1.0, 1.0))
    with pytest.raises(ValueError, match="GammaPrecision"):
        fit_svi(model, x, y, num_steps=2, prior="learnable_scale_mixture", progress_bar=False)
    with pytest.raises(ValueError, match=r"mixture_weight must lie in \(0.0, 1.0\)"):
        LearnableScaleMixturePrior(mixture_weight=1.0)
    with pytest.raises(ValueError, match="scale2 must be > 0"):
        LearnableScaleMixturePrior(scale2=0.0)
    with pytest.raises(TypeError, match="sites must be a list"):
        LearnableScaleMixturePrior(sites="w")


# ---------------------------------------------------------------------------------------------
# initial locations
# ---------------------------------------------------------------------------------------------
def test_init_to_fan_in_draws_weights_with_variance_one_over_fan_in():
    """Uniform on +-sqrt(3/d): variance 1/d. The sample variance of n values has standard error
    (1/d) sqrt(0.8/n) (fourth moment of a uniform: 9/5 sigma^4); biases and noise start feasible."""
    model = BayesianMLP(4, [200], 3, likelihood=NormalLikelihood(precision=GammaPrecision(2, 1)))
    x = torch.randn(10, 4)
    guide = AutoNormal(model, init_loc_fn=init_to_fan_in())
    guide(x)
    locs = {name: value.detach() for name, value in autonormal_loc_and_scale(guide)[0].items()}
    first, second = locs["layers.0.weight"], locs["layers.1.weight"]
    for values, fan_in in ((first, 4), (second, 200)):
        bound = math.sqrt(3 / fan_in)
        assert values.abs().max() <= bound
        n = values.numel()
        assert float(values.var()) == pytest.approx(
            1 / fan_in, abs=4.5 * math.sqrt(0.8 / n) / fan_in
        )
    assert len({tuple(row.tolist()) for row in first}) == 200  # no two hidden units alike
    assert torch.equal(locs["layers.0.bias"], torch.zeros(200))
    assert float(locs["noise_precision"]) == 0.0  # log-precision 0: precision 1


def test_fits_start_from_seeded_distinct_locations():
    x, y = _regression_data(30)
    model = BayesianMLP(3, [8], 1)
    zero_steps = lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: 0.0)  # noqa: E731
    first = fit_svi(
        model, x, y, num_steps=1, lr_scheduler=zero_steps, num_fits=2, seed=4, progress_bar=False
    )
    again = fit_svi(
        model, x, y, num_steps=1, lr_scheduler=zero_steps, num_fits=2, seed=4, progress_bar=False
    )
    loc0, scale0 = first.loc_and_scale(0)
    loc1, _ = first.loc_and_scale(1)
    assert torch.equal(loc0["layers.0.weight"], again.loc_and_scale(0)[0]["layers.0.weight"])
    assert not torch.equal(loc0["layers.0.weight"], loc1["layers.0.weight"])
    np.testing.assert_allclose(scale0["layers.0.weight"].numpy(), 0.01, rtol=1e-5)


@pytest.mark.slow
def test_random_start_fits_where_the_all_zero_start_stays_flat():
    """A 1-10-10-1 tanh network with the noise fixed at its true 0.14 on 32 points of
    sin(1.86 x): from init_to_feasible (every location 0) the fits stay at the flat, symmetric
    solution (RMSE of the posterior mean against the curve ~0.22 for every seed measured), from
    init_to_fan_in they fit it (0.08-0.23, mostly ~0.1)."""
    x = torch.linspace(-1.7, 1.7, 32).unsqueeze(-1)
    curve = lambda v: torch.sin(1.86 * v).squeeze(-1)  # noqa: E731
    y = curve(x) + 0.14 * torch.randn(32, generator=torch.Generator().manual_seed(0))
    grid = torch.linspace(-1.6, 1.6, 101).unsqueeze(-1)
    model = BayesianMLP(1, [10, 10], 1, likelihood=NormalLikelihood(scale=0.14))

    def error(init_loc_fn, seed):
        result = fit_svi(
            model,
            x,
            y,
            num_steps=1000,
            learning_rate=0.03,
            estimator="local_reparameterization",
            init_loc_fn=init_loc_fn,
            seed=seed,
            progress_bar=False,
        )
        draws = {k: v[0] for k, v in result.sample_posterior(100, seed=1).items()}
        mean = model.functional_forward(draws, grid).mean(0).squeeze(-1)
        return float((mean - curve(grid)).square().mean().sqrt())

    random_start = [error(init_to_fan_in(), seed) for seed in range(4)]
    zero_start = [error(init_to_feasible, seed) for seed in range(4)]
    assert min(zero_start) > 0.19
    assert np.median(random_start) < 0.15
