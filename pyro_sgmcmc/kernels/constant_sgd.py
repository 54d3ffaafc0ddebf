"""The constant-SGD kernel (SGD with a constant rate as an approximate posterior sampler)."""

from __future__ import annotations

from typing import Literal

from ..dynamics.registry import ConstantSGDOptions
from .base import StochasticGradientKernel


class ConstantSGD(StochasticGradientKernel):
    r"""SGD with a constant rate and no injected noise, read as posterior samples.

    .. math::

        \theta_{t+1} = \theta_t - H\, \nabla \tilde U(\theta_t).

    During the warm-up draws the kernel runs SGD with ``step_size`` (or ``learning_rate``) to reach
    the stationary regime and, over the second half of warm-up, estimates the minibatch gradient
    noise by drawing a second, independent minibatch at the same position. From the first kept
    draw on, the rate is fixed to Mandt et al.'s optimum times ``rate_multiplier``:

    .. math::

        \eta^* = \frac{2 B D}{N^2 \operatorname{Tr} C} \quad (\text{``scalar''}), \qquad
        H^*_{kk} = \frac{2 B}{N^2 C_{kk}} \quad (\text{``diagonal''}),

    where :math:`C` is the covariance of the per-datum gradients. With ``optimal_rate=False`` the
    warm-up rate is kept.

    **Stationary distribution.** Approximately Gaussian around a mode, with covariance set by the
    rate and the gradient noise (see :func:`pyro_sgmcmc.dynamics.sgd_step`); at the optimal rate it
    is the closest such Gaussian to the posterior's Laplace approximation, and equal to it when
    :math:`C` is proportional to the Hessian (e.g. linear regression with Gaussian inputs). It is
    a cheap, approximate method: there is no injected noise, no temperature and no correction.

    Parameters
    ----------
    optimal_rate:
        Replace the rate by the estimated optimum after warm-up (default ``True``; needs
        ``warmup_steps >= 2`` in ``MCMC``).
    preconditioner:
        ``"scalar"`` (one rate) or ``"diagonal"`` (one per coordinate, Mandt et al.'s
        preconditioned constant SGD).
    rate_multiplier:
        Multiplies the optimal rate (``> 0``; e.g. 10 to see how a too-large rate inflates the
        spread).
    **kwargs:
        The arguments of :class:`~pyro_sgmcmc.SGLD` except ``temperature`` and
        ``control_variate`` (the minibatch noise is the sampler here). ``batch_sampling``
        defaults to ``"independent"``: the theory assumes minibatch noise that is independent from
        step to step, and epoch-wise reshuffling would shrink the spread (about 4x in variance for
        20 batches an epoch on linear regression).

    References
    ----------
    S. Mandt, M. D. Hoffman and D. M. Blei, "Stochastic gradient descent as approximate Bayesian
    inference", JMLR 18, 2017.
    """

    algorithm = "constant_sgd"

    def __init__(
        self,
        model,
        step_size=None,
        *,
        optimal_rate: bool = True,
        preconditioner: Literal["scalar", "diagonal"] = "scalar",
        rate_multiplier: float = 1.0,
        **kwargs,
    ) -> None:
        if "temperature" in kwargs:
            raise ValueError("ConstantSGD has no temperature: its spread is set by the rate")
        control_variate = kwargs.setdefault("control_variate", False)
        if control_variate is not False:
            raise ValueError(
                f"ConstantSGD takes no control_variate (got {control_variate!r}; allowed: False, "
                "the default): its draws spread only as far as the minibatch gradient noise "
                "carries them, which a control variate removes (the draws would collapse onto "
                "the mode)"
            )
        options = ConstantSGDOptions(optimal_rate, preconditioner, rate_multiplier)
        kwargs.setdefault("batch_sampling", "independent")
        super().__init__(model, step_size, options=options, **kwargs)

    def diagnostics(self) -> dict:
        """The per-chain diagnostics of :class:`StochasticGradientKernel`, and
        ``optimal_rate``: the rate in use after warm-up (a float, or per site with the diagonal
        preconditioner; ``None`` before)."""
        diagnostics = super().diagnostics()
        control = None if self._chains is None else self._chains.engine.control
        rates = getattr(control, "rates", None)
        if rates is None:
            diagnostics["optimal_rate"] = None
        elif self.options.preconditioner == "diagonal":
            per_site = self._chains.engine.layout.unflatten(rates[0])
            diagnostics["optimal_rate"] = {k: v.clone() for k, v in per_site.items()}
        else:
            diagnostics["optimal_rate"] = float(rates.reshape(-1)[0])
        return diagnostics
