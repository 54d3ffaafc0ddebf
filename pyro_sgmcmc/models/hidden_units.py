"""Whether a model is a network whose hidden units can be permuted, told from its site shapes.

Such a network's weights are not identified -- two chains in modes that differ only by an
order of the hidden units disagree on every weight however long they run -- so its convergence
is judged on its outputs :math:`f(x)` (:mod:`pyro_sgmcmc.analysis.function_space`), its
thinning on them too (:mod:`pyro_sgmcmc.engine.thinning`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["has_hidden_units"]


def has_hidden_units(model: Any, site_shapes: Mapping[str, Sequence[int]]) -> bool:
    """Whether ``model`` is a network whose hidden units can be permuted (then its weights are
    not identified, and its convergence is judged in function space).

    A model says so itself with a boolean attribute ``function_space`` (as
    :class:`~pyro_sgmcmc.nn.BayesianMLP` and :class:`~pyro_sgmcmc.nn.LeNet5` do); otherwise it
    is a network when two of its latent sites are weight tensors that chain as layers: a
    trailing size of one, two or more, is the other's other trailing size (the hidden width:
    ``(hidden, inputs)`` then ``(outputs, hidden)``, or transposed), as in Pyro's tutorial
    network of ``PyroModule[nn.Linear]`` layers, and not in a regression's ``(outputs,
    features)`` weight with its ``(outputs,)`` bias. An output weight ``(hidden,)`` cannot be
    told from a multi-output regression by shapes: set ``function_space`` where they misjudge.
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
    return 2 <= first[-2] == second[-1] or 2 <= first[-1] == second[-2]
