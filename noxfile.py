"""Automation for pyro_sgmcmc: ``nox -s demo``, ``nox -s tests``, ``nox -s slow``, ``nox -s lint``,
``nox -s docs``, ``nox -s tutorials``, ``nox -s benchmarks``.

Every session installs the CPU build of torch *before* the package, so that pip never resolves the
multi-gigabyte CUDA build on a machine without a GPU.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

PYTHON = os.environ.get("PYRO_SGMCMC_PYTHON", None)
TORCH = os.environ.get("PYRO_SGMCMC_TORCH", "torch==2.13.0")


def _install(session: nox.Session, *extras: str) -> None:
    session.install(TORCH)
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: HMC vs SG-MCMC vs SVI on the default data set, results in ``results/``."""
    _install(session, "data")
    session.run("pyro-sgmcmc", "compare", *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The default test suite (fast; statistical tests marked ``slow`` are skipped)."""
    _install(session, "test")
    session.run("pytest", "-m", "not slow", *session.posargs)


@nox.session(python=PYTHON)
def slow(session: nox.Session) -> None:
    """Slow statistical tests: long seeded runs checked against exact answers."""
    _install(session, "test")
    session.run("pytest", "-m", "slow", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """``ruff check`` and ``ruff format --check``."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def tutorials(session: nox.Session) -> None:
    """Execute every tutorial in smoke mode (``PYRO_SGMCMC_SMOKE=1``); fail if one raises.

    Also checks that each paired ``.ipynb`` matches its jupytext ``.py`` source. Pass tutorial
    names to run a subset (``nox -s tutorials -- 01 05``) or ``--full`` for the full runs.
    """
    _install(session, "tutorials")
    session.run("python", "tutorials/run_all.py", "--check-paired", *session.posargs)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the documentation site into ``site/`` with ``mkdocs build --strict``.

    The tutorials are executed first in smoke mode and written as notebooks to
    ``docs/tutorials/``, which mkdocs-jupyter renders without executing them again.
    """
    _install(session, "docs", "tutorials")
    session.run("python", "tutorials/run_all.py", "--check-paired", "--output", "docs/tutorials")
    session.run("mkdocs", "build", "--strict", *session.posargs)


@nox.session(python=PYTHON)
def benchmarks(session: nox.Session) -> None:
    """Performance benchmarks: print tables and write JSON to ``benchmarks/results/``."""
    _install(session, "data")
    scripts = sorted(
        name
        for name in os.listdir("benchmarks")
        if name.endswith(".py") and not name.startswith("_") and name != "run_all.py"
    )
    # the summary reads what the others wrote, so it runs last
    for script in [*scripts, "run_all.py"]:
        session.run("python", f"benchmarks/{script}")
