r"""The variational baseline: a mean-field Gaussian guide fitted on data-plate minibatches.

The guide is Pyro's :class:`~pyro.infer.autoguide.AutoNormal`: independent Gaussians
:math:`q(z_j) = \mathcal N(\mu_j, \sigma_j^2)` on every latent coordinate in unconstrained space,
with :math:`\sigma_j = \operatorname{softplus}(\rho_j) = \log(1 + e^{\rho_j})`, the
parameterisation of Bayes by Backprop (Blundell et al., 2015). The gradient of the ELBO comes from
the reparameterisation :math:`z = \mu + \sigma \odot \epsilon`, :math:`\epsilon\sim\mathcal N(0,I)`.

Minibatches and the KL weight
-----------------------------
Each step draws a minibatch :math:`S` of :math:`B` rows out of :math:`N` (epochs without
replacement, :class:`~pyro_sgmcmc.engine.minibatch.Minibatcher`) and conditions the data plate's
index site on it, exactly as the SG-MCMC kernels do; Pyro then scales the log-likelihood by
:math:`N/B`. The loss of one step is therefore

.. math::

    \hat L_S = \mathbb E_q\Big[\log q(z) - \log p(\theta)
               - \frac{N}{B}\sum_{i\in S}\log p(y_i\mid\theta)\Big]
             = \mathrm{KL}(q\,\|\,p) - \frac{N}{B}\sum_{i\in S}\mathbb E_q \log p(y_i\mid\theta),

and with :math:`M = N/B` minibatches per epoch, :math:`\hat L_S = M\,\big(\mathrm{KL}/M -
\sum_{i\in S} \mathbb E_q\log p(y_i\mid\theta)\big)`: :math:`M` times the per-minibatch cost of
Blundell et al. (eq. 8) with the KL weighted :math:`1/M`. Summed over the :math:`M` minibatches of
an epoch, or averaged over a random minibatch, it equals the full-data negative ELBO
:math:`\mathrm{KL} - \sum_{i=1}^N \mathbb E_q\log p(y_i\mid\theta)`; the tests check this
unbiasedness. The constant factor :math:`M` only rescales the learning rate of Adam-like
optimisers (which are invariant to it).

Gradient estimators
-------------------
The expectation is estimated with one weight draw per minibatch (``num_particles`` draws if
asked). For a :class:`~pyro_sgmcmc.nn.BayesianMLP` with the default guide the loss is computed in
plain torch by :func:`~pyro_sgmcmc.variational.flipout.mean_field_negative_elbo` (the same estimator
as Pyro's ``TraceMeanField_ELBO``, 3.5 times faster for the demo's 1-10-10-1 network); any other
model or guide goes through Pyro's ELBO on the conditioned model.
``estimator="local_reparameterization"`` (Kingma, Salimans & Welling 2015) or ``"flipout"`` (Wen et
al. 2018) give every example of the minibatch its own perturbation of the pre-activations: same
guide parameters, much lower gradient variance for large minibatches, same expected loss (for
Flipout always, for local reparameterisation exactly for ``Linear`` layers, approximately for
convolutions). They work for a ``BayesianMLP`` (its plain-torch path) and for any ``PyroModule``
whose latent weights and biases are ``PyroSample`` attributes of ``PyroModule[nn.Linear]`` /
``[nn.Conv1d]`` / ``[nn.Conv2d]`` / ``[nn.Conv3d]`` layers, e.g. :class:`~pyro_sgmcmc.nn.LeNet5`:
the model's own ``forward`` runs under an effect handler that replaces each such layer's output by a
per-example draw (:func:`~pyro_sgmcmc.variational.flipout.module_negative_elbo`); its other latent
sites are drawn by plain reparameterisation (:mod:`pyro_sgmcmc.variational.flipout`).

Starting point
--------------
Pyro's ``init_to_feasible`` puts every real-valued location at 0. In a network all hidden units
are then exchangeable: their location gradients are equal in expectation and only the guide's
noise tells them apart, so the fit stays near the symmetric, data-ignoring solution. The default
:func:`init_to_fan_in` draws each weight matrix's locations uniformly with variance :math:`1/d`
(:math:`d` its last dimension, the fan-in in torch's ``(out, in)`` layout), and
``init_scale = 0.01`` starts the guide nearly deterministic, so that the likelihood shapes the
network before the KL term widens it.

A learnable prior (empirical Bayes)
-----------------------------------
``prior="learnable_scale_mixture"`` (or a :class:`LearnableScaleMixturePrior`) replaces the prior
of the weight sites by the scale mixture of Blundell et al.,
:math:`p_\psi(w) = \pi\,\mathcal N(w\mid 0,\sigma_1^2) + (1-\pi)\,\mathcal N(w\mid 0,\sigma_2^2)`,
whose :math:`\psi = (\pi, \sigma_1, \sigma_2)`, shared by all those sites, are maximised jointly
with the guide: :math:`\max_{q,\psi} \mathrm{ELBO}(q, \psi)`, a type-II maximum-likelihood
(empirical Bayes) estimate of the prior inside the bound. The KL term of those sites is estimated
by Monte Carlo (no closed form exists for a mixture).

Divergence
----------
A step whose loss or gradient is not finite, or whose guide leaves the support of a distribution
(Pyro's validation error, e.g. a softplus scale that underflowed to 0), stops the fit with
:class:`SVIDivergedError`, which names the fit and the step and keeps the losses computed so far.

References
----------
C. Blundell, J. Cornebise, K. Kavukcuoglu and D. Wierstra, "Weight uncertainty in neural networks",
ICML 2015.

D. P. Kingma and M. Welling, "Auto-encoding variational Bayes", ICLR 2014.

Y. LeCun, L. Bottou, G. B. Orr and K.-R. Müller, "Efficient BackProp", in *Neural Networks: Tricks
of the Trade*, Springer, 1998 (the initial weight variance :math:`1/d`).

B. L. Trippe and R. E. Turner, "Overpruning in variational Bayesian neural networks", NeurIPS 2017
workshop on advances in approximate Bayesian inference (why mean-field fits of small data sets
prefer to explain the data as noise).

Where the code lives
--------------------
This module is the public entry: :func:`fit_svi` is defined here and the other names are
re-exported from modules of one job each: :mod:`pyro_sgmcmc.variational.svi_checks` (validating the
arguments), :mod:`pyro_sgmcmc.variational.svi_fit` (the optimisation loop of each fit),
:mod:`pyro_sgmcmc.variational.svi_loss` (the loss of one minibatch),
:mod:`pyro_sgmcmc.variational.svi_result` (:class:`SVIResult`, :func:`full_data_negative_elbo`),
:mod:`pyro_sgmcmc.variational.svi_prior` (the learnable scale-mixture prior) and
:mod:`pyro_sgmcmc.variational.svi_store` (Pyro's parameter store around a fit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import SVIDivergedError
from ..models.initialization import init_to_fan_in
from ..models.structure import MissingPlateError
from .svi_checks import FitPlan, OptimizerFactory, SchedulerFactory, check_plan
from .svi_fit import run_fits
from .svi_loss import minibatch_elbo_loss
from .svi_prior import LearnableScaleMixturePrior
from .svi_prior import ScaleMixtureParameters as ScaleMixtureParameters
from .svi_prior import _SubstitutePrior as _SubstitutePrior
from .svi_result import SVIResult, full_data_negative_elbo
from .svi_result import TensorDict as TensorDict
from .svi_store import global_param_mode

__all__ = [
    "LearnableScaleMixturePrior",
    "SVIDivergedError",
    "SVIResult",
    "fit_svi",
    "full_data_negative_elbo",
    "minibatch_elbo_loss",
]

#: The default start of the guide's locations: weight matrices with variance :math:`1/d`, every
#: other site where ``init_to_feasible`` puts it (0 in unconstrained space: biases at 0, a
#: positive scale or precision at 1); see :func:`~pyro_sgmcmc.models.initialization.init_to_fan_in`.
default_init_loc = init_to_fan_in()


@global_param_mode
def fit_svi(
    model: Callable[..., Any],
    *args: Any,
    num_steps: int = 1000,
    batch_size: int | None = None,
    learning_rate: float = 1e-2,
    optimizer: OptimizerFactory | None = None,
    lr_scheduler: SchedulerFactory | None = None,
    num_particles: int = 1,
    analytic_kl: bool = True,
    estimator: str = "reparameterization",
    prior: str | LearnableScaleMixturePrior | None = None,
    init_scale: float = 0.01,
    init_loc_fn: Callable = default_init_loc,
    guide_factory: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    num_fits: int = 1,
    seed: int | None = 0,
    plate_name: str = "data",
    progress_bar: bool = True,
    callback: Callable[[int, int, Callable[..., Any], float], None] | None = None,
    num_threads: int | None = None,
    **kwargs: Any,
) -> SVIResult:
    r"""Fit a mean-field Gaussian guide (Bayes by Backprop) on data-plate minibatches.

    Parameters
    ----------
    model:
        A Pyro model following the data-plate contract.
    *args, **kwargs:
        The model's arguments (full data). NumPy arrays and lists of numbers are converted to
        torch tensors (:func:`as_tensor_arguments`); a keyword that is neither an option below
        nor a parameter of the model is refused with a ``TypeError``.
    num_steps:
        Optimisation steps per fit, an integer >= 1.
    batch_size:
        Minibatch size ``B`` in ``[1, N]``; ``None`` uses all ``N`` rows.
    learning_rate:
        Learning rate of the default optimiser (``torch.optim.Adam``), > 0.
    optimizer:
        ``params -> torch.optim.Optimizer``, replacing the default Adam.
    lr_scheduler:
        ``optimizer -> scheduler`` with a ``step()`` method called after every optimisation step,
        e.g. ``lambda opt: torch.optim.lr_scheduler.ExponentialLR(opt, 0.999)``.
    num_particles:
        Monte Carlo samples of the guide per ELBO estimate, an integer >= 1.
    analytic_kl:
        Use closed-form KL terms where available (see :func:`minibatch_elbo_loss`).
    estimator:
        How the expected log-likelihood of a minibatch is estimated, one of
        :data:`pyro_sgmcmc.variational.flipout.ESTIMATORS`: ``"reparameterization"`` (one weight
        draw per minibatch, any model and guide), ``"local_reparameterization"`` (Kingma et al.
        2015) or ``"flipout"`` (Wen et al. 2018). The last two sample per-example pre-activations
        instead of one weight draw per minibatch, which lowers the variance of the gradient. They
        need the default ``AutoNormal`` guide, whose parameters (loc and softplus scale per weight)
        they train, so the result is used exactly as with plain reparameterisation, and either a
        :class:`~pyro_sgmcmc.nn.BayesianMLP` or a ``PyroModule`` whose latent weights and biases are
        ``PyroSample`` attributes of ``PyroModule[nn.Linear]`` or ``[nn.Conv1d/2d/3d]`` layers used
        through their ``forward`` (e.g. :class:`~pyro_sgmcmc.nn.LeNet5`; its other latent sites are
        drawn by plain reparameterisation). Same expected loss as plain reparameterisation (local
        reparameterisation of a convolution: approximately); see
        :mod:`pyro_sgmcmc.variational.flipout`.
    prior:
        ``None`` keeps the model's prior; ``"learnable_scale_mixture"`` or a
        :class:`LearnableScaleMixturePrior` puts a scale-mixture prior whose parameters are
        fitted with the guide on the weight sites (module docstring); the fitted values are in
        :meth:`SVIResult.prior_values`.
    init_scale:
        Initial :math:`\sigma` of every coordinate, > 0. The default 0.01 starts the guide nearly
        deterministic (Pyro's ``AutoNormal`` uses 0.1).
    init_loc_fn:
        Initial :math:`\mu`, a Pyro init strategy; the default :func:`init_to_fan_in` draws weight
        matrices at random (an all-zero start keeps the hidden units of a network identical).
    guide_factory:
        ``model -> guide`` replacing ``AutoNormal(model, init_loc_fn=..., init_scale=...)``.
    num_fits:
        Independent fits (different seeds), exported as chains; an integer >= 1.
    seed:
        Seed of the first fit (fit ``k`` uses a seed spawned from it); ``None`` draws one.
    plate_name:
        Name of the data plate.
    progress_bar:
        Show a tqdm progress bar with the running loss.
    callback:
        Called after every optimisation step as ``callback(fit, step, guide, loss)`` (fit and
        step counted from 0), e.g. to evaluate the guide once per epoch; it runs inside the
        fit's parameter scope, and its time counts in the fit's wall time.
    num_threads:
        torch's intra-op threads during the fits (restored afterwards); ``None`` leaves torch's
        setting. A small network gains nothing from several threads, and on a machine whose
        cores are busy they wait for each other: a fit of the toy sinusoid took 85 s with 2
        threads and 9 s with 1 on a loaded 2-core machine (same result).

    Returns
    -------
    SVIResult
        Guides, loss history (``losses``), wall times and ``sample_posterior(num_draws)``.

    Raises
    ------
    SVIDivergedError
        When a step's loss or gradient is not finite or the guide leaves a distribution's support
        (learning rate too large); it names the step and keeps the losses so far.
    TypeError
        For a keyword argument that is neither an option nor a model parameter (e.g. a misspelt
        ``num_step``), or arguments of the wrong type; for ``estimator="flipout"`` or
        ``"local_reparameterization"``, a model that is neither a ``BayesianMLP`` nor a
        ``PyroModule``.
    ValueError
        For option values out of range, or data with NaN, infinite or no values; for the
        per-example estimators, a model without latent Linear/Conv weights or whose layers they
        cannot handle (named; see :class:`~pyro_sgmcmc.variational.flipout.LayerNoise`).

    Notes
    -----
    The loss of one step is the minibatch estimate :math:`\hat L_S` of the module docstring; its
    expectation over minibatches is the full-data negative ELBO (KL weighted :math:`1/M` per
    minibatch, up to the overall factor :math:`M = N/B`). Randomness comes from a per-fit seed:
    the minibatches from a ``torch.Generator``, the reparameterisation noise and the initial
    locations from torch's generator inside ``torch.random.fork_rng`` (the global state is
    restored afterwards).

    Mean-field VI of a small network on few data can have its ELBO optimum at a solution that
    explains the data as observation noise (over-pruning, Trippe & Turner 2017): with a learnt
    noise level that is what the bound prefers, not an optimisation failure; see the SVI page of
    the documentation for measurements and remedies.
    """
    plan = FitPlan(
        model=model,
        args=args,
        kwargs=kwargs,
        num_steps=num_steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        num_particles=num_particles,
        analytic_kl=analytic_kl,
        estimator=estimator,
        prior=prior,
        init_scale=init_scale,
        init_loc_fn=init_loc_fn,
        guide_factory=guide_factory,
        num_fits=num_fits,
        seed=seed,
        plate_name=plate_name,
        progress_bar=progress_bar,
        callback=callback,
        num_threads=num_threads,
    )
    try:
        return run_fits(check_plan(plan))
    except MissingPlateError as error:  # worded for this function's argument
        raise error.naming("plate_name") from None
