r"""The variational baseline: a mean-field Gaussian guide fitted on data-plate minibatches.

The guide is Pyro's :class:`~pyro.infer.autoguide.AutoNormal`: independent Gaussians
:math:`q(z_j) = \mathcal N(\mu_j, \sigma_j^2)` on every latent coordinate in unconstrained space,
with :math:`\sigma_j = \operatorname{softplus}(\rho_j) = \log(1 + e^{\rho_j})`, the
parameterisation of Bayes by Backprop (Blundell et al., 2015). The gradient of the ELBO comes from
the reparameterisation :math:`z = \mu + \sigma \odot \epsilon`, :math:`\epsilon\sim\mathcal N(0,I)`.

Minibatches and the KL weight
-----------------------------
Each step draws a minibatch :math:`S` of :math:`B` rows out of :math:`N` (epochs without
replacement, :class:`~pyro_sgmcmc.kernels.minibatch.EpochBatches`) and conditions the data plate's
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
By default the expectation is estimated with one weight draw per minibatch through Pyro's ELBO
(any model, any guide). For a :class:`~pyro_sgmcmc.nn.BayesianMLP`, ``estimator=
"local_reparameterization"`` (Kingma, Salimans & Welling 2015) or ``"flipout"`` (Wen et al.
2018) gives every example of the minibatch its own perturbation of the pre-activations: same
expected loss, same guide parameters, much lower gradient variance for large minibatches
(:mod:`pyro_sgmcmc.flipout`).

References
----------
C. Blundell, J. Cornebise, K. Kavukcuoglu and D. Wierstra, "Weight uncertainty in neural networks",
ICML 2015.

D. P. Kingma and M. Welling, "Auto-encoding variational Bayes", ICLR 2014.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.infer.autoguide.initialization import init_to_feasible
from torch.distributions import biject_to
from tqdm.auto import tqdm

from ._validation import check_positive, check_positive_int
from .flipout import check_estimator, guide_negative_elbo
from .kernels.minibatch import EpochBatches
from .model_structure import check_finite_data, inspect_model, resolve_batch_size
from .nn.mlp import BayesianMLP

__all__ = ["SVIResult", "fit_svi", "full_data_negative_elbo", "minibatch_elbo_loss"]

TensorDict = dict[str, torch.Tensor]
OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]
_P = ParamSpec("_P")
_T = TypeVar("_T")


def global_param_mode(fn: Callable[_P, _T]) -> Callable[_P, _T]:
    """Run ``fn`` with ``pyro.settings`` ``module_local_params=False``: any PyroModule works.

    Pyro's ``PyroModule`` keeps a ``_Context`` that creates its private ``param_state`` only if
    ``module_local_params`` is on *when the module is built*, but reads the setting again every
    time the module is *called* (``_Context.__enter__``). A model built with the setting off
    and called with it on (set globally by the user, or by a caller's
    ``pyro.settings.context``) fails with ``AttributeError: '_Context' object has no attribute
    'param_state'``. With the setting off at call time a module works however it was built
    (the context never touches ``param_state`` then), and the per-fit store scope of
    :func:`_param_scope` already gives the isolation that module-local parameters would.
    """

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with pyro.settings.context(module_local_params=False):
            return fn(*args, **kwargs)

    return wrapper


def _param_scope(state: dict | None = None) -> Any:
    """A private parameter store for one fit (``ParamStoreDict.scope``).

    Independent fits of the same model create guides whose parameters have the same names; in
    Pyro's global parameter mode (see :func:`global_param_mode`) a ``PyroModule`` guide reads
    its parameters from the global store by name, so each fit keeps its own store state and
    every call of its guide runs inside it. The user's global store is restored on exit.
    """
    return pyro.get_param_store().scope(state)


@dataclass
class SVIResult:
    """Independent SVI fits of one model (each fit is exported as one chain).

    Attributes
    ----------
    model:
        The model.
    guides:
        One fitted guide per fit.
    param_states:
        The private parameter-store state of each fit; call guide ``k`` inside
        ``pyro.get_param_store().scope(param_states[k])``.
    losses:
        ``(num_fits, num_steps)`` array: the loss (negative ELBO estimate) of every step.
    wall_times:
        Seconds each fit took.
    seeds:
        The seed of each fit.
    args, kwargs:
        The model's training arguments.
    plate_name, batch_size, num_data:
        The data plate, the minibatch size ``B`` and ``N``.
    estimator:
        The gradient estimator of the fits (:data:`pyro_sgmcmc.flipout.ESTIMATORS`).
    """

    model: Callable[..., Any]
    guides: list[Callable[..., Any]]
    losses: np.ndarray
    wall_times: list[float]
    seeds: list[int]
    args: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)
    param_states: list[dict] | None = None
    plate_name: str = "data"
    batch_size: int = 1
    num_data: int = 1
    estimator: str = "reparameterization"

    @property
    def guide(self) -> Callable[..., Any]:
        """The guide of the first fit."""
        return self.guides[0]

    @property
    def loss_history(self) -> np.ndarray:
        """The loss per step of the first fit."""
        return self.losses[0]

    @property
    def wall_time(self) -> float:
        """Total seconds of all fits."""
        return float(sum(self.wall_times))

    @property
    def num_fits(self) -> int:
        return len(self.guides)

    def loc_and_scale(self, fit: int = 0) -> tuple[TensorDict, TensorDict]:
        """Variational means :math:`\\mu` and scales :math:`\\sigma` (unconstrained space)."""
        guide = self.guides[fit]
        if not isinstance(guide, AutoNormal):
            raise TypeError("loc_and_scale needs an AutoNormal guide")
        locs, scales = {}, {}
        for name, _ in guide.prototype_trace.iter_stochastic_nodes():
            locs[name] = guide._get_loc_and_scale(name)[0].detach()
            scales[name] = guide._get_loc_and_scale(name)[1].detach()
        return locs, scales

    @global_param_mode
    def sample_posterior(self, num_draws: int, seed: int | None = None) -> TensorDict:
        """Draw from every fitted guide: constrained values shaped ``(num_fits, num_draws, ...)``.

        For an :class:`~pyro.infer.autoguide.AutoNormal` guide the draws are
        :math:`\\theta = T^{-1}(\\mu + \\sigma\\odot\\epsilon)` computed in one vectorised step
        (:math:`T` = ``biject_to(support)``); other guides are run once per draw.
        """
        num_draws = check_positive_int("num_draws", num_draws)
        generator = torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        per_fit = []
        for k, guide in enumerate(self.guides):
            if isinstance(guide, AutoNormal):
                locs, scales = self.loc_and_scale(k)
                draws = {}
                for name, site in guide.prototype_trace.iter_stochastic_nodes():
                    shape = (num_draws, *locs[name].shape)
                    eps = torch.randn(shape, generator=generator, dtype=locs[name].dtype)
                    z = locs[name] + scales[name] * eps
                    draws[name] = biject_to(site["fn"].support)(z)
            else:
                draws_list = []
                state = None if self.param_states is None else self.param_states[k]
                with _param_scope(state), torch.random.fork_rng(devices=[]), torch.no_grad():
                    torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
                    for _ in range(num_draws):
                        trace = poutine.trace(guide).get_trace(*self.args, **self.kwargs)
                        draws_list.append(
                            {
                                n: s["value"].detach()
                                for n, s in trace.nodes.items()
                                if s["type"] == "sample"
                                and not s["is_observed"]
                                and not s["infer"].get("is_auxiliary", False)
                            }
                        )
                draws = {n: torch.stack([d[n] for d in draws_list]) for n in draws_list[0]}
            per_fit.append(draws)
        return {name: torch.stack([d[name] for d in per_fit]) for name in per_fit[0]}


def minibatch_elbo_loss(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    subsample: torch.Tensor | None,
    *args: Any,
    plate_name: str = "data",
    num_particles: int = 1,
    analytic_kl: bool = True,
    **kwargs: Any,
) -> torch.Tensor:
    r"""Differentiable :math:`\hat L_S` (module docstring) on the minibatch ``subsample``.

    ``subsample=None`` gives the full-data negative ELBO estimate. With ``analytic_kl`` the
    estimator is Pyro's ``TraceMeanField_ELBO``: :math:`\mathrm{KL}(q_j\,\|\,p_j)` in closed form
    for every site where torch registers it (e.g. Normal guide and Normal prior), the Monte Carlo
    term :math:`\log q - \log p` elsewhere (e.g. the scale-mixture prior); otherwise
    ``Trace_ELBO`` (Monte Carlo everywhere). Both are unbiased for the same loss.
    """
    conditioned = model if subsample is None else poutine.condition(model, {plate_name: subsample})
    elbo_class = TraceMeanField_ELBO if analytic_kl else Trace_ELBO
    elbo = elbo_class(num_particles=num_particles)
    return elbo.differentiable_loss(conditioned, guide, *args, **kwargs)


def _step_loss(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    *,
    plate_name: str,
    estimator: str,
    num_particles: int,
    analytic_kl: bool,
) -> Callable[[torch.Tensor | None], torch.Tensor]:
    """``subsample -> loss`` of one optimisation step: Pyro's ELBO or the BayesianMLP estimators.

    Plain reparameterisation goes through :func:`minibatch_elbo_loss` (any model and guide); the
    per-example estimators through :func:`~pyro_sgmcmc.flipout.guide_negative_elbo`.
    """
    if estimator == "reparameterization":

        def pyro_loss(subsample: torch.Tensor | None) -> torch.Tensor:
            return minibatch_elbo_loss(
                model,
                guide,
                subsample,
                *args,
                plate_name=plate_name,
                num_particles=num_particles,
                analytic_kl=analytic_kl,
                **kwargs,
            )

        return pyro_loss
    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    x, y = bound.arguments["x"], bound.arguments.get("y")
    if y is None:
        raise ValueError(f"estimator={estimator!r} needs the targets y among the model arguments")
    return functools.partial(
        guide_negative_elbo,
        model,
        guide,
        x,
        y,
        estimator=estimator,
        num_particles=num_particles,
        analytic_kl=analytic_kl,
    )


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
    init_scale: float = 0.1,
    init_loc_fn: Callable = init_to_feasible,
    guide_factory: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    num_fits: int = 1,
    seed: int | None = 0,
    plate_name: str = "data",
    progress_bar: bool = True,
    callback: Callable[[int, int, Callable[..., Any], float], None] | None = None,
    **kwargs: Any,
) -> SVIResult:
    r"""Fit a mean-field Gaussian guide (Bayes by Backprop) on data-plate minibatches.

    Parameters
    ----------
    model:
        A Pyro model following the data-plate contract.
    *args, **kwargs:
        The model's arguments (full data).
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
        :data:`pyro_sgmcmc.flipout.ESTIMATORS`: ``"reparameterization"`` (Pyro's ELBO on the
        conditioned model, any model and guide), ``"local_reparameterization"`` (Kingma et al.
        2015) or ``"flipout"`` (Wen et al. 2018). The last two sample per-example
        pre-activations instead of one weight draw per minibatch, which lowers the variance of
        the gradient; they need a :class:`~pyro_sgmcmc.nn.BayesianMLP` and the default
        ``AutoNormal`` guide, whose parameters (loc and softplus scale per weight) they train, so
        the result is used exactly as with plain reparameterisation. Same expected loss for
        all three; see :mod:`pyro_sgmcmc.flipout`.
    init_scale:
        Initial :math:`\sigma` of every coordinate, > 0 (AutoNormal's default 0.1).
    init_loc_fn:
        Initial :math:`\mu`, a Pyro init strategy.
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

    Returns
    -------
    SVIResult
        Guides, loss history (``losses``), wall times and ``sample_posterior(num_draws)``.

    Notes
    -----
    The loss of one step is the minibatch estimate :math:`\hat L_S` of the module docstring; its
    expectation over minibatches is the full-data negative ELBO (KL weighted :math:`1/M` per
    minibatch, up to the overall factor :math:`M = N/B`). Randomness comes from a per-fit seed:
    the minibatches from a ``torch.Generator``, the reparameterisation noise from torch's
    generator inside ``torch.random.fork_rng`` (the global state is restored afterwards).
    """
    if not callable(model):
        raise TypeError(f"model must be a callable Pyro model, got {type(model).__name__}")
    num_steps = check_positive_int("num_steps", num_steps)
    learning_rate = check_positive("learning_rate", learning_rate)
    num_particles = check_positive_int("num_particles", num_particles)
    estimator = check_estimator(estimator)
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {callback!r}")
    if estimator != "reparameterization":
        if not isinstance(model, BayesianMLP):
            raise TypeError(
                f"estimator={estimator!r} needs model to be a pyro_sgmcmc.nn.BayesianMLP, got "
                f"{type(model).__name__}; use estimator='reparameterization' for other models"
            )
        if guide_factory is not None:
            raise ValueError(
                f"guide_factory must be None with estimator={estimator!r}: the estimator "
                "trains the parameters of the default AutoNormal guide"
            )
        if plate_name != "data":
            raise ValueError(f"plate_name must be 'data' for a BayesianMLP, got {plate_name!r}")
    init_scale = check_positive("init_scale", init_scale)
    num_fits = check_positive_int("num_fits", num_fits)
    if seed is not None:
        seed = check_positive_int("seed", seed, minimum=0)
    else:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    check_finite_data(args, kwargs)
    structure = inspect_model(model, args, kwargs, plate_name)
    num_data = structure.num_data
    if batch_size is not None:
        batch_size = check_positive_int("batch_size", batch_size)
    batch_size = resolve_batch_size(batch_size, num_data, plate_name)

    fit_seeds = [
        int(s.generate_state(1, np.uint64)[0] % 2**62)
        for s in np.random.SeedSequence(seed).spawn(num_fits)
    ]
    guides, losses, wall_times, states = [], [], [], []
    for k, fit_seed in enumerate(fit_seeds):
        start = time.perf_counter()
        with torch.random.fork_rng(devices=[]), _param_scope() as state:
            torch.manual_seed(fit_seed)
            if guide_factory is None:
                guide = AutoNormal(model, init_loc_fn=init_loc_fn, init_scale=float(init_scale))
            else:
                guide = guide_factory(model)
            guide(*args, **kwargs)  # builds the guide's parameters
            step_loss = _step_loss(
                model,
                guide,
                args,
                kwargs,
                plate_name=plate_name,
                estimator=estimator,
                num_particles=num_particles,
                analytic_kl=analytic_kl,
            )
            params = [p for p in guide.parameters() if p.requires_grad]
            if not params:
                raise ValueError("the guide has no trainable parameters")
            opt = (
                torch.optim.Adam(params, lr=learning_rate)
                if optimizer is None
                else optimizer(params)
            )
            scheduler = None if lr_scheduler is None else lr_scheduler(opt)
            batches = EpochBatches(num_data, batch_size, torch.Generator().manual_seed(fit_seed))
            history = np.empty(num_steps)
            bar = tqdm(
                range(num_steps),
                desc=f"SVI fit {k}" if num_fits > 1 else "SVI",
                disable=not progress_bar,
                leave=False,
            )
            for step in bar:
                opt.zero_grad()
                loss = step_loss(batches.next())
                loss.backward()
                opt.step()
                if scheduler is not None:
                    scheduler.step()
                history[step] = float(loss.detach())
                if callback is not None:
                    callback(k, step, guide, history[step])
                if progress_bar and step % 50 == 0:
                    bar.set_postfix(loss=f"{history[step]:.4g}")
            bar.close()
        wall_times.append(time.perf_counter() - start)
        guides.append(guide)
        losses.append(history)
        states.append(state)
    return SVIResult(
        model=model,
        guides=guides,
        losses=np.stack(losses),
        wall_times=wall_times,
        seeds=fit_seeds,
        args=tuple(args),
        kwargs=dict(kwargs),
        plate_name=plate_name,
        batch_size=batch_size,
        num_data=num_data,
        param_states=states,
        estimator=estimator,
    )


@global_param_mode
def full_data_negative_elbo(result: SVIResult, fit: int = 0, num_particles: int = 100) -> float:
    """Full-data negative ELBO estimate of one fit (``num_particles`` guide samples)."""
    num_particles = check_positive_int("num_particles", num_particles)
    state = None if result.param_states is None else result.param_states[fit]
    with torch.no_grad(), _param_scope(state):
        loss = minibatch_elbo_loss(
            result.model,
            result.guides[fit],
            None,
            *result.args,
            plate_name=result.plate_name,
            num_particles=num_particles,
            **result.kwargs,
        )
    return float(loss)
