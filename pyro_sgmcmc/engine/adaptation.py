r"""The tuning-free warm-up: the engine adapts its step size and a diagonal preconditioner.

A kernel given neither ``step_size`` nor ``learning_rate`` runs the warm-up below, per chain,
then freezes what it learnt for the sampling phase, as NUTS does with its step size and mass
matrix.

1. **Descent** (the first half of the warm-up steps, temperature 0). RMSprop-normalised
   gradient steps (momentum steps for SGHMC: then it is Adam's update), so every coordinate
   moves by about ``lr`` per step whatever the gradient's scale; ``lr`` ramps geometrically from
   ``lr / 100`` to ``lr`` over the first 50 steps and is halved at every non-finite step, after
   which the chain restarts from its last good state. Once the ramp is done, a coordinate whose
   gradient keeps a clear slope (its running mean above half its RMS, same sign) gets up to three
   times the rate, and a heavy ball whose momentum climbs such a slope stops (delta-bar-delta and
   adaptive restart): a noise scale started ten times too large reaches its mode within the
   descent. No initial point -- uniform, a prior draw, a MAP fit -- can make the first steps
   explode. Over the descent's last fifth (40-50% of the warm-up) each chain's positions are
   averaged, and the chain starts the windows from that average (iterate averaging: Polyak and
   Juditsky 1992; SWA, Izmailov et al. 2018): at a constant rate the descent ends anywhere in
   its noise ball, possibly with a row far out in the inputs badly fitted, whose pull the
   sampling steps that follow cannot absorb; the average lies near the ball's centre. Gibbs
   updates start at a quarter of the warm-up. A centred hierarchical model has no mode to
   descend to; where the descent runs into its funnel, the warm-up starts again with a descent
   of 200 steps (:mod:`~pyro_sgmcmc.engine.hierarchy`).
2. **Measurement.** From 35% of the warm-up on, every ``probe_every`` steps two extra gradients
   are evaluated at the current position :math:`z`: one on an independent minibatch, which gives
   the minibatch gradient's variance, :math:`\hat V_i = \tfrac12 (g_S - g_{S'})_i^2`, and one on
   the *same* minibatch at :math:`z + \epsilon \odot \delta` with Rademacher :math:`\delta`,
   which gives the Hessian's diagonal (Hutchinson's estimator, in absolute value),
   :math:`\hat H_{ii} = |\delta_i (g_S(z + \epsilon\odot\delta) - g_S(z))_i| / \epsilon_i`,
   bounded below by the empirical Fisher :math:`\hat V_i B / N`.
3. **Adaptation windows** (50-60%, 60-75% and 75-100% of the warm-up, temperature :math:`T`).
   The chain samples with the constant per-coordinate step :math:`e_i = h P_i` measured in the
   previous windows,

   .. math::

       e_i = \min\Big(\frac{c_H}{\hat H_{ii}},\; \frac{c_V\, b\, T}{\hat V_i}\Big),

   with :math:`b = 1` (SGHMC: its friction :math:`\alpha`), capped at four times the median of
   its site's coordinates that the data reach (those with gradient noise). For a Gaussian
   coordinate with curvature :math:`H_i` and gradient noise :math:`V_i`, one Langevin step
   inflates the stationary variance by a factor :math:`1 + e_i H_i/2` (discretisation) and
   :math:`1 + e_i V_i / (2 b T)` (gradient noise), so both biases are bounded in every
   coordinate, whatever the scales of the model, the data size and the batch size. A window
   with a divergence halves :math:`h` (and its measurements are
   dropped: those along an unstable trajectory are not the posterior's); so does a last window whose
   configurational temperature :math:`\langle (z - \bar z)\cdot \nabla U\rangle / D`, which
   equals :math:`T` for the exact target (integration by parts), comes out far above :math:`T`
   -- the sign of a step too large for correlated directions that a diagonal step cannot see.
   A coordinate that runs away gets a ten times smaller step. A diagonal bound cannot see a
   direction in which many coordinates are coupled, so at every window end :math:`h` is also
   capped along the stiffest direction of the preconditioned Hessian, found by power iteration
   with Hessian-vector products (finite differences of the gradient),
   :math:`h \le c_\lambda / \lambda_{\max}(P^{1/2} H P^{1/2})`.
4. **Freeze.** At the end of warm-up the steps are fixed (pSGLD's RMSprop statistics too). With a
   constant preconditioner the Langevin diffusion needs no correction term (:math:`\Gamma = 0`),
   so the sampling phase targets :math:`\exp(-U/T)` up to the discretisation and gradient-noise
   biases bounded above; no Metropolis correction is made. The gradient noise is not subtracted
   from the injected noise: a diagonal estimate of a correlated noise makes that correction
   biased.

The bounds are :math:`c_H = 0.05` for SGLD and pSGLD with Euler's step (variance bias
:math:`\le 2.5\%` per coordinate), :math:`0.1` for SGHMC (BAOAB, its default, is exact on
Gaussians; Euler's SGHMC has the bias :math:`eH / (2(2 - \alpha))`, and its :math:`c_H`,
:math:`c_\lambda` are scaled by :math:`1 - \alpha/2` to hold it at :math:`c_H/4`),
:math:`c_V = 0.1`, :math:`c_\lambda = 0.2` (Euler's SGLD, pSGLD) or :math:`0.4` (SGHMC); SGLD and
pSGLD with their default, the Leimkuhler-Matthews integrator, exact on Gaussians, take
:math:`c_H = 0.5` and :math:`c_\lambda = 0.4` (:data:`LEIMKUHLER_MATTHEWS_BOUNDS`). pSGLD's
preconditioner is its own RMSprop diagonal :math:`G` (frozen with the rest), capped per coordinate:
:math:`h` is the 90th percentile over the coordinates of :math:`e_i / G_i`
(:data:`PSGLD_STEP_QUANTILE`) and each :math:`G_i` is capped at :math:`e_i / h`, so that no
coordinate steps beyond its bound (90% of them step at it) while RMSprop sets the smaller steps of
the rest. Taking the largest :math:`h` with :math:`h G_i \le e_i` in *every* coordinate instead
lets one coordinate set the step of all: RMSprop's gain is :math:`1/\lambda` for a ReLU unit
inactive on every row and too large for a stiff output weight, and on a 50-unit regression network
that gave :math:`h \approx 10^{-10}`-:math:`10^{-9}`, 40-1,300 times below the median coordinate's
:math:`e_i / G_i` (chains all but frozen).

This module is one job, the warm-up's step control (:class:`AdaptiveControl`), kept whole so
its phases read in the order they run; the dense preconditioner it may switch to lives in
:mod:`~pyro_sgmcmc.engine.dense`, the thinning it chooses in :mod:`~pyro_sgmcmc.engine.thinning`.

References
----------
T. Chen, E. B. Fox and C. Guestrin, "Stochastic gradient Hamiltonian Monte Carlo", ICML 2014.

S. Ahn, A. Korattikara and M. Welling, "Bayesian posterior sampling via stochastic gradient Fisher
scoring", ICML 2012 (a preconditioner from the gradient noise).

J. T. Springenberg, A. Klein, S. Falkner and F. Hutter, "Bayesian optimization with robust
Bayesian neural networks", NeurIPS 2016 (scale-adapted SGHMC).

M. F. Hutchinson, "A stochastic estimator of the trace of the influence matrix for Laplacian
smoothing splines", Communications in Statistics 18(3), 1989.

B. O'Donoghue and E. Candes, "Adaptive restart for accelerated gradient schemes", Foundations
of Computational Mathematics 15, 2015 (the descent's momentum restart).

R. A. Jacobs, "Increased rates of convergence through learning rate adaptation", Neural
Networks 1(4), 1988 (the descent's per-coordinate rates).

B. A. Pearlmutter, "Fast exact multiplication by the Hessian", Neural Computation 6(1), 1994
(Hessian-vector products; here by finite differences of the gradient).

M. D. Hoffman and A. Gelman, "The No-U-Turn sampler", JMLR 15, 2014 (warm-up that freezes its
adaptation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..dynamics.metric import DenseMetric
from ..dynamics.psgld import rmsprop_preconditioner
from .controls import StepControl
from .dense import DenseAdaptation, choose_friction
from .estimators import AutoControlVariate
from .fit_recovery import FitRecovery
from .hierarchy import FUNNEL_SHRINK, HIERARCHY_DESCENT_STEPS
from .view import EngineView

__all__ = ["MINIMUM_WARMUP_STEPS", "AdaptiveControl"]

#: The adaptive warm-up needs at least this many gradient steps.
MINIMUM_WARMUP_STEPS = 20
#: Movement per step and coordinate of the descent, in the parameters' units.
DESCENT_RATE = 2e-2
#: The descent's per-coordinate rate grows by ``BOOST_GROWTH`` per step (up to ``BOOST_MAX``
#: times :data:`DESCENT_RATE`) while its gradient keeps its sign, and falls back by
#: ``BOOST_DECAY`` when the sign flips (delta-bar-delta, Jacobs 1988): a coordinate far from its
#: mode -- a noise scale started ten times too large -- gets there in tens of steps.
BOOST_GROWTH, BOOST_DECAY, BOOST_MAX = 1.1, 0.7, 3.0
#: ... while the running mean of its gradient exceeds this fraction of its RMS.
BOOST_SIGNAL = 0.5
#: Per rule, the bound :math:`c_H` on :math:`e_i H_{ii}` for the per-coordinate step
#: :math:`e_i = h P_i` (SGLD's variance bias is :math:`e H / 2`, Euler's SGHMC's
#: :math:`e H / (2(2 - \alpha))`, BAOAB's none on a Gaussian).
CURVATURE_BOUND = {"sgld": 0.05, "psgld": 0.05, "sghmc": 0.1}
#: The bound :math:`c_V` on the gradient noise's share :math:`e_i V_i / (b T)` of the injected
#: noise (:math:`b = 1`, or SGHMC's friction :math:`\alpha`): for sampling, and (larger) for
#: the first adaptation windows, whose only job is to reach the typical set quickly.
NOISE_BOUND, BURN_IN_NOISE_BOUND = 0.1, 0.1
#: A coordinate's step is at most this multiple of the median step of its site (over the
#: coordinates whose gradient noise exceeds ``UNREACHED`` times the site's largest).
SITE_CAP, UNREACHED = 4.0, 1e-6
#: Fractions of the warm-up: Gibbs updates start, measurements start, the descent's positions
#: are averaged from, the descent ends, windows end, and the last window (sampling settings)
#: starts.
SCHEDULE = {
    "gibbs": 0.25, "probe": 0.35, "average": 0.4, "descent": 0.5, "windows": (0.6, 0.75),
    "last": 0.75,
}  # fmt: skip
#: Per rule, the bound on :math:`h\,\lambda_{\max}(P^{1/2} H P^{1/2})`, the largest curvature
#: of the preconditioned Hessian (power iteration): the diagonal bound :data:`CURVATURE_BOUND`
#: holds per coordinate, but where many coordinates are coupled (the weights of one layer of a
#: network) the stiffest direction is up to :math:`\sqrt{D}` times stiffer than any diagonal
#: entry says, and a step within the diagonal bound runs hot or unstable along it.
STABILITY_BOUND = {"sgld": 0.2, "psgld": 0.2, "sghmc": 0.4}
#: :data:`CURVATURE_BOUND` and :data:`STABILITY_BOUND` of SGLD and pSGLD with the
#: Leimkuhler-Matthews integrator, whose Gaussian variance is exact for :math:`eH < 2`: the
#: bias left is that of the gradient noise, :math:`e^2 V / (2(2 - eH))`, at most
#: :math:`c_V c_H / (2(2 - c_H)) = 1.7\%` of the variance where both bounds bind. The
#: stiffest direction stays five times inside its stability limit
#: :math:`h \lambda_{\max} < 2`: at 0.8 the sinusoid network's chains, whose curvature
#: changes as they move, flagged runaway moves (6 in 4 x 50,000 sampling steps; 1 at 0.4).
LEIMKUHLER_MATTHEWS_BOUNDS = (0.5, 0.4)
#: pSGLD's :math:`h` is this quantile over the coordinates of :math:`e_i / G_i` (the bound of
#: each coordinate over its RMSprop gain); the gains of the coordinates above it are capped.
PSGLD_STEP_QUANTILE = 0.9
#: SGHMC's friction, from the first adaptation window on, for a network on full-batch
#: gradients when the user gave none. With no minibatch noise the friction only sets the
#: damping, and a network's posterior is mostly directions far flatter than its coordinates'
#: curvature (on the demo's sinusoid network the median of the spectrum of
#: :math:`hP^{1/2}HP^{1/2}` is :math:`2\cdot10^{-4}`), which SGHMC damps critically at
#: :math:`\alpha = 2\sqrt{h\lambda}`: 0.02 for :math:`h\lambda = 10^{-4}`, where the default
#: 0.05 overdamps them (2.6 times the median ESS of the outputs on that network, seeds 0-5).
#: Where the minibatch noise bounds the step, the step shrinks with the friction; networks on
#: minibatches keep the default until measured there.
FULL_BATCH_NETWORK_FRICTION = 0.02
#: Hessian-vector products per window end (the vector is kept from window to window).
POWER_ITERATIONS = 8
#: A power iteration whose late Rayleigh quotients average less than this fraction of its
#: largest one has collapsed (see :func:`_power_iteration`).
COLLAPSE = 0.1
#: Relative size of the finite-difference perturbation (of a posterior standard deviation).
PERTURBATION = 0.05
#: With ``control_variate="auto"``, a chain samples with the control-variate gradient when its
#: noise lets the per-coordinate steps grow this many times (geometric mean over coordinates):
#: a control-variate step evaluates the minibatch twice.
CV_GAIN = 2.0
#: A chain whose typical coordinate sits more than this many posterior standard deviations
#: from its mode over the last warm-up window (:class:`OffsetMeter`) is reported.
OFFSET_LIMIT = 5.0


def step_bounds(algorithm: str, options: Any) -> tuple[float, float]:
    r"""The rule's bounds :math:`(c_H, c_\lambda)` on :math:`e_i H_{ii}` and on
    :math:`h \lambda_{\max}`: :data:`LEIMKUHLER_MATTHEWS_BOUNDS` for SGLD and pSGLD with that
    integrator, else :data:`CURVATURE_BOUND` and :data:`STABILITY_BOUND`."""
    if getattr(options, "integrator", "euler") == "leimkuhler_matthews":
        return LEIMKUHLER_MATTHEWS_BOUNDS
    return CURVATURE_BOUND[algorithm], STABILITY_BOUND[algorithm]


def _early_phases(warmup_steps: int, descent_steps: int | None) -> tuple[int, int, int, int]:
    """The steps at which Gibbs updates start, measurements start, the descent's average starts
    and the descent ends: :data:`SCHEDULE`'s fractions of the warm-up, or, where the descent is
    cut to ``descent_steps``, the same fractions of the descent."""
    names = ("gibbs", "probe", "average", "descent")
    end = int(SCHEDULE["descent"] * warmup_steps)
    if descent_steps is None or descent_steps >= end:
        return tuple(int(SCHEDULE[name] * warmup_steps) for name in names)  # type: ignore[return-value]
    scale = descent_steps / SCHEDULE["descent"]
    return tuple(int(SCHEDULE[name] * scale) for name in names)  # type: ignore[return-value]


class AdaptiveControl(StepControl):
    """The warm-up of the module docstring, for ``C`` chains.

    Parameters
    ----------
    algorithm:
        ``"sgld"``, ``"sghmc"`` or ``"psgld"``.
    options:
        The update rule's options (SGHMC's friction, pSGLD's epsilon).
    temperature:
        :math:`T` of the sampling phases.
    num_data:
        :math:`N`.
    warmup_steps:
        Gradient steps of warm-up (``warmup_draws * num_steps_per_sample``), at least
        :data:`MINIMUM_WARMUP_STEPS`.
    like:
        A ``(C, D)`` tensor with the dtype and device of the positions.
    probe_every:
        Steps between two measurements.
    dense:
        Learn a dense preconditioner (:mod:`.dense`; SGLD and SGHMC with few coordinates).
    adapt_friction:
        Choose SGHMC's friction (the user gave none): with the dense preconditioner, or
        :data:`FULL_BATCH_NETWORK_FRICTION` for a network on full-batch gradients.
    full_batch_network:
        The model is a network (:func:`~pyro_sgmcmc.models.hidden_units.has_hidden_units`) and
        every gradient is on all rows.
    watch:
        The flat coordinates of each site whose spread another site sets (a centred
        hierarchical model's group effects, :mod:`~pyro_sgmcmc.engine.hierarchy`), or ``None``:
        the descent is checked for the funnel's neck (:meth:`ran_into_funnel`).
    """

    def __init__(
        self,
        algorithm: str,
        options: Any,
        temperature: float,
        num_data: int,
        warmup_steps: int,
        like: torch.Tensor,
        probe_every: int = 4,
        dense: bool = False,
        adapt_friction: bool = False,
        full_batch_network: bool = False,
        watch: list[torch.Tensor] | None = None,
    ) -> None:
        if warmup_steps < MINIMUM_WARMUP_STEPS:
            raise ValueError(
                f"the adaptive warm-up (no step_size or learning_rate given) needs at least "
                f"{MINIMUM_WARMUP_STEPS} warm-up gradient steps (warmup_steps x "
                f"num_steps_per_sample), got {warmup_steps}: give more warm-up draws, or a "
                "step_size"
            )
        self.algorithm, self.options = algorithm, options
        self.temperature, self.num_data = temperature, num_data
        self.probe_every = probe_every
        self.curvature_bound, self.stability_bound = step_bounds(algorithm, options)
        self.dense = DenseAdaptation(like) if dense else None
        self.adapt_friction = adapt_friction and dense and algorithm == "sghmc"
        self.low_friction = (
            adapt_friction and full_batch_network and not dense and algorithm == "sghmc"
        )
        self.metric: DenseMetric | None = None
        self.friction: torch.Tensor | None = None
        self.warmup_steps, self.watch = warmup_steps, watch
        self.planned_steps = warmup_steps  # warmup_steps grows where the warm-up is lengthened
        # the watched sites' spreads early in the descent; whether the descent was cut short
        self.watch_start: torch.Tensor | None = None
        self.cut = False
        self._set_schedule(None)
        if self.descent_end <= HIERARCHY_DESCENT_STEPS:  # no longer descent to cut short
            self.watch = None
        column = like.new_ones(like.shape[0], 1)
        self.rate = DESCENT_RATE * column
        self.step = self.curvature_bound * column
        self.window_start = self.descent_end
        self.square = torch.zeros_like(like)
        self.count = 0
        self.boost = torch.ones_like(like)
        self.trend = torch.zeros_like(like)
        self.fisher: torch.Tensor | None = None
        # pSGLD: the cap on each coordinate's RMSprop gain (see _psgld_step)
        self.gain_cap: torch.Tensor | None = None
        self.curvature_sum = torch.zeros_like(like)
        self.noise_sum = torch.zeros_like(like)
        self.probes = torch.zeros_like(column)
        self.frozen = False
        self.window_diverged = torch.zeros(like.shape[0], dtype=torch.bool)
        # the measurements as they stood when the current window began (see _end_window):
        # noise, curvature, probes, and the dense sums (None without a dense preconditioner)
        self.window_start_sums: tuple[Any, ...] | None = None
        self.offset = OffsetMeter(like)
        self.curvature: torch.Tensor | None = None
        self.direction: torch.Tensor | None = None
        # (label, flat position, fixed sites) at the end of the descent and of the first
        # windows: the fit check at the end of warm-up compares the chains' fit with them
        self.milestones: list[tuple[str, torch.Tensor, dict[str, torch.Tensor]]] = []
        # averages of each chain's potential before each milestone: chains to send back
        self.recovery = self._fit_recovery()
        # (C, D) how fast each coordinate mixed over the last window (see mixing_slowdown)
        self.last_window_rate: torch.Tensor | None = None
        # control_variate="auto": positions of the first window (the centres), then the noise
        # of both estimators over the second
        self.position_sum = torch.zeros_like(like)
        self.position_count = 0
        # the descent's positions over its last fifth (see _average_descent)
        self.descent_sum = torch.zeros_like(like)
        self.descent_count = 0
        self.pair_sum = torch.zeros(2, *like.shape, dtype=like.dtype, device=like.device)
        self.pair_count = torch.zeros_like(column)

    def _set_schedule(self, descent_steps: int | None) -> None:
        warmup_steps = self.warmup_steps
        self.gibbs_start, self.probe_start, self.average_start, self.descent_end = _early_phases(
            warmup_steps, descent_steps
        )
        self.last_window = int(SCHEDULE["last"] * warmup_steps)
        self.window_ends = [self.descent_end]
        self.window_ends += [int(f * warmup_steps) for f in SCHEDULE["windows"]]
        self.window_ends.append(warmup_steps)
        # auto control variate: positions averaged into the centre over (centre_start,
        # centre_end], both estimators measured up to choice_end, one chosen there
        self.centre_start, self.centre_end = self.descent_end, self.window_ends[1]
        self.choice_end = self.window_ends[2]

    def _fit_recovery(self) -> FitRecovery:
        chains, dimension = self.rate.shape[0], self.square.shape[1]
        return FitRecovery(
            self.window_ends, chains, dimension, self.num_data, self.temperature
        )  # fmt: skip

    # ------------------------------------------------------------------ the funnel
    def _spreads(self, engine: EngineView) -> torch.Tensor:
        """``(C, K)``: the standard deviation of each watched site's coordinates (its group
        effects' spread around their mean), per chain."""
        position = engine.position
        return torch.stack([position[:, columns].std(dim=1) for columns in self.watch], dim=1)

    def ran_into_funnel(self, engine: EngineView) -> bool:
        """Whether the descent, now at its end, shrank the spread of a watched site's
        coordinates by more than :data:`~pyro_sgmcmc.engine.hierarchy.FUNNEL_SHRINK` times
        since step :data:`~pyro_sgmcmc.engine.hierarchy.HIERARCHY_DESCENT_STEPS` in some chain:
        every group effect drawn onto the group mean, in the neck of a centred hierarchical
        model's funnel, where the joint density grows without bound. Asked at the end of every
        warm-up draw; true at most once."""
        if not self.funnel_check_due(engine):
            return False
        shrunk = self._spreads(engine) * FUNNEL_SHRINK < self.watch_start
        self.watch_start = None  # asked once
        return bool(shrunk.any())

    def funnel_check_due(self, engine: EngineView) -> bool:
        """Whether :meth:`ran_into_funnel` has its one question to answer now."""
        return self.watch_start is not None and not self.cut and engine.t >= self.descent_end

    def cut_descent(self) -> None:
        """After the engine went back to its start: descend for
        :data:`~pyro_sgmcmc.engine.hierarchy.HIERARCHY_DESCENT_STEPS` steps only (the other
        early phases at the same fractions of that descent)."""
        self.cut, self.watch_start = True, None
        self._set_schedule(HIERARCHY_DESCENT_STEPS)
        self.window_start = self.descent_end
        self.recovery = self._fit_recovery()

    # ------------------------------------------------------------------ what the engine reads
    @property
    def adapting(self) -> bool:
        return not self.frozen

    def heats(self, t: int) -> bool:
        return t >= self.descent_end

    def updates_gibbs(self, t: int) -> bool:
        # the start of the descent holds the Gibbs sites at their starting values: redrawing a
        # noise precision from the residuals of a network far from any fit would make the
        # likelihood flat and the descent stall (the "everything is noise" fixed point)
        return t >= self.gibbs_start

    def step_size(self, t: int) -> torch.Tensor:
        if t < self.descent_end:
            # 0.01 -> 1 over the first half of the descent (at most 50 steps); the exponent is
            # clamped first, so a descent of any length cannot overflow the power
            ramp_steps = max(1, min(50, self.descent_end // 2))
            ramp = 0.01 * 100 ** min(1.0, t / ramp_steps)
            return self._descent_scale() * ramp * self.rate
        if self.frozen or t - self.window_start >= 20:
            return self.step
        return self.step * 10 ** ((t - self.window_start) / 20.0 - 1.0)

    @property
    def preconditioner(self) -> dict[str, Any] | None:
        if self.metric is not None:
            return {"z": self.metric}
        if self.algorithm == "psgld":
            return None if self.gain_cap is None else {"z": self.gain_cap}
        if self.fisher is not None:
            return {"z": self.fisher}
        return {"z": self._rmsprop() * self.boost}

    def _budget(self) -> float | torch.Tensor:
        """:math:`b`: the injected variance per unit step and temperature (SGHMC: its friction,
        per chain once adapted)."""
        if self.algorithm != "sghmc":
            return 1.0
        return self.options.friction if self.friction is None else self.friction

    def _friction_factor(self) -> float | torch.Tensor:
        r"""For SGHMC with Euler's integrator :math:`1 - \alpha / 2` (per chain once its
        friction is adapted), else ``1``: the factor of :math:`c_H` and :math:`c_\lambda` that
        holds its variance bias :math:`eH / (2(2 - \alpha))` at :math:`c_H / 4` whatever its
        friction (at :math:`\alpha = 1` it is Euler's SGLD, and gets its bounds). BAOAB's
        variance is exact on a Gaussian at any friction."""
        if self.algorithm != "sghmc" or self.options.integrator != "euler":
            return 1.0
        return 1.0 - 0.5 * self._budget()

    def _curvature_limit(self) -> float | torch.Tensor:
        """:math:`c_H` times :meth:`_friction_factor`."""
        return self.curvature_bound * self._friction_factor()

    def _descent_scale(self) -> float:
        """``lr`` as a step size: RMSprop steps move each coordinate by ``step``, heavy-ball
        steps by ``step / friction``, pSGLD's steps (gradient per datum) by ``step * N``."""
        if self.algorithm == "sghmc":
            return self.options.friction
        if self.algorithm == "psgld":
            return 1.0 / self.num_data
        return 1.0

    def _rmsprop(self) -> torch.Tensor:
        """RMSprop's diagonal from the bias-corrected running mean of the squared gradient,
        with a floor of a tenth of the mean gradient scale: coordinates with gradients far
        smaller than the rest are not pushed at full speed along what is nearly flat."""
        scale = (self.square / (1.0 - 0.99 ** max(self.count, 1))).sqrt()
        return (scale + 0.1 * scale.mean(1, keepdim=True)).reciprocal()

    # ------------------------------------------------------------------ what it observes
    def begin(self, engine: EngineView) -> None:
        """Seed RMSprop's statistic with the gradient at the start (no step is ever taken
        with an empty statistic)."""
        self.offset.layout = engine.layout
        if self.count == 0:
            self.square.lerp_(engine.grad.square(), 0.01)
            self.count = 1

    def observe(self, engine: EngineView) -> None:
        t = engine.t  # steps made so far
        if self.watch is not None and not self.cut and t == HIERARCHY_DESCENT_STEPS:
            self.watch_start = self._spreads(engine)
        self.recovery.observe(t, engine.value)
        if t <= self.descent_end:
            self.square.lerp_(engine.grad.square(), 0.01)
            self.count += 1
            self._update_boost(engine, ramped=t >= 50)
        if self.average_start < t <= self.descent_end:
            self._average_descent(engine)
        if t > self.last_window:
            self.offset.add(engine.grad)
        if self.centre_start < t <= self.centre_end and _auto_control_variate(engine):
            self.position_sum += engine.position
            self.position_count += 1
        if t >= self.probe_start and t % self.probe_every == 0:
            self._probe(engine)
        if t in self.window_ends:
            if t < self.window_ends[-1]:
                self._recover_fits(engine)
                self._keep_milestone(engine)
            if t == self.choice_end:
                self._choose_control_variate(engine)
            self._end_window(engine)
            if t == self.centre_end and _auto_control_variate(engine):
                centre = self.position_sum / max(self.position_count, 1)
                engine.estimator.set_centre(centre, engine.fixed)

    def _average_descent(self, engine: EngineView) -> None:
        """Add the position to the descent's sum; at the descent's end, put every chain at its
        average (momenta at rest). A ReLU network's descent at a constant rate keeps moving
        in its noise ball, and a row far out in the inputs (45 standard deviations, where the
        network extrapolates) can sit 50-80 target standard deviations off its fit at any one
        step, a pull the windows' steps then meet once per epoch, magnified N/B times; the
        average fits it. A decaying rate would fit it too, but settles into a sharper minimum,
        whose minibatch curvature the windows' first steps cannot take."""
        self.descent_sum += engine.position
        self.descent_count += 1
        if engine.t < self.descent_end:
            return
        average = self.descent_sum / self.descent_count
        everyone = torch.ones(average.shape[0], dtype=torch.bool)
        fixed = {name: value.clone() for name, value in engine.fixed.items()}
        engine.return_to(everyone, average, fixed)

    def _recover_fits(self, engine: EngineView) -> None:
        """Put the chains whose fit collapsed since their best milestone back there
        (:mod:`.fit_recovery`). The step is not halved for it: a cascade's own divergences did
        that where they happened, and :meth:`_end_window` drops the window's measurements of a
        chain that diverged. A chain that collapsed without diverging heated up steadily: its
        steps, measured at an over-fitted mode where the likelihood is flat, were too large
        for where sampling took it (a 64-50-10 ``tanh`` network on the digits: the potential
        rose from 3,600 to 21,000 in the first window). It keeps the window's measurements,
        which shrink its steps (30-fold there); without them it went back to the same steps
        and collapsed again in the next window."""
        found = self.recovery.collapsed(engine.t)
        if found is not None:
            mask, best = found
            flat = engine.position.clone()
            fixed = {name: value.clone() for name, value in engine.fixed.items()}
            for c in mask.nonzero().flatten().tolist():
                _, position, kept = self.milestones[int(best[c])]
                flat[c] = position[c]
                for name in fixed:
                    fixed[name][c] = kept[name][c]
            engine.return_to(mask, flat, fixed)
        self.recovery.keep()

    def _keep_milestone(self, engine: EngineView) -> None:
        """Keep the chains' state at the end of the descent or of an adaptation window
        (:mod:`.fit_check`)."""
        if engine.t == self.descent_end:
            label = "the end of the descent"
        elif engine.t > self.planned_steps:
            label = f"step {engine.t:,} of the lengthened warm-up's {self.window_ends[-1]:,}"
        else:
            label = f"{100 * engine.t / self.window_ends[-1]:.0f}% of warm-up"
        fixed = {name: value.clone() for name, value in engine.fixed.items()}
        self.milestones.append((label, engine.position.clone(), fixed))

    def _update_boost(self, engine: EngineView, ramped: bool) -> None:
        """Delta-bar-delta on the descent's rates: grow where the gradient's running mean
        stands out of its noise (a consistent slope, far from the mode) and agrees in sign with
        the gradient, once the ramp is done; shrink elsewhere. A heavy ball (SGHMC) whose
        momentum climbs such a slope stops (adaptive restart, O'Donoghue and Candes 2015):
        after an overshoot, RMSprop's inflated statistic leaves the pull back too weak to turn
        the momentum round for tens of steps."""
        grad = engine.grad
        self.trend.lerp_(grad, 0.1)
        if not ramped:
            return
        rms = (self.square / (1.0 - 0.99 ** max(self.count, 1))).sqrt()
        slope = self.trend.abs() > BOOST_SIGNAL * rms
        factor = torch.where(slope & (grad * self.trend > 0), BOOST_GROWTH, BOOST_DECAY)
        self.boost = (self.boost * factor).clamp(1.0, BOOST_MAX)
        momentum = getattr(engine.state, "momentum", None)
        if momentum is not None:
            engine.rest_auxiliary(slope & (momentum["z"] * self.trend > 0))

    def _probe(self, engine: EngineView) -> None:
        """Accumulate the gradient noise and the Hessian's diagonal at the current position."""
        grad = engine.grad
        difference = None
        if engine.batches.full_batch:  # no minibatch noise: skip the second gradient
            noise = torch.zeros_like(grad)
        elif self._comparing_estimators(engine):
            difference = self._probe_both_estimators(engine)
        else:
            difference = grad - engine.probe_gradient()
        if difference is not None:
            noise = 0.5 * difference.square()
        sign = engine.rademacher()
        if self.fisher is not None:
            epsilon = PERTURBATION * (self.temperature * self.fisher).sqrt()
        else:
            epsilon = 0.1 * DESCENT_RATE * torch.ones_like(grad)
        moved = engine.gradient_on_last_rows(engine.position + epsilon * sign)
        # |delta_i (H delta)_i| averages to at least |H_ii|: coordinates coupled to others get a
        # larger (safer) estimate, uncoupled ones the exact one
        change = moved - grad
        curvature = (change / epsilon).abs()
        # a probe that lands where the model is not finite is left out (for that chain)
        finite = (torch.isfinite(noise) & torch.isfinite(curvature)).all(1, keepdim=True)
        self.noise_sum += torch.where(finite, noise, 0.0)
        self.curvature_sum += torch.where(finite, curvature, 0.0)
        self.probes = self.probes + finite.to(grad.dtype)
        if self.dense is not None:
            self.dense.add_curvature(torch.where(finite, change, 0.0), sign / epsilon)
            if difference is not None:
                self.dense.add_noise(torch.where(finite, difference, 0.0))

    def _comparing_estimators(self, engine: EngineView) -> bool:
        """Whether the second adaptation window measures both gradient estimators."""
        estimator = engine.estimator
        return (
            _auto_control_variate(engine)
            and estimator.centre is not None
            and estimator.active is None
            and self.centre_end < engine.t <= self.choice_end
        )

    def _probe_both_estimators(self, engine: EngineView) -> torch.Tensor:
        """The plain gradient's difference between two minibatches at the position (returned)
        and the noise of both estimators on them (accumulated)."""
        pair = engine.estimator.noise_pair(
            engine.position, engine.fixed, engine.rows, engine.batches.probe()
        )
        both = torch.stack(pair)
        finite = torch.isfinite(both).all(0).all(1, keepdim=True)
        both = torch.where(finite, both, 0.0)
        self.pair_sum += 0.5 * both.square()
        self.pair_count = self.pair_count + finite.to(self.pair_count.dtype)
        if self.dense is not None:
            self.dense.add_pair(both[0], both[1])
        return pair[0]

    def _choose_control_variate(self, engine: EngineView) -> None:
        r"""Turn the control variate on for the chains where it lets the steps grow
        :data:`CV_GAIN` times (geometric mean over coordinates of the ratio of the steps the
        curvature and noise bounds allow with either estimator's noise), and sample the last
        window with the noise of the estimator chosen."""
        if not (_auto_control_variate(engine) and engine.estimator.centre is not None):
            return
        if engine.estimator.active is not None or self.curvature is None:
            return
        count = self.pair_count.clamp_min(1.0)
        plain, controlled = self.pair_sum[0] / count, self.pair_sum[1] / count
        tiny = torch.finfo(plain.dtype).tiny
        budget = NOISE_BOUND * self._budget() * self.temperature
        curvature = self._curvature_limit() / self.curvature.clamp_min(tiny)
        allowed = [
            torch.minimum(curvature, budget / noise.clamp_min(tiny))
            for noise in (plain, controlled)
        ]
        gain = (allowed[1].log() - allowed[0].log()).mean(1).exp()
        chosen = (gain >= CV_GAIN) & (self.pair_count.reshape(-1) > 0)
        engine.estimator.activate(chosen.cpu())
        if not bool(chosen.any()):
            return
        rows = chosen.reshape(-1, 1)
        # the measurements of this window, with the control variate's noise, set the steps
        self.noise_sum = torch.where(rows, controlled * self.probes, self.noise_sum)
        if self.dense is not None:
            self.dense.use_control_variate(chosen, self.pair_count, self.probes)
        engine.refresh_gradient()

    def _end_window(self, engine: EngineView) -> None:
        """New preconditioner from the measurements so far; smaller steps where needed.

        A chain that diverged during the window keeps the measurements it had when the window
        began: probes taken along an unstable trajectory (a cascade of runaway moves and
        blow-ups) measure gradient noise and curvature many orders of magnitude above the
        posterior's, and a preconditioner built from them freezes the chain. A chain sent back
        without diverging keeps the window's (see :meth:`_recover_fits`)."""
        diverged = self.window_diverged.reshape(-1, 1).to(self.noise_sum.device)
        if self.window_start_sums is not None and bool(diverged.any()):
            noise, curvature, probes, dense = self.window_start_sums
            self.noise_sum = torch.where(diverged, noise, self.noise_sum)
            self.curvature_sum = torch.where(diverged, curvature, self.curvature_sum)
            self.probes = torch.where(diverged, probes, self.probes)
            if self.dense is not None and dense is not None:
                self.dense.restore(dense, diverged)
        if not bool((self.probes > 0).all()):
            return
        noise = self.noise_sum / self.probes
        # the empirical Fisher (B/N) V, the likelihood's curvature for a well-specified model,
        # bounds the curvature from below; so does a millionth of the median (flat coordinates)
        fisher = noise * (engine.batches.batch_size / engine.num_data)
        curvature = torch.maximum(self.curvature_sum / self.probes, fisher)
        floor = 1e-6 * curvature.median(1, keepdim=True).values
        curvature = torch.maximum(curvature, floor.clamp_min(torch.finfo(floor.dtype).tiny))
        self.curvature = curvature
        bound = NOISE_BOUND if engine.t >= self.last_window else BURN_IN_NOISE_BOUND
        tiny = torch.finfo(noise.dtype).tiny
        # per-coordinate step h P_i: the smaller of the curvature and the noise bounds
        if self.dense is not None:
            self._dense_metric(bound)
        else:
            allowed = torch.minimum(
                self._curvature_limit() / curvature.clamp_min(tiny),
                bound * self._budget() * self.temperature / noise.clamp_min(tiny),
            )
            allowed = self._site_cap(engine, allowed, noise)
            if self.algorithm == "psgld":
                self.step = self._psgld_step(engine, allowed)
            else:
                self.fisher = allowed / self.curvature_bound
        self._bound_stiffest_direction(engine)
        shrink = self.window_diverged.to(self.step.device)  # the masks are kept on the CPU
        if engine.t == self.window_ends[-1]:
            hot = engine.virial.too_hot(self.temperature)
            shrink = shrink if hot is None else shrink | hot.to(shrink.device)
        self.step = torch.where(shrink.reshape(-1, 1), 0.5 * self.step, self.step)
        # older measurements count half as much as those of the window just ended
        self.curvature_sum *= 0.5
        self.noise_sum *= 0.5
        self.probes *= 0.5
        if self.dense is not None:
            self.dense.decay()
        self.window_start_sums = (
            self.noise_sum.clone(), self.curvature_sum.clone(), self.probes.clone(),
            None if self.dense is None else self.dense.kept(),
        )  # fmt: skip
        self.window_diverged.zero_()
        self.window_start = engine.t
        if self.low_friction and self.friction is None:  # from the first window on
            self.friction = torch.full_like(self.step, FULL_BATCH_NETWORK_FRICTION)
        if engine.t == self.last_window:
            self.last_window_rate = self._mixing_rate(engine)
        engine.virial.reset()
        engine.rest_auxiliary()
        engine.keep_anchor()

    def _dense_metric(self, bound: float) -> None:
        """The dense preconditioner of :mod:`.dense` (and the friction, where it is chosen)."""
        base = self.dense.metric(self.probes)
        noise = self.dense.noise_curvature(base, self.probes)
        if self.adapt_friction:
            self.friction = choose_friction(
                self.curvature_bound, noise, bound, self.temperature, self.options.friction
            )
        tiny = torch.finfo(noise.dtype).tiny
        limit = bound * self._budget() * self.temperature / noise.clamp_min(tiny)
        scale = limit.clamp_max(self._curvature_limit()) / self.curvature_bound
        self.metric = DenseMetric(
            base.matrix * scale.unsqueeze(-1), base.root * scale.sqrt().unsqueeze(-1)
        )
        self.fisher = self.metric.diagonal()

    def unit_step(self, engine: EngineView) -> torch.Tensor | None:
        """The per-coordinate step per unit of :math:`h` (``(C, D)``): the preconditioner."""
        if self.algorithm != "psgld" or self.metric is not None:
            return self.fisher
        average = engine.state.square_average
        if average is None:
            return None
        gain = rmsprop_preconditioner(average["z"], self.options.epsilon)
        return gain if self.gain_cap is None else torch.minimum(gain, self.gain_cap)

    def _bound_stiffest_direction(self, engine: EngineView) -> None:
        r"""Cap :math:`h` at :math:`c_\lambda / \lambda_{\max}(P^{1/2} H P^{1/2})`.

        Power iteration with Hessian-vector products by finite differences of the gradient,
        :math:`H_S u \approx (\nabla\tilde U_S(z + \delta u) - \nabla\tilde U_S(z)) /
        \delta` with :math:`u = P^{1/2} v`, each on a fresh minibatch :math:`S`, started from
        the previous window's vector. The Rayleigh quotient :math:`v^\top H_S v` of a vector
        chosen without :math:`S` is unbiased for :math:`v^\top H v` (those of the second half
        of the iterations are averaged); on the minibatch that
        chose :math:`v` it would be biased upwards (a minibatch Hessian's largest eigenvalue
        exceeds the full data's: 2-8 times on the UCI and Fashion-MNIST networks). The cap only
        ever lowers :math:`h`; a chain whose products are not finite keeps its step.
        """
        unit = self.unit_step(engine)
        if unit is None:
            return
        if self.metric is not None:
            apply_root = self.metric.apply_root
        else:
            root = unit.sqrt()

            def apply_root(vector: torch.Tensor) -> torch.Tensor:
                return root * vector

        tiny = torch.finfo(unit.dtype).tiny
        # posterior standard deviations from the diagonal curvature, to size the perturbation
        deviation = (self.temperature / self.curvature.clamp_min(tiny)).sqrt()
        if self.direction is None:
            self.direction = engine.rademacher()
        top, self.direction = _power_iteration(
            engine, apply_root, deviation, self.direction, POWER_ITERATIONS
        )
        limit = self.stability_bound * self._friction_factor() / top.clamp_min(tiny)
        self.step = torch.where(top > 0, torch.minimum(self.step, limit), self.step)

    @staticmethod
    def _site_cap(engine: EngineView, allowed: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """At most :data:`SITE_CAP` times the median step of the site's coordinates that the
        data reach (gradient noise above :data:`UNREACHED` of the site's largest).

        A coordinate of a tensor site that looks flat at the measured points -- the weights of a
        ReLU unit that is inactive on every row, which only the prior curves -- would otherwise
        take steps thousands of times larger than its neighbours; the first step that wakes
        the unit up meets the curvature of a live one and is unstable. The median is taken
        over the coordinates the data reach because such coordinates can be most of a site: at
        the end of the descent 67-81% of each weight site of a Bayesian LeNet-5 had no gradient
        noise, and with the median over all of them those coordinates stepped 3,700 times
        further than the live ones (``fc1.weight``) and woke up in the first window.
        """
        capped = []
        for part, spread in zip(
            allowed.split(engine.layout.sizes, dim=1),
            noise.split(engine.layout.sizes, dim=1),
            strict=True,
        ):
            reached = spread > UNREACHED * spread.amax(1, keepdim=True)
            # per chain: the median over the reached coordinates (all, if none is)
            reached = reached | ~reached.any(1, keepdim=True)
            median = part.where(reached, torch.nan).nanmedian(1, keepdim=True).values
            capped.append(torch.minimum(part, SITE_CAP * median))
        return torch.cat(capped, 1)

    def _psgld_step(self, engine: EngineView, allowed: torch.Tensor) -> torch.Tensor:
        r"""pSGLD's step :math:`h`: the :data:`PSGLD_STEP_QUANTILE` quantile over the
        coordinates of :math:`e_i / G_i`, :math:`G` being pSGLD's own RMSprop diagonal (without
        the cap); sets the cap :math:`e_i / h` on :math:`G_i` (:attr:`gain_cap`), so that
        :math:`h \min(G_i, e_i / h) \le e_i` in every coordinate."""
        average = engine.state.square_average
        if average is None:
            return self.step
        gain = rmsprop_preconditioner(average["z"], self.options.epsilon)
        ratio = allowed / gain
        rank = max(1, math.ceil(PSGLD_STEP_QUANTILE * ratio.shape[1]))  # any size, unlike quantile
        step = ratio.kthvalue(rank, dim=1, keepdim=True).values
        self.gain_cap = allowed / step
        return step

    def on_divergence(self, engine: EngineView, chains: torch.Tensor) -> None:
        """A coordinate that ran away gets a ten times smaller preconditioner (its curvature was
        underestimated, or has grown: a ReLU unit that came back to life); during warm-up, a
        non-finite step halves the chain's step (down to a thousandth of its start); a jump of
        the potential alone (which a minibatch can cause) only puts the chain back, unless it
        happens on consecutive steps, which halves the step too. Only ever
        shrinking the preconditioner, a finite number of times, keeps the frozen sampler's
        constant-:math:`P` target."""
        mask = chains.reshape(-1, 1).to(self.rate.device)
        if self._retreat(engine, chains):
            return
        if engine.monitor.last_reason.startswith("a blow-up"):
            # one jump may be the minibatch's; a chain that blows up on consecutive steps has
            # too large a step (a curvature the probes did not see): during warm-up, shrink it
            again = torch.from_numpy(engine.monitor.consecutive >= 2).reshape(-1, 1)
            again = again.to(mask.device)
            mask = mask & again
            if self.frozen or not bool(mask.any()):
                return
        if self.frozen:
            self._shrink_runaway(engine)
            return
        if engine.t <= self.descent_end:
            self.rate = torch.where(mask, 0.5 * self.rate, self.rate)
            return
        shrunk = self._shrink_runaway(engine)
        if shrunk is not None:
            mask = mask & ~shrunk.reshape(-1, 1).to(mask.device)
        floor = 1e-3 * self.curvature_bound
        self.step = torch.where(mask, (0.5 * self.step).clamp_min(floor), self.step)
        self.window_diverged |= mask.reshape(-1).cpu()

    def _retreat(self, engine: EngineView, chains: torch.Tensor) -> bool:
        """Send the chains that have diverged
        :data:`~pyro_sgmcmc.engine.divergence.RETREAT_EVERY` (then twice as many, ...) steps in
        a row back to the start of the current adaptation window (the end of the descent at
        first), a state the chain reached before it drifted to where no step is stable, momenta
        at rest, with half the step; returns whether any went (the engine's own retreat to
        kept draws takes over once sampling has begun)."""
        if self.frozen or engine.t <= self.descent_end or engine.anchor is None:
            return False
        due = engine.monitor.due_for_retreat(chains)
        if not bool(due.any()):
            return False
        engine.restore_anchor(due)
        mask = due.reshape(-1, 1).to(self.step.device)
        floor = 1e-3 * self.curvature_bound
        self.step = torch.where(mask, (0.5 * self.step).clamp_min(floor), self.step)
        self.window_diverged |= due
        return True

    def _shrink_runaway(self, engine: EngineView) -> torch.Tensor | None:
        """Divide the preconditioner of the coordinates that ran away by ten (pSGLD: cap their
        RMSprop gain at a tenth of what it is); return the ``(C,)`` mask of chains that had one
        (``None`` when there is no such coordinate, or no preconditioner yet)."""
        runaway = engine.monitor.runaway
        if runaway is None:
            return None
        runaway = runaway.to(self.step.device)
        if self.metric is not None:
            factor = torch.where(runaway, 0.1**0.5, 1.0).to(self.fisher.dtype)
            self.metric = self.metric.scaled(factor)
            self.fisher = self.metric.diagonal()
        elif self.fisher is not None:
            self.fisher = torch.where(runaway, 0.1 * self.fisher, self.fisher)
        elif self.gain_cap is not None:
            self.gain_cap = torch.where(runaway, 0.1 * self.unit_step(engine), self.gain_cap)
        else:
            return None
        return runaway.any(1)

    def lengthen(self, engine: EngineView, end: int) -> int:
        """Go on warming up from here to step ``end`` with the adaptation windows once more, in
        the proportions of :data:`SCHEDULE` (a fifth of the steps, where the control variate is
        chosen automatically its centre is averaged; three tenths, both gradient estimators are
        measured and one is chosen; the last half samples with the settings measured so far,
        and the thinning is measured there). The windows measure afresh: what was measured
        before was measured on the chains' way (a non-centred hierarchical model's descent ends
        at the joint mode, far from the typical set, and a control variate centred there is
        noisier where the chains are now than the plain gradient). Called at the end of warm-up
        where the thinning's measurement was too short, or after a network's units were
        started afresh (:meth:`~pyro_sgmcmc.engine.engine.ChainEngine.draw`); returns the step
        the last window starts at."""
        start, end = engine.t, int(end)
        self.centre_start = start
        self.centre_end = start + int(0.2 * (end - start))
        self.choice_end = self.last_window = start + int(0.5 * (end - start))
        self.window_ends += [self.centre_end, self.last_window, end]
        self.recovery.set_window_ends(self.window_ends)
        self.warmup_steps = end
        # (window_start_sums keeps the sums as they were: a chain that diverges in the first
        # new window falls back on them)
        self.noise_sum.zero_()
        self.curvature_sum.zero_()
        self.probes.zero_()
        if self.dense is not None:
            self.dense.clear()
        self.offset.sum.zero_()
        self.offset.count = 0
        if _auto_control_variate(engine) and engine.estimator.active is not None:
            engine.estimator.active = None  # the plain gradient until the choice is made again
            engine.refresh_gradient()
        self.position_sum.zero_()
        self.position_count = 0
        self.pair_sum.zero_()
        self.pair_count.zero_()
        return self.last_window

    def end_warmup(self, engine: EngineView) -> None:
        if self.fisher is None and self.algorithm != "psgld":
            raise RuntimeError("the adaptive warm-up ended before its first measurement")
        self.frozen = True

    def warmup_report(self, chain_ids: list[int]) -> list[str]:
        """Chains still on their way at the end of warm-up (the draws that follow are not from
        the posterior yet): the mean gradient of the last window is many posterior standard
        deviations from zero (:class:`OffsetMeter`)."""
        labels = [label for label, _, _ in self.milestones]
        reports = self.recovery.report(labels, chain_ids)
        if self.curvature is None:
            return reports
        offsets = self.offset.site_offsets(self.curvature, self.temperature)
        for c in range(self.curvature.shape[0]):
            site, offset = max(offsets.items(), key=lambda item: float(item[1][c]))
            if float(offset[c]) > OFFSET_LIMIT:
                reports.append(
                    f"chain {chain_ids[c]} is still on its way to the posterior at the end of "
                    f"warm-up: over its last warm-up window the typical coordinate of site "
                    f"{site!r} sat {float(offset[c]):.0f} posterior standard deviations from "
                    "where its gradient vanishes, so its first draws are not from the "
                    "posterior. Give more warm-up steps (warm-up draws x num_steps_per_sample "
                    f"= {self.window_ends[-1]} now)"
                )
        return reports

    def posterior_scale(self) -> torch.Tensor | None:
        r""":math:`\sqrt{T / \hat H_{ii}}` from the curvature measured so far (``None`` before the
        first measurement)."""
        if self.curvature is None:
            return None
        tiny = torch.finfo(self.curvature.dtype).tiny
        return (self.temperature / self.curvature.clamp_min(tiny)).sqrt()

    def _mixing_rate(self, engine: EngineView) -> torch.Tensor | None:
        r"""``(C, D)``: per coordinate, the step of the overdamped Langevin dynamics the rule
        follows, :math:`e_i = h P_i` (SGHMC: :math:`e_i / \alpha`, its position moves as
        Langevin dynamics with that step; with BAOAB :math:`e_i (1 - \alpha/2) / \alpha`); a
        coordinate's autocorrelation time is inversely proportional to it."""
        unit = self.unit_step(engine)
        if unit is None:
            return None
        rate = self.step * unit
        if self.algorithm == "sghmc":
            rate = rate / self._budget()
            if self.options.integrator == "baoab":  # its position moves 1 - alpha/2 as far
                rate = rate * (1.0 - 0.5 * self._budget())
        return rate

    def mixing_slowdown(self, engine: EngineView) -> torch.Tensor | None:
        """``(C, 1)``: how many times slower the frozen settings mix than those of the last
        warm-up window, over which the thinning was measured: the largest ratio over the
        coordinates of :meth:`_mixing_rate` then and now. The last window's end re-estimates
        the preconditioner, the step and SGHMC's friction from its measurements (a control
        variate's noise grows once the chain explores the posterior, and the friction with it).
        """
        before = self.last_window_rate
        after = self._mixing_rate(engine)
        if before is None or after is None:
            return None
        tiny = torch.finfo(after.dtype).tiny
        return (before / after.clamp_min(tiny)).amax(1, keepdim=True)

    # ------------------------------------------------------------------ checkpoints
    _STATE = ("rate", "step", "window_start", "square", "count", "boost", "trend", "fisher",
              "gain_cap", "curvature", "curvature_sum", "noise_sum", "probes", "frozen",
              "window_diverged", "window_start_sums", "direction", "last_window_rate",
              "position_sum", "position_count", "pair_sum", "pair_count", "friction",
              "milestones", "descent_sum", "descent_count", "watch_start")  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        state = {
            name: value.clone() if isinstance(value, torch.Tensor) else value
            for name in self._STATE
            for value in [getattr(self, name)]
        }
        state["milestones"] = list(self.milestones)
        state["recovery"] = self.recovery.state_dict()
        state["offset"] = self.offset.state_dict()
        state["metric"] = None if self.metric is None else tuple(self.metric)
        state["dense"] = None if self.dense is None else self.dense.state_dict()
        state["cut"] = self.cut
        state["schedule"] = (
            self.warmup_steps, self.last_window, list(self.window_ends),
            (self.centre_start, self.centre_end, self.choice_end),
        )  # fmt: skip
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("cut", False) and not self.cut:  # a checkpoint after a cut descent
            self.cut_descent()
        if "schedule" in state:  # lengthened windows (absent from older checkpoints)
            self.warmup_steps, self.last_window, window_ends, phases = state["schedule"]
            self.window_ends = list(window_ends)
            self.centre_start, self.centre_end, self.choice_end = phases
            self.recovery.set_window_ends(self.window_ends)
        for name in self._STATE:
            value = state.get(name)  # last_window_rate: absent from older checkpoints
            setattr(self, name, value.clone() if isinstance(value, torch.Tensor) else value)
        self.milestones = list(state.get("milestones") or [])  # absent from older checkpoints
        self.recovery.load_state_dict(state.get("recovery"))  # likewise
        if self.descent_sum is None:  # likewise: the average starts at the resumed step
            self.descent_sum, self.descent_count = torch.zeros_like(self.position_sum), 0
        self.offset.load_state_dict(state["offset"])
        self.metric = None if state["metric"] is None else DenseMetric(*state["metric"])
        if self.dense is not None:
            self.dense.load_state_dict(state["dense"])


def _auto_control_variate(engine: EngineView) -> bool:
    return isinstance(engine.estimator, AutoControlVariate)


class OffsetMeter:
    r"""How far is a chain from its typical set? At stationarity the mean gradient vanishes
    (:math:`E[\nabla U] = 0`), and near a mode :math:`\nabla U \approx H (z - \mu)`, so the
    mean gradient over a window in posterior standard deviations,

    .. math::

        S_i = \frac{|\overline{\partial_i U}|}{\sqrt{\hat H_{ii} T}}
            \approx \frac{|\bar z_i - \mu_i|}{\sigma_i},

    is of order one or less for a chain in its typical set (slowly mixing or not) and large for
    one still on its way to it; the gradient noise adds about
    :math:`\sqrt{\hat V_i / (\hat H_{ii} T n)}` over :math:`n` steps. The median over each
    site's coordinates is reported, so one site left behind (a noise scale still far from its
    value) is seen however many coordinates the other sites have."""

    def __init__(self, like: torch.Tensor) -> None:
        self.sum = torch.zeros_like(like)
        self.count = 0
        self.layout: Any = None

    def add(self, grad: torch.Tensor) -> None:
        self.sum += grad
        self.count += 1

    def site_offsets(self, curvature: torch.Tensor, temperature: float) -> dict[str, torch.Tensor]:
        """Per site, the ``(C,)`` median :math:`S_i` over its coordinates (zeros before any
        step); a model whose sites are unknown counts as one site ``"position"``."""
        if self.count == 0:
            return {"position": self.sum.new_zeros(self.sum.shape[0])}
        scale = (curvature * temperature).sqrt().clamp_min(torch.finfo(self.sum.dtype).tiny)
        offset = (self.sum / self.count).abs() / scale
        if self.layout is None:
            return {"position": offset.median(1).values}
        parts = offset.split(self.layout.sizes, dim=1)
        return {
            name: part.median(1).values for name, part in zip(self.layout.names, parts, strict=True)
        }

    def state_dict(self) -> dict[str, Any]:
        return {"sum": self.sum.clone(), "count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sum, self.count = state["sum"].clone(), state["count"]


def _power_iteration(
    engine: EngineView,
    apply_root: Callable[[torch.Tensor], torch.Tensor],
    deviation: torch.Tensor,
    vector: torch.Tensor,
    iterations: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``(C, 1)`` estimates of :math:`\lambda_{\max}(P^{1/2} H P^{1/2})` and the vectors to
    start from next time (see :meth:`AdaptiveControl._bound_stiffest_direction`).

    The estimate is the mean Rayleigh quotient of the second half of the iterations -- unless
    that is less than :data:`COLLAPSE` times the largest quotient seen: the quotients of a power
    iteration never fall, so such a fall means the finite differences left the range where the
    gradient is linear (a ReLU network's kinks) and the iteration wandered into a flat subspace
    (units that are off, curved by the prior alone); every quotient is a lower bound of
    :math:`\lambda_{\max}`, and the largest one is then the estimate, its vector the next start.
    """
    tiny = torch.finfo(vector.dtype).tiny
    quotients, counts = torch.zeros_like(vector[:, :1]), torch.zeros_like(vector[:, :1])
    largest, best = torch.zeros_like(vector[:, :1]), vector
    for iteration in range(iterations):
        vector = vector / vector.norm(dim=1, keepdim=True).clamp_min(tiny)
        # no coordinate moves more than PERTURBATION posterior standard deviations
        rooted = apply_root(vector)
        reach = rooted.abs() / deviation
        delta = PERTURBATION / reach.amax(1, keepdim=True).clamp_min(tiny)
        base, moved = engine.gradients_around_position(delta * rooted)
        product = apply_root(moved - base) / delta
        finite = torch.isfinite(product).all(1, keepdim=True)
        quotient = torch.where(finite, (product * vector).sum(1, keepdim=True).abs(), 0.0)
        better = quotient > largest
        largest, best = torch.where(better, quotient, largest), torch.where(better, vector, best)
        if 2 * iteration >= iterations:  # average the quotients of the second half
            quotients = quotients + quotient
            counts = counts + finite.to(counts.dtype)
        vector = torch.where(finite, product, vector)
    top = quotients / counts.clamp_min(1.0)
    collapsed = top < COLLAPSE * largest
    return torch.where(collapsed, largest, top), torch.where(collapsed, best, vector)
