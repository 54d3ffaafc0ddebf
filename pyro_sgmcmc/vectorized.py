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
from .model_structure import check_finite_data, inspect_model
from .potentials import SupportsLogJoint, is_identity
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
    """Draws and statistics of a :func:`run_chains` run.

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
        if log_joint.shape != (self.num_chains,):
            raise ModelContractError(
                f"{type(self.model).__name__}.log_joint returned shape {tuple(log_joint.shape)} "
                f"for parameters stacked over {self.num_chains} chains; run_chains needs one log "
                f"joint per chain, shape ({self.num_chains},) (see pyro_sgmcmc.vectorized)"
            )
        return -(log_joint + log_det)


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
    for seed in seeds:
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
        Compile the stacked potential with ``torch.compile`` (its compile time is part of
        ``setup_time``: the first call is made before the clock of the sampling loop starts).
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
    if batch_size is None:
        batch_size = num_data
    batch_size = check_positive_int("batch_size", batch_size)
    if batch_size > num_data:
        raise ValueError(
            f"batch_size must lie in [1, N] = [1, {num_data}] (N is the size of the data plate "
            f"{subsample_plate!r}), got {batch_size}"
        )
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
    evaluate = torch.compile(potential.__call__, dynamic=False) if compile else potential

    # The dynamic sites of each chain are concatenated into one row of a (C, D) tensor: the
    # element-wise update rules then cost a handful of kernel launches per step, not per site.
    fixed = {name: z[name] for name in z if name not in dynamic_sites}
    shapes = {name: z[name].shape[1:] for name in dynamic_sites}
    sizes = [math.prod(shape) for shape in shapes.values()]
    dynamic = {_FLAT: torch.cat([z[name].reshape(num_chains, -1) for name in dynamic_sites], 1)}

    def unflatten(flat: torch.Tensor) -> TensorDict:
        parts = flat.split(sizes, dim=1)
        return {
            name: part.reshape(num_chains, *shape)
            for (name, shape), part in zip(shapes.items(), parts, strict=True)
        }

    def chain_noise() -> TensorDict:
        # one draw per chain from the chain's own generator: chains never share noise
        draws = [
            torch.randn(sum(sizes), generator=g, dtype=dynamic[_FLAT].dtype) for g in generators
        ]
        return {_FLAT: torch.stack(draws)}

    def value_and_gradient(position: TensorDict, subsample: torch.Tensor | None):
        leaf = position[_FLAT].detach().requires_grad_(True)
        value = evaluate({**unflatten(leaf), **fixed}, subsample)
        (grad,) = torch.autograd.grad(value.sum(), (leaf,))
        return value.detach(), {_FLAT: grad}

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
                values.update(block.sample(values, generator, *args, **kwargs))
            per_chain.append(values)
        for name in gibbs_sites:
            stacked = torch.stack([values[name] for values in per_chain])
            fixed[name] = transforms[name](stacked)

    if compile:  # trigger compilation here, so that it counts as set-up, not sampling
        value_and_gradient(dynamic, batches.next())
        batches = _Batches(num_data, batch_size, generators)
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
        model=model,
        args=args,
        kwargs=dict(kwargs),
    )


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
