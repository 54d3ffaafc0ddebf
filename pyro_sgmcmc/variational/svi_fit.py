"""The optimisation loop of :func:`~pyro_sgmcmc.variational.svi.fit_svi`: one fit after another,
step by step.

:func:`run_fits` runs the independent fits of a checked
:class:`~pyro_sgmcmc.variational.svi_checks.FitPlan`, each under its own seed
(``torch.random.fork_rng``) and parameter store (:mod:`pyro_sgmcmc.variational.svi_store`), and
collects them into an :class:`~pyro_sgmcmc.variational.svi_result.SVIResult`. One fit builds its
guide and the loss of one step (:func:`~pyro_sgmcmc.variational.svi_loss._step_loss`), then takes
its optimisation steps on minibatches, stopping with :class:`~pyro_sgmcmc.errors.SVIDivergedError`
at a step whose loss or gradient is not finite or whose guide leaves a distribution's support.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyro
import torch
from pyro.infer.autoguide import AutoNormal
from tqdm.auto import tqdm

from ..engine.minibatch import Minibatcher
from ..engine.seeds import chain_generators, chain_seeds
from ..errors import SVIDivergedError
from .svi_checks import FitPlan
from .svi_loss import _step_loss
from .svi_prior import ScaleMixtureParameters
from .svi_result import SVIResult
from .svi_store import _param_scope

__all__ = ["run_fits"]

#: What :func:`_divergence` needs besides the fit, step and reason: the fit's loss history, the
#: histories of the fits completed before it and the default optimiser's learning rate (or None).
_Context = tuple[np.ndarray, list[np.ndarray], float | None]
TensorDict = dict[str, torch.Tensor]


def run_fits(plan: FitPlan) -> SVIResult:
    """Run the ``plan.num_fits`` independent fits of a checked ``plan``.

    Fit ``k`` uses the ``k``-th seed spawned from ``plan.seed`` for torch's generator (inside
    ``torch.random.fork_rng``, so the global state is restored) and for its minibatches, and keeps
    its guide's parameters in a store of its own.
    """
    fit_seeds = chain_seeds(plan.seed, range(plan.num_fits))
    guides, losses, wall_times, states, priors, held = [], [], [], [], [], []
    with _intra_op_threads(plan.num_threads):
        for k, fit_seed in enumerate(fit_seeds):
            start = time.perf_counter()
            with torch.random.fork_rng(devices=[]), _param_scope() as state:
                torch.manual_seed(fit_seed)
                guide, history, prior_parameters, fitted = _one_fit(plan, k, fit_seed, losses)
            wall_times.append(time.perf_counter() - start)
            held.append(fitted)
            guides.append(guide)
            losses.append(history)
            states.append(state)
            priors.append(prior_parameters)
    return SVIResult(
        model=plan.model,
        guides=guides,
        losses=np.stack(losses),
        wall_times=wall_times,
        seeds=fit_seeds,
        args=tuple(plan.args),
        kwargs=dict(plan.kwargs),
        plate_name=plan.plate_name,
        plate=plan.plate,
        batch_size=plan.batch_size,
        num_data=plan.num_data,
        param_states=states,
        estimator=plan.estimator,
        prior_parameters=None if plan.learnable is None else priors,
        prior_sites=plan.prior_sites,
        model_params=held if any(held) else None,
    )


def _one_fit(
    plan: FitPlan, k: int, fit_seed: int, completed: list[np.ndarray]
) -> tuple[Callable[..., Any], np.ndarray, ScaleMixtureParameters | None, TensorDict]:
    """Fit ``k`` (seeded, in its parameter scope): its guide, loss history, learnable prior and
    the fitted values of the model's own parameters.

    ``completed`` holds the loss histories of the fits before it (kept by a divergence error).
    """
    if plan.guide_factory is None:
        guide = AutoNormal(
            plan.model, init_loc_fn=plan.init_loc_fn, init_scale=float(plan.init_scale)
        )
    else:
        guide = plan.guide_factory(plan.model)
    guide(*plan.args, **plan.kwargs)  # builds the guide's parameters
    prior_parameters = None if plan.learnable is None else plan.learnable.new_parameters()
    step_loss = _step_loss(
        plan.model,
        guide,
        plan.args,
        plan.kwargs,
        plate=plan.plate,
        estimator=plan.estimator,
        num_particles=plan.num_particles,
        analytic_kl=plan.analytic_kl,
        fast=plan.fast,
        prior=prior_parameters,
        prior_sites=plan.prior_sites,
        layers=plan.layers,
    )
    params = [p for p in guide.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the guide has no trainable parameters")
    if prior_parameters is not None:
        params += list(prior_parameters.parameters())
    own = _unconstrained(plan, params)
    # a PyroModule's PyroParam is the module's own tensor, whatever the store: each fit starts
    # from its initial value and leaves it there, so that the fits are independent and the
    # user's module unchanged (as the store, restored by the fit's scope)
    starts = [tensor.detach().clone() for tensor in own]
    try:
        history = _optimise(plan, k, fit_seed, guide, step_loss, params + own, completed)
        store = pyro.get_param_store()
        fitted = {name: store.get_param(name).detach().clone() for name in plan.params}
    finally:
        with torch.no_grad():
            for tensor, start in zip(own, starts, strict=True):
                tensor.copy_(start)
    return guide, history, prior_parameters, fitted


def _unconstrained(plan: FitPlan, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """The unconstrained tensors of the model's own parameters (``pyro.param``, ``PyroParam``)
    in the fit's store that require gradients and are not already among ``params``: the fit
    optimises them with the guide's, as Pyro's ``SVI`` does. Those the guide's first call did
    not create (a guide that does not run the model) are created at their values in the
    model's structure."""
    store = pyro.get_param_store()
    for name, (value, constraint) in plan.params.items():
        store.setdefault(name, value.clone(), constraint)
    known = {id(p) for p in params}
    found = [store.get_param(name).unconstrained() for name in plan.params]
    return [p for p in found if p.requires_grad and id(p) not in known]


def _optimise(
    plan: FitPlan,
    k: int,
    fit_seed: int,
    guide: Callable[..., Any],
    step_loss: Callable[[torch.Tensor | None], torch.Tensor],
    params: list[torch.nn.Parameter],
    completed: list[np.ndarray],
) -> np.ndarray:
    """The ``plan.num_steps`` optimisation steps of fit ``k`` on ``params``; the loss history."""
    opt = (
        torch.optim.Adam(params, lr=plan.learning_rate, foreach=True)
        if plan.optimizer is None
        else plan.optimizer(params)
    )
    scheduler = None if plan.lr_scheduler is None else plan.lr_scheduler(opt)
    batches = Minibatcher(plan.num_data, plan.batch_size, chain_generators([fit_seed]))
    history = np.full(plan.num_steps, np.nan)
    context = (history, completed, plan.learning_rate if plan.optimizer is None else None)

    bar = tqdm(
        range(plan.num_steps),
        desc=f"SVI fit {k}" if plan.num_fits > 1 else "SVI",
        disable=not plan.progress_bar,
        leave=False,
    )
    for step in bar:
        opt.zero_grad()
        _loss_and_gradients(step_loss, batches.next(), params, k, step, bar, context)
        opt.step()
        if scheduler is not None:
            scheduler.step()
        if plan.callback is not None:
            plan.callback(k, step, guide, history[step])
        if plan.progress_bar and step % 50 == 0:
            bar.set_postfix(loss=f"{history[step]:.4g}")
    bar.close()
    return history


def _loss_and_gradients(
    step_loss: Callable[[torch.Tensor | None], torch.Tensor],
    rows: torch.Tensor | None,
    params: list[torch.nn.Parameter],
    k: int,
    step: int,
    bar: Any,
    context: _Context,
) -> None:
    """The loss of step ``step`` of fit ``k`` on the minibatch ``rows`` (``(1, B)``), recorded in
    the history (``context[0]``), and its gradients; a non-finite loss or gradient, or a guide
    that left a distribution's support after the first step, raises :class:`SVIDivergedError`."""
    history = context[0]
    try:
        loss = step_loss(None if rows is None else rows[0])
    except ValueError as error:
        violation = _support_violation(error) if step > 0 else None
        if violation is not None:
            bar.close()
            reason = f"the guide left a distribution's support: {violation}"
            raise _divergence(k, step, reason, *context) from error
        raise
    history[step] = float(loss.detach())
    if not math.isfinite(history[step]):
        bar.close()
        raise _divergence(k, step, f"the loss is {history[step]}", *context)
    loss.backward()
    if not _gradients_finite(params):
        bar.close()
        reason = "a gradient of the guide is not finite"
        raise _divergence(k, step, reason, *context)


def _support_violation(error: ValueError) -> str | None:
    """A one-line account of torch's distribution validation error ``error``, or ``None`` if it
    is another error (torch's message ends with a dump of the offending tensor)."""
    message = str(error)
    if not message.startswith(("Expected parameter", "Expected value")):
        return None
    match = re.match(
        r"Expected (parameter \w+|value argument)\b.*?of distribution (\w+).*?"
        r"to satisfy the constraint ([^\n]*?)(?:, but found invalid values.*)?$",
        message,
        flags=re.DOTALL,
    )
    if match is None:
        return message.splitlines()[0]
    what, distribution, constraint = match.groups()
    return f"the {what} of a {distribution} does not satisfy {constraint}"


def _gradients_finite(params: list[torch.Tensor]) -> bool:
    grads = [p.grad.reshape(-1) for p in params if p.grad is not None]
    return not grads or bool(torch.isfinite(torch.cat(grads)).all())


@contextlib.contextmanager
def _intra_op_threads(num_threads: int | None) -> Iterator[None]:
    """Run with ``num_threads`` intra-op threads (``None``: unchanged); restore torch's after."""
    threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _divergence(
    fit: int,
    step: int,
    reason: str,
    history: np.ndarray,
    completed: list[np.ndarray],
    learning_rate: float | None,
) -> SVIDivergedError:
    """The error for fit ``fit`` diverging at (0-based) ``step``, with the losses so far."""
    advice = (
        f"learning_rate={learning_rate:g} is probably too large (try {learning_rate / 10:g})"
        if learning_rate is not None
        else "the optimiser's step size is probably too large"
    )
    num_steps = len(history)
    return SVIDivergedError(
        f"SVI diverged at step {step + 1} of {num_steps} (fit {fit}): {reason}; {advice}. The "
        "losses of the steps so far are kept in the exception's `losses` attribute.",
        fit=fit,
        step=step + 1,
        losses=history[: step + 1].copy(),
        completed_losses=np.asarray(completed).reshape(len(completed), num_steps),
    )
