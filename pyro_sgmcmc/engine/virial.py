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
        self.values: list[torch.Tensor] = []
        self.calls = 0

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
        self.values.append(term.detach().double().cpu())

    def estimate(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The ``(C,)`` configurational temperatures and their standard errors, or ``None``
        before two batches were measured."""
        batches = len(self.values) // self.batch
        if batches < 2:
            return None
        stacked = torch.stack(self.values[: batches * self.batch])
        means = stacked.reshape(batches, self.batch, -1).mean(1)
        return means.mean(0), means.std(0) / math.sqrt(batches)

    def too_hot(self, temperature: float, margin: float = 0.5) -> torch.Tensor | None:
        """``(C,)`` mask of chains whose configurational temperature exceeds
        ``(1 + margin) T`` by more than four standard errors."""
        found = self.estimate()
        if found is None:
            return None
        value, error = found
        batches = len(self.values) // self.batch
        means = torch.stack(self.values[: batches * self.batch]).reshape(batches, self.batch, -1)
        # every batch mean far above T: too hot however noisy the batch means are (a chain
        # whose oscillation grows has batch means that differ by orders of magnitude)
        far = (means.mean(1) > FAR_TOO_HOT * (1.0 + margin) * temperature).all(0)
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
        return {"reference": self.reference, "values": list(self.values), "calls": self.calls}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.reference = state["reference"]
        self.values = list(state["values"])
        self.calls = state["calls"]
