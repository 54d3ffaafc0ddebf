r"""Weight priors of :class:`~pyro_sgmcmc.nn.BayesianMLP`.

Three priors over each weight matrix :math:`W` and bias vector :math:`b` of a layer:

* :class:`NormalPrior`: i.i.d. :math:`w \sim \mathcal N(0, \sigma^2)`.
* :class:`ScaleMixturePrior`: i.i.d. :math:`w \sim \pi\, \mathcal N(0, \sigma_1^2) +
  (1 - \pi)\, \mathcal N(0, \sigma_2^2)`, the prior of Blundell et al. (2015), as the
  distribution :class:`ScaleMixtureNormal`.
* :class:`GammaPrecision`: a hierarchical prior with one precision per group (each weight matrix
  and each bias vector, Neal 1996), :math:`\lambda_g \sim \mathrm{Gamma}(\alpha, \beta)` and
  :math:`w \mid \lambda_g \sim \mathcal N(0, \lambda_g^{-1})`. The precisions are latent sites
  ``<group>_precision`` (e.g. ``layers.0.weight_precision``), sampled jointly by NUTS or by exact
  Gibbs steps inside the SG-MCMC kernels (:mod:`pyro_sgmcmc.models.conjugate`).

Each prior describes itself twice: as ``PyroSample`` statements on a ``PyroModule`` (the Pyro
path) and as a closed-form ``log_prob`` of a dict of constrained values (the fast path of
:meth:`BayesianMLP.log_joint`). Tests check that the two agree.

References
----------
R. M. Neal, *Bayesian Learning for Neural Networks*, Springer, 1996.

C. Blundell, J. Cornebise, K. Kavukcuoglu and D. Wierstra, "Weight uncertainty in neural
networks", ICML 2015.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.distributions import TorchDistribution, constraints
from pyro.nn import PyroModule, PyroSample
from torch.distributions.utils import broadcast_all

from .._validation import check_interval, check_positive

__all__ = [
    "GammaPrecision",
    "NormalPrior",
    "Prior",
    "ScaleMixtureNormal",
    "ScaleMixturePrior",
]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def sum_event(values: torch.Tensor, batch_ndim: int = 0) -> torch.Tensor:
    """Sum ``values`` over every dimension after the first ``batch_ndim`` (draw or chain) ones."""
    if batch_ndim == 0:
        return values.sum()
    if values.dim() == batch_ndim:
        return values
    return values.flatten(batch_ndim).sum(-1)


def event_numel(values: torch.Tensor, batch_ndim: int = 0) -> int:
    """Number of elements of one draw of ``values`` (dimensions after ``batch_ndim``)."""
    return math.prod(values.shape[batch_ndim:])


class ScaleMixtureNormal(TorchDistribution):
    r"""Zero-mean scale mixture of two Normals (Blundell et al. 2015).

    .. math::

        p(w) = \pi\, \mathcal N(w \mid 0, \sigma_1^2) + (1 - \pi)\, \mathcal N(w \mid 0, \sigma_2^2)

    Usually :math:`\sigma_1 > \sigma_2`, with :math:`\sigma_2 \ll 1` so that many weights sit near
    zero while a few can be large (a smooth spike-and-slab).

    Parameters
    ----------
    mixture_weight:
        :math:`\pi \in (0, 1)`, the weight of the first component.
    scale1, scale2:
        :math:`\sigma_1, \sigma_2 > 0`.
    validate_args:
        Passed to :class:`torch.distributions.Distribution`.
    """

    arg_constraints: ClassVar[dict] = {
        "mixture_weight": constraints.unit_interval,
        "scale1": constraints.positive,
        "scale2": constraints.positive,
    }
    support = constraints.real
    has_rsample = False

    def __init__(
        self,
        mixture_weight: float | torch.Tensor,
        scale1: float | torch.Tensor,
        scale2: float | torch.Tensor,
        validate_args: bool | None = None,
    ) -> None:
        self.mixture_weight, self.scale1, self.scale2 = broadcast_all(
            mixture_weight, scale1, scale2
        )
        super().__init__(self.mixture_weight.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(ScaleMixtureNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        new.mixture_weight = self.mixture_weight.expand(batch_shape)
        new.scale1 = self.scale1.expand(batch_shape)
        new.scale2 = self.scale2.expand(batch_shape)
        super(ScaleMixtureNormal, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self) -> torch.Tensor:
        return torch.zeros_like(self.scale1)

    @property
    def variance(self) -> torch.Tensor:
        pi = self.mixture_weight
        return pi * self.scale1**2 + (1 - pi) * self.scale2**2

    def sample(self, sample_shape=()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            first = torch.rand(shape, dtype=self.scale1.dtype) < self.mixture_weight.expand(shape)
            scale = torch.where(first, self.scale1.expand(shape), self.scale2.expand(shape))
            return torch.randn(shape, dtype=scale.dtype) * scale

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        pi = self.mixture_weight
        log1 = torch.log(pi) - torch.log(self.scale1) - 0.5 * (value / self.scale1) ** 2
        log2 = torch.log1p(-pi) - torch.log(self.scale2) - 0.5 * (value / self.scale2) ** 2
        return torch.logaddexp(log1, log2) - _HALF_LOG_2PI


class _ScaleMixtureLogProbSum(torch.autograd.Function):
    r"""Fused scale-mixture log density :math:`\sum_j \log p(w_j)` and its gradient.

    With :math:`a_k = c_k - h_k w^2` (:math:`c_k` the log weight and normaliser, :math:`h_k =
    1/(2\sigma_k^2)`) and :math:`d = a_1 - a_2`, the log density is :math:`\max(a_1, a_2) +
    \operatorname{softplus}(-|d|)` and its derivative
    :math:`-2w\,[h_2 + (h_1 - h_2)\,\sigma(d)]` (:math:`\sigma` the logistic function, the
    responsibility of the first component). Autograd through ``torch.logaddexp`` costs about 50
    times more on CPU, which would dominate an SG-MCMC step.
    """

    @staticmethod
    def forward(
        ctx, w: torch.Tensor, c1: float, c2: float, h1: float, h2: float, batch_ndim: int = 0
    ) -> torch.Tensor:
        w2 = w * w
        log1 = w2.mul(-h1).add_(c1)
        log2 = w2.mul(-h2).add_(c2)
        d = w2.mul(h2 - h1).add_(c1 - c2)
        ctx.save_for_backward(w, d)
        ctx.h = (h1, h2)
        ctx.event_ndim = w.dim() - batch_ndim
        # log(e^a1 + e^a2) = max(a1, a2) + softplus(-|a1 - a2|), without the cancellation of
        # a2 + softplus(a1 - a2) when the narrow component's a2 is large and negative
        log_density = torch.where(d > 0, log1, log2).add_(F.softplus(-d.abs()))
        return sum_event(log_density, batch_ndim)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        w, d = ctx.saved_tensors
        h1, h2 = ctx.h
        factor = torch.sigmoid(d).mul_(h1 - h2).add_(h2)
        grad_output = grad_output.reshape(grad_output.shape + (1,) * ctx.event_ndim)
        return factor.mul_(w).mul_(-2.0 * grad_output), None, None, None, None, None


class Prior:
    """Base class of the weight priors; see the module docstring.

    Subclasses implement :meth:`attach` (the Pyro path) and :meth:`log_prob` (the fast path).
    ``log_prob`` takes ``batch_ndim``, the number of leading draw (or chain) dimensions of the
    values, and returns one log density per draw (a scalar when ``batch_ndim = 0``); the
    vectorised multi-chain runner (:mod:`pyro_sgmcmc.inference.vectorized`) relies on it.
    """

    def attach(self, module: PyroModule, name: str, shape: Sequence[int]) -> tuple[str, ...]:
        """Declare ``module.<name>`` (a tensor of ``shape``) as ``PyroSample`` site(s).

        Returns the attribute names of the hyper-parameter sites it added (in addition to
        ``name`` itself), in the order Pyro visits them.
        """
        raise NotImplementedError

    def hyper_sites(self, site: str) -> tuple[str, ...]:
        """Full names of the hyper-parameter sites added for the weight site ``site``."""
        return ()

    def log_prob(
        self, params: Mapping[str, torch.Tensor], site: str, batch_ndim: int = 0
    ) -> torch.Tensor:
        """:math:`\\log p` of the weight site ``site`` and of its hyper-parameter sites."""
        raise NotImplementedError


def _event(base: dist.Distribution, shape: Sequence[int]) -> dist.Distribution:
    return base.expand(torch.Size(shape)).to_event(len(shape))


#: The buffer whose device and dtype a module's priors are built on (see :func:`placed`).
ANCHOR = "prior_anchor"


class _Placed:
    """A ``PyroSample`` prior built, each time it is drawn, on the device and dtype of the
    module's :data:`ANCHOR` buffer (picklable)."""

    def __init__(self, build: Callable[..., dist.Distribution], args: tuple, shape) -> None:
        self.build, self.args = build, args
        self.shape = None if shape is None else tuple(shape)

    def __call__(self, module: PyroModule) -> dist.Distribution:
        anchor = getattr(module, ANCHOR)
        base = self.build(*(anchor.new_tensor(value) for value in self.args))
        return base if self.shape is None else _event(base, self.shape)


def placed(
    module: PyroModule,
    build: Callable[..., dist.Distribution],
    *args: float,
    shape: Sequence[int] | None = None,
) -> PyroSample:
    """``PyroSample(build(*args))``, with ``args`` as tensors on the module's device and dtype:
    ``module.to("cuda")`` (or ``.double()``) moves its priors with it, as it moves parameters.
    The module gets a non-persistent zero buffer :data:`ANCHOR` for that (once)."""
    if ANCHOR not in module._buffers:
        module.register_buffer(ANCHOR, torch.zeros(()), persistent=False)
    return PyroSample(_Placed(build, args, shape))


class NormalPrior(Prior):
    r"""I.i.d. :math:`w \sim \mathcal N(0, \sigma^2)`.

    Parameters
    ----------
    scale:
        :math:`\sigma > 0`.
    """

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = check_positive("scale", scale)
        self._half_precision = 0.5 / self.scale**2
        self._log_norm = math.log(self.scale) + _HALF_LOG_2PI

    def attach(self, module: PyroModule, name: str, shape: Sequence[int]) -> tuple[str, ...]:
        setattr(module, name, placed(module, dist.Normal, 0.0, self.scale, shape=shape))
        return ()

    def log_prob(
        self, params: Mapping[str, torch.Tensor], site: str, batch_ndim: int = 0
    ) -> torch.Tensor:
        w = params[site]
        return (
            -self._half_precision * sum_event(w.square(), batch_ndim)
            - event_numel(w, batch_ndim) * self._log_norm
        )

    def __repr__(self) -> str:
        return f"NormalPrior(scale={self.scale})"


class ScaleMixturePrior(Prior):
    r"""I.i.d. scale mixture of two zero-mean Normals (Blundell et al. 2015).

    :math:`w \sim \pi \mathcal N(0, \sigma_1^2) + (1-\pi) \mathcal N(0, \sigma_2^2)`.

    Parameters
    ----------
    mixture_weight:
        :math:`\pi \in (0, 1)`.
    scale1, scale2:
        :math:`\sigma_1, \sigma_2 > 0` (defaults 1 and :math:`e^{-6}`, Blundell et al.).
    """

    def __init__(
        self, mixture_weight: float = 0.5, scale1: float = 1.0, scale2: float = math.exp(-6)
    ) -> None:
        self.mixture_weight = check_interval(
            "mixture_weight", mixture_weight, 0.0, 1.0, low_open=True, high_open=True
        )
        self.scale1 = check_positive("scale1", scale1)
        self.scale2 = check_positive("scale2", scale2)
        pi = self.mixture_weight
        self._c1 = math.log(pi) - math.log(self.scale1) - _HALF_LOG_2PI
        self._c2 = math.log1p(-pi) - math.log(self.scale2) - _HALF_LOG_2PI
        self._h1 = 0.5 / self.scale1**2
        self._h2 = 0.5 / self.scale2**2

    def distribution(self) -> ScaleMixtureNormal:
        """The scalar prior as a :class:`ScaleMixtureNormal`."""
        return ScaleMixtureNormal(self.mixture_weight, self.scale1, self.scale2)

    def attach(self, module: PyroModule, name: str, shape: Sequence[int]) -> tuple[str, ...]:
        weights = (self.mixture_weight, self.scale1, self.scale2)
        setattr(module, name, placed(module, ScaleMixtureNormal, *weights, shape=shape))
        return ()

    def log_prob(
        self, params: Mapping[str, torch.Tensor], site: str, batch_ndim: int = 0
    ) -> torch.Tensor:
        return _ScaleMixtureLogProbSum.apply(
            params[site], self._c1, self._c2, self._h1, self._h2, batch_ndim
        )

    def __repr__(self) -> str:
        return (
            f"ScaleMixturePrior(mixture_weight={self.mixture_weight}, scale1={self.scale1}, "
            f"scale2={self.scale2})"
        )


class _PrecisionScaledNormal:
    """``PyroSample`` prior of a weight group given its precision attribute (picklable)."""

    def __init__(self, precision_attr: str, shape: Sequence[int]) -> None:
        self.precision_attr = precision_attr
        self.shape = tuple(shape)

    def __call__(self, module: PyroModule) -> dist.Distribution:
        precision = getattr(module, self.precision_attr)
        return _event(dist.Normal(torch.zeros_like(precision), precision.rsqrt()), self.shape)


class GammaPrecision(Prior):
    r"""One precision per weight group with a Gamma hyperprior (Neal 1996).

    .. math::

        \lambda_g \sim \mathrm{Gamma}(\alpha, \beta), \qquad
        w_{gj} \mid \lambda_g \sim \mathcal N(0, \lambda_g^{-1}),

    with the rate parameterisation (:math:`E[\lambda_g] = \alpha/\beta`). The precision of the
    group ``layers.0.weight`` is the site ``layers.0.weight_precision``. Given the weights, its
    exact conditional is :math:`\mathrm{Gamma}(\alpha + n_g/2, \beta + \lVert w_g\rVert^2/2)`,
    which :meth:`BayesianMLP.gibbs_updates` hands to the SG-MCMC kernels.

    Parameters
    ----------
    alpha:
        Shape :math:`\alpha > 0`.
    beta:
        Rate :math:`\beta > 0`.
    """

    suffix = "_precision"

    def __init__(self, alpha: float = 1.0, beta: float = 1.0) -> None:
        self.alpha = check_positive("alpha", alpha)
        self.beta = check_positive("beta", beta)
        self._gamma_const = self.alpha * math.log(self.beta) - math.lgamma(self.alpha)

    def attach(self, module: PyroModule, name: str, shape: Sequence[int]) -> tuple[str, ...]:
        precision_attr = name + self.suffix
        setattr(module, precision_attr, placed(module, dist.Gamma, self.alpha, self.beta))
        setattr(module, name, PyroSample(_PrecisionScaledNormal(precision_attr, shape)))
        return (precision_attr,)

    def hyper_sites(self, site: str) -> tuple[str, ...]:
        return (site + self.suffix,)

    def log_prob_hyper(self, precision: torch.Tensor) -> torch.Tensor:
        r""":math:`\log \mathrm{Gamma}(\lambda \mid \alpha, \beta)` in closed form."""
        return self._gamma_const + (self.alpha - 1) * precision.log() - self.beta * precision

    def log_prob(
        self, params: Mapping[str, torch.Tensor], site: str, batch_ndim: int = 0
    ) -> torch.Tensor:
        w = params[site]
        lam = params[site + self.suffix]
        n = event_numel(w, batch_ndim)
        log_w = (
            0.5 * n * lam.log() - n * _HALF_LOG_2PI - 0.5 * lam * sum_event(w.square(), batch_ndim)
        )
        return self.log_prob_hyper(lam) + log_w

    def __repr__(self) -> str:
        return f"GammaPrecision(alpha={self.alpha}, beta={self.beta})"
