"""Workload W4: Bayesian linear regression with an exact Gaussian posterior, N from 1e3 to 1e6.

d = 10, X ~ N(0, 1), true w ~ N(0, 1), y = X w + N(0, 0.5^2) (sigma known), prior w ~ N(0, I).
The posterior is N(mu, Sigma) with Sigma = (X'X / sigma^2 + I)^-1, mu = Sigma X'y / sigma^2.

Score: the 2-Wasserstein distance between the Gaussian fitted to the draws and the exact posterior,
divided by sqrt(trace Sigma) (300 iid exact draws score about 0.11). Samplers: Pyro NUTS
(``--nuts-warmup`` + ``--nuts-samples``, one chain) and vectorised SGHMC
(``pyro_sgmcmc.inference.vectorized.run_chains``: ``--chains`` chains, batch ``--batch-size``, 300
kept draws in all). Targets: at N = 1e4 a score <= 0.16 in no more time than NUTS; at N = 1e6 a
score <= 0.16 in at most 1/20 of NUTS's time. Also plots seconds per kept draw against N (PNG +
JSON).

SGHMC uses the control-variate gradient (SGHMC-CV, Baker et al. 2019; ``run_chains(...,
control_variate=True)``: an L-BFGS mode search on the full data, its full-data gradient once, then
minibatch gradient differences) unless ``--no-control-variate``; without it the minibatch noise
swamps the posterior once N/B is large (score ~9 at N = 1e6). Chains start at over-dispersed
prior draws (``initial_params``, so the model is traced once, not once per chain). SGHMC times
include all set-up (mode search included). NUTS at N = 1e6 takes ~5 minutes; ``--reuse-nuts``
takes NUTS's numbers from the previous JSON for the same N, seed and NUTS settings.

Run: ``python benchmarks/w4_known_posterior.py [--sizes 1000 10000 100000 1000000]``.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import pyro
import pyro.distributions as dist
import scipy.linalg
import torch
from _common import RESULTS, load_average, print_table, write_json
from pyro.infer import MCMC, NUTS

from pyro_sgmcmc import SGHMC
from pyro_sgmcmc.inference.vectorized import run_chains

DIM, SIGMA = 10, 0.5
TARGET_SCORE = 0.16


class LinearRegression:
    """The W4 model, a Pyro model with a batched fast path ``log_joint``."""

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1]), 1.0).to_event(1))
        mean = x @ w
        with pyro.plate("data", x.shape[0]) as idx:
            pyro.sample("obs", dist.Normal(mean[idx], SIGMA), obs=y[idx])

    def log_joint(self, params, subsample, x, y):
        w = params["w"]  # (D,) or (C, D)
        if subsample is None:
            xb, yb, scale = x, y, 1.0
        else:
            xb, yb, scale = x[subsample], y[subsample], x.shape[0] / subsample.shape[-1]
        mean = (xb @ w.unsqueeze(-1)).squeeze(-1) if w.dim() == 1 or xb.dim() == 3 else w @ xb.T
        residual = mean - yb
        log_lik = -0.5 * residual.square().sum(-1) / SIGMA**2 - residual.shape[-1] * math.log(
            SIGMA * math.sqrt(2 * math.pi)
        )
        log_prior = -0.5 * w.square().sum(-1) - w.shape[-1] * 0.5 * math.log(2 * math.pi)
        return log_prior + scale * log_lik


def make_data(num_data: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    w_true = torch.randn(DIM, generator=generator)
    x = torch.randn(num_data, DIM, generator=generator)
    y = x @ w_true + SIGMA * torch.randn(num_data, generator=generator)
    precision = x.double().T @ x.double() / SIGMA**2 + torch.eye(DIM, dtype=torch.float64)
    cov = torch.linalg.inv(precision)
    mean = cov @ (x.double().T @ y.double()) / SIGMA**2
    return x, y, mean.numpy(), cov.numpy()


def score(draws: np.ndarray, mean: np.ndarray, cov: np.ndarray) -> float:
    """W2(N(fitted), N(exact)) / sqrt(trace cov)."""
    m, s = draws.mean(0), np.cov(draws, rowvar=False)
    root = scipy.linalg.sqrtm(cov)
    cross = scipy.linalg.sqrtm(root @ s @ root).real
    w2_sq = np.sum((m - mean) ** 2) + np.trace(s + cov - 2 * cross)
    return float(math.sqrt(max(w2_sq, 0.0)) / math.sqrt(np.trace(cov)))


def run_nuts(x, y, warmup: int, samples: int, seed: int):
    pyro.set_rng_seed(seed)
    mcmc = MCMC(NUTS(LinearRegression()), warmup_steps=warmup, num_samples=samples,
                disable_progbar=True)  # fmt: skip
    start = time.perf_counter()
    mcmc.run(x, y)
    return mcmc.get_samples()["w"].double().numpy(), time.perf_counter() - start


def run_sghmc(x, y, args, seed: int):
    """300 kept draws over ``args.chains`` chains; step size is per datum (learning rate)."""
    num_data = x.shape[0]
    batch = min(args.batch_size, num_data)
    per_chain = math.ceil(300 / args.chains)
    generator = torch.Generator().manual_seed(seed)
    start = (
        torch.zeros(DIM)
        if args.start_at_zero
        else torch.randn(args.chains, DIM, generator=generator)
    )
    clock = time.perf_counter()
    kernel = SGHMC(
        LinearRegression(), num_steps_per_sample=args.thinning,
        learning_rate=args.learning_rate * SIGMA**2, friction=args.friction, batch_size=batch,
        seed=seed, control_variate=not args.no_control_variate,
    )  # fmt: skip
    result = run_chains(
        kernel, x, y, num_chains=args.chains, num_samples=per_chain,
        warmup_steps=args.warmup_draws, initial_params={"w": start},
    )  # fmt: skip
    total = time.perf_counter() - clock
    draws = result.samples["w"].reshape(-1, DIM)[:300].double().numpy()
    return draws, total, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000, 1000000])
    parser.add_argument("--nuts-warmup", type=int, default=300)
    parser.add_argument("--nuts-samples", type=int, default=300)
    parser.add_argument("--chains", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument(
        "--learning-rate", type=float, default=0.1, help="eta N / sigma^2 (step x curvature)"
    )
    parser.add_argument("--friction", type=float, default=0.5)
    parser.add_argument("--thinning", type=int, default=10)
    parser.add_argument("--warmup-draws", type=int, default=10)
    parser.add_argument("--start-at-zero", action="store_true", help="else prior draws per chain")
    parser.add_argument("--no-control-variate", action="store_true", help="plain SGHMC")
    parser.add_argument("--reuse-nuts", action="store_true", help="NUTS numbers from last JSON")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    previous = {}
    if args.reuse_nuts and (RESULTS / "w4_known_posterior.json").exists():
        old = json.loads((RESULTS / "w4_known_posterior.json").read_text())
        same = all(old["settings"].get(k) == getattr(args, k.replace("-", "_"))
                   for k in ("nuts_warmup", "nuts_samples", "seed"))  # fmt: skip
        previous = {r["num_data"]: r for r in old["runs"] if same and "nuts_score" in r}
    iid = []
    records, rows = [], []
    for num_data in args.sizes:
        x, y, mean, cov = make_data(num_data, args.seed)
        rng = np.random.default_rng(args.seed)
        iid.append(score(rng.multivariate_normal(mean, cov, 300), mean, cov))
        load = load_average()
        sg_draws, sg_time, result = run_sghmc(x, y, args, args.seed)
        if num_data in previous:
            nuts_score, nuts_time = (
                previous[num_data]["nuts_score"],
                previous[num_data]["nuts_seconds"],
            )
            nuts_load = previous[num_data].get(
                "nuts_load_average", previous[num_data]["load_average"]
            )
        else:
            nuts_load = load_average()
            nuts_draws, nuts_time = run_nuts(x, y, args.nuts_warmup, args.nuts_samples, args.seed)
            nuts_score = score(nuts_draws, mean, cov)
        record = {
            "num_data": num_data,
            "sghmc_score": score(sg_draws, mean, cov),
            "sghmc_seconds": sg_time,
            "sghmc_sampling_seconds": result.sampling_time,
            "sghmc_setup_seconds": result.setup_time,
            "sghmc_seconds_per_draw": sg_time / 300,
            "control_variate": not args.no_control_variate,
            "nuts_score": nuts_score,
            "nuts_reused": num_data in previous,
            "nuts_load_average": nuts_load,
            "nuts_seconds": nuts_time,
            "nuts_seconds_per_draw": nuts_time / args.nuts_samples,
            "iid_300_score": iid[-1],
            "load_average": load,
        }
        records.append(record)
        print(
            f"N={num_data:>8d}: SGHMC score {record['sghmc_score']:.3f} in {sg_time:.2f} s "
            f"(set-up {result.setup_time:.2f} s); NUTS score {record['nuts_score']:.3f} in "
            f"{nuts_time:.2f} s{' (reused)' if num_data in previous else ''}; iid {iid[-1]:.3f}; "
            f"load {load}"
        )
        limit = {10000: 1.0, 1000000: 1 / 20}.get(num_data)
        if limit is not None:
            ratio = sg_time / nuts_time
            rows.append(
                {
                    "workload": f"W4 N={num_data:.0e} score / time"
                    + ("" if args.no_control_variate else " (SGHMC-CV)"),
                    "ours": f"{record['sghmc_score']:.3f} / {sg_time:.2f} s",
                    "baseline": f"NUTS {record['nuts_score']:.3f} / {nuts_time:.2f} s",
                    "ratio": f"{ratio:.3f}",
                    "target": f"score <= {TARGET_SCORE}, time ratio <= {limit:g}",
                    "pass": record["sghmc_score"] <= TARGET_SCORE and ratio <= limit,
                }
            )
    print_table(rows, ["workload", "ours", "baseline", "ratio", "target", "pass"])

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["num_data"] for r in records]
    figure, axis = plt.subplots(figsize=(5, 3.5))
    axis.loglog(sizes, [r["sghmc_seconds_per_draw"] for r in records], "o-", label="SGHMC (ours)")
    axis.loglog(sizes, [r["nuts_seconds_per_draw"] for r in records], "s-", label="Pyro NUTS")
    axis.set_xlabel("N (data points)")
    axis.set_ylabel("seconds per kept draw")
    axis.set_title("W4: Bayesian linear regression, d = 10")
    axis.legend()
    figure.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    figure.savefig(RESULTS / "w4_seconds_per_draw.png", dpi=120)
    path = write_json(
        "w4_known_posterior",
        {"settings": vars(args), "runs": records, "rows": rows, "load_average_end": load_average()},
    )
    print(f"wrote {path} and {RESULTS / 'w4_seconds_per_draw.png'}")


if __name__ == "__main__":
    main()
