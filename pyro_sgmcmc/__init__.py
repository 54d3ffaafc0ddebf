"""pyro_sgmcmc: stochastic-gradient MCMC for Pyro models and Bayesian neural networks.

The kernels :class:`SGLD`, :class:`SGHMC`, :class:`PSGLD` and :class:`ConstantSGD` run inside
``pyro.infer.MCMC`` and draw minibatches of the data plate on every step;
:func:`run_chains` runs many chains of the same kernel at once. Results export to ArviZ with
:func:`to_inference_data` (arrays of draws with :func:`from_draws`).

The names below are what a user needs; the rest lives in the submodules (:mod:`.nn`,
:mod:`.schedules`, :mod:`.conjugate`, :mod:`.export`, :mod:`.diagnostics`, :mod:`.datasets`,
:mod:`.compare`, ...). Modules that pull in ArviZ, matplotlib or scikit-learn are imported on
first use, so ``import pyro_sgmcmc`` stays light and never touches the plotting backend.
"""

from __future__ import annotations

import importlib
from typing import Any

from .checkpoint import ResumableMCMC, load_checkpoint
from .errors import (
    CheckpointError,
    DistributedRunError,
    ModelContractError,
    SamplerDivergedError,
)
from .initialization import find_map, init_to_prior
from .kernels import PSGLD, SGHMC, SGLD, ConstantSGD, StochasticGradientKernel
from .nn import BayesianMLP, GammaPrecision, NormalPrior, ScaleMixturePrior
from .vectorized import VectorizedResult, run_chains

__version__ = "0.2.0"

#: Public names loaded on first use, and the module each comes from.
_LAZY = {
    "to_inference_data": ".export",
    "from_draws": ".export",
    "HMCStatsCollector": ".export",
    "convergence_report": ".diagnostics",
    "posterior_predictive": ".predictive",
    "fit_svi": ".svi",
    "SVIResult": ".svi",
    "load_dataset": ".datasets",
    "run_comparison": ".compare",
    "init_distributed": ".engine.distributed",
}

_SUBMODULES = (
    "checkpoint", "checkpoint_files", "compare", "conjugate", "datasets", "diagnostics",
    "dynamics", "engine", "export", "flipout", "initialization", "kernels", "metrics", "nn",
    "plots", "potentials", "predictive", "pruning", "schedules", "svi", "vectorized",
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
    "to_inference_data",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
