"""Gradient variance and accuracy of the three SVI estimators on a 784-100-10 Bayesian MLP.

The estimators of :mod:`pyro_sgmcmc.variational.flipout` (one weight draw per minibatch, local
reparameterisation, Flipout) on Fashion-MNIST (pixels standardised with training statistics),
network 784-100-10 with sigmoid hidden units, N(0, 1) priors and a categorical likelihood, the
mean-field guide of :func:`pyro_sgmcmc.variational.svi.fit_svi`.

1. **Gradient variance** (and the milliseconds of one loss and gradient, all three estimators in
   the same plain-torch implementation). On a fixed guide and a fixed minibatch of
   ``--batch-size`` rows, ``--replicates`` independent gradients of the minibatch loss per
   estimator; the total variance
   :math:`V = \\mathbb E\\lVert g - \\mathbb E g\\rVert^2` over all guide parameters (and split
   into the means :math:`\\mu` and the softplus parameters :math:`\\rho`), with its standard
   error :math:`\\mathrm{sd}(d_r)/\\sqrt R`, :math:`d_r = \\lVert g_r - \\bar g\\rVert^2`. Measured
   twice: at the initial guide and at the guide fitted by plain reparameterisation (end of part
   2). The ratios to plain reparameterisation come with delta-method standard errors.
2. **Accuracy per epoch.** ``fit_svi(..., estimator=...)`` from the same initial means and seed
   for ``--epochs`` epochs; after every epoch, the test accuracy of the predictive mean over
   ``--draws`` guide draws (the training time per epoch excludes this evaluation). Plain
   reparameterisation runs through Pyro's ``TraceMeanField_ELBO`` there, so its seconds per
   epoch include Pyro's tracing overhead; compare speed with the ``ms/grad`` column.

Run: ``python benchmarks/flipout_variance.py`` (default: full training set, 10 000 test rows,
3 epochs, under 5 minutes on 2 busy cores), ``--quick`` (a smoke test), ``--data digits`` (the
scikit-learn digits, 64-100-10). Writes ``results/flipout_variance.json``
(``results/flipout_variance_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from _common import load_average, print_table, write_json

from pyro_sgmcmc.analysis import metrics
from pyro_sgmcmc.data.datasets import load_dataset
from pyro_sgmcmc.nn import BayesianMLP
from pyro_sgmcmc.variational.flipout import (
    ESTIMATORS,
    autonormal_loc_and_scale,
    guide_negative_elbo,
)
from pyro_sgmcmc.variational.svi import fit_svi

SHORT = {"reparameterization": "plain", "local_reparameterization": "LRT", "flipout": "Flipout"}


def init_scaled_normal(site: dict) -> torch.Tensor:
    """Initial means: N(0, 1/fan_in) weights (Glorot-like), zero biases; seeded by fit_svi."""
    value = site["fn"].sample()
    if site["name"].endswith(".weight"):
        return torch.randn_like(value) / math.sqrt(value.shape[-1])
    return torch.zeros_like(value)


def gradient_variance(model, guide, x, y, subsample, replicates: int, seed: int) -> dict:
    """Total gradient variance per estimator, for all parameters, the locs and the scales."""
    groups = {
        "all": list(guide.parameters()),
        "loc": list(guide.locs.parameters()),
        "rho": list(guide.scales.parameters()),
    }
    params = groups["all"]
    positions = {id(p): i for i, p in enumerate(params)}
    out, milliseconds = {}, {}
    for estimator in ESTIMATORS:
        generator = torch.Generator().manual_seed(seed)
        grads = []
        began = time.perf_counter()
        for _ in range(replicates):
            loss = guide_negative_elbo(
                model, guide, x, y, subsample, estimator=estimator, generator=generator
            )
            grads.append([g.double() for g in torch.autograd.grad(loss, params)])
        milliseconds[estimator] = 1e3 * (time.perf_counter() - began) / replicates
        out[estimator] = {}
        for name, members in groups.items():
            flat = torch.stack(
                [torch.cat([g[positions[id(p)]].flatten() for p in members]) for g in grads]
            )
            d = (flat - flat.mean(0)).square().sum(1) * replicates / (replicates - 1)
            out[estimator][name] = (d.mean().item(), d.std().item() / math.sqrt(replicates))
    ratios = {}
    for estimator in ESTIMATORS[1:]:
        ratios[estimator] = {}
        for name in groups:
            value, se = out[estimator][name]
            base, base_se = out["reparameterization"][name]
            ratio = value / base
            ratios[estimator][name] = (ratio, ratio * math.hypot(se / value, base_se / base))
    return {"variance": out, "ratio_to_plain": ratios, "ms_per_gradient": milliseconds}


def predictive_accuracy(model, guide, x_test, y_test, draws: int, seed: int) -> float:
    loc, scale, _ = autonormal_loc_and_scale(guide)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        probs = torch.zeros(x_test.shape[0], model.out_features)
        for _ in range(draws):
            params = {
                k: loc[k] + scale[k] * torch.randn(loc[k].shape, generator=generator) for k in loc
            }
            probs += model.functional_forward(params, x_test).softmax(-1) / draws
    return metrics.accuracy(probs, y_test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("fashion_mnist", "digits"), default="fashion_mnist")
    parser.add_argument("--max-train", type=int, default=None)
    parser.add_argument("--max-test", type=int, default=10000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--init-scale", type=float, default=0.05)
    parser.add_argument("--replicates", type=int, default=64)
    parser.add_argument("--draws", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2000 rows, 1 epoch, 16 replicates")
    args = parser.parse_args()
    if args.quick:
        args.max_train, args.max_test, args.epochs, args.replicates = 2000, 1000, 1, 16
    torch.set_num_threads(args.threads)
    start = time.perf_counter()

    data = load_dataset(args.data, seed=args.seed, max_train=args.max_train, max_test=args.max_test)
    x, y = data.x_train.float(), data.y_train.long()
    x_test, y_test = data.x_test.float(), data.y_test.long()
    batch_size = min(args.batch_size, x.shape[0])
    steps_per_epoch = x.shape[0] // batch_size
    print(
        f"{data.name}: N = {x.shape[0]}, test {x_test.shape[0]}, B = {batch_size}, "
        f"{steps_per_epoch} steps per epoch, {args.epochs} epochs; load {load_average()}"
    )

    def make_model():
        return BayesianMLP(
            x.shape[1], [100], 10, activation="sigmoid", likelihood="categorical", prior="normal"
        )

    subsample = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1))
    subsample = subsample[:batch_size]
    runs, fitted = {}, {}
    for estimator in ESTIMATORS:
        model = make_model()
        accuracy, train_seconds = [], []
        clock = {"last": time.perf_counter(), "eval": 0.0}

        def on_step(
            fit,
            step,
            guide,
            loss,
            model=model,
            accuracy=accuracy,
            train_seconds=train_seconds,
            clock=clock,
        ):
            if (step + 1) % steps_per_epoch:
                return
            now = time.perf_counter()
            train_seconds.append(now - clock["last"])
            accuracy.append(predictive_accuracy(model, guide, x_test, y_test, args.draws, 0))
            clock["last"] = time.perf_counter()

        result = fit_svi(
            model,
            x,
            y,
            num_steps=args.epochs * steps_per_epoch,
            batch_size=batch_size,
            learning_rate=args.learning_rate,
            estimator=estimator,
            init_scale=args.init_scale,
            init_loc_fn=init_scaled_normal,
            seed=args.seed,
            progress_bar=False,
            callback=on_step,
        )
        fitted[estimator] = (model, result)
        runs[estimator] = {
            "accuracy_per_epoch": accuracy,
            "train_seconds_per_epoch": train_seconds,
            "final_loss_per_datum": float(result.losses[0, -steps_per_epoch:].mean()) / x.shape[0],
        }
        print(
            f"  {SHORT[estimator]:>7}: accuracy per epoch "
            f"{', '.join(f'{a:.4f}' for a in accuracy)}; "
            f"{sum(train_seconds) / len(train_seconds):.1f} s per epoch"
        )

    variance = {}
    for label, epochs in (("initial guide", 0), ("fitted guide (plain, end)", args.epochs)):
        model, result = fitted["reparameterization"]
        if epochs == 0:
            model = make_model()
            result = fit_svi(
                model,
                x,
                y,
                num_steps=1,
                batch_size=batch_size,
                learning_rate=1e-12,
                init_scale=args.init_scale,
                init_loc_fn=init_scaled_normal,
                seed=args.seed,
                progress_bar=False,
            )
        variance[label] = gradient_variance(
            model, result.guide, x, y, subsample, args.replicates, args.seed
        )

    rows = []
    for label, v in variance.items():
        for estimator in ESTIMATORS:
            row = {"guide": label, "estimator": SHORT[estimator]}
            row["ms/grad"] = f"{v['ms_per_gradient'][estimator]:.1f}"
            for name in ("all", "loc", "rho"):
                value, se = v["variance"][estimator][name]
                row[f"V[{name}]"] = f"{value:.4g} ± {se:.2g}"
                if estimator != "reparameterization":
                    ratio, ratio_se = v["ratio_to_plain"][estimator][name]
                    row[f"ratio[{name}]"] = f"{ratio:.3f} ± {ratio_se:.3f}"
            rows.append(row)
    print(
        f"\nGradient variance on one minibatch of {batch_size} rows, {args.replicates} "
        "replicates (ratio: to plain reparameterisation)"
    )
    columns = ["guide", "estimator", "V[all]", "ratio[all]", "ratio[loc]", "ratio[rho]", "ms/grad"]
    print_table(rows, columns)
    print(f"\nTest accuracy (predictive mean of {args.draws} draws) after each epoch")
    acc_rows = [
        {
            "estimator": SHORT[e],
            **{f"epoch {i + 1}": f"{a:.4f}" for i, a in enumerate(runs[e]["accuracy_per_epoch"])},
            "s/epoch": f"{sum(runs[e]['train_seconds_per_epoch']) / args.epochs:.1f}",
        }
        for e in ESTIMATORS
    ]
    print_table(acc_rows, list(acc_rows[0]))
    total = time.perf_counter() - start
    path = write_json(
        "flipout_variance_quick" if args.quick else "flipout_variance",
        {
            "settings": {
                **vars(args),
                "dataset": data.name,
                "num_train": int(x.shape[0]),
                "num_test": int(x_test.shape[0]),
                "network": f"{x.shape[1]}-100-10",
                "activation": "sigmoid",
                "prior": "normal(0, 1)",
            },
            "gradient_variance": variance,
            "runs": runs,
            "load_average": load_average(),
            "total_seconds": total,
        },
    )
    print(f"\n{total:.0f} s in all; wrote {path}")


if __name__ == "__main__":
    main()
