r"""The chain engine: advances :math:`C \ge 1` SG-MCMC chains by one gradient step at a time.

Every sampler of the package runs through :class:`ChainEngine`: the ``pyro.infer.MCMC`` kernels
with :math:`C = 1` (one engine per chain), :func:`~pyro_sgmcmc.run_chains` with :math:`C` chains
stacked along a leading axis. A chain's path depends only on its own seed, so chain :math:`c` of
a stacked run equals the same chain run alone, draw for draw.

One step of the engine, for every chain at once:

1. the update rule of :mod:`pyro_sgmcmc.dynamics.registry` moves the state with the gradient
   :math:`g_t` carried from the previous step, the control's step size, preconditioner and
   phase, and noise drawn from each chain's generator;
2. every ``gibbs_every`` steps, the Gibbs blocks redraw their sites from their exact
   conditionals (each chain from its own generator);
3. the gradient estimator evaluates :math:`\tilde U` and :math:`\nabla \tilde U` at the new
   position on the chain's next minibatch;
4. a chain whose new potential, gradient or position is not finite, or whose potential blew up
   (:class:`~pyro_sgmcmc.engine.divergence.DivergenceMonitor`), *diverged*: it is put back to
   its last good state (momenta restart at zero) and the divergence is recorded; too many in a
   row raise :class:`~pyro_sgmcmc.SamplerDivergedError`.

So the state always holds a finite potential and gradient at its position, and no draw is ever
taken from a diverged state.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..dynamics.registry import Algorithm, SettingsMemo, StepInputs, dump_state, load_state
from ..errors import CheckpointError
from .controls import StepControl
from .divergence import RETREAT_EVERY, DivergenceMonitor
from .estimators import MinibatchGradient
from .gibbs_blocks import GibbsBlocks
from .layout import FlatLayout
from .minibatch import Minibatcher
from .noise import GaussianNoise
from .thinning import LONGEST_WARMUP, DrawCadence, ThinningMeter
from .unit_restart import Restart, UnitRestart
from .virial import VirialMeter

__all__ = ["FLAT", "ChainEngine", "DrawStats"]

#: The key of the flat ``(C, D)`` position in the dynamics states.
FLAT = "z"


@dataclass(frozen=True)
class DrawStats:
    """Statistics of one draw of every chain (arrays of shape ``(C,)``).

    Attributes
    ----------
    potential_energy:
        The minibatch potential :math:`\\tilde U` at the draw (a noisy, unbiased estimate).
    step_size:
        The step size of the draw's last step (multiplying the full-data gradient).
    temperature:
        The temperature of the chain.
    diverging:
        Whether a step of the draw diverged.
    """

    potential_energy: np.ndarray
    step_size: np.ndarray
    temperature: float
    diverging: np.ndarray


def select_chains(chains: torch.Tensor, when_true: Any, when_false: Any) -> Any:
    """Per chain, ``when_true`` where the ``(C,)`` mask is set, else ``when_false``: tensors with a
    leading chain axis, dicts and named tuples of them (other values: ``when_false``'s). A part
    that ``when_true`` does not have yet (``None``: a statistic set up by the step being undone)
    stays unset if every chain is reverted, else the new one is kept for all."""
    if when_true is None and when_false is not None:
        return None if bool(chains.all()) else when_false
    if isinstance(when_false, torch.Tensor):
        mask = chains.to(when_false.device).reshape(-1, *([1] * (when_false.dim() - 1)))
        return torch.where(mask, when_true, when_false)
    if isinstance(when_false, dict):
        return {k: select_chains(chains, when_true[k], v) for k, v in when_false.items()}
    if isinstance(when_false, tuple) and hasattr(when_false, "_fields"):
        return type(when_false)(
            *(select_chains(chains, a, b) for a, b in zip(when_true, when_false, strict=True))
        )
    return when_false


class ChainEngine:
    """Advance ``C`` chains of one update rule (see the module docstring).

    Parameters
    ----------
    algorithm, options:
        The update rule and its validated options.
    layout:
        The moving sites and their flat layout.
    estimator:
        The gradient estimator (minibatch or control variate) over the potential.
    batches:
        The per-chain minibatch sampler.
    generators:
        One ``torch.Generator`` per chain: noise, minibatches and Gibbs draws.
    control:
        Step size, phase and preconditioner per step.
    gibbs:
        The Gibbs blocks, or ``None``.
    monitor:
        Divergence bookkeeping.
    num_data:
        :math:`N`.
    temperature:
        :math:`T` of the sampling phases.
    num_steps_per_sample:
        Gradient steps per kept draw (more while the control is in an exploration phase), or
        ``None``: each chain's thinning is chosen at the end of warm-up by ``thinning_meter``.
    warmup_draws:
        Draws before the control freezes its adaptation.
    warmup_steps_per_draw:
        Gradient steps per warm-up draw (default: ``num_steps_per_sample``).
    thinning_meter:
        Measures the chains' autocorrelation during warm-up and chooses their thinning
        (:mod:`.thinning`); required when ``num_steps_per_sample`` is ``None``.
    """

    def __init__(
        self,
        *,
        algorithm: Algorithm,
        options: Any,
        layout: FlatLayout,
        estimator: MinibatchGradient,
        batches: Minibatcher,
        generators: Sequence[torch.Generator],
        control: StepControl,
        gibbs: GibbsBlocks | None,
        monitor: DivergenceMonitor,
        num_data: int,
        temperature: float,
        num_steps_per_sample: int | None,
        warmup_draws: int,
        warmup_steps_per_draw: int | None = None,
        thinning_meter: ThinningMeter | None = None,
    ) -> None:
        if num_steps_per_sample is None and thinning_meter is None:
            raise ValueError("num_steps_per_sample=None needs a thinning_meter")
        self.algorithm, self.options = algorithm, options
        self.settings_memo = SettingsMemo()  # the rule's constants while the settings hold
        self.layout = layout
        self.estimator = estimator
        self.batches = batches
        self.generators = list(generators)
        self.control = control
        self.gibbs = gibbs
        self.monitor = monitor
        self.num_data = num_data
        self.temperature = temperature
        self.num_steps_per_sample = num_steps_per_sample
        self.warmup_draws = warmup_draws
        self.warmup_steps_per_draw = warmup_steps_per_draw or num_steps_per_sample or 1
        self.thinning_meter = thinning_meter
        self.cadence: DrawCadence | None = None
        self.drawn: list[dict[str, Any]] | None = None
        self.t = 0
        self.draws_done = 0
        self.state: Any = None
        self.fixed: dict[str, torch.Tensor] = {}
        self.value: torch.Tensor | None = None
        self.grad: torch.Tensor | None = None
        self.rows: torch.Tensor | None = None
        self.virial = VirialMeter(len(self.generators))
        self.noise = GaussianNoise(self.generators)
        self.anchor: dict[str, Any] | None = None
        #: ``(chain, step)`` of every retreat to a kept draw during sampling.
        self.retreats: list[tuple[int, int]] = []
        #: The state at the start, where the control may send the warm-up back to
        #: (:meth:`_start_again_with_a_short_descent`); ``None`` where it will not.
        self.beginning: dict[str, Any] | None = None
        #: Whether the warm-up goes on past its planned end (:meth:`_lengthen_warmup`).
        self.lengthening = False
        #: Which units of a network to start afresh at the planned end of warm-up
        #: (:class:`~pyro_sgmcmc.engine.unit_restart.UnitRestart`); ``None`` for models without
        #: hidden units.
        self.unit_restart: UnitRestart | None = None
        #: Per chain, how many units were started afresh at the planned end of warm-up.
        self.restarted_units: list[int] = [0] * len(self.generators)
        #: ``time.perf_counter()`` by which the run must end (``run_chains(max_seconds=...)``),
        #: or ``None``: the warm-up is not lengthened past it.
        self.deadline: float | None = None
        #: ``(time, step)`` at this process's first draw: the pace of its steps.
        self.clock: tuple[float, int] | None = None
        #: ``any_rank(flag, what)``: whether some rank's chains want what the chains do alike
        #: (:meth:`_decide`): ``flag`` itself in one process; for chains across processes,
        #: :func:`~pyro_sgmcmc.engine.distributed.any_rank`, set by the driver.
        self.any_rank: Callable[[bool, str], bool] = _this_process
        #: The joint decisions taken so far, in order (checkpointed), and those a rank resumed
        #: behind the others takes from them instead of asking (:meth:`catch_up`).
        self.decisions: list[bool] = []
        self.to_replay: list[bool] = []
        #: Whether :attr:`decisions` are known: not after restoring a checkpoint of a version
        #: that did not record them.
        self.decisions_known = True

    # ------------------------------------------------------------------ position
    @property
    def num_chains(self) -> int:
        return len(self.generators)

    @property
    def position(self) -> torch.Tensor:
        """The flat ``(C, D)`` position of the moving sites."""
        return self.state.position[FLAT]

    def current_values(self) -> dict[str, torch.Tensor]:
        """Unconstrained values of every latent site, ``(C, ...)`` (moving and fixed sites)."""
        return {**self.layout.unflatten(self.position), **self.fixed}

    def drawn_values(self) -> dict[str, torch.Tensor]:
        """Unconstrained values of every latent site at the last draw, ``(C, ...)``: the
        current values after a warm-up draw; after a kept draw, each chain's kept state (a
        chain whose thinning is shorter than another's has stepped on since)."""
        if self.drawn is None:
            return self.current_values()
        flat = torch.stack([entry["flat"] for entry in self.drawn])
        fixed = {
            name: torch.stack([entry["fixed"][name] for entry in self.drawn]) for name in self.fixed
        }
        return {**self.layout.unflatten(flat), **fixed}

    @property
    def thinning(self) -> list[int] | None:
        """Gradient steps per kept draw of each chain (``None`` before the end of warm-up when
        the warm-up chooses them)."""
        if self.cadence is not None:
            return list(self.cadence.thinning)
        if self.num_steps_per_sample is not None:
            return [self.num_steps_per_sample] * self.num_chains
        return None

    def start(self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor]) -> None:
        """(Re)start the dynamics at ``flat`` (``(C, D)``) with auxiliary variables at rest.

        Evaluates the potential and gradient there on the chains' next minibatches.

        Raises
        ------
        ValueError
            If they are not finite for some chain (the message names chains and sites).
        """
        self.state = self.algorithm.init({FLAT: flat}, self.options)
        self.fixed = dict(fixed)
        self.estimator.refresh(self.fixed)
        self.rows = self.batches.next()
        self.value, self.grad = self.estimator(flat, self.fixed, self.rows)
        bad = self.monitor.non_finite(self.value, self.grad, flat)
        if not bool(bad.any()):
            if self.monitor.blow_up is not None and self.monitor.blow_up.count == 0:
                self.monitor.blow_up.accept(self.value)  # the level a first step is judged by
            self.control.begin(self)
            # the first start only: a kernel's restart later in the run (new params) is not
            # where a warm-up that starts again goes back to
            first = self.t == 0 and self.draws_done == 0
            if first and getattr(self.control, "watch", None) is not None:
                self.beginning = copy.deepcopy(self.state_dict())
            return
        chains = bad.nonzero().flatten().tolist()
        sites = self.layout.sites_where(~torch.isfinite(self.grad[bad]))
        raise ValueError(
            f"the starting point of chain(s) {chains} has a non-finite potential or gradient "
            f"(sites {sites or 'unknown: the potential itself'}); give other initial_params "
            "or another init_strategy"
        )

    # ------------------------------------------------------------------ stepping
    def draw(self) -> DrawStats:
        """Advance every chain by one draw: ``warmup_steps_per_draw`` steps during warm-up,
        then each chain's thinning (more while the control is in an exploration phase). The
        last warm-up draw ends the warm-up (:meth:`_end_warmup`)."""
        if self.clock is None:
            self.clock = (time.perf_counter(), self.t)
        if self.draws_done == self.warmup_draws and self.cadence is None:
            self._end_warmup()  # no warm-up, or a checkpoint written before its end was ended
        if not self.in_warmup:
            return self._kept_draw()
        stats = self._warmup_draw()
        if self.beginning is not None and self._ran_into_funnel():
            stats = self._start_again_with_a_short_descent()
        if self.draws_done == self.warmup_draws:  # the warm-up's end (lengthened, if need be)
            self._end_warmup()  # belongs to its last draw: the drivers' warm-up checks follow
        return stats

    def _decide(self, flag: bool, what: str) -> bool:
        """Whether the chains do ``what`` together: whether some chain wants it (``flag``: this
        engine's chains), here and on every other rank of a run with chains across processes,
        so that they decide as the same chains stacked in one process do. A rank resumed
        behind the others takes the decision they took (:meth:`catch_up`)."""
        if self.to_replay:
            decision = self.to_replay.pop(0)
        else:
            decision = bool(self.any_rank(bool(flag), what))
        self.decisions.append(decision)
        return decision

    def catch_up(self, every_rank: Sequence[Sequence[bool]]) -> None:
        """Take the joint decisions that other ranks (``every_rank``: each rank's
        :attr:`decisions`, after a resume) took beyond this rank's checkpoint: their
        checkpoints may have been written later than this rank's."""
        lists = [list(decisions) for decisions in every_rank] + [self.decisions]
        furthest = max(lists, key=len)
        if any(furthest[: len(other)] != other for other in lists):
            raise CheckpointError(
                "the ranks' checkpoints disagree on the warm-up's joint decisions (lengthening, "
                "starting again): they come from different runs"
            )
        self.to_replay = [bool(d) for d in furthest[len(self.decisions) :]]

    def _ran_into_funnel(self) -> bool:
        """Whether the chains' descent ran into a funnel's neck (asked once, at its end)."""
        if not self.control.funnel_check_due(self):
            return False
        wanted = self.control.ran_into_funnel(self)
        return self._decide(wanted, "agreeing whether to start the warm-up again")

    def _start_again_with_a_short_descent(self) -> DrawStats:
        """Go back to the start and warm up again, with the control's descent cut short, to
        the draw reached (:mod:`~pyro_sgmcmc.engine.hierarchy`: the descent ran into the neck
        of a centred hierarchical model's funnel). The draws are done within this call, so a
        driver that counts warm-up draws (``pyro.infer.MCMC``) sees one slower draw."""
        reached, beginning = self.draws_done, self.beginning
        decisions, to_replay = self.decisions, self.to_replay
        self.load_state_dict(beginning)
        self.beginning, self.decisions, self.to_replay = beginning, decisions, to_replay
        self.control.cut_descent()
        stats = self._warmup_draw()
        while self.draws_done < reached:
            stats = self._warmup_draw()
        return stats

    def _end_warmup(self) -> None:
        """Freeze the control's adaptation and fix each chain's thinning."""
        self._lengthen_warmup()
        self.control.end_warmup(self)
        self.virial.reset()
        thinning = self.thinning
        if thinning is None:
            thinning = self.thinning_meter.choose(self.control.mixing_slowdown(self))
        self.cadence = DrawCadence(thinning)
        self.monitor.start_draw()

    def _lengthen_warmup(self) -> None:
        """Double the warm-up, one more adaptation window at a time, while the thinning's
        measurement spans fewer than :data:`~pyro_sgmcmc.engine.thinning.RELIABLE_LENGTH`
        autocorrelation times of some chain, up to
        :data:`~pyro_sgmcmc.engine.thinning.LONGEST_WARMUP` times its planned length: a chain
        that mixes that slowly has likely not arrived yet, and the settings were measured on its
        way (a non-centred hierarchical model's descent ends at the joint mode, far from the
        typical set). Also once where, at the planned end, a network's chain holds units far
        outside their prior, which are started afresh first (:attr:`unit_restart`,
        :meth:`_restart_units`). Chains stacked in one engine go on together where any of them
        needs it. The steps are made within this call, so a driver that counts draws sees one
        slower draw. With a :attr:`deadline`, only while the new steps fit before it at the pace
        of the steps made so far."""
        meter, lengthen = self.thinning_meter, getattr(self.control, "lengthen", None)
        if lengthen is None or (meter is None and self.unit_restart is None):
            return
        longest = LONGEST_WARMUP * self.t
        restarts = []
        if self.unit_restart is not None:
            restarts = self.unit_restart(self.current_values(), self.generators)
        while 0 < 2 * self.t <= longest and self._decide(
            (meter is not None and meter.wants_longer()) or any(r.units for r in restarts),
            "agreeing whether to lengthen the warm-up",
        ):
            end = 2 * self.t
            late = not self._time_allows(end)
            if self._decide(late, "agreeing whether a longer warm-up fits the time budget"):
                break
            if any(r.units for r in restarts):
                self._restart_units(restarts)
            restarts = []
            last_window = lengthen(self, end)
            if meter is not None:
                meter.lengthen(last_window, end)
            self.lengthening = True
            try:
                while self.t < end:
                    self.step()
            finally:
                self.lengthening = False

    def _restart_units(self, restarts: Sequence[Restart]) -> None:
        """Start afresh the units of each chain's :class:`~.unit_restart.Restart`, momenta of
        those chains at rest (:meth:`return_to`), and keep the fit check from sending them back
        to where they were (:meth:`~.fit_recovery.FitRecovery.forget`); the new state is the
        anchor a chain stuck in the new windows returns to (:meth:`restore_anchor`). Sites that
        Gibbs blocks draw are left to them. Recorded in :attr:`restarted_units`."""
        values = {name: v.clone() for name, v in self.layout.unflatten(self.position).items()}
        for c, restart in enumerate(restarts):
            for name, (mask, new) in restart.values.items():
                if name in values:
                    old = values[name][c]
                    values[name][c] = torch.where(mask, new.to(old.dtype), old)
        self.restarted_units = [restart.units for restart in restarts]
        chains = torch.tensor([restart.units > 0 for restart in restarts])
        self.return_to(chains, self.layout.flatten(values), self.fixed)
        self.keep_anchor()  # a chain stuck in the new windows goes back here, not before
        recovery = getattr(self.control, "recovery", None)
        if recovery is not None:
            recovery.forget(chains)

    def _time_allows(self, end: int) -> bool:
        """Whether the steps up to ``end`` end before the :attr:`deadline` (if any) at the pace
        of this process's steps so far."""
        if self.deadline is None:
            return True
        now = time.perf_counter()
        since, step = self.clock or (now, self.t)
        pace = (now - since) / max(self.t - step, 1)
        return now + pace * (end - self.t) <= self.deadline

    def _warmup_draw(self) -> DrawStats:
        self.monitor.start_draw()
        steps = 0
        while True:
            sampling = self.step()
            steps += 1
            if steps >= self.warmup_steps_per_draw and sampling:
                break
        self.draws_done += 1
        self.drawn = None
        return DrawStats(
            potential_energy=self.value.detach().double().cpu().numpy(),
            step_size=np.full(self.num_chains, np.nan),  # a warm-up draw's are not kept
            temperature=self.temperature,
            diverging=self.monitor.draw_diverged.cpu().numpy().copy(),
        )

    def _kept_draw(self) -> DrawStats:
        cadence = self.cadence
        while not cadence.ready:
            sampling = self.step()
            cadence.after_step(self, sampling)
        self.drawn = cadence.pop()
        self.draws_done += 1
        return DrawStats(
            potential_energy=torch.stack([entry["value"] for entry in self.drawn])
            .detach()
            .double()
            .cpu()
            .numpy(),
            step_size=np.array([entry["step_size"] for entry in self.drawn]),
            temperature=self.temperature,
            diverging=np.array([entry["diverged"] for entry in self.drawn], dtype=bool),
        )

    def _inputs(self, t: int, temperature: float) -> StepInputs:
        control = self.control
        step_size, preconditioner = control.step_size(t), control.preconditioner
        variance, friction = control.gradient_variance, control.friction
        return StepInputs(
            step_size=step_size,
            temperature=temperature,
            draw_noise=self.draw_noise,
            num_data=self.num_data,
            step=t + 1,
            preconditioner=preconditioner,
            gradient_variance=variance,
            adapting=control.adapting,
            friction=friction,
            memo=self.settings_memo.for_settings(
                step_size, temperature, preconditioner, variance, friction
            ),
        )

    def step(self) -> bool:
        """One gradient step of every chain; returns whether it was in a sampling phase."""
        t = self.t
        sampling = self.control.is_sampling(t)
        temperature = self.temperature if self.control.heats(t) else 0.0
        inputs = self._inputs(t, temperature)
        new_state = self.algorithm.step(self.state, {FLAT: self.grad}, inputs, self.options)
        self.t += 1
        fixed = self.fixed
        position = new_state.position[FLAT]
        rows = self.batches.next()
        value, grad = self.estimator(position, fixed, rows)
        variance = self.algorithm.move_variance(self.state, inputs, self.options)
        bad = self.monitor.check(
            value, grad, position, self.t, self.in_warmup,
            position - self.position, None if variance is None else variance[FLAT],
            confirm=lambda: self._same_rows_rise(position, fixed),
        )  # fmt: skip
        if bad is None:
            self.state, self.value, self.grad, self.rows = new_state, value, grad, rows
        else:
            self._revert(bad, new_state, value, grad, rows)
        if self.gibbs is not None and self.gibbs.due(self.t) and self.control.updates_gibbs(t):
            self._gibbs_update()
        if temperature > 0:
            self.virial.update(self.position, self.grad)
        if self.in_warmup:
            self.control.observe(self)
            if self.thinning_meter is not None:
                self.thinning_meter.observe(self)
        return sampling

    def _gibbs_update(self) -> None:
        """Redraw the Gibbs blocks from their exact conditionals at the chains' (accepted)
        positions, and the potential and gradient there on the same rows.

        The step is judged before: a move that blew up is put back first, not hidden behind the
        conditional draw it would cause (a noise precision drawn near zero from huge residuals
        makes a blown-up network look like a quiet one). A conditional draw is exact, so the
        potential's running level restarts at the new value."""
        fixed = self.gibbs(self.position, self.fixed)
        self.estimator.refresh(fixed)
        value, grad = self.estimator(self.position, fixed, self.rows)
        bad = self.monitor.non_finite(value, grad, self.position)
        if bool(bad.any()):  # keep the old draw for those chains
            value = select_chains(bad, self.value, value)
            grad = select_chains(bad, self.grad, grad)
            fixed = select_chains(bad, self.fixed, fixed)
            self.estimator.refresh(fixed)
        self.fixed, self.value, self.grad = fixed, value, grad
        blow_up = self.monitor.blow_up
        if blow_up is not None:
            blow_up.rebase()
            blow_up.accept(value)

    @property
    def in_warmup(self) -> bool:
        return self.draws_done < self.warmup_draws or self.lengthening

    def _same_rows_rise(self, position: torch.Tensor, fixed) -> torch.Tensor:
        """The rise of the potential from the current to ``position`` on the current rows."""
        value, _ = self.estimator(position, fixed, self.rows)
        return value - self.value

    def _revert(self, bad, new_state, value, grad, rows) -> None:
        """Keep the new state of the good chains; put the bad ones back, momenta at rest."""
        reset = self.algorithm.reset(self.state, bad.to(self.position.device))
        self.state = select_chains(bad, reset, new_state)
        self.value = select_chains(bad, self.value, value)
        self.grad = select_chains(bad, self.grad, grad)
        if rows is not None:
            self.rows = select_chains(bad, self.rows, rows)
        self.control.on_divergence(self, bad)
        if self.cadence is not None:
            self._retreat_to_kept_draws(bad)
        self.monitor.raise_if_stuck(self.layout)

    def _retreat_to_kept_draws(self, bad: torch.Tensor) -> None:
        """Send the sampling chains of the ``(C,)`` mask ``bad`` that have diverged
        :data:`~pyro_sgmcmc.engine.divergence.RETREAT_EVERY` (then twice as many, ...) steps in
        a row back to a draw they kept before (:meth:`DrawCadence.retreat_point`), momenta at
        rest, with the same step and preconditioner (the sampler stays the one the warm-up
        froze). A growing oscillation can carry a chain, in steps each below the blow-up
        threshold, to a state from which every step diverges, where going back one step does
        not help."""
        due = self.monitor.due_for_retreat(bad).tolist()
        points = [self.cadence.retreat_point(c) if go else None for c, go in enumerate(due)]
        going = [point is not None for point in points]
        if not any(going):
            return
        flat = torch.stack([p["flat"] if p else self.position[c] for c, p in enumerate(points)])
        fixed = {
            name: torch.stack([p["fixed"][name] if p else value[c] for c, p in enumerate(points)])
            for name, value in self.fixed.items()
        }
        self.return_to(torch.tensor(going), flat, fixed)
        self.retreats += [(c, self.t) for c, go in enumerate(going) if go]

    def retreat_messages(self) -> list[str]:
        """One line per chain that was sent back to a kept draw during sampling."""
        messages = []
        for c, chain_id in enumerate(self.monitor.chain_ids):
            steps = [t for chain, t in self.retreats if chain == c]
            if not steps:
                continue
            shown = ", ".join(map(str, steps[:5])) + (", ..." if len(steps) > 5 else "")
            messages.append(
                f"chain {chain_id} diverged {RETREAT_EVERY} steps in a row during sampling and "
                f"was sent back to a draw it had kept, {len(steps)} time(s) (at step(s) "
                f"{shown}): its step is too large for a part of the posterior it reached, whose "
                "curvature the step cannot follow, and which its draws may under-represent "
                "(the draws concerned are marked `diverging`); a smaller step_size or "
                "learning_rate, or NUTS, would tell"
            )
        return messages

    def keep_anchor(self) -> None:
        """Remember the current state of every chain as the place to go back to
        (:meth:`restore_anchor`); the engine never modifies a state in place, so this copies
        nothing."""
        self.anchor = {
            "state": self.state, "fixed": self.fixed, "value": self.value, "grad": self.grad,
            "rows": self.rows,
        }  # fmt: skip

    def restore_anchor(self, chains: torch.Tensor) -> None:
        """Put the chains of the ``(C,)`` mask back at the anchor, momenta at rest: for a chain
        whose last good states have drifted somewhere the dynamics cannot leave (each step
        from there diverges), going back one step is not enough."""
        anchor = self.anchor
        if anchor is None:
            return
        chains = chains.to(torch.bool)
        at_rest = self.algorithm.reset(anchor["state"], chains.to(self.position.device))
        self.state = select_chains(chains, at_rest, self.state)
        fixed_changed = anchor["fixed"] is not self.fixed
        self.fixed = select_chains(chains, anchor["fixed"], self.fixed)
        self.value = select_chains(chains, anchor["value"], self.value)
        self.grad = select_chains(chains, anchor["grad"], self.grad)
        if self.rows is not None and anchor["rows"] is not None:
            self.rows = select_chains(chains, anchor["rows"], self.rows)
        if fixed_changed:
            self.estimator.refresh(self.fixed)
        if self.monitor.blow_up is not None:
            self.monitor.blow_up.rebase()  # the potential's level restarts at the next step

    def return_to(
        self, chains: torch.Tensor, flat: torch.Tensor, fixed: dict[str, torch.Tensor]
    ) -> None:
        """Put the chains of the ``(C,)`` mask at their rows of ``flat`` (``(C, D)``) and
        ``fixed``, momenta at rest, and evaluate the potential and gradient there (the others
        keep their state: their potential is evaluated again on the same rows, unchanged).

        The rule's statistics other than the momenta (pSGLD's RMSprop average, SGHMC's
        gradient-noise estimate) are kept, as after a divergence: a fresh state would rebuild
        pSGLD's preconditioner from a single minibatch gradient, whose near-zero entries give
        steps that blow the chain up."""
        chains = chains.to(device=self.position.device, dtype=torch.bool)
        moved = self.state._replace(position={FLAT: flat})
        self.state = select_chains(chains, self.algorithm.reset(moved, chains), self.state)
        self.fixed = select_chains(chains, dict(fixed), self.fixed)
        self.estimator.refresh(self.fixed)
        self.refresh_gradient()
        if self.monitor.blow_up is not None:
            self.monitor.blow_up.rebase()

    def refresh_gradient(self) -> None:
        """Evaluate the potential and gradient at the current position on the current rows
        again (after the gradient estimator changed)."""
        self.value, self.grad = self.estimator(self.position, self.fixed, self.rows)

    def draw_noise(self) -> dict[str, torch.Tensor]:
        """Standard normal draws shaped like the position, each chain from its own generator
        (in blocks of steps: :class:`~pyro_sgmcmc.engine.noise.GaussianNoise`)."""
        return {FLAT: self.noise(self.state.position[FLAT])}

    def probe_gradient(self) -> torch.Tensor:
        """The gradient at the current position on a fresh, independent minibatch per chain."""
        rows = None if self.batches.full_batch else self.batches.probe()
        _, grad = self.estimator(self.position, self.fixed, rows)
        return grad

    def gradient_on_last_rows(self, flat: torch.Tensor) -> torch.Tensor:
        """The gradient at ``flat`` on the minibatch of the current position's gradient."""
        _, grad = self.estimator(flat, self.fixed, self.rows)
        return grad

    def gradients_around_position(self, shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradients at the current position and at ``position + shift`` on one fresh
        minibatch per chain (on all rows for full-batch chains, whose gradient at the position
        is the one already known), e.g. for a Hessian-vector product."""
        if self.batches.full_batch:
            return self.grad, self.gradient_on_last_rows(self.position + shift)
        rows = self.batches.probe()
        _, base = self.estimator(self.position, self.fixed, rows)
        _, moved = self.estimator(self.position + shift, self.fixed, rows)
        return base, moved

    def rademacher(self) -> torch.Tensor:
        """Random signs shaped like the position, each chain from its own generator."""
        like = self.position
        signs = [
            torch.randint(0, 2, like.shape[1:], generator=g, device=like.device)
            for g in self.generators
        ]
        stacked = signs[0].unsqueeze(0) if len(signs) == 1 else torch.stack(signs)
        return stacked.to(like.dtype).mul_(2).sub_(1)

    def rest_auxiliary(self, where: torch.Tensor | None = None) -> None:
        """Put the auxiliary variables (momenta) at rest: every chain's (e.g. when the
        preconditioner changes), or only the entries of the ``(C, D)`` mask ``where``."""
        if where is None:
            where = torch.ones(self.num_chains, dtype=torch.bool, device=self.position.device)
        self.state = self.algorithm.reset(self.state, where)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything that determines the rest of the chains' paths (tensors are shared)."""
        return {
            "t": self.t,
            "draws_done": self.draws_done,
            "state": dump_state(self.state),
            "fixed": dict(self.fixed),
            "value": self.value,
            "grad": self.grad,
            "rows": self.rows,
            "virial": self.virial.state_dict(),
            "generators": [g.get_state() for g in self.generators],
            "noise": self.noise.state_dict(),
            "anchor": None
            if self.anchor is None
            else {
                **self.anchor,
                "state": dump_state(self.anchor["state"]),
                "fixed": dict(self.anchor["fixed"]),
            },
            "retreats": list(self.retreats),
            "batches": self.batches.state_dict(),
            "monitor": self.monitor.state_dict(),
            "control": self.control.state_dict(),
            "estimator": self.estimator.state_dict(),
            "thinning_meter": None
            if self.thinning_meter is None
            else self.thinning_meter.state_dict(),
            "cadence": None if self.cadence is None else self.cadence.state_dict(),
            "drawn": self.drawn,
            "decisions": list(self.decisions),
            "restarted_units": list(self.restarted_units),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (the engine must be built for the same run)."""
        self.t = state["t"]
        self.draws_done = state["draws_done"]
        template = self.algorithm.init({FLAT: state["value"].new_zeros(1, 1)}, self.options)
        self.state = load_state(template, state["state"])
        self.fixed = dict(state["fixed"])
        self.value, self.grad, self.rows = state["value"], state["grad"], state["rows"]
        self.virial.load_state_dict(state["virial"])
        for generator, saved in zip(self.generators, state["generators"], strict=True):
            generator.set_state(saved)
        self.noise.load_state_dict(state.get("noise", {}))
        anchor = state.get("anchor")
        if anchor is not None:
            anchor = {**anchor, "state": load_state(template, anchor["state"])}
        self.anchor = anchor
        self.retreats = [tuple(r) for r in state.get("retreats", [])]
        self.batches.load_state_dict(state["batches"])
        self.monitor.load_state_dict(state["monitor"])
        self.control.load_state_dict(state["control"])
        self.estimator.load_state_dict(state["estimator"])
        if self.thinning_meter is not None and state.get("thinning_meter") is not None:
            self.thinning_meter.load_state_dict(state["thinning_meter"])
        self.cadence = None
        if state.get("cadence") is not None:
            self.cadence = DrawCadence(state["cadence"]["thinning"])
            self.cadence.load_state_dict(state["cadence"])
        self.drawn = state.get("drawn")
        self.decisions, self.to_replay = list(state.get("decisions", [])), []
        self.decisions_known = "decisions" in state
        self.restarted_units = list(state.get("restarted_units", [0] * self.num_chains))


def _this_process(flag: bool, what: str) -> bool:
    """The decision of the chains of one process: their own."""
    return flag
