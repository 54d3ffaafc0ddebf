"""A griffe extension that lets mkdocstrings render the package's reStructuredText markup.

The docstrings of ``pyro_sgmcmc`` follow the numpy style and use a few Sphinx constructs that
Markdown does not know: ``:math:`...``` roles, ``.. math::`` blocks and cross-reference roles
such as ``:class:`~pyro_sgmcmc.SGLD```. Before mkdocstrings renders a docstring this extension
rewrites them into what the site's Markdown understands (pymdownx.arithmatex math, code
spans, and cross-references that link to the target's API entry when the site renders it);
the docstrings themselves stay as they are, readable in ``help()`` and in an editor.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

from griffe import Extension, Object

_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_XREF_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|obj|data|exc|const):`~?([^`]+)`")
_DOUBLE_BACKTICKS = re.compile(r"``([^`]+)``")
#: The target of a role with an explicit title, ``:func:`title <target>```.
_TITLED_TARGET = re.compile(r"^(?P<title>.*\S)\s*<(?P<target>[^<>\s]+)>$", re.DOTALL)
_MATH_DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*\n")


def _short_name(target: str, had_tilde: bool) -> str:
    return target.rsplit(".", 1)[-1] if had_tilde else target


def _convert_math_blocks(text: str) -> str:
    """Turn each ``.. math::`` directive and its indented body into a ``$$ ... $$`` block."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = _MATH_DIRECTIVE.match(lines[i])
        if not match:
            out.append(lines[i])
            i += 1
            continue
        indent = match.group("indent")
        i += 1
        body: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith(indent + " ")):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
        math = textwrap.dedent("".join(body)).strip("\n")
        if "&" in math or "\\\\" in math:
            # Sphinx wraps multi-line math in an alignment environment; MathJax needs it spelled.
            math = f"\\begin{{aligned}}\n{math}\n\\end{{aligned}}"
        # Markdown nests blocks by multiples of four spaces: a block indented by three (inside
        # an item "3. ...") would be a paragraph, with its $$ left as text.
        indent = indent.expandtabs(4)
        indent = " " * (len(indent) - len(indent) % 4)
        out.append(f"{indent}$$\n")
        out.extend(f"{indent}{line}\n" for line in math.splitlines())
        out.append(f"{indent}$$\n\n")
    return "".join(out)


def rst_to_markdown(text: str) -> str:
    """Rewrite the reStructuredText constructs used in the package's docstrings."""
    text = _convert_math_blocks(text)
    text = _MATH_ROLE.sub(lambda m: "\\(" + m.group(1) + "\\)", text)

    def xref(match: re.Match[str]) -> str:
        whole = match.group(0)
        target = match.group(1)
        titled = _TITLED_TARGET.match(target)
        if titled:
            # ":func:`title <target>`": Sphinx shows the title and links to the target.
            title, target = titled.group("title"), titled.group("target")
        else:
            title = _short_name(target, "`~" in whole)
        # An optional autoref (what mkdocstrings emits for annotations): a link when the target
        # has an entry on one of the API pages, the plain code span otherwise (no warning).
        return f'<autoref identifier="{target.lstrip("~")}" optional>`{title}`</autoref>'

    text = _XREF_ROLE.sub(xref, text)
    return _DOUBLE_BACKTICKS.sub(r"`\1`", text)


class RstRoles(Extension):
    """Apply :func:`rst_to_markdown` to every docstring griffe loads."""

    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
