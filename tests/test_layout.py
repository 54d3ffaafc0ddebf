"""The package's layout rules: short functions, no import cycles, modules of one job, folder tables.

* No function or method longer than :data:`MAX_FUNCTION_LINES` code lines (blank lines, comment
  lines and the docstring not counted).
* No cycle among the package's imports, wherever they sit: a module's top, inside a function
  or under ``if TYPE_CHECKING:`` (a cycle of annotations is a cycle of ideas too).
* A module longer than :data:`MAX_MODULE_LINES` lines says in its docstring that it is one job
  (the words "one job").
* Every sub-package's ``__init__`` has a table naming each of its modules.
* Every former module path (:mod:`pyro_sgmcmc._moved`) imports, as the moved module itself.
"""

from __future__ import annotations

import ast
import importlib
import io
import tokenize
from pathlib import Path

import pytest

from pyro_sgmcmc import _moved

PACKAGE = Path(__file__).resolve().parents[1] / "pyro_sgmcmc"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 800


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _code_lines(source: str) -> set[int]:
    """Line numbers that hold code: not blank, not only a comment, not a docstring."""
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT):
            continue
        if token.type in (tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and _is_docstring(body[0]):
            lines -= set(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def long_functions() -> list[str]:
    """``module:function (N code lines)`` for every function over the limit."""
    found = []
    for path in _modules():
        source = path.read_text()
        code = _code_lines(source)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                count = len(code & set(range(node.lineno, node.end_lineno + 1)))
                if count > MAX_FUNCTION_LINES:
                    found.append(f"{_module_name(path)}:{node.name} ({count} code lines)")
    return found


def _imported(module: str, is_package: bool, node: ast.ImportFrom, known: set[str]) -> set[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = ".".join(parts[:keep] + ([node.module] if node.module else []))
    submodules = {f"{base}.{alias.name}" for alias in node.names} & known
    return submodules if len(submodules) == len(node.names) else {base, *submodules}


def _imports(path: Path, known: set[str]) -> set[str]:
    """Package modules imported anywhere in a module."""
    module, is_package = _module_name(path), path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            targets.update(_imported(module, is_package, node, known))
    return (targets & known) - {module}


def import_graph() -> dict[str, set[str]]:
    """Each package module and the package modules it imports, anywhere in its code."""
    paths = {_module_name(path): path for path in _modules()}
    return {name: _imports(path, set(paths)) for name, path in paths.items()}


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for target in graph[node]:
            if target == start:
                return [*path, start]
            if target not in seen and not _is_ancestor_package(target, start):
                seen.add(target)
                stack.append((target, [*path, target]))
    return None


def _is_ancestor_package(candidate: str, module: str) -> bool:
    """A package's ``__init__`` importing its own modules is not a cycle of theirs."""
    return module.startswith(candidate + ".")


def import_cycles() -> list[str]:
    graph = import_graph()
    cycles = {}
    for module in graph:
        cycle = _cycle_from(module, graph)
        if cycle is not None:
            cycles[frozenset(cycle)] = " -> ".join(cycle)
    return sorted(cycles.values())


def test_no_function_is_longer_than_the_limit():
    assert long_functions() == []


def test_the_package_has_no_import_cycle():
    assert import_cycles() == []


@pytest.mark.parametrize("path", _modules(), ids=_module_name)
def test_a_long_module_says_it_is_one_job(path):
    source = path.read_text()
    if source.count("\n") > MAX_MODULE_LINES:
        assert "one job" in (ast.get_docstring(ast.parse(source)) or "").lower()


FOLDERS = sorted(PACKAGE.glob("*/__init__.py"))


@pytest.mark.parametrize("package", FOLDERS, ids=lambda path: path.parent.name)
def test_every_folder_lists_its_modules(package):
    docstring = ast.get_docstring(ast.parse(package.read_text())) or ""
    folder = package.parent
    modules = sorted(path.stem for path in folder.glob("*.py") if not path.stem.startswith("__"))
    modules += sorted(path.name for path in folder.iterdir() if (path / "__init__.py").exists())
    missing = [name for name in modules if f":mod:`.{name}`" not in docstring]
    assert missing == []


if __name__ == "__main__":
    print("\n".join(long_functions()))
    print("\n".join(import_cycles()))


@pytest.mark.parametrize("former", sorted(_moved.FORMER_PATHS))
def test_a_former_module_path_imports_the_moved_module(former):
    moved = importlib.import_module(f"pyro_sgmcmc.{_moved.FORMER_PATHS[former]}")
    assert importlib.import_module(f"pyro_sgmcmc.{former}") is moved
    assert moved.__spec__.name == moved.__name__  # the moved module keeps its own spec


def test_former_paths_share_state_with_the_moved_module(monkeypatch):
    import pyro_sgmcmc.export as former
    from pyro_sgmcmc.analysis import export

    monkeypatch.setattr(former, "to_inference_data", "patched")
    assert export.to_inference_data == "patched"


def test_every_former_path_has_moved_and_no_folder_shadows_one():
    for former, new in _moved.FORMER_PATHS.items():
        assert not (PACKAGE / f"{former}.py").exists()
        assert (PACKAGE / (new.replace(".", "/") + ".py")).is_file()
