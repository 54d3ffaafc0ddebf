"""The settings every SG-MCMC sampler shares, validated in one place.

A kernel (:class:`~pyro_sgmcmc.SGLD`, :class:`~pyro_sgmcmc.SGHMC`, ...) holds one
:class:`SamplerSettings` and its update rule's options; ``pyro.infer.MCMC`` and
:func:`~pyro_sgmcmc.run_chains` both build their engines from them, so every option is accepted
(or refused, with the same message) by both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from torch.distributions.transforms import Transform

from .._validation import check_positive, check_positive_int
from ..inference.schedules import StepSchedule, as_schedule
from ..models.gibbs import GibbsUpdate
from ..models.potential_choice import POTENTIAL_CHOICES
from .minibatch import BatchSampling

__all__ = ["SamplerSettings", "describe"]


@dataclass(frozen=True)
class SamplerSettings:
    """Validated sampler settings (see :class:`~pyro_sgmcmc.SGLD` for their meaning).

    Build it with :meth:`create`, which checks every argument and names it in its errors.
    """

    step_size: Any
    learning_rate: Any
    schedule: StepSchedule | None
    batch_size: int | None
    subsample_plate: str
    num_steps_per_sample: int | None
    temperature: float
    init_strategy: Callable
    seed: int | None
    gibbs_updates: Sequence[GibbsUpdate] | str | None
    gibbs_every: int | None
    potential: str
    max_consecutive_divergences: int
    transforms: dict[str, Transform] | None
    batch_sampling: BatchSampling
    keep_draws: bool
    control_variate: bool | str | Mapping[str, Any]
    centre_iterations: int
    chunk_size: int
    compile: bool
    data_args: tuple[int | str, ...] | None = None
    data_parallel: bool = False

    @property
    def per_datum(self) -> bool:
        """Whether the step size is given per datum (``learning_rate``)."""
        return self.learning_rate is not None

    @property
    def adaptive(self) -> bool:
        """Whether no step size was given: the warm-up adapts it."""
        return self.schedule is None

    @classmethod
    def create(cls, **arguments: Any) -> SamplerSettings:
        """Check every argument (the messages name it and the allowed values)."""
        step_size, learning_rate = arguments["step_size"], arguments["learning_rate"]
        if step_size is not None and learning_rate is not None:
            raise ValueError(
                "give at most one of step_size (multiplies the gradient of the full-data "
                "potential) or learning_rate (per datum: step_size = learning_rate / N); give "
                "neither for the adaptive warm-up"
            )
        schedule = None
        if step_size is not None:
            schedule = as_schedule(step_size, "step_size")
        elif learning_rate is not None:
            schedule = as_schedule(learning_rate, "learning_rate")
        checked = {**arguments, "schedule": schedule}
        for name, check in _CHECKS.items():
            checked[name] = check(name, arguments.get(name))
        return cls(**checked)


def _optional_positive_int(name: str, value: Any) -> int | None:
    return None if value is None else check_positive_int(name, value)


def _plate(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _callable(name: str, value: Any) -> Callable:
    if not callable(value):
        raise TypeError(
            f"{name} must be a callable such as pyro's init_to_uniform(), got {value!r}"
        )
    return value


def _seed(name: str, value: Any) -> int | None:
    return None if value is None else check_positive_int(name, value, minimum=0)


def _gibbs(name: str, value: Any) -> Sequence[GibbsUpdate] | str | None:
    if value in ("auto", None):
        return value
    if isinstance(value, Sequence) and all(isinstance(g, GibbsUpdate) for g in value):
        return tuple(value)
    raise TypeError(f"{name} must be 'auto', None, or a sequence of GibbsUpdate objects")


def _choice(allowed: Sequence[Any]) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> Any:
        if value not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
        return value

    return check


def _transforms(name: str, value: Any) -> dict[str, Transform] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{name} must be a dict from site name to a torch Transform, got {type(value).__name__}"
        )
    for site, transform in value.items():
        if not isinstance(transform, Transform):
            raise TypeError(
                f"{name}[{site!r}] must be a torch.distributions Transform, got "
                f"{type(transform).__name__}"
            )
    return dict(value)


def _data_args(name: str, value: Any) -> tuple[int | str, ...] | None:
    if value is None:
        return None
    if isinstance(value, int | str):
        value = (value,)
    if not isinstance(value, Sequence) or not all(
        isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)
        for v in value
    ):
        raise TypeError(
            f"{name} must be None or a sequence of argument positions (ints >= 0) and keyword "
            f"names (strs) of the model's data arguments, got {value!r}"
        )
    return tuple(value)


def _boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def _flag_off_by_default(name: str, value: Any) -> bool:
    return False if value is None else _boolean(name, value)


def _control_variate(name: str, value: Any) -> bool | str | Mapping[str, Any]:
    if value == "auto" and isinstance(value, str):
        return value
    if not isinstance(value, bool | Mapping):
        raise TypeError(
            f"{name} must be 'auto', True, False or a mapping from site name to the centre's "
            f"constrained value, got {value!r}"
        )
    return value


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "batch_size": _optional_positive_int,
    "subsample_plate": _plate,
    "num_steps_per_sample": _optional_positive_int,
    "temperature": check_positive,
    "init_strategy": _callable,
    "seed": _seed,
    "gibbs_updates": _gibbs,
    "gibbs_every": _optional_positive_int,
    "potential": _choice(POTENTIAL_CHOICES),
    "max_consecutive_divergences": check_positive_int,
    "transforms": _transforms,
    "batch_sampling": _choice(("epoch", "independent")),
    "keep_draws": _boolean,
    "control_variate": _control_variate,
    "centre_iterations": check_positive_int,
    "chunk_size": check_positive_int,
    "compile": _boolean,
    "data_args": _data_args,
    "data_parallel": _flag_off_by_default,
}


def describe(value: Any) -> str:
    """A stable text form of a setting: ``repr`` for values and the built-in schedules (frozen
    dataclasses), the qualified name for other callables and for objects without a ``repr`` of
    their own (theirs holds an address that changes from run to run)."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(describe(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k!r}: {describe(v)}" for k, v in value.items()) + "}"
    if is_dataclass(value) and not isinstance(value, type):
        return repr(value)
    if callable(value):
        module = getattr(value, "__module__", None) or type(value).__module__
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        return f"<callable {module}.{name}>"
    if type(value).__repr__ is object.__repr__:
        return f"<{type(value).__module__}.{type(value).__qualname__}>"
    return repr(value)


def settings_signature(settings: SamplerSettings, options: Any) -> dict[str, str]:
    """The settings and options that determine a chain's path, as comparable strings."""
    skipped = {"schedule", "keep_draws"}
    signature = {
        f.name: describe(getattr(settings, f.name))
        for f in fields(settings)
        if f.name not in skipped
    }
    for f in fields(options):
        signature[f.name] = describe(getattr(options, f.name))
    return signature
