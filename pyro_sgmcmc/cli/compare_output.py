"""The output directory of a comparison: checking it, and the manifest of the files written there.

Part of :mod:`pyro_sgmcmc.cli.compare` (whose names these are):
:func:`~pyro_sgmcmc.cli.compare.run_comparison` prepares an :class:`OutputDirectory` before any
sampling and claims each file's name in its manifest (:data:`MANIFEST_NAME`) before writing it;
:func:`check_output_dir` checks that a directory can be written (also for
:func:`~pyro_sgmcmc.cli.compare.sample_to_file`).
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from ..analysis import plots
from .compare_config import METHODS

#: The file that marks a directory as written by :func:`run_comparison` and lists its files.
MANIFEST_NAME = "pyro-sgmcmc-manifest.json"
_MANIFEST_TEMPORARY = f".{MANIFEST_NAME}.tmp"


def check_output_dir(out: Path) -> None:
    """Create ``out`` if needed and check that a file can be written there.

    Raises
    ------
    OSError
        With a message naming the directory, before any sampling starts.
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as error:
        raise OSError(f"output directory {str(out)!r} cannot be written: {error}") from error


def output_names(methods: tuple[str, ...] = METHODS) -> set[str]:
    """Every file name a comparison of ``methods`` can write (besides the manifest)."""
    names = {"summary.json", "summary.md"}
    names |= {"reliability_diagram.png", "predictive_bands.png", "predicted_vs_observed.png"}
    for method in methods:
        names |= {f"{method}.nc", *plots.diagnostic_figure_names(method, outputs=True)}
    return names


def _read_manifest(path: Path) -> list[str] | None:
    """The file names listed by the manifest in ``path``, or ``None`` if it has no valid one."""
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if manifest.get("tool") != "pyro-sgmcmc" or not isinstance(files, list):
        return None
    # only plain names inside the directory: a manifest never reaches outside it
    return [name for name in files if isinstance(name, str) and name == Path(name).name]


def _written_before_manifests(path: Path) -> bool:
    """Whether ``path`` holds only a comparison's outputs from before manifests were written.

    That is: every file is named like an output of :func:`run_comparison` and ``summary.json``
    is a summary it wrote (it names the data set, the settings and the methods).
    """
    names = {p.name for p in path.iterdir()} if path.is_dir() else set()
    if "summary.json" not in names or not names <= output_names():
        return False
    try:
        summary = json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and {"dataset", "config", "methods"} <= set(summary)


class OutputDirectory:
    """A results directory that lists every file written into it in a manifest.

    :meth:`prepare` checks the directory before any sampling starts: a missing or empty directory
    is created and claimed; a directory holding a manifest (:data:`MANIFEST_NAME`) from an
    earlier run is reused after the files that manifest lists are deleted, so no result of that
    run survives beside the new ones (a directory of outputs written before manifests existed,
    with its ``summary.json``, is treated the same); any other non-empty directory is refused unless
    ``overwrite`` is true (then the files named like this command's outputs are deleted and the
    others left in place). :meth:`claim` adds a name to the manifest *before* the file is
    written, so an interrupted run still leaves every file it wrote listed.

    Attributes
    ----------
    path:
        The directory.
    files:
        Names written (claimed) so far, in order.
    kept:
        Names of files that were there before and are left in place (only with ``overwrite``).
    """

    def __init__(self, path: Path, files: list[str], kept: list[str]) -> None:
        self.path = Path(path)
        self.files = files
        self.kept = kept

    @classmethod
    def prepare(cls, path: Path, *, overwrite: bool = False) -> OutputDirectory:
        """Check, clean and claim ``path``; see the class description.

        Raises
        ------
        FileExistsError
            For a non-empty directory without a manifest, or with files its manifest does not
            list, when ``overwrite`` is false; the message lists some of those files.
        OSError
            When ``path`` is a file or cannot be written.
        """
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(f"output directory {str(path)!r} exists and is a file")
        present = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        listed = _read_manifest(path) if MANIFEST_NAME in present else None
        if listed is None and MANIFEST_NAME not in present and _written_before_manifests(path):
            listed = present  # results of a version that wrote no manifest yet
        internal = {MANIFEST_NAME, _MANIFEST_TEMPORARY}
        ours = internal | set(listed) if listed is not None else {_MANIFEST_TEMPORARY}
        foreign = [name for name in present if name not in ours]
        if foreign and not overwrite:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            if listed is not None:
                why = f"its manifest {MANIFEST_NAME} does not list {shown}"
            elif MANIFEST_NAME in present:
                why = f"its {MANIFEST_NAME} is not a valid manifest"
            else:
                why = f"it holds {shown} and no {MANIFEST_NAME}"
            raise FileExistsError(
                f"output directory {str(path)!r} is not empty and was not written by pyro-sgmcmc "
                f"({why}); choose another directory or pass --overwrite (overwrite=True)"
            )
        check_output_dir(path)
        replaced = set(listed or ()) | (output_names() & set(foreign))
        for name in sorted(replaced):
            target = path / name
            if target.is_file() or target.is_symlink():
                target.unlink()
        kept = [name for name in foreign if name not in replaced and name not in internal]
        directory = cls(path, [], kept)
        directory._write_manifest()
        return directory

    def claim(self, name: str) -> Path:
        """Record ``name`` in the manifest and return its path; call it before writing."""
        if name != Path(name).name or name == MANIFEST_NAME:
            raise ValueError(
                f"name must be a plain file name other than the manifest, got {name!r}"
            )
        if name not in self.files:
            self.files.append(name)
            self._write_manifest()
        return self.path / name

    def _write_manifest(self) -> None:
        manifest = {
            "tool": "pyro-sgmcmc",
            "command": "compare",
            "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "files": self.files,
        }
        temporary = self.path / _MANIFEST_TEMPORARY
        temporary.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(temporary, self.path / MANIFEST_NAME)
