r"""Running SG-MCMC: many chains at once, checkpoints and resume, step-size schedules.

The kernels of :mod:`pyro_sgmcmc.kernels` run inside ``pyro.infer.MCMC``; this folder holds the
package's own drivers around the same engine (:mod:`pyro_sgmcmc.engine`).

=========================  ===================================================================
module                     job
=========================  ===================================================================
:mod:`.vectorized`         :func:`run_chains`: many chains in one process, stacked on a chain axis
:mod:`.across_ranks`       ``run_chains`` with chains across processes: shares, the gather
:mod:`.rounds`             a run until converged: judge the draws, size the next round
:mod:`.checkpoint`         :class:`ResumableMCMC`: checkpoint, resume and extend a run
:mod:`.checkpoint_files`   checkpoint files: format, atomic writes, integrity, when to write
:mod:`.schedules`          step-size schedules (polynomial decay, cyclical, ...)
=========================  ===================================================================
"""
