r"""Data: built-in sets and your own tables, split with a seed and standardised.

:func:`~pyro_sgmcmc.data.datasets.load_dataset` and
:func:`~pyro_sgmcmc.data.datasets.load_table` return a frozen ``Dataset`` of torch tensors.

=========================  ===================================================================
module                     job
=========================  ===================================================================
:mod:`.datasets`           the entry: the registry of names, :func:`load_dataset`
:mod:`.datasets_base`      the ``Dataset`` container; splitting and standardising
:mod:`.datasets_builtin`   the built-in sets: toys, scikit-learn's, Boston, Fashion-MNIST
:mod:`.datasets_table`     your own tables: CSV, NPZ, Parquet, checked and split
:mod:`.datasets_targets`   target densities for tests of mixing
=========================  ===================================================================
"""
