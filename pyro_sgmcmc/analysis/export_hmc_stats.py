r"""Per-draw statistics of Pyro's HMC and NUTS: the :class:`HMCStatsCollector` hook.

``pyro.infer.MCMC`` keeps only the draws. Passed as its ``hook_fn``, :class:`HMCStatsCollector`
reads the kernel's running state after each transition (step size, acceptance probability,
potential and total energy, divergence); :func:`~pyro_sgmcmc.analysis.export.to_inference_data`
turns what it recorded into the ``sample_stats`` group (through
:mod:`~pyro_sgmcmc.analysis.export_sources`). Nothing here depends on ArviZ or on the rest of the
export.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from pyro.infer.mcmc import HMC

__all__ = ["HMCStatsCollector"]


class _MomentumProbe:
    """Stands in for an HMC/NUTS kernel's ``_sample_r``: records the Hamiltonian at the start of
    each transition, :math:`U(q) + K(r)`, with the freshly drawn momentum (picklable, so that a
    probed kernel can still be sent to worker processes)."""

    def __init__(self, kernel: HMC, collector: HMCStatsCollector) -> None:
        sample_r = kernel._sample_r
        # another collector's probe: wrap what it wraps, not the probe
        self.sample_r = sample_r.sample_r if isinstance(sample_r, _MomentumProbe) else sample_r
        self.kernel = kernel
        self.collector = collector

    def __call__(self, name: str) -> Any:
        r, r_unscaled = self.sample_r(name)
        # "r_t=<t>" is the momentum of transition t; "r_presample_<k>" the step-size search's
        if name.startswith("r_t="):
            potential = self.kernel._potential_energy_last
            kinetic = self.kernel._kinetic_energy(r_unscaled)
            self.collector._pending_energy = float(potential + kinetic)
        return r, r_unscaled


class HMCStatsCollector:
    r"""A ``hook_fn`` for ``pyro.infer.MCMC`` that records per-draw HMC / NUTS statistics.

    ``pyro.infer.MCMC`` keeps only the draws; HMC and NUTS expose their running state after each
    transition, which this hook reads: the step size, the potential energy of the new state (minus
    ``lp``), whether the transition diverged, and the acceptance probability, recovered from
    Pyro's running mean :math:`\bar a_n = \bar a_{n-1} + (a_n - \bar a_{n-1})/n` as
    :math:`a_n = n\bar a_n - (n-1)\bar a_{n-1}`.

    ``energy`` is the Hamiltonian

    .. math::

        H_n = U(q_{n-1}) + \tfrac12\, r_n^\top M^{-1} r_n ,

    at the start of transition :math:`n`: the potential energy of the previous state plus the
    kinetic energy of the momentum :math:`r_n \sim \mathcal N(0, M)` just drawn (Pyro's
    ``energy_current``, whose conservation along the trajectory the Metropolis or slice step
    tests). Pyro keeps no momentum after a transition, so on its first call the collector wraps
    the kernel's momentum draw (``_sample_r``) to read it; the first warm-up transition of a
    kernel, which happens before that call, has no energy, the ones after do. Stan and PyMC
    report the Hamiltonian at the selected state of the trajectory instead; the two differ by the
    integrator's energy error at that state (small unless the transition diverges), and the
    energy-transition statistics computed from either estimate the same E-BFMI
    :math:`\sum_n (H_n - H_{n-1})^2 / \sum_n (H_n - \bar H)^2` (Betancourt 2016), which
    ``az.bfmi`` and ``az.plot_energy`` read.

    Chains run in worker processes (``num_chains <= cpu_count - 1``) call the hook in the worker,
    so nothing is recorded: construct the ``MCMC`` inside
    :func:`~pyro_sgmcmc.sequential_chains` to keep its chains in this process on any machine.

    Examples
    --------
    >>> collector = HMCStatsCollector()                       # doctest: +SKIP
    >>> mcmc = MCMC(NUTS(model), 200, warmup_steps=200, hook_fn=collector)   # doctest: +SKIP
    >>> mcmc.run(x, y)                                        # doctest: +SKIP
    >>> idata = to_inference_data(mcmc, model, x, y, hmc_stats=collector)  # doctest: +SKIP

    References
    ----------
    M. Betancourt, "Diagnosing suboptimal cotangent disintegrations in Hamiltonian Monte Carlo",
    arXiv:1604.00695, 2016.
    """

    _FIELDS = ("step_size", "acceptance_rate", "lp", "energy", "diverging")

    def __init__(self, hook: Callable[..., Any] | None = None) -> None:
        if hook is not None and not callable(hook):
            raise TypeError(f"hook must be callable or None, got {hook!r}")
        self.hook = hook
        self.chains: list[dict[str, list]] = []
        self._previous_mean = 0.0
        self._last_stage = ""
        self._pending_energy = math.nan

    def _chain_for(self, stage: str, i: int) -> dict[str, list] | None:
        match = re.search(r"\[(\d+)\]", stage)
        if match is not None:
            index = int(match.group(1))
            while len(self.chains) <= index:
                self.chains.append({field: [] for field in self._FIELDS})
            return self.chains[index]
        starts_chain = i == 0 and (
            stage.startswith("Warmup") or not self._last_stage.startswith("Warmup")
        )
        if starts_chain or not self.chains:
            self.chains.append({field: [] for field in self._FIELDS})
        return self.chains[-1]

    def __call__(self, kernel: Any, params: Mapping[str, torch.Tensor], stage: str, i: int) -> None:
        chain = self._chain_for(stage, i)
        self._last_stage = stage
        if isinstance(kernel, HMC):
            probe = kernel.__dict__.get("_sample_r")
            if not (isinstance(probe, _MomentumProbe) and probe.collector is self):
                kernel._sample_r = _MomentumProbe(kernel, self)
        if stage.startswith("Sample") and isinstance(kernel, HMC):
            n = i + 1
            mean = float(kernel._mean_accept_prob)
            previous = self._previous_mean if n > 1 else 0.0
            chain["acceptance_rate"].append(n * mean - (n - 1) * previous)
            self._previous_mean = mean
            chain["step_size"].append(float(kernel.step_size))
            energy = getattr(kernel, "_potential_energy_last", None)
            chain["lp"].append(-float(energy) if energy is not None else math.nan)
            chain["energy"].append(self._pending_energy)
            divergences = getattr(kernel, "_divergences", [])
            chain["diverging"].append(bool(divergences) and divergences[-1] == i)
        self._pending_energy = math.nan
        if self.hook is not None:
            self.hook(kernel, params, stage, i)

    def stats(self, num_chains: int, num_draws: int) -> dict[str, np.ndarray] | None:
        """The statistics as ``(chain, draw)`` arrays, or ``None`` if they are incomplete.

        ``energy`` is left out (with a warning) if a draw lacks it: with ``warmup_steps=0`` the
        first draw of the first chain precedes the collector's first call.
        """
        chains = [c for c in self.chains if c["step_size"]]
        if len(chains) != num_chains or any(len(c["step_size"]) != num_draws for c in chains):
            return None
        stats = {
            field: np.asarray(
                [c[field] for c in chains], dtype=bool if field == "diverging" else float
            )
            for field in self._FIELDS
        }
        if not np.isfinite(stats["energy"]).all():
            missing = int((~np.isfinite(stats["energy"])).sum())
            warnings.warn(
                f"HMCStatsCollector: {missing} draw(s) have no energy (the collector first sees "
                "a kernel after its first transition; use warmup_steps >= 1); exporting without "
                "`energy`",
                stacklevel=3,
            )
            del stats["energy"]
        return stats
