r"""The one chain engine behind every SG-MCMC sampler of the package.

=========================  ===================================================================
module                     job
=========================  ===================================================================
:mod:`.engine`             :class:`ChainEngine`: advance :math:`C \ge 1` chains one step at a time
:mod:`.build`              :func:`prepare_chains`: model, data, seeds, starts -> a started engine
:mod:`.settings`           :class:`SamplerSettings`: the validated options every driver shares
:mod:`.controls`           step size, phase and preconditioner per step (schedules, constant SGD)
:mod:`.adaptation`         the tuning-free warm-up
:mod:`.dense`              the warm-up's dense preconditioner, for models with few coordinates
:mod:`.view`               what the controls and meters may read of the engine (a protocol)
:mod:`.estimators`         gradient estimators: minibatch, control variates
:mod:`.minibatch`          per-chain minibatch streams (epoch-wise or independent)
:mod:`.noise`              the injected Gaussian noise, from each chain's generator in blocks
:mod:`.divergence`         divergence detection (non-finite values, blow-ups) and bookkeeping
:mod:`.health`             after a run: chains or coordinates that did not move, chains too hot
:mod:`.prior_distance`     after a run: a network's weights that stay far outside their prior
:mod:`.unit_restart`       end of warm-up: a network's units far outside their prior, restarted
:mod:`.virial`             the configurational temperature of a chain (a stationarity check)
:mod:`.fit_check`          after warm-up: a chain whose fit to the data collapsed
:mod:`.fit_recovery`       during warm-up: send a chain whose fit collapsed back to a milestone
:mod:`.blind_sites`        before sampling: latent sites the likelihood's gradient cannot see
:mod:`.hierarchy`          before sampling: sites that set others' spread (a funnel to watch)
:mod:`.thinning`           the thinning the warm-up chooses from the autocorrelation it measures
:mod:`.report`             what the warm-up chose, as ``diagnostics()`` reports it
:mod:`.gibbs_blocks`       exact conditional updates of some sites, chain by chain
:mod:`.layout`             the flat ``(C, D)`` layout of the moving sites
:mod:`.recorder`           the kept draws and per-draw statistics, for both drivers
:mod:`.mcmc_layout`        kept draws laid out as ``MCMC`` lays out its own (the same bits)
:mod:`.distributed`        chains over several processes with ``torch.distributed``
:mod:`.seeds`              the per-chain seed derivation
=========================  ===================================================================

The ``pyro.infer.MCMC`` kernels (:mod:`pyro_sgmcmc.kernels`) adapt it with :math:`C = 1`;
:func:`pyro_sgmcmc.run_chains` drives it with :math:`C` chains stacked.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ChainEngine", "PreparedChains", "SamplerSettings", "prepare_chains"]

_WHERE = {
    "ChainEngine": ".engine",
    "PreparedChains": ".build",
    "prepare_chains": ".build",
    "SamplerSettings": ".settings",
}


def __getattr__(name: str) -> Any:
    # loaded on first use: potentials.py imports .layout, and .build imports potentials.py
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
