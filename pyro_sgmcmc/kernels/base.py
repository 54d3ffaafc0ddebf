"""The ``pyro.infer.MCMC`` adapter over the chain engine, shared by every SG-MCMC kernel.

A kernel holds the sampler's settings and its update rule's options; ``setup`` builds a
one-chain :class:`~pyro_sgmcmc.engine.ChainEngine` (:func:`~pyro_sgmcmc.engine.prepare_chains`)
and each ``sample`` call advances it by one draw. Everything else -- minibatches, Gibbs blocks,
divergences, seeds, the step-size control -- lives in the engine, which
:func:`~pyro_sgmcmc.run_chains` drives with many chains: the same chain gives the same draws
under either driver (except where the adaptive warm-up starts again or is lengthened for all
the chains stacked in one engine, while a chain alone decides for itself).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pyro.infer.autoguide.initialization import init_to_uniform
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from torch.distributions.transforms import Transform

from .._validation import as_tensor_arguments, check_positive_int
from ..analysis.diagnostics import temperature_attrs, with_temperatures
from ..analysis.function_space import (
    OutputDraws,
    judged_training_rows,
    run_verdict,
    where_judged,
)
from ..dynamics.registry import get_algorithm
from ..engine.build import PreparedChains, model_transforms, prepare_chains
from ..engine.controls import median_steps
from ..engine.health import warn_all
from ..engine.recorder import DrawRecorder
from ..engine.report import sampling_report, unconverged_advice
from ..engine.settings import SamplerSettings
from ..engine.thinning import ThinningMeter
from ..errors import CheckpointError, SamplerDivergedError
from ..inference.checkpoint_files import check_signature
from ..inference.schedules import StepSchedule
from ..models.gibbs import GibbsUpdate
from ..models.initialization import init_to_fan_in
from ..models.model_params import param_values
from .pyro_driver import (
    TransformsRequest,
    one_thread_per_worker,
    parallel_worker_chain,
    sequential_run_position,
    transforms_request,
)

TensorDict = dict[str, torch.Tensor]
#: The kernels' default start: weight tensors uniform in +-2/sqrt(fan-in), every other site
#: uniform in (-2, 2) in unconstrained space (Pyro's default): over-dispersed and network-scaled.
DEFAULT_INIT = init_to_fan_in(2.0, init_to_uniform)
StepSizeArgument = float | StepSchedule | Callable[[int], float] | None


class StochasticGradientKernel(MCMCKernel):
    r"""Base class of the SG-MCMC kernels; see :class:`~pyro_sgmcmc.SGLD` for the arguments.

    Each call of :meth:`sample` makes ``num_steps_per_sample`` gradient steps (more if the step
    schedule is still in an exploration phase) and returns the position reached: one kept draw.
    ``pyro.infer.MCMC`` discards the first ``warmup_steps`` such draws.
    """

    #: Name of the update rule in :data:`pyro_sgmcmc.dynamics.registry.ALGORITHMS`.
    algorithm: ClassVar[str] = ""

    def __init__(
        self,
        model: Callable[..., Any],
        step_size: StepSizeArgument = None,
        *,
        learning_rate: StepSizeArgument = None,
        batch_size: int | None = None,
        subsample_plate: str = "data",
        num_steps_per_sample: int | None = None,
        temperature: float = 1.0,
        init_strategy: Callable = DEFAULT_INIT,
        seed: int | None = None,
        gibbs_updates: Sequence[GibbsUpdate] | Literal["auto"] | None = "auto",
        gibbs_every: int | None = None,
        potential: Literal["auto", "closed_form", "log_joint", "trace"] = "auto",
        max_consecutive_divergences: int = 100,
        transforms: Mapping[str, Transform] | None = None,
        batch_sampling: Literal["epoch", "independent"] = "epoch",
        keep_draws: bool = True,
        control_variate: bool | Literal["auto"] | Mapping[str, torch.Tensor] = "auto",
        centre_iterations: int = 100,
        chunk_size: int = 65536,
        compile: bool = False,
        data_args: Sequence[int | str] | None = None,
        data_parallel: bool = False,
        options: Any = None,
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be a callable Pyro model, got {type(model).__name__}")
        arguments = dict(locals())
        for name in ("self", "model", "options", "__class__"):
            arguments.pop(name, None)
        self.model = model
        self.settings = SamplerSettings.create(**arguments)
        self.options = get_algorithm(self.algorithm).options() if options is None else options
        self.transforms: dict[str, Transform] | None = None
        #: The values of the model's own parameters (``pyro.param``, ``PyroParam``) held fixed
        #: by the last chain set up (:mod:`pyro_sgmcmc.models.model_params`); the export
        #: evaluates the model with them.
        self.model_params: TensorDict = {}
        self._num_setups = 0
        self._user_initial_params: TensorDict | None = None
        self._finished_chains: list[TensorDict] = []
        # the thinning meters of those chains (None where the thinning was given)
        self._finished_meters: list[ThinningMeter | None] = []
        # and their reports (sampling_report): chains too hot make the verdict not converged
        self._finished_reports: list[dict[str, Any]] = []
        self._run_position: tuple[int, int] | None = None
        self._in_parallel_worker = False
        #: Set by a driver that judges its whole run itself (:class:`~pyro_sgmcmc.ResumableMCMC`,
        #: whose resumed runs hold chains this kernel never ran): :meth:`diagnostics` then
        #: leaves the end-of-run verdict to it (:meth:`judge_draws`).
        self.run_judged_by_driver = False
        #: For a network judged at training rows by the last end-of-run verdict, those rows and
        #: the rows of the data (``((), 0)`` otherwise): its export records them, and
        #: :func:`~pyro_sgmcmc.convergence_report` judges the outputs there, as the warning did.
        self.judged_rows: tuple[tuple[int, ...], int] = ((), 0)
        #: What the last chain run in this process chose, for ``repr`` after the run.
        self._last_choice: dict[str, Any] = {}
        self._reset_chain()

    @property
    def rule(self):
        """The update rule (:class:`~pyro_sgmcmc.dynamics.registry.Algorithm`)."""
        return get_algorithm(self.algorithm)

    # ------------------------------------------------------------------ chain bookkeeping
    def _reset_chain(self) -> None:
        self._chains: PreparedChains | None = None
        self._last_returned: TensorDict | None = None
        self._initial_params: TensorDict | None = None
        self._warmup_steps = 0
        self._num_draws = 0
        self._recorder = DrawRecorder(1, self.settings.keep_draws)
        self.chain_seed: int | None = None
        self._setup_seconds = 0.0
        self._sampling_seconds = 0.0  # the chain's sample() calls: warm-up and kept draws

    def _chain_index(self, worker_chain: int | None, position: tuple[int, int] | None) -> int:
        """The index of the chain being set up: in a worker process of a parallel run, the index
        Pyro gave the worker (``worker_chain``); in a sequential ``pyro.infer.MCMC`` run, the
        chain Pyro is running, ``position[0]`` (so that a kernel object run again gives the
        same draws); elsewhere (:class:`~pyro_sgmcmc.ResumableMCMC`, a loop of one's own) the
        number of ``setup`` calls since the kernel was built or :meth:`start_run`. Either way
        chain ``c`` has the same seed, hence the same draws, as under ``run_chains``."""
        if worker_chain is not None:
            return worker_chain
        return self._num_setups if position is None else position[0]

    def start_run(self) -> None:
        """Number the chains from 0 again: the next :meth:`setup` sets up chain 0 (a driver
        that runs chains one after the other in this process calls it before a new run)."""
        self._num_setups = 0

    # ------------------------------------------------------------------ MCMCKernel API
    @property
    def initial_params(self) -> TensorDict | None:
        """Unconstrained starting values of the current chain (set by :meth:`setup`)."""
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: Mapping[str, torch.Tensor]) -> None:
        if not isinstance(params, Mapping):
            raise TypeError(
                f"initial_params must be a dict from site name to an unconstrained tensor, got "
                f"{type(params).__name__}"
            )
        params = {k: torch.as_tensor(v) for k, v in params.items()}
        for name, value in params.items():
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                raise ValueError(f"initial_params[{name!r}] contains NaN or infinite values")
        self._user_initial_params = params
        self._initial_params = dict(params)

    @property
    def num_data(self) -> int:
        """``N``, the size of the data plate (after :meth:`setup`)."""
        if self._chains is None:
            raise RuntimeError("the kernel has not been set up: call MCMC.run(...) first")
        return self._chains.structure.num_data

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        """Build the chain's engine on the data: seed, initial values, potential, minibatches."""
        request = transforms_request()
        if request is not None:
            self._answer_transforms_request(request, args, kwargs)
            return
        began = time.perf_counter()
        warmup_steps = check_positive_int("warmup_steps", warmup_steps, minimum=0)
        worker_chain = parallel_worker_chain()
        if worker_chain is not None:
            one_thread_per_worker()  # before any tensor operation of the worker
        user = self._user_initial_params
        position = sequential_run_position()
        chain = self._chain_index(worker_chain, position)
        self._reset_chain()
        self._num_setups = chain + 1
        args, kwargs = as_tensor_arguments(args, kwargs)  # as run_chains does: NumPy data work
        self._data = (args, kwargs)
        self._run_position = position
        self._in_parallel_worker = worker_chain is not None
        if self._run_position is None or self._run_position[0] == 0:
            self._finished_chains, self._finished_meters, self._finished_reports = [], [], []
            self._last_choice = {}
        self._chains = prepare_chains(
            self.settings, self.rule, self.options, self.model, args, kwargs,
            chains=[chain], warmup_draws=warmup_steps,
            initial_params=None if user is None else {k: v.unsqueeze(0) for k, v in user.items()},
        )  # fmt: skip
        self.transforms = dict(self._chains.transforms)
        self.model_params = param_values(self._chains.structure.trace)
        self._initial_params = {k: v[0] for k, v in self._chains.initial.items()}
        self.chain_seed = self._chains.seeds[0]
        self._warmup_steps = warmup_steps
        self._setup_seconds = time.perf_counter() - began

    def _answer_transforms_request(
        self, request: TransformsRequest, args: tuple, kwargs: dict[str, Any]
    ) -> None:
        """After running its chains in worker processes, ``pyro.infer.MCMC`` calls ``setup(0,
        ...)`` in the main process, whose kernel ran no chain, only for the transforms (a full
        set-up would refuse a warm-up of 0 draws). Give them, and judge the run's chains
        together, which no worker could: each saw its own chain only."""
        args, kwargs = as_tensor_arguments(args, kwargs)
        structure, transforms = model_transforms(self.settings, self.model, args, kwargs)
        self.transforms = transforms
        self.model_params = param_values(structure.trace)
        self._last_choice = {}  # the chains ran elsewhere: repr shows no choice
        if request.draws is None or self.run_judged_by_driver:
            return
        draws = {
            name: transforms[name].inv(value) if name in transforms else value
            for name, value in request.draws.items()
        }
        self._warn_verdict(draws, structure, (args, kwargs), several=True,
                           reports=request.reports)  # fmt: skip

    def sample(self, params: Mapping[str, torch.Tensor]) -> TensorDict:
        """Advance the chain by one draw and return it (unconstrained values)."""
        if self._chains is None:
            raise RuntimeError("the kernel has not been set up: run it through pyro.infer.MCMC")
        began = time.perf_counter()
        if params is not self._last_returned and params is not self._initial_params:
            self._restart(params)
        try:
            stats = self._chains.engine.draw()
        except SamplerDivergedError as error:
            raise self._with_draws(error) from None
        draws = self._chains.draw()
        if self._num_draws >= self._warmup_steps:
            self._recorder.add(draws, stats)
        self._num_draws += 1
        if self._num_draws == self._warmup_steps and self._warmup_steps > 0:
            warn_all(self._chains.warmup_messages(*self._data))
        self._last_returned = {name: value[0] for name, value in draws.items()}
        self._sampling_seconds += time.perf_counter() - began
        return self._last_returned

    def _restart(self, params: Mapping[str, torch.Tensor]) -> None:
        """Continue from a position Pyro passes that is not the last draw (momenta at rest)."""
        engine = self._chains.engine
        batched = {name: torch.as_tensor(value).unsqueeze(0) for name, value in params.items()}
        fixed = {name: batched[name] for name in engine.fixed}
        engine.start(engine.layout.flatten(batched), fixed)

    def _with_draws(self, error: SamplerDivergedError) -> SamplerDivergedError:
        draws = self.collected_draws()
        diverging = self._recorder.stats()["diverging"][0]
        note = (
            f" The {len(self._recorder.draws)} draws kept before this are in the exception's "
            "`draws` (`diverging` marks those with a divergent step)"
            + ("." if self.settings.keep_draws else " (none: the kernel has keep_draws=False).")
        )
        return error.with_draws(draws, self.constrain_draws(draws), diverging, note)

    # ------------------------------------------------------------------ checkpoints
    @property
    def current_params(self) -> TensorDict | None:
        """The unconstrained position to pass to the next :meth:`sample` call.

        The last draw returned (or loaded by :meth:`load_state_dict`); the initial values before
        the first draw. Passing any other dict restarts the dynamics there (momenta zeroed).
        """
        return self._last_returned if self._last_returned is not None else self._initial_params

    def signature(self) -> dict[str, Any]:
        """What a saved state must share with this kernel to be loaded into it: the kernel class,
        its settings and options (seed included), and the model as the kernel sees it: names,
        shapes and dtypes of the unconstrained latent sites, observed sites, data size ``N``."""
        if self._chains is None:
            raise RuntimeError("the kernel has not been set up: call setup(...) first")
        return self._chains.signature(self)

    def state_dict(self, *, include_draws: bool = True) -> dict[str, Any]:
        """Everything needed to continue the current chain bit for bit (between two
        :meth:`sample` calls): the engine's state (position, momenta, step counter, generator,
        minibatch order, Gibbs values, divergence bookkeeping, adaptation), the draw counters,
        per-draw statistics and, with ``include_draws``, the kept draws. Plain Python values and
        tensors only (``torch.load(..., weights_only=True)`` reads it back)."""
        if self._chains is None:
            raise RuntimeError("the kernel has not been set up: call setup(...) first")
        state = {
            "signature": self.signature(),
            "chain_seed": self.chain_seed,
            "num_setups": self._num_setups,
            "warmup_steps": self._warmup_steps,
            "num_draws": self._num_draws,
            "initial_params": dict(self._initial_params),
            "engine": self._chains.engine.state_dict(),
            "started": self._last_returned is not None,
            "recorder": self._recorder.state_dict(),
            "sampling_seconds": self._sampling_seconds,
        }
        if not include_draws:
            state["recorder"]["draws"] = {}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the chain saved by :meth:`state_dict`; call :meth:`setup` first with the same
        ``warmup_steps`` and data. The next :meth:`sample` call must be given
        :attr:`current_params`.

        Raises
        ------
        CheckpointError
            If the state was saved by another kernel class, with other settings (seed included),
            for a model with other latent sites or data size, or with another ``warmup_steps``.
        """
        if self._chains is None:
            raise RuntimeError(
                "call setup(warmup_steps, *args, **kwargs) with the model's data before "
                "load_state_dict(...)"
            )
        if not isinstance(state, Mapping) or "signature" not in state:
            raise CheckpointError("not a kernel state: it has no 'signature' entry")
        check_signature(state["signature"], self.signature())
        if state.get("warmup_steps") != self._warmup_steps:
            raise CheckpointError(
                f"the saved chain was set up with warmup_steps={state.get('warmup_steps')}, this "
                f"one with warmup_steps={self._warmup_steps}"
            )
        self.chain_seed = state["chain_seed"]
        self._num_setups = state["num_setups"]
        self._num_draws = state["num_draws"]
        self._sampling_seconds = float(state.get("sampling_seconds", 0.0))  # before resuming
        self._initial_params = dict(state["initial_params"])
        engine = self._chains.engine
        engine.load_state_dict(state["engine"])
        self._last_returned = None
        if state["started"]:
            values = engine.current_values()
            self._last_returned = {name: values[name][0] for name in self._chains.latent_sites}
        recorded = dict(state["recorder"])
        if "draws" in state:  # a driver that stores the draws itself hands them back
            recorded["draws"] = _stack_draws(state["draws"])
        self._recorder.load_state_dict(recorded)

    # ------------------------------------------------------------------ results
    def collected_draws(self) -> TensorDict:
        """The post-warm-up draws of the current chain so far, stacked along a first dimension."""
        return {name: value[0] for name, value in self._recorder.stacked().items()}

    def constrain_draws(self, draws: Mapping[str, torch.Tensor]) -> TensorDict:
        """Map unconstrained draws to the constrained space of each site."""
        if self._chains is None:
            return dict(draws)
        return self._chains.constrain(draws)

    def logging(self) -> OrderedDict:
        """Shown on Pyro's progress bar: the median per-coordinate step :math:`h P_i`, the
        minibatch potential, the divergences so far and, once chosen, the thinning."""
        step, potential = math.nan, math.nan
        if self._chains is not None and self._chains.engine.value is not None:
            engine = self._chains.engine
            # the median step of a coordinate, h P_i: what the chain moves by
            step = float(median_steps(engine)[0])
            potential = float(engine.value[0])
        divergent = 0 if self._chains is None else self._chains.engine.monitor.total
        fields = [("step size", f"{step:.2e}"), ("U", f"{potential:.4g}"), ("div", divergent)]
        thinning = None if self._chains is None else self._chains.engine.thinning
        if thinning is not None:
            fields.append(("thin", thinning[0]))
        return OrderedDict(fields)

    def diagnostics(self) -> dict:
        """Per-chain diagnostics; ``pyro.infer.MCMC.diagnostics()`` gathers them over chains.

        ``divergences`` lists the post-warm-up draws during which at least one gradient step
        diverged (the format ``arviz.from_pyro`` reads). ``step_size``, ``temperature`` and
        ``potential_energy`` (the minibatch potential at each draw) have one entry per kept draw.
        """
        stats = {name: value[0] for name, value in self._recorder.stats().items()}
        monitor = None if self._chains is None else self._chains.engine.monitor
        if self._chains is not None and self._recorder.draws:
            self._last_choice = self._choice()  # for repr after the run
            warn_all(self._chains.final_messages(self._recorder.stacked(), *self._data))
            if not self.run_judged_by_driver:
                self._judge_run()
        return {
            "divergences": np.flatnonzero(stats["diverging"]).tolist(),
            "warmup_divergences": 0 if monitor is None else monitor.warmup_steps[0],
            "divergent_steps": [] if monitor is None else list(monitor.steps[0]),
            "num_steps": 0 if self._chains is None else self._chains.engine.t,
            "setup_seconds": self._setup_seconds,
            "sampling_seconds": self._sampling_seconds,
            "in_parallel_worker": bool(getattr(self, "_in_parallel_worker", False)),
            **self._chains_report(),
            "chain_seed": self.chain_seed,
            "step_size": torch.from_numpy(stats["step_size"]),
            "temperature": torch.from_numpy(stats["temperature"]),
            "potential_energy": torch.from_numpy(-stats["lp"]),
        }

    def _judge_run(self) -> None:
        """At the end of the last chain of a ``pyro.infer.MCMC`` run, warn if the run has not
        converged: the chains of a sequential run share this kernel, which keeps each finished
        chain's draws; the chains of a parallel run are judged together in the main process
        (:meth:`_answer_transforms_request`), not in their workers."""
        if self._in_parallel_worker:
            return
        draws = self.constrain_draws(self._recorder.stacked())
        meters, reports = [self._chains.engine.thinning_meter], [self._chains_report()]
        position = self._run_position
        if position is not None:
            self._finished_chains.append(draws)
            self._finished_meters.append(meters[0])
            self._finished_reports.append(reports[0])
            if position[0] != position[1] - 1:
                return
            counts = {next(iter(d.values())).shape[1] for d in self._finished_chains}
            if len(counts) != 1:
                return
            draws = {
                name: torch.cat([d[name] for d in self._finished_chains])
                for name in self._finished_chains[0]
            }
            meters, reports = self._finished_meters, self._finished_reports
            self._finished_chains, self._finished_meters, self._finished_reports = [], [], []
        self._warn_verdict(draws, self._chains.structure, self._chains.data,
                           position is not None, meters, reports)  # fmt: skip

    def judge_draws(
        self,
        draws: Mapping[str, torch.Tensor],
        several: bool = True,
        reports: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Warn with the run's verdict unless it has converged: ``draws`` are the constrained
        ``(C, S, ...)`` draws of every chain of the run (``several=False``: this chain's alone),
        judged as :func:`~pyro_sgmcmc.convergence_report` judges their export (a network on its
        outputs at up to 64 training rows); ``reports``, each chain's ``diagnostics()``, name
        the chains too hot (by default this chain's alone, with ``several=False``). Needs the
        current chain's set-up (data, model)."""
        if reports is None:
            reports = [] if several else [self._chains_report()]
        self._warn_verdict(draws, self._chains.structure, self._chains.data, several,
                           [self._chains.engine.thinning_meter], reports)  # fmt: skip

    def _warn_verdict(
        self,
        draws: Mapping[str, torch.Tensor],
        structure: Any,
        data: tuple[tuple, dict[str, Any]],
        several: bool,
        meters: Sequence[ThinningMeter | None] = (),
        reports: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """:meth:`judge_draws` given the model's structure and full data (and the chains'
        thinning meters, for :func:`~pyro_sgmcmc.engine.report.unconverged_advice`, and reports,
        whose chains too hot make the verdict ``not converged``, as in the export)."""
        outputs = OutputDraws(structure.model, *data, structure.plate)
        verdict = with_temperatures(
            run_verdict(draws, structure.model, outputs), temperature_attrs(reports)
        )
        self.judged_rows = judged_training_rows(outputs, verdict)
        if verdict.converged:
            return
        chains, count = next(iter(draws.values())).shape[:2]
        which = f"{chains} chains" if several else f"one chain (seed {self.chain_seed})"
        text = f"MCMC with {type(self).__name__}: {which} x {count} draws, {verdict}"
        if verdict.statistic == "temperature":  # its remedy is a smaller step, not more draws
            warn_all([text + where_judged(outputs, verdict)])
            return
        if verdict.longer_run_helps:
            text += (" (or use pyro_sgmcmc.run_chains(kernel, ..., target_ess=400), which draws "
                     "until it has)")  # fmt: skip
        warn_all([text + where_judged(outputs, verdict)
                  + unconverged_advice(self.algorithm, verdict, meters)])  # fmt: skip

    def _chains_report(self) -> dict[str, Any]:
        """What the warm-up chose for the current chain (thinning, autocorrelation time)."""
        if self._chains is None:
            return {}
        return sampling_report(self._chains.engine, 0)

    def _choice(self) -> dict[str, Any]:
        """The current chain's report (:meth:`_chains_report`) and its median coordinate step."""
        return {**self._chains_report(), "median_step": float(median_steps(self._chains.engine)[0])}

    def cleanup(self) -> None:
        """Forget the chain's state so that the next chain starts fresh."""
        if self._chains is None and self._user_initial_params is None:
            return
        transforms = self.transforms
        self._user_initial_params = None
        self._reset_chain()
        self.transforms = transforms

    def __repr__(self) -> str:
        """The settings, and what the warm-up chose for the current chain (or, after a run, its
        last chain): the median coordinate step, the preconditioner and the thinning."""
        settings = self.settings
        step = (
            "adaptive" if settings.adaptive else repr(settings.step_size or settings.learning_rate)
        )
        live = self._chains is not None and self._chains.engine.value is not None
        chosen = self._choice() if live else self._last_choice
        if chosen:
            step += (
                f" (median coordinate step {chosen['median_step']:.3g}, "
                f"{chosen['preconditioner']} preconditioner)"
            )
        thinning = settings.num_steps_per_sample
        if thinning is None:
            picked = chosen.get("num_steps_per_sample") if chosen else None
            thinning = "auto" if picked is None else f"auto (chose {picked})"
        return (
            f"{type(self).__name__}(step={step}, batch_size={settings.batch_size}, "
            f"num_steps_per_sample={thinning}, "
            f"temperature={settings.temperature}, {self.options})"
        )


def _stack_draws(draws: Any) -> TensorDict:
    """``(1, n, ...)`` per site from a list of one chain's draws (or an already stacked dict)."""
    if isinstance(draws, Mapping):
        return dict(draws)
    if not draws:
        return {}
    return {name: torch.stack([d[name] for d in draws]).unsqueeze(0) for name in draws[0]}
