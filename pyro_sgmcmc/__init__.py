"""pyro_sgmcmc: stochastic-gradient MCMC for Pyro models and Bayesian neural networks.

The kernels :class:`SGLD`, :class:`SGHMC` and :class:`PSGLD` run inside ``pyro.infer.MCMC`` and
draw minibatches of the data plate on every step.
"""

from . import conjugate, dynamics, initialization, metrics, nn, predictive, schedules
from .conjugate import (
    NormalGammaPrecisionUpdate,
    NormalNoisePrecisionUpdate,
    find_normal_gamma_updates,
)
from .errors import ModelContractError, SamplerDivergedError
from .gibbs import GibbsUpdate
from .initialization import find_map, init_to_prior
from .kernels import PSGLD, SGHMC, SGLD, ConstantSGD, StochasticGradientKernel
from .nn import (
    BayesianMLP,
    CategoricalLikelihood,
    GammaPrecision,
    HeteroscedasticNormalLikelihood,
    NormalLikelihood,
    NormalPrior,
    ScaleMixturePrior,
)
from .predictive import posterior_predictive

__version__ = "0.1.0"

__all__ = [
    "PSGLD",
    "SGHMC",
    "SGLD",
    "BayesianMLP",
    "CategoricalLikelihood",
    "ConstantSGD",
    "GammaPrecision",
    "GibbsUpdate",
    "HeteroscedasticNormalLikelihood",
    "ModelContractError",
    "NormalGammaPrecisionUpdate",
    "NormalLikelihood",
    "NormalNoisePrecisionUpdate",
    "NormalPrior",
    "SamplerDivergedError",
    "ScaleMixturePrior",
    "StochasticGradientKernel",
    "__version__",
    "conjugate",
    "dynamics",
    "find_map",
    "find_normal_gamma_updates",
    "init_to_prior",
    "initialization",
    "metrics",
    "nn",
    "posterior_predictive",
    "predictive",
    "schedules",
]
