"""The variational baseline on the seed-004 sinusoid, measured as `pyro-sgmcmc compare` scores it.

Two findings, each a slow test (about 10-20 s each on one core):

* with the demo's network (1-10-10-1 tanh, N(0, 1) weights) and a Gamma noise precision learnt
  with the weights (``noise="gamma"``; the demo itself now uses the sinusoid's known noise) the
  mean-field ELBO's optimum explains the data as noise: the fitted noise is about 5
  times the true one and the test RMSE stays near 3 (NUTS and SGHMC: about 1.1), however the
  guide starts; this is the objective, not the optimiser;
* with seed 004's model (the same network, the noise known) the default fit_svi settings plus
  local reparameterisation, 2000 Adam steps at 0.03 reach the issue's bar: test RMSE <= 1.3 and
  log-likelihood >= -1.9 (original units) in about 10 s.

`python -m pytest -m slow tests/test_svi_sinusoid.py -s` prints the numbers.
"""

from __future__ import annotations

import time

import pyro
import pytest

from pyro_sgmcmc.analysis.export import to_inference_data
from pyro_sgmcmc.analysis.predictive import posterior_predictive
from pyro_sgmcmc.cli.compare import (
    CompareConfig,
    build_model,
    posterior_samples,
    predictive_metrics,
)
from pyro_sgmcmc.data.datasets import load_dataset
from pyro_sgmcmc.nn import BayesianMLP, NormalLikelihood
from pyro_sgmcmc.variational.svi import fit_svi

pytestmark = pytest.mark.slow


def _score(variant: str) -> dict[str, float]:
    """Fit, export and score SVI on the sinusoid as the demo does (its data, seed, chains)."""
    noise = "gamma" if variant == "learnt-noise" else "auto"
    config = CompareConfig(out=None, progress=False, figures=False, noise=noise)
    data = load_dataset(config.dataset, seed=config.seed, test_fraction=config.test_fraction)
    pyro.clear_param_store()
    pyro.set_rng_seed(config.seed)
    model = build_model(config, data)
    options = dict(
        num_steps=config.svi_steps,
        batch_size=min(config.batch_size, data.num_train),
        learning_rate=config.svi_learning_rate,
        num_fits=config.chains,
        seed=config.seed,
        progress_bar=False,
        num_threads=1,
    )
    if variant != "learnt-noise":
        sigma = data.metadata["noise"] / data.y_scale  # the generating noise, standardised
        model = BayesianMLP(
            data.num_features,
            list(config.hidden),
            data.output_dim,
            activation=config.activation,
            likelihood=NormalLikelihood(scale=sigma),
            prior=model.prior,
        )
        options.update(num_steps=2000, learning_rate=0.03, estimator="local_reparameterization")
        if variant == "seed004-learnable-prior":
            options["prior"] = "learnable_scale_mixture"
    start = time.perf_counter()
    result = fit_svi(model, data.x_train, data.y_train, **options)
    idata = to_inference_data(
        result,
        model,
        data.x_train,
        data.y_train,
        test=(data.x_test, data.y_test),
        num_draws=config.num_samples,
        seed=config.seed,
    )
    seconds = time.perf_counter() - start
    prediction = posterior_predictive(model, posterior_samples(idata), data.x_test, data.y_test)
    scores = predictive_metrics(prediction, data)
    scores["seconds"] = seconds
    if variant == "learnt-noise":
        draws = posterior_samples(idata)
        sigma = float(draws["noise_precision"].rsqrt().mean()) * data.y_scale
        scores["fitted_noise"] = sigma
    print(variant, {k: round(float(v), 3) for k, v in scores.items()})
    return scores


def test_a_learnt_noise_makes_svi_underfit_because_of_its_objective():
    scores = _score("learnt-noise")
    assert scores["rmse"] > 2.5
    assert scores["fitted_noise"] > 3.0  # the generating noise is 1.0


@pytest.mark.parametrize("variant", ["seed004", "seed004-learnable-prior"])
def test_seed_004_model_reaches_the_bar(variant):
    scores = _score(variant)
    assert scores["rmse"] <= 1.3
    assert scores["log_likelihood"] >= -1.9
