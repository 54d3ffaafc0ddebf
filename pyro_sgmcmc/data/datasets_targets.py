"""Target densities (not data sets) for tests of mixing: the bimodal 2-D Gaussian.

One job: the registered target densities and :func:`load_target`. A target is a density to
sample, with no rows of data; :mod:`pyro_sgmcmc.data.datasets` re-exports these names and refers a
target's name given to ``load_dataset`` here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyro
import pyro.distributions as dist
import torch

__all__ = ["BimodalGaussian", "list_targets", "load_target"]


@dataclass(frozen=True, eq=False)
class BimodalGaussian:
    r"""The bimodal target: an equal mixture of two unit-covariance 2-D Gaussians.

    .. math::

        \pi(x) = \tfrac12 \mathcal N(x; \mu_1, I) + \tfrac12 \mathcal N(x; \mu_2, I), \qquad
        \mu_1 = (2, -2), \ \mu_2 = (-2, 2).

    The modes are about 5.7 standard deviations apart, so a sampler must cross a region of low
    density to visit both: a test of mixing, not of fit. Use :meth:`model` with
    ``pyro.infer.NUTS`` (or any kernel that takes a potential) and :meth:`log_prob` directly.

    Attributes
    ----------
    mode_1, mode_2:
        The component means.
    scale:
        The components' standard deviation.
    site:
        Name of the sample site in :meth:`model`.
    """

    mode_1: tuple[float, float] = (2.0, -2.0)
    mode_2: tuple[float, float] = (-2.0, 2.0)
    scale: float = 1.0
    site: str = "x"

    def distribution(self) -> dist.MixtureSameFamily:
        """The target as a Pyro distribution with event shape ``(2,)``."""
        locs = torch.tensor([self.mode_1, self.mode_2])
        components = dist.Normal(locs, torch.full_like(locs, self.scale)).to_event(1)
        return dist.MixtureSameFamily(dist.Categorical(probs=torch.tensor([0.5, 0.5])), components)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Log-density at ``x`` of shape ``(..., 2)``."""
        return self.distribution().log_prob(x)

    def model(self) -> torch.Tensor:
        """A Pyro model with one latent site (``site``, shape ``(2,)``) following the target."""
        return pyro.sample(self.site, self.distribution())

    @property
    def mean(self) -> torch.Tensor:
        """The exact mean, :math:`(\\mu_1 + \\mu_2)/2`."""
        return (torch.tensor(self.mode_1) + torch.tensor(self.mode_2)) / 2

    @property
    def covariance(self) -> torch.Tensor:
        r"""The exact covariance, :math:`s^2 I + \tfrac14 (\mu_1 - \mu_2)(\mu_1 - \mu_2)^T`."""
        delta = torch.tensor(self.mode_1) - torch.tensor(self.mode_2)
        return self.scale**2 * torch.eye(2) + torch.outer(delta, delta) / 4


_TARGETS: dict[str, Callable[[], Any]] = {"bimodal": BimodalGaussian}


def list_targets() -> list[str]:
    """Names accepted by :func:`load_target`."""
    return list(_TARGETS)


def load_target(name: str) -> BimodalGaussian:
    """A registered target density (``"bimodal"``: :class:`BimodalGaussian`).

    Raises
    ------
    ValueError
        For an unknown name (the message lists the valid ones).
    """
    if name not in _TARGETS:
        raise ValueError(f"unknown target {name!r}; valid names are: {', '.join(_TARGETS)}")
    return _TARGETS[name]()
