r"""Exact conditional (Gibbs) updates for Normal-Gamma conjugate pairs.

A precision :math:`\lambda \sim \mathrm{Gamma}(\alpha, \beta)` (rate parameterisation) of
zero-mean Gaussian values :math:`v_1, \dots, v_n \mid \lambda \sim \mathcal N(0, \lambda^{-1})`
has the exact conditional

.. math::

    \lambda \mid v \sim \mathrm{Gamma}\!\left(\alpha + \frac{n}{2},\;
                                             \beta + \frac{1}{2}\sum_{j=1}^n v_j^2\right).

The values :math:`v` are either weights (:class:`NormalGammaPrecisionUpdate`; Neal 1996, Chen et
al. 2014 section 5) or the residuals :math:`y_i - \mu_\theta(x_i)` of a Normal likelihood on the
full data set (:class:`NormalNoisePrecisionUpdate`, computed in chunks of rows). Both follow the
:class:`~pyro_sgmcmc.models.gibbs.GibbsUpdate` protocol, so a kernel given them removes the
precision sites from the stochastic-gradient dynamics and redraws them every ``gibbs_every`` steps.

:func:`find_normal_gamma_updates` finds such pairs in any Pyro model by probing its trace, so
that hand-written models get Gibbs steps without wiring them by hand.

Gibbs draws are exact at temperature :math:`T = 1`; with a tempered SG-MCMC kernel they still
sample the untempered conditional.

References
----------
R. M. Neal, *Bayesian Learning for Neural Networks*, Springer, 1996.

T. Chen, E. B. Fox and C. Guestrin, "Stochastic gradient Hamiltonian Monte Carlo", ICML 2014.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample

from .._validation import check_positive, check_positive_int
from .gibbs import with_generator

__all__ = [
    "NormalGammaPrecisionUpdate",
    "NormalNoisePrecisionUpdate",
    "find_normal_gamma_updates",
    "gamma_posterior",
]


def gamma_posterior(
    alpha: float, beta: float, num_values: float, sum_of_squares: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Concentration and rate of :math:`\lambda \mid v`: :math:`(\alpha + n/2, \beta + S/2)`."""
    concentration = torch.as_tensor(
        alpha + 0.5 * num_values, dtype=sum_of_squares.dtype, device=sum_of_squares.device
    )
    rate = beta + 0.5 * sum_of_squares
    return concentration, rate


def _draw_gamma(
    generator: torch.Generator,
    concentration: torch.Tensor,
    rate: torch.Tensor,
    like: torch.Tensor,
) -> torch.Tensor:
    draw = with_generator(
        generator, lambda: torch.distributions.Gamma(concentration, rate).sample()
    )
    # A Gamma draw can underflow to 0 in float32 when alpha + n/2 is tiny; keep it positive.
    draw = draw.clamp_min(torch.finfo(like.dtype).tiny)
    return draw.to(dtype=like.dtype).expand_as(like).clone()


class _GammaConditionalUpdate:
    r"""Shared part of the Gamma-precision updates: draw from :meth:`conditional`.

    Tempered targets :math:`\pi_T \propto p(\theta \mid y)^{1/T}` are supported
    (``supports_temperature``): the tempered conditional of a
    :math:`\mathrm{Gamma}(a, b)` conditional is
    :math:`\mathrm{Gamma}\bigl((a - 1)/T + 1,\; b / T\bigr)`, so cold posteriors
    (``T < 1``) stay consistent between the SG dynamics and the Gibbs blocks.
    """

    precision_site: str
    supports_temperature = True

    def conditional(
        self, params: Mapping[str, torch.Tensor], *args: Any, **kwargs: Any
    ) -> torch.distributions.Gamma:  # pragma: no cover - abstract
        raise NotImplementedError

    def sample(
        self,
        params: Mapping[str, torch.Tensor],
        generator: torch.Generator,
        *args: Any,
        temperature: float = 1.0,
        **kwargs: Any,
    ) -> dict[str, torch.Tensor]:
        """Draw the precision from its exact (tempered) conditional, randomness from
        ``generator``; ``temperature`` is the kernel's :math:`T > 0`."""
        gamma = self.conditional(params, *args, **kwargs)
        concentration, rate = gamma.concentration, gamma.rate
        if temperature != 1.0:
            if not temperature > 0:
                raise ValueError(f"temperature must be > 0, got {temperature}")
            concentration = (concentration - 1.0) / temperature + 1.0
            rate = rate / temperature
            if not bool((concentration > 0).all()):
                raise ValueError(
                    f"the tempered conditional of {self.precision_site!r} is improper at "
                    f"temperature {temperature}: (alpha + n/2 - 1)/T + 1 <= 0"
                )
        like = params[self.precision_site]
        return {self.precision_site: _draw_gamma(generator, concentration, rate, like)}


class NormalGammaPrecisionUpdate(_GammaConditionalUpdate):
    r"""Gibbs update of one precision shared by zero-mean Gaussian weight sites.

    Model: :math:`\lambda \sim \mathrm{Gamma}(\alpha, \beta)` and every element of every site in
    ``weight_sites`` is :math:`\mathcal N(0, \lambda^{-1})` given :math:`\lambda`. The update
    draws :math:`\lambda \sim \mathrm{Gamma}(\alpha + n/2, \beta + \lVert w\rVert^2/2)`, with
    :math:`n` the total number of weights.

    Parameters
    ----------
    precision_site:
        Name of the latent precision site.
    weight_sites:
        Names of the weight sites whose prior precision it is.
    alpha, beta:
        Shape and rate of the Gamma prior, both :math:`> 0`.

    Examples
    --------
    >>> update = NormalGammaPrecisionUpdate("w_precision", ["w"], alpha=1.0, beta=1.0)
    >>> params = {"w": torch.zeros(4), "w_precision": torch.tensor(1.0)}
    >>> update.sample(params, torch.Generator().manual_seed(0))["w_precision"].shape
    torch.Size([])
    """

    def __init__(
        self, precision_site: str, weight_sites: Sequence[str], alpha: float, beta: float
    ) -> None:
        if not isinstance(precision_site, str) or not precision_site:
            raise ValueError(f"precision_site must be a non-empty string, got {precision_site!r}")
        if isinstance(weight_sites, str):
            weight_sites = (weight_sites,)
        weight_sites = tuple(weight_sites)
        if not weight_sites or not all(isinstance(s, str) and s for s in weight_sites):
            raise ValueError(
                f"weight_sites must be a non-empty sequence of site names, got {weight_sites!r}"
            )
        if precision_site in weight_sites:
            raise ValueError(f"precision_site {precision_site!r} is also listed in weight_sites")
        self.precision_site = precision_site
        self.weight_sites = weight_sites
        self.alpha = check_positive("alpha", alpha)
        self.beta = check_positive("beta", beta)
        self.sites: tuple[str, ...] = (precision_site,)

    def conditional(
        self, params: Mapping[str, torch.Tensor], *args: Any, **kwargs: Any
    ) -> torch.distributions.Gamma:
        """The exact conditional :math:`p(\\lambda \\mid w)` as a ``Gamma`` distribution."""
        weights = [params[s].detach().double() for s in self.weight_sites]
        num_values = sum(w.numel() for w in weights)
        sum_of_squares = sum(w.square().sum() for w in weights)
        concentration, rate = gamma_posterior(self.alpha, self.beta, num_values, sum_of_squares)
        return torch.distributions.Gamma(concentration, rate)

    def __repr__(self) -> str:
        return (
            f"NormalGammaPrecisionUpdate({self.precision_site!r}, {list(self.weight_sites)!r}, "
            f"alpha={self.alpha}, beta={self.beta})"
        )


ResidualFn = Callable[..., torch.Tensor]


class NormalNoisePrecisionUpdate(_GammaConditionalUpdate):
    r"""Gibbs update of the noise precision :math:`\tau` of a Normal likelihood.

    Model: :math:`\tau \sim \mathrm{Gamma}(a, b)`, :math:`y_i \mid \theta, \tau \sim
    \mathcal N(\mu_\theta(x_i), \tau^{-1})` for each of the :math:`n` scalar observations (rows
    times outputs). The update draws

    .. math::

        \tau \sim \mathrm{Gamma}\!\left(a + \frac{\omega n}{2},\;
                                        b + \frac{\omega}{2}\sum_i (y_i - \mu_\theta(x_i))^2\right)

    on the **full** data set, with :math:`\omega` the power of a tempered likelihood
    :math:`p(y \mid \theta, \tau)^{\omega}` (``1`` for the posterior); the residuals are computed
    ``chunk_size`` rows at a time, so memory stays bounded.

    Parameters
    ----------
    precision_site:
        Name of the latent noise precision site.
    alpha, beta:
        Shape and rate of its Gamma prior, both :math:`> 0`.
    residuals:
        ``residuals(params, rows, *args, **kwargs) -> Tensor``: the residuals
        :math:`y - \mu_\theta(x)` of the rows ``rows`` (a ``slice``) for constrained ``params``
        and the model's full-data arguments.
    num_data:
        ``num_data(*args, **kwargs) -> int``: the number of rows :math:`N`.
    chunk_size:
        Rows per chunk, ``>= 1``.
    likelihood_weight:
        :math:`\omega > 0`, the power of the likelihood (``1 / likelihood_temperature`` of a
        :class:`~pyro_sgmcmc.nn.BayesianMLP`).
    """

    def __init__(
        self,
        precision_site: str,
        alpha: float,
        beta: float,
        residuals: ResidualFn,
        num_data: Callable[..., int],
        chunk_size: int = 4096,
        likelihood_weight: float = 1.0,
    ) -> None:
        if not isinstance(precision_site, str) or not precision_site:
            raise ValueError(f"precision_site must be a non-empty string, got {precision_site!r}")
        if not callable(residuals) or not callable(num_data):
            raise TypeError("residuals and num_data must be callables")
        self.precision_site = precision_site
        self.alpha = check_positive("alpha", alpha)
        self.beta = check_positive("beta", beta)
        self.residuals = residuals
        self.num_data = num_data
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.likelihood_weight = check_positive("likelihood_weight", likelihood_weight)
        self.sites: tuple[str, ...] = (precision_site,)

    def conditional(
        self, params: Mapping[str, torch.Tensor], *args: Any, **kwargs: Any
    ) -> torch.distributions.Gamma:
        """The exact conditional :math:`p(\\tau \\mid \\theta, y)` as a ``Gamma`` distribution."""
        num_rows = int(self.num_data(*args, **kwargs))
        num_values = 0
        sum_of_squares = torch.zeros((), dtype=torch.float64)
        with torch.no_grad():
            for start in range(0, num_rows, self.chunk_size):
                rows = slice(start, min(start + self.chunk_size, num_rows))
                r = self.residuals(params, rows, *args, **kwargs)
                num_values += r.numel()
                sum_of_squares = sum_of_squares + r.double().square().sum()
        weight = self.likelihood_weight
        concentration, rate = gamma_posterior(
            self.alpha, self.beta, weight * num_values, weight * sum_of_squares
        )
        return torch.distributions.Gamma(concentration, rate)

    def __repr__(self) -> str:
        return (
            f"NormalNoisePrecisionUpdate({self.precision_site!r}, alpha={self.alpha}, "
            f"beta={self.beta}, chunk_size={self.chunk_size})"
        )


def _base(fn: dist.Distribution) -> tuple[dist.Distribution, int]:
    """Strip ``Independent`` and ``Expanded`` wrappers; return the base and its event rank."""
    event_dim = fn.event_dim
    while True:
        if isinstance(fn, dist.Independent | torch.distributions.Independent):
            fn = fn.base_dist
        elif isinstance(fn, dist.ExpandedDistribution):
            fn = fn.base_dist
        else:
            return fn, event_dim


def _scalar_gamma(fn: dist.Distribution) -> tuple[float, float] | None:
    base, _ = _base(fn)
    if not isinstance(base, torch.distributions.Gamma):
        return None
    if base.concentration.numel() != 1 or base.rate.numel() != 1:
        return None
    return float(base.concentration), float(base.rate)


def _normal_scale(fn: dist.Distribution) -> torch.Tensor | None:
    """The scale of a zero-mean Normal site (any wrapper), else ``None``."""
    base, _ = _base(fn)
    if not isinstance(base, torch.distributions.Normal):
        return None
    if not bool((base.loc == 0).all()):
        return None
    return base.scale


def find_normal_gamma_updates(
    model: Callable[..., Any], *args: Any, **kwargs: Any
) -> list[NormalGammaPrecisionUpdate]:
    r"""Find Normal-Gamma conjugate pairs among the latent sites of ``model``.

    A latent site with a scalar :math:`\mathrm{Gamma}(\alpha, \beta)` prior is a precision when
    the model's zero-mean Normal latent sites :math:`w` whose scale is :math:`\lambda^{-1/2}`
    follow it: the model is traced twice with the candidate precision conditioned on two
    different values, and a Normal site is paired with it when its scale equals
    :math:`\lambda^{-1/2}` element-wise in both traces. Observed sites are ignored (use
    :class:`NormalNoisePrecisionUpdate` for a likelihood's noise precision), and a precision
    that also enters anything else than paired Normal sites (another distribution, a
    likelihood) is skipped, since its conditional would not be the conjugate one.

    Returns one :class:`NormalGammaPrecisionUpdate` per precision found.
    """
    base_trace = poutine.trace(model).get_trace(*args, **kwargs)
    latent = {
        name: site
        for name, site in base_trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
    }
    values = {name: site["value"].detach() for name, site in latent.items()}
    updates = []
    for name, site in latent.items():
        gamma = _scalar_gamma(site["fn"])
        if gamma is None or site["value"].numel() != 1:
            continue
        paired: list[str] | None = []
        probes = (torch.tensor(0.37), torch.tensor(2.9))
        traces = []
        for probe in probes:
            data = {**values, name: probe.to(site["value"]).reshape(site["value"].shape)}
            traces.append(
                poutine.trace(poutine.condition(model, data=data)).get_trace(*args, **kwargs)
            )
        for other in latent:
            if other == name:
                continue
            scales = [_normal_scale(tr.nodes[other]["fn"]) for tr in traces]
            if any(s is None for s in scales):
                if _depends_on(traces, other):
                    paired = None
                    break
                continue
            expected = [probe.rsqrt().to(s) for probe, s in zip(probes, scales, strict=True)]
            matches = [
                torch.allclose(s, e.expand_as(s)) for s, e in zip(scales, expected, strict=True)
            ]
            if all(matches):
                paired.append(other)
            elif not torch.equal(scales[0], scales[1]):
                paired = None
                break
        if paired and not _observed_depends_on(traces, set(latent)):
            updates.append(NormalGammaPrecisionUpdate(name, paired, *gamma))
    return updates


def _depends_on(traces: list, site: str) -> bool:
    """Whether the distribution of ``site`` differs between the two probe traces."""
    fns = [tr.nodes[site]["fn"] for tr in traces]
    value = traces[0].nodes[site]["value"]
    return not torch.equal(fns[0].log_prob(value), fns[1].log_prob(value))


def _observed_depends_on(traces: list, latent: set[str]) -> bool:
    """Whether an observed site's log density differs between the two probe traces."""
    for name, site in traces[0].nodes.items():
        if site["type"] != "sample" or name in latent or site_is_subsample(site):
            continue
        if not site["is_observed"]:
            continue
        other = traces[1].nodes[name]
        if not torch.equal(site["fn"].log_prob(site["value"]), other["fn"].log_prob(site["value"])):
            return True
    return False
