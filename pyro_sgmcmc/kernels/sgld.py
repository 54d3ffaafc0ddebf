"""The SGLD kernel."""

from __future__ import annotations

from ..dynamics.registry import SGLDOptions
from ..dynamics.sgld import DEFAULT_INTEGRATOR
from .base import StochasticGradientKernel


class SGLD(StochasticGradientKernel):
    r"""Stochastic gradient Langevin dynamics as a ``pyro.infer.MCMC`` kernel.

    Every gradient step draws a minibatch of ``batch_size`` rows of the data plate (epoch by
    epoch, without replacement), evaluates the minibatch potential :math:`\tilde U` (likelihood
    scaled by :math:`N/B`) in unconstrained space and applies

    .. math::

        \theta_{t+1} = \theta_t - \epsilon_t \nabla \tilde U(\theta_t)
                       + \sqrt{2 \epsilon_t T}\, \tfrac12 (\xi_{t-1} + \xi_t),
                       \qquad \xi_t \sim \mathcal N(0, I),

    Leimkuhler and Matthews' integrator of the Langevin diffusion (the default): Welling and
    Teh's step with the noise of this step and of the last averaged, at the cost of one
    gradient like theirs (``integrator="euler"`` injects :math:`\xi_t` alone).

    **Stationary distribution**: :math:`\propto \exp(-U(\theta)/T)` as :math:`\epsilon \to 0`;
    ``T = 1`` is the posterior. SG-MCMC makes no Metropolis-Hastings correction, so with a
    finite step size the draws are approximate: bias :math:`O(\epsilon^2)` for Leimkuhler and
    Matthews' step (none for a Gaussian target at any stable step), :math:`O(\epsilon)` for
    Euler's.

    Parameters
    ----------
    model:
        A Pyro model whose observations sit in ``pyro.plate(subsample_plate, N)`` (no
        ``subsample_size``) and are indexed by the plate's indices; see the model contract.
    step_size:
        :math:`\epsilon`, multiplying the gradient of the full-data potential: a positive float,
        a schedule from :mod:`pyro_sgmcmc.inference.schedules`, or a callable of the step counter.
    learning_rate:
        Alternative to ``step_size``, per datum: :math:`\epsilon = \text{learning\_rate} / N`,
        which does not change with the size of the data set. Give exactly one of the two.
    batch_size:
        Minibatch size :math:`B \in [1, N]`; ``None`` uses the full data set.
    subsample_plate:
        Name of the data plate.
    num_steps_per_sample:
        Gradient steps per kept draw (the thinning), ``>= 1``. ``None`` (default): with no
        step size given, each chain's warm-up measures its integrated autocorrelation time and
        keeps one draw per autocorrelation time (at most
        :data:`~pyro_sgmcmc.engine.thinning.MAX_THINNING` steps), so that a kept draw is worth
        about one effective draw, and a warm-up draw is as many steps as make the warm-up at
        least :data:`~pyro_sgmcmc.engine.thinning.MIN_WARMUP_STEPS` gradient steps
        (:mod:`pyro_sgmcmc.engine.thinning`); with a step size given, 1.
    temperature:
        :math:`T > 0`.
    init_strategy:
        A Pyro init strategy. The default,
        :func:`init_to_fan_in(2.0, init_to_uniform)
        <pyro_sgmcmc.models.initialization.init_to_fan_in>`, starts weight tensors uniformly in
        :math:`\pm 2/\sqrt{\text{fan-in}}` and every other site uniformly in :math:`(-2, 2)` in
        unconstrained space (NUTS's default): over-dispersed starts, which R-hat needs, at a
        network's scale.
    seed:
        Seed of the chains' generators: chain ``c`` uses a seed derived from ``(seed, c)``.
        ``None`` draws the seeds from torch's global RNG, so ``pyro.set_rng_seed`` makes the run
        reproducible.
    gibbs_updates:
        Exact conditional updates of some sites (:class:`~pyro_sgmcmc.models.gibbs.GibbsUpdate`);
        ``"auto"`` asks the model (``model.gibbs_updates()``), ``None`` disables them.
    gibbs_every:
        Gradient steps between Gibbs updates; default one epoch (``N // B`` steps).
    potential:
        ``"auto"`` uses the model's closed-form gradient when it has one, else its own
        ``log_joint`` (the fast path), else Pyro's trace; ``"closed_form"``, ``"log_joint"`` or
        ``"trace"`` force one.
    max_consecutive_divergences:
        Non-finite steps in a row after which :class:`~pyro_sgmcmc.SamplerDivergedError` is
        raised. A single non-finite step is a divergence: the last finite position is kept
        and the chain continues.
    transforms:
        Optional constrained-to-unconstrained transforms per site (default: Pyro's
        ``biject_to`` of each site's support).
    batch_sampling:
        ``"epoch"`` (default): each epoch is a fresh permutation cut into batches, so every row is
        used once an epoch; ``"independent"``: every batch is drawn afresh (white gradient noise).
    control_variate:
        Replace the minibatch gradient by the control-variate estimator of SGLD-CV / SGHMC-CV
        (Baker et al. 2019; :class:`~pyro_sgmcmc.engine.estimators.ControlVariateGradient`), for
        tall data: ``True`` finds the centre (a mode of the full-data potential) by L-BFGS from
        chain 0's start at set-up; a mapping gives the centre's constrained value per sampled
        site; ``False`` keeps the plain minibatch gradient. ``"auto"`` (default): with no step
        size given, minibatches and no Gibbs blocks, the warm-up centres each chain at its mean
        position over an adaptation window, measures the gradient noise of both estimators and
        keeps the control variate for the chains where it lets the steps grow at least twice
        (:class:`~pyro_sgmcmc.engine.estimators.AutoControlVariate`); otherwise ``False``.
    centre_iterations:
        Maximum L-BFGS iterations for the centre, ``>= 1``.
    chunk_size:
        Rows per call in full-data passes (the centre's gradient), ``>= 1``.
    data_args:
        For a model whose data plate is sized from the data (``pyro.plate("data",
        x.shape[0])`` with ``obs=y``): the positions (ints) and keyword names (strs) of the
        arguments to slice to each minibatch; default: every tensor argument whose leading size
        is :math:`N`. See the model contract.
    compile:
        Compile the potential's recorded graph with TorchInductor (generated C++ kernels; a
        few seconds per distinct shape of evaluation, the first time in a process up to about
        twenty). A small model's step then costs tens of microseconds instead of about a
        millisecond: worth it for runs of tens of thousands of steps. A model with a
        closed-form gradient (:class:`~pyro_sgmcmc.nn.BayesianMLP`) has it compiled with
        ``torch.compile``; a model that cannot be recorded (:mod:`pyro_sgmcmc.models.graph_capture`)
        stays eager.
    data_parallel:
        Evaluate every minibatch across the ranks of ``torch.distributed``'s process group (one
        chain, many workers; launch with ``torchrun`` and call
        :func:`~pyro_sgmcmc.init_distributed` first): each rank holds the full data, takes its
        share of each minibatch's rows, and one all-reduce per step sums the shares, so every
        rank holds the same chain -- the single-process chain with the same seed and batch, up
        to rounding (:mod:`pyro_sgmcmc.engine.distributed`). ``batch_size`` must be at least the
        number of ranks; rank 0 writes the checkpoints.
    integrator:
        ``"leimkuhler_matthews"`` (default): the update above, whose noise
        :math:`\tfrac12(\xi_{t-1} + \xi_t)` is the average of this step's and the last step's
        draws (Leimkuhler and Matthews 2013), at no extra cost: exact for Gaussian targets at
        any stable step and :math:`O(\epsilon^2)` accurate otherwise, so the adaptive warm-up
        gives it steps ten times larger than Euler's (:func:`~pyro_sgmcmc.dynamics.sgld_step`;
        docs/adaptation.md). ``"euler"``: Welling and Teh's update, noise :math:`\xi_t`.
    keep_draws:
        Keep a reference to every kept draw (default ``True``) so that a
        :class:`~pyro_sgmcmc.SamplerDivergedError` can hand back what was collected before it.
        ``False`` holds no draws: use it with ``pyro.infer.StreamingMCMC`` or
        :class:`~pyro_sgmcmc.inference.checkpoint.ResumableMCMC` (``draw_dtype``) when the draws of
        a large network would not fit in memory twice.

    References
    ----------
    M. Welling and Y. W. Teh, "Bayesian learning via stochastic gradient Langevin dynamics",
    ICML 2011.

    B. Leimkuhler and C. Matthews, "Rational construction of stochastic numerical methods for
    molecular sampling", Applied Mathematics Research eXpress, 2013.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> from pyro_sgmcmc import SGLD
    >>> def model(y):
    ...     mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    ...     with pyro.plate("data", len(y)) as idx:
    ...         pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])
    >>> y = torch.randn(1000) + 3.0
    >>> mcmc = MCMC(SGLD(model, step_size=1e-4, batch_size=100, seed=0),
    ...             num_samples=200, warmup_steps=100, disable_progbar=True)
    >>> mcmc.run(y)
    >>> bool(abs(mcmc.get_samples()["mu"].mean() - y.mean()) < 0.2)
    True
    """

    algorithm = "sgld"

    def __init__(
        self, model, step_size=None, *, integrator: str = DEFAULT_INTEGRATOR, **kwargs
    ) -> None:
        super().__init__(model, step_size, options=SGLDOptions(integrator), **kwargs)
