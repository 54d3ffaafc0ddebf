r"""Many SG-MCMC chains in one process: one engine, parameters stacked along a chain axis.

``pyro.infer.MCMC`` runs one process per chain, and only when ``num_chains <= cpu_count - 1``;
on a small machine its chains run one after the other, and a small network spends most of each
step in Python and autograd overhead rather than arithmetic. :func:`run_chains` instead drives
one :class:`~pyro_sgmcmc.engine.ChainEngine` with the :math:`C` chains stacked,
:math:`z \in \mathbb R^{C \times D}`, evaluated in one forward and one backward pass per step.
It takes the *same kernel object* as ``pyro.infer.MCMC`` (``SGHMC(model, ...)``), so every
option of the kernel works here too, and chain :math:`c` is draw for draw the chain that
``MCMC(kernel, num_chains=C)`` runs as its chain :math:`c` (same seed, start, minibatches,
noise and Gibbs draws; tested with ``torch.equal``).

Examples
--------
>>> kernel = SGHMC(model, batch_size=32, seed=0)                       # doctest: +SKIP
>>> result = run_chains(kernel, x, y, num_chains=8, num_samples=200, warmup_steps=100)
... # doctest: +SKIP
>>> result.samples["layers.0.weight"].shape          # (chain, draw, out, in)  # doctest: +SKIP
>>> idata = result.to_inference_data()     # az.rhat(idata), az.ess(idata)  # doctest: +SKIP

References
----------
A. Gelman and D. B. Rubin, "Inference from iterative simulation using multiple sequences",
Statistical Science 7(4), 1992 (over-dispersed starts for R-hat).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
import signal
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyro
import torch
from pyro.infer.mcmc.util import diagnostics as pyro_diagnostics
from pyro.infer.mcmc.util import print_summary

from .._validation import (
    as_tensor_arguments,
    check_model_kwargs,
    check_options_not_model_parameters,
    check_positive_int,
)
from ..analysis.diagnostics import Verdict, temperature_attrs, with_temperatures
from ..analysis.export_checks import checked_test_set
from ..analysis.function_space import HeldOutOutputDraws, OutputDraws, judged_training_rows
from ..engine.build import PreparedChains, prepare_chains
from ..engine.distributed import (
    any_rank,
    gather_objects,
    rank_path,
    world,
    writes_checkpoints,
)
from ..engine.health import warn_all
from ..engine.recorder import DrawRecorder
from ..engine.report import any_too_hot, sampling_report, unconverged_advice
from ..engine.thinning import ThinningMeter
from ..errors import CheckpointError, DistributedRunError, SamplerDivergedError
from ..kernels.base import StochasticGradientKernel
from ..models.model_params import param_values
from .across_ranks import distribute, gathered
from .checkpoint_files import (
    FORMAT_NAME,
    FORMAT_VERSION,
    CheckpointPolicy,
    check_signature,
    data_fingerprint,
    deferred_interrupt,
    load_checkpoint,
    restore_state,
)
from .rounds import _Rounds

__all__ = ["VectorizedResult", "run_chains"]

TensorDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class VectorizedResult:
    r"""Draws and statistics of a :func:`run_chains` run.

    Attributes
    ----------
    samples:
        Constrained draws per latent site, shape ``(chain, draw, *site_shape)`` (empty with the
        kernel's ``keep_draws=False``).
    sample_stats:
        Per-draw statistics, shape ``(chain, draw)``: ``lp`` (minus the minibatch potential in
        unconstrained space at the draw), ``step_size`` (multiplying the full-data gradient),
        ``temperature`` and ``diverging`` (a divergent step in the draw).
    sampling_time:
        Seconds spent in the gradient steps (warm-up included).
    setup_time:
        Seconds spent before the first step: model inspection, initial values, compilation.
    num_gradient_steps:
        Gradient steps per chain.
    chain_seeds:
        The seed of each chain's generator.
    kernel:
        Name of the update rule.
    control_variate_centre:
        With ``control_variate``: the centre :math:`\hat\theta`, constrained values per sampled
        site; else ``None``.
    divergent_steps:
        Per chain, the gradient steps (1-based, warm-up included) that diverged.
    verdict:
        Whether the draws converged (:class:`~pyro_sgmcmc.analysis.diagnostics.Verdict`: every
        parameter, or a network's outputs, within the bounds of
        :mod:`pyro_sgmcmc.analysis.diagnostics`).
    judged_at:
        The numbers of kept draws per chain at which the run was judged: once at the end of a
        fixed-length run, after every round of a run until converged.
    judged_rows, judged_of_rows:
        For a network judged without a test set, the training rows at which its outputs were
        judged, and the rows of the data (``()`` and ``0`` otherwise). The export records them
        (attributes ``judged_rows`` and ``judged_of_rows``), and
        :func:`~pyro_sgmcmc.convergence_report` judges the outputs at those rows.
    target_ess:
        The total bulk and tail ESS the verdict required (``run_chains(..., target_ess=...)``),
        or ``None``; recorded with the export, where
        :func:`~pyro_sgmcmc.analysis.diagnostics.convergence_report` requires it too.
    chain_reports:
        Per chain, what the warm-up chose (:func:`~pyro_sgmcmc.engine.report.sampling_report`:
        thinning, autocorrelation time, control variate, per-site steps, preconditioner).
    model_params:
        The values of the model's own parameters (``pyro.param``, ``PyroParam``) that the run
        held fixed (:mod:`pyro_sgmcmc.models.model_params`); the export evaluates the model
        with them.
    test_set:
        The test set given to ``run_chains`` (positional arguments and keyword arguments), at
        which a network was judged, or ``None``. The export stores the predictions there unless
        it is given another ``test``, so that :func:`~pyro_sgmcmc.convergence_report` of the
        export judges what the run judged.
    plate_name:
        The data plate the run subsampled (the kernel's ``subsample_plate``), the export's too.
    """

    samples: dict[str, torch.Tensor]
    sample_stats: dict[str, np.ndarray]
    sampling_time: float
    setup_time: float
    num_gradient_steps: int
    chain_seeds: tuple[int, ...]
    kernel: str
    control_variate_centre: dict[str, torch.Tensor] | None = None
    divergent_steps: tuple[tuple[int, ...], ...] = ()
    verdict: Verdict | None = None
    judged_at: tuple[int, ...] = ()
    judged_rows: tuple[int, ...] = ()
    judged_of_rows: int = 0
    target_ess: float | None = None
    chain_reports: tuple[dict[str, Any], ...] = field(default=(), repr=False)
    test_set: tuple[tuple, dict[str, Any]] | None = field(default=None, repr=False)
    plate_name: str = field(default="data", repr=False)
    model: Any = field(default=None, repr=False)
    model_params: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    args: tuple = field(default=(), repr=False)
    kwargs: dict = field(default_factory=dict, repr=False)

    @property
    def num_chains(self) -> int:
        return len(self.chain_seeds)

    @property
    def num_draws(self) -> int:
        return int(next(iter(self.sample_stats.values())).shape[1])

    @property
    def total_time(self) -> float:
        """Set-up plus sampling time."""
        return self.setup_time + self.sampling_time

    @property
    def attrs(self) -> dict[str, Any]:
        """Attributes recorded with the exported groups."""
        attrs: dict[str, Any] = {
            "inference_library": "pyro_sgmcmc.run_chains",
            "method": self.kernel,
            "sampling_time": float(self.sampling_time),
            "setup_time": float(self.setup_time),
            "num_gradient_steps": int(self.num_gradient_steps),
        }
        thinning = [r.get("num_steps_per_sample") for r in self.chain_reports]
        if thinning and None not in thinning:
            attrs["num_steps_per_sample"] = [int(k) for k in thinning]
        if self.verdict is not None:
            attrs["verdict"] = str(self.verdict)
        if self.target_ess is not None:
            attrs["target_ess"] = float(self.target_ess)
        if self.judged_rows:
            attrs["judged_rows"] = list(self.judged_rows)
            attrs["judged_of_rows"] = self.judged_of_rows
        attrs.update(temperature_attrs(self.chain_reports))
        return attrs

    def get_samples(self, group_by_chain: bool = False) -> dict[str, torch.Tensor]:
        """Draws as ``pyro.infer.MCMC.get_samples`` returns them."""
        if group_by_chain:
            return dict(self.samples)
        return {k: v.reshape(-1, *v.shape[2:]) for k, v in self.samples.items()}

    def summary(self, prob: float = 0.9) -> None:
        """Print each site's mean, standard deviation, median, ``prob`` interval, ``n_eff`` and
        ``r_hat`` as ``pyro.infer.MCMC.summary`` does (Pyro's ``print_summary``), then the
        divergent steps and the run's verdict (which judges a network by its outputs, not by
        the weights' ``r_hat``)."""
        print_summary(self.samples, prob=prob, group_by_chain=True)
        print(f"Number of divergent steps: {sum(len(steps) for steps in self.divergent_steps)}")
        if self.verdict is not None:
            print(f"Verdict: {self.verdict}")

    def diagnostics(self) -> dict[str, Any]:
        """Per site ``n_eff`` and ``r_hat`` (Pyro's ``diagnostics``), and per chain
        (``"chain 0"``, ...) the entries ``pyro.infer.MCMC.diagnostics()`` has for the same
        kernel under these names: ``divergences`` (the kept draws during which a gradient step
        diverged, the format ``arviz.from_pyro`` reads), ``divergent_steps`` (those gradient
        steps, 1-based, warm-up included) and what the warm-up chose (:attr:`chain_reports`:
        thinning, autocorrelation time, per-site steps, ...). The per-draw statistics
        (``step_size``, ``temperature``, ``potential_energy``) are in :attr:`sample_stats`."""
        found = pyro_diagnostics(self.samples, group_by_chain=True)
        per_chain: dict[str, dict[str, Any]] = {"divergences": {}, "divergent_steps": {}}
        diverging = self.sample_stats.get("diverging")
        for c in range(self.num_chains):
            chain = f"chain {c}"
            kept = [] if diverging is None else np.flatnonzero(diverging[c]).tolist()
            per_chain["divergences"][chain] = kept
            steps = self.divergent_steps[c] if c < len(self.divergent_steps) else ()
            per_chain["divergent_steps"][chain] = list(steps)
            report = self.chain_reports[c] if c < len(self.chain_reports) else {}
            for key, value in report.items():
                per_chain.setdefault(key, {})[chain] = value
        return {**found, **per_chain}

    def to_inference_data(self, *args: Any, **options: Any):
        """The run as an ``arviz.InferenceData`` (ArviZ 0.x) or ``xarray.DataTree`` (ArviZ 1.x),
        through :func:`pyro_sgmcmc.to_inference_data`:
        ``posterior``, ``sample_stats``, ``log_likelihood``, predictive groups and data
        (``*args`` and ``options`` as there; the model, the training data and the test set
        default to the run's)."""
        from ..analysis.export import to_inference_data

        return to_inference_data(self, None, *args, **options)


def _check_run_arguments(kernel: Any, num_chains: int, num_samples: int, warmup_steps: int | None):
    if not isinstance(kernel, StochasticGradientKernel):
        raise TypeError(
            "run_chains takes an SG-MCMC kernel as first argument, e.g. "
            f"run_chains(SGHMC(model, batch_size=32), x, y, num_chains=4); got "
            f"{type(kernel).__name__}"
        )
    num_samples = check_positive_int("num_samples", num_samples)
    if warmup_steps is None:  # as pyro.infer.MCMC
        warmup_steps = num_samples
    return (
        check_positive_int("num_chains", num_chains),
        num_samples,
        check_positive_int("warmup_steps", warmup_steps, minimum=0),
    )


def _warmup_of_resumed_run(
    resume_from: str | os.PathLike | None, warmup_steps: int | None, distribute_chains: bool
) -> tuple[dict[str, Any] | None, int | None]:
    """A resumed run given no ``warmup_steps`` takes its checkpoint's (which may predate the
    default of ``num_samples``): the checkpoint read (``None`` if not read) and the warm-up."""
    if resume_from is None or warmup_steps is not None:
        return None, warmup_steps
    path = rank_path(resume_from) if distribute_chains else resume_from
    checkpoint = load_checkpoint(path, _Saver.required)
    return checkpoint, checkpoint.get("run", {}).get("warmup_steps")


def _stacked_initial(
    initial_params: Mapping[str, torch.Tensor] | None, num_chains: int, local: range
) -> TensorDict | None:
    if initial_params is None:
        return None
    if not isinstance(initial_params, Mapping):
        raise TypeError(
            "initial_params must be a dict from site name to unconstrained values, shape "
            f"(num_chains, ...) or one shared value; got {type(initial_params).__name__}"
        )
    values = {name: torch.as_tensor(value) for name, value in initial_params.items()}
    if len(local) == num_chains:
        return values
    # chains across processes: this rank's rows of the values given per chain
    return {
        name: value[local.start : local.stop]
        if value.dim() > 0 and value.shape[0] == num_chains
        else value
        for name, value in values.items()
    }


#: The options of :func:`run_chains` (its other keyword arguments go to the model).
_RUN_OPTIONS = ("num_chains", "num_samples", "warmup_steps", "initial_params", "callback",
                "checkpoint_path", "checkpoint_every", "checkpoint_seconds", "resume_from",
                "overwrite", "disable_validation", "distribute_chains", "target_ess",
                "max_seconds", "test", "test_kwargs")  # fmt: skip


def run_chains(
    kernel: StochasticGradientKernel,
    *args: Any,
    num_chains: int = 4,
    num_samples: int = 100,
    warmup_steps: int | None = None,
    initial_params: Mapping[str, torch.Tensor] | None = None,
    callback: Callable[[int, Mapping[str, torch.Tensor]], None] | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    checkpoint_seconds: float | None = None,
    resume_from: str | os.PathLike | None = None,
    overwrite: bool = False,
    disable_validation: bool = True,
    distribute_chains: bool = False,
    target_ess: float | None = None,
    max_seconds: float | None = None,
    test: tuple | None = None,
    test_kwargs: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> VectorizedResult:
    r"""Run ``num_chains`` chains of an SG-MCMC kernel at once, batched along a chain axis.

    Each kept draw is ``num_steps_per_sample`` gradient steps of every chain (more while a
    cyclical schedule is in its exploration phase); the first ``warmup_steps`` draws are
    discarded, as in ``pyro.infer.MCMC``. The update rule, its options, the step size (or the
    adaptive warm-up), minibatches, Gibbs blocks, gradient estimator, seeds and divergence
    handling are the kernel's: see :class:`~pyro_sgmcmc.SGLD`, :class:`~pyro_sgmcmc.SGHMC`,
    :class:`~pyro_sgmcmc.PSGLD` and :class:`~pyro_sgmcmc.ConstantSGD`.

    Parameters
    ----------
    kernel:
        An SG-MCMC kernel, e.g. ``SGHMC(model, batch_size=32, seed=0)``. Any model the kernel
        accepts works; models with a batched ``log_joint`` or a closed-form gradient (e.g.
        :class:`~pyro_sgmcmc.nn.BayesianMLP`) evaluate all chains in one pass.
    *args, **kwargs:
        The model's arguments (full data).
    num_chains:
        :math:`C \ge 1`.
    num_samples:
        Kept draws per chain, ``>= 1``.
    warmup_steps:
        Discarded draws per chain, ``>= 0``; by default ``num_samples``, as in
        ``pyro.infer.MCMC`` (until version 0.3.0 it was 0, which a kernel with the adaptive
        warm-up refuses: ``run_chains(SGHMC(model, batch_size=32), x, y)`` failed), or, with
        ``resume_from``, the warm-up of the run the checkpoint continues.
    initial_params:
        Unconstrained starting values per site (as in ``pyro.infer.MCMC``), shape ``(C, ...)``
        or ``(...)`` (shared); overrides the kernel's ``init_strategy`` for the sites given.
    callback:
        ``callback(draw_index, constrained_draw)`` after each kept draw (the index counts the
        kept draws from 0), with values of shape ``(C, ...)``: for anytime evaluation, or to
        stream the draws of a run with the kernel's ``keep_draws=False``.
    checkpoint_path, checkpoint_every, checkpoint_seconds:
        Write a checkpoint of the run (every chain's engine state and the draws kept so far) to
        this file every so many draws (warm-up included) and/or seconds (default: every 60 s
        with a path), at the end, and when the run is interrupted with Ctrl-C (which is held
        back until the current draw is complete); see :mod:`pyro_sgmcmc.inference.checkpoint_files`.
    resume_from:
        Continue the run saved in this checkpoint, bit for bit: the same kernel (class,
        settings, seed), model, data, ``num_chains``, ``num_samples`` and ``warmup_steps`` are
        required (:class:`~pyro_sgmcmc.CheckpointError` otherwise). ``target_ess`` and
        ``max_seconds`` may differ: a finished run resumed with a ``target_ess`` draws on in
        rounds until it has converged, as if it had been given that target from the start.
    overwrite:
        Allow ``checkpoint_path`` to replace a file that is not this run's checkpoint.
    disable_validation:
        Switch Pyro's distribution argument checks off while sampling, as ``pyro.infer.MCMC``
        does by default: a diverging chain then gives non-finite values (a divergence the
        engine handles) instead of an exception from a distribution's constructor.
    distribute_chains:
        Share the chains among the ranks of ``torch.distributed``'s process group (every rank
        calls ``run_chains`` alike; see :func:`~pyro_sgmcmc.init_distributed`): each runs a
        contiguous share with the seeds the chains have in one process, and all get every
        chain's draws, gathered at the end. ``callback`` sees the rank's chains; each rank
        checkpoints to ``checkpoint_path`` with ``.rank<r>`` before its suffix (and resumes
        from ``resume_from`` so renamed). Not with a ``data_parallel`` kernel.
    target_ess:
        Run until converged: after the ``num_samples`` draws, judge the run
        (:mod:`pyro_sgmcmc.analysis.diagnostics`, with this total bulk and tail ESS required besides
        100 per chain) and, while it has not converged, draw more in rounds (each as many
        draws as the verdict's "run about k times longer" asks, at least a tenth more and at
        most a quarter more, :data:`~pyro_sgmcmc.inference.rounds.ROUND_GROWTH`; with
        ``max_seconds``, longer where a verdict would otherwise take more than about a tenth of its
        round's time), until
        it converges or ``max_seconds`` are spent (without ``max_seconds``: until
        :data:`~pyro_sgmcmc.inference.rounds.ROUNDS_LIMIT` times
        ``max(num_samples, target_ess / num_chains)`` draws per chain, so that a run that cannot
        converge ends).
        The draws are those of a fixed-length run of the same total length, bit for bit;
        checkpoints are written after each round and a resumed run goes on with its rounds.
    max_seconds:
        A budget in seconds for the run, counted from its first warm-up step (the time
        ``result.sampling_time`` reports): each round is sized from the kept draws' pace and
        the time its verdict will take (in proportion to the draws) to end within it, and
        none starts once it is spent (the warm-up and the first
        ``num_samples`` draws are always made). Alone, it runs rounds until the default
        bounds are met. A resumed run's budget counts the seconds it sampled before it was
        stopped (so does its ``sampling_time``), and a run whose rounds spent their budget
        resumes as it ended, with no more draws (given a larger ``max_seconds``, it draws on
        within the difference).
    test, test_kwargs:
        Positional (and keyword) model arguments of a test set, e.g. ``(x_test,)``: a network
        is judged on its outputs at every test row -- those ``to_inference_data(result, ...,
        test=...)`` stores, on which :func:`~pyro_sgmcmc.convergence_report` judges it -- instead
        of at up to 64 training rows (:mod:`pyro_sgmcmc.analysis.function_space`); each
        round evaluates its new draws at every test row, so keep a large test set to a few
        hundred rows for judging. Checked before the run starts: a tuple, every dimension but
        the rows as in the training arguments, finite, and evaluated once at the chains'
        starting points (the model must accept it: dtype, device, the likelihood's support).
        A model with a parameter named ``test`` or ``test_kwargs`` is refused with either
        given. Models that are not networks are judged on their parameters either way.

    Returns
    -------
    VectorizedResult

    Raises
    ------
    SamplerDivergedError
        When a chain diverges ``max_consecutive_divergences`` steps in a row; its ``draws`` hold
        every draw kept before, ``(C, draws, ...)`` per site, and ``diverging`` marks those
        with a divergent step.
    """
    checkpoint, warmup_steps = _warmup_of_resumed_run(resume_from, warmup_steps, distribute_chains)
    num_chains, num_samples, warmup_steps = _check_run_arguments(
        kernel, num_chains, num_samples, warmup_steps
    )
    check_model_kwargs("run_chains", _RUN_OPTIONS, kernel.model, kwargs)
    given = {"test": test, "test_kwargs": test_kwargs}
    check_options_not_model_parameters("run_chains", kernel.model, given)
    target_ess, max_seconds = _check_budget(target_ess, max_seconds)
    _check_flags(callback, disable_validation=disable_validation,
                 distribute_chains=distribute_chains)  # fmt: skip
    args, kwargs = as_tensor_arguments(args, kwargs)  # as MCMC.run does (the kernel's setup)
    test_set = checked_test_set(kernel.model, test, test_kwargs, args)
    run = {"num_chains": num_chains, "num_samples": num_samples, "warmup_steps": warmup_steps}
    if target_ess is not None:
        run["target_ess"] = target_ess
    fingerprint = data_fingerprint(args, kwargs, kernel.model)
    settings, local = kernel.settings, range(num_chains)
    if distribute_chains:
        settings, local = distribute(kernel, run, fingerprint)
        checkpoint_path, resume_from = rank_path(checkpoint_path), rank_path(resume_from)
    policy = CheckpointPolicy(checkpoint_path, checkpoint_every, checkpoint_seconds, overwrite)
    policy.writer = writes_checkpoints(settings)
    policy.check_fresh_run(resume_from)
    with pyro.validation_enabled(not disable_validation):
        setup_start = time.perf_counter()
        chains = prepare_chains(
            settings, kernel.rule, kernel.options, kernel.model, args, kwargs,
            chains=local, warmup_draws=warmup_steps,
            initial_params=_stacked_initial(initial_params, num_chains, local),
        )  # fmt: skip
        recorder = DrawRecorder(len(local), kernel.settings.keep_draws)
        saver = _Saver(kernel, chains, recorder, run, fingerprint, policy)
        saver.start(resume_from, checkpoint, across_ranks=distribute_chains)
        outputs = _judged_outputs(chains, test_set)
        setup_time = time.perf_counter() - setup_start
        # a resumed run's budget and sampling time count the seconds it sampled before
        sampling_start = saver.sampling_start = time.perf_counter() - saver.seconds_before
        if max_seconds is not None:  # a warm-up that would go on is held to the budget
            chains.engine.deadline = sampling_start + max_seconds
        _sample(chains, recorder, warmup_steps + num_samples, callback, saver, (args, kwargs))
        if saver.round_target is not None:  # resumed in the middle of a round: finish it
            _sample(chains, recorder, saver.round_target, callback, saver, (args, kwargs))
        rounds = _Rounds(chains, recorder, target_ess, max_seconds, sampling_start,
                         num_samples, num_chains, outputs,
                         shared=saver if distribute_chains else None)  # fmt: skip
        rounds.ended = max_seconds is not None and max_seconds <= (saver.budget_spent or 0.0)
        verdict = _draw_rounds(rounds, chains, recorder, callback, saver, (args, kwargs))
        sampling_time = time.perf_counter() - sampling_start
        warn_all(chains.final_messages(recorder.stacked(), args, kwargs))
    result = _result(kernel, chains, recorder, setup_time, sampling_time, args, kwargs, verdict)
    judged_rows, judged_of_rows = judged_training_rows(outputs, verdict)
    result = dataclasses.replace(
        result, judged_at=tuple(rounds.judged_at), target_ess=target_ess,
        judged_rows=judged_rows, judged_of_rows=judged_of_rows, test_set=test_set,
    )  # fmt: skip
    warning = functools.partial(_warning, rounds, kernel.algorithm, chains.engine.thinning_meter)
    return _finished(result, saver if distribute_chains else None, warning)


def _finished(
    result: VectorizedResult, saver: _Saver | None, warning: Callable[[Verdict], str]
) -> VectorizedResult:
    """``result`` with every rank's chains (``saver`` of a run across processes), its verdict
    ``not converged`` where chains sample too hot, whatever R-hat and ESS say, or too cold
    (:func:`~pyro_sgmcmc.analysis.diagnostics.with_temperatures`); warns with ``warning`` of
    the verdict unless it has converged."""
    if saver is not None:
        result = gathered(result, saver)
    if result.verdict is not None:
        attrs = temperature_attrs(result.chain_reports)
        result = dataclasses.replace(result, verdict=with_temperatures(result.verdict, attrs))
    if result.verdict is not None and not result.verdict.converged:
        warn_all([warning(result.verdict)])
    return result


def _warning(rounds: _Rounds, algorithm: str, meter: ThinningMeter | None, verdict: Verdict) -> str:
    """An unconverged run's warning: the rounds' message and advice (too hot: the verdict's)."""
    return rounds.message(verdict) + unconverged_advice(algorithm, verdict, [meter])


def _draw_rounds(rounds, chains, recorder, callback, saver, data) -> Verdict:
    """Judge the draws; while a run until converged has not converged and its budget allows,
    draw another round (checkpointed at its end) and judge again. Returns the last verdict."""
    verdict = rounds.judge()
    while rounds.wanted and not verdict.converged:
        if rounds.any_rank(any_too_hot(chains.engine), "agreeing whether a chain is too hot"):
            break  # a smaller step, not more draws
        more = rounds.more_draws(verdict)
        if more == 0:
            break
        saver.round_target = chains.engine.draws_done + more
        _sample(chains, recorder, saver.round_target, callback, saver, data)
        saver.policy.write(saver.payload())
        verdict = rounds.judge()
    if rounds.spent and rounds.max_seconds is not None and not rounds.ended:
        # a resumed run with this budget returns the draws as they are
        saver.budget_spent = rounds.max_seconds
        saver.policy.write(saver.payload())
    return verdict


def _check_budget(
    target_ess: float | None, max_seconds: float | None
) -> tuple[float | None, float | None]:
    for name, value in (("target_ess", target_ess), ("max_seconds", max_seconds)):
        if value is not None and not (  # NumPy's numbers too; inf overflowed the round sizes
            isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0
        ):  # fmt: skip
            raise ValueError(f"{name} must be None or a finite number > 0, got {value!r}")
    return (None if target_ess is None else float(target_ess),
            None if max_seconds is None else float(max_seconds))  # fmt: skip


def _check_flags(callback: Any, **flags: Any) -> None:
    """Refuse a ``callback`` that cannot be called and flags that are not ``True`` or ``False``."""
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {callback!r}")
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")


def _judged_outputs(
    chains: PreparedChains, test_set: tuple[tuple, dict[str, Any]] | None
) -> OutputDraws | HeldOutOutputDraws:
    """The outputs a network is judged on: at training rows, or at a test set, which is tried
    at the chains' starting points first (a test set the model fails on is refused before the
    run, not after it)."""
    structure = chains.structure
    if test_set is None:
        return OutputDraws(structure.model, *chains.data, structure.plate)
    outputs = HeldOutOutputDraws(structure.model, chains.data[0], structure.plate.name, *test_set)
    outputs.check(chains.constrain(chains.draw()))
    return outputs


class _Saver:
    """Checkpoints of a :func:`run_chains` run: what they hold, when they are written, and how a
    run is restored from one."""

    required = ("format", "format_version", "kind", "signature", "data_fingerprint", "run",
                "engine", "recorder")  # fmt: skip

    def __init__(self, kernel, chains, recorder, run, fingerprint, policy) -> None:
        self.kernel, self.chains, self.recorder = kernel, chains, recorder
        self.run, self.fingerprint, self.policy = run, fingerprint, policy
        #: The draws (warm-up included) the current round of a run until converged ends at.
        self.round_target: int | None = None
        #: Seconds sampled by the processes before this one (a resumed run), and when this
        #: process's sampling would have started had it run them too (``perf_counter``).
        self.seconds_before = 0.0
        self.sampling_start: float | None = None
        #: The ``max_seconds`` whose budget the run's rounds spent (``None`` while not spent).
        self.budget_spent: float | None = None

    def payload(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "kind": "run_chains",
            "signature": self.chains.signature(self.kernel),
            "data_fingerprint": self.fingerprint,
            "run": dict(self.run),
            "engine": self.chains.engine.state_dict(),
            "recorder": self.recorder.state_dict(),
            "round_target": self.round_target,
            "sampling_seconds": self.sampling_seconds(),
            "budget_spent": self.budget_spent,
            "written_at": time.time(),
        }

    def sampling_seconds(self) -> float:
        """Seconds the run has sampled, the processes before this one included."""
        if self.sampling_start is None:
            return self.seconds_before
        return time.perf_counter() - self.sampling_start

    def after_draw(self, interrupted: int | None) -> None:
        """Write a checkpoint if one is due; on an interrupt (its signal), write one and stop."""
        draws = self.chains.engine.draws_done
        if interrupted:
            self.policy.write(self.payload())
            where = (
                f"a checkpoint is in {str(self.policy.path)!r} (resume_from=...)"
                if self.policy.path is not None
                else "no checkpoint_path was given"
            )
            if interrupted == signal.SIGTERM:
                rank, size = world()
                raise DistributedRunError(
                    f"rank {rank} of {size}: stopped by SIGTERM after {draws} draws per chain "
                    f"(torchrun ends every rank when one fails: that rank's log says why); {where}."
                )
            warnings.warn(f"run_chains interrupted after {draws} draws per chain; {where}.",
                          stacklevel=4)  # fmt: skip
            raise KeyboardInterrupt
        if self.policy.due(draws) or draws == self.run["warmup_steps"] + self.run["num_samples"]:
            self.policy.write(self.payload())

    def failed(self, error: DistributedRunError) -> DistributedRunError:
        """``error`` with where the run can be resumed from."""
        path = self.policy.path
        if path is None:
            where = "No checkpoint_path was given: the run starts over."
        elif self.policy.writer:
            where = (f"This rank's last checkpoint is {str(path)!r}: start the run again on "
                     "every rank with resume_from=... to continue it.")  # fmt: skip
        else:
            where = "Rank 0's last checkpoint continues the run (resume_from=..., every rank)."
        return DistributedRunError(f"{error} {where}")

    def start(
        self, resume_from: str | os.PathLike | None, payload: dict[str, Any] | None,
        across_ranks: bool,
    ) -> None:  # fmt: skip
        """Restore the run saved in ``resume_from``, if given. With chains across processes the
        ranks decide together what the chains of one process decide together
        (:meth:`~pyro_sgmcmc.engine.engine.ChainEngine.catch_up`), and a rank resumed from a
        checkpoint older than the others' takes the decisions they took since. Checkpoints of a
        version that did not record the decisions (before 0.3.1) go on deciding per rank, as
        they did."""
        if resume_from is not None:
            self.restore(resume_from, payload)
        if not across_ranks:
            return
        engine, every_rank = self.chains.engine, None
        if resume_from is not None:
            try:
                every_rank = gather_objects((engine.decisions_known, engine.decisions),
                                            "agreeing on the warm-up's decisions")  # fmt: skip
            except DistributedRunError as error:
                raise self.failed(error) from error
            if not all(known for known, _ in every_rank):
                return
        engine.any_rank = any_rank
        if every_rank is not None:
            engine.catch_up([decisions for _, decisions in every_rank])

    def restore(self, path: str | os.PathLike, payload: dict[str, Any] | None = None) -> None:
        """Continue the run saved in ``path`` (refusing another run's checkpoint); ``payload``:
        its contents, where they were read already."""
        if payload is None:
            payload = load_checkpoint(path, self.required)
        if payload["kind"] != "run_chains":
            raise CheckpointError(f"{str(path)!r} is a checkpoint of {payload['kind']}, not of "
                                  "run_chains")  # fmt: skip
        for name, value in self.run.items():
            # a run may go on to another target_ess (a fixed-length one until converged): the
            # rounds decide where the chains stop, never what they draw
            if name != "target_ess" and payload["run"].get(name) != value:
                raise CheckpointError(
                    f"the checkpoint {str(path)!r} was written by a run with {name}="
                    f"{payload['run'].get(name)}, this one has {name}={value}"
                )
        if payload["data_fingerprint"] != self.fingerprint:
            raise CheckpointError(
                f"the data given to run_chains differ from those of the checkpoint {str(path)!r}"
                " (fingerprint of the tensors' dtypes, shapes and values)"
            )
        check_signature(payload["signature"], self.chains.signature(self.kernel))
        restore_state(self.chains.engine, payload["engine"], "engine", path)
        restore_state(self.recorder, payload["recorder"], "recorder", path)
        self.round_target = payload.get("round_target")
        self.seconds_before = float(payload.get("sampling_seconds", 0.0))
        self.budget_spent = payload.get("budget_spent")


def _sample(
    chains: PreparedChains,
    recorder: DrawRecorder,
    total_draws: int,
    callback: Callable | None,
    saver: _Saver,
    data: tuple[tuple, dict],
) -> None:
    """Draw until ``total_draws`` draws (warm-up included) are done, recording the kept ones."""
    engine = chains.engine
    signals = (signal.SIGINT, signal.SIGTERM) if world()[1] > 1 else (signal.SIGINT,)
    with deferred_interrupt(signals) as interrupt:
        while engine.draws_done < total_draws:
            try:
                _one_draw(chains, recorder, callback)
            except DistributedRunError as error:
                raise saver.failed(error) from error
            except _CallbackInterrupt:
                saver.after_draw(signal.SIGINT)  # the draw is recorded: keep it, and stop
            if engine.draws_done == engine.warmup_draws > 0:
                warn_all(chains.warmup_messages(*data))
            saver.after_draw(interrupt.signal if interrupt.is_set() else None)


def _one_draw(chains: PreparedChains, recorder: DrawRecorder, callback: Callable | None) -> None:
    engine = chains.engine
    try:
        stats = engine.draw()
    except SamplerDivergedError as error:
        draws = recorder.stacked()
        raise error.with_draws(
            draws,
            chains.constrain(draws),
            recorder.stats()["diverging"],
            f" The {recorder.count} draws per chain kept before this are in the "
            "exception's `draws` (`diverging` marks those with a divergent step).",
        ) from None
    if engine.draws_done <= engine.warmup_draws:
        return
    draw = chains.draw()
    recorder.add(draw, stats)
    if callback is not None:
        with torch.no_grad():
            try:
                callback(recorder.count - 1, chains.constrain(draw))
            except KeyboardInterrupt:
                raise _CallbackInterrupt from None


class _CallbackInterrupt(Exception):
    """The callback raised ``KeyboardInterrupt`` after a recorded draw (Ctrl-C itself is
    deferred to the end of the draw): stop as on Ctrl-C, with a checkpoint."""


def _result(
    kernel: StochasticGradientKernel,
    chains: PreparedChains,
    recorder: DrawRecorder,
    setup_time: float,
    sampling_time: float,
    args: tuple,
    kwargs: Mapping[str, Any],
    verdict: Verdict | None = None,
) -> VectorizedResult:
    engine = chains.engine
    with torch.no_grad():
        samples = chains.constrain_kept(recorder.stacked())
        centre = getattr(engine.estimator, "centre", None)
        if centre is not None:
            values = engine.layout.unflatten(centre.unsqueeze(0))
            centre = {name: value[0] for name, value in chains.constrain(values).items()}
    return VectorizedResult(
        samples=samples,
        sample_stats=recorder.stats(),
        sampling_time=sampling_time,
        setup_time=setup_time,
        num_gradient_steps=engine.t,
        chain_seeds=tuple(chains.seeds),
        kernel=kernel.rule.name,
        control_variate_centre=centre,
        divergent_steps=tuple(tuple(steps) for steps in engine.monitor.steps),
        verdict=verdict,
        chain_reports=tuple(sampling_report(engine, c) for c in range(engine.num_chains)),
        model=kernel.model,
        model_params=param_values(chains.structure.trace),
        plate_name=kernel.settings.subsample_plate,
        args=tuple(args),
        kwargs=dict(kwargs),
    )
