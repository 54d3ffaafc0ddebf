"""pyro_sgmcmc: stochastic-gradient MCMC for Pyro models and Bayesian neural networks.

The kernels :class:`SGLD`, :class:`SGHMC` and :class:`PSGLD` run inside ``pyro.infer.MCMC`` and
draw minibatches of the data plate on every step.
"""

from . import dynamics, schedules
from .errors import ModelContractError, SamplerDivergedError
from .gibbs import GibbsUpdate
from .kernels import PSGLD, SGHMC, SGLD, StochasticGradientKernel

__version__ = "0.1.0"

__all__ = [
    "PSGLD",
    "SGHMC",
    "SGLD",
    "GibbsUpdate",
    "ModelContractError",
    "SamplerDivergedError",
    "StochasticGradientKernel",
    "__version__",
    "dynamics",
    "schedules",
]
