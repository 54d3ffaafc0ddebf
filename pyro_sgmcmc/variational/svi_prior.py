r"""The learnable scale-mixture prior of :func:`~pyro_sgmcmc.variational.svi.fit_svi` (empirical
Bayes).

:class:`LearnableScaleMixturePrior` is what the user passes as ``prior=``: the initial
:math:`\pi, \sigma_1, \sigma_2` and the sites that get the prior (:meth:`resolve_sites
<LearnableScaleMixturePrior.resolve_sites>` checks them against the model). Each fit gets its own
trainable :class:`ScaleMixtureParameters`, optimised with the guide, and the model sees them
through :class:`_SubstitutePrior`, which swaps the prior of those sites. Public names are
re-exported by :mod:`pyro_sgmcmc.variational.svi`, whose docstring describes the objective.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from pyro import poutine
from pyro.poutine.messenger import Messenger

from .._validation import check_interval, check_positive
from ..models.initialization import real_support
from ..nn.mlp import BayesianMLP
from ..nn.priors import GammaPrecision, ScaleMixtureNormal
from .flipout_mlp import layer_sites

__all__ = ["LearnableScaleMixturePrior", "ScaleMixtureParameters"]


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
