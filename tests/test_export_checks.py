"""ArviZ export: energy for NUTS/HMC, float64 log-likelihood, chunks of hand-written models, chains
sources, and the checks that refuse a wrong model, wrong labels or a wrong test set.

Most tests export a small stand-in "chains source" (draws written down directly, the duck type the
vectorised runner produces), so that no inference runs; the energy tests run a short NUTS/HMC.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import matplotlib
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import HMC, MCMC, NUTS

from pyro_sgmcmc.analysis import _arviz
from pyro_sgmcmc.analysis.export import (
    HMCStatsCollector,
    ModelMismatchError,
    ModelMismatchWarning,
    build_groups,
    model_fingerprint,
    to_inference_data,
)
from pyro_sgmcmc.analysis.fitted_data import check_fitted_data
from pyro_sgmcmc.nn import BayesianMLP
from pyro_sgmcmc.nn.priors import ScaleMixtureNormal
from pyro_sgmcmc.variational.svi import fit_svi

matplotlib.use("Agg")
import matplotlib.pyplot as plt

N, N_TEST = 24, 6


def indexed(x, y=None):
    """The data-plate contract: the data indexed with the plate's indices."""
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    mean = x @ w
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mean[idx], s), obs=None if y is None else y[idx])


def observed_whole(x, y=None):
    """The common Pyro idiom: the plate sized from the data, ``obs=y`` without indices."""
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", len(x)):
        pyro.sample("obs", dist.Normal(x @ w, s), obs=y)


def two_outputs(x, y=None):
    """Rows on plate dim -2, two responses per row in an inner plate."""
    w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", len(x), dim=-2), pyro.plate("response", 2, dim=-1):
        pyro.sample("obs", dist.Normal(x @ w, s), obs=y)


def fixed_size(x, y=None):
    """A plate whose size is a constant: neither conditioning nor slicing can chunk it."""
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", N):
        pyro.sample("obs", dist.Normal(x @ w, s), obs=y)


@dataclass
class Chains:
    """A stand-in for the vectorised runner's result (the duck type the export accepts)."""

    samples: dict[str, torch.Tensor]
    sample_stats: dict[str, np.ndarray]
    model: Any
    args: tuple
    kwargs: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(N + N_TEST, 3, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 * torch.randn(N + N_TEST, generator=generator)
    return x[:N], y[:N], x[N:], y[N:]


def _draws(shapes: dict[str, tuple], chains: int = 2, draws: int = 5, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        value = 0.3 * torch.randn(chains, draws, *shape, generator=generator)
        out[name] = value.exp() if name == "s" else value
    return out


def _source(model, args, shapes=None, **kw):
    shapes = shapes or {"w": (3,), "s": ()}
    samples = _draws(shapes)
    stats = {"lp": np.zeros((2, 5)), "diverging": np.zeros((2, 5), dtype=bool)}
    return Chains(samples, stats, model, args, **kw)


# ---------------------------------------------------------------------------------------------
# energy of NUTS / HMC
# ---------------------------------------------------------------------------------------------
def _run(kernel, data, num_samples=60, warmup=40, collector=None):
    x, y, _, _ = data
    pyro.set_rng_seed(1)
    collector = HMCStatsCollector() if collector is None else collector
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*sequentially", category=UserWarning)
        mcmc = MCMC(
            kernel,
            num_samples=num_samples,
            warmup_steps=warmup,
            num_chains=2,
            disable_progbar=True,
            hook_fn=collector,
        )
        mcmc.run(x, y)
    return mcmc, collector


@pytest.mark.parametrize("kernel", ["NUTS", "HMC"])
def test_energy_is_the_hamiltonian_at_the_start_of_each_transition(data, kernel):
    """H_n = U(q_{n-1}) + K_n: energy_n + lp_{n-1} is the kinetic energy of a fresh momentum,
    (1/2) chi^2 with d = 4 degrees of freedom (w: 3, log s: 1): mean 2, variance 2. A z-test on the
    2 x 59 transitions; K >= 0 always. Exporting U alone (no momentum) would give K = 0."""
    x, y, _, _ = data
    sampler = NUTS(indexed) if kernel == "NUTS" else HMC(indexed, step_size=0.1, num_steps=8)
    mcmc, collector = _run(sampler, data)
    idata = to_inference_data(mcmc, indexed, x, y, hmc_stats=collector, posterior_predictive=False)
    energy = idata.sample_stats["energy"].values
    lp = idata.sample_stats["lp"].values
    assert energy.shape == (2, 60) and np.isfinite(energy).all()
    kinetic = energy[:, 1:] + lp[:, :-1]
    assert (kinetic >= -1e-4).all()
    n = kinetic.size
    assert abs(kinetic.mean() - 2.0) < 4.5 * math.sqrt(2.0 / n)


def test_bfmi_and_energy_plot_work_on_a_nuts_export(data):
    x, y, _, _ = data
    mcmc, collector = _run(NUTS(indexed), data)
    idata = to_inference_data(mcmc, indexed, x, y, hmc_stats=collector)
    bfmi = _arviz.bfmi(idata)
    assert bfmi.shape == (2,) and np.isfinite(bfmi).all() and (bfmi > 0).all()
    assert _arviz.plot_energy(idata).axes
    assert not plt.get_fignums()


def test_without_warmup_the_first_draw_has_no_energy_and_energy_is_left_out(data):
    x, y, _, _ = data
    mcmc, collector = _run(NUTS(indexed), data, num_samples=5, warmup=0)
    with pytest.warns(UserWarning, match="warmup_steps >= 1"):
        idata = to_inference_data(mcmc, indexed, x, y, hmc_stats=collector)
    assert "energy" not in idata.sample_stats and "lp" in idata.sample_stats


def test_hmc_stats_must_be_a_collector(data):
    x, y, _, _ = data
    source = _source(indexed, (x, y))
    with pytest.raises(TypeError, match=r"hmc_stats must be .*HMCStatsCollector.*'x'"):
        to_inference_data(source, None, hmc_stats="x")


# ---------------------------------------------------------------------------------------------
# log-likelihood: float64, chunks of hand-written models
# ---------------------------------------------------------------------------------------------
def _direct_log_likelihood(samples, x, y):
    w, s = samples["w"].double(), samples["s"].double()
    mean = torch.einsum("nk,cdk->cdn", x.double(), w)
    return dist.Normal(mean, s[..., None]).log_prob(y.double()).numpy()


@pytest.mark.parametrize("model", [indexed, observed_whole])
def test_log_likelihood_is_float64_and_chunks_agree(data, model):
    x, y, _, _ = data
    source = _source(model, (x, y))
    whole = build_groups(source, None, seed=3)
    for chunk_size in (5, 7, N):
        chunked = build_groups(source, None, seed=3, chunk_size=chunk_size)
        values = chunked["log_likelihood"]["obs"]
        assert values.dtype == np.float64 and values.dims == ("chain", "draw", "data")
        # the model computes in float32: chunks change the summation order (BLAS kernels differ
        # by CPU), so the values agree to a few float32 epsilons (1.2e-7), not to float64's
        np.testing.assert_allclose(
            values.values, whole["log_likelihood"]["obs"].values, rtol=1e-5, atol=1e-6
        )
        assert chunked["posterior_predictive"]["obs"].shape == (2, 5, N)
        np.testing.assert_array_equal(chunked["observed_data"]["obs"].values, y.numpy())
    # the model's float32 values against a float64 computation
    np.testing.assert_allclose(
        whole["log_likelihood"]["obs"].values,
        _direct_log_likelihood(source.samples, x, y),
        rtol=1e-5,
        atol=1e-6,
    )


def test_chunks_of_a_two_dimensional_observation(data):
    x, _, _, _ = data
    y = torch.stack([x.sum(-1), x[:, 0]], -1)
    source = _source(two_outputs, (x, y), shapes={"w": (3, 2), "s": ()})
    whole = build_groups(source, None, seed=1)
    chunked = build_groups(source, None, seed=1, chunk_size=5)
    assert chunked["log_likelihood"]["obs"].shape == (2, 5, N)  # responses summed per row
    np.testing.assert_allclose(  # float32: chunks change the summation order (see above)
        chunked["log_likelihood"]["obs"].values,
        whole["log_likelihood"]["obs"].values,
        rtol=1e-5,
        atol=1e-6,
    )
    assert chunked["posterior_predictive"]["obs"].shape == (2, 5, N, 2)


def test_a_model_that_cannot_be_chunked_is_refused(data):
    x, y, _, _ = data
    source = _source(fixed_size, (x, y))
    assert build_groups(source, None)["log_likelihood"]["obs"].shape == (2, 5, N)
    with pytest.raises(ValueError, match=r"chunk_size=5: .*cannot be split.*chunk_size=None"):
        build_groups(source, None, chunk_size=5)


def test_loo_and_compare_on_float32_models(data):
    """A float32 model still gets a float64 log-likelihood, and ArviZ's loo / compare run."""
    x, y, _, _ = data
    sources = {
        name: Chains(
            _draws({"w": (3,), "s": ()}, draws=40, seed=seed),
            {},
            indexed,
            (x, y),
        )
        for seed, name in enumerate(("a", "b"))
    }
    exports = {name: to_inference_data(source) for name, source in sources.items()}
    for idata in exports.values():
        assert idata.log_likelihood["obs"].dtype == np.float64
        assert math.isfinite(_arviz.loo(idata).elpd)
    compared = _arviz.compare(exports)
    assert np.isfinite(compared["elpd"].values).all()


# ---------------------------------------------------------------------------------------------
# a chains source
# ---------------------------------------------------------------------------------------------
def test_chains_source_is_exported_with_its_statistics_and_attributes(data):
    x, y, x_test, y_test = data
    source = _source(indexed, (x, y), attrs={"method": "sghmc", "num_gradient_steps": 10})
    idata = to_inference_data(source, test=(x_test, y_test), wall_time=2.5)
    assert set(idata.sample_stats.data_vars) == {"lp", "diverging"}
    assert idata.posterior.attrs["method"] == "sghmc"
    assert idata.posterior.attrs["num_gradient_steps"] == 10
    assert idata.posterior.attrs["sampling_time"] == 2.5
    assert idata.predictions["obs"].shape == (2, 5, N_TEST)
    np.testing.assert_allclose(  # the model's float32 values against a float64 computation
        idata.log_likelihood["obs"].values,
        _direct_log_likelihood(source.samples, x, y),
        rtol=1e-5,
        atol=1e-6,
    )


def test_chains_source_without_attrs_and_with_numpy_data(data):
    x, y, _, _ = data

    class Bare:
        def __init__(self):
            self.samples = _draws({"w": (3,), "s": ()})
            self.sample_stats = {}
            self.model = indexed
            self.args = (x.numpy(), y.numpy())
            self.kwargs = {}

    idata = to_inference_data(Bare())
    assert idata.posterior.attrs["method"] == "Bare"
    assert idata.log_likelihood["obs"].shape == (2, 5, N)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"sample_stats": {"lp": np.zeros((2, 4))}}, r"sample_stats\['lp'\] must have shape"),
        ({"samples": {"w": np.zeros((2, 5, 3))}}, r"samples\['w'\] must be a torch.Tensor"),
        ({"samples": {}}, "non-empty dict"),
        (
            {"samples": {"w": torch.zeros(2, 5, 3), "s": torch.ones(2, 4)}},
            r"disagree on \(chain, draw\)",
        ),
    ],
)
def test_malformed_chains_sources_are_refused(data, change, match):
    x, y, _, _ = data
    source = _source(indexed, (x, y))
    for key, value in change.items():
        setattr(source, key, value)
    with pytest.raises(ValueError, match=match):
        to_inference_data(source)


def test_unknown_source_names_the_accepted_kinds(data):
    with pytest.raises(TypeError, match="samples, sample_stats, model, args, kwargs"):
        to_inference_data({"w": torch.zeros(3)}, indexed)


# ---------------------------------------------------------------------------------------------
# the model must be the draws' model
# ---------------------------------------------------------------------------------------------
def fixed_noise(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("obs", dist.Normal((x @ w)[idx], 0.3), obs=None if y is None else y[idx])


def extra_site(x, y=None):
    indexed(x, y)
    pyro.sample("t", dist.Normal(0.0, 1.0))


def column_weights(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(3, 1), 1.0).to_event(2))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample(
            "obs", dist.Normal((x @ w).squeeze(-1)[idx], s), obs=None if y is None else y[idx]
        )


@pytest.mark.parametrize(
    ("other", "match"),
    [
        (fixed_noise, r"the draws hold \['s'\], which the model does not sample"),
        (extra_site, r"the model samples \['t'\], which the draws lack .*redrawn from the prior"),
        (column_weights, r"site 'w' has draws of shape \(3,\), the model's has shape \(3, 1\)"),
    ],
)
def test_a_model_with_other_sites_is_refused(data, other, match):
    x, y, _, _ = data
    source = _source(indexed, (x, y))
    with pytest.raises(ModelMismatchError, match=match):
        to_inference_data(source, other, x, y)


def _mlp_source(model, x, y):
    shapes = {name: tuple(shape) for name, shape in model.site_shapes().items()}
    return _source(model, (x, y), shapes=shapes)


def test_another_bayesian_mlp_with_the_same_sites_is_refused(data):
    x, y, _, _ = data
    model = BayesianMLP(3, [4], 1, activation="tanh")
    source = _mlp_source(model, x, y)
    idata = to_inference_data(source, BayesianMLP(3, [4], 1, activation="tanh"))  # a twin
    assert "activation=tanh" in idata.posterior.attrs["model"]
    assert idata.posterior.attrs["model"] == model_fingerprint(model)
    relu = BayesianMLP(3, [4], 1, activation="relu")
    with pytest.raises(ModelMismatchError, match=r"activation=relu.*activation=tanh"):
        to_inference_data(source, relu)
    with pytest.raises(ModelMismatchError, match=r"likelihood_temperature=0.5"):
        to_inference_data(source, BayesianMLP(3, [4], 1, likelihood_temperature=0.5))
    # the caller can insist
    forced = to_inference_data(source, relu, check_model=False)
    assert "activation=relu" in forced.posterior.attrs["model"]


def test_another_function_with_the_same_sites_warns(data):
    x, y, _, _ = data
    source = _source(indexed, (x, y))
    with pytest.warns(ModelMismatchWarning, match="differs from the model of the run"):
        to_inference_data(source, observed_whole)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        to_inference_data(source, observed_whole, check_model=False)
        to_inference_data(source, indexed)


def test_fingerprints_tell_functions_and_wrapped_functions_apart():
    assert model_fingerprint(indexed) != model_fingerprint(observed_whole)
    assert model_fingerprint(indexed) == model_fingerprint(indexed)
    wrapped = pyro.poutine.scale(indexed, scale=0.5)
    assert model_fingerprint(wrapped) == "wrapped " + model_fingerprint(indexed)
    # user-defined activations: same name (<lambda>), different code
    tanh = BayesianMLP(3, [4], 1, activation=lambda h: torch.tanh(h))
    relu = BayesianMLP(3, [4], 1, activation=lambda h: torch.relu(h))
    assert model_fingerprint(tanh) != model_fingerprint(relu)


def test_nuts_on_global_sites_first_exports_with_the_module_without_a_warning(data):
    """The docs run a module's NUTS reference as ``NUTS(GlobalSitesFirst(model))`` and export
    it with ``to_inference_data(mcmc, model, ...)``: the same density, so no warning (it once
    warned that the model differs from ``<GlobalSitesFirst object at 0x...>``)."""
    from pyro.infer import MCMC, NUTS

    from pyro_sgmcmc.models.structure import GlobalSitesFirst

    x, y, _, _ = data
    model = BayesianMLP(3, [4], 1, activation="tanh")
    assert model_fingerprint(GlobalSitesFirst(model)) == model_fingerprint(model)
    mcmc = MCMC(NUTS(GlobalSitesFirst(model), max_tree_depth=3), num_samples=4, warmup_steps=4,
                disable_progbar=True)  # fmt: skip
    mcmc.run(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelMismatchWarning)
        idata = to_inference_data(mcmc, model, x, y)
    assert _arviz.get_group(idata, "log_likelihood")["obs"].shape[:2] == (1, 4)


# ---------------------------------------------------------------------------------------------
# labels and test sets
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def classifier_source():
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(N, 3, generator=generator)
    y = torch.randint(0, 3, (N,), generator=generator)
    model = BayesianMLP(3, [4], 3, likelihood="categorical")
    return _mlp_source(model, x, y), x, y


@pytest.mark.parametrize("bad", [3, -1])
def test_test_labels_outside_the_classes_are_refused(classifier_source, bad):
    source, x, y = classifier_source
    labels = y[:N_TEST].clone()
    labels[2] = bad
    # the export's support check, or (first) BayesianMLP's own check of its labels
    outside = r"test: .*'obs' has 1 value\(s\) outside the support"
    own = rf"test set .* y holds 1 label\(s\) outside the classes \[0, 3\) .* e\.g\. {bad}"
    with pytest.raises(ValueError, match=f"{outside}|{own}"):
        to_inference_data(source, test=(x[:N_TEST], labels))
    with pytest.raises(ValueError, match=r"integers in \[0, K\)|labels must be 0, \.\.\., 2"):
        to_inference_data(source, test=(x[:N_TEST], labels))


def test_training_labels_outside_the_classes_are_refused(classifier_source):
    source, x, y = classifier_source
    labels = y.clone()
    labels[0] = 7
    outside = r"training data \(args\): .*outside the support"
    own = r"y holds 1 label\(s\) outside the classes \[0, 3\) .* e\.g\. 7"  # BayesianMLP's check
    with pytest.raises(ValueError, match=f"{outside}|{own}"):
        to_inference_data(_mlp_source(source.model, x, labels))


def test_a_test_set_of_the_wrong_width_is_refused_naming_test(data):
    x, y, _, _ = data
    source = _source(indexed, (x, y))
    with pytest.raises(ValueError, match=r"test\[0\] has shape \(6, 4\) .*'x' has shape") as e:
        to_inference_data(source, test=(torch.randn(N_TEST, 4),))
    assert "tensor(" not in str(e.value)


def test_a_test_set_with_nan_is_refused_naming_test(data):
    x, y, x_test, _ = data
    source = _source(indexed, (x, y))
    bad = x_test.clone()
    bad[1, 2] = math.nan
    with pytest.raises(ValueError, match=r"test\[0\] contains 1 NaN or infinite value"):
        to_inference_data(source, test=(bad,))
    with pytest.raises(ValueError, match=r"args\[0\] contains 1 NaN"):
        to_inference_data(_source(indexed, (bad, y[:N_TEST])))


def test_a_model_failing_on_the_test_set_is_reported_in_one_line(classifier_source):
    source, x, y = classifier_source
    keyword = rf"test_kwargs= \(shapes \{{'y': \({N_TEST + 1},\)\}}\)"
    message = rf"fails on the test set .*{keyword}: .*y must have shape"
    with pytest.raises(ValueError, match=message):
        to_inference_data(source, test=(x[:N_TEST],), test_kwargs={"y": y[: N_TEST + 1]})
    # as positional arguments, the rows are compared before the model is tried
    with pytest.raises(ValueError, match=rf"test\[0\] has {N_TEST} rows but test\[1\] has"):
        to_inference_data(source, test=(x[:N_TEST], y[: N_TEST + 1]))


def subsampling(x, y=None):
    """Pyro's SVI idiom: the plate draws its own rows."""
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", len(x), subsample_size=8) as idx:
        pyro.sample("obs", dist.Normal(x[idx] @ w, s), obs=None if y is None else y[idx])


def test_a_test_set_smaller_than_the_plates_subsample_size_is_named(data):
    """Pyro's plate cannot draw 8 of 6 rows, and its message blames a guide: the refusal
    names the plate, both sizes and two ways out."""
    x, y, x_test, _ = data
    source = _source(subsampling, (x, y))
    message = (
        r"a plate of the model \(the data plate 'data'\?\) draws subsample_size=8 of its 6 rows .*"
        r"give at least 8 test rows, or write the plate as .*subsample_size=min\(8, len\(x\)\)"
    )
    with pytest.raises(ValueError, match=message) as error:
        to_inference_data(source, test=(x_test,))
    assert "guide" not in str(error.value)
    idata = to_inference_data(source, test=(torch.cat([x_test, x[:2]]),))  # 8 rows: fine
    assert idata.predictions["obs"].shape[-1] == 8


def test_a_site_the_model_visits_in_some_draws_only_is_named(data):
    """Each site's values are written into one array for all draws: a site left out of a draw
    is refused by name, not exported with that draw's row unwritten."""
    x, y, _, _ = data

    def sometimes(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        with pyro.plate("data", len(x)):
            pyro.sample("obs", dist.Normal(x @ w, 0.3), obs=y)
            if w[0] > 0:
                pyro.sample("extra", dist.Normal(x[:, 0] * w[0], 1.0), obs=y)

    w = torch.tensor([[[1.0, -2.0, 0.5], [-1.0, -2.0, 0.5], [1.0, -2.0, 0.5]]])
    source = Chains({"w": w}, {}, sometimes, (x, y))
    with pytest.raises(ValueError, match=r"site 'extra' is missing from draw 1"):
        to_inference_data(source)


# ---------------------------------------------------------------------------------------------
# SVI exported with other data than it was fitted on
# ---------------------------------------------------------------------------------------------
def test_an_svi_fit_exported_with_other_data_is_refused_pointing_to_test(data):
    """observed_data and log_likelihood must describe the data the posterior was fitted to: an
    SVI fit keeps its data, so other training arguments are refused, naming the argument and
    ``test=``; the same data (as NumPy arrays too) and held-out data in ``test=`` are exported."""
    x, y, x_test, y_test = data
    result = fit_svi(indexed, x, y, num_steps=5, progress_bar=False)
    hint = r"pass held-out data as test=\(x_test, y_test\)"
    other_rows = r"args\[0\] \('x'\) is a tensor of shape \(6, 3\), but .* \(24, 3\)"
    with pytest.raises(ValueError, match=rf"{other_rows}.*{hint}"):
        to_inference_data(result, None, x_test, y_test, num_draws=2)
    with pytest.raises(ValueError, match=rf"args\[1\] \('y'\) holds other values .*{hint}"):
        to_inference_data(result, None, x, y + 1.0, num_draws=2)
    left_out = r"model argument 'y' \(left out: its default\) is None, but .* shape \(24,\)"
    with pytest.raises(ValueError, match=left_out):
        to_inference_data(result, None, x, num_draws=2)
    # the same data passed by keyword, or with a default spelled out, are the fit's
    to_inference_data(result, None, x, num_draws=2, model_kwargs={"y": y})
    idata = to_inference_data(
        result, None, x.numpy(), y.numpy(), test=(x_test, y_test), num_draws=2
    )
    np.testing.assert_array_equal(idata.observed_data["obs"].values, y.numpy())
    assert idata.log_likelihood["obs"].shape == (1, 2, N)
    assert idata.predictions["obs"].shape == (1, 2, N_TEST)


# ---------------------------------------------------------------------------------------------
# SVI with a learnable prior
# ---------------------------------------------------------------------------------------------
def test_svi_lp_uses_each_fits_fitted_prior(data):
    x, y, _, _ = data
    result = fit_svi(
        indexed,
        x,
        y,
        num_steps=40,
        learning_rate=0.05,
        prior="learnable_scale_mixture",
        num_fits=2,
        progress_bar=False,
    )
    idata = to_inference_data(result, None, num_draws=4)
    values = result.prior_values()
    assert idata.posterior.attrs["svi_prior_scale1"] == [v["scale1"] for v in values]
    for chain in (0, 1):
        w = torch.as_tensor(idata.posterior["w"].values[chain, 2])
        s = torch.as_tensor(idata.posterior["s"].values[chain, 2])
        v = values[chain]
        prior = ScaleMixtureNormal(v["mixture_weight"], v["scale1"], v["scale2"])
        direct = (
            prior.log_prob(w).sum()
            + dist.LogNormal(0.0, 1.0).log_prob(s)
            + dist.Normal(x @ w, s).log_prob(y).sum()
        )
        assert idata.sample_stats["lp"].values[chain, 2] == pytest.approx(float(direct), rel=1e-5)


# ---------------------------------------------------------------------------------------------
# MCMC runs and run_chains results exported with other data than they sampled
# ---------------------------------------------------------------------------------------------
def test_mcmc_and_run_chains_exported_with_other_data_are_refused_naming_the_argument(data):
    """Pyro's MCMC keeps the run's arguments, run_chains results keep theirs: training arguments
    other than those are refused like an SVI fit's; the same data given again (NumPy arrays,
    by keyword) are exported, and held-out data go in test=."""
    from pyro_sgmcmc import SGLD, run_chains

    x, y, x_test, y_test = data
    pyro.set_rng_seed(0)
    mcmc = MCMC(SGLD(indexed, batch_size=8, seed=0), num_samples=4, warmup_steps=20,
                disable_progbar=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(x, y)
        result = run_chains(SGLD(indexed, batch_size=8, seed=0), x, y, num_chains=2,
                            num_samples=4, warmup_steps=20)  # fmt: skip
    hint = r"pass held-out data as test=\(x_test, y_test\)"
    for source, fit in ((mcmc, "the MCMC run"), (result, "the run_chains result")):
        other_rows = rf"args\[0\] \('x'\) is a tensor of shape \(6, 3\), but {fit} .* \(24, 3\)"
        with pytest.raises(ValueError, match=rf"{other_rows}.*{hint}"):
            to_inference_data(source, None, x_test, y_test)
        other_values = rf"model_kwargs\['y'\] holds other values than the data {fit}"
        with pytest.raises(ValueError, match=other_values):
            to_inference_data(source, None, x, model_kwargs={"y": y + 1.0})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = to_inference_data(source, None, x.numpy(), model_kwargs={"y": y.numpy()},
                                      test=(x_test, y_test))  # fmt: skip
        np.testing.assert_array_equal(idata.observed_data["obs"].values, y.numpy())
        assert idata.predictions["obs"].shape[-1] == N_TEST
        # the data where the model goes (to_inference_data(result, x, y)): named as such
        with pytest.raises(
            TypeError,
            match=r"model \(the second argument\) must be the Pyro "
            r"model, got a tensor of shape \(24, 3\): data go after it",
        ):
            to_inference_data(source, x, y)
        # the data as keywords, as mcmc.run(x=x, y=y) takes them: named, with where they go
        with pytest.raises(
            TypeError,
            match=r"unexpected keyword argument\(s\) 'x', 'y': the model's keyword data go "
            r"in model_kwargs=dict\(x=\.\.\., y=\.\.\.\)",
        ):
            to_inference_data(source, None, x=x, y=y)
        # az.from_pyro's coords=: not taken for data, dims= and assign_coords named instead
        with pytest.raises(TypeError, match=r"takes no coords= .*dims= names .*assign_coords"):
            to_inference_data(source, coords={"feature": ["a", "b", "c"]})


def _from_dict(data, scale=1.0):
    return indexed(data["x"], data.get("y"))


def _star(*data):
    return indexed(*data)


def _without_default(x, y):
    return indexed(x, y)


def test_the_same_data_in_another_form_is_the_runs_and_other_data_are_named(data):
    """The export binds both calls to the model's signature: float64 data given again as NumPy
    (converted to float32), a dict of copies, a number for a 0-d tensor are the run's data; a
    difference is named by how the export passed it, and a missing argument as missing."""
    x, y, _, _ = data
    x64, y64 = x.double(), y.double()
    check_fitted_data(indexed, (x64.numpy(), y64.numpy()), {}, (x64, y64), {}, "the run")
    other = (y64 + torch.eye(24)[0]).numpy()
    with pytest.raises(ValueError, match=r"args\[1\] \('y'\) holds other values .*\(1 of 24"):
        check_fitted_data(indexed, (x64.numpy(), other), {}, (x64, y64), {}, "the run")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the stand-in models differ from their run's in name
        source = _source(_from_dict, ({"x": x, "y": y},), kwargs={"scale": torch.tensor(0.5)})
        to_inference_data(
            source, None, {"x": x.clone(), "y": y.clone()}, model_kwargs={"scale": 0.5}
        )
        with pytest.raises(
            ValueError,
            match=r"^args\[0\] \('data'\) holds other values than the Chains run was fitted "
            r"on \(a dict of 2 entries \('x', 'y'\)\)\. observed_data",
        ):
            to_inference_data(source, None, {"x": x, "y": y + 1.0}, model_kwargs={"scale": 0.5})
        with pytest.raises(ValueError, match=r"model argument 'scale' \(left out: its default\)"):
            to_inference_data(source, None, {"x": x, "y": y})
        source = _source(_star, (x, y))
        with pytest.raises(ValueError, match=r"^args\[1\] holds other values"):
            to_inference_data(source, None, x, y + 1.0)
        source = _source(_without_default, (x, y))
        with pytest.raises(
            ValueError,
            match=r"^args\[1\] \('y'\) is missing, but the Chains run "
            r"was fitted with a tensor of shape \(24,\)",
        ):
            to_inference_data(source, None, x)


def test_the_model_given_by_keyword_is_told_to_go_by_position(data):
    """``model`` (like ``source``) is positional; given as ``model=``, the error says so rather
    than sending it into ``model_kwargs``."""
    from pyro_sgmcmc import SGLD, run_chains

    x, y, _, _ = data
    kernel = SGLD(indexed, batch_size=8, step_size=1e-3, num_steps_per_sample=1, seed=0)
    result = run_chains(kernel, x, y, num_chains=1, num_samples=2, warmup_steps=0)
    with pytest.raises(TypeError, match=r"takes model by position: to_inference_data\(result"):
        to_inference_data(result, model=indexed)
