"""fit_svi refuses or reports what would otherwise fail silently or obscurely.

A learning rate that diverges raises SVIDivergedError naming the step, with the losses so far (with
Pyro's validation on or off, on the Pyro-ELBO path and on the plain-torch BayesianMLP path); a
misspelt option is a TypeError naming it and the allowed ones; NumPy arrays and lists are converted.
"""

from __future__ import annotations

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoNormal

from pyro_sgmcmc._validation import as_tensor_arguments
from pyro_sgmcmc.errors import SVIDivergedError
from pyro_sgmcmc.nn import BayesianMLP
from pyro_sgmcmc.variational.svi import fit_svi


def regression(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
    s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
    mean = x @ w
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mean[idx], s), obs=None if y is None else y[idx])


@pytest.fixture(scope="module")
def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=generator)
    y = x @ torch.tensor([1.0, -0.5]) + 0.3 * torch.randn(40, generator=generator)
    return x, y


MODELS = {
    # Pyro's TraceMeanField_ELBO on the conditioned model
    "pyro-elbo": lambda: regression,
    # the plain-torch loss of a BayesianMLP with the default guide
    "bayesian-mlp": lambda: BayesianMLP(2, [6], 1),
}


@pytest.mark.filterwarnings("ignore:Encountered NaN")
@pytest.mark.parametrize("validation", [True, False])
@pytest.mark.parametrize("name", list(MODELS))
def test_a_diverging_learning_rate_names_the_step_and_keeps_the_losses(data, name, validation):
    x, y = data
    with pyro.validation_enabled(validation), pytest.raises(SVIDivergedError) as caught:
        fit_svi(MODELS[name](), x, y, num_steps=200, learning_rate=1e4, progress_bar=False)
    error = caught.value
    assert 2 <= error.step <= 200
    assert f"step {error.step} of 200" in str(error) and "learning_rate=10000" in str(error)
    assert "Tensor of shape" not in str(error) and "\n" not in str(error)
    assert error.fit == 0 and error.completed_losses.shape == (0, 200)
    # every loss before the diverged step is kept and finite
    assert error.losses.shape == (error.step,)
    assert np.isfinite(error.losses[:-1]).all()


def test_a_later_fit_that_diverges_keeps_the_finished_fits_losses(data):
    x, y = data
    calls = []

    def optimizer(params):
        calls.append(len(calls))
        if len(calls) == 1:
            return torch.optim.Adam(params, lr=0.01)
        return torch.optim.SGD(params, lr=1e8)

    with pytest.raises(SVIDivergedError, match="optimiser's step size") as caught:
        fit_svi(regression, x, y, num_steps=30, optimizer=optimizer, num_fits=2, progress_bar=False)
    error = caught.value
    assert error.fit == 1 and "(fit 1)" in str(error)
    assert error.completed_losses.shape == (1, 30)
    assert np.isfinite(error.completed_losses).all()


def test_a_stable_learning_rate_does_not_raise(data):
    x, y = data
    result = fit_svi(regression, x, y, num_steps=50, learning_rate=0.05, progress_bar=False)
    assert np.isfinite(result.losses).all()


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [("num_step", "num_steps"), ("learningrate", "learning_rate"), ("batchsize", "batch_size")],
)
def test_a_misspelt_option_is_a_type_error_naming_it(data, typo, suggestion):
    x, y = data
    with pytest.raises(TypeError) as caught:
        fit_svi(regression, x, y, progress_bar=False, **{typo: 5})
    message = str(caught.value)
    assert repr(typo) in message and f"did you mean {suggestion!r}" in message
    assert "num_steps" in message and "learning_rate" in message  # the allowed options
    assert "x, y" in message  # the model's parameters
    with pytest.raises(TypeError, match="'num_step'"):
        fit_svi(BayesianMLP(2, [4], 1), x, y, num_step=5, progress_bar=False)


def test_model_keyword_arguments_still_reach_the_model(data):
    x, y = data
    result = fit_svi(regression, x, y=y, num_steps=3, progress_bar=False)
    assert result.kwargs["y"] is y

    def open_model(x, **kwargs):  # takes anything: nothing can be checked, nothing refused
        regression(x, kwargs.get("y"))

    fit_svi(open_model, x, y=y, num_steps=2, progress_bar=False)


def test_numpy_arrays_and_lists_are_converted(data):
    x, y = data
    kwargs = dict(num_steps=20, learning_rate=0.05, progress_bar=False, seed=3)
    reference = fit_svi(regression, x, y, **kwargs)
    converted = fit_svi(regression, x.double().numpy(), y.tolist(), **kwargs)
    np.testing.assert_array_equal(converted.losses, reference.losses)
    assert converted.args[0].dtype == torch.get_default_dtype()
    labels = np.array([0, 2, 1])
    (features, classes), _ = as_tensor_arguments((np.ones((3, 2), dtype=np.float16), labels), {})
    assert features.dtype == torch.get_default_dtype() and classes.dtype == torch.int64


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (["a", "b"], TypeError, r"args\[1\] is a list of <U1"),
        ([[1.0], [1.0, 2.0]], ValueError, r"args\[1\] is a list that is not a rectangular"),
        (np.array(["a"]), TypeError, r"args\[1\] is a NumPy array of dtype <U1"),
    ],
)
def test_non_numeric_data_are_refused_naming_the_argument(data, value, error, match):
    x, _ = data
    with pytest.raises(error, match=match):
        fit_svi(regression, x, value, num_steps=2, progress_bar=False)


def test_an_invalid_guide_is_not_reported_as_a_divergence(data):
    """A ValueError at the first step is the model's or guide's, not the learning rate's."""
    x, y = data

    def broken(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0]) as idx:
            pyro.sample("obs", dist.Normal((x @ w)[idx], -1.0), obs=None if y is None else y[idx])

    with pyro.validation_enabled(True), pytest.raises(ValueError) as caught:
        fit_svi(broken, x, y, num_steps=2, progress_bar=False, guide_factory=AutoNormal)
    assert not isinstance(caught.value, SVIDivergedError)


def test_num_threads_holds_during_the_fit_and_is_restored(data):
    x, y = data
    seen = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        fit_svi(
            regression,
            x,
            y,
            num_steps=3,
            num_threads=1,
            callback=lambda *_: seen.append(torch.get_num_threads()),
            progress_bar=False,
        )
        assert seen == [1, 1, 1] and torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="num_threads must be an integer >= 1"):
            fit_svi(regression, x, y, num_steps=3, num_threads=0, progress_bar=False)
    finally:
        torch.set_num_threads(before)
