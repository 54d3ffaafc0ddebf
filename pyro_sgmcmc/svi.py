r"""The variational baseline: a mean-field Gaussian guide fitted on data-plate minibatches.

The guide is Pyro's :class:`~pyro.infer.autoguide.AutoNormal`: independent Gaussians
:math:`q(z_j) = \mathcal N(\mu_j, \sigma_j^2)` on every latent coordinate in unconstrained space,
with :math:`\sigma_j = \operatorname{softplus}(\rho_j) = \log(1 + e^{\rho_j})`, the
parameterisation of Bayes by Backprop (Blundell et al., 2015). The gradient of the ELBO comes from
the reparameterisation :math:`z = \mu + \sigma \odot \epsilon`, :math:`\epsilon\sim\mathcal N(0,I)`.

Minibatches and the KL weight
-----------------------------
Each step draws a minibatch :math:`S` of :math:`B` rows out of :math:`N` (epochs without
replacement, :class:`~pyro_sgmcmc.engine.minibatch.Minibatcher`) and conditions the data plate's
index site on it, exactly as the SG-MCMC kernels do; Pyro then scales the log-likelihood by
:math:`N/B`. The loss of one step is therefore

.. math::

    \hat L_S = \mathbb E_q\Big[\log q(z) - \log p(\theta)
               - \frac{N}{B}\sum_{i\in S}\log p(y_i\mid\theta)\Big]
             = \mathrm{KL}(q\,\|\,p) - \frac{N}{B}\sum_{i\in S}\mathbb E_q \log p(y_i\mid\theta),

and with :math:`M = N/B` minibatches per epoch, :math:`\hat L_S = M\,\big(\mathrm{KL}/M -
\sum_{i\in S} \mathbb E_q\log p(y_i\mid\theta)\big)`: :math:`M` times the per-minibatch cost of
Blundell et al. (eq. 8) with the KL weighted :math:`1/M`. Summed over the :math:`M` minibatches of
an epoch, or averaged over a random minibatch, it equals the full-data negative ELBO
:math:`\mathrm{KL} - \sum_{i=1}^N \mathbb E_q\log p(y_i\mid\theta)`; the tests check this
unbiasedness. The constant factor :math:`M` only rescales the learning rate of Adam-like
optimisers (which are invariant to it).

Gradient estimators
-------------------
The expectation is estimated with one weight draw per minibatch (``num_particles`` draws if
asked). For a :class:`~pyro_sgmcmc.nn.BayesianMLP` with the default guide the loss is computed in
plain torch by :func:`~pyro_sgmcmc.flipout.mean_field_negative_elbo` (the same estimator as Pyro's
``TraceMeanField_ELBO``, 3.5 times faster for the demo's 1-10-10-1 network); any other model or
guide goes through Pyro's ELBO on the conditioned model. ``estimator="local_reparameterization"``
(Kingma, Salimans & Welling 2015) or ``"flipout"`` (Wen et al. 2018) give every example of the
minibatch its own perturbation of the pre-activations: same guide parameters, much lower
gradient variance for large minibatches, same expected loss (for Flipout always, for local
reparameterisation exactly for ``Linear`` layers, approximately for convolutions). They work for
a ``BayesianMLP`` (its plain-torch path) and for any ``PyroModule`` whose latent weights and
biases are ``PyroSample`` attributes of ``PyroModule[nn.Linear]`` / ``[nn.Conv1d]`` /
``[nn.Conv2d]`` / ``[nn.Conv3d]`` layers, e.g. :class:`~pyro_sgmcmc.nn.LeNet5`: the model's own
``forward`` runs under an effect handler that replaces each such layer's output by a per-example
draw (:func:`~pyro_sgmcmc.flipout.module_negative_elbo`); its other latent sites are drawn by
plain reparameterisation (:mod:`pyro_sgmcmc.flipout`).

Starting point
--------------
Pyro's ``init_to_feasible`` puts every real-valued location at 0. In a network all hidden units
are then exchangeable: their location gradients are equal in expectation and only the guide's
noise tells them apart, so the fit stays near the symmetric, data-ignoring solution. The default
:func:`init_to_fan_in` draws each weight matrix's locations uniformly with variance :math:`1/d`
(:math:`d` its last dimension, the fan-in in torch's ``(out, in)`` layout), and
``init_scale = 0.01`` starts the guide nearly deterministic, so that the likelihood shapes the
network before the KL term widens it.

A learnable prior (empirical Bayes)
-----------------------------------
``prior="learnable_scale_mixture"`` (or a :class:`LearnableScaleMixturePrior`) replaces the prior
of the weight sites by the scale mixture of Blundell et al.,
:math:`p_\psi(w) = \pi\,\mathcal N(w\mid 0,\sigma_1^2) + (1-\pi)\,\mathcal N(w\mid 0,\sigma_2^2)`,
whose :math:`\psi = (\pi, \sigma_1, \sigma_2)`, shared by all those sites, are maximised jointly
with the guide: :math:`\max_{q,\psi} \mathrm{ELBO}(q, \psi)`, a type-II maximum-likelihood
(empirical Bayes) estimate of the prior inside the bound. The KL term of those sites is estimated
by Monte Carlo (no closed form exists for a mixture).

Divergence
----------
A step whose loss or gradient is not finite, or whose guide leaves the support of a distribution
(Pyro's validation error, e.g. a softplus scale that underflowed to 0), stops the fit with
:class:`SVIDivergedError`, which names the fit and the step and keeps the losses computed so far.

References
----------
C. Blundell, J. Cornebise, K. Kavukcuoglu and D. Wierstra, "Weight uncertainty in neural networks",
ICML 2015.

D. P. Kingma and M. Welling, "Auto-encoding variational Bayes", ICLR 2014.

Y. LeCun, L. Bottou, G. B. Orr and K.-R. Müller, "Efficient BackProp", in *Neural Networks: Tricks
of the Trade*, Springer, 1998 (the initial weight variance :math:`1/d`).

B. L. Trippe and R. E. Turner, "Overpruning in variational Bayesian neural networks", NeurIPS 2017
workshop on advances in approximate Bayesian inference (why mean-field fits of small data sets
prefer to explain the data as noise).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger
from torch.distributions import biject_to
from tqdm.auto import tqdm

from ._validation import (
    as_tensor_arguments,
    check_interval,
    check_model_kwargs,
    check_positive,
    check_positive_int,
)
from .engine.minibatch import Minibatcher
from .engine.seeds import chain_generators, chain_seeds
from .errors import SVIDivergedError
from .flipout import (
    BayesianLayer,
    _layer_negative_elbo,
    check_estimator,
    check_layer_model,
    guide_negative_elbo,
    layer_sites,
)
from .initialization import init_to_fan_in, real_support
from .model_structure import DataPlate, check_finite_data, inspect_model, resolve_batch_size
from .nn.mlp import BayesianMLP
from .nn.priors import GammaPrecision, ScaleMixtureNormal

__all__ = [
    "LearnableScaleMixturePrior",
    "SVIDivergedError",
    "SVIResult",
    "fit_svi",
    "full_data_negative_elbo",
    "minibatch_elbo_loss",
]

TensorDict = dict[str, torch.Tensor]
OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]
_P = ParamSpec("_P")
_T = TypeVar("_T")


def global_param_mode(fn: Callable[_P, _T]) -> Callable[_P, _T]:
    """Run ``fn`` with ``pyro.settings`` ``module_local_params=False``: any PyroModule works.

    Pyro's ``PyroModule`` keeps a ``_Context`` that creates its private ``param_state`` only if
    ``module_local_params`` is on *when the module is built*, but reads the setting again every
    time the module is *called* (``_Context.__enter__``). A model built with the setting off
    and called with it on (set globally by the user, or by a caller's
    ``pyro.settings.context``) fails with ``AttributeError: '_Context' object has no attribute
    'param_state'``. With the setting off at call time a module works however it was built
    (the context never touches ``param_state`` then), and the per-fit store scope of
    :func:`_param_scope` already gives the isolation that module-local parameters would.
    """

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with pyro.settings.context(module_local_params=False):
            return fn(*args, **kwargs)

    return wrapper


def _param_scope(state: dict | None = None) -> Any:
    """A private parameter store for one fit (``ParamStoreDict.scope``).

    Independent fits of the same model create guides whose parameters have the same names; in
    Pyro's global parameter mode (see :func:`global_param_mode`) a ``PyroModule`` guide reads
    its parameters from the global store by name, so each fit keeps its own store state and
    every call of its guide runs inside it. The user's global store is restored on exit.
    """
    return pyro.get_param_store().scope(state)


# ---------------------------------------------------------------------------------------------
# model arguments
# ---------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------
# initial values
# ---------------------------------------------------------------------------------------------
#: The default start of the guide's locations: weight matrices with variance :math:`1/d`, every
#: other site where ``init_to_feasible`` puts it (0 in unconstrained space: biases at 0, a
#: positive scale or precision at 1); see :func:`~pyro_sgmcmc.initialization.init_to_fan_in`.
default_init_loc = init_to_fan_in()


# ---------------------------------------------------------------------------------------------
# learnable scale-mixture prior
# ---------------------------------------------------------------------------------------------
class LearnableScaleMixturePrior:
    r"""A scale-mixture prior on the weight sites whose parameters are fitted with the guide.

    .. math::

        p_\psi(w) = \pi\,\mathcal N(w \mid 0, \sigma_1^2) + (1 - \pi)\,\mathcal N(w \mid 0,
        \sigma_2^2), \qquad \psi = (\pi, \sigma_1, \sigma_2),

    i.i.d. over every coordinate of the chosen sites and shared by all of them. ``fit_svi``
    maximises the ELBO over the guide and :math:`\psi` together (empirical Bayes), with
    :math:`\pi = \operatorname{sigmoid}(\ell)`, :math:`\sigma_k = \operatorname{softplus}(r_k)`
    as unconstrained parameters. The scale-mixture prior of Blundell et al. (2015), whose
    parameters are here learnt with the guide instead of being fixed.

    Parameters
    ----------
    mixture_weight:
        Initial :math:`\pi \in (0, 1)`, the weight of the first component.
    scale1, scale2:
        Initial :math:`\sigma_1, \sigma_2 > 0` (a wide and a narrow component).
    sites:
        The latent sites that get this prior. ``None``: the weights and biases of a
        :class:`~pyro_sgmcmc.nn.BayesianMLP`, or every real-valued latent site of another model.
    """

    def __init__(
        self,
        mixture_weight: float = 0.2,
        scale1: float = 1.0,
        scale2: float = 0.1,
        sites: Iterable[str] | None = None,
    ) -> None:
        self.mixture_weight = check_interval(
            "mixture_weight", mixture_weight, 0.0, 1.0, low_open=True, high_open=True
        )
        self.scale1 = check_positive("scale1", scale1)
        self.scale2 = check_positive("scale2", scale2)
        if isinstance(sites, str):
            raise TypeError(f"sites must be a list of site names or None, got the string {sites!r}")
        self.sites = None if sites is None else tuple(sites)

    def resolve_sites(self, model: Callable[..., Any], trace: Any) -> tuple[str, ...]:
        """The sites of ``model`` that get the prior (checked against the model's trace)."""
        latent = {
            name: site
            for name, site in trace.nodes.items()
            if site["type"] == "sample"
            and not site["is_observed"]
            and not poutine.util.site_is_subsample(site)
        }
        if isinstance(model, BayesianMLP) and isinstance(model.prior, GammaPrecision):
            raise ValueError(
                "prior='learnable_scale_mixture' replaces the weight prior, but this BayesianMLP "
                "has a GammaPrecision prior whose precision sites would be left without "
                "weights; build the model with a NormalPrior or ScaleMixturePrior"
            )
        if self.sites is None:
            if isinstance(model, BayesianMLP):
                return tuple(site for pair in layer_sites(model) for site in pair)
            sites = tuple(n for n, s in latent.items() if real_support(s["fn"].support))
            if not sites:
                raise ValueError("the model has no real-valued latent site for the learnable prior")
            return sites
        unknown = [s for s in self.sites if s not in latent]
        if unknown:
            raise ValueError(
                f"LearnableScaleMixturePrior(sites=...) names {unknown}, which are not latent "
                f"sites of the model; its latent sites are {sorted(latent)}"
            )
        not_real = [s for s in self.sites if not real_support(latent[s]["fn"].support)]
        if not_real:
            raise ValueError(
                f"LearnableScaleMixturePrior(sites=...) names {not_real}, whose support is not "
                "the real line; a scale mixture of Normals needs real-valued sites"
            )
        return self.sites

    def new_parameters(self) -> ScaleMixtureParameters:
        """Fresh trainable parameters at the initial values (one set per fit)."""
        return ScaleMixtureParameters(self.mixture_weight, self.scale1, self.scale2)

    def __repr__(self) -> str:
        return (
            f"LearnableScaleMixturePrior(mixture_weight={self.mixture_weight}, "
            f"scale1={self.scale1}, scale2={self.scale2}, sites={self.sites})"
        )


def _softplus_inverse(value: float) -> float:
    return value + math.log(-math.expm1(-value))


class ScaleMixtureParameters(torch.nn.Module):
    r"""The trainable :math:`\psi = (\pi, \sigma_1, \sigma_2)` of one fit's learnable prior."""

    def __init__(self, mixture_weight: float, scale1: float, scale2: float) -> None:
        super().__init__()
        dtype = torch.get_default_dtype()
        logit = math.log(mixture_weight) - math.log1p(-mixture_weight)
        self.logit = torch.nn.Parameter(torch.tensor(logit, dtype=dtype))
        self.rho1 = torch.nn.Parameter(torch.tensor(_softplus_inverse(scale1), dtype=dtype))
        self.rho2 = torch.nn.Parameter(torch.tensor(_softplus_inverse(scale2), dtype=dtype))

    @property
    def mixture_weight(self) -> torch.Tensor:
        return torch.sigmoid(self.logit)

    @property
    def scale1(self) -> torch.Tensor:
        return torch.nn.functional.softplus(self.rho1)

    @property
    def scale2(self) -> torch.Tensor:
        return torch.nn.functional.softplus(self.rho2)

    def values(self) -> dict[str, float]:
        """The current :math:`\\pi, \\sigma_1, \\sigma_2` as floats."""
        with torch.no_grad():
            return {
                "mixture_weight": float(self.mixture_weight),
                "scale1": float(self.scale1),
                "scale2": float(self.scale2),
            }

    def distribution(self, shape: torch.Size, event_dim: int) -> Any:
        """The prior of a site of ``shape`` whose last ``event_dim`` dimensions are its event."""
        base = ScaleMixtureNormal(self.mixture_weight, self.scale1, self.scale2)
        return base.expand(shape).to_event(event_dim)

    def log_prob(
        self, params: Mapping[str, torch.Tensor], site: str, batch_ndim: int = 0
    ) -> torch.Tensor:
        r""":math:`\sum_j \log p_\psi(w_j)` of ``params[site]`` (the :class:`~pyro_sgmcmc.nn.Prior`
        interface, differentiable in :math:`\psi`)."""
        w = params[site]
        log_pi = torch.nn.functional.logsigmoid(self.logit)
        log_1m_pi = torch.nn.functional.logsigmoid(-self.logit)
        s1, s2 = self.scale1, self.scale2
        log1 = log_pi - s1.log() - 0.5 * (w / s1).square()
        log2 = log_1m_pi - s2.log() - 0.5 * (w / s2).square()
        values = torch.logaddexp(log1, log2) - 0.5 * math.log(2 * math.pi)
        return values.sum() if batch_ndim == 0 else values.flatten(batch_ndim).sum(-1)


class _SubstitutePrior(Messenger):
    """Replace the prior of the named latent sites by a fit's learnable scale mixture."""

    def __init__(self, sites: Iterable[str], parameters: ScaleMixtureParameters) -> None:
        super().__init__()
        self.sites = frozenset(sites)
        self.parameters = parameters

    def _pyro_sample(self, msg: dict) -> None:
        if msg["name"] in self.sites and not msg["is_observed"]:
            fn = msg["fn"]
            msg["fn"] = self.parameters.distribution(
                fn.batch_shape + fn.event_shape, len(fn.event_shape)
            )


def _resolve_prior(prior: Any) -> LearnableScaleMixturePrior | None:
    if prior is None:
        return None
    if isinstance(prior, str):
        if prior != "learnable_scale_mixture":
            raise ValueError(
                f"prior must be None (the model's own prior), 'learnable_scale_mixture' or a "
                f"LearnableScaleMixturePrior; got {prior!r}"
            )
        return LearnableScaleMixturePrior()
    if isinstance(prior, LearnableScaleMixturePrior):
        return prior
    raise TypeError(
        "prior must be None (the model's own prior), 'learnable_scale_mixture' or a "
        f"LearnableScaleMixturePrior; got {type(prior).__name__}"
    )


# ---------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------
@dataclass
class SVIResult:
    """Independent SVI fits of one model (each fit is exported as one chain).

    Attributes
    ----------
    model:
        The model.
    guides:
        One fitted guide per fit.
    param_states:
        The private parameter-store state of each fit; call guide ``k`` inside
        ``pyro.get_param_store().scope(param_states[k])``.
    losses:
        ``(num_fits, num_steps)`` array: the loss (negative ELBO estimate) of every step.
    wall_times:
        Seconds each fit took.
    seeds:
        The seed of each fit.
    args, kwargs:
        The model's training arguments.
    plate_name, batch_size, num_data:
        The data plate, the minibatch size ``B`` and ``N``.
    plate:
        How a minibatch restricts the model (:class:`~pyro_sgmcmc.model_structure.DataPlate`).
    estimator:
        The gradient estimator of the fits (:data:`pyro_sgmcmc.flipout.ESTIMATORS`).
    prior_parameters:
        With a learnable prior, each fit's fitted :class:`ScaleMixtureParameters`; else ``None``.
    prior_sites:
        The sites that carry the learnable prior (empty without one).
    """

    model: Callable[..., Any]
    guides: list[Callable[..., Any]]
    losses: np.ndarray
    wall_times: list[float]
    seeds: list[int]
    args: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)
    param_states: list[dict] | None = None
    plate_name: str = "data"
    batch_size: int = 1
    num_data: int = 1
    estimator: str = "reparameterization"
    prior_parameters: list[ScaleMixtureParameters] | None = None
    prior_sites: tuple[str, ...] = ()
    plate: DataPlate | None = None

    @property
    def guide(self) -> Callable[..., Any]:
        """The guide of the first fit."""
        return self.guides[0]

    @property
    def loss_history(self) -> np.ndarray:
        """The loss per step of the first fit."""
        return self.losses[0]

    @property
    def wall_time(self) -> float:
        """Total seconds of all fits."""
        return float(sum(self.wall_times))

    @property
    def num_fits(self) -> int:
        return len(self.guides)

    def fitted_model(self, fit: int = 0) -> Callable[..., Any]:
        """The model as fit ``fit`` saw it: with its fitted learnable prior, if it had one."""
        if self.prior_parameters is None:
            return self.model
        return _SubstitutePrior(self.prior_sites, self.prior_parameters[fit])(self.model)

    def prior_values(self) -> list[dict[str, float]] | None:
        r"""The fitted :math:`\pi, \sigma_1, \sigma_2` of each fit (``None`` without a learnable
        prior)."""
        if self.prior_parameters is None:
            return None
        return [parameters.values() for parameters in self.prior_parameters]

    def loc_and_scale(self, fit: int = 0) -> tuple[TensorDict, TensorDict]:
        """Variational means :math:`\\mu` and scales :math:`\\sigma` (unconstrained space)."""
        guide = self.guides[fit]
        if not isinstance(guide, AutoNormal):
            raise TypeError("loc_and_scale needs an AutoNormal guide")
        locs, scales = {}, {}
        for name, _ in guide.prototype_trace.iter_stochastic_nodes():
            locs[name] = guide._get_loc_and_scale(name)[0].detach()
            scales[name] = guide._get_loc_and_scale(name)[1].detach()
        return locs, scales

    @global_param_mode
    def sample_posterior(self, num_draws: int, seed: int | None = None) -> TensorDict:
        """Draw from every fitted guide: constrained values shaped ``(num_fits, num_draws, ...)``.

        For an :class:`~pyro.infer.autoguide.AutoNormal` guide the draws are
        :math:`\\theta = T^{-1}(\\mu + \\sigma\\odot\\epsilon)` computed in one vectorised step
        (:math:`T` = ``biject_to(support)``); other guides are run once per draw.
        """
        num_draws = check_positive_int("num_draws", num_draws)
        generator = torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        per_fit = []
        for k, guide in enumerate(self.guides):
            if isinstance(guide, AutoNormal):
                locs, scales = self.loc_and_scale(k)
                draws = {}
                for name, site in guide.prototype_trace.iter_stochastic_nodes():
                    shape = (num_draws, *locs[name].shape)
                    eps = torch.randn(shape, generator=generator, dtype=locs[name].dtype)
                    eps = eps.to(locs[name].device)  # drawn on the CPU: the same on any device
                    z = locs[name] + scales[name] * eps
                    draws[name] = biject_to(site["fn"].support)(z)
            else:
                draws_list = []
                state = None if self.param_states is None else self.param_states[k]
                with _param_scope(state), torch.random.fork_rng(devices=[]), torch.no_grad():
                    torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
                    for _ in range(num_draws):
                        trace = poutine.trace(guide).get_trace(*self.args, **self.kwargs)
                        draws_list.append(
                            {
                                n: s["value"].detach()
                                for n, s in trace.nodes.items()
                                if s["type"] == "sample"
                                and not s["is_observed"]
                                and not s["infer"].get("is_auxiliary", False)
                            }
                        )
                draws = {n: torch.stack([d[n] for d in draws_list]) for n in draws_list[0]}
            per_fit.append(draws)
        return {name: torch.stack([d[name] for d in per_fit]) for name in per_fit[0]}


def minibatch_elbo_loss(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    subsample: torch.Tensor | None,
    *args: Any,
    plate: DataPlate | str = "data",
    num_particles: int = 1,
    analytic_kl: bool = True,
    **kwargs: Any,
) -> torch.Tensor:
    r"""Differentiable :math:`\hat L_S` (module docstring) on the minibatch ``subsample``.

    ``subsample=None`` gives the full-data negative ELBO estimate (for a plate that subsamples
    itself, :math:`\sum_k \frac{|S_k|}{N} \hat L_{S_k}` over chunks :math:`S_k` of the rows,
    equally unbiased). ``plate`` is the model's :class:`~pyro_sgmcmc.model_structure.DataPlate`
    (how a minibatch restricts it), or the name of a plate indexed by its indices. With
    ``analytic_kl`` the estimator is Pyro's ``TraceMeanField_ELBO``: :math:`\mathrm{KL}(q_j\,\|
    \,p_j)` in closed form for every site where torch registers it (e.g. Normal guide and Normal
    prior), the Monte Carlo term :math:`\log q - \log p` elsewhere (e.g. the scale-mixture
    prior); otherwise ``Trace_ELBO`` (Monte Carlo everywhere). Both are unbiased for the same loss.
    """
    if isinstance(plate, str):
        plate = DataPlate(plate, 0)
    elbo_class = TraceMeanField_ELBO if analytic_kl else Trace_ELBO
    elbo = elbo_class(num_particles=num_particles)
    if subsample is None and plate.subsample_size is not None:
        chunks = torch.arange(plate.num_data).split(plate.subsample_size)
        return sum(
            len(rows)
            / plate.num_data
            * minibatch_elbo_loss(
                model,
                guide,
                rows,
                *args,
                plate=plate,
                num_particles=num_particles,
                analytic_kl=analytic_kl,
                **kwargs,
            )
            for rows in chunks
        )
    bound, bound_args, bound_kwargs = plate.bind(model, args, kwargs, subsample)
    return elbo.differentiable_loss(bound, guide, *bound_args, **bound_kwargs)


def _fast_path_data(
    model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    return bound.arguments["x"], bound.arguments.get("y")


def _step_loss(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    *,
    plate: DataPlate,
    estimator: str,
    num_particles: int,
    analytic_kl: bool,
    fast: bool,
    prior: ScaleMixtureParameters | None,
    prior_sites: tuple[str, ...],
    layers: Mapping[str, BayesianLayer] | None = None,
) -> Callable[[torch.Tensor | None], torch.Tensor]:
    """``subsample -> loss`` of one optimisation step: Pyro's ELBO or the plain-torch one.

    ``fast`` (a BayesianMLP with the default AutoNormal guide) uses
    :func:`~pyro_sgmcmc.flipout.guide_negative_elbo` for every estimator; otherwise plain
    reparameterisation goes through :func:`minibatch_elbo_loss` (any model and guide), and the
    per-example estimators on another ``PyroModule`` (its Bayesian ``layers``, from
    :func:`~pyro_sgmcmc.flipout.check_layer_model`) through
    :func:`~pyro_sgmcmc.flipout.module_negative_elbo`'s handler.
    """
    if not fast:
        target = model if prior is None else _SubstitutePrior(prior_sites, prior)(model)
        if estimator != "reparameterization":
            if not isinstance(guide, AutoNormal):
                raise TypeError(
                    f"estimator={estimator!r} needs the default AutoNormal guide, got "
                    f"{type(guide).__name__}"
                )
            return functools.partial(
                _layer_negative_elbo,
                target,
                layers,
                guide,
                args=args,
                kwargs=kwargs,
                plate=plate,
                estimator=estimator,
                num_particles=num_particles,
                analytic_kl=analytic_kl,
                generator=None,
            )

        def pyro_loss(subsample: torch.Tensor | None) -> torch.Tensor:
            return minibatch_elbo_loss(
                target,
                guide,
                subsample,
                *args,
                plate=plate,
                num_particles=num_particles,
                analytic_kl=analytic_kl,
                **kwargs,
            )

        return pyro_loss
    x, y = _fast_path_data(model, args, kwargs)
    if y is None:
        raise ValueError(f"estimator={estimator!r} needs the targets y among the model arguments")
    return functools.partial(
        guide_negative_elbo,
        model,
        guide,
        x,
        y,
        estimator=estimator,
        num_particles=num_particles,
        analytic_kl=analytic_kl,
        prior=prior,
    )


def _support_violation(error: ValueError) -> str | None:
    """A one-line account of torch's distribution validation error ``error``, or ``None`` if it
    is another error (torch's message ends with a dump of the offending tensor)."""
    message = str(error)
    if not message.startswith(("Expected parameter", "Expected value")):
        return None
    match = re.match(
        r"Expected (parameter \w+|value argument)\b.*?of distribution (\w+).*?"
        r"to satisfy the constraint ([^\n]*?)(?:, but found invalid values.*)?$",
        message,
        flags=re.DOTALL,
    )
    if match is None:
        return message.splitlines()[0]
    what, distribution, constraint = match.groups()
    return f"the {what} of a {distribution} does not satisfy {constraint}"


def _gradients_finite(params: list[torch.Tensor]) -> bool:
    grads = [p.grad.reshape(-1) for p in params if p.grad is not None]
    return not grads or bool(torch.isfinite(torch.cat(grads)).all())


@contextlib.contextmanager
def _intra_op_threads(num_threads: int | None) -> Iterator[None]:
    """Run with ``num_threads`` intra-op threads (``None``: unchanged); restore torch's after."""
    threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _divergence(
    fit: int,
    step: int,
    reason: str,
    history: np.ndarray,
    completed: list[np.ndarray],
    learning_rate: float | None,
) -> SVIDivergedError:
    """The error for fit ``fit`` diverging at (0-based) ``step``, with the losses so far."""
    advice = (
        f"learning_rate={learning_rate:g} is probably too large (try {learning_rate / 10:g})"
        if learning_rate is not None
        else "the optimiser's step size is probably too large"
    )
    num_steps = len(history)
    return SVIDivergedError(
        f"SVI diverged at step {step + 1} of {num_steps} (fit {fit}): {reason}; {advice}. The "
        "losses of the steps so far are kept in the exception's `losses` attribute.",
        fit=fit,
        step=step + 1,
        losses=history[: step + 1].copy(),
        completed_losses=np.asarray(completed).reshape(len(completed), num_steps),
    )


_OPTIONS = (
    "num_steps",
    "batch_size",
    "learning_rate",
    "optimizer",
    "lr_scheduler",
    "num_particles",
    "analytic_kl",
    "estimator",
    "prior",
    "init_scale",
    "init_loc_fn",
    "guide_factory",
    "num_fits",
    "seed",
    "plate_name",
    "progress_bar",
    "callback",
    "num_threads",
)


@global_param_mode
def fit_svi(
    model: Callable[..., Any],
    *args: Any,
    num_steps: int = 1000,
    batch_size: int | None = None,
    learning_rate: float = 1e-2,
    optimizer: OptimizerFactory | None = None,
    lr_scheduler: SchedulerFactory | None = None,
    num_particles: int = 1,
    analytic_kl: bool = True,
    estimator: str = "reparameterization",
    prior: str | LearnableScaleMixturePrior | None = None,
    init_scale: float = 0.01,
    init_loc_fn: Callable = default_init_loc,
    guide_factory: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    num_fits: int = 1,
    seed: int | None = 0,
    plate_name: str = "data",
    progress_bar: bool = True,
    callback: Callable[[int, int, Callable[..., Any], float], None] | None = None,
    num_threads: int | None = None,
    **kwargs: Any,
) -> SVIResult:
    r"""Fit a mean-field Gaussian guide (Bayes by Backprop) on data-plate minibatches.

    Parameters
    ----------
    model:
        A Pyro model following the data-plate contract.
    *args, **kwargs:
        The model's arguments (full data). NumPy arrays and lists of numbers are converted to
        torch tensors (:func:`as_tensor_arguments`); a keyword that is neither an option below
        nor a parameter of the model is refused with a ``TypeError``.
    num_steps:
        Optimisation steps per fit, an integer >= 1.
    batch_size:
        Minibatch size ``B`` in ``[1, N]``; ``None`` uses all ``N`` rows.
    learning_rate:
        Learning rate of the default optimiser (``torch.optim.Adam``), > 0.
    optimizer:
        ``params -> torch.optim.Optimizer``, replacing the default Adam.
    lr_scheduler:
        ``optimizer -> scheduler`` with a ``step()`` method called after every optimisation step,
        e.g. ``lambda opt: torch.optim.lr_scheduler.ExponentialLR(opt, 0.999)``.
    num_particles:
        Monte Carlo samples of the guide per ELBO estimate, an integer >= 1.
    analytic_kl:
        Use closed-form KL terms where available (see :func:`minibatch_elbo_loss`).
    estimator:
        How the expected log-likelihood of a minibatch is estimated, one of
        :data:`pyro_sgmcmc.flipout.ESTIMATORS`: ``"reparameterization"`` (one weight draw per
        minibatch, any model and guide), ``"local_reparameterization"`` (Kingma et al.
        2015) or ``"flipout"`` (Wen et al. 2018). The last two sample per-example
        pre-activations instead of one weight draw per minibatch, which lowers the variance of
        the gradient. They need the default ``AutoNormal`` guide, whose parameters (loc and
        softplus scale per weight) they train, so the result is used exactly as with plain
        reparameterisation, and either a :class:`~pyro_sgmcmc.nn.BayesianMLP` or a
        ``PyroModule`` whose latent weights and biases are ``PyroSample`` attributes of
        ``PyroModule[nn.Linear]`` or ``[nn.Conv1d/2d/3d]`` layers used through their
        ``forward`` (e.g. :class:`~pyro_sgmcmc.nn.LeNet5`; its other latent sites are drawn by
        plain reparameterisation). Same expected loss as plain reparameterisation (local
        reparameterisation of a convolution: approximately); see :mod:`pyro_sgmcmc.flipout`.
    prior:
        ``None`` keeps the model's prior; ``"learnable_scale_mixture"`` or a
        :class:`LearnableScaleMixturePrior` puts a scale-mixture prior whose parameters are
        fitted with the guide on the weight sites (module docstring); the fitted values are in
        :meth:`SVIResult.prior_values`.
    init_scale:
        Initial :math:`\sigma` of every coordinate, > 0. The default 0.01 starts the guide nearly
        deterministic (Pyro's ``AutoNormal`` uses 0.1).
    init_loc_fn:
        Initial :math:`\mu`, a Pyro init strategy; the default :func:`init_to_fan_in` draws weight
        matrices at random (an all-zero start keeps the hidden units of a network identical).
    guide_factory:
        ``model -> guide`` replacing ``AutoNormal(model, init_loc_fn=..., init_scale=...)``.
    num_fits:
        Independent fits (different seeds), exported as chains; an integer >= 1.
    seed:
        Seed of the first fit (fit ``k`` uses a seed spawned from it); ``None`` draws one.
    plate_name:
        Name of the data plate.
    progress_bar:
        Show a tqdm progress bar with the running loss.
    callback:
        Called after every optimisation step as ``callback(fit, step, guide, loss)`` (fit and
        step counted from 0), e.g. to evaluate the guide once per epoch; it runs inside the
        fit's parameter scope, and its time counts in the fit's wall time.
    num_threads:
        torch's intra-op threads during the fits (restored afterwards); ``None`` leaves torch's
        setting. A small network gains nothing from several threads, and on a machine whose
        cores are busy they wait for each other: a fit of the toy sinusoid took 85 s with 2
        threads and 9 s with 1 on a loaded 2-core machine (same result).

    Returns
    -------
    SVIResult
        Guides, loss history (``losses``), wall times and ``sample_posterior(num_draws)``.

    Raises
    ------
    SVIDivergedError
        When a step's loss or gradient is not finite or the guide leaves a distribution's support
        (learning rate too large); it names the step and keeps the losses so far.
    TypeError
        For a keyword argument that is neither an option nor a model parameter (e.g. a misspelt
        ``num_step``), or arguments of the wrong type; for ``estimator="flipout"`` or
        ``"local_reparameterization"``, a model that is neither a ``BayesianMLP`` nor a
        ``PyroModule``.
    ValueError
        For option values out of range, or data with NaN, infinite or no values; for the
        per-example estimators, a model without latent Linear/Conv weights or whose layers they
        cannot handle (named; see :class:`~pyro_sgmcmc.flipout.LayerNoise`).

    Notes
    -----
    The loss of one step is the minibatch estimate :math:`\hat L_S` of the module docstring; its
    expectation over minibatches is the full-data negative ELBO (KL weighted :math:`1/M` per
    minibatch, up to the overall factor :math:`M = N/B`). Randomness comes from a per-fit seed:
    the minibatches from a ``torch.Generator``, the reparameterisation noise and the initial
    locations from torch's generator inside ``torch.random.fork_rng`` (the global state is
    restored afterwards).

    Mean-field VI of a small network on few data can have its ELBO optimum at a solution that
    explains the data as observation noise (over-pruning, Trippe & Turner 2017): with a learnt
    noise level that is what the bound prefers, not an optimisation failure; see the SVI page of
    the documentation for measurements and remedies.
    """
    if not callable(model):
        raise TypeError(f"model must be a callable Pyro model, got {type(model).__name__}")
    check_model_kwargs("fit_svi", _OPTIONS, model, kwargs)
    num_steps = check_positive_int("num_steps", num_steps)
    learning_rate = check_positive("learning_rate", learning_rate)
    num_particles = check_positive_int("num_particles", num_particles)
    estimator = check_estimator(estimator)
    learnable = _resolve_prior(prior)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {callback!r}")
    if not callable(init_loc_fn):
        raise TypeError(f"init_loc_fn must be a Pyro init strategy (callable), got {init_loc_fn!r}")
    if guide_factory is not None and not callable(guide_factory):
        raise TypeError(f"guide_factory must be callable (model -> guide), got {guide_factory!r}")
    if estimator != "reparameterization":
        if not isinstance(model, BayesianMLP | PyroModule):
            raise TypeError(
                f"estimator={estimator!r} needs model to be a pyro_sgmcmc.nn.BayesianMLP or a "
                "pyro.nn.PyroModule whose latent sites include the weight/bias PyroSample "
                "attributes of PyroModule[nn.Linear] or [nn.Conv1d/2d/3d] layers, got "
                f"{type(model).__name__}; use estimator='reparameterization' for other models"
            )
        if guide_factory is not None:
            raise ValueError(
                f"guide_factory must be None with estimator={estimator!r}: the estimator "
                "trains the parameters of the default AutoNormal guide"
            )
        if isinstance(model, BayesianMLP) and plate_name != "data":
            raise ValueError(f"plate_name must be 'data' for a BayesianMLP, got {plate_name!r}")
    init_scale = check_positive("init_scale", init_scale)
    num_fits = check_positive_int("num_fits", num_fits)
    if seed is not None:
        seed = check_positive_int("seed", seed, minimum=0)
    if num_threads is not None:
        num_threads = check_positive_int("num_threads", num_threads)
    args, kwargs = as_tensor_arguments(args, kwargs)
    check_finite_data(args, kwargs)
    structure = inspect_model(model, args, kwargs, plate_name)
    model, plate, num_data = structure.model, structure.plate, structure.num_data
    if batch_size is not None:
        batch_size = check_positive_int("batch_size", batch_size)
    batch_size = resolve_batch_size(batch_size, num_data, plate_name, plate)
    prior_sites = () if learnable is None else learnable.resolve_sites(model, structure.trace)
    fast = isinstance(model, BayesianMLP) and guide_factory is None and plate_name == "data"
    layers = None
    if estimator != "reparameterization" and not fast:
        layers = check_layer_model(model, structure.trace)

    fit_seeds = chain_seeds(seed, range(num_fits))
    guides, losses, wall_times, states, priors = [], [], [], [], []
    with _intra_op_threads(num_threads):
        for k, fit_seed in enumerate(fit_seeds):
            start = time.perf_counter()
            with torch.random.fork_rng(devices=[]), _param_scope() as state:
                torch.manual_seed(fit_seed)
                if guide_factory is None:
                    guide = AutoNormal(model, init_loc_fn=init_loc_fn, init_scale=float(init_scale))
                else:
                    guide = guide_factory(model)
                guide(*args, **kwargs)  # builds the guide's parameters
                prior_parameters = None if learnable is None else learnable.new_parameters()
                step_loss = _step_loss(
                    model,
                    guide,
                    args,
                    kwargs,
                    plate=plate,
                    estimator=estimator,
                    num_particles=num_particles,
                    analytic_kl=analytic_kl,
                    fast=fast,
                    prior=prior_parameters,
                    prior_sites=prior_sites,
                    layers=layers,
                )
                params = [p for p in guide.parameters() if p.requires_grad]
                if not params:
                    raise ValueError("the guide has no trainable parameters")
                if prior_parameters is not None:
                    params += list(prior_parameters.parameters())
                opt = (
                    torch.optim.Adam(params, lr=learning_rate, foreach=True)
                    if optimizer is None
                    else optimizer(params)
                )
                scheduler = None if lr_scheduler is None else lr_scheduler(opt)
                batches = Minibatcher(num_data, batch_size, chain_generators([fit_seed]))
                history = np.full(num_steps, np.nan)
                context = (history, losses, learning_rate if optimizer is None else None)

                bar = tqdm(
                    range(num_steps),
                    desc=f"SVI fit {k}" if num_fits > 1 else "SVI",
                    disable=not progress_bar,
                    leave=False,
                )
                for step in bar:
                    opt.zero_grad()
                    rows = batches.next()
                    try:
                        loss = step_loss(None if rows is None else rows[0])
                    except ValueError as error:
                        violation = _support_violation(error) if step > 0 else None
                        if violation is not None:
                            bar.close()
                            reason = f"the guide left a distribution's support: {violation}"
                            raise _divergence(k, step, reason, *context) from error
                        raise
                    history[step] = float(loss.detach())
                    if not math.isfinite(history[step]):
                        bar.close()
                        raise _divergence(k, step, f"the loss is {history[step]}", *context)
                    loss.backward()
                    if not _gradients_finite(params):
                        bar.close()
                        reason = "a gradient of the guide is not finite"
                        raise _divergence(k, step, reason, *context)
                    opt.step()
                    if scheduler is not None:
                        scheduler.step()
                    if callback is not None:
                        callback(k, step, guide, history[step])
                    if progress_bar and step % 50 == 0:
                        bar.set_postfix(loss=f"{history[step]:.4g}")
                bar.close()
            wall_times.append(time.perf_counter() - start)
            guides.append(guide)
            losses.append(history)
            states.append(state)
            priors.append(prior_parameters)
    return SVIResult(
        model=model,
        guides=guides,
        losses=np.stack(losses),
        wall_times=wall_times,
        seeds=fit_seeds,
        args=tuple(args),
        kwargs=dict(kwargs),
        plate_name=plate_name,
        plate=plate,
        batch_size=batch_size,
        num_data=num_data,
        param_states=states,
        estimator=estimator,
        prior_parameters=None if learnable is None else priors,
        prior_sites=prior_sites,
    )


@global_param_mode
def full_data_negative_elbo(result: SVIResult, fit: int = 0, num_particles: int = 100) -> float:
    """Full-data negative ELBO estimate of one fit (``num_particles`` guide samples), under the
    fit's own (fitted, if learnable) prior."""
    num_particles = check_positive_int("num_particles", num_particles)
    state = None if result.param_states is None else result.param_states[fit]
    with torch.no_grad(), _param_scope(state):
        loss = minibatch_elbo_loss(
            result.fitted_model(fit),
            result.guides[fit],
            None,
            *result.args,
            plate=result.plate or result.plate_name,
            num_particles=num_particles,
            **result.kwargs,
        )
    return float(loss)
