"""MkDocs hook: serve MathJax from the site itself, so that every formula renders offline.

MathJax 3 comes from the PyPI package ``django-static-mathjax`` (in the ``docs`` extra), which
ships MathJax's own ``es5`` build as static files. At build time this hook adds the files the
pages need -- the ``tex-chtml.js`` component, the TeX extensions it loads on demand, the CHTML
fonts and the accessibility and menu components -- to the site under ``javascripts/mathjax/``.
No page loads anything from another host when it is read.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

#: Where the files go in the site; ``mkdocs.yml`` loads ``{SITE_DIR}/tex-chtml.js``.
SITE_DIR = "javascripts/mathjax"
#: The parts of MathJax's ``es5`` build that ``tex-chtml.js`` loads (the rest is unused).
PARTS = ("tex-chtml.js", "input/tex/extensions", "output/chtml/fonts", "a11y", "ui", "sre")


def mathjax_directory() -> Path:
    """MathJax's ``es5`` directory inside the installed ``django-static-mathjax`` package."""
    spec = importlib.util.find_spec("mathjax")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        es5 = Path(location) / "static" / "mathjax" / "es5"
        if (es5 / "tex-chtml.js").is_file():
            return es5
    raise PluginError(
        "MathJax not found: the documentation serves MathJax from the site and takes it from "
        'the PyPI package django-static-mathjax; pip install -e ".[docs]"'
    )


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add MathJax's files to the site's files."""
    es5 = mathjax_directory()
    for part in PARTS:
        source = es5 / part
        paths = [source] if source.is_file() else sorted(source.rglob("*"))
        paths = [path for path in paths if path.is_file()]
        for path in paths:
            uri = f"{SITE_DIR}/{path.relative_to(es5).as_posix()}"
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


# nbconvert puts three blocks into every notebook page that this site does not use: a
# ``<script src="">`` for MathJax 2 (mkdocs-jupyter passes no URL) with its MathJax 2
# configuration, and a module that would import Mermaid from a CDN if a notebook held a Mermaid
# diagram (ours do not). The site's own MathJax 3 typesets the notebooks' maths.
_NBCONVERT_LEFTOVERS = (
    re.compile(r'<script src="">\s*</script>'),
    re.compile(r'<script type="text/x-mathjax-config">.*?</script>', re.DOTALL),
    re.compile(r'<script type="module">(?:(?!</script>).)*?mermaid.*?</script>', re.DOTALL),
)


def on_post_page(output: str, page: Page, config: MkDocsConfig) -> str:
    """Drop nbconvert's unused MathJax 2 and Mermaid loaders from the notebook pages."""
    if page.file.src_uri.endswith(".ipynb"):
        for pattern in _NBCONVERT_LEFTOVERS:
            output = pattern.sub("", output)
    return output
