"""A classifier's outputs are judged as its class probabilities: by the run, by the export's
``convergence_report`` and in the CLI's figures, one transform everywhere
(``pyro_sgmcmc.analysis.judged_outputs``)."""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
import xarray as xr
from pyro import poutine

from pyro_sgmcmc import SGHMC, _arviz, convergence_report, run_chains, to_inference_data
from pyro_sgmcmc.analysis.judged_outputs import apply_link, output_link, traced_output_link
from pyro_sgmcmc.analysis.plots import _output_subset
from pyro_sgmcmc.errors import SamplerWarning
from pyro_sgmcmc.nn import BayesianMLP

GENERATOR = torch.Generator().manual_seed(0)
X = torch.randn(40, 2, generator=GENERATOR)
Y3 = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()  # three classes
Y2 = (X[:, 0] > 0).float()


def _features(x):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))
    return x @ w


def logits_model(x, y=None):
    f = _features(x)
    with pyro.plate("data", len(x)):
        pyro.sample("obs", dist.Categorical(logits=f), obs=y)
    return f


def probs_model(x, y=None):
    f = _features(x)
    with pyro.plate("data", len(x)):
        pyro.sample("obs", dist.Categorical(probs=f.softmax(-1)), obs=y)
    return f


def one_hot_model(x, y=None):
    f = _features(x)
    with pyro.plate("data", len(x)):
        pyro.sample("obs", dist.OneHotCategorical(logits=f), obs=y)
    return f


def returns_observation_model(x, y=None):
    f = _features(x)
    with pyro.plate("data", len(x)):
        # the export's outputs are this site's class probabilities: no link to apply
        return pyro.sample("obs", dist.Categorical(logits=f), obs=y)


def bernoulli_model(x, y=None):
    f = _features(x)[:, :1]  # (rows, 1) outputs, (rows,) observations
    with pyro.plate("data", len(x)):
        pyro.sample("obs", dist.Bernoulli(logits=f.squeeze(-1)), obs=y)
    return f


def regression_model(x, y=None):
    f = _features(x)[:, 0]
    with pyro.plate("data", len(x)):
        pyro.sample("obs", dist.Normal(f, 1.0), obs=y)
    return f


def full_outputs_model(x, y=None):
    """Outputs at every row, observations at the rows the plate draws (``f[idx]``)."""
    f = _features(x)
    with pyro.plate("data", len(x), subsample_size=16) as idx:
        pyro.sample("obs", dist.Categorical(logits=f[idx]), obs=None if y is None else y[idx])
    return f


def uniform_probabilities_model(x, y=None):
    """Returns its class probabilities, here uniform: a softmax leaves them as they are."""
    p = torch.full((len(x), 3), 1.0 / 3.0) + 0.0 * pyro.sample("s", dist.Normal(0.0, 1.0))
    with pyro.plate("data", len(x)):
        pyro.sample("obs", dist.Categorical(probs=p), obs=y)
    return p


def full_outputs_network(x, y=None):
    """A 2-8-3 network computed at every row, observed at the plate's rows (idiom (b))."""
    w1 = pyro.sample("w1", dist.Normal(0.0, 1.0).expand([2, 8]).to_event(2))
    w2 = pyro.sample("w2", dist.Normal(0.0, 1.0).expand([8, 3]).to_event(2))
    f = torch.tanh(x @ w1) @ w2
    with pyro.plate("data", len(x)) as idx:
        pyro.sample("obs", dist.Categorical(logits=f[idx]), obs=None if y is None else y[idx])
    return f


def hidden_features_model(x, y=None):
    """Returns features that are not the observation's logits (a softmax of them is not)."""
    f = _features(x)
    with pyro.plate("data", len(x)):
        pyro.sample("obs", dist.Categorical(logits=2.0 * f), obs=y)
    return f


@pytest.mark.parametrize(
    "model, y, link",
    [
        (logits_model, Y3, "softmax"),
        (probs_model, Y3, "softmax"),
        (one_hot_model, torch.nn.functional.one_hot(Y3, 3).float(), "softmax"),
        (returns_observation_model, Y3, None),
        (bernoulli_model, Y2, "sigmoid"),
        (regression_model, Y2, None),
        (hidden_features_model, Y3, None),
        (full_outputs_model, Y3, "softmax"),
        (uniform_probabilities_model, Y3, None),
    ],
)
def test_the_link_is_the_one_under_which_the_outputs_give_the_observations_probabilities(
    model, y, link
):
    trace = poutine.trace(model).get_trace(X, y)
    assert output_link(trace) == link
    draw = {n: trace.nodes[n]["value"] for n in ("w", "s") if n in trace.nodes}
    assert traced_output_link(model, draw, (X, y), {}) == link
    assert traced_output_link(model, draw, (X,), {}) == link  # test inputs: no targets


def test_a_bayesian_mlp_classifier_has_softmax_outputs_and_a_regression_none():
    for likelihood, y, link in [("categorical", Y3, "softmax"), ("normal", Y2, None)]:
        model = BayesianMLP(2, [4], 3 if link else 1, likelihood=likelihood)
        assert output_link(poutine.trace(model).get_trace(X, y)) == link


def test_apply_link_gives_probabilities_and_refuses_other_names():
    logits = np.random.default_rng(0).normal(size=(2, 5, 4, 3)) * 10
    probabilities = apply_link(logits, "softmax")
    assert probabilities.shape == logits.shape
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, rtol=1e-12)
    expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(probabilities, expected, rtol=1e-12)
    np.testing.assert_allclose(apply_link(logits, "sigmoid"), 1 / (1 + np.exp(-logits)))
    assert apply_link(logits, None) is logits
    with pytest.raises(ValueError, match="link must be one of"):
        apply_link(logits, "probit")


def _classifier_export(link: str | None) -> object:
    """Outputs whose logits wander along the direction a softmax does not see (a common shift
    of the three classes, a random walk per chain) while the class probabilities are draws of
    one distribution: converged as predictions, far from it as logits."""
    rng = np.random.default_rng(0)
    identified = rng.normal(size=(4, 400, 6, 3))
    shift = np.cumsum(rng.normal(size=(4, 400, 6, 1)), axis=1) * 3.0
    posterior = xr.Dataset({"w": (("chain", "draw"), rng.normal(size=(4, 400)))})
    posterior.attrs["function_space"] = 1
    if link is not None:
        posterior.attrs["output_link"] = link
    labels = rng.integers(0, 3, size=(4, 400, 6))  # replicated observations beside the outputs
    predictions = xr.Dataset(
        {
            "output": (("chain", "draw", "row", "class"), identified + shift),
            "obs": (("chain", "draw", "row"), labels),
        }
    )
    return _arviz.from_datasets({"posterior": posterior, "predictions": predictions})


def test_a_report_judges_a_classifier_on_its_probabilities_not_on_its_logits():
    as_probabilities = convergence_report(_classifier_export("softmax"))
    assert as_probabilities.converged and as_probabilities.verdict.basis == "f(x)"
    # the whole group, the observations with them: the outputs still as probabilities
    whole_group = convergence_report(_classifier_export("softmax"), group="predictions")
    assert whole_group.converged and whole_group.verdict.basis == "f(x)"
    as_logits = convergence_report(_classifier_export(None))
    assert not as_logits.converged and as_logits.max_rhat > 1.2


def _classifier_run(model=None, x=X, y=Y3, **options):
    model = model or BayesianMLP(2, [8], 3, likelihood="categorical")
    kernel = SGHMC(model, batch_size=16, num_steps_per_sample=2, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplerWarning)
        return run_chains(kernel, x, y, num_chains=2, num_samples=40, warmup_steps=60,
                          target_ess=None, **options)  # fmt: skip


def _numbers(verdict):
    return {verdict.statistic: verdict.value, **{s: v for s, v, _ in verdict.others}}


@pytest.mark.parametrize("where", ["test rows", "training rows"])
def test_a_classifiers_run_export_report_and_arviz_judge_the_same_probabilities(where, tmp_path):
    x_test = torch.randn(30, 2, generator=torch.Generator().manual_seed(1))
    result = _classifier_run(**({"test": (x_test,)} if where == "test rows" else {}))
    path = tmp_path / "run.nc"
    _arviz.to_netcdf(to_inference_data(result), path)
    idata = _arviz.load_netcdf(path)
    posterior = _arviz.get_group(idata, "posterior")
    assert posterior.attrs["output_link"] == "softmax"
    report = convergence_report(idata)
    assert report.verdict.basis == "f(x)" and report.converged == result.verdict.converged
    reported = {"R-hat": report.max_rhat, "bulk ESS": report.min_ess_bulk,
                "tail ESS": report.min_ess_tail}  # fmt: skip
    run = _numbers(result.verdict)
    assert {name: reported[name] for name in run} == pytest.approx(run, rel=1e-6)
    # ArviZ's own diagnostics of the softmax of the exported logits say the same
    group = "predictions" if where == "test rows" else "posterior_predictive"
    output = _arviz.get_group(idata, group)["output"]
    assert output.values.min() < 0  # the export keeps what the model returns: logits
    if where == "training rows":
        output = output.isel({output.dims[2]: list(result.judged_rows)})
    probabilities = xr.Dataset({"p": output.copy(data=apply_link(output.values, "softmax"))})
    assert float(az.rhat(probabilities)["p"].max()) == pytest.approx(report.max_rhat, rel=1e-6)
    assert float(az.ess(probabilities)["p"].min()) == pytest.approx(report.min_ess_bulk, rel=1e-6)
    tail_prob = {"prob": _arviz.TAIL_PROB} if _arviz.ARVIZ_1 else {}  # 1.x's default differs
    tail = float(az.ess(probabilities, method="tail", **tail_prob)["p"].min())
    assert tail == pytest.approx(report.min_ess_tail, rel=1e-6)
    if where == "test rows":  # the CLI's figures show the probabilities too
        shown = _arviz.get_group(_output_subset(idata), "posterior")
        values = np.concatenate([v.values.ravel() for v in shown.data_vars.values()])
        assert values.min() >= 0.0 and values.max() <= 1.0


def test_a_network_computed_at_every_row_is_judged_on_probabilities_by_run_and_report():
    """Idiom (b) (``f = net(x)`` at every row, ``obs=y[idx]`` with ``f[idx]``) on more rows than
    the run judges (64): the run reads the link at the observed rows, as the export does."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(120, 2, generator=generator)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    result = _classifier_run(full_outputs_network, x, y)
    assert result.verdict.basis == "f(x)" and len(result.judged_rows) == 64
    idata = to_inference_data(result)
    assert _arviz.get_group(idata, "posterior").attrs["output_link"] == "softmax"
    report = convergence_report(idata)
    reported = {"R-hat": report.max_rhat, "bulk ESS": report.min_ess_bulk,
                "tail ESS": report.min_ess_tail}  # fmt: skip
    run = _numbers(result.verdict)
    assert {name: reported[name] for name in run} == pytest.approx(run, rel=1e-6)
