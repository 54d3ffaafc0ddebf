r"""One draw of a mean-field layer's pre-activations under each gradient estimator.

The building blocks that both ELBO assemblies of :mod:`pyro_sgmcmc.variational.flipout` share: the
names of the estimators (:data:`ESTIMATORS`), the guide's :math:`\mu, \sigma` read from an
``AutoNormal`` (:func:`autonormal_loc_and_scale`), one draw of the pre-activations of a ``Linear``
layer given its means and scales (:func:`sample_preactivations`, used by the plain-torch
``BayesianMLP`` loss of :mod:`pyro_sgmcmc.variational.flipout_mlp`), and the per-example
perturbation that turns the output of a ``Linear``/``Conv`` layer at its means into a
local-reparameterisation or Flipout draw (:func:`layer_perturbation`, :func:`flipout_perturbation`,
used by the effect handler of :mod:`pyro_sgmcmc.variational.flipout_modules`). The equations are in
the docstring of :mod:`pyro_sgmcmc.variational.flipout`, the public entry that re-exports every
public name here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pyro.distributions import constraints
from pyro.infer.autoguide import AutoNormal
from torch import nn

__all__ = [
    "ESTIMATORS",
    "autonormal_loc_and_scale",
    "check_estimator",
    "flipout_perturbation",
    "layer_perturbation",
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
