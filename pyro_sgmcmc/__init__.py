"""pyro_sgmcmc: stochastic-gradient MCMC for Pyro models and Bayesian neural networks.

The kernels :class:`SGLD`, :class:`SGHMC`, :class:`PSGLD` and :class:`ConstantSGD` run inside
``pyro.infer.MCMC`` and draw minibatches of the data plate on every step;
:func:`run_chains` runs many chains of the same kernel at once. Results export to ArviZ with
:func:`to_inference_data` (arrays of draws with :func:`from_draws`).

The names below are what a user needs; the rest lives in folders by job:

=========================  ===================================================================
folder                     job
=========================  ===================================================================
:mod:`.kernels`            the SG-MCMC kernels for ``pyro.infer.MCMC``
:mod:`.engine`             the one chain engine behind every sampler, and its warm-up
:mod:`.dynamics`           the pure update rules (SGLD, SGHMC, pSGLD, constant SGD)
:mod:`.inference`          :func:`run_chains`, checkpoints and resume, step-size schedules
:mod:`.models`             a Pyro model as the samplers see it: structure, potential, starts
:mod:`.nn`                 Bayesian networks written the Pyro way (MLP, LeNet-5) and priors
:mod:`.variational`        the SVI baseline (mean-field, Bayes by Backprop) and its estimators
:mod:`.analysis`           export to ArviZ, convergence verdicts, predictive summaries, plots
:mod:`.data`               built-in data sets and your own tables
:mod:`.cli`                the ``pyro-sgmcmc`` command line and its comparison
=========================  ===================================================================

Besides them: :mod:`.errors` (the exceptions and warnings), :mod:`._validation` (argument checks
shared by every entry point) and :mod:`._moved` (the former flat module paths, such as
``pyro_sgmcmc.export``, which keep importing). Modules that pull in ArviZ, matplotlib or
scikit-learn are imported on first use, so ``import pyro_sgmcmc`` stays light and never touches
the plotting backend.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import _moved  # importing it installs the finder of the former module paths
from ._version import __version__
from .errors import (
    CheckpointError,
    DistributedRunError,
    ModelContractError,
    SamplerDivergedError,
)
from .inference.checkpoint import ResumableMCMC, load_checkpoint
from .inference.vectorized import VectorizedResult, run_chains
from .kernels import PSGLD, SGHMC, SGLD, ConstantSGD, StochasticGradientKernel
from .kernels.pyro_driver import sequential_chains
from .models.initialization import find_map, init_to_prior
from .nn import BayesianMLP, GammaPrecision, NormalPrior, ScaleMixturePrior

#: Public names loaded on first use, and the module each comes from.
_LAZY = {
    "to_inference_data": ".analysis.export",
    "from_draws": ".analysis.export",
    "HMCStatsCollector": ".analysis.export",
    "convergence_report": ".analysis.diagnostics",
    "posterior_predictive": ".analysis.predictive",
    "fit_svi": ".variational.svi",
    "SVIResult": ".variational.svi",
    "load_dataset": ".data.datasets",
    "run_comparison": ".cli.compare",
    "init_distributed": ".engine.distributed",
}

#: The folders, loaded on first use as attributes (``pyro_sgmcmc.analysis``).
_SUBMODULES = (
    "analysis", "cli", "data", "dynamics", "engine", "inference", "kernels", "models", "nn",
    "variational",
)  # fmt: skip

__all__ = [
    "PSGLD",
    "SGHMC",
    "SGLD",
    "BayesianMLP",
    "CheckpointError",
    "ConstantSGD",
    "DistributedRunError",
    "GammaPrecision",
    "HMCStatsCollector",
    "ModelContractError",
    "NormalPrior",
    "ResumableMCMC",
    "SVIResult",
    "SamplerDivergedError",
    "ScaleMixturePrior",
    "StochasticGradientKernel",
    "VectorizedResult",
    "__version__",
    "convergence_report",
    "find_map",
    "fit_svi",
    "from_draws",
    "init_distributed",
    "init_to_prior",
    "load_checkpoint",
    "load_dataset",
    "posterior_predictive",
    "run_chains",
    "run_comparison",
    "sequential_chains",
    "to_inference_data",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES or name in _moved.FORMER_PATHS:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES) | set(_moved.FORMER_PATHS))
