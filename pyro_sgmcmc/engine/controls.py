r"""Step-size controls: what step size, preconditioner and phase each gradient step uses.

A control answers, for step :math:`t`, the step size (shared or one per chain), whether the step
belongs to a sampling phase (a cyclical schedule explores at temperature 0 between them), the
constant diagonal preconditioner :math:`P` and the frozen gradient-noise estimate :math:`\hat V`
(both ``None`` unless adapted). It may watch the warm-up (:meth:`StepControl.observe`) and
freezes what it learnt at :meth:`StepControl.end_warmup`. Everything it learns is in its
``state_dict``, so a checkpointed run resumes bit for bit.

* :class:`ScheduleControl`: a user-given ``step_size`` or ``learning_rate`` (a float, a
  schedule or a callable of :math:`t`).
* :class:`MandtRateControl`: constant SGD's optimal rate (Mandt et al. 2017), estimated during
  the second half of warm-up from the gradient noise of two independent minibatches.
* :class:`~pyro_sgmcmc.engine.adaptation.AdaptiveControl`: the tuning-free warm-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..dynamics.metric import DenseMetric
from ..dynamics.psgld import rmsprop_preconditioner
from ..dynamics.sgd import optimal_constant_rates
from ..inference.schedules import StepSchedule
from .view import EngineView

__all__ = ["MandtRateControl", "ScheduleControl", "StepControl", "coordinate_steps", "median_steps"]


def coordinate_steps(engine: EngineView) -> torch.Tensor:
    """``(C, D)``: the step :math:`h P_i` of every coordinate at the engine's last step."""
    step = engine.control.step_size(max(engine.t - 1, 0))
    unit = engine.control.unit_step(engine)
    position = engine.position
    step = torch.as_tensor(step, dtype=position.dtype, device=position.device)
    if unit is None:
        return (
            step.reshape(-1, 1).expand(position.shape)
            if step.dim()
            else step.expand(position.shape)
        )
    return step * unit


def median_steps(engine: EngineView) -> np.ndarray:
    r"""``(C,)``: each chain's median over its coordinates of the step :math:`h P_i` at the
    engine's last step (the lower median for an even number of coordinates).

    What a chain moves by, where :math:`h` alone is a step per unit of preconditioner: the
    ``step_size`` statistic of every draw and the progress bar's step size. A hand-given step
    without a preconditioner is reported as given."""
    if engine.control.unit_step(engine) is None:  # every coordinate steps by h
        step = engine.control.step_size(max(engine.t - 1, 0))
        step = torch.as_tensor(step, dtype=torch.float64).detach().reshape(-1)
        return step.expand(engine.position.shape[0]).cpu().numpy().copy()
    # contiguous: torch's median along a dimension reads garbage from an expanded tensor
    # (seen with torch 2.13)
    steps = coordinate_steps(engine).detach().contiguous()
    return steps.median(dim=1).values.double().cpu().numpy()


class StepControl:
    """Base class: a schedule-free control that adapts nothing (see the module docstring)."""

    preconditioner: dict[str, Any] | None = None
    gradient_variance: dict[str, torch.Tensor] | None = None
    #: SGHMC's friction per chain, ``(C, 1)``, where the control adapts it (else ``None``).
    friction: torch.Tensor | None = None

    @property
    def adapting(self) -> bool:
        """Whether statistics that set the preconditioner may still change."""
        return True

    def step_size(self, t: int) -> float | torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def is_sampling(self, t: int) -> bool:
        """Whether a draw may end at step ``t`` (a cyclical schedule's exploration phase may
        not: its draws are kept only from sampling phases)."""
        return True

    def heats(self, t: int) -> bool:
        """Whether step ``t`` runs at the sampler's temperature (else at ``T = 0``: an
        exploration or descent phase)."""
        return self.is_sampling(t)

    def updates_gibbs(self, t: int) -> bool:
        """Whether the Gibbs blocks may be updated after step ``t``."""
        return True

    def begin(self, engine: EngineView) -> None:
        """Called when the engine (re)starts its chains, with the gradient at the start."""

    def observe(self, engine: EngineView) -> None:
        """Called after every warm-up step (the engine's state is the new, accepted one)."""

    def on_divergence(self, engine: EngineView, chains: torch.Tensor) -> None:
        """Called when the chains in the ``(C,)`` mask diverged at the last step."""

    def end_warmup(self, engine: EngineView) -> None:
        """Called once, before the first step of the first kept draw."""

    def unit_step(self, engine: EngineView) -> torch.Tensor | None:
        """``(C, D)``: the step of each coordinate per unit of :meth:`step_size` -- the
        preconditioner, or pSGLD's own RMSprop diagonal -- or ``None`` (one)."""
        if self.preconditioner is not None:
            value = self.preconditioner["z"]
            return value.diagonal() if isinstance(value, DenseMetric) else value
        average = getattr(engine.state, "square_average", None)
        if average is None:
            return None
        return rmsprop_preconditioner(average["z"], engine.options.epsilon)

    def posterior_scale(self) -> torch.Tensor | None:
        """``(C, D)`` posterior standard deviations of the coordinates as the warm-up measured
        them, or ``None`` (unknown)."""
        return None

    def mixing_slowdown(self, engine: EngineView) -> torch.Tensor | None:
        """``(C, 1)``: how many times slower the sampling phase's frozen settings mix than
        those of the last quarter of warm-up, over which the thinning was measured (``None``:
        the same settings)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class ScheduleControl(StepControl):
    r"""A user-given step size: :math:`\epsilon_t = s(t)`, or :math:`s(t)/N` for a per-datum
    ``learning_rate``.

    Parameters
    ----------
    schedule:
        The schedule of :mod:`pyro_sgmcmc.inference.schedules` (or a checked callable).
    scale:
        :math:`1` for a step size, :math:`1/N` for a learning rate.
    """

    def __init__(self, schedule: StepSchedule, scale: float = 1.0) -> None:
        self.schedule = schedule
        self.scale = scale
        self._is_sampling = getattr(schedule, "is_sampling", None)

    def step_size(self, t: int) -> float:
        return float(self.schedule(t)) * self.scale

    def is_sampling(self, t: int) -> bool:
        return True if self._is_sampling is None else bool(self._is_sampling(t))


class MandtRateControl(StepControl):
    r"""Constant SGD's rate: a warm-up control, then Mandt et al.'s optimum times a multiplier.

    During warm-up the steps are those of ``warmup`` (the user's rate, or the adaptive warm-up's
    preconditioned steps). Over the second half of the warm-up draws every step also evaluates
    the gradient on a second, independent minibatch at the same position and accumulates the
    squared difference of the two (:func:`~pyro_sgmcmc.dynamics.optimal_constant_rates` turns
    its mean into the rate). From the first kept draw on the rate is fixed: one scalar
    :math:`\eta^*` per chain, or with ``diagonal`` one rate per coordinate (passed as a
    preconditioner with unit step).
    """

    def __init__(
        self,
        warmup: StepControl,
        warmup_draws: int,
        *,
        diagonal: bool,
        multiplier: float,
    ) -> None:
        self.warmup = warmup
        self.warmup_draws = warmup_draws
        self.diagonal = diagonal
        self.multiplier = multiplier
        self.square_difference: torch.Tensor | None = None
        self.count = 0
        self.rates: torch.Tensor | None = None

    @property
    def adapting(self) -> bool:
        return self.rates is None

    def step_size(self, t: int) -> float | torch.Tensor:
        if self.rates is None:
            return self.warmup.step_size(t)
        return 1.0 if self.diagonal else self.rates

    def is_sampling(self, t: int) -> bool:
        return self.rates is not None or self.warmup.is_sampling(t)

    def heats(self, t: int) -> bool:
        return True

    @property
    def preconditioner(self) -> dict[str, torch.Tensor] | None:
        if self.rates is None:
            return self.warmup.preconditioner
        return {"z": self.rates} if self.diagonal else None

    def updates_gibbs(self, t: int) -> bool:
        return self.rates is not None or self.warmup.updates_gibbs(t)

    def posterior_scale(self) -> torch.Tensor | None:
        return self.warmup.posterior_scale()

    def begin(self, engine: EngineView) -> None:
        self.warmup.begin(engine)

    def warmup_report(self, chain_ids: list[int]) -> list[str]:
        """The warm-up control's report (chains still on their way), if it makes one."""
        return list(getattr(self.warmup, "warmup_report", lambda _: [])(chain_ids))

    def observe(self, engine: EngineView) -> None:
        self.warmup.observe(engine)
        if engine.draws_done < self.warmup_draws // 2:
            return
        other = engine.probe_gradient()
        difference = (engine.grad - other).square_()
        if self.square_difference is None:
            self.square_difference = difference
        else:
            self.square_difference += difference
        self.count += 1

    def on_divergence(self, engine: EngineView, chains: torch.Tensor) -> None:
        if self.rates is None:
            self.warmup.on_divergence(engine, chains)

    def end_warmup(self, engine: EngineView) -> None:
        if self.square_difference is None or not bool((self.square_difference.sum(1) > 0).all()):
            raise ValueError(
                "ConstantSGD(optimal_rate=True) measured no minibatch gradient noise during "
                "warm-up (all minibatches gave the same gradient), so the optimal rate is "
                "undefined: pass optimal_rate=False or a smaller batch_size"
            )
        mean = {"z": self.square_difference / self.count}
        rates = optimal_constant_rates(mean, engine.num_data, diagonal=self.diagonal, batch_ndim=1)
        self.rates = self._stable(self.multiplier * (rates["z"] if self.diagonal else rates))

    def _stable(self, rates: torch.Tensor) -> torch.Tensor:
        """Clip the rates to half of SGD's stability limit :math:`2 / H_{kk}`, where the adaptive
        warm-up measured the curvature :math:`H_{kk}` (Mandt et al.'s optimum assumes gradient
        noise proportional to the curvature; where it is not -- a stiff coordinate with little
        noise, such as a noise scale -- the unclipped rate makes SGD oscillate and diverge)."""
        curvature = getattr(self.warmup, "curvature", None)
        if curvature is None:
            return rates
        limit = 1.0 / curvature.clamp_min(torch.finfo(curvature.dtype).tiny)
        if not self.diagonal:
            limit = limit.amin(1).reshape(rates.shape)
        return torch.minimum(rates, limit.to(rates))

    def state_dict(self) -> dict[str, Any]:
        square = self.square_difference
        return {
            "warmup": self.warmup.state_dict(),
            "square_difference": None if square is None else square.clone(),
            "count": self.count,
            "rates": self.rates,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.warmup.load_state_dict(state["warmup"])
        square = state["square_difference"]
        self.square_difference = None if square is None else square.clone()
        self.count = state["count"]
        self.rates = state["rates"]
