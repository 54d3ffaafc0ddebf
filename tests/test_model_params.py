"""A model's own parameters (``pyro.param``, ``PyroParam``): held fixed by the samplers as by
Pyro's MCMC, optimised by ``fit_svi`` as by Pyro's SVI, and exported as the run used them."""

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.nn import PyroModule, PyroParam, PyroSample

from pyro_sgmcmc import SGHMC, fit_svi, run_chains, to_inference_data

NOISE = 0.3


def _data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(200, 2, generator=generator)
    y = x @ torch.tensor([1.0, -2.0]) + NOISE * torch.randn(200, generator=generator)
    return x, y


def param_model(x, y=None):
    s = pyro.param("s", torch.tensor(0.5), constraint=dist.constraints.positive)
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(x @ w, s), obs=y)


class ParamModule(PyroModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = PyroSample(dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        self.s = PyroParam(torch.tensor(0.5), constraint=dist.constraints.positive)

    def forward(self, x, y=None):
        w = self.w
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(x @ w, self.s), obs=y)


def _log_likelihood(w: torch.Tensor, s: float, x, y) -> torch.Tensor:
    """Per-row log-likelihood at draws ``w`` of shape (chain, draw, 2), in float64."""
    mean = w.double() @ x.double().T
    return dist.Normal(mean, s).log_prob(y.double())


def _assert_exported_with(idata, w: torch.Tensor, s: float, x, y) -> None:
    exported = torch.as_tensor(idata.log_likelihood["obs"].values)
    expected = _log_likelihood(w, s, x, y)
    torch.testing.assert_close(exported, expected, rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def _clear_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def test_run_chains_holds_the_param_and_exports_with_the_value_it_used():
    x, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_chains(SGHMC(param_model, batch_size=50, seed=0), x, y, num_chains=2,
                            num_samples=20, warmup_steps=20)  # fmt: skip
    assert set(result.model_params) == {"s"}
    assert float(result.model_params["s"]) == pytest.approx(0.5)
    pyro.get_param_store()["s"] = torch.tensor(2.0)  # the store changes after the run
    idata = to_inference_data(result)
    _assert_exported_with(idata, result.samples["w"], 0.5, x, y)


def test_mcmc_kernel_records_the_param_and_the_export_uses_it():
    x, y = _data()
    kernel = SGHMC(param_model, batch_size=50, seed=0)
    mcmc = MCMC(kernel, num_samples=10, warmup_steps=20, disable_progbar=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(x, y)
    assert float(kernel.model_params["s"]) == pytest.approx(0.5)
    pyro.clear_param_store()  # re-created at its initial value 0.5 by a model run ...
    pyro.get_param_store()["s"] = torch.tensor(2.0)  # ... unless the user set another
    idata = to_inference_data(mcmc)
    w = mcmc.get_samples(group_by_chain=True)["w"]
    _assert_exported_with(idata, w, 0.5, x, y)


@pytest.mark.parametrize("model", [param_model, ParamModule()], ids=["pyro.param", "PyroParam"])
def test_fit_svi_optimises_the_models_params_as_pyros_svi_does(model):
    """The noise scale starts at 0.5; the data's is 0.3: each fit learns it (before: it stayed
    at 0.5, the guide alone being optimised), and the export evaluates each fit's model with its
    own fitted value, whatever the global store holds."""
    x, y = _data()
    result = fit_svi(model, x, y, num_steps=1500, batch_size=50, num_fits=2, seed=0,
                     progress_bar=False)  # fmt: skip
    assert result.model_params is not None
    fitted = [float(params["s"]) for params in result.model_params]
    for value in fitted:
        assert abs(value - NOISE) < 0.06, fitted
    pyro.get_param_store()["s"] = torch.tensor(2.0)
    idata = to_inference_data(result, num_draws=5, seed=0)
    w = torch.as_tensor(idata.posterior["w"].values)
    for fit, value in enumerate(fitted):
        _assert_exported_with(idata.isel(chain=[fit]), w[fit : fit + 1], value, x, y)


def test_a_model_without_params_records_none():
    x, y = _data()

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(x @ w, NOISE), obs=y)

    result = fit_svi(model, x, y, num_steps=5, batch_size=50, progress_bar=False)
    assert result.model_params is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chains = run_chains(SGHMC(model, batch_size=50, seed=0), x, y, num_chains=1,
                            num_samples=5, warmup_steps=20)  # fmt: skip
    assert chains.model_params == {}


def test_fits_of_a_pyro_param_module_are_independent_and_leave_the_module_alone():
    """A ``PyroParam`` is the module's own tensor: each fit starts from its initial value (fit 1
    did not continue from fit 0), the same call gives the same fits, the module is unchanged."""
    x, y = _data()
    module = ParamModule()
    options = {"num_steps": 60, "batch_size": 50, "seed": 0, "progress_bar": False}
    first = fit_svi(module, x, y, num_fits=2, **options)
    assert float(module.s) == pytest.approx(0.5)
    again = fit_svi(module, x, y, num_fits=2, **options)
    alone = fit_svi(ParamModule(), x, y, num_fits=1, **options)
    fits = [float(params["s"]) for params in first.model_params]
    assert fits == [float(params["s"]) for params in again.model_params]
    assert fits[0] == float(alone.model_params[0]["s"])


def test_an_svi_export_uses_each_fits_params_also_with_a_pointwise_log_likelihood():
    """A model's ``pointwise_log_likelihood`` reads its parameters from the store: the export of
    an SVI result with fitted parameters traces the per-fit models instead."""
    x, y = _data()

    def model(x, y=None):
        param_model(x, y)

    def pointwise(params, subsample, x, y=None):
        s = pyro.param("s", torch.tensor(0.5), constraint=dist.constraints.positive)
        rows = slice(None) if subsample is None else subsample
        return dist.Normal(x[rows] @ params["w"], s).log_prob(y[rows])

    model.pointwise_log_likelihood = pointwise
    result = fit_svi(model, x, y, num_steps=300, batch_size=50, seed=0, progress_bar=False)
    fitted = float(result.model_params[0]["s"])
    pyro.get_param_store()["s"] = torch.tensor(2.0)
    idata = to_inference_data(result, num_draws=3, seed=0)
    w = torch.as_tensor(idata.posterior["w"].values)
    _assert_exported_with(idata, w, fitted, x, y)


def test_fit_svi_optimises_the_params_with_a_guide_that_does_not_run_the_model():
    """A hand-written guide does not create the model's parameters at its first call (an
    autoguide's does, tracing the model): they are created at their values in the model's
    structure, and learnt all the same."""

    class Guide(PyroModule):
        def __init__(self, model) -> None:
            super().__init__()
            self.loc = PyroParam(torch.zeros(2))
            self.scale = PyroParam(torch.full((2,), 0.1), constraint=dist.constraints.positive)

        def forward(self, x, y=None):
            pyro.sample("w", dist.Normal(self.loc, self.scale).to_event(1))

    x, y = _data()
    result = fit_svi(param_model, x, y, num_steps=1500, batch_size=50, guide_factory=Guide,
                     seed=0, progress_bar=False)  # fmt: skip
    assert abs(float(result.model_params[0]["s"]) - NOISE) < 0.06
