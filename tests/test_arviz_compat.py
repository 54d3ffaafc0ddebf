"""The export under ArviZ 0.x (``InferenceData``) and 1.x (``DataTree``), through
``pyro_sgmcmc.analysis._arviz``: the same groups, variables, dimensions and dtypes; a netCDF round
trip of every method's export; LOO and the convergence report on each; the diagnostics agree across
lines.

Every test runs under both lines (which one is installed decides which branch of the compat
layer runs); the runs are tiny, they check plumbing, not statistics.
"""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path

import arviz as az
import matplotlib
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
import xarray as xr
from pyro.infer import MCMC, NUTS

from pyro_sgmcmc import SGHMC, SGLD, _arviz, run_chains
from pyro_sgmcmc.analysis.diagnostics import convergence_report
from pyro_sgmcmc.analysis.export import (
    HMCStatsCollector,
    build_groups,
    from_draws,
    to_datatree,
    to_inference_data,
)
from pyro_sgmcmc.analysis.plots import (
    _label_trace_axes,
    _output_subset,
    diagnostic_figure_names,
    diagnostic_figures,
    has_outputs,
)
from pyro_sgmcmc.errors import SamplerWarning
from pyro_sgmcmc.variational.svi import fit_svi

matplotlib.use("Agg")
import matplotlib.pyplot as plt

N_TRAIN, N_TEST, CHAINS, DRAWS = 30, 5, 2, 20
METHODS = ["nuts", "sghmc_mcmc", "sgld_chains", "svi"]


def regression(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("obs", dist.Normal((x @ w)[idx], s), obs=None if y is None else y[idx])


@pytest.fixture(scope="module")
def data():
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(N_TRAIN + N_TEST, 3, generator=generator)
    y = x @ torch.tensor([1.0, -1.0, 0.5]) + 0.3 * torch.randn(
        N_TRAIN + N_TEST, generator=generator
    )
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def _mcmc(kernel, x, y, hook_fn=None):
    pyro.set_rng_seed(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*sequentially", category=UserWarning)
        mcmc = MCMC(
            kernel,
            num_samples=DRAWS,
            warmup_steps=DRAWS,
            num_chains=CHAINS,
            disable_progbar=True,
            hook_fn=hook_fn,
        )
        mcmc.run(x, y)
    return mcmc


@pytest.fixture(scope="module")
def exports(data):
    """One tiny run of each way of getting draws, exported with training and test data."""
    with warnings.catch_warnings():
        # runs this short are not converged, and the kernels say so
        warnings.filterwarnings("ignore", category=SamplerWarning)
        return _exports(*data)


def _exports(x, y, x_test, y_test):
    test = (x_test, y_test)
    out = {}
    collector = HMCStatsCollector()
    nuts = _mcmc(NUTS(regression, max_tree_depth=4), x, y, hook_fn=collector)
    out["nuts"] = to_inference_data(nuts, regression, x, y, test=test, hmc_stats=collector)
    sghmc = SGHMC(regression, learning_rate=0.01, batch_size=10, num_steps_per_sample=3, seed=2)
    out["sghmc_mcmc"] = to_inference_data(_mcmc(sghmc, x, y), regression, x, y, test=test)
    sgld = SGLD(regression, learning_rate=0.02, batch_size=10, num_steps_per_sample=3, seed=3)
    chains = run_chains(sgld, x, y, num_chains=CHAINS, num_samples=DRAWS, warmup_steps=5)
    out["sgld_chains"] = chains.to_inference_data(test=test)
    svi = fit_svi(
        regression, x, y, num_steps=60, batch_size=10, learning_rate=0.05, num_fits=CHAINS,
        progress_bar=False,
    )  # fmt: skip
    out["svi"] = to_inference_data(svi, regression, x, y, test=test, num_draws=DRAWS)
    out["_svi_result"] = svi
    return out


#: group -> variable -> (dims, dtype kind); "f" any float, "f8" float64, "b" bool.
SCHEMA = {
    "posterior": {
        "w": (("chain", "draw", "w_dim_0"), "f"),
        "s": (("chain", "draw"), "f"),
    },
    "log_likelihood": {"obs": (("chain", "draw", "data"), "f8")},
    "posterior_predictive": {"obs": (("chain", "draw", "data"), "f")},
    "observed_data": {"obs": (("data",), "f")},
    "constant_data": {"x": (("data", "x_dim_1"), "f")},
    "predictions": {"obs": (("chain", "draw", "data"), "f")},
    "predictions_constant_data": {"x": (("data", "x_dim_1"), "f"), "y": (("data",), "f")},
}
SAMPLE_STATS = {
    "nuts": {"step_size", "acceptance_rate", "lp", "energy", "diverging"},
    "sghmc_mcmc": {"step_size", "temperature", "lp", "diverging"},
    "svi": {"lp"},
}


def _check_dtype(array, kind):
    if kind == "f8":
        assert array.dtype == np.float64
    else:
        assert array.dtype.kind == kind, array.dtype


def test_arviz_is_imported_on_first_use_not_with_the_package():
    """Importing ArviZ takes about two seconds (SciPy's statistics, its plots): a script that
    only samples, and the command line's ``--help``, do not wait for it."""
    code = (
        "import sys, pyro_sgmcmc, pyro_sgmcmc.cli.commands; "
        "print(sorted(m for m in ('arviz', 'scipy.stats') if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"
    # on first use: the installed line's module, its version read without importing it
    assert _arviz.az.summary is az.summary
    assert _arviz.ARVIZ_1 == (int(az.__version__.split(".")[0]) >= 1)
    with pytest.raises(AttributeError, match="no attribute 'InferenceDatum'"):
        _arviz.InferenceDatum


def test_the_result_is_the_installed_lines_object(exports):
    idata = exports["nuts"]
    if _arviz.ARVIZ_1:
        assert isinstance(idata, xr.DataTree)
    else:
        assert isinstance(idata, az.InferenceData)
    assert isinstance(idata, _arviz.InferenceData)
    assert _arviz.ARVIZ_1 == (int(az.__version__.split(".")[0]) >= 1)


@pytest.mark.parametrize("method", METHODS)
def test_groups_variables_dims_and_dtypes(exports, method):
    idata = exports[method]
    expected = set(SCHEMA) | {"sample_stats"} | ({"svi_loss"} if method == "svi" else set())
    assert set(_arviz.group_names(idata)) == expected
    for group, variables in SCHEMA.items():
        dataset = _arviz.get_group(idata, group)
        assert isinstance(dataset, xr.Dataset)
        assert set(dataset.data_vars) == set(variables), group
        for name, (dims, kind) in variables.items():
            assert dataset[name].dims == dims, (group, name)
            _check_dtype(dataset[name], kind)
    posterior = _arviz.get_group(idata, "posterior")
    assert posterior.sizes["chain"] == CHAINS and posterior.sizes["draw"] == DRAWS
    assert _arviz.get_group(idata, "log_likelihood").sizes["data"] == N_TRAIN
    assert _arviz.get_group(idata, "predictions").sizes["data"] == N_TEST
    assert (posterior["s"].values > 0).all()
    assert posterior.attrs["method"]
    stats = _arviz.get_group(idata, "sample_stats")
    if method in SAMPLE_STATS:
        assert set(stats.data_vars) == SAMPLE_STATS[method]
    else:
        assert {"lp", "step_size", "diverging"} <= set(stats.data_vars)
    for variable in stats.data_vars.values():
        assert variable.dims == ("chain", "draw")
    if "diverging" in stats:
        _check_dtype(stats["diverging"], "b")
    if method == "svi":
        loss = _arviz.get_group(idata, "svi_loss")["loss"]
        assert loss.dims == ("chain", "svi_step") and loss.shape == (CHAINS, 60)


def test_the_result_holds_the_built_datasets_unchanged(exports, data):
    x, y, x_test, y_test = data
    options = dict(num_draws=3, seed=5, test=(x_test, y_test))
    groups = build_groups(exports["_svi_result"], None, x, y, **options)
    idata = _arviz.from_datasets(groups)
    assert set(_arviz.group_names(idata)) == set(groups)  # 0.x orders them by its schema
    for name, dataset in groups.items():
        assert _arviz.get_group(idata, name).identical(dataset), name
    tree = to_datatree(exports["_svi_result"], None, x, y, **options)
    assert list(tree.children) == list(groups)
    for name, dataset in groups.items():
        assert tree[name].to_dataset().identical(dataset), name


STORES = {
    "netcdf": (_arviz.to_netcdf, _arviz.load_netcdf, ".nc"),
    "zarr": (_arviz.to_zarr, _arviz.load_zarr, ".zarr"),
}


@pytest.mark.parametrize("store", list(STORES))
@pytest.mark.parametrize("method", METHODS)
def test_round_trip(exports, tmp_path, method, store):
    if store == "zarr":
        pytest.importorskip("zarr")
    write, read, suffix = STORES[store]
    idata = exports[method]
    path = tmp_path / f"{method}{suffix}"
    assert write(idata, path) == str(path)
    loaded = read(path)
    assert isinstance(loaded, _arviz.InferenceData)
    assert set(_arviz.group_names(loaded)) == set(_arviz.group_names(idata))
    for group in _arviz.group_names(idata):
        original, restored = _arviz.get_group(idata, group), _arviz.get_group(loaded, group)
        assert set(restored.data_vars) == set(original.data_vars), group
        for name, variable in original.data_vars.items():
            assert restored[name].dims == variable.dims, (group, name)
            assert restored[name].dtype == variable.dtype, (group, name)
            np.testing.assert_array_equal(restored[name].values, variable.values)
    attrs = _arviz.get_group(loaded, "posterior").attrs
    for key, value in _arviz.get_group(idata, "posterior").attrs.items():
        np.testing.assert_array_equal(attrs[key], value, err_msg=key)
    assert convergence_report(loaded).min_ess_bulk == convergence_report(idata).min_ess_bulk


@pytest.mark.parametrize("method", METHODS)
def test_loo_is_finite(exports, method):
    loo = _arviz.loo(exports[method])
    assert math.isfinite(loo.elpd) and math.isfinite(loo.se) and math.isfinite(loo.p)
    assert loo.elpd_i.shape == (N_TRAIN,) and np.isfinite(loo.elpd_i).all()
    assert loo.pareto_k.shape == (N_TRAIN,)
    assert loo.elpd == pytest.approx(loo.elpd_i.sum())


def test_compare_names_its_columns_alike(exports):
    table = _arviz.compare({method: exports[method] for method in METHODS})
    assert set(table.index) == set(METHODS)
    assert {"rank", "elpd", "p", "elpd_diff", "weight", "se", "dse"} <= set(table.columns)
    assert np.isfinite(table["elpd"].values.astype(float)).all()
    diff = table["elpd_diff"].values.astype(float)
    assert diff[0] == 0.0 and (diff <= 0).all()  # each minus the best, under both lines
    assert table["rank"].values[0] == 0


@pytest.mark.parametrize("method", METHODS)
def test_convergence_report(exports, method):
    report = convergence_report(exports[method])
    assert report.num_chains == CHAINS and report.num_draws == DRAWS
    assert math.isfinite(report.max_rhat)
    assert report.min_ess_bulk > 0 and report.min_ess_tail > 0
    assert report.verdict is not None
    single = convergence_report(exports[method].isel(chain=[0]))
    assert single.num_chains == 1 and math.isnan(single.max_rhat)
    # SVI's draws come from a fitted guide: no chain to call converged (the CLI says "fitted")
    fitted = method == "svi"
    assert (report.verdict.statistic == "fitted") == fitted
    assert str(report.verdict).startswith("fitted") == fitted and not (fitted and report.converged)


def test_concat_chains_renumbers_and_keeps_the_rest(exports):
    idata = exports["sghmc_mcmc"]
    joined = _arviz.concat_chains(idata.isel(chain=[1]), idata.isel(chain=[0]))
    assert _arviz.group_names(joined) == _arviz.group_names(idata)
    posterior = _arviz.get_group(joined, "posterior")
    np.testing.assert_array_equal(posterior["chain"].values, [0, 1])
    np.testing.assert_array_equal(
        posterior["w"].values, _arviz.get_group(idata, "posterior")["w"].values[::-1]
    )
    observed = _arviz.get_group(joined, "observed_data")
    assert "chain" not in observed.dims and observed.sizes["data"] == N_TRAIN
    assert posterior.attrs["method"] == _arviz.get_group(idata, "posterior").attrs["method"]
    assert convergence_report(joined).num_chains == 2
    with pytest.raises(ValueError, match="two or more"):
        _arviz.concat_chains(idata)
    # ArviZ 1.x's xarray would pad the shorter run with NaN (then "the chains do not move")
    shorter = idata.isel(draw=slice(0, DRAWS - 3))
    with pytest.raises(ValueError, match=rf"same number of draws.*got {DRAWS - 3}, {DRAWS}"):
        _arviz.concat_chains(shorter, idata)


def test_set_group_adds_and_replaces(exports, data):
    x, y, _, _ = data
    idata = to_inference_data(exports["_svi_result"], None, x, y, num_draws=4)
    extra = xr.Dataset({"a": (("chain", "draw"), np.zeros((CHAINS, 4)))})
    _arviz.set_group(idata, "extra", extra)
    assert _arviz.has_group(idata, "extra")
    posterior = _arviz.get_group(idata, "posterior").isel(draw=slice(0, 2))
    _arviz.set_group(idata, "posterior", posterior)
    assert _arviz.get_group(idata, "posterior").sizes["draw"] == 2
    assert _arviz.group_names(idata).count("posterior") == 1
    with pytest.raises(KeyError, match="nope"):
        _arviz.get_group(idata, "nope")


def test_trace_and_rank_figures_show_every_component_of_a_small_network():
    """67 scalars (a 4-8-3 network's weights): ArviZ 1.x refuses more than 40 panels and 0.x
    draws 40; the figures show all of them."""
    idata = _arviz.from_samples({"w": np.random.default_rng(0).normal(size=(2, 50, 67))})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # 0.x's "generating only 40 plots"
        trace, rank = _arviz.plot_trace(idata), _arviz.plot_rank(idata)
    assert len([ax for ax in trace.axes if ax.get_visible()]) >= 2 * 67
    assert len([ax for ax in rank.axes if ax.get_visible()]) >= 67  # 1.x leaves one more empty


def test_figures_stay_out_of_pyplot(exports, tmp_path):
    idata = exports["nuts"]
    before = plt.get_fignums()
    figures = [
        _arviz.plot_trace(idata, var_names=["s", "w"], figsize=(8, 6)),
        _arviz.plot_rank(idata, var_names=["s", "w"], figsize=(8, 4)),
        _arviz.plot_energy(idata),
        _arviz.plot_forest(
            {name: exports[name] for name in METHODS}, var_names=["s", "w"], figsize=(6, 5)
        ),
        _arviz.plot_pair(idata, var_names=["s", "w"], figsize=(6, 6)),
    ]
    for index, figure in enumerate(figures):
        assert isinstance(figure, matplotlib.figure.Figure) and figure.axes
        figure.savefig(tmp_path / f"{index}.png")
    assert len(figures[0].axes) >= 2 * 4  # trace and density of s, w[0], w[1], w[2]
    assert len(figures[4].axes) >= 6  # s and w's three against each other, lower triangle
    forest_text = " ".join(t.get_text() for ax in figures[3].axes for t in ax.texts)
    forest_text += " ".join(
        t.get_text() for legend in figures[3].legends for t in legend.get_texts()
    ) + " ".join(
        t.get_text()
        for ax in figures[3].axes
        if ax.get_legend()
        for t in ax.get_legend().get_texts()
    )
    assert all(name in forest_text for name in METHODS), forest_text  # each method named
    with pytest.raises(ValueError, match="two scalar components"):
        _arviz.plot_pair(idata, var_names=["s"])
    paths = diagnostic_figures(exports["svi"], "svi", tmp_path)
    assert all((tmp_path / name).stat().st_size > 0 for name in ("svi_trace.png", "svi_rank.png"))
    outputs = has_outputs(exports["svi"])
    assert [Path(path).name for path in paths] == diagnostic_figure_names("svi", outputs=outputs)
    assert plt.get_fignums() == before


def test_figures_of_a_networks_outputs_show_its_least_mixed_outputs(tmp_path):
    """A network's outputs f(x) get trace and rank figures of their own: the test inputs where
    the chains disagree most come first, labelled by test row; trace panels name their axes."""
    rng = np.random.default_rng(0)
    output = rng.normal(size=(2, 60, 10, 1))
    output[1, :, 7] += 5.0  # the chains disagree at test input 7, less at 3
    output[1, :, 3] += 1.0
    idata = _arviz.from_samples({"w": rng.normal(size=(2, 60, 3))}, predictions={"output": output})
    assert has_outputs(idata)
    subset = _output_subset(idata)
    names = list(_arviz.get_group(subset, "posterior").data_vars)
    assert names[:2] == ["f(x_7)", "f(x_3)"] and len(names) == 6
    figure = _arviz.plot_trace(subset, figsize=(9, 10))
    _label_trace_axes(figure, num_draws=60)
    labels = {(ax.get_xlabel(), ax.get_ylabel()) for ax in figure.axes if ax.get_visible()}
    assert ("draw", "value") in labels
    paths = diagnostic_figures(idata, "sghmc", tmp_path)
    assert [Path(path).name for path in paths] == diagnostic_figure_names("sghmc")
    assert all(Path(path).stat().st_size > 0 for path in paths)


def test_bfmi_per_chain(exports):
    bfmi = _arviz.bfmi(exports["nuts"])
    assert bfmi.shape == (CHAINS,) and np.isfinite(bfmi).all() and (bfmi > 0).all()


def test_diagnostics_agree_across_lines():
    """The same draws give the same R-hat, bulk and tail ESS, MCSE, BFMI and LOO under ArviZ 0.23
    and 1.3 (numbers computed with 0.23; the tail ESS at the 5% and 95% quantiles)."""
    rng = np.random.default_rng(3)
    w = rng.normal(size=(2, 200, 3)).cumsum(axis=1) * 0.1 + rng.normal(size=(2, 200, 3))
    log_lik = rng.normal(-1, 0.2, size=(2, 200, 30))
    energy = rng.normal(size=(2, 200))
    idata = _arviz.from_samples(
        {"w": w}, log_likelihood={"obs": log_lik}, sample_stats={"energy": energy}
    )
    posterior = _arviz.get_group(idata, "posterior")
    close = dict(rtol=1e-5)
    np.testing.assert_allclose(
        _arviz.rhat(posterior)["w"].values, [1.462607, 1.100954, 1.000102], **close
    )
    np.testing.assert_allclose(
        _arviz.ess(posterior)["w"].values, [4.037499, 13.698581, 245.885768], **close
    )
    np.testing.assert_allclose(
        _arviz.ess(posterior, method="tail")["w"].values,
        [45.221027, 106.19242, 405.194376],
        **close,
    )
    np.testing.assert_allclose(
        _arviz.mcse(posterior)["w"].values, [0.725249, 0.32521, 0.065841], rtol=1e-4
    )
    np.testing.assert_allclose(_arviz.bfmi(idata), [1.963313, 1.908418], **close)
    loo = _arviz.loo(idata)
    assert loo.elpd == pytest.approx(-30.6117, abs=1e-4)
    assert loo.p == pytest.approx(1.206611, abs=1e-5)
    assert loo.se == pytest.approx(0.06, abs=0.002)  # 0.0593 (0.x), 0.0604 (1.x)


def test_from_draws_builds_the_installed_lines_object_from_arrays_and_tensors():
    """Derived quantities, as a tutorial computes them, reach ArviZ's own functions the same way
    under both lines (``az.from_dict`` changed its signature in 1.x)."""
    rng = np.random.default_rng(0)
    idata = from_draws(
        {"slope": rng.normal(size=(2, 50)), "w": torch.randn(2, 50, 3)},
        posterior_predictive={"obs": rng.normal(size=(2, 50, 4))},
    )
    assert isinstance(idata, _arviz.InferenceData)
    posterior = _arviz.get_group(idata, "posterior")
    assert posterior["w"].dims == ("chain", "draw", "w_dim_0")
    assert posterior["slope"].dtype == np.float64 and posterior["w"].dtype == np.float32
    assert _arviz.has_group(idata, "posterior_predictive")
    table = az.summary(idata, kind="diagnostics")
    assert {"ess_bulk", "r_hat"} <= set(table.columns)
    assert "slope" in table.index and table.shape[0] == 4
    assert convergence_report(idata, "derived").num_draws == 50
    shape = r"must be shaped \(chain, draw, ...\), got shape \(10,\): one chain of draws is"
    with pytest.raises(ValueError, match=rf"posterior variable 'a' {shape}"):
        from_draws({"a": np.zeros(10)})


def test_the_arviz_calls_the_tutorials_make_work_under_both_lines(exports):
    """Tutorials 2 and 6 call ArviZ directly (each line's own ``summary`` columns)."""
    stats = az.summary(exports["sghmc_mcmc"], var_names=["s"], kind="stats")
    assert list(stats.index) == ["s"] and "mean" in stats.columns and "sd" in stats.columns
    rng = np.random.default_rng(1)
    dataset = az.convert_to_dataset({"test accuracy": rng.uniform(size=(2, 40))})
    assert isinstance(dataset, xr.Dataset) and dataset["test accuracy"].dims == ("chain", "draw")
    dataset["train log-lik"] = (("chain", "draw"), rng.normal(size=(2, 40)))
    table = az.summary(dataset, kind="diagnostics")[["ess_bulk", "ess_tail", "r_hat"]]
    assert set(table.index) == {"test accuracy", "train log-lik"}


def test_a_zarr_store_is_never_overwritten(exports, tmp_path):
    pytest.importorskip("zarr")
    path = tmp_path / "run.zarr"
    _arviz.to_zarr(exports["nuts"], path)
    with pytest.raises(FileExistsError, match="give a new path"):
        _arviz.to_zarr(exports["sgld_chains"], path)
    kept = _arviz.get_group(_arviz.load_zarr(path), "posterior")
    assert kept.attrs["method"] == _arviz.get_group(exports["nuts"], "posterior").attrs["method"]
