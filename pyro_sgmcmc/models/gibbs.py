r"""Gibbs steps inside SG-MCMC kernels: the protocol and helpers.

Some latent sites have exact conditional distributions given the others, such as the Gamma
precision :math:`\lambda` of Gaussian weights :math:`w` (Neal 1996; Chen et al. 2014, section 5):

.. math::

    \lambda \mid w \sim \mathrm{Gamma}\!\left(\alpha + \tfrac{n}{2},\;
                                              \beta + \tfrac{1}{2}\lVert w \rVert^2\right).

A kernel given such *Gibbs updates* removes their sites from the stochastic-gradient dynamics and,
every ``gibbs_every`` steps, replaces their values by a draw from the exact conditional.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar, runtime_checkable

import torch

from ..engine.seeds import seeded

__all__ = ["GibbsUpdate", "with_generator"]

T = TypeVar("T")


@runtime_checkable
class GibbsUpdate(Protocol):
    """One block of sites with an exact conditional.

    Attributes
    ----------
    sites:
        The latent sites this update draws. They are not moved by the SG dynamics.
    """

    sites: tuple[str, ...]

    #: Optional: an update that sets ``supports_temperature = True`` accepts a keyword argument
    #: ``temperature`` in :meth:`sample` and draws from the conditional of the tempered target
    #: :math:`\propto p(\theta \mid y)^{1/T}`; the kernels then pass their temperature.

    def sample(
        self,
        params: Mapping[str, torch.Tensor],
        generator: torch.Generator,
        *args,
        **kwargs,
    ) -> dict[str, torch.Tensor]:
        """Draw new *constrained* values of ``sites`` given every other site in ``params``.

        ``params`` holds constrained values of every latent site; ``*args, **kwargs`` are the
        model's full-data arguments. All randomness must come from ``generator``.
        """
        ...


def with_generator(generator: torch.Generator, draw: Callable[[], T]) -> T:
    """Run ``draw`` with torch's global RNG seeded from ``generator``, then restore the global RNG.

    ``torch.distributions`` samplers such as ``Gamma`` take no generator argument; this keeps
    their draws reproducible from the chain's generator without touching the user's global state.
    """
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
    with seeded(seed, generator.device):
        return draw()
