"""The settings of a comparison: :class:`CompareConfig`, the checks of its fields, and its data.

Part of :mod:`pyro_sgmcmc.cli.compare` (whose names these are): every other ``compare_*`` module
reads its settings from a :class:`CompareConfig`, and :func:`load_data` loads the data set or
table the settings name. The names of the methods, activations, priors, noises and tasks that
a comparison knows live here too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .._validation import check_interval, check_positive, check_positive_int
from ..data.datasets import Dataset, dataset_task, list_datasets, load_dataset, load_table
from ..dynamics.sgld import DEFAULT_INTEGRATOR, check_integrator
from ..engine.adaptation import MINIMUM_WARMUP_STEPS

#: Inference methods known to :func:`run_comparison`, in their default order.
METHODS = ("nuts", "sghmc", "sgld", "psgld", "svi")
#: The methods that run as stacked SG-MCMC chains, in rounds until converged (``target_ess``).
SGMCMC_METHODS = ("sghmc", "sgld", "psgld")
#: Activations of the hidden layers.
ACTIVATIONS = ("tanh", "relu", "sigmoid", "softplus")
#: Weight priors: i.i.d. Normal, Blundell's scale mixture, Neal's per-layer Gamma precision.
PRIORS = ("normal", "scale_mixture", "gamma_precision")
#: Observation noise of regression models: a Gamma-distributed precision (Gibbs-updated by the
#: SG-MCMC kernels), a half-Normal scale, or a fixed scale.
NOISES = ("auto", "known", "gamma", "halfnormal", "fixed")
#: Tasks of a data file (``None`` infers the task from the target column).
TASKS = ("regression", "classification")


@dataclass(frozen=True)
class CompareConfig:
    """Everything one comparison needs; every field is checked when the object is created.

    Parameters
    ----------
    dataset:
        A name from :func:`pyro_sgmcmc.data.datasets.list_datasets`; ``None`` means ``"sinusoid"``
        unless ``data`` is given (give one or the other).
    data:
        Your own table instead of a built-in set: a ``.csv``/``.tsv``/``.txt``, ``.npz`` or
        ``.parquet`` file read by :func:`pyro_sgmcmc.data.datasets.load_table` (every column but
        ``target`` is a numeric feature).
    target:
        The column of ``data`` to predict (required with ``data``).
    task:
        ``"regression"`` or ``"classification"`` for ``data``; ``None`` infers it from the
        target column. For a built-in set it is filled in from the set (and must agree).
    methods:
        Subset of :data:`METHODS`, run in the given order.
    chains:
        Chains per MCMC method (run one after the other on a machine with 2 cores).
    seed:
        Seed of the data split and of every method (``pyro.set_rng_seed`` before each).
    out:
        Output directory, or ``None`` to write nothing. An empty string is refused.
    overwrite:
        Write into ``out`` even when it holds files that no earlier comparison wrote (they are
        left in place, except files named like this command's outputs, which are replaced).
    hidden:
        Hidden layer widths.
    activation:
        One of :data:`ACTIVATIONS`.
    prior:
        One of :data:`PRIORS`.
    prior_scale:
        Scale of the Normal prior (and of the wide component of the scale mixture).
    noise:
        Observation noise of a regression model, one of :data:`NOISES`.
    noise_scale:
        The scale of ``noise="fixed"`` and of the half-Normal prior, in standardised units.
    num_samples, warmup:
        Kept draws and warm-up draws per chain of the SG-MCMC methods.
    nuts_num_samples, nuts_warmup:
        The same for NUTS (``None``: as the SG-MCMC methods).
    max_tree_depth:
        Bound of NUTS's tree depth (at most :math:`2^d - 1` leapfrog steps per draw).
    nuts_target_accept:
        NUTS's target acceptance probability during step-size adaptation, in ``(0, 1)``.
    nuts_init_steps:
        Adam steps from each NUTS chain's random start towards its nearest mode before warm-up
        (see :func:`nuts_starts`); 0 starts at the random point.
    sgld_learning_rate, sghmc_learning_rate, psgld_learning_rate:
        ``None`` (default): the kernels' adaptive warm-up chooses the step size and a diagonal
        preconditioner (see :mod:`pyro_sgmcmc.engine.adaptation`). A number: a per-datum
        learning rate instead (the step size multiplying the gradient of the full-data potential
        is ``learning_rate / N``).
    friction:
        SGHMC's friction :math:`\\alpha \\in (0, 1]`, or ``None`` (the kernel's default).
    integrator:
        The integrator of the SGLD and pSGLD rows, ``"leimkuhler_matthews"`` (default) or
        ``"euler"`` (see :class:`~pyro_sgmcmc.SGLD`).
    batch_size:
        Minibatch size of the SG-MCMC methods and SVI (capped at ``N``).
    num_steps_per_sample:
        Gradient steps per kept SG-MCMC draw (the thinning), or ``None``: chosen by each
        chain's warm-up from its autocorrelation (see :class:`~pyro_sgmcmc.SGLD`).
    target_ess:
        Run the SG-MCMC methods until converged (:func:`~pyro_sgmcmc.run_chains`'s
        ``target_ess``): after ``num_samples`` draws, keep drawing in rounds until the
        verdict is ``converged`` with this total ESS, or ``max_seconds`` are spent; ``None``
        draws ``num_samples`` only. The default, 200, is what the verdict itself asks of the
        default two chains (100 per chain); with more chains the verdict's 100 per chain
        still holds.
    max_seconds:
        Seconds per SG-MCMC method, counted from its first warm-up step, within which its
        rounds are drawn (``None``: no limit; the warm-up and the first ``num_samples`` draws
        are always made).
    svi_steps, svi_learning_rate:
        Adam steps and learning rate of mean-field SVI; SVI keeps ``chains * num_samples``
        independent draws of its guide.
    time_budget:
        Seconds for the whole comparison, or ``None``. A method that would start after the
        budget is spent is skipped (status ``"skipped"``); a method already running is not
        interrupted, so size the draws to the budget.
    test_fraction, max_train, max_test:
        Passed to :func:`~pyro_sgmcmc.data.datasets.load_dataset`.
    data_dir:
        Directory of the Fashion-MNIST files.
    distributed:
        ``None`` (default), or run the SG-MCMC methods (only) over the ranks of
        ``torch.distributed``'s process group with :func:`~pyro_sgmcmc.run_chains`: ``"data"``
        splits every minibatch over the ranks (``data_parallel=True``), ``"chains"`` shares the
        chains among them (``distribute_chains=True``); see :mod:`pyro_sgmcmc.engine.distributed`.
    threads:
        Torch intra-op threads while the comparison runs (restored afterwards), or ``None`` to
        leave torch's setting. The default 1 suits the small networks compared here: extra
        threads cost more in synchronisation than they gain, on a busy machine by a factor of
        five and more.
    jobs:
        How many methods run at once, each in its own worker process
        (:mod:`pyro_sgmcmc.cli.compare_jobs`); 1 (default) runs them in turn in this process.
        Each method's wall time is measured in its worker, so the times stay comparable while
        every worker has a core of its own. Workers show no progress bars. The command line's
        default is one per usable core (``--jobs``). A script that sets it must guard its top
        level with ``if __name__ == "__main__":`` (workers are started with ``spawn``).
    progress:
        Show progress bars.
    figures:
        Write PNG figures.
    """

    dataset: str | None = None
    data: Path | None = None
    target: str | None = None
    task: str | None = None
    methods: tuple[str, ...] = METHODS
    chains: int = 2
    seed: int = 0
    out: Path | None = Path("results")
    overwrite: bool = False
    hidden: tuple[int, ...] = (10, 10)
    activation: str = "tanh"
    prior: str = "normal"
    prior_scale: float = 1.0
    noise: str = "auto"
    noise_scale: float = 0.5
    num_samples: int = 200
    warmup: int = 200
    nuts_num_samples: int | None = 200
    nuts_warmup: int | None = 100
    max_tree_depth: int = 7
    nuts_target_accept: float = 0.8
    nuts_init_steps: int = 1000
    sgld_learning_rate: float | None = None
    sghmc_learning_rate: float | None = None
    psgld_learning_rate: float | None = None
    friction: float | None = None
    integrator: str = DEFAULT_INTEGRATOR
    batch_size: int = 32
    num_steps_per_sample: int | None = None
    target_ess: float | None = 200.0
    max_seconds: float | None = 60.0
    svi_steps: int = 2000
    svi_learning_rate: float = 0.03
    time_budget: float | None = None
    test_fraction: float = 0.2
    max_train: int | None = None
    max_test: int | None = None
    data_dir: Path | None = None
    threads: int | None = 1
    distributed: str | None = None
    jobs: int = 1
    progress: bool = True
    figures: bool = True

    def __post_init__(self) -> None:
        self._check_data()
        self._check_methods()
        self._check_sampling()
        self._check_model()
        self._check_run()

    def _check_methods(self) -> None:
        """Check ``methods`` (stored as a tuple) and ``distributed``."""
        methods = tuple(self.methods)
        if not methods:
            raise ValueError(f"methods must name at least one of {', '.join(METHODS)}")
        unknown = [m for m in methods if m not in METHODS]
        if unknown:
            raise ValueError(
                f"methods: unknown method(s) {', '.join(map(repr, unknown))}; "
                f"valid ones are {', '.join(METHODS)}"
            )
        if len(set(methods)) != len(methods):
            raise ValueError(f"methods must not repeat a method, got {', '.join(methods)}")
        object.__setattr__(self, "methods", methods)
        if self.distributed not in (None, "data", "chains"):
            raise ValueError(
                f"distributed must be None, 'data' or 'chains'; got {self.distributed!r}"
            )
        if self.distributed is not None and set(methods) - {"sgld", "sghmc", "psgld"}:
            raise ValueError(
                "distributed runs the SG-MCMC methods sgld, sghmc and psgld only; methods has "
                f"{', '.join(m for m in methods if m not in ('sgld', 'sghmc', 'psgld'))}"
            )

    def _check_sampling(self) -> None:
        """Check the counts and settings of the samplers (draws, seed, NUTS, threads)."""
        for name in ("chains", "num_samples", "svi_steps"):
            check_positive_int(name, getattr(self, name))
        if self.num_steps_per_sample is not None:
            check_positive_int("num_steps_per_sample", self.num_steps_per_sample)
        for name in ("target_ess", "max_seconds"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        for name in ("warmup", "nuts_init_steps"):
            check_positive_int(name, getattr(self, name), minimum=0)
        check_positive_int("seed", self.seed, minimum=0)
        check_positive_int("batch_size", self.batch_size)
        check_interval("max_tree_depth", self.max_tree_depth, 1, 15)
        check_positive_int("max_tree_depth", self.max_tree_depth)
        check_interval(
            "nuts_target_accept", self.nuts_target_accept, 0.0, 1.0, low_open=True, high_open=True
        )
        if self.threads is not None:
            check_positive_int("threads", self.threads)
        check_positive_int("jobs", self.jobs)
        if self.jobs > 1 and self.distributed is not None:
            raise ValueError(
                f"jobs must be 1 with distributed={self.distributed!r} (its ranks are the "
                f"processes); got jobs={self.jobs}"
            )
        if self.nuts_num_samples is not None:
            check_positive_int("nuts_num_samples", self.nuts_num_samples)
        if self.nuts_warmup is not None:
            check_positive_int("nuts_warmup", self.nuts_warmup, minimum=0)
        self._check_adaptive_warmup()

    def _check_adaptive_warmup(self) -> None:
        """An SG-MCMC method given no learning rate adapts its step during warm-up, which takes
        at least ``MINIMUM_WARMUP_STEPS`` gradient steps: refuse a shorter warm-up before anything
        runs (with the thinning chosen, any warm-up draw takes enough steps)."""
        adaptive = [
            method for method in self.methods
            if method in SGMCMC_METHODS and getattr(self, f"{method}_learning_rate") is None
        ]  # fmt: skip
        if self.num_steps_per_sample is None:
            steps = MINIMUM_WARMUP_STEPS if self.warmup > 0 else 0
        else:
            steps = self.warmup * self.num_steps_per_sample
        if adaptive and steps < MINIMUM_WARMUP_STEPS:
            given = f"warmup={self.warmup}"
            if self.num_steps_per_sample is not None:
                given += f" x num_steps_per_sample={self.num_steps_per_sample} = {steps} steps"
            raise ValueError(
                f"{given}: the step size of {', '.join(adaptive)} is adapted during warm-up, "
                f"which needs at least {MINIMUM_WARMUP_STEPS} gradient steps; give more warm-up "
                "draws, or a learning rate (--sgld-lr, --sghmc-lr, --psgld-lr)"
            )

    def _check_model(self) -> None:
        """Check the network (``hidden``, stored as a tuple), its prior, noise and step sizes."""
        hidden = tuple(self.hidden)
        for width in hidden:
            check_positive_int("hidden", width)
        object.__setattr__(self, "hidden", hidden)
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {', '.join(ACTIVATIONS)}; got {self.activation!r}"
            )
        if self.prior not in PRIORS:
            raise ValueError(f"prior must be one of {', '.join(PRIORS)}; got {self.prior!r}")
        if self.noise not in NOISES:
            raise ValueError(f"noise must be one of {', '.join(NOISES)}; got {self.noise!r}")
        for name in ("prior_scale", "noise_scale", "svi_learning_rate"):
            check_positive(name, getattr(self, name))
        for name in ("sgld_learning_rate", "sghmc_learning_rate", "psgld_learning_rate"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if self.friction is not None:
            check_interval("friction", self.friction, 0.0, 1.0, low_open=True)
        check_integrator(self.integrator)

    def _check_run(self) -> None:
        """Check the time budget, the data split and the paths (stored as :class:`Path`)."""
        if self.time_budget is not None:
            check_positive("time_budget", self.time_budget)
        check_interval("test_fraction", self.test_fraction, 0.0, 1.0, low_open=True, high_open=True)
        if self.max_train is not None:
            check_positive_int("max_train", self.max_train, minimum=2)
        if self.max_test is not None:
            check_positive_int("max_test", self.max_test)
        if self.out is not None:
            if not isinstance(self.out, str | os.PathLike):
                raise TypeError(f"out must be a path or None, got {type(self.out).__name__}")
            if not os.fspath(self.out).strip():
                raise ValueError(
                    "out must name a directory, got an empty string; use out=None "
                    "(--no-output) to write nothing"
                )
            object.__setattr__(self, "out", Path(self.out))
        if self.data_dir is not None:
            object.__setattr__(self, "data_dir", Path(self.data_dir))

    def _check_data(self) -> None:
        if self.task is not None and self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)} or None; got {self.task!r}")
        if self.data is None:
            if self.target is not None:
                raise ValueError("target names a column of data: give data (--data FILE) too")
            dataset = "sinusoid" if self.dataset is None else self.dataset
            if dataset not in list_datasets():
                raise ValueError(
                    f"dataset must be one of {', '.join(list_datasets())}; got {dataset!r}"
                )
            if self.task is not None and self.task != dataset_task(dataset):
                raise ValueError(
                    f"task: the data set {dataset!r} is a {dataset_task(dataset)} set, got "
                    f"task={self.task!r} (task chooses the task of a data file)"
                )
            object.__setattr__(self, "dataset", dataset)
            object.__setattr__(self, "task", dataset_task(dataset))
            return
        if self.dataset is not None:
            raise ValueError(
                f"give either dataset (--dataset {self.dataset}) or data (--data {self.data}), "
                "not both"
            )
        if not isinstance(self.data, str | os.PathLike) or not os.fspath(self.data).strip():
            raise ValueError(f"data must be the path of a table, got {self.data!r}")
        if not isinstance(self.target, str) or not self.target:
            raise ValueError(
                f"target must name the column of {str(self.data)!r} to predict (--target COLUMN), "
                f"got {self.target!r}"
            )
        object.__setattr__(self, "data", Path(self.data))

    def nuts_draws(self) -> tuple[int, int]:
        """NUTS's (kept draws, warm-up draws) per chain."""
        samples = self.num_samples if self.nuts_num_samples is None else self.nuts_num_samples
        warmup = self.warmup if self.nuts_warmup is None else self.nuts_warmup
        return samples, warmup

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the settings."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = (
                str(value)
                if isinstance(value, Path)
                else list(value)
                if isinstance(value, tuple)
                else value
            )
        return out


def load_data(config: CompareConfig) -> Dataset:
    """The data of ``config``: its built-in set, or its data file read by ``load_table``.

    Raises
    ------
    ValueError, ImportError, FileNotFoundError
        When the data cannot be loaded (the message says why).
    """
    if config.data is not None:
        return load_table(
            config.data,
            config.target,
            task=config.task,
            seed=config.seed,
            test_fraction=config.test_fraction,
            max_train=config.max_train,
            max_test=config.max_test,
        )
    return load_dataset(
        config.dataset,
        seed=config.seed,
        test_fraction=config.test_fraction,
        max_train=config.max_train,
        max_test=config.max_test,
        data_dir=config.data_dir,
    )
