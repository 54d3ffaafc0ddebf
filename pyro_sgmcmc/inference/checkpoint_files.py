r"""Checkpoint files: the format, atomic writes, integrity, and when to write.

Used by :class:`~pyro_sgmcmc.inference.checkpoint.ResumableMCMC` and
:func:`~pyro_sgmcmc.run_chains`.

The file
--------
A header line ``PYRO_SGMCMC_CHECKPOINT``, the BLAKE2b-256 digest of the body (hex) on the second
line, then the body: a dictionary written with :func:`torch.save` holding only tensors and
plain Python values, read back with ``torch.load(..., weights_only=True)`` (no arbitrary
objects are unpickled). :func:`load_checkpoint` recomputes the digest, so a damaged or edited
file (one flipped byte is enough) is refused instead of resuming a different run.

Files are written to a temporary file in the same directory, flushed to disk (``fsync``) and
renamed over the target (``os.replace``, atomic on POSIX and Windows): the file on disk is always
a complete checkpoint. Temporary files left by a process killed while writing are removed by
the next write or load of the same checkpoint.

Nothing is overwritten without being asked: a checkpoint path that holds another file, or the
checkpoint of another run, is refused unless ``overwrite=True`` (resuming from a checkpoint
writes the continued run's checkpoints to the same file, which is allowed).
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._validation import check_positive, check_positive_int, model_signature
from ..errors import CheckpointError

__all__ = [
    "FORMAT_VERSION",
    "CheckpointPolicy",
    "check_signature",
    "data_fingerprint",
    "deferred_interrupt",
    "is_checkpoint",
    "load_checkpoint",
    "restore_state",
    "save_checkpoint",
]

#: Version of the checkpoint format written by this module; files of other versions are refused.
FORMAT_VERSION = 2
FORMAT_NAME = "pyro_sgmcmc.inference.checkpoint"
_HEADER = b"PYRO_SGMCMC_CHECKPOINT\n"
_DIGEST_SIZE = 32


def _temporary_files(path: Path) -> list[Path]:
    return list(path.parent.glob(f".{path.name}.*.tmp"))


def remove_stale_temporary_files(path: str | os.PathLike) -> None:
    """Remove the temporary files a writer of ``path`` left behind when it was killed."""
    for stale in _temporary_files(Path(path)):
        stale.unlink(missing_ok=True)


def save_checkpoint(payload: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write ``payload`` to ``path`` atomically, with its digest (see the module docstring)."""
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(dict(payload), buffer)
    body = buffer.getvalue()
    digest = hashlib.blake2b(body, digest_size=_DIGEST_SIZE).hexdigest().encode()
    remove_stale_temporary_files(path)
    handle = tempfile.NamedTemporaryFile(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
    )
    try:
        with handle:
            handle.write(_HEADER + digest + b"\n" + body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    if hasattr(os, "O_DIRECTORY"):
        descriptor = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def is_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file that starts like a checkpoint of this library."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(_HEADER)) == _HEADER
    except OSError:
        return False


def load_checkpoint(
    path: str | os.PathLike, required: Sequence[str] = ("format", "format_version")
) -> dict[str, Any]:
    """Read a checkpoint of this library, refusing anything else.

    Parameters
    ----------
    path:
        The file.
    required:
        Entries the payload must have (a missing one is named in the error).

    Raises
    ------
    FileNotFoundError
        If there is no file at ``path``.
    IsADirectoryError
        If ``path`` is a directory.
    CheckpointError
        If the file is not a checkpoint of this library, is damaged (its digest does not match),
        has another format version, was written by the other driver (``run_chains`` or
        ``ResumableMCMC``), or lacks a required entry.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(
            f"{str(path)!r} is a directory, not a checkpoint file: pass the checkpoint file itself"
        )
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {str(path)!r}")
    remove_stale_temporary_files(path)
    raw = path.read_bytes()
    if not raw.startswith(_HEADER):
        raise CheckpointError(
            f"{str(path)!r} is not a pyro_sgmcmc checkpoint of format version {FORMAT_VERSION} "
            "(no checkpoint header; files of version 1 cannot be read by this version)"
        )
    digest, _, body = raw[len(_HEADER) :].partition(b"\n")
    if hashlib.blake2b(body, digest_size=_DIGEST_SIZE).hexdigest().encode() != digest:
        raise CheckpointError(
            f"{str(path)!r} is damaged: its content does not match the digest written with it "
            "(a changed or truncated file); resume from another checkpoint"
        )
    try:
        payload = torch.load(io.BytesIO(body), map_location=_where_saved, weights_only=True)
    except Exception as error:
        raise CheckpointError(
            f"{str(path)!r} is not a readable pyro_sgmcmc checkpoint "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
        ) from error
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{str(path)!r} is not a pyro_sgmcmc checkpoint (no format marker)")
    if payload.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{str(path)!r} has checkpoint format version {payload.get('format_version')!r}; "
            f"this version of pyro_sgmcmc reads version {FORMAT_VERSION} only"
        )
    missing = [name for name in required if name not in payload]
    if missing:
        writer, wanted = _written_by(payload), _written_by(required)
        if writer is not None and wanted is not None and writer != wanted:
            raise CheckpointError(
                f"{str(path)!r} is a checkpoint of {writer}, not of {wanted}: continue it with "
                f"{_RESUMED_BY.get(writer, writer)}"
            )
        raise CheckpointError(f"{str(path)!r} lacks the entries {missing}: it was edited")
    return payload


#: How the run that wrote each kind of checkpoint is continued.
_RESUMED_BY = {
    "run_chains": "run_chains(kernel, *data, resume_from=path, ...)",
    "ResumableMCMC": "ResumableMCMC.resume(path, kernel, *data)",
}


def _written_by(entries: Mapping[str, Any] | Sequence[str]) -> str | None:
    """Which driver writes a checkpoint with these entries (a payload, or the entries a reader
    requires): ``run_chains`` records its ``kind``, ``ResumableMCMC`` its ``chains``."""
    if "kind" in entries:
        kind = entries["kind"] if isinstance(entries, Mapping) else "run_chains"
        return kind if isinstance(kind, str) else None
    return "ResumableMCMC" if "chains" in entries else None


def data_fingerprint(args: tuple, kwargs: Mapping[str, Any], model: Any = None) -> str:
    """A BLAKE2b digest of the model arguments: tensors by dtype, shape and bytes, other
    values by type and ``repr`` when that is stable (no memory address). Given the ``model``,
    the arguments are taken as its signature binds them, so that data passed by keyword to a
    positional parameter (``run(x=x, y=y)``) are the same data as passed by position."""
    if model is not None:
        args, kwargs = _as_bound(model, args, kwargs)
    digest = hashlib.blake2b(digest_size=16)
    named = [(str(i), a) for i, a in enumerate(args)] + sorted(
        (str(k), v) for k, v in kwargs.items()
    )
    for name, value in named:
        digest.update(name.encode())
        if isinstance(value, torch.Tensor):
            flat = value.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{flat.dtype}{tuple(value.shape)}".encode())
            digest.update(flat.view(torch.uint8).numpy().data)
        elif value is None or isinstance(value, bool | int | float | str):
            digest.update(repr(value).encode())
        else:
            digest.update(type(value).__qualname__.encode())
    return digest.hexdigest()


def _as_bound(model: Any, args: tuple, kwargs: Mapping[str, Any]) -> tuple[tuple, Mapping]:
    """``(args, kwargs)`` as ``model``'s signature binds them: its positional parameters in
    ``args`` however they were passed (unchanged where the signature cannot be read or bound)."""
    signature = model_signature(model)
    try:
        bound = signature.bind(*args, **kwargs) if signature is not None else None
    except TypeError:
        bound = None
    return (args, kwargs) if bound is None else (bound.args, bound.kwargs)


def global_rng_state() -> dict[str, Any]:
    """The global random states of torch, NumPy (the legacy one ``pyro.set_rng_seed`` seeds)
    and Python, as tensors and plain values."""
    kind, keys, position, has_gauss, cached = np.random.get_state()  # noqa: NPY002
    return {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
        "python": random.getstate(),
    }


def set_global_rng_state(state: Mapping[str, Any]) -> None:
    """Restore :func:`global_rng_state`."""
    torch.set_rng_state(state["torch"])
    kind, keys, position, has_gauss, cached = state["numpy"]
    keys = keys.numpy().astype(np.uint32)
    np.random.set_state((kind, keys, position, has_gauss, cached))  # noqa: NPY002
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


@contextmanager
def deferred_interrupt(
    signals: Sequence[int] = (signal.SIGINT,),
) -> Iterator[threading.Event]:
    """Hold back Ctrl-C (and the other ``signals``, e.g. the SIGTERM with which ``torchrun``
    ends the other ranks when one fails) until the current draw is complete.

    The first signal only sets the returned event, whose ``signal`` attribute then names it (the
    driver stops at the next draw boundary, where the state can be saved); a second one
    interrupts at once. Outside the main thread signals cannot be caught, and the event is never
    set.
    """
    requested = threading.Event()
    requested.signal = None
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def handler(signum, frame):
        if requested.is_set():
            for number, saved in previous.items():
                signal.signal(number, saved)
            raise KeyboardInterrupt
        requested.signal = signum
        requested.set()

    previous = {number: signal.signal(number, handler) for number in signals}
    try:
        yield requested
    finally:
        for number, saved in previous.items():
            signal.signal(number, saved)


def check_writable_path(path: str | os.PathLike, name: str = "checkpoint_path") -> Path:
    """Return ``path`` as a :class:`~pathlib.Path` after checking that a file can be written there.

    The directory must exist and accept new files (the checkpoint is written next to the target
    and renamed over it); ``path`` must not be a directory.
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"{name} must be a str or os.PathLike, got {type(path).__name__}")
    path = Path(path)
    if str(path) in ("", ".") or path.name == "":
        raise ValueError(f"{name} must name a file, got {str(path)!r}")
    if path.is_dir():
        raise ValueError(f"{name} must name a file, but {str(path)!r} is a directory")
    directory = path.parent
    if not directory.is_dir():
        raise ValueError(f"{name}: the directory {str(directory)!r} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=f".{path.name}.", suffix=".probe"):
            pass
    except OSError as error:
        raise ValueError(
            f"{name}: cannot write to the directory {str(directory)!r} ({error.strerror})"
        ) from error
    return path


class CheckpointPolicy:
    """Where and when a run writes checkpoints, and what it may overwrite.

    Parameters
    ----------
    path:
        The checkpoint file, or ``None`` for none.
    every:
        Write after every so many draws (warm-up included), ``>= 1``.
    seconds:
        Write when this many seconds have passed since the last write, ``> 0``. With a path and
        neither option, every 60 s.
    overwrite:
        Allow replacing an existing file that is not this run's checkpoint.

    Raises
    ------
    CheckpointError
        If ``path`` holds a file that is not a checkpoint and ``overwrite`` is false.
    """

    def __init__(
        self,
        path: str | os.PathLike | None,
        every: int | None = None,
        seconds: float | None = None,
        overwrite: bool = False,
    ) -> None:
        if every is not None:
            every = check_positive_int("checkpoint_every", every)
        if seconds is not None:
            seconds = check_positive("checkpoint_seconds", seconds)
        if not isinstance(overwrite, bool):
            raise TypeError(f"overwrite must be True or False, got {overwrite!r}")
        self.path = None if path is None else check_writable_path(path)
        if self.path is not None and every is None and seconds is None:
            seconds = 60.0
        self.every, self.seconds, self.overwrite = every, seconds, overwrite
        self.last_write = time.monotonic()
        #: ``False`` on the ranks of a data-parallel run other than 0: they hold rank 0's state
        #: and read its file to resume, but do not write it.
        self.writer = True
        if self.path is not None and self.path.exists() and not overwrite:
            if not is_checkpoint(self.path):
                raise CheckpointError(
                    f"checkpoint_path {str(self.path)!r} is an existing file that is not a "
                    "pyro_sgmcmc checkpoint: refusing to overwrite it (choose another path, or "
                    "pass overwrite=True)"
                )

    def check_fresh_run(self, resume_from: str | os.PathLike | None) -> None:
        """Refuse to start a fresh run over another run's checkpoint (unless ``overwrite``)."""
        path = self.path
        if path is None or self.overwrite or not path.exists():
            return
        if resume_from is not None and Path(resume_from).resolve() == path.resolve():
            return
        raise CheckpointError(
            f"checkpoint_path {str(path)!r} already holds the checkpoint of a run: resume it "
            "(resume_from=..., or ResumableMCMC.resume), choose another path, or pass "
            "overwrite=True to replace it"
        )

    def due(self, num_draws: int) -> bool:
        """Whether a checkpoint is due after ``num_draws`` draws."""
        if self.path is None:
            return False
        if self.every is not None and num_draws % self.every == 0:
            return True
        return self.seconds is not None and time.monotonic() - self.last_write >= self.seconds

    def write(self, payload: Mapping[str, Any]) -> None:
        """Write ``payload`` (a no-op without a path, or when this process is not the writer)."""
        if self.path is None or not self.writer:
            return
        save_checkpoint(payload, self.path)
        self.last_write = time.monotonic()


def restore_state(target: Any, state: Any, what: str, path: str | os.PathLike) -> None:
    """``target.load_state_dict(state)``, a state read from the checkpoint ``path``; a state
    that does not fit (an entry missing, a tensor of another shape: a hand-edited file) raises
    :class:`~pyro_sgmcmc.errors.CheckpointError` naming ``what`` and the file."""
    try:
        target.load_state_dict(state)
    except CheckpointError:
        raise  # it names what differs (another model, kernel or setting)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError, RuntimeError) as error:
        raise CheckpointError(
            f"the checkpoint {str(path)!r}: its {what} state cannot be loaded "
            f"({type(error).__name__}: {error}): it was edited or written by another version"
        ) from error


def _where_saved(storage: Any, location: str) -> Any:
    """``torch.load``'s placement: a tensor saved on a GPU goes back there when there is one
    (a chain's position, momenta and statistics live on the data's device), else stays on the
    CPU, where every other tensor (generator states, bookkeeping) belongs."""
    if location.startswith("cuda") and torch.cuda.is_available():
        return None  # torch's default: the device it was saved from
    return storage


#: Signature entries newer than some checkpoints: compared only when the checkpoint has them.
_ADDED_ENTRIES = frozenset({"model_log_density"})


#: Per kernel, options newer than some checkpoints, with the value the runs that wrote them
#: had (SGHMC's integrator arrived in 0.4.0; its step was Euler's before).
_ADDED_OPTIONS = {"SGHMC": {"integrator": "'euler'"}}


def check_signature(saved: Any, current: Mapping[str, Any]) -> None:
    """Refuse a saved run whose signature (kernel class, settings, model's sites, data size)
    differs from the current one, naming each difference (:class:`CheckpointError`)."""
    if isinstance(saved, Mapping):  # entries added since a checkpoint was written are not asked
        current = {k: v for k, v in current.items() if k in saved or k not in _ADDED_ENTRIES}
        saved = _with_added_options(saved)
    differences = _differences(saved, current) if isinstance(saved, Mapping) else ["signature"]
    if differences:
        raise CheckpointError(
            "the saved state belongs to another kernel or model and cannot be continued "
            "here: " + "; ".join(differences)
        )


def _with_added_options(saved: Mapping[str, Any]) -> Mapping[str, Any]:
    """``saved`` with the options of :data:`_ADDED_OPTIONS` it lacks set to what it ran."""
    added = _ADDED_OPTIONS.get(saved.get("kernel"), {})
    config = saved.get("config")
    if not added or not isinstance(config, Mapping):
        return saved
    return {**saved, "config": {**added, **config}}


def _differences(saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list:
    """Human-readable differences between two signatures (nested dicts)."""
    found = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, "<missing>"), current.get(key, "<missing>")
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            found.extend(_differences(a, b, f"{prefix}{key}."))
        elif isinstance(a, float) and isinstance(b, float):
            if not math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6):  # another CPU's rounding
                found.append(f"{prefix}{key}: saved {a:.7g}, now {b:.7g}")
        elif a != b:
            found.append(f"{prefix}{key}: saved {a!r}, now {b!r}")
    return found
