"""The rendered book in a real browser: every page that _toc.yml lists, offline, desktop and phone.

The `site` fixture builds the book with the README's strict command,
`jupyter-book build . -W -n --keep-going`, into `_build/` (or into `$BOOK_PATH_OUTPUT/_build/`).
The book renders the notebooks' stored outputs (`execute_notebooks: "off"` in _config.yml), the
outputs that nbval re-executes and compares in the same `pytest` run, so the build runs no
notebook. It is incremental: Sphinx re-reads only the pages that changed, so an up-to-date
`_build/` costs seconds. A failed build fails the test and drops the Sphinx environment, so the
next build re-reads every page and shows its warnings again.

Each page is then opened in headless Chromium (Debian's `chromium`, driven by Playwright with
`executable_path`; no browser download) with every request that is not `file://` blocked, at a
desktop width (1280 px) and a phone width (390 px), in the theme's light and dark mode (set as
its switch sets them, in localStorage): loaded once per mode at the phone's width, then widened
to the desktop's as a window is resized. On each page, width and mode:

- MathJax (served from the built site) typeset every formula, and none reports an error;
- every image decoded;
- no uncaught page error, no console error, no failed or blocked request;
- the sidebar links to every page of `_toc.yml` (and is visible on the desktop);
- a notebook page links to its `.ipynb` download and to Binder and Colab;
- the page does not scroll sideways (a phone reader would have to pan the whole page);
- it can be read: every image and interactive figure of the text sits on a light panel
  (undimmed, relative luminance above 0.8, in the light theme; dimmed to an off-white of 0.6 to
  0.85 as seen in the dark theme), and every piece of text of the article, solutions and
  hidden cells opened, has WCAG contrast of at least 4.5 against what lies behind it (3 for
  large text), computed from the browser's own colours;
- at 1280 px, no code cell (input or printed output) is wider than its box (the text column
  holds about 77 characters of code, 75 inside a toggle that hides a cell or its code);
- it fits its column (`_misfits` states the thresholds): no display equation cut off, or
  scrolling without the fade that shows it scrolls, or with its number on the formula; at
  390 px no code input wider than the column, and no printed output that scrolls unseen; no
  table wider than its box, and no table cell of prose squeezed below 8 em; every image drawn
  at 0.62 of its size or more (its smallest text, 7 pt at 100 dpi, keeps 6 px), linked to its
  file, with alt text that is not a file name; no build markup in the text;
- a full-page screenshot is saved to `_build/screenshots/{desktop,phone}/<page>.png`, and for
  the dark mode to `_build/screenshots/{dark-desktop,dark-phone}/<page>.png`.

A chapter printed from its page (Chromium's own printing) keeps its number in its title, its
folded code and its solutions, and prints no navigation.

The first look's interactive heatmap is also used: hovering a cell shows its query, key and
weight (checked against mha_lit), the buttons switch heads, and a tap works on a phone.

Without Chromium (or Playwright) the tests skip and say why; with CI=true they fail instead.

One more test here needs no browser: the sizes the notation page states are the sizes of
mha_lit's running example.

Every test here is marked `book`. Under pytest-xdist the module is one unit of work: one worker
builds the book once and opens its pages. The PDF test (tests/test_pdf.py) may run beside it in
the other worker: its single-page build writes only into `_build/pdf/`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import book_pages
import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import offline_browser  # noqa: E402  (scripts/offline_browser.py)

VIEWPORTS = {"desktop": (1280, 900), "phone": (390, 844)}
THEMES = ("light", "dark")  # the theme's toggle; light is the first visit's default
# WCAG 2.1 minimum contrast (success criterion 1.4.3): normal text, and large text
# (24 px, or 18.66 px bold).
TEXT_CONTRAST, LARGE_TEXT_CONTRAST = 4.5, 3.0
# A figure's black text needs a light panel: the relative luminance behind an image, as the
# reader sees it. In the light theme the panel is white or nearly (above 0.8, not dimmed); in
# the dark theme it is dimmed to an off-white that does not glare beside the dark page (0.6 to
# 0.85; black text on 0.6 still has a contrast of 13).
LIGHT_PANEL = 0.8
DARK_THEME_PANEL = (0.6, 0.85)


PAGES = book_pages.toc_pages()
pytestmark = pytest.mark.book


def _cannot_run(reason: str):
    book_pages.cannot_run("browser test", reason)


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
        chrome = offline_browser.launch(playwright, chromium)
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
    # Sphinx rewrites only changed pages, and copies the static files only when it writes a
    # page; but every page's sidebar shows the table of contents, and every page loads
    # book/_static and is shaped by book/_ext: when one of those changed since the last
    # build, rebuild all pages.
    settings_files = [ROOT / "_toc.yml", ROOT / "_config.yml",
                      *sorted((ROOT / "book" / "_static").rglob("*.*")),
                      *sorted((ROOT / "book" / "_ext").glob("*.py"))]
    settings = hashlib.sha256(b"".join(f.read_bytes() for f in settings_files)).hexdigest()
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


# Runs in the page after its window was resized: book.js lays the page out again in the next
# animation frame; two more let the browser draw the result.
AFTER_RESIZE = """
() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(
  () => requestAnimationFrame(r))))
"""

# Runs in the page once the load event has fired; returns what the checks need.
INSPECT_PAGE = """
async () => {
  const late = (promise, what) => Promise.race([promise, new Promise((_, reject) =>
    setTimeout(() => reject(new Error(`${what} did not finish within 30 s`)), 30000))]);
  // Formulas of the text; not the copies of a table's headings that book.js puts in its cells
  // for the phone's cards (copied from typeset headings).
  const mathElements = [...document.querySelectorAll("span.math, div.math")]
    .filter((el) => !el.closest(".mha-card-label"));
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


# Runs in the page after INSPECT_PAGE: what a reader of this theme can and cannot read.
INSPECT_LEGIBILITY = """
([textContrast, largeTextContrast]) => {
  const parse = (css) => {
    let m = css.match(/^rgba?\\(([^)]*)\\)$/);
    if (m) {
      const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
      return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    }
    m = css.match(/^color\\(srgb ([^)]*)\\)$/);
    if (m) {
      const p = m[1].split(/[\\s\\/]+/).filter(Boolean).map(Number);
      return [p[0] * 255, p[1] * 255, p[2] * 255, p.length > 3 ? p[3] : 1];
    }
    return null;
  };
  const unreadable = [];
  const colour = (el, property) => {
    const css = getComputedStyle(el)[property];
    const c = parse(css);
    if (c === null) unreadable.push(`${property} ${css}`);
    return c || [0, 0, 0, 0];
  };
  const over = ([r, g, b, a], [R, G, B]) =>
    [r * a + R * (1 - a), g * a + G * (1 - a), b * a + B * (1 - a)];
  // The colour behind an element: its own background and its ancestors', composited.
  const background = (el) => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = colour(e, "backgroundColor");
      if (c[3] > 0) layers.push(c);
      if (c[3] >= 1) break;
    }
    return layers.reverse().reduce((below, layer) => over(layer, below), [255, 255, 255]);
  };
  // WCAG 2.1 relative luminance and contrast ratio.
  const luminance = (rgb) => {
    const [r, g, b] = rgb.map((v) => {
      const s = v / 255;
      return s <= 0.03928 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const contrast = (a, b) => {
    const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
    return (hi + 0.05) / (lo + 0.05);
  };
  const shown = (el) => el.getClientRects().length > 0 &&
                        getComputedStyle(el).visibility !== "hidden";
  const article = document.querySelector("article.bd-article");
  // Open what the reader can open (solutions, hidden code cells), so their text is checked too.
  for (const details of article.querySelectorAll("details")) details.open = true;
  for (const title of article.querySelectorAll(".toggle-hidden > .admonition-title")) title.click();
  const hex = (rgb) => "#" + rgb.map((v) => Math.round(v).toString(16).padStart(2, "0")).join("");

  // Every image and interactive figure of the text sits on a light panel.
  const figures = [...article.querySelectorAll("img, .mha-attn")].filter(shown).map((el) => {
    const bg = background(el);
    // A filter that dims the image (brightness below 1) greys its white and its black text:
    // what the reader sees is the panel's colour times that factor.
    const brightness = [...getComputedStyle(el).filter.matchAll(/brightness\\(([\\d.]+)\\)/g)]
      .reduce((product, m) => product * Number(m[1]), 1);
    const seen = bg.map((v) => Math.min(255, v * brightness));
    return {what: el.getAttribute("src") || el.className, luminance: luminance(seen),
            bg: hex(seen), brightness};
  });

  // Every piece of text of the article (prose, tables, code, outputs, admonitions, captions)
  // against the colour behind it. MathJax draws in the text's colour; SVG text has its own
  // fill and sits on the figure's light panel.
  const texts = new Map();
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!node.textContent.trim() || texts.has(el) || el.closest("svg, mjx-container")) continue;
    if (!shown(el)) continue;
    const style = getComputedStyle(el);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
    const fg = colour(el, "color");
    const bg = background(el);
    const ratio = contrast(over(fg, bg), bg);
    texts.set(el, true);
    if (ratio < (large ? largeTextContrast : textContrast)) {
      texts.set(el, {text: node.textContent.trim().slice(0, 40), ratio: ratio.toFixed(2),
                     fg: hex(over(fg, bg)), bg: hex(bg),
                     where: el.tagName.toLowerCase() + "." + [...el.classList].join(".")});
    }
  }
  const lowContrast = [...texts.values()].filter((v) => v !== true);

  // Code wider than its box: the reader would have to scroll it sideways.
  const wideCode = [...article.querySelectorAll("div.cell_input pre, div.cell_output pre")]
    .filter((pre) => shown(pre) && pre.scrollWidth > pre.clientWidth + 1)
    .map((pre) => {
      const cells = [...article.querySelectorAll("div.cell")];
      const cell = pre.closest("div.cell");
      const lines = pre.textContent.split("\\n");
      const widest = lines.reduce((a, b) => (b.length > a.length ? b : a), "");
      return {cell: cells.indexOf(cell), part: pre.closest("div.cell_input") ? "input" : "output",
              overflow: pre.scrollWidth - pre.clientWidth, line: widest.slice(0, 100)};
    });
  return {theme: document.documentElement.dataset.theme, figures, lowContrast, wideCode,
          textsChecked: texts.size, unreadable: [...new Set(unreadable)]};
}
"""


# Runs in the page after INSPECT_LEGIBILITY (solutions and hidden cells open): what does not
# fit the column, and whether the reader can tell and reach it.
INSPECT_LAYOUT = """
async ([figureScale]) => {
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  const article = document.querySelector("article.bd-article");
  const shown = (el) => el.getClientRects().length > 0 &&
                        getComputedStyle(el).visibility !== "hidden";
  const wider = (el) => el.scrollWidth > el.clientWidth + 1;
  const cued = (el) => {
    const s = getComputedStyle(el);
    return [s.maskImage, s.webkitMaskImage].some((m) => m && m.includes("gradient"));
  };
  const scrolls = (el) => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
  const text = (el) => el.textContent.trim().replace(/\\s+/g, " ").slice(0, 60);
  const equations = {count: 0, scrolling: 0, cut: [], uncued: [], numberOnFormula: []};
  for (const eq of article.querySelectorAll("div.math")) {
    if (!shown(eq)) continue;
    equations.count++;
    const container = eq.querySelector(":scope > mjx-container");
    const tex = eq.id || text(eq);
    // The box that scrolls is the equation's own (book.css) or, in the theme's own style, its
    // formula's container; a container that does not scroll overflows into the equation's box.
    for (const box of [eq, container].filter((b) => b && (b === eq || scrolls(b)))) {
      if (!wider(box)) continue;
      if (!scrolls(box)) equations.cut.push(tex);
      else {
        equations.scrolling++;
        if (!cued(box)) equations.uncued.push(tex);
      }
    }
    const number = eq.querySelector(":scope > span.eqno");
    const formula = eq.querySelector("mjx-math");
    // Overflow to the left of the box cannot be scrolled to: that part of the formula is cut.
    if (formula && eq.scrollLeft === 0 &&
        formula.getBoundingClientRect().left < eq.getBoundingClientRect().left - 1) {
      equations.cut.push(tex);
    }
    if (number && formula) {
      const n = number.getBoundingClientRect(), f = formula.getBoundingClientRect();
      const view = eq.getBoundingClientRect();
      const right = Math.min(f.right, view.right);
      if (n.left < right - 1 && f.left < n.right - 1 && n.top < f.bottom - 1 && f.top < n.bottom - 1) {
        equations.numberOnFormula.push(tex);
      }
    }
  }
  const pres = (part) => [...article.querySelectorAll(`div.${part} pre`)].filter(shown);
  const code = {inputs: 0, inputsScrolling: [], outputs: 0, outputsScrolling: 0, outputsUncued: []};
  for (const pre of pres("cell_input")) {
    code.inputs++;
    if (wider(pre)) code.inputsScrolling.push(text(pre));
  }
  for (const pre of pres("cell_output")) {
    code.outputs++;
    if (wider(pre)) {
      code.outputsScrolling++;
      if (!cued(pre) || !scrolls(pre)) code.outputsUncued.push(text(pre));
    }
  }
  const tables = {count: 0, cards: 0, hidingColumns: [], squeezed: []};
  for (const table of article.querySelectorAll("table")) {
    if (!shown(table)) continue;
    tables.count++;
    if (table.classList.contains("mha-cards")) tables.cards++;
    const box = table.parentElement;
    if (table.getBoundingClientRect().width > box.clientWidth + 1) {
      tables.hidingColumns.push(text(table.querySelector("tr") || table));
    }
    const em = parseFloat(getComputedStyle(table).fontSize);
    for (const cell of table.querySelectorAll("td")) {
      const shownText = cell.cloneNode(true);  // not a card's hidden label, nor MathJax's copy
      shownText.querySelectorAll(".mha-card-label, mjx-assistive-mml").forEach((e) => e.remove());
      const words = shownText.textContent.trim();
      if (words.length >= 40 && cell.getBoundingClientRect().width < 8 * em) {
        tables.squeezed.push(words.slice(0, 40));
      }
    }
  }
  const figures = [];
  for (const img of article.querySelectorAll("img")) {
    if (!shown(img)) continue;
    const s = getComputedStyle(img);
    const drawn = img.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
    const link = img.closest("a");
    const alt = img.getAttribute("alt") || "";
    figures.push({src: img.getAttribute("src"), scale: drawn / img.naturalWidth,
                  linked: !!link && link.href === img.src,
                  altIsPath: !alt.trim() || /\\.(png|jpe?g|svg|gif|webp)\\s*$/i.test(alt) ||
                             /(^|\\/)_images\\/|[0-9a-f]{20}/.test(alt),
                  boxScrolls: !!link && wider(link), cued: !!link && (!wider(link) || cued(link))});
  }
  const plumbing = (article.innerText.match(/glue\\(|NBVAL|nbval-|remove-(cell|input|output)/g) || []);
  return {equations, code, tables, figures, plumbing: [...new Set(plumbing)]};
}
"""

# Figures are drawn with text of 7 pt or more at 100 dpi (tests/test_plots.py): 9.7 px at full
# size. Drawn at no less than this share of their size, that text keeps 6 px on any screen.
FIGURE_SCALE = 0.62


def _check_page(browser, html: Path, page_name: str,
                theme: str = "light") -> dict[str, tuple[list[str], dict]]:
    """Open one page in one theme at both widths; per width, every problem found and what was
    seen.

    The page is loaded once, at the phone's width, and then widened to the desktop's: the
    theme's style sheets and book.js (which lays the page out again on every resize) decide
    the layout of each width, so the second width needs no second load.
    """
    results = {}
    problems: list[str] = []
    width, height = VIEWPORTS["phone"]
    context = browser.new_context(viewport={"width": width, "height": height})
    # The theme's own switch stores the choice in localStorage ("mode" and "theme"); the
    # page's first script reads it back before anything is drawn, as on a reader's return.
    context.add_init_script(f'localStorage.setItem("mode", "{theme}");'
                            f'localStorage.setItem("theme", "{theme}");')
    page = offline_browser.offline_page(context, problems)
    try:
        page.goto((html / f"{page_name}.html").as_uri(), wait_until="load")
        for viewport in ("phone", "desktop"):
            if viewport != "phone":
                width, height = VIEWPORTS[viewport]
                page.set_viewport_size({"width": width, "height": height})
                page.evaluate(AFTER_RESIZE)
            found = page.evaluate(INSPECT_PAGE)
            if "timeout" not in found:
                found.update(page.evaluate(INSPECT_LEGIBILITY,
                                           [TEXT_CONTRAST, LARGE_TEXT_CONTRAST]))
                found["layout"] = page.evaluate(INSPECT_LAYOUT, [FIGURE_SCALE])
            folder = viewport if theme == "light" else f"{theme}-{viewport}"
            shot = (html.parent / "screenshots" / folder
                    / f"{page_name.replace('/', '__')}.png")
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
            sidebar_visible = page.locator(".bd-sidebar-primary").is_visible()
            results[viewport] = _problems_of(html, page_name, viewport, theme, found,
                                             sidebar_visible, problems)
            problems.clear()  # errors so far are the phone's; the page appends to this list
    finally:
        context.close()
    return results


def _problems_of(html: Path, page_name: str, viewport: str, theme: str, found: dict,
                 sidebar_visible: bool, problems: list[str]) -> tuple[list[str], dict]:
    """Every problem of one page at one width in one theme, from what INSPECT_* found."""
    problems = list(problems)
    label = f"[{viewport}, {theme}]"
    if "timeout" in found:
        return [f"{label} {found['timeout']}"] + [f"{label} {p}" for p in problems], found

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
    problems += _illegible(found, theme)
    problems += _misfits(found["layout"], viewport)
    return [f"{label} {p}" for p in problems], found


def _illegible(found: dict, theme: str) -> list[str]:
    """What INSPECT_LEGIBILITY found unreadable: dark figure panels, faint text."""
    problems = []
    if found["theme"] != theme:
        problems.append(f"the page shows the {found['theme']} theme, not {theme}")
    if found["unreadable"]:
        problems.append(f"colours the test cannot read: {found['unreadable']}")
    if not found["textsChecked"]:
        problems.append("no text found in the article")
    if theme == "light":
        wrong = [f for f in found["figures"]
                 if f["luminance"] <= LIGHT_PANEL or f["brightness"] < 1]
        want = f"undimmed, on a panel of luminance above {LIGHT_PANEL}"
    else:
        low, high = DARK_THEME_PANEL
        wrong = [f for f in found["figures"] if not low <= f["luminance"] <= high]
        want = f"on an off-white panel of luminance {low} to {high} as seen"
    if wrong:
        problems.append(f"figures not {want}: {wrong}")
    if found["lowContrast"]:
        problems.append(f"text below WCAG contrast ({TEXT_CONTRAST}, large text "
                        f"{LARGE_TEXT_CONTRAST}): {found['lowContrast'][:8]}")
    return problems


def _misfits(layout: dict, viewport: str) -> list[str]:
    """What INSPECT_LAYOUT found that does not fit, or that the reader cannot tell scrolls.

    The thresholds, at both widths unless said: no display equation cut off (wider than its
    box without scrolling, or reaching left of where the scroll starts), none that scrolls
    without the fade that shows it does, no equation number on its formula; at 390 px no code
    input wider than the column (a reader must read it: it wraps), and every printed output
    that scrolls shows the fade; no table wider than its box (the reader would lose a column),
    and no cell of 40 characters or more squeezed into less than 8 em; every image drawn at
    FIGURE_SCALE of its size or more, linked to its own file (a tap opens it full size), with
    alt text that is not a file name, and faded at the edge if its box scrolls; and no build
    markup (glue calls, NBVAL markers, cell tags) in the text a reader sees.
    """
    problems = []
    equations, code, tables = layout["equations"], layout["code"], layout["tables"]
    for key, what in (("cut", "equations cut off"), ("uncued", "equations that scroll unseen"),
                      ("numberOnFormula", "equation numbers on their formulas")):
        if equations[key]:
            problems.append(f"{what}: {equations[key][:6]}")
    if viewport == "phone" and code["inputsScrolling"]:
        problems.append(f"code inputs wider than the column: {code['inputsScrolling'][:6]}")
    if code["outputsUncued"]:
        problems.append(f"printed outputs that scroll unseen: {code['outputsUncued'][:6]}")
    if tables["hidingColumns"]:
        problems.append(f"tables wider than their box: {tables['hidingColumns'][:6]}")
    if tables["squeezed"]:
        problems.append(f"table cells squeezed below 8 em: {tables['squeezed'][:6]}")
    figures = layout["figures"]
    for test, what in ((lambda f: f["scale"] < FIGURE_SCALE - 0.005,
                        f"figures drawn below {FIGURE_SCALE} of their size"),
                       (lambda f: not f["linked"], "images that do not open full size"),
                       (lambda f: f["altIsPath"], "images whose alt text is a file name"),
                       (lambda f: not f["cued"], "figures that scroll unseen")):
        wrong = [(f["src"], round(f["scale"], 2)) for f in figures if test(f)]
        if wrong:
            problems.append(f"{what}: {wrong[:6]}")
    if layout["plumbing"]:
        problems.append(f"build markup shown to the reader: {layout['plumbing']}")
    return problems


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
    """Every check above, at both widths, in the light and the dark theme."""
    assert (site / f"{page_name}.html").is_file(), f"{page_name} was not built"
    problems = []
    for theme in THEMES:
        for viewport, (found_problems, found) in _check_page(browser, site, page_name,
                                                             theme).items():
            problems += found_problems
            if viewport == "desktop" and theme == "light" and found.get("wideCode"):
                problems.append(f"[desktop] code a reader must scroll sideways (cell index "
                                f"from 0, px too wide, widest line): {found['wideCode']}")
    assert not problems, f"{page_name}:\n" + "\n".join(problems)


def _first_look_weights() -> np.ndarray:
    """S_1 and S_2 of the first look, (2, 3, 3), computed by mha_lit from the page's inputs.

    Causal, as the page computes them: softmax(causal_mask(Q K^T / sqrt(d_k))) for each head.
    """
    from mha_lit import (
        Dims,
        causal_mask,
        example_table,
        init_weights,
        sentence,
        softmax,
    )

    dims = Dims()
    W = init_weights(dims, seed=0)
    X = sentence(["the", "cat", "sat"], example_table(np.random.default_rng(2), dims.d_model))
    return np.stack([softmax(causal_mask((X @ W.W_Q[i]) @ (X @ W.W_K[i]).T / np.sqrt(dims.d_k)))
                     for i in range(dims.heads)])


def _open(browser, html: Path, page_name: str, problems: list[str], **options):
    """A page in a fresh offline context; problems collects errors and blocked requests."""
    context = browser.new_context(**options)
    page = offline_browser.offline_page(context, problems, console=False)
    page.goto((html / f"{page_name}.html").as_uri(), wait_until="load")
    return context, page


def test_first_look_heatmap_tells_query_key_and_weight_and_switches_heads(browser, site):
    """Hover a cell: the tooltip names its query, key and weight (as mha_lit computes it)."""
    S = _first_look_weights()  # (2 heads, 3 queries, 3 keys)

    def tip_text(q, k, h, i, j):
        return f"query \u201c{q}\u201d \u2192 key \u201c{k}\u201d\nweight {S[h, i, j]:.3f}"

    assert f"{S[0, 2, 1]:.3f}" != f"{S[1, 2, 1]:.3f}"  # the two heads differ in that cell
    problems: list[str] = []
    context, page = _open(browser, site, "book/first_look", problems,
                          viewport={"width": 1280, "height": 900})
    try:
        figure = page.locator(".mha-attn").first
        panels, tip = figure.locator(".mha-attn-panel"), figure.locator(".mha-attn-tip")

        def shown():
            return [panels.nth(i).is_visible() for i in range(panels.count())]

        assert panels.count() == 2 and shown() == [True, False]
        assert panels.nth(0).locator("rect[data-w]").count() == 9  # one per weight
        assert not tip.is_visible()

        panels.nth(0).locator('rect[data-i="2"][data-j="1"]').hover()  # query sat, key cat
        assert tip.is_visible() and tip.inner_text() == tip_text("sat", "cat", 0, 2, 1)
        box, outer = tip.bounding_box(), figure.bounding_box()
        assert outer["x"] <= box["x"] and box["x"] + box["width"] <= outer["x"] + outer["width"] + 1

        figure.get_by_role("button", name="head 2").click()
        assert shown() == [False, True] and not tip.is_visible()
        assert figure.get_by_role("button", name="head 2").get_attribute("aria-pressed") == "true"
        panels.nth(1).locator('rect[data-i="2"][data-j="1"]').hover()
        assert tip.inner_text() == tip_text("sat", "cat", 1, 2, 1)
        panels.nth(1).locator('rect[data-i="0"][data-j="2"]').hover()  # above the diagonal
        assert tip.inner_text() == "query \u201cthe\u201d \u2192 key \u201csat\u201d\nmasked: weight 0.000"
        page.mouse.move(0, 0)
        assert not tip.is_visible()
        page.keyboard.press("Tab")  # the keyboard reaches the cells too
        panels.nth(1).locator('rect[data-i="1"][data-j="0"]').focus()
        assert tip.inner_text() == tip_text("cat", "the", 1, 1, 0)
        figure.get_by_role("button", name="head 1").click()
        assert shown() == [True, False]
    finally:
        context.close()

    # A phone has no pointer to hover with: a tap shows the same, inside the narrow page.
    context, page = _open(browser, site, "book/first_look", problems,
                          viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)
    try:
        figure = page.locator(".mha-attn").first
        cell = figure.locator('.mha-attn-panel[data-head="0"] rect[data-i="2"][data-j="2"]')
        cell.scroll_into_view_if_needed()
        cell.tap()
        tip = figure.locator(".mha-attn-tip")
        assert tip.is_visible() and tip.inner_text() == tip_text("sat", "sat", 0, 2, 2)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    finally:
        context.close()
    assert not problems, problems


def test_a_chapter_printed_from_its_page_keeps_its_number_folded_code_and_solutions(browser, site):
    """A reader's own "Print" of a chapter page: Chromium prints it (print media, as the menu
    does), and the printed text has the chapter's number in its title, the code of the folded
    cell, each exercise followed by its solution's text and code, and no navigation or buttons.

    The folded code and the solutions are opened by the print style sheet alone (book.css):
    Chromium's PDF printing runs no `beforeprint` handler, so book.js is not what opens them.
    """
    import pypdf

    page_name = "book/part1/01_linear_algebra"
    cells = json.loads((ROOT / f"{page_name}.ipynb").read_text())["cells"]
    source = ["".join(c["source"]) for c in cells]
    folded = [s for c, s in zip(cells, source) if "hide-input" in c["metadata"].get("tags", [])]
    solutions = [s for c, s, before in zip(cells[1:], source[1:], source)
                 if c["cell_type"] == "code" and "{solution-start}" in before]
    assert folded and len(solutions) >= 3
    problems: list[str] = []
    context, page = _open(browser, site, page_name, problems, viewport={"width": 1280, "height": 900})
    try:
        page.evaluate("async () => { await MathJax.startup.promise; await document.fonts.ready; }")
        pdf = page.pdf(format="A4", print_background=True)
    finally:
        context.close()
    text = "".join(p.extract_text() for p in pypdf.PdfReader(io.BytesIO(pdf)).pages)
    squeezed = re.sub(r"\s+", "", text)

    def first_line(code: str) -> str:
        return re.sub(r"\s+", "", next(line for line in code.splitlines() if line.strip()))[:24]

    heading = next(line for line in cells[0]["source"] if line.startswith("# "))
    title = re.sub(r"\s+", "", "1. " + heading[2:])
    assert squeezed.startswith(title), (title, squeezed[:80])
    for code in folded:
        assert first_line(code) in squeezed, f"folded code not printed: {first_line(code)!r}"
    at = 0
    for number, code in enumerate(solutions, start=1):
        solution = squeezed.find(f"SolutiontoExercise1.{number}", at)
        assert solution > at, f"no solution to Exercise 1.{number} after the one before"
        assert squeezed.find(first_line(code), solution) > solution, f"Exercise 1.{number}'s code"
        at = solution
    for chrome in ("Skiptomaincontent", "Showcodecell", "PrinttoPDF", "Backtotop"):
        assert chrome not in squeezed, f"printed {chrome!r}"
    assert not problems, problems


def test_every_page_of_the_toc_is_checked():
    """The parametrisation above covers the whole table of contents, root page included."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    assert PAGES[0] == toc["root"]
    assert len(PAGES) == len(set(PAGES)) >= 2


def _notation_rows() -> dict[str, tuple[int, ...]]:
    """First cell -> the numbers of the second cell, for the table rows of book/notation.md.

    A symbol's first row with a number counts: the running example's sizes come before
    Part III's, whose chapters restate some symbols (h, n) for their own examples; a row of
    the letters' table, which gives no size, is passed over.
    """
    rows = {}
    for line in (ROOT / "book" / "notation.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| $") and len(cells) >= 2:
            numbers = tuple(int(number) for number in re.findall(r"\d+", cells[1]))
            if numbers:
                rows.setdefault(cells[0], numbers)
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
        r"$Q_i$, $K_i$": Q.shape, r"$V_i$": V.shape, r"$Z_i$": (Q @ Q.T).shape,
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
