r"""Step-size schedules for stochastic-gradient MCMC.

A schedule is a callable ``schedule(t) -> float`` of the gradient-step counter ``t = 0, 1, 2, ...``
(warm-up included) with a method ``is_sampling(t) -> bool`` that tells whether the draw made at
step ``t`` may be kept. Any plain callable is accepted by the kernels too; it is treated as
always sampling and its values are checked to be finite and positive at every step.

The schedules here are immutable dataclasses, so the position in a schedule is fully described by
the step counter: a run can be checkpointed and resumed bit for bit.
"""

from __future__ import annotations

import bisect
import inspect
import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .._validation import check_interval, check_positive, check_positive_int, check_real

__all__ = [
    "Constant",
    "CyclicalCosine",
    "PiecewiseConstant",
    "PolynomialDecay",
    "Schedule",
    "StepSchedule",
    "as_schedule",
]


@runtime_checkable
class StepSchedule(Protocol):
    """What the kernels need from a schedule."""

    def __call__(self, t: int) -> float: ...

    def is_sampling(self, t: int) -> bool: ...


class Schedule:
    """Base class of the built-in schedules: always in the sampling phase unless overridden."""

    def __call__(self, t: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def is_sampling(self, t: int) -> bool:
        """Whether a draw made at step ``t`` belongs to a sampling phase (default: always)."""
        return True


@dataclass(frozen=True)
class Constant(Schedule):
    r"""A constant step size, :math:`\epsilon_t = \epsilon`.

    Parameters
    ----------
    value:
        The step size, ``> 0``.
    """

    value: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", check_positive("value", self.value))

    def __call__(self, t: int) -> float:
        return self.value


@dataclass(frozen=True)
class PolynomialDecay(Schedule):
    r"""The decaying step size of Welling & Teh (2011), :math:`\epsilon_t = a (b + t)^{-\gamma}`.

    With :math:`\gamma \in (0.5, 1]` the sequence satisfies
    :math:`\sum_t \epsilon_t = \infty` and :math:`\sum_t \epsilon_t^2 < \infty`, the conditions
    under which SGLD converges to the posterior without a Metropolis-Hastings correction.
    Smaller exponents (``0 <= gamma <= 0.5``) are allowed but lose that guarantee.

    Parameters
    ----------
    a:
        Scale, ``> 0``.
    b:
        Offset, ``> 0`` (so that the first step is finite).
    gamma:
        Decay exponent in ``[0, 1]``.

    References
    ----------
    M. Welling and Y. W. Teh, "Bayesian learning via stochastic gradient Langevin dynamics",
    ICML 2011.
    """

    a: float
    b: float = 1.0
    gamma: float = 0.55

    def __post_init__(self) -> None:
        object.__setattr__(self, "a", check_positive("a", self.a))
        object.__setattr__(self, "b", check_positive("b", self.b))
        object.__setattr__(self, "gamma", check_interval("gamma", self.gamma, 0.0, 1.0))

    def __call__(self, t: int) -> float:
        if t < 0:
            raise ValueError(f"the step counter t must be >= 0, got {t}")
        return self.a * (self.b + t) ** (-self.gamma)


@dataclass(frozen=True)
class PiecewiseConstant(Schedule):
    r"""A step size that is constant between given steps: ``values[k]`` for
    ``boundaries[k-1] <= t < boundaries[k]``.

    .. math::

        \epsilon_t = v_k \quad \text{for} \quad b_{k-1} \le t < b_k,
        \qquad b_{-1} = 0,\; b_K = \infty.

    The typical use is a burn-in with a larger step followed by sampling with a smaller one:
    ``PiecewiseConstant(values=(1e-3, 3e-4), boundaries=(1000,))``. Large steps reach the typical
    set sooner; the bias of a constant-step sampler is :math:`O(\epsilon)`, so the draws kept
    should come from the last, small step (put the boundary inside the warm-up).

    Parameters
    ----------
    values:
        ``K + 1`` step sizes, each ``> 0``.
    boundaries:
        ``K`` strictly increasing steps ``>= 1`` at which the next value starts.
    """

    values: tuple[float, ...]
    boundaries: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("values", "boundaries"):
            given = getattr(self, name)
            if not isinstance(given, Iterable) or isinstance(given, str):
                raise TypeError(
                    f"PiecewiseConstant {name} must be a sequence (e.g. values=(1e-3, 3e-4), "
                    f"boundaries=(1000,)), got {given!r}"
                )
        values = tuple(check_positive(f"values[{i}]", v) for i, v in enumerate(tuple(self.values)))
        boundaries = tuple(
            check_positive_int(f"boundaries[{i}]", b) for i, b in enumerate(tuple(self.boundaries))
        )
        if len(values) != len(boundaries) + 1:
            raise ValueError(
                f"PiecewiseConstant needs one more value than boundaries, got {len(values)} "
                f"values and {len(boundaries)} boundaries"
            )
        if any(b <= a for a, b in itertools.pairwise(boundaries)):
            raise ValueError(f"boundaries must be strictly increasing, got {boundaries}")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "boundaries", boundaries)

    def __call__(self, t: int) -> float:
        if t < 0:
            raise ValueError(f"the step counter t must be >= 0, got {t}")
        return self.values[bisect.bisect_right(self.boundaries, t)]


@dataclass(frozen=True)
class CyclicalCosine(Schedule):
    r"""The cyclical cosine schedule of cyclical SG-MCMC (Zhang et al., 2020).

    .. math::

        r_t = \frac{t \bmod L}{L}, \qquad
        \epsilon_t = \frac{\epsilon_0}{2}\left[\cos(\pi r_t) + 1\right].

    Each cycle of ``L = cycle_length`` steps starts with a large step size (the *exploration*
    phase, :math:`r_t < \beta`, in which the kernels switch the injected noise off and only
    optimise) and ends with small steps (the *sampling* phase, :math:`r_t \ge \beta`, in which
    the kernels add noise and keep draws).

    Parameters
    ----------
    initial:
        :math:`\epsilon_0`, the step size at the start of each cycle, ``> 0``.
    cycle_length:
        :math:`L`, the number of gradient steps in a cycle, an integer ``>= 1``.
    exploration_fraction:
        :math:`\beta \in [0, 1)`, the fraction of each cycle spent exploring.

    References
    ----------
    R. Zhang, C. Li, J. Zhang, C. Chen and A. G. Wilson, "Cyclical stochastic gradient MCMC for
    Bayesian deep learning", ICLR 2020.
    """

    initial: float
    cycle_length: int
    exploration_fraction: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "initial", check_positive("initial", self.initial))
        object.__setattr__(
            self, "cycle_length", check_positive_int("cycle_length", self.cycle_length)
        )
        object.__setattr__(
            self,
            "exploration_fraction",
            check_interval(
                "exploration_fraction", self.exploration_fraction, 0.0, 1.0, high_open=True
            ),
        )

    def _phase(self, t: int) -> float:
        return (t % self.cycle_length) / self.cycle_length

    def __call__(self, t: int) -> float:
        return 0.5 * self.initial * (math.cos(math.pi * self._phase(t)) + 1.0)

    def is_sampling(self, t: int) -> bool:
        return self._phase(t) >= self.exploration_fraction


@dataclass(frozen=True)
class _CallableSchedule(Schedule):
    """Wraps a user callable; every value is checked when it is used."""

    function: Callable[[int], float]
    name: str

    def __call__(self, t: int) -> float:
        value = self.function(t)
        try:
            value = check_real(f"{self.name}({t})", value)
        except TypeError as error:
            raise TypeError(f"schedule {self.name} returned a non-number at step {t}") from error
        if value <= 0:
            raise ValueError(
                f"schedule {self.name} must stay > 0 (allowed range (0, inf)), "
                f"but {self.name}({t}) = {value}"
            )
        return value


def as_schedule(value: float | StepSchedule | Callable[[int], float], name: str) -> StepSchedule:
    """Turn a float or a callable into a schedule, validating it.

    Parameters
    ----------
    value:
        A positive number (a :class:`Constant` schedule), one of the schedules of this module, or
        any callable of the step counter returning a positive float.
    name:
        The argument name used in error messages, e.g. ``"step_size"``.
    """
    if isinstance(value, Schedule):
        return value
    if callable(value):
        if isinstance(value, StepSchedule):
            return value
        try:
            inspect.signature(value).bind(0)
        except TypeError as error:
            raise TypeError(
                f"{name} must be a positive float, a schedule from "
                "pyro_sgmcmc.inference.schedules or a callable of the step counter, called as "
                f"{name}(t); {value!r} cannot be called with one argument ({error})"
            ) from None
        except ValueError:  # no signature (some builtins): let the first call tell
            pass
        schedule = _CallableSchedule(value, name)
        schedule(0)
        return schedule
    try:
        return Constant(check_positive(name, value))
    except TypeError as error:
        raise TypeError(
            f"{name} must be a positive float or a schedule from pyro_sgmcmc.inference.schedules, "
            f"got {value!r}"
        ) from error
