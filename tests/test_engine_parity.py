"""One engine, two drivers: ``run_chains`` and ``pyro.infer.MCMC`` give the same draws.

Chain ``c`` of ``run_chains(kernel, ..., num_chains=C)`` must equal chain ``c`` of
``MCMC(kernel, num_chains=C)`` draw for draw (``torch.equal``), for every update rule, with
minibatches, Gibbs-updated sites and divergences; and every option of a kernel must work with
both drivers (or be refused, at construction, with one message).
"""

from __future__ import annotations

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.infer.autoguide import init_to_median, init_to_sample

from pyro_sgmcmc import PSGLD, SGHMC, SGLD, ConstantSGD, SamplerDivergedError, run_chains, schedules
from pyro_sgmcmc.models.conjugate import NormalGammaPrecisionUpdate
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision

KERNELS = {"sgld": SGLD, "sghmc": SGHMC, "psgld": PSGLD, "constant_sgd": ConstantSGD}
NUM_CHAINS, NUM_SAMPLES, WARMUP = 3, 6, 4


@pytest.fixture(autouse=True)
def float64():
    """Bitwise comparisons in double precision (BayesianMLP's priors take the default dtype)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def divergent_schedule(t: int) -> float:
    """A small step, except for two steps so large that the position overflows to infinity."""
    return 1e300 if t in (9, 21) else 1e-3


def hierarchical(y):
    """``tau ~ Gamma``, ``mu ~ N(0, 1/sqrt(tau))``, ``s ~ HalfNormal``, ``y ~ N(mu, s)``: a
    Normal-Gamma pair found by the Gibbs discovery, and a constrained site (trace path)."""
    tau = pyro.sample("tau", dist.Gamma(2.0, 1.0))
    mu = pyro.sample("mu", dist.Normal(0.0, tau.rsqrt()))
    s = pyro.sample("s", dist.HalfNormal(2.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mu, s), obs=y[idx])


def data(model_name: str):
    generator = torch.Generator().manual_seed(0)
    if model_name == "hierarchical":
        y = 1.0 + 0.5 * torch.randn(60, generator=generator, dtype=torch.float64)
        return hierarchical, (y,)
    x = torch.randn(40, 2, generator=generator, dtype=torch.float64)
    y = torch.sin(x[:, 0]) + 0.1 * torch.randn(40, generator=generator, dtype=torch.float64)
    return BayesianMLP(2, [5], 1, prior=GammaPrecision(2.0, 1.0)), (x, y)


def kernel_for(name: str, model, **options):
    options.setdefault("step_size", divergent_schedule)
    options.setdefault("batch_size", 10)
    options.setdefault("seed", 7)
    options.setdefault("num_steps_per_sample", 3)
    if name == "sghmc":
        options.setdefault("friction", 0.3)
    return KERNELS[name](model, **options)


def both_drivers(make_kernel, args, num_chains=NUM_CHAINS, **run_options):
    """The runs of the two drivers; if one raises SamplerDivergedError, both must, alike."""
    errors = []
    try:
        outcome = _both_drivers(make_kernel, args, num_chains, **run_options)
    except SamplerDivergedError as error:
        errors.append(error)
    try:
        _both_drivers(make_kernel, args, num_chains, swap=True, **run_options)
    except SamplerDivergedError as error:
        errors.append(error)
    if not errors:
        return outcome
    assert len(errors) == 2, "only one driver gave up"
    by_mcmc, by_chains = errors
    # MCMC runs its chains one after the other and stops at the first that gives up
    assert by_mcmc.iteration == by_chains.iteration
    assert by_mcmc.chains == by_chains.chains[:1]
    for error in errors:
        assert f"divergent steps in a row up to step {by_mcmc.iteration} " in str(error)
    raise by_mcmc


def _both_drivers(make_kernel, args, num_chains, swap=False, **run_options):
    """MCMC then run_chains (or, with ``swap``, only run_chains: each raises on its own)."""
    if swap:
        return run_chains(
            make_kernel(), *args, num_chains=num_chains, num_samples=NUM_SAMPLES,
            warmup_steps=WARMUP, **run_options,
        )  # fmt: skip
    mcmc = MCMC(
        make_kernel(),
        num_samples=NUM_SAMPLES,
        warmup_steps=WARMUP,
        num_chains=num_chains,
        disable_progbar=True,
        mp_context=None,
        **run_options,
    )
    mcmc.run(*args)
    return mcmc, _both_drivers(make_kernel, args, num_chains, swap=True, **run_options)


def assert_same_draws(mcmc, result) -> None:
    by_chain = mcmc.get_samples(group_by_chain=True)
    assert set(by_chain) == set(result.samples)
    for name, draws in by_chain.items():
        assert torch.equal(draws, result.samples[name]), name
    diagnostics = mcmc.diagnostics()
    for c in range(result.num_chains):
        flagged = np.flatnonzero(result.sample_stats["diverging"][c]).tolist()
        assert diagnostics["divergences"][f"chain {c}"] == flagged
        step_sizes = diagnostics["step_size"][f"chain {c}"].numpy()
        np.testing.assert_array_equal(step_sizes, result.sample_stats["step_size"][c])
        lp = -diagnostics["potential_energy"][f"chain {c}"].numpy()
        np.testing.assert_array_equal(lp, result.sample_stats["lp"][c])


@pytest.mark.parametrize("model_name", ["hierarchical", "bnn"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_chain_c_of_run_chains_is_chain_c_of_mcmc(name, model_name):
    model, args = data(model_name)
    mcmc, result = both_drivers(lambda: kernel_for(name, model), args)
    assert_same_draws(mcmc, result)
    # the run had minibatches, Gibbs-updated sites and divergences in every chain
    gibbs_site = "tau" if model_name == "hierarchical" else "layers.0.weight_precision"
    precisions = result.samples[gibbs_site]
    assert not torch.equal(precisions[:, 0], precisions[:, -1])
    assert all(len(steps) >= 1 for steps in result.divergent_steps)
    assert all(torch.isfinite(v).all() for v in result.samples.values())


# ----------------------------------------------------------------------------- every option
def _option_cases():
    """(kernel, option, value): each option set to a valid non-default value."""
    common = {
        "learning_rate": 0.05,
        "num_steps_per_sample": 2,
        "temperature": 0.5,
        "init_strategy": init_to_sample,
        "gibbs_updates": None,
        "gibbs_every": 2,
        "potential": "trace",
        "max_consecutive_divergences": 3,
        "batch_sampling": "independent",
        "keep_draws": False,
        "control_variate": True,
        "centre_iterations": 5,
        "chunk_size": 17,
        "transforms": {"tau": torch.distributions.transforms.ExpTransform().inv},
        "subsample_plate": "data",
    }
    specific = {
        "sgld": {},
        "sghmc": {
            "friction": 0.7,
            "gradient_noise": "estimate",
            "gradient_noise_decay": 0.9,
            "resample_momentum_every": 4,
            "momentum_persistence": 0.5,
        },
        "psgld": {"decay": 0.9, "epsilon": 1e-3},
        "constant_sgd": {
            "optimal_rate": False,
            "preconditioner": "diagonal",
            "rate_multiplier": 2.0,
        },
    }
    cases = []
    for name in sorted(KERNELS):
        for option, value in {**common, **specific[name]}.items():
            if name == "constant_sgd" and option in ("temperature", "control_variate"):
                continue  # refused by ConstantSGD (test_constant_sgd_and_refresh.py)
            cases.append(pytest.param(name, option, value, id=f"{name}-{option}"))
    return cases


@pytest.mark.parametrize(("name", "option", "value"), _option_cases())
def test_every_kernel_option_works_with_both_drivers(name, option, value):
    model, args = data("hierarchical")
    options = {option: value}
    if option == "learning_rate":
        options["step_size"] = None
    if option == "max_consecutive_divergences":  # from step 10 on, every step overflows
        options["step_size"] = lambda t: 1e300 if t >= 10 else 1e-3
    else:
        options.setdefault("step_size", 1e-3)
    if name == "constant_sgd" and option == "preconditioner":
        options["optimal_rate"] = True
    if option == "max_consecutive_divergences":  # every chain gives up at the same step
        with pytest.raises(SamplerDivergedError, match="3 divergent steps in a row"):
            both_drivers(lambda: kernel_for(name, model, **options), args)
        return
    mcmc, result = both_drivers(lambda: kernel_for(name, model, **options), args)
    if option == "keep_draws":  # run_chains then keeps no draws; MCMC always collects its own
        assert result.samples == {}
        assert result.sample_stats["lp"].shape == (NUM_CHAINS, NUM_SAMPLES)
        return
    assert_same_draws(mcmc, result)


def test_initial_params_and_a_hook_work_with_both_drivers():
    model, args = data("hierarchical")
    start = {"mu": torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)}
    seen_mcmc, seen_chains = [], []

    def hook(kernel, params, stage, i):
        if stage.startswith("Sample"):
            seen_mcmc.append(params["mu"])

    mcmc = MCMC(
        kernel_for("sgld", model, step_size=1e-3),
        num_samples=NUM_SAMPLES,
        warmup_steps=WARMUP,
        num_chains=NUM_CHAINS,
        initial_params=start,
        hook_fn=hook,
        disable_progbar=True,
    )
    mcmc.run(*args)
    result = run_chains(
        kernel_for("sgld", model, step_size=1e-3),
        *args,
        num_chains=NUM_CHAINS,
        num_samples=NUM_SAMPLES,
        warmup_steps=WARMUP,
        initial_params=start,
        callback=lambda i, draw: seen_chains.append(draw["mu"]),
    )
    assert_same_draws(mcmc, result)
    assert torch.equal(torch.stack(seen_mcmc), result.samples["mu"].reshape(-1))
    assert torch.equal(torch.stack(seen_chains).T, result.samples["mu"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"friction": 0.0}, r"friction must lie in \(0, 1\]"),
        ({"batch_sampling": "random"}, r"batch_sampling must be one of \['epoch', 'independent'\]"),
        ({"potential": "fast"}, "potential must be one of"),
        ({"gibbs_updates": [object()]}, "gibbs_updates must be 'auto', None"),
        ({"step_size": 1e-3, "learning_rate": 1e-3}, "at most one of step_size"),
        ({"keep_draws": 1}, "keep_draws must be True or False"),
    ],
)
def test_a_bad_option_is_refused_once_for_both_drivers(options, message):
    """Options are checked when the kernel is built, so neither driver ever sees them."""
    with pytest.raises((TypeError, ValueError), match=message):
        SGHMC(hierarchical, **options)


def test_hand_given_gibbs_updates_work_with_both_drivers():
    model, args = data("hierarchical")
    update = NormalGammaPrecisionUpdate("tau", ("mu",), 2.0, 1.0)
    mcmc, result = both_drivers(
        lambda: kernel_for("sghmc", model, step_size=1e-3, gibbs_updates=[update]), args
    )
    assert_same_draws(mcmc, result)


def test_other_init_strategies_give_the_same_draws():
    model, args = data("hierarchical")
    mcmc, result = both_drivers(
        lambda: kernel_for("sgld", model, step_size=1e-3, init_strategy=init_to_median), args
    )
    assert_same_draws(mcmc, result)


def test_a_cyclical_schedule_gives_the_same_draws():
    model, args = data("bnn")
    schedule = schedules.CyclicalCosine(1e-3, cycle_length=6, exploration_fraction=0.5)
    mcmc, result = both_drivers(lambda: kernel_for("sghmc", model, step_size=schedule), args)
    assert_same_draws(mcmc, result)


def _line(x, y):
    coef = pyro.sample("coef", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
    sigma = pyro.sample("sigma", dist.HalfNormal(1.0))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("y", dist.Normal(coef[0] + coef[1] * x[idx], sigma), obs=y[idx])


def test_a_chain_that_runs_away_leaves_the_others_metric_alone():
    """A short warm-up (100 steps, the chains far from the posterior) where some chains run
    away and have their dense metric scaled: the metrics of the others, stacked with them, were
    re-decomposed and rounded anew, and those chains differed from MCMC's in the last bits."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(1000, generator=generator) - 0.5
    y = 2.0 * x - 1.0 + 0.5 * torch.randn(1000, generator=generator)

    def make_kernel():
        return SGHMC(_line, batch_size=32, num_steps_per_sample=10, seed=0)

    with pytest.warns(UserWarning):  # still on their way: the point of this warm-up
        mcmc = MCMC(make_kernel(), num_samples=5, warmup_steps=10, num_chains=4,
                    disable_progbar=True, mp_context=None)  # fmt: skip
        mcmc.run(x, y)
        result = run_chains(make_kernel(), x, y, num_chains=4, num_samples=5, warmup_steps=10)
    assert_same_draws(mcmc, result)


def test_scaling_a_dense_metric_keeps_the_unscaled_chains_bit_for_bit():
    from pyro_sgmcmc.dynamics.metric import DenseMetric

    generator = torch.Generator().manual_seed(1)
    a = torch.randn(3, 4, 4, generator=generator)
    metric = DenseMetric.from_matrix(a @ a.transpose(-1, -2) + 0.1 * torch.eye(4))
    factor = torch.ones(3, 4)
    factor[1, 2] = 0.1**0.5
    scaled = metric.scaled(factor)
    for c in (0, 2):
        assert torch.equal(scaled.matrix[c], metric.matrix[c])
        assert torch.equal(scaled.root[c], metric.root[c])
    expected = factor[1].unsqueeze(-1) * metric.matrix[1] * factor[1].unsqueeze(-2)
    torch.testing.assert_close(scaled.matrix[1], expected)
    torch.testing.assert_close(scaled.root[1] @ scaled.root[1], expected)


def test_a_kernel_object_run_again_gives_the_same_draws():
    """Re-running a cell of a notebook: the same kernel object through ``MCMC`` twice, through
    ``run_chains`` between, and through two ``ResumableMCMC`` runs gives the same draws every
    time (sequential chains were once numbered by the kernel's setups since it was built, so a
    second ``MCMC`` run drew chains 2 and 3 of the seed, silently)."""
    from pyro_sgmcmc import ResumableMCMC

    model, args = data("hierarchical")
    kernel = kernel_for("sghmc", model, step_size=1e-3)

    def through(driver):
        mcmc = driver(kernel, num_samples=NUM_SAMPLES, warmup_steps=WARMUP, num_chains=2,
                      disable_progbar=True)  # fmt: skip
        mcmc.run(*args)
        return mcmc.get_samples(group_by_chain=True)["mu"]

    first = through(MCMC)
    stacked = run_chains(kernel, *args, num_chains=2, num_samples=NUM_SAMPLES,
                         warmup_steps=WARMUP)  # fmt: skip
    assert torch.equal(through(MCMC), first)
    assert torch.equal(stacked.samples["mu"], first)
    assert torch.equal(through(ResumableMCMC), first)
    assert torch.equal(through(ResumableMCMC), first)


def tutorial_regression(x, y=None):
    """Pyro's tutorial regression as a function: ``sigma ~ Uniform(0, 10)``, a site constrained
    by a sigmoid."""
    weight = pyro.sample("weight", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    bias = pyro.sample("bias", dist.Normal(0.0, 10.0))
    sigma = pyro.sample("sigma", dist.Uniform(0.0, 10.0))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(bias + x @ weight, sigma), obs=y)


@pytest.mark.filterwarnings("ignore::pyro_sgmcmc.errors.SamplerWarning")
@pytest.mark.parametrize("name", ["sgld", "sghmc"])
def test_sites_of_an_interval_are_constrained_to_the_bits_mcmc_gives(name):
    """In float32, as users run: ``MCMC`` constrains each site's slice of one ``(chains, draws,
    D)`` tensor, a strided view, on which torch's sigmoid rounds some values one unit in the
    last place away from its result on a contiguous tensor; ``run_chains`` and ``ResumableMCMC``
    constrained contiguous tensors (SGLD's run here: 1 of its 80 draws of ``sigma`` differed)."""
    from pyro_sgmcmc import ResumableMCMC

    torch.set_default_dtype(torch.float32)  # the fixture restores float64
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=generator)
    y = x @ torch.tensor([1.0, -0.5, 0.3]) + 1.0 + 0.5 * torch.randn(200, generator=generator)

    def drawn(driver):
        kernel = KERNELS[name](tutorial_regression, batch_size=20, seed=0)
        if driver is run_chains:
            return run_chains(kernel, x, y, num_chains=2, num_samples=40, warmup_steps=40).samples
        mcmc = driver(kernel, num_samples=40, warmup_steps=40, num_chains=2, disable_progbar=True)
        mcmc.run(x, y)
        return mcmc.get_samples(group_by_chain=True)

    expected = drawn(MCMC)
    assert expected["sigma"].dtype == torch.float32
    for driver in (run_chains, ResumableMCMC):
        samples = drawn(driver)
        for site, draws in expected.items():
            assert torch.equal(samples[site], draws), (driver.__name__, site)
            assert samples[site].is_contiguous()


def test_the_layout_of_mcmc_keeps_every_value_shape_and_dtype():
    from pyro_sgmcmc.engine.mcmc_layout import as_mcmc_lays_them_out

    draws = {"w": torch.randn(2, 3, 4, 5), "b": torch.randn(2, 3), "empty": torch.zeros(2, 3, 0)}
    laid_out = as_mcmc_lays_them_out(draws)
    assert list(laid_out) == ["b", "empty", "w"]  # MCMC's order: sorted
    for name, value in draws.items():
        assert torch.equal(laid_out[name], value)
    assert laid_out["b"].stride() == (3 * 21, 21)  # a column of one (2, 3, 1 + 0 + 20) tensor
    none_yet = as_mcmc_lays_them_out({n: v[:, :0] for n, v in draws.items()})
    assert {n: v.shape for n, v in none_yet.items()} == {"b": (2, 0), "empty": (2, 0, 0),
                                                         "w": (2, 0, 4, 5)}  # fmt: skip
    mixed = {
        "a": torch.zeros(2, 3, dtype=torch.float64),
        "b": torch.zeros(2, 3, dtype=torch.float32),
    }
    assert {n: v.dtype for n, v in as_mcmc_lays_them_out(mixed).items()} == {
        "a": torch.float64, "b": torch.float32}  # fmt: skip
