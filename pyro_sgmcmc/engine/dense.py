r"""The adaptive warm-up's dense preconditioner, for models with few coordinates.

A diagonal preconditioner cannot undo correlations between coordinates: with posterior
correlations whose matrix has condition number :math:`\kappa`, the stiffest direction bounds the
step and the softest one then needs :math:`\kappa` times as many steps (SGLD) to decorrelate --
the regression of Pyro's tutorial, with its intercept and uncentred inputs, has
:math:`\kappa \approx 30`. For :math:`D \le` :data:`DENSE_LIMIT` coordinates the warm-up
therefore learns a dense :math:`P` (:class:`~pyro_sgmcmc.dynamics.metric.DenseMetric`):

* **Curvature.** The warm-up's probes perturb the position by :math:`\epsilon \odot \delta` with
  Rademacher :math:`\delta` and measure :math:`u = \nabla\tilde U_S(z + \epsilon\odot\delta) -
  \nabla\tilde U_S(z) \approx H (\epsilon \odot \delta)` on one minibatch. Since
  :math:`E[\delta\delta^\top] = I`, :math:`u\, (\delta / \epsilon)^\top` is an unbiased rank-one
  estimate of the whole Hessian :math:`H` (Hutchinson's estimator, the diagonal of which the
  diagonal warm-up uses); its average over the probes of the adaptation windows is
  :math:`\bar H`, averaged over the positions the chain visited.
* **Metric.** :math:`P_0 = Q |\Lambda|^{-1} Q^\top` for :math:`\bar H = Q\Lambda Q^\top`
  (symmetrised; absolute eigenvalues, floored at :data:`EIGEN_FLOOR` of the largest), so that
  :math:`P_0^{1/2} \bar H P_0^{1/2} = I`: every direction of a Gaussian posterior has the same
  curvature.
* **Gradient noise.** The probes' second minibatch gives :math:`\tfrac12 (g_S - g_{S'})
  (g_S - g_{S'})^\top`, whose average :math:`\bar V` is the minibatch gradient's covariance; the
  noise it injects along the preconditioned directions is bounded by the largest eigenvalue
  :math:`\lambda_V` of :math:`P_0^{1/2} \bar V P_0^{1/2}`.
* **Step.** :math:`e = a P_0` with :math:`a = \min(c_H,\ c_V b T / \lambda_V)` (:math:`c_H`,
  :math:`c_V` the diagonal warm-up's bounds, :math:`b = 1` or SGHMC's friction): both biases are
  bounded in every direction, not only along the coordinates.
* **Friction** (SGHMC given no ``friction``). For a Gaussian direction of preconditioned curvature
  :math:`\lambda`, SGHMC is a damped oscillator of frequency :math:`\omega = \sqrt{a\lambda}` per
  step. Its exact stationary autocorrelations (the step is linear there) show what the friction
  trades: the integrated autocorrelation time of the position, which sets the ESS of
  means (bulk ESS), is about :math:`2\alpha/\omega^2` and grows with :math:`\alpha`, while that of
  its square, which sets the ESS of variances and tails, is smallest near
  :math:`\alpha = \omega` and grows below it; the larger of the two is smallest at
  :math:`\alpha \approx \omega`, half the continuous-time critical damping :math:`2\omega`
  (fastest only for the slowest exponential rate). For :math:`\omega^2 = 0.025` the two times
  are 12.6 and 12.1 steps at :math:`\alpha = \omega`, 25.1 and 15.1 at :math:`2\omega`, 6.3
  and 15.3 at :math:`\omega / 2`. With :math:`\lambda` between :math:`1/\kappa_r` and 1
  (:math:`\kappa_r` = :data:`RESIDUAL_CONDITION`, what an estimated metric leaves),
  :math:`\alpha_s = \sqrt{c_H/\kappa_r}` is that friction for the softest directions, the
  slowest to decorrelate.
  Where the gradient noise binds (:math:`a = c_V\alpha T / \lambda_V`) the position's
  autocorrelation time :math:`\alpha / (a\lambda)` no longer depends on :math:`\alpha`, and a
  larger friction lets the step grow: :math:`\alpha_n = c_H \lambda_V / (c_V T)` is where the
  noise bound meets the curvature bound. The friction is
  :math:`\min(1, \max(\alpha_s, \alpha_n, \alpha_0))`, with
  :math:`\alpha_0` the rule's default.

The stiffest-direction cap of the diagonal warm-up (power iteration with fresh Hessian-vector
products) applies to the dense metric as well.

References
----------
S. Ahn, A. Korattikara and M. Welling, "Bayesian posterior sampling via stochastic gradient Fisher
scoring", ICML 2012 (a dense preconditioner from the gradient noise).

M. F. Hutchinson, "A stochastic estimator of the trace of the influence matrix for Laplacian
smoothing splines", Communications in Statistics 18(3), 1989.

T. Chen, E. B. Fox and C. Guestrin, "Stochastic gradient Hamiltonian Monte Carlo", ICML 2014.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ..dynamics.metric import DenseMetric

__all__ = ["DENSE_LIMIT", "DenseAdaptation"]

#: Models with at most this many moving coordinates get a dense preconditioner.
DENSE_LIMIT = 100
#: Eigenvalues of :math:`\bar H` below this fraction of the largest are raised to it.
EIGEN_FLOOR = 1e-6
#: The condition number an estimated dense metric is assumed to leave (sets the friction).
RESIDUAL_CONDITION = 4.0


class DenseAdaptation:
    """The measurements and choices of the module docstring for ``C`` chains.

    Parameters
    ----------
    like:
        A ``(C, D)`` tensor with the dtype and device of the positions.
    """

    def __init__(self, like: torch.Tensor) -> None:
        num_chains, dimension = like.shape
        shape = (num_chains, dimension, dimension)
        self.hessian_sum = like.new_zeros(shape)
        self.noise_sum = like.new_zeros(shape)
        self.pair_sum = like.new_zeros((2, *shape))

    def add_curvature(self, difference: torch.Tensor, direction: torch.Tensor) -> None:
        r"""Add :math:`u\,(\delta/\epsilon)^\top` (rows of non-finite probes must be zero)."""
        self.hessian_sum += difference.unsqueeze(-1) * direction.unsqueeze(-2)

    def add_noise(self, difference: torch.Tensor) -> None:
        r"""Add :math:`\tfrac12 d d^\top` for the difference :math:`d = g_S - g_{S'}`."""
        self.noise_sum += 0.5 * difference.unsqueeze(-1) * difference.unsqueeze(-2)

    def add_pair(self, plain: torch.Tensor, controlled: torch.Tensor) -> None:
        """Add the noise of both gradient estimators (plain, control variate)."""
        for index, difference in enumerate((plain, controlled)):
            self.pair_sum[index] += 0.5 * difference.unsqueeze(-1) * difference.unsqueeze(-2)

    def use_control_variate(
        self, chosen: torch.Tensor, pair_count: torch.Tensor, probes: torch.Tensor
    ) -> None:
        """The noise of the chains that switch to the control variate becomes its noise (the
        average of :meth:`add_pair` over ``pair_count`` probes, counted as ``probes``)."""
        mean = self.pair_sum[1] / pair_count.clamp_min(1.0).unsqueeze(-1)
        scaled = mean * probes.unsqueeze(-1)
        self.noise_sum = torch.where(chosen.reshape(-1, 1, 1), scaled, self.noise_sum)

    def clear(self) -> None:
        """Forget every measurement (a lengthened warm-up measures afresh)."""
        for tensor in (self.hessian_sum, self.noise_sum, self.pair_sum):
            tensor.zero_()

    def decay(self) -> None:
        """Older measurements count half as much as those of the window just ended."""
        self.hessian_sum *= 0.5
        self.noise_sum *= 0.5

    def kept(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the curvature and noise sums as they stand (for :meth:`restore`)."""
        return self.hessian_sum.clone(), self.noise_sum.clone()

    def restore(self, kept: tuple[torch.Tensor, torch.Tensor], chains: torch.Tensor) -> None:
        """Put the sums of the chains of the ``(C, 1)`` mask ``chains`` back to ``kept``."""
        rows = chains.reshape(-1, 1, 1)
        self.hessian_sum = torch.where(rows, kept[0], self.hessian_sum)
        self.noise_sum = torch.where(rows, kept[1], self.noise_sum)

    def metric(self, probes: torch.Tensor) -> DenseMetric:
        r""":math:`P_0 = Q |\Lambda|^{-1} Q^\top` of the average curvature."""
        hessian = self.hessian_sum / probes.clamp_min(1.0).unsqueeze(-1)
        hessian = 0.5 * (hessian + hessian.transpose(-1, -2))
        values, vectors = torch.linalg.eigh(hessian.double())
        magnitude = values.abs()
        floor = EIGEN_FLOOR * magnitude.amax(-1, keepdim=True)
        magnitude = torch.maximum(magnitude, floor.clamp_min(torch.finfo(values.dtype).tiny))
        metric = DenseMetric.from_eigen(vectors, magnitude.reciprocal())
        dtype = hessian.dtype
        return DenseMetric(metric.matrix.to(dtype), metric.root.to(dtype))

    def noise_curvature(self, metric: DenseMetric, probes: torch.Tensor) -> torch.Tensor:
        r""":math:`\lambda_V`, the largest eigenvalue of :math:`P^{1/2} \bar V P^{1/2}`,
        ``(C, 1)``."""
        noise = self.noise_sum / probes.clamp_min(1.0).unsqueeze(-1)
        projected = metric.root @ noise @ metric.root
        projected = 0.5 * (projected + projected.transpose(-1, -2))
        return torch.linalg.eigvalsh(projected.double()).amax(-1, keepdim=True).to(noise.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {
            "hessian_sum": self.hessian_sum.clone(),
            "noise_sum": self.noise_sum.clone(),
            "pair_sum": self.pair_sum.clone(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.hessian_sum = state["hessian_sum"].clone()
        self.noise_sum = state["noise_sum"].clone()
        self.pair_sum = state["pair_sum"].clone()


def choose_friction(
    curvature_bound: float,
    noise_curvature: torch.Tensor,
    noise_bound: float,
    temperature: float,
    default: float,
) -> torch.Tensor:
    r"""SGHMC's friction per chain, ``(C, 1)`` (see the module docstring):
    :math:`\min(1, \max(\sqrt{c_H/\kappa_r},\ c_H \lambda_V / (c_V T),\ \alpha_0))`."""
    softest = math.sqrt(curvature_bound / RESIDUAL_CONDITION)
    noisy = curvature_bound * noise_curvature / (noise_bound * temperature)
    return noisy.clamp_min(max(softest, default)).clamp_max(1.0)
