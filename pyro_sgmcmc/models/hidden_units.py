"""Whether a model is a network whose hidden units can be permuted, told from its site shapes.

Such a network's weights are not identified -- two chains in modes that differ only by an
order of the hidden units disagree on every weight however long they run -- so its convergence
is judged on its outputs :math:`f(x)` (:mod:`pyro_sgmcmc.analysis.function_space`), its
thinning on them too (:mod:`pyro_sgmcmc.engine.thinning`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MIN_SQUARE_WIDTH", "has_hidden_units"]

#: The fewest hidden units that make a square weight matrix and another chained one a
#: network's layers: a hierarchical model's varying effects, a ``(groups, K)`` tensor, chain
#: with the ``(K, K)`` Cholesky factor of their correlations, and K is a few (an intercept and
#: a slope or three), while a network with a square hidden-to-hidden layer is wider.
MIN_SQUARE_WIDTH = 5


def has_hidden_units(model: Any, site_shapes: Mapping[str, Sequence[int]]) -> bool:
    """Whether ``model`` is a network whose hidden units can be permuted (then its weights are
    not identified, and its convergence is judged in function space).

    A model says so itself with a boolean attribute ``function_space`` (as
    :class:`~pyro_sgmcmc.nn.BayesianMLP` and :class:`~pyro_sgmcmc.nn.LeNet5` do); otherwise it
    is a network when two of its latent sites are weight tensors that chain as layers: a
    trailing size of one, two or more, is the other's other trailing size (the hidden width:
    ``(hidden, inputs)`` then ``(outputs, hidden)``, or transposed), as in Pyro's tutorial
    network of ``PyroModule[nn.Linear]`` layers, and not in a regression's ``(outputs,
    features)`` weight with its ``(outputs,)`` bias. Where one of the two is square, the width
    must be :data:`MIN_SQUARE_WIDTH` or more: narrower, they are a hierarchical model's varying
    effects, ``(groups, K)``, and the ``(K, K)`` Cholesky factor of their correlations, which
    are identified and judged on their parameters. An output weight ``(hidden,)`` cannot be
    told from a multi-output regression by shapes, nor varying effects from a hidden layer
    when they chain with a ``(K, L)`` matrix: set ``function_space`` where they misjudge.
    """
    flag = getattr(model, "function_space", None)
    if isinstance(flag, bool):
        return flag
    weights = [tuple(shape) for shape in site_shapes.values() if len(shape) >= 2]
    return any(
        _feeds(first, second) for i, first in enumerate(weights) for second in weights[i + 1 :]
    )


def _feeds(first: tuple[int, ...], second: tuple[int, ...]) -> bool:
    """Whether weights ``first`` and ``second`` chain as layers (see :func:`has_hidden_units`)."""
    square = first[-1] == first[-2] or second[-1] == second[-2]
    fewest = MIN_SQUARE_WIDTH if square else 2
    return fewest <= first[-2] == second[-1] or fewest <= first[-1] == second[-2]
