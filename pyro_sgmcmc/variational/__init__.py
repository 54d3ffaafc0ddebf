r"""The variational baseline: a mean-field Gaussian guide fitted on minibatches (Bayes by Backprop).

:func:`~pyro_sgmcmc.variational.svi.fit_svi` is the entry; :mod:`.flipout` gives its
lower-variance gradient estimators (local reparameterisation, Flipout).

=========================  ===================================================================
module                     job
=========================  ===================================================================
:mod:`.svi`                :func:`fit_svi`, the entry: arguments in, :class:`SVIResult` out
:mod:`.svi_checks`         every argument of ``fit_svi`` checked, the fit planned
:mod:`.svi_fit`            the optimisation loop: one fit after another, step by step
:mod:`.svi_loss`           the differentiable loss of one minibatch
:mod:`.svi_result`         :class:`SVIResult`: the fitted guides and what can be asked of them
:mod:`.svi_prior`          the learnable scale-mixture prior (empirical Bayes)
:mod:`.svi_store`          Pyro's parameter store around a fit
:mod:`.flipout`            the estimators' entry: local reparameterisation and Flipout
:mod:`.flipout_estimators` one draw of a mean-field layer's pre-activations per estimator
:mod:`.flipout_mlp`        the plain-torch loss of a guide on a ``BayesianMLP``
:mod:`.flipout_modules`    the loss of a guide on any ``PyroModule`` of Linear/Conv layers
:mod:`.pruning`            signal-to-noise pruning of a mean-field posterior
=========================  ===================================================================
"""
