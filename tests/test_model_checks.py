"""What the kernels say about a model before and after sampling: a prior that cannot draw is
refused by name, and a correct posterior of a model without inputs raises no alarm."""

from __future__ import annotations

import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from stats_helpers import assert_mean_close

from pyro_sgmcmc import SGHMC, SGLD, ModelContractError, run_chains
from pyro_sgmcmc.engine import engine as engine_module


def improper_location(y):
    mu = pyro.sample("mu", dist.ImproperUniform(dist.constraints.real, (), ()))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])


def dirichlet_categorical(y):
    probs = pyro.sample("probs", dist.Dirichlet(torch.ones(3)))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Categorical(probs), obs=y[idx])


def test_a_prior_that_cannot_draw_is_named_with_what_works():
    y = torch.randn(20)
    with pytest.raises(ModelContractError) as caught:
        run_chains(SGLD(improper_location, batch_size=5), y, num_samples=5, warmup_steps=10)
    message = str(caught.value)
    assert "'mu'" in message and "ImproperUniform" in message
    assert "proper prior" in message and "Check that the data match" not in message


def test_a_model_error_elsewhere_keeps_the_data_message():
    def broken(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        raise NotImplementedError("not written yet")
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y)  # pragma: no cover

    with pytest.raises(ModelContractError, match="Check that the data match the model"):
        run_chains(SGLD(broken, batch_size=5), torch.randn(20), num_samples=5, warmup_steps=10)


@pytest.mark.parametrize("kernel", [SGLD, SGHMC], ids=lambda k: k.__name__)
def test_a_categorical_model_without_inputs_raises_no_alarm(kernel):
    """The classifier check (accuracy no better than the most frequent class) is for networks;
    a model whose class probabilities are the same for every row predicts the most frequent
    class by construction, and its posterior Dirichlet(1 + counts) is sampled correctly."""
    generator = torch.Generator().manual_seed(0)
    y = torch.multinomial(torch.tensor([0.2, 0.5, 0.3]), 300, True, generator=generator)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_chains(kernel(dirichlet_categorical, batch_size=50, seed=0), y,
                            num_chains=2, num_samples=200, warmup_steps=50)  # fmt: skip
    alarms = [str(w.message) for w in caught if "most frequent class" in str(w.message)]
    assert not alarms, alarms
    counts = torch.bincount(y, minlength=3).double().numpy()
    exact = (1.0 + counts) / (3.0 + counts.sum())
    draws = result.samples["probs"].double().numpy()
    assert_mean_close(draws, exact, z=4.0)
    assert np.all(np.abs(draws.reshape(-1, 3).mean(0) - exact) < 0.03)


def change_point(y):
    """A change point that enters the likelihood only through a comparison."""
    tau = pyro.sample("tau", dist.Uniform(0.0, 1.0))
    early = pyro.sample("early", dist.Gamma(2.0, 0.5))
    late = pyro.sample("late", dist.Gamma(2.0, 0.5))
    unused = pyro.sample("unused", dist.Normal(0.0, 1.0))  # noqa: F841 (its posterior: its prior)
    with pyro.plate("data", y.shape[0]) as idx:
        rate = torch.where(idx < tau * y.shape[0], early, late)
        pyro.sample("obs", dist.Poisson(rate), obs=y[idx])


def smooth_change_point(y):
    """The same with a sigmoid switch: the gradient sees tau."""
    tau = pyro.sample("tau", dist.Uniform(0.0, 1.0))
    early = pyro.sample("early", dist.Gamma(2.0, 0.5))
    late = pyro.sample("late", dist.Gamma(2.0, 0.5))
    with pyro.plate("data", y.shape[0]) as idx:
        weight = torch.sigmoid((tau * y.shape[0] - idx) / 2.0)
        pyro.sample("obs", dist.Poisson(weight * early + (1 - weight) * late), obs=y[idx])


@pytest.fixture(scope="module", params=[100, 3000], ids=lambda n: f"{n}_rows")
def counts(request):
    """Counts whose rate changes at 40% of the rows (3,000 rows: more than the check reads)."""
    generator = torch.Generator().manual_seed(0)
    early = int(0.4 * request.param)
    return torch.cat([
        torch.poisson(torch.full((early,), 2.0), generator=generator),
        torch.poisson(torch.full((request.param - early,), 6.0), generator=generator),
    ])  # fmt: skip


@pytest.fixture
def no_lengthening(monkeypatch):
    """The checks below are made at set-up: the warm-up is not lengthened (the blind site's
    random walk under its prior mixes slowly, and the run would go on 8 times longer)."""
    monkeypatch.setattr(engine_module, "LONGEST_WARMUP", 1)


def _setup_warnings(model, counts):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_chains(SGLD(model, batch_size=20, seed=0), counts, num_samples=2, warmup_steps=20)
    return [str(w.message) for w in caught if "gradient with respect to it" in str(w.message)]


def test_a_site_the_gradient_cannot_see_is_named_with_the_reason(counts, no_lengthening):
    messages = _setup_warnings(change_point, counts)
    assert len(messages) == 1, messages  # tau only: not the rates, not the unused site
    assert messages[0].startswith("latent site 'tau'")
    assert "no Metropolis correction" in messages[0] and "NUTS" in messages[0]


def test_a_smooth_switch_is_not_flagged(counts, no_lengthening):
    assert _setup_warnings(smooth_change_point, counts) == []
