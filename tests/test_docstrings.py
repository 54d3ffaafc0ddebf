"""Docstrings survive Python's string escapes: a ``\\tau`` or ``\\alpha`` in a non-raw docstring
becomes a tab or a bell character, and the API reference then shows broken maths (MathJax
reports a TeX error only in the built site, which needs a browser to check)."""

import ast
import pathlib

import pyro_sgmcmc

PACKAGE = pathlib.Path(pyro_sgmcmc.__file__).parent
CONTROL = {"\a", "\b", "\f", "\v", "\t", "\r", "\x00"}


def _docstrings(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield getattr(node, "name", "<module>"), text


def test_no_docstring_holds_an_escaped_control_character():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for name, text in _docstrings(path):
            bad = sorted(repr(c) for c in CONTROL if c in text)
            if bad:
                found.append(f"{path.relative_to(PACKAGE.parent)}::{name} holds {', '.join(bad)}")
    assert not found, 'use a raw docstring (r""") or double the backslash:\n' + "\n".join(found)
