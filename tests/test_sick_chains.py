"""Sick chains are named: a chain whose fit collapsed during warm-up, coordinates that did not
move during sampling; healthy runs raise neither alarm."""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro_tutorial_models import BayesianRegression

from pyro_sgmcmc import SGHMC, SGLD, run_chains
from pyro_sgmcmc.engine import engine as engine_module
from pyro_sgmcmc.engine import prepare_chains
from pyro_sgmcmc.engine.fit_check import MARGIN, Z, check_fit
from pyro_sgmcmc.engine.fit_recovery import FitRecovery
from pyro_sgmcmc.engine.health import FROZEN, TREND, check_draws, trend_ratios
from pyro_sgmcmc.errors import SamplerWarning
from pyro_sgmcmc.models.structure import inspect_model


def _regression_data(num_data: int = 400, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_data, 3, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 3.0 + 0.5 * torch.randn(num_data, generator=generator)
    return x, y


def _values(weight, bias, sigma):
    """Constrained values of ``BayesianRegression(3)`` for two chains, ``(2, ...)`` per site."""
    return {
        "linear.weight": torch.as_tensor(weight, dtype=torch.float32).reshape(2, 1, 3),
        "linear.bias": torch.as_tensor(bias, dtype=torch.float32).reshape(2, 1),
        "sigma": torch.as_tensor(sigma, dtype=torch.float32).reshape(2),
    }


def _structure(model, x, y):
    pyro.clear_param_store()
    return inspect_model(model, (x, y), {})


def test_a_chain_thrown_to_a_flat_likelihood_is_named_and_a_sampled_one_is_not():
    x, y = _regression_data()
    model = BayesianRegression(3)
    structure = _structure(model, x, y)
    good = [[1.0, -2.0, 0.5], [1.0, -2.0, 0.5]]
    milestones = [("the end of the descent", _values(good, [3.0, 3.0], [0.5, 0.5]))]
    # chain 0: a posterior draw's distance from the best fit; chain 1: noise scale grown to
    # 20 times the residuals' and the fit lost (the issue's stuck chain)
    now = _values([[1.02, -2.01, 0.49], [0.0, 0.0, 0.0]], [3.01, 0.0], [0.51, 9.0])
    messages = check_fit(structure, (x, y), {}, milestones, now, 1.0, [0, 1])
    assert len(messages) == 1
    assert messages[0].startswith("chain 1 fits the training data far worse")
    assert "the end of the descent" in messages[0] and "per row" in messages[0]


def test_the_fit_check_allows_what_sampling_at_the_temperature_costs():
    """A fit worse by less than MARGIN nats per row is never reported."""
    x, y = _regression_data()
    model = BayesianRegression(3)
    structure = _structure(model, x, y)
    weight = [[1.0, -2.0, 0.5], [1.0, -2.0, 0.5]]
    milestones = [("60% of warm-up", _values(weight, [3.0, 3.0], [0.5, 0.5]))]
    # a noise scale 1.4 times too large costs log(1.4) + (1/1.4^2 - 1)/2 = 0.09 nats per row
    now = _values(weight, [3.0, 3.0], [0.7, 0.7])
    assert 0.09 < MARGIN
    assert check_fit(structure, (x, y), {}, milestones, now, 1.0, [0, 1]) == []


def test_a_chain_that_lost_a_few_rows_and_with_them_its_noise_scale_is_named():
    """Two rows far out in the inputs fitted 200 noise sds off (a ReLU unit woken for them,
    issue 27's seed 11) drag the noise scale up six-fold: the plain mean's standard error is
    inflated by those two rows and clears nothing; the winsorised mean sees every other row
    fit worse by 1.3 nats."""
    x, y = _regression_data()
    x[:, 2] = 0.0
    x[:2, 2] = 100.0  # the only rows that feel the third weight
    noise = torch.randn(len(y), generator=torch.Generator().manual_seed(1))
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 3.0 + 0.5 * noise
    model = BayesianRegression(3)
    structure = _structure(model, x, y)
    good = [[1.0, -2.0, 0.5], [1.0, -2.0, 0.5]]
    milestones = [("the end of the descent", _values(good, [3.0, 3.0], [0.5, 0.5]))]
    now = _values([[1.0, -2.0, 0.5], [1.0, -2.0, 2.5]], [3.0, 3.0], [0.5, 3.0])
    messages = check_fit(structure, (x, y), {}, milestones, now, 1.0, [0, 1])
    assert len(messages) == 1 and messages[0].startswith("chain 1 fits the training data")
    # the plain test alone would not have named it
    best = _row_log_likelihood(x, y, [1.0, -2.0, 0.5], 3.0, 0.5)
    worse = best - _row_log_likelihood(x, y, [1.0, -2.0, 2.5], 3.0, 3.0)
    error = float(worse.std()) / len(worse) ** 0.5
    assert float(worse.mean()) - Z * error < MARGIN


def _row_log_likelihood(x, y, weight, bias, sigma):
    return dist.Normal(x @ torch.tensor(weight) + bias, sigma).log_prob(y).double()


def test_frozen_coordinates_are_named_with_their_site_and_value():
    generator = torch.Generator().manual_seed(1)
    draws = {"w": torch.randn(2, 50, 3, 4, generator=generator), "b": torch.randn(2, 50, 4)}
    draws["w"][1, :, 2, 1] = 108.6  # one coordinate of chain 1 never moves
    scales = {"w": torch.ones(2, 3, 4), "b": torch.ones(2, 4)}
    messages = check_draws(draws, None, 1.0, [0, 1], posterior_scales=scales)
    assert len(messages) == 1
    message = messages[0]
    assert message.startswith("chain 1: 1 of 12 coordinates of site 'w' did not move")
    assert "w(2, 1) = 108.6" in message and "in all 50 kept draws" in message
    # a coordinate that moves a tenth of its posterior sd is not frozen; a chain with few
    # draws is not judged
    draws["w"][1, :, 2, 1] = 108.6 + 0.1 * torch.randn(50, generator=generator)
    assert check_draws(draws, None, 1.0, [0, 1], posterior_scales=scales) == []
    few = {name: value[:, :5].clone() for name, value in draws.items()}
    few["w"][1, :, 2, 1] = 108.6
    assert check_draws(few, None, 1.0, [0, 1], posterior_scales=scales) == []
    assert FROZEN < 0.1 / 50


def test_a_chain_that_did_not_move_at_all_gets_one_message():
    draws = {"w": torch.zeros(1, 20, 3)}
    messages = check_draws(draws, None, 1.0, [0], posterior_scales={"w": torch.ones(1, 3)})
    assert len(messages) == 1 and "did not move during sampling (largest" in messages[0]


def _autoregressive(num_draws: int, rho: float, generator: torch.Generator) -> torch.Tensor:
    """A stationary AR(1) series of unit variance with lag-one autocorrelation ``rho``."""
    noise = torch.randn(num_draws, generator=generator, dtype=torch.float64)
    series = torch.empty(num_draws, dtype=torch.float64)
    series[0] = noise[0]
    for s in range(1, num_draws):
        series[s] = rho * series[s - 1] + (1 - rho**2) ** 0.5 * noise[s]
    return series


def test_a_scalar_site_still_trending_is_named_and_a_stationary_one_is_not():
    generator = torch.Generator().manual_seed(3)
    # chain 0 stationary (autocorrelation 0.5); chain 1 the log noise precision of the
    # 12,000-row SGHMC run that was still fitting: 2.16 -> 2.53 with draw-to-draw jitter 0.02
    stationary = 2.7 + 0.1 * _autoregressive(100, 0.5, generator)
    drifting = torch.linspace(2.09, 2.56, 100, dtype=torch.float64)
    drifting = drifting + 0.02 * torch.randn(100, generator=generator, dtype=torch.float64)
    draws = {
        "noise_precision": torch.stack([stationary, drifting]).float(),
        # a network's weights drift in every run (hidden units wander): not judged
        "w": torch.linspace(0, 5, 100).expand(2, 3, 100).movedim(-1, 1).contiguous(),
    }
    ratios = trend_ratios(draws)
    assert set(ratios) == {"noise_precision"}
    ratio_stationary, ratio_drifting = ratios["noise_precision"][2].tolist()
    assert ratio_stationary < 2 < TREND < ratio_drifting
    messages = check_draws(draws, None, 1.0, [4, 5])
    assert len(messages) == 1
    assert messages[0].startswith("chain 5 is still trending: site 'noise_precision' moved")
    first, last, ratio = ratios["noise_precision"][:, 1].tolist()
    assert abs(first - 2.15) < 0.02 and abs(last - 2.5) < 0.02
    assert (
        f"mean of {first:.4g} over the first quarter of its kept draws to {last:.4g}"
        in (messages[0])
    )
    assert f"{ratio:.0f} times its draw-to-draw fluctuation" in messages[0]
    # too few draws to tell (fewer than five per quarter)
    # in a network only the sites of shape () are judged: its output bias (one element) is not
    # identified, and drifts in healthy chains
    bias = {"layers.1.bias": draws["noise_precision"].unsqueeze(-1)}
    assert len(check_draws(bias, None, 1.0, [4, 5])) == 1
    assert check_draws(bias, None, 1.0, [4, 5], network=True) == []
    assert len(check_draws(draws, None, 1.0, [4, 5], network=True)) == 1
    few = {"noise_precision": draws["noise_precision"][:, :19]}
    assert check_draws(few, None, 1.0, [4, 5]) == []


def test_a_slowly_mixing_stationary_chain_is_not_called_trending():
    generator = torch.Generator().manual_seed(4)
    # autocorrelation time 19 draws in a run of 200: slow, stationary, not trending
    series = torch.stack([_autoregressive(200, 0.9, generator) for _ in range(8)])
    ratios = trend_ratios({"sigma": series.float()})["sigma"][2]
    assert float(ratios.max()) < TREND / 2


def _normal_mean(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])


@pytest.mark.parametrize("step_size", [2e-5, None], ids=["creeping", "adaptive"])
def test_a_run_still_on_its_way_warns_that_it_is_trending_and_a_sampled_one_does_not(step_size):
    y = 3.0 + torch.randn(200, generator=torch.Generator().manual_seed(1))
    kernel = SGLD(_normal_mean, batch_size=50, num_steps_per_sample=5, seed=0, step_size=step_size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_chains(kernel, y, num_chains=2, num_samples=40, target_ess=None,
                   warmup_steps=100 if step_size is None else 10)  # fmt: skip
    trending = [str(w.message) for w in caught if "is still trending" in str(w.message)]
    if step_size is None:
        assert trending == []
    else:  # a step 50 times too small creeps from the prior's start towards mu ~ 3
        expected = [f"chain {c} is still trending: site 'mu'" for c in (0, 1)]
        assert [m[:36] for m in trending] == expected


@pytest.mark.parametrize("kernel", [SGLD, SGHMC], ids=lambda k: k.__name__)
def test_a_chain_moved_off_its_fit_at_the_end_of_warmup_is_named(kernel, monkeypatch):
    """End to end: the warm-up keeps its milestones; a healthy chain raises no alarm, the
    same chain moved to where it fits nothing (every weight 0, sigma 5) is named. (The
    warm-up is not lengthened here: SGHMC's 60 draws measure its thinning over fewer than 20
    autocorrelation times.)"""
    monkeypatch.setattr(engine_module, "LONGEST_WARMUP", 1)
    x, y = _regression_data()
    pyro.clear_param_store()
    sampler = kernel(BayesianRegression(3), batch_size=50, seed=3)
    chains = prepare_chains(sampler.settings, sampler.rule, sampler.options, sampler.model,
                            (x, y), {}, chains=[0, 1], warmup_draws=60)  # fmt: skip
    engine = chains.engine
    for _ in range(60):
        engine.draw()
    labels = [label for label, _, _ in engine.control.milestones]
    assert labels == ["the end of the descent", "60% of warm-up", "75% of warm-up"]
    assert chains.warmup_messages((x, y), {}) == []
    moved = engine.position.clone()
    moved[1] = 0.0
    engine.start(moved, engine.fixed)
    messages = chains.warmup_messages((x, y), {})
    assert len(messages) == 1 and messages[0].startswith("chain 1 fits the training data")


def heteroscedastic_network(x, y=None):
    """A network with an input-dependent noise scale: its mode over-fits, the posterior
    does not; the fit check must not mistake one for the other."""
    hidden = 16
    w1 = pyro.sample("w1", dist.Normal(0.0, 1.0).expand([1, hidden]).to_event(2))
    b1 = pyro.sample("b1", dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
    w2 = pyro.sample("w2", dist.Normal(0.0, 1.0).expand([hidden, 2]).to_event(2))
    features = torch.tanh(x @ w1 + b1)
    out = features @ w2
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(out[..., 0], out[..., 1].exp() + 1e-3), obs=y)


def test_a_heteroscedastic_network_raises_no_fit_alarm():
    generator = torch.Generator().manual_seed(4)
    x = torch.rand(300, 1, generator=generator) * 6 - 3
    y = torch.sin(x[:, 0]) + (0.05 + 0.3 * x[:, 0].abs()) * torch.randn(300, generator=generator)
    pyro.clear_param_store()
    mcmc = MCMC(SGHMC(heteroscedastic_network, batch_size=32, seed=5), 20, warmup_steps=100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(x, y)
    assert not _sick_chain_alarms(caught)


def _sick_chain_alarms(caught) -> list[str]:
    return [
        str(w.message)
        for w in caught
        if issubclass(w.category, SamplerWarning)
        and (
            "fits the training data far worse" in str(w.message) or "did not move" in str(w.message)
        )
    ]


def test_the_dense_sums_of_a_diverged_chain_go_back_to_the_window_start():
    from pyro_sgmcmc.engine.dense import DenseAdaptation

    dense = DenseAdaptation(torch.zeros(2, 3))
    dense.add_noise(torch.ones(2, 3))
    kept = dense.kept()
    dense.add_noise(1e6 * torch.ones(2, 3))  # a cascade's probe, in both chains
    dense.restore(kept, torch.tensor([[True], [False]]))
    assert torch.equal(dense.noise_sum[0], kept[1][0])
    assert float(dense.noise_sum[1].max()) > 1e11


# ---------------------------------------------------------------------- sending a chain back
def test_fit_recovery_sends_back_exactly_the_chains_whose_potential_rose_beyond_sampling():
    """Three chains over the descent's last quarter and the first window's: one sampling (its
    potential up by a few nats, as T D/2 says), one collapsed (up by a nat per row), one up by
    just under the bound: only the second is sent back, to the end of the descent."""
    recovery = FitRecovery([400, 480, 600, 800], num_chains=3, dimension=8, num_data=100,
                           temperature=1.0)  # fmt: skip
    assert recovery.segment_starts[:2] == [300, 460]  # the last quarters
    bound = 1.0 * (4 + 10 * 2.0) + 0.5 * 100  # T (D/2 + 10 sqrt(D/2)) + N/2 = 74
    assert recovery.allowed == pytest.approx(bound)
    for t in range(1, 481):
        level = torch.full((3,), 500.0 + (1.0 if t % 2 else -1.0), dtype=torch.float64)
        if t > 400:
            level += torch.tensor([4.0, 100.0, bound - 5.0], dtype=torch.float64)
        recovery.observe(t, level)
        if t == 400:
            assert recovery.collapsed(t) is None  # nothing earlier to compare with
            recovery.keep()
    found = recovery.collapsed(480)
    assert found is not None
    mask, best = found
    assert mask.tolist() == [False, True, False] and int(best[1]) == 0
    recovery.keep()
    ((chain, t, now, then, index),) = recovery.returns
    assert (chain, t, index) == (1, 480, 0) and now - then == pytest.approx(100.0, abs=1e-9)
    line = recovery.report(["the end of the descent", "60% of warm-up"], [7, 8, 9])[0]
    assert line.startswith("chain 8 left the posterior during warm-up")
    assert "put back where it was at the end of the descent and warmed up again" in line


def test_a_chain_whose_units_were_started_afresh_is_not_sent_back_to_before():
    """Chains moved on purpose (units started afresh) forget their milestones: the same
    collapse that sends chain 1 back is not judged for chain 0."""
    recovery = FitRecovery([400, 480, 600, 800], num_chains=2, dimension=8, num_data=100,
                           temperature=1.0)  # fmt: skip
    for t in range(301, 481):
        recovery.observe(
            t, torch.full((2,), 500.0 + (200.0 if t > 400 else 0.0), dtype=torch.float64)
        )
        if t == 400:
            recovery.collapsed(t)
            recovery.keep()
            recovery.forget(torch.tensor([True, False]))
    mask, _ = recovery.collapsed(480)
    assert mask.tolist() == [False, True]


def test_fit_recovery_needs_enough_steps_and_skips_a_checkpoint_without_levels():
    recovery = FitRecovery([4, 5, 6, 8], num_chains=1, dimension=2, num_data=10,
                           temperature=1.0)  # fmt: skip
    for t in range(1, 6):
        recovery.observe(t, torch.tensor([1e6 if t == 5 else 0.0]))
        if t in (4, 5):
            assert recovery.collapsed(t) is None  # one or two steps per segment: not judged
            recovery.keep()
    recovery.load_state_dict(None)  # a checkpoint written before recovery existed
    recovery.observe(6, torch.tensor([1e9]))
    assert recovery.collapsed(6) is None and recovery.returns == []


def _hold_chain_one_off_its_fit(kernel, x, y, before_the_window_ends=None):
    """Two chains warming up; chain 1 is held where it fits nothing (every weight 0, sigma 5)
    over the first window's last quarter, until that window ends."""
    pyro.clear_param_store()
    sampler = kernel(BayesianRegression(3), batch_size=50, seed=3)
    chains = prepare_chains(sampler.settings, sampler.rule, sampler.options, sampler.model,
                            (x, y), {}, chains=[0, 1], warmup_draws=60)  # fmt: skip
    engine, control = chains.engine, chains.engine.control
    stuck = torch.tensor([False, True])
    window_end = control.window_ends[1]
    while engine.t < window_end:
        if engine.t >= control.recovery.segment_starts[1]:
            moved = engine.position.clone()
            moved[1] = 0.0
            engine.return_to(stuck, moved, engine.fixed)
        if engine.t == window_end - 1 and before_the_window_ends is not None:
            before_the_window_ends(control)
        engine.step()
    return chains


@pytest.mark.parametrize("kernel", [SGLD, SGHMC])
def test_a_chain_stuck_off_its_fit_in_the_first_window_is_sent_back_to_the_descent_end(kernel):
    """End to end: chain 1 is held where it fits nothing (every weight 0, sigma 5) over the
    first window's last quarter; at the window's end it is put back where the descent left it
    (its milestone); chain 0 is left alone, and warm-up says what happened."""
    x, y = _regression_data()
    chains = _hold_chain_one_off_its_fit(kernel, x, y)
    engine, control = chains.engine, chains.engine.control
    _, descent_end, _ = control.milestones[0]
    assert torch.equal(engine.position[1], descent_end[1])
    assert not torch.equal(engine.position[0], descent_end[0])
    assert [c for c, *_ in control.recovery.returns] == [1]
    while engine.t < control.window_ends[-1]:
        engine.step()
    messages = chains.warmup_messages((x, y), {})
    assert any(m.startswith("chain 1 left the posterior during warm-up") for m in messages)


def test_a_healthy_warmup_sends_no_chain_back():
    x, y = _regression_data()
    pyro.clear_param_store()
    sampler = SGHMC(BayesianRegression(3), batch_size=50, seed=3)
    chains = prepare_chains(sampler.settings, sampler.rule, sampler.options, sampler.model,
                            (x, y), {}, chains=[0, 1, 2, 3], warmup_draws=60)  # fmt: skip
    for _ in range(60):
        chains.engine.draw()
    assert chains.engine.control.recovery.returns == []


@pytest.mark.parametrize("diverged", [False, True])
def test_a_chain_sent_back_keeps_the_window_measurements_unless_it_diverged(diverged):
    """A chain that heated up without diverging was stepping too far for where sampling took
    it (tutorial 6's digits network: steps measured at an over-fitted mode, where the
    likelihood is flat): it goes back with the window's measurements, which shrink its step,
    or the same steps would send it off again. One that diverged drops them (a runaway
    cascade's probes would freeze it)."""
    start = []

    def before_the_window_ends(control):
        start.extend(s.clone() for s in control.window_start_sums[:3])
        control.window_diverged[1] = diverged

    x, y = _regression_data()
    chains = _hold_chain_one_off_its_fit(SGHMC, x, y, before_the_window_ends)
    control = chains.engine.control
    assert [c for c, *_ in control.recovery.returns] == [1]
    halved = [0.5 * s[1] for s in start]  # the window-start sums, decayed at the window end
    kept = [control.noise_sum[1], control.curvature_sum[1], control.probes[1]]
    assert all(torch.equal(a, b) for a, b in zip(kept, halved, strict=True)) == diverged
