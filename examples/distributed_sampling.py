"""SG-MCMC of a Bayesian MLP on several processes, with PyTorch's own distributed engine.

Launch R processes (ranks) with PyTorch's launcher; every rank runs this script alike:

    torchrun --nproc-per-node=2 examples/distributed_sampling.py --mode data
    torchrun --nproc-per-node=2 examples/distributed_sampling.py --mode chains

``--mode data`` (one chain, many workers): every rank runs the same chains and evaluates its
share of every minibatch; one all-reduce per gradient step sums the shares, so each step costs
about 1/R of the compute plus the all-reduce of a parameter-sized vector. For networks or data
whose gradient is expensive. The chains are those of a one-process run with the same seed and
batch, to rounding.

``--mode chains`` (chains across processes): each rank runs its share of the chains, with the
seeds they have in one process; the draws are gathered at the end, so every rank gets all
chains (R-hat and ESS across ranks). Nothing is communicated while sampling. For more chains in
the same wall time.

On GPUs the same command works: :func:`pyro_sgmcmc.init_distributed` picks NCCL when CUDA is
available and gives each rank its GPU (``cuda:LOCAL_RANK``); the model and data are moved there.
Rank 0 prints the convergence report and writes the ``InferenceData`` (``--out``). With
``--checkpoint FILE`` a run whose rank fails stops on every rank with ``DistributedRunError``;
start the same command again with ``--resume`` to continue it. See ``docs/distributed.md``.
``--smoke`` runs a few draws (seconds).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed

from pyro_sgmcmc import SGHMC, convergence_report, init_distributed, run_chains
from pyro_sgmcmc.data.datasets import list_datasets, load_dataset
from pyro_sgmcmc.engine.distributed import world
from pyro_sgmcmc.nn import BayesianMLP


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("data", "chains"), default="data")
    parser.add_argument("--dataset", choices=list_datasets(), default="sinusoid")
    parser.add_argument("--chains", type=int, default=4, help="chains in all (default 4)")
    parser.add_argument("--num-samples", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps-per-sample", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--checkpoint", default=None, help="checkpoint file (rank files in chains mode)"
    )
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--out", default=None, help="netCDF file for the InferenceData (rank 0)")
    parser.add_argument("--smoke", action="store_true", help="a few draws, for a quick check")
    return parser.parse_args()


def main() -> None:
    args = parse()
    device = init_distributed()  # the process group torchrun describes: gloo or NCCL
    torch.set_num_threads(1)  # one core per rank; torchrun sets OMP_NUM_THREADS=1 as well
    rank, size = world()
    data = load_dataset(args.dataset, seed=args.seed)
    x, y = data.x_train.to(device), data.y_train.to(device)
    likelihood = "categorical" if data.task == "classification" else "normal"
    output_dim = data.num_classes if data.task == "classification" else 1
    model = BayesianMLP(
        data.x_train.shape[1], [20, 20], output_dim, activation="tanh", likelihood=likelihood
    ).to(device)
    samples, warmup = (4, 4) if args.smoke else (args.num_samples, args.warmup)
    kernel = SGHMC(
        model,
        step_size=3e-4,
        friction=0.3,
        batch_size=min(args.batch_size, x.shape[0]),
        num_steps_per_sample=args.steps_per_sample,
        seed=args.seed,
        data_parallel=args.mode == "data",
    )
    began = time.perf_counter()
    result = run_chains(
        kernel,
        x,
        y,
        num_chains=args.chains,
        num_samples=samples,
        warmup_steps=warmup,
        distribute_chains=args.mode == "chains",
        checkpoint_path=args.checkpoint,
        checkpoint_every=10 if args.checkpoint else None,
        resume_from=args.checkpoint if args.resume else None,
        overwrite=not args.resume,
    )
    seconds = time.perf_counter() - began
    torch.distributed.destroy_process_group()
    if rank != 0:
        return
    print(
        f"{args.mode} mode on {size} rank(s) ({device.type}): {result.num_chains} chains x "
        f"{result.num_draws} draws in {seconds:.1f} s"
    )
    idata = result.to_inference_data(test=(data.x_test.to(device), data.y_test.to(device)))
    report = convergence_report(idata, "SGHMC", wall_time=seconds)
    print(
        f"max R-hat {report.max_rhat:.3f}, min bulk ESS {report.min_ess_bulk:.0f}, "
        f"divergences {report.divergences}"
    )
    if args.out:
        idata.to_netcdf(args.out)
        print(f"InferenceData written to {args.out}")


if __name__ == "__main__":
    main()
