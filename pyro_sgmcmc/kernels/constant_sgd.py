"""The constant-SGD kernel (SGD with a constant rate as an approximate posterior sampler)."""

from __future__ import annotations

from typing import Literal

import torch

from .._validation import check_positive
from ..dynamics import SGDState, optimal_constant_rates, sgd_init, sgd_step
from ..potentials import potential_and_gradient
from .base import StochasticGradientKernel, TensorDict


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
        The arguments of :class:`~pyro_sgmcmc.SGLD` except ``temperature``. ``batch_sampling``
        defaults to ``"independent"``: the theory assumes minibatch noise that is independent from
        step to step, and epoch-wise reshuffling would shrink the spread (about 4x in variance for
        20 batches an epoch on linear regression).

    References
    ----------
    S. Mandt, M. D. Hoffman and D. M. Blei, "Stochastic gradient descent as approximate Bayesian
    inference", JMLR 18, 2017.
    """

    algorithm = "constant SGD"
    _config_attributes = ("optimal_rate", "preconditioner", "rate_multiplier")

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
        if preconditioner not in ("scalar", "diagonal"):
            raise ValueError(
                f"preconditioner must be 'scalar' or 'diagonal', got {preconditioner!r}"
            )
        self.optimal_rate = bool(optimal_rate)
        self.preconditioner = preconditioner
        self.rate_multiplier = check_positive("rate_multiplier", rate_multiplier)
        kwargs.setdefault("batch_sampling", "independent")
        super().__init__(model, step_size, **kwargs)

    def _reset_chain(self) -> None:
        super()._reset_chain()
        self._square_difference: TensorDict | None = None
        self._num_noise_estimates = 0
        self.optimal_rates: float | TensorDict | None = None

    def setup(self, warmup_steps: int, *args, **kwargs) -> None:
        if self.optimal_rate and warmup_steps < 2:
            raise ValueError(
                "ConstantSGD(optimal_rate=True) estimates the gradient noise during warm-up: "
                f"warmup_steps must be >= 2, got {warmup_steps}"
            )
        super().setup(warmup_steps, *args, **kwargs)
        if self.optimal_rate and self._batches.full_batch:
            raise ValueError(
                "ConstantSGD(optimal_rate=True) needs minibatches: batch_size must be < N"
            )

    def _extra_state(self) -> dict:
        # The running sum is updated in place: copy it so that a saved state stays as it was.
        square = self._square_difference
        rates = self.optimal_rates
        return {
            "square_difference": None
            if square is None
            else {k: v.clone() for k, v in square.items()},
            "num_noise_estimates": self._num_noise_estimates,
            "optimal_rates": dict(rates) if isinstance(rates, dict) else rates,
        }

    def _load_extra_state(self, extra) -> None:
        square = extra["square_difference"]
        self._square_difference = (
            None if square is None else {k: v.clone() for k, v in square.items()}
        )
        self._num_noise_estimates = extra["num_noise_estimates"]
        rates = extra["optimal_rates"]
        self.optimal_rates = dict(rates) if isinstance(rates, dict) else rates

    def _init_state(self, position: TensorDict) -> SGDState:
        return sgd_init(position)

    def _estimating(self) -> bool:
        return self.optimal_rate and self._warmup_steps // 2 <= self._num_draws < self._warmup_steps

    def _step(
        self, state: SGDState, gradient: TensorDict, step_size: float, temperature: float
    ) -> SGDState:
        if self._estimating():
            self._update_noise_estimate(state, gradient)
        if self.optimal_rate and self._num_draws >= self._warmup_steps:
            if self.optimal_rates is None:
                if not any(bool(v.sum() > 0) for v in self._square_difference.values()):
                    raise ValueError(
                        "ConstantSGD(optimal_rate=True) measured no minibatch gradient noise "
                        "during warm-up (all minibatches gave the same gradient), so the optimal "
                        "rate is undefined: pass optimal_rate=False or a smaller batch_size"
                    )
                rates = optimal_constant_rates(
                    {k: v / self._num_noise_estimates for k, v in self._square_difference.items()},
                    self.num_data,
                    diagonal=self.preconditioner == "diagonal",
                )
                if isinstance(rates, dict):
                    rates = {k: self.rate_multiplier * v for k, v in rates.items()}
                else:
                    rates = self.rate_multiplier * rates
                self.optimal_rates = rates
            step_size = self.optimal_rates
            self._last_step_size = step_size if isinstance(step_size, float) else float("nan")
        return sgd_step(state, gradient, step_size)

    def _update_noise_estimate(self, state: SGDState, gradient: TensorDict) -> None:
        """Accumulate the squared difference of two independent minibatch gradients."""
        position = {**state.position, **self._fixed}
        _, other = potential_and_gradient(
            self._potential, position, self._batches.next(), self._dynamic_sites
        )
        if self._square_difference is None:
            self._square_difference = {k: torch.zeros_like(v) for k, v in gradient.items()}
        for name, g in gradient.items():
            self._square_difference[name] += (g - other[name]).square()
        self._num_noise_estimates += 1

    def diagnostics(self) -> dict:
        diagnostics = super().diagnostics()
        rates = self.optimal_rates
        if isinstance(rates, dict):
            diagnostics["optimal_rate"] = {k: v.clone() for k, v in rates.items()}
        else:
            diagnostics["optimal_rate"] = rates
        return diagnostics
