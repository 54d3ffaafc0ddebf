"""Build a :class:`~pyro_sgmcmc.engine.ChainEngine` for a model, its data and a set of chains.

:func:`prepare_chains` is the one place where a sampler meets the model: it inspects the data
plate, finds the Gibbs blocks, draws each chain's seed and starting point, chooses the potential
and gradient estimator, the minibatch sampler and the step-size control, and starts the engine.
The ``pyro.infer.MCMC`` kernels call it once per chain (``C = 1``), :func:`~pyro_sgmcmc.run_chains`
once for all chains; chain ``c`` gets the same seed, start, minibatches and noise either way.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pyro import poutine
from pyro.infer.autoguide.initialization import init_to_mean, init_to_median
from pyro.infer.mcmc.util import initialize_model
from pyro.poutine.messenger import Messenger
from torch.distributions import biject_to
from torch.distributions.transforms import Transform

from .._validation import as_tensor_arguments
from ..dynamics.registry import Algorithm
from ..errors import ModelContractError
from ..models.conjugate import find_normal_gamma_updates
from ..models.contract_checks import check_finite_data, dtype_mismatch
from ..models.gibbs import GibbsUpdate
from ..models.hidden_units import has_hidden_units
from ..models.potential_choice import make_potential
from ..models.potentials import Potential
from ..models.structure import (
    ModelStructure,
    data_mismatch,
    inspect_model,
    resolve_batch_size,
    spread_rows,
)
from .adaptation import AdaptiveControl
from .blind_sites import blind_site_messages, find_blind_sites
from .controls import MandtRateControl, ScheduleControl, StepControl
from .dense import DENSE_LIMIT
from .distributed import DataParallelGradient, start_data_parallel
from .divergence import BlowUpDetector, DivergenceMonitor
from .engine import ChainEngine
from .estimators import (
    AutoControlVariate,
    ControlVariateGradient,
    MinibatchGradient,
    find_centre,
)
from .fit_check import check_fit
from .gibbs_blocks import GibbsBlocks, supports_temperature
from .health import check_classifier, check_draws, warn_all
from .hierarchy import find_scale_parents
from .layout import FlatLayout
from .mcmc_layout import constrained_as_mcmc
from .minibatch import Minibatcher
from .prior_distance import check_prior_distance
from .report import measured_temperature
from .seeds import chain_generators, chain_seeds, seeded
from .settings import SamplerSettings, settings_signature
from .thinning import ThinningMeter, warmup_steps_per_draw
from .unit_restart import UnitRestart

__all__ = ["PreparedChains", "model_transforms", "prepare_chains", "resolve_gibbs_updates"]

TensorDict = dict[str, torch.Tensor]


#: Rows on which :attr:`PreparedChains.log_density_at_reference` evaluates the model.
SIGNATURE_ROWS = 8


@dataclass
class PreparedChains:
    """A started engine and what the drivers need to report its draws.

    Attributes
    ----------
    engine:
        The engine, started at the chains' initial values.
    structure:
        The model's latent and observed sites and the data plate.
    transforms:
        Constrained-to-unconstrained transforms of the latent sites.
    potential:
        The potential (maps unconstrained draws to constrained ones).
    initial:
        The chains' unconstrained starting values, ``(C, ...)`` per latent site.
    seeds:
        The seed of each chain's generator.
    data:
        The model's full-data ``(args, kwargs)``.
    """

    engine: ChainEngine
    structure: ModelStructure
    transforms: dict[str, Transform]
    potential: Potential
    initial: TensorDict
    seeds: list[int]
    data: tuple[tuple, dict[str, Any]] = ((), {})

    @property
    def latent_sites(self) -> tuple[str, ...]:
        return self.structure.latent_sites

    def draw(self) -> TensorDict:
        """The engine's last draw: unconstrained ``(C, ...)`` values of every latent site, in the
        model's order (safe to keep: the engine never modifies a state in place)."""
        values = self.engine.drawn_values()
        return {name: values[name] for name in self.structure.latent_sites}

    def signature(self, kernel: Any) -> dict[str, Any]:
        """What a checkpoint must share with the run that continues it: the kernel class, its
        settings and options (seed included), and the model as the chains see it (latent sites'
        unconstrained shapes and dtypes, observed sites, data size)."""
        return {
            "kernel": type(kernel).__qualname__,
            "config": settings_signature(kernel.settings, kernel.options),
            "latent_sites": {
                name: [list(value.shape[1:]), str(value.dtype)]
                for name, value in self.initial.items()
            },
            "observed_sites": list(self.structure.observed_sites),
            "num_data": self.structure.num_data,
            "model_log_density": self.log_density_at_reference,
        }

    @functools.cached_property
    def log_density_at_reference(self) -> float | None:
        r""":math:`\log p(\theta_r, y_R)`: the model's log joint density at a fixed point
        :math:`\theta_r` (every unconstrained coordinate 0.1, whatever the chain) on
        :data:`SIGNATURE_ROWS` rows :math:`R` spread over the data, the model's own torch random
        numbers fixed; ``None`` where it is not finite. Computed once per engine. With the sites'
        shapes in :meth:`signature`, it tells apart two models of the same sites, e.g. another
        likelihood."""
        plate = self.structure.plate
        device = next(iter(self.initial.values())).device
        count = min(plate.num_data, plate.max_rows, SIGNATURE_ROWS)
        rows = spread_rows(count, plate.num_data, device)
        model, args, kwargs = plate.bind(self.structure.model, *self.data, rows)
        values = self.constrain(
            {name: torch.full_like(value[0], 0.1) for name, value in self.initial.items()}
        )
        with torch.no_grad(), seeded(0, device):
            trace = poutine.trace(poutine.condition(model, data=values)).get_trace(*args, **kwargs)
            density = float(trace.log_prob_sum())
        return density if math.isfinite(density) else None

    def warmup_messages(self, args: tuple, kwargs: Mapping[str, Any]) -> list[str]:
        """What is wrong after warm-up: chains still on their way, a classifier at chance, a fit
        far worse than earlier in warm-up."""
        engine = self.engine
        ids = engine.monitor.chain_ids
        now = self.constrain(self.draw())
        messages = list(getattr(engine.control, "warmup_report", lambda _: [])(ids))
        messages += check_classifier(
            self.structure.model, args, kwargs, now, self.structure.plate, ids
        )
        milestones = [
            (label, self.constrain({**engine.layout.unflatten(flat), **fixed}))
            for label, flat, fixed in getattr(engine.control, "milestones", [])
        ]
        messages += check_fit(
            self.structure, args, kwargs, milestones, now, engine.temperature, ids
        )
        return messages

    def final_messages(
        self, draws: Mapping[str, torch.Tensor], args: tuple, kwargs: Mapping[str, Any]
    ) -> list[str]:
        """What is wrong after sampling: chains sent back to a kept draw, chains or coordinates of
        a site that did not move, chains that ran too hot, a network's coordinates far outside
        their prior (``draws`` are the kept unconstrained draws, ``(C, S, ...)`` per site;
        ``args``, ``kwargs`` the model's full-data arguments)."""
        engine = self.engine
        virial = measured_temperature(engine)  # none for constant SGD: its spread is Mandt's
        scale = engine.control.posterior_scale()
        scales = None if scale is None else engine.layout.unflatten(scale)
        network = has_hidden_units(self.structure.model, {n: v.shape[2:] for n, v in draws.items()})
        ids = engine.monitor.chain_ids
        messages = engine.retreat_messages() + check_draws(
            draws, virial, engine.temperature, ids, posterior_scales=scales, network=network
        )
        if network:
            structure = self.structure
            messages += check_prior_distance(
                structure.model, args, kwargs, self.constrain(draws), structure.plate, ids
            )
        return messages

    def constrain(self, values: Mapping[str, torch.Tensor]) -> TensorDict:
        """Constrained values of unconstrained ones (any number of leading dimensions)."""
        out = {}
        for name, value in values.items():
            transform = self.potential.non_identity.get(name)
            out[name] = value if transform is None else transform.inv(value)
        return out

    def constrain_kept(self, draws: Mapping[str, torch.Tensor]) -> TensorDict:
        """Kept draws ``(C, S, ...)`` constrained, contiguous, to the bits ``pyro.infer.MCMC``
        gives (:func:`~.mcmc_layout.constrained_as_mcmc`)."""
        return constrained_as_mcmc(draws, self.potential.non_identity)


def prepare_chains(
    settings: SamplerSettings,
    algorithm: Algorithm,
    options: Any,
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    *,
    chains: Sequence[int],
    warmup_draws: int,
    initial_params: Mapping[str, torch.Tensor] | None = None,
) -> PreparedChains:
    """Build and start the engine of the chains with indices ``chains``.

    Parameters
    ----------
    settings, algorithm, options:
        The sampler's settings and update rule.
    model, args, kwargs:
        The Pyro model and its full-data arguments.
    chains:
        The chains' indices (their seeds derive from ``settings.seed`` and these).
    warmup_draws:
        Draws of warm-up before the kept draws.
    initial_params:
        Unconstrained starting values, ``(C, ...)`` per site, for some or all latent sites;
        the others come from ``settings.init_strategy`` run under each chain's seed.
    """
    args, kwargs = as_tensor_arguments(tuple(args), dict(kwargs))
    check_finite_data(args, kwargs)
    seeds, generators = _chain_randomness(settings, options, args, kwargs, chains)
    with seeded(seeds[0], data_device(args, kwargs)):
        structure = _inspect(model, args, kwargs, settings)
    model = structure.model
    updates = resolve_gibbs_updates(settings.gibbs_updates, model, args, kwargs, structure)
    gibbs_sites = {site for update in updates for site in update.sites}
    blind = find_blind_sites(structure, args, kwargs, gibbs_sites, data_device(args, kwargs))
    warn_all(blind_site_messages(blind))
    initial, transforms = initial_values(
        model, args, kwargs, settings, seeds, initial_params, structure, gibbs_sites
    )
    _check_data_dtypes(args, kwargs, next(iter(initial.values())).dtype)
    dynamic = [name for name in structure.latent_sites if name not in gibbs_sites]
    layout = FlatLayout({name: initial[name].shape[1:] for name in dynamic})
    fixed = {name: initial[name] for name in structure.latent_sites if name in gibbs_sites}
    potential = _potential(settings, model, args, kwargs, transforms, layout, structure, initial)
    batch_size = resolve_batch_size(
        settings.batch_size, structure.num_data, structure.plate_name, structure.plate
    )
    batches = Minibatcher(structure.num_data, batch_size, generators, settings.batch_sampling)
    flat = layout.flatten(initial)
    first = _first_chain_start(
        model, args, kwargs, settings, seeds, chains, structure, initial, gibbs_sites
    )
    estimator = _gradient_estimator(
        settings, potential, layout, first, transforms, len(seeds), batch_size, structure, updates
    )
    network = has_hidden_units(model, {name: value.shape[1:] for name, value in initial.items()})
    thinning, steps_per_draw, meter = _thinning(settings, warmup_draws, network)
    watch = _funnel_watch(settings, structure, args, kwargs, gibbs_sites, network, layout)
    engine = ChainEngine(
        algorithm=algorithm,
        options=options,
        layout=layout,
        estimator=estimator,
        batches=batches,
        generators=generators,
        control=make_control(
            settings,
            algorithm,
            options,
            batches,
            warmup_draws * steps_per_draw,
            warmup_draws,
            flat,
            network,
            watch,
        ),
        gibbs=_gibbs_blocks(settings, updates, potential, generators, args, kwargs, batches),
        monitor=_divergence_monitor(settings, algorithm, len(seeds), layout, chains),
        num_data=structure.num_data,
        temperature=settings.temperature if algorithm.uses_temperature else 1.0,
        num_steps_per_sample=thinning,
        warmup_draws=warmup_draws,
        warmup_steps_per_draw=steps_per_draw,
        thinning_meter=meter,
    )
    engine.start(flat, fixed)
    prepared = PreparedChains(
        engine, structure, transforms, potential, initial, seeds, (args, dict(kwargs))
    )
    engine.unit_restart = _unit_restart(network, prepared)
    return prepared


def _unit_restart(network: bool, chains: PreparedChains) -> UnitRestart | None:
    """What starts a network's units far outside their prior afresh at the planned end of
    warm-up (:mod:`.unit_restart`); ``None`` for a model without hidden units."""
    if not network:
        return None
    structure, potential = chains.structure, chains.potential
    real = [name for name in structure.latent_sites if name not in potential.non_identity]
    return UnitRestart(structure.model, *chains.data, structure.plate, chains.constrain,
                       potential.unconstrain, real)  # fmt: skip


def _funnel_watch(settings, structure, args, kwargs, gibbs_sites, network, layout):
    """The flat coordinates of each site whose spread another site sets (a centred hierarchical
    model's group effects, :mod:`~pyro_sgmcmc.engine.hierarchy`), which the adaptive warm-up's
    descent watches for the funnel's neck: sites of two coordinates or more; ``None`` where
    there are none, for a network (whose descent is kept whole) and without the adaptive
    warm-up."""
    if not settings.adaptive or network:
        return None
    device = data_device(args, kwargs)
    children = find_scale_parents(structure, args, kwargs, gibbs_sites, device)
    offsets = dict(zip(layout.names, itertools.accumulate([0, *layout.sizes]), strict=False))
    sizes = dict(zip(layout.names, layout.sizes, strict=True))
    watch = [
        torch.arange(offsets[name], offsets[name] + sizes[name], device=device)
        for name in children
        if sizes.get(name, 0) >= 2
    ]
    return watch or None


def _chain_randomness(
    settings: SamplerSettings,
    options: Any,
    args: tuple,
    kwargs: Mapping[str, Any],
    chains: Sequence[int],
) -> tuple[list[int], list[torch.Generator]]:
    """The chains' seeds and generators (on the data's device); with ``data_parallel``, the
    seed agreed when the process group starts."""
    seed = settings.seed
    if settings.data_parallel:
        seed = start_data_parallel(settings, options, args, kwargs, chains)
    seeds = chain_seeds(seed, chains)
    generators = chain_generators(seeds, data_device(args, kwargs))
    return seeds, generators


def _potential(
    settings: SamplerSettings,
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    transforms: Mapping[str, Transform],
    layout: FlatLayout,
    structure: ModelStructure,
    initial: Mapping[str, torch.Tensor],
) -> Potential:
    """The potential of ``settings.potential`` over the dynamic sites, compiled if asked."""
    potential = make_potential(
        settings.potential,
        model,
        args,
        kwargs,
        transforms,
        layout,
        structure.plate,
        initial,
        structure.sample_sites,
    )
    if settings.compile:
        potential.compile()
    return potential


def _gradient_estimator(
    settings: SamplerSettings,
    potential: Potential,
    layout: FlatLayout,
    first: Mapping[str, torch.Tensor] | None,
    transforms: Mapping[str, Transform],
    num_chains: int,
    batch_size: int,
    structure: ModelStructure,
    updates: Sequence[GibbsUpdate],
) -> MinibatchGradient | DataParallelGradient:
    """The gradient estimator: ``settings.control_variate`` (``"auto"`` keeps a control variate
    only for the adaptive warm-up on minibatches of a model without Gibbs updates, outside
    ``data_parallel``), wrapped to average over processes under ``data_parallel``."""
    estimator = _estimator(settings, potential, layout, first, transforms, num_chains)
    if settings.control_variate == "auto" and not (
        settings.adaptive
        and batch_size < structure.num_data
        and not updates
        and not settings.data_parallel
    ):
        estimator = MinibatchGradient(potential)
    if settings.data_parallel:
        estimator = DataParallelGradient(estimator, structure.num_data, batch_size)
    return estimator


def _thinning(
    settings: SamplerSettings, warmup_draws: int, network: bool
) -> tuple[int | None, int, ThinningMeter | None]:
    """Steps per kept draw (``None``: the adaptive warm-up chooses it), steps per warm-up draw,
    and the meter that measures the thinning when the warm-up chooses it (on the potential for
    a ``network``)."""
    # the adaptive warm-up chooses the thinning; a hand-given step keeps one step per draw
    thinning = settings.num_steps_per_sample or (None if settings.adaptive else 1)
    steps_per_draw = thinning or warmup_steps_per_draw(warmup_draws)
    meter = None
    if thinning is None:
        meter = ThinningMeter(warmup_draws * steps_per_draw, network)
    return thinning, steps_per_draw, meter


def _divergence_monitor(
    settings: SamplerSettings,
    algorithm: Algorithm,
    num_chains: int,
    layout: FlatLayout,
    chains: Sequence[int],
) -> DivergenceMonitor:
    """The monitor that stops the chains after too many divergences in a row or a blow-up."""
    return DivergenceMonitor(
        num_chains,
        settings.max_consecutive_divergences,
        algorithm.label,
        BlowUpDetector(num_chains, dimension=layout.dimension),
        [int(c) for c in chains],
        adaptive=settings.adaptive,
    )


def data_device(args: tuple, kwargs: Mapping[str, Any]) -> torch.device:
    """The device of the first tensor among the model's arguments (the CPU without one): where
    the chains' generators, minibatch rows and noise live."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _check_data_dtypes(args: tuple, kwargs: Mapping[str, Any], dtype: torch.dtype) -> None:
    """Floating data must have the dtype of the latent sites (mixing them fails mid-run)."""
    if (mismatch := dtype_mismatch(args, kwargs, dtype)) is not None:
        raise TypeError(mismatch)


def _inspect(model, args, kwargs, settings: SamplerSettings) -> ModelStructure:
    """The model's structure (its one run on all rows; run under a forked generator, so it may
    stop a ``PyroModule`` early, see :func:`~pyro_sgmcmc.models.structure.inspect_model`)."""
    try:
        return inspect_model(
            model, args, kwargs, settings.subsample_plate, settings.data_args, stop_early=True
        )
    except ModelContractError:
        raise
    except (IndexError, RuntimeError, TypeError) as error:
        if isinstance(error, NotImplementedError):
            _refuse_a_prior_without_sampler(model, args, kwargs, error)
        raise data_mismatch(
            model, args, kwargs, settings.subsample_plate, error, "run(...)"
        ) from error


class _LastSampleSite(Messenger):
    """Records the name and distribution of each sample site as the model reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.name: str | None = None
        self.fn: Any = None

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        self.name, self.fn = msg["name"], msg["fn"]


def _refuse_a_prior_without_sampler(model, args, kwargs, error: NotImplementedError) -> None:
    """A latent site whose prior cannot draw (``ImproperUniform``) stops the model's first run:
    name the site and what works instead (a proper prior)."""
    last = _LastSampleSite()
    try:
        with torch.random.fork_rng(devices=[]), last:
            model(*args, **kwargs)
    except NotImplementedError:
        pass
    if last.name is None or last.fn is None:
        return
    try:
        with torch.random.fork_rng(devices=[]):
            last.fn.sample()
        return  # that site's prior draws: the error came from elsewhere in the model
    except NotImplementedError:
        pass
    prior = type(last.fn).__name__
    raise ModelContractError(
        f"the prior of latent site {last.name!r}, {prior}, cannot draw a value "
        f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). The "
        "kernels run the model forward to find its sites, shapes and data plate, which draws "
        f"every latent site from its prior. Give {last.name!r} a proper prior on the same "
        "support (e.g. dist.Normal(0.0, 100.0) for the real line, dist.HalfNormal(100.0) for a "
        "positive scale), which is as flat where the likelihood has its mass"
    ) from error


def resolve_gibbs_updates(
    spec: Sequence[GibbsUpdate] | str | None,
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    structure: ModelStructure,
) -> list[GibbsUpdate]:
    """The Gibbs blocks: given, declared by the model (``model.gibbs_updates()``), or found in its
    trace (``"auto"``, :func:`find_gibbs_updates`); ``None`` for none. Their sites must be latent,
    and some latent site must be left for the SG dynamics."""
    if spec is None:
        updates: list[GibbsUpdate] = []
    elif spec == "auto":
        factory = getattr(model, "gibbs_updates", None)
        updates = list(
            factory() if callable(factory) else find_gibbs_updates(model, args, kwargs, structure)
        )
    else:
        updates = list(spec)
    sites = {site for update in updates for site in update.sites}
    unknown = sites - set(structure.latent_sites)
    if unknown:
        raise ValueError(f"gibbs_updates name sites that are not latent: {sorted(unknown)}")
    if updates and sites >= set(structure.latent_sites):
        raise ValueError("every latent site is Gibbs-updated: nothing is left for SG-MCMC")
    return updates


def find_gibbs_updates(
    model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any], structure: ModelStructure
) -> list[GibbsUpdate]:
    """The Normal-Gamma pairs of ``model`` (see
    :func:`~pyro_sgmcmc.models.conjugate.find_normal_gamma_updates`), found on the set-up rows
    (:meth:`~pyro_sgmcmc.models.structure.DataPlate.bind_for_setup`): the latent sites, between
    which they are found, are the same on any rows.

    A plate that subsamples itself runs as it is: it evaluates only its own subsample anyway,
    and the draw of that subsample leaves torch's global generator (which this search uses,
    unforked) in the state that later seeds expect.
    """
    plate = structure.plate
    if plate.subsample_size is None:
        model, args, kwargs = plate.bind_for_setup(model, args, kwargs)
    return find_normal_gamma_updates(model, *args, **kwargs)


def initial_values(
    model: Callable[..., Any],
    args: tuple,
    kwargs: Mapping[str, Any],
    settings: SamplerSettings,
    seeds: Sequence[int],
    given: Mapping[str, torch.Tensor] | None,
    structure: ModelStructure,
    at_mean: set[str] | frozenset[str] = frozenset(),
) -> tuple[TensorDict, dict[str, Transform]]:
    """Unconstrained ``(C, ...)`` starts: ``given`` where given, else the init strategy run under
    each chain's seed (over-dispersed starts, which R-hat needs); and the transforms.

    The sites in ``at_mean`` (the Gibbs-updated ones) start at their prior mean: a noise
    precision drawn at random would weigh the likelihood arbitrarily until the first Gibbs
    update, and one of :math:`e^{-2}` makes a network far from any fit look like noise.
    """
    strategy = _mean_for(at_mean, settings.init_strategy) if at_mean else settings.init_strategy
    model, args, kwargs = structure.plate.bind_for_setup(model, args, kwargs)
    starts: list[TensorDict] = []
    transforms = site_transforms(structure, settings)
    device = data_device(args, kwargs)
    for seed in seeds:
        with seeded(seed, device):
            initial, _, _, _ = initialize_model(
                model,
                model_args=args,
                model_kwargs=kwargs,
                transforms=transforms,
                init_strategy=strategy,
            )
        starts.append({k: v.detach() for k, v in initial.items()})
    stacked = {name: torch.stack([s[name] for s in starts]) for name in structure.latent_sites}
    for name, value in (given or {}).items():
        stacked[name] = _given_start(name, value, stacked, structure)
    return stacked, dict(transforms)


def _mean_for(sites: set[str] | frozenset[str], otherwise: Callable) -> Callable:
    """An init strategy: the prior mean for ``sites``, ``otherwise`` for the others."""
    at_mean = init_to_mean(fallback=init_to_median)

    def strategy(site):
        return at_mean(site) if site["name"] in sites else otherwise(site)

    return strategy


def site_transforms(structure: ModelStructure, settings: SamplerSettings) -> dict[str, Transform]:
    """Each latent site's constrained-to-unconstrained transform: the user's
    (``settings.transforms``, refused if it names a site that is not latent), else Pyro's."""
    transforms = default_transforms(structure)
    unknown = sorted(set(settings.transforms or {}) - set(structure.latent_sites))
    if unknown:
        raise ValueError(
            f"transforms names {unknown}, which are not latent sites of the model; its latent "
            f"sites are {list(structure.latent_sites)}"
        )
    transforms.update(settings.transforms or {})
    return transforms


def model_transforms(
    settings: SamplerSettings, model: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]
) -> tuple[ModelStructure, dict[str, Transform]]:
    """The model's structure and its latent sites' transforms, from one run of the model on
    ``args, kwargs`` (under a forked generator: the caller's random state is untouched) --
    what a driver that only maps draws back to the constrained space needs, without a chain."""
    args, kwargs = as_tensor_arguments(tuple(args), dict(kwargs))
    with seeded(0 if settings.seed is None else settings.seed, data_device(args, kwargs)):
        structure = _inspect(model, args, kwargs, settings)
    return structure, site_transforms(structure, settings)


def default_transforms(structure: ModelStructure) -> dict[str, Transform]:
    """Pyro's constrained-to-unconstrained transform of each latent site,
    ``biject_to(support).inv``."""
    return {
        name: biject_to(structure.trace.nodes[name]["fn"].support).inv
        for name in structure.latent_sites
    }


def _given_start(
    name: str, value: torch.Tensor, stacked: TensorDict, structure: ModelStructure
) -> torch.Tensor:
    if name not in stacked:
        raise ValueError(
            f"initial_params has site {name!r}, which is not latent; latent sites: "
            f"{sorted(stacked)}"
        )
    expected = stacked[name].shape
    value = torch.as_tensor(value, dtype=stacked[name].dtype, device=stacked[name].device)
    if value.shape == expected[1:]:
        value = value.expand(expected)
    if value.shape != expected:
        site = structure.trace.nodes[name]
        unconstrained = biject_to(site["fn"].support).inv(site["value"]).shape
        raise ValueError(
            f"initial_params[{name!r}] must have the site's unconstrained shape "
            f"{tuple(unconstrained)} (or {tuple(expected)} with a leading chain axis), got "
            f"{tuple(value.shape)}"
        )
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"initial_params[{name!r}] contains NaN or infinite values")
    return value.clone()


def _first_chain_start(
    model, args, kwargs, settings, seeds, chains, structure, initial, gibbs_sites
):
    """Chain 0's starting values, ``(1, ...)`` per site: where the control-variate centre search
    starts, whichever chains this engine runs (so the centre does not depend on the driver)."""
    chains = list(chains)
    if settings.control_variate is not True or 0 in chains:
        index = chains.index(0) if 0 in chains else 0
        return {name: value[index : index + 1] for name, value in initial.items()}
    first = chain_seeds(settings.seed, [0]) if settings.seed is not None else seeds[:1]
    start, _ = initial_values(model, args, kwargs, settings, first, None, structure, gibbs_sites)
    return start


def _estimator(settings, potential, layout, start, transforms, num_chains):
    """The gradient estimator; ``start`` holds chain 0's ``(1, ...)`` starting values."""
    if settings.control_variate is False:
        return MinibatchGradient(potential)
    if settings.control_variate == "auto":
        return AutoControlVariate(potential, settings.chunk_size)
    if settings.control_variate is True:
        fixed = {name: value for name, value in start.items() if name not in layout.names}
        centre = find_centre(
            potential,
            layout.flatten(start)[0],
            fixed,
            settings.chunk_size,
            settings.centre_iterations,
        )
    else:
        centre = _given_centre(settings.control_variate, layout, transforms, start)
    return ControlVariateGradient(potential, centre, num_chains, settings.chunk_size)


def _given_centre(
    values: Mapping[str, Any],
    layout: FlatLayout,
    transforms: Mapping[str, Transform],
    like: Mapping[str, torch.Tensor],
) -> torch.Tensor:
    dtype, device = next(iter(like.values())).dtype, next(iter(like.values())).device
    missing = set(layout.names) - set(values)
    extra = set(values) - set(layout.names)
    if missing or extra:
        raise ValueError(
            f"control_variate must give a centre value for exactly the sampled sites "
            f"{list(layout.names)}; missing {sorted(missing)}, unknown {sorted(extra)}"
        )
    parts = []
    for name, shape in layout.shapes.items():
        value = torch.as_tensor(values[name], dtype=dtype, device=device)
        if value.shape != shape:
            raise ValueError(
                f"control_variate[{name!r}] must have the site's shape {tuple(shape)}, got "
                f"{tuple(value.shape)}"
            )
        parts.append(transforms[name](value).reshape(-1))
    return torch.cat(parts).detach()


def _gibbs_blocks(settings, updates, potential, generators, args, kwargs, batches):
    if not updates:
        return None
    if settings.temperature != 1.0 and not all(supports_temperature(u) for u in updates):
        warnings.warn(
            f"temperature={settings.temperature} with Gibbs updates that do not support "
            "temperature: those blocks draw from their untempered (T = 1) conditionals",
            stacklevel=4,
        )
    period = settings.gibbs_every or max(batches.batches_per_epoch, 1)
    return GibbsBlocks(updates, potential, generators, args, kwargs, settings.temperature, period)


def make_control(
    settings: SamplerSettings,
    algorithm: Algorithm,
    options: Any,
    batches: Minibatcher,
    warmup_steps: int,
    warmup: int,
    like: torch.Tensor,
    network: bool = False,
    watch: list[torch.Tensor] | None = None,
) -> StepControl:
    """The step-size control: the user's schedule, or (no step size given) the adaptive warm-up
    (:mod:`pyro_sgmcmc.engine.adaptation`) over ``warmup_steps`` gradient steps; for constant
    SGD with ``optimal_rate``, either of them during the ``warmup`` draws of warm-up and Mandt
    et al.'s rate after. ``network``: the model is a network (SGHMC's friction on full-batch
    gradients); ``watch``: the coordinates the adaptive warm-up's descent watches for a funnel
    (:func:`_funnel_watch`)."""
    num_data = batches.num_data
    if settings.adaptive:
        rule = "sgld" if algorithm.name == "constant_sgd" else algorithm.name
        dense = algorithm.name in ("sgld", "sghmc", "psgld") and like.shape[1] <= DENSE_LIMIT
        control: StepControl = AdaptiveControl(
            rule, options, settings.temperature, num_data, warmup_steps, like,
            dense=dense, adapt_friction=getattr(options, "adapt_friction", False),
            full_batch_network=network and batches.full_batch, watch=watch,
        )  # fmt: skip
    else:
        scale = 1.0 / num_data if settings.per_datum else 1.0
        control = ScheduleControl(settings.schedule, scale)
    if algorithm.name != "constant_sgd" or not options.optimal_rate:
        return control
    if warmup < 2:
        raise ValueError(
            "ConstantSGD(optimal_rate=True) estimates the gradient noise during warm-up: "
            f"warmup_steps must be >= 2, got {warmup}"
        )
    if batches.full_batch:
        raise ValueError("ConstantSGD(optimal_rate=True) needs minibatches: batch_size must be < N")
    return MandtRateControl(
        control, warmup, diagonal=options.preconditioner == "diagonal",
        multiplier=options.rate_multiplier,
    )  # fmt: skip
