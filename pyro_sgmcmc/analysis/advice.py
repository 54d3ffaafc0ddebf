r"""What the warning of an unconverged run advises, beyond its verdict's "run about k times
longer": the causes a longer run does not cure, and their remedies.

:func:`advice` gathers them: for SGLD and pSGLD on a network, that SGHMC's momentum mixes its
outputs faster (:func:`network_advice`); for chains that barely move, the likely causes
(:func:`frozen_advice`); for chains far apart, whether they are on their way or stuck
(:func:`stuck_advice`). The engine adds what the warm-up's measurement of the
autocorrelation time says (:func:`~pyro_sgmcmc.engine.report.measurement_advice`).
"""

from __future__ import annotations

from .diagnostics import Verdict

__all__ = ["APART", "NETWORK_ADVICE", "OVERDAMPED_KERNELS", "RICH_GROUPS", "advice",
           "frozen_advice", "network_advice", "stuck_advice"]  # fmt: skip

#: Kernels whose overdamped Langevin dynamics cross a network's flat directions slowly.
OVERDAMPED_KERNELS = ("sgld", "psgld")
#: What :func:`network_advice` adds (a comparison that ran SGHMC too keeps it only where SGHMC
#: did mix the outputs faster there).
NETWORK_ADVICE = (
    "; on networks SGHMC's momentum usually mixes the outputs several times faster "
    "with the same defaults"
)


def network_advice(algorithm: str, verdict: Verdict) -> str:
    r"""What to add to the warning of an unconverged network run of SGLD or pSGLD.

    Most directions of a network's posterior are far flatter than its coordinates' curvature
    says; overdamped Langevin dynamics needs about :math:`1/(h\lambda)` steps to cross one,
    SGHMC's momentum about the square root of that (on the demo's network, with the defaults:
    7.6 times Pyro NUTS's ESS/s for SGHMC, 4.8 for SGLD, 1.2 for pSGLD; docs/performance.md).
    ``""`` for a converged run, a judgement of parameters, or another kernel.
    """
    if verdict.converged or verdict.basis != "f(x)" or algorithm not in OVERDAMPED_KERNELS:
        return ""
    return NETWORK_ADVICE


#: An :math:`\hat R` this many times its bound's distance from 1 (1.1 for parameters, 1.5 for a
#: network's outputs) says the chains sit in different places, not that they are slow.
APART = 10.0


def stuck_advice(verdict: Verdict, slow_chains: bool = False) -> str:
    r"""What to add to the warning of a run whose chains disagree far beyond the
    :math:`\hat R` bound (``""`` otherwise), where a longer run is often not the cure.

    A model's parameters: the chains are still on their way or each stuck in its own place. On
    their way: the warm-up ended before they arrived, as on a non-centred hierarchical model of
    40 groups whose descent ends at the joint mode, with the group scale at 1.4 where the
    posterior's is 0.28 +- 0.05, and whose coupled coordinates then move slowly (R-hat 1.19
    after a warm-up of 4,200 steps and 1,000 draws per chain; 1.01 and bulk ESS 600 after a
    warm-up of 20,000 steps; the warm-up now lengthens itself there, at most
    :data:`~pyro_sgmcmc.engine.thinning.LONGEST_WARMUP` times): a longer warm-up is the cure
    where that was not enough. Stuck: a separate mode, or
    the neck of a centred hierarchical model's funnel, where a group scale went to zero (a
    concentration to infinity) with every member at the group's mean during the warm-up's
    descent -- and stay there however long they run. A
    network's outputs: each chain explores its own region of the posterior (a mode and its
    surroundings) and moves through it slowly; on a regression of 12,000 training rows (50
    units) neither a warm-up five times longer nor a minute of more draws brought the chains'
    predictions
    together (:math:`\hat R` of :math:`f(x)` 2.9 and 2.5), while their pooled draws predicted
    well (docs/adaptation.md, Limits). With ``slow_chains`` (a model's parameters whose kept
    draws are closer than their autocorrelation time: the engine's thinning advice says so and
    what to do), an :math:`\hat R` this large is what chains this slow give, and the advice
    only says how to tell stuck chains from those."""
    failures = [(verdict.statistic, verdict.value, verdict.bound), *verdict.others]
    apart = any(
        statistic == "R-hat" and value - 1.0 >= APART * (bound - 1.0)
        for statistic, value, bound in failures
    )
    if verdict.converged or not apart:
        return ""
    if verdict.basis == "f(x)":
        return (
            "; chains this far apart predict differently: unless the warm-up was too short for "
            "them to arrive, each chain of a network usually explores its own region of the "
            "posterior (a mode and its surroundings) and moves through it slowly, which more "
            "draws cure only slowly; the chains' draws pooled average over those regions, as an "
            "ensemble does"
        )
    if slow_chains:
        return (
            "; chains stuck in their own places (a separate mode, or the neck of a centred "
            "hierarchical model's funnel, which non-centring or NUTS cures) stay apart however "
            "long they run, where slow chains draw together: compare the chains' draws of each "
            "site (arviz.plot_trace)" + RICH_GROUPS
        )
    return (
        "; chains this far apart are either still on their way or each stuck in its own place. "
        "Still on their way: the warm-up ended before they arrived, often along a direction in "
        "which many coordinates move together (a non-centred hierarchical model's warm-up "
        "starts at its joint mode, where the group scale is several times its posterior "
        "value, and the warm-up goes on at most 8 times its planned length): give a warm-up "
        "several times longer in gradient steps (with the thinning left to the kernel, "
        "warmup_steps draws of at least 4,000 take one step each). "
        "Stuck: a separate mode, or the neck of a centred hierarchical "
        "model's funnel (a group scale near zero with every member at the group mean), which "
        "a longer run does not cure: write such a model in non-centred form, or sample it with "
        "NUTS. Compare the chains' draws of each site (arviz.plot_trace)" + RICH_GROUPS
    )


#: The other direction of the hierarchical cure, added to :func:`stuck_advice` for parameters:
#: where every group holds many rows, the data fix each group's value, and a non-centred
#: model's group mean and effects can only move together. On 20 groups of 500 rows (batches of
#: 100, four chains of 500 draws after 100 warm-up epochs; 2026-12-07) the non-centred model
#: ended with R-hat 2.24 and bulk ESS 5 in 66 s, the centred one with R-hat 1.00 and bulk ESS
#: 1,993 in 12 s.
RICH_GROUPS = (
    ". A non-centred hierarchical model whose groups each hold many rows mixes slowly for the "
    "opposite reason (the data fix each group's value, so its group mean and effects can only "
    "move together): write that one in centred form"
)


def frozen_advice(verdict: Verdict) -> str:
    r"""What to add to the warning of a run whose chains barely move, or do not move at all
    (``""`` otherwise): the likely causes, and their remedies.

    With a hand-given step size of :math:`10^{-12}` on a conjugate regression, four SGHMC
    chains moved about :math:`10^{-4}` over 200 draws while they sat about 1 apart;
    extrapolating the ESS said "run about 301 times longer". Moving at a constant speed they
    would need the ratio of the two (about 60,000 times longer) to meet, and as a random walk
    its square."""
    if not verdict.not_moving:
        return ""
    return (
        "; chains that barely move have a step size far too small for this posterior (a "
        "hand-given step_size: leave it out for the adaptive warm-up, or give a larger one; "
        "a warm-up too short to adapt it), diverge at every step (sample_stats.diverging), or "
        "sit in the neck of a centred hierarchical model's funnel (write it in non-centred form)"
    )


def advice(algorithm: str, verdict: Verdict, slow_chains: bool = False) -> str:
    """:func:`network_advice` and :func:`frozen_advice` or :func:`stuck_advice` (told of
    ``slow_chains``), for the warning of an unconverged run (none for chains too hot: the
    verdict's own remedy, a smaller step, comes first)."""
    if verdict.statistic == "temperature":
        return ""
    apart = frozen_advice(verdict) or stuck_advice(verdict, slow_chains)
    return network_advice(algorithm, verdict) + apart
