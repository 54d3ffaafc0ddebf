"""SG-MCMC kernels for ``pyro.infer.MCMC``."""

from .base import StochasticGradientKernel
from .psgld import PSGLD
from .sghmc import SGHMC
from .sgld import SGLD

__all__ = ["PSGLD", "SGHMC", "SGLD", "StochasticGradientKernel"]
