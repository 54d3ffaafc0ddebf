"""pyro_sgmcmc: stochastic-gradient MCMC for Pyro models and Bayesian neural networks.

The kernels :class:`SGLD`, :class:`SGHMC` and :class:`PSGLD` run inside ``pyro.infer.MCMC`` and
draw minibatches of the data plate on every step.
"""

from . import (
    checkpoint,
    conjugate,
    datasets,
    diagnostics,
    dynamics,
    export,
    flipout,
    initialization,
    metrics,
    nn,
    predictive,
    pruning,
    schedules,
    svi,
    vectorized,
)
from .checkpoint import CheckpointError, ResumableMCMC, load_checkpoint
from .compare import CompareConfig, run_comparison
from .conjugate import (
    NormalGammaPrecisionUpdate,
    NormalNoisePrecisionUpdate,
    find_normal_gamma_updates,
)
from .datasets import Dataset, list_datasets, load_dataset, load_target
from .diagnostics import ConvergenceReport, convergence_report, format_reports
from .errors import ModelContractError, SamplerDivergedError
from .export import HMCStatsCollector, to_datatree, to_inference_data
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
from .pruning import prune_by_snr, snr_pruning_table
from .svi import SVIResult, fit_svi
from .vectorized import VectorizedResult, run_chains

__version__ = "0.1.0"

__all__ = [
    "PSGLD",
    "SGHMC",
    "SGLD",
    "BayesianMLP",
    "CategoricalLikelihood",
    "CheckpointError",
    "CompareConfig",
    "ConstantSGD",
    "ConvergenceReport",
    "Dataset",
    "GammaPrecision",
    "GibbsUpdate",
    "HMCStatsCollector",
    "HeteroscedasticNormalLikelihood",
    "ModelContractError",
    "NormalGammaPrecisionUpdate",
    "NormalLikelihood",
    "NormalNoisePrecisionUpdate",
    "NormalPrior",
    "ResumableMCMC",
    "SVIResult",
    "SamplerDivergedError",
    "ScaleMixturePrior",
    "StochasticGradientKernel",
    "VectorizedResult",
    "__version__",
    "checkpoint",
    "conjugate",
    "convergence_report",
    "datasets",
    "diagnostics",
    "dynamics",
    "export",
    "find_map",
    "find_normal_gamma_updates",
    "fit_svi",
    "flipout",
    "format_reports",
    "init_to_prior",
    "initialization",
    "list_datasets",
    "load_checkpoint",
    "load_dataset",
    "load_target",
    "metrics",
    "nn",
    "posterior_predictive",
    "predictive",
    "prune_by_snr",
    "pruning",
    "run_chains",
    "run_comparison",
    "schedules",
    "snr_pruning_table",
    "svi",
    "to_datatree",
    "to_inference_data",
    "vectorized",
]
