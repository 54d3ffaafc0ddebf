"""Kept draws laid out in memory as ``pyro.infer.MCMC`` lays out its own before constraining them.

``MCMC`` stacks each chain's flat draws (every site's unconstrained values, sites in sorted
order) into one ``(chains, draws, D)`` tensor and constrains each site's slice of it: a strided
view. Torch's element-wise kernels take another code path on a strided tensor than on a
contiguous one, and a transform such as ``Uniform(0, 10)``'s sigmoid can then round the same
value one unit in the last place apart. :func:`as_mcmc_lays_them_out` gives the drivers of this
package (:func:`~pyro_sgmcmc.run_chains`, :class:`~pyro_sgmcmc.ResumableMCMC`) the same layout,
so that their constrained draws equal ``MCMC``'s bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.distributions.transforms import Transform

from ..models.potentials import is_identity

__all__ = ["as_mcmc_lays_them_out", "constrained_as_mcmc"]


def constrained_as_mcmc(
    draws: Mapping[str, torch.Tensor], transforms: Mapping[str, Transform]
) -> dict[str, torch.Tensor]:
    """Kept draws ``(chains, draws, *shape)`` constrained (``transforms[name].inv``), contiguous,
    to the bits ``pyro.infer.MCMC`` gives: laid out as it lays them out where a site has a
    transform other than the identity (else as they are, with no copy)."""
    moving = {n: t for n, t in transforms.items() if n in draws and not is_identity(t)}
    if moving:
        draws = as_mcmc_lays_them_out(draws)
    return {
        name: (moving[name].inv(value) if name in moving else value).contiguous()
        for name, value in draws.items()
    }


def as_mcmc_lays_them_out(draws: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``draws`` (site -> ``(chains, draws, *shape)``, unconstrained) as views of one
    ``(chains, draws, D)`` tensor of the sites' flat values in sorted order, the same values in
    the layout ``pyro.infer.MCMC`` constrains them in; ``draws`` as they are where the sites
    differ in dtype (one tensor would promote them)."""
    names = sorted(draws)
    if len({draws[name].dtype for name in names}) != 1:
        return dict(draws)
    leading = tuple(draws[names[0]].shape[:2])
    flat = torch.cat(
        [draws[name].reshape(*leading, draws[name].shape[2:].numel()) for name in names], dim=-1
    )
    laid_out, start = {}, 0
    for name in names:
        shape = draws[name].shape[2:]
        end = start + shape.numel()
        laid_out[name] = flat[..., start:end].reshape(*leading, *shape)
        start = end
    return laid_out
