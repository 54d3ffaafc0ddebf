r"""SG-MCMC over several processes with ``torch.distributed``: PyTorch's process group, nothing
home-made.

:math:`R` processes (*ranks*), started by ``torchrun --nproc-per-node=R script.py`` and joined
into PyTorch's process group by :func:`init_distributed` (gloo on CPU, NCCL on CUDA), share the
work in one of two ways.

**Data parallel** -- one chain, many workers (``SGHMC(model, ..., data_parallel=True)``; any
kernel, any model the kernels accept, in ``pyro.infer.MCMC`` and in
:func:`~pyro_sgmcmc.run_chains`). Every rank runs the same chains: it holds the full data and the
chains' generators, seeded alike on every rank (:mod:`~pyro_sgmcmc.engine.seeds`), so every rank
draws the same minibatch rows, the same injected noise and the same Gibbs draws.
:class:`DataParallelGradient` cuts each chain's minibatch :math:`S` (:math:`|S| = B`) into
:math:`R` contiguous shares :math:`S_r` of :math:`B_r` rows; rank :math:`r` evaluates the wrapped
estimator on its share, which gives :math:`\tilde U_{S_r} = -\log p(\theta) - \frac{N}{B_r}
\sum_{i \in S_r} \log p(y_i \mid \theta) - \log|J|` and its gradient, and one all-reduce sums

.. math::

    \sum_r \frac{B_r}{B}\, \tilde U_{S_r} = -\log p(\theta) - \frac{N}{B} \sum_{i \in S}
    \log p(y_i \mid \theta) - \log|J| = \tilde U_S

(the weights sum to one, so prior and Jacobian terms are counted once), and the same for the
gradient: exactly the single-process minibatch potential and gradient, up to the rounding of the
re-associated sums (:math:`\sim 10^{-16}` relative in float64; bit-identical when :math:`R = 1`).
Without minibatches the shares are contiguous blocks of the :math:`N` rows. The control-variate
estimator is wrapped the same way (its centre and full-data gradient are computed on every
rank). Gibbs blocks need full-data statistics: every rank holds the full data and computes them
itself, with the same generator, so they agree without communication.

**Chains across processes** (``run_chains(..., distribute_chains=True)``): each rank runs its
contiguous share of the chains (:func:`chain_share`) with the seeds they have in one process, and
the draws are gathered at the end (:func:`gather_objects`), so the result has every chain and
R-hat and ESS are computed across ranks.

What is communicated
--------------------
Data parallel: per gradient step, one all-reduce (sum) of :math:`C(D + 1 + R)` numbers in the
gradient's dtype: the weighted gradients, the potentials, and one fingerprint of every rank's
state per chain (:func:`state_fingerprint`; it verifies that the ranks still hold the same state,
at the cost of :math:`R` numbers). At set-up, one gather of the run's description (settings, data
fingerprint; a run whose ranks differ is refused) and, without a seed, one of the seed. Chains
across processes: the same two at set-up, one gather of a flag at each of the warm-up's joint
decisions (:func:`any_rank`: whether to lengthen it, whether to start it again), one of every
rank's decisions on a resume, the gathers of a run until converged at each verdict (every
rank's draws, the verdict, the next round's size), and one gather of the draws at the end.

Failures
--------
Every collective runs under the process group's timeout (:func:`init_distributed`). A rank that
exits closes its connections, and the next collective of every other rank fails at once (gloo;
NCCL notices at the timeout) with :class:`~pyro_sgmcmc.errors.DistributedRunError`, which names
the operation; the drivers add where the last checkpoint is. In a data-parallel run rank 0
writes the checkpoints and every rank resumes from them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .._validation import check_positive
from ..errors import CheckpointError, DistributedRunError
from ..inference.checkpoint_files import data_fingerprint
from .seeds import fresh_seed
from .settings import settings_signature

__all__ = [
    "DEFAULT_TIMEOUT",
    "DataParallelGradient",
    "any_rank",
    "chain_share",
    "check_agreement",
    "gather_objects",
    "init_distributed",
    "rank_path",
    "share_bounds",
    "start_data_parallel",
    "state_fingerprint",
    "world",
    "writes_checkpoints",
]

#: Seconds a collective waits for the other ranks before it fails (:func:`init_distributed`).
DEFAULT_TIMEOUT = 600.0
_BACKENDS = ("gloo", "nccl")
_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_LAUNCH_HINT = (
    "launch the script with `torchrun --nproc-per-node=R script.py` and call "
    "pyro_sgmcmc.init_distributed() (or torch.distributed.init_process_group) first"
)
#: Fingerprint moduli: primes below the largest integer each dtype holds exactly.
_MODULI = {torch.float64: 2**31 - 1, torch.float32: 16777213, torch.float16: 2039}

_forked_from_rank = False
_object_groups: dict[int, tuple[Any, Any]] = {}


def _after_fork_in_child() -> None:
    # A forked child (e.g. pyro.infer.MCMC's parallel chains) inherits the parent's process group
    # object but cannot take part in its collectives: remember it, to refuse clearly.
    global _forked_from_rank
    _forked_from_rank = dist.is_available() and dist.is_initialized()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def init_distributed(backend: str | None = None, *, timeout: float = DEFAULT_TIMEOUT):
    """Join the process group that ``torchrun`` describes in the environment.

    Parameters
    ----------
    backend:
        ``"gloo"`` (CPU tensors), ``"nccl"`` (CUDA tensors, one GPU per rank: this rank's is
        ``cuda:LOCAL_RANK``), or ``None``: NCCL when CUDA is available, else gloo.
    timeout:
        Seconds, ``> 0``, that a collective waits for the other ranks before it fails (a rank
        that exits is noticed at once under gloo; NCCL notices at the timeout). In a
        chains-across-processes run the ranks that finish first wait for the others at the final
        gather, so it must exceed the spread of their finishing times.

    Returns
    -------
    torch.device
        Where this rank's model and data go: ``cuda:LOCAL_RANK`` with NCCL, else the CPU.

    Raises
    ------
    ValueError
        For an unknown backend, or NCCL without CUDA.
    RuntimeError
        If the environment variables of ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
        ``MASTER_PORT``) are not set.
    """
    if backend not in (None, *_BACKENDS):
        raise ValueError(f"backend must be one of {[None, *_BACKENDS]}, got {backend!r}")
    timeout = check_positive("timeout", timeout)
    if dist.is_initialized():
        backend = dist.get_backend()
    elif backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend='nccl' needs CUDA; use backend='gloo' on CPU")
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if dist.is_initialized():
        return device
    missing = [name for name in _LAUNCH_VARIABLES if name not in os.environ]
    if missing:
        raise RuntimeError(
            f"init_distributed reads the process group from the environment that torchrun sets, "
            f"but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: "
            f"{_LAUNCH_HINT}"
        )
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    return device


def world() -> tuple[int, int]:
    """``(rank, number of ranks)`` of the default process group; ``(0, 1)`` outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _require_group(option: str) -> tuple[int, int]:
    if _forked_from_rank:
        raise RuntimeError(
            f"{option}: this process was forked from a rank of a torch.distributed run (e.g. by "
            "pyro.infer.MCMC, which runs chains in worker processes when num_chains <= "
            "cpu_count - 1) and cannot take part in its collectives; run the chains in the "
            "rank's own process: MCMC(..., num_chains=1), ResumableMCMC, or run_chains"
        )
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{option} needs torch.distributed's process group: {_LAUNCH_HINT}")
    return world()


def _guarded(what: str, call, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, a collective; its failure becomes a
    :class:`~pyro_sgmcmc.errors.DistributedRunError` that names ``what`` and the rank."""
    try:
        return call(*args, **kwargs)
    except RuntimeError as error:  # gloo's and NCCL's errors (DistBackendError included)
        rank, size = world()
        lines = str(error).strip().splitlines()
        detail = (lines[0] if lines else type(error).__name__)[:300]
        raise DistributedRunError(
            f"rank {rank} of {size}: {what} failed ({detail}). Another rank has exited (its log "
            "says why) or did not answer within the process group's timeout, so every rank stops."
        ) from error


def _object_group():
    """The group for collectives of Python objects: the default group under gloo, a gloo copy of
    it under NCCL (whose collectives take CUDA tensors only), created once."""
    if dist.get_backend() == "gloo":
        return None
    default = dist.group.WORLD
    if id(default) not in _object_groups:
        group = _guarded("creating a gloo group", dist.new_group, backend="gloo")
        _object_groups[id(default)] = (default, group)
    return _object_groups[id(default)][1]


def gather_objects(value: Any, what: str) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order, on every rank.

    ``what`` names the operation in the :class:`~pyro_sgmcmc.errors.DistributedRunError` raised
    when a rank does not take part.
    """
    gathered: list[Any] = [None] * world()[1]
    _guarded(what, dist.all_gather_object, gathered, value, group=_object_group())
    return gathered


def any_rank(flag: bool, what: str) -> bool:
    """Whether ``flag`` holds on some rank (every rank takes part): how the ranks of a run with
    chains across processes decide together what the chains stacked in one process decide
    together (lengthening the warm-up, starting it again), so that they run as one process
    would. ``what`` names the operation in the error raised when a rank does not take part."""
    return any(gather_objects(bool(flag), what))


def check_agreement(run: str, facts: Mapping[str, str]) -> None:
    """Refuse a run whose ranks were started differently.

    Every rank gathers every rank's ``facts`` (e.g. settings, a data fingerprint); where they
    differ, every rank raises the same :class:`~pyro_sgmcmc.errors.DistributedRunError`, naming
    the facts and each rank's value.
    """
    gathered = gather_objects(dict(facts), f"comparing the ranks' {run} set-ups")
    differing = [name for name in gathered[0] if len({part.get(name) for part in gathered}) > 1]
    if differing:
        details = "; ".join(
            f"{name}: " + ", ".join(f"rank {r} {str(part.get(name))[:80]!r}"
                                    for r, part in enumerate(gathered))
            for name in differing[:5]
        )  # fmt: skip
        raise DistributedRunError(
            f"every rank of a {run} must be started with the same kernel settings, data and "
            f"run options, but they differ: {details}"
        )


def agreed_seed(seed: int | None) -> int | None:
    """The base seed of a distributed run: ``seed``, or, for ``None``, rank 0's draw from torch's
    global generator (every rank draws one, so that their global generators stay in step): as
    if ``pyro.set_rng_seed`` had been called alike on every rank."""
    if seed is not None:
        return seed
    return gather_objects(fresh_seed(), "agreeing on the run's seed")[0]


def start_data_parallel(
    settings: Any, options: Any, args: tuple, kwargs: Mapping[str, Any], chains: Sequence[int]
) -> int | None:
    """Set-up of a data-parallel engine: check that every rank runs the same chains with the same
    settings on the same data (:func:`check_agreement`); return the base seed every rank uses."""
    _require_group("data_parallel=True")
    facts = {f"setting {k}": v for k, v in settings_signature(settings, options).items()}
    facts["data"] = data_fingerprint(args, kwargs)
    facts["chains"] = repr(list(chains))
    check_agreement("data-parallel run", facts)
    return agreed_seed(settings.seed)


def share_bounds(count: int, parts: int) -> list[int]:
    """Boundaries of ``count`` items cut into ``parts`` contiguous shares as even as possible
    (the first ``count % parts`` shares have one more item): ``parts + 1`` integers."""
    base, extra = divmod(count, parts)
    bounds = [0]
    for part in range(parts):
        bounds.append(bounds[-1] + base + (1 if part < extra else 0))
    return bounds


def chain_share(num_chains: int) -> range:
    """The chains this rank runs in a chains-across-processes run: a contiguous share of
    ``range(num_chains)``, as even as possible.

    Raises
    ------
    ValueError
        If there are fewer chains than ranks.
    """
    rank, size = _require_group("distribute_chains=True")
    if num_chains < size:
        raise ValueError(
            f"distribute_chains=True gives every rank at least one chain: num_chains must be "
            f">= the number of ranks ({size}), got {num_chains}"
        )
    bounds = share_bounds(num_chains, size)
    return range(bounds[rank], bounds[rank + 1])


def rank_path(path: str | os.PathLike | None) -> Path | None:
    """This rank's file of a chains-across-processes run: ``run.ckpt`` -> ``run.rank1.ckpt``."""
    if path is None:
        return None
    path = Path(path)
    return path.with_name(f"{path.stem}.rank{world()[0]}{path.suffix}")


def writes_checkpoints(settings: Any) -> bool:
    """Whether this rank writes the run's checkpoints: in a data-parallel run every rank holds the
    same state and only rank 0 writes (every rank reads the file to resume); else every rank."""
    return not getattr(settings, "data_parallel", False) or world()[0] == 0


def state_fingerprint(
    flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], modulus: int
) -> torch.Tensor:
    """Per chain, the sum of the bit patterns of the position and the fixed sites, read as
    integers, modulo ``modulus``, shape ``(C,)`` (int64).

    Integer sums are exact, so equal states give equal fingerprints whatever the order of the
    summation (threads, device), and any change of a bit changes the fingerprint unless it is a
    multiple of ``modulus`` away.
    """
    total = _bit_sum(flat)
    for value in fixed.values():
        total = total + _bit_sum(value)
    return torch.remainder(total, modulus)


def _bit_sum(value: torch.Tensor) -> torch.Tensor:
    """Per chain, the sum of the value's bits read as 32-bit (16-bit for half types) integers: at
    most :math:`2^{32}` terms of magnitude :math:`2^{31}`, so the int64 sum is exact."""
    rows = value.detach().contiguous().reshape(value.shape[0], -1)
    if rows.is_floating_point():
        rows = rows.view(torch.int32 if rows.element_size() >= 4 else torch.int16)
    return rows.sum(-1, dtype=torch.int64)


class DataParallelGradient:
    r"""The data-parallel gradient estimator: each rank evaluates its share of every minibatch,
    one all-reduce sums the weighted shares (see the module docstring for why the sum is the
    single-process minibatch potential and gradient).

    Parameters
    ----------
    estimator:
        The estimator on one rank (:class:`~pyro_sgmcmc.engine.estimators.MinibatchGradient` or
        :class:`~pyro_sgmcmc.engine.estimators.ControlVariateGradient`): ``estimator(flat, fixed,
        rows)`` returns the ``(C,)`` potentials and ``(C, D)`` gradients on ``rows``.
    num_data:
        :math:`N`.
    batch_size:
        :math:`B`; ``B >= N`` means the full data, cut into contiguous blocks of rows.

    Raises
    ------
    RuntimeError
        Outside a process group (the message says how to launch one).
    ValueError
        If some rank would get no row: ``B`` (or :math:`N`) smaller than the number of ranks.
    """

    def __init__(self, estimator: Any, num_data: int, batch_size: int) -> None:
        self.rank, self.size = _require_group("data_parallel=True")
        rows = min(batch_size, num_data)
        if rows < self.size:
            raise ValueError(
                f"data_parallel=True splits every minibatch over the {self.size} ranks: "
                f"batch_size (and N) must be >= {self.size}, got {rows} rows per batch"
            )
        bounds = share_bounds(rows, self.size)
        self.start, self.stop = bounds[self.rank], bounds[self.rank + 1]
        self.weight = (self.stop - self.start) / rows
        self.inner = estimator

    @property
    def centre(self) -> torch.Tensor | None:
        """The control-variate centre of the wrapped estimator (``None`` without one)."""
        return getattr(self.inner, "centre", None)

    @property
    def potential(self) -> Any:
        """The wrapped estimator's potential (whose ``value_and_grad`` a network's thinning
        measurement evaluates on fixed rows, on every rank alike)."""
        return self.inner.potential

    def refresh(self, fixed: Mapping[str, torch.Tensor]) -> None:
        """After a Gibbs step: the wrapped estimator's refresh, on every rank alike."""
        self.inner.refresh(fixed)

    def __call__(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(C,)`` minibatch potentials and ``(C, D)`` gradients on ``rows`` (``(C, B)``, or
        ``None`` for the full data), summed over the ranks' shares."""
        if rows is None:
            local = torch.arange(self.start, self.stop, device=flat.device)
            local = local.expand(flat.shape[0], -1)
        else:
            local = rows[:, self.start : self.stop]
        value, grad = self.inner(flat, fixed, local)
        if self.size == 1:
            return value, grad
        modulus = _MODULI.get(grad.dtype, 251)
        return self._all_reduce(value, grad, state_fingerprint(flat, fixed, modulus))

    def _all_reduce(
        self, value: torch.Tensor, grad: torch.Tensor, fingerprint: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One all-reduce of ``[weight * grad, weight * value, fingerprints]``."""
        chains, dim = grad.shape
        buffer = grad.new_empty(chains * (dim + 1 + self.size))
        torch.mul(grad, self.weight, out=buffer[: chains * dim].view(chains, dim))
        torch.mul(value.to(grad.dtype), self.weight, out=buffer[chains * dim : chains * (dim + 1)])
        checks = buffer[chains * (dim + 1) :].view(chains, self.size)
        checks.zero_()
        checks[:, self.rank] = fingerprint.to(grad.dtype)
        _guarded("the data-parallel all-reduce of the gradient", dist.all_reduce, buffer)
        self._check_same_state(checks)
        return buffer[chains * dim : chains * (dim + 1)], buffer[: chains * dim].view(chains, dim)

    def _check_same_state(self, checks: torch.Tensor) -> None:
        """Every rank sees every rank's fingerprints (adding zeros is exact): all raise alike."""
        differs = (checks != checks[:, :1]).any(1)
        if not bool(differs.any()):
            return
        raise DistributedRunError(
            f"the ranks of a data-parallel run hold different states of the chain(s) in slot(s) "
            f"{differs.nonzero().flatten().tolist()} (fingerprints per rank: "
            f"{checks.long().tolist()}): every rank needs the same data, settings and seed, and "
            "must compute alike (same torch build, device type and number of threads)"
        )

    def state_dict(self) -> dict[str, Any]:
        """The wrapped estimator's state and the number of ranks (which sets the split)."""
        return {"inner": self.inner.state_dict(), "world_size": self.size}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`.

        Raises
        ------
        CheckpointError
            If the state was saved by a run with another number of ranks.
        """
        saved = state.get("world_size")
        if saved != self.size:
            raise CheckpointError(
                f"the checkpoint was written by a data-parallel run on {saved} rank(s), this run "
                f"has {self.size}: resume on {saved} rank(s) (the split of every minibatch, hence "
                "the rounding of the gradient, depends on the number of ranks)"
            )
        self.inner.load_state_dict(state["inner"])
