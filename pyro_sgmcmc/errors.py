"""Exceptions raised by pyro_sgmcmc."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
