"""Bad input at the public entry points: each case of docs/bad-input.md that is not tested
elsewhere. Refusals must name the argument (or the site) and say what is allowed. Known gaps in
other modules were recorded as strict xfails until they were fixed."""

from __future__ import annotations

import os

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS
from torch.distributions.transforms import ExpTransform

from pyro_sgmcmc import (
    PSGLD,
    SGHMC,
    SGLD,
    ConstantSGD,
    ModelContractError,
    _arviz,
    convergence_report,
    find_map,
    fit_svi,
    init_to_prior,
    metrics,
    posterior_predictive,
    pruning,
    to_inference_data,
)
from pyro_sgmcmc.analysis.diagnostics import format_reports
from pyro_sgmcmc.dynamics import (
    psgld_init,
    psgld_step,
    sghmc_init,
    sghmc_step,
    sgld_init,
    sgld_step,
)
from pyro_sgmcmc.inference.checkpoint import ResumableMCMC
from pyro_sgmcmc.inference.schedules import PolynomialDecay

Y = torch.randn(20, generator=torch.Generator().manual_seed(0))


def model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])


def plate_of_size(size):
    def sized(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with pyro.plate("data", size) as idx:
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])

    return sized


def regression(x, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(x[idx] @ w, 1.0), obs=y[idx])


def run(kernel, *args, **kwargs):
    MCMC(kernel, 2, warmup_steps=1, disable_progbar=True).run(*args, **kwargs)


# ---------------------------------------------------------------------- data vs model (kernels)
@pytest.mark.parametrize(
    ("make_model", "args", "message"),
    [
        (lambda: plate_of_size(30), (Y,),
         r"args\[0\] has 20 rows but the data plate 'data' has size 30"),
        (lambda: regression, (torch.randn(20, 3), torch.randn(15)),
         r"args\[1\] has 15 rows but the data plate 'data' has size 20"),
        (lambda: regression, (torch.randn(20), torch.randn(20)),
         r"fails on the data given to run.*plate sizes"),
    ],
    ids=["plate-larger-than-data", "rows-of-x-and-y-differ", "x-not-a-matrix"],
)  # fmt: skip
def test_data_that_do_not_fit_the_model_are_refused_by_name(make_model, args, message):
    with pytest.raises(ModelContractError, match=message):
        run(SGLD(make_model(), step_size=1e-3), *args)


def test_nan_in_keyword_data_is_refused():
    with pytest.raises(ValueError, match=r"kwargs\['y'\] contains 1 NaN"):
        run(SGLD(model, step_size=1e-3), y=torch.tensor([1.0, float("nan")]))


def test_plate_smaller_than_data_is_refused():
    with pytest.raises(ValueError):
        run(SGLD(plate_of_size(10), step_size=1e-3), Y)


@pytest.mark.parametrize(
    ("initial", "error", "message"),
    [
        ({"mu": torch.tensor(float("nan"))}, ValueError, r"initial_params\['mu'\] contains NaN"),
        ({"nu": torch.tensor(0.0)}, ValueError, r"site 'nu', which is not latent; latent sites"),
        ({"mu": torch.zeros(3)}, ValueError, r"initial_params\['mu'\] must have the site's uncon"),
        ([0.0], TypeError, "initial_params must be a dict"),
    ],
)
def test_bad_initial_params_are_refused(initial, error, message):
    kernel = SGLD(model, step_size=1e-3)
    with pytest.raises(error, match=message):
        kernel.initial_params = initial
        run(kernel, Y)


@pytest.mark.parametrize(
    ("transforms", "error", "message"),
    [
        ({"mu": 3}, TypeError, r"transforms\['mu'\] must be a torch.distributions Transform"),
        ([ExpTransform()], TypeError, "transforms must be a dict"),
    ],
)
def test_bad_transforms_are_refused(transforms, error, message):
    with pytest.raises(error, match=message):
        SGLD(model, step_size=1e-3, transforms=transforms)


def test_keep_draws_must_be_a_bool():
    with pytest.raises(TypeError, match="keep_draws must be True or False"):
        SGLD(model, step_size=1e-3, keep_draws="yes")


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: SGLD(model, step_size=1e-3, batch_sampling="random"), "batch_sampling must be"),
        (lambda: SGLD(model, step_size=1e-3, subsample_plate=""), "subsample_plate must be"),
        (lambda: SGLD(model, step_size=float("inf")), "step_size must be finite"),
        (lambda: SGLD(model, learning_rate=-1.0), r"learning_rate must be > 0"),
        (lambda: SGHMC(model, step_size=1e-3, resample_momentum_every=0), "resample_momentum"),
        (lambda: SGHMC(model, step_size=1e-3, momentum_persistence=1.0), "momentum_persistence"),
        (lambda: SGHMC(model, step_size=1e-3, gradient_noise_decay=1.0), "gradient_noise_decay"),
        (lambda: PSGLD(model, step_size=1e-3, decay=-0.1), r"decay must lie in \[0.0, 1.0\)"),
        (lambda: ConstantSGD(model, step_size=1e-3, temperature=2.0), "has no temperature"),
    ],
)
def test_kernel_hyper_parameters_are_checked(factory, message):
    with pytest.raises((ValueError, TypeError), match=message):
        factory()


def test_constant_sgd_without_gradient_noise_is_refused_by_name():
    constant = torch.ones(20)  # every minibatch gives the same gradient
    with pytest.raises(ValueError, match="measured no minibatch gradient noise"):
        MCMC(ConstantSGD(model, step_size=1e-3, batch_size=5), 2, warmup_steps=4).run(constant)


# ---------------------------------------------------------------------- checkpoint driver
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_samples": 0}, ValueError, "num_samples must be an integer >= 1"),
        ({"warmup_steps": -1}, ValueError, "warmup_steps must be an integer >= 0"),
        ({"num_chains": 0}, ValueError, "num_chains must be an integer >= 1"),
        ({"checkpoint_every": 0}, ValueError, "checkpoint_every must be an integer >= 1"),
        ({"checkpoint_seconds": -1.0}, ValueError, r"checkpoint_seconds must be > 0"),
        ({"draw_dtype": torch.int32}, TypeError, "draw_dtype must be None or a floating"),
        ({"hook_fn": 3}, TypeError, "hook_fn must be callable"),
        (
            {"num_chains": 2, "initial_params": {"mu": torch.zeros(3)}},
            ValueError,
            "leading dimension",
        ),
    ],
)
def test_resumable_mcmc_checks_its_arguments(kwargs, error, message):
    call = {"num_samples": 2, **kwargs}
    with pytest.raises(error, match=message):
        ResumableMCMC(SGLD(model, step_size=1e-3), **call)


def test_resumable_mcmc_needs_an_sg_kernel():
    with pytest.raises(TypeError, match="lacks state_dict, load_state_dict, signature"):
        ResumableMCMC(NUTS(model), 2)


def test_many_chains_run_one_after_the_other():
    mcmc = ResumableMCMC(SGLD(model, step_size=1e-3, seed=0), 2, warmup_steps=0, num_chains=5)
    mcmc.disable_progbar = True
    mcmc.run(Y)
    assert mcmc.get_samples(group_by_chain=True)["mu"].shape == (5, 2)


def test_checkpoint_path_that_cannot_be_written_is_refused(tmp_path):
    kernel = SGLD(model, step_size=1e-3)
    with pytest.raises(ValueError, match=r"checkpoint_path: the directory .* does not exist"):
        ResumableMCMC(kernel, 2, checkpoint_path=tmp_path / "missing" / "run.ckpt")
    with pytest.raises(ValueError, match="is a directory"):
        ResumableMCMC(kernel, 2, checkpoint_path=tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="does not exist"):
        ResumableMCMC(kernel, 2, checkpoint_path=tmp_path / "file" / "run.ckpt")
    with pytest.raises(TypeError, match=r"checkpoint_path must be a str or os\.PathLike"):
        ResumableMCMC(kernel, 2, checkpoint_path=3)
    if os.geteuid() != 0:  # root writes to read-only directories
        read_only = tmp_path / "read_only"
        read_only.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="cannot write to the directory"):
            ResumableMCMC(kernel, 2, checkpoint_path=read_only / "run.ckpt")


def test_extend_before_run_and_save_without_path_are_refused():
    mcmc = ResumableMCMC(SGLD(model, step_size=1e-3), 2)
    with pytest.raises(RuntimeError, match="extend\\(\\) continues a finished run"):
        mcmc.extend(2)
    with pytest.raises(ValueError, match="num_samples must be an integer >= 1"):
        mcmc.extend(0)
    with pytest.raises(ValueError, match="give a path"):
        mcmc.save_checkpoint()


# ---------------------------------------------------------------------- known gaps elsewhere
def test_sgld_step_names_a_negative_step_size():
    state = sgld_init({"a": torch.zeros(2)})
    with pytest.raises(ValueError, match="step_size"):
        sgld_step(state, {"a": torch.zeros(2)}, -1.0)


def test_sghmc_step_refuses_friction_outside_unit_interval():
    state = sghmc_init({"a": torch.zeros(2)})
    with pytest.raises(ValueError, match="friction"):
        sghmc_step(state, {"a": torch.zeros(2)}, 1e-2, 2.0)


def test_psgld_step_refuses_decay_above_one():
    state = psgld_init({"a": torch.zeros(2)})
    with pytest.raises(ValueError, match="decay"):
        psgld_step(state, {"a": torch.ones(2)}, 1e-2, num_data=10, decay=1.5)


def test_polynomial_decay_refuses_a_negative_step():
    with pytest.raises(ValueError, match="t"):
        PolynomialDecay(1.0)(-5)


def test_rmse_refuses_nan_predictions():
    with pytest.raises(ValueError, match="NaN"):
        metrics.rmse(torch.tensor([float("nan")]), torch.zeros(1))


def test_accuracy_refuses_rows_that_are_not_probabilities():
    with pytest.raises(ValueError, match="probs"):
        metrics.accuracy(torch.full((4, 2), 3.0), torch.zeros(4, dtype=torch.long))


def test_prune_by_snr_refuses_negative_scales():
    with pytest.raises(ValueError, match="scales"):
        pruning.prune_by_snr({"a": torch.zeros(3)}, {"a": -torch.ones(3)}, 0.5)


# ---------------------------------------------------------------------- other entry points
def _empty_mcmc():
    return MCMC(SGLD(model, step_size=1e-3), 2)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: find_map(model, torch.tensor([1.0, float("nan")])), ValueError, "NaN"),
        (lambda: find_map(model, torch.tensor([])), ValueError, "empty tensor"),
        (lambda: init_to_prior(num_reference_draws=0), ValueError, "num_reference_draws"),
        (lambda: fit_svi(model, torch.tensor([float("inf")]), num_steps=1), ValueError, "NaN"),
        (lambda: fit_svi(model, torch.tensor([]), num_steps=1), ValueError, "empty tensor"),
        (lambda: fit_svi(no_plate, Y, num_steps=1), ModelContractError, "no pyro.plate"),
        (
            lambda: posterior_predictive(model, {"mu": torch.zeros(2)}, Y, draw_chunk_size=0),
            ValueError,
            "draw_chunk_size",
        ),
        (lambda: metrics.rmse(torch.zeros(0), torch.zeros(0)), ValueError, "no rows"),
        (lambda: metrics.rmse(torch.zeros(5), torch.zeros(4)), ValueError, "5 predictions"),
        (lambda: convergence_report(_arviz.from_datasets({})), ValueError, "posterior group"),
        (lambda: format_reports([]), ValueError, "at least one"),
        (lambda: to_inference_data(_empty_mcmc(), model, Y), ValueError, "no samples"),
    ],
    ids=[
        "find_map-nan",
        "find_map-empty",
        "init_to_prior-draws",
        "fit_svi-inf",
        "fit_svi-empty",
        "fit_svi-no-plate",
        "posterior_predictive-chunk",
        "rmse-empty",
        "rmse-lengths",
        "convergence_report-no-posterior",
        "format_reports-empty",
        "to_inference_data-not-run",
    ],
)
def test_other_entry_points_refuse_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


def no_plate(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    pyro.sample("obs", dist.Normal(mu, 1.0).expand([len(y)]).to_event(1), obs=y)


def test_bayesian_mlp_refuses_targets_of_the_wrong_shape():
    from pyro_sgmcmc.nn import BayesianMLP

    model = BayesianMLP(2, [3], 1)
    x = torch.randn(8, 2)
    with pytest.raises(ValueError, match=r"y must have shape \(8,\) .* got \(8, 1\)"):
        model(x, torch.randn(8, 1))
