r"""A network's hidden units held far outside their prior at the end of warm-up are started
afresh, and the warm-up goes on.

The warm-up may move a chain anywhere: only the steps after it must sample the posterior. On
heavy-tailed inputs the descent can leave a ReLU unit switched off on all but a few extreme
training rows, its bias or an incoming weight far outside the prior (on the 50,000-row
regression family of ``benchmarks/scale_family.py``, first-layer biases of -26 to -148 under
:math:`\mathcal N(0, 1)` after 100 warm-up epochs, on 9 of 20 seeds), held there because bringing
it back switches the unit on where its outgoing weight hurts the fit. Such a coordinate is more
than :data:`~pyro_sgmcmc.engine.prior_distance.FAR_FROM_PRIOR` prior standard deviations out,
which a network's posterior does not pay for (:mod:`.prior_distance`), and the sampling steps,
sized for the posterior, do not bring it back within a run.

At the planned end of warm-up, each such unit of a ``torch.nn.Linear``-shaped layer (a
``<layer>.weight`` site ``(units, inputs)`` with its ``<layer>.bias`` ``(units,)``, whose units
the next such weight in the model's order, ``(outputs, units)``, takes) is started afresh, as a
network's dormant units are re-initialised in training (Sokar et al. 2023):

.. math::

    w^{(l)}_{j\cdot},\ b^{(l)}_j \sim \mathcal N(m, s^2), \qquad
    w^{(l+1)}_{\cdot j} = 0,

with :math:`m` and :math:`s` each coordinate's prior mean and standard deviation at the chain's
position (the prior itself where it is Gaussian), so the network's outputs stay what they were
wherever the unit was off, and the unit is alive again. The chain's momenta are put at rest and
the warm-up runs its adaptation windows once more, as long again
(:meth:`~pyro_sgmcmc.engine.engine.ChainEngine.draw`). Measured on the 20 seeds of
that family with 100 + 100 epochs (2026-12-07): the 9 seeds that ended with units far out end
without them, and 19 of 20 within 10% of a hand-tuned reference's test RMSE instead of 18 (seed
2 from 1.20 to 1.05 times it); the others never restart and end bit for bit as before. Two
simpler cures were tried and not kept: more warm-up steps alone barely move such a bias (-47.0
to -31.9), and putting the far coordinates at the prior's mean without silencing the unit's
outgoing weights ruins the fit (test RMSE 36.9 where the reference's is 4.3).

Units of layers laid out otherwise (a weight ``(inputs, units)`` used as ``x @ w``, a
convolution), of layers whose weights are not real-valued (a prior on a constrained support),
and coordinates far out in an outgoing weight, are not restarted; the check at the end of the
run (:mod:`.prior_distance`) names them. Where a layer's weight or the taker's is the
``weight`` of a ``PyroModule`` that is not a ``torch.nn.Linear`` (Pyro names a module's sites
``<module name>.weight``), the layer is left as it is, whatever its names and shapes. Sites of
no such module (a model written as a function, ``pyro.sample`` with names of its own) are told
by their names and shapes alone, so there a ``(inputs, units)`` weight named ``<layer>.weight``
with as many inputs as units would be taken for ``torch.nn.Linear``'s layout.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from pyro.nn import PyroModule

from ..models.structure import DataPlate, GlobalSitesFirst
from .prior_distance import FAR_FROM_PRIOR, prior_distances

__all__ = ["Restart", "UnitRestart", "other_layer_sites", "units_to_restart"]

TensorMap = Mapping[str, torch.Tensor]


class Restart(NamedTuple):
    """One chain's units to start afresh.

    Attributes
    ----------
    values:
        Per site touched, the mask of the coordinates to set and their new values, both shaped
        like the site (constrained from :func:`units_to_restart`, unconstrained from
        :class:`UnitRestart`).
    units:
        How many units.
    """

    values: dict[str, tuple[torch.Tensor, torch.Tensor]]
    units: int


class UnitRestart:
    """Which units of each chain to start afresh at a position (see the module docstring).

    Parameters
    ----------
    model, args, kwargs:
        The Pyro model and its full-data arguments (the model is evaluated on one row).
    plate:
        The model's data plate.
    constrain, unconstrain:
        Map unconstrained values, ``(...)`` or ``(C, ...)`` per site, to constrained ones, and
        back.
    real:
        The sites whose support is the real line (see :func:`units_to_restart`).
    """

    def __init__(
        self,
        model: Callable[..., Any],
        args: tuple,
        kwargs: Mapping[str, Any],
        plate: DataPlate,
        constrain: Callable[[TensorMap], TensorMap],
        unconstrain: Callable[[TensorMap], TensorMap],
        real: Collection[str] | None = None,
    ) -> None:
        self.model, self.args, self.kwargs, self.plate = model, args, kwargs, plate
        self.constrain, self.unconstrain, self.real = constrain, unconstrain, real
        self.other_layers = other_layer_sites(model)

    def __call__(self, values: TensorMap, generators: Sequence[torch.Generator]) -> list[Restart]:
        """Per chain, the units to start afresh at ``values`` (unconstrained, ``(C, ...)`` per
        latent site), their new incoming weights and biases drawn from chain ``c``'s generator
        ``generators[c]``."""
        constrained = self.constrain(values)
        first = next(iter(constrained.values()))
        row = torch.arange(1, device=first.device)
        model, args, kwargs = self.plate.bind(self.model, self.args, self.kwargs, row)
        restarts = []
        for c in range(first.shape[0]):
            chain = {name: value[c] for name, value in constrained.items()}
            distances = prior_distances(model, args, kwargs, {n: v[None] for n, v in chain.items()})
            found = units_to_restart(chain, distances, generators[c], self.real,
                                     self.other_layers)  # fmt: skip
            new = self.unconstrain({name: value for name, (_, value) in found.values.items()})
            masks = {name: mask for name, (mask, _) in found.values.items()}
            restarts.append(Restart({n: (m, new[n]) for n, m in masks.items()}, found.units))
        return restarts


def units_to_restart(
    values: TensorMap,
    distances: Mapping[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    generator: torch.Generator,
    real: Collection[str] | None = None,
    other_layers: Collection[str] = (),
) -> Restart:
    """The units of one chain to start afresh, with their new values (constrained).

    Parameters
    ----------
    values:
        The chain's constrained values, one per latent site.
    distances:
        Per site judged, each coordinate's distance from its prior's mean in prior standard
        deviations, and the prior's mean and standard deviation
        (:func:`~pyro_sgmcmc.engine.prior_distance.prior_distances`).
    generator:
        The chain's generator, for the new incoming weights and biases.
    real:
        The sites whose support is the real line (restarted only where the layer's weight,
        bias and outgoing weight all are); ``None``: every site.
    other_layers:
        Weight sites of layers that are not ``torch.nn.Linear`` (:func:`other_layer_sites`):
        a layer whose weight or taker is among them is not restarted.
    """
    drawn, silenced, count = [], [], 0
    for name, bias, taker in _linear_layers(values, distances, other_layers):
        if real is not None and not {name, bias, taker} <= set(real):
            continue
        far = distances[name][0] > FAR_FROM_PRIOR
        dead = far.any(1) | (distances[bias][0] > FAR_FROM_PRIOR)
        if not bool(dead.any()):
            continue
        for site, mask in ((name, dead[:, None].expand_as(far)), (bias, dead)):
            _, mean, sd = distances[site]
            noise = torch.randn(mean.shape, generator=generator, device=mean.device)
            drawn.append((site, mask, mean + sd * noise.to(mean.dtype)))
        zeros = torch.zeros_like(values[taker])
        silenced.append((taker, dead[None, :].expand_as(zeros), zeros))
        count += int(dead.sum())
    restart: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for site, mask, value in drawn + silenced:  # silenced last: a zero outgoing weight stays zero
        if site in restart:
            before, old = restart[site]
            mask, value = before | mask, torch.where(mask, value, old)
        restart[site] = (mask, value)
    return Restart(restart, count)


def other_layer_sites(model: Any) -> frozenset[str]:
    """The ``weight`` site names, as Pyro names them (``<module name>.weight``), of the
    ``PyroModule`` s of ``model`` (of the module it wraps, for a
    :class:`~pyro_sgmcmc.models.structure.GlobalSitesFirst`) that are not ``torch.nn.Linear``;
    empty for a model that is not a ``torch.nn.Module``."""
    if isinstance(model, GlobalSitesFirst):
        model = model.module
    if not isinstance(model, torch.nn.Module):
        return frozenset()
    return frozenset(
        f"{module._pyro_name}.weight" if module._pyro_name else "weight"
        for module in model.modules()
        if isinstance(module, PyroModule) and not isinstance(module, torch.nn.Linear)
    )


def _linear_layers(
    values: TensorMap, distances: Mapping[str, Any], other_layers: Collection[str] = ()
) -> list[tuple[str, str, str]]:
    """``(weight, bias, taker)`` site names of each layer laid out as ``torch.nn.Linear``'s whose
    weight and bias are judged: the taker is the next such weight in the model's order (a
    ``.weight`` site of two dimensions), where it takes the layer's units; neither weight among
    ``other_layers``."""
    weights = [name for name, value in values.items()
               if name.endswith(".weight") and value.dim() == 2]  # fmt: skip
    layers = []
    for name, taker in itertools.pairwise(weights):
        bias = name[: -len("weight")] + "bias"
        units = values[name].shape[0]
        judged = name in distances and bias in distances
        if name in other_layers or taker in other_layers:
            continue
        if judged and values[bias].shape == (units,) and values[taker].shape[1] == units:
            layers.append((name, bias, taker))
    return layers
