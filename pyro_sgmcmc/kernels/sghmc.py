"""The SGHMC kernel."""

from __future__ import annotations

from typing import Literal

from ..dynamics.registry import SGHMCOptions
from ..dynamics.sghmc import DEFAULT_SGHMC_INTEGRATOR
from .base import StochasticGradientKernel

#: SGHMC's friction when none is given and the warm-up does not choose it.
DEFAULT_FRICTION = 0.05


class SGHMC(StochasticGradientKernel):
    r"""Stochastic gradient HMC with friction as a ``pyro.infer.MCMC`` kernel.

    With the default integrator, BAOAB (Leimkuhler and Matthews 2013), a step is a kick, half a
    drift, the friction with its noise, and half a drift:

    .. math::

        v' &= v_t - \eta_t \nabla \tilde U(\theta_t), \qquad
        \theta' = \theta_t + \tfrac12 v', \\
        v_{t+1} &= (1 - \alpha)\, v'
                   + \sqrt{\eta_t (\alpha (2 - \alpha) T - (2 - \alpha)^2\hat\beta / 2)_+}
                   \; \xi_t, \qquad
        \theta_{t+1} = \theta' + \tfrac12 v_{t+1}, \qquad \xi_t \sim \mathcal N(0, I),

    with :math:`\eta` = ``step_size`` (or ``learning_rate / N``), :math:`\alpha` = ``friction`` and
    :math:`\hat\beta = \eta \hat V / 2` the optional estimate of the stochastic-gradient noise.
    ``integrator="euler"`` is Chen et al.'s update, :math:`v_{t+1} = (1 - \alpha) v_t - \eta_t
    \nabla \tilde U(\theta_t) + \sqrt{2 \eta_t (\alpha T - \hat\beta)_+}\, \xi_t`,
    :math:`\theta_{t+1} = \theta_t + v_{t+1}`. Both take one gradient per step. Momenta start
    at zero and are reset to zero after a divergence.

    **Stationary distribution**: :math:`\theta \sim \exp(-U(\theta)/T)`,
    :math:`v \sim \mathcal N(0, \eta T I)` as :math:`\eta \to 0`; no Metropolis-Hastings correction.
    The friction term is what makes the stochastic-gradient dynamics sample the right distribution:
    without it (naive SGHMC) the gradient noise heats the chain up. On a Gaussian target of
    curvature :math:`\kappa` BAOAB's positions have the exact variance :math:`T/\kappa` at any
    friction and any stable step (:math:`\eta\kappa < 4`), and its error is
    :math:`O(\eta)` smaller elsewhere in the limit of high friction; Euler's variance is
    :math:`T / (\kappa (1 - \eta\kappa / (2(2 - \alpha))))`, 5% too large at
    :math:`\eta\kappa = 0.1` and :math:`\alpha = 1`. On the eight schools (non-centred,
    4 of the 8 schools per minibatch) the default warm-up's Euler chains put :math:`\tau`'s
    mean 6-10 Monte Carlo standard errors low (before its bounds were scaled for the friction;
    docs/kernels.md), BAOAB's within 2.5.

    Parameters
    ----------
    friction:
        :math:`\alpha \in (0, 1]`, the fraction of momentum lost per step (Chen et al. use
        0.01-0.1). ``friction = 1`` is SGLD: with BAOAB the Leimkuhler-Matthews SGLD of step
        size :math:`\eta / 2`, with Euler's integrator Euler's SGLD of step size :math:`\eta`.
        ``None`` (default): 0.05, except that the adaptive warm-up (no step size given)
        chooses it for models with a dense preconditioner (at most
        :data:`~pyro_sgmcmc.engine.dense.DENSE_LIMIT` coordinates): the frequency per step of
        the softest directions, which minimises the larger of the autocorrelation times of their
        position and of its square, larger where the gradient noise binds the step
        (:mod:`pyro_sgmcmc.engine.dense`), and for a network on full-batch gradients uses
        :data:`~pyro_sgmcmc.engine.adaptation.FULL_BATCH_NETWORK_FRICTION` from its first
        adaptation window on.
    gradient_noise:
        :math:`\hat\beta \ge 0` as a float (``0``, the default, ignores the gradient noise), or
        ``"estimate"`` for an element-wise running estimate :math:`\hat\beta = \eta \hat V/2`.
        The running variance of successive minibatch gradients counts the position's own
        drift as noise, so the chains inject too little noise and sample too cold (on a
        conjugate regression at 0.75-0.79 of the target temperature, sds 10-14% too small):
        the run's verdict then says ``not converged: configurational temperature ... <
        0.9 ...``.
    gradient_noise_decay:
        Decay :math:`\rho \in [0, 1)` of the running moments used by ``"estimate"``.
    resample_momentum_every:
        If given, every so many steps the momentum is refreshed,
        :math:`v \leftarrow a v + \sqrt{1 - a^2}\,\sqrt{\eta T}\,\xi`
        (:func:`~pyro_sgmcmc.dynamics.partial_momentum_refresh`), which leaves the momentum's
        stationary law :math:`\mathcal N(0, \eta T I)` invariant. The friction step is itself
        such a refresh, with persistence :math:`a = 1 - \alpha`: exactly in BAOAB (fresh
        variance :math:`\alpha(2 - \alpha) = 1 - (1-\alpha)^2`), to first order in Euler's step
        (:math:`2\alpha`); explicit refreshes add mixing on top of it. BAOAB's stored momentum
        is correlated with the position (the last half drift used it), so a refresh between
        steps perturbs its exact Gaussian variance a little (a few percent on a Gaussian).
    momentum_persistence:
        :math:`a \in [0, 1)`: ``0`` (default) draws a fresh momentum, values near 1 refresh
        partially (Horowitz).
    integrator:
        ``"baoab"`` (default) or ``"euler"`` (Chen et al.'s update), see above
        (:func:`~pyro_sgmcmc.dynamics.sghmc_step`).
    **kwargs:
        The arguments of :class:`~pyro_sgmcmc.SGLD` (``step_size`` or ``learning_rate``,
        ``batch_size``, ``num_steps_per_sample``, ``temperature``, ``seed``, ...).

    References
    ----------
    T. Chen, E. B. Fox and C. Guestrin, "Stochastic gradient Hamiltonian Monte Carlo",
    ICML 2014.

    B. Leimkuhler and C. Matthews, "Rational construction of stochastic numerical methods for
    molecular sampling", Applied Mathematics Research eXpress 2013(1), 2013 (BAOAB).
    """

    algorithm = "sghmc"

    def __init__(
        self,
        model,
        step_size=None,
        *,
        friction: float | None = None,
        gradient_noise: float | Literal["estimate"] = 0.0,
        gradient_noise_decay: float = 0.99,
        resample_momentum_every: int | None = None,
        momentum_persistence: float = 0.0,
        integrator: str = DEFAULT_SGHMC_INTEGRATOR,
        **kwargs,
    ) -> None:
        options = SGHMCOptions(
            DEFAULT_FRICTION if friction is None else friction,
            gradient_noise,
            gradient_noise_decay,
            resample_momentum_every,
            momentum_persistence,
            adapt_friction=friction is None,
            integrator=integrator,
        )
        super().__init__(model, step_size, options=options, **kwargs)
