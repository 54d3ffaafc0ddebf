"""The adapter shared by every SG-MCMC kernel: Pyro's ``MCMCKernel`` on minibatches.

A subclass supplies the update rule (``_init_state`` and ``_step``, calling a pure function from
:mod:`pyro_sgmcmc.dynamics`) and its own hyper-parameters; everything that touches Pyro lives here:
model inspection and the data-plate contract, initial values and transforms, minibatches, the
potential (trace path or fast path), thinning, warm-up counting, Gibbs steps, divergences,
reproducible per-chain random numbers and diagnostics.
"""

from __future__ import annotations

import math
import multiprocessing
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from pyro.infer.autoguide.initialization import init_to_uniform
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from pyro.infer.mcmc.util import initialize_model
from torch.distributions.transforms import Transform

from .._validation import check_interval, check_positive, check_positive_int
from ..conjugate import find_normal_gamma_updates
from ..errors import SamplerDivergedError
from ..gibbs import GibbsUpdate
from ..model_structure import ModelStructure, check_finite_data, inspect_model
from ..potentials import (
    LogJointPotential,
    Potential,
    SupportsLogJoint,
    TracePotential,
    is_identity,
    potential_and_gradient,
)
from ..schedules import StepSchedule, as_schedule
from .minibatch import EpochBatches, IndependentBatches

TensorDict = dict[str, torch.Tensor]
PotentialChoice = Literal["auto", "trace", "log_joint"]

_MAX_SEED = 2**62


class _DrawStats(NamedTuple):
    step_size: float
    temperature: float
    potential_energy: float
    diverging: bool


class StochasticGradientKernel(MCMCKernel):
    r"""Base class of the SG-MCMC kernels; see :class:`~pyro_sgmcmc.SGLD` for the arguments.

    Each call of :meth:`sample` makes ``num_steps_per_sample`` gradient steps (more if the step
    schedule is still in an exploration phase) and returns the position reached: one kept draw.
    ``pyro.infer.MCMC`` discards the first ``warmup_steps`` such draws.
    """

    #: Name of the update rule, used in messages.
    algorithm = "SG-MCMC"

    def __init__(
        self,
        model: Callable[..., Any],
        step_size: float | StepSchedule | Callable[[int], float] | None = None,
        *,
        learning_rate: float | StepSchedule | Callable[[int], float] | None = None,
        batch_size: int | None = None,
        subsample_plate: str = "data",
        num_steps_per_sample: int = 1,
        temperature: float = 1.0,
        init_strategy: Callable = init_to_uniform,
        seed: int | None = None,
        gibbs_updates: Sequence[GibbsUpdate] | Literal["auto"] | None = "auto",
        gibbs_every: int | None = None,
        potential: PotentialChoice = "auto",
        max_consecutive_divergences: int = 100,
        transforms: Mapping[str, Transform] | None = None,
        batch_sampling: Literal["epoch", "independent"] = "epoch",
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be a callable Pyro model, got {type(model).__name__}")
        if (step_size is None) == (learning_rate is None):
            raise ValueError(
                "give exactly one of step_size (multiplies the gradient of the full-data "
                "potential) or learning_rate (per datum: step_size = learning_rate / N)"
            )
        self.model = model
        self._step_size_arg = step_size
        self._learning_rate_arg = learning_rate
        if step_size is not None:
            self._schedule = as_schedule(step_size, "step_size")
        else:
            self._schedule = as_schedule(learning_rate, "learning_rate")
        self._schedule_is_per_datum = learning_rate is not None
        if batch_size is not None:
            batch_size = check_positive_int("batch_size", batch_size)
        self.batch_size = batch_size
        if not isinstance(subsample_plate, str) or not subsample_plate:
            raise ValueError(f"subsample_plate must be a non-empty string, got {subsample_plate!r}")
        self.subsample_plate = subsample_plate
        self.num_steps_per_sample = check_positive_int("num_steps_per_sample", num_steps_per_sample)
        self.temperature = check_positive("temperature", temperature)
        if not callable(init_strategy):
            raise TypeError("init_strategy must be a callable such as pyro's init_to_median()")
        self.init_strategy = init_strategy
        if seed is not None:
            seed = check_positive_int("seed", seed, minimum=0)
        self.seed = seed
        if not (
            gibbs_updates in ("auto", None)
            or (
                isinstance(gibbs_updates, Sequence)
                and all(isinstance(g, GibbsUpdate) for g in gibbs_updates)
            )
        ):
            raise TypeError(
                "gibbs_updates must be 'auto', None, or a sequence of GibbsUpdate objects"
            )
        self._gibbs_arg = gibbs_updates
        if gibbs_every is not None:
            gibbs_every = check_positive_int("gibbs_every", gibbs_every)
        self.gibbs_every = gibbs_every
        if potential not in ("auto", "trace", "log_joint"):
            raise ValueError(
                f"potential must be one of 'auto', 'trace', 'log_joint', got {potential!r}"
            )
        if potential == "log_joint" and not isinstance(model, SupportsLogJoint):
            raise ValueError(
                "potential='log_joint' needs a model with a log_joint(params, subsample, *args, "
                "**kwargs) method (e.g. pyro_sgmcmc.nn.BayesianMLP)"
            )
        self.potential = potential
        self.max_consecutive_divergences = check_positive_int(
            "max_consecutive_divergences", max_consecutive_divergences
        )
        if batch_sampling not in ("epoch", "independent"):
            raise ValueError(
                f"batch_sampling must be 'epoch' or 'independent', got {batch_sampling!r}"
            )
        self.batch_sampling = batch_sampling
        self._user_transforms = dict(transforms) if transforms is not None else None
        self.transforms: dict[str, Transform] | None = None
        self._num_setups = 0
        self._user_initial_params: TensorDict | None = None
        self._reset_chain()

    # ------------------------------------------------------------------ hooks for subclasses
    def _init_state(self, position: TensorDict) -> Any:
        """Create the dynamics state at ``position`` (only the dynamic sites)."""
        raise NotImplementedError

    def _step(self, state: Any, gradient: TensorDict, step_size: float, temperature: float) -> Any:
        """Advance the dynamics state by one step."""
        raise NotImplementedError

    def _state_with_position(self, state: Any, position: TensorDict, reset: bool) -> Any:
        """Return ``state`` moved to ``position``; ``reset`` also zeroes auxiliary variables."""
        return state._replace(position=position)

    # ------------------------------------------------------------------ chain bookkeeping
    def _reset_chain(self) -> None:
        self._state: Any = None
        self._fixed: TensorDict = {}
        self._last_returned: TensorDict | None = None
        self._initial_params: TensorDict | None = None
        self._generator: torch.Generator | None = None
        self._batches: EpochBatches | None = None
        self._potential: Potential | None = None
        self._structure: ModelStructure | None = None
        self._gibbs: list[GibbsUpdate] = []
        self._dynamic_sites: tuple[str, ...] = ()
        self._num_steps = 0
        self._num_draws = 0
        self._warmup_steps = 0
        self._consecutive_divergences = 0
        self._divergent_steps: list[int] = []
        self._divergences: list[int] = []
        self._num_warmup_divergences = 0
        self._draw_diverged = False
        self._last_potential = math.nan
        self._last_step_size = math.nan
        self._stats: list[_DrawStats] = []
        self._draws: list[TensorDict] = []
        self.chain_seed: int | None = None

    def _chain_seed(self) -> int:
        """A seed for this chain: from ``seed`` and the chain's index, or from torch's global RNG.

        Chains run one after the other share this kernel object (Pyro calls ``setup`` once per
        chain), so the index is the number of ``setup`` calls; in a worker process of a parallel
        run Pyro has seeded torch per chain, and that seed tells the chains apart.
        """
        if self.seed is None:
            return int(torch.randint(0, _MAX_SEED, (1,)).item())
        if multiprocessing.current_process().name == "MainProcess":
            chain_key = self._num_setups
        else:
            chain_key = torch.initial_seed()
        sequence = np.random.SeedSequence(self.seed, spawn_key=(chain_key,))
        return int(sequence.generate_state(1, np.uint64)[0] % _MAX_SEED)

    # ------------------------------------------------------------------ MCMCKernel API
    @property
    def initial_params(self) -> TensorDict | None:
        """Unconstrained starting values of the current chain (set by :meth:`setup`)."""
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: Mapping[str, torch.Tensor]) -> None:
        self._user_initial_params = {k: torch.as_tensor(v) for k, v in params.items()}
        self._initial_params = dict(self._user_initial_params)

    @property
    def num_data(self) -> int:
        """``N``, the size of the data plate (after :meth:`setup`)."""
        if self._structure is None:
            raise RuntimeError("the kernel has not been set up: call MCMC.run(...) first")
        return self._structure.num_data

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        """Inspect the model on the data, draw the chain's seed and its initial values."""
        warmup_steps = check_positive_int("warmup_steps", warmup_steps, minimum=0)
        check_finite_data(args, kwargs)
        user_initial = self._user_initial_params
        self._reset_chain()
        self.chain_seed = self._chain_seed()
        self._num_setups += 1
        self._warmup_steps = warmup_steps
        self._generator = torch.Generator().manual_seed(self.chain_seed)

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.chain_seed)
            structure = inspect_model(self.model, args, kwargs, self.subsample_plate)
            gibbs = self._resolve_gibbs(args, kwargs)
            initial_params, _, transforms, _ = initialize_model(
                self.model,
                model_args=args,
                model_kwargs=kwargs,
                transforms=self._user_transforms,
                init_strategy=self.init_strategy,
                initial_params=user_initial,
            )
        self._structure = structure
        self.transforms = dict(transforms)
        self._initial_params = dict(initial_params)

        num_data = structure.num_data
        batch_size = num_data if self.batch_size is None else self.batch_size
        if batch_size > num_data:
            raise ValueError(
                f"batch_size must lie in [1, N] = [1, {num_data}] (N is the size of the data "
                f"plate {self.subsample_plate!r}), got {batch_size}"
            )
        batches = EpochBatches if self.batch_sampling == "epoch" else IndependentBatches
        self._batches = batches(num_data, batch_size, self._generator)

        use_fast = self.potential == "log_joint" or (
            self.potential == "auto" and isinstance(self.model, SupportsLogJoint)
        )
        if use_fast:
            self._potential = LogJointPotential(self.model, args, kwargs, self.transforms)
        else:
            self._potential = TracePotential(
                self.model, args, kwargs, self.transforms, self.subsample_plate
            )

        self._gibbs = gibbs
        if self._gibbs and self.temperature != 1.0:
            warnings.warn(
                f"temperature={self.temperature} with Gibbs updates: the Gibbs blocks draw from "
                "their untempered (T = 1) conditionals",
                stacklevel=2,
            )
        gibbs_sites = {site for update in self._gibbs for site in update.sites}
        unknown = gibbs_sites - set(structure.latent_sites)
        if unknown:
            raise ValueError(f"gibbs_updates name sites that are not latent: {sorted(unknown)}")
        self._dynamic_sites = tuple(s for s in structure.latent_sites if s not in gibbs_sites)
        if not self._dynamic_sites:
            raise ValueError("every latent site is Gibbs-updated: nothing is left for SG-MCMC")
        if self.gibbs_every is None:
            self._gibbs_every = max(self._batches.batches_per_epoch, 1)
        else:
            self._gibbs_every = self.gibbs_every
        self._args, self._kwargs = args, kwargs

    def _resolve_gibbs(self, args: tuple, kwargs: Mapping[str, Any]) -> list[GibbsUpdate]:
        """The Gibbs blocks: given, declared by the model, or found in its trace (``"auto"``)."""
        if self._gibbs_arg is None:
            return []
        if self._gibbs_arg == "auto":
            factory = getattr(self.model, "gibbs_updates", None)
            if callable(factory):
                return list(factory())
            return list(find_normal_gamma_updates(self.model, *args, **kwargs))
        return list(self._gibbs_arg)

    def step_size_at(self, t: int) -> float:
        """The step size (multiplying the full-data gradient) at gradient step ``t``."""
        value = float(self._schedule(t))
        if self._schedule_is_per_datum:
            value = value / self.num_data
        return value

    def _split(self, params: Mapping[str, torch.Tensor]) -> tuple[TensorDict, TensorDict]:
        dynamic = {name: params[name] for name in self._dynamic_sites}
        fixed = {name: params[name] for name in params if name not in dynamic}
        return dynamic, fixed

    def sample(self, params: Mapping[str, torch.Tensor]) -> TensorDict:
        """Make ``num_steps_per_sample`` gradient steps and return the new unconstrained draw."""
        if self._potential is None:
            raise RuntimeError("the kernel has not been set up: run it through pyro.infer.MCMC")
        if self._state is None or params is not self._last_returned:
            dynamic, self._fixed = self._split(params)
            self._state = self._init_state(dynamic)
        self._draw_diverged = False
        steps_done = 0
        while True:
            sampling_phase = self._take_step()
            steps_done += 1
            if steps_done >= self.num_steps_per_sample and sampling_phase:
                break
        draw = {**self._state.position, **self._fixed}
        self._record_draw(draw)
        self._last_returned = draw
        return draw

    def _take_step(self) -> bool:
        t = self._num_steps
        step_size = self.step_size_at(t)
        sampling_phase = bool(getattr(self._schedule, "is_sampling", lambda _: True)(t))
        temperature = self.temperature if sampling_phase else 0.0
        subsample = self._batches.next()
        position = {**self._state.position, **self._fixed}
        value, gradient = potential_and_gradient(
            self._potential, position, subsample, self._dynamic_sites
        )
        self._num_steps += 1
        self._last_step_size = step_size
        new_state = self._step(self._state, gradient, step_size, temperature)
        # One reduction per site: a NaN or infinity anywhere makes the total non-finite.
        total = value
        for site_value in new_state.position.values():
            total = total + site_value.sum()
        if math.isfinite(float(total)):
            self._state = new_state
            self._last_potential = float(value)
            self._consecutive_divergences = 0
            if self._gibbs and self._num_steps % self._gibbs_every == 0:
                self._gibbs_step()
        else:
            self._on_divergence(self._non_finite_sites(value, gradient, new_state.position))
        return sampling_phase

    @staticmethod
    def _non_finite_sites(
        value: torch.Tensor, gradient: TensorDict, position: TensorDict
    ) -> list[str]:
        bad = [name for name, g in gradient.items() if not torch.isfinite(g).all()]
        bad = bad or [name for name, v in position.items() if not torch.isfinite(v).all()]
        if not bad and not torch.isfinite(value):
            bad = ["<potential energy>"]
        return bad

    def _on_divergence(self, bad_sites: list[str]) -> None:
        """Keep the last finite position, zero auxiliary variables, and count the divergence."""
        self._state = self._state_with_position(self._state, self._state.position, reset=True)
        self._consecutive_divergences += 1
        self._divergent_steps.append(self._num_steps)
        self._draw_diverged = True
        if self._consecutive_divergences >= self.max_consecutive_divergences:
            draws = self.collected_draws()
            constrained = self.constrain_draws(draws)
            raise SamplerDivergedError(
                f"{self.algorithm} diverged: {self._consecutive_divergences} consecutive steps up "
                f"to step {self._num_steps} (draw {self._num_draws}) produced non-finite values at "
                f"sites {bad_sites}; step size was {self._last_step_size:.3g}. Reduce step_size "
                f"(or learning_rate) or check the model. The {len(self._draws)} draws collected "
                "before this are in the exception's `draws` attribute.",
                iteration=self._num_steps,
                sites=bad_sites,
                draws=draws,
                constrained_draws=constrained,
            )

    def _gibbs_step(self) -> None:
        position = {**self._state.position, **self._fixed}
        constrained, _ = self._potential.constrain(position)
        updated = dict(self._fixed)
        for update in self._gibbs:
            new_values = update.sample(constrained, self._generator, *self._args, **self._kwargs)
            for name, value in new_values.items():
                constrained[name] = value
                updated[name] = self.transforms[name](value)
        self._fixed = updated

    def _record_draw(self, draw: TensorDict) -> None:
        is_warmup = self._num_draws < self._warmup_steps
        if self._draw_diverged:
            if is_warmup:
                self._num_warmup_divergences += 1
            else:
                self._divergences.append(self._num_draws - self._warmup_steps)
        if not is_warmup:
            self._stats.append(
                _DrawStats(
                    self._last_step_size,
                    self.temperature,
                    self._last_potential,
                    self._draw_diverged,
                )
            )
            self._draws.append(draw)
        self._num_draws += 1

    # ------------------------------------------------------------------ results
    def collected_draws(self) -> TensorDict:
        """The post-warm-up draws of the current chain so far, stacked along a first dimension."""
        if not self._draws:
            return {}
        return {name: torch.stack([d[name] for d in self._draws]) for name in self._draws[0]}

    def constrain_draws(self, draws: Mapping[str, torch.Tensor]) -> TensorDict:
        """Map unconstrained draws to the constrained space of each site."""
        transforms = self.transforms or {}
        return {
            name: value
            if name not in transforms or is_identity(transforms[name])
            else transforms[name].inv(value)
            for name, value in draws.items()
        }

    def logging(self) -> OrderedDict:
        """Shown on Pyro's progress bar."""
        return OrderedDict(
            [
                ("step size", f"{self._last_step_size:.2e}"),
                ("U", f"{self._last_potential:.4g}"),
                ("div", len(self._divergent_steps)),
            ]
        )

    def diagnostics(self) -> dict:
        """Per-chain diagnostics; ``pyro.infer.MCMC.diagnostics()`` gathers them over chains.

        ``divergences`` lists the post-warm-up draws during which at least one gradient step was
        non-finite (the format ``arviz.from_pyro`` reads). ``step_size``, ``temperature`` and
        ``potential_energy`` (the minibatch potential at the last step of each draw) are arrays
        with one entry per kept draw.
        """
        stats = self._stats
        return {
            "divergences": list(self._divergences),
            "warmup_divergences": self._num_warmup_divergences,
            "divergent_steps": list(self._divergent_steps),
            "num_steps": self._num_steps,
            "chain_seed": self.chain_seed,
            "step_size": torch.tensor([s.step_size for s in stats], dtype=torch.float64),
            "temperature": torch.tensor([s.temperature for s in stats], dtype=torch.float64),
            "potential_energy": torch.tensor(
                [s.potential_energy for s in stats], dtype=torch.float64
            ),
        }

    def cleanup(self) -> None:
        """Forget the chain's state so that the next chain starts fresh."""
        if self._state is None and self._user_initial_params is None:
            return
        transforms = self.transforms
        self._user_initial_params = None
        self._reset_chain()
        self.transforms = transforms

    # ------------------------------------------------------------------ helpers
    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(step_size={self._step_size_arg!r}, "
            f"learning_rate={self._learning_rate_arg!r}, batch_size={self.batch_size}, "
            f"num_steps_per_sample={self.num_steps_per_sample}, "
            f"temperature={self.temperature})"
        )


def check_friction(friction: float) -> float:
    """``friction`` must lie in ``(0, 1]`` in the :math:`(\\eta, \\alpha)` parameterisation."""
    return check_interval("friction", friction, 0, 1, low_open=True)
