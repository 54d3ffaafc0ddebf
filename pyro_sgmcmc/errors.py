"""Exceptions raised by pyro_sgmcmc."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyro
import torch


class ModelContractError(ValueError):
    """The model does not follow the data-plate contract that SG-MCMC kernels rely on.

    See the "model contract" page of the documentation: observations sit inside one
    ``pyro.plate`` (by default named ``"data"``) declared without ``subsample_size``, every latent
    site lies outside it, and all latent sites are continuous.
    """


class SamplerDivergedError(RuntimeError):
    """Raised when a stochastic-gradient chain keeps producing non-finite values.

    Attributes
    ----------
    iteration:
        The (1-based, warm-up included) gradient step at which the kernel gave up.
    sites:
        Names of the sites whose gradient (or value) was not finite at that step.
    draws:
        Every draw kept before the failure, as a dict from site name to a tensor whose first
        dimension indexes the draws, in *unconstrained* space (the same space as
        ``MCMCKernel.sample``). Nothing collected before the divergence is lost.
    constrained_draws:
        The same draws mapped to the constrained space of each site.
    chains:
        The indices of the chains that gave up (``None`` when not known).
    diverging:
        For each kept draw, whether a step of it diverged (the draws so marked were taken after
        the chain was put back to its last good state, never from a diverged state), shape of
        the draws' leading dimensions; ``None`` when not known.
    """

    def __init__(
        self,
        message: str,
        *,
        iteration: int,
        sites: Sequence[str],
        draws: Mapping[str, torch.Tensor],
        constrained_draws: Mapping[str, torch.Tensor],
        chains: Sequence[int] | None = None,
        diverging: Any = None,
    ) -> None:
        super().__init__(message)
        self.iteration = iteration
        self.sites = tuple(sites)
        self.draws = dict(draws)
        self.constrained_draws = dict(constrained_draws)
        self.chains = None if chains is None else tuple(chains)
        self.diverging = diverging

    def with_draws(
        self,
        draws: Mapping[str, torch.Tensor],
        constrained_draws: Mapping[str, torch.Tensor],
        diverging: Any = None,
        note: str = "",
    ) -> SamplerDivergedError:
        """A copy of this error carrying the draws a driver collected before it."""
        return SamplerDivergedError(
            f"{self.args[0]}{note}",
            iteration=self.iteration,
            sites=self.sites,
            draws=draws,
            constrained_draws=constrained_draws,
            chains=self.chains,
            diverging=diverging,
        )


class CheckpointError(ValueError):
    """A checkpoint cannot be used: not a checkpoint, another format version, damaged, or another
    model, kernel, seed, data set or run configuration. The message says which."""


class SVIDivergedError(RuntimeError):
    """An SVI fit produced a non-finite loss or gradient, or left a distribution's support.

    Attributes
    ----------
    fit:
        Index of the fit that diverged (0-based).
    step:
        The optimisation step that diverged, counted from 1.
    losses:
        The loss of every step of that fit up to and including the diverged one (whose value may
        be NaN or infinite; NaN when the step failed before its loss was known).
    completed_losses:
        ``(k, num_steps)`` losses of the ``k`` fits that finished before this one.
    """

    def __init__(
        self,
        message: str,
        *,
        fit: int,
        step: int,
        losses: np.ndarray,
        completed_losses: np.ndarray,
    ) -> None:
        super().__init__(message)
        self.fit = fit
        self.step = step
        self.losses = losses
        self.completed_losses = completed_losses


class ModelMismatchError(ValueError):
    """The model given to the export is not the model whose draws are exported (other latent
    sites, other shapes, or another :class:`~pyro_sgmcmc.nn.BayesianMLP`)."""


class ModelMismatchWarning(UserWarning):
    """The model given to the export differs from the run's model in a way that need not change
    the density (another function or module object with the same latent sites)."""


class SamplerWarning(UserWarning):
    """A run whose draws should not be trusted as they are: a chain that did not move, that ran
    far hotter than its temperature, or a classifier still at chance after warm-up. The message
    gives the numbers and what to change."""


class DistributedRunError(RuntimeError):
    """A run over several processes (``torch.distributed``) cannot go on: a rank exited or did not
    answer within the process group's timeout, or the ranks were started (or compute) differently.
    The message names the rank, the operation and, where the driver knows it, the checkpoint to
    resume from."""


#: Frames in these packages are not the user's.
_LIBRARY_DIRS = tuple(
    str(directory) + os.sep
    for directory in (Path(__file__).parent, *(Path(m.__file__).parent for m in (pyro, torch)))
)


def user_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning to the user's line: that of the first frame
    outside this package, Pyro and PyTorch, as seen from the function that calls
    :func:`warnings.warn` (the caller of this function, stack level 1)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
        frame, level = frame.f_back, level + 1
    return level
