"""UCI regression on the standard splits with the samplers' default (adaptive) settings.

Protocol (Hernandez-Lobato & Adams 2015, reused by Gal & Ghahramani 2016 for MC dropout): for
each of the 20 published train/test splits of a data set, standardise features and target with
the training rows' mean and sd; one hidden layer of 50 ReLU units; report the mean over splits and
the standard error of the test RMSE and of the test log-likelihood, both in the target's original
units (the log-likelihood of the standardised target minus log(sd of y)).

Model: ``BayesianMLP(d, [50], 1, activation="relu")`` with N(0, 1) weights and a Gamma noise
precision (Gibbs-updated). Sampler: the kernel with no step size or learning rate (the adaptive
warm-up), batch 32, one kept draw per epoch, ``--epochs`` epochs of warm-up then as many of
sampling, ``--chains`` chains in ``run_chains``. Nothing is tuned per data set or split.

The data are read from ``../shared/data/uci`` (never copied into the project; override with
``--data-dir``); the MC-dropout means in the data folder's README (parsed at run time) are the
targets.

Run: ``python benchmarks/uci_regression.py [--datasets bostonHousing concrete energy]``; writes
``benchmarks/results/uci_regression.json``.
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from pathlib import Path

import numpy as np
import torch
from _common import load_average, print_table, write_json

from pyro_sgmcmc import PSGLD, SGHMC, SGLD, run_chains
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision, NormalLikelihood, NormalPrior

#: ``sghmc-euler``: SGHMC with Chen et al.'s step (its default until 2026-12-06; BAOAB since).
KERNELS = {
    "sghmc": SGHMC,
    "sghmc-euler": functools.partial(SGHMC, integrator="euler"),
    "sgld": SGLD,
    "psgld": PSGLD,
}
#: The published method whose means (read from the data folder's README) are the targets.
TARGET_METHOD = "MC dropout"
DATASETS = ("bostonHousing", "concrete", "energy")
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "uci"


def published_means(data_dir: Path, method: str = TARGET_METHOD) -> dict[str, tuple[float, ...]]:
    """The (RMSE, log-likelihood) means of ``method`` per data set, parsed from the table of
    published results in the data folder's README (``| data set | N | PBP | MC dropout | ...``);
    an empty mapping if the README has no such table."""
    readme = data_dir / "README.md"
    lines = readme.read_text().splitlines() if readme.is_file() else []
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines
            if line.lstrip().startswith("|")]  # fmt: skip
    if not rows or method not in rows[0]:
        return {}
    column = rows[0].index(method)
    means = {}
    for row in rows[2:]:
        try:
            means[row[0]] = tuple(float(value) for value in row[column].split("/"))
        except (ValueError, IndexError):
            continue
    return means


def load_split(directory: Path, split: int):
    data = np.loadtxt(directory / "data.txt")
    features = np.loadtxt(directory / "index_features.txt", dtype=int).reshape(-1)
    target = int(np.loadtxt(directory / "index_target.txt"))
    train = np.loadtxt(directory / f"index_train_{split}.txt", dtype=int)
    test = np.loadtxt(directory / f"index_test_{split}.txt", dtype=int)
    x, y = data[:, features], data[:, target]
    x_mean, x_sd = x[train].mean(0), x[train].std(0)
    x_sd[x_sd == 0] = 1.0
    y_mean, y_sd = y[train].mean(), y[train].std()

    def tensor(values):
        return torch.tensor(values, dtype=torch.float32)

    return (
        tensor((x[train] - x_mean) / x_sd),
        tensor((y[train] - y_mean) / y_sd),
        tensor((x[test] - x_mean) / x_sd),
        tensor(y[test]),
        float(y_mean),
        float(y_sd),
    )


def evaluate(model, samples, x_test, y_test, y_mean, y_sd) -> tuple[float, float]:
    """Test RMSE of the predictive mean and test log-likelihood of the predictive mixture."""
    with torch.no_grad():
        mean = model.functional_forward(samples, x_test).squeeze(-1)  # (S, M), standardised
        precision = samples["noise_precision"].reshape(-1, 1)
        scale = precision.rsqrt() * y_sd
        prediction = mean * y_sd + y_mean
        rmse = float((prediction.mean(0) - y_test).square().mean().sqrt())
        log_density = torch.distributions.Normal(prediction, scale).log_prob(y_test)
        log_lik = torch.logsumexp(log_density, 0) - math.log(log_density.shape[0])
    return rmse, float(log_lik.mean())


def run_split(name: str, directory: Path, split: int, args) -> dict:
    x, y, x_test, y_test, y_mean, y_sd = load_split(directory, split)
    model = BayesianMLP(
        x.shape[1], [50], 1, activation="relu",
        likelihood=NormalLikelihood(precision=GammaPrecision(2.0, 2.0 * 0.5**2)),
        prior=NormalPrior(1.0),
    )  # fmt: skip
    steps_per_epoch = max(x.shape[0] // args.batch_size, 1)
    kernel = KERNELS[args.kernel](
        model, batch_size=args.batch_size, num_steps_per_sample=steps_per_epoch, seed=split
    )
    start = time.perf_counter()
    result = run_chains(
        kernel, x, y, num_chains=args.chains, num_samples=args.epochs, warmup_steps=args.epochs
    )
    seconds = time.perf_counter() - start
    samples = result.get_samples()
    rmse, log_lik = evaluate(model, samples, x_test, y_test, y_mean, y_sd)
    divergent = int(result.sample_stats["diverging"].sum())  # kept draws with a divergence
    finite = all(bool(torch.isfinite(v).all()) for v in samples.values())
    return {
        "dataset": name,
        "split": split,
        "rmse": rmse,
        "test_ll": log_lik,
        "seconds": seconds,
        "divergent_draws": divergent,
        "finite": finite,
    }


def summarise(records: list[dict], name: str, targets: dict[str, tuple[float, ...]]) -> dict:
    rows = [r for r in records if r["dataset"] == name]
    rmse = np.array([r["rmse"] for r in rows])
    ll = np.array([r["test_ll"] for r in rows])
    target_rmse, target_ll = targets.get(name, (math.nan, math.nan))
    return {
        "dataset": name,
        "splits": len(rows),
        "rmse": f"{rmse.mean():.2f} +- {rmse.std(ddof=1) / math.sqrt(len(rows)):.2f}",
        "test ll": f"{ll.mean():.2f} +- {ll.std(ddof=1) / math.sqrt(len(rows)):.2f}",
        TARGET_METHOD: f"{target_rmse} / {target_ll}",
        "failed or diverged": sum((not r["finite"]) or r["divergent_draws"] > 0 for r in rows),
        "s per split": f"{np.mean([r['seconds'] for r in rows]):.1f}",
        "pass": bool(rmse.mean() < target_rmse and ll.mean() > target_ll),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--splits", type=int, default=20)
    parser.add_argument("--kernel", choices=sorted(KERNELS), default="sghmc")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    records = []
    for name in args.datasets:
        for split in range(args.splits):
            record = run_split(name, args.data_dir / name, split, args)
            records.append(record)
            print(
                f"{name} split {split}: RMSE {record['rmse']:.3f}, test LL {record['test_ll']:.3f}"
                f", {record['seconds']:.1f} s, divergent draws {record['divergent_draws']}",
                flush=True,
            )
    targets = published_means(args.data_dir)
    rows = [summarise(records, name, targets) for name in args.datasets]
    print(f"kernel {args.kernel} (defaults), {args.epochs} + {args.epochs} epochs, batch "
          f"{args.batch_size}, {args.chains} chain(s); load {load_average()}")  # fmt: skip
    print_table(rows, list(rows[0]))
    path = write_json(
        "uci_regression",
        {"settings": {k: str(v) for k, v in vars(args).items()}, "records": records,
         "summary": rows, "load_average": load_average()},
    )  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
