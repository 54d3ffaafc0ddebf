"""SG-MCMC kernels for ``pyro.infer.MCMC``."""

from .base import StochasticGradientKernel
from .constant_sgd import ConstantSGD
from .psgld import PSGLD
from .sghmc import SGHMC
from .sgld import SGLD

__all__ = ["PSGLD", "SGHMC", "SGLD", "ConstantSGD", "StochasticGradientKernel"]
