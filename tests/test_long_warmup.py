"""A warm-up of any length: the adaptive control's schedule is finite and well ordered for any
number of warm-up gradient steps, and a long warm-up runs through both drivers.

The descent's ramp once raised ``100 ** (t / 50)`` and overflowed past about 15,400 warm-up
gradient steps (``OverflowError``); these tests pin the schedule at its boundaries for warm-ups
from the minimum to ten million steps, and run more than 200,000 steps (``slow``).
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_sgmcmc import SGHMC, SGLD, run_chains
from pyro_sgmcmc.dynamics.registry import PSGLDOptions, SGHMCOptions, SGLDOptions
from pyro_sgmcmc.engine.adaptation import MINIMUM_WARMUP_STEPS, SCHEDULE, AdaptiveControl

OPTIONS = {"sgld": SGLDOptions(), "sghmc": SGHMCOptions(), "psgld": PSGLDOptions()}


def _boundaries(warmup_steps: int) -> list[int]:
    """Every step where the schedule changes, with its neighbours."""
    marks = {0, 1, 50, warmup_steps}
    for fraction in (SCHEDULE["gibbs"], SCHEDULE["probe"], SCHEDULE["descent"], SCHEDULE["last"],
                     *SCHEDULE["windows"]):  # fmt: skip
        marks.add(int(fraction * warmup_steps))
    steps = {t + d for t in marks for d in (-1, 0, 1, 19, 20, 21)}
    return sorted(t for t in steps if 0 <= t <= warmup_steps)


@pytest.mark.parametrize("algorithm", sorted(OPTIONS))
@pytest.mark.parametrize("warmup_steps", [MINIMUM_WARMUP_STEPS, 101, 15_400, 16_000, 200_000,
                                          10_000_000])  # fmt: skip
def test_descent_ramp_is_finite_and_bounded_for_any_warmup_length(algorithm, warmup_steps):
    control = AdaptiveControl(algorithm, OPTIONS[algorithm], 1.0, 100, warmup_steps,
                              like=torch.zeros(2, 3))  # fmt: skip
    scale = control._descent_scale()
    previous = 0.0
    for t in _boundaries(warmup_steps):
        if t >= control.descent_end:
            break
        step = control.step_size(t)
        assert torch.isfinite(step).all(), (t, step)
        # the ramp climbs from a hundredth of the descent rate to the rate, never beyond
        ratio = float(step.max()) / (scale * float(control.rate.max()))
        # (float32 steps: a relative tolerance of a few float32 epsilons)
        assert 0.01 * (1 - 1e-6) <= ratio <= 1.0 + 1e-6, (t, ratio)
        assert ratio >= previous * (1 - 1e-6), (t, ratio, previous)
        previous = ratio
    assert math.isclose(previous, 1.0, rel_tol=1e-6) or warmup_steps < 100


@pytest.mark.parametrize("algorithm", sorted(OPTIONS))
def test_window_ramp_is_finite_after_every_window_start(algorithm):
    warmup_steps = 1_000_000
    control = AdaptiveControl(algorithm, OPTIONS[algorithm], 1.0, 100, warmup_steps,
                              like=torch.zeros(2, 3))  # fmt: skip
    for start in control.window_ends[:-1]:
        control.window_start = start
        steps = [control.step_size(start + d) for d in (0, 1, 10, 19, 20, 21, 10_000)]
        assert all(torch.isfinite(s).all() for s in steps)
        # a tenth of the step at the window's start, the full step from 20 steps in
        assert torch.allclose(steps[0], 0.1 * control.step)
        assert torch.equal(steps[4], control.step)


def _normal_mean_model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y)


def _data():
    return torch.randn(200, generator=torch.Generator().manual_seed(0)) + 3.0


@pytest.mark.slow
def test_warmup_past_the_old_overflow_runs_in_run_chains():
    """16,000 warm-up gradient steps (1,600 draws x 10): raised ``OverflowError`` before."""
    y = _data()
    kernel = SGLD(_normal_mean_model, batch_size=20, num_steps_per_sample=10, seed=0)
    result = run_chains(kernel, y, num_chains=1, num_samples=50, warmup_steps=1600)
    draws = result.samples["mu"]
    assert torch.isfinite(draws).all()
    # the posterior is N(mean(y), 1/200) nearly exactly (prior sd 10): well within 6 sds
    assert abs(float(draws.mean()) - float(y.mean())) < 6 * 200**-0.5


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["mcmc", "run_chains"])
def test_two_hundred_thousand_warmup_steps(driver):
    y = _data()
    kernel = SGHMC(_normal_mean_model, batch_size=20, num_steps_per_sample=100, seed=0)
    if driver == "mcmc":
        mcmc = MCMC(kernel, num_samples=20, warmup_steps=2000, disable_progbar=True)
        mcmc.run(y)
        draws = mcmc.get_samples()["mu"]
    else:
        result = run_chains(kernel, y, num_chains=1, num_samples=20, warmup_steps=2000)
        draws = result.samples["mu"]
    assert torch.isfinite(draws).all()
    assert abs(float(draws.mean()) - float(y.mean())) < 6 * 200**-0.5


@pytest.mark.slow
def test_a_long_warmup_that_chooses_its_thinning():
    """100,000 warm-up draws of one gradient step each, the thinning chosen by the warm-up: its
    measurement spans the last 24,980 steps of 2 chains, which Pyro's ``effective_sample_size``
    measured with a 12,490 x 12,490 matrix per series (10 GB per chain)."""
    y = _data()
    kernel = SGHMC(_normal_mean_model, batch_size=20, seed=0)
    result = run_chains(kernel, y, num_chains=2, num_samples=50, warmup_steps=100_000)
    for report in result.chain_reports:
        assert report["warmup_gradient_steps"] >= 100_000
        assert math.isfinite(report["autocorrelation_time"])
        chosen = min(100, math.ceil(report["autocorrelation_time"]))  # times the slowdown >= 1
        assert report["num_steps_per_sample"] >= chosen
    draws = result.samples["mu"]
    assert torch.isfinite(draws).all()
    assert abs(float(draws.mean()) - float(y.mean())) < 6 * 200**-0.5
