r"""Likelihood heads of :class:`~pyro_sgmcmc.nn.BayesianMLP`.

A head maps the network output :math:`f_\theta(x)` to the distribution of :math:`y`:

* :class:`NormalLikelihood`: :math:`y \sim \mathcal N(f_\theta(x), \sigma^2)` with a fixed
  :math:`\sigma`, a latent ``noise_scale`` with any positive prior, or a latent
  ``noise_precision`` :math:`\tau = \sigma^{-2} \sim \mathrm{Gamma}(a, b)` that the SG-MCMC
  kernels can update by exact Gibbs steps.
* :class:`HeteroscedasticNormalLikelihood`: the network outputs a mean and a log-variance per
  response, :math:`y \sim \mathcal N(\mu_\theta(x), \exp(s_\theta(x)))` (Kendall & Gal 2017).
* :class:`CategoricalLikelihood`:
  :math:`y \sim \mathrm{Categorical}(\mathrm{softmax}(f_\theta(x)))`.

Regression targets have shape ``(N,)`` when there is one response and ``(N, D)`` otherwise;
class labels have shape ``(N,)`` (integers in ``[0, K)``).

References
----------
A. Kendall and Y. Gal, "What uncertainties do we need in Bayesian deep learning for computer
vision?", NeurIPS 2017.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule, PyroSample

from .._validation import check_positive
from .priors import GammaPrecision, event_numel, placed, sum_event

__all__ = [
    "CategoricalLikelihood",
    "HeteroscedasticNormalLikelihood",
    "Likelihood",
    "NormalLikelihood",
]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class Likelihood:
    """Base class of the heads.

    Attributes
    ----------
    outputs_per_response:
        Network outputs needed per response (1, or 2 for mean and log-variance).
    is_classifier:
        Whether the targets are class labels.
    """

    outputs_per_response = 1
    is_classifier = False

    def attach(self, module: PyroModule) -> tuple[str, ...]:
        """Declare the head's latent sites on ``module``; return their names."""
        return ()

    def log_prior(
        self, params: Mapping[str, torch.Tensor], batch_ndim: int = 0
    ) -> torch.Tensor | float:
        """Log prior density of the head's latent sites (0 when it has none).

        With ``batch_ndim`` leading draw dimensions it has one value per draw.
        """
        return 0.0

    def distribution(
        self, output: torch.Tensor, module: PyroModule, num_responses: int
    ) -> dist.Distribution:
        """The distribution of the targets of a batch (batch shape: rows)."""
        raise NotImplementedError

    def log_likelihood(
        self,
        output: torch.Tensor,
        y: torch.Tensor,
        params: Mapping[str, torch.Tensor],
        num_responses: int,
        batch_ndim: int = 0,
    ) -> torch.Tensor:
        """:math:`\\sum_i \\log p(y_i \\mid \\theta)` over the rows of a batch (fast path).

        With ``batch_ndim`` leading draw (or chain) dimensions on ``output``, ``y`` and the
        head's latent ``params``, the sum runs over the rows of each draw: one value per draw.
        """
        raise NotImplementedError

    def mean_and_variance(
        self,
        output: torch.Tensor,
        params: Mapping[str, torch.Tensor],
        num_responses: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance of :math:`y` for one or more draws (regression heads).

        ``output`` has shape ``(..., rows, outputs)``; ``params`` values carry the same leading
        draw dimensions. Returns tensors of shape ``(..., rows, num_responses)``.
        """
        raise NotImplementedError(f"{type(self).__name__} is not a regression head")


def _squeeze(t: torch.Tensor, num_responses: int) -> torch.Tensor:
    return t.squeeze(-1) if num_responses == 1 else t


def _event(d: dist.Distribution, num_responses: int) -> dist.Distribution:
    return d if num_responses == 1 else d.to_event(1)


class NormalLikelihood(Likelihood):
    r"""Normal likelihood with homoscedastic noise.

    Give at most one of ``scale`` and ``precision``; the default is a fixed :math:`\sigma = 1`.

    Parameters
    ----------
    scale:
        A float :math:`\sigma > 0` (fixed noise), or a Pyro distribution over :math:`(0, \infty)`
        (e.g. ``dist.HalfNormal(1.0)``): the prior of the latent site ``noise_scale``.
    precision:
        A :class:`~pyro_sgmcmc.nn.GammaPrecision` ``(a, b)``: the latent site
        ``noise_precision`` :math:`\tau \sim \mathrm{Gamma}(a, b)` with :math:`\sigma =
        \tau^{-1/2}`, Gibbs-updated by the SG-MCMC kernels (conjugate to the Normal likelihood).
    """

    def __init__(
        self,
        scale: float | dist.Distribution | None = None,
        precision: GammaPrecision | None = None,
    ) -> None:
        if scale is not None and precision is not None:
            raise ValueError("give at most one of scale and precision")
        self.precision = None
        self.scale_prior = None
        self.scale = None
        if precision is not None:
            if not isinstance(precision, GammaPrecision):
                raise ValueError(
                    f"precision must be a GammaPrecision(alpha, beta), got {precision!r}"
                )
            self.precision = precision
        elif isinstance(scale, torch.distributions.Distribution):
            if scale.event_shape or scale.batch_shape:
                raise ValueError("scale must be a scalar distribution (no batch or event shape)")
            support = scale.support
            if not bool(support.check(torch.tensor(1.0))) or bool(
                support.check(torch.tensor(-1.0))
            ):
                raise ValueError(f"scale prior must have positive support, got {support}")
            self.scale_prior = scale
        else:
            self.scale = check_positive("scale", 1.0 if scale is None else scale)
            self._log_norm = math.log(self.scale) + _HALF_LOG_2PI
            self._half_precision = 0.5 / self.scale**2

    @property
    def noise_site(self) -> str | None:
        """The latent noise site (``noise_precision``, ``noise_scale``) or ``None``."""
        if self.precision is not None:
            return "noise_precision"
        if self.scale_prior is not None:
            return "noise_scale"
        return None

    def attach(self, module: PyroModule) -> tuple[str, ...]:
        if self.precision is not None:
            module.noise_precision = placed(
                module, dist.Gamma, self.precision.alpha, self.precision.beta
            )
            return ("noise_precision",)
        if self.scale_prior is not None:
            module.noise_scale = PyroSample(self.scale_prior)
            return ("noise_scale",)
        return ()

    def _sigma(self, module: PyroModule) -> torch.Tensor | float:
        if self.precision is not None:
            return module.noise_precision.rsqrt()
        if self.scale_prior is not None:
            return module.noise_scale
        return self.scale

    def distribution(self, output, module, num_responses):
        loc = _squeeze(output, num_responses)
        return _event(dist.Normal(loc, self._sigma(module)), num_responses)

    def log_prior(
        self, params: Mapping[str, torch.Tensor], batch_ndim: int = 0
    ) -> torch.Tensor | float:
        """Log prior density of the noise site (0 for a fixed scale)."""
        if self.precision is not None:
            return self.precision.log_prob_hyper(params["noise_precision"])
        if self.scale_prior is not None:
            return self.scale_prior.log_prob(params["noise_scale"])
        return 0.0

    def log_likelihood(self, output, y, params, num_responses, batch_ndim=0):
        r = _squeeze(output, num_responses) - y
        n = event_numel(r, batch_ndim)
        ss = sum_event(r.square(), batch_ndim)
        if self.precision is not None:
            tau = params["noise_precision"]
            return 0.5 * n * tau.log() - n * _HALF_LOG_2PI - 0.5 * tau * ss
        if self.scale_prior is not None:
            sigma = params["noise_scale"]
            return -n * (sigma.log() + _HALF_LOG_2PI) - 0.5 * ss / sigma.square()
        return -n * self._log_norm - self._half_precision * ss

    def noise_variance(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor | float:
        """:math:`\\sigma^2`, with the leading draw dimensions of ``params`` if latent."""
        if self.precision is not None:
            return params["noise_precision"].reciprocal()
        if self.scale_prior is not None:
            return params["noise_scale"].square()
        return self.scale**2

    def mean_and_variance(self, output, params, num_responses):
        var = self.noise_variance(params)
        if isinstance(var, torch.Tensor):
            var = var.reshape(var.shape + (1,) * (output.dim() - var.dim()))
        var = torch.as_tensor(var, dtype=output.dtype, device=output.device)
        return output, var.expand_as(output)

    def __repr__(self) -> str:
        if self.precision is not None:
            return f"NormalLikelihood(precision={self.precision!r})"
        if self.scale_prior is not None:
            return f"NormalLikelihood(scale={self.scale_prior!r})"
        return f"NormalLikelihood(scale={self.scale})"


class HeteroscedasticNormalLikelihood(Likelihood):
    r"""Normal likelihood whose variance is an output of the network.

    The last layer has :math:`2D` outputs: :math:`\mu_\theta(x)` (the first :math:`D`) and
    :math:`s_\theta(x) = \log \sigma^2_\theta(x)` (the last :math:`D`), and
    :math:`y \sim \mathcal N(\mu_\theta(x), e^{s_\theta(x)})`.
    """

    outputs_per_response = 2

    @staticmethod
    def split(output: torch.Tensor, num_responses: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-variance parts of the network output."""
        return output[..., :num_responses], output[..., num_responses:]

    def distribution(self, output, module, num_responses):
        loc, log_var = self.split(output, num_responses)
        scale = (0.5 * log_var).exp()
        loc, scale = _squeeze(loc, num_responses), _squeeze(scale, num_responses)
        return _event(dist.Normal(loc, scale), num_responses)

    def log_likelihood(self, output, y, params, num_responses, batch_ndim=0):
        loc, log_var = self.split(output, num_responses)
        if num_responses == 1:
            y = y.unsqueeze(-1)
        r2 = (y - loc).square()
        return (
            -0.5 * sum_event(log_var + r2 * (-log_var).exp(), batch_ndim)
            - event_numel(r2, batch_ndim) * _HALF_LOG_2PI
        )

    def mean_and_variance(self, output, params, num_responses):
        loc, log_var = self.split(output, num_responses)
        return loc, log_var.exp()

    def __repr__(self) -> str:
        return "HeteroscedasticNormalLikelihood()"


class CategoricalLikelihood(Likelihood):
    r"""Categorical over the network's logits.

    :math:`y \sim \mathrm{Categorical}(\mathrm{softmax}(f_\theta(x)))`.
    """

    is_classifier = True

    def distribution(self, output, module, num_responses):
        return dist.Categorical(logits=output)

    def log_likelihood(self, output, y, params, num_responses, batch_ndim=0):
        if batch_ndim == 0 and output.dim() == 2:
            return -F.cross_entropy(output, y, reduction="sum")
        # cross_entropy reads dimension 1 as the classes: flatten the draw dimensions first
        y = y.expand(output.shape[:-1])
        per_row = F.cross_entropy(
            output.reshape(-1, output.shape[-1]), y.reshape(-1), reduction="none"
        )
        return -sum_event(per_row.reshape(output.shape[:-1]), batch_ndim)

    def __repr__(self) -> str:
        return "CategoricalLikelihood()"
