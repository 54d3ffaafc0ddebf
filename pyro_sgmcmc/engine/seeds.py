"""Seeds of the chains' random-number generators, derived in one place.

Chain ``c`` of a run seeded with ``seed`` uses the generator seeded with
``SeedSequence(seed, spawn_key=(c,))``: the same chain gets the same seed whether it runs alone in
a ``pyro.infer.MCMC`` kernel, among others in :func:`~pyro_sgmcmc.run_chains`, or on another
process of a distributed run; distinct chains get statistically independent streams (NumPy's
``SeedSequence`` hashes the key). Without a seed, a base seed is drawn from torch's global
generator, so ``pyro.set_rng_seed`` makes the run reproducible.

The set-up's own runs of the model (inspection, start values) draw under :func:`seeded`, which
leaves the caller's generators as they were.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

__all__ = ["MAX_SEED", "chain_generators", "chain_seeds", "fresh_seed", "seeded"]

#: Seeds lie in ``[0, MAX_SEED)`` (what ``torch.Generator.manual_seed`` accepts comfortably).
MAX_SEED = 2**62


def fresh_seed() -> int:
    """A base seed drawn from torch's global generator."""
    return int(torch.randint(0, MAX_SEED, (1,)).item())


def chain_seeds(seed: int | None, chains: Sequence[int]) -> list[int]:
    """The generator seeds of the chains with indices ``chains`` in a run seeded with ``seed``.

    ``seed=None`` draws a base seed with :func:`fresh_seed` first.
    """
    base = fresh_seed() if seed is None else seed
    return [
        int(np.random.SeedSequence(base, spawn_key=(int(c),)).generate_state(1, np.uint64)[0])
        % MAX_SEED
        for c in chains
    ]


def chain_generators(seeds: Sequence[int], device: torch.device | str = "cpu") -> list:
    """One ``torch.Generator`` per seed, on ``device``."""
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]


@contextmanager
def seeded(seed: int, device: torch.device | None = None) -> Iterator[None]:
    """Inside the block torch's CPU generator, and that of ``device`` where it is a CUDA
    device, are seeded with ``seed``; after it both are as they were. No other generator is
    touched: ``torch.manual_seed`` would also reseed every CUDA device (lazily, at CUDA's
    first use, where CUDA has not started yet) and leave them so."""
    cuda = device is not None and device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []):
        torch.default_generator.manual_seed(int(seed))
        if cuda:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(int(seed))
        yield
