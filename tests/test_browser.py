"""The rendered book in a real browser: every page that _toc.yml lists, offline, desktop and phone.

The `site` fixture builds the book with the README's strict command,
`jupyter-book build . -W -n --keep-going`, into `_build/` (or into `$BOOK_PATH_OUTPUT/_build/`).
That build is incremental: Sphinx re-reads only the pages that changed and the execution cache
re-runs only the notebooks whose code changed, so an up-to-date `_build/` costs seconds and a
fresh clone gets a full build. A failed build fails the test and drops the Sphinx environment,
so the next build re-reads every page and shows its warnings again.

Each page is then opened in headless Chromium (Debian's `chromium`, driven by Playwright with
`executable_path`; no browser download) with every request that is not `file://` blocked, at a
desktop width (1280 px) and a phone width (390 px). On each page and width:

- MathJax (served from the built site) typeset every formula, and none reports an error;
- every image decoded;
- no uncaught page error, no console error, no failed or blocked request;
- the sidebar links to every page of `_toc.yml` (and is visible on the desktop);
- a notebook page links to its `.ipynb` download and to Binder and Colab;
- the page does not scroll sideways (a phone reader would have to pan the whole page);
- a full-page screenshot is saved to `_build/screenshots/{desktop,phone}/<page>.png`.

Without Chromium (or Playwright) the tests skip and say why; with CI=true they fail instead.

One more test here needs no browser: the sizes the notation page states are the sizes of
mha_lit's running example.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
VIEWPORTS = {"desktop": (1280, 900), "phone": (390, 844)}


def _toc_pages() -> list[str]:
    """Every page of _toc.yml, in reading order, read with the root conftest's own parser."""
    spec = importlib.util.spec_from_file_location("book_toc", ROOT / "conftest.py")
    book_toc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(book_toc)
    return book_toc._toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text()))


PAGES = _toc_pages()


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _cannot_run(reason: str):
    """Fail in CI; elsewhere skip, loudly (a warning in the summary as well as the skip)."""
    message = f"BROWSER TEST NOT RUN: {reason}"
    if _in_ci():
        pytest.fail(f"{message} (CI=true: the browser test must run)", pytrace=False)
    warnings.warn(message, UserWarning, stacklevel=2)
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium driven by Playwright, for this module only."""
    chromium = shutil.which("chromium")
    if chromium is None:
        _cannot_run("Chromium is not installed; install it with `apt-get install -y chromium`")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _cannot_run("Playwright is not installed; `pip install -r requirements.txt` installs it")
    with sync_playwright() as playwright:
        chrome = playwright.chromium.launch(
            executable_path=chromium,
            args=["--disable-gpu", "--disable-background-networking", "--disable-sync"],
        )
        yield chrome
        chrome.close()


def _jupyter_book() -> str:
    beside_python = Path(sys.executable).with_name("jupyter-book")
    return str(beside_python) if beside_python.exists() else shutil.which("jupyter-book")


@pytest.fixture(scope="module")
def site(browser) -> Path:
    """The built HTML folder, brought up to date by the strict build (see the module docstring)."""
    path_output = Path(os.environ.get("BOOK_PATH_OUTPUT", ROOT)).resolve()
    build = path_output / "_build"
    command = [_jupyter_book(), "build", str(ROOT), "-W", "-n", "--keep-going"]
    if path_output != ROOT:
        command += ["--path-output", str(path_output)]
    # Sphinx rewrites only changed pages, but every page's sidebar shows the table of
    # contents: when _toc.yml or _config.yml changed since the last build, rebuild all pages.
    settings = hashlib.sha256(b"".join((ROOT / f).read_bytes()
                                       for f in ("_toc.yml", "_config.yml"))).hexdigest()
    stamp = build / "settings_of_last_build.sha256"
    if not stamp.is_file() or stamp.read_text() != settings:
        command.append("--all")
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    build.mkdir(parents=True, exist_ok=True)
    stamp.write_text(settings if result.returncode == 0 else "")
    (build / "browser_test_build.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        shutil.rmtree(build / ".doctrees", ignore_errors=True)
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
        pytest.fail(f"the strict build failed (exit {result.returncode}):\n{tail}", pytrace=False)
    return build / "html"


# Runs in the page once the load event has fired; returns what the checks need.
INSPECT_PAGE = """
async () => {
  const late = (promise, what) => Promise.race([promise, new Promise((_, reject) =>
    setTimeout(() => reject(new Error(`${what} did not finish within 30 s`)), 30000))]);
  const mathElements = [...document.querySelectorAll("span.math, div.math")];
  let mathjax = null;
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    try { await late(MathJax.startup.promise, "MathJax"); }
    catch (e) { return {timeout: String(e)}; }
    const items = Array.from(MathJax.startup.document.math);
    const mml = items.map((item) => MathJax.startup.toMML(item.root));
    mathjax = {
      version: MathJax.version,
      typeset: items.length,
      errors: mml.filter((m) => m.includes("<merror") || /<mtext[^>]*mathcolor="red"/.test(m))
                 .map((m) => m.slice(0, 200)),
      errorNodes: document.querySelectorAll("mjx-merror").length,
    };
  }
  const untypeset = mathElements.filter((el) => !el.querySelector("mjx-container"))
                                .map((el) => el.textContent.trim().slice(0, 80));
  const images = await Promise.all([...document.images].map(async (img) => {
    img.loading = "eager";
    try { await late(img.decode(), "decoding"); } catch (e) { return img.getAttribute("src"); }
    return img.naturalWidth > 0 ? null : img.getAttribute("src");
  }));
  try { await late(document.fonts.ready, "Loading fonts"); } catch (e) { return {timeout: String(e)}; }
  const nav = document.querySelector("#bd-docs-nav, nav.bd-docs-nav");
  return {
    mathCount: mathElements.length,
    mathjax: mathjax,
    untypeset: untypeset,
    imageCount: images.length,
    brokenImages: images.filter((src) => src !== null),
    sidebarLinks: nav ? [...nav.querySelectorAll("a.reference.internal")]
                       .map((a) => a.href.split("#")[0]) : [],
    headerLinks: [...document.querySelectorAll(".article-header-buttons a")].map((a) => a.href),
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
  };
}
"""


def _check_page(browser, html: Path, page_name: str, viewport: str) -> list[str]:
    """Open one page at one width; return every problem found (empty when all is well)."""
    width, height = VIEWPORTS[viewport]
    problems: list[str] = []
    context = browser.new_context(viewport={"width": width, "height": height})
    context.route(
        lambda url: not url.startswith("file:"),
        lambda route: (problems.append(f"blocked network request: {route.request.url}"),
                       route.abort())[1],
    )
    page = context.new_page()
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}")
            if msg.type == "error" else None)
    page.on("requestfailed", lambda request: problems.append(
        f"request failed: {request.url} ({request.failure})"))
    try:
        page.goto((html / f"{page_name}.html").as_uri(), wait_until="load")
        found = page.evaluate(INSPECT_PAGE)
        shot = html.parent / "screenshots" / viewport / f"{page_name.replace('/', '__')}.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
        sidebar_visible = page.locator(".bd-sidebar-primary").is_visible()
    finally:
        context.close()
    if "timeout" in found:
        return [f"[{viewport}] {found['timeout']}"] + [f"[{viewport}] {p}" for p in problems]

    if found["mathCount"] and found["mathjax"] is None:
        problems.append(f"{found['mathCount']} formulas but MathJax did not load")
    if found["mathjax"]:
        if found["mathjax"]["errors"] or found["mathjax"]["errorNodes"]:
            problems.append(f"MathJax errors: {found['mathjax']['errors']}")
        if found["mathjax"]["typeset"] < found["mathCount"]:
            problems.append(f"MathJax typeset {found['mathjax']['typeset']} of "
                            f"{found['mathCount']} formulas")
    if found["untypeset"]:
        problems.append(f"formulas left as TeX source: {found['untypeset'][:5]}")
    if found["brokenImages"]:
        problems.append(f"images that did not decode: {found['brokenImages']}")
    linked = set(found["sidebarLinks"])
    missing = [p for p in PAGES if (html / f"{p}.html").as_uri() not in linked]
    if missing:
        problems.append(f"sidebar does not list: {missing}")
    if (ROOT / f"{page_name}.ipynb").is_file():
        problems += _notebook_buttons_missing(html, page_name, found["headerLinks"])
    if viewport == "desktop" and not sidebar_visible:
        problems.append("sidebar is not visible at desktop width")
    if found["scrollWidth"] > found["innerWidth"]:
        problems.append(f"page scrolls sideways: {found['scrollWidth']} px wide in a "
                        f"{found['innerWidth']} px window")
    return [f"[{viewport}] {p}" for p in problems]


def _notebook_buttons_missing(html: Path, page_name: str, links: list[str]) -> list[str]:
    """A notebook page offers its .ipynb for download and launch links to Binder and Colab."""
    problems = []
    download = (html / "_sources" / f"{page_name}.ipynb").as_uri()
    if download not in links or not (html / "_sources" / f"{page_name}.ipynb").is_file():
        problems.append(f"no working .ipynb download link ({download})")
    for service in ("https://mybinder.org/", "https://colab.research.google.com/"):
        if not any(link.startswith(service) and f"{page_name}.ipynb" in link for link in links):
            problems.append(f"no launch link to {service} for {page_name}.ipynb")
    return problems


@pytest.mark.parametrize("page_name", PAGES)
def test_page_renders_offline(browser, site, page_name):
    assert (site / f"{page_name}.html").is_file(), f"{page_name} was not built"
    problems = []
    for viewport in VIEWPORTS:
        problems += _check_page(browser, site, page_name, viewport)
    assert not problems, f"{page_name}:\n" + "\n".join(problems)


def test_every_page_of_the_toc_is_checked():
    """The parametrisation above covers the whole table of contents, root page included."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    assert PAGES[0] == toc["root"]
    assert len(PAGES) == len(set(PAGES)) >= 2


def _notation_rows() -> dict[str, tuple[int, ...]]:
    """First cell -> the numbers of the second cell, for every table row of book/notation.md."""
    rows = {}
    for line in (ROOT / "book" / "notation.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| $") and len(cells) >= 2:
            rows[cells[0]] = tuple(int(number) for number in re.findall(r"\d+", cells[1]))
    return rows


def test_notation_page_states_the_sizes_the_code_uses():
    """The sizes on the notation page are those of mha_lit's running example, row by row."""
    from mha_lit import VOCABULARY, Dims, init_block_weights, init_weights

    dims = Dims()
    W = init_weights(dims, seed=0)
    B = init_block_weights(dims, seed=0)
    X = np.zeros((dims.tokens, dims.d_model))  # (n, d_model)
    Q = X @ W.W_Q[0]  # (n, d_k)
    V = X @ W.W_V[0]  # (n, d_v)
    expected = {
        r"$n$": (dims.tokens,), r"$d_\text{model}$": (dims.d_model,), r"$d_k$": (dims.d_k,),
        r"$d_v$": (dims.d_v,), r"$h$": (dims.heads,), r"$h\,d_v$": (dims.concat,),
        r"$d_\text{ff}$": (B.W_1.shape[1],), r"$n_\text{vocab}$": (len(VOCABULARY),),
        r"$X$": X.shape, r"$W_{Qi}$, $W_{Ki}$": W.W_K.shape[1:], r"$W_{Vi}$": W.W_V.shape[1:],
        r"$Q_i$, $K_i$": Q.shape, r"$V_i$": V.shape, r"$Q_i K_i^T$": (Q @ Q.T).shape,
        r"$H_i$": V.shape, r"$\operatorname{Concat}(H_1, H_2)$": (dims.tokens, dims.concat),
        r"$W_O$": W.W_O.shape, r"$Y$": X.shape,
        r"$\gamma_1$, $\beta_1$": B.gamma_1.shape, r"$\gamma_2$, $\beta_2$": B.beta_2.shape,
        r"$W_1$": B.W_1.shape, r"$b_1$": B.b_1.shape, r"$W_2$": B.W_2.shape, r"$b_2$": B.b_2.shape,
    }
    stated = _notation_rows()
    assert {symbol: stated.get(symbol) for symbol in expected} == expected


def test_tables_that_cells_display_render_as_tables(site):
    """A Markdown table a cell displays must become an HTML table, not a paragraph of pipes."""
    import json

    for page in PAGES:
        notebook = ROOT / f"{page}.ipynb"
        if not notebook.is_file():
            continue
        tables = sum(
            1
            for cell in json.loads(notebook.read_text())["cells"]
            for out in cell.get("outputs", [])
            if re.search(r"^\|(---\|)+$", "".join(out.get("data", {}).get("text/markdown", "")), re.M)
        )
        html = (site / f"{page}.html").read_text()
        assert html.count("<table") >= tables, f"{page}: {tables} displayed tables"
        assert not re.search(r"<p>\|[^<]*\|(---\||—\|)", html), f"{page}: a table left as text"
