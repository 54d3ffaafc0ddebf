"""What importing the package costs, against importing Pyro alone, in fresh processes.

ArviZ is imported when it is first used (:mod:`pyro_sgmcmc.analysis._arviz`): importing it
takes about two seconds (SciPy's statistics, its plotting), which a script that only samples,
and the command line's ``--help``, need not wait for. Each command below runs in a fresh Python
process, all of them in turn, ``--repeats`` times; the table gives the median wall time of the
process (the interpreter's own start included) and what it adds to ``import pyro``, the
baseline every Pyro user pays. ``import pyro_sgmcmc, arviz`` is what the package's import cost
when it imported ArviZ itself; the first export in a process pays the difference. The children
cache their compiled modules (``PYTHONDONTWRITEBYTECODE`` is left out of their environment, and
each command runs once untimed first), as a user's interpreter does. With
``--against DIR`` (another checkout, e.g. ``git worktree add --detach /tmp/before 2fd8f8f``, the
last commit that imported ArviZ with the package) each command runs from that checkout too, in
the same turns, and the table gives both.

Run: ``python benchmarks/import_time.py [--repeats 5] [--against DIR]``; writes
``benchmarks/results/import_time.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import load_average, print_table, write_json

COMMANDS = {
    "import pyro": "import pyro",
    "import pyro_sgmcmc": "import pyro_sgmcmc",
    "import pyro_sgmcmc, arviz": "import pyro_sgmcmc, arviz",
    "pyro-sgmcmc --help": (
        "import contextlib, io\n"
        "from pyro_sgmcmc.cli.commands import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])"
    ),
}


def seconds(code: str, checkout: Path) -> float:
    """Wall time of a fresh interpreter that runs ``code`` with ``checkout``'s package first on
    its path (started elsewhere, so that the working directory's package is not the one found)."""
    code = f"import sys; sys.path.insert(0, {str(checkout)!r})\n{code}"
    # as a user's interpreter runs: with the compiled modules cached (a first, untimed run)
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tempfile.gettempdir(),
                   env=environment)  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--against", type=Path, help="another checkout of the package")
    args = parser.parse_args()
    checkouts = {"this": Path(__file__).resolve().parents[1]}
    if args.against is not None:
        if not (args.against / "pyro_sgmcmc").is_dir():
            parser.error(f"--against must be a checkout of pyro_sgmcmc, got {args.against}")
        checkouts["against"] = args.against.resolve()
    timings = {(where, name): [] for where in checkouts for name in COMMANDS}
    for where, name in timings:  # the first run compiles the modules; not timed
        seconds(COMMANDS[name], checkouts[where])
    for _ in range(args.repeats):  # in turn, so that a slower minute slows every command
        for (where, name), values in timings.items():
            values.append(seconds(COMMANDS[name], checkouts[where]))
    baseline = statistics.median(timings["this", "import pyro"])
    rows = []
    for (where, name), values in timings.items():
        median = statistics.median(values)
        rows.append({"checkout": where, "command": name, "median_s": round(median, 2),
                     "over_import_pyro_s": round(median - baseline, 2),
                     "runs_s": [round(v, 2) for v in values]})  # fmt: skip
    print_table(rows, ["checkout", "command", "median_s", "over_import_pyro_s", "runs_s"])
    path = write_json("import_time", {"load_average": load_average(), "rows": rows,
                                      "against": str(args.against)})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
