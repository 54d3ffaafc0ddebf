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
from dataclasses import is_dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from pyro.infer.autoguide.initialization import init_to_uniform
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from pyro.infer.mcmc.util import initialize_model
from torch.distributions import biject_to
from torch.distributions.transforms import Transform

from .._validation import check_interval, check_positive, check_positive_int
from ..checkpoint import CheckpointError
from ..conjugate import find_normal_gamma_updates
from ..errors import ModelContractError, SamplerDivergedError
from ..gibbs import GibbsUpdate
from ..model_structure import (
    ModelStructure,
    check_finite_data,
    inspect_model,
    resolve_batch_size,
)
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


def _tempered(update: GibbsUpdate) -> bool:
    """Whether a Gibbs update accepts the kernel's temperature (``supports_temperature``)."""
    return bool(getattr(update, "supports_temperature", False))


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
        keep_draws: bool = True,
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
        if not isinstance(keep_draws, bool):
            raise TypeError(f"keep_draws must be True or False, got {keep_draws!r}")
        self.keep_draws = keep_draws
        if transforms is not None:
            if not isinstance(transforms, Mapping):
                raise TypeError(
                    f"transforms must be a dict from site name to a torch Transform, got "
                    f"{type(transforms).__name__}"
                )
            for name, transform in transforms.items():
                if not isinstance(transform, Transform):
                    raise TypeError(
                        f"transforms[{name!r}] must be a torch.distributions Transform, got "
                        f"{type(transform).__name__}"
                    )
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
            try:
                structure = inspect_model(self.model, args, kwargs, self.subsample_plate)
            except (IndexError, RuntimeError, TypeError) as error:
                raise ModelContractError(
                    f"the model fails on the data given to run(...) ({type(error).__name__}: "
                    f"{str(error).splitlines()[0] if str(error) else ''}). Check that the data "
                    "match the model: plate sizes, numbers of rows and features, dtypes."
                ) from error
            if user_initial is not None:
                self._check_initial_params(user_initial, structure)
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
        batch_size = resolve_batch_size(self.batch_size, num_data, self.subsample_plate)
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
        if self.temperature != 1.0 and not all(_tempered(u) for u in self._gibbs):
            warnings.warn(
                f"temperature={self.temperature} with Gibbs updates that do not support "
                "temperature: those blocks draw from their untempered (T = 1) conditionals",
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

    @staticmethod
    def _check_initial_params(
        params: Mapping[str, torch.Tensor], structure: ModelStructure
    ) -> None:
        """User initial values must name every latent site, with its unconstrained shape."""
        latent = set(structure.latent_sites)
        unknown, missing = sorted(set(params) - latent), sorted(latent - set(params))
        if unknown or missing:
            raise ValueError(
                f"initial_params must give every latent site {sorted(latent)} and no other; "
                f"unknown: {unknown}, missing: {missing}"
            )
        for name in structure.latent_sites:
            site = structure.trace.nodes[name]
            expected = biject_to(site["fn"].support).inv(site["value"]).shape
            if params[name].shape != expected:
                raise ValueError(
                    f"initial_params[{name!r}] has shape {tuple(params[name].shape)}; the site's "
                    f"unconstrained value has shape {tuple(expected)}"
                )

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
                "before this are in the exception's `draws` attribute"
                + ("." if self.keep_draws else " (none: the kernel has keep_draws=False)."),
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
            extra = {"temperature": self.temperature} if _tempered(update) else {}
            new_values = update.sample(
                constrained, self._generator, *self._args, **extra, **self._kwargs
            )
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
            if self.keep_draws:
                self._draws.append(draw)
        self._num_draws += 1

    # ------------------------------------------------------------------ checkpoints
    #: Attributes of a subclass that change the chain's path (compared by :meth:`signature`).
    _config_attributes: tuple[str, ...] = ()

    @property
    def current_params(self) -> TensorDict | None:
        """The unconstrained position to pass to the next :meth:`sample` call.

        The last draw returned (or loaded by :meth:`load_state_dict`); the initial values before
        the first draw. Passing any other dict restarts the dynamics there (momenta zeroed).
        """
        return self._last_returned if self._last_returned is not None else self._initial_params

    def _config(self) -> dict[str, str]:
        """The hyper-parameters that determine the chain, as comparable strings."""
        names = (
            "_step_size_arg",
            "_learning_rate_arg",
            "batch_size",
            "subsample_plate",
            "num_steps_per_sample",
            "temperature",
            "batch_sampling",
            "gibbs_every",
            "potential",
            "_gibbs_arg",
            *self._config_attributes,
        )
        return {name.strip("_"): _describe(getattr(self, name)) for name in names}

    def signature(self) -> dict[str, Any]:
        """What a saved state must share with this kernel to be loaded into it.

        The kernel class, its hyper-parameters (:meth:`_config`), and the model as the kernel
        sees it after :meth:`setup`: names, shapes and dtypes of the unconstrained latent sites,
        the observed sites in the data plate, the plate's name and size ``N``.
        """
        if self._structure is None or self._initial_params is None:
            raise RuntimeError("the kernel has not been set up: call setup(...) first")
        return {
            "kernel": type(self).__qualname__,
            "config": self._config(),
            "latent_sites": {
                name: [list(value.shape), str(value.dtype)]
                for name, value in self._initial_params.items()
            },
            "observed_sites": list(self._structure.observed_sites),
            "num_data": self._structure.num_data,
        }

    def state_dict(self, *, include_draws: bool = True) -> dict[str, Any]:
        """Everything needed to continue the current chain bit for bit.

        Call it between two :meth:`sample` calls. The result holds plain Python values and
        tensors only (``torch.load(..., weights_only=True)`` reads it back): counters, the
        schedule position (the step counter: the schedules are functions of it), the
        generator's state, the minibatch order, the dynamics state (position, momenta,
        preconditioner statistics), the Gibbs-updated values, divergence bookkeeping, per-draw
        statistics and, with ``include_draws``, the kept draws. Tensors are shared, not copied.

        Parameters
        ----------
        include_draws:
            Include the kept draws (only present when ``keep_draws=True``). A driver that stores
            the draws itself passes ``False`` and hands them back to :meth:`load_state_dict`.
        """
        if self._potential is None:
            raise RuntimeError("the kernel has not been set up: call setup(...) first")
        state = {
            "signature": self.signature(),
            "chain_seed": self.chain_seed,
            "num_setups": self._num_setups,
            "warmup_steps": self._warmup_steps,
            "num_steps": self._num_steps,
            "num_draws": self._num_draws,
            "generator": self._generator.get_state(),
            "batches": self._batches.state_dict(),
            "initial_params": dict(self._initial_params),
            "dynamics": None if self._state is None else dict(self._state._asdict()),
            "fixed": dict(self._fixed),
            "consecutive_divergences": self._consecutive_divergences,
            "divergent_steps": list(self._divergent_steps),
            "divergences": list(self._divergences),
            "num_warmup_divergences": self._num_warmup_divergences,
            "last_potential": self._last_potential,
            "last_step_size": self._last_step_size,
            "stats": [tuple(s) for s in self._stats],
            "extra": self._extra_state(),
        }
        if include_draws:
            state["draws"] = list(self._draws)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the chain saved by :meth:`state_dict`.

        Call :meth:`setup` first with the same ``warmup_steps`` and data (it rebuilds the
        potential, the transforms and the minibatch sampler); this then overwrites the chain's
        state. The next :meth:`sample` call must be given :attr:`current_params`.

        Raises
        ------
        CheckpointError
            If the state was saved by another kernel class, with other hyper-parameters, for a
            model with other latent sites or data size, or with another ``warmup_steps``.
        """
        if self._potential is None:
            raise RuntimeError(
                "call setup(warmup_steps, *args, **kwargs) with the model's data before "
                "load_state_dict(...)"
            )
        if not isinstance(state, Mapping) or "signature" not in state:
            raise CheckpointError("not a kernel state: it has no 'signature' entry")
        differences = _differences(state["signature"], self.signature())
        if differences:
            raise CheckpointError(
                "the saved state belongs to another kernel or model and cannot be continued "
                "here: " + "; ".join(differences)
            )
        if state["warmup_steps"] != self._warmup_steps:
            raise CheckpointError(
                f"the saved chain was set up with warmup_steps={state['warmup_steps']}, this "
                f"one with warmup_steps={self._warmup_steps}"
            )
        self.chain_seed = state["chain_seed"]
        self._num_setups = state["num_setups"]
        self._num_steps = state["num_steps"]
        self._num_draws = state["num_draws"]
        self._generator.set_state(state["generator"])
        self._batches.load_state_dict(state["batches"])
        self._initial_params = dict(state["initial_params"])
        self._fixed = dict(state["fixed"])
        if state["dynamics"] is None:
            self._state = None
            self._last_returned = None
        else:
            dynamic, _ = self._split(self._initial_params)
            self._state = self._init_state(dynamic)._replace(**state["dynamics"])
            self._last_returned = {**self._state.position, **self._fixed}
        self._consecutive_divergences = state["consecutive_divergences"]
        self._divergent_steps = list(state["divergent_steps"])
        self._divergences = list(state["divergences"])
        self._num_warmup_divergences = state["num_warmup_divergences"]
        self._last_potential = state["last_potential"]
        self._last_step_size = state["last_step_size"]
        self._stats = [_DrawStats(*s) for s in state["stats"]]
        self._draws = list(state.get("draws", ())) if self.keep_draws else []
        self._load_extra_state(state["extra"])

    def _extra_state(self) -> dict[str, Any]:
        """State a subclass keeps besides the dynamics state (see :meth:`state_dict`)."""
        return {}

    def _load_extra_state(self, extra: Mapping[str, Any]) -> None:
        """Restore what :meth:`_extra_state` saved."""

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


def _describe(value: Any) -> str:
    """A stable text form of a hyper-parameter: ``repr`` for values and the built-in schedules
    (frozen dataclasses), the qualified name for other callables and for objects without a
    ``repr`` of their own (theirs holds an address that changes from run to run)."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_describe(v) for v in value) + "]"
    if callable(value) and not is_dataclass(value):
        module = getattr(value, "__module__", None) or type(value).__module__
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        return f"<callable {module}.{name}>"
    if type(value).__repr__ is object.__repr__:
        return f"<{type(value).__module__}.{type(value).__qualname__}>"
    return repr(value)


def _differences(saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list:
    """Human-readable differences between two signatures (nested dicts)."""
    found = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<missing>"), current.get(key, "<missing>")
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            found.extend(_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            found.append(f"{prefix}{key}: saved {a!r}, now {b!r}")
    return found


def check_friction(friction: float) -> float:
    """``friction`` must lie in ``(0, 1]`` in the :math:`(\\eta, \\alpha)` parameterisation."""
    return check_interval("friction", friction, 0, 1, low_open=True)
