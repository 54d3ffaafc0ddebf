r"""A Bayesian multi-layer perceptron as a Pyro model (``PyroModule`` with ``PyroSample`` priors).

The model, for layers :math:`l = 0, \dots, L-1` with weights :math:`W_l` and biases :math:`b_l`,

.. math::

    h_0 = x, \qquad h_{l+1} = \phi(W_l h_l + b_l) \ (l < L-1), \qquad
    f_\theta(x) = W_{L-1} h_{L-1} + b_{L-1}, \qquad
    y_i \mid \theta \sim p(y \mid f_\theta(x_i)),

with the priors of :mod:`pyro_sgmcmc.nn.priors` on :math:`\theta = \{W_l, b_l\}` and a head of
:mod:`pyro_sgmcmc.nn.likelihoods`.

It follows the data-plate contract of the SG-MCMC kernels: the network is evaluated *outside*
``pyro.plate("data", N)`` on the rows the plate yields (a minibatch when a kernel conditions the
plate's index site, all rows under NUTS, SVI or ``Predictive``), and only the observation sits
inside the plate, so no prior is ever scaled by :math:`N/B`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyro
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule
from torch import nn

from .._validation import check_positive, check_positive_int
from ..errors import ModelContractError
from ..models.conjugate import NormalGammaPrecisionUpdate, NormalNoisePrecisionUpdate
from ..models.gibbs import GibbsUpdate
from .likelihoods import (
    CategoricalLikelihood,
    HeteroscedasticNormalLikelihood,
    Likelihood,
    NormalLikelihood,
)
from .priors import GammaPrecision, NormalPrior, Prior, ScaleMixturePrior

__all__ = ["ACTIVATIONS", "BayesianMLP"]

#: Activations known by name.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh,
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
    "elu": F.elu,
    "gelu": F.gelu,
    "silu": F.silu,
}

#: Back-propagation through the activations: ``g`` times the derivative, as a function of the
#: activation's *output* ``h`` (analytic gradient path; two operations each, ``g`` reused).
_BACKWARD: dict[
    Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
]
_BACKWARD = {
    torch.tanh: lambda g, h: torch.addcmul(g, g * h, h, value=-1),  # g (1 - h^2)
    torch.sigmoid: lambda g, h: g.mul_(torch.addcmul(h, h, h, value=-1)),  # g h (1 - h)
    torch.relu: lambda g, h: g.mul_(h > 0),
}


def _take_rows(data: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``data[rows]`` for an integer index tensor of any shape, by ``index_select`` (a gather of
    whole rows, about twice as fast as advanced indexing for a minibatch of wide rows)."""
    if rows.dtype == torch.bool or rows.dtype.is_floating_point:
        return data[rows]
    flat = data.index_select(0, rows.reshape(-1).to(data.device))
    return flat.reshape(*rows.shape, *data.shape[1:])


_LIKELIHOODS: dict[str, Callable[[], Likelihood]] = {
    "normal": NormalLikelihood,
    "heteroscedastic": HeteroscedasticNormalLikelihood,
    "categorical": CategoricalLikelihood,
}

_PRIORS: dict[str, Callable[[], Prior]] = {
    "normal": NormalPrior,
    "scale_mixture": ScaleMixturePrior,
    "gamma_precision": GammaPrecision,
}


def _resolve(value: Any, table: Mapping[str, Callable[[], Any]], kind: type, name: str) -> Any:
    if isinstance(value, str):
        if value not in table:
            raise ValueError(
                f"{name} must be one of {sorted(table)} or a {kind.__name__}, got {value!r}"
            )
        return table[value]()
    if not isinstance(value, kind):
        raise ValueError(
            f"{name} must be one of {sorted(table)} or a {kind.__name__}, got {value!r}"
        )
    return value


class BayesianMLP(PyroModule):
    r"""Fully connected Bayesian neural network; a Pyro model ``model(x, y=None)``.

    Latent sites (names as they appear in ``mcmc.get_samples()`` and in ArviZ):
    ``layers.{l}.weight`` (shape ``(out, in)``), ``layers.{l}.bias`` (shape ``(out,)``), with
    :class:`GammaPrecision` also ``layers.{l}.weight_precision`` and ``layers.{l}.bias_precision``,
    and the head's noise site ``noise_precision`` or ``noise_scale`` when it has one.

    Observed site ``obs`` and deterministic site ``output`` (the network output
    :math:`f_\theta(x)` of shape ``(rows, outputs)``: the mean, or mean and log-variance, or the
    logits) sit inside ``pyro.plate("data", N)``; ``forward`` also returns ``output``.
    ``pyro.infer.Predictive(model, posterior_samples=...)(x)`` therefore yields ``obs`` and
    ``output`` per draw, and :func:`pyro_sgmcmc.analysis.predictive.posterior_predictive` computes
    the predictive summaries directly from the draws with :meth:`functional_forward`.

    Parameters
    ----------
    in_features:
        Input dimension, ``>= 1``.
    hidden_features:
        Widths of the hidden layers (each ``>= 1``; may be empty for a generalised linear model).
    out_features:
        Number of responses :math:`D` (regression) or classes :math:`K` (classification), ``>= 1``.
    activation:
        A name in :data:`ACTIVATIONS` or a callable applied element-wise after each hidden layer.
    likelihood:
        ``"normal"`` (fixed :math:`\sigma = 1`), ``"heteroscedastic"``, ``"categorical"`` or a
        head object such as ``NormalLikelihood(precision=GammaPrecision(1.0, 0.1))``.
    prior:
        ``"normal"`` (:math:`\mathcal N(0, 1)`), ``"scale_mixture"``, ``"gamma_precision"`` (with
        default arguments) or a prior object such as ``NormalPrior(0.5)``,
        ``ScaleMixturePrior(0.5, 1.0, 0.01)`` or ``GammaPrecision(1.0, 1.0)``.
    likelihood_temperature:
        :math:`T_\ell > 0`: the likelihood enters as :math:`p(y \mid \theta)^{1/T_\ell}` (a
        *cold likelihood* for :math:`T_\ell < 1`) while the prior is left as it is. In the Pyro
        model this is ``pyro.poutine.scale(scale=1/T)`` on ``obs``; ``log_joint``, the closed-form
        gradient, the Gibbs update of a Gamma noise precision and the Flipout/local
        reparameterisation ELBO apply the same weight; ``log_likelihood`` in the ArviZ export
        stays the untempered one. Unlike the kernels' ``temperature``, which tempers the whole
        posterior :math:`p(\theta \mid y)^{1/T}`, it keeps hierarchical priors proper: under a
        cold *posterior* the joint density of a :class:`GammaPrecision` prior grows without
        bound as :math:`w \to 0,\ \lambda \to \infty`, and the Gibbs-updated precisions run
        away. Default ``1`` (the posterior).

    Examples
    --------
    >>> model = BayesianMLP(4, [8], 3, likelihood="categorical", prior=GammaPrecision(1.0, 1.0))
    >>> [update.sites for update in model.gibbs_updates()][:2]
    [('layers.0.weight_precision',), ('layers.0.bias_precision',)]
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: Sequence[int],
        out_features: int,
        activation: str | Callable[[torch.Tensor], torch.Tensor] = "tanh",
        likelihood: str | Likelihood = "normal",
        prior: str | Prior = "normal",
        likelihood_temperature: float = 1.0,
    ) -> None:
        super().__init__()
        self.likelihood_temperature = check_positive(
            "likelihood_temperature", likelihood_temperature
        )
        in_features = check_positive_int("in_features", in_features)
        out_features = check_positive_int("out_features", out_features)
        if isinstance(hidden_features, int):
            hidden_features = [hidden_features]
        if not isinstance(hidden_features, Sequence) or isinstance(hidden_features, str):
            raise TypeError(
                "hidden_features must be a positive int or a sequence of positive ints (e.g. "
                f"[50] or [100, 100]; [] for no hidden layer), got {hidden_features!r}"
            )
        hidden = [check_positive_int("hidden_features[i]", h) for h in hidden_features]
        if isinstance(activation, str):
            if activation not in ACTIVATIONS:
                raise ValueError(
                    f"activation must be one of {sorted(ACTIVATIONS)} or a callable, "
                    f"got {activation!r}"
                )
            activation_fn = ACTIVATIONS[activation]
        elif callable(activation):
            activation_fn = activation
        else:
            raise ValueError(f"activation must be a name or a callable, got {activation!r}")
        self.head: Likelihood = _resolve(likelihood, _LIKELIHOODS, Likelihood, "likelihood")
        self.prior: Prior = _resolve(prior, _PRIORS, Prior, "prior")
        if self.head.is_classifier and out_features < 2:
            raise ValueError(f"out_features must be >= 2 for a classifier, got {out_features}")
        self.in_features = in_features
        self.hidden_features = tuple(hidden)
        self.out_features = out_features
        # hidden units can be permuted: judge convergence on the outputs
        # (pyro_sgmcmc.analysis.diagnostics)
        self.function_space = bool(hidden)
        self.activation = activation_fn

        sizes = [in_features, *hidden, out_features * self.head.outputs_per_response]
        self.layers = PyroModule[nn.ModuleList](
            [PyroModule[nn.Linear](a, b) for a, b in itertools.pairwise(sizes)]
        )
        layer_sites, group_sites, sites = [], [], []
        for index, layer in enumerate(self.layers):
            names = []
            for attr, shape in (
                ("weight", (layer.out_features, layer.in_features)),
                ("bias", (layer.out_features,)),
            ):
                hyper = self.prior.attach(layer, attr, shape)
                site = f"layers.{index}.{attr}"
                sites += [f"layers.{index}.{h}" for h in hyper] + [site]
                names.append(site)
            layer_sites.append(tuple(names))
            group_sites += names
        sites += list(self.head.attach(self))
        self._layer_sites: tuple[tuple[str, str], ...] = tuple(layer_sites)
        self._group_sites: tuple[str, ...] = tuple(group_sites)
        self._latent_sites: tuple[str, ...] = tuple(sites)

    # ------------------------------------------------------------------ structure
    @property
    def latent_sites(self) -> tuple[str, ...]:
        """Names of the latent sites, in the order the model samples them."""
        return self._latent_sites

    @property
    def likelihood(self) -> Likelihood:
        """The likelihood head."""
        return self.head

    @property
    def likelihood_weight(self) -> float:
        r""":math:`1 / T_\ell`, the power of the likelihood (``1 / likelihood_temperature``)."""
        return 1.0 / self.likelihood_temperature

    def site_shapes(self) -> dict[str, torch.Size]:
        """Shape of one draw of each latent site."""
        shapes: dict[str, torch.Size] = {}
        for index, layer in enumerate(self.layers):
            for attr, shape in (
                ("weight", (layer.out_features, layer.in_features)),
                ("bias", (layer.out_features,)),
            ):
                for hyper in self.prior.hyper_sites(attr):
                    shapes[f"layers.{index}.{hyper}"] = torch.Size()
                shapes[f"layers.{index}.{attr}"] = torch.Size(shape)
        for name in self._latent_sites:
            shapes.setdefault(name, torch.Size())
        return {name: shapes[name] for name in self._latent_sites}

    # ------------------------------------------------------------------ data checks
    def check_data(self, x: Any, y: Any = None, *, dtype: torch.dtype | None = None) -> None:
        """Refuse inputs that do not fit the network, naming the argument and what is allowed.

        ``x`` must be a floating ``torch.Tensor`` of shape ``(rows, in_features)`` (of ``dtype``
        when given, the dtype of the weights); ``y`` of shape ``(rows,)`` (one response, or
        class labels) or ``(rows, out_features)``; class labels must be integers in
        ``[0, out_features)``, and floating responses must have ``x``'s dtype.

        Raises
        ------
        TypeError
            For ``x`` or ``y`` that are not tensors (NumPy arrays, lists).
        ModelContractError
            For a wrong shape, dtype or a label outside the classes.
        """
        for name, value in (("x", x), ("y", y)):
            if value is not None and not isinstance(value, torch.Tensor):
                kind = "numpy.ndarray" if isinstance(value, np.ndarray) else type(value).__name__
                raise TypeError(
                    f"{name} must be a torch.Tensor for BayesianMLP, got {kind}: "
                    f"convert it first, e.g. torch.as_tensor({name}"
                    + (", dtype=torch.float32)" if name == "x" else ")")
                )
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ModelContractError(
                f"x must have shape (rows, in_features) = (rows, {self.in_features}) for this "
                f"BayesianMLP, got {tuple(x.shape)}"
                + (": add the feature dimension, x.unsqueeze(-1)" if x.dim() == 1 else "")
            )
        if not x.is_floating_point() or (dtype is not None and x.dtype != dtype):
            wanted = dtype or torch.get_default_dtype()
            raise ModelContractError(
                f"x must be a floating tensor of the weights' dtype {wanted}, got {x.dtype}: "
                f"convert it with x.to({wanted})"
            )
        if y is None:
            return
        rows = x.shape[0]
        single = self.head.is_classifier or self.out_features == 1
        expected = (rows,) if single else (rows, self.out_features)
        if tuple(y.shape) != expected:
            raise ValueError(
                f"y must have shape {expected} for this BayesianMLP "
                f"({'labels' if self.head.is_classifier else 'responses'}), got "
                f"{tuple(y.shape)}"
            )
        if self.head.is_classifier:
            _check_labels(y, self.out_features)
        elif y.is_floating_point() and y.dtype != x.dtype:
            raise ModelContractError(
                f"y has dtype {y.dtype} but x has dtype {x.dtype}: give both the weights' dtype "
                f"(y.to({x.dtype}))"
            )

    # ------------------------------------------------------------------ Pyro model
    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """Run the model on the rows the data plate yields; return the network output there."""
        self.check_data(x, y)
        data_plate = pyro.plate("data", x.shape[0], device=x.device)  # indices beside the data
        idx = data_plate.indices
        h = _take_rows(x, idx)
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            weight = layer.weight
            if index == 0 and weight.dtype != x.dtype:
                self.check_data(x, dtype=weight.dtype)
            h = F.linear(h, weight, layer.bias)
            if index < last:
                h = self.activation(h)
        obs_dist = self.head.distribution(h, self, self.out_features)
        with data_plate:
            pyro.deterministic("output", h, event_dim=1)
            with pyro.poutine.scale(scale=self.likelihood_weight):
                pyro.sample("obs", obs_dist, obs=None if y is None else _take_rows(y, idx))
        return h

    # ------------------------------------------------------------------ fast path
    def functional_forward(
        self, params: Mapping[str, torch.Tensor], x: torch.Tensor
    ) -> torch.Tensor:
        r"""Network output :math:`f_\theta(x)` for constrained ``params``, in plain torch.

        ``params`` may carry leading draw dimensions (e.g. ``(S, out, in)`` weights); the output
        then has shape ``(S, rows, outputs)``.
        """
        h = x
        last = len(self._layer_sites) - 1
        for index, (w_site, b_site) in enumerate(self._layer_sites):
            w, b = params[w_site], params[b_site]
            if w.dim() == 2:
                h = F.linear(h, w, b)
            else:
                h = torch.matmul(h, w.transpose(-1, -2)) + b.unsqueeze(-2)
            if index < last:
                h = self.activation(h)
        return h

    def log_prior(self, params: Mapping[str, torch.Tensor], batch_ndim: int = 0) -> torch.Tensor:
        """:math:`\\log p(\\theta)`: weights, biases, their hyper-parameters and the noise site.

        With ``batch_ndim`` leading draw (or chain) dimensions on ``params``, one value per draw.
        """
        prior = self.prior
        if batch_ndim == 0:
            # keep the call signature of user-defined priors that predate ``batch_ndim``
            total = prior.log_prob(params, self._group_sites[0])
            for site in self._group_sites[1:]:
                total = total + prior.log_prob(params, site)
            return total + self.head.log_prior(params)
        total = prior.log_prob(params, self._group_sites[0], batch_ndim)
        for site in self._group_sites[1:]:
            total = total + prior.log_prob(params, site, batch_ndim)
        return total + self.head.log_prior(params, batch_ndim)

    def batch_ndim(self, params: Mapping[str, torch.Tensor]) -> int:
        """Number of leading draw (or chain) dimensions of ``params``."""
        return params[self._layer_sites[0][0]].dim() - 2

    def log_joint(
        self,
        params: Mapping[str, torch.Tensor],
        subsample: torch.Tensor | None,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
    ) -> torch.Tensor:
        r"""Minibatch log joint density (the fast path of the SG-MCMC kernels).

        .. math::

            \log p(\theta) + \frac{N}{B} \sum_{i \in S} \log p(y_i \mid f_\theta(x_i)),

        for constrained ``params`` keyed by site name and the rows ``subsample`` (``None``: all
        ``N`` rows, :math:`B = N`). Plain torch, no effect handlers; equal to the log density of
        the model's Pyro trace with the data plate conditioned on ``subsample``.

        **Batched (multi-chain) use.** ``params`` may carry leading chain dimensions, e.g.
        ``(C, out, in)`` weights, and ``subsample`` may then have shape ``(C, B)`` (each chain its
        own minibatch) or ``(B,)`` (shared). The result has shape ``(C,)``, one log joint per
        chain, so the gradient of its sum holds each chain's own gradient.
        """
        if y is None:
            raise ValueError("log_joint needs the targets y")
        if subsample is None:
            xb, yb, scale = x, y, self.likelihood_weight
        else:
            xb, yb = _take_rows(x, subsample), _take_rows(y, subsample)
            scale = self.likelihood_weight * x.shape[0] / subsample.shape[-1]
        batch_ndim = self.batch_ndim(params)
        output = self.functional_forward(params, xb)
        if batch_ndim == 0:
            log_lik = self.head.log_likelihood(output, yb, params, self.out_features)
        else:
            log_lik = self.head.log_likelihood(output, yb, params, self.out_features, batch_ndim)
        return self.log_prior(params, batch_ndim) + scale * log_lik

    # ------------------------------------------------------------------ analytic gradient
    @property
    def has_analytic_gradient(self) -> bool:
        """Whether :meth:`log_joint_and_gradient` applies: a :class:`NormalPrior` or a
        :class:`GammaPrecision` prior, a fixed-scale :class:`NormalLikelihood` or a
        :class:`CategoricalLikelihood`, and a tanh, sigmoid or relu activation. The gradient is
        with respect to :attr:`analytic_gradient_sites` (weights and biases) only: Gamma
        precisions must be held fixed, as the Gibbs updates do."""
        head = self.head
        normal_head = isinstance(head, NormalLikelihood) and head.scale is not None
        return (
            type(self.prior) in (NormalPrior, GammaPrecision)
            and (normal_head or isinstance(head, CategoricalLikelihood))
            and self.activation in _BACKWARD
        )

    @property
    def analytic_gradient_sites(self) -> tuple[str, ...]:
        """The sites :meth:`log_joint_and_gradient` differentiates: the weights and biases."""
        return self._group_sites

    @property
    def flat_gaussian_prior(self) -> tuple[float, float] | None:
        r"""``(precision, log_norm)`` of the fixed :class:`NormalPrior` :math:`N(0, \sigma^2)`
        on every weight and bias (:math:`1/\sigma^2` and :math:`\log\sigma +
        \frac12\log 2\pi`), else ``None``. With it, a potential over the flat vector :math:`z`
        of all weights and biases adds :math:`-\log p(z) = \frac{|z|^2}{2\sigma^2} + D\,
        \mathrm{log\_norm}` in one reduction, and :meth:`log_likelihood_and_gradient` gives the
        rest."""
        if type(self.prior) is not NormalPrior:
            return None
        return 2.0 * self.prior._half_precision, self.prior._log_norm

    def log_joint_and_gradient(
        self,
        params: Mapping[str, torch.Tensor],
        subsample: torch.Tensor | None,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        r"""Batched :meth:`log_joint` and its gradient, by hand-written back-propagation.

        For ``params`` with one leading chain dimension :math:`C` and ``subsample`` of shape
        ``(C, B)`` or ``None``, returns the ``(C,)`` log joints and their gradients with
        respect to each weight and bias site: :meth:`log_likelihood_and_gradient` plus the
        prior's :math:`\partial \log p / \partial W_l = -W_l / \sigma_p^2` (the same for the
        biases). With a :class:`GammaPrecision` prior :math:`1/\sigma_p^2` is the group's
        precision :math:`\lambda_g` from ``params`` (held fixed: no gradient is returned for
        it). Only when :attr:`has_analytic_gradient`; the tests compare it with autograd
        through :meth:`log_joint`.
        """
        log_joint, grads = self.log_likelihood_and_gradient(params, subsample, x, y)
        gamma = isinstance(self.prior, GammaPrecision)
        for site in (site for pair in self._layer_sites for site in pair):
            grad, value = grads[site], params[site]
            if gamma:  # d/dw log N(w | 0, 1/lambda) = -lambda w, one lambda per chain and group
                precision = params[site + GammaPrecision.suffix]
                grad.addcmul_(value, precision.reshape(-1, *[1] * (grad.dim() - 1)), value=-1)
            else:
                grad.sub_(value, alpha=2.0 * self.prior._half_precision)  # type: ignore[attr-defined]
        return log_joint.add_(self.log_prior(params, 1)), grads

    def log_likelihood_and_gradient(
        self,
        params: Mapping[str, torch.Tensor],
        subsample: torch.Tensor | None,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        r"""The ``(C,)`` scaled minibatch log likelihoods :math:`\frac{N}{B}\log p(y_S \mid
        \theta)` (times ``likelihood_weight``) and their gradients with respect to each weight
        and bias site, by hand-written back-propagation (no prior term; see
        :meth:`log_joint_and_gradient` for the shapes).

        With :math:`a_l = h_l W_l^\top + b_l`, :math:`h_{l+1} = \phi(a_l)` and :math:`G_l =
        \partial \log p / \partial a_l`,

        .. math::

            G_{L-1} = \frac{N}{B}\,\frac{\partial \log p(y \mid f)}{\partial f}, \quad
            \frac{\partial}{\partial W_l} = G_l^\top h_l, \quad
            \frac{\partial}{\partial b_l} = \mathbf 1^\top G_l, \quad
            G_{l-1} = (G_l W_l) \odot \phi'(a_{l-1}),

        with :math:`\partial \log p / \partial f = -(f - y)/\sigma^2` (Normal head) or
        :math:`\mathrm{onehot}(y) - \mathrm{softmax}(f)` (categorical head), times
        ``1 / likelihood_temperature``. A small network spends most of an autograd step in the
        engine's per-node overhead (for the 1-20-20-1 sinusoid network, about half the step);
        this costs a handful of batched matrix products.
        """
        if not self.has_analytic_gradient:
            raise ValueError(
                f"log_joint_and_gradient needs a NormalPrior, a fixed-scale Normal or a "
                f"categorical head and a tanh, sigmoid or relu activation; this is {self!r}"
            )
        if y is None:
            raise ValueError("log_joint_and_gradient needs the targets y")
        if self.batch_ndim(params) != 1:
            raise ValueError("log_joint_and_gradient needs params with one leading chain dim")
        if subsample is None:
            h, yb, scale = x, y, self.likelihood_weight
        else:
            h, yb = _take_rows(x, subsample), _take_rows(y, subsample)
            scale = self.likelihood_weight * x.shape[0] / subsample.shape[-1]
        inputs, outputs = self._forward_layers(params, h)
        log_lik, grad_f = self._head_and_gradient(outputs[-1], yb, scale)
        return log_lik.mul_(scale), self._back_propagate(params, inputs, outputs, grad_f)

    def _forward_layers(self, params, h) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each layer's input and output (the activation applied but on the last)."""
        last = len(self._layer_sites) - 1
        inputs, outputs = [], []
        for index, (w_site, b_site) in enumerate(self._layer_sites):
            w, b = params[w_site], params[b_site]
            inputs.append(h)
            rows = h if h.dim() == 3 else h.expand(w.shape[0], *h.shape)  # shared by the chains
            a = torch.baddbmm(b.unsqueeze(1), rows, w.transpose(1, 2))
            h = self.activation(a) if index < last else a
            outputs.append(h)
        return inputs, outputs

    def _head_and_gradient(self, f, yb, scale) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(C,)`` unscaled log likelihoods of the outputs ``f`` (``(C, B, K)``) and
        ``scale`` times their gradient with respect to ``f``."""
        head = self.head
        if isinstance(head, NormalLikelihood):
            residual = f.squeeze(-1) - yb if self.out_features == 1 else f - yb
            # log p(y | f) = -(rows log_norm + half_precision sum r^2)
            log_lik = residual.flatten(1).square().sum(-1)
            log_lik = log_lik.mul_(-head._half_precision).sub_(residual[0].numel() * head._log_norm)
            return log_lik, residual.mul(-2 * head._half_precision * scale).reshape(f.shape)
        log_prob = f.log_softmax(-1)
        labels = yb.expand(f.shape[:-1]).unsqueeze(-1)
        log_lik = log_prob.gather(-1, labels).flatten(1).sum(-1)
        grad_f = log_prob.exp_().neg_()
        grad_f.scatter_add_(-1, labels, torch.ones_like(labels, dtype=f.dtype))
        return log_lik, grad_f.mul_(scale)

    def _back_propagate(self, params, inputs, outputs, g) -> dict[str, torch.Tensor]:
        """The gradients of each weight and bias from the output gradient ``g``."""
        backward = _BACKWARD[self.activation]
        grads: dict[str, torch.Tensor] = {}
        for index in range(len(self._layer_sites) - 1, -1, -1):
            w_site, b_site = self._layer_sites[index]
            grads[w_site] = torch.matmul(g.transpose(1, 2), inputs[index])
            grads[b_site] = g.sum(1)
            if index > 0:
                g = backward(torch.bmm(g, params[w_site]), outputs[index - 1])
        return grads

    # ------------------------------------------------------------------ Gibbs steps
    def gibbs_updates(self) -> list[GibbsUpdate]:
        """Exact conditional updates of the Gamma precisions, derived from the declared priors.

        One :class:`~pyro_sgmcmc.models.conjugate.NormalGammaPrecisionUpdate` per weight group when
        the prior is :class:`GammaPrecision`, and a
        :class:`~pyro_sgmcmc.models.conjugate.NormalNoisePrecisionUpdate` when the head is a
        :class:`NormalLikelihood` with a Gamma noise precision. Empty otherwise.
        """
        updates: list[GibbsUpdate] = []
        if isinstance(self.prior, GammaPrecision):
            for site in self._group_sites:
                (precision_site,) = self.prior.hyper_sites(site)
                updates.append(
                    NormalGammaPrecisionUpdate(
                        precision_site, (site,), self.prior.alpha, self.prior.beta
                    )
                )
        head = self.head
        if isinstance(head, NormalLikelihood) and head.precision is not None:
            updates.append(
                NormalNoisePrecisionUpdate(
                    "noise_precision",
                    head.precision.alpha,
                    head.precision.beta,
                    residuals=self.residuals,
                    num_data=_num_rows,
                    likelihood_weight=self.likelihood_weight,
                )
            )
        return updates

    def residuals(
        self,
        params: Mapping[str, torch.Tensor],
        rows: slice | torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Residuals :math:`y - \\mu_\\theta(x)` of the rows ``rows`` (Normal heads)."""
        if y is None:
            raise ValueError("residuals need the targets y")
        mean = self.functional_forward(params, x[rows])[..., : self.out_features]
        if self.out_features == 1:
            mean = mean.squeeze(-1)
        return y[rows] - mean

    def __repr__(self) -> str:
        sizes = [self.in_features, *self.hidden_features, self.out_features]
        tempered = (
            f", likelihood_temperature={self.likelihood_temperature}"
            if self.likelihood_temperature != 1.0
            else ""
        )
        return (
            f"BayesianMLP({'-'.join(map(str, sizes))}, likelihood={self.head!r}, "
            f"prior={self.prior!r}{tempered})"
        )


def _check_labels(y: torch.Tensor, num_classes: int) -> None:
    """Class labels must be integers in ``[0, num_classes)`` (named in the error otherwise)."""
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ModelContractError(
            f"y must hold integer class labels in [0, {num_classes}) (an int64 tensor) for a "
            f"classifier, got dtype {y.dtype}: convert whole-number labels with y.long()"
        )
    if y.numel() == 0:
        return
    low, high = int(y.min()), int(y.max())
    if low < 0 or high >= num_classes:
        bad = y[(y < 0) | (y >= num_classes)]
        raise ModelContractError(
            f"y holds {bad.numel()} label(s) outside the classes [0, {num_classes}) of this "
            f"classifier (out_features={num_classes}), e.g. {int(bad[0])}: labels must be "
            f"0, ..., {num_classes - 1}"
        )


def _num_rows(x: torch.Tensor, *args: Any, **kwargs: Any) -> int:
    return int(x.shape[0])
