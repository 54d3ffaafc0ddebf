"""Gibbs updates of Gamma precisions: exact conditionals, detection, and use inside SG-MCMC."""

from __future__ import annotations

import math

import arviz as az
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS

from pyro_sgmcmc import SGLD
from pyro_sgmcmc.models.conjugate import (
    NormalGammaPrecisionUpdate,
    NormalNoisePrecisionUpdate,
    find_normal_gamma_updates,
)
from pyro_sgmcmc.models.gibbs import GibbsUpdate
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision, NormalLikelihood


def gamma_moment_test(draws: torch.Tensor, concentration: float, rate: float) -> None:
    """Mean and variance of i.i.d. draws against Gamma(concentration, rate), 4.5 standard errors.

    Var of the sample mean is k/r^2/M; var of the sample variance is about
    (mu4 - sigma^4)/M with mu4 = 3 sigma^4 (1 + 2/k) for a Gamma.
    """
    num = draws.numel()
    draws = draws.double()
    mean, var = concentration / rate, concentration / rate**2
    assert abs(float(draws.mean()) - mean) < 4.5 * math.sqrt(var / num)
    mu4 = 3 * var**2 * (1 + 2 / concentration)
    assert abs(float(draws.var()) - var) < 4.5 * math.sqrt((mu4 - var**2) / num)


def test_weight_precision_draws_match_the_exact_conditional():
    generator = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(7, 5, generator=generator) * 0.4, torch.randn(6, generator=generator)
    alpha, beta = 2.0, 3.0
    update = NormalGammaPrecisionUpdate("lam", ["w1", "w2"], alpha, beta)
    assert isinstance(update, GibbsUpdate)
    params = {"w1": w1, "w2": w2, "lam": torch.tensor(1.0)}
    draws = torch.stack([update.sample(params, generator)["lam"] for _ in range(1500)])
    n = 41
    sum_of_squares = float(w1.square().sum() + w2.square().sum())
    gamma_moment_test(draws, alpha + n / 2, beta + sum_of_squares / 2)
    # The moments differ enough that a conditional using n instead of n/2 would fail the test.
    wrong_mean = (alpha + n) / (beta + sum_of_squares / 2)
    right = (alpha + n / 2) / (beta + sum_of_squares / 2)
    assert abs(wrong_mean - right) > 20 * math.sqrt(right / (beta + sum_of_squares / 2) / 1500)
    assert draws.dtype == torch.float32 and draws.shape == (1500,)


def test_noise_precision_draws_match_the_exact_conditional_in_chunks():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(103, 2, generator=generator)
    y = x @ torch.tensor([1.0, -0.5]) + 0.3 * torch.randn(103, generator=generator)

    def residuals(params, rows, x, y):
        return y[rows] - x[rows] @ params["w"]

    update = NormalNoisePrecisionUpdate(
        "tau", 1.5, 0.5, residuals, lambda x, y: x.shape[0], chunk_size=10
    )
    params = {"w": torch.tensor([0.9, -0.4]), "tau": torch.tensor(1.0)}
    sum_of_squares = float((y - x @ params["w"]).square().sum())
    gamma = update.conditional(params, x, y)
    assert float(gamma.concentration) == pytest.approx(1.5 + 103 / 2)
    # float32 residuals: the conditional sums their squares in float64 chunks, the reference
    # in one float32 sum
    assert float(gamma.rate) == pytest.approx(0.5 + sum_of_squares / 2, rel=1e-5)
    draws = torch.stack([update.sample(params, generator, x, y)["tau"] for _ in range(1500)])
    gamma_moment_test(draws, 1.5 + 103 / 2, 0.5 + sum_of_squares / 2)


def test_draws_come_only_from_the_generator():
    update = NormalGammaPrecisionUpdate("lam", ["w"], 1.0, 1.0)
    params = {"w": torch.ones(3), "lam": torch.tensor(1.0)}
    torch.manual_seed(5)
    state = torch.random.get_rng_state()
    a = update.sample(params, torch.Generator().manual_seed(9))["lam"]
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.manual_seed(123)
    b = update.sample(params, torch.Generator().manual_seed(9))["lam"]
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "factory, message",
    [
        (lambda: NormalGammaPrecisionUpdate("", ["w"], 1.0, 1.0), "precision_site"),
        (lambda: NormalGammaPrecisionUpdate("lam", [], 1.0, 1.0), "weight_sites"),
        (lambda: NormalGammaPrecisionUpdate("lam", ["lam"], 1.0, 1.0), "weight_sites"),
        (lambda: NormalGammaPrecisionUpdate("lam", ["w"], 0.0, 1.0), "alpha"),
        (lambda: NormalGammaPrecisionUpdate("lam", ["w"], 1.0, -1.0), "beta"),
        (
            lambda: NormalNoisePrecisionUpdate(
                "tau", 1.0, 1.0, lambda *a: None, lambda *a: 1, likelihood_weight=0.0
            ),
            "likelihood_weight must be > 0",
        ),
    ],
)
def test_update_validation(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


def test_bayesian_mlp_declares_its_conjugate_pairs():
    model = BayesianMLP(
        3,
        [4],
        1,
        likelihood=NormalLikelihood(precision=GammaPrecision(2.0, 0.5)),
        prior=GammaPrecision(1.5, 2.5),
    )
    updates = model.gibbs_updates()
    weight_updates = [u for u in updates if isinstance(u, NormalGammaPrecisionUpdate)]
    assert [(u.precision_site, u.weight_sites) for u in weight_updates] == [
        ("layers.0.weight_precision", ("layers.0.weight",)),
        ("layers.0.bias_precision", ("layers.0.bias",)),
        ("layers.1.weight_precision", ("layers.1.weight",)),
        ("layers.1.bias_precision", ("layers.1.bias",)),
    ]
    assert all((u.alpha, u.beta) == (1.5, 2.5) for u in weight_updates)
    (noise,) = [u for u in updates if isinstance(u, NormalNoisePrecisionUpdate)]
    assert (noise.precision_site, noise.alpha, noise.beta) == ("noise_precision", 2.0, 0.5)
    # Its residuals agree with the model's own forward pass.
    x, y = torch.randn(9, 3), torch.randn(9)
    pyro.set_rng_seed(0)
    trace = pyro.poutine.trace(model).get_trace(x, y)
    params = {n: trace.nodes[n]["value"] for n in model.latent_sites}
    assert torch.allclose(
        noise.residuals(params, slice(0, 9), x, y), y - trace.nodes["output"]["value"].squeeze(-1)
    )
    assert BayesianMLP(3, [4], 1).gibbs_updates() == []


def test_find_normal_gamma_updates_on_a_hand_written_model():
    def model(x, y=None):
        lam = pyro.sample("lam", dist.Gamma(2.0, 1.0))
        w = pyro.sample("w", dist.Normal(0.0, lam.rsqrt()).expand([3]).to_event(1))
        b = pyro.sample("b", dist.Normal(0.0, lam.rsqrt()))
        tau = pyro.sample("tau", dist.Gamma(1.0, 1.0))  # noise precision: not a weight prior
        other = pyro.sample("other", dist.Gamma(3.0, 1.0))  # used as a Normal *mean*: skipped
        c = pyro.sample("c", dist.Normal(other, 1.0))
        with pyro.plate("data", x.shape[0]) as idx:
            mu = x[idx] @ w + b + c
            pyro.sample("obs", dist.Normal(mu, tau.rsqrt()), obs=None if y is None else y[idx])

    x, y = torch.randn(10, 3), torch.randn(10)
    updates = find_normal_gamma_updates(model, x, y)
    assert [(u.precision_site, u.weight_sites, u.alpha, u.beta) for u in updates] == [
        ("lam", ("w", "b"), 2.0, 1.0)
    ]


# A conjugate hierarchical model: y_jk ~ N(w_j, 1), w_j ~ N(0, 1/lam), lam ~ Gamma(a, b). The
# marginal posterior of lam is one-dimensional,
#   p(lam | y) ∝ Gamma(lam | a, b) prod_j N(ybar_j | 0, 1/lam + 1/m),
# which a quadrature on a fine grid gives to high accuracy.
ALPHA, BETA, NUM_GROUPS, PER_GROUP = 2.0, 1.0, 8, 4


def hierarchical_data(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    groups = torch.arange(NUM_GROUPS).repeat_interleave(PER_GROUP)
    w_true = torch.randn(NUM_GROUPS, generator=generator) * 0.8
    y = w_true[groups] + torch.randn(groups.shape[0], generator=generator)
    return groups, y


def hierarchical_model(groups, y=None):
    lam = pyro.sample("lam", dist.Gamma(ALPHA, BETA))
    w = pyro.sample("w", dist.Normal(0.0, lam.rsqrt()).expand([NUM_GROUPS]).to_event(1))
    with pyro.plate("data", groups.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(w[groups[idx]], 1.0), obs=None if y is None else y[idx])


def exact_precision_posterior_mean(groups, y) -> float:
    ybar = torch.stack([y[groups == j].mean() for j in range(NUM_GROUPS)]).double()
    log_lam = torch.linspace(-8, 5, 20001, dtype=torch.float64)
    lam = log_lam.exp()
    var = 1 / lam.unsqueeze(-1) + 1 / PER_GROUP
    log_post = (
        dist.Gamma(torch.tensor(ALPHA).double(), torch.tensor(BETA).double()).log_prob(lam)
        + log_lam  # the grid is uniform in log lam
        + (-0.5 * ybar.square() / var - 0.5 * var.log()).sum(-1)
    )
    weights = torch.softmax(log_post, dim=0)
    return float((weights * lam).sum())


def run_sgld_with_gibbs(groups, y, num_samples, seed, step_size):
    updates = find_normal_gamma_updates(hierarchical_model, groups, y)
    assert [u.precision_site for u in updates] == ["lam"]
    kernel = SGLD(
        hierarchical_model,
        step_size=step_size,
        batch_size=16,
        gibbs_updates=updates,
        gibbs_every=1,
        seed=seed,
    )
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=200, disable_progbar=True)
    mcmc.run(groups, y)
    return mcmc.get_samples()["lam"]


def z_score(draws: torch.Tensor, reference: float) -> float:
    ess = float(az.ess(draws.double().numpy()[None, :]))
    mcse = float(draws.double().std()) / math.sqrt(ess)
    return abs(float(draws.double().mean()) - reference) / mcse


def test_sgld_with_gibbs_recovers_the_precision_posterior_quick():
    groups, y = hierarchical_data()
    exact = exact_precision_posterior_mean(groups, y)
    draws = run_sgld_with_gibbs(groups, y, num_samples=1500, seed=1, step_size=2e-3)
    assert z_score(draws, exact) < 4.0, (float(draws.mean()), exact)


@pytest.mark.slow
def test_sgld_with_gibbs_matches_long_nuts():
    groups, y = hierarchical_data(seed=3)
    exact = exact_precision_posterior_mean(groups, y)
    pyro.set_rng_seed(0)
    nuts = MCMC(NUTS(hierarchical_model), num_samples=6000, warmup_steps=1000, disable_progbar=True)
    nuts.run(groups, y)
    nuts_lam = nuts.get_samples()["lam"]
    assert z_score(nuts_lam, exact) < 4.0  # the reference itself is right
    draws = run_sgld_with_gibbs(groups, y, num_samples=20000, seed=2, step_size=1e-3)
    ess_nuts = float(az.ess(nuts_lam.double().numpy()[None, :]))
    ess_sgld = float(az.ess(draws.double().numpy()[None, :]))
    se = math.sqrt(
        float(nuts_lam.double().var()) / ess_nuts + float(draws.double().var()) / ess_sgld
    )
    assert abs(float(draws.mean()) - float(nuts_lam.mean())) < 4 * se
    assert abs(float(draws.std()) - float(nuts_lam.std())) < 0.1 * float(nuts_lam.std())


def test_tempered_precision_draws_match_the_tempered_conditional():
    """At temperature T the precision is drawn from Gamma((a - 1)/T + 1, b/T), where
    Gamma(a, b) is the T = 1 conditional: moments within 4.5 standard errors."""
    from pyro_sgmcmc.models.conjugate import NormalGammaPrecisionUpdate

    weights = torch.linspace(-1.0, 1.0, 40)
    update = NormalGammaPrecisionUpdate("tau", ("w",), alpha=2.0, beta=1.0)
    assert update.supports_temperature
    a = 2.0 + 20.0
    b = 1.0 + 0.5 * float(weights.square().sum())
    temperature = 0.25
    shape, rate = (a - 1.0) / temperature + 1.0, b / temperature
    generator = torch.Generator().manual_seed(0)
    params = {"w": weights, "tau": torch.tensor(1.0)}
    draws = torch.stack(
        [update.sample(params, generator, temperature=temperature)["tau"] for _ in range(4000)]
    ).double()
    mean, var = shape / rate, shape / rate**2
    assert abs(float(draws.mean()) - mean) < 4.5 * (var / 4000) ** 0.5
    # sd of the sample variance of a Gamma: sqrt((m4 - var^2) / n), m4 = 3 var^2 (1 + 2 / shape)
    m4 = 3 * var**2 * (1 + 2 / shape)
    assert abs(float(draws.var()) - var) < 4.5 * ((m4 - var**2) / 4000) ** 0.5
    with pytest.raises(ValueError, match="temperature must be > 0"):
        update.sample(params, generator, temperature=0.0)
