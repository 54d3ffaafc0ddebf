"""Pure update rules of stochastic-gradient MCMC.

Every rule acts on dictionaries of tensors (one entry per latent site, in unconstrained space),
takes the gradient of the minibatch potential at the current position, a step size, a temperature
and a :class:`torch.Generator`, and returns a new immutable state. Nothing here knows about Pyro:
the kernels in :mod:`pyro_sgmcmc.kernels` adapt these rules to :class:`pyro.infer.MCMC`.

=========================  ===================================================================
module                     job
=========================  ===================================================================
:mod:`.sgld`               SGLD (Welling & Teh, 2011)
:mod:`.sghmc`              SGHMC with friction (Chen et al. 2014): Euler's or BAOAB's step
:mod:`.psgld`              pSGLD with an RMSprop diagonal (Li et al., 2016)
:mod:`.sgd`                constant-rate SGD as a sampler (Mandt, Hoffman & Blei, 2017)
:mod:`.metric`             a constant dense preconditioner for the rules
:mod:`.registry`           the rules by name: options, initial state, one step, reset
:mod:`._common`            helpers the rules share: dicts of tensors, noise, step sizes
=========================  ===================================================================
"""

from .psgld import PSGLDConstants, PSGLDState, psgld_constants, psgld_init, psgld_step
from .sgd import (
    SGDState,
    optimal_constant_rates,
    partial_momentum_refresh,
    sgd_init,
    sgd_step,
)
from .sghmc import (
    GradientNoiseEstimate,
    SGHMCConstants,
    SGHMCState,
    sghmc_constants,
    sghmc_init,
    sghmc_step,
    update_gradient_noise_estimate,
)
from .sgld import SGLDConstants, SGLDState, sgld_constants, sgld_init, sgld_step

__all__ = [
    "GradientNoiseEstimate",
    "PSGLDConstants",
    "PSGLDState",
    "SGDState",
    "SGHMCConstants",
    "SGHMCState",
    "SGLDConstants",
    "SGLDState",
    "optimal_constant_rates",
    "partial_momentum_refresh",
    "psgld_constants",
    "psgld_init",
    "psgld_step",
    "sgd_init",
    "sgd_step",
    "sghmc_constants",
    "sghmc_init",
    "sghmc_step",
    "sgld_constants",
    "sgld_init",
    "sgld_step",
    "update_gradient_noise_estimate",
]
