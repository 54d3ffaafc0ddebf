"""Running the methods of a comparison: in turn in this process, or several at once.

Part of :mod:`pyro_sgmcmc.cli.compare`. Each method is single-threaded by default
(``CompareConfig.threads = 1``: the compared networks are too small for intra-op threads to pay),
so on a machine with two cores a comparison run in turn leaves one core idle. With
``CompareConfig.jobs = J > 1``, :func:`run_methods` runs up to ``J`` methods at once, each in its
own worker process (started with ``spawn``, which works on every platform and never inherits the
torch thread pool of this process), and hands back their outcomes in the order of
``config.methods``. A method's wall time is measured inside its worker, so it is comparable with
a run in turn as long as each worker has a core of its own (:func:`default_jobs` never asks for
more workers than cores).

Each worker runs :func:`~pyro_sgmcmc.cli.compare_method.run_method` with the same seed as a run
in turn, so its draws are the same bit for bit. Workers show no progress bars (several bars would
overwrite each other); their phase lines are passed on when the method ends.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

from ..data.datasets import Dataset
from .compare_config import CompareConfig
from .compare_method import MethodOutcome, run_method, torch_threads
from .compare_results import MethodResult

__all__ = ["default_jobs", "run_methods", "usable_cores"]

Say = Callable[[str], None]


def usable_cores() -> int:
    """The number of CPU cores this process may run on (its affinity where the OS tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def default_jobs(config: CompareConfig) -> int:
    """How many methods of ``config`` to run at once when the user did not say: one per usable
    core (each with ``config.threads`` threads), at most one per method, and 1 for a
    ``torch.distributed`` run (whose ranks are the processes)."""
    if config.distributed is not None:
        return 1
    threads = config.threads or 1
    return max(1, min(len(config.methods), usable_cores() // threads))


def run_methods(
    config: CompareConfig, data: Dataset, deadline: float | None, say: Say
) -> Iterator[MethodOutcome]:
    """The outcome of each method of ``config``, in the order of ``config.methods``.

    A method that would start after ``deadline`` (a :func:`time.perf_counter` value) is skipped:
    its outcome has status ``"skipped"``. With ``config.jobs > 1`` (and more than one method)
    the methods run in worker processes, ``config.jobs`` at a time.
    """
    if config.jobs <= 1 or len(config.methods) <= 1:
        yield from _in_turn(config, data, deadline, say)
        return
    outcomes = dict(_in_workers(config, data, deadline, say))
    for index in range(len(config.methods)):
        yield outcomes[index]


def _skipped(config: CompareConfig, data: Dataset, method: str, say: Say) -> MethodOutcome:
    result = MethodResult(method, status="skipped")
    result.message = f"time budget of {config.time_budget:g} s spent before it started"
    say(f"[{method}] skipped: time budget spent")
    return MethodOutcome(result, data)


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


def _in_turn(
    config: CompareConfig, data: Dataset, deadline: float | None, say: Say
) -> Iterator[MethodOutcome]:
    """Run the methods one after another in this process."""
    for index, method in enumerate(config.methods):
        if _past(deadline):
            yield _skipped(config, data, method, say)
            continue
        say(f"[{method}] running ({index + 1}/{len(config.methods)})")
        yield run_method(config, data, method, log=say)


def _in_workers(
    config: CompareConfig, data: Dataset, deadline: float | None, say: Say
) -> Iterator[tuple[int, MethodOutcome]]:
    """Run the methods ``config.jobs`` at a time in worker processes, yielding ``(position in
    config.methods, outcome)`` as each ends; a method is started (or skipped, past ``deadline``)
    when a worker is free, in the order of ``config.methods``."""
    waiting = list(enumerate(config.methods))
    running: dict[Future, tuple[int, str]] = {}
    quiet = dataclasses.replace(config, progress=False)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=config.jobs, mp_context=context) as pool:
        while waiting or running:
            while waiting and len(running) < config.jobs:
                index, method = waiting.pop(0)
                if _past(deadline):
                    yield index, _skipped(config, data, method, say)
                    continue
                say(
                    f"[{method}] running ({index + 1}/{len(config.methods)}) in a worker "
                    f"process, {config.jobs} at a time"
                )
                running[pool.submit(_work, quiet, data, method)] = (index, method)
            if not running:
                continue
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                index, method = running.pop(future)
                yield index, _collect(future, data, method, say)


def _work(config: CompareConfig, data: Dataset, method: str) -> tuple[MethodOutcome, list[str]]:
    """In a worker: run one method and keep its phase lines for the parent to show."""
    lines: list[str] = []
    with torch_threads(config.threads):
        outcome = run_method(config, data, method, log=lines.append)
    return outcome, lines


def _collect(future: Future, data: Dataset, method: str, say: Say) -> MethodOutcome:
    """The outcome a worker returned; a worker that died (killed, out of memory) is a failure
    of its method, recorded like any other."""
    try:
        outcome, lines = future.result()
    except Exception as error:  # BrokenProcessPool, or an outcome that could not be returned
        result = MethodResult(method, status="failed")
        result.message = f"{type(error).__name__} in its worker process: {error}"[:300]
        say(f"[{method}] failed: {result.message}")
        return MethodOutcome(result, data)
    for line in lines:
        say(line)
    return outcome
