r"""After inference: export to ArviZ, convergence verdicts, predictive summaries, metrics, figures.

Every result (MCMC, :func:`~pyro_sgmcmc.run_chains`, SVI) becomes an ArviZ object with
:func:`~pyro_sgmcmc.analysis.export.to_inference_data`; :mod:`._arviz` is the one module that knows
whether ArviZ 0.x or 1.x is installed.

=========================  ===================================================================
module                     job
=========================  ===================================================================
:mod:`.export`             the entry: :func:`to_inference_data`, :func:`from_draws`
:mod:`.export_groups`      the export's groups: posterior, log-likelihood, predictive, data
:mod:`.export_sources`     what a source of draws holds: MCMC, ``run_chains``, SVI
:mod:`.export_trace`       log-likelihood and predictive draws, the model traced per chunk
:mod:`.export_checks`      refuse draws, models and data that do not belong together
:mod:`.fitted_data`        refuse training data other than those a result was fitted on
:mod:`.export_hmc_stats`   :class:`HMCStatsCollector`: per-draw statistics of NUTS and HMC
:mod:`.export_xarray`      arrays to labelled ``xarray.Dataset`` groups
:mod:`._arviz`             ArviZ 0.x or 1.x: the one module that knows which
:mod:`.diagnostics`        convergence report and verdict: R-hat, ESS, divergences
:mod:`.advice`             what an unconverged run's warning advises beyond a longer run
:mod:`.rank_diagnostics`   rank-normalised R-hat, bulk and tail ESS of many quantities at once
:mod:`.function_space`     a run's verdict on parameters or on a network's outputs
:mod:`.judged_outputs`     the outputs a verdict judges: class probabilities, judged rows
:mod:`.predictive`         posterior predictive summaries, epistemic/aleatoric split
:mod:`.metrics`            predictive metrics for regression and classification
:mod:`.plots`              the figures of ``pyro-sgmcmc compare``
=========================  ===================================================================
"""
