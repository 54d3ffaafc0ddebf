"""The README's commands and code run as printed.

The quick start is two ``nox`` commands: their sessions must exist in the noxfile (running them
whole is CI's job: ``.ci/run`` calls the test command). The command-line tool the README names
must accept the subcommands and options it shows. The Python example runs unchanged on random
data of the shapes it names (marked slow: it samples a 784-100-10 network).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def _noxfile_sessions() -> set[str]:
    """Session names of the noxfile: the function names and ``name=`` overrides."""
    text = (ROOT / "noxfile.py").read_text()
    named = set(re.findall(r'@nox\.session\(name="([^"]+)"', text))
    functions = re.findall(r"@nox\.session\(([^)]*)\)\ndef (\w+)", text)
    return named | {function for arguments, function in functions if "name=" not in arguments}


def test_quick_start_is_two_commands_of_existing_sessions():
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = _code_blocks("bash")[0]
    assert block in quick_start
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert len(commands) == 2, commands
    sessions = _noxfile_sessions()
    for command in commands:
        assert command.startswith("python -m pip install nox && python -m nox -s "), command
        assert command.split()[-1] in sessions, (command, sorted(sessions))
    assert {command.split()[-1] for command in commands} == {"demo", "tests"}


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m nox -s tests\n" in ci


def test_every_nox_session_the_readme_names_exists():
    sessions = _noxfile_sessions()
    named = set(re.findall(r"`(?:python -m nox )?-s ([\w-]+)", README))
    assert named and named <= sessions, sorted(named - sessions)


def _cli(*arguments: str) -> subprocess.CompletedProcess:
    executable = shutil.which("pyro-sgmcmc")
    command = [executable] if executable else [sys.executable, "-m", "pyro_sgmcmc.cli"]
    return subprocess.run([*command, *arguments], capture_output=True, text=True, timeout=120)


def test_the_command_line_the_readme_shows_parses():
    """``pyro-sgmcmc sample sghmc --data houses.csv --target price -o sghmc.nc`` and the demo's
    ``--dataset breast_cancer --chains 2``: the subcommands and options exist."""
    sample = _cli("sample", "--help")
    assert sample.returncode == 0, sample.stderr
    for option in ("--data", "--target", "-o"):
        assert option in sample.stdout
    assert "sghmc" in sample.stdout
    compare = _cli("compare", "--help")
    assert compare.returncode == 0, compare.stderr
    for option in ("--dataset", "--chains", "--data", "--target", "--overwrite"):
        assert option in compare.stdout


@pytest.mark.slow
def test_the_python_example_runs_as_printed():
    """The example's code, unchanged, on random images and labels of the shapes it names."""
    example = _code_blocks("python")[0]
    generator = torch.Generator().manual_seed(0)
    names = {
        "x_train": torch.rand(1000, 784, generator=generator),
        "y_train": torch.randint(0, 10, (1000,), generator=generator),
        "x_test": torch.rand(200, 784, generator=generator),
        "y_test": torch.randint(0, 10, (200,), generator=generator),
    }
    with pytest.warns(Warning):  # random labels: nothing to learn, the checks say so
        exec(compile(example, "README.md", "exec"), names)
    assert str(names["result"].verdict).startswith(("converged", "not converged"))
    assert "posterior" in names["idata"]
