"""The book as one PDF: `python scripts/build_pdf.py` builds `_build/pdf/book.pdf`; read it back.

The `book` fixture runs the script (a strict single-page build, then headless Chromium prints
it; see the script's docstring) and reads the PDF with pypdf. What the PDF must hold is worked
out here from the sources (`_toc.yml`, `_config.yml`, the notebooks and Markdown pages,
`book/references.bib`), not from the script:

- every page of `_toc.yml`, in order, each starting on a new page under its title (numbered
  as the web pages number it), listed in the contents with the page it starts on, and in the
  PDF's bookmarks;
- every formula typeset by MathJax: as many MathJax containers as formulas in the single page,
  no MathJax error, no TeX delimiter left in the PDF's text, and every labelled equation's
  number ((1.1), (1.2), ...) printed in its own chapter;
- every image of the single page printed once, every numbered figure caption in its chapter;
- every line of every code cell, and every line of text the cells print, whole (long lines are
  wrapped, not cut off): each one is found in the PDF's text;
- a page number in the footer of every page; the bibliography lists every entry of the .bib;
  no "??" of an unresolved reference; nothing wider than the printed column;
- a page count that fits the amount of content (see `test_page_count_fits_the_content`).

Without Chromium (or Playwright) the tests skip and say why; with CI=true they fail instead.

Every test here is marked `book`. Under pytest-xdist the module is one unit of work: one worker
builds the PDF once. The browser test may run beside it in the other worker: the PDF script
builds only into `_build/pdf/` (its own Sphinx environment and `jupyter_execute/` included),
the web build never writes there.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import book_pages
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PDF = ROOT / "_build" / "pdf" / "book.pdf"
RECORD = ROOT / "_build" / "pdf" / "book.json"
SINGLE_PAGE = ROOT / "_build" / "pdf" / "singlehtml"  # the single-page build the PDF prints
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())


PAGES = book_pages.toc_pages()
pytestmark = pytest.mark.book


def _cannot_run(reason: str):
    book_pages.cannot_run("PDF test", reason)


# --- what the sources say the book holds -------------------------------------------------------

def _markdown_and_cells(page: str) -> tuple[str, list[dict]]:
    """A page's Markdown (all its Markdown cells) and its code cells."""
    notebook = ROOT / f"{page}.ipynb"
    if notebook.is_file():
        cells = json.loads(notebook.read_text())["cells"]
        markdown = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        return markdown, [c for c in cells if c["cell_type"] == "code"]
    return (ROOT / f"{page}.md").read_text(), []


def _title(markdown: str) -> str:
    return re.search(r"^# (.+)$", markdown, re.M).group(1).strip()


def _chapters() -> list[dict]:
    """Every page of _toc.yml: name, printed title (numbered as on the web pages), equations."""
    chapters = [{"name": TOC["root"], "number": None}]
    number = 0
    for part in TOC["parts"]:
        if not CONFIG.get("html", {}).get("use_multitoc_numbering", True):
            number = 0
        for entry in part["chapters"]:
            if part.get("numbered"):
                number += 1
            chapters.append({"name": entry["file"], "number": number if part.get("numbered") else None,
                             "part": part.get("caption", "")})
    for chapter in chapters:
        markdown, cells = _markdown_and_cells(chapter["name"])
        title = _title(markdown)
        chapter["title"] = f"{chapter['number']}. {title}" if chapter["number"] else title
        labelled = (len(re.findall(r"^\$\$\s*\([^)\s]+\)\s*$", markdown, re.M))
                    + len(re.findall(r"^[`:]{3,}\{math\}[^\n]*\n:label:", markdown, re.M)))
        chapter["equations"] = [f"({chapter['number']}.{k})" for k in range(1, labelled + 1)]
        figures = (len(re.findall(r"^[`:]{3,}\{(?:figure|glue:figure)\}", markdown, re.M))
                   + sum(1 for c in cells if c["metadata"].get("mystnb", {}).get("figure", {}).get("caption")))
        chapter["figures"] = [f"Fig. {chapter['number']}.{k}" for k in range(1, figures + 1)]
        exercises = len(re.findall(r"^[`:]{3,}\{exercise\}", markdown, re.M))
        chapter["exercises"] = [f"Exercise {chapter['number']}.{k}" for k in range(1, exercises + 1)]
    assert [c["name"] for c in chapters] == PAGES
    return chapters


CHAPTERS = _chapters()


def _printed_text_of_cells() -> list[tuple[str, str, bool]]:
    """(page, line, volatile) for every line of code and of text output of every code cell.

    An output is volatile when its cell says `# NBVAL_IGNORE_OUTPUT` (timings, machine rates)
    and the book's build runs the notebooks again (`execute_notebooks` other than "off" in
    _config.yml): its numbers then differ from the stored ones. The book as configured renders
    the stored outputs, so nothing is volatile and every stored line must be printed as is.
    """
    executes = str(CONFIG.get("execute", {}).get("execute_notebooks", "auto")) not in ("off", "False")
    lines = []
    for page in PAGES:
        for cell in _markdown_and_cells(page)[1]:
            tags = cell["metadata"].get("tags", [])
            source = "".join(cell["source"])
            if "remove-cell" in tags:
                continue
            if "remove-input" not in tags:
                lines += [(page, line, False) for line in source.splitlines()]
            if "remove-output" in tags:
                continue
            volatile = executes and (bool(re.search(r"^# NBVAL_(IGNORE_OUTPUT|SKIP)", source, re.M)) or any(
                tag in tags for tag in ("nbval-ignore-output", "nbval-skip")))
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                if output["output_type"] == "stream":
                    text = "".join(output["text"])
                elif set(data) == {"text/plain"}:  # shown as text only when nothing richer is there
                    text = "".join(data["text/plain"])
                else:
                    continue
                lines += [(page, line, volatile) for line in text.splitlines()]
    return [(page, line, volatile) for page, line, volatile in lines if line.strip()]


def _bib_titles() -> list[str]:
    text = (ROOT / "book" / "references.bib").read_text()
    return [re.sub(r"[{}]", "", t) for t in re.findall(r"^\s*title\s*=\s*\{(.*)\},?\s*$", text, re.M)]


# --- the PDF -----------------------------------------------------------------------------------

def _squeeze(text: str) -> str:
    """Compare text without whitespace and ligatures ("ﬁ" -> "fi"), as the PDF's text layer has it."""
    return re.sub(r"\s+", "", unicodedata.normalize("NFKC", text))


def _image_count(page) -> int:
    """Distinct images a page draws (its own and its forms' XObjects), without parsing content."""
    seen = set()

    def walk(resources):
        xobjects = resources.get("/XObject") if resources else None
        for reference in (xobjects or {}).values():
            xobject = reference.get_object()
            key = getattr(reference, "idnum", id(xobject))
            if xobject.get("/Subtype") == "/Image":
                seen.add(key)
            elif xobject.get("/Subtype") == "/Form" and key not in seen:
                seen.add(("form", key))
                walk(xobject.get("/Resources"))

    walk(page.get("/Resources"))
    return sum(1 for key in seen if not isinstance(key, tuple))


@pytest.fixture(scope="module")
def book() -> dict:
    """Build the PDF with the README's command and read it: pages' text, bookmarks, record."""
    if shutil.which("chromium") is None:
        _cannot_run("Chromium is not installed; install it with `apt-get install -y chromium`")
    try:
        import playwright.sync_api  # noqa: F401
        import pypdf
    except ImportError as missing:
        _cannot_run(f"{missing.name} is not installed; `pip install -r requirements.txt` installs it")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_pdf.py")], cwd=ROOT,
                            capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
        pytest.fail(f"scripts/build_pdf.py failed (exit {result.returncode}):\n{tail}", pytrace=False)
    logging.getLogger("pypdf").setLevel(logging.ERROR)  # Chromium's trailer miscounts its objects
    reader = pypdf.PdfReader(PDF)
    texts = [unicodedata.normalize("NFKC", page.extract_text()) for page in reader.pages]

    outline = []

    def walk(items, depth):
        for item in items:
            if isinstance(item, list):
                walk(item, depth + 1)
            else:
                outline.append((depth, item.title, reader.get_destination_page_number(item) + 1,
                                float(item.top)))

    walk(reader.outline, 0)
    return {"reader": reader, "texts": texts, "outline": outline,
            "record": json.loads(RECORD.read_text())}


def _lines(text: str) -> list[str]:
    return [re.sub(r"\s+", " ", line).strip() for line in text.splitlines()]


def _start_pages(book) -> dict[str, int]:
    """Title -> page of its bookmark, for the bookmarks of the contents, parts and chapters."""
    starts: dict[str, int] = {}
    for depth, title, page, _ in book["outline"]:
        if depth <= 1:
            starts.setdefault(title, page)
    return starts


def test_every_page_of_the_toc_starts_a_page_in_order(book):
    titles = [c["title"] for c in CHAPTERS]
    starts = _start_pages(book)
    missing = [t for t in titles if t not in starts]
    assert not missing, f"no bookmark for: {missing}"
    pages = [starts[t] for t in titles]
    assert pages == sorted(pages) and len(set(pages)) == len(pages), list(zip(titles, pages))
    tops = {title: top for depth, title, _, top in reversed(book["outline"]) if depth <= 1}
    height = float(book["reader"].pages[0].mediabox.top)
    for chapter, page in zip(CHAPTERS, pages):
        text = re.sub(r"\s+", " ", book["texts"][page - 1])
        assert chapter["title"] in text, f"{chapter['title']!r} is not printed on page {page}"
        # At the top of a new page: below the top margin (16 mm) and at most a part's name.
        assert height - 45.4 - 60 < tops[chapter["title"]] <= height - 45.4 + 8, (
            f"{chapter['title']!r} does not start at the top of page {page}")
    for part in TOC["parts"]:
        first = next(c for c in CHAPTERS if c["name"] == part["chapters"][0]["file"])
        text = re.sub(r"\s+", " ", book["texts"][starts[first["title"]] - 1])
        assert part["caption"].upper() in text, f"{part['caption']!r} is not above {first['title']!r}"


def test_bookmarks_follow_parts_chapters_and_sections(book):
    top = [title for depth, title, _, _ in book["outline"] if depth == 0]
    parts = [part["caption"] for part in TOC["parts"]]
    assert top == ["Contents", CHAPTERS[0]["title"], *parts]
    chapters = [title for depth, title, _, _ in book["outline"]
                if depth == 1 and title in {c["title"] for c in CHAPTERS}]
    assert chapters == [c["title"] for c in CHAPTERS[1:]]
    assert sum(depth == 2 for depth, _, _, _ in book["outline"]) >= 5 * len(CHAPTERS[1:-3])


def test_contents_lists_every_chapter_with_its_page(book):
    starts = _start_pages(book)
    first = starts[CHAPTERS[0]["title"]]
    contents = " ".join(" ".join(_lines(text)) for text in book["texts"][1:first - 1])
    for chapter in CHAPTERS:
        entry = f"{chapter['title']} {starts[chapter['title']]}"
        assert re.search(rf"(^| ){re.escape(entry)}( |$)", contents), f"contents lack {entry!r}"
    # Its links go to those pages.
    reader = book["reader"]
    targets = set()
    for page in reader.pages[1:first - 1]:
        for annotation in page.get("/Annots") or []:
            destination = annotation.get_object().get("/Dest")
            if destination is not None and not isinstance(destination, str):
                targets.add(reader.get_page_number(destination[0].get_object()) + 1)
    assert {starts[c["title"]] for c in CHAPTERS} <= targets


def test_page_count_fits_the_content(book):
    """Between the fewest and the most pages the content can fill.

    The sources (Markdown, code, and the text the cells print) hold N characters. A page of
    this PDF set entirely with prose holds about 85 characters on 55 lines, fewer than 4,700, so
    the book needs at least N / 4,700 pages. Pages of formulas, figures, tables and code hold
    less (about 1,800 on average in this book, some under 1,000). An average below 1,300
    means the layout wastes room everywhere: a page break after every code cell, say, which
    gives about 300 pages where the book fills under 200.
    """
    characters = sum(len(_markdown_and_cells(page)[0]) for page in PAGES)
    characters += sum(len(line) for _, line, _ in _printed_text_of_cells())  # code and output
    pages = len(book["reader"].pages)
    assert characters / 4700 <= pages <= characters / 1300, (pages, characters)


def test_every_formula_is_typeset_by_mathjax(book):
    record = book["record"]
    html = (SINGLE_PAGE / f"{TOC['root']}.html").read_text()
    article = html[html.index('<article class="bd-article">'):html.rindex("</article>")]
    # Formulas of the text (span, div) and LaTeX the cells display (div.output.text_latex.math).
    formulas = len(re.findall(r'<(?:span|div) class="(?:[\w-]+ )*math( [\w-]+)*"', article))
    assert formulas > 1000
    assert record["mathjaxVersion"].startswith("3.")
    assert record["mathElements"] == record["mathjaxTypeset"] == record["mathjaxContainers"] == formulas
    assert not record["mathErrors"] and not record["mathErrorNodes"] and not record["untypeset"]
    text = "".join(book["texts"])
    for delimiter in ("\\(", "\\)", "\\[", "\\]", "\\begin{", "\\frac", "\\sqrt", "\\mathrm"):
        assert delimiter not in text, f"TeX left untypeset in the PDF: {delimiter}"
    assert text.count("∑") >= 20 and text.count("√") >= 5, "typeset sums and roots are missing"


def test_equation_numbers_are_printed_in_their_chapters(book):
    starts = [_start_pages(book)[c["title"]] for c in CHAPTERS] + [len(book["texts"]) + 1]
    numbered = [c for c in CHAPTERS if c["equations"]]
    assert len(numbered) >= 10
    for chapter, (first, end) in zip(CHAPTERS, zip(starts, starts[1:])):
        text = " ".join(book["texts"][first - 1:end - 1])
        missing = [number for number in chapter["equations"] if number not in text]
        assert not missing, f"{chapter['title']}: equation numbers not printed: {missing}"
        recorded = next(c for c in book["record"]["chapters"] if c["name"] == chapter["name"])
        assert recorded["equations"] == chapter["equations"], chapter["title"]


def test_exercises_are_numbered_and_their_solutions_printed_with_their_code(book):
    """Exercise 3.2 and "Solution to Exercise 3.2" in chapter 3, the solution's code inside it.

    Each exercise is a sphinx-exercise directive; its solution is gated (solution-start, then
    the solution's text and code cells, then solution-end), so the code belongs to it. On paper
    the solution is unfolded: its title, and the first line of its code, are printed after the
    exercise and before the next solution. The text layer lists a page's boxed titles in its own
    order (an exercise's title bar may come before the solution box above it on the page), so an
    exercise is placed by its page: on the page of its solution or before it.
    """
    starts = [_start_pages(book)[c["title"]] for c in CHAPTERS] + [len(book["texts"]) + 1]
    assert sum(len(c["exercises"]) for c in CHAPTERS) >= 40

    def squeeze(text: str) -> str:  # the PDF's text layer spaces code its own way
        return re.sub(r"\s+", "", text)

    for chapter, (first, end) in zip(CHAPTERS, zip(starts, starts[1:])):
        pages = [squeeze(page) for page in book["texts"][first - 1:end - 1]]
        text = "".join(pages)
        page_of = [i for i, page in enumerate(pages) for _ in page]  # character -> page
        notebook = ROOT / f"{chapter['name']}.ipynb"
        cells = json.loads(notebook.read_text())["cells"] if notebook.is_file() else []
        solutions = _solution_code(cells)
        assert len(solutions) == len(chapter["exercises"]), chapter["title"]
        at = 0
        for label, code in zip(chapter["exercises"], solutions):
            label = squeeze(label)
            # "Exercise 3.1" on its own, not the start of 3.12 nor the end of "Solution to ..."
            shown = re.compile(r"(?<!Solutionto)" + re.escape(label) + r"(?!\d)")
            exercise = shown.search(text)
            assert exercise, f"{chapter['title']}: {label} not printed"
            solution = text.find(f"Solutionto{label}", at)
            assert solution >= 0, f"{chapter['title']}: no solution to {label} after the last"
            assert page_of[exercise.start()] <= page_of[solution], f"{label} after its solution"
            line = squeeze(next(line for line in code.splitlines() if line.strip()))
            following = text.find("Solutionto", solution + 1)
            following = len(text) if following < 0 else following
            assert solution < text.find(line[:20], solution) < following, f"{label}: code {line[:20]!r}"
            at = solution + 1


def _solution_code(cells: list[dict]) -> list[str]:
    """The code of each gated solution, in order: the first code cell after solution-start."""
    found, inside = [], False
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            if "{solution-end}" in source:
                inside = False
            if "{solution-start}" in source:
                assert not inside, "a solution starts inside another"
                inside, found = True, found + [None]
        elif inside and found[-1] is None:
            found[-1] = source
    assert None not in found, "a solution without code"
    return found


def test_every_image_and_figure_is_printed(book):
    reader = book["reader"]
    html = (SINGLE_PAGE / f"{TOC['root']}.html").read_text()
    article = html[html.index('<article class="bd-article">'):html.rindex("</article>")]
    images = len(re.findall(r"<img\s", article))
    assert images >= 5
    assert sum(_image_count(page) for page in reader.pages) == images == len(book["record"]["images"])
    starts = [_start_pages(book)[c["title"]] for c in CHAPTERS] + [len(book["texts"]) + 1]
    for chapter, (first, end) in zip(CHAPTERS, zip(starts, starts[1:])):
        text = " ".join(book["texts"][first - 1:end - 1])
        missing = [caption for caption in chapter["figures"] if caption not in text]
        assert not missing, f"{chapter['title']}: figure captions not printed: {missing}"
    assert sum(len(c["figures"]) for c in CHAPTERS) >= 10


def test_every_line_of_code_and_output_is_printed_whole(book):
    # The body of each page: the running header (book title) and the page number drawn last.
    body = _squeeze("".join("\n".join(text.splitlines()[:-2]) for text in book["texts"]))
    lines = _printed_text_of_cells()
    assert len(lines) > 1000
    missing = []
    for page, line, volatile in lines:
        if volatile:  # the same line with other numbers in it
            number = r"\d+(?:[.,]\d+)*"
            pieces = re.split(number, _squeeze(line))
            found = re.search(number.join(re.escape(piece) for piece in pieces), body)
        else:
            found = _squeeze(line) in body
        if not found:
            missing.append(f"{page}: {line}")
    assert not missing, f"{len(missing)} lines of code or output not in the PDF:\n" + "\n".join(missing[:20])


def test_every_page_has_its_number_in_the_footer(book):
    for number, text in enumerate(book["texts"], start=1):
        assert text.splitlines()[-1].strip() == str(number), f"page {number}: {text[-80:]!r}"


def test_bibliography_lists_every_reference(book):
    first = _start_pages(book)[CHAPTERS[-1]["title"]]
    assert CHAPTERS[-1]["name"].endswith("bibliography")
    text = _squeeze(" ".join(book["texts"][first - 1:])).lower()
    titles = _bib_titles()
    assert len(titles) >= 20
    missing = [title for title in titles if _squeeze(title).lower() not in text]
    assert not missing, f"not in the bibliography: {missing}"


def test_no_unresolved_reference_and_nothing_cut_off(book):
    text = "".join(book["texts"])
    assert "??" not in text
    record = book["record"]
    assert not record["problems"], record["problems"][:10]
    assert not record["brokenImages"] and not record["overflowing"], record["overflowing"][:10]
