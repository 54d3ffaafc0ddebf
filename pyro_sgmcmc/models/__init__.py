r"""A Pyro model as the samplers see it: its structure, its potential energy, its conditionals.

A user's model is any Pyro model with one data plate (see the "model contract" page). Before a
chain moves, :mod:`.structure` reads the model's latent sites and plate, :mod:`.potential_choice`
picks how its minibatch potential and gradient are computed, :mod:`.conjugate` finds sites with
exact conditionals for Gibbs steps, and :mod:`.initialization` chooses where chains start.

=========================  ===================================================================
module                     job
=========================  ===================================================================
:mod:`.structure`          the contract: latent sites, the data plate, restricting a model to rows
:mod:`.hidden_units`       whether a model is a network judged on its outputs (site shapes)
:mod:`.contract_checks`    contract checks that name the fault: observation shapes, priors, plates
:mod:`.potentials`         minibatch potentials: closed-form gradient, batched ``log_joint``, trace
:mod:`.functional_potential`the fast path for any Pyro model: one light handler, chains at once
:mod:`.graph_capture`      replay a potential's value and gradient from one recorded graph
:mod:`.graph_simplify`     fewer operations in a recorded graph, with the same numbers
:mod:`.potential_choice`   which potential a model gets (the ``potential`` option)
:mod:`.gibbs`              Gibbs steps inside the kernels: the protocol and helpers
:mod:`.conjugate`          exact Normal-Gamma conditionals, found in the model
:mod:`.initialization`     starting points: over-dispersed prior draws, a MAP fit
:mod:`.model_params`       a model's own ``pyro.param`` values: recorded by a run, substituted after
=========================  ===================================================================
"""
