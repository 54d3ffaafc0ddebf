r"""Lower-variance ELBO gradients for a mean-field Gaussian :class:`~pyro_sgmcmc.nn.BayesianMLP`.

The guide is the one :func:`~pyro_sgmcmc.svi.fit_svi` fits: independent Gaussians
:math:`q(w_j) = \mathcal N(\mu_j, \sigma_j^2)`, :math:`\sigma_j = \operatorname{softplus}(\rho_j)`,
on every weight and bias (Pyro's ``AutoNormal``, Blundell et al. 2015). What changes is how the
expected log-likelihood of a minibatch,
:math:`\sum_{i\in S}\mathbb E_q \log p(y_i \mid f_W(x_i))`, is estimated. For one layer with
input rows :math:`h_n` (``(B, in)``), weight means :math:`M`, scales :math:`\Sigma` (``(out, in)``)
and bias means and scales :math:`m, s` (``(out,)``), the three estimators draw the pre-activations
:math:`a_n = W_n h_n + b_n` as follows (:math:`\epsilon, \xi \sim \mathcal N(0, 1)` i.i.d.):

``"reparameterization"`` (Kingma & Welling 2014; Blundell et al. 2015)
    One weight draw :math:`W = M + \Sigma \odot E`, :math:`b = m + s\odot e` shared by the whole
    minibatch: :math:`a_n = W h_n + b`. Every example sees the same perturbation, so the
    likelihood terms of a minibatch are correlated and the gradient variance does not fall like
    :math:`1/B` as the batch grows.

``"local_reparameterization"`` (Kingma, Salimans & Welling 2015)
    Given :math:`h_n`, each pre-activation is Gaussian under :math:`q`, and units are independent
    (they depend on different rows of :math:`W`), so it is sampled directly, independently for
    every example:

    .. math::

        a_n = M h_n + m + \sqrt{\Sigma^{\circ 2} h_n^{\circ 2} + s^{\circ 2}} \odot \xi_n .

    This is the exact marginal of :math:`a_n` under :math:`q` for each example; it equals drawing
    an independent :math:`W_n \sim q` per example, but costs two matrix products instead of
    :math:`B` weight draws. Deeper layers apply it to the sampled activations of the layer below.

``"flipout"`` (Wen, Vicol, Ba, Tran & Grosse 2018)
    One shared perturbation :math:`\Delta W = \Sigma\odot E` (and :math:`\Delta b = s \odot e`),
    decorrelated across examples by random sign vectors :math:`s_n \in \{\pm1\}^{in}`,
    :math:`r_n \in \{\pm1\}^{out}`: :math:`W_n = M + \Delta W \odot r_n s_n^\top`, i.e.

    .. math::

        a_n = M h_n + m + r_n \odot \big(\Delta W (h_n \odot s_n) + \Delta b\big).

    Because :math:`\Delta W` is symmetric about zero with independent entries and the signs are
    independent of it, :math:`\Delta W \odot r_n s_n^\top \overset{d}{=} \Delta W`: each example
    sees a weight drawn exactly from :math:`q` (the bias is flipped by :math:`r_n` alone, Flipout
    on the augmented input :math:`[h_n, 1]` with a fixed sign for the constant), so the estimator
    is unbiased, while the perturbations of different examples are uncorrelated (not
    independent). Cost: about twice a deterministic layer.

Since the loss is a sum of per-example terms and every estimator gives each example the exact
distribution of its network output under :math:`q`, all three have the same expectation; they
differ only in the covariance between examples, hence in the variance of the gradient.

The loss
--------
As in :mod:`pyro_sgmcmc.svi`, the loss of the minibatch :math:`S` (:math:`B` of :math:`N` rows) is

.. math::

    \hat L_S = \mathrm{KL}(q \,\|\, p) - \frac{N}{B}\sum_{i\in S} \frac1P \sum_{k=1}^{P}
               \log p\big(y_i \mid f^{(k)}(x_i)\big),

with :math:`P` = ``num_particles`` draws of the pre-activations. The KL term is in closed form
for a :class:`~pyro_sgmcmc.nn.NormalPrior` :math:`\mathcal N(0, \sigma_p^2)`,

.. math::

    \mathrm{KL}\big(\mathcal N(\mu, \sigma^2)\,\|\,\mathcal N(0, \sigma_p^2)\big)
    = \log\frac{\sigma_p}{\sigma} + \frac{\sigma^2 + \mu^2}{2\sigma_p^2} - \frac12,

and a Monte Carlo estimate :math:`\log q(z) - \log p(T(z)) - \log|\det \partial T/\partial z|`
(one reparameterised draw :math:`z` per particle, :math:`T` = ``biject_to(support)``) for the
other priors (scale mixture, Gamma precision) and for the head's latent noise sites, which are
also drawn by plain reparameterisation. The likelihood of the head is the model's own fast path
(:meth:`~pyro_sgmcmc.nn.Likelihood.log_likelihood`), so the value matches Pyro's
``TraceMeanField_ELBO`` on the conditioned model in expectation; the tests check this.

References
----------
D. P. Kingma and M. Welling, "Auto-encoding variational Bayes", ICLR 2014.

C. Blundell, J. Cornebise, K. Kavukcuoglu and D. Wierstra, "Weight uncertainty in neural
networks", ICML 2015.

D. P. Kingma, T. Salimans and M. Welling, "Variational dropout and the local reparameterization
trick", NeurIPS 2015.

Y. Wen, P. Vicol, J. Ba, D. Tran and R. Grosse, "Flipout: efficient pseudo-independent weight
perturbations on mini-batches", ICLR 2018.
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

from ._validation import check_positive_int
from .nn.mlp import BayesianMLP
from .nn.priors import NormalPrior

__all__ = [
    "ESTIMATORS",
    "autonormal_loc_and_scale",
    "check_estimator",
    "guide_negative_elbo",
    "layer_sites",
    "mean_field_negative_elbo",
    "sample_preactivations",
]

#: The gradient estimators of the expected log-likelihood, see the module docstring.
ESTIMATORS = ("reparameterization", "local_reparameterization", "flipout")

TensorDict = dict[str, torch.Tensor]


def check_estimator(estimator: Any) -> str:
    """Return ``estimator`` after checking that it is one of :data:`ESTIMATORS`."""
    if not isinstance(estimator, str) or estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}; got {estimator!r}")
    return estimator


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


def autonormal_loc_and_scale(
    guide: AutoNormal,
) -> tuple[TensorDict, TensorDict, dict[str, constraints.Constraint]]:
    r"""Differentiable :math:`\mu`, :math:`\sigma = \operatorname{softplus}(\rho)` and supports.

    Reads the fitted (or initial) parameters of every latent site of an ``AutoNormal`` guide that
    has been run once; gradients flow back to the guide's ``nn.Parameter`` objects, so an
    optimiser over ``guide.parameters()`` trains them. The supports give the transform
    :math:`T` from the unconstrained guide space to each site's domain.
    """
    if not isinstance(guide, AutoNormal):
        raise TypeError(f"guide must be a pyro AutoNormal guide, got {type(guide).__name__}")
    if getattr(guide, "prototype_trace", None) is None:
        raise ValueError("guide has no parameters yet: call guide(*args, **kwargs) once first")
    locs, scales, supports = {}, {}, {}
    for name, site in guide.prototype_trace.iter_stochastic_nodes():
        locs[name], scales[name] = guide._get_loc_and_scale(name)
        supports[name] = site["fn"].support
    return locs, scales, supports


def _rademacher(shape: tuple[int, ...], like: torch.Tensor, generator) -> torch.Tensor:
    bits = torch.randint(0, 2, shape, generator=generator, device=like.device)
    return bits.to(like.dtype).mul_(2.0).sub_(1.0)


def sample_preactivations(
    h: torch.Tensor,
    weight_loc: torch.Tensor,
    weight_scale: torch.Tensor,
    bias_loc: torch.Tensor,
    bias_scale: torch.Tensor,
    estimator: str,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""One draw of the pre-activations :math:`a_n = W_n h_n + b_n` of a mean-field layer.

    Parameters
    ----------
    h:
        Inputs :math:`h_n`, shape ``(B, in)``.
    weight_loc, weight_scale:
        :math:`M` and :math:`\Sigma`, shape ``(out, in)``.
    bias_loc, bias_scale:
        :math:`m` and :math:`s`, shape ``(out,)``.
    estimator:
        One of :data:`ESTIMATORS`; the equations are in the module docstring.
    generator:
        Source of the noise (torch's global generator when ``None``).

    Returns
    -------
    torch.Tensor
        Shape ``(B, out)``; for every row, distributed as :math:`W h_n + b` with
        :math:`(W, b) \sim q`.
    """
    estimator = check_estimator(estimator)
    if estimator == "reparameterization":
        eps_w = torch.randn(weight_loc.shape, generator=generator, dtype=h.dtype, device=h.device)
        eps_b = torch.randn(bias_loc.shape, generator=generator, dtype=h.dtype, device=h.device)
        return F.linear(h, weight_loc + weight_scale * eps_w, bias_loc + bias_scale * eps_b)
    mean = F.linear(h, weight_loc, bias_loc)
    if estimator == "local_reparameterization":
        variance = F.linear(h.square(), weight_scale.square(), bias_scale.square())
        xi = torch.randn(mean.shape, generator=generator, dtype=h.dtype, device=h.device)
        return mean + variance.sqrt() * xi
    eps_w = torch.randn(weight_loc.shape, generator=generator, dtype=h.dtype, device=h.device)
    eps_b = torch.randn(bias_loc.shape, generator=generator, dtype=h.dtype, device=h.device)
    sign_in = _rademacher(h.shape, h, generator)
    sign_out = _rademacher(mean.shape, h, generator)
    perturbation = F.linear(h * sign_in, weight_scale * eps_w, bias_scale * eps_b)
    return mean + perturbation * sign_out


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
        parameters of a learnable scale mixture (:class:`pyro_sgmcmc.svi.ScaleMixtureParameters`),
        through which the loss is then differentiable too. Its KL term is estimated by Monte
        Carlo.

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
    # N/B for a minibatch, times the power of a tempered likelihood (BayesianMLP)
    if subsample is None:
        xb, yb, data_scale = x, y, model.likelihood_weight
    else:
        xb, yb = x[subsample], y[subsample]
        data_scale = model.likelihood_weight * x.shape[0] / subsample.shape[0]

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
        params: TensorDict = {}
        log_q = torch.zeros((), dtype=x.dtype, device=x.device)
        log_det = torch.zeros((), dtype=x.dtype, device=x.device)
        for site in sampled_sites:
            eps = torch.randn(loc[site].shape, generator=generator, dtype=x.dtype, device=x.device)
            z = loc[site] + scale[site] * eps
            transform = biject_to(supports.get(site, constraints.real))
            value = transform(z)
            params[site] = value
            log_q = log_q + (-0.5 * eps.square() - scale[site].log()).sum()
            log_det = log_det + transform.log_abs_det_jacobian(z, value).sum()
        if sampled_sites:
            num_sampled = sum(loc[s].numel() for s in sampled_sites)
            log_q = log_q - num_sampled * 0.5 * math.log(2 * math.pi)
            log_p = model.head.log_prior(params)
            for site in weight_sites:
                if site in params:
                    log_p = log_p + weight_prior.log_prob(params, site)
            kl = kl + (log_q - log_p - log_det) / num_particles

        h = xb
        last = len(layers) - 1
        for index, (w_site, b_site) in enumerate(layers):
            if reuse_weights and w_site in params:
                h = F.linear(h, params[w_site], params[b_site])
            else:
                h = sample_preactivations(
                    h, loc[w_site], scale[w_site], loc[b_site], scale[b_site], estimator, generator
                )
            if index < last:
                h = model.activation(h)
        log_lik = log_lik + model.head.log_likelihood(h, yb, params, model.out_features)
    return kl - data_scale * log_lik / num_particles


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
    this is the loss :func:`~pyro_sgmcmc.svi.fit_svi` minimises with ``estimator=...``.
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
