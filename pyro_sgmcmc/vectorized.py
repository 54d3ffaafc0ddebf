r"""Many SG-MCMC chains in one process: parameters stacked along a leading chain dimension.

``pyro.infer.MCMC`` runs one process per chain, and only when ``num_chains <= cpu_count - 1``;
on a small machine its chains run one after the other, and a small network spends most of each
step in Python and autograd overhead rather than arithmetic. :func:`run_chains` instead stacks the
unconstrained parameters of :math:`C` chains, :math:`z \in \mathbb R^{C \times \dots}`, and
evaluates all of them in one forward and one backward pass:

.. math::

    \nabla_{z_c} \sum_{c'=1}^{C} \tilde U_{c'}(z_{c'}) = \nabla_{z_c} \tilde U_c(z_c),

since chain :math:`c'` does not depend on :math:`z_c`. Each chain has its own minibatch
:math:`S_c` (rows ``subsample[c]``), its own noise :math:`\xi_c` and Gibbs draws (its own
``torch.Generator``, seeded from ``seed`` and the chain index by ``numpy.random.SeedSequence``)
and its own over-dispersed start (the init strategy run under the chain's seed). The update
rules are the pure, element-wise functions of :mod:`pyro_sgmcmc.dynamics`, applied unchanged to
the stacked tensors, and the step-size schedules are those of :mod:`pyro_sgmcmc.schedules`. So
chain :math:`c` is, in distribution, the chain the sequential kernel would have produced; the
tests compare the two on a conjugate Gaussian model.

The model needs the fast path (:class:`~pyro_sgmcmc.potentials.SupportsLogJoint`) *accepting
batched parameters*: ``model.log_joint(params, subsample, *args)`` with ``params`` of shape
``(C, ...)`` and ``subsample`` of shape ``(C, B)`` (or ``None``) must return the ``(C,)`` log
joints of the chains. :class:`~pyro_sgmcmc.nn.BayesianMLP` does.

Examples
--------
>>> result = run_chains(model, x, y, kernel="sghmc", num_chains=8, num_samples=200,
...                     warmup_steps=100, learning_rate=1e-2, batch_size=32)
>>> result.samples["layers.0.weight"].shape          # (chain, draw, out, in)
>>> idata = result.to_inference_data()                # az.rhat(idata), az.ess(idata)

References
----------
T. Chen, E. B. Fox and C. Guestrin, "Stochastic gradient Hamiltonian Monte Carlo", ICML 2014.

A. Gelman and D. B. Rubin, "Inference from iterative simulation using multiple sequences",
Statistical Science 7(4), 1992 (over-dispersed starts for R-hat).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import numpy as np
import torch
from pyro.infer.autoguide.initialization import init_to_uniform
from pyro.infer.mcmc.util import initialize_model
from torch.distributions.transforms import Transform

from ._validation import check_interval, check_nonnegative, check_positive, check_positive_int
from .conjugate import find_normal_gamma_updates
from .dynamics import (
    psgld_init,
    psgld_step,
    sghmc_init,
    sghmc_step,
    sgld_init,
    sgld_step,
    update_gradient_noise_estimate,
)
from .errors import ModelContractError, SamplerDivergedError
from .gibbs import GibbsUpdate
from .model_structure import check_finite_data, inspect_model, resolve_batch_size
from .potentials import SupportsLogJoint, closed_form_gradient_covers, is_identity
from .schedules import StepSchedule, as_schedule

__all__ = ["KERNELS", "VectorizedResult", "run_chains"]

TensorDict = dict[str, torch.Tensor]
KernelName = Literal["sgld", "sghmc", "psgld"]

#: The update rules :func:`run_chains` knows.
KERNELS: tuple[str, ...] = ("sgld", "sghmc", "psgld")

_MAX_SEED = 2**62
_FLAT = "_flat"


@dataclass(frozen=True)
class VectorizedResult:
    r"""Draws and statistics of a :func:`run_chains` run.

    Attributes
    ----------
    samples:
        Constrained draws per latent site, shape ``(chain, draw, *site_shape)``.
    sample_stats:
        Per-draw statistics, shape ``(chain, draw)``: ``lp`` (minus the minibatch potential in
        unconstrained space at the last step of the draw), ``step_size`` (multiplying the
        full-data gradient), ``temperature`` and ``diverging`` (a non-finite step in the draw).
    sampling_time:
        Seconds spent in the gradient steps (warm-up included).
    setup_time:
        Seconds spent before the first step: model inspection, initial values, compilation.
    num_gradient_steps:
        Gradient steps per chain.
    control_variate_centre:
        With ``control_variate``: the centre :math:`\hat\theta`, constrained values per dynamic
        site; else ``None``.
    chain_seeds:
        The seed of each chain's generator.
    kernel:
        Name of the update rule.
    """

    samples: dict[str, torch.Tensor]
    sample_stats: dict[str, np.ndarray]
    sampling_time: float
    setup_time: float
    num_gradient_steps: int
    chain_seeds: tuple[int, ...]
    kernel: str
    control_variate_centre: dict[str, torch.Tensor] | None = None
    model: Any = field(default=None, repr=False)
    args: tuple = field(default=(), repr=False)
    kwargs: dict = field(default_factory=dict, repr=False)

    @property
    def num_chains(self) -> int:
        return int(next(iter(self.samples.values())).shape[0])

    @property
    def num_draws(self) -> int:
        return int(next(iter(self.samples.values())).shape[1])

    @property
    def total_time(self) -> float:
        """Set-up plus sampling time."""
        return self.setup_time + self.sampling_time

    def get_samples(self, group_by_chain: bool = False) -> dict[str, torch.Tensor]:
        """Draws as ``pyro.infer.MCMC.get_samples`` returns them."""
        if group_by_chain:
            return dict(self.samples)
        return {k: v.reshape(-1, *v.shape[2:]) for k, v in self.samples.items()}

    def to_inference_data(self, **options: Any):
        """An ``arviz.InferenceData`` with ``posterior`` and ``sample_stats``.

        Variables keep the Pyro site names and have dims ``(chain, draw, <site>_dim_k)``; the
        attributes record ``sampling_time`` (for ESS per second), the kernel and the number of
        gradient steps. ``options`` go to ``arviz.from_dict`` (e.g. ``dims``, ``coords``).
        """
        import arviz as az

        attrs = {
            "inference_library": "pyro_sgmcmc.vectorized",
            "method": self.kernel,
            "sampling_time": float(self.sampling_time),
            "setup_time": float(self.setup_time),
            "num_gradient_steps": int(self.num_gradient_steps),
            "num_chains": self.num_chains,
            "num_draws": self.num_draws,
        }
        posterior = {k: v.detach().cpu().numpy() for k, v in self.samples.items()}
        idata = az.from_dict(posterior=posterior, sample_stats=dict(self.sample_stats), **options)
        for group in ("posterior", "sample_stats"):
            idata[group].attrs.update(attrs)
        return idata


def _is_identity(transform: Transform) -> bool:
    """Identity test that also sees through ``_InverseTransform`` (what Pyro's
    ``initialize_model`` returns: ``biject_to(support).inv``)."""
    return is_identity(transform) or is_identity(transform.inv)


def _chain_seeds(seed: int | None, num_chains: int) -> list[int]:
    if seed is None:
        seed = int(torch.randint(0, _MAX_SEED, (1,)).item())
    children = np.random.SeedSequence(seed).spawn(num_chains)
    return [int(c.generate_state(1, np.uint64)[0] % _MAX_SEED) for c in children]


def _check_kernel_options(
    kernel: str, friction: float, gradient_noise: float | str, decay: float, epsilon: float
) -> tuple[float, float | str, float, float]:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {list(KERNELS)}, got {kernel!r}")
    friction = check_interval("friction", friction, 0.0, 1.0, low_open=True)
    if gradient_noise != "estimate":
        gradient_noise = check_nonnegative("gradient_noise", gradient_noise)
        if gradient_noise > friction:
            raise ValueError(
                f"gradient_noise must lie in [0, friction] = [0, {friction}], got {gradient_noise}"
            )
    decay = check_interval("decay", decay, 0.0, 1.0, high_open=True)
    epsilon = check_positive("epsilon", epsilon)
    return friction, gradient_noise, decay, epsilon


class _Batches:
    """Per-chain minibatch indices, ``(C, B)``: each chain walks its own random permutations."""

    def __init__(self, num_data: int, batch_size: int, generators: Sequence[torch.Generator]):
        self.num_data, self.batch_size, self.generators = num_data, batch_size, generators
        self.batches_per_epoch = num_data // batch_size
        self._permutations: torch.Tensor | None = None
        self._position = 0

    def next(self) -> torch.Tensor | None:
        if self.batch_size >= self.num_data:
            return None
        if self._permutations is None or self._position + self.batch_size > self.num_data:
            self._permutations = torch.stack(
                [torch.randperm(self.num_data, generator=g) for g in self.generators]
            )
            self._position = 0
        batch = self._permutations[:, self._position : self._position + self.batch_size]
        self._position += self.batch_size
        return batch


class _StackedPotential:
    r"""``U(z) = -(log_joint(T^{-1}(z)) + log|det J|)`` for stacked chains: shape ``(C,)``."""

    def __init__(
        self,
        model: SupportsLogJoint,
        args: tuple,
        kwargs: Mapping[str, Any],
        transforms: Mapping[str, Transform],
        num_chains: int,
    ) -> None:
        self.model, self.args, self.kwargs = model, args, dict(kwargs)
        self.transforms = dict(transforms)
        self.non_identity = {k: t for k, t in self.transforms.items() if not _is_identity(t)}
        self.num_chains = num_chains

    def constrain(self, z: Mapping[str, torch.Tensor]) -> tuple[TensorDict, torch.Tensor | float]:
        constrained = dict(z)
        log_det: torch.Tensor | float = 0.0
        for name, transform in self.non_identity.items():
            value = z[name]
            theta = transform.inv(value)
            constrained[name] = theta
            ladj = transform.inv.log_abs_det_jacobian(value, theta)
            if ladj.dim() > 1:
                ladj = ladj.flatten(1).sum(-1)
            log_det = log_det + ladj
        return constrained, log_det

    def __call__(self, z: Mapping[str, torch.Tensor], subsample: torch.Tensor | None):
        constrained, log_det = self.constrain(z)
        log_joint = self.model.log_joint(constrained, subsample, *self.args, **self.kwargs)
        stacked = next(iter(z.values())).shape[0]  # C, or 2C with a control variate
        if log_joint.shape != (stacked,):
            raise ModelContractError(
                f"{type(self.model).__name__}.log_joint returned shape {tuple(log_joint.shape)} "
                f"for parameters stacked over {stacked} chains; run_chains needs one log "
                f"joint per chain, shape ({stacked},) (see pyro_sgmcmc.vectorized)"
            )
        return -(log_joint + log_det)


class _FlatGradient:
    r"""Value and gradient of the stacked potential as functions of the flat ``(C, D)`` positions.

    The dynamic sites of each chain are concatenated into one row of :math:`z \in \mathbb
    R^{C \times D}`; ``fixed`` holds the other (Gibbs-updated) sites, shape ``(C, ...)``.
    """

    def __init__(
        self,
        evaluate: Callable,
        shapes: Mapping[str, torch.Size],
        analytic: Callable[..., tuple[torch.Tensor, Mapping[str, torch.Tensor]]] | None = None,
        compile: bool = False,
        constrain: Callable[[Mapping[str, torch.Tensor]], tuple[TensorDict, Any]] | None = None,
    ) -> None:
        self.shapes = dict(shapes)
        # maps the fixed (e.g. Gibbs-updated, constrained) sites for the closed-form gradient
        self.constrain = constrain
        self.sizes = [math.prod(shape) for shape in self.shapes.values()]
        self.analytic = analytic
        if compile and analytic is not None:
            # the whole closed-form value-and-gradient, flattening included, as one graph
            self._analytic_call = torch.compile(self._analytic_value_and_gradient, dynamic=False)
        else:
            self._analytic_call = self._analytic_value_and_gradient
        if compile and analytic is None:
            evaluate = torch.compile(evaluate, dynamic=False)
        self.evaluate = evaluate

    def unflatten(self, flat: torch.Tensor) -> TensorDict:
        parts = flat.split(self.sizes, dim=-1)
        lead = flat.shape[:-1]
        return {
            name: part.reshape(*lead, *shape)
            for (name, shape), part in zip(self.shapes.items(), parts, strict=True)
        }

    def _analytic_value_and_gradient(
        self, flat: torch.Tensor, subsample: torch.Tensor | None, fixed: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        log_det: torch.Tensor | float = 0.0
        if fixed and self.constrain is not None:
            fixed, log_det = self.constrain(fixed)
        log_joint, grads = self.analytic({**self.unflatten(flat), **fixed}, subsample)
        grad = torch.cat([grads[name].flatten(1) for name in self.shapes], 1)
        return -(log_joint + log_det), grad.neg_()

    def __call__(
        self, flat: torch.Tensor, subsample: torch.Tensor | None, fixed: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.analytic is not None:  # hand-written gradient of the log joint (no autograd)
            with torch.no_grad():
                return self._analytic_call(flat, subsample, fixed)
        leaf = flat.detach().requires_grad_(True)
        value = self.evaluate({**self.unflatten(leaf), **fixed}, subsample)
        (grad,) = torch.autograd.grad(value.sum(), (leaf,))
        return value.detach(), grad

    def full_data(
        self,
        flat: torch.Tensor,
        fixed: Mapping[str, torch.Tensor],
        num_data: int,
        chunk_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Full-data potential :math:`U(z)` and :math:`\nabla U(z)`, in chunks of rows.

        The minibatch potential of the rows :math:`S_k` (:math:`|S_k| = B_k`) is
        :math:`\tilde U_{S_k} = -\log p(\theta) - \frac{N}{B_k}\sum_{i \in S_k} \log p(y_i \mid
        \theta) - \log|J|`, so :math:`\sum_k \frac{B_k}{N} \tilde U_{S_k} = U` exactly when the
        chunks partition the rows; memory is that of one chunk.
        """
        if chunk_size >= num_data:
            return self(flat, None, fixed)
        value = torch.zeros(flat.shape[0], dtype=flat.dtype)
        grad = torch.zeros_like(flat)
        for start in range(0, num_data, chunk_size):
            rows = torch.arange(start, min(start + chunk_size, num_data))
            weight = rows.numel() / num_data
            chunk_value, chunk_grad = self(flat, rows.expand(flat.shape[0], -1), fixed)
            value += weight * chunk_value
            grad += weight * chunk_grad
        return value, grad


class _ControlVariate:
    r"""The control-variate gradient estimator of SGLD-CV / SGHMC-CV (Baker et al. 2019).

    .. math::

        \hat\nabla U(z) = \nabla U(\hat z) + \nabla \tilde U_S(z) - \nabla \tilde U_S(\hat z),

    with :math:`\nabla U(\hat z)` the full-data gradient at the centre, computed once (and again
    after each Gibbs step, since the Gibbs-updated sites enter it). For each chain both minibatch
    gradients use the chain's rows :math:`S`; the positions :math:`z` and the centre are stacked
    along the chain dimension, ``(2C, D)``, so one batched forward/backward gives both.
    """

    def __init__(
        self,
        gradient: _FlatGradient,
        centre: torch.Tensor,
        num_chains: int,
        num_data: int,
        chunk_size: int,
    ) -> None:
        self.gradient, self.num_data, self.chunk_size = gradient, num_data, chunk_size
        self.centre = centre.expand(num_chains, -1)
        self.centre_gradient: torch.Tensor | None = None
        self.full_data_passes = 0

    def refresh(self, fixed: Mapping[str, torch.Tensor]) -> None:
        r"""(Re)compute :math:`\nabla U(\hat z)` for every chain (its own fixed sites)."""
        # without fixed (Gibbs) sites every chain shares the centre's gradient: one pass
        centre = self.centre if fixed else self.centre[:1]
        _, grad = self.gradient.full_data(centre, fixed, self.num_data, self.chunk_size)
        self.centre_gradient = grad.expand(self.centre.shape)
        self.full_data_passes += 1

    def __call__(
        self, flat: torch.Tensor, subsample: torch.Tensor | None, fixed: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if subsample is None:  # full batch: the exact gradient, nothing to reduce
            return self.gradient(flat, None, fixed)
        if self.centre_gradient is None:
            self.refresh(fixed)
        num_chains = flat.shape[0]
        both = torch.cat([flat, self.centre])
        doubled = {name: torch.cat([value, value]) for name, value in fixed.items()}
        value, grad = self.gradient(both, torch.cat([subsample, subsample]), doubled)
        estimate = grad[:num_chains] - grad[num_chains:] + self.centre_gradient
        return value[:num_chains], estimate


def _find_centre(
    gradient: _FlatGradient,
    start: torch.Tensor,
    fixed: Mapping[str, torch.Tensor],
    num_data: int,
    chunk_size: int,
    max_iterations: int,
    history: int = 10,
    tolerance: float = 1e-4,
) -> torch.Tensor:
    r"""A mode of the full-data potential, by L-BFGS with a backtracking line search.

    The search direction is :math:`d = -H g` with :math:`H` the L-BFGS inverse-Hessian estimate
    (two-loop recursion over the last ``history`` pairs; Nocedal and Wright 2006, Alg. 7.4) and
    the step the largest of :math:`1, 1/2, \dots` that satisfies Armijo's condition (where
    the change of the potential is below its rounding error: that reduces the directional
    derivative by 10%). It stops when the quasi-Newton decrement :math:`g^\top H g` falls below
    ``tolerance``: near a mode it is the squared distance to the mode in units of the
    posterior's standard deviations (:math:`H \approx \nabla^2 U^{-1} \approx` posterior
    covariance), which is what sets the variance of the control-variate gradient; it is
    scale-free, so it needs no tuning with :math:`N`. Written out rather than taken from
    ``torch.optim.LBFGS``, whose first use imports ``torch._dynamo`` (seconds of set-up).
    """
    fixed_one = {name: value[:1] for name, value in fixed.items()}

    def evaluate(position: torch.Tensor) -> tuple[float, torch.Tensor]:
        value, grad = gradient.full_data(position.unsqueeze(0), fixed_one, num_data, chunk_size)
        return float(value[0]), grad[0].double()

    z = start.detach().double()
    value, grad = evaluate(z.to(start.dtype))
    pairs: list[tuple[torch.Tensor, torch.Tensor, float]] = []
    for _ in range(max_iterations):
        if not (math.isfinite(value) and bool(torch.isfinite(grad).all())):
            break
        q = grad.clone()
        alphas = []
        for s, y, rho in reversed(pairs):
            alpha = rho * float(s @ q)
            q -= alpha * y
            alphas.append(alpha)
        if pairs:
            s, y, _ = pairs[-1]
            q *= float(s @ y) / float(y @ y)
        else:  # first step: at most a unit move
            q /= max(1.0, float(grad.abs().max()))
        for (s, y, rho), alpha in zip(pairs, reversed(alphas), strict=True):
            q += (alpha - rho * float(y @ q)) * s
        decrement = float(grad @ q)
        if decrement <= 0:  # not a descent direction: restart from steepest descent
            pairs.clear()
            q = grad / max(1.0, float(grad.abs().max()))
            decrement = float(grad @ q)
        if pairs and decrement < tolerance:
            break
        # the potential is a sum of N terms in the data's precision: differences below
        # ``resolution`` are rounding, so there the step is judged by its directional derivative
        resolution = 64 * torch.finfo(start.dtype).eps * max(abs(value), 1.0)
        step = 1.0
        while step > 1e-8:
            candidate = z - step * q
            new_value, new_grad = evaluate(candidate.to(start.dtype))
            if math.isfinite(new_value) and (
                new_value <= value - 1e-4 * step * decrement
                or (new_value <= value + resolution and abs(float(new_grad @ q)) <= 0.9 * decrement)
            ):
                break
            step *= 0.5
        else:
            break  # no decrease at floating-point resolution: as close as it gets
        s, y = candidate - z, new_grad - grad
        curvature = float(s @ y)
        if curvature > 1e-12 * float(y @ y):
            pairs = [*pairs[-(history - 1) :], (s, y, 1.0 / curvature)]
        z, value, grad = candidate, new_value, new_grad
    centre = z.to(start.dtype)
    if not torch.isfinite(centre).all():
        raise SamplerDivergedError(
            "the search for the control-variate centre diverged; pass the centre yourself "
            "(control_variate={site: value})",
            iteration=0,
            sites=list(gradient.shapes),
            draws={},
            constrained_draws={},
        )
    return centre


def _initial_values(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    init_strategy: Callable,
    seeds: Sequence[int],
    initial_params: Mapping[str, torch.Tensor] | None,
    transforms: Mapping[str, Transform] | None,
) -> tuple[TensorDict, dict[str, Transform]]:
    """Stacked unconstrained starts: the init strategy run under each chain's seed."""
    starts: list[TensorDict] = []
    found_transforms: dict[str, Transform] = {}
    given = set(initial_params or ())
    for index, seed in enumerate(seeds):
        if index > 0 and given and given >= set(starts[0]):
            # every site's start is given: one model trace (for the transforms) is enough
            starts.append(starts[0])
            continue
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            initial, _, found_transforms, _ = initialize_model(
                model,
                model_args=args,
                model_kwargs=kwargs,
                transforms=transforms,
                init_strategy=init_strategy,
            )
        starts.append({k: v.detach() for k, v in initial.items()})
    stacked = {name: torch.stack([s[name] for s in starts]) for name in starts[0]}
    if initial_params is not None:
        for name, value in initial_params.items():
            if name not in stacked:
                raise ValueError(
                    f"initial_params has site {name!r}, which is not latent; latent sites: "
                    f"{sorted(stacked)}"
                )
            value = torch.as_tensor(value, dtype=stacked[name].dtype)
            expected = stacked[name].shape
            if value.shape == expected[1:]:
                value = value.expand(expected)
            if value.shape != expected:
                raise ValueError(
                    f"initial_params[{name!r}] must have shape {tuple(expected)} (chain first) "
                    f"or {tuple(expected[1:])}, got {tuple(value.shape)}"
                )
            stacked[name] = found_transforms[name](value).clone()
    return stacked, dict(found_transforms)


def run_chains(
    model: Callable[..., Any],
    *args: Any,
    kernel: KernelName = "sghmc",
    num_chains: int = 4,
    num_samples: int = 100,
    warmup_steps: int = 0,
    num_steps_per_sample: int = 1,
    step_size: float | StepSchedule | Callable[[int], float] | None = None,
    learning_rate: float | StepSchedule | Callable[[int], float] | None = None,
    batch_size: int | None = None,
    friction: float = 0.05,
    gradient_noise: float | Literal["estimate"] = 0.0,
    gradient_noise_decay: float = 0.99,
    decay: float = 0.99,
    epsilon: float = 1e-5,
    temperature: float = 1.0,
    seed: int | None = None,
    init_strategy: Callable = init_to_uniform,
    initial_params: Mapping[str, torch.Tensor] | None = None,
    gibbs_updates: Sequence[GibbsUpdate] | Literal["auto"] | None = "auto",
    gibbs_every: int | None = None,
    subsample_plate: str = "data",
    compile: bool = False,
    control_variate: bool | Mapping[str, torch.Tensor] = False,
    centre_iterations: int = 100,
    chunk_size: int = 65536,
    max_consecutive_divergences: int = 100,
    callback: Callable[[int, Mapping[str, torch.Tensor]], None] | None = None,
    **kwargs: Any,
) -> VectorizedResult:
    r"""Run ``num_chains`` SG-MCMC chains at once, batched through one forward/backward per step.

    Each kept draw is ``num_steps_per_sample`` gradient steps (more while a cyclical schedule is
    in its exploration phase, which runs at temperature 0); the first ``warmup_steps`` draws
    are discarded, as in ``pyro.infer.MCMC``. The update rules and their stationary
    distributions are those of :func:`~pyro_sgmcmc.dynamics.sgld_step` (``"sgld"``),
    :func:`~pyro_sgmcmc.dynamics.sghmc_step` (``"sghmc"``, momenta start at zero and are reset
    after a divergence) and :func:`~pyro_sgmcmc.dynamics.psgld_step` (``"psgld"``); none has a
    Metropolis-Hastings correction.

    Parameters
    ----------
    model:
        A Pyro model following the data-plate contract whose ``log_joint`` accepts parameters
        with a leading chain dimension (e.g. :class:`~pyro_sgmcmc.nn.BayesianMLP`).
    *args, **kwargs:
        The model's arguments (full data).
    kernel:
        ``"sgld"``, ``"sghmc"`` or ``"psgld"``.
    num_chains:
        :math:`C \ge 1`.
    num_samples:
        Kept draws per chain, ``>= 1``.
    warmup_steps:
        Discarded draws per chain, ``>= 0``.
    num_steps_per_sample:
        Gradient steps per draw (thinning), ``>= 1``.
    step_size, learning_rate:
        Exactly one: ``step_size`` multiplies the gradient of the full-data potential;
        ``learning_rate`` is per datum (``step_size = learning_rate / N``). A float, a schedule
        of :mod:`pyro_sgmcmc.schedules` or a callable of the step counter.
    batch_size:
        Rows per minibatch in ``[1, N]``; ``None`` uses all rows (no gradient noise).
    friction:
        SGHMC's :math:`\alpha \in (0, 1]`.
    gradient_noise, gradient_noise_decay:
        SGHMC's :math:`\hat\beta` (a float in ``[0, friction]`` or ``"estimate"``) and the decay
        of its running estimate, in ``[0, 1)``.
    decay, epsilon:
        pSGLD's RMSprop decay in ``[0, 1)`` and diagonal bias ``> 0``.
    temperature:
        :math:`T > 0`.
    seed:
        Seeds every chain's generator (``SeedSequence(seed).spawn``); ``None``: from torch's RNG.
    init_strategy:
        Pyro init strategy, run once per chain under the chain's seed. The default
        ``init_to_uniform`` (uniform on ``(-2, 2)`` in unconstrained space) gives over-dispersed
        starts, which R-hat needs to be meaningful.
    initial_params:
        Constrained starting values per site, shape ``(C, ...)`` or ``(...)`` (shared);
        overrides ``init_strategy`` for the sites given.
    gibbs_updates, gibbs_every:
        Exact conditional updates (``"auto"``: the model's ``gibbs_updates()`` or the
        Normal-Gamma pairs found in its trace; ``None``: none) and their period in gradient steps
        (default: once per epoch). Each chain draws from its own conditional.
    subsample_plate:
        Name of the data plate.
    compile:
        Compile the gradient computation with ``torch.compile``: the model's closed-form value
        and gradient when it has one, otherwise the stacked potential that autograd
        differentiates. Its compile time is part of ``setup_time`` (the first call is made
        before the clock of the sampling loop starts); inductor caches compiled code on disk, so
        a second process compiles the same step much faster.
    control_variate:
        Replace the minibatch gradient by the control-variate estimator of SGLD-CV / SGHMC-CV
        (Baker et al. 2019), for tall data (large :math:`N/B`). With :math:`\tilde U_S` the
        minibatch potential of the chain's rows :math:`S` and a centre :math:`\hat z`,

        .. math::

            \hat\nabla U(z) = \nabla U(\hat z) + \nabla\tilde U_S(z) - \nabla\tilde U_S(\hat z)
            = \nabla U(\hat z) - \nabla \log p(z) + \nabla \log p(\hat z)
            + \frac{N}{B}\sum_{i \in S}\bigl[\nabla u_i(z) - \nabla u_i(\hat z)\bigr]

        (:math:`u_i = -\log p(y_i \mid z)`; the Jacobian term is treated like the prior). It is
        unbiased for any centre; its variance is :math:`O(\lVert z - \hat z\rVert^2)` instead
        of :math:`O(1)`, so near a mode it stays small however large :math:`N/B` is. Each step
        evaluates the minibatch at :math:`z` and at :math:`\hat z`, stacked as :math:`2C`
        chains in one call (about twice the cost of a plain step); :math:`\nabla U(\hat z)`
        costs one pass over the data at set-up and one more after each Gibbs step (the Gibbs
        sites enter it). ``True``: the centre is a mode of the full-data potential found by
        L-BFGS from chain 0's start (part of ``setup_time``); a mapping: the centre's
        constrained value for each dynamic site (shape of one draw). ``False`` (default): the
        plain minibatch gradient.
    centre_iterations:
        Maximum L-BFGS iterations for the centre (``control_variate=True``), ``>= 1``; each
        costs one or a few passes over the data.
    chunk_size:
        Rows per call in full-data passes (the centre's gradient), ``>= 1``: bounds their memory.
    max_consecutive_divergences:
        A chain with this many non-finite steps in a row raises
        :class:`~pyro_sgmcmc.errors.SamplerDivergedError`.
    callback:
        ``callback(draw_index, constrained_draw)`` after each kept draw (draw index counts the
        kept draws, from 0), with values of shape ``(C, ...)``; for anytime evaluation.

    Returns
    -------
    VectorizedResult

    Raises
    ------
    ValueError
        On an invalid argument (the message names it and its allowed range), or
        :class:`~pyro_sgmcmc.errors.ModelContractError` for a model without a batched fast path.

    References
    ----------
    J. Baker, P. Fearnhead, E. B. Fox and C. Nemeth, "Control variates for stochastic gradient
    MCMC", Statistics and Computing 29(3), 599-615, 2019 (``control_variate``).
    """
    setup_start = time.perf_counter()
    if not callable(model):
        raise TypeError(f"model must be a callable Pyro model, got {type(model).__name__}")
    if not isinstance(model, SupportsLogJoint):
        raise ModelContractError(
            "run_chains needs a model with a batched log_joint(params, subsample, *args, "
            "**kwargs) method (the fast path), e.g. pyro_sgmcmc.nn.BayesianMLP"
        )
    friction, gradient_noise, decay, epsilon = _check_kernel_options(
        kernel, friction, gradient_noise, decay, epsilon
    )
    num_chains = check_positive_int("num_chains", num_chains)
    num_samples = check_positive_int("num_samples", num_samples)
    warmup_steps = check_positive_int("warmup_steps", warmup_steps, minimum=0)
    num_steps_per_sample = check_positive_int("num_steps_per_sample", num_steps_per_sample)
    temperature = check_positive("temperature", temperature)
    max_consecutive_divergences = check_positive_int(
        "max_consecutive_divergences", max_consecutive_divergences
    )
    if (step_size is None) == (learning_rate is None):
        raise ValueError(
            "give exactly one of step_size (multiplies the gradient of the full-data potential) "
            "or learning_rate (per datum: step_size = learning_rate / N)"
        )
    schedule = as_schedule(
        step_size if step_size is not None else learning_rate,
        "step_size" if step_size is not None else "learning_rate",
    )
    if seed is not None:
        seed = check_positive_int("seed", seed, minimum=0)
    if gibbs_every is not None:
        gibbs_every = check_positive_int("gibbs_every", gibbs_every)
    centre_iterations = check_positive_int("centre_iterations", centre_iterations)
    chunk_size = check_positive_int("chunk_size", chunk_size)
    if not isinstance(control_variate, bool | Mapping):
        raise ValueError(
            "control_variate must be True, False or a mapping from site name to the centre's "
            f"constrained value, got {type(control_variate).__name__}"
        )
    if not callable(init_strategy):
        raise ValueError("init_strategy must be a callable such as pyro's init_to_uniform()")
    if callback is not None and not callable(callback):
        raise ValueError(f"callback must be callable or None, got {callback!r}")
    check_finite_data(args, kwargs)

    seeds = _chain_seeds(seed, num_chains)
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seeds[0])
        structure = inspect_model(model, args, kwargs, subsample_plate)
    num_data = structure.num_data
    if batch_size is not None:
        batch_size = check_positive_int("batch_size", batch_size)
    batch_size = resolve_batch_size(batch_size, num_data, subsample_plate)
    z, transforms = _initial_values(model, args, kwargs, init_strategy, seeds, initial_params, None)

    if gibbs_updates is None:
        gibbs: list[GibbsUpdate] = []
    elif gibbs_updates == "auto":
        factory = getattr(model, "gibbs_updates", None)
        gibbs = list(factory()) if callable(factory) else find_normal_gamma_updates(model, *args)
    elif isinstance(gibbs_updates, Sequence) and all(
        isinstance(g, GibbsUpdate) for g in gibbs_updates
    ):
        gibbs = list(gibbs_updates)
    else:
        raise ValueError("gibbs_updates must be 'auto', None or a sequence of GibbsUpdate objects")
    gibbs_sites = {site for update in gibbs for site in update.sites}
    unknown = gibbs_sites - set(z)
    if unknown:
        raise ValueError(f"gibbs_updates name sites that are not latent: {sorted(unknown)}")
    dynamic_sites = tuple(name for name in structure.latent_sites if name not in gibbs_sites)
    if not dynamic_sites:
        raise ValueError("every latent site is Gibbs-updated: nothing is left for SG-MCMC")
    batches = _Batches(num_data, batch_size, generators)
    gibbs_period = gibbs_every or max(batches.batches_per_epoch, 1)
    step_scale = 1.0 / num_data if learning_rate is not None else 1.0
    is_sampling = getattr(schedule, "is_sampling", lambda _t: True)

    potential = _StackedPotential(model, args, kwargs, transforms, num_chains)

    # The dynamic sites of each chain are concatenated into one row of a (C, D) tensor: the
    # element-wise update rules then cost a handful of kernel launches per step, not per site.
    fixed = {name: z[name] for name in z if name not in dynamic_sites}
    # A model may offer its gradient in closed form (BayesianMLP for common settings): used when
    # every dynamic site is unconstrained and among the sites it differentiates (sites held fixed,
    # such as Gibbs-updated precisions, are only read). ``compile`` compiles it (or, without it,
    # the potential that autograd differentiates).
    analytic = None
    if closed_form_gradient_covers(model, tuple(dynamic_sites), potential.non_identity):
        analytic = partial(_call_analytic, model, args, kwargs)
    flat_gradient = _FlatGradient(
        potential.__call__,
        {name: z[name].shape[1:] for name in dynamic_sites},
        analytic,
        compile,
        constrain=potential.constrain,
    )
    unflatten = flat_gradient.unflatten
    sizes = flat_gradient.sizes
    dynamic = {_FLAT: torch.cat([z[name].reshape(num_chains, -1) for name in dynamic_sites], 1)}

    control: _ControlVariate | None = None
    centre_constrained: dict[str, torch.Tensor] | None = None
    if control_variate is not False:
        centre = _control_variate_centre(
            control_variate, flat_gradient, dynamic[_FLAT][0], fixed, transforms, num_data,
            chunk_size, centre_iterations, dynamic_sites,
        )  # fmt: skip
        control = _ControlVariate(flat_gradient, centre, num_chains, num_data, chunk_size)
        control.refresh(fixed)
        with torch.no_grad():
            one = {**unflatten(centre.unsqueeze(0)), **{k: v[:1] for k, v in fixed.items()}}
            constrained_centre = potential.constrain(one)[0]
            centre_constrained = {name: constrained_centre[name][0] for name in dynamic_sites}

    def chain_noise() -> TensorDict:
        # one draw per chain from the chain's own generator: chains never share noise
        draws = [
            torch.randn(sum(sizes), generator=g, dtype=dynamic[_FLAT].dtype) for g in generators
        ]
        return {_FLAT: torch.stack(draws)}

    def value_and_gradient(position: TensorDict, subsample: torch.Tensor | None):
        if control is not None:
            value, grad = control(position[_FLAT], subsample, fixed)
        else:
            value, grad = flat_gradient(position[_FLAT], subsample, fixed)
        return value, {_FLAT: grad}

    if kernel == "sghmc":
        state = sghmc_init(dynamic)
    elif kernel == "sgld":
        state = sgld_init(dynamic)
    else:
        state = psgld_init(dynamic)
    noise_estimate = None

    def update(state, gradient, eta, temp):
        nonlocal noise_estimate
        xi = chain_noise() if temp > 0 else None
        if kernel == "sgld":
            return sgld_step(state, gradient, eta, temp, noise=xi)
        if kernel == "psgld":
            return psgld_step(
                state,
                gradient,
                eta,
                temp,
                num_data=num_data,
                decay=decay,
                epsilon=epsilon,
                noise=xi,
            )
        beta = gradient_noise
        if beta == "estimate":
            noise_estimate = update_gradient_noise_estimate(
                noise_estimate, gradient, gradient_noise_decay
            )
            beta = {k: 0.5 * eta * v for k, v in noise_estimate.variance.items()}
        return sghmc_step(state, gradient, eta, friction, temp, gradient_noise=beta, noise=xi)

    def gibbs_step() -> None:
        constrained, _ = potential.constrain({**unflatten(state.position[_FLAT]), **fixed})
        per_chain: list[TensorDict] = []
        for c, generator in enumerate(generators):
            values = {name: value[c] for name, value in constrained.items()}
            for block in gibbs:
                extra = (
                    {"temperature": temperature}
                    if getattr(block, "supports_temperature", False)
                    else {}
                )
                values.update(block.sample(values, generator, *args, **extra, **kwargs))
            per_chain.append(values)
        for name in gibbs_sites:
            stacked = torch.stack([values[name] for values in per_chain])
            fixed[name] = transforms[name](stacked)
        if control is not None:  # the centre's full-data gradient depends on the Gibbs sites
            control.refresh(fixed)

    if compile:  # trigger compilation here, so that it counts as set-up, not sampling
        # a minibatch of the real shape and layout that draws nothing from the chains' generators
        # (the compiled run must follow the eager one draw for draw)
        rows = None
        if batch_size < num_data:
            rows = torch.zeros(num_chains, num_data, dtype=torch.long)[:, :batch_size]
        value_and_gradient(dynamic, rows)
    setup_time = time.perf_counter() - setup_start

    total_draws = warmup_steps + num_samples
    kept: dict[str, list[torch.Tensor]] = {name: [] for name in z}
    stats = {name: np.zeros((num_chains, num_samples)) for name in ("lp", "step_size")}
    stats["temperature"] = np.zeros((num_chains, num_samples))
    stats["diverging"] = np.zeros((num_chains, num_samples), dtype=bool)
    consecutive = torch.zeros(num_chains, dtype=torch.long)
    t = 0
    value = torch.zeros(num_chains)
    eta = math.nan
    sampling_start = time.perf_counter()
    for draw in range(total_draws):
        steps = 0
        diverged = torch.zeros(num_chains, dtype=torch.bool)
        while True:
            eta = float(schedule(t)) * step_scale
            sampling = bool(is_sampling(t))
            new_value, gradient = value_and_gradient(state.position, batches.next())
            new_state = update(state, gradient, eta, temperature if sampling else 0.0)
            t += 1
            total = new_value.sum()
            for site_value in new_state.position.values():
                total = total + site_value.sum()
            if math.isfinite(float(total)):
                state, value = new_state, new_value
                consecutive.zero_()
            else:
                state, value, bad = _reject_non_finite(state, new_state, value, new_value)
                diverged |= bad
                consecutive = torch.where(bad, consecutive + 1, torch.zeros_like(consecutive))
                if int(consecutive.max()) >= max_consecutive_divergences:
                    raise SamplerDivergedError(
                        f"{kernel} diverged: chains {bad.nonzero().flatten().tolist()} produced "
                        f"{max_consecutive_divergences} non-finite steps in a row up to step {t}; "
                        f"step size was {eta:.3g}. Reduce step_size (or learning_rate).",
                        iteration=t,
                        sites=list(dynamic_sites),
                        draws={},
                        constrained_draws={},
                    )
            if gibbs and t % gibbs_period == 0:
                gibbs_step()
            steps += 1
            if steps >= num_steps_per_sample and sampling:
                break
        if draw >= warmup_steps:
            i = draw - warmup_steps
            position = {**unflatten(state.position[_FLAT]), **fixed}
            for name in kept:
                kept[name].append(position[name].detach().clone())
            stats["lp"][:, i] = -value.double().numpy()
            stats["step_size"][:, i] = eta
            stats["temperature"][:, i] = temperature
            stats["diverging"][:, i] = diverged.numpy()
            if callback is not None:
                with torch.no_grad():
                    callback(i, potential.constrain(position)[0])
    sampling_time = time.perf_counter() - sampling_start

    with torch.no_grad():
        unconstrained = {name: torch.stack(values, dim=1) for name, values in kept.items()}
        constrained = {}
        for name, values in unconstrained.items():
            transform = transforms[name]
            constrained[name] = values if _is_identity(transform) else transform.inv(values)
    samples = {name: constrained[name] for name in structure.latent_sites}
    return VectorizedResult(
        samples=samples,
        sample_stats=stats,
        sampling_time=sampling_time,
        setup_time=setup_time,
        num_gradient_steps=t,
        chain_seeds=tuple(seeds),
        kernel=kernel,
        control_variate_centre=centre_constrained,
        model=model,
        args=args,
        kwargs=dict(kwargs),
    )


def _call_analytic(model: Any, args: tuple, kwargs: Mapping[str, Any], params, subsample):
    return model.log_joint_and_gradient(params, subsample, *args, **kwargs)


def _control_variate_centre(
    control_variate: bool | Mapping[str, torch.Tensor],
    flat_gradient: _FlatGradient,
    start: torch.Tensor,
    fixed: Mapping[str, torch.Tensor],
    transforms: Mapping[str, Transform],
    num_data: int,
    chunk_size: int,
    centre_iterations: int,
    dynamic_sites: Sequence[str],
) -> torch.Tensor:
    """The centre as a flat ``(D,)`` unconstrained vector: given, or found by L-BFGS."""
    if control_variate is True:
        return _find_centre(flat_gradient, start, fixed, num_data, chunk_size, centre_iterations)
    assert isinstance(control_variate, Mapping)
    missing = set(dynamic_sites) - set(control_variate)
    extra = set(control_variate) - set(dynamic_sites)
    if missing or extra:
        raise ValueError(
            f"control_variate must give a centre value for exactly the dynamic sites "
            f"{list(dynamic_sites)}; missing {sorted(missing)}, unknown {sorted(extra)}"
        )
    parts = []
    for name in dynamic_sites:
        shape = flat_gradient.shapes[name]
        value = torch.as_tensor(control_variate[name], dtype=start.dtype)
        if value.shape != shape:
            raise ValueError(
                f"control_variate[{name!r}] must have the site's shape {tuple(shape)}, got "
                f"{tuple(value.shape)}"
            )
        parts.append(transforms[name](value).reshape(-1))
    return torch.cat(parts).detach()


def _reject_non_finite(state, new_state, value: torch.Tensor, new_value: torch.Tensor):
    """Per chain: keep the new state where it is finite, else the old position (momenta zeroed).

    Returns the merged state, the merged potential values and the ``(C,)`` mask of bad chains.
    """
    bad = ~torch.isfinite(new_value)
    for site_value in new_state.position.values():
        bad |= ~torch.isfinite(site_value.flatten(1)).all(dim=1)
    merged = {}
    for field_name, new_field in zip(new_state._fields, new_state, strict=True):
        old_field = getattr(state, field_name)
        if not isinstance(new_field, dict):
            merged[field_name] = new_field
            continue
        merged_field = {}
        for name, new in new_field.items():
            mask = bad.reshape(-1, *([1] * (new.dim() - 1)))
            if field_name == "momentum":  # momenta restart at zero, as in the SGHMC kernel
                fallback = torch.zeros_like(new)
            elif old_field is not None:  # positions and running averages keep their last value
                fallback = old_field[name]
            else:
                fallback = new.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
            merged_field[name] = torch.where(mask, fallback, new)
        merged[field_name] = merged_field
    return type(new_state)(**merged), torch.where(bad, value, new_value), bad
