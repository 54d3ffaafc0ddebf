r"""Lower-variance ELBO gradients for mean-field Gaussian networks of Linear and Conv layers.

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

Any ``PyroModule`` network: Linear and Conv layers
--------------------------------------------------
:func:`module_negative_elbo` (what :func:`~pyro_sgmcmc.svi.fit_svi` uses with these estimators
for a ``PyroModule`` that is not a ``BayesianMLP``, e.g. :class:`~pyro_sgmcmc.nn.LeNet5`) runs
the model's **own** ``forward`` -- activations, pooling, reshapes, the data plate and the
likelihood -- under the effect handler :class:`LayerNoise`. Every ``weight``/``bias`` site that
is a ``PyroSample`` attribute of a ``PyroModule[nn.Linear]`` or ``PyroModule[nn.Conv1d]``,
``[nn.Conv2d]``, ``[nn.Conv3d]`` layer (:data:`SUPPORTED_LAYERS`) is given its guide mean
:math:`\mu`, so the layer's own ``forward`` computes :math:`M \star h + m`; a forward hook then
adds the estimator's perturbation (:func:`layer_perturbation`), with :math:`\star` the layer's
own map: ``F.linear``, or ``F.conv*d`` with the layer's stride, padding (and padding mode),
dilation and groups. For a convolution with input :math:`h_n` (``(C_in, *spatial)``), kernel
means and scales :math:`M, \Sigma` (``(C_out, C_in / groups, *kernel)``), bias means and scales
:math:`m, s` (``(C_out,)``):

``"local_reparameterization"``
    Every output element is drawn from its marginal under :math:`q`:

    .. math::

        a_n = M \star h_n + m + \sqrt{\Sigma^{\circ 2} \star h_n^{\circ 2} + s^{\circ 2}}
              \odot \xi_n, \qquad \xi_n \sim \mathcal N(0, I) \text{ per output element.}

    Each output has the exact marginal of a weight draw, but positions of one example that
    share a kernel are drawn independently, whereas under :math:`q` they are correlated: for
    convolutions (and for a ``Linear`` layer applied to inputs with more than one leading
    dimension) this, the usual application of the trick to convolutions, is an approximation,
    not an unbiased estimator of the ELBO. It is exact for ``Linear`` layers on ``(B, in)``
    inputs, as above. Measured on a small conv net with weight scales near 0.5: a loss 3.6%
    too large; below detection with 300 replicates at scales near 0.2.

``"flipout"``
    One shared kernel perturbation, its sign flipped per example:

    .. math::

        a_n = M \star h_n + m + r_n \odot \big((\Sigma \odot E) \star (h_n \odot s_n)
              + s \odot e\big),

    with one sign per example and **channel**, :math:`s_n \in \{\pm 1\}^{C_{in}}`,
    :math:`r_n \in \{\pm 1\}^{C_{out}}`, broadcast over all positions: example :math:`n` then
    sees one kernel :math:`W_n = M + (\Sigma \odot E) \odot r_n s_n^\top` at every position
    (the sign of kernel entry :math:`(o, c, k)` is :math:`r_{no} s_{nc}`, whatever the groups),
    distributed exactly as :math:`q`, so the estimator is unbiased. Signs drawn per position
    would give every position its own kernel and bias the loss. A ``Linear`` layer likewise
    shares its signs over every dimension of its input but the first (dimension 0 is the
    example, the data plate's rows).

The other terms of the loss are as above: the KL term of a layer site is in closed form for a
Normal prior whose location and scale are fixed (a one-draw Monte Carlo estimate otherwise, e.g.
for a learnable scale-mixture prior); every latent site that is **not** a layer weight or bias
(a noise scale ``sigma ~ Uniform``, a hierarchical prior scale) is drawn by plain
reparameterisation, :math:`T(\mu + \sigma\epsilon)` shared by the minibatch, as in Pyro's
``TraceMeanField_ELBO``; the observed sites contribute their log-density with the data plate's
:math:`N/B` (any of the three plate idioms of :mod:`pyro_sgmcmc.model_structure`). Refused with
a ``TypeError`` or ``ValueError`` naming the site or layer: a model that is not a
``PyroModule``, one with no latent Linear/Conv weight, a layer weight with a prior off the real
line, a layer site missing from the guide, a latent site that is scaled or masked, a layer
applied twice in one run, and a layer whose weight is used other than through its ``forward``
(``F.linear(x, self.fc.weight)``, detected when the layer never runs); a weight read both
through its layer and directly (weight tying) is not detected and would get the guide mean in
the direct use. ``BayesianMLP`` keeps its own fast path above (its ``forward`` applies the
weights with ``F.linear``, so this handler would refuse it).

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.distributions import constraints
from pyro.distributions.util import is_identically_one, scale_and_mask
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger
from pyro.poutine.trace_struct import Trace
from pyro.poutine.util import site_is_subsample
from torch import nn
from torch.distributions import biject_to

from ._validation import check_positive_int
from .model_structure import DataPlate, GlobalSitesFirst
from .nn.mlp import BayesianMLP
from .nn.priors import NormalPrior

__all__ = [
    "ESTIMATORS",
    "SUPPORTED_LAYERS",
    "BayesianLayer",
    "LayerNoise",
    "autonormal_loc_and_scale",
    "bayesian_layers",
    "check_estimator",
    "check_layer_model",
    "flipout_perturbation",
    "guide_negative_elbo",
    "layer_perturbation",
    "layer_sites",
    "mean_field_negative_elbo",
    "module_negative_elbo",
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


# ---------------------------------------------------------------------------------------------
# any PyroModule network of Linear and Conv layers
# ---------------------------------------------------------------------------------------------
#: The layer types whose ``weight``/``bias`` ``PyroSample`` sites get per-example noise.
SUPPORTED_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_LAYER_NAMES = "PyroModule[nn.Linear], PyroModule[nn.Conv1d], [nn.Conv2d] or [nn.Conv3d]"


@dataclass(frozen=True)
class BayesianLayer:
    """A ``Linear`` or ``Conv`` layer of a ``PyroModule`` whose weight and/or bias are latent.

    Attributes
    ----------
    path:
        The layer's module path in the model (``"conv1"``, ``"layers.0"``; ``""`` for the root).
    module:
        The layer itself.
    weight_site, bias_site:
        The names of its latent ``weight`` and ``bias`` sample sites (``None`` for a weight or
        bias that is a fixed parameter, or absent).
    """

    path: str
    module: nn.Module
    weight_site: str | None
    bias_site: str | None

    @property
    def sites(self) -> tuple[str, ...]:
        """The layer's latent sites."""
        return tuple(s for s in (self.weight_site, self.bias_site) if s is not None)


def _root_module(model: Any) -> PyroModule | None:
    """The ``PyroModule`` behind ``model`` (itself, or the module a
    :class:`~pyro_sgmcmc.model_structure.GlobalSitesFirst` wraps), else ``None``."""
    if isinstance(model, GlobalSitesFirst):
        model = model.module
    return model if isinstance(model, PyroModule) else None


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def bayesian_layers(
    model: Any, latent_sites: Iterable[str] | None = None
) -> dict[str, BayesianLayer]:
    """The layers of a ``PyroModule`` model whose ``weight``/``bias`` are ``PyroSample`` sites.

    Parameters
    ----------
    model:
        A ``PyroModule`` (or one wrapped in
        :class:`~pyro_sgmcmc.model_structure.GlobalSitesFirst`).
    latent_sites:
        If given, only sites in it count (e.g. the latent sites of a trace of the model): a
        layer that the model never uses has no site.

    Returns
    -------
    dict
        :class:`BayesianLayer` by module path, in the order of ``model.named_modules()``; only
        instances of :data:`SUPPORTED_LAYERS` with at least one latent site.

    Raises
    ------
    TypeError
        If ``model`` is not a ``PyroModule``.
    """
    root = _root_module(model)
    if root is None:
        raise TypeError(f"model must be a pyro.nn.PyroModule, got {type(model).__name__}")
    latent = None if latent_sites is None else set(latent_sites)
    layers = {}
    for path, module in root.named_modules():
        if not isinstance(module, PyroModule) or not isinstance(module, SUPPORTED_LAYERS):
            continue
        samples = module.__dict__.get("_pyro_samples", {})
        names = {}
        for attr in ("weight", "bias"):
            # the name Pyro gives the site: the layer's own _pyro_name, set by its supermodules
            site = _join(module.__dict__.get("_pyro_name", path), attr)
            names[attr] = site if attr in samples and (latent is None or site in latent) else None
        if names["weight"] is not None or names["bias"] is not None:
            layers[path] = BayesianLayer(path, module, names["weight"], names["bias"])
    return layers


def _is_real(support: constraints.Constraint) -> bool:
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real


def check_layer_model(model: Any, trace: Trace) -> dict[str, BayesianLayer]:
    """Check that the per-example estimators apply to ``model``; return its Bayesian layers.

    ``trace`` is a trace of the model (e.g. :attr:`ModelStructure.trace
    <pyro_sgmcmc.model_structure.ModelStructure.trace>`). Latent sites that are not layer
    weights or biases are allowed: :func:`module_negative_elbo` draws them by plain
    reparameterisation.

    Raises
    ------
    TypeError
        If ``model`` is not a ``PyroModule``.
    ValueError
        If no latent site is the weight or bias of a supported layer, or a layer's site is not
        real-valued (its guide location would not be the weight's mean).
    """
    if _root_module(model) is None:
        raise TypeError(
            "the local reparameterisation and Flipout estimators need model to be a "
            "pyro_sgmcmc.nn.BayesianMLP or a pyro.nn.PyroModule whose latent sites include the "
            f"weight/bias PyroSample attributes of {_LAYER_NAMES} layers; got "
            f"{type(model).__name__}"
        )
    latent = {
        name: site
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
    }
    layers = bayesian_layers(model, latent)
    if not layers:
        raise ValueError(
            "no latent site of the model is the weight or bias (a PyroSample attribute) of a "
            f"{_LAYER_NAMES} layer, so the local reparameterisation and Flipout estimators have "
            f"nothing to act on; latent sites: {sorted(latent)}. Use "
            "estimator='reparameterization'."
        )
    not_real = [
        s for layer in layers.values() for s in layer.sites if not _is_real(latent[s]["fn"].support)
    ]
    if not_real:
        raise ValueError(
            f"the layer site(s) {not_real} are not real-valued (support "
            f"{latent[not_real[0]]['fn'].support}); the local reparameterisation and Flipout "
            "estimators need layer weights and biases with a prior on the real line (e.g. "
            "Normal)"
        )
    return layers


def _check_guide_sites(
    layers: Mapping[str, BayesianLayer], loc: Mapping[str, torch.Tensor]
) -> None:
    missing = [s for layer in layers.values() for s in layer.sites if s not in loc]
    if missing:
        raise ValueError(
            f"the guide has no location and scale for the layer site(s) {missing}: the local "
            "reparameterisation and Flipout estimators need an AutoNormal guide over every "
            "latent weight and bias of the model's Linear/Conv layers"
        )


def _linear_map(layer: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: Any) -> torch.Tensor:
    """The layer's own affine map with another weight and bias: ``F.linear`` or ``F.conv*d``
    with the layer's stride, padding (and padding mode), dilation and groups."""
    if isinstance(layer, nn.Linear):
        return F.linear(x, weight, bias)
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[len(layer.kernel_size)]
    padding = layer.padding
    if layer.padding_mode != "zeros":
        x = F.pad(x, layer._reversed_padding_repeated_twice, mode=layer.padding_mode)
        padding = 0
    return conv(x, weight, bias, layer.stride, padding, layer.dilation, layer.groups)


def _feature_dim(layer: nn.Module, x: torch.Tensor) -> tuple[int, bool]:
    """The dimension of the features (channels) of ``x`` and whether ``x`` has a leading
    example dimension (dimension 0): ``(-1, x.dim() > 1)`` for a ``Linear`` layer, ``(1, True)``
    / ``(0, False)`` for a batched / unbatched convolution."""
    if isinstance(layer, nn.Linear):
        return -1, x.dim() > 1
    batched = x.dim() == len(layer.kernel_size) + 2
    return (1, True) if batched else (0, False)


def _sign_shape(t: torch.Tensor, feature_dim: int, batched: bool) -> tuple[int, ...]:
    """One sign per example (dimension 0) and feature, shared by every other dimension."""
    shape = [1] * t.dim()
    shape[feature_dim] = t.shape[feature_dim]
    if batched:
        shape[0] = t.shape[0]
    return tuple(shape)


def _as_output_bias(bias: torch.Tensor, out: torch.Tensor, feature_dim: int) -> torch.Tensor:
    """``bias`` (one value per output feature) shaped to broadcast against the output."""
    if feature_dim < 0:
        return bias
    return bias.reshape((-1,) + (1,) * (out.dim() - 1 - feature_dim))


def flipout_perturbation(
    layer: nn.Module,
    x: torch.Tensor,
    mean: torch.Tensor,
    weight_noise: torch.Tensor | None,
    bias_noise: torch.Tensor | None,
    sign_in: torch.Tensor | None,
    sign_out: torch.Tensor,
) -> torch.Tensor:
    r"""The Flipout term :math:`r_n \odot \big(\Delta W \star (h_n \odot s_n) + \Delta b\big)`.

    Parameters
    ----------
    layer:
        A :data:`SUPPORTED_LAYERS` instance; :math:`\star` is its own map (``F.linear``, or
        ``F.conv*d`` with its stride, padding, padding mode, dilation and groups).
    x:
        The layer's input :math:`h`.
    mean:
        The layer's output at the means, :math:`M \star h + m` (only its shape is used when the
        weight is fixed).
    weight_noise, bias_noise:
        The perturbations :math:`\Delta W = \Sigma \odot E` and :math:`\Delta b = s \odot e`
        shared by the minibatch (``None``: that parameter is fixed).
    sign_in, sign_out:
        :math:`s_n` and :math:`r_n`: :math:`\pm 1` per example and input (output) feature, shaped
        to broadcast against the input (output), e.g. ``(B, C, 1, 1)`` for a 2-d convolution.
        ``sign_in`` is unused when the weight is fixed.

    Returns
    -------
    torch.Tensor
        Shaped like ``mean``; example :math:`n` gets the output of the effective weights
        :math:`W_n = M + \Delta W \odot r_n s_n^\top` and :math:`b_n = m + r_n \odot \Delta b`
        minus that of the means.
    """
    if weight_noise is not None:
        return _linear_map(layer, x * sign_in, weight_noise, bias_noise) * sign_out
    feature_dim, _ = _feature_dim(layer, x)
    return _as_output_bias(bias_noise, mean, feature_dim) * sign_out


def layer_perturbation(
    layer: nn.Module,
    x: torch.Tensor,
    mean: torch.Tensor,
    weight_scale: torch.Tensor | None,
    bias_scale: torch.Tensor | None,
    estimator: str,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""A draw of :math:`a - (M \star h + m)` for a mean-field layer: what turns the output of a
    layer at its means into a local-reparameterisation or Flipout sample.

    Parameters
    ----------
    layer:
        A :data:`SUPPORTED_LAYERS` instance.
    x:
        The layer's input :math:`h` (examples along dimension 0, as the data plate's rows).
    mean:
        The layer's output at the means, :math:`M \star h + m`.
    weight_scale, bias_scale:
        :math:`\Sigma` and :math:`s` (``None``: that parameter is fixed).
    estimator:
        ``"local_reparameterization"`` or ``"flipout"``; the equations are in the module
        docstring.
    generator:
        Source of the noise (torch's global generator when ``None``).
    """
    estimator = check_estimator(estimator)
    feature_dim, batched = _feature_dim(layer, x)
    options = {"generator": generator, "dtype": mean.dtype, "device": mean.device}
    if estimator == "local_reparameterization":
        bias_var = None if bias_scale is None else bias_scale.square()
        if weight_scale is not None:
            variance = _linear_map(layer, x.square(), weight_scale.square(), bias_var)
        else:
            variance = _as_output_bias(bias_var, mean, feature_dim)
        # a zero variance (a fixed bias and a zero input) would make the gradient of sqrt NaN
        std = variance.clamp_min(torch.finfo(variance.dtype).tiny).sqrt()
        return std * torch.randn(mean.shape, **options)
    if estimator == "flipout":
        weight_noise = bias_noise = sign_in = None
        if weight_scale is not None:
            weight_noise = weight_scale * torch.randn(weight_scale.shape, **options)
            sign_in = _rademacher(_sign_shape(x, feature_dim, batched), x, generator)
        if bias_scale is not None:
            bias_noise = bias_scale * torch.randn(bias_scale.shape, **options)
        sign_out = _rademacher(_sign_shape(mean, feature_dim, batched), mean, generator)
        return flipout_perturbation(layer, x, mean, weight_noise, bias_noise, sign_in, sign_out)
    raise ValueError("estimator='reparameterization' draws weights, not per-example perturbations")


def _normal_kl_to(prior: Any, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor | None:
    r"""Summed :math:`\mathrm{KL}(\mathcal N(\mu, \sigma^2) \| p)` when ``prior`` is a Normal
    (possibly expanded or with event dimensions) of ``loc``'s shape, else ``None``."""
    base = prior
    while isinstance(base, torch.distributions.Independent | dist.ExpandedDistribution):
        base = base.base_dist
    if not isinstance(base, torch.distributions.Normal):
        return None
    if torch.broadcast_shapes(base.batch_shape, loc.shape) != loc.shape:
        return None
    ratio = (scale / base.scale).square()
    return 0.5 * (ratio + ((loc - base.loc) / base.scale).square() - 1.0 - ratio.log()).sum()


def _gaussian_log_density(eps: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (-0.5 * eps.square() - scale.log()).sum() - eps.numel() * 0.5 * math.log(2 * math.pi)


class LayerNoise(Messenger):
    r"""Effect handler: one run of a ``PyroModule`` model under the per-example estimators.

    While the model runs (its own ``forward``, unchanged), every latent site is answered from
    the ``AutoNormal`` guide's :math:`\mu, \sigma`, and the handler accumulates the two terms of
    the loss :math:`\hat L_S = \mathrm{KL} - \log p(\text{observations})`:

    * the ``weight``/``bias`` site of a :data:`SUPPORTED_LAYERS` layer gets the value
      :math:`\mu` (so the layer's own ``forward`` computes :math:`M \star h + m`), and a forward
      hook adds :func:`layer_perturbation` to the layer's output: a local-reparameterisation or
      Flipout draw of the pre-activations. Its KL term is in closed form for a Normal prior
      (with ``analytic_kl``), a one-draw Monte Carlo estimate :math:`\log q(z) - \log p(z)`
      otherwise;
    * any other latent site (a noise scale, a hierarchical prior scale) gets a plain
      reparameterised draw :math:`T(\mu + \sigma\epsilon)` shared by the minibatch, as in Pyro's
      ``TraceMeanField_ELBO``: closed-form KL for a real-valued site with a Normal prior,
      :math:`\log q - \log|\det \partial T| - \log p` otherwise;
    * every observed site (the likelihood inside the data plate) adds its log-density times its
      scale (:math:`N/B` under :meth:`DataPlate.bind
      <pyro_sgmcmc.model_structure.DataPlate.bind>`) and mask, to :attr:`log_likelihood`.

    With ``estimator="reparameterization"`` the layer sites are drawn like the other sites
    (Pyro's ``TraceMeanField_ELBO`` estimator).

    Parameters
    ----------
    layers:
        The model's Bayesian layers (:func:`bayesian_layers`).
    loc, scale:
        :math:`\mu` and :math:`\sigma` of every latent site in unconstrained space
        (:func:`autonormal_loc_and_scale`).
    estimator:
        One of :data:`ESTIMATORS`.
    analytic_kl:
        Closed-form KL terms for Normal priors on real-valued sites.
    generator:
        Source of all noise (torch's global generator when ``None``).

    Attributes
    ----------
    kl, log_likelihood:
        The accumulated terms after a run (tensors, or 0.0 when there was none).

    Raises
    ------
    ValueError
        During the run: a latent site that is not in the guide, or that is scaled or masked; a
        layer applied more than once in a run; a layer whose latent weight was sampled but whose
        ``forward`` never ran (the weight was used some other way, e.g. ``F.linear(x,
        self.fc.weight)``, which would silently lose its noise).
    """

    def __init__(
        self,
        layers: Mapping[str, BayesianLayer],
        loc: Mapping[str, torch.Tensor],
        scale: Mapping[str, torch.Tensor],
        estimator: str = "flipout",
        *,
        analytic_kl: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.layers = dict(layers)
        self.loc, self.scale = loc, scale
        self.estimator = check_estimator(estimator)
        self.analytic_kl = bool(analytic_kl)
        self.generator = generator
        self._site_layer = {site: layer for layer in self.layers.values() for site in layer.sites}
        self._by_module = {id(layer.module): layer for layer in self.layers.values()}
        self._handles: list[Any] = []
        self._reset()

    def _reset(self) -> None:
        self.kl: torch.Tensor | float = 0.0
        self.log_likelihood: torch.Tensor | float = 0.0
        self._sampled: set[str] = set()
        self._calls: dict[str, int] = {}

    def __enter__(self) -> LayerNoise:
        self._reset()
        if self.estimator != "reparameterization":
            for layer in self.layers.values():
                handle = layer.module.register_forward_hook(self._hook, with_kwargs=True)
                self._handles.append(handle)
        return super().__enter__()

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> Any:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        result = super().__exit__(exc_type, exc_value, traceback)
        if exc_type is None and self.estimator != "reparameterization":
            self._check_every_layer_ran()
        return result

    def _check_every_layer_ran(self) -> None:
        unused = [
            layer
            for layer in self.layers.values()
            if layer.path not in self._calls and any(s in self._sampled for s in layer.sites)
        ]
        if unused:
            sites = [s for layer in unused for s in layer.sites if s in self._sampled]
            raise ValueError(
                f"the latent site(s) {sites} were sampled but the forward of their layer(s) "
                f"{[layer.path for layer in unused]} never ran: the local reparameterisation and "
                "Flipout estimators replace the output of a layer's forward, so a Bayesian weight "
                "must be used through its layer (`self.fc(x)`, not `F.linear(x, "
                "self.fc.weight)`); use estimator='reparameterization' for such a model"
            )

    def _hook(
        self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: torch.Tensor
    ) -> torch.Tensor | None:
        layer = self._by_module[id(module)]
        calls = self._calls[layer.path] = self._calls.get(layer.path, 0) + 1
        if calls > 1:
            raise ValueError(
                f"the layer {layer.path!r} ran {calls} times in one run of the model: the local "
                "reparameterisation and Flipout estimators give each Bayesian layer one "
                "perturbation per example, so a layer may be applied once per run; use "
                "estimator='reparameterization' for a model that reuses a layer"
            )
        weight = layer.weight_site if layer.weight_site in self._sampled else None
        bias = layer.bias_site if layer.bias_site in self._sampled else None
        if weight is None and bias is None:
            return None
        x = args[0] if args else kwargs["input"]
        return output + layer_perturbation(
            module,
            x,
            output,
            None if weight is None else self.scale[weight],
            None if bias is None else self.scale[bias],
            self.estimator,
            self.generator,
        )

    def _randn_like(self, t: torch.Tensor) -> torch.Tensor:
        return torch.randn(t.shape, generator=self.generator, dtype=t.dtype, device=t.device)

    def _pyro_sample(self, msg: dict) -> None:
        if msg["is_observed"] or msg["done"] or site_is_subsample(msg):
            return
        name = msg["name"]
        layer = self._site_layer.get(name)
        if name not in self.loc or name not in self.scale:
            what = "the layer site" if layer is not None else "the latent site"
            raise ValueError(
                f"{what} {name!r} is not in the guide: the estimators need an AutoNormal guide "
                "with a location and scale for every latent site of the model (the weights and "
                "biases of its Linear/Conv layers included)"
            )
        if not is_identically_one(msg["scale"]) or (
            msg["mask"] is not None and msg["mask"] is not True
        ):
            raise ValueError(
                f"the latent site {name!r} is scaled or masked (poutine.scale / poutine.mask): "
                "not supported by the local reparameterisation and Flipout estimators"
            )
        if layer is None or self.estimator == "reparameterization":
            self._reparameterised_site(msg)
        else:
            self._layer_site(msg)

    def _reparameterised_site(self, msg: dict) -> None:
        name, fn = msg["name"], msg["fn"]
        loc, scale = self.loc[name], self.scale[name]
        eps = self._randn_like(loc)
        z = loc + scale * eps
        transform = biject_to(fn.support)
        value = transform(z)
        kl = _normal_kl_to(fn, loc, scale) if self.analytic_kl and _is_real(fn.support) else None
        if kl is None:
            log_det = transform.log_abs_det_jacobian(z, value).sum()
            kl = _gaussian_log_density(eps, scale) - log_det - fn.log_prob(value).sum()
        self.kl = self.kl + kl
        msg["value"], msg["done"] = value, True

    def _layer_site(self, msg: dict) -> None:
        name, fn = msg["name"], msg["fn"]
        if not _is_real(fn.support):
            raise ValueError(
                f"the layer site {name!r} is not real-valued (support {fn.support}); the local "
                "reparameterisation and Flipout estimators need layer weights and biases with "
                "a prior on the real line (e.g. Normal)"
            )
        loc, scale = self.loc[name], self.scale[name]
        kl = _normal_kl_to(fn, loc, scale) if self.analytic_kl else None
        if kl is None:  # one reparameterised draw of its own, used for the KL term only
            eps = self._randn_like(loc)
            kl = _gaussian_log_density(eps, scale) - fn.log_prob(loc + scale * eps).sum()
        self.kl = self.kl + kl
        self._sampled.add(name)
        msg["value"], msg["done"] = loc, True

    def _pyro_post_sample(self, msg: dict) -> None:
        if (
            not msg["is_observed"]
            or site_is_subsample(msg)
            or msg["infer"].get("_deterministic", False)
        ):
            return
        log_p = scale_and_mask(msg["fn"].log_prob(msg["value"]), msg["scale"], msg["mask"])
        self.log_likelihood = self.log_likelihood + log_p.sum()


def _layer_negative_elbo(
    target: Callable[..., Any],
    layers: Mapping[str, BayesianLayer],
    guide: AutoNormal,
    subsample: torch.Tensor | None,
    args: tuple,
    kwargs: Mapping[str, Any],
    *,
    plate: DataPlate,
    estimator: str,
    num_particles: int,
    analytic_kl: bool,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """:func:`module_negative_elbo` with the layers given (``target`` may wrap the module)."""
    if subsample is None and plate.subsample_size is not None:
        chunks = torch.arange(plate.num_data).split(plate.subsample_size)
        options = {
            "plate": plate,
            "estimator": estimator,
            "num_particles": num_particles,
            "analytic_kl": analytic_kl,
            "generator": generator,
        }
        return sum(
            len(rows)
            / plate.num_data
            * _layer_negative_elbo(target, layers, guide, rows, args, kwargs, **options)
            for rows in chunks
        )
    loc, scale, _ = autonormal_loc_and_scale(guide)
    bound, bound_args, bound_kwargs = plate.bind(target, args, kwargs, subsample)
    total: torch.Tensor | float = 0.0
    for _ in range(num_particles):
        handler = LayerNoise(
            layers, loc, scale, estimator, analytic_kl=analytic_kl, generator=generator
        )
        handler(bound)(*bound_args, **bound_kwargs)
        total = total + (handler.kl - handler.log_likelihood)
    if not isinstance(total, torch.Tensor):
        raise ValueError("the model has neither latent nor observed sites: there is no ELBO")
    return total / num_particles


def module_negative_elbo(
    model: Callable[..., Any],
    guide: AutoNormal,
    subsample: torch.Tensor | None,
    *args: Any,
    plate: DataPlate | str = "data",
    estimator: str = "flipout",
    num_particles: int = 1,
    analytic_kl: bool = True,
    generator: torch.Generator | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    r"""Differentiable minibatch loss :math:`\hat L_S` of an ``AutoNormal`` guide on any
    ``PyroModule`` network of ``Linear``/``Conv`` layers, with per-example noise.

    The counterpart of :func:`pyro_sgmcmc.svi.minibatch_elbo_loss` (same arguments, same
    expectation) for ``estimator="local_reparameterization"`` or ``"flipout"``: the model's own
    ``forward`` runs under :class:`LayerNoise`, which replaces the output of every layer whose
    ``weight``/``bias`` are latent ``PyroSample`` sites by a per-example draw of its
    pre-activations (module docstring), and gives every other latent site a plain
    reparameterised draw.

    Parameters
    ----------
    model:
        A ``PyroModule`` following the data-plate contract (e.g.
        :class:`~pyro_sgmcmc.nn.LeNet5`), or one wrapped in
        :class:`~pyro_sgmcmc.model_structure.GlobalSitesFirst`.
    guide:
        An ``AutoNormal`` guide of ``model`` that has been run once.
    subsample:
        Row indices of the minibatch; ``None`` for all rows.
    *args, **kwargs:
        The model's arguments (full data).
    plate:
        The model's :class:`~pyro_sgmcmc.model_structure.DataPlate` (any of its three idioms),
        or the name of a plate indexed by its indices.
    estimator:
        One of :data:`ESTIMATORS`; ``"reparameterization"`` draws the layer weights too (Pyro's
        ``TraceMeanField_ELBO`` estimator).
    num_particles:
        :math:`P`, independent runs of the model averaged, an integer >= 1.
    analytic_kl:
        Closed-form KL for Normal priors on real-valued sites; Monte Carlo otherwise.
    generator:
        Source of all noise (torch's global generator when ``None``).

    Returns
    -------
    torch.Tensor
        A scalar whose expectation (for Flipout and for networks whose local reparameterisation
        is exact, see the module docstring) equals that of Pyro's ``TraceMeanField_ELBO`` loss
        on the model restricted to ``subsample``.

    Raises
    ------
    TypeError
        If ``model`` is not a ``PyroModule`` or ``guide`` not an ``AutoNormal``.
    ValueError
        For the refusals of :class:`LayerNoise`, or bad option values.
    """
    estimator = check_estimator(estimator)
    num_particles = check_positive_int("num_particles", num_particles)
    layers = bayesian_layers(model)
    if isinstance(plate, str):
        plate = DataPlate(plate, 0)
    return _layer_negative_elbo(
        model,
        layers,
        guide,
        subsample,
        args,
        kwargs,
        plate=plate,
        estimator=estimator,
        num_particles=num_particles,
        analytic_kl=analytic_kl,
        generator=generator,
    )
