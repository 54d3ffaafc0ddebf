r"""The plain-torch minibatch loss of a mean-field guide on a :class:`~pyro_sgmcmc.nn.BayesianMLP`.

The fast path that :func:`~pyro_sgmcmc.variational.svi.fit_svi` takes for a ``BayesianMLP`` with the
default ``AutoNormal`` guide, whatever the estimator: :func:`mean_field_negative_elbo` assembles the
loss :math:`\hat L_S` (closed-form or Monte Carlo KL term, then the likelihood of the head at the
network's output) from the guide's :math:`\mu, \sigma`, drawing each layer's pre-activations with
:func:`~pyro_sgmcmc.variational.flipout_estimators.sample_preactivations`;
:func:`guide_negative_elbo` reads those :math:`\mu, \sigma` from the guide first. Any other
``PyroModule`` network goes through :mod:`pyro_sgmcmc.variational.flipout_modules` instead. Public
names are re-exported by :mod:`pyro_sgmcmc.variational.flipout`, whose docstring has the equations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from pyro.distributions import constraints
from pyro.infer.autoguide import AutoNormal
from torch.distributions import biject_to

from .._validation import check_positive_int
from ..nn.mlp import BayesianMLP
from ..nn.priors import NormalPrior
from .flipout_estimators import (
    TensorDict,
    autonormal_loc_and_scale,
    check_estimator,
    sample_preactivations,
)

__all__ = ["guide_negative_elbo", "layer_sites", "mean_field_negative_elbo"]


def _check_model(model: Any) -> BayesianMLP:
    if not isinstance(model, BayesianMLP):
        raise TypeError(
            "model must be a pyro_sgmcmc.nn.BayesianMLP for the local reparameterisation and "
            f"Flipout estimators, got {type(model).__name__}"
        )
    return model


def layer_sites(model: BayesianMLP) -> list[tuple[str, str]]:
    """The ``(weight, bias)`` site names of each layer of ``model``, input layer first."""
    return [(f"layers.{i}.weight", f"layers.{i}.bias") for i in range(len(model.layers))]


def _normal_kl(loc: torch.Tensor, scale: torch.Tensor, prior_scale: float) -> torch.Tensor:
    r"""Summed :math:`\mathrm{KL}(\mathcal N(\mu, \sigma^2) \| \mathcal N(0, \sigma_p^2))`."""
    ratio = (scale.square() + loc.square()) / (2.0 * prior_scale**2)
    return (math.log(prior_scale) - scale.log() + ratio - 0.5).sum()


def mean_field_negative_elbo(
    model: BayesianMLP,
    loc: Mapping[str, torch.Tensor],
    scale: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    subsample: torch.Tensor | None = None,
    *,
    estimator: str = "flipout",
    supports: Mapping[str, constraints.Constraint] | None = None,
    num_particles: int = 1,
    analytic_kl: bool = True,
    generator: torch.Generator | None = None,
    prior: Any = None,
) -> torch.Tensor:
    r"""Differentiable minibatch loss :math:`\hat L_S` of a mean-field guide on a BayesianMLP.

    Parameters
    ----------
    model:
        The :class:`~pyro_sgmcmc.nn.BayesianMLP` (any prior and head).
    loc, scale:
        :math:`\mu` and :math:`\sigma > 0` of every latent site in the guide's unconstrained
        space, e.g. from :func:`autonormal_loc_and_scale`.
    x, y:
        The full training data (``N`` rows).
    subsample:
        Row indices of the minibatch (``B`` rows); ``None`` uses all rows.
    estimator:
        One of :data:`ESTIMATORS` (default ``"flipout"``).
    supports:
        Support of each latent site other than the (real-valued) weights and biases, e.g.
        ``noise_precision``; required when the model has such sites.
    num_particles:
        :math:`P`, independent draws averaged in the estimate, an integer >= 1.
    analytic_kl:
        Use the closed-form KL for weights and biases under a
        :class:`~pyro_sgmcmc.nn.NormalPrior`; Monte Carlo otherwise.
    generator:
        Source of all noise (torch's global generator when ``None``).
    prior:
        The prior of the weights and biases, replacing ``model.prior``: any object with the
        :class:`~pyro_sgmcmc.nn.Prior` method ``log_prob(params, site)``, e.g. the fitted
        parameters of a learnable scale mixture
        (:class:`pyro_sgmcmc.variational.svi.ScaleMixtureParameters`), through which the loss is
        then differentiable too. Its KL term is estimated by Monte Carlo.

    Returns
    -------
    torch.Tensor
        A scalar whose expectation is the same for every estimator and equals Pyro's
        ``TraceMeanField_ELBO`` loss on the model with its data plate conditioned on
        ``subsample``.
    """
    model = _check_model(model)
    estimator = check_estimator(estimator)
    num_particles = check_positive_int("num_particles", num_particles)
    layers, weight_sites, supports = _checked_sites(model, loc, scale, y, supports)
    xb, yb, data_scale = _minibatch(model, x, y, subsample)
    weight_prior = model.prior if prior is None else prior
    closed_form = analytic_kl and prior is None and isinstance(model.prior, NormalPrior)
    kl = torch.zeros((), dtype=x.dtype, device=x.device)
    if closed_form:
        for site in weight_sites:
            kl = kl + _normal_kl(loc[site], scale[site], model.prior.scale)
    # Sites whose KL is estimated by Monte Carlo with a reparameterised draw z = mu + sigma eps.
    sampled_sites = [s for s in model.latent_sites if not (closed_form and s in weight_sites)]
    # With plain reparameterisation the likelihood reuses the weight draw of the KL estimate
    # (as Pyro's Trace_ELBO does); the other estimators never materialise weights.
    reuse_weights = estimator == "reparameterization"
    log_lik = torch.zeros((), dtype=x.dtype, device=x.device)
    for _ in range(num_particles):
        params, log_q, log_det = _draw_sites(sampled_sites, loc, scale, supports, x, generator)
        if sampled_sites:
            num_sampled = sum(loc[s].numel() for s in sampled_sites)
            log_q = log_q - num_sampled * 0.5 * math.log(2 * math.pi)
            log_p = model.head.log_prior(params)
            for site in weight_sites:
                if site in params:
                    log_p = log_p + weight_prior.log_prob(params, site)
            kl = kl + (log_q - log_p - log_det) / num_particles
        weights = params if reuse_weights else {}
        h = _network_output(model, layers, xb, loc, scale, weights, estimator, generator)
        log_lik = log_lik + model.head.log_likelihood(h, yb, params, model.out_features)
    return kl - data_scale * log_lik / num_particles


def _checked_sites(
    model: BayesianMLP,
    loc: Mapping[str, torch.Tensor],
    scale: Mapping[str, torch.Tensor],
    y: torch.Tensor | None,
    supports: Mapping[str, constraints.Constraint] | None,
) -> tuple[list[tuple[str, str]], list[str], dict[str, constraints.Constraint]]:
    """The layers' ``(weight, bias)`` sites, all weight and bias sites, and the supports, after
    checking that ``y`` is given and ``loc``, ``scale`` and ``supports`` cover every site."""
    if y is None:
        raise ValueError("y must be given: the ELBO needs the targets")
    missing = [site for site in model.latent_sites if site not in loc or site not in scale]
    if missing:
        raise ValueError(f"loc and scale must hold every latent site; missing {missing}")
    layers = layer_sites(model)
    weight_sites = [site for pair in layers for site in pair]
    supports = {} if supports is None else dict(supports)
    unknown = [s for s in model.latent_sites if s not in supports and s not in weight_sites]
    if unknown:
        raise ValueError(f"supports must give the support of the latent sites {unknown}")
    return layers, weight_sites, supports


def _minibatch(
    model: BayesianMLP, x: torch.Tensor, y: torch.Tensor, subsample: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The rows of the minibatch and the likelihood's scale: :math:`N/B` for a minibatch, times
    the power of a tempered likelihood (``model.likelihood_weight``)."""
    if subsample is None:
        return x, y, model.likelihood_weight
    data_scale = model.likelihood_weight * x.shape[0] / subsample.shape[0]
    return x[subsample], y[subsample], data_scale


def _draw_sites(
    sites: list[str],
    loc: Mapping[str, torch.Tensor],
    scale: Mapping[str, torch.Tensor],
    supports: Mapping[str, constraints.Constraint],
    like: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[TensorDict, torch.Tensor, torch.Tensor]:
    r"""One reparameterised draw :math:`T(\mu + \sigma\epsilon)` of every site in ``sites``.

    Returns the constrained values, :math:`\sum \log q` without its :math:`\log 2\pi` constant
    and :math:`\sum \log|\det \partial T/\partial z|` (zero tensors of ``like``'s dtype and
    device when ``sites`` is empty).
    """
    params: TensorDict = {}
    log_q = torch.zeros((), dtype=like.dtype, device=like.device)
    log_det = torch.zeros((), dtype=like.dtype, device=like.device)
    for site in sites:
        eps = torch.randn(
            loc[site].shape, generator=generator, dtype=like.dtype, device=like.device
        )
        z = loc[site] + scale[site] * eps
        transform = biject_to(supports.get(site, constraints.real))
        value = transform(z)
        params[site] = value
        log_q = log_q + (-0.5 * eps.square() - scale[site].log()).sum()
        log_det = log_det + transform.log_abs_det_jacobian(z, value).sum()
    return params, log_q, log_det


def _network_output(
    model: BayesianMLP,
    layers: list[tuple[str, str]],
    x: torch.Tensor,
    loc: Mapping[str, torch.Tensor],
    scale: Mapping[str, torch.Tensor],
    weights: Mapping[str, torch.Tensor],
    estimator: str,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """The network's output on ``x``: each layer with its drawn ``weights`` if they hold its
    weight, else with pre-activations drawn by ``estimator``; the activation between layers."""
    h = x
    last = len(layers) - 1
    for index, (w_site, b_site) in enumerate(layers):
        if w_site in weights:
            h = F.linear(h, weights[w_site], weights[b_site])
        else:
            h = sample_preactivations(
                h, loc[w_site], scale[w_site], loc[b_site], scale[b_site], estimator, generator
            )
        if index < last:
            h = model.activation(h)
    return h


def guide_negative_elbo(
    model: BayesianMLP,
    guide: AutoNormal,
    x: torch.Tensor,
    y: torch.Tensor,
    subsample: torch.Tensor | None = None,
    *,
    estimator: str = "flipout",
    num_particles: int = 1,
    analytic_kl: bool = True,
    generator: torch.Generator | None = None,
    prior: Any = None,
) -> torch.Tensor:
    r""":func:`mean_field_negative_elbo` at the current parameters of an ``AutoNormal`` guide.

    Differentiable with respect to ``guide.parameters()`` (see :func:`autonormal_loc_and_scale`);
    this is the loss :func:`~pyro_sgmcmc.variational.svi.fit_svi` minimises with ``estimator=...``.
    """
    loc, scale, supports = autonormal_loc_and_scale(guide)
    return mean_field_negative_elbo(
        model,
        loc,
        scale,
        x,
        y,
        subsample,
        estimator=estimator,
        supports=supports,
        num_particles=num_particles,
        analytic_kl=analytic_kl,
        generator=generator,
        prior=prior,
    )
