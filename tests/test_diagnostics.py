"""Convergence report (pyro_sgmcmc.analysis.diagnostics) on SG-MCMC chains of a conjugate model."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
import xarray as xr
from pyro.infer import MCMC
from pyro.infer.autoguide.initialization import init_to_sample

from pyro_sgmcmc import SGHMC, SGLD, _arviz, run_chains
from pyro_sgmcmc.analysis.diagnostics import (
    FUNCTION_RHAT_BOUND,
    RHAT_BOUND,
    ConvergenceReport,
    convergence_report,
    format_reports,
    reports_table,
)
from pyro_sgmcmc.analysis.export import to_inference_data
from pyro_sgmcmc.errors import SamplerWarning
from pyro_sgmcmc.nn import BayesianMLP

NUM_DATA = 20


def normal_mean(y):
    """mu ~ N(0, 1), y_i ~ N(mu, 1): the posterior is N(sum y / (N + 1), 1 / (N + 1))."""
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])


@pytest.fixture(scope="module")
def y():
    return 1.0 + torch.randn(NUM_DATA, generator=torch.Generator().manual_seed(0))


def _sgld_run(y, *, num_draws, num_chains=2, seed=0, step_size=0.01, initial=None):
    kernel = SGLD(
        normal_mean,
        step_size=step_size,
        batch_size=10,
        num_steps_per_sample=3,
        seed=seed,
        init_strategy=init_to_sample,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*sequentially", category=UserWarning)
        mcmc = MCMC(
            kernel,
            num_samples=num_draws,
            warmup_steps=50,
            num_chains=num_chains,
            disable_progbar=True,
            initial_params=initial,
        )
        mcmc.run(y)
    return to_inference_data(mcmc, normal_mean, y, posterior_predictive=False, wall_time=2.0)


def _check_two_chains_agree(y, num_draws, threshold):
    idata = _sgld_run(y, num_draws=num_draws)
    draws = idata.posterior["mu"].values
    assert not np.allclose(draws[0], draws[1]), "chains from different seeds must differ"
    report = convergence_report(idata)
    assert report.num_chains == 2 and report.num_draws == num_draws
    assert report.max_rhat < threshold, report
    # Posterior N(m, 1/(N+1)); SGLD adds an O(step size) bias to the variance only.
    mean = float(y.sum()) / (NUM_DATA + 1)
    se = draws.std() / math.sqrt(report.min_ess_bulk)
    assert abs(draws.mean() - mean) < 4 * se
    return report


def test_two_sgld_chains_agree_quick(y):
    """Short run: R-hat is within its sampling noise of 1 (about 1/ESS), far below 1.1."""
    report = _check_two_chains_agree(y, num_draws=200, threshold=1.05)
    assert report.min_ess_bulk > 50


@pytest.mark.slow
def test_two_sgld_chains_agree_long_run(y):
    report = _check_two_chains_agree(y, num_draws=3000, threshold=1.01)
    assert report.converged


def test_stuck_chain_gives_large_rhat(y):
    moving = _sgld_run(y, num_draws=100, num_chains=1, seed=1)
    # A step size of 1e-9 leaves the chain where it started, 13 posterior sds away.
    stuck = _sgld_run(
        y, num_draws=100, num_chains=1, seed=2, step_size=1e-9, initial={"mu": torch.tensor(4.0)}
    )
    assert abs(float(stuck.posterior["mu"].mean()) - 4.0) < 0.01
    combined = _arviz.concat_chains(moving, stuck)
    report = convergence_report(combined, "SGLD, one chain stuck", wall_time=4.0)
    assert report.num_chains == 2
    assert report.max_rhat > 1.1
    assert not report.converged
    summary = _arviz.summary(combined)
    assert report.max_rhat == pytest.approx(float(summary["r_hat"].max()), abs=0.01)


def test_an_mcmc_run_of_our_kernel_records_its_sampling_time(y):
    """Exported without ``wall_time=``, an ``MCMC`` run of an SG-MCMC kernel carries the seconds
    its chains sampled (sequential chains: their sum) and were set up, so that the report gives
    ESS per second as for ``run_chains``; a chain restored from its state keeps its seconds."""
    kernel = SGLD(normal_mean, batch_size=10, num_steps_per_sample=3, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc = MCMC(kernel, num_samples=30, warmup_steps=20, num_chains=2, disable_progbar=True)
        mcmc.run(y)
        idata = to_inference_data(mcmc, normal_mean, y, posterior_predictive=False)
    seconds = mcmc.diagnostics()["sampling_seconds"]
    attrs = idata.posterior.attrs
    assert attrs["sampling_time"] == pytest.approx(seconds["chain 0"] + seconds["chain 1"])
    assert 0 < seconds["chain 0"] < attrs["sampling_time"] and attrs["setup_time"] > 0
    report = convergence_report(idata)
    assert report.wall_time == attrs["sampling_time"] and math.isfinite(report.ess_bulk_per_second)
    kernel.setup(20, y)
    for _ in range(3):
        kernel.sample(kernel.current_params)
    state = kernel.state_dict()
    restored = SGLD(normal_mean, batch_size=10, num_steps_per_sample=3, seed=0)
    restored.setup(20, y)
    restored.load_state_dict(state)
    assert restored.diagnostics()["sampling_seconds"] == state["sampling_seconds"] > 0


def test_report_fields_table_and_validation(y, capfd):
    idata = _sgld_run(y, num_draws=60)
    report = convergence_report(idata)
    assert report.method == "SGLD"
    assert report.wall_time == 2.0
    assert report.ess_bulk_per_second == pytest.approx(report.min_ess_bulk / 2.0)
    assert report.divergences == int(idata.sample_stats["diverging"].sum()) == 0
    posterior = _arviz.get_group(idata, "posterior")
    bulk = _arviz.ess(posterior, method="bulk")["mu"].item()
    tail = _arviz.ess(posterior, method="tail")["mu"].item()
    assert report.min_ess_bulk == pytest.approx(bulk)
    assert report.min_ess_tail == pytest.approx(tail)
    as_dict = report.to_dict()
    assert set(as_dict) == {
        "method",
        "num_chains",
        "num_draws",
        "max_rhat",
        "min_ess_bulk",
        "min_ess_tail",
        "wall_time",
        "ess_bulk_per_second",
        "divergences",
        "converged",
        "verdict",
        "basis",
    }
    assert as_dict["verdict"] == str(report.verdict) and as_dict["basis"] == "parameters"
    other = ConvergenceReport("NUTS", 1, 10, math.nan, 5.0, 4.0, math.nan, math.nan, 3)
    table = format_reports([report, other])
    lines = table.splitlines()
    assert len(lines) == 4 and lines[2].startswith("SGLD") and lines[3].startswith("NUTS")
    assert "max R-hat" in lines[0] and " - " in lines[3]
    assert str(report) == format_reports([report])
    capfd.readouterr()
    single = convergence_report(idata.sel(chain=[0]), wall_time=1.0)
    assert math.isnan(single.max_rhat) and single.min_ess_bulk > 0
    # one chain has no R-hat: not computed, so ArviZ logs no "Shape validation failed"
    assert "Shape validation" not in capfd.readouterr().err
    frame = reports_table([report, other])
    assert list(frame.index) == ["SGLD", "NUTS"]
    assert list(frame.columns) == [
        "chains",
        "draws",
        "max R-hat",
        "min ESS bulk",
        "min ESS tail",
        "time [s]",
        "ESS/s",
        "divergences",
        "judged on",
        "verdict",
    ]
    assert frame.loc["SGLD", "verdict"] == str(report.verdict)
    assert frame.loc["SGLD", "judged on"] == "parameters"
    assert frame.loc["SGLD", "min ESS bulk"] == pytest.approx(report.min_ess_bulk)
    assert math.isnan(frame.loc["NUTS", "max R-hat"]) and frame.loc["NUTS", "divergences"] == 3
    with pytest.raises(ValueError, match="reports"):
        format_reports([])
    with pytest.raises(ValueError, match="reports"):
        reports_table([])
    with pytest.raises(ValueError, match="var_names"):
        convergence_report(idata, var_names=["nope"])
    with pytest.raises(ValueError, match="wall_time"):
        convergence_report(idata, wall_time=-1.0)


def test_a_network_report_judges_its_outputs_and_names_any_other_choice():
    rng = np.random.default_rng(0)
    # two chains that disagree a little: R-hat about 1.03, within a network's outputs' bound,
    # beyond a parameter's
    stuck = rng.normal(size=(2, 500)) + np.array([[0.0], [0.5]])
    idata = _arviz.from_samples(
        {"w": rng.normal(size=(2, 500, 3)), "sigma": stuck},
        predictions={"output": rng.normal(size=(2, 500, 4)), "obs": stuck[..., None]},
        log_likelihood={"obs": stuck[..., None] + rng.normal(size=(2, 500, 5))},
    )
    idata["posterior"].attrs["function_space"] = 1  # as the export marks a network
    outputs = convergence_report(idata)
    assert outputs.verdict.basis == "f(x)" and outputs.verdict.converged
    # sigma is a parameter of the posterior: named there, judged with the parameters' bound
    for report in (
        convergence_report(idata, var_names=["sigma"]),
        convergence_report(idata, group="posterior", var_names=["sigma"]),
    ):
        assert report.verdict.basis == "parameters" and not report.verdict.converged
        assert report.verdict.statistic == "R-hat" and report.verdict.bound == RHAT_BOUND
        assert RHAT_BOUND < report.max_rhat < FUNCTION_RHAT_BOUND
    ll = convergence_report(idata, group="log_likelihood")
    assert ll.verdict.basis == "log_likelihood" and ll.verdict.bound == RHAT_BOUND
    assert convergence_report(idata, group="log_likelihood", function_space=True).verdict.converged
    assert "R-hat of log_likelihood" in str(ll.verdict)
    # the replicated observations beside the outputs are not f(x): named, the parameters' bound
    observations = convergence_report(idata, group="predictions", var_names=["obs"]).verdict
    assert (observations.basis, observations.bound) == ("predictions", RHAT_BOUND)
    assert not observations.converged and "R-hat of predictions" in str(observations)
    explicit = convergence_report(idata, group="predictions", var_names=["output"])
    assert explicit.verdict == outputs.verdict
    assert convergence_report(idata, var_names=["output"]).verdict == outputs.verdict


def test_misuse_of_the_report_is_refused_by_name(tmp_path):
    rng = np.random.default_rng(0)
    idata = _arviz.from_samples(
        {"sigma": rng.normal(size=(2, 100)), "w": rng.normal(size=(2, 100))},
        observed_data={"y": rng.normal(size=5)},
    )
    path = tmp_path / "run.nc"
    _arviz.to_netcdf(idata, path)
    posterior = idata["posterior"] if _arviz.ARVIZ_1 else idata.posterior
    for wrong, message in [
        (str(path), r"idata must be an .* got str; for a file, load it first"),
        (posterior.to_dataset() if _arviz.ARVIZ_1 else posterior, "got Dataset"),
        (rng.normal(size=(2, 100)), "got ndarray"),
    ]:
        with pytest.raises(TypeError, match=message):
            convergence_report(wrong)
    if _arviz.ARVIZ_1:  # one node of the tree, as az.thin(idata) returns it
        with pytest.raises(TypeError, match="the group 'posterior' of a result, not the result"):
            convergence_report(posterior)
        # a whole result inside a larger tree is a result
        nested = xr.DataTree(children={"sghmc": idata.copy()})
        assert convergence_report(nested["sghmc"]) == convergence_report(idata)
    with pytest.raises(ValueError, match=r"'observed_data' holds no draws.*\['posterior'\]"):
        convergence_report(idata, group="observed_data")
    with pytest.raises(ValueError, match="at least one variable"):
        convergence_report(idata, var_names=[])
    # a name alone, as ArviZ takes it
    assert convergence_report(idata, var_names="sigma") == convergence_report(
        idata, var_names=["sigma"]
    )


def test_report_on_another_group_and_bad_group():
    rng = np.random.default_rng(0)
    idata = _arviz.from_samples(
        {"w": rng.normal(size=(2, 100))},
        predictions={"output": rng.normal(size=(2, 100, 3))},
    )
    report = convergence_report(idata, method="m", group="predictions", var_names=["output"])
    assert report.num_chains == 2 and report.max_rhat < 1.1
    with pytest.raises(ValueError, match="group must be one of"):
        convergence_report(idata, group="nope")


def test_an_export_without_test_inputs_is_judged_at_the_rows_the_run_judged(tmp_path):
    """A network run without a test set is judged at up to 64 training rows; its export stores
    the outputs at every row, and ``convergence_report`` judges the rows the run judged, so that
    one file says one verdict (it judged all 150 rows before, R-hat 1.259 against the run's
    1.248 in a user's probe). Asked for the group by name, it judges every row."""
    generator = torch.Generator().manual_seed(2)
    # rows in random order: the outputs that mix worst (the ends of the inputs' range) are then
    # at rows the run did not judge (with this seed; with seed 1 and SGHMC's BAOAB step the
    # worst output happened to be at a judged row)
    x = torch.linspace(-1, 1, 150)[torch.randperm(150, generator=generator)].unsqueeze(-1)
    y = torch.sin(3 * x.squeeze(-1)) + 0.1 * torch.randn(150, generator=generator)
    kernel = SGHMC(BayesianMLP(1, [8], 1), batch_size=16, num_steps_per_sample=2, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplerWarning)
        result = run_chains(kernel, x, y, num_chains=2, num_samples=30, warmup_steps=40,
                            target_ess=None)  # fmt: skip
    assert result.verdict.basis == "f(x)" and result.judged_of_rows == 150
    assert len(result.judged_rows) == 64 and result.judged_rows[-1] == 149
    path = tmp_path / "run.nc"
    _arviz.to_netcdf(to_inference_data(result), path)
    idata = _arviz.load_netcdf(path)
    assert _arviz.get_group(idata, "posterior_predictive")["output"].shape[2] == 150
    verdict = result.verdict
    run_numbers = {verdict.statistic: verdict.value, **{s: v for s, v, _ in verdict.others}}
    report = convergence_report(idata)
    assert (report.basis, report.converged) == ("f(x)", verdict.converged)
    report_numbers = {"R-hat": report.max_rhat, "bulk ESS": report.min_ess_bulk,
                      "tail ESS": report.min_ess_tail}  # fmt: skip
    assert report_numbers == pytest.approx(run_numbers, rel=1e-6)
    every_row = convergence_report(idata, group="posterior_predictive", var_names=["output"])
    every_row_numbers = (every_row.max_rhat, every_row.min_ess_bulk, every_row.min_ess_tail)
    assert every_row_numbers != pytest.approx(tuple(report_numbers.values()), rel=1e-6)


def _outputs(rows_apart: list[int]) -> xr.Dataset:
    """Outputs ``(4 chains, 200 draws, 3 rows)``: independent draws, each chain shifted by 3
    at the rows ``rows_apart`` (R-hat far above 1 there)."""
    generator = np.random.default_rng(0)
    values = generator.normal(size=(4, 200, 3))
    values[:, :, rows_apart] += 3.0 * np.arange(4)[:, None, None]
    return xr.Dataset({"output": (("chain", "draw", "data"), values)})


def test_the_judged_rows_apply_to_the_training_outputs_only():
    """The rows a run judged (``judged_rows`` of ``judged_of_rows``) select the training
    outputs; test outputs of as many rows are judged at every row."""
    posterior = xr.Dataset(
        {"w": (("chain", "draw"), np.random.default_rng(1).normal(size=(4, 200)))}
    )
    posterior.attrs.update(function_space=1, judged_rows=[0], judged_of_rows=3)
    training = {"posterior": posterior, "posterior_predictive": _outputs([1, 2])}
    assert convergence_report(_arviz.from_datasets(training)).converged  # row 0 alone
    every_row = convergence_report(_arviz.from_datasets(training), group="posterior_predictive")
    assert every_row.max_rhat > 2
    with_test = _arviz.from_datasets({**training, "predictions": _outputs([1])})
    assert convergence_report(with_test).max_rhat > 2  # every test row, row 1 among them


def test_an_mcmc_export_of_a_network_is_judged_where_its_warning_judged_it():
    """``pyro.infer.MCMC`` with our kernel warns with a verdict on a network's outputs at up to
    64 training rows; the export records them, and the report says what the warning said."""
    generator = torch.Generator().manual_seed(1)
    x = torch.linspace(-1, 1, 150)[torch.randperm(150, generator=generator)].unsqueeze(-1)
    y = torch.sin(3 * x.squeeze(-1)) + 0.1 * torch.randn(150, generator=generator)
    model = BayesianMLP(1, [8], 1)
    kernel = SGHMC(model, batch_size=16, num_steps_per_sample=2, seed=0)
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=40, num_chains=2, disable_progbar=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mcmc.run(x, y)
    (warning,) = [str(w.message) for w in caught if "not converged" in str(w.message)]
    idata = to_inference_data(mcmc, model, x, y)
    posterior = _arviz.get_group(idata, "posterior")
    assert len(posterior.attrs["judged_rows"]) == 64 and posterior.attrs["judged_of_rows"] == 150
    report = convergence_report(idata)
    assert f"{report.verdict}" in warning
