r"""Checkpoint, resume and extend SG-MCMC runs, and keep what was drawn when a run is interrupted.

:class:`ResumableMCMC` is a ``pyro.infer.MCMC`` that runs its chains one after the other in this
process, with the same loop as Pyro's sequential sampler (``kernel.setup``, then one
``kernel.sample`` per warm-up draw and per kept draw, the hook after each), and

* writes a checkpoint file every ``checkpoint_every`` draws and/or ``checkpoint_seconds`` seconds,
  at the end of each chain and when it is interrupted (Ctrl-C);
* continues from such a file (:meth:`ResumableMCMC.resume`, or ``run(..., resume_from=path)``)
  so that the continued run is **bit-identical** to one that was never interrupted: same draws,
  same diagnostics;
* continues a finished run for more draws (:meth:`ResumableMCMC.extend`), again bit-identical
  to a run asked for the larger number of draws from the start.

After a run, ``get_samples()``, ``diagnostics()``, ``summary()``, ``arviz.from_pyro`` and
:func:`pyro_sgmcmc.to_inference_data` work as for ``pyro.infer.MCMC``.

What a checkpoint holds
-----------------------
A dictionary written with :func:`torch.save`: the format name and version
(:data:`FORMAT_VERSION`), the run's settings (``num_samples``, ``warmup_steps``, ``num_chains``),
the signature of the kernel and model (kernel class and hyper-parameters; names, shapes and
dtypes of the latent sites; observed sites; data size), a fingerprint of the data (BLAKE2b of
the tensors given to ``run``), for each chain its kept draws (unconstrained), its diagnostics
and the kernel's complete state (:meth:`~pyro_sgmcmc.StochasticGradientKernel.state_dict`:
position, momenta, preconditioner statistics, step counter, hence schedule position, minibatch
order, the generator's state, divergence bookkeeping, per-draw statistics), and the global random
states of torch, NumPy and Python (the kernels draw their chain seeds from torch's when
``seed=None``). It holds only tensors and plain Python values and is read back with
``torch.load(..., weights_only=True)``, which unpickles no arbitrary objects. Files are written
to a temporary file in the same directory, flushed to disk (``fsync``) and renamed over the
target (``os.replace``), so the file on disk is always a complete checkpoint.

Each checkpoint rewrites every draw kept so far; with very many draws, checkpoint less often
(``checkpoint_seconds``) or thin more (``num_steps_per_sample``).
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from pyro.infer.mcmc.api import MCMC, AbstractMCMC
from pyro.infer.mcmc.logger import ProgressBar
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel
from pyro.util import optional

from .._validation import check_positive_int
from ..engine.distributed import writes_checkpoints
from ..engine.mcmc_layout import constrained_as_mcmc
from ..errors import CheckpointError
from .checkpoint_files import (
    FORMAT_NAME,
    FORMAT_VERSION,
    CheckpointPolicy,
    check_writable_path,
    data_fingerprint,
    deferred_interrupt,
    global_rng_state,
    load_checkpoint,
    restore_state,
    save_checkpoint,
    set_global_rng_state,
)

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "ResumableMCMC",
    "data_fingerprint",
    "load_checkpoint",
    "save_checkpoint",
]

TensorDict = dict[str, torch.Tensor]
#: What a checkpoint of :class:`ResumableMCMC` must hold.
_REQUIRED = ("format", "format_version", "signature", "data_fingerprint", "run", "chains", "rng")
#: What its ``run`` entry and each entry of its ``chains`` must hold.
_RUN_ENTRIES = ("num_samples", "warmup_steps", "num_chains", "initial_params", "save_params",
                "draw_dtype")  # fmt: skip
_CHAIN_ENTRIES = ("draws", "diagnostics", "kernel_state")


def _check_entries(payload: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Refuse a checkpoint whose ``run`` or ``chains`` entries were edited (named in the error),
    instead of failing on them later with a bare ``KeyError``."""
    where = str(path)
    run = payload["run"]
    if not isinstance(run, Mapping):
        raise CheckpointError(f"{where!r}: its 'run' entry is not a dict: it was edited")
    missing = [name for name in _RUN_ENTRIES if name not in run]
    if missing:
        raise CheckpointError(f"{where!r} lacks the entries {missing} of 'run': it was edited")
    chains = payload["chains"]
    if not isinstance(chains, list | tuple) or len(chains) != run["num_chains"]:
        raise CheckpointError(
            f"{where!r}: its 'chains' entry should list num_chains={run['num_chains']} chains: "
            "it was edited"
        )
    for chain, saved in enumerate(chains):
        missing = [n for n in _CHAIN_ENTRIES if not isinstance(saved, Mapping) or n not in saved]
        if missing:
            raise CheckpointError(
                f"{where!r} lacks the entries {missing} of chains[{chain}]: it was edited"
            )


# ---------------------------------------------------------------------- the driver
class ResumableMCMC(MCMC):
    r"""``pyro.infer.MCMC`` for SG-MCMC kernels with checkpoints, resumption and extension.

    Chains run one after the other in this process (SG-MCMC chains are cheap per step, and a
    checkpoint needs the whole state in one place). The run is reproducible exactly as with
    ``pyro.infer.MCMC`` on one core: seed the kernel (``seed=``) or call ``pyro.set_rng_seed``.

    Parameters
    ----------
    kernel:
        An SG-MCMC kernel (:class:`~pyro_sgmcmc.SGLD`, :class:`~pyro_sgmcmc.SGHMC`,
        :class:`~pyro_sgmcmc.PSGLD`, :class:`~pyro_sgmcmc.ConstantSGD`) or any kernel with
        ``state_dict``, ``load_state_dict``, ``signature`` and ``current_params``.
    num_samples:
        Kept draws per chain, ``>= 1``.
    warmup_steps:
        Discarded draws per chain before those, ``>= 0`` (default ``num_samples``, as Pyro).
    initial_params, num_chains, hook_fn, disable_progbar, disable_validation, transforms,
    save_params:
        As in ``pyro.infer.MCMC``. ``num_chains`` may exceed the number of CPUs.
    checkpoint_path:
        File to write checkpoints to (its directory must exist and be writable); ``None``
        writes none (the draws are still kept when interrupted).
    checkpoint_every:
        Write a checkpoint after every so many draws (warm-up included), ``>= 1``.
    checkpoint_seconds:
        Write a checkpoint when this many seconds have passed since the last one, ``> 0``.
        With a ``checkpoint_path`` and neither option, a checkpoint is written every 60 s.
    overwrite:
        Allow ``checkpoint_path`` to replace an existing file that is not a checkpoint, or the
        checkpoint of another run (refused otherwise, with :class:`CheckpointError`, so that
        nothing is lost by a mistyped path). Resuming from ``checkpoint_path`` needs no
        permission.
        Checkpoints are also written at the end of each chain and on interruption.
    draw_dtype:
        Store the kept draws in this floating dtype (e.g. ``torch.float16`` to quarter the
        memory of float64 draws); the chain itself runs at full precision. ``None`` (default)
        stores them as they are. Pair it with the kernel's ``keep_draws=False``.

    Examples
    --------
    >>> mcmc = ResumableMCMC(SGLD(model, step_size=1e-4, seed=0), num_samples=1000,
    ...                      checkpoint_path="run.ckpt", checkpoint_every=100)  # doctest: +SKIP
    >>> mcmc.run(x, y)              # Ctrl-C keeps the draws and leaves run.ckpt  # doctest: +SKIP
    >>> mcmc = ResumableMCMC.resume("run.ckpt", SGLD(model, step_size=1e-4, seed=0), x, y)
    ... # doctest: +SKIP
    >>> mcmc.extend(500)            # 500 more draws per chain  # doctest: +SKIP
    """

    def __init__(
        self,
        kernel: MCMCKernel,
        num_samples: int,
        warmup_steps: int | None = None,
        initial_params: Mapping[str, torch.Tensor] | None = None,
        num_chains: int = 1,
        hook_fn: Callable | None = None,
        disable_progbar: bool = False,
        disable_validation: bool | None = True,
        transforms: Mapping | None = None,
        save_params: list[str] | None = None,
        *,
        checkpoint_path: str | os.PathLike | None = None,
        checkpoint_every: int | None = None,
        checkpoint_seconds: float | None = None,
        draw_dtype: torch.dtype | None = None,
        overwrite: bool = False,
    ) -> None:
        required = ("setup", "sample", "state_dict", "load_state_dict", "signature")
        missing = [name for name in required if not callable(getattr(kernel, name, None))]
        if missing:
            raise TypeError(
                f"kernel must be an SG-MCMC kernel with {', '.join(required)} (e.g. "
                f"pyro_sgmcmc.SGLD); {type(kernel).__name__} lacks {', '.join(missing)}"
            )
        num_samples = check_positive_int("num_samples", num_samples)
        warmup_steps = num_samples if warmup_steps is None else warmup_steps
        warmup_steps = check_positive_int("warmup_steps", warmup_steps, minimum=0)
        num_chains = check_positive_int("num_chains", num_chains)
        if hook_fn is not None and not callable(hook_fn):
            raise TypeError(f"hook_fn must be callable, got {type(hook_fn).__name__}")
        self._checkpoints = CheckpointPolicy(
            checkpoint_path, checkpoint_every, checkpoint_seconds, overwrite
        )
        self._checkpoints.writer = writes_checkpoints(getattr(kernel, "settings", None))
        if draw_dtype is not None and not (
            isinstance(draw_dtype, torch.dtype) and draw_dtype.is_floating_point
        ):
            raise TypeError(
                f"draw_dtype must be None or a floating torch.dtype such as torch.float16, "
                f"got {draw_dtype!r}"
            )
        AbstractMCMC.__init__(self, kernel, num_chains, transforms)
        self.num_samples = num_samples
        self.warmup_steps = warmup_steps
        self.disable_validation = disable_validation
        self.disable_progbar = disable_progbar
        self.hook_fn = hook_fn
        if save_params is not None:
            kernel.save_params = list(save_params)
        if initial_params:
            initial_params = {k: torch.as_tensor(v) for k, v in initial_params.items()}
            if num_chains > 1:
                self._validate_initial_params(initial_params)
            else:
                initial_params = {k: v.unsqueeze(0) for k, v in initial_params.items()}
        self.initial_params = initial_params or None
        self.draw_dtype = draw_dtype
        #: ``True`` after a run stopped on KeyboardInterrupt (the draws so far are kept).
        self.interrupted = False
        self._samples = None
        self._args: tuple | None = None
        self._kwargs: dict | None = None
        self._fingerprint: str | None = None
        self._reset_progress()

    @property
    def checkpoint_path(self):
        """The checkpoint file (a :class:`~pathlib.Path`), or ``None``."""
        return self._checkpoints.path

    def _reset_progress(self) -> None:
        self._chain_draws: list[list[TensorDict]] = [[] for _ in range(self.num_chains)]
        self._chain_states: list[dict | None] = [None] * self.num_chains
        self._diagnostics = [None] * self.num_chains
        self._current_chain = 0
        self._consistent = True

    # ------------------------------------------------------------------ public API
    @poutine.block
    def run(self, *args, resume_from: str | os.PathLike | None = None, **kwargs) -> None:
        """Run the chains, or continue the run saved in ``resume_from``.

        Parameters
        ----------
        *args, **kwargs:
            The model's data, as for ``pyro.infer.MCMC.run``; when resuming, the same data as
            the saved run (checked against its fingerprint).
        resume_from:
            A checkpoint written by a run with the same kernel (class and hyper-parameters),
            model, data, ``num_samples``, ``warmup_steps`` and ``num_chains``.

        Raises
        ------
        KeyboardInterrupt
            Re-raised after Ctrl-C (or a hook raising it): the draws so far stay on the object
            (:meth:`collected_samples`) and, with a ``checkpoint_path``, a checkpoint of the
            last complete draw is on disk.
        CheckpointError
            If ``resume_from`` does not belong to this run.
        """
        args = tuple(a.detach() if torch.is_tensor(a) else a for a in args)
        self._args, self._kwargs = args, kwargs
        self._fingerprint = data_fingerprint(args, kwargs, getattr(self.kernel, "model", None))
        self._samples = None
        self.interrupted = False
        self._consistent = True
        restore_rng = None
        self._checkpoints.check_fresh_run(resume_from)
        if resume_from is None:
            self._reset_progress()
            start_run = getattr(self.kernel, "start_run", None)
            if start_run is not None:  # a kernel object run before: its chains from 0 again
                start_run()
        else:
            restore_rng = self._restore(load_checkpoint(resume_from, _REQUIRED), resume_from)
        self._sample_chains(restore_rng)

    @classmethod
    def resume(
        cls,
        path: str | os.PathLike,
        kernel,
        *args,
        hook_fn: Callable | None = None,
        disable_progbar: bool = False,
        checkpoint_path: str | os.PathLike | None = None,
        overwrite: bool = False,
        **kwargs,
    ) -> ResumableMCMC:
        """Continue the run saved in ``path`` to its end and return it.

        The settings (``num_samples``, ``warmup_steps``, ``num_chains``, checkpoint frequency,
        ``draw_dtype``, ``save_params``, ``initial_params``) are read from the file; ``kernel``
        must be built as the saved one (same class and hyper-parameters) on the same model,
        and ``*args, **kwargs`` are the same data. Checkpoints go on to ``checkpoint_path``
        (default: ``path`` itself), which ``overwrite=True`` lets replace a file that is not
        this run's checkpoint (as in the constructor).
        """
        payload = load_checkpoint(path, _REQUIRED)
        _check_entries(payload, path)
        settings = payload["run"]
        mcmc = cls(
            kernel,
            num_samples=settings["num_samples"],
            warmup_steps=settings["warmup_steps"],
            num_chains=settings["num_chains"],
            initial_params=settings["initial_params"],
            hook_fn=hook_fn,
            disable_progbar=disable_progbar,
            save_params=settings["save_params"],
            checkpoint_path=path if checkpoint_path is None else checkpoint_path,
            checkpoint_every=settings.get("checkpoint_every"),
            checkpoint_seconds=settings.get("checkpoint_seconds"),
            draw_dtype=getattr(torch, settings["draw_dtype"]) if settings["draw_dtype"] else None,
            overwrite=overwrite,
        )
        if mcmc.initial_params is not None and settings["num_chains"] == 1:
            mcmc.initial_params = settings["initial_params"]
        mcmc.run(*args, resume_from=path, **kwargs)
        return mcmc

    @poutine.block
    def extend(self, num_samples: int) -> None:
        """Draw ``num_samples`` more kept draws per chain, continuing each chain where it ended.

        The result is bit-identical to a run asked for the larger number of draws from the
        start. Checkpoints and interruption behave as in :meth:`run`.
        """
        num_samples = check_positive_int("num_samples", num_samples)
        if self._args is None or not all(map(self._chain_complete, range(self.num_chains))):
            raise RuntimeError(
                "extend() continues a finished run: call run(...) (or resume) to the end first"
            )
        self.num_samples += num_samples
        self._samples = None
        self.interrupted = False
        self._sample_chains(None)

    def collected_samples(self) -> list[TensorDict]:
        """The kept draws so far, constrained, one dict per chain that has any (site -> tensor
        with the draws along the first dimension). Useful after an interruption."""
        transforms = self._transforms()
        result = []
        for draws in self._chain_draws:
            if draws:
                result.append(
                    {
                        name: self._constrain(
                            name, torch.stack([d[name] for d in draws]), transforms
                        )
                        for name in draws[0]
                    }
                )
        return result

    def save_checkpoint(self, path: str | os.PathLike | None = None) -> None:
        """Write a checkpoint of the run as it stands (after :meth:`run`, or after it was
        interrupted) to ``path`` (default: ``checkpoint_path``)."""
        target = self.checkpoint_path if path is None else check_writable_path(path, "path")
        if target is None:
            raise ValueError("give a path: this run has no checkpoint_path")
        if self._args is None:
            raise RuntimeError("nothing to save: call run(...) first")
        if not self._consistent:
            raise RuntimeError(
                "the run was interrupted inside a draw, where its state cannot be saved; resume "
                "from the last checkpoint file instead"
            )
        save_checkpoint(self._payload(None), target)

    # ------------------------------------------------------------------ the loop
    def _sample_chains(self, restore_rng: Mapping[str, Any] | None) -> None:
        with optional(
            pyro.validation_enabled(not self.disable_validation),
            self.disable_validation is not None,
        ):
            with deferred_interrupt() as interrupt:
                for chain in range(self.num_chains):
                    if self._chain_complete(chain):
                        continue
                    self._run_chain(chain, interrupt, restore_rng)
                    restore_rng = None
        if restore_rng is not None:
            set_global_rng_state(restore_rng)
        self._finalize()

    def _total_draws(self) -> int:
        return self.warmup_steps + self.num_samples

    def _chain_complete(self, chain: int) -> bool:
        state = self._chain_states[chain]
        return (
            state is not None
            and state["num_draws"] >= self._total_draws()
            and self._diagnostics[chain] is not None
        )

    def _setup_quietly(self) -> None:
        """``kernel.setup`` without touching the global random state (to load a saved state)."""
        with torch.random.fork_rng(devices=[]):
            self.kernel.setup(self.warmup_steps, *self._args, **self._kwargs)

    def _start_chain(self, chain: int, restore_rng: Mapping[str, Any] | None):
        """Set the kernel up for ``chain``, fresh or from its saved state; return the params."""
        kernel = self.kernel
        saved = self._chain_states[chain]
        if saved is not None:
            self._setup_quietly()
            draws = self._chain_draws[chain] if self.draw_dtype is None else []
            kernel.load_state_dict({**saved, "draws": draws})
            if restore_rng is not None:
                set_global_rng_state(restore_rng)
            return kernel.current_params
        if chain > 0 and restore_rng is not None:
            # A fresh kernel object: count the earlier chains' setups as the saved run did.
            self._setup_quietly()
            kernel.load_state_dict(self._chain_states[chain - 1])
            kernel.cleanup()
        if restore_rng is not None:
            set_global_rng_state(restore_rng)
        if self.initial_params is not None:
            kernel.initial_params = {k: v[chain] for k, v in self.initial_params.items()}
        kernel.setup(self.warmup_steps, *self._args, **self._kwargs)
        return kernel.initial_params

    def _run_chain(
        self, chain: int, interrupt: threading.Event, restore_rng: Mapping[str, Any] | None
    ) -> None:
        kernel = self.kernel
        saved = self._chain_states[chain]
        done = saved["num_draws"] if saved is not None else 0
        params = self._start_chain(chain, restore_rng)
        self._chain_states[chain] = None
        self._diagnostics[chain] = None
        self._current_chain = chain
        save_params = getattr(kernel, "save_params", None)
        tag = f" [{chain}]" if self.num_chains > 1 else ""
        bar = ProgressBar(self.warmup_steps, self.num_samples, disable=self.disable_progbar)
        bar.update(done)
        at_boundary = True
        try:
            for index in range(done, self._total_draws()):
                at_boundary = False
                params = kernel.sample(params)
                warmup = index < self.warmup_steps
                if not warmup:
                    self._chain_draws[chain].append(self._stored(params, save_params))
                at_boundary = True
                stage = "Warmup" if warmup else "Sample"
                bar.set_description(stage + tag, refresh=False)
                bar.set_postfix(kernel.logging(), refresh=False)
                bar.update()
                if self.hook_fn is not None:
                    local = index if warmup else index - self.warmup_steps
                    self.hook_fn(kernel, params, stage + tag, local)
                if interrupt.is_set():
                    raise KeyboardInterrupt
                if self._checkpoints.due(index + 1):
                    self._checkpoints.write(self._payload(kernel))
        except KeyboardInterrupt:
            self._on_interrupt(chain, at_boundary)
            raise
        finally:
            bar.close()
        judged_here = self._judges_the_run(kernel)
        kernel.run_judged_by_driver = judged_here
        try:
            self._diagnostics[chain] = kernel.diagnostics()
        finally:
            kernel.run_judged_by_driver = False
        if judged_here and chain == self.num_chains - 1:
            self._judge_the_run(kernel, params)
        self._chain_states[chain] = kernel.state_dict(include_draws=False)
        kernel.cleanup()
        self._checkpoints.write(self._payload(None))

    @staticmethod
    def _judges_the_run(kernel) -> bool:
        """Whether this driver judges the run (every chain's draws, those restored from a
        checkpoint included) instead of the kernel, which sees the chains it ran: for kernels
        that can judge draws, when every site is stored (``save_params`` keeps all)."""
        return callable(getattr(kernel, "judge_draws", None)) and not getattr(
            kernel, "save_params", None
        )

    def _judge_the_run(self, kernel, params: Mapping[str, torch.Tensor]) -> None:
        """Warn with the verdict on every chain's draws, at the end of the last chain (the
        kernel still set up on the data), as ``pyro.infer.MCMC``'s sequential runs do."""
        counts = {len(draws) for draws in self._chain_draws}
        if len(counts) != 1 or 0 in counts:
            return
        stacked = {
            name: torch.stack(
                [torch.stack([draw[name] for draw in draws]) for draws in self._chain_draws]
            ).to(params[name].dtype)  # draws stored in a lower precision (draw_dtype)
            for name in params
        }
        reports = [d for d in self._diagnostics if isinstance(d, dict)]  # a chain's report
        kernel.judge_draws(
            kernel.constrain_draws(stacked),
            several=self.num_chains > 1,
            reports=reports if len(reports) == self.num_chains else [],
        )

    def _on_interrupt(self, chain: int, at_boundary: bool) -> None:
        """Keep the chain's state (and write a checkpoint) if the interrupt came between draws."""
        self.interrupted = True
        if at_boundary:
            self._chain_states[chain] = self.kernel.state_dict(include_draws=False)
        else:
            self._consistent = False
        where = "no checkpoint_path was given"
        if self.checkpoint_path is not None:
            if at_boundary:
                self._checkpoints.write(self._payload(None))
                where = f"a checkpoint of it is in {str(self.checkpoint_path)!r}"
            else:
                where = (
                    f"the interrupt came inside a draw; the last checkpoint in "
                    f"{str(self.checkpoint_path)!r} is older"
                )
        warnings.warn(
            f"interrupted in chain {chain} after {len(self._chain_draws[chain])} kept draws "
            f"of that chain; {where}. The kept draws are in collected_samples().",
            stacklevel=4,
        )

    def _stored(self, params: TensorDict, save_params: list[str] | None) -> TensorDict:
        names = params if save_params is None else save_params
        if self.draw_dtype is None:
            return {name: params[name] for name in names}
        return {name: params[name].to(self.draw_dtype) for name in names}

    # ------------------------------------------------------------------ checkpoint contents
    def _payload(self, kernel) -> dict[str, Any]:
        """The checkpoint: finished chains and, if ``kernel`` is given, the running one."""
        chains = []
        for chain in range(self.num_chains):
            state = self._chain_states[chain]
            if kernel is not None and chain == self._current_chain:
                state = kernel.state_dict(include_draws=False)
            chains.append(
                {
                    "draws": self._chain_draws[chain],
                    "diagnostics": self._diagnostics[chain],
                    "kernel_state": state,
                }
            )
        signature = next(
            (c["kernel_state"]["signature"] for c in chains if c["kernel_state"]), None
        )
        return {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "signature": signature,
            "data_fingerprint": self._fingerprint,
            "run": {
                "num_samples": self.num_samples,
                "warmup_steps": self.warmup_steps,
                "num_chains": self.num_chains,
                "initial_params": self.initial_params,
                "save_params": getattr(self.kernel, "save_params", None),
                "checkpoint_every": self._checkpoints.every,
                "checkpoint_seconds": self._checkpoints.seconds,
                "draw_dtype": None if self.draw_dtype is None else str(self.draw_dtype)[6:],
            },
            "chains": chains,
            "rng": global_rng_state(),
            "written_at": time.time(),
        }

    def _restore(self, payload: Mapping[str, Any], path: str | os.PathLike) -> dict[str, Any]:
        """Check that ``payload`` belongs to this run and load its chains; return its RNG."""
        _check_entries(payload, path)
        settings = payload["run"]
        for name in ("num_samples", "warmup_steps", "num_chains"):
            if settings[name] != getattr(self, name):
                raise CheckpointError(
                    f"the checkpoint {str(path)!r} was written by a run with {name}="
                    f"{settings[name]}, this one has {name}={getattr(self, name)}; use "
                    "ResumableMCMC.resume(path, ...) to take the saved settings, or extend() for "
                    "more draws"
                )
        if payload["data_fingerprint"] != self._fingerprint:
            raise CheckpointError(
                f"the data given to run() differ from those of the checkpoint {str(path)!r} "
                "(fingerprint of the tensors' dtypes, shapes and values): resume with the same data"
            )
        self._reset_progress()
        for chain, saved in enumerate(payload["chains"]):
            self._check_draw_count(chain, saved, path)
            self._chain_draws[chain] = list(saved["draws"])
            self._diagnostics[chain] = saved["diagnostics"]
            self._chain_states[chain] = saved["kernel_state"]
        saved_states = [(c, s) for c, s in enumerate(self._chain_states) if s is not None]
        if saved_states:
            # Compare kernel and model, and read every saved chain state, before running
            # anything (load_state_dict checks again when each chain starts).
            self._setup_quietly()
            try:
                for chain, state in saved_states:
                    restore_state(self.kernel, state, f"kernel (chain {chain})", path)
            finally:
                self.kernel.cleanup()
        return payload["rng"]

    def _check_draw_count(self, chain: int, saved: Mapping[str, Any], path) -> None:
        """Refuse a chain whose kernel state counts other draws than the chain has kept."""
        state = saved["kernel_state"]
        if state is None:
            return
        done = state.get("num_draws") if isinstance(state, Mapping) else None
        total = self._total_draws()
        if not isinstance(done, int) or not 0 <= done <= total:
            raise CheckpointError(
                f"the checkpoint {str(path)!r}: chain {chain}'s kernel state has num_draws="
                f"{done!r}, outside [0, {total}] for a run of {self.warmup_steps} warm-up and "
                f"{self.num_samples} kept draws: it was edited"
            )
        kept = max(0, done - self.warmup_steps)
        if len(saved["draws"]) != kept:
            raise CheckpointError(
                f"the checkpoint {str(path)!r}: chain {chain} holds {len(saved['draws'])} kept "
                f"draws, but its kernel state counts {done} draws ({kept} after "
                f"{self.warmup_steps} of warm-up): it was edited"
            )

    # ------------------------------------------------------------------ results
    def _transforms(self) -> Mapping:
        if self.transforms is not None:
            return self.transforms
        return getattr(self.kernel, "transforms", None) or {}

    @staticmethod
    def _constrain(name: str, value: torch.Tensor, transforms: Mapping) -> torch.Tensor:
        return transforms[name].inv(value) if name in transforms else value

    def _finalize(self) -> None:
        """Fill ``_samples`` (constrained, ``(chain, draw, *shape)``) and ``transforms``."""
        if self.transforms is None:
            self.transforms = dict(getattr(self.kernel, "transforms", None) or {})
        names = sorted(self._chain_draws[0][0])
        stacked = {
            name: torch.stack(
                [torch.stack([draw[name] for draw in draws]) for draws in self._chain_draws]
            )
            for name in names
        }
        self._samples = constrained_as_mcmc(stacked, self.transforms)  # MCMC's bits
