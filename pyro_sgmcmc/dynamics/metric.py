r"""A constant dense preconditioner for the update rules.

The rules take a preconditioner :math:`P` per site: a tensor (a diagonal :math:`P`, applied
element-wise) or a :class:`DenseMetric` (a full matrix per chain over the flat ``(C, D)``
position). Either way the update is the same Langevin discretisation,

.. math::

    \theta' = \theta - \epsilon P \nabla U + \sqrt{2 \epsilon T}\, P^{1/2} \xi,

which has :math:`\exp(-U/T)` as its stationary distribution for any constant symmetric
positive definite :math:`P` (as :math:`\epsilon \to 0`; no correction term is needed when
:math:`P` does not depend on :math:`\theta`). With :math:`P \approx (\nabla^2 U)^{-1}` every
direction of a Gaussian posterior moves at the same rate, so one step size suits all of them
however correlated the posterior is (the dense metric of Stan's HMC, ``dense_e``).

References
----------
M. Girolami and B. Calderhead, "Riemann manifold Langevin and Hamiltonian Monte Carlo methods",
JRSS B 73(2), 2011 (a constant metric is the simplest case).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["DenseMetric"]


class DenseMetric(NamedTuple):
    """A symmetric positive definite :math:`P` per chain and its symmetric square root.

    Attributes
    ----------
    matrix:
        :math:`P`, shape ``(C, D, D)``.
    root:
        :math:`P^{1/2}`, shape ``(C, D, D)``, symmetric.
    """

    matrix: torch.Tensor
    root: torch.Tensor

    @classmethod
    def from_eigen(cls, vectors: torch.Tensor, values: torch.Tensor) -> DenseMetric:
        r""":math:`P = Q \operatorname{diag}(\lambda) Q^\top` from orthonormal eigenvectors
        ``(C, D, D)`` (columns) and positive eigenvalues ``(C, D)``."""
        matrix = (vectors * values.unsqueeze(-2)) @ vectors.transpose(-1, -2)
        root = (vectors * values.sqrt().unsqueeze(-2)) @ vectors.transpose(-1, -2)
        return cls(matrix, root)

    @classmethod
    def from_matrix(cls, matrix: torch.Tensor) -> DenseMetric:
        """The metric of a symmetric positive definite ``(C, D, D)`` matrix."""
        symmetric = 0.5 * (matrix + matrix.transpose(-1, -2))
        values, vectors = torch.linalg.eigh(symmetric)
        tiny = torch.finfo(values.dtype).tiny
        return cls.from_eigen(vectors, values.clamp_min(tiny))

    def apply(self, vector: torch.Tensor) -> torch.Tensor:
        """:math:`P v` for ``(C, D)`` vectors."""
        return torch.bmm(self.matrix, vector.unsqueeze(-1)).squeeze(-1)

    def apply_root(self, vector: torch.Tensor) -> torch.Tensor:
        r""":math:`P^{1/2} v` for ``(C, D)`` vectors."""
        return torch.bmm(self.root, vector.unsqueeze(-1)).squeeze(-1)

    def diagonal(self) -> torch.Tensor:
        """The ``(C, D)`` diagonal of :math:`P`."""
        return self.matrix.diagonal(dim1=-2, dim2=-1)

    def scaled(self, factor: torch.Tensor) -> DenseMetric:
        r""":math:`S P S` with :math:`S = \operatorname{diag}(s)`, ``factor`` :math:`s` of shape
        ``(C, D)`` (still symmetric positive definite; its root is recomputed). A chain whose
        factor is all ones keeps its metric as it is, bit for bit (a decomposition and product
        would round it anew: the other chains stacked with it would change it)."""
        new = DenseMetric.from_matrix(factor.unsqueeze(-1) * self.matrix * factor.unsqueeze(-2))
        changed = (factor != 1).any(-1).reshape(-1, 1, 1)
        return DenseMetric(
            torch.where(changed, new.matrix, self.matrix), torch.where(changed, new.root, self.root)
        )
