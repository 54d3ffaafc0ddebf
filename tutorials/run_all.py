"""Execute the tutorials as notebooks and fail if any cell raises.

The jupytext ``.py`` scripts in this folder are the source of truth. Each is converted to a
notebook in memory, executed in a fresh Jupyter kernel (working directory: this folder), and,
with ``--output``, written there as an executed ``.ipynb`` (the documentation renders those).

By default the tutorials run in smoke mode (``PYRO_SGMCMC_SMOKE=1``: short chains, a few seconds
to a minute each); ``--full`` runs the full configurations.

The committed ``.ipynb`` twins hold the outputs of a **full-mode** run, so that they read complete
on the repository page and in the documentation without running anything. Each records in its
metadata how and from what it was executed::

    {"pyro_sgmcmc": {"mode": "full", "source_sha256": "<sha256 of the .py>", "wall_time_s": 123.4}}

``--check-executed`` fails when a committed notebook has no outputs, was not executed in full
mode, has an error or stderr output, or was executed from another version of its ``.py``;
regenerate it with ``python tutorials/run_all.py --full --output tutorials NN``.

Examples
--------
::

    python tutorials/run_all.py                          # smoke mode, all tutorials
    python tutorials/run_all.py 01 05                    # only the tutorials whose names match
    python tutorials/run_all.py --output docs/tutorials  # also write the executed notebooks
    python tutorials/run_all.py --check-paired           # also check the .ipynb twins are in sync
    python tutorials/run_all.py --full --output tutorials 03   # regenerate a committed notebook
    python tutorials/run_all.py --check-executed --no-execute  # only check the committed outputs
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The key of the execution record in a notebook's metadata.
RECORD = "pyro_sgmcmc"


def tutorial_sources(patterns: list[str]) -> list[Path]:
    """The tutorial scripts (``NN_name.py``), optionally only those matching ``patterns``."""
    sources = sorted(p for p in HERE.glob("[0-9][0-9]_*.py"))
    if patterns:
        sources = [p for p in sources if any(pattern in p.stem for pattern in patterns)]
    return sources


def check_paired(source: Path) -> str | None:
    """Return a message if the paired ``.ipynb`` is missing or its cells differ from ``source``."""
    import jupytext

    twin = source.with_suffix(".ipynb")
    if not twin.exists():
        return f"{twin.name} is missing: run `jupytext --sync tutorials/{source.name}`"
    expected = [(c.cell_type, c.source.strip()) for c in jupytext.read(source).cells]
    actual = [(c.cell_type, c.source.strip()) for c in jupytext.read(twin).cells]
    if expected != actual:
        return (
            f"{twin.name} is out of date with {source.name}: "
            f"run `jupytext --sync tutorials/{source.name}`"
        )
    return None


def source_sha256(source: Path) -> str:
    """The sha256 of the bytes of a tutorial's ``.py`` source."""
    return hashlib.sha256(source.read_bytes()).hexdigest()


def regenerate_command(source: Path) -> str:
    return f"python tutorials/run_all.py --full --output tutorials {source.stem[:2]}"


def check_executed(source: Path, notebook_path: Path | None = None) -> str | None:
    """Return a message if the committed notebook of ``source`` is not a full-mode run of it.

    The notebook (by default the ``.ipynb`` twin of ``source``) must record
    ``{"pyro_sgmcmc": {"mode": "full", "source_sha256": ...}}`` with the sha256 of the current
    ``.py``, and hold outputs, none of them an error or stderr text.
    """
    import nbformat

    twin = notebook_path or source.with_suffix(".ipynb")
    fix = f"run `{regenerate_command(source)}`"
    if not twin.exists():
        return f"{twin.name} is missing: {fix}"
    notebook = nbformat.read(twin, as_version=4)
    record = notebook.metadata.get(RECORD)
    if not isinstance(record, dict) or "source_sha256" not in record:
        return f"{twin.name} has no record of a full-mode execution: {fix}"
    if record.get("mode") != "full":
        return f"{twin.name} was executed in {record.get('mode')!r} mode, not full mode: {fix}"
    if record["source_sha256"] != source_sha256(source):
        return f"{twin.name} was executed from another version of {source.name}: {fix}"
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    if not outputs:
        return f"{twin.name} has no outputs: {fix}"
    if any(o.output_type == "error" for o in outputs):
        return f"{twin.name} holds an error output: fix {source.name}, then {fix}"
    if any(o.output_type == "stream" and o.get("name") == "stderr" for o in outputs):
        return (
            f"{twin.name} holds stderr output (a warning?) that the documentation would show: "
            f"silence it in {source.name}, then {fix}"
        )
    return None


def execute(
    source: Path, timeout: int, output: Path | None, mode: str = "smoke"
) -> tuple[bool, float, str]:
    """Execute one tutorial; return (succeeded, seconds, error message).

    With ``output``, the executed notebook is written there as ``NN_name.ipynb`` with the record
    ``{"pyro_sgmcmc": {"mode", "source_sha256", "wall_time_s"}}`` in its metadata.
    """
    import jupytext
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    sha256 = source_sha256(source)
    notebook = jupytext.read(source)
    notebook.metadata["kernelspec"] = {
        "display_name": "Python 3",
        "language": "python",
        "name": "python3",
    }
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(HERE)}},
    )
    start = time.perf_counter()
    try:
        client.execute()
        ok, message = True, ""
    except CellExecutionError as error:
        ok, message = False, str(error)
    except TimeoutError as error:
        ok, message = False, f"timed out after {timeout} s per cell: {error}"
    seconds = time.perf_counter() - start
    if output is not None:
        notebook.metadata[RECORD] = {
            "mode": mode if ok else f"{mode} (failed)",
            "source_sha256": sha256,
            "wall_time_s": round(seconds, 1),
        }
        output.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, output / f"{source.stem}.ipynb")
    return ok, seconds, message


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("patterns", nargs="*", help="run only tutorials whose names contain these")
    parser.add_argument("--full", action="store_true", help="full mode (default: smoke mode)")
    parser.add_argument("--output", type=Path, help="write the executed notebooks to this folder")
    parser.add_argument(
        "--timeout", type=int, help="seconds allowed per cell (default: 600, 1800 with --full)"
    )
    parser.add_argument(
        "--check-paired", action="store_true", help="fail if an .ipynb twin is out of date"
    )
    parser.add_argument(
        "--check-executed",
        action="store_true",
        help="fail if a committed .ipynb is not a full-mode execution of its current .py",
    )
    parser.add_argument(
        "--no-execute", action="store_true", help="only run the checks, execute nothing"
    )
    args = parser.parse_args(argv)
    if (
        args.output is not None
        and not args.full
        and not args.no_execute
        and args.output.resolve() == HERE
    ):
        parser.error(
            "the notebooks in tutorials/ hold full-mode outputs: write smoke runs elsewhere, "
            "or pass --full"
        )

    os.environ["PYRO_SGMCMC_SMOKE"] = "0" if args.full else "1"
    # Worker processes of the kernel must not oversubscribe a small CI machine.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sources = tutorial_sources(args.patterns)
    if not sources:
        print(f"no tutorial matches {args.patterns}", file=sys.stderr)
        return 2

    failures = []
    if args.check_paired:
        for source in sources:
            problem = check_paired(source)
            if problem:
                failures.append(problem)
                print(f"FAIL {problem}", file=sys.stderr)
    if args.check_executed:
        for source in sources:
            problem = check_executed(source)
            if problem:
                failures.append(problem)
                print(f"FAIL {problem}", file=sys.stderr)
    if args.no_execute:
        if not failures:
            print(f"{len(sources)} tutorial(s): checks passed")
        return 1 if failures else 0

    mode = "full" if args.full else "smoke"
    print(f"executing {len(sources)} tutorial(s) in {mode} mode", flush=True)
    for source in sources:
        timeout = args.timeout or (1800 if args.full else 600)
        ok, seconds, message = execute(source, timeout, args.output, mode)
        print(f"{'ok  ' if ok else 'FAIL'} {source.name:40s} {seconds:7.1f} s", flush=True)
        if not ok:
            failures.append(f"{source.name} raised:\n{message}")
    for failure in failures:
        print(f"\n{failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
