"""An update rule's constants are computed once while a sampler's settings hold, with the same
numbers as when they are computed at every step (``SettingsMemo``, ``sghmc_constants``,
``sgld_constants``, ``psgld_constants``)."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch

import pyro_sgmcmc.dynamics.registry as registry
import pyro_sgmcmc.engine.build as build
from pyro_sgmcmc import PSGLD, SGHMC, SGLD, run_chains
from pyro_sgmcmc.dynamics import (
    psgld_constants,
    psgld_init,
    psgld_step,
    sghmc_constants,
    sghmc_init,
    sghmc_step,
    sgld_constants,
    sgld_init,
    sgld_step,
)
from pyro_sgmcmc.dynamics.metric import DenseMetric
from pyro_sgmcmc.dynamics.registry import SettingsMemo


def test_memo_is_kept_while_the_settings_are_the_same_unmodified_objects():
    memo = SettingsMemo()
    step, diagonal = torch.full((2, 1), 0.1), torch.ones(2, 3)
    first = memo.for_settings(step, 1.0, {"z": diagonal}, None, None)
    first["noise"] = "computed"
    assert memo.for_settings(step, 1.0, {"z": diagonal}, None, None) is first
    assert memo.for_settings(step, 0.5, {"z": diagonal}, None, None) == {}  # another float
    first = memo.for_settings(step, 1.0, {"z": diagonal}, None, None)
    diagonal.mul_(2.0)  # changed in place: its version counter moves on
    assert memo.for_settings(step, 1.0, {"z": diagonal}, None, None) is not first
    kept = memo.for_settings(step, 1.0, {"z": diagonal}, None, None)
    assert memo.for_settings(step.clone(), 1.0, {"z": diagonal}, None, None) is not kept


def test_memo_sees_a_dense_metric_change():
    memo = SettingsMemo()
    metric = DenseMetric.from_matrix(torch.eye(3).expand(2, 3, 3).clone())
    first = memo.for_settings(0.1, 1.0, {"z": metric}, None, None)
    assert memo.for_settings(0.1, 1.0, {"z": metric}, None, None) is first
    metric.root.mul_(0.5)
    assert memo.for_settings(0.1, 1.0, {"z": metric}, None, None) is not first


def _settings():
    """Per-chain steps and frictions, a diagonal preconditioner and a gradient noise per entry,
    as a sampling phase has them."""
    generator = torch.Generator().manual_seed(0)
    shape = (3, 4)

    def draw() -> torch.Tensor:
        return torch.randn(shape, generator=generator)

    state = {"z": draw()}
    return {
        "position": state,
        "gradient": {"z": draw()},
        "noise": {"z": draw()},
        "step": torch.tensor([[1e-3], [2e-3], [5e-4]]),
        "friction": torch.tensor([[0.1], [0.3], [0.05]]),
        "preconditioner": {"z": draw().exp()},
        "beta": {"z": 1e-4 * draw().square()},
        "momentum": {"z": 0.01 * draw()},
    }


def test_sghmc_constants_give_the_same_step():
    s = _settings()
    state = sghmc_init(s["position"], s["momentum"])
    args = (state, s["gradient"], s["step"], s["friction"], 1.0)
    kwargs = {
        "gradient_noise": s["beta"],
        "noise": s["noise"],
        "preconditioner": s["preconditioner"],
    }
    constants = sghmc_constants(
        s["position"], s["step"], s["friction"], 1.0, s["beta"], s["preconditioner"]
    )
    plain = sghmc_step(*args, **kwargs)
    with_constants = sghmc_step(*args, **kwargs, constants=constants)
    assert torch.equal(plain.position["z"], with_constants.position["z"])
    assert torch.equal(plain.momentum["z"], with_constants.momentum["z"])


@pytest.mark.parametrize("integrator", ["euler", "leimkuhler_matthews"])
def test_sgld_constants_give_the_same_step(integrator):
    s = _settings()
    state = sgld_init(s["position"])
    args = (state, s["gradient"], s["step"], 1.0)
    kwargs = {
        "gradient_noise": s["beta"],
        "noise": s["noise"],
        "preconditioner": s["preconditioner"],
        "integrator": integrator,
    }
    constants = sgld_constants(s["position"], s["step"], 1.0, s["beta"], s["preconditioner"])
    plain = sgld_step(*args, **kwargs)
    assert torch.equal(
        plain.position["z"], sgld_step(*args, **kwargs, constants=constants).position["z"]
    )


def test_psgld_constants_give_the_same_step_while_the_average_is_frozen():
    s = _settings()
    average = {"z": s["beta"]["z"] + 1e-3}
    state = psgld_init(s["position"])._replace(square_average=average)
    cap = {"z": torch.full((3, 4), 50.0)}
    args = (state, s["gradient"], s["step"], 1.0)
    kwargs = {"num_data": 100, "noise": s["noise"], "adapt": False, "max_gain": cap,
              "gradient_variance": s["beta"]}  # fmt: skip
    constants = psgld_constants(average, s["step"], 1.0, 1e-5, s["beta"], cap)
    plain = psgld_step(*args, **kwargs)
    assert torch.equal(
        plain.position["z"], psgld_step(*args, **kwargs, constants=constants).position["z"]
    )
    # constants given to an adapting step are not used: its average moves
    adapted = psgld_step(*args, **{**kwargs, "adapt": True})
    given = psgld_step(*args, **{**kwargs, "adapt": True}, constants=constants)
    assert torch.equal(adapted.position["z"], given.position["z"])


def test_constants_of_a_step_without_noise_draw_nothing():
    s = _settings()
    assert sghmc_constants(s["position"], s["step"], 0.1, 0.0, 0.0, None).noise_std is None
    assert sgld_constants(s["position"], 1e-3, 0.0, 0.0, None).noise_std is None


def _regression(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Normal(x @ w, 0.5), obs=y)


def _data():
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(300, 3, generator=generator)
    return x, x @ torch.tensor([1.0, -0.5, 0.2]) + 0.5 * torch.randn(300, generator=generator)


def _draws(kernel_class, num_samples=40):
    x, y = _data()
    pyro.set_rng_seed(1)
    kernel = kernel_class(_regression, batch_size=30, num_steps_per_sample=2)
    result = run_chains(kernel, x, y, num_chains=2, num_samples=num_samples, warmup_steps=200)
    return result.get_samples()["w"]


@pytest.mark.filterwarnings("ignore:run_chains.*not converged")
@pytest.mark.parametrize("kernel_class", [SGHMC, SGLD, PSGLD], ids=["sghmc", "sgld", "psgld"])
@pytest.mark.parametrize("dense", [True, False], ids=["dense", "diagonal"])
def test_memo_keeps_the_draws(kernel_class, dense, monkeypatch):
    if not dense:  # the diagonal preconditioner of larger models
        monkeypatch.setattr(build, "DENSE_LIMIT", 0)
    memoized = _draws(kernel_class)
    monkeypatch.setattr(SettingsMemo, "for_settings", lambda self, *settings: {})
    assert torch.equal(_draws(kernel_class), memoized)


RULE_CONSTANTS = ("sghmc", "sgld", "psgld", "psgld_dense")


@pytest.mark.filterwarnings("ignore:run_chains.*not converged")
@pytest.mark.parametrize("kernel_class", [SGHMC, SGLD, PSGLD], ids=["sghmc", "sgld", "psgld"])
@pytest.mark.parametrize("dense", [True, False], ids=["dense", "diagonal"])
def test_the_rules_computing_their_own_constants_draw_the_same(kernel_class, dense, monkeypatch):
    """Against the rules as they are called without ``constants`` (as before the memo): every
    step computes everything from its arguments."""
    if not dense:
        monkeypatch.setattr(build, "DENSE_LIMIT", 0)
    memoized = _draws(kernel_class)
    derived = registry.StepInputs.derived

    def without_rule_constants(self, name, compute, *depends_on):
        if name in RULE_CONSTANTS:
            return None
        return derived(self, name, compute, *depends_on)

    monkeypatch.setattr(registry.StepInputs, "derived", without_rule_constants)
    assert torch.equal(_draws(kernel_class), memoized)


@pytest.mark.filterwarnings("ignore:run_chains.*not converged")
def test_sghmc_with_its_gradient_noise_estimated_at_every_step_draws_the_same(monkeypatch):
    kernel = SGHMC(_regression, batch_size=30, num_steps_per_sample=2, gradient_noise="estimate")
    x, y = _data()
    pyro.set_rng_seed(1)
    memoized = run_chains(kernel, x, y, num_chains=2, num_samples=20, warmup_steps=100)
    monkeypatch.setattr(SettingsMemo, "for_settings", lambda self, *settings: None)
    pyro.set_rng_seed(1)
    plain = run_chains(kernel, x, y, num_chains=2, num_samples=20, warmup_steps=100)
    assert torch.equal(plain.get_samples()["w"], memoized.get_samples()["w"])


@pytest.mark.filterwarnings("ignore:run_chains.*not converged")
@pytest.mark.parametrize("kernel_class", [SGHMC, SGLD, PSGLD], ids=["sghmc", "sgld", "psgld"])
@pytest.mark.parametrize("dense", [True, False], ids=["dense", "diagonal"])
def test_sampling_computes_the_constants_once(kernel_class, dense, monkeypatch):
    """A longer sampling phase computes the rule's constants no more often."""
    calls = []

    def counted(function):
        def wrapper(*args, **kwargs):
            calls.append(None)
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(registry, "sghmc_constants", counted(sghmc_constants))
    monkeypatch.setattr(registry, "sgld_constants", counted(sgld_constants))
    monkeypatch.setattr(registry, "psgld_constants", counted(psgld_constants))
    if not dense:  # the diagonal preconditioner of larger models
        monkeypatch.setattr(build, "DENSE_LIMIT", 0)
    _draws(kernel_class, num_samples=10)
    short = len(calls)
    _draws(kernel_class, num_samples=60)
    assert short > 0
    assert len(calls) - short == short
