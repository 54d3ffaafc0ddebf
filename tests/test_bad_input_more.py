"""Bad input found by the probe of issue 19 (docs/bad-input.md, "Wrong pairings, damaged files,
silent results" and the network rows): each refusal names the argument (or site) and what is
allowed; inputs that are accepted give the same result as the equivalent torch input."""

from __future__ import annotations

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

from pyro_sgmcmc import (
    SGLD,
    BayesianMLP,
    CheckpointError,
    ModelContractError,
    ResumableMCMC,
    find_map,
    fit_svi,
    load_checkpoint,
    posterior_predictive,
    run_chains,
    to_inference_data,
)
from pyro_sgmcmc.cli.commands import main
from pyro_sgmcmc.data.datasets import load_table
from pyro_sgmcmc.inference.checkpoint_files import save_checkpoint
from pyro_sgmcmc.inference.schedules import PiecewiseConstant

pytestmark = pytest.mark.filterwarnings("ignore::pyro_sgmcmc.errors.SamplerWarning")

GEN = torch.Generator().manual_seed(0)
X = torch.randn(40, 2, generator=GEN)
Y_REG = X.sum(1) + 0.1 * torch.randn(40, generator=GEN)
Y_CLS = torch.randint(0, 3, (40,), generator=GEN)
Y = torch.randn(30, generator=GEN) + 3.0


def regressor():
    return BayesianMLP(2, [4], 1)


def classifier():
    return BayesianMLP(2, [4], 3, likelihood="categorical")


def sgld(model, **kwargs):
    return SGLD(model, step_size=1e-3, batch_size=10, seed=0, **kwargs)


def run(kernel, *args):
    mcmc = MCMC(kernel, num_samples=3, warmup_steps=2, disable_progbar=True)
    mcmc.run(*args)
    return mcmc


def mean_model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", len(y)) as idx:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])


def with_label(y, index, value):
    y = y.clone()
    y[index] = value
    return y


# ---------------------------------------------------------------------- BayesianMLP data
@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (with_label(Y_CLS, 3, 5), r"1 label\(s\) outside the classes \[0, 3\) .* e\.g\. 5"),
        (with_label(Y_CLS, 0, -1), r"outside the classes \[0, 3\) .* e\.g\. -1"),
        (with_label(Y_CLS.float(), 0, 0.5), r"integer class labels in \[0, 3\).*torch\.float32"),
        (Y_CLS.float(), r"got dtype torch\.float32: convert whole-number labels with y\.long\(\)"),
    ],
    ids=["above-the-classes", "negative", "not-integers", "integer-valued-floats"],
)
def test_class_labels_that_are_not_classes_are_refused_by_name(labels, message):
    with pytest.raises(ModelContractError, match=message):
        run(sgld(classifier()), X, labels)
    with pytest.raises(ModelContractError, match=message):
        fit_svi(classifier(), X, labels, num_steps=1, progress_bar=False)


DTYPES = r"float32.*float64|float64.*float32"  # a dtype refusal names both dtypes


@pytest.mark.parametrize(
    ("x", "y", "message", "run_message"),
    [
        (torch.randn(40, 3), Y_REG, r"x must have shape \(rows, in_features\) = \(rows, 2\)", None),
        (X[:, 0], Y_REG, r"got \(40,\): add the feature dimension, x\.unsqueeze", None),
        (X.double(), Y_REG.double(), r"weights' dtype torch\.float32, got torch\.float64", DTYPES),
        ((X * 3).long(), Y_REG, r"floating tensor .* got torch\.int64", r"int64"),
        (X, Y_REG.double(), r"y has dtype torch\.float64 but x has dtype torch\.float32", DTYPES),
    ],
    ids=["x-too-wide", "x-one-dimensional", "float64", "integer-x", "y-float64"],
)
def test_inputs_that_do_not_fit_the_network_are_refused_by_name(x, y, message, run_message):
    model = regressor()
    with pytest.raises(ModelContractError, match=message):
        model(x, y)  # the Pyro model itself, as under NUTS, SVI or Predictive
    # the kernels inspect the data first: the same refusal, or their own naming both dtypes
    with pytest.raises((ModelContractError, TypeError), match=run_message or message):
        run(sgld(model), x, y)


@pytest.mark.parametrize(
    "convert", [lambda t: t.numpy(), lambda t: t.tolist()], ids=["numpy", "list"]
)
def test_numpy_and_list_data_are_converted_by_mcmc_and_run_chains_alike(convert):
    """``MCMC.run`` and ``run_chains`` both convert NumPy arrays and lists (as ``fit_svi``,
    ``find_map`` and the export do): the draws equal those of the torch tensors. ``MCMC.run``
    refused them before, from a check made on the unconverted data after the warm-up."""
    reference = run(sgld(regressor()), X, Y_REG).get_samples()
    converted = run(sgld(regressor()), convert(X), convert(Y_REG)).get_samples()
    for name, value in reference.items():
        torch.testing.assert_close(converted[name], value, rtol=0, atol=0)
    vectorized = [
        run_chains(sgld(regressor()), *data, num_chains=2, num_samples=3, warmup_steps=2).samples
        for data in [(X, Y_REG), (convert(X), convert(Y_REG))]
    ]
    for name, value in vectorized[0].items():
        torch.testing.assert_close(vectorized[1][name], value, rtol=0, atol=0)


def test_the_right_inputs_still_run():
    samples = run(sgld(classifier()), X, Y_CLS).get_samples()
    assert samples["layers.0.weight"].shape == (3, 4, 2)


# ---------------------------------------------------------------------- posterior_predictive
@pytest.fixture(scope="module")
def fitted():
    model = classifier()
    draws = run(sgld(model), X, Y_CLS).get_samples()
    return model, draws


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: (torch.randn(5, 3), None), r"x must have shape \(rows, in_features\) = \(rows"),
        (lambda d: (X.double(), None), r"x must be a floating tensor of the weights' dtype"),
        (lambda d: (X, with_label(Y_CLS, 0, 9)), r"outside the classes \[0, 3\) .* e\.g\. 9"),
        (lambda d: (X, Y_CLS[:-5]), r"y must hold one target per row of x \(40 rows\)"),
    ],
    ids=["x-too-wide", "x-float64", "label-out-of-range", "y-too-short"],
)
def test_predictive_refuses_inputs_that_do_not_fit(fitted, change, message):
    model, draws = fitted
    x, y = change(draws)
    with pytest.raises(ValueError, match=message):
        posterior_predictive(model, draws, x, y)


def test_predictive_refuses_draws_with_nan(fitted):
    model, draws = fitted
    draws = {k: v.clone() for k, v in draws.items()}
    draws["layers.0.bias"][1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"draws\['layers.0.bias'\] has NaN .* in 1 of 3 draws"):
        posterior_predictive(model, draws, X)


def test_predictive_converts_numpy_inputs(fitted):
    model, draws = fitted
    from_numpy = posterior_predictive(model, draws, X.numpy(), Y_CLS.numpy())
    from_torch = posterior_predictive(model, draws, X, Y_CLS)
    assert torch.equal(from_numpy.probs, from_torch.probs)
    assert torch.equal(from_numpy.log_predictive_density, from_torch.log_predictive_density)


def test_predictive_names_an_unknown_obs_site():
    def model(x, y=None):
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        with pyro.plate("data", x.shape[0]) as idx:
            pyro.sample("obs", dist.Normal(mu + 0 * x[idx], 1.0), obs=None if y is None else y)

    with pytest.raises(ValueError, match=r"obs_site='y'.*its sites outside the draws are \['obs'"):
        posterior_predictive(model, {"mu": torch.randn(4)}, torch.zeros(5), obs_site="y")


# ---------------------------------------------------------------------- schedules, find_map
def test_a_step_size_callable_of_the_wrong_arity_is_refused():
    with pytest.raises(TypeError, match=r"callable of the step counter, called as step_size\(t\)"):
        SGLD(mean_model, step_size=lambda: 1e-3)


@pytest.mark.parametrize("name", ["values", "boundaries"])
def test_piecewise_constant_needs_sequences(name):
    arguments = {"values": (1e-3, 1e-4), "boundaries": (10,), name: 1e-3}
    with pytest.raises(TypeError, match=f"PiecewiseConstant {name} must be a sequence"):
        PiecewiseConstant(**arguments)


def test_find_map_names_a_misspelt_option_and_a_bad_init_strategy():
    with pytest.raises(TypeError, match=r"unknown keyword argument 'num_step'; did you mean 'num"):
        find_map(regressor(), X, Y_REG, num_step=5)
    with pytest.raises(TypeError, match=r"init_strategy must be None .* got 'prior'"):
        find_map(regressor(), X, Y_REG, init_strategy="prior", num_steps=1)


def test_find_map_converts_numpy_data():
    model = regressor()
    from_numpy = find_map(model, X.numpy(), Y_REG.numpy(), num_steps=5, seed=0, return_values=True)
    from_torch = find_map(model, X, Y_REG, num_steps=5, seed=0, return_values=True)
    assert all(torch.equal(from_numpy[k], from_torch[k]) for k in from_torch)


# ---------------------------------------------------------------------- export
@pytest.fixture(scope="module")
def regression_run():
    model = regressor()
    return run(sgld(model), X, Y_REG), model


def test_export_checks_its_seed(regression_run):
    mcmc, model = regression_run
    with pytest.raises(TypeError, match="seed must be an integer >= 0, got 'a'"):
        to_inference_data(mcmc, model, X, Y_REG, seed="a")


@pytest.mark.parametrize(
    ("args", "test", "message"),
    [
        ((X, Y_REG), (X[:5].double(), Y_REG[:5].double()), r"weights' dtype torch\.float32"),
        ((X, Y_REG), (torch.randn(5, 3), Y_REG[:5]), r"test\[0\] has shape \(5, 3\)"),
        # training data are the run's own: others are refused before the network sees them
        ((torch.randn(40, 3), Y_REG), None, r"args\[0\] .* shape \(40, 3\), but the MCMC run"),
    ],
    ids=["float64-test-set", "test-set-of-another-width", "training-data-of-another-width"],
)
def test_export_names_data_that_do_not_fit_the_network(regression_run, args, test, message):
    mcmc, model = regression_run
    with pytest.raises(ValueError, match=message):
        to_inference_data(mcmc, model, *args, test=test)


# ---------------------------------------------------------------------- checkpoints
@pytest.fixture
def resumable(tmp_path):
    path = tmp_path / "resumable.ckpt"
    mcmc = ResumableMCMC(
        SGLD(mean_model, step_size=1e-3, batch_size=10, seed=0), 3, warmup_steps=2,
        num_chains=2, disable_progbar=True, checkpoint_path=path,
    )  # fmt: skip
    mcmc.run(Y)
    return path


@pytest.fixture
def chains(tmp_path):
    path = tmp_path / "chains.ckpt"
    kernel = SGLD(mean_model, step_size=1e-3, batch_size=10, seed=0)
    run_chains(kernel, Y, num_chains=2, num_samples=3, checkpoint_path=path, checkpoint_every=1)
    return path


def resume(path, seed=0):
    kernel = SGLD(mean_model, step_size=1e-3, batch_size=10, seed=seed)
    return ResumableMCMC.resume(path, kernel, Y, disable_progbar=True)


def resume_chains(path, seed=0):
    kernel = SGLD(mean_model, step_size=1e-3, batch_size=10, seed=seed)
    return run_chains(kernel, Y, num_chains=2, num_samples=3, resume_from=path)


def test_a_checkpoint_of_the_other_driver_is_named(resumable, chains):
    with pytest.raises(
        CheckpointError, match="is a checkpoint of ResumableMCMC, not of run_chains"
    ):
        resume_chains(resumable)
    with pytest.raises(
        CheckpointError, match="is a checkpoint of run_chains, not of ResumableMCMC"
    ):
        resume(chains)


def test_a_directory_is_not_a_checkpoint(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory, not a checkpoint file"):
        load_checkpoint(tmp_path)
    with pytest.raises(IsADirectoryError, match="is a directory"):
        resume_chains(tmp_path)


def test_a_kernel_of_another_seed_is_refused(resumable, chains):
    with pytest.raises(CheckpointError, match=r"seed: saved '0', now '1'"):
        resume(resumable, seed=1)
    with pytest.raises(CheckpointError, match=r"seed: saved '0', now '1'"):
        resume_chains(chains, seed=1)


def edit(path, change):
    payload = load_checkpoint(path)
    change(payload)
    save_checkpoint(payload, path)  # a valid digest: a deliberate edit, not damage


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["chains"][1].pop("diagnostics"), r"\['diagnostics'\] of chains\[1\]"),
        (lambda p: p["run"].pop("num_chains"), r"\['num_chains'\] of 'run'"),
        (lambda p: p["chains"].pop(), r"should list num_chains=2 chains"),
        (
            lambda p: p["chains"][1]["kernel_state"]["engine"].pop("batches"),
            r"its kernel \(chain 1\) state cannot be loaded \(KeyError: 'batches'\)",
        ),
        (
            lambda p: p["chains"][1]["kernel_state"].update(num_draws=5000),
            r"chain 1's kernel state has num_draws=5000, outside \[0, 5\]",
        ),
        (
            lambda p: p["chains"][0]["draws"].pop(),
            r"chain 0 holds 2 kept draws, but its kernel state counts 5 draws \(3 after 2",
        ),
    ],
    ids=["chain-entry", "run-entry", "a-chain", "kernel-state-entry", "num-draws", "draws"],
)
def test_an_edited_resumable_checkpoint_is_named(resumable, change, message):
    edit(resumable, change)
    with pytest.raises(CheckpointError, match=message):
        resume(resumable)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["engine"].pop("batches"), r"engine state .*\(KeyError: 'batches'\)"),
        (
            lambda p: p["recorder"].update(draws=[torch.zeros(3)]),
            r"its recorder state cannot be loaded",
        ),
    ],
    ids=["engine-entry", "recorder-shape"],
)
def test_an_edited_run_chains_checkpoint_is_named(chains, change, message):
    edit(chains, change)
    with pytest.raises(CheckpointError, match=message):
        resume_chains(chains)


def test_a_keyboard_interrupt_from_the_callback_keeps_a_checkpoint(tmp_path):
    path = tmp_path / "run.ckpt"

    def stop_at_the_third_draw(index, draw):
        if index == 2:
            raise KeyboardInterrupt

    kernel = SGLD(mean_model, step_size=1e-3, batch_size=10, seed=0)
    with pytest.warns(UserWarning, match="interrupted after 5 draws per chain"):
        with pytest.raises(KeyboardInterrupt):
            run_chains(kernel, Y, num_chains=2, num_samples=6, warmup_steps=2,
                       callback=stop_at_the_third_draw, checkpoint_path=path,
                       checkpoint_seconds=3600)  # fmt: skip
    resumed = resume_chains_to(path, num_samples=6, warmup_steps=2)
    whole = run_chains(SGLD(mean_model, step_size=1e-3, batch_size=10, seed=0), Y,
                       num_chains=2, num_samples=6, warmup_steps=2)  # fmt: skip
    assert torch.equal(resumed.samples["mu"], whole.samples["mu"])


def resume_chains_to(path, **run):
    kernel = SGLD(mean_model, step_size=1e-3, batch_size=10, seed=0)
    return run_chains(kernel, Y, num_chains=2, resume_from=path, **run)


def test_the_unedited_checkpoints_resume(resumable, chains):
    assert resume(resumable).get_samples(group_by_chain=True)["mu"].shape == (2, 3)
    assert resume_chains(chains).samples["mu"].shape == (2, 3)


# ---------------------------------------------------------------------- data files, CLI
def test_a_table_with_only_a_header_is_refused(tmp_path, capsys):
    path = tmp_path / "empty.csv"
    path.write_text("a,b,y\n")
    with pytest.raises(ValueError, match=r"has no data rows \(only a header line\)"):
        load_table(path, target="y")
    code = main(["compare", "--data", str(path), "--target", "y", "--no-output", "--no-progress"])
    assert code == 2
    assert "has no data rows" in capsys.readouterr().err


def test_numpy_labels_are_converted_by_the_kernels_and_by_fit_svi():
    samples = run(sgld(classifier()), X.numpy(), Y_CLS.numpy()).get_samples()
    expected = run(sgld(classifier()), X, Y_CLS).get_samples()
    for name, value in expected.items():
        torch.testing.assert_close(samples[name], value, rtol=0, atol=0)
    result = fit_svi(classifier(), X.numpy(), Y_CLS.numpy(), num_steps=2, progress_bar=False)
    assert np.isfinite(result.losses).all()


# ---------------------------------------------------------------------- models, kernels, networks
def plate_of_size(size, wrap=True):
    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        with pyro.plate("data", size) as idx:
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx % len(y) if wrap else idx])

    return model


@pytest.mark.parametrize("size", [35, 45])
def test_a_data_plate_larger_than_the_data_is_refused(size):
    with pytest.raises(
        ModelContractError,
        match=rf"args\[0\] has 30 rows but the data plate "
        rf"'data' has size {size}: the plate's rows 30..{size - 1} have no data",
    ):
        run(sgld(plate_of_size(size)), Y)  # fmt: skip
    # without the wrap-around the model itself fails first (an index past the data): the
    # refusal still names the plate's size
    with pytest.raises(ModelContractError, match=rf"has size {size}: the plate's rows 30"):
        run(sgld(plate_of_size(size, wrap=False)), Y)


def test_transforms_of_unknown_sites_are_refused_with_the_latent_sites():
    from torch.distributions.transforms import ExpTransform

    kernel = SGLD(mean_model, step_size=1e-3, batch_size=10, seed=0,
                  transforms={"nope": ExpTransform()})  # fmt: skip
    with pytest.raises(ValueError, match=r"transforms names \['nope'\].*latent sites are \['mu'\]"):
        run(kernel, Y)


def test_hidden_features_none_is_refused_by_name():
    with pytest.raises(TypeError, match="hidden_features must be a positive int or a sequence"):
        BayesianMLP(2, None, 1)


def test_a_step_size_that_blows_up_at_once_warns_and_keeps_the_start():
    kernel = SGLD(regressor(), step_size=1e6, batch_size=10, seed=0)
    mcmc = MCMC(kernel, num_samples=5, warmup_steps=5, disable_progbar=True)
    with pytest.warns(UserWarning, match="did not move during sampling.*or every step diverged"):
        mcmc.run(X, Y_REG)
    draws = mcmc.get_samples()
    assert all(float(value.abs().max()) < 10 for value in draws.values())
    assert mcmc.diagnostics()["divergences"]["chain 0"] == [0, 1, 2, 3, 4]
    # run_chains' diagnostics() the same, per chain, for the same kernel: kept draws, not steps
    with pytest.warns(UserWarning, match="did not move"):
        result = run_chains(SGLD(regressor(), step_size=1e6, batch_size=10, seed=0), X, Y_REG,
                            num_chains=1, num_samples=5, warmup_steps=5)  # fmt: skip
    found, reference = result.diagnostics(), mcmc.diagnostics()
    for key in ("divergences", "divergent_steps", "num_steps_per_sample"):
        assert found[key] == reference[key], key
    assert found["divergent_steps"]["chain 0"] != found["divergences"]["chain 0"]


def test_targets_left_out_are_named():
    with pytest.raises(
        ModelContractError,
        match=r"\['obs'\] inside the data plate 'data' have "
        r"no observed value: were the targets passed",
    ):
        run(sgld(regressor()), X)  # fmt: skip


def test_a_misspelt_run_chains_option_is_named():
    with pytest.raises(TypeError, match="num_chain"):
        run_chains(sgld(regressor()), X, Y_REG, num_chain=2)
