r"""The configurational temperature of a chain: a check of its stationary distribution.

For a target :math:`\pi_T(z) \propto \exp(-U(z)/T)` and any constant :math:`c`, integrating by
parts gives

.. math::

    E_{\pi_T}\bigl[(z_i - c_i)\, \partial_i U(z)\bigr] = T \quad \text{for every coordinate } i,

so :math:`\hat T = \frac{1}{nD}\sum_t (z_t - c)\cdot \nabla \tilde U(z_t)` estimates the
temperature the chain actually samples at (the configurational temperature of molecular
dynamics). A minibatch gradient is unbiased and its noise is independent of :math:`z_t`, so the
estimate stays unbiased with minibatches. A chain that is too hot -- a step size too large for
its curvature, or gradient noise that the dynamics do not absorb -- shows :math:`\hat T > T`;
a variance inflated by a factor :math:`1 + b` shows :math:`\hat T \approx (1 + b)\,T` for a
Gaussian target, and one shrunk (too little injected noise, e.g. a gradient-noise estimate that
exceeds the gradient's noise) :math:`\hat T < T`. The standard error comes from batch means
of the per-step terms.

The meter keeps running statistics of the batch means (their number, mean, sum of squared
deviations, Welford's update, and smallest value), not the terms: its memory does not grow with
the run. (It kept every term until 2026-12-07: a tensor every 4 steps, which on Fashion-MNIST
with 1,875 steps per draw fragmented the heap to 12 GB after 900 draws.)

References
----------
O. G. Jepps, G. Ayton and D. J. Evans, "Microscopic expressions for the thermodynamic
temperature", Physical Review E 62, 2000.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["VirialMeter"]

#: A chain all of whose batch means exceed this many times the allowed temperature is too hot.
FAR_TOO_HOT = 5.0
#: The running statistics of :class:`VirialMeter` (its state besides the reference point).
_RUNNING = ("batch_sum", "batch_terms", "batches", "mean", "squares", "lowest")


def _rowwise_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(C,)`` dot products of the rows of two ``(C, D)`` tensors."""
    return torch.linalg.vecdot(a, b)


class VirialMeter:
    """Running configurational temperature of ``C`` chains.

    Parameters
    ----------
    num_chains:
        :math:`C`.
    stride:
        Measure every so many steps (the estimate stays unbiased).
    batch:
        Measurements per batch mean (for the standard error).
    """

    def __init__(self, num_chains: int, stride: int = 4, batch: int = 10) -> None:
        self.num_chains, self.stride, self.batch = num_chains, stride, batch
        self.reset()

    def reset(self) -> None:
        """Start a new measurement (the reference point is the next position seen)."""
        self.reference: torch.Tensor | None = None
        self.calls = 0
        self.batch_sum = torch.zeros(self.num_chains, dtype=torch.float64)
        self.batch_terms = 0
        self.batches = 0
        self.mean = torch.zeros(self.num_chains, dtype=torch.float64)  # of the batch means
        self.squares = torch.zeros(self.num_chains, dtype=torch.float64)  # their deviations
        self.lowest = torch.full((self.num_chains,), math.inf, dtype=torch.float64)

    def update(self, position: torch.Tensor, grad: torch.Tensor) -> None:
        """Add the term :math:`(z - c)\\cdot g / D` of every chain (every ``stride`` calls)."""
        self.calls += 1
        if self.calls % self.stride:
            return
        if self.reference is None:
            self.reference = position
        # (z - c) . g without the (C, D) difference: two dot products per chain
        term = (_rowwise_dot(position, grad) - _rowwise_dot(self.reference, grad)) / (
            position.shape[1]
        )
        self._add(term.detach().double().cpu())

    def _add(self, term: torch.Tensor) -> None:
        """Add one ``(C,)`` term to the current batch; a full batch's mean joins the running
        statistics (Welford's update)."""
        self.batch_sum += term
        self.batch_terms += 1
        if self.batch_terms < self.batch:
            return
        batch_mean = self.batch_sum / self.batch
        self.batches += 1
        deviation = batch_mean - self.mean
        self.mean += deviation / self.batches
        self.squares += deviation * (batch_mean - self.mean)
        torch.minimum(self.lowest, batch_mean, out=self.lowest)
        self.batch_sum.zero_()
        self.batch_terms = 0

    def estimate(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The ``(C,)`` configurational temperatures and their standard errors, or ``None``
        before two batches were measured."""
        if self.batches < 2:
            return None
        spread = (self.squares / (self.batches - 1)).sqrt()
        return self.mean.clone(), spread / math.sqrt(self.batches)

    def too_hot(self, temperature: float, margin: float = 0.5) -> torch.Tensor | None:
        """``(C,)`` mask of chains whose configurational temperature exceeds
        ``(1 + margin) T`` by more than four standard errors."""
        found = self.estimate()
        if found is None:
            return None
        value, error = found
        # every batch mean far above T: too hot however noisy the batch means are (a chain
        # whose oscillation grows has batch means that differ by orders of magnitude)
        far = self.lowest > FAR_TOO_HOT * (1.0 + margin) * temperature
        return (value - (1.0 + margin) * temperature > 4.0 * error) | far

    def too_cold(self, temperature: float, bound: float = 0.9) -> torch.Tensor | None:
        """``(C,)`` mask of chains whose configurational temperature is below ``bound * T``
        by more than four standard errors (too little noise for the dynamics: draws spread
        narrower than the target)."""
        found = self.estimate()
        if found is None:
            return None
        value, error = found
        return bound * temperature - value > 4.0 * error

    def state_dict(self) -> dict[str, Any]:
        """The meter's state; its tensors are copies (the meter updates its own in place)."""
        state = {"reference": self.reference, "calls": self.calls}
        for name in _RUNNING:
            value = getattr(self, name)
            state[name] = value.clone() if torch.is_tensor(value) else value
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a state of :meth:`state_dict`, or of a checkpoint written before 2026-12-07,
        which kept the terms (``values``): they are added again."""
        self.reset()
        if "values" in state:
            for term in state["values"]:
                self._add(term)
        else:
            for name in _RUNNING:
                value = state[name]
                setattr(self, name, value.clone() if torch.is_tensor(value) else value)
        self.reference = state["reference"]
        self.calls = state["calls"]
