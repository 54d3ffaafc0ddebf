"""Execute the tutorials as notebooks and fail if any cell raises.

The jupytext ``.py`` scripts in this folder are the source of truth. Each is converted to a
notebook in memory, executed in a fresh Jupyter kernel (working directory: this folder), and,
with ``--output``, written there as an executed ``.ipynb`` (the documentation renders those).

By default the tutorials run in smoke mode (``PYRO_SGMCMC_SMOKE=1``: short chains, a few seconds
to a minute each); ``--full`` runs the full configurations.

Examples
--------
::

    python tutorials/run_all.py                          # smoke mode, all tutorials
    python tutorials/run_all.py 01 05                    # only the tutorials whose names match
    python tutorials/run_all.py --output docs/tutorials  # also write the executed notebooks
    python tutorials/run_all.py --check-paired           # also check the .ipynb twins are in sync
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


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


def execute(source: Path, timeout: int, output: Path | None) -> tuple[bool, float, str]:
    """Execute one tutorial; return (succeeded, seconds, error message)."""
    import jupytext
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

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
        output.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, output / f"{source.stem}.ipynb")
    return ok, seconds, message


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("patterns", nargs="*", help="run only tutorials whose names contain these")
    parser.add_argument("--full", action="store_true", help="full mode (default: smoke mode)")
    parser.add_argument("--output", type=Path, help="write the executed notebooks to this folder")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    parser.add_argument(
        "--check-paired", action="store_true", help="fail if an .ipynb twin is out of date"
    )
    args = parser.parse_args(argv)

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

    mode = "full" if args.full else "smoke"
    print(f"executing {len(sources)} tutorial(s) in {mode} mode", flush=True)
    for source in sources:
        ok, seconds, message = execute(source, args.timeout, args.output)
        print(f"{'ok  ' if ok else 'FAIL'} {source.name:40s} {seconds:7.1f} s", flush=True)
        if not ok:
            failures.append(f"{source.name} raised:\n{message}")
    for failure in failures:
        print(f"\n{failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
