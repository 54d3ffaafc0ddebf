"""The committed tutorial notebooks are full-mode executions of their current ``.py`` sources.

Fast: nothing is executed. ``tutorials/run_all.py --check-executed`` is the check; these tests run
it on the committed notebooks and show that it catches a stale or unexecuted notebook.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("jupytext")

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"


def _load_run_all():
    spec = importlib.util.spec_from_file_location("tutorials_run_all", TUTORIALS / "run_all.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_all = _load_run_all()
SOURCES = run_all.tutorial_sources([])


def test_there_are_tutorials():
    assert len(SOURCES) >= 6
    assert all(source.with_suffix(".ipynb").exists() for source in SOURCES)


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_committed_notebook_is_a_full_run_of_its_source(source):
    assert run_all.check_executed(source) is None
    assert run_all.check_paired(source) is None


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_committed_notebook_prints_its_wall_time(source):
    import nbformat

    notebook = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    texts = [
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream"
    ]
    assert any("full mode: this notebook ran in" in text for text in texts)
    assert notebook.metadata["pyro_sgmcmc"]["wall_time_s"] > 0


@pytest.fixture
def copied(tmp_path):
    """The first tutorial and its committed notebook, copied to a temporary folder."""
    source = SOURCES[0]
    shutil.copy(source, tmp_path / source.name)
    shutil.copy(source.with_suffix(".ipynb"), tmp_path / source.with_suffix(".ipynb").name)
    return tmp_path / source.name


def test_a_modified_source_makes_the_notebook_stale(copied):
    assert run_all.check_executed(copied) is None
    copied.write_text(copied.read_text() + "\n# an edit\n")
    problem = run_all.check_executed(copied)
    assert problem is not None
    assert "another version" in problem
    assert f"--full --output tutorials {copied.stem[:2]}" in problem


def test_a_notebook_without_the_record_fails(copied):
    import nbformat

    twin = copied.with_suffix(".ipynb")
    notebook = nbformat.read(twin, as_version=4)
    del notebook.metadata["pyro_sgmcmc"]
    nbformat.write(notebook, twin)
    problem = run_all.check_executed(copied)
    assert problem is not None and "no record" in problem


def test_a_smoke_run_or_a_notebook_without_outputs_fails(copied):
    import nbformat

    twin = copied.with_suffix(".ipynb")
    notebook = nbformat.read(twin, as_version=4)
    notebook.metadata["pyro_sgmcmc"]["mode"] = "smoke"
    nbformat.write(notebook, twin)
    assert "smoke" in run_all.check_executed(copied)

    notebook.metadata["pyro_sgmcmc"]["mode"] = "full"
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    nbformat.write(notebook, twin)
    assert "no outputs" in run_all.check_executed(copied)


def test_stderr_in_a_notebook_fails(copied):
    import nbformat

    twin = copied.with_suffix(".ipynb")
    notebook = nbformat.read(twin, as_version=4)
    code = next(cell for cell in notebook.cells if cell.cell_type == "code")
    code.outputs.append(nbformat.v4.new_output("stream", name="stderr", text="UserWarning: x\n"))
    nbformat.write(notebook, twin)
    assert "stderr" in run_all.check_executed(copied)


def test_the_command_line_check_fails_with_the_command_to_run(copied, monkeypatch, capsys):
    copied.write_text(copied.read_text() + "\n# an edit\n")
    monkeypatch.setattr(run_all, "HERE", copied.parent)
    code = run_all.main(["--check-executed", "--no-execute"])
    assert code == 1
    err = capsys.readouterr().err
    assert copied.with_suffix(".ipynb").name in err
    assert "python tutorials/run_all.py --full --output tutorials" in err


def test_smoke_runs_may_not_overwrite_the_committed_notebooks():
    with pytest.raises(SystemExit):
        run_all.main(["--output", str(TUTORIALS), "01"])


def test_the_tutorials_executed_under_arviz1_are_the_ones_that_call_arviz():
    """CI executes each tutorial once: the ones that call ArviZ under 1.x (``tests-arviz1``),
    the others in ``tutorials``. Every name the noxfile lists must be a tutorial, and every
    tutorial that imports ArviZ itself must be listed."""
    import ast

    tree = ast.parse((ROOT / "noxfile.py").read_text())
    listed = next(
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(getattr(target, "id", None) == "ARVIZ_TUTORIALS" for target in node.targets)
    )
    prefixes = {source.stem[:2] for source in SOURCES}
    assert set(listed) <= prefixes
    calling_arviz = {
        source.stem[:2]
        for source in SOURCES
        if "import arviz" in source.read_text() or "from arviz" in source.read_text()
    }
    assert calling_arviz <= set(listed), sorted(calling_arviz - set(listed))


def _load_docs_site_check():
    """``tests/test_docs_site.py``, whose word list the documentation check applies to the site."""
    spec = importlib.util.spec_from_file_location(
        "docs_site_check", ROOT / "tests/test_docs_site.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_speaks_to_a_reader(source):
    """No benchmark code (``W5``), "workload", "anchors", "the blog" or note to self in a
    notebook's markdown cells or outputs (the list of ``tests/test_docs_site.py``); and no
    heading with nothing but code under it (the wall-time cell is introduced by a sentence)."""
    import nbformat

    check = _load_docs_site_check()
    twin = source.with_suffix(".ipynb")
    problems = [
        problem
        for where, text in check.notebook_reader_texts(twin)
        for problem in check.unplaceable_words(where, text)
    ]
    cells = nbformat.read(twin, as_version=4).cells
    for number, cell in enumerate(cells, start=1):
        lines = [line for line in cell.source.strip().splitlines() if line.strip()]
        if cell.cell_type == "markdown" and lines and all(line.startswith("#") for line in lines):
            following = cells[number] if number < len(cells) else None
            if following is None or following.cell_type == "code":
                problems.append(f"{twin.name}, cell {number}: a bare heading {lines[-1]!r}")
    assert not problems, "\n".join(problems)
