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
