"""The built documentation site, checked as a reader sees it: every page in headless Chromium.

``nox -s docs`` builds ``site/``; ``nox -s docs_check`` serves it on 127.0.0.1, opens every
page in headless Chromium (driven by Selenium and Debian's ``chromium-driver``) with every other
host unreachable, waits for MathJax and asserts what a reader would notice:

* every formula is typeset -- MathJax output where the source has maths, no raw ``$``, ``\\(``
  or ``\\[`` left in the text, no TeX error, no ``\\_`` shown as such;
* the tutorial pages show their figures, and every image on every page loads;
* nothing is requested from another host (the maths renderer is served by the site) and every
  request to the site succeeds; no JavaScript error;
* no stderr output, warning or build path in the tutorials' outputs, no internal labels
  (seed numbers, benchmark codes) in any page;
* wide tables scroll inside the page instead of running past it.

The tests run only with ``PYRO_SGMCMC_DOCS_CHECK=1`` (set by ``nox -s docs_check``), which makes
a missing site, browser or driver a failure; otherwise they are skipped. ``PYRO_SGMCMC_SITE``,
``CHROMIUM`` and ``CHROMEDRIVER`` override the site folder and the programs.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("PYRO_SGMCMC_SITE", ROOT / "site"))
ENABLED = os.environ.get("PYRO_SGMCMC_DOCS_CHECK") == "1"

pytestmark = pytest.mark.skipif(
    not ENABLED, reason="checks the built site in a browser: run `nox -s docs_check`"
)

#: Labels of the project's internal notes that must not reach a reader.
INTERNAL_LABELS = re.compile(r"\bseed[ -]0\d\d\b|\b[Ww]orkload W\d|\bbenchmark W\d|\bW[1-4]\b")
#: Raw maths delimiters; in rendered text they mean a formula MathJax did not typeset.
RAW_MATHS = re.compile(r"\$|\\\(|\\\)|\\\[|\\\]|\\begin\{")
#: Text in a tutorial's output that a reader should not see.
NOISE_IN_OUTPUTS = re.compile(
    r"Warning\b|Traceback|site-packages|/tmp/|" + re.escape(str(ROOT)), re.IGNORECASE
)


def _program(variable: str, *names: str) -> str | None:
    found = os.environ.get(variable) or next(filter(None, map(shutil.which, names)), None)
    return found if found and Path(found).exists() else None


def _require(condition: bool, message: str) -> None:
    if not condition:
        pytest.fail(message)


def site_pages() -> list[str]:
    """Every HTML page of the site, relative to it (MathJax's own files excluded)."""
    return sorted(
        path.relative_to(SITE).as_posix()
        for path in SITE.rglob("*.html")
        if not path.relative_to(SITE).as_posix().startswith(("assets/", "javascripts/"))
    )


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:
        pass


@pytest.fixture(scope="module")
def server():
    """The site served on 127.0.0.1 at a free port, for the duration of the module."""
    _require((SITE / "index.html").is_file(), f"no built site in {SITE}: run `nox -s docs` first")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium with a fresh profile, network logging, and no route to other hosts."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("the docs check needs selenium: pip install selenium")
    chromium = _program("CHROMIUM", "chromium", "chromium-browser", "google-chrome")
    driver = _program("CHROMEDRIVER", "chromedriver")
    _require(
        chromium is not None and driver is not None,
        "the docs check needs Chromium and its driver: apt-get install chromium chromium-driver",
    )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="docs-check-profile-")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        f"--user-data-dir={profile}",
        # every host but this machine is unreachable, so a CDN request fails instead of hanging
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    chrome.set_page_load_timeout(60)
    chrome.set_script_timeout(60)
    yield chrome
    chrome.quit()
    shutil.rmtree(profile, ignore_errors=True)


_WAIT_FOR_MATHJAX = """
const done = arguments[arguments.length - 1];
const start = Date.now();
(function wait() {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    MathJax.startup.promise.then(() => done("ok"), (error) => done(String(error)));
  } else if (Date.now() - start > 20000) {
    done("MathJax did not start within 20 s");
  } else {
    setTimeout(wait, 50);
  }
})();
"""

_INSPECT = """
const content = document.querySelector(".md-content") || document.body;
const prose = content.cloneNode(true);
// what is left is prose: no code, no code-cell outputs (data, not text), no typeset maths
prose.querySelectorAll(
  "pre, code, kbd, script, style, mjx-container, .jp-InputArea, " +
  ".jp-OutputArea-output:not(.jp-MarkdownOutput)"
).forEach((element) => element.remove());
const outputs = [...content.querySelectorAll(".jp-OutputArea-output")].map((e) => e.innerText);
const words = content.cloneNode(true);  // all text but maths (whose MathML spells symbols out)
words.querySelectorAll("mjx-container, script, style").forEach((element) => element.remove());
const mathml = [];
if (window.MathJax && MathJax.startup && MathJax.startup.document) {
  for (const item of MathJax.startup.document.math) {
    mathml.push(MathJax.startup.toMML(item.root));
  }
}
const contentBox = content.getBoundingClientRect();
const overflowing = [];
for (const table of content.querySelectorAll("table")) {
  let scrolls = false;
  for (let node = table; node && node !== content; node = node.parentElement) {
    const overflow = getComputedStyle(node).overflowX;
    if (overflow === "auto" || overflow === "scroll") { scrolls = true; break; }
  }
  const box = table.getBoundingClientRect();
  if (!scrolls && box.right > contentBox.right + 1) {
    overflowing.push(table.innerText.slice(0, 80));
  }
}
return {
  prose: prose.textContent,
  text: words.textContent,
  outputs: outputs,
  math: document.querySelectorAll("mjx-container").length,
  mathErrors: document.querySelectorAll("mjx-merror").length,
  arithmatex: content.querySelectorAll(".arithmatex").length,
  markdownCells: [...content.querySelectorAll(".jp-MarkdownOutput")].map((e) => e.textContent),
  images: [...content.querySelectorAll("img")].map((i) => [i.currentSrc, i.naturalWidth]),
  stderr: content.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]').length,
  mathml: mathml,
  overflowing: overflowing,
};
"""


def _network(chrome) -> tuple[list[str], list[str]]:
    """The URLs the last page requested, and descriptions of the requests that failed."""
    requested, failed, urls = [], [], {}
    for entry in chrome.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message["method"] == "Network.requestWillBeSent":
            url = params["request"]["url"]
            urls[params["requestId"]] = url
            requested.append(url)
        elif message["method"] == "Network.responseReceived":
            status = params["response"]["status"]
            if status >= 400:
                failed.append(f"{params['response']['url']}: HTTP {status}")
        elif message["method"] == "Network.loadingFailed" and not params.get("canceled"):
            url = urls.get(params["requestId"], "?")
            failed.append(f"{url}: {params.get('errorText')}")
    return requested, failed


@pytest.fixture(scope="module")
def rendered(server, browser) -> dict[str, dict]:
    """Every page as the browser rendered it, with its requests and console errors."""
    pages = {}
    browser.get("about:blank")
    for page in site_pages():
        browser.get_log("performance")  # drop what earlier pages logged
        browser.get_log("browser")
        browser.get(f"{server}/{page}")
        state = browser.execute_async_script(_WAIT_FOR_MATHJAX)
        info = browser.execute_script(_INSPECT)
        info["mathjax"] = state
        info["requested"], info["failed"] = _network(browser)
        info["console"] = [
            entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"
        ]
        pages[page] = info
    return pages


def _tutorials(rendered: dict[str, dict]) -> dict[str, dict]:
    return {page: info for page, info in rendered.items() if re.match(r"tutorials/0\d_", page)}


def _report(problems: list[str]) -> str:
    return "\n".join(problems[:40]) + (
        f"\n... and {len(problems) - 40} more" if len(problems) > 40 else ""
    )


def test_the_site_has_the_pages_of_the_navigation(rendered):
    for page in ("index.html", "cli/index.html", "kernels/index.html", "api/kernels/index.html"):
        assert page in rendered
    sources = sorted(Path(__file__).resolve().parents[1].glob("tutorials/[0-9][0-9]_*.py"))
    assert len(_tutorials(rendered)) == len(sources) > 0, sorted(rendered)


def test_every_formula_is_typeset(rendered):
    problems = []
    for page, info in rendered.items():
        if info["mathjax"] != "ok":
            problems.append(f"{page}: {info['mathjax']}")
            continue
        raw = RAW_MATHS.search(info["prose"])
        if raw:
            around = info["prose"][max(raw.start() - 60, 0) : raw.end() + 60].replace("\n", " ")
            problems.append(f"{page}: raw maths left in the text: ...{around}...")
        if info["math"] < info["arithmatex"]:
            problems.append(f"{page}: {info['arithmatex']} formulas, {info['math']} typeset")
        if any("$" in cell for cell in info["markdownCells"]) or info["arithmatex"]:
            if info["math"] == 0:
                problems.append(f"{page}: the source has maths but no MathJax output")
        if info["mathErrors"]:
            problems.append(f"{page}: {info['mathErrors']} TeX error(s)")
        for mathml in info["mathml"]:
            shown = re.search(r"<mtext[^>]*>[^<]*\\[^<]*</mtext>", mathml)
            if shown:
                problems.append(f"{page}: a backslash shown in text: {shown.group(0)}")
    assert not problems, _report(problems)
    assert sum(info["math"] for info in rendered.values()) > 100


def test_tutorials_show_their_figures_and_every_image_loads(rendered):
    problems = []
    for page, info in _tutorials(rendered).items():
        if not any(width > 0 for _, width in info["images"]):
            problems.append(f"{page}: no figure")
    for page, info in rendered.items():
        problems += [f"{page}: image not loaded: {src[:80]}" for src, w in info["images"] if w == 0]
    assert not problems, _report(problems)


def test_nothing_is_requested_from_another_host(rendered, server):
    local = urlsplit(server).netloc
    problems = []
    for page, info in rendered.items():
        for url in info["requested"]:
            parts = urlsplit(url)
            if parts.scheme in ("data", "blob", "about", "chrome", "chrome-untrusted", "devtools"):
                continue  # inline data and the browser's own pages: no network
            if parts.netloc != local:
                problems.append(f"{page}: requested {url}")
        problems += [f"{page}: failed {failure}" for failure in info["failed"]]
    assert not problems, _report(problems)
    mathjax = [url for info in rendered.values() for url in info["requested"] if "mathjax" in url]
    assert any(url.endswith("/javascripts/mathjax/tex-chtml.js") for url in mathjax)


def test_no_javascript_errors(rendered):
    problems = [f"{page}: {m}" for page, info in rendered.items() for m in info["console"]]
    assert not problems, _report(problems)


def test_tutorial_outputs_hold_results_only(rendered):
    problems = []
    for page, info in _tutorials(rendered).items():
        if info["stderr"]:
            problems.append(f"{page}: {info['stderr']} stderr output(s)")
        for output in info["outputs"]:
            noise = NOISE_IN_OUTPUTS.search(output)
            if noise:
                problems.append(f"{page}: {noise.group(0)!r} in an output: {output[:120]!r}")
    assert not problems, _report(problems)


def test_results_are_rendered_tables(rendered):
    """The tables a tutorial computes are HTML tables, not text printed in columns."""
    for page, info in _tutorials(rendered).items():
        for output in info["outputs"]:
            assert not re.search(r"^\|[-:|]+\|$", output, re.MULTILINE), (page, output[:200])
            assert not re.search(r"^-{3,}(  -{3,})+$", output, re.MULTILINE), (page, output[:200])


def test_no_internal_labels(rendered):
    problems = []
    for page, info in rendered.items():
        for match in INTERNAL_LABELS.finditer(info["text"]):
            around = info["text"][max(match.start() - 60, 0) : match.end() + 40]
            problems.append(f"{page}: {match.group(0)!r} in ...{around.replace(chr(10), ' ')}...")
    assert not problems, _report(problems)


def test_wide_tables_scroll_instead_of_running_off_the_page(rendered):
    problems = [
        f"{page}: table runs past the content: {table!r}"
        for page, info in rendered.items()
        for table in info["overflowing"]
    ]
    assert not problems, _report(problems)


#: What a reader cannot place, on top of :data:`INTERNAL_LABELS`: any benchmark code (``W5``,
#: ``W1g``), the words the benchmarks use for themselves ("workload", "anchors"), a source named
#: "the blog" instead of by its title and author, notes to self ("we checked", TODO). Searched
#: in prose and in outputs, never in code: a command that reproduces a number
#: (``python benchmarks/w5_lenet.py``) is not a label.
UNPLACEABLE_WORDS = re.compile(
    INTERNAL_LABELS.pattern
    + r"|\bW\d+[a-z]?\b"
    + r"|(?i:\bworkloads?\b|\banchors\b|\bpublished anchor\b|\bthe blog\b|\bblog's\b"
    + r"|\bseed documents?\b|\bwe checked\b|\bTODO\b|\bFIXME\b)"
)
#: Code and maths in a markdown source: fenced blocks, inline code and inline maths (which may
#: run over a line end), display maths.
_MARKDOWN_CODE_AND_MATHS = re.compile(r"```.*?```|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$", re.DOTALL)


def unplaceable_words(where: str, text: str) -> list[str]:
    """One problem for each of :data:`UNPLACEABLE_WORDS` in ``text``, with its context."""
    return [
        f"{where}: {match.group(0)!r} in ..."
        + text[max(match.start() - 60, 0) : match.end() + 40].replace("\n", " ")
        + "..."
        for match in UNPLACEABLE_WORDS.finditer(text)
    ]


def notebook_reader_texts(path: Path) -> list[tuple[str, str]]:
    """What a reader of a notebook reads as words: its markdown cells without code or maths, and
    its text outputs (printed streams, plain-text and markdown results), as (where, text)."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    texts = []
    for number, cell in enumerate(notebook["cells"], start=1):
        where = f"{path.name}, cell {number}"
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            texts.append((where, _MARKDOWN_CODE_AND_MATHS.sub(" ", source)))
        for output in cell.get("outputs", []):
            text = output.get("text", "")
            data = output.get("data", {})
            for value in (text, data.get("text/plain", ""), data.get("text/markdown", "")):
                value = "".join(value)
                if value:
                    texts.append((f"{where}, output", value))
    return texts


def test_no_benchmark_codes_or_internal_words_on_any_page(rendered):
    """Every page says what was measured in words a reader knows (the network, the data, the
    machine) and cites a source by its title: no ``W5``, "workload", "anchors", "the blog"."""
    problems = []
    for page, info in rendered.items():
        problems += unplaceable_words(page, info["prose"])
        for output in info["outputs"]:
            problems += unplaceable_words(f"{page}, output", output)
    assert not problems, _report(problems)


def test_no_benchmark_codes_or_internal_words_in_the_notebooks():
    """The same words in the committed notebooks, read as files: markdown cells and outputs."""
    notebooks = sorted(ROOT.glob("tutorials/[0-9][0-9]_*.ipynb"))
    assert notebooks
    problems = [
        problem
        for notebook in notebooks
        for where, text in notebook_reader_texts(notebook)
        for problem in unplaceable_words(where, text)
    ]
    assert not problems, _report(problems)


# --- The API pages' parameter sections and the reading width --------------------------------
# (docs/griffe_forwarded_params.py gives the kernels the signature that receives their
# **kwargs; docs/stylesheets/extra.css and `toc.integrate` widen the content column.)

#: The kernels, whose options reach ``StochasticGradientKernel.__init__`` through ``**kwargs``.
KERNELS = ("SGLD", "SGHMC", "PSGLD", "ConstantSGD")
_VARIADIC = "*variadic*"

_PARAMETER_ROWS = """
// Every row of a Parameters section on the page, with the object it documents; both the
// "spacy" style (TYPE:/DEFAULT: under the description) and the four-column "table" style.
const rows = [];
const text = (element) => (element ? element.innerText.trim() : null);
for (const table of document.querySelectorAll(".md-content table")) {
  const headers = [...table.querySelectorAll("thead th")].map((th) => th.innerText.trim());
  const spacy = headers.length === 2 && /^PARAMETERS?$/i.test(headers[0]);
  // the section title precedes the table, or the wrappers Material puts around tables
  let anchor = table;
  while (!anchor.previousElementSibling && anchor.parentElement) anchor = anchor.parentElement;
  const title = anchor.previousElementSibling ? anchor.previousElementSibling.innerText : "";
  const classic = headers.join("|").toLowerCase() === "name|type|description|default"
    && /^parameters/i.test(title.trim());
  if (!spacy && !classic) continue;
  const object = table.closest(".doc-object");
  const heading = object && object.querySelector(":scope > .doc-heading");
  for (const row of table.querySelectorAll(":scope > tbody > tr")) {
    const cells = row.querySelectorAll(":scope > td");
    const item = {owner: heading ? heading.id : null, name: text(cells[0]), row: row.innerText};
    if (spacy) {
      item.type = text(row.querySelector(".doc-param-annotation code"));
      item.default = text(row.querySelector(".doc-param-default code"));
    } else {
      item.type = text(cells[1]);
      item.default = text(cells[3]) === "required" ? null : text(cells[3]);
    }
    rows.push(item);
  }
}
return rows;
"""


@pytest.fixture(scope="module")
def code_parameters():
    """``(lookup, normal)``: ``lookup(anchor)`` gives the parameters in the code of the object an
    API entry documents (name -> its default's source, ``None`` when required), or ``None``
    when the source alone cannot tell; ``normal(source)`` spells a value the way ``ast`` does.
    The package is read with ``ast``: the check imports neither torch nor the package."""
    import ast  # here, not at the top: this part of the module was appended

    classes: dict[str, ast.ClassDef] = {}
    functions: dict[str, list[ast.FunctionDef]] = {}
    for path in sorted((ROOT / "pyro_sgmcmc").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.setdefault(node.name, []).append(node)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, node)

    def arguments(function):
        args = function.args
        positional = args.posonlyargs + args.args
        defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        pairs = [
            *zip(positional, defaults, strict=True),
            *zip(args.kwonlyargs, args.kw_defaults, strict=True),
        ]
        found = {arg.arg: None if value is None else ast.unparse(value) for arg, value in pairs}
        for variadic in (args.vararg, args.kwarg):
            if variadic is not None:
                found[variadic.arg] = _VARIADIC
        found.pop("self", None)
        found.pop("cls", None)
        return found

    def bases(name):
        nodes = classes[name].bases
        return [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in nodes]

    def method(class_name, name):
        """(defining class, ``class_name.name``) from the class or its nearest package base."""
        if class_name not in classes:
            return None
        for item in classes[class_name].body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                return class_name, item
        return next(filter(None, (method(base, name) for base in bases(class_name))), None)

    def accepted(class_name):
        """What ``class_name(...)`` accepts: its ``__init__``'s parameters and, when they hand
        ``**kwargs`` on to ``super().__init__``, the base class's (the subclass's own win)."""
        found = method(class_name, "__init__")
        if found is None:
            return {}
        owner, init = found
        parameters = arguments(init)
        if init.args.kwarg is not None and "super().__init__(" in ast.unparse(init):
            for base in bases(owner):
                for name, default in accepted(base).items():
                    parameters.setdefault(name, default)
        return parameters

    def lookup(anchor):
        parts = anchor.split(".")
        if parts[-1] in classes:
            return accepted(parts[-1])
        if len(parts) > 1 and parts[-2] in classes:
            found = method(parts[-2], parts[-1])
            return None if found is None else arguments(found[1])
        if len(functions.get(parts[-1], [])) == 1:
            return arguments(functions[parts[-1]][0])
        return None

    def normal(source):
        try:
            return ast.unparse(ast.parse(source.strip(), mode="eval"))
        except SyntaxError:
            return " ".join(source.split())

    return lookup, normal


def test_kernel_parameters_show_the_codes_types_and_defaults(server, browser, code_parameters):
    """The kernels' page: every parameter row has a type, and a parameter with a default in the
    code shows that default, not "required" -- also the options the kernels take through
    ``**kwargs`` (their defaults are in ``StochasticGradientKernel.__init__``)."""
    browser.get(f"{server}/api/kernels/index.html")
    rows = browser.execute_script(_PARAMETER_ROWS)
    lookup, normal = code_parameters
    problems = []
    for row in rows:
        where = f"{row['owner']}({row['name']})"
        if re.search(r"<\w+(\.\w+)+>", row["row"]):
            problems.append(f"{where}: a raw cross-reference in the text: {row['row'][:200]!r}")
        code = lookup(row["owner"] or "")
        name = row["name"].lstrip("*")
        if code is not None and name not in code:
            problems.append(f"{where}: documented, but the code takes no such parameter")
            continue
        default = None if code is None else code[name]
        if default == _VARIADIC:
            # *args / **kwargs hold values of many types and have no default: the row says which
            # callable's arguments they are (e.g. "The arguments of SGLD").
            continue
        if not row["type"]:
            problems.append(f"{where}: no type")
        if default is None:
            continue
        if row["default"] is None or re.search(r"\brequired\b", row["row"].splitlines()[-1]):
            problems.append(f"{where}: shown as required, the code's default is {default}")
        elif normal(row["default"]) != normal(default):
            problems.append(f"{where}: default shown {row['default']!r}, in the code {default}")
    assert not problems, _report(problems)
    # not vacuous: every kernel's section lists its options with types and defaults
    for kernel in KERNELS:
        listed = [row for row in rows if row["owner"] == f"pyro_sgmcmc.{kernel}"]
        with_defaults = [row for row in listed if row["default"] is not None and row["type"]]
        assert len(with_defaults) >= 2, (kernel, listed)
    sgld = {row["name"] for row in rows if row["owner"] == "pyro_sgmcmc.SGLD"}
    assert {"temperature", "seed", "batch_size", "init_strategy"} <= sgld, sorted(sgld)


#: The pages whose reading width is checked: the home page, a tutorial, an API page.
LAYOUT_PAGES = (
    "index.html",
    "tutorials/01_linear_regression/index.html",
    "api/kernels/index.html",
)
#: The content column at a 1280 px window is at least this wide (px).
MIN_CONTENT_WIDTH = 900

_LAYOUT = """
const content =
  document.querySelector(".md-content__inner") || document.querySelector(".md-content");
const column = content.getBoundingClientRect();
const scrolls = (element) => {
  for (let node = element; node && node !== content; node = node.parentElement) {
    const overflow = getComputedStyle(node).overflowX;
    if (overflow === "auto" || overflow === "scroll") return true;
  }
  return false;
};
const describe = (element) =>
  `${element.tagName.toLowerCase()}.${String(element.className).split(" ")[0]}: ` +
  JSON.stringify((element.innerText || element.getAttribute("src") || "").slice(0, 60));
const cut = [];
const blocks = content.querySelectorAll(
  "pre, pre > code, table, figure, img, .highlight, .jp-OutputArea-output, .jp-InputArea"
);
let scrolling = 0;
for (const element of blocks) {
  const box = element.getBoundingClientRect();
  if (box.width === 0) continue;  // not shown (a closed <details>)
  const ownOverflow = getComputedStyle(element).overflowX;
  const scrollable = ownOverflow === "auto" || ownOverflow === "scroll";
  if (element.scrollWidth > element.clientWidth + 1) {
    if (scrollable) scrolling += 1;
    else cut.push(`wider than its box (${element.scrollWidth} > ${element.clientWidth} px), ` +
                  `no scroll bar: ${describe(element)}`);
  }
  if (box.right > column.right + 1 && !scrolls(element.parentElement)) {
    const past = Math.round(box.right - column.right);
    cut.push(`runs ${past} px past the column: ${describe(element)}`);
  }
}
const images = [...content.querySelectorAll("img")].map((image) => ({
  src: (image.getAttribute("src") || "").slice(0, 60),
  natural: image.naturalWidth,
  width: image.getBoundingClientRect().width,
}));
return {
  window: window.innerWidth,
  column: content.clientWidth,
  cut: cut,
  scrolling: scrolling,
  images: images,
};
"""


def _screenshot(
    browser, directory: Path, name: str, selector: str | None = None, widest: bool = True
) -> None:
    """A screenshot of the window, scrolled to the widest (or first) match of ``selector``."""
    import time  # here, not at the top: this part of the module was appended

    if selector is not None:
        found = browser.execute_script(
            "const all = [...document.querySelectorAll(arguments[0])];"
            "if (arguments[1]) all.sort((a, b) => b.scrollWidth - a.scrollWidth);"
            "const e = all[0];"
            "if (!e) return false;"
            "const y = e.getBoundingClientRect().top + window.scrollY - 80;"
            "window.scrollTo(0, 0); window.scrollTo(0, y); return true;",
            selector,
            widest,
        )
        if not found:
            return
        time.sleep(0.5)  # the header's title changes with an animation on scrolling
    browser.save_screenshot(str(directory / f"{name}.png"))


def test_reading_width_fits_figures_code_and_tables(server, browser):
    """At a 1280x900 window the content column is wide (>= 900 px), no code block, table or
    figure is wider than its visible box without a scroll bar, and the figures fit the column.
    With ``DOCS_SCREENSHOTS`` set, screenshots of the pages go to that folder."""
    shots = os.environ.get("DOCS_SCREENSHOTS")
    directory = Path(shots) if shots else None
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    browser.set_window_size(1280, 900)
    problems = []
    for page in LAYOUT_PAGES:
        browser.get(f"{server}/{page}")
        browser.execute_async_script(_WAIT_FOR_MATHJAX)
        layout = browser.execute_script(_LAYOUT)
        if layout["column"] < MIN_CONTENT_WIDTH:
            problems.append(
                f"{page}: content column {layout['column']} px at a {layout['window']} px window"
            )
        problems += [f"{page}: {problem}" for problem in layout["cut"]]
        for image in layout["images"]:
            if image["width"] > layout["column"] + 1:
                problems.append(f"{page}: image wider than the column: {image}")
            if image["natural"] and image["width"] < min(image["natural"], layout["column"]) / 2:
                problems.append(f"{page}: image shown at under half its size: {image}")
        if directory is not None:
            name = page.removesuffix("/index.html").removesuffix(".html").replace("/", "-")
            _screenshot(browser, directory, f"{name}-top")
            _screenshot(browser, directory, f"{name}-figure", ".md-content img")
            _screenshot(browser, directory, f"{name}-code", ".md-content pre")
            _screenshot(browser, directory, f"{name}-table", ".jp-OutputArea-output table")
            _screenshot(browser, directory, f"{name}-parameters", ".doc-contents table", False)
    assert not problems, _report(problems)
