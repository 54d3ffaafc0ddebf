"""Bayesian neural networks as Pyro models: :class:`BayesianMLP`, its priors and heads."""

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
