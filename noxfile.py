"""Automation for pyro_sgmcmc: ``nox -s demo``, ``nox -s tests``, ``nox -s tests-arviz1``,
``nox -s slow``, ``nox -s lint``, ``nox -s docs``, ``nox -s docs_check``, ``nox -s tutorials``,
``nox -s benchmarks``.

Every session installs torch *before* the package. Environment variables:

``PYRO_SGMCMC_PYTHON``
    The Python of the sessions that do not fix one (default: the one running nox).
``PYRO_SGMCMC_TORCH``
    The torch requirement (default ``torch==2.13.0``).
``PYRO_SGMCMC_PYTHON312``
    The Python 3.12 interpreter of ``tests-arviz1`` (default: pyenv's 3.12, else ``3.12``).
``PYRO_SGMCMC_TORCH_INDEX``
    When set, torch is installed from this package index only (``pip install --index-url``), e.g.
    PyTorch's CPU wheels, ``https://download.pytorch.org/whl/cpu``: on Linux, PyPI's torch is the
    multi-gigabyte CUDA build, which a machine without a GPU does not need. Unset: torch comes
    from the default index (PyPI).

``tests`` runs with whatever ArviZ ``arviz>=0.20`` resolves to (0.23 on Python 3.11);
``tests-arviz1`` runs the tests that exercise ArviZ on Python 3.12 with ArviZ 1.x
(``xarray.DataTree`` results, see ``pyro_sgmcmc/analysis/_arviz.py``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint"]
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

PYTHON = os.environ.get("PYRO_SGMCMC_PYTHON", None)
TORCH = os.environ.get("PYRO_SGMCMC_TORCH", "torch==2.13.0")
TORCH_INDEX = os.environ.get("PYRO_SGMCMC_TORCH_INDEX") or None


def _python_312() -> str:
    """The interpreter of ``tests-arviz1``: ``PYRO_SGMCMC_PYTHON312`` when set, else a pyenv
    installation of 3.12 (pyenv's ``python3.12`` shim runs only where 3.12 is a selected
    version), else whatever nox finds as ``3.12``."""
    explicit = os.environ.get("PYRO_SGMCMC_PYTHON312")
    if explicit:
        return explicit
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    installed = sorted(root.glob("versions/3.12*/bin/python3.12"))
    return str(installed[-1]) if installed else "3.12"


#: The test files that exercise ArviZ: the export, its checks, diagnostics, the CLI's netCDF files.
ARVIZ_TESTS = (
    "tests/test_arviz_compat.py",
    "tests/test_export.py",
    "tests/test_export_checks.py",
    "tests/test_export_plates.py",
    "tests/test_diagnostics.py",
    "tests/test_judged_outputs.py",
    "tests/test_rank_diagnostics.py",
    "tests/test_cli.py",
)

#: The tutorials that call ArviZ themselves: ``tests-arviz1`` executes them (smoke mode) under
#: ArviZ 1.x, the line a fresh install gets; ``tutorials`` executes the others under the default
#: line. Each tutorial runs once on CI; the ArviZ calls of these three are also tested under both
#: lines (``tests/test_arviz_compat.py``).
ARVIZ_TUTORIALS = ("01", "02", "06")


def _install_torch(session: nox.Session) -> None:
    if TORCH_INDEX:
        session.install("--index-url", TORCH_INDEX, TORCH)
    else:
        session.install(TORCH)


def _install(session: nox.Session, *extras: str, also: tuple[str, ...] = ()) -> None:
    _install_torch(session)
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec, *also)


def _debian_install(session: nox.Session, *packages: str) -> bool:
    """Install Debian packages with apt-get on CI (``CI`` set, running as root); else do nothing.

    Returns whether the installation ran and succeeded. On a developer's machine a session never
    installs system packages: it says what is missing and what to install instead.
    """
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if not (os.environ.get("CI") and as_root and shutil.which("apt-get")):
        return False
    session.log(f"CI: installing {' '.join(packages)} with apt-get")
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        try:
            session.run(*command, external=True, env={"DEBIAN_FRONTEND": "noninteractive"})
        except nox.command.CommandFailed:
            return False
    return True


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: HMC vs SG-MCMC vs SVI on the default data set, results in ``results/``."""
    _install(session, "data")
    session.run("pyro-sgmcmc", "compare", *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The default test suite (fast; statistical tests marked ``slow`` are skipped)."""
    _install(session, "test")
    # one pytest worker per core (at most four): the tests run one torch thread each
    session.run("pytest", "-m", "not slow", "-n", "auto", "--maxprocesses", "4", *session.posargs)


@nox.session(name="tests-arviz1", python=_python_312())
def tests_arviz1(session: nox.Session) -> None:
    """The tests that exercise ArviZ, with ArviZ 1.x on Python 3.12 (not the ``slow`` ones).

    ArviZ 1.x is ``arviz_base``, ``arviz_stats`` and ``arviz_plots``; the exports are then
    ``xarray.DataTree`` objects. The files run are :data:`ARVIZ_TESTS`; extra arguments go to
    pytest (``nox -s tests-arviz1 -- -x``). Then the tutorials that call ArviZ themselves
    (:data:`ARVIZ_TUTORIALS`) are executed in smoke mode.
    """
    _install(session, "test", "tutorials", also=("arviz>=1",))
    session.run(
        "python",
        "-c",
        "import arviz, pyro_sgmcmc.analysis._arviz as c; assert c.ARVIZ_1, arviz.__version__; "
        "print('ArviZ', arviz.__version__)",
    )
    session.run(
        "pytest", "-m", "not slow", "-n", "auto", "--maxprocesses", "4", *ARVIZ_TESTS,
        *session.posargs,
    )  # fmt: skip
    session.run(
        "python", "tutorials/run_all.py", *ARVIZ_TUTORIALS, env={"PYRO_SGMCMC_SMOKE": "1"}
    )  # fmt: skip


@nox.session(python=PYTHON)
def slow(session: nox.Session) -> None:
    """Slow statistical tests: long seeded runs checked against exact answers."""
    _install(session, "test")
    session.run("pytest", "-m", "slow", "-n", "auto", "--maxprocesses", "4", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """``ruff check`` and ``ruff format --check``."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def tutorials(session: nox.Session) -> None:
    """Execute the tutorials in smoke mode (``PYRO_SGMCMC_SMOKE=1``); fail if one raises.

    Executes every tutorial but :data:`ARVIZ_TUTORIALS` (``tests-arviz1`` runs those under
    ArviZ 1.x), and checks every one: its paired ``.ipynb`` matches its jupytext ``.py`` source
    and is a full-mode execution of its current version (``--check-executed``: the sha256 of
    the ``.py`` recorded in the notebook's metadata; regenerate a stale one with
    ``python tutorials/run_all.py --full --output tutorials NN``). Pass tutorial names to run a
    subset (``nox -s tutorials -- 01 05``).
    """
    _install(session, "tutorials")
    if session.posargs:
        names = list(session.posargs)
    else:
        names = sorted(
            path.stem[:2]
            for path in Path("tutorials").glob("[0-9][0-9]_*.py")
            if path.stem[:2] not in ARVIZ_TUTORIALS
        )
    session.run("python", "tutorials/run_all.py", "--check-paired", "--check-executed",
                "--no-execute")  # fmt: skip
    session.run("python", "tutorials/run_all.py", *names, env={"PYRO_SGMCMC_SMOKE": "1"})


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the documentation site into ``site/`` with ``mkdocs build --strict``.

    The tutorial pages show the committed notebooks of ``tutorials/``, executed in full mode
    (``python tutorials/run_all.py --full --output tutorials``): they are checked to be full
    runs of their current ``.py`` sources, copied to ``docs/tutorials/`` and rendered by
    mkdocs-jupyter without executing them again. Fashion-MNIST (Debian's
    ``dataset-fashion-mnist``; on CI the session installs it) is what tutorial 4 needs when it
    is executed. MathJax is copied into the site from the ``docs`` extra
    (``docs/hooks/offline_assets.py``): the site reads offline.
    """
    _install(session, "docs", "tutorials")
    fashion = Path(os.environ.get("PYRO_SGMCMC_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))
    if not fashion.is_dir() and not _debian_install(session, "dataset-fashion-mnist"):
        session.warn(
            f"Fashion-MNIST not found in {fashion}: the site shows tutorial 4's committed "
            "Fashion-MNIST run, but executing it here would fall back to scikit-learn's digits "
            "(apt-get install dataset-fashion-mnist, or set PYRO_SGMCMC_FASHION_MNIST)"
        )
    session.run(
        "python", "tutorials/run_all.py", "--check-paired", "--check-executed", "--no-execute"
    )
    target = Path("docs/tutorials")
    for notebook in sorted(Path("tutorials").glob("[0-9][0-9]_*.ipynb")):
        shutil.copy2(notebook, target / notebook.name)
    session.log(f"copied the executed tutorial notebooks to {target}")
    session.run("mkdocs", "build", "--strict", *session.posargs)


@nox.session(python=PYTHON)
def docs_check(session: nox.Session) -> None:
    """Open every page of the built site in headless Chromium and check what a reader sees.

    Run ``nox -s docs`` first. The check (``tests/test_docs_site.py``) serves ``site/`` on
    127.0.0.1 with every other host unreachable and asserts that all maths is typeset, the
    tutorials show their figures, nothing is requested from another host, and no warnings,
    build paths or internal labels reach a page. It needs Debian's ``chromium`` and
    ``chromium-driver``: on CI the session installs them; elsewhere it is skipped with the
    command to run when they are missing.
    """
    if not Path("site/index.html").is_file():
        session.error("no built site in site/: run `nox -s docs` first")
    programs = ("chromium", "chromedriver")
    if not all(map(shutil.which, programs)) and not _debian_install(
        session, "chromium", "chromium-driver"
    ):
        session.skip(
            "Chromium or chromedriver not found; install them (Debian: apt-get install chromium "
            "chromium-driver, or point CHROMIUM and CHROMEDRIVER at them) and run again"
        )
    session.install("pytest>=8", "selenium>=4.10")
    # --noconftest: the check needs no torch or Pyro, only the site, a browser and selenium
    session.run(
        "pytest",
        "--noconftest",
        "-p",
        "no:cacheprovider",
        "tests/test_docs_site.py",
        *session.posargs,
        env={"PYRO_SGMCMC_DOCS_CHECK": "1"},
    )


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
