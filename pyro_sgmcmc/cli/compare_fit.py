"""The model of a comparison and the inference of each method (NUTS, SG-MCMC and SVI).

Part of :mod:`pyro_sgmcmc.cli.compare` (whose names these are): :func:`build_model` makes the
Bayesian MLP of a :class:`~pyro_sgmcmc.cli.compare.CompareConfig`, and ``_RUNNERS`` maps each
method's name to the function that fits it and returns the source of its ``InferenceData``
(exporting, predicting and diagnosing are :func:`~pyro_sgmcmc.cli.compare.run_method`'s).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.mcmc.util import initialize_model

from ..analysis.export import HMCStatsCollector
from ..data.datasets import Dataset
from ..inference.vectorized import run_chains
from ..kernels import PSGLD, SGHMC, SGLD
from ..nn import BayesianMLP, GammaPrecision, NormalLikelihood, NormalPrior, ScaleMixturePrior
from ..variational.svi import fit_svi
from .compare_config import CompareConfig

TensorDict = dict[str, torch.Tensor]


# --------------------------------------------------------------------------- the model


def build_model(config: CompareConfig, data: Dataset) -> BayesianMLP:
    """The :class:`~pyro_sgmcmc.nn.BayesianMLP` of ``config`` for ``data``.

    Regression heads (standardised targets): ``noise="known"`` is the data set's own noise level
    when it declares one (``metadata["noise"]``, in the target's units: the toy sinusoid's
    :math:`\\sigma = 1`), as in Blundell et al.'s regression example; ``"auto"`` (default) is
    ``"known"`` when the data set declares its noise and ``"gamma"`` otherwise;
    ``noise="gamma"`` is a latent precision
    :math:`\\tau \\sim \\mathrm{Gamma}(2, 2 s^2)` (prior mean of :math:`\\sigma` about ``s`` =
    ``noise_scale``; Gibbs-updated by the SG-MCMC kernels), ``"halfnormal"`` a latent
    :math:`\\sigma \\sim \\mathrm{HalfNormal}(s)`, ``"fixed"`` :math:`\\sigma = s`.
    """
    noise = config.noise
    if noise == "auto":
        noise = "known" if "noise" in data.metadata else "gamma"
    if data.task == "classification":
        likelihood: Any = "categorical"
    elif noise == "known":
        if "noise" not in data.metadata:
            raise ValueError(
                f"noise='known' needs a data set that declares its noise level; "
                f"{data.name!r} does not: use noise='gamma', 'halfnormal' or 'fixed'"
            )
        likelihood = NormalLikelihood(scale=float(data.metadata["noise"]) / data.y_scale)
    elif noise == "gamma":
        likelihood = NormalLikelihood(precision=GammaPrecision(2.0, 2.0 * config.noise_scale**2))
    elif noise == "halfnormal":
        likelihood = NormalLikelihood(scale=dist.HalfNormal(config.noise_scale))
    else:
        likelihood = NormalLikelihood(scale=config.noise_scale)
    if config.prior == "normal":
        prior: Any = NormalPrior(config.prior_scale)
    elif config.prior == "scale_mixture":
        prior = ScaleMixturePrior(0.5, config.prior_scale, config.prior_scale * math.exp(-6))
    else:
        prior = GammaPrecision(1.0, 1.0)
    return BayesianMLP(
        data.num_features,
        list(config.hidden),
        data.output_dim,
        activation=config.activation,
        likelihood=likelihood,
        prior=prior,
    )


# --------------------------------------------------------------------------- methods


@dataclass
class _Run:
    """What a method returns: its ``InferenceData`` source and notes for the table."""

    source: Any
    hmc_stats: HMCStatsCollector | None = None
    notes: str = ""
    num_draws: int = 0


def _mcmc(
    kernel, config: CompareConfig, num_samples: int, warmup: int, hook=None, **options: Any
) -> MCMC:
    with warnings.catch_warnings():
        # On few cores Pyro runs the chains one after the other and says so.
        warnings.filterwarnings("ignore", message="num_chains=.*sequentially")
        return MCMC(
            kernel,
            num_samples=num_samples,
            warmup_steps=warmup,
            num_chains=config.chains,
            disable_progbar=not config.progress,
            hook_fn=hook,
            **options,
        )


def nuts_potential(
    model: BayesianMLP, data: Dataset
) -> tuple[Callable[[TensorDict], torch.Tensor], dict[str, Any], str]:
    r"""The full-data potential of ``model`` in unconstrained space, for ``NUTS(potential_fn=...)``.

    .. math::

        U(z) = -\log p(\theta, y \mid x) - \log \left|\det \partial\theta/\partial z\right|,
        \qquad \theta = T^{-1}(z),

    with Pyro's transforms ``T`` of each site's support. The density comes from
    :meth:`BayesianMLP.log_joint` (plain torch; for the small networks of this module it halves
    the cost of a leapfrog step against Pyro's trace) when it agrees with the log density of the
    model's Pyro trace at two test points, and from the trace otherwise: NUTS always samples the
    model's own posterior. NUTS itself is Pyro's, unchanged.

    Returns
    -------
    (potential, transforms, source)
        ``potential`` maps a dict of unconstrained site values to :math:`U(z)`; ``transforms``
        maps each site to the transform from constrained to unconstrained values; ``source`` is
        ``"log_joint"`` or ``"trace"``.
    """
    x, y = data.x_train, data.y_train
    start, trace_potential, transforms, _ = initialize_model(model, model_args=(x, y))

    def potential(unconstrained: TensorDict) -> torch.Tensor:
        params = {name: transforms[name].inv(value) for name, value in unconstrained.items()}
        log_det = sum(
            transforms[name].inv.log_abs_det_jacobian(value, params[name]).sum()
            for name, value in unconstrained.items()
        )
        return -(model.log_joint(params, None, x, y) + log_det)

    generator = torch.Generator().manual_seed(0)
    shifted = {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in start.items()}
    with torch.no_grad():
        for point in (start, shifted):
            ours, theirs = float(potential(point)), float(trace_potential(point))
            # float32 sums of a few thousand terms: agree to ~1e-5 relative when the same
            if not abs(ours - theirs) <= 1e-4 * max(1.0, abs(theirs)) + 1e-2:
                return trace_potential, transforms, "trace"
    return potential, transforms, "log_joint"


def nuts_starts(
    model: BayesianMLP,
    data: Dataset,
    potential: Callable[[TensorDict], torch.Tensor],
    num_chains: int,
    num_steps: int,
) -> TensorDict:
    """Independent starting points for ``num_chains`` NUTS chains, in unconstrained space.

    Each chain starts from its own draw of Pyro's ``init_to_uniform`` (uniform on
    :math:`[-2, 2]` in unconstrained space) and descends ``num_steps`` Adam steps (learning rate
    0.01) on ``potential`` towards the mode nearest to it. The chains thus start in different
    modes, as over-dispersed as before, but warm-up adapts the step size and mass matrix instead
    of spending its draws on the descent.

    Returns
    -------
    dict
        One tensor per site with a leading chain dimension.
    """
    starts: dict[str, list[torch.Tensor]] = {}
    for _ in range(num_chains):
        start, _, _, _ = initialize_model(model, model_args=(data.x_train, data.y_train))
        point = {name: value.detach().clone().requires_grad_(True) for name, value in start.items()}
        if num_steps:
            optimiser = torch.optim.Adam(list(point.values()), lr=0.01)
            for _ in range(num_steps):
                optimiser.zero_grad()
                potential(point).backward()
                optimiser.step()
        for name, value in point.items():
            starts.setdefault(name, []).append(value.detach())
    return {name: torch.stack(values) for name, values in starts.items()}


_POTENTIAL_SOURCES = {"log_joint": "BayesianMLP.log_joint", "trace": "the Pyro trace"}


def _run_nuts(model, data: Dataset, config: CompareConfig) -> _Run:
    samples, warmup = config.nuts_draws()
    potential, transforms, source = nuts_potential(model, data)
    starts = nuts_starts(model, data, potential, config.chains, config.nuts_init_steps)
    kernel = NUTS(
        potential_fn=potential,
        transforms=transforms,
        max_tree_depth=config.max_tree_depth,
        target_accept_prob=config.nuts_target_accept,
    )
    collector = HMCStatsCollector()
    mcmc = _mcmc(
        kernel,
        config,
        samples,
        warmup,
        hook=collector,
        initial_params=starts if config.chains > 1 else {k: v[0] for k, v in starts.items()},
        transforms=transforms,
    )
    mcmc.run()
    notes = (
        f"Pyro NUTS, max_tree_depth={config.max_tree_depth} (<= "
        f"{2**config.max_tree_depth - 1} leapfrog steps per draw), {samples} draws after {warmup} "
        f"warm-up per chain, each chain started {config.nuts_init_steps} Adam steps from its own "
        f"random point; potential from {_POTENTIAL_SOURCES[source]}"
    )
    return _Run(mcmc, hmc_stats=collector, notes=notes)


def _run_sgmcmc(method: str, model, data: Dataset, config: CompareConfig) -> _Run:
    common = {
        "batch_size": min(config.batch_size, data.num_train),
        "num_steps_per_sample": config.num_steps_per_sample,
        "seed": config.seed,
        "data_parallel": config.distributed == "data",
    }
    if method == "sgld":
        kernel = SGLD(
            model,
            learning_rate=config.sgld_learning_rate,
            integrator=config.integrator,
            **common,
        )
    elif method == "sghmc":
        kernel = SGHMC(
            model, learning_rate=config.sghmc_learning_rate, friction=config.friction, **common
        )
    else:
        kernel = PSGLD(
            model,
            learning_rate=config.psgld_learning_rate,
            integrator=config.integrator,
            **common,
        )
    # with no learning rate the kernels adapt their step size and thinning during warm-up;
    # the chains run stacked, and go on in rounds until converged (target_ess), judged as the
    # table judges them: a network on its outputs at the test inputs
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="run_chains: .* not converged")
        result = run_chains(
            kernel, data.x_train, data.y_train, num_chains=config.chains,
            num_samples=config.num_samples, warmup_steps=config.warmup,
            distribute_chains=config.distributed == "chains", target_ess=config.target_ess,
            max_seconds=config.max_seconds if config.target_ess is not None else None,
            test=(data.x_test, data.y_test),
        )  # fmt: skip
    thinning = [report["num_steps_per_sample"] for report in result.chain_reports]
    notes = f"{result.num_draws} draws per chain, {thinning} gradient steps per draw"
    budget = None not in (config.target_ess, config.max_seconds)
    if budget and not result.verdict.converged and result.verdict.statistic != "temperature":
        # the rounds stop when converged or at the budget, and the warm-up and the first
        # --num-samples draws are always made: say why this run stopped, and how long it took
        notes += f"; --max-seconds {config.max_seconds:g} spent before it converged"
    return _Run(result, notes=notes)


def _run_svi(model, data: Dataset, config: CompareConfig) -> _Run:
    result = fit_svi(
        model,
        data.x_train,
        data.y_train,
        num_steps=config.svi_steps,
        batch_size=min(config.batch_size, data.num_train),
        learning_rate=config.svi_learning_rate,
        num_fits=config.chains,
        seed=config.seed,
        progress_bar=config.progress,
        estimator="local_reparameterization",
        num_threads=1,
    )
    notes = (
        f"mean-field Normal guide (local reparameterisation), {config.chains} independent "
        f"fit(s) of {config.svi_steps} "
        f"Adam steps, {config.num_samples} guide draws each; R-hat compares the fits, ESS "
        "of independent draws is not shown"
    )
    return _Run(result, notes=notes, num_draws=config.num_samples)


_RUNNERS = {
    "nuts": _run_nuts,
    "sghmc": lambda *a: _run_sgmcmc("sghmc", *a),
    "sgld": lambda *a: _run_sgmcmc("sgld", *a),
    "psgld": lambda *a: _run_sgmcmc("psgld", *a),
    "svi": _run_svi,
}
