r"""The update rules by name: options, initial state, one step, and the reset after a divergence.

Every sampler of the package (the ``pyro.infer.MCMC`` kernels and the many-chain runner) advances
its chains through :data:`ALGORITHMS`: an :class:`Algorithm` bundles

* ``options``: a frozen dataclass of the rule's hyper-parameters, validated when it is built
  (the messages name the argument and its allowed range);
* ``init(position, options)``: the state at a position, holding everything the rule carries from
  step to step (momenta, the running gradient-noise estimate, RMSprop statistics);
* ``step(state, gradient, inputs, options)``: one update, calling the pure rule of
  :mod:`pyro_sgmcmc.dynamics` -- the only call site of each rule;
* ``reset(state, chains)``: the state after a divergence of the chains in the boolean mask
  ``chains`` (momenta restart at zero; other statistics are kept);
* ``move_variance(state, inputs, options)``: the variance of the noise one step injects in each
  coordinate, the scale against which a runaway move is judged (``None`` without noise).

The states hold dictionaries of tensors; the samplers pass a single entry whose tensor has a
leading chain axis, so every operation here is element-wise or per chain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch

from .._validation import check_interval, check_nonnegative, check_positive, check_positive_int
from ._common import StepSize, TensorDict, entry, sqrt
from .metric import DenseMetric
from .psgld import (
    PSGLDConstants,
    PSGLDState,
    psgld_constants,
    psgld_init,
    psgld_step,
    rmsprop_preconditioner,
)
from .sgd import SGDState, partial_momentum_refresh, sgd_init, sgd_step
from .sghmc import (
    DEFAULT_SGHMC_INTEGRATOR,
    GradientNoiseEstimate,
    SGHMCConstants,
    SGHMCState,
    check_sghmc_integrator,
    sghmc_constants,
    sghmc_init,
    sghmc_step,
    update_gradient_noise_estimate,
)
from .sgld import (
    DEFAULT_INTEGRATOR,
    SGLDState,
    check_integrator,
    sgld_constants,
    sgld_init,
    sgld_step,
)

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "ConstantSGDOptions",
    "PSGLDOptions",
    "SGHMCOptions",
    "SGLDOptions",
    "SettingsMemo",
    "StepInputs",
    "dump_state",
    "get_algorithm",
    "load_state",
]


@dataclass(frozen=True)
class StepInputs:
    """What a sampler hands to :attr:`Algorithm.step` besides the state and the gradient.

    Attributes
    ----------
    step_size:
        The step size multiplying the full-data gradient: a float or a ``(C, 1)`` tensor.
    temperature:
        :math:`T \\ge 0` of this step (0 in an exploration phase).
    draw_noise:
        Returns fresh standard normal draws shaped like the position (each chain from its own
        generator); called only by rules that inject noise.
    num_data:
        :math:`N`, the size of the data plate.
    step:
        The 1-based index of this step.
    preconditioner:
        A constant diagonal :math:`P` shaped like the position, or ``None`` (the identity).
    gradient_variance:
        :math:`\\hat V`, a frozen estimate of the minibatch gradient's variance shaped like the
        position, used to subtract the gradient noise from the injected noise; or ``None``.
    adapting:
        Whether statistics that set the preconditioner may still change (pSGLD's running
        average): ``False`` freezes them.
    friction:
        SGHMC's friction :math:`\\alpha` as the warm-up adapted it, a ``(C, 1)`` tensor; ``None``:
        the rule's option.
    memo:
        Where the rules keep what they derive from these settings for the next steps with the
        same ones (:meth:`derived`; the sampler's :class:`SettingsMemo`), or ``None``.
    """

    step_size: StepSize
    temperature: float
    draw_noise: Callable[[], TensorDict]
    num_data: int
    step: int
    preconditioner: TensorDict | None = None
    gradient_variance: TensorDict | None = None
    adapting: bool = True
    friction: torch.Tensor | None = None
    memo: dict[str, Any] | None = None

    def derived(self, name: str, compute: Callable[[], Any], *depends_on: Any) -> Any:
        """``compute()``, a quantity of the settings and of ``depends_on`` alone (not of the
        step's index, nor of any other part of the state but the names of its sites, which are
        fixed), kept in :attr:`memo` under ``name`` for the next steps with the same settings
        (:class:`SettingsMemo`) and the same, unmodified ``depends_on`` (compared as the settings
        are); computed anew at every step without a memo."""
        if self.memo is None:
            return compute()
        tensors: list[torch.Tensor] = []
        key = _identity(depends_on, tensors)
        kept = self.memo.get(name)
        if kept is None or kept[0] != key:
            # the tensors are kept with their key, so that their identities cannot be reused
            kept = self.memo[name] = (key, tensors, compute())
        return kept[2]

    def gradient_noise(self, variance: TensorDict | None = None) -> float | TensorDict:
        r""":math:`\hat\beta = \epsilon P \hat V / 2` per entry, for ``variance`` :math:`\hat V`
        (default :attr:`gradient_variance`, kept in :attr:`memo`; 0 without an estimate)."""
        if variance is None:
            return self.derived("gradient_noise", lambda: self._gradient_noise(None))
        return self._gradient_noise(variance)

    def _gradient_noise(self, variance: TensorDict | None) -> float | TensorDict:
        variance = self.gradient_variance if variance is None else variance
        if variance is None:
            return 0.0
        return {
            name: 0.5 * self.step_size * value * self.preconditioner_of(name)
            for name, value in variance.items()
        }

    def preconditioner_of(self, name: str) -> torch.Tensor | float:
        """The diagonal of the preconditioner of entry ``name`` (1 for the identity)."""
        value = entry(self.preconditioner, name)
        if isinstance(value, DenseMetric):
            return value.diagonal()
        return 1.0 if value is None else value


class SettingsMemo:
    r"""The :attr:`StepInputs.memo` of a sampler: one dictionary of derived quantities, kept
    while the step settings stay the same objects, unmodified, and replaced when they change.

    A sampling phase's settings are frozen, so an update rule's constants (its noise scale,
    :math:`1 - \alpha`, the variance a step injects) are computed once instead of at each step:
    the same operations on the same values, hence the same numbers. Settings are compared by
    identity and, for tensors, by their version counter, which every in-place tensor operation
    bumps (a change through ``.data`` or a NumPy view does not: settings must not be changed
    that way); floats and other values by equality. The memo holds the tensors it was made for,
    so that their identities cannot be reused by other tensors while it is kept.
    """

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.kept: list[torch.Tensor] = []
        self.values: dict[str, Any] = {}

    def for_settings(self, *settings: Any) -> dict[str, Any]:
        """The memo of ``settings``: the last one if they are the same as last time's, else a
        new, empty one."""
        kept: list[torch.Tensor] = []
        key = _identity(settings, kept)
        if key != self.key:
            self.key, self.kept, self.values = key, kept, {}
        return self.values


def _identity(value: Any, kept: list[torch.Tensor]) -> Any:
    """What :class:`SettingsMemo` compares a setting (or a tuple, mapping or dense metric of
    them) by; each tensor met is appended to ``kept``."""
    if isinstance(value, torch.Tensor):
        kept.append(value)
        return (id(value), value._version)
    if isinstance(value, DenseMetric):
        return (_identity(value.matrix, kept), _identity(value.root, kept))
    if isinstance(value, Mapping):
        return tuple((name, _identity(item, kept)) for name, item in value.items())
    if isinstance(value, tuple):
        return tuple(_identity(item, kept) for item in value)
    return (type(value), value)


# ---------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class SGLDOptions:
    """SGLD's integrator of the Langevin diffusion (see :class:`pyro_sgmcmc.SGLD`):
    ``"leimkuhler_matthews"`` (default) or ``"euler"`` (:func:`~pyro_sgmcmc.dynamics.sgld_step`)."""

    integrator: str = DEFAULT_INTEGRATOR

    def __post_init__(self) -> None:
        check_integrator(self.integrator)


@dataclass(frozen=True)
class SGHMCOptions:
    """SGHMC's friction, gradient-noise handling and optional momentum refreshes.

    See :class:`pyro_sgmcmc.SGHMC` for their meaning and ranges. ``adapt_friction`` (the user
    gave no friction): the adaptive warm-up may choose the friction, starting from
    ``friction``.
    """

    friction: float = 0.05
    gradient_noise: float | Literal["estimate"] = 0.0
    gradient_noise_decay: float = 0.99
    resample_momentum_every: int | None = None
    momentum_persistence: float = 0.0
    adapt_friction: bool = False
    integrator: str = DEFAULT_SGHMC_INTEGRATOR

    def __post_init__(self) -> None:
        friction = check_interval("friction", self.friction, 0, 1, low_open=True)
        object.__setattr__(self, "friction", friction)
        if self.gradient_noise != "estimate":
            noise = check_nonnegative("gradient_noise", self.gradient_noise)
            if noise > friction:
                raise ValueError(
                    f"gradient_noise must lie in [0, friction] = [0, {friction}], got {noise}"
                )
            object.__setattr__(self, "gradient_noise", noise)
        decay = check_interval(
            "gradient_noise_decay", self.gradient_noise_decay, 0.0, 1.0, high_open=True
        )
        object.__setattr__(self, "gradient_noise_decay", decay)
        check_sghmc_integrator(self.integrator)
        if self.resample_momentum_every is not None:
            every = check_positive_int("resample_momentum_every", self.resample_momentum_every)
            object.__setattr__(self, "resample_momentum_every", every)
        persistence = check_interval(
            "momentum_persistence", self.momentum_persistence, 0.0, 1.0, high_open=True
        )
        object.__setattr__(self, "momentum_persistence", persistence)


@dataclass(frozen=True)
class PSGLDOptions:
    """pSGLD's RMSprop decay, diagonal bias and integrator (see :class:`pyro_sgmcmc.PSGLD`)."""

    decay: float = 0.99
    epsilon: float = 1e-5
    integrator: str = DEFAULT_INTEGRATOR

    def __post_init__(self) -> None:
        check_integrator(self.integrator)
        decay = check_interval("decay", self.decay, 0.0, 1.0, high_open=True)
        object.__setattr__(self, "decay", decay)
        object.__setattr__(self, "epsilon", check_positive("epsilon", self.epsilon))


@dataclass(frozen=True)
class ConstantSGDOptions:
    """Constant SGD's optimal-rate settings (see :class:`pyro_sgmcmc.ConstantSGD`)."""

    optimal_rate: bool = True
    preconditioner: Literal["scalar", "diagonal"] = "scalar"
    rate_multiplier: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.optimal_rate, bool):
            raise TypeError(f"optimal_rate must be True or False, got {self.optimal_rate!r}")
        if self.preconditioner not in ("scalar", "diagonal"):
            raise ValueError(
                f"preconditioner must be 'scalar' or 'diagonal', got {self.preconditioner!r}"
            )
        multiplier = check_positive("rate_multiplier", self.rate_multiplier)
        object.__setattr__(self, "rate_multiplier", multiplier)


# ---------------------------------------------------------------------------------------- rules
def _sgld_step(state: SGLDState, gradient: TensorDict, inputs: StepInputs, options: SGLDOptions):
    noise = inputs.draw_noise() if inputs.temperature > 0 else None
    beta = inputs.gradient_noise()
    constants = inputs.derived(
        "sgld",
        lambda: sgld_constants(
            state.position, inputs.step_size, inputs.temperature, beta, inputs.preconditioner
        ),
    )
    return sgld_step(
        state,
        gradient,
        inputs.step_size,
        inputs.temperature,
        noise=noise,
        preconditioner=inputs.preconditioner,
        gradient_noise=beta,
        integrator=options.integrator,
        constants=constants,
    )


def _sghmc_step(
    state: SGHMCState, gradient: TensorDict, inputs: StepInputs, options: SGHMCOptions
) -> SGHMCState:
    beta: float | TensorDict = options.gradient_noise
    estimate = state.noise_estimate
    estimating = beta == "estimate"
    if estimating:
        estimate = update_gradient_noise_estimate(estimate, gradient, options.gradient_noise_decay)
        beta = inputs.gradient_noise(estimate.variance)
    elif inputs.gradient_variance is not None:
        beta = inputs.gradient_noise()
    noise = inputs.draw_noise() if inputs.temperature > 0 else None
    friction = options.friction if inputs.friction is None else inputs.friction

    def constants() -> SGHMCConstants:
        return sghmc_constants(
            state.position, inputs.step_size, friction, inputs.temperature, beta,
            inputs.preconditioner, options.integrator,
        )  # fmt: skip

    new = sghmc_step(
        state,
        gradient,
        inputs.step_size,
        friction,
        inputs.temperature,
        gradient_noise=beta,
        noise=noise,
        preconditioner=inputs.preconditioner,
        # an estimated gradient noise changes at every step, and the constants with it
        constants=constants() if estimating else inputs.derived("sghmc", constants),
        integrator=options.integrator,
    )._replace(noise_estimate=estimate)
    every = options.resample_momentum_every
    if every is not None and inputs.step % every == 0:
        fresh = inputs.draw_noise()
        dense = entry(inputs.preconditioner, next(iter(fresh)))
        if isinstance(dense, DenseMetric):  # N(0, eta T P) through P's root
            fresh = {name: dense.apply_root(value) for name, value in fresh.items()}
            scale: Any = {name: sqrt(inputs.step_size * inputs.temperature) for name in fresh}
        else:
            scale = _momentum_scale(inputs, new.momentum)
        momentum = partial_momentum_refresh(
            new.momentum, options.momentum_persistence, scale, noise=fresh
        )
        new = new._replace(momentum=momentum)
    return new


def _momentum_scale(inputs: StepInputs, momentum: TensorDict) -> dict[str, Any]:
    r"""The stationary standard deviation :math:`\sqrt{\eta T P}` of SGHMC's velocity."""
    return {
        name: sqrt(inputs.step_size * inputs.temperature * inputs.preconditioner_of(name))
        for name in momentum
    }


def _psgld_step(state: PSGLDState, gradient: TensorDict, inputs: StepInputs, options):
    noise = inputs.draw_noise() if inputs.temperature > 0 else None
    if _dense(inputs) is not None:
        # the adaptive warm-up's dense metric replaces the RMSprop diagonal: preconditioned SGLD
        constants = inputs.derived(
            "psgld_dense",
            lambda: sgld_constants(
                state.position, inputs.step_size, inputs.temperature, 0.0, inputs.preconditioner
            ),
        )
        moved = sgld_step(
            SGLDState(state.position, state.previous_noise),
            gradient,
            inputs.step_size,
            inputs.temperature,
            noise=noise,
            preconditioner=inputs.preconditioner,
            integrator=options.integrator,
            constants=constants,
        )
        return state._replace(position=moved.position, previous_noise=moved.previous_noise)
    adapt = inputs.adapting or state.square_average is None
    # a diagonal preconditioner given to pSGLD caps its RMSprop gain (the adaptive warm-up's)
    cap = inputs.preconditioner
    constants = None
    if not adapt:  # the running average is frozen: so are the step's constants

        def compute() -> PSGLDConstants:
            return psgld_constants(
                state.square_average, inputs.step_size, inputs.temperature, options.epsilon,
                inputs.gradient_variance, cap,
            )  # fmt: skip

        constants = inputs.derived("psgld", compute, state.square_average)
    return psgld_step(
        state,
        gradient,
        inputs.step_size,
        inputs.temperature,
        num_data=inputs.num_data,
        decay=options.decay,
        epsilon=options.epsilon,
        noise=noise,
        adapt=adapt,
        gradient_variance=inputs.gradient_variance,
        max_gain=cap,
        integrator=options.integrator,
        constants=constants,
    )


def _dense(inputs: StepInputs) -> DenseMetric | None:
    """The dense metric the inputs carry, if any."""
    if inputs.preconditioner is None:
        return None
    value = next(iter(inputs.preconditioner.values()))
    return value if isinstance(value, DenseMetric) else None


def _sgd_step(state: SGDState, gradient: TensorDict, inputs: StepInputs, _: Any) -> SGDState:
    # constant SGD's per-coordinate rates arrive as the preconditioner
    if inputs.preconditioner is None:
        return sgd_step(state, gradient, inputs.step_size)
    rates = {name: inputs.step_size * p for name, p in inputs.preconditioner.items()}
    return sgd_step(state, gradient, rates)


def _sghmc_init(position: Mapping[str, torch.Tensor], _: SGHMCOptions) -> SGHMCState:
    return sghmc_init(position)


def _reset_momentum(state: SGHMCState, where: torch.Tensor) -> SGHMCState:
    """Momenta at rest for the chains ``where`` (``(C,)``), or the entries ``where`` (a mask of
    the momenta's shape)."""
    momentum = {
        name: v.masked_fill(
            where if where.shape == v.shape else where.reshape(-1, *([1] * (v.dim() - 1))), 0.0
        )
        for name, v in state.momentum.items()
    }
    return state._replace(momentum=momentum)


def _unchanged(state: Any, _: torch.Tensor) -> Any:
    return state


def _move_variance(state: Any, inputs: StepInputs, _: Any) -> dict[str, Any] | None:
    r""":math:`2 \epsilon T P` per entry: the variance of the noise a step injects, the scale of an
    ordinary move (SGHMC's velocity has stationary variance :math:`\epsilon T P`, half of it)."""
    if inputs.temperature <= 0:
        return None
    return inputs.derived(
        "move_variance",
        lambda: {
            name: 2.0 * inputs.temperature * inputs.step_size * inputs.preconditioner_of(name)
            for name in state.position
        },
    )


def _sgld_move_variance(
    state: SGLDState, inputs: StepInputs, options: SGLDOptions
) -> dict[str, Any] | None:
    r""":math:`2 \epsilon T P` per entry for Euler's SGLD; half of it for the
    Leimkuhler-Matthews integrator, whose step injects the average of two draws."""
    return inputs.derived(
        "langevin_move_variance",
        lambda: _for_integrator(_move_variance(state, inputs, options), options),
    )


def _for_integrator(variance: dict[str, Any] | None, options: Any) -> dict[str, Any] | None:
    """The move variance of an Euler step, halved for the Leimkuhler-Matthews integrator."""
    if variance is None or options.integrator == "euler":
        return variance
    return {name: 0.5 * value for name, value in variance.items()}


def _psgld_move_variance(
    state: PSGLDState, inputs: StepInputs, options: PSGLDOptions
) -> dict[str, Any] | None:
    r""":math:`2 \epsilon T G` per entry, with pSGLD's own RMSprop diagonal :math:`G` (or the
    diagonal of the dense metric that replaces it), halved for the Leimkuhler-Matthews
    integrator."""
    if _dense(inputs) is not None:
        return _sgld_move_variance(state, inputs, options)
    if inputs.temperature <= 0 or state.square_average is None:
        return None

    def variance() -> dict[str, Any] | None:
        scale = 2.0 * inputs.temperature * inputs.step_size
        return _for_integrator(
            {
                name: scale * rmsprop_preconditioner(v, options.epsilon)
                for name, v in state.square_average.items()
            },
            options,
        )

    return inputs.derived("psgld_move_variance", variance, state.square_average)


def _no_noise(state: Any, inputs: StepInputs, _: Any) -> None:
    return None


# ---------------------------------------------------------------------------------------- registry
class Algorithm(NamedTuple):
    """One update rule as the samplers see it (see the module docstring)."""

    name: str
    label: str
    options: type
    init: Callable[[Mapping[str, torch.Tensor], Any], Any]
    step: Callable[[Any, TensorDict, StepInputs, Any], Any]
    reset: Callable[[Any, torch.Tensor], Any]
    move_variance: Callable[[Any, StepInputs, Any], dict[str, Any] | None] = _move_variance
    uses_temperature: bool = True


#: The update rules, by name.
ALGORITHMS: dict[str, Algorithm] = {
    "sgld": Algorithm(
        "sgld",
        "SGLD",
        SGLDOptions,
        lambda p, _: sgld_init(p),
        _sgld_step,
        _unchanged,
        _sgld_move_variance,
    ),
    "sghmc": Algorithm("sghmc", "SGHMC", SGHMCOptions, _sghmc_init, _sghmc_step, _reset_momentum),
    "psgld": Algorithm(
        "psgld",
        "pSGLD",
        PSGLDOptions,
        lambda p, _: psgld_init(p),
        _psgld_step,
        _unchanged,
        _psgld_move_variance,
    ),
    "constant_sgd": Algorithm(
        "constant_sgd",
        "constant SGD",
        ConstantSGDOptions,
        lambda p, _: sgd_init(p),
        _sgd_step,
        _unchanged,
        _no_noise,
        uses_temperature=False,
    ),
}


def get_algorithm(name: str) -> Algorithm:
    """The :class:`Algorithm` called ``name``; the error lists the known names."""
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {name!r}")
    return ALGORITHMS[name]


#: Named-tuple fields of the states that hold named tuples themselves.
_NESTED_STATES: dict[str, type] = {"noise_estimate": GradientNoiseEstimate}


def dump_state(state: Any) -> dict[str, Any]:
    """A state as plain dictionaries (what ``torch.load(..., weights_only=True)`` reads back)."""
    return {
        name: value._asdict() if isinstance(value, tuple) and hasattr(value, "_fields") else value
        for name, value in state._asdict().items()
    }


def load_state(template: Any, saved: Mapping[str, Any]) -> Any:
    """The state of ``template``'s type with the fields of :func:`dump_state`'s output."""
    fields = {
        name: _NESTED_STATES[name](**value)
        if name in _NESTED_STATES and isinstance(value, Mapping)
        else value
        for name, value in saved.items()
    }
    return type(template)(**fields)
