r"""The minibatch loss of a mean-field guide on any ``PyroModule`` network of Linear/Conv layers.

What :func:`~pyro_sgmcmc.variational.svi.fit_svi` uses with the per-example estimators for a
``PyroModule`` that is not a ``BayesianMLP`` (e.g. :class:`~pyro_sgmcmc.nn.LeNet5`): finding the
layers whose ``weight``/``bias`` are latent ``PyroSample`` sites (:func:`bayesian_layers`,
:func:`check_layer_model`), the effect handler :class:`LayerNoise` under which the model's own
``forward`` runs (each such layer's output perturbed by
:func:`~pyro_sgmcmc.variational.flipout_estimators.layer_perturbation`, every other latent site
drawn by plain reparameterisation), and the loss that averages its runs
(:func:`module_negative_elbo`). Public names are re-exported by
:mod:`pyro_sgmcmc.variational.flipout`, whose docstring has the equations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.distributions.util import is_identically_one, scale_and_mask
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger
from pyro.poutine.trace_struct import Trace
from pyro.poutine.util import site_is_subsample
from torch import nn
from torch.distributions import biject_to

from .._validation import check_positive_int
from ..models.structure import DataPlate, GlobalSitesFirst
from .flipout_estimators import autonormal_loc_and_scale, check_estimator, layer_perturbation

__all__ = [
    "SUPPORTED_LAYERS",
    "BayesianLayer",
    "LayerNoise",
    "bayesian_layers",
    "check_layer_model",
    "module_negative_elbo",
]

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
    :class:`~pyro_sgmcmc.models.structure.GlobalSitesFirst` wraps), else ``None``."""
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
        :class:`~pyro_sgmcmc.models.structure.GlobalSitesFirst`).
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
    <pyro_sgmcmc.models.structure.ModelStructure.trace>`). Latent sites that are not layer
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
      <pyro_sgmcmc.models.structure.DataPlate.bind>`) and mask, to :attr:`log_likelihood`.

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

    The counterpart of :func:`pyro_sgmcmc.variational.svi.minibatch_elbo_loss` (same arguments, same
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
        :class:`~pyro_sgmcmc.models.structure.GlobalSitesFirst`.
    guide:
        An ``AutoNormal`` guide of ``model`` that has been run once.
    subsample:
        Row indices of the minibatch; ``None`` for all rows.
    *args, **kwargs:
        The model's arguments (full data).
    plate:
        The model's :class:`~pyro_sgmcmc.models.structure.DataPlate` (any of its three idioms),
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
