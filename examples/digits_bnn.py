"""Bayesian MLP on scikit-learn's digits: SGHMC with Gibbs-sampled precisions vs SGD and MAP.

Model: ``BayesianMLP(64, [50], 10, activation="tanh", likelihood="categorical",
prior=GammaPrecision(1, 1))``, one Gamma precision per weight matrix and bias vector (Neal 1996;
Chen et al. 2014 section 5). SGHMC moves the weights; the kernel's Gibbs steps redraw the
precisions from their exact conditionals once per epoch. Baselines: a plain torch network trained
by SGD with weight decay, and the MAP of the same model (``find_map``).

Run ``python examples/digits_bnn.py`` (about a minute on one core) or with ``--smoke`` for a
seconds-long check.
"""

from __future__ import annotations

import argparse
import time

import pyro
import torch
import torch.nn.functional as F
from pyro.infer import MCMC
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from pyro_sgmcmc import SGHMC
from pyro_sgmcmc.analysis.metrics import (
    accuracy,
    expected_calibration_error,
    negative_log_likelihood,
)
from pyro_sgmcmc.analysis.predictive import classify_with_cutoff, posterior_predictive
from pyro_sgmcmc.models.initialization import find_map, init_to_prior
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision


def load(seed: int = 0):
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=seed, stratify=y
    )
    mean, std = x_train.mean(0), x_train.std(0).clamp_min(1e-3)
    return (x_train - mean) / std, (x_test - mean) / std, y_train, y_test


def report(name: str, probs: torch.Tensor, y: torch.Tensor, seconds: float) -> dict:
    row = {
        "method": name,
        "accuracy": accuracy(probs, y),
        "nll": negative_log_likelihood(probs, y),
        "ece": expected_calibration_error(probs, y),
        "refused@0.2": float((classify_with_cutoff(probs, 0.2) == -1).float().mean()),
        "seconds": seconds,
    }
    print(
        f"{name:>14}: accuracy {row['accuracy']:.4f}  NLL {row['nll']:.4f}  "
        f"ECE {row['ece']:.4f}  time {seconds:.1f} s"
    )
    return row


def sgd_baseline(x, y, x_test, epochs, weight_decay, seed):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(64, 50), torch.nn.Tanh(), torch.nn.Linear(50, 10))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=weight_decay)
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in torch.randperm(x.shape[0]).split(100):
            optimizer.zero_grad()
            F.cross_entropy(net(x[batch]), y[batch]).backward()
            optimizer.step()
    with torch.no_grad():
        probs = torch.softmax(net(x_test), -1)
    return probs, time.perf_counter() - start


def main(smoke: bool = False, seed: int = 0) -> list[dict]:
    x, x_test, y, y_test = load(seed)
    rows = []

    probs, seconds = sgd_baseline(x, y, x_test, 5 if smoke else 100, 1e-4, seed)
    rows.append(report("SGD", probs, y_test, seconds))

    model = BayesianMLP(64, [50], 10, "tanh", "categorical", GammaPrecision(1.0, 1.0))
    pyro.set_rng_seed(seed)
    start = time.perf_counter()
    map_values = find_map(
        model,
        x,
        y,
        num_steps=50 if smoke else 1500,
        learning_rate=1e-2,
        batch_size=100,
        seed=seed,
        init_strategy=init_to_prior(0.1),
        return_values=True,
    )
    map_seconds = time.perf_counter() - start
    map_probs = posterior_predictive(model, {k: v[None] for k, v in map_values.items()}, x_test)
    rows.append(report("MAP (Adam)", map_probs.probs, y_test, map_seconds))

    # SGHMC from the MAP: per-datum learning rate 0.1 (step size 0.1 / N on the full-data
    # gradient), friction 0.05, 50 steps (about 4 epochs) per kept draw.
    kernel = SGHMC(
        model,
        learning_rate=0.1,
        friction=0.05,
        batch_size=100,
        num_steps_per_sample=5 if smoke else 50,
        init_strategy=map_values.init_strategy(),
        seed=seed,
    )
    mcmc = MCMC(
        kernel,
        num_samples=10 if smoke else 200,
        warmup_steps=5 if smoke else 50,
        disable_progbar=True,
    )
    start = time.perf_counter()
    mcmc.run(x, y)
    sghmc_seconds = time.perf_counter() - start + map_seconds
    draws = mcmc.get_samples()
    pred = posterior_predictive(model, draws, x_test, y_test)
    rows.append(report("SGHMC + Gibbs", pred.probs, y_test, sghmc_seconds))
    precisions = {k: float(v.mean()) for k, v in draws.items() if k.endswith("precision")}
    print("posterior mean precisions:", {k: round(v, 3) for k, v in precisions.items()})
    print(
        f"mean total entropy {float(pred.total_entropy.mean()):.3f}, aleatoric "
        f"{float(pred.expected_entropy.mean()):.3f}, epistemic (MI) "
        f"{float(pred.mutual_information.mean()):.3f} nats"
    )
    noise = torch.randn(500, 64)
    noise_pred = posterior_predictive(model, draws, noise)
    refused = float((classify_with_cutoff(noise_pred.probs, 0.2) == -1).float().mean())
    print(
        f"Gaussian-noise inputs: MI {float(noise_pred.mutual_information.mean()):.3f} nats, "
        f"refused at cut-off 0.2: {refused:.1%}"
    )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds, for CI")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    main(smoke=args.smoke, seed=args.seed)
