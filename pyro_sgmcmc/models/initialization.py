r"""Starting points for MCMC chains: over-dispersed prior draws and a MAP fit.

* :func:`init_to_prior` draws each latent site from its prior and spreads the draw away from the
  prior's centre in unconstrained space by a factor ``scale``: chains started this way are
  over-dispersed relative to the posterior, which is what the potential scale reduction
  :math:`\hat R` (Gelman & Rubin 1992) needs to detect chains that have not mixed.
* :func:`find_map` runs a few hundred Adam steps on the log joint density (the same potential the
  kernels use, minibatches optional) and returns the result as a Pyro init strategy, so a chain
  can start at the mode instead of spending its warm-up on the descent (HMC from a MAP fit, as
  in tutorial 3).

Both return callables usable as ``init_strategy=`` of NUTS, the SG-MCMC kernels and autoguides.

References
----------
A. Gelman and D. B. Rubin, "Inference from iterative simulation using multiple sequences",
Statistical Science 7(4), 1992.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from pyro.distributions import constraints
from pyro.distributions.torch_distribution import MaskedDistribution
from pyro.distributions.util import is_identically_zero
from pyro.infer.autoguide.initialization import init_to_feasible, init_to_value
from pyro.infer.mcmc.util import initialize_model
from torch.distributions import biject_to

from .._validation import (
    as_tensor_arguments,
    check_model_kwargs,
    check_positive,
    check_positive_int,
)
from ..engine.layout import FlatLayout
from ..engine.minibatch import Minibatcher
from ..engine.seeds import chain_generators, chain_seeds
from .contract_checks import check_finite_data
from .potential_choice import make_potential
from .structure import inspect_model, resolve_batch_size

__all__ = ["MapResult", "find_map", "init_to_fan_in", "init_to_prior"]

InitStrategy = Callable[[dict], torch.Tensor]
#: The keyword options of :func:`find_map`; other keywords go to the model.
_FIND_MAP_OPTIONS = ("num_steps", "learning_rate", "batch_size", "subsample_plate",
                     "init_strategy", "seed", "return_values")  # fmt: skip


def _init_to_prior(site: dict, scale: float, num_reference_draws: int) -> torch.Tensor | None:
    if site["type"] != "sample" or site["is_observed"]:
        return None
    fn = site["fn"]
    if isinstance(fn, MaskedDistribution) and is_identically_zero(fn._mask):
        return None
    value = fn.sample().detach()
    if scale == 1.0:
        return value
    transform = biject_to(fn.support)
    reference = fn.sample((num_reference_draws,)).detach()
    z_center = transform.inv(reference).median(dim=0).values
    z = z_center + scale * (transform.inv(value) - z_center)
    return transform(z)


def real_support(support: constraints.Constraint) -> bool:
    """Whether a support is the real line (possibly with event dimensions)."""
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real


def _init_to_fan_in(site: dict, radius: float, fallback: InitStrategy) -> torch.Tensor:
    if site["type"] != "sample" or site["is_observed"]:
        return fallback(site)
    value = site["fn"].sample().detach()
    if value.dim() >= 2 and real_support(site["fn"].support):
        bound = radius / math.sqrt(math.prod(value.shape[1:]))
        value = torch.empty_like(value).uniform_(-bound, bound)
        value._pyro_custom_init = False
        return value
    return fallback(site)


def init_to_fan_in(
    radius: float = math.sqrt(3.0), fallback: InitStrategy = init_to_feasible
) -> InitStrategy:
    r"""Init strategy for networks: weight tensors uniform in :math:`\pm r/\sqrt{d}`.

    Every real-valued site with at least two dimensions -- a weight in torch's ``(out, in, ...)``
    layout, whose fan-in is :math:`d`, the product of its dimensions after the first -- starts
    uniformly in :math:`\pm r / \sqrt{d}` (variance :math:`r^2/(3d)`; :math:`r = \sqrt 3`, the
    default, is LeCun's variance :math:`1/d`), so that a pre-activation of standardised inputs
    starts with a variance of order one, whatever the layer's width. Every other site starts
    where ``fallback`` puts it. Pyro's ``init_to_uniform`` (:math:`\pm 2` in unconstrained space)
    starts a 50-unit ReLU layer on 13 inputs with outputs of order 100, from which even Adam
    needs hundreds of steps to recover; the SG-MCMC kernels therefore start with
    ``init_to_fan_in(2.0, init_to_uniform)``: random, distinct (no two hidden units alike) and
    over-dispersed starts, which R-hat needs. Draws use torch's global generator, which the
    samplers seed per chain.

    Parameters
    ----------
    radius:
        :math:`r > 0`.
    fallback:
        The init strategy of the other sites (default: Pyro's ``init_to_feasible``).
    """
    radius = check_positive("radius", radius)
    if not callable(fallback):
        raise TypeError(f"fallback must be a Pyro init strategy, got {fallback!r}")
    return functools.partial(_init_to_fan_in, radius=radius, fallback=fallback)  # type: ignore[return-value]


def init_to_prior(scale: float = 1.0, num_reference_draws: int = 31) -> InitStrategy:
    r"""Init strategy: a prior draw, over-dispersed by ``scale`` in unconstrained space.

    For each latent site with prior :math:`p` and bijection :math:`T` to unconstrained space, draw
    :math:`\theta \sim p` and return :math:`T^{-1}(\tilde z + s\,(T(\theta) - \tilde z))`, where
    :math:`\tilde z` is the element-wise median of ``num_reference_draws`` prior draws in
    unconstrained space and :math:`s` = ``scale``. ``scale = 1`` is an exact prior draw (Pyro's
    ``init_to_sample``); ``scale > 1`` over-disperses. Hierarchical priors are drawn in model
    order, so a weight's spread follows its own drawn precision. Draws use torch's global RNG,
    which the SG-MCMC kernels seed per chain.

    Parameters
    ----------
    scale:
        Spread factor :math:`s > 0` (e.g. 2 for starts twice as wide as the prior).
    num_reference_draws:
        Prior draws used to locate the centre, ``>= 1``.
    """
    scale = check_positive("scale", scale)
    num_reference_draws = check_positive_int("num_reference_draws", num_reference_draws)
    return functools.partial(_init_to_prior, scale=scale, num_reference_draws=num_reference_draws)  # type: ignore[return-value]


class MapResult(dict):
    """Constrained MAP values keyed by site name, with the optimisation trace.

    Attributes
    ----------
    losses:
        The potential energy :math:`\\tilde U(z)` (minibatch estimate) at every step.
    """

    losses: list[float]

    def init_strategy(self) -> InitStrategy:
        """``init_to_value`` with these values, for ``init_strategy=`` of a kernel."""
        return init_to_value(values={k: v.detach().clone() for k, v in self.items()})


def find_map(
    model: Callable[..., Any],
    *args: Any,
    num_steps: int = 500,
    learning_rate: float = 1e-2,
    batch_size: int | None = None,
    subsample_plate: str = "data",
    init_strategy: InitStrategy | None = None,
    seed: int | None = None,
    return_values: bool = False,
    **kwargs: Any,
) -> InitStrategy | MapResult:
    r"""Maximise the log joint density with Adam; return it as an init strategy.

    Minimises the same potential as the SG-MCMC kernels,
    :math:`\tilde U(z) = -\log p(\theta) - \frac{N}{B}\sum_{i\in S}\log p(y_i\mid\theta)
    - \log|\det \partial\theta/\partial z|`, in unconstrained space :math:`z` (the model's fast
    ``log_joint`` when it has one, otherwise Pyro's trace). The result is the mode of the
    posterior of :math:`z`; for unconstrained sites such as weights that is the usual MAP, and
    for a precision :math:`\lambda` it stays away from the boundary :math:`\lambda = 0`.

    Parameters
    ----------
    model:
        A Pyro model following the data-plate contract.
    *args, **kwargs:
        The model's arguments (full data). NumPy arrays and lists of numbers are converted to
        torch tensors; a keyword that is neither an option below nor a parameter of the model
        (e.g. a misspelt ``num_step``) is refused with a ``TypeError``.
    num_steps:
        Adam steps, ``>= 1``.
    learning_rate:
        Adam's learning rate, ``> 0``.
    batch_size:
        Minibatch size in ``[1, N]``; ``None`` uses the full data at every step.
    subsample_plate:
        Name of the data plate.
    init_strategy:
        Where the optimisation starts (default ``init_to_prior(1.0)``, a prior draw).
    seed:
        Seed of the start and the minibatches; ``None`` uses torch's global RNG.
    return_values:
        Return the :class:`MapResult` (values and losses) instead of the init strategy.

    Returns
    -------
    An init strategy (``pyro.infer.autoguide.init_to_value`` at the MAP values), or the
    :class:`MapResult` when ``return_values`` is true.

    Examples
    --------
    >>> kernel = SGHMC(model, step_size=1e-4, init_strategy=find_map(model, x, y, num_steps=300))
    """
    if not callable(model):
        raise TypeError(f"model must be a callable Pyro model, got {type(model).__name__}")
    check_model_kwargs("find_map", _FIND_MAP_OPTIONS, model, kwargs)
    num_steps = check_positive_int("num_steps", num_steps)
    learning_rate = check_positive("learning_rate", learning_rate)
    if seed is not None:
        seed = check_positive_int("seed", seed, minimum=0)
    if init_strategy is not None and not callable(init_strategy):
        raise TypeError(
            "init_strategy must be None (a prior draw) or a Pyro init strategy such as "
            f"init_to_prior() or pyro's init_to_median, got {init_strategy!r}"
        )
    args, kwargs = as_tensor_arguments(args, kwargs)
    check_finite_data(args, kwargs)
    (chain_seed,) = chain_seeds(seed, [0])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(chain_seed)
        structure = inspect_model(model, args, kwargs, subsample_plate)
        model = structure.model
        setup_model, setup_args, setup_kwargs = structure.plate.bind_for_setup(model, args, kwargs)
        initial, _, transforms, _ = initialize_model(
            setup_model,
            model_args=setup_args,
            model_kwargs=setup_kwargs,
            init_strategy=init_strategy or init_to_prior(1.0),
        )
    num_data = structure.num_data
    if batch_size is not None:
        batch_size = check_positive_int("batch_size", batch_size)
    batch_size = resolve_batch_size(batch_size, num_data, subsample_plate, structure.plate)
    batches = Minibatcher(num_data, batch_size, chain_generators([chain_seed]), "independent")
    start = {name: value.detach().unsqueeze(0) for name, value in initial.items()}
    layout = FlatLayout({name: value.shape[1:] for name, value in start.items()})
    potential = make_potential(
        "auto",
        model,
        args,
        kwargs,
        transforms,
        layout,
        structure.plate,
        start,
        structure.sample_sites,
    )
    z = layout.flatten(start).clone().requires_grad_(True)
    optimizer = torch.optim.Adam([z], lr=learning_rate)
    losses: list[float] = []
    for _ in range(num_steps):
        optimizer.zero_grad(set_to_none=True)
        loss = potential(layout.unflatten(z), batches.next()).sum()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    if not math.isfinite(losses[-1]):
        raise FloatingPointError(
            f"find_map diverged (potential {losses[-1]}); lower learning_rate={learning_rate}"
        )
    with torch.no_grad():
        constrained, _ = potential.constrain(layout.unflatten(z.detach()))
        constrained = {name: value[0] for name, value in constrained.items()}
    result = MapResult({k: v.detach() for k, v in constrained.items()})
    result.losses = losses
    return result if return_values else result.init_strategy()
