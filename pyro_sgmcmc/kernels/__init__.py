"""SG-MCMC kernels for ``pyro.infer.MCMC``: each a ``MCMCKernel`` over the chain engine.

=========================  ===================================================================
module                     job
=========================  ===================================================================
:mod:`.base`               :class:`StochasticGradientKernel`: the ``MCMC`` adapter they share
:mod:`.sgld`               :class:`SGLD`
:mod:`.sghmc`              :class:`SGHMC`
:mod:`.psgld`              :class:`PSGLD`
:mod:`.constant_sgd`       :class:`ConstantSGD`
:mod:`.pyro_driver`        what a kernel learns of the ``MCMC`` run driving it; sequential chains
=========================  ===================================================================
"""

from .base import StochasticGradientKernel
from .constant_sgd import ConstantSGD
from .psgld import PSGLD
from .sghmc import SGHMC
from .sgld import SGLD

__all__ = ["PSGLD", "SGHMC", "SGLD", "ConstantSGD", "StochasticGradientKernel"]
