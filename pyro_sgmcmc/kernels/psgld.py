"""The preconditioned SGLD kernel."""

from __future__ import annotations

from ..dynamics.registry import PSGLDOptions
from ..dynamics.sgld import DEFAULT_INTEGRATOR
from .base import StochasticGradientKernel


class PSGLD(StochasticGradientKernel):
    r"""Preconditioned SGLD (RMSprop diagonal) as a ``pyro.infer.MCMC`` kernel.

    .. math::

        V_t &= \beta V_{t-1} + (1-\beta)\, \bar g_t \odot \bar g_t, \quad
        \bar g_t = \nabla \tilde U(\theta_t)/N, \qquad
        G_t = \operatorname{diag}\big(1 \oslash (\lambda + \sqrt{V_t})\big), \\
        \theta_{t+1} &= \theta_t - \epsilon_t G_t \nabla \tilde U(\theta_t)
                        + \sqrt{2 \epsilon_t T G_t}\; \tfrac12 (\xi_{t-1} + \xi_t),

    with Leimkuhler and Matthews' noise, as in :class:`~pyro_sgmcmc.SGLD` (the default;
    ``integrator="euler"`` injects :math:`\xi_t` alone, as Li et al. do).

    The drift correction :math:`\Gamma(\theta)` of the exact preconditioned diffusion is dropped,
    as in Li et al.'s experiments, so the stationary distribution is :math:`\exp(-U/T)` only up to
    a bias that vanishes as :math:`\epsilon \to 0` and :math:`\beta \to 1`. With a step size
    given, the preconditioner adapts during warm-up and sampling alike; with the adaptive
    warm-up (no step size given) it is frozen at the end of warm-up, together with
    :math:`\epsilon`, so the sampling phase needs no correction term
    (:mod:`pyro_sgmcmc.engine.adaptation`), and each entry of :math:`G` is capped so that no
    coordinate steps beyond the bounds the warm-up measured for it (one coordinate with a
    gradient near zero, whose RMSprop gain is :math:`1/\lambda`, would otherwise set
    :math:`\epsilon` for all). For a model with at most
    :data:`~pyro_sgmcmc.engine.dense.DENSE_LIMIT` coordinates the adaptive warm-up replaces
    :math:`G` by a dense metric learnt from the curvature (:mod:`pyro_sgmcmc.engine.dense`),
    which a diagonal cannot match on a correlated posterior: the sampling phase is then
    preconditioned SGLD with a constant dense :math:`G`, the same update as
    :class:`~pyro_sgmcmc.SGLD`'s.

    Parameters
    ----------
    decay:
        :math:`\beta \in [0, 1)`, the RMSprop decay (default 0.99).
    epsilon:
        :math:`\lambda > 0`, the diagonal bias (default 1e-5).
    integrator:
        ``"leimkuhler_matthews"`` (default) or ``"euler"``, as for :class:`~pyro_sgmcmc.SGLD`:
        with the preconditioner frozen after the adaptive warm-up, Leimkuhler and Matthews'
        step is exact for Gaussian targets at any stable step.
    **kwargs:
        The other arguments of :class:`~pyro_sgmcmc.SGLD`.

    References
    ----------
    C. Li, C. Chen, D. Carlson and L. Carin, "Preconditioned stochastic gradient Langevin
    dynamics for deep neural networks", AAAI 2016.

    B. Leimkuhler and C. Matthews, "Rational construction of stochastic numerical methods for
    molecular sampling", Applied Mathematics Research eXpress, 2013.
    """

    algorithm = "psgld"

    def __init__(
        self,
        model,
        step_size=None,
        *,
        decay: float = 0.99,
        epsilon: float = 1e-5,
        integrator: str = DEFAULT_INTEGRATOR,
        **kwargs,
    ) -> None:
        options = PSGLDOptions(decay, epsilon, integrator)
        super().__init__(model, step_size, options=options, **kwargs)
