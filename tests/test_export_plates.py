"""The export's plates: the data plate a run subsampled is the export's by default, and every
other plate names the axes it spans (pyro_sgmcmc.analysis.export)."""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC, NUTS

from pyro_sgmcmc import SGHMC, SGLD, run_chains
from pyro_sgmcmc.analysis.export import to_inference_data
from pyro_sgmcmc.analysis.export_trace import plate_axes
from pyro_sgmcmc.errors import ModelContractError
from pyro_sgmcmc.variational.svi import fit_svi

ROWS, GROUPS = 24, 3
FAST = {"step_size": 1e-3, "num_steps_per_sample": 2, "seed": 0}


def grouped(y):
    """Group means around a common one; rows (the data plate, ``rows``) by groups."""
    mu = pyro.sample("mu", dist.Normal(0.0, 5.0))
    with pyro.plate("groups", GROUPS, dim=-1):
        a = pyro.sample("a", dist.Normal(mu, 1.0))
        with pyro.plate("rows", y.shape[0], dim=-2):
            pyro.sample("obs", dist.Normal(a, 1.0), obs=y)


@pytest.fixture(scope="module")
def y():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(ROWS, GROUPS, generator=generator) + torch.arange(3.0)


def _dims(idata, group: str) -> dict[str, tuple[str, ...]]:
    return {name: tuple(idata[group][name].dims) for name in idata[group].data_vars}


def _check_named(idata, test_rows: int | None = None) -> None:
    assert _dims(idata, "posterior") == {"mu": ("chain", "draw"), "a": ("chain", "draw", "groups")}
    assert _dims(idata, "log_likelihood") == {"obs": ("chain", "draw", "rows")}
    assert _dims(idata, "observed_data") == {"obs": ("rows", "groups")}
    assert _dims(idata, "posterior_predictive") == {"obs": ("chain", "draw", "rows", "groups")}
    assert idata.posterior.sizes["groups"] == GROUPS and idata.observed_data.sizes["rows"] == ROWS
    if test_rows is not None:
        assert _dims(idata, "predictions") == {"obs": ("chain", "draw", "rows", "groups")}
        assert idata.predictions.sizes["rows"] == test_rows


def _quiet(run, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run(*args, **kwargs)


def test_a_run_chains_result_exports_on_the_plate_it_subsampled(y):
    kernel = SGHMC(grouped, subsample_plate="rows", batch_size=8, **FAST)
    result = _quiet(run_chains, kernel, y, num_chains=2, num_samples=6, warmup_steps=4)
    assert result.plate_name == "rows"
    _check_named(to_inference_data(result))


def test_an_mcmc_run_of_a_kernel_exports_on_its_plate_with_a_test_set(y):
    mcmc = MCMC(SGLD(grouped, subsample_plate="rows", batch_size=8, **FAST), num_samples=6,
                warmup_steps=4, disable_progbar=True)  # fmt: skip
    _quiet(mcmc.run, y)
    _check_named(to_inference_data(mcmc, test=(y[:5],)), test_rows=5)


def test_an_svi_fit_exports_on_its_plate(y):
    fits = _quiet(fit_svi, grouped, y, num_steps=3, plate_name="rows", seed=0)
    _check_named(to_inference_data(fits, num_draws=5))


def test_nuts_takes_the_plate_by_name_and_a_wrong_one_is_still_named(y):
    pyro.set_rng_seed(0)
    mcmc = MCMC(NUTS(grouped), num_samples=5, warmup_steps=5, disable_progbar=True)
    _quiet(mcmc.run, y)
    with pytest.raises(ModelContractError, match=r"plate_name='data'.*plates found"):
        to_inference_data(mcmc)
    _check_named(to_inference_data(mcmc, plate_name="rows"))


def test_a_given_plate_name_or_dims_win(y):
    kernel = SGHMC(grouped, subsample_plate="rows", batch_size=8, **FAST)
    result = _quiet(run_chains, kernel, y, num_chains=1, num_samples=5, warmup_steps=2)
    idata = to_inference_data(result, plate_name="rows", dims={"a": ["group"]})
    assert _dims(idata, "posterior")["a"] == ("chain", "draw", "group")
    assert _dims(idata, "observed_data")["obs"] == ("rows", "groups")
    with pytest.raises(ValueError, match="plate_name must be a non-empty string or None"):
        to_inference_data(result, plate_name="")


def _trace(model, *args):
    return pyro.poutine.trace(model).get_trace(*args)


def test_plate_axes_leave_subsampled_and_broadcast_axes_unnamed():
    def model():
        with pyro.plate("kept", 4, dim=-1):
            pyro.sample("full", dist.Normal(0.0, 1.0))
            pyro.sample("event", dist.Normal(torch.zeros(4, 2), 1.0).to_event(1))
        with pyro.plate("sub", 6, subsample_size=2, dim=-1):
            pyro.sample("subsampled", dist.Normal(0.0, 1.0))
        with pyro.plate("outer", 5, dim=-2), pyro.plate("inner", 3, dim=-1):
            pyro.sample("matrix", dist.Normal(0.0, 1.0))
            pyro.sample("broadcast", dist.Normal(0.0, 1.0), obs=torch.zeros(1, 1))

    axes = plate_axes(_trace(model), plate_name="inner")
    assert axes["full"] == {0: "kept"}
    assert axes["event"] == {0: "kept"}  # the event axis is not the plate's
    assert "subsampled" not in axes
    assert axes["matrix"] == {0: "outer"}  # the data plate (here "inner") is named elsewhere
    assert "broadcast" not in axes  # its value has size 1 along "outer"


def with_extras(y, y_row):
    """:func:`grouped` with deterministic sites and an observation broadcast over the groups."""
    mu = pyro.sample("mu", dist.Normal(0.0, 5.0))
    with pyro.plate("groups", GROUPS, dim=-1):
        a = pyro.sample("a", dist.Normal(mu, 1.0))
        pyro.deterministic("shifted", a + 1.0)
        with pyro.plate("rows", y.shape[0], dim=-2):
            pyro.deterministic("mean", a.expand(y.shape))
            pyro.sample("obs", dist.Normal(a, 1.0), obs=y)
            pyro.sample("row_obs", dist.Normal(a, 1.0), obs=y_row)  # (rows, 1): broadcast


def test_deterministic_broadcast_and_unread_groups_keep_the_names_consistent(y):
    """A deterministic site is named like the others; an observation broadcast over a plate
    keeps ``<site>_dim_<k>`` in every group (its draws span the plate, its data do not, and
    one name with two sizes could not share a dataset with a site that spans it); and the
    posterior is named whatever groups are asked for."""
    y_row = y[:, :1].clone()
    kernel = SGHMC(with_extras, subsample_plate="rows", batch_size=8, **FAST)
    result = _quiet(run_chains, kernel, y, y_row, num_chains=2, num_samples=5, warmup_steps=2)
    idata = to_inference_data(result)
    predictive = _dims(idata, "posterior_predictive")
    assert predictive["shifted"] == ("chain", "draw", "groups")
    assert predictive["mean"] == predictive["obs"] == ("chain", "draw", "rows", "groups")
    assert predictive["row_obs"] == ("chain", "draw", "rows", "row_obs_dim_1")
    observed = _dims(idata, "observed_data")
    assert observed["row_obs"] == ("rows", "row_obs_dim_1") and observed["obs"] == (
        "rows",
        "groups",
    )
    assert idata.observed_data.sizes["row_obs_dim_1"] == 1
    bare = to_inference_data(result, log_likelihood=False, posterior_predictive=False)
    assert _dims(bare, "posterior")["a"] == ("chain", "draw", "groups")
    # no group read per draw: the observed rows are named all the same (were obs_dim_0)
    assert _dims(bare, "observed_data") == observed
