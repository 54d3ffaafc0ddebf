"""Bayesian neural networks as Pyro models: :class:`BayesianMLP`, its priors and heads, LeNet-5.

=========================  ===================================================================
module                     job
=========================  ===================================================================
:mod:`.mlp`                :class:`BayesianMLP`: a ``PyroModule`` MLP with ``PyroSample`` priors
:mod:`.priors`             its weight priors (Normal, scale mixture, Gamma precision)
:mod:`.likelihoods`        its likelihood heads (Normal, heteroscedastic, categorical)
:mod:`.lenet`              :class:`LeNet5`, a Bayesian CNN written the Pyro way
=========================  ===================================================================
"""

from .lenet import LeNet5
from .likelihoods import (
    CategoricalLikelihood,
    HeteroscedasticNormalLikelihood,
    Likelihood,
    NormalLikelihood,
)
from .mlp import ACTIVATIONS, BayesianMLP
from .priors import GammaPrecision, NormalPrior, Prior, ScaleMixtureNormal, ScaleMixturePrior

__all__ = [
    "ACTIVATIONS",
    "BayesianMLP",
    "CategoricalLikelihood",
    "GammaPrecision",
    "HeteroscedasticNormalLikelihood",
    "LeNet5",
    "Likelihood",
    "NormalLikelihood",
    "NormalPrior",
    "Prior",
    "ScaleMixtureNormal",
    "ScaleMixturePrior",
]
