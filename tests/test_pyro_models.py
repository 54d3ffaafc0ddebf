"""Models written the way Pyro's tutorials write them, through every driver, unchanged.

The three data-plate idioms -- (a) the plate sized from the data with ``obs=y``, (b) the plate
indexed with ``obs=y[idx]``, (c) ``pyro.plate(..., subsample_size=B)`` -- and ``PyroSample``
weights first touched inside the plate, under each kernel in ``pyro.infer.MCMC``, under
``run_chains``, ``fit_svi``, the ArviZ export, ``posterior_predictive``, Pyro's ``Predictive`` and
NUTS; and the posterior the kernels sample with their defaults (no step size) against NUTS's,
with tolerances from the Monte Carlo standard errors of both runs.
"""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS, Predictive
from pyro_tutorial_models import (
    BayesianRegression,
    DocsBNN,
    WeightsInsidePlate,
    binary_data,
    classification_data,
    grouped_data,
    logistic_regression,
    regression_data,
    varying_intercepts,
)
from stats_helpers import effective_sample_size

from pyro_sgmcmc import PSGLD, SGHMC, SGLD, ConstantSGD, run_chains, to_inference_data
from pyro_sgmcmc.analysis.predictive import posterior_predictive
from pyro_sgmcmc.models.structure import GlobalSitesFirst
from pyro_sgmcmc.variational.svi import fit_svi

KERNELS = {"SGLD": SGLD, "SGHMC": SGHMC, "PSGLD": PSGLD, "ConstantSGD": ConstantSGD}


def _case(name: str) -> tuple[object, tuple, dict[str, tuple[int, ...]]]:
    """(model, data arguments, latent site -> shape) for each idiom."""
    if name == "a_regression":
        x, y = regression_data()
        return BayesianRegression(3), (x, y), {"linear.weight": (1, 3), "linear.bias": (1,),
                                               "sigma": ()}  # fmt: skip
    if name == "a_weights_inside_plate":
        x, y = regression_data()
        return WeightsInsidePlate(3), (x, y), {"linear.weight": (1, 3), "linear.bias": (1,),
                                               "sigma": ()}  # fmt: skip
    if name == "a_docs_bnn":
        x, y = classification_data()
        return DocsBNN(3, 8, 3), (x, y), {"layer1.weight": (8, 3), "layer1.bias": (8,),
                                         "layer2.weight": (3, 8), "layer2.bias": (3,)}  # fmt: skip
    if name == "b_varying_intercepts":
        group, num_groups, y = grouped_data()
        shapes = {"mu": (), "tau": (), "sigma": (), "a": (num_groups,)}
        return varying_intercepts, (group, num_groups, y), shapes
    if name == "c_subsample_size":
        x, y = binary_data()
        return logistic_regression, (x, y), {"w": (3,), "b": ()}
    raise KeyError(name)


CASES = ["a_regression", "a_weights_inside_plate", "a_docs_bnn", "b_varying_intercepts",
         "c_subsample_size"]  # fmt: skip


def _num_rows(args: tuple) -> int:
    return args[0].shape[0]


@pytest.fixture(autouse=True)
def _clean_param_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


# ------------------------------------------------------------------------- every driver
@pytest.mark.filterwarnings("error::pyro_sgmcmc.errors.SamplerWarning")
@pytest.mark.parametrize("kernel_name", list(KERNELS))
@pytest.mark.parametrize("case", CASES)
def test_kernels_sample_every_idiom_inside_pyro_mcmc(case, kernel_name):
    """The adaptive warm-up (a given thinning, to keep the run short): no warning but the
    verdict's (40 draws cannot reach an ESS of 100), finite draws that move."""
    model, args, shapes = _case(case)
    kernel = KERNELS[kernel_name](model, batch_size=25, num_steps_per_sample=1, seed=3)
    mcmc = MCMC(kernel, num_samples=40, warmup_steps=500, disable_progbar=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="MCMC with .* not converged")
        mcmc.run(*args)
    draws = mcmc.get_samples()
    assert set(draws) == set(shapes)
    for site, shape in shapes.items():
        assert draws[site].shape == (40, *shape), site
        assert torch.isfinite(draws[site]).all(), site
        assert draws[site].std(0).max() > 0, f"{site} never moved"


@pytest.mark.parametrize("case", CASES)
def test_run_chains_samples_every_idiom_and_exports(case):
    model, args, shapes = _case(case)
    result = run_chains(SGHMC(model, batch_size=25, num_steps_per_sample=2, seed=5), *args,
                        num_chains=3, num_samples=30, warmup_steps=300)  # fmt: skip
    for site, shape in shapes.items():
        assert result.samples[site].shape == (3, 30, *shape), site
        assert torch.isfinite(result.samples[site]).all(), site
    idata = result.to_inference_data()
    assert idata.log_likelihood["obs"].shape == (3, 30, _num_rows(args))
    assert idata.log_likelihood["obs"].notnull().all()


@pytest.mark.parametrize("case", CASES)
def test_fit_svi_fits_every_idiom_and_exports(case):
    model, args, shapes = _case(case)
    result = fit_svi(model, *args, num_steps=300, batch_size=25, learning_rate=0.02, seed=0,
                     progress_bar=False)  # fmt: skip
    losses = torch.as_tensor(result.losses).flatten()
    assert torch.isfinite(losses).all()
    assert losses[-50:].mean() < losses[:50].mean()
    idata = to_inference_data(result, num_draws=20)
    assert set(shapes) <= set(idata.posterior.data_vars)
    assert idata.log_likelihood["obs"].shape[-1] == _num_rows(args)
    assert idata.log_likelihood["obs"].notnull().all()


@pytest.mark.parametrize("case", CASES)
def test_export_and_pyro_predictive_after_mcmc(case):
    model, args, _ = _case(case)
    # a given thinning keeps the warm-up short (800 steps): the export is what is tested here
    mcmc = MCMC(SGHMC(model, batch_size=25, num_steps_per_sample=2, seed=1), num_samples=20,
                warmup_steps=400, disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="MCMC with .* not converged")
        mcmc.run(*args)
    idata = to_inference_data(mcmc)
    n = _num_rows(args)
    assert idata.log_likelihood["obs"].shape == (1, 20, n)
    assert idata.log_likelihood["obs"].notnull().all()
    assert idata.posterior_predictive["obs"].shape == (1, 20, n)
    # Pyro's own Predictive on the same draws, with the targets left out (Pyro itself runs
    # weights first touched inside the plate per row: GlobalSitesFirst makes them global)
    predictive = Predictive(GlobalSitesFirst(model) if case == "a_weights_inside_plate" else model,
                            posterior_samples=mcmc.get_samples())  # fmt: skip
    predicted = predictive(*args[:-1])["obs"]
    expected_rows = n if case != "c_subsample_size" else 25  # Pyro subsamples idiom (c) itself
    assert predicted.shape == (20, expected_rows)


@pytest.mark.parametrize("case", ["a_regression", "a_weights_inside_plate", "a_docs_bnn"])
def test_posterior_predictive_on_new_inputs(case):
    model, (x, y), _ = _case(case)
    mcmc = MCMC(SGLD(model, batch_size=25, num_steps_per_sample=2, seed=2), num_samples=20,
                warmup_steps=400, disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="MCMC with .* not converged")
        mcmc.run(x, y)
    x_new = x[:7] + 0.1
    prediction = posterior_predictive(model, mcmc.get_samples(), x_new)
    mean = prediction.mean if hasattr(prediction, "mean") else prediction.probs
    assert mean.shape[0] == 7
    assert torch.isfinite(torch.as_tensor(mean)).all()


@pytest.mark.parametrize("case", ["a_regression", "a_weights_inside_plate", "b_varying_intercepts"])
def test_nuts_runs_the_same_models(case):
    model, args, shapes = _case(case)
    if case == "a_weights_inside_plate":
        with pytest.raises(RuntimeError):  # Pyro alone: the weights are drawn per row
            MCMC(NUTS(model), num_samples=2, warmup_steps=2, disable_progbar=True).run(*args)
        model = GlobalSitesFirst(model)
    mcmc = MCMC(NUTS(model, max_tree_depth=4), num_samples=20, warmup_steps=20,
                disable_progbar=True)  # fmt: skip
    mcmc.run(*args)
    assert set(mcmc.get_samples()) == set(shapes)


def test_nuts_runs_idiom_c_with_the_subsampling_switched_off():
    """Pyro's HMC refuses subsampling plates; the same model with ``subsample_size=None``."""
    x, y = binary_data()
    mcmc = MCMC(NUTS(logistic_regression, max_tree_depth=4), num_samples=20, warmup_steps=20,
                disable_progbar=True)  # fmt: skip
    mcmc.run(x, y, subsample_size=None)
    assert mcmc.get_samples()["w"].shape == (20, 3)


# ------------------------------------------------------------------ the posterior, vs NUTS
def _nuts_reference(model, args, kwargs=None, num_samples=800, seed=0):
    pyro.set_rng_seed(seed)
    mcmc = MCMC(NUTS(model), num_samples=num_samples, warmup_steps=400, disable_progbar=True)
    mcmc.run(*args, **(kwargs or {}))
    return mcmc.get_samples()


def _assert_means_agree(draws, reference, sites, num_sd=4.0):
    """|mean_ours - mean_NUTS| within ``num_sd`` Monte Carlo standard errors of the difference
    (ESS-based, both runs), plus a tenth of a posterior sd for SG-MCMC's O(step) bias.

    ``draws`` are shaped ``(chain, draw, *site)``, ``reference`` ``(draw, *site)``."""
    for site in sites:
        ours = draws[site].reshape(*draws[site].shape[:2], -1).double().numpy()
        ref = reference[site].reshape(1, reference[site].shape[0], -1).double().numpy()
        ours_mcse = ours.std(axis=(0, 1)) / effective_sample_size(ours) ** 0.5
        ref_mcse = ref.std(axis=(0, 1)) / effective_sample_size(ref) ** 0.5
        difference = abs(ours.mean(axis=(0, 1)) - ref.mean(axis=(0, 1)))
        tolerance = num_sd * (ours_mcse**2 + ref_mcse**2) ** 0.5 + 0.1 * ref.std(axis=(0, 1))
        assert (difference < tolerance).all(), (site, difference, tolerance)


@pytest.mark.parametrize(
    "kernel_name", ["SGHMC", pytest.param("SGLD", marks=pytest.mark.slow)]
)  # fmt: skip
def test_defaults_sample_the_tutorial_regression_like_nuts(kernel_name):
    x, y = regression_data()
    model = BayesianRegression(3)
    reference = _nuts_reference(model, (x, y), num_samples=600)
    kernel = KERNELS[kernel_name](model, batch_size=50, seed=11)
    # the kernel thins by its autocorrelation time: 200 draws are about 200 effective draws
    mcmc = MCMC(kernel, num_samples=200, warmup_steps=500, disable_progbar=True)
    mcmc.run(x, y)
    draws = mcmc.get_samples(group_by_chain=True)
    _assert_means_agree(draws, reference, ["linear.weight", "linear.bias", "sigma"])


@pytest.mark.slow
def test_defaults_sample_the_hierarchical_model_like_nuts():
    """Varying intercepts (J = 8, N = 2000): the funnel-free non-centred form, default SGHMC."""
    group, num_groups, y = grouped_data(n=2000)
    reference = _nuts_reference(varying_intercepts, (group, num_groups, y), num_samples=1000)
    result = run_chains(SGHMC(varying_intercepts, batch_size=200, seed=4), group, num_groups, y,
                        num_chains=4, num_samples=2000, warmup_steps=2000)  # fmt: skip
    _assert_means_agree(result.samples, reference, ["mu", "tau", "sigma", "a"])


def test_global_sites_first_names_what_it_wraps():
    def function_model(x):
        return pyro.sample("w", dist.Normal(0.0, 1.0))

    with pytest.raises(TypeError, match=r"GlobalSitesFirst wraps a PyroModule .* got function"):
        GlobalSitesFirst(function_model)


def test_a_model_with_a_pyro_param_builds_no_autograd_graph_along_the_chain():
    """A model's ``pyro.param`` (a constant to the sampler, as to NUTS) requires grad: the
    replay of the recorded gradient used to run under autograd, so every step's position hung
    on one graph that grew with the chain (1,600 draws: 11.6 s and 693 MB instead of 7.5 s and
    434 MB), and torch warned where the draws were read as numbers."""
    from torch.distributions import constraints

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(100, generator=generator)
    y = 1.0 + 2.0 * x + 0.5 * torch.randn(100, generator=generator)

    def model(x, y):
        scale = pyro.param("scale", torch.tensor(0.5), constraint=constraints.positive)
        slope = pyro.sample("slope", dist.Normal(0.0, 10.0))
        with pyro.plate("data", x.shape[0]) as idx:
            pyro.sample("obs", dist.Normal(slope * x[idx], scale), obs=y[idx])

    pyro.clear_param_store()
    kernel = SGLD(model, batch_size=20, step_size=1e-4, num_steps_per_sample=2, seed=0)
    tracked = []

    def hook(kernel, samples, stage, index):  # after each draw, before the chain's clean-up
        engine = kernel._chains.engine
        tracked.append(engine.position.requires_grad or engine.value.requires_grad)

    mcmc = MCMC(kernel, num_samples=20, warmup_steps=10, hook_fn=hook)  # progress bar: logging()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Converting a tensor with requires_grad")
        mcmc.run(x, y)
    assert mcmc.get_samples()["slope"].shape == (20,)
    assert len(tracked) == 30 and not any(tracked)
    pyro.clear_param_store()
