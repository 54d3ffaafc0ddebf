"""Runs of the distributed tests, one function per scenario, and the launcher of their ranks.

Each scenario builds its run from ``distributed`` (``False``: the one-process reference, run in
the test process; ``True``: on every rank of a process group) and returns a dict of tensors.
Run as a script, this module is one rank: ``python distributed_scenarios.py OUT SCENARIO...``
with the variables ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...); it saves
each scenario's output to ``OUT/<scenario>.rank<r>.pt`` and, when a run raises, the message to
``OUT/<scenario>.rank<r>.error``. :func:`launch` starts the ranks as plain subprocesses (the
kernels' chain numbering under ``pyro.infer.MCMC`` needs each rank to be a main process).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from unittest import mock

import pyro
import pyro.distributions as dist
import torch
import torch.distributed
from pyro.infer import MCMC

from pyro_sgmcmc import SGHMC, SGLD, ResumableMCMC, run_chains
from pyro_sgmcmc.engine import engine as engine_module
from pyro_sgmcmc.engine.adaptation import AdaptiveControl
from pyro_sgmcmc.engine.thinning import ThinningMeter
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision

NUM_SAMPLES, WARMUP = 6, 4


def mlp_data(num_data: int = 40):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(num_data, 2, generator=generator, dtype=torch.float64)
    y = torch.sin(x[:, 0]) + 0.1 * torch.randn(num_data, generator=generator, dtype=torch.float64)
    return BayesianMLP(2, [5], 1, prior=GammaPrecision(2.0, 1.0)), (x, y)


def hierarchical(y):
    """A hand-written Pyro model (Pyro's trace potential): a Normal-Gamma pair (Gibbs-updated
    ``tau``) and a constrained site ``s``."""
    tau = pyro.sample("tau", dist.Gamma(2.0, 1.0))
    mu = pyro.sample("mu", dist.Normal(0.0, tau.rsqrt()))
    s = pyro.sample("s", dist.HalfNormal(2.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mu, s), obs=y[idx])


def regression(x, y):
    w = pyro.sample("w", dist.Normal(torch.zeros(x.shape[1], dtype=x.dtype), 1.0).to_event(1))
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(x[idx] @ w, 0.5), obs=y[idx])


def sghmc(model, distributed: bool, **options) -> SGHMC:
    options = {
        "step_size": 1e-3,
        "batch_size": 10,
        "num_steps_per_sample": 3,
        "seed": 7,
        "friction": 0.3,
        **options,
    }
    return SGHMC(model, data_parallel=distributed, **options)


def _chains(result) -> dict[str, torch.Tensor]:
    return {**result.samples, "lp": torch.from_numpy(result.sample_stats["lp"])}


def data_mlp(distributed: bool) -> dict[str, torch.Tensor]:
    """Data parallel, BayesianMLP (closed-form gradient), Gibbs precisions, 2 chains."""
    model, data = mlp_data()
    kernel = sghmc(model, distributed)
    return _chains(
        run_chains(kernel, *data, num_chains=2, num_samples=NUM_SAMPLES, warmup_steps=WARMUP)
    )


def data_trace(distributed: bool) -> dict[str, torch.Tensor]:
    """Data parallel, a hand-written model through Pyro's trace, SGLD, no seed given (the ranks
    agree on rank 0's), odd batch size (shares of 4 and 3 rows)."""
    y = 1.0 + 0.5 * torch.randn(60, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    pyro.set_rng_seed(3)
    kernel = SGLD(
        hierarchical,
        step_size=1e-3,
        batch_size=7,
        num_steps_per_sample=2,
        data_parallel=distributed,
    )
    return _chains(
        run_chains(kernel, y, num_chains=1, num_samples=NUM_SAMPLES, warmup_steps=WARMUP)
    )


def data_control_variate(distributed: bool) -> dict[str, torch.Tensor]:
    """Data parallel with the control-variate estimator, and the full-data (no minibatch) path
    on an odd number of rows."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(201, 3, generator=generator, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 0.5 * torch.randn(
        201, generator=generator, dtype=torch.float64
    )
    out = {}
    for name, options in {
        "cv": {"control_variate": True, "batch_size": 20},
        "full": {"batch_size": None},
    }.items():
        kernel = sghmc(regression, distributed, step_size=1e-4, **options)
        result = run_chains(
            kernel, x, y, num_chains=2, num_samples=NUM_SAMPLES, warmup_steps=WARMUP
        )
        out.update({f"{name}.{k}": v for k, v in _chains(result).items()})
    return out


def data_mcmc(distributed: bool) -> dict[str, torch.Tensor]:
    """Data parallel inside pyro.infer.MCMC (one chain) and ResumableMCMC (two, in turn)."""
    model, data = mlp_data()
    mcmc = MCMC(
        sghmc(model, distributed),
        num_samples=NUM_SAMPLES,
        warmup_steps=WARMUP,
        num_chains=1,
        disable_progbar=True,
    )
    mcmc.run(*data)
    resumable = ResumableMCMC(
        sghmc(model, distributed),
        num_samples=NUM_SAMPLES,
        warmup_steps=WARMUP,
        num_chains=2,
        disable_progbar=True,
    )
    resumable.run(*data)
    out = {f"mcmc.{k}": v for k, v in mcmc.get_samples(group_by_chain=True).items()}
    out.update({f"resumable.{k}": v for k, v in resumable.get_samples(group_by_chain=True).items()})
    return out


def _chains_across_ranks(distributed: bool, **options):
    """3 chains (2 on rank 0, 1 on rank 1) of the MLP."""
    model, data = mlp_data()
    return run_chains(
        sghmc(model, False),
        *data,
        num_chains=3,
        num_samples=NUM_SAMPLES,
        warmup_steps=WARMUP,
        distribute_chains=distributed,
        **options,
    )


def chains_mlp(distributed: bool) -> dict[str, torch.Tensor]:
    """Chains across processes: 3 chains (2 on rank 0, 1 on rank 1), with the training rows at
    which the network's verdict judged its outputs (what an export records)."""
    result = _chains_across_ranks(distributed)
    out = _chains(result)
    out["seeds"] = torch.tensor(result.chain_seeds)
    out["judged_rows"] = torch.tensor(result.judged_rows)
    out["judged_of_rows"] = torch.tensor(result.judged_of_rows)
    out["converged"] = torch.tensor(result.verdict.converged)
    out["thinning"] = torch.tensor([r["num_steps_per_sample"] for r in result.chain_reports])
    return out


def chains_rounds(distributed: bool) -> dict[str, torch.Tensor]:
    """Chains across processes run until converged: rounds beyond ``num_samples`` (judged on
    every rank's chains, sized alike on every rank)."""
    result = _chains_across_ranks(distributed, target_ess=30)
    out = _chains(result)
    out["judged_at"] = torch.tensor(result.judged_at)
    out["converged"] = torch.tensor(result.verdict.converged)
    return out


def chains_too_hot(distributed: bool) -> dict[str, torch.Tensor]:
    """Chains across processes with a hand-given step too large (chains 25-40 times too hot):
    a run until converged stops after its first verdict on every rank, as in one process."""
    from stats_helpers import ConjugateLinearRegression, regression_data

    x, y = (t.double() for t in regression_data(n=1000, d=3))
    model = ConjugateLinearRegression(prior_scale=10.0)
    result = run_chains(SGHMC(model, batch_size=50, step_size=4e-5, seed=0), x, y,
                        num_chains=3, num_samples=300, warmup_steps=100, target_ess=4000,
                        max_seconds=120, distribute_chains=distributed)  # fmt: skip
    return {
        "judged_at": torch.tensor(result.judged_at),
        "too_hot": torch.tensor([r["too_hot"] for r in result.chain_reports]),
        "temperature_first": torch.tensor(result.verdict.statistic == "temperature"),
    }


def _chains_deciding_together(distributed: bool, model, data) -> dict[str, torch.Tensor]:
    """3 chains across processes (2 on rank 0, 1 on rank 1) whose warm-up chooses their
    thinning, with the warm-up's joint decision wanted by an engine of 1 or 3 chains (rank 1's,
    or all three in one process) and not by one of 2 (rank 0's): the ranks must decide as one."""
    kernel = sghmc(model, False, step_size=None, num_steps_per_sample=None)  # the adaptive warm-up
    result = run_chains(kernel, *data, num_chains=3,
                        num_samples=NUM_SAMPLES, warmup_steps=WARMUP,
                        distribute_chains=distributed)  # fmt: skip
    out = _chains(result)
    steps = [report["warmup_gradient_steps"] for report in result.chain_reports]
    out["warmup_gradient_steps"] = torch.tensor(steps)
    return out


def _not_two_chains(engine) -> bool:
    return engine.position.shape[0] != 2


def _unless_two_chains(meter: ThinningMeter) -> bool:
    times = meter.measure()
    return times is not None and len(times) != 2


def chains_lengthened(distributed: bool) -> dict[str, torch.Tensor]:
    """Chains across processes, the warm-up lengthened because rank 1's chain wants it."""
    with (
        mock.patch.object(ThinningMeter, "wants_longer", _unless_two_chains),
        mock.patch.object(engine_module, "LONGEST_WARMUP", 2),
    ):
        generator = torch.Generator().manual_seed(2)
        x = torch.randn(40, 3, generator=generator, dtype=torch.float64)
        y = x @ torch.tensor([1.0, -0.5, 0.2]) + 0.5 * torch.randn(40, generator=generator)
        return _chains_deciding_together(distributed, regression, (x, y))


def groups(group, y):
    """Four group effects under a scale (the warm-up's descent is watched for a funnel)."""
    tau = pyro.sample("tau", dist.HalfNormal(1.0))
    with pyro.plate("groups", 4):
        effect = pyro.sample("effect", dist.Normal(0.0, tau))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(effect[group[idx]], 1.0), obs=y[idx])


def chains_started_again(distributed: bool) -> dict[str, torch.Tensor]:
    """Chains across processes, the warm-up started again because rank 1's descent (as the
    patched check says) ran into a funnel."""
    generator = torch.Generator().manual_seed(1)
    group = torch.arange(40) % 4
    y = torch.randn(40, generator=generator, dtype=torch.float64) + 0.3 * group
    asked = AdaptiveControl.ran_into_funnel

    def ran_into_funnel(control, engine):
        asked(control, engine)  # the question is asked once, as without the patch
        return _not_two_chains(engine)

    with mock.patch.object(AdaptiveControl, "ran_into_funnel", ran_into_funnel):
        out = _chains_deciding_together(distributed, groups, (group, y))
    return out


def _dies_at(index: int):
    """A callback that kills rank 1 (SIGKILL: no clean-up) after the kept draw ``index``."""

    def callback(draw_index, draw):
        if int(os.environ.get("RANK", "0")) == 1 and draw_index == index:
            os.kill(os.getpid(), signal.SIGKILL)

    return callback


def _crash_run(distributed: bool, resume: bool, **options) -> dict[str, torch.Tensor]:
    model, data = mlp_data()
    data_parallel = options.pop("data_parallel")
    kernel = sghmc(model, distributed and data_parallel)
    path = Path(options.pop("out")) / "run.ckpt"
    result = run_chains(
        kernel,
        *data,
        num_chains=options.pop("num_chains"),
        num_samples=NUM_SAMPLES,
        warmup_steps=WARMUP,
        checkpoint_path=path if distributed else None,
        checkpoint_every=1,
        resume_from=path if resume else None,
        callback=None if resume else _dies_at(2),
        **options,
    )
    return _chains(result)


def crash_data(distributed: bool, out: str = "", resume: bool = False):
    """Data parallel; rank 1 is killed after its third kept draw; then resumed."""
    return _crash_run(distributed, resume, data_parallel=True, out=out, num_chains=2)


def crash_chains(distributed: bool, out: str = "", resume: bool = False):
    """Chains across processes; rank 1 is killed after its third kept draw; then resumed."""
    return _crash_run(
        distributed,
        resume,
        data_parallel=False,
        out=out,
        num_chains=3,
        distribute_chains=distributed,
    )


class RankDependentUpdate:
    """A faulty Gibbs update whose draw depends on the rank: the ranks' states part."""

    sites = ("tau",)

    def sample(self, params, generator, *args, **kwargs):
        rank = int(os.environ.get("RANK", "0"))
        return {"tau": params["tau"] * (1.0 + 1e-3 * rank)}


def diverging_ranks(distributed: bool) -> dict[str, torch.Tensor]:
    """Data parallel with a Gibbs update that differs between ranks: refused after its step."""
    y = torch.linspace(0.0, 2.0, 30, dtype=torch.float64)
    kernel = SGLD(
        hierarchical,
        step_size=1e-3,
        batch_size=6,
        seed=1,
        gibbs_every=2,
        gibbs_updates=[RankDependentUpdate()],
        data_parallel=distributed,
    )
    return _chains(run_chains(kernel, y, num_chains=1, num_samples=2))


def mismatched_ranks(distributed: bool) -> dict[str, torch.Tensor]:
    """Data parallel with another seed on rank 1: refused at set-up."""
    model, data = mlp_data()
    seed = 7 + int(os.environ.get("RANK", "0"))
    return _chains(
        run_chains(sghmc(model, distributed, seed=seed), *data, num_chains=1, num_samples=2)
    )


SCENARIOS = {
    f.__name__: f
    for f in (
        data_mlp,
        data_trace,
        data_control_variate,
        data_mcmc,
        chains_mlp,
        chains_rounds,
        chains_too_hot,
        chains_lengthened,
        chains_started_again,
        diverging_ranks,
        mismatched_ranks,
        crash_data,
        crash_chains,
    )
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(out: Path, scenarios: list[str], ranks: int = 2, timeout: float = 120.0) -> list:
    """Run ``scenarios`` on ``ranks`` processes of one gloo group; return their exit codes."""
    port = _free_port()
    root = Path(__file__).resolve().parents[1]
    processes = []
    for rank in range(ranks):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(ranks),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        }
        command = [sys.executable, str(Path(__file__).resolve()), str(out), *scenarios]
        processes.append(subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True))
    codes = []
    for process in processes:
        try:
            _, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
        (out / f"stderr.rank{len(codes)}.txt").write_text(stderr or "")
        codes.append(process.returncode)
    return codes


def main(out: str, *names: str) -> int:
    from pyro_sgmcmc import init_distributed

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    init_distributed("gloo", timeout=60.0)
    rank = int(os.environ["RANK"])
    status = 0
    for name in names:
        scenario, _, stage = name.partition(":")
        options = {"out": out, "resume": stage == "resume"} if scenario.startswith("crash") else {}
        try:
            result = SCENARIOS[scenario](True, **options)
        except Exception as error:  # reported to the test, which checks the message
            Path(out, f"{name}.rank{rank}.error").write_text(f"{type(error).__name__}: {error}")
            traceback.print_exc()
            status = 1
            continue
        torch.save(result, Path(out, f"{name}.rank{rank}.pt"))
    # every rank reaches the end before any tears the group down: gloo can abort (SIGABRT) a
    # rank whose peer closes its connections first (the suspected cause of one CI failure)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
