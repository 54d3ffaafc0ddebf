r"""The ``pyro-sgmcmc`` command line and the comparison behind ``pyro-sgmcmc compare``.

:func:`main` is the console script; :func:`~pyro_sgmcmc.cli.compare.run_comparison` runs the
comparison from Python too.

=========================  ===================================================================
module                     job
=========================  ===================================================================
:mod:`.commands`           the command line: parser, ``compare`` and ``sample`` commands
:mod:`.compare`            :func:`run_comparison`: run every method and write the results
:mod:`.compare_config`     :class:`CompareConfig`: the settings, their checks, their data
:mod:`.compare_fit`        the model and each method's inference (NUTS, SG-MCMC, SVI)
:mod:`.compare_method`     one method from data to table row
:mod:`.compare_jobs`       the methods in turn, or several at once in worker processes
:mod:`.compare_output`     the output directory and its manifest
:mod:`.compare_results`    the results as a table, ``summary.json``, ``summary.md``
=========================  ===================================================================
"""

from .commands import build_parser, main

__all__ = ["build_parser", "main"]
