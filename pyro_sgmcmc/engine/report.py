r"""What the warm-up chose for each chain, as the kernels' ``diagnostics()`` and the exported
``sample_stats`` attributes report it.

* ``control_variate``: whether the chain samples with the control-variate gradient;
* ``num_steps_per_sample``: the chain's thinning (gradient steps per kept draw);
* ``autocorrelation_time``: the integrated autocorrelation time the warm-up measured, in gradient
  steps (``nan`` when the thinning was given);
* ``warmup_gradient_steps``: the gradient steps the warm-up took, more than planned where it was
  lengthened to measure that time (:meth:`~pyro_sgmcmc.engine.thinning.ThinningMeter.wants_longer`)
  or because a network's units were started afresh (``None`` without the adaptive warm-up);
* ``restarted_units``: how many of a network's hidden units, far outside their prior at the
  planned end of warm-up, were started afresh there (:mod:`~pyro_sgmcmc.engine.unit_restart`);
* ``coordinate_step``: per site, the smallest, median and largest step :math:`e_i = h P_i` of its
  coordinates, the step that multiplies the full-data gradient of each coordinate (each kept
  draw's ``step_size`` statistic, and the progress bar's step size, is the median over all the
  chain's coordinates: :func:`~pyro_sgmcmc.engine.controls.median_steps`);
* ``preconditioner``: what scales the coordinates (:func:`preconditioner_kind`), e.g. ``"dense"``
  where the warm-up's dense metric replaced pSGLD's RMSprop on a small model;
* ``configurational_temperature``, ``too_hot`` and ``too_cold``: the temperature the chain
  samples at over its target (:class:`~pyro_sgmcmc.engine.virial.VirialMeter`; ``nan`` where
  not measured) and whether it is too hot, which makes the run's verdict ``not converged``, or
  too cold, which makes a verdict ``converged`` on R-hat and ESS ``not converged``
  (:func:`~pyro_sgmcmc.analysis.diagnostics.with_temperatures`).

:func:`unconverged_advice` adds to the warning of an unconverged run what its measurement of the
autocorrelation time says (:func:`measurement_advice`: kept draws closer than that time, the
warm-up a short measurement asks for), then the verdict's own advice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..analysis.advice import advice
from ..analysis.diagnostics import Verdict
from ..dynamics.metric import DenseMetric
from .controls import coordinate_steps
from .thinning import ThinningMeter
from .view import EngineView

__all__ = [
    "any_too_hot",
    "draws_closer_than_mixing",
    "measured_temperature",
    "measurement_advice",
    "preconditioner_kind",
    "sampling_report",
    "unconverged_advice",
]


def sampling_report(engine: EngineView, chain: int) -> dict[str, Any]:
    """The report of the module docstring for chain ``chain`` of ``engine``."""
    thinning = engine.thinning
    meter = engine.thinning_meter
    times = None if meter is None else meter.autocorrelation_time
    steps = coordinate_steps(engine)[chain].detach().double().cpu()
    per_site = {}
    for name, part in zip(engine.layout.names, steps.split(engine.layout.sizes), strict=True):
        per_site[name] = {
            "min": float(part.min()),
            "median": float(part.median()),
            "max": float(part.max()),
        }
    estimator = engine.estimator
    active = getattr(estimator, "active", None)
    if active is not None:
        control_variate = bool(active[chain])
    else:
        control_variate = getattr(estimator, "centre", None) is not None and not hasattr(
            estimator, "active"
        )
    return {
        "control_variate": control_variate,
        "num_steps_per_sample": None if thinning is None else int(thinning[chain]),
        "autocorrelation_time": math.nan if times is None else float(times[chain]),
        "warmup_gradient_steps": _warmup_gradient_steps(engine),
        "restarted_units": int(engine.restarted_units[chain]),
        "coordinate_step": per_site,
        "preconditioner": preconditioner_kind(engine),
        **_temperature_check(engine, chain),
    }


def _warmup_gradient_steps(engine: EngineView) -> int | None:
    """The gradient steps of the warm-up, lengthened or not (``None`` without the adaptive
    warm-up, whose control counts them)."""
    if engine.thinning_meter is not None:
        return int(engine.thinning_meter.end)
    steps = getattr(engine.control, "warmup_steps", None)
    return None if steps is None else int(steps)


def measured_temperature(
    engine: EngineView,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(C,)`` each: the chains' configurational temperatures over the sampling phase so far,
    their standard errors, and the mask of chains too hot
    (:meth:`~pyro_sgmcmc.engine.virial.VirialMeter.too_hot`); ``None`` before they have been
    measured, and for constant SGD, which has no temperature."""
    found = engine.virial.estimate() if engine.algorithm.uses_temperature else None
    return None if found is None else (*found, engine.virial.too_hot(engine.temperature))


def any_too_hot(engine: EngineView) -> bool:
    """Whether some chain of ``engine`` samples too hot (its report's ``too_hot``)."""
    measured = measured_temperature(engine)
    return measured is not None and engine.temperature > 0 and bool(measured[2].any())


def _temperature_check(engine: EngineView, chain: int) -> dict[str, Any]:
    """The chain's configurational temperature over its target (``nan`` where
    :func:`measured_temperature` has none) and whether it is too hot, or too cold
    (:meth:`~pyro_sgmcmc.engine.virial.VirialMeter.too_cold`)."""
    measured = measured_temperature(engine)
    if measured is None or not engine.temperature > 0:
        return {"configurational_temperature": math.nan, "too_hot": False, "too_cold": False}
    value, _, hot = measured
    cold = engine.virial.too_cold(engine.temperature)
    return {"configurational_temperature": float(value[chain]) / engine.temperature,
            "too_hot": bool(hot[chain]), "too_cold": bool(cold[chain])}  # fmt: skip


def preconditioner_kind(engine: EngineView) -> str:
    """What scales the chains' coordinates: ``"dense"`` (the warm-up's dense metric: on models
    of up to 100 coordinates it replaces pSGLD's RMSprop too), ``"rmsprop"`` (pSGLD's own
    running diagonal), ``"diagonal"`` (a diagonal the warm-up measured, or constant SGD's
    per-coordinate rates) or ``"identity"`` (a hand-given step)."""
    preconditioner = engine.control.preconditioner
    if preconditioner is not None and isinstance(preconditioner["z"], DenseMetric):
        return "dense"
    if getattr(engine.state, "square_average", None) is not None:
        return "rmsprop"
    return "identity" if preconditioner is None else "diagonal"


def measurement_advice(meters: Sequence[ThinningMeter | None]) -> str:
    """For the warning of an unconverged run, what the measurement of the slowest chain among
    the thinning meters of its chains says: that its kept draws are closer than its
    autocorrelation time (:meth:`~pyro_sgmcmc.engine.thinning.ThinningMeter.thinning_advice`),
    and the longer warm-up a short measurement asks for
    (:meth:`~pyro_sgmcmc.engine.thinning.ThinningMeter.warmup_advice`); ``""`` where the
    thinning was given or nothing was measured."""
    measured = [m for m in meters if m is not None and m.autocorrelation_time is not None]
    if not measured:
        return ""
    slowest = max(measured, key=lambda meter: float(meter.autocorrelation_time.max()))
    capped = [meter for meter in measured if meter.capped_chains()]
    thinning = max(capped, key=lambda meter: float(meter.sampling_times.max()), default=None)
    return ("" if thinning is None else thinning.thinning_advice()) + slowest.warmup_advice()


def unconverged_advice(
    algorithm: str, verdict: Verdict, meters: Sequence[ThinningMeter | None]
) -> str:
    """What the warning of an unconverged run adds to its verdict: what the chains' measurement
    says (:func:`measurement_advice`), then the verdict's advice
    (:func:`~pyro_sgmcmc.analysis.advice.advice`), told whether the kept draws are closer than
    the chains' autocorrelation time; ``""`` for chains too hot (a smaller step is the cure),
    and the verdict's advice alone for chains that barely move (their causes come first)."""
    if verdict.statistic == "temperature":
        return ""
    if verdict.not_moving:
        return advice(algorithm, verdict)
    slow = draws_closer_than_mixing(meters)
    return measurement_advice(meters) + advice(algorithm, verdict, slow)


def draws_closer_than_mixing(meters: Sequence[ThinningMeter | None]) -> bool:
    """Whether some chain's kept draws are closer than the autocorrelation time it measured
    (:meth:`~pyro_sgmcmc.engine.thinning.ThinningMeter.capped_chains`)."""
    return any(meter.capped_chains() for meter in meters if meter is not None)
