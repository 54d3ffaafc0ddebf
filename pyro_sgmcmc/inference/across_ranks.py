r"""``run_chains(..., distribute_chains=True)``: each rank runs its share of the chains, and the
result gathers every rank's.

The ranks are checked to have been started alike (settings, data, run), every rank takes the
seed rank 0 has where none was given, and at the end every rank gathers every rank's draws,
statistics, chain reports and control-variate centres, in the order of the chains' indices
(:mod:`pyro_sgmcmc.engine.distributed` holds the collectives; the warm-up's joint decisions are
the engine's, :meth:`~pyro_sgmcmc.engine.engine.ChainEngine.catch_up`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..engine.distributed import agreed_seed, chain_share, check_agreement, gather_objects
from ..engine.settings import settings_signature
from ..errors import DistributedRunError

__all__ = ["distribute", "gathered"]


def distribute(kernel: Any, run: dict[str, Any], fingerprint: str) -> tuple[Any, range]:
    """Chains across processes: the settings with the seed every rank uses, and this rank's
    chains (added to ``run``, which the checkpoints record), after checking that every rank was
    started alike."""
    if kernel.settings.data_parallel:
        raise ValueError(
            "distribute_chains=True runs different chains on the ranks, but the kernel has "
            "data_parallel=True, which runs the same chains on every rank: choose one"
        )
    local = chain_share(run["num_chains"])
    signature = settings_signature(kernel.settings, kernel.options)
    facts = {f"setting {name}": value for name, value in signature.items()}
    facts.update(data=fingerprint, run=repr(sorted(run.items())))
    check_agreement("chains-across-processes run", facts)
    run["chains"] = list(local)
    return dataclasses.replace(kernel.settings, seed=agreed_seed(kernel.settings.seed)), local


def gathered(result: Any, saver: Any) -> Any:
    """Every rank's chains in one result, in the order of the chains' indices (each rank holds a
    contiguous share, in rank order); times are the slowest rank's."""
    mine = {
        "samples": {name: value.cpu() for name, value in result.samples.items()},
        "sample_stats": result.sample_stats,
        "times": (result.sampling_time, result.setup_time),
        "chain_seeds": result.chain_seeds,
        "divergent_steps": result.divergent_steps,
        "chain_reports": result.chain_reports,
        "centre": _on_cpu(result.control_variate_centre),
    }
    try:
        parts = gather_objects(mine, "gathering the draws of every rank")
    except DistributedRunError as error:
        raise saver.failed(error) from error
    device = next((value.device for value in result.samples.values()), torch.device("cpu"))
    return dataclasses.replace(
        result,
        samples={
            name: torch.cat([part["samples"][name] for part in parts]).to(device)
            for name in result.samples
        },
        sample_stats={
            name: np.concatenate([part["sample_stats"][name] for part in parts])
            for name in result.sample_stats
        },
        sampling_time=max(part["times"][0] for part in parts),
        setup_time=max(part["times"][1] for part in parts),
        chain_seeds=tuple(seed for part in parts for seed in part["chain_seeds"]),
        divergent_steps=tuple(steps for part in parts for steps in part["divergent_steps"]),
        chain_reports=tuple(report for part in parts for report in part["chain_reports"]),
        control_variate_centre=_joined_centres(
            [part["centre"] for part in parts], _per_chain_centres(saver), device
        ),
    )


def _per_chain_centres(saver: Any) -> bool:
    """Whether the control variate has a centre per chain (``control_variate="auto"``: ``(C,
    D)``), or one the chains share (given, or found from the first chain's start: ``(D,)``)."""
    centre = getattr(saver.chains.engine.estimator, "centre", None)
    return centre is not None and centre.dim() == 2


def _on_cpu(values: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    return None if values is None else {name: value.cpu() for name, value in values.items()}


def _joined_centres(
    centres: list, per_chain: bool, device: torch.device
) -> dict[str, torch.Tensor] | None:
    """Every rank's control-variate centres, ``(C, ...)`` per site, where each chain has its own;
    rank 0's where the chains share one (``None`` unless every rank has them)."""
    if any(centre is None for centre in centres):
        return None
    if not per_chain:
        return {name: value.to(device) for name, value in centres[0].items()}
    return {name: torch.cat([c[name] for c in centres]).to(device) for name in centres[0]}
