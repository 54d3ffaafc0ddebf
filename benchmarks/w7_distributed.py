"""Workload W7: SG-MCMC on 2 processes (``torch.distributed``, gloo, one thread each) vs 1.

Rows (each run is launched by ``torchrun --standalone --nproc-per-node=R``, ``OMP_NUM_THREADS=1``):

* ``mlp / data``: the W3 network (784-100-10 sigmoid ``BayesianMLP``, N(0, 1) prior), Fashion-MNIST
  training set (60000 rows), one SGHMC chain, batch 1000, one draw per epoch (60 steps),
  data parallel (``data_parallel=True``: each rank evaluates 500 rows of every batch, one
  all-reduce of the 79,510-dimensional gradient per step). Target: time per kept draw with 2
  ranks <= 0.6x that of 1 rank.
* ``mlp / chains``: the same network, 2 chains: on 1 rank stacked in one ``run_chains`` or one
  after the other (the faster counts; the table says which), or one per rank
  (``distribute_chains=True``, nothing communicated while sampling).
* ``lenet / data``: the W5 LeNet-5 at batch 256, when ``pyro_sgmcmc.nn`` has it (else skipped,
  and the table says so).
* ``lenet / chains``: the same, 2 chains, as for the MLP (stacked LeNet chains cost more than
  two single ones on the CPU: ``vmap``'s batched convolutions and pooling are slower).
* ``linreg / data``: W4's Bayesian linear regression at N = 1e6 (d = 10), 10 chains, SGHMC-CV,
  batch 1000, thinning 10: a step computes almost nothing, so communication and the per-step
  overhead, which data parallelism does not divide, dominate.

A probe measures gloo's all-reduce on loopback (latency ``alpha``, bandwidth ``beta``); with the
1-rank MLP at batches 1000 and 500 (fixed cost per step ``t0`` and cost per row ``c``) it fills
the scaling model of ``docs/distributed.md``,

    T(R) = t0 + c B / R + 2 (R - 1) alpha + 2 (R - 1) / R * bytes / beta,

whose prediction is printed beside the measured 2-rank time, and projected to 2..64 workers for
two networks; a second probe times the same all-reduce right after a step's compute, as it runs
in a data-parallel step. Run ``python benchmarks/w7_distributed.py`` (about 6 minutes) when the
machine is quiet: the JSON records the load average; ``--quick`` runs fewer draws.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed
from _common import fashion_mnist_or_synthetic, load_average, print_table, write_json

HERE = Path(__file__).resolve().parent
MLP_BATCH, LENET_BATCH, LINREG_BATCH = 1000, 256, 1000
#: Networks for the projection: (name, alpha seconds, beta bytes per second).
NETWORKS = [("10 GbE, gloo", 50e-6, 1.0e9), ("100 Gb/s InfiniBand, NCCL", 10e-6, 10e9)]


# ------------------------------------------------------------------------- the ranks' side
def mlp_run(args) -> dict:
    from pyro_sgmcmc import SGHMC
    from pyro_sgmcmc.nn import BayesianMLP

    x, y, source = fashion_mnist_or_synthetic()
    model = BayesianMLP(784, [100], 10, activation="sigmoid", likelihood="categorical")
    kernel = SGHMC(
        model,
        learning_rate=0.05,
        friction=0.1,
        batch_size=args.batch,
        num_steps_per_sample=x.shape[0] // args.batch,
        seed=0,
        data_parallel=args.mode == "data",
    )
    return {"kernel": kernel, "data": (x, y), "chains": args.chains, "source": source}


def lenet_run(args) -> dict | None:
    import pyro_sgmcmc.nn as nn

    factory = getattr(nn, "LeNet5", None)
    if factory is None:
        return None
    from pyro_sgmcmc import SGHMC

    x, y, source = fashion_mnist_or_synthetic()
    kernel = SGHMC(
        factory(),
        learning_rate=0.05,
        friction=0.1,
        batch_size=args.batch,
        num_steps_per_sample=50,
        seed=0,
        data_parallel=args.mode == "data",
    )
    data = (x.reshape(-1, 1, 28, 28), y)
    return {"kernel": kernel, "data": data, "chains": args.chains, "source": source}


def linreg_run(args) -> dict:
    sys.path.insert(0, str(HERE))
    from w4_known_posterior import SIGMA, LinearRegression, make_data

    from pyro_sgmcmc import SGHMC

    x, y, _, _ = make_data(1_000_000, 0)
    kernel = SGHMC(
        LinearRegression(),
        learning_rate=0.1 * SIGMA**2,
        friction=0.5,
        batch_size=args.batch,
        num_steps_per_sample=10,
        seed=0,
        control_variate=True,
        data_parallel=args.mode == "data",
    )
    return {"kernel": kernel, "data": (x, y), "chains": 10, "source": "synthetic (W4)"}


def probe_all_reduce() -> dict:
    """Median seconds of gloo's all-reduce of float32 vectors of several sizes, back to back,
    and of the MLP's gradient-sized one right after a step's worth of compute (as in a
    data-parallel run)."""
    import torch.distributed as dist

    timings = {}
    for size in (1, 1_000, 10_000, 100_000, 1_000_000):
        buffer = torch.ones(size)
        for _ in range(5):
            dist.all_reduce(buffer)
        samples = []
        for _ in range(40 if size < 1_000_000 else 10):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            samples.append(time.perf_counter() - start)
        timings[size] = sorted(samples)[len(samples) // 2]
    return {"all_reduce_seconds": timings, "after_compute_seconds": _all_reduce_after_compute()}


def _all_reduce_after_compute() -> dict:
    """Median and mean seconds of the all-reduce of the W3 gradient (79,513 floats) when each
    rank has just run the forward and backward pass of 500 rows of the W3 network (the mean
    counts the stalls in the tail, which a throughput pays)."""
    import torch.distributed as dist

    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(500, 784, generator=generator)
    hidden = torch.randn(784, 100, generator=generator, requires_grad=True)
    out = torch.randn(100, 10, generator=generator, requires_grad=True)
    buffer = torch.ones(79_513)
    samples = []
    for index in range(110):
        torch.sigmoid(rows @ hidden).matmul(out).logsumexp(1).sum().backward()
        start = time.perf_counter()
        dist.all_reduce(buffer)
        if index >= 10:
            samples.append(time.perf_counter() - start)
    samples.sort()
    return {
        "median": samples[len(samples) // 2],
        "mean": sum(samples) / len(samples),
        "p90": samples[9 * len(samples) // 10],
    }


def worker(args) -> None:
    """One rank: build the workload, time its kept draws, rank 0 writes the JSON."""
    from pyro_sgmcmc import init_distributed, run_chains
    from pyro_sgmcmc.engine.distributed import world
    from pyro_sgmcmc.errors import SamplerWarning

    torch.set_num_threads(1)
    # short timing runs without warm-up: the health checks' warnings say nothing about speed
    warnings.filterwarnings("ignore", category=SamplerWarning)
    init_distributed("gloo")
    rank, size = world()
    if args.workload == "probe":
        record = probe_all_reduce()
    else:
        run = {"mlp": mlp_run, "lenet": lenet_run, "linreg": linreg_run}[args.workload](args)
        if run is None:
            record = {"skipped": "pyro_sgmcmc.nn has no LeNet5 (issue 15)"}
        else:
            record = time_draws(run, args, run_chains)
    if rank == 0:
        record.update(workload=args.workload, mode=args.mode, ranks=size, batch=args.batch)
        Path(args.result).write_text(json.dumps(record))
    torch.distributed.destroy_process_group()


def time_draws(run: dict, args, run_chains) -> dict:
    stamps: list[float] = []
    result = run_chains(
        run["kernel"],
        *run["data"],
        num_chains=run["chains"],
        num_samples=args.draws,
        warmup_steps=1,
        callback=lambda index, draw: stamps.append(time.perf_counter()),
        distribute_chains=args.mode == "chains",
    )
    per_draw = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    steps = run["kernel"].settings.num_steps_per_sample
    dim = sum(value[0, 0].numel() for value in result.samples.values())
    return {
        "seconds_per_draw": per_draw,
        "seconds_per_step": per_draw / steps,
        "steps_per_draw": steps,
        "chains": run["chains"],
        "dimension": dim,
        "data": run["source"],
        "setup_seconds": result.setup_time,
    }


# ------------------------------------------------------------------------- the launcher's side
def launch(workload: str, mode: str, ranks: int, batch: int, draws: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "result.json"
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            str(Path(__file__).resolve()),
            "--worker",
            workload,
            "--mode",
            mode,
            "--batch",
            str(batch),
            "--draws",
            str(draws),
            "--result",
            str(result),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(command, check=True, env=env, cwd=HERE, timeout=1800)
        return json.loads(result.read_text())


def _one_rank_baseline(runs: dict, name: str, stacked: dict) -> tuple[dict, str]:
    """The 1-rank time to beat: for the chains rows, the faster of the chains stacked in one
    ``run_chains`` and the same chains one after the other (``chains`` times the 1-chain run of
    the data row: same network, batch and steps per draw); a user on one rank takes the
    faster."""
    if not name.endswith("/chains"):
        return stacked, "stacked" if stacked["chains"] > 1 else ""
    single = runs.get(name.replace("/chains", "/data") + "/1")
    if single is None or "skipped" in single:
        return stacked, "stacked"
    chains = stacked["chains"]
    one_by_one = chains * single["seconds_per_draw"]
    if one_by_one >= stacked["seconds_per_draw"]:
        return stacked, "stacked"
    baseline = dict(stacked, seconds_per_draw=one_by_one)
    baseline["seconds_per_step"] = one_by_one / stacked["steps_per_draw"]
    return baseline, "one after the other"


def fit_all_reduce(probe: dict) -> tuple[float, float]:
    """``alpha`` from the 1-float all-reduce, ``beta`` from the 1e6-float one (2 ranks: a ring
    all-reduce sends 2 (R-1)/R = 1 times the buffer)."""
    seconds = {int(k): v for k, v in probe["all_reduce_seconds"].items()}
    alpha = seconds[1] / 2
    beta = 4e6 / max(seconds[1_000_000] - 2 * alpha, 1e-9)
    return alpha, beta


def model_time(
    t0: float, per_row: float, batch: int, ranks: int, nbytes: float, alpha: float, beta: float
) -> float:
    """Seconds per step of the scaling model (docs/distributed.md)."""
    if ranks == 1:
        return t0 + per_row * batch
    comm = 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * nbytes / beta
    return t0 + per_row * batch / ranks + comm


def projection(t0: float, per_row: float, nbytes: float) -> list[dict]:
    """Projected speed-up of the MLP step (batch 1000) for 2..64 workers, one core each."""
    rows = []
    for ranks in (2, 4, 8, 16, 32, 64):
        row = {"workers": ranks}
        for name, alpha, beta in NETWORKS:
            one = model_time(t0, per_row, MLP_BATCH, 1, nbytes, alpha, beta)
            many = model_time(t0, per_row, MLP_BATCH, ranks, nbytes, alpha, beta)
            comm = many - t0 - per_row * MLP_BATCH / ranks
            row[f"speed-up ({name})"] = f"{one / many:.2f}"
            row[f"comm ms ({name})"] = f"{1e3 * comm:.2f}"
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="data", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=MLP_BATCH, help=argparse.SUPPRESS)
    parser.add_argument("--draws", type=int, default=12, help="kept draws timed per run")
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="3 draws per run")
    args = parser.parse_args()
    if args.worker is not None:
        args.workload, args.chains = args.worker, 2 if args.mode == "chains" else 1
        worker(args)
        return
    draws = 3 if args.quick else args.draws
    load_before = load_average()
    runs = measure(draws)
    report(runs, draws, load_before)


def measure(draws: int) -> dict:
    plan = {"probe": ("probe", "data", 2, 1, 0)}
    for ranks in (1, 2):
        plan[f"mlp/data/{ranks}"] = ("mlp", "data", ranks, MLP_BATCH, draws)
        plan[f"mlp/chains/{ranks}"] = ("mlp", "chains", ranks, MLP_BATCH, draws)
        plan[f"lenet/data/{ranks}"] = ("lenet", "data", ranks, LENET_BATCH, draws)
        plan[f"lenet/chains/{ranks}"] = ("lenet", "chains", ranks, LENET_BATCH, draws)
        plan[f"linreg/data/{ranks}"] = ("linreg", "data", ranks, LINREG_BATCH, 4 * draws)
    plan["mlp/data/1/half"] = ("mlp", "data", 1, MLP_BATCH // 2, draws)
    runs = {}
    for key, (workload, mode, ranks, batch, count) in plan.items():
        print(f"[w7] {key} ...", file=sys.stderr, flush=True)
        runs[key] = launch(workload, mode, ranks, batch, count)
    return runs


def report(runs: dict, draws: int, load_before: list[float]) -> None:
    alpha, beta = fit_all_reduce(runs["probe"])
    full, half = runs["mlp/data/1"], runs["mlp/data/1/half"]
    per_row = (full["seconds_per_step"] - half["seconds_per_step"]) / (MLP_BATCH / 2)
    t0 = full["seconds_per_step"] - per_row * MLP_BATCH
    rows, notes = [], []
    for name in ("mlp/data", "mlp/chains", "lenet/data", "lenet/chains", "linreg/data"):
        one, two = runs[f"{name}/1"], runs[f"{name}/2"]
        if "skipped" in one:
            notes.append(f"{name}: skipped, {one['skipped']}")
            continue
        nbytes = 4 * one["chains"] * (one["dimension"] + 3)
        one, how = _one_rank_baseline(runs, name, one)
        predicted = ""
        if name == "mlp/data":
            step = model_time(t0, per_row, MLP_BATCH, 2, nbytes, alpha, beta)
            predicted = f"{step * one['steps_per_draw']:.3f}"
        rows.append(
            {
                "workload": name,
                "batch": one["batch"],
                "chains": one["chains"],
                "steps/draw": one["steps_per_draw"],
                "1 rank s/draw": f"{one['seconds_per_draw']:.3f}",
                "2 ranks s/draw": f"{two['seconds_per_draw']:.3f}",
                "ratio 2/1": f"{two['seconds_per_draw'] / one['seconds_per_draw']:.2f}",
                "1 rank ms/step": f"{1e3 * one['seconds_per_step']:.2f}",
                "2 ranks ms/step": f"{1e3 * two['seconds_per_step']:.2f}",
                "model 2 ranks s/draw": predicted,
                "1 rank runs the chains": how,
                "bytes/step": nbytes if "data" in name else 0,
            }
        )
    print_table(rows, list(rows[0]))
    print(
        f"all-reduce on loopback: alpha = {1e6 * alpha:.0f} us, beta = {beta / 1e9:.2f} GB/s; "
        f"MLP step: t0 = {1e3 * t0:.2f} ms fixed + c = {1e6 * per_row:.1f} us per row"
    )
    loaded = runs["probe"].get("after_compute_seconds")
    if loaded is not None:
        idle = model_time(0.0, 0.0, 0, 2, 4 * 79_513, alpha, beta)
        print(
            "all-reduce of the MLP gradient right after a step's compute: median "
            f"{1e3 * loaded['median']:.2f} ms, mean {1e3 * loaded['mean']:.2f} ms, 90th "
            f"percentile {1e3 * loaded['p90']:.2f} ms (the model's idle estimate: "
            f"{1e3 * idle:.2f} ms)"
        )
    for note in notes:
        print(note)
    mlp_bytes = 4 * (runs["mlp/data/1"]["dimension"] + 3)
    projected = projection(t0, per_row, mlp_bytes)
    print_table(projected, list(projected[0]))
    load_after = load_average()
    print(f"load average before {load_before}, after {load_after}")
    write_json(
        "w7_distributed",
        {
            "rows": rows,
            "runs": runs,
            "notes": notes,
            "draws_timed": draws,
            "model": {"alpha_s": alpha, "beta_bytes_per_s": beta, "t0_s": t0, "per_row_s": per_row},
            "projection": projected,
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
    )


if __name__ == "__main__":
    main()
