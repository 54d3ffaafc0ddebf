r"""Gibbs blocks inside the engine: exact conditional draws of some sites, chain by chain.

Each chain draws from its own conditional with its own generator (see
:class:`~pyro_sgmcmc.models.gibbs.GibbsUpdate`), so the draws of chain :math:`c` do not depend on
how many chains run beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..models.gibbs import GibbsUpdate
from ..models.potentials import Potential

__all__ = ["GibbsBlocks", "supports_temperature"]


def supports_temperature(update: GibbsUpdate) -> bool:
    """Whether a Gibbs update accepts the sampler's temperature (``supports_temperature``)."""
    return bool(getattr(update, "supports_temperature", False))


class GibbsBlocks:
    """Apply Gibbs updates to the fixed sites of every chain every ``period`` steps.

    Parameters
    ----------
    updates:
        The Gibbs updates, applied in order.
    potential:
        Maps unconstrained values to constrained ones (and back, with its transforms).
    generators:
        One generator per chain.
    args, kwargs:
        The model's full-data arguments, passed to every update.
    temperature:
        The sampler's temperature, passed to the updates that support it.
    period:
        Steps between two updates.
    """

    def __init__(
        self,
        updates: Sequence[GibbsUpdate],
        potential: Potential,
        generators: Sequence[torch.Generator],
        args: tuple,
        kwargs: Mapping[str, Any],
        temperature: float,
        period: int,
    ) -> None:
        self.updates = list(updates)
        self.potential = potential
        self.generators = list(generators)
        self.args, self.kwargs = args, dict(kwargs)
        self.temperature = temperature
        self.period = period
        self.sites = tuple(dict.fromkeys(site for u in self.updates for site in u.sites))

    def due(self, step: int) -> bool:
        """Whether the blocks are updated after gradient step ``step`` (1-based)."""
        return step % self.period == 0

    def __call__(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """New unconstrained ``(C, ...)`` values of the fixed sites given the positions."""
        potential = self.potential
        constrained, _ = potential.constrain({**potential.layout.unflatten(flat), **fixed})
        per_chain = []
        for c, generator in enumerate(self.generators):
            values = {name: value[c] for name, value in constrained.items()}
            for update in self.updates:
                extra = {"temperature": self.temperature} if supports_temperature(update) else {}
                values.update(update.sample(values, generator, *self.args, **extra, **self.kwargs))
            per_chain.append(values)
        new_fixed = dict(fixed)
        for name in self.sites:
            stacked = torch.stack([values[name] for values in per_chain])
            new_fixed[name] = potential.transforms[name](stacked)
        return new_fixed
