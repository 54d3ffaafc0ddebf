r"""Convergence report and verdict: R-hat, bulk and tail ESS, ESS per second, divergences.

For every scalar coordinate of every posterior variable ArviZ computes the rank-normalised split
:math:`\hat R` and the bulk and tail effective sample sizes of Vehtari et al. (2021); the report
keeps the worst of each (largest :math:`\hat R`, smallest ESS) and divides the smallest bulk ESS by
the wall time.

Every report carries a **verdict** (:class:`Verdict`), ``converged`` or ``not converged:
<statistic> <value> <than> <bound>[, <statistic> ...]; run about k times longer`` (every
statistic outside its bound, the one that needs the longest run first), against the bounds of
Vehtari et al. (2021):

* a model whose parameters are identified: :math:`\hat R \le` :data:`RHAT_BOUND` (1.01) and
  bulk and tail ESS :math:`\ge` :data:`ESS_PER_CHAIN` (100) per chain, over every parameter;
* a network (hidden units that can be permuted: :func:`~pyro_sgmcmc.models.hidden_units.
  has_hidden_units`): its weights are not identified -- two chains in modes that differ only by
  a permutation of units give a weight-space :math:`\hat R` far above 1 while they agree on
  every prediction -- so it is judged in function space, on its outputs :math:`f(x)` at fixed
  inputs: :math:`\hat R \le` :data:`FUNCTION_RHAT_BOUND` (1.05) and ESS :math:`\ge` 100 per
  chain over every output; a classifier's as its class probabilities (:mod:`.judged_outputs`).

"Run about k times longer" extrapolates: ESS grows in proportion to the number of draws, and
:math:`\hat R - 1` falls about in inverse proportion to it. With one chain :math:`\hat R`
cannot be computed and only the ESS is judged: a converged verdict says so
(``converged (on ESS alone: ...)``), since one chain cannot show a mode it never left.

R-hat and ESS judge mixing, not the distribution the chains mix in. The chains' configurational
temperature (:mod:`pyro_sgmcmc.engine.virial`) checks that: a run with a chain too hot (above
:data:`HOT_BOUND` times its target by four standard errors, as for its ``SamplerWarning``) is
``not converged: configurational temperature ...`` whatever the other statistics say
(:func:`with_hot_chains`; the export records the chains, so that :func:`convergence_report`
agrees), and the remedy is a smaller step, not a longer run.

A chain too cold (below :data:`COLD_BOUND` times its target by four standard errors) makes a
verdict that R-hat and ESS pass ``not converged`` (:func:`with_temperatures`). Chains that
barely move are told by the classic split :math:`\hat R` of the draws (:data:`FROZEN_RHAT`,
:attr:`Verdict.barely_moving`): ranks cap the rank-normalised one near 3 or 4.

For SVI the "chains" are independent fits, each with independent draws from its guide:
:math:`\hat R` then measures the agreement between fits, and the ESS is close to the number of
draws by construction (it says nothing about the quality of the approximation).

References
----------
A. Vehtari, A. Gelman, D. Simpson, B. Carpenter and P.-C. Bürkner, "Rank-normalization, folding,
and localization: an improved R-hat for assessing convergence of MCMC", Bayesian Analysis 16(2),
2021.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from . import _arviz
from .judged_outputs import judged_outputs
from .rank_diagnostics import worst_of_all

__all__ = [
    "COLD_BOUND",
    "ESS_PER_CHAIN",
    "FROZEN_RHAT",
    "FUNCTION_RHAT_BOUND",
    "HOT_BOUND",
    "ONE_CHAIN",
    "RHAT_BOUND",
    "ConvergenceReport",
    "Verdict",
    "convergence_report",
    "format_reports",
    "hot_chains",
    "judge",
    "reports_table",
    "rhat_text",
    "temperature_attrs",
    "with_hot_chains",
    "with_temperatures",
    "worst_statistics",
]

#: :math:`\hat R` bound for identified parameters (Vehtari et al. 2021).
RHAT_BOUND = 1.01
#: :math:`\hat R` bound for a network's outputs :math:`f(x)`.
FUNCTION_RHAT_BOUND = 1.05
#: Bulk and tail ESS bound, per chain (Vehtari et al. 2021).
ESS_PER_CHAIN = 100
#: Fewer draws per chain than this cannot be judged (ArviZ's ESS needs four).
MIN_DRAWS = 4
#: A classic split :math:`\hat R` (of the draws, not of their ranks) this large says the draws
#: within each chain spread about a thousandth of the chains' distance: they barely move (the
#: rank-normalised one stays near 3 or 4 for four chains that do not overlap).
FROZEN_RHAT = 1e3
#: The groups where an export keeps a network's outputs ``output`` (test inputs first); their
#: draws are judged in function space.
OUTPUT_GROUPS = ("predictions", "posterior_predictive")


@dataclass(frozen=True)
class Verdict:
    r"""Whether draws meet the convergence bounds of the module docstring, and if not, the
    statistic furthest from its bound.

    Attributes
    ----------
    converged:
        Every statistic within its bound.
    statistic:
        ``"R-hat"``, ``"bulk ESS"`` or ``"tail ESS"``: the one that needs the longest run
        (``None`` when converged); ``"fitted"`` for the draws of an SVI guide, which are
        independent by construction, so that R-hat and ESS say nothing of the fit.
    value, bound:
        Its value and bound.
    longer:
        About how many times longer the run should be for it to meet its bound (1 when
        converged).
    basis:
        What was judged: ``"parameters"`` or ``"f(x)"`` (a network's outputs).
    others:
        The other statistics outside their bounds, as ``(statistic, value, bound)``, the one
        furthest from its bound first: the text names them all, so that an ESS that binds does
        not hide an :math:`\hat R` that says the chains disagree.
    chains:
        For ``"temperature"`` (:func:`with_temperatures`), the chains that sample too hot
        (``bound`` :data:`HOT_BOUND`), or too cold (``bound`` :data:`COLD_BOUND`).
    caveat:
        What a ``converged`` verdict did not check: with one chain, :math:`\hat R`.
    spread:
        The largest classic split :math:`\hat R` of the draws (``nan`` where not known): from
        :data:`FROZEN_RHAT` on, the chains barely move.
    """

    converged: bool
    statistic: str | None
    value: float
    bound: float
    longer: float
    basis: str = "parameters"
    others: tuple[tuple[str, float, float], ...] = ()
    chains: tuple[int, ...] = ()
    caveat: str = ""
    spread: float = math.nan

    @property
    def barely_moving(self) -> bool:
        """Whether the chains barely move (:data:`FROZEN_RHAT`): a run that brings them
        together is at least ``spread`` times longer."""
        return (
            not self.converged
            and self.statistic == "R-hat"
            and math.isfinite(self.spread)
            and self.spread >= FROZEN_RHAT
            and self.longer == self.spread
        )

    @property
    def not_moving(self) -> bool:
        """Whether the chains barely move, or do not move at all (constant, apart)."""
        return self.barely_moving or (self.statistic == "R-hat" and math.isinf(self.longer))

    @property
    def longer_run_helps(self) -> bool:
        """Whether a longer run is the remedy: not for chains too hot, or that (barely) move."""
        return not (self.statistic == "temperature" or self.not_moving)

    def __str__(self) -> str:
        if self.converged:
            return f"converged ({self.caveat})" if self.caveat else "converged"
        if self.statistic is None:
            return "not converged: no finite diagnostics"
        if self.statistic == "fitted":
            return "fitted (independent draws of a fitted guide: R-hat and ESS do not judge it)"
        if self.statistic == "temperature":
            return _too_hot_text(self)
        if self.statistic == "draws":
            return (
                f"not converged: {self.value:.0f} draws per chain are too few to judge (at least "
                f"{self.bound:.0f})"
            )
        where = "" if self.basis == "parameters" else f" of {self.basis}"
        failures = [(self.statistic, self.value, self.bound), *self.others]
        named = ", ".join(_failure_text(*failure, where) for failure in failures)
        if not math.isfinite(self.longer):  # chains constant, apart
            return f"not converged: {named}; the chains do not move, a longer run will not help"
        if self.barely_moving:
            return (
                f"not converged: {named}; the chains barely move (within each chain the draws "
                f"spread about 1/{self.spread:,.0f} of the distance between the chains): run at "
                f"least {math.ceil(self.longer):,} times longer"
            )
        # rounded up: to tenths below 2 (1.031 is "1.1 times", not "2 times"), else to units
        tenths = math.ceil(round(self.longer * 10, 9)) / 10  # round: 1.1 * 10 is 11.000...02
        longer = tenths if self.longer < 2 else math.ceil(self.longer)
        return f"not converged: {named}; run about {longer:g} times longer"


#: A chain whose configurational temperature exceeds this many times its target by four
#: standard errors, or all of whose batch means exceed five times that, samples too hot
#: (:meth:`~pyro_sgmcmc.engine.virial.VirialMeter.too_hot`, whose ``margin`` is this less 1).
HOT_BOUND = 1.5

#: A chain whose configurational temperature is below this many times its target by four
#: standard errors samples too cold (:meth:`~pyro_sgmcmc.engine.virial.VirialMeter.too_cold`,
#: whose ``bound`` this is): for a Gaussian, sds 5% too small. With the defaults the chains of
#: the conjugate, Normal-mean, Beta-Bernoulli, Student-t and logistic posteriors of the probes
#: sampled at 0.96-1.13; SGHMC with ``gradient_noise="estimate"`` at 0.19-0.93, its sds 11-66%
#: too small.
COLD_BOUND = 0.9

#: The caveat of a converged verdict on one chain.
ONE_CHAIN = "on ESS alone: R-hat needs 2 or more chains to show that they agree"


def with_hot_chains(verdict: Verdict, temperatures: Mapping[int, float]) -> Verdict:
    r"""``verdict``, or where some chains sample too hot (``temperatures``: chain to its
    configurational temperature over the target's, for those chains), ``not converged`` for
    that: their draws spread wider than the posterior, which neither :math:`\hat R` nor ESS
    can see, and which a longer run does not mend. The statistics that failed too are kept
    in ``others``."""
    if not temperatures:
        return verdict
    failed = () if verdict.converged or verdict.statistic is None else (
        (verdict.statistic, verdict.value, verdict.bound), *verdict.others
    )  # fmt: skip
    return Verdict(False, "temperature", max(temperatures.values()), HOT_BOUND, math.inf,
                   verdict.basis, tuple(failed), tuple(sorted(temperatures)))  # fmt: skip


def with_temperatures(
    verdict: Verdict, attrs: Mapping[str, Any], num_chains: int | None = None
) -> Verdict:
    r"""``verdict`` with the chains' temperatures an export's ``attrs`` record
    (:func:`temperature_attrs`): ``not converged`` where some chain samples too hot
    (:func:`with_hot_chains`), and where R-hat and ESS say ``converged`` but some chain samples
    too cold (below :data:`COLD_BOUND` times the target by four standard errors): its draws
    spread narrower than the posterior. (A chain that has not converged on R-hat or ESS may
    show any temperature: one still arriving, or barely moving, is not at its stationary law.
    A network judged on its outputs is not judged cold: its temperature is measured on
    weights whose flat directions do not settle; a small regression network's chains sampled
    at 0.06-0.92 of the target with the defaults.)
    """
    verdict = with_hot_chains(verdict, _recorded(attrs, "too_hot_chains", num_chains))
    cold = _recorded(attrs, "too_cold_chains", num_chains)
    if not verdict.converged or not cold or verdict.basis != "parameters":
        return verdict
    return Verdict(False, "temperature", min(cold.values()), COLD_BOUND, math.inf,
                   verdict.basis, (), tuple(sorted(cold)))  # fmt: skip


def _too_hot_text(verdict: Verdict) -> str:
    chains = ", ".join(str(c) for c in verdict.chains)
    where = "" if verdict.basis == "parameters" else f" of {verdict.basis}"
    also = "".join(f", {_failure_text(*failure, where)}" for failure in verdict.others
                   if failure[0] in ("R-hat", "bulk ESS", "tail ESS"))  # fmt: skip
    which = f"chain{'s' if len(verdict.chains) > 1 else ''} {chains}{also}"
    if verdict.bound < 1.0:
        return (
            f"not converged: configurational temperature {verdict.value:.2f} < "
            f"{verdict.bound:g} times the target in {which}; the draws spread narrower than the "
            "posterior: the dynamics inject less noise than they need (SGHMC's gradient_noise, "
            "a value or 'estimate', above the gradient's own noise: leave it at 0), or the "
            "chains were still on their way to it (a longer warm-up)"
        )
    return (
        f"not converged: configurational temperature {verdict.value:.2f} > {verdict.bound:g} "
        f"times the target in {which}; "
        "the draws spread wider than the posterior: a smaller step size or a larger batch "
        "size (a hand-given step_size: leave it out for the adaptive warm-up), not a longer run"
    )


def _failure_text(statistic: str, value: float, bound: float, where: str) -> str:
    """``"R-hat of f(x) 1.0503 > 1.05"`` or ``"bulk ESS 39 < 200"`` (``where``: ``" of f(x)"``
    or ``""``)."""
    if statistic == "R-hat":
        return f"R-hat{where} {rhat_text(value, bound)} > {bound:.2f}"
    return f"{statistic}{where} {value:.0f} < {bound:.0f}"


def rhat_text(value: float, bound: float) -> str:
    r""":math:`\hat R` with three decimals, or with as many more (up to six) as it takes to show
    a value above ``bound`` above it (1.0500233 against 1.05 reads ``1.05002``, not ``1.050``);
    from :data:`FROZEN_RHAT` on, three significant digits (``9.81e+15``)."""
    if not value < FROZEN_RHAT:
        return f"{value:.3g}"
    for decimals in range(3, 7):
        text = f"{value:.{decimals}f}"
        if not value > bound or float(text) > bound:
            return text
    return text


def judge(
    max_rhat: float,
    min_ess_bulk: float,
    min_ess_tail: float,
    num_chains: int,
    *,
    function_space: bool = False,
    min_ess: float | None = None,
    num_draws: int | None = None,
    spread: float = math.nan,
) -> Verdict:
    r"""The :class:`Verdict` on worst-case statistics (see the module docstring).

    Parameters
    ----------
    max_rhat, min_ess_bulk, min_ess_tail:
        The largest :math:`\hat R` (``nan`` with one chain) and the smallest ESS.
    num_chains:
        Chains of the run (the ESS bound is per chain).
    function_space:
        Judge a network's outputs (:data:`FUNCTION_RHAT_BOUND`) instead of parameters.
    min_ess:
        A total ESS to require instead of :data:`ESS_PER_CHAIN` per chain (the larger counts).
    num_draws:
        Draws per chain; fewer than :data:`MIN_DRAWS` cannot be judged.
    spread:
        The largest classic split :math:`\hat R` (:func:`worst_statistics`): from
        :data:`FROZEN_RHAT` on, the chains barely move, and a run that brings them together
        is at least this many times longer (moving at a constant speed; as a random walk, its
        square).
    """
    rhat_bound = FUNCTION_RHAT_BOUND if function_space else RHAT_BOUND
    ess_bound = float(max(ESS_PER_CHAIN * num_chains, min_ess or 0))
    basis = "f(x)" if function_space else "parameters"
    if num_draws is not None and num_draws < MIN_DRAWS:
        return Verdict(False, "draws", num_draws, MIN_DRAWS, MIN_DRAWS / max(num_draws, 1), basis)
    needs = []  # (how many times longer, statistic, value, bound)
    if not math.isnan(max_rhat):
        excess = (max_rhat - 1.0) / (rhat_bound - 1.0) if max_rhat < FROZEN_RHAT else math.inf
        if max_rhat > rhat_bound and spread >= FROZEN_RHAT:  # at least that many times longer
            excess = max(excess, spread)
        needs.append((excess, "R-hat", max_rhat, rhat_bound))
    for name, value in (("bulk ESS", min_ess_bulk), ("tail ESS", min_ess_tail)):
        factor = ess_bound / value if value > 0 else math.inf
        needs.append((factor if not math.isnan(value) else math.inf, name, value, ess_bound))
    failing = sorted((need for need in needs if need[0] > 1.0), key=lambda need: -need[0])
    if not failing:
        caveat = ONE_CHAIN if num_chains == 1 else ""
        return Verdict(True, None, math.nan, math.nan, 1.0, basis, caveat=caveat)
    (longer, statistic, value, bound), *others = failing
    others = tuple(o[1:] for o in others)
    return Verdict(False, statistic, value, bound, longer, basis, others, spread=spread)


@dataclass(frozen=True)
class ConvergenceReport:
    """Worst-case convergence statistics of one inference result.

    Attributes
    ----------
    method:
        Name of the method (e.g. ``"NUTS"``, ``"SGHMC"``, ``"SVI"``).
    num_chains, num_draws:
        Chains and draws per chain.
    max_rhat:
        Largest rank-normalised split :math:`\\hat R` over all scalar quantities (``nan`` with a
        single chain: R-hat compares chains).
    min_ess_bulk, min_ess_tail:
        Smallest bulk and tail ESS over all scalar quantities.
    wall_time:
        Seconds of inference (``nan`` if unknown).
    ess_bulk_per_second:
        ``min_ess_bulk / wall_time`` (``nan`` if the wall time is unknown or zero).
    divergences:
        Post-warm-up draws flagged ``diverging`` in ``sample_stats`` (0 if not recorded).
    verdict:
        The :class:`Verdict` on these statistics.
    """

    method: str
    num_chains: int
    num_draws: int
    max_rhat: float
    min_ess_bulk: float
    min_ess_tail: float
    wall_time: float
    ess_bulk_per_second: float
    divergences: int
    verdict: Verdict | None = None

    def __post_init__(self) -> None:
        if self.verdict is None:
            verdict = judge(self.max_rhat, self.min_ess_bulk, self.min_ess_tail, self.num_chains)
            object.__setattr__(self, "verdict", verdict)

    def to_dict(self) -> dict[str, float | int | str | bool]:
        """The fields as a plain dict (JSON-serialisable); the verdict as ``converged``,
        ``verdict`` (its text) and ``basis``."""
        fields = asdict(self)
        fields.pop("verdict")
        return {
            **fields,
            "converged": self.verdict.converged,
            "verdict": str(self.verdict),
            "basis": self.verdict.basis,
        }

    @property
    def converged(self) -> bool:
        """Whether the verdict is ``converged`` (the bounds of the module docstring)."""
        return self.verdict.converged

    @property
    def basis(self) -> str:
        """What the verdict judged: ``"parameters"`` or ``"f(x)"`` (a network's outputs)."""
        return self.verdict.basis

    def __str__(self) -> str:
        return format_reports([self])


def convergence_report(
    idata: Any,
    method: str | None = None,
    *,
    wall_time: float | None = None,
    var_names: Sequence[str] | None = None,
    group: str | None = None,
    function_space: bool | None = None,
    min_ess: float | None = None,
) -> ConvergenceReport:
    """Summarise the convergence of a run's draws and judge it (see the module docstring).

    Parameters
    ----------
    idata:
        An ``InferenceData`` (ArviZ 0.x) or ``DataTree`` (ArviZ 1.x) with a ``posterior`` group
        (e.g. from :func:`pyro_sgmcmc.analysis.export.to_inference_data`).
    method:
        Name shown in the table; defaults to the ``method`` attribute of the posterior.
    wall_time:
        Seconds of inference, >= 0; defaults to the ``sampling_time`` attribute.
    var_names:
        Variables to include (default: all of the group; for a network's default group, its
        outputs ``output``). Without ``group``, names that are not all variables of the
        network's output group select them from the posterior.
    group:
        The group whose draws are diagnosed. Default: ``"posterior"``; for a network
        (``function_space``), its outputs: the variable ``output`` of ``predictions`` (the
        test inputs), else of ``posterior_predictive`` (the training inputs), there at the rows
        the run judged (the posterior's attributes ``judged_rows`` and ``judged_of_rows``,
        which ``run_chains`` and ``pyro.infer.MCMC`` with this package's kernels record), so
        that the report says the run's verdict. A group given by name is judged at every row.
    function_space:
        Judge the draws as a network's outputs (:data:`FUNCTION_RHAT_BOUND`). Default: the
        ``function_space`` attribute the export records for networks, for their outputs
        ``output`` in the groups of :data:`OUTPUT_GROUPS` (with any variable named beside them);
        any other selection (e.g. ``sigma`` in the posterior, the replicated observations
        alone, or ``log_likelihood``) is judged with the parameters' bounds and named in the
        verdict.
    min_ess:
        A total bulk and tail ESS to require beyond :data:`ESS_PER_CHAIN` per chain. Default:
        the ``target_ess`` attribute of the posterior (a ``run_chains(..., target_ess=...)``
        run's export records it), so that the report judges as the run did.

    Returns
    -------
    ConvergenceReport
    """
    _arviz.check_result(idata)
    if not _arviz.has_group(idata, "posterior"):
        raise ValueError("idata must have a posterior group")
    var_names = [var_names] if isinstance(var_names, str) else var_names  # as ArviZ takes it
    attrs = _arviz.get_group(idata, "posterior").attrs
    network = bool(attrs.get("function_space", False))
    at_judged_rows = group is None
    if group is None:
        group, var_names = _default_selection(idata, network, function_space, var_names)
    dataset = _select(idata, group, var_names)
    if function_space is None:  # a network's outputs; its replicated observations alone are not
        function_space = network and group in OUTPUT_GROUPS and "output" in dataset.data_vars
    if function_space and group in OUTPUT_GROUPS:  # at the rows and on the scale the run judged
        dataset = judged_outputs(dataset, attrs, at_judged_rows and group == "posterior_predictive")
    if wall_time is None:
        wall_time = attrs.get("sampling_time", math.nan)
    wall_time = float(wall_time)
    if not (math.isnan(wall_time) or wall_time >= 0):
        raise ValueError(f"wall_time must be >= 0 seconds, got {wall_time}")
    if method is None:
        method = str(attrs.get("method", "unknown"))
    if min_ess is None and "target_ess" in attrs:
        min_ess = float(attrs["target_ess"])
    num_chains, num_draws = dataset.sizes["chain"], dataset.sizes["draw"]
    max_rhat, min_bulk, min_tail, spread = worst_statistics(dataset)
    per_second = min_bulk / wall_time if wall_time and wall_time > 0 else math.nan
    divergences = 0
    if _arviz.has_group(idata, "sample_stats"):
        stats = _arviz.get_group(idata, "sample_stats")
        if "diverging" in stats:
            divergences = int(stats["diverging"].values.sum())
    verdict = judge(
        max_rhat, min_bulk, min_tail, int(num_chains), function_space=function_space,
        min_ess=min_ess, num_draws=int(num_draws), spread=spread,
    )  # fmt: skip
    if not function_space and group != "posterior":  # name what was judged
        verdict = replace(verdict, basis=group)
    verdict = with_temperatures(verdict, attrs, int(num_chains))
    if "svi_estimator" in attrs:  # an SVI export (pyro_sgmcmc.analysis.export)
        # draws of a variational guide are independent by construction: no chain to judge
        verdict = Verdict(False, "fitted", math.nan, math.nan, 1.0, verdict.basis)
    return ConvergenceReport(
        method=method,
        num_chains=int(num_chains),
        num_draws=int(num_draws),
        max_rhat=max_rhat,
        min_ess_bulk=min_bulk,
        min_ess_tail=min_tail,
        wall_time=wall_time,
        ess_bulk_per_second=per_second,
        divergences=divergences,
        verdict=verdict,
    )


def temperature_attrs(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The export's attributes ``configurational_temperature`` (per chain, over the target's),
    ``too_hot_chains`` and ``too_cold_chains`` from the chains' reports
    (:func:`~pyro_sgmcmc.engine.report.sampling_report`); none where nothing was measured."""
    temperatures = [float(r.get("configurational_temperature", math.nan)) for r in reports]
    if not any(math.isfinite(t) for t in temperatures):
        return {}
    attrs: dict[str, Any] = {"configurational_temperature": temperatures}
    for flag in ("too_hot", "too_cold"):
        chains = [c for c, report in enumerate(reports) if report.get(flag)]
        if chains:
            attrs[f"{flag}_chains"] = chains
    return attrs


def hot_chains(attrs: Mapping[str, Any], num_chains: int | None = None) -> dict[int, float]:
    """The chains an export records as too hot (attributes ``too_hot_chains`` and
    ``configurational_temperature``; netCDF reads a list of one as a scalar), each with its
    temperature over the target's; with ``num_chains``, only chains below it (an export cut to
    fewer chains)."""
    return _recorded(attrs, "too_hot_chains", num_chains)


def _recorded(attrs: Mapping[str, Any], key: str, num_chains: int | None) -> dict[int, float]:
    """The chains of attribute ``key`` (see :func:`hot_chains`) with their temperatures."""
    hot = np.atleast_1d(np.asarray(attrs.get(key, ()), dtype=np.int64))
    temperatures = np.atleast_1d(
        np.asarray(attrs.get("configurational_temperature", ()), dtype=np.float64)
    )
    limit = len(temperatures) if num_chains is None else min(num_chains, len(temperatures))
    return {int(c): float(temperatures[c]) for c in hot if 0 <= c < limit}


def _default_selection(
    idata: Any, network: bool, function_space: bool | None, var_names: Sequence[str] | None
) -> tuple[str, Sequence[str] | None]:
    """The group (and variables) judged when none is given: a network's outputs where the
    export holds them and ``var_names`` names none but them, else the posterior."""
    output_group = _output_group(idata)
    wanted = network if function_space is None else function_space
    if not wanted or output_group is None:
        return "posterior", var_names
    if var_names is None:
        return output_group, ["output"]
    if set(var_names) <= set(_arviz.get_group(idata, output_group).data_vars):
        return output_group, var_names
    return "posterior", var_names


def _output_group(idata: Any) -> str | None:
    """The group holding a network's outputs ``output``: test inputs first."""
    for group in OUTPUT_GROUPS:
        if _arviz.has_group(idata, group) and "output" in _arviz.get_group(idata, group):
            return group
    return None


def _select(idata: Any, group: str, var_names: Sequence[str] | None):
    names = _arviz.group_names(idata)
    if group not in names:
        raise ValueError(f"group must be one of {names}, got {group!r}")
    dataset = _arviz.get_group(idata, group)
    if "chain" not in dataset.dims or "draw" not in dataset.dims:
        drawn = [n for n in names if {"chain", "draw"} <= set(_arviz.get_group(idata, n).dims)]
        raise ValueError(f"group {group!r} holds no draws (no chain and draw dimensions): "
                         f"judge one of {drawn}")  # fmt: skip
    if var_names is None:
        return dataset
    if not var_names:
        raise ValueError("var_names must name at least one variable, got an empty list")
    missing = [v for v in var_names if v not in dataset.data_vars]
    if missing:
        raise ValueError(
            f"var_names must name variables of the {group} group "
            f"{sorted(dataset.data_vars)}, got unknown {missing}"
        )
    return dataset[list(var_names)]


def worst_statistics(dataset) -> tuple[float, float, float, float]:
    r"""The largest rank-normalised split :math:`\hat R` (``nan`` with one chain; ``inf`` for a
    coordinate constant within chains but not across them; a coordinate constant in every draw
    left out), the smallest bulk and tail ESS, and the largest classic split :math:`\hat R`
    (the ``spread`` of :func:`judge`) over every scalar of an xarray ``Dataset`` with
    ``chain`` and ``draw`` dimensions, computed for all of them at once
    (:mod:`.rank_diagnostics`: thousands of a network's outputs about 7 times faster than
    ArviZ)."""
    if dataset.sizes["draw"] < MIN_DRAWS or not dataset.data_vars:
        return math.nan, math.nan, math.nan, math.nan
    columns = [
        np.asarray(variable.transpose("chain", "draw", ...).values, dtype=float)
        for variable in dataset.data_vars.values()
    ]
    draws = np.concatenate([c.reshape(*c.shape[:2], -1) for c in columns], axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return worst_of_all(draws)


_COLUMNS = (
    ("method", "method", "{}"),
    ("chains", "num_chains", "{:d}"),
    ("draws", "num_draws", "{:d}"),
    ("max R-hat", "max_rhat", "{:.3f}"),
    ("min ESS bulk", "min_ess_bulk", "{:.0f}"),
    ("min ESS tail", "min_ess_tail", "{:.0f}"),
    ("time [s]", "wall_time", "{:.2f}"),
    ("ESS/s", "ess_bulk_per_second", "{:.2f}"),
    ("divergences", "divergences", "{:d}"),
    ("judged on", "basis", "{}"),
    ("verdict", "verdict", "{}"),
)


def format_reports(reports: Iterable[ConvergenceReport]) -> str:
    """A plain-text table with one row per report (for tutorials and the CLI)."""
    reports = list(reports)
    if not reports:
        raise ValueError("reports must contain at least one ConvergenceReport")
    rows = [[title for title, _, _ in _COLUMNS]]
    for report in reports:
        row = []
        for _, attribute, fmt in _COLUMNS:
            value = getattr(report, attribute)
            if isinstance(value, float) and not math.isfinite(value):
                row.append("inf" if value == math.inf else "-")
            elif attribute == "max_rhat":
                bound = FUNCTION_RHAT_BOUND if report.basis == "f(x)" else RHAT_BOUND
                row.append(rhat_text(value, bound))
            else:
                row.append(fmt.format(value))
        rows.append(row)
    widths = [max(len(row[k]) for row in rows) for k in range(len(_COLUMNS))]
    lines = []
    for i, row in enumerate(rows):
        last = len(row) - 1  # the method and the verdict are words: left-aligned
        cells = [
            cell.ljust(width) if k in (0, last) else cell.rjust(width)
            for k, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def reports_table(reports: Iterable[ConvergenceReport]) -> Any:
    """The table of :func:`format_reports` as a ``pandas.DataFrame``, one row per method.

    A notebook renders it as an HTML table. The columns carry the same titles as the text
    table; values are numbers (``NaN`` where a statistic does not apply), not strings.

    Returns
    -------
    pandas.DataFrame
        Indexed by method.
    """
    import pandas as pd  # an ArviZ dependency, imported here to keep this module light

    reports = list(reports)
    if not reports:
        raise ValueError("reports must contain at least one ConvergenceReport")
    rows = [
        {
            title: str(value) if isinstance(value, Verdict) else value
            for title, attribute, _ in _COLUMNS
            for value in [getattr(report, attribute)]
        }
        for report in reports
    ]
    return pd.DataFrame(rows).set_index("method")
