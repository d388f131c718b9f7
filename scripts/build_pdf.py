"""Build the whole book as one PDF: `_build/pdf/book.pdf`.

    python scripts/build_pdf.py

1. The strict build, as one HTML page (what `jupyter-book build . --builder singlehtml -W -n
   --keep-going` does), writes every page of `_toc.yml`, in order, into `_build/pdf/singlehtml/`.
   Like the web build it renders the notebooks' stored outputs (`execute_notebooks: "off"` in
   _config.yml: no notebook runs), and it keeps its own Sphinx environment (see
   `build_single_page`).
2. Headless Chromium (Debian's `chromium`, driven by Playwright; no browser download) opens that
   page with every request that is not `file://` refused, waits until MathJax (served from the
   built site) has typeset every formula, every image has decoded and every font has loaded, and
   prepares it for paper: a title page; a table of contents (parts, chapters and sections, with
   page numbers); each chapter on a new page, the part's name above the first chapter of each
   part; hidden code cells and exercise solutions printed open (paper cannot unfold them); no
   navigation, sidebars, buttons or launch menus; long code lines wrapped instead of cut off;
   figures, equations and code cells kept on one page where they fit.
3. Chromium prints it on A4, the page number in the footer. Every heading of the table of
   contents carries an invisible marker link, so the printed PDF itself says on which page each
   heading landed; the contents get those page numbers and the book is printed again (the
   numbers take the room of placeholders, so nothing moves; the second printing is checked).
4. pypdf removes the markers, points the links of the contents at their pages, and adds the
   PDF's bookmarks (parts, chapters, sections) and its title and author.

Besides the PDF, `_build/pdf/book.json` records what the browser saw before printing (formulas
and MathJax containers, images, equation and figure numbers per chapter, the page of every
heading of the contents); `tests/test_pdf.py` checks the PDF against it and against the sources.

Needs Chromium (`apt-get install -y chromium`) and the packages of `requirements.txt`
(Playwright, pypdf). No network.
"""

from __future__ import annotations

import html
import json
import logging
import re
import shutil
import sys
import time
from io import BytesIO
from pathlib import Path

import offline_browser  # scripts/offline_browser.py, beside this script
import yaml

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"
PDF_DIR = BUILD / "pdf"
# Everything this script builds lies in _build/pdf/, apart from the web build's _build/html/,
# _build/.doctrees/ and _build/jupyter_execute/ (myst-nb writes a build's images and notebooks
# beside its output folder): the two builds can run at the same time (the browser test and the
# PDF test do, in two pytest workers) without writing the same file.
SINGLEHTML = PDF_DIR / "singlehtml"
DOCTREES = PDF_DIR / ".doctrees"
PDF = PDF_DIR / "book.pdf"
RECORD = PDF_DIR / "book.json"
MARK = "https://pdf-page-marker.invalid/"  # never requested: only a link annotation's address

# A4 with these margins leaves a text column of 210 - 2 * 18 = 174 mm = 658 CSS px.
MARGIN_MM = {"top": 16, "bottom": 16, "left": 18, "right": 18}
COLUMN_PX = round((210 - MARGIN_MM["left"] - MARGIN_MM["right"]) / 25.4 * 96)
PAGE_PX = round((297 - MARGIN_MM["top"] - MARGIN_MM["bottom"]) / 25.4 * 96)

# The book's own pages, added on top of the print rules every page has (book/_static/book.css):
# title page, contents, a new page for each chapter. The web pages stay unchanged.
PRINT_CSS = """
@media print {
  /* The book's own pages: title page, contents, a new page for each chapter. */
  .pdf-title-page { break-after: page; text-align: center; padding-top: 200px; }
  .pdf-title-page img { width: 140px; margin-bottom: 40px; }
  .pdf-title-page .pdf-title { font-size: 2.6rem; font-weight: 700; line-height: 1.2; }
  .pdf-title-page .pdf-author { font-size: 1.2rem; margin-top: 70px; }
  .pdf-title-page .pdf-copyright { font-size: 0.9rem; margin-top: 14px; color: #555; }
  nav.pdf-toc { break-after: page; }
  nav.pdf-toc h1 { margin-bottom: 1em; }
  nav.pdf-toc .pdf-toc-part { font-weight: 700; margin-top: 1em; margin-bottom: 0.2em;
    font-size: 1.05rem; break-after: avoid-page; }
  nav.pdf-toc .pdf-toc-entry { display: flex; align-items: baseline; line-height: 1.5;
    break-inside: avoid-page; }
  nav.pdf-toc .pdf-toc-entry a { color: inherit; }
  nav.pdf-toc .pdf-toc-chapter { font-weight: 600; margin-top: 0.3em; }
  nav.pdf-toc .pdf-toc-section { padding-left: 2.2em; font-size: 0.92rem; }
  nav.pdf-toc .pdf-toc-dots { flex: 1; border-bottom: 0.5px solid #bbb; margin: 0 0.5em;
    transform: translateY(-0.25em); min-width: 1em; }
  nav.pdf-toc .pdf-toc-page { min-width: 2.2em; text-align: right;
    font-variant-numeric: tabular-nums; }
  .pdf-chapter { break-before: page; }
  .pdf-part { font-size: 0.95rem; font-weight: 600; color: #666; text-transform: uppercase;
    letter-spacing: 0.05em; margin: 0 0 0.3em 0; }
  .pdf-marked { position: relative; }
  .pdf-mark { position: absolute; left: 0; top: 0; width: 1px; height: 1px; display: block; }
}
"""

# Runs in the loaded page: wait for MathJax, images and fonts; record what is there; then
# rearrange the page into a book. Returns the record (or {"error": ...}).
PREPARE = """
async ({parts, root, title, author, copyright, logo, mark}) => {
  const late = (promise, what, seconds) => Promise.race([promise, new Promise((_, reject) =>
    setTimeout(() => reject(new Error(`${what} did not finish within ${seconds} s`)),
               seconds * 1000))]);
  const article = document.querySelector("article.bd-article");
  if (!article) return {error: "no article.bd-article in the single-page build"};
  document.title = title;

  // Unfold what the web page folds: hidden code cells and exercise solutions.
  document.querySelectorAll("details").forEach((d) => { d.open = true; });
  document.querySelectorAll(".toggle-hidden").forEach((e) => e.classList.remove("toggle-hidden"));

  // A table's cells carry a copy of their column's heading for the phone's cards (book.js):
  // paper shows the table itself, so the copies (and their formulas) go.
  document.querySelectorAll(".mha-card-label").forEach((e) => e.remove());

  // MathJax 3 typesets on load; its startup promise resolves when it is done.
  if (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) {
    return {error: "MathJax did not load"};
  }
  try { await late(MathJax.startup.promise, "MathJax", 180); } catch (e) { return {error: String(e)}; }
  const mathElements = [...article.querySelectorAll("span.math, div.math")];
  const mathjaxContainers = article.querySelectorAll(
    "span.math > mjx-container, div.math > mjx-container").length;
  const items = Array.from(MathJax.startup.document.math)  // not the removed copies
    .filter((item) => !item.typesetRoot || item.typesetRoot.isConnected);
  const texOf = new Map(items.map((item) => [item.typesetRoot, item.math]));
  const mathErrors = items.map((item) => MathJax.startup.toMML(item.root))
    .filter((m) => m.includes("<merror") || /<mtext[^>]*mathcolor="red"/.test(m))
    .map((m) => m.slice(0, 200));
  const untypeset = mathElements.filter((el) => !el.querySelector("mjx-container"))
    .map((el) => el.textContent.trim().slice(0, 80));

  // Every image loaded and decoded.
  const images = [...article.querySelectorAll("img")];
  const broken = [];
  for (const img of images) {
    img.loading = "eager";
    try { await late(img.decode(), "decoding an image", 30); }
    catch (e) { broken.push(img.getAttribute("src")); continue; }
    if (!img.naturalWidth) broken.push(img.getAttribute("src"));
  }

  // Every page of _toc.yml is one <section>, after a <span id="document-NAME">.
  const docs = [];
  for (const span of article.querySelectorAll('span[id^="document-"]')) {
    let section = span.nextElementSibling;
    while (section && section.tagName !== "SECTION") section = section.nextElementSibling;
    if (!section) return {error: `no section after ${span.id}`};
    docs.push({name: span.id.slice("document-".length), section: section});
  }
  // Those pages sit one heading level lower than on their own web page (a chapter's title is
  // an h2 inside the root page's section): give them their own levels back.
  for (const doc of docs) {
    for (const h of [...doc.section.querySelectorAll("h2, h3, h4, h5, h6")]) {
      const up = document.createElement("h" + (Number(h.tagName[1]) - 1));
      for (const attr of h.attributes) up.setAttribute(attr.name, attr.value);
      while (h.firstChild) up.appendChild(h.firstChild);
      h.replaceWith(up);
    }
  }
  const rootSection = article.querySelector("section");
  const chapters = [{name: root, section: rootSection}, ...docs];
  const own = (chapter, nodes) => [...nodes].filter((n) =>
    !docs.some((d) => d.section !== chapter.section && chapter.section.contains(d.section) &&
                      d.section.contains(n)));
  // A heading as plain text, formulas as $TeX$ (for the PDF's bookmarks).
  const plain = (node) => {
    if (node.nodeType === Node.TEXT_NODE) return node.textContent;
    if (node.nodeType !== Node.ELEMENT_NODE) return "";
    if (node.matches(".headerlink, .pdf-mark, mjx-assistive-mml")) return "";
    if (texOf.has(node)) return `$${texOf.get(node)}$`;
    return [...node.childNodes].map(plain).join("");
  };

  const esc = (s) => String(s).replace(/[&<>"]/g,
    (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
  const titlePage = document.createElement("div");
  titlePage.className = "pdf-title-page";
  titlePage.innerHTML = (logo ? `<img src="${esc(logo)}" alt="">` : "") +
    `<div class="pdf-title">${esc(title)}</div>` +
    `<div class="pdf-author">${esc(author)}</div>` +
    `<div class="pdf-copyright">&copy; ${esc(copyright)}</div>`;
  const toc = document.createElement("nav");
  toc.className = "pdf-toc";
  toc.innerHTML = '<h1 class="pdf-toc-title">Contents</h1>';

  // Each heading of the contents gets an id, a marker link and a row in the contents.
  const entries = [];
  const addEntry = (h, kind, part) => {
    const n = entries.length + 1;
    h.id = h.id || `pdf-heading-${n}`;
    h.classList.add("pdf-marked");
    const marker = document.createElement("a");
    marker.className = "pdf-mark";
    marker.href = mark + n;
    marker.setAttribute("aria-hidden", "true");
    h.prepend(marker);
    const label = h.cloneNode(true);
    label.querySelectorAll(".headerlink, .pdf-mark").forEach((a) => a.remove());
    const row = document.createElement("div");
    row.className = `pdf-toc-entry pdf-toc-${kind}`;
    row.innerHTML = `<a href="#${esc(h.id)}">${label.innerHTML}</a>` +
      `<span class="pdf-toc-dots"></span><span class="pdf-toc-page" data-mark="${n}">000</span>`;
    if (kind !== "contents") toc.appendChild(row);
    entries.push({mark: n, kind: kind, id: h.id, part: part, text: plain(h).replace(/\\s+/g, " ").trim()});
  };
  addEntry(toc.querySelector("h1"), "contents", "");

  const partOf = {};
  for (const part of parts) if (part.caption && part.files.length) partOf[part.files[0]] = part.caption;
  let part = "";
  const record = [];
  for (const chapter of chapters) {
    const h1 = chapter.section.querySelector("h1");
    if (!h1) return {error: `no title in ${chapter.name}`};
    if (partOf[chapter.name]) {
      part = partOf[chapter.name];
      const row = document.createElement("div");
      row.className = "pdf-toc-part";
      row.textContent = part;
      toc.appendChild(row);
      const above = document.createElement("p");
      above.className = "pdf-part";
      above.textContent = part;
      h1.before(above);
    }
    addEntry(h1, "chapter", part);
    own(chapter, chapter.section.querySelectorAll("h2")).forEach((h) => addEntry(h, "section", part));
    chapter.section.classList.add("pdf-chapter");
    record.push({
      name: chapter.name,
      title: entries.find((e) => e.id === h1.id).text,
      mark: entries.find((e) => e.id === h1.id).mark,
      equations: own(chapter, chapter.section.querySelectorAll(".eqno"))
        .map((e) => e.firstChild.textContent.trim()),
      figures: own(chapter, chapter.section.querySelectorAll("figure .caption-number"))
        .map((e) => e.textContent.trim()),
      images: own(chapter, chapter.section.querySelectorAll("img")).length,
    });
  }
  rootSection.before(titlePage, toc);

  try { await late(document.fonts.ready, "loading fonts", 60); } catch (e) { return {error: String(e)}; }
  return {
    mathjaxVersion: MathJax.version,
    mathElements: mathElements.length,
    mathjaxContainers: mathjaxContainers,
    mathjaxTypeset: items.length,
    mathErrors: mathErrors,
    mathErrorNodes: document.querySelectorAll("mjx-merror").length,
    untypeset: untypeset,
    images: images.map((img) => ({src: img.getAttribute("src"), width: img.naturalWidth,
                                  height: img.naturalHeight})),
    brokenImages: broken,
    entries: entries,
    chapters: record,
  };
}
"""

# Runs with the print stylesheet in force, at the width of the printed text column: what would
# stick out of the column (and be cut off on paper).
OVERFLOWING = """
() => {
  const article = document.querySelector("article.bd-article");
  const right = article.getBoundingClientRect().right;
  const found = [];
  // MathJax's invisible copy of each formula for screen readers is not laid out on paper.
  const measuring = document.createElement("style");
  measuring.textContent = "mjx-assistive-mml { display: none !important; }";
  document.head.appendChild(measuring);
  const describe = (el, width) => `${el.tagName.toLowerCase()}.${[...el.classList].join(".")} ` +
    `${Math.round(width)} px: ${el.textContent.replace(/\\s+/g, " ").trim().slice(0, 80)}`;
  for (const el of article.querySelectorAll("*")) {
    const box = el.getBoundingClientRect();
    if (box.width === 0) continue;
    // Sticks out of the column: cut off at the paper's edge.
    if (box.right > right + 1 && !(el.parentElement && el.parentElement.getBoundingClientRect().right > right + 1)) {
      found.push(describe(el, box.width));
    }
    // A box that scrolls or clips its content sideways: on paper the rest is lost.
    // (Inline boxes have no scroll width; MathJax clips its own stretched glyphs on purpose; a
    // slanted letter may overhang its formula's box by a pixel or two.)
    const style = getComputedStyle(el);
    if (style.overflowX !== "visible" && style.display !== "inline" &&
        !(el.parentElement && el.parentElement.closest("mjx-container")) &&
        el.scrollWidth > el.clientWidth + 4) found.push(describe(el, el.scrollWidth) + ` (shows ${el.clientWidth} px)`);
  }
  measuring.remove();
  return {column: article.getBoundingClientRect().width, overflowing: found};
}
"""

FILL_PAGE_NUMBERS = """
(pages) => {
  const spans = document.querySelectorAll(".pdf-toc-page");
  spans.forEach((span) => { span.textContent = String(pages[span.dataset.mark]); });
  return spans.length;
}
"""

_SUPERSCRIPT = str.maketrans("0123456789T+-", "⁰¹²³⁴⁵⁶⁷⁸⁹ᵀ⁺⁻")
_SUBSCRIPT = {**{str(d): chr(0x2080 + d) for d in range(10)},
              **dict(zip("aehijklmnoprstuvx", "ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ", strict=True))}


def tex_as_text(text: str) -> str:
    """Plain text for a bookmark: `$Q K^T$` -> `QKᵀ`, `$\\sqrt{d_k}$` -> `√dₖ`."""
    def formula(match: re.Match) -> str:
        tex = match.group(1)
        tex = re.sub(r"\\sqrt\{([^{}]*)\}", r"√\1", tex)
        tex = re.sub(r"\\(?:text|mathrm|operatorname)\{([^{}]*)\}", r"\1", tex)
        tex = tex.replace(r"\times", "×").replace(r"\cdot", "·")
        tex = re.sub(r"\^\{?([0-9T+-]+)\}?", lambda m: m.group(1).translate(_SUPERSCRIPT), tex)
        tex = re.sub(r"_\{?([0-9a-z]+)\}?", lambda m: "".join(_SUBSCRIPT.get(c, c) for c in m.group(1))
                     if all(c in _SUBSCRIPT for c in m.group(1)) else "_" + m.group(1), tex)
        tex = re.sub(r"\\,|\\;|\\!|[{}]", "", tex)
        return re.sub(r"\s+", "", tex) if len(tex) < 12 else tex
    return re.sub(r"\$([^$]+)\$", formula, text)


def _toc() -> tuple[str, list[dict]]:
    """The root page and the parts of _toc.yml (caption and files), in order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    parts = [{"caption": part.get("caption", ""),
              "files": [chapter["file"] for chapter in part.get("chapters", [])]}
             for part in toc.get("parts", [])]
    return toc["root"], parts


def build_single_page() -> None:
    """The README's strict build (`jupyter-book build . -W -n --keep-going`), as one HTML page.

    This is what `jupyter-book build . --builder singlehtml -W -n --keep-going` runs, with one
    change: the single-page build keeps its own Sphinx environment (`_build/pdf/.doctrees`)
    instead of sharing `_build/.doctrees` with the web build, and its own
    `_build/pdf/jupyter_execute/`. Each build then re-reads what changed since its own last run, so neither leaves the other's pages stale (a page that shows
    another page's title in a link is rewritten when that title changes).
    """
    from jupyter_book.sphinx import build_sphinx

    status = build_sphinx(
        ROOT, SINGLEHTML, use_external_toc=True, noconfig=True,
        path_config=str(ROOT / "_config.yml"),
        confoverrides={"external_toc_path": (ROOT / "_toc.yml").as_posix(),
                       "latex_individualpages": False, "nitpicky": True},
        doctreedir=DOCTREES, builder="singlehtml", warningiserror=True, keep_going=True,
    )
    if status != 0:
        # The next build re-reads every page and shows its warnings again.
        shutil.rmtree(DOCTREES, ignore_errors=True)
        sys.exit(f"the single-page build failed ({status}); its warnings are above")


def marker_positions(pdf: bytes) -> dict[int, tuple[int, float, float]]:
    """Marker number -> (page index, left, top) of its link in a printed PDF."""
    from pypdf import PdfReader

    found = {}
    for index, page in enumerate(PdfReader(BytesIO(pdf)).pages):
        for annotation in page.get("/Annots") or []:
            uri = annotation.get_object().get("/A", {}).get("/URI", "")
            if uri.startswith(MARK):
                left, _, _, top = (float(v) for v in annotation.get_object()["/Rect"])
                found[int(uri[len(MARK):])] = (index, left, top)
    return found


def print_book(source: Path, toc_root: str, parts: list[dict], config: dict) -> tuple[bytes, dict]:
    """Open the single page in Chromium, prepare it for paper, print it; return PDF and record."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("Chromium is not installed; install it with `apt-get install -y chromium`")
    problems: list[str] = []
    header = (f'<div style="font-size:7.5px;width:100%;margin:0 {MARGIN_MM["left"]}mm;'
              f'color:#888;font-family:sans-serif">{html.escape(config["title"])}</div>')
    footer = ('<div style="font-size:9px;width:100%;text-align:center;color:#444;'
              'font-family:sans-serif"><span class="pageNumber"></span></div>')
    options = dict(format="A4", print_background=True, display_header_footer=True,
                   header_template=header, footer_template=footer,
                   margin={side: f"{mm}mm" for side, mm in MARGIN_MM.items()})
    with sync_playwright() as playwright:
        browser = offline_browser.launch(playwright, chromium)
        try:
            context = browser.new_context(viewport={"width": COLUMN_PX, "height": PAGE_PX})
            page = offline_browser.offline_page(context, problems)
            clock = time.monotonic()
            # The load event waits for MathJax, which typesets some 2,000 formulas first: on a
            # busy machine that takes more than Playwright's default 30 s.
            page.set_default_timeout(600_000)
            page.goto(source.as_uri(), wait_until="load")
            page.add_style_tag(content=PRINT_CSS)
            found = page.evaluate(PREPARE, {
                "parts": parts, "root": toc_root, "title": config["title"],
                "author": config.get("author", ""), "copyright": str(config.get("copyright", "")),
                "logo": f"_static/{Path(config['logo']).name}" if config.get("logo") else "",
                "mark": MARK,
            })
            found["seconds_typesetting"] = round(time.monotonic() - clock, 1)
            if "error" in found:
                sys.exit(f"could not prepare the book for printing: {found['error']}")
            page.emulate_media(media="print")
            found.update(page.evaluate(OVERFLOWING))
            page.evaluate("document.fonts.ready.then(() => true)")

            # Print; read where each heading landed; write the page numbers into the contents
            # and print again, until a printing agrees with the numbers it shows.
            shown: list[int] = []
            found["seconds_printing"] = []
            for _ in range(3):
                clock = time.monotonic()
                pdf = page.pdf(**options)
                marks = marker_positions(pdf)
                found["seconds_printing"].append(round(time.monotonic() - clock, 1))
                missing = [e["mark"] for e in found["entries"] if e["mark"] not in marks]
                if missing:
                    sys.exit(f"no marker link in the PDF for the headings {missing[:5]}")
                landed = [marks[e["mark"]][0] + 1 for e in found["entries"]]
                if landed == shown:
                    break
                shown = landed
                page.evaluate(FILL_PAGE_NUMBERS, {str(e["mark"]): page_number
                                                  for e, page_number in zip(found["entries"], shown, strict=True)})
            else:
                sys.exit("the page numbers of the contents did not settle in 3 printings")
        finally:
            browser.close()
    for entry in found["entries"]:
        entry["page"], entry["left"], entry["top"] = marks[entry["mark"]]
        entry["page"] += 1
    for chapter in found["chapters"]:
        chapter["page"] = next(e["page"] for e in found["entries"] if e["mark"] == chapter["mark"])
    found["problems"] = problems
    return pdf, found


def finish_pdf(pdf: bytes, found: dict, config: dict) -> None:
    """Drop the markers, link the contents to explicit pages, add bookmarks and metadata."""
    from pypdf import PdfReader, PdfWriter
    from pypdf.generic import (
        ArrayObject,
        Fit,
        FloatObject,
        NameObject,
        NumberObject,
    )

    writer = PdfWriter(clone_from=PdfReader(BytesIO(pdf)))
    by_id = {e["id"]: e for e in found["entries"]}

    def destination(entry: dict) -> ArrayObject:
        return ArrayObject([writer.pages[entry["page"] - 1].indirect_reference,
                            NameObject("/XYZ"), FloatObject(entry["left"]),
                            FloatObject(entry["top"] + 6), NumberObject(0)])

    for page in writer.pages:
        if "/Annots" not in page:
            continue
        kept = ArrayObject()
        for reference in page["/Annots"]:
            annotation = reference.get_object()
            if str(annotation.get("/A", {}).get("/URI", "")).startswith(MARK):
                continue
            target = str(annotation.get("/Dest", "")).lstrip("/")
            if target in by_id:  # a link of the contents: to the page, not to a named place
                annotation[NameObject("/Dest")] = destination(by_id[target])
            kept.append(reference)
        page[NameObject("/Annots")] = kept

    def bookmark(title: str, entry: dict, parent=None):
        return writer.add_outline_item(title=title, page_number=entry["page"] - 1, parent=parent,
                                       fit=Fit.xyz(entry["left"], entry["top"] + 6, 0))

    part_item, part, chapter_item = None, "", None
    for entry in found["entries"]:
        title = tex_as_text(entry["text"])
        if entry["kind"] == "contents":
            bookmark(title, entry)
        elif entry["kind"] == "chapter":
            if entry["part"] != part:
                part = entry["part"]
                part_item = bookmark(part, entry)
            chapter_item = bookmark(title, entry, part_item if part else None)
        else:
            bookmark(title, entry, chapter_item)
    writer.add_metadata({"/Title": config["title"], "/Author": config.get("author", "")})
    writer.page_mode = "/UseOutlines"
    with PDF.open("wb") as out:
        writer.write(out)


def main() -> int:
    started = time.monotonic()
    # pypdf warns that Chromium's PDFs count their objects one short; it reads them fine.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    PDF_DIR.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    toc_root, parts = _toc()

    build_single_page()
    # Sphinx writes the single page under the root page's name (book/intro.html) but links it
    # to _static/ and _images/ as if it sat at the top of the folder; a copy there finds them.
    built = SINGLEHTML / f"{toc_root}.html"
    source = SINGLEHTML / "book-for-print.html"
    # The single page has no search index (its search box is not printed).
    source.write_text(built.read_text().replace('<script src="searchindex.js"></script>', ""))

    pdf, found = print_book(source, toc_root, parts, config)
    finish_pdf(pdf, found, config)
    from pypdf import PdfReader

    found["pages"] = len(PdfReader(PDF).pages)
    found["seconds"] = round(time.monotonic() - started, 1)
    RECORD.write_text(json.dumps(found, indent=1, ensure_ascii=False) + "\n")

    failures = list(found["problems"])
    if found["mathErrors"] or found["mathErrorNodes"]:
        failures.append(f"MathJax errors: {found['mathErrors'][:5]}")
    if found["untypeset"]:
        failures.append(f"formulas left as TeX source: {found['untypeset'][:5]}")
    if found["brokenImages"]:
        failures.append(f"images that did not load: {found['brokenImages']}")
    if found["overflowing"]:
        failures.append("wider than the printed column (cut off on paper):\n  "
                        + "\n  ".join(found["overflowing"][:20]))
    print(f"{PDF.relative_to(ROOT)}: {found['pages']} pages, {PDF.stat().st_size / 2**20:.1f} MiB, "
          f"{found['seconds']:.0f} s (record: {RECORD.relative_to(ROOT)})")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
