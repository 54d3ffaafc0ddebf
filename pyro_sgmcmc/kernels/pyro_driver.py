"""What a kernel learns about the ``pyro.infer.MCMC`` run that drives it, read off the call stack.

``pyro.infer.MCMC`` tells a kernel neither how many chains it runs nor how: one after the
other in this process (``_UnarySampler``), or each in a worker process of its own
(``_MultiSampler``, whenever ``num_chains <= cpu_count - 1``), after which the main process,
whose kernel ran no chain, calls ``kernel.setup(0, *args)`` only to learn the transforms
(``AbstractMCMC._set_transforms``). A kernel that judges the whole run must know which case it
is in; these functions find Pyro's driver frames by their class and method names and return
``None`` (or ``False``) where they find none -- as under another driver, or if Pyro's internals
change, in which case a kernel behaves as for a run it cannot see whole. The other way round,
:func:`sequential_chains` makes Pyro choose its sequential driver on any machine.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

__all__ = [
    "TransformsRequest",
    "one_thread_per_worker",
    "parallel_worker_chain",
    "sequential_chains",
    "sequential_run_position",
    "transforms_request",
]


def _frames(depth: int = 2):
    frame = sys._getframe(depth)
    while frame is not None:
        yield frame
        frame = frame.f_back


def _owner(frame: Any) -> str:
    """The class name of the ``self`` of a method's frame ('' for a function's)."""
    return type(frame.f_locals.get("self")).__name__


def sequential_run_position() -> tuple[int, int] | None:
    """``(chain index, number of chains)`` when ``pyro.infer.MCMC`` runs its chains one after
    the other in this process (its ``_UnarySampler``: the only place the number of chains is
    known to a kernel), else ``None``."""
    for frame in _frames():
        if _owner(frame) == "_UnarySampler" and frame.f_code.co_name == "run":
            index = frame.f_locals.get("i")
            total = getattr(frame.f_locals["self"], "num_chains", None)
            if isinstance(index, int) and isinstance(total, int):
                return index, total
            return None
    return None


def parallel_worker_chain() -> int | None:
    """The index of the chain this call runs when it runs in a worker process of a parallel
    ``pyro.infer.MCMC`` run (Pyro's ``_Worker``), else ``None``."""
    for frame in _frames():
        if _owner(frame) == "_Worker" and frame.f_code.co_name == "run":
            index = getattr(frame.f_locals["self"], "chain_id", None)
            return index if isinstance(index, int) else None
    return None


@contextlib.contextmanager
def sequential_chains() -> Iterator[None]:
    """Make every ``pyro.infer.MCMC`` constructed in the block run its chains one after the
    other, in this process, on any machine.

    Pyro chooses at construction: with ``num_chains <= cpu_count - 1`` it runs each chain in a
    worker process, and has no option to do otherwise. In a worker, ``hook_fn`` runs in the
    worker, so a hook that collects in this process
    (:class:`~pyro_sgmcmc.analysis.export.HMCStatsCollector`, a list of warm-up draws) collects
    nothing on a machine with a spare core per chain, and timings differ from a machine
    without. In the block Pyro sees one core (it warns that the chains are drawn sequentially):
    ``torch.multiprocessing.cpu_count``, which Pyro asks, returns 1 for the whole process (other
    threads too) until the block ends. ``mcmc.run`` may be called after it.

    Examples
    --------
    >>> with sequential_chains():                                        # doctest: +SKIP
    ...     mcmc = MCMC(NUTS(model), 500, warmup_steps=500, num_chains=4, hook_fn=collector)
    >>> mcmc.run(x, y)                                                   # doctest: +SKIP
    """
    from pyro.infer.mcmc import api

    processes = api.mp
    original = processes.cpu_count
    processes.cpu_count = _one_core
    try:
        yield
    finally:
        processes.cpu_count = original


def _one_core() -> int:
    return 1


def one_thread_per_worker() -> None:
    """Run this worker process's tensor operations on one thread.

    Pyro starts its workers by ``fork`` on Linux (Python < 3.14). The GNU OpenMP runtime of
    PyTorch's wheels is not fork-safe: a parent that ran any operation large enough to be
    parallelised (a few tens of thousands of elements, e.g. building a 12,000 x 3 design matrix)
    leaves a forked child that hangs, without a word, at its first parallel operation -- Pyro's
    own NUTS as well (seen with ``torch`` 2.13). On one thread PyTorch never enters an OpenMP
    region. It is also the right number: Pyro runs one chain per core (``num_chains <=
    cpu_count - 1``), so more threads per worker would only oversubscribe the cores. (PyTorch's
    ``DataLoader`` workers do the same.)"""
    torch.set_num_threads(1)


class TransformsRequest(NamedTuple):
    """``pyro.infer.MCMC`` calls ``setup`` only for the transforms, after its chains ran in
    worker processes; ``draws`` are the run's unconstrained ``(chains, draws, ...)`` values per
    site, where they could be found, and ``reports`` each chain's ``diagnostics()`` sent back
    by its worker (``()`` where they could not)."""

    draws: dict[str, torch.Tensor] | None
    reports: tuple[dict, ...] = ()


def transforms_request() -> TransformsRequest | None:
    """The request when this ``setup`` call comes from ``pyro.infer.MCMC``'s
    ``_set_transforms`` (in its ``run``, where the gathered draws are the local ``z_acc``),
    else ``None``."""
    from pyro.infer.mcmc.api import AbstractMCMC

    for frame in _frames():
        driver = frame.f_locals.get("self")
        if frame.f_code.co_name == "_set_transforms" and isinstance(driver, AbstractMCMC):
            caller = frame.f_back
            draws = None if caller is None else caller.f_locals.get("z_acc")
            if not (isinstance(draws, dict) and all(map(torch.is_tensor, draws.values()))):
                draws = None
            found = getattr(driver, "_diagnostics", None)
            usable = isinstance(found, list) and all(isinstance(d, dict) for d in found)
            return TransformsRequest(draws, tuple(found) if usable else ())
    return None
