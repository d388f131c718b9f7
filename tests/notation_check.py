"""Read the mathematics of every page of the book and check it against the notation page.

The notation page (``book/notation.md``) declares every symbol of the book in its tables: the
mathematics in a column headed ``symbol`` (or ``letter``, or else the first column) names the
symbols, and the column ``where`` of the same row says on which pages they are defined; a
table without a ``where`` column defines nothing. This module extracts the mathematics of
every page listed in ``_toc.yml``, splits it into symbols and reports each symbol that a page
uses but the notation page does not define for that page.

What is read
    The markdown cells of a notebook, or the whole of a ``.md`` page. Code cells, fenced code
    blocks (except ``{math}`` blocks), inline code and roles such as ``{glue:text}`name``` are
    dropped first. The mathematics is then everything between ``$...$``, ``$$...$$``, inside a
    ```` ```{math} ```` block, a ``{math}`...``` role, or a ``\\begin{equation}...\\end{equation}``.

Symbols (the tokeniser, ``symbols``)
    - A symbol is one Latin letter (``Q``), one Greek letter (``\\omega``), ``\\ell``, or a
      calligraphic/blackboard letter (``\\mathcal{R}``), with a prime if it has one (``u'``).
      Accents (``\\tilde H``, ``\\hat x``) are dropped: ``\\tilde H`` is ``H``. Letters written
      side by side are separate symbols: ``QK^T`` is ``Q`` and ``K``.
    - A subscript written as a word, ``\\text{model}`` or ``\\mathrm{kv}``, makes one symbol with
      its letter: ``d_\\text{model}``, ``h_\\text{kv}``, ``M_\\text{cache}``.
    - A subscript that begins with capital letters names a family of matrices: ``W_{Qi}`` is
      ``W_Q`` (with the index ``i``), ``W_{UKi}`` is ``W_UK``, ``b_{Vi}`` is ``b_V``; what
      follows the capitals is read as ordinary mathematics (so ``i`` is used too).
    - The size letters ``d`` and ``n`` with a one-letter subscript are one symbol: ``d_k``,
      ``d_v``, ``d_c``, ``d_r``, ``n_b``.
    - Any other subscript is an index: ``Q_t`` is ``Q`` and ``t``; ``S_{tu}`` is ``S``, ``t``
      and ``u``; ``\\omega_j`` is ``\\omega`` and ``j``. Digits are not symbols: ``W_1`` is ``W``.
    - A superscript ``T`` or ``\\top`` (transpose) and numbers are not new symbols; ``*`` is
      kept with its letter (``I^*``). A superscript that is a word (``X^\\text{the}``), two or
      more capitals (``C^{KV}``), or one capital over a small letter (``c^Q``) makes one symbol
      with its letter; ``W^{Q1}`` is ``W_Q`` (chapter 6 writes an entry ``W^{Q1}_{2,4}``). Any
      other superscript is ordinary mathematics: ``D^L`` uses ``D`` and ``L``.
    - A prime goes with the whole symbol: ``d_c'``, ``W'_{Ki}`` is ``W_K'``.
    - A word in ``\\mathit{id}``, ``\\mathbf{...}`` (two or more letters) is a word, not symbols.
    - Commands are not symbols: ``\\frac``, ``\\sqrt``, ``\\sum``, ``\\max``, ``\\dots``...; the
      letters of ``\\operatorname{softmax}``, ``\\text{peak}``, ``\\mathrm{...}`` and of
      environment names are words, not symbols.

Rows that name only chapters (``stale_rows``)
    A row whose ``where`` is a list of single chapters (no ``all``, part or range) must name
    symbols that at least one of those chapters uses: a row left behind by a renaming fails.

The sizes (``size_primes``)
    The column ``running example`` of the sizes table: each prime in it belongs to one axis.

Where (``where_pages``)
    ``all`` (every page), a part ``I``, ``II``, ``III``, ``IV``, chapter numbers ``12`` and ranges
    ``9–13`` (the chapters of Parts I-IV are numbered 1-21 in the order of ``_toc.yml``), and the
    unnumbered pages ``intro``, ``first look``, ``glossary``. Text in parentheses (the section
    of a local symbol) is for the reader and is ignored. The notation page itself is not
    checked: it is the definition.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTATION = ROOT / "book" / "notation.md"

GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta",
    "vartheta", "iota", "kappa", "lambda", "mu", "nu", "xi", "pi", "varpi", "rho", "varrho",
    "sigma", "varsigma", "tau", "upsilon", "phi", "varphi", "chi", "psi", "omega", "Gamma",
    "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Upsilon", "Phi", "Psi", "Omega", "ell",
}
LETTER_FONTS = {"mathcal", "mathbb", "mathscr", "mathfrak"}  # \mathcal{R} is its own symbol
TRANSPARENT_FONTS = {"mathbf", "boldsymbol", "mathit", "bm", "mathnormal"}  # \mathbf{x} is x
WORDS = {"text", "mathrm", "operatorname", "textrm", "textit", "texttt", "textbf", "mbox",
         "mathtt", "mathsf", "textsf", "label", "tag", "begin", "end", "hbox"}
ACCENTS = {"tilde", "hat", "bar", "widetilde", "widehat", "overline", "vec", "dot", "ddot",
           "check", "breve", "underline"}
SIZE_LETTERS = {"d", "n"}
NOT_SYMBOLS_SUP = {"T", r"\top", r"\prime"}


# --- reading a page -------------------------------------------------------------------------

def page_markdown(path: Path) -> str:
    """The markdown of a page: a notebook's markdown cells joined, or a .md file's text."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return "\n\n".join(
            "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells if c["cell_type"] == "markdown"
        )
    return path.read_text(encoding="utf-8")


_FENCE = re.compile(r"^(`{3,}|~{3,})\s*(\{[^}]*\}|\w*)?[^\n]*\n(.*?)^\1\s*$", re.S | re.M)


def page_math(markdown: str) -> list[str]:
    """Every piece of mathematics of a page's markdown, in order."""
    pieces: list[str] = []

    def fence(match: re.Match) -> str:
        kind = (match.group(2) or "").strip()
        if kind == "{math}":
            body = "\n".join(line for line in match.group(3).splitlines()
                             if not line.lstrip().startswith(":"))
            pieces.append(body)
        elif kind == "{glossary}" or kind.startswith("{admonition") or kind in (
                "{note}", "{tip}", "{warning}", "{important}", "{hint}", "{seealso}",
                "{exercise}", "{solution}", "{dropdown}", "{margin}", "{sidebar}", "{figure}",
                "{caution}", "{attention}", "{epigraph}", "{topic}"):
            return match.group(3)  # prose inside a directive: read on
        return "\n"

    text = markdown
    for _ in range(3):  # directives nest (a note inside an exercise)
        text = _FENCE.sub(fence, text)
    text = re.sub(r"\{math\}`([^`]*)`", lambda m: pieces.append(m.group(1)) or " ", text)
    text = re.sub(r"`+[^`]*`+", " ", text)  # inline code and the targets of roles
    text = re.sub(r"\\begin\{(equation\*?|align\*?)\}(.*?)\\end\{\1\}",
                  lambda m: pieces.append(m.group(2)) or " ", text, flags=re.S)
    text = text.replace(r"\$", " ")
    for match in re.finditer(r"\$\$(.+?)\$\$|\$((?:[^$\n]|\n(?!\s*\n))+?)\$", text, re.S):
        pieces.append(match.group(1) if match.group(1) is not None else match.group(2))
    return pieces


# --- splitting mathematics into symbols -----------------------------------------------------

def _group(tex: str, i: int) -> tuple[str, int]:
    """The argument starting at tex[i] (after spaces): a {...} group, a command or one char."""
    while i < len(tex) and tex[i] == " ":
        i += 1
    if i >= len(tex):
        return "", i
    if tex[i] == "{":
        depth, j = 0, i
        while j < len(tex):
            depth += {"{": 1, "}": -1}.get(tex[j], 0)
            if depth == 0:
                return tex[i + 1:j], j + 1
            j += 1
        return tex[i + 1:], len(tex)
    if tex[i] == "\\":
        m = re.match(r"\\([A-Za-z]+)\*?", tex[i:])
        if m:
            name, j = m.group(1), i + m.end()
            if name in WORDS | LETTER_FONTS | TRANSPARENT_FONTS | ACCENTS:
                arg, j = _group(tex, j)
                return tex[i:i + m.end()] + "{" + arg + "}", j
            return tex[i:j], j
        return tex[i:i + 2], i + 2
    return tex[i], i + 1


def _word(script: str) -> str | None:
    """The word of a subscript such as ``\\text{model}``, or None."""
    m = re.fullmatch(r"\s*\\(?:text|mathrm|operatorname|textrm|textit|mathit)\{([^{}]*)\}\s*",
                     script)
    return m.group(1).strip() if m else None


def _atoms(tex: str):
    """(atom, subscript, superscript) for every letter of ``tex`` at its top level."""
    i, n = 0, len(tex)
    out = []
    while i < n:
        ch = tex[i]
        atom = None
        if ch == "\\":
            m = re.match(r"\\([A-Za-z]+)\*?", tex[i:])
            if not m:
                i += 2
                continue
            name = m.group(1)
            j = i + m.end()
            if name in GREEK:
                atom = "\\" + name
                i = j
            elif name in LETTER_FONTS:
                arg, i = _group(tex, j)
                atom = f"\\{name}{{{arg.strip()}}}"
            elif name in TRANSPARENT_FONTS or name in ACCENTS:
                arg, i = _group(tex, j)
                if name in TRANSPARENT_FONTS and re.fullmatch(r"\s*[A-Za-z]{2,}\s*", arg):
                    continue  # \mathit{id}: a word
                inner = _atoms(arg)
                if len(inner) == 1 and inner[0][1] is None and inner[0][2] is None:
                    atom = inner[0][0]  # \tilde H_t: the accent's letter takes the scripts
                else:
                    out.extend(inner)
                    continue
            elif name in WORDS:
                _, i = _group(tex, j)
                continue
            else:
                i = j
                continue
        elif ch.isascii() and ch.isalpha():
            atom = ch
            i += 1
        elif ch in "_^":  # a script after a bracket: (AB)^T, \big)^2
            script, i = _group(tex, i + 1)
            if script.strip() not in NOT_SYMBOLS_SUP:
                out.extend(_atoms(script))
            continue
        else:
            i += 1
            continue
        sub = sup = None
        prime = ""
        while i < n:
            while i < n and tex[i] == " ":
                i += 1
            if i < n and tex[i] == "'":
                prime += "'"
                i += 1
            elif i < n and tex[i] in "_^":
                kind = tex[i]
                script, i = _group(tex, i + 1)
                if kind == "_":
                    sub = script if sub is None else sub + "," + script
                else:
                    sup = script if sup is None else sup + "," + script
            else:
                break
        out.append((atom + prime, sub, sup) if prime and sub is None and sup is None
                   else (atom, sub, sup, prime) if prime else (atom, sub, sup))
    return out


def symbols(tex: str) -> set[str]:
    """The symbols of a piece of LaTeX, by the rules of the module docstring."""
    found: set[str] = set()
    for atom, sub, sup, *prime in _atoms(tex):
        name = atom
        if sub is not None:
            word = _word(sub)
            caps = re.match(r"\s*([A-Z]+)", sub)
            plain = sub.strip()
            if word is not None:
                name = f"{atom}_\\text{{{word}}}"
            elif caps and not plain.startswith("\\"):
                name = f"{atom}_{caps.group(1)}"
                found |= symbols(sub[caps.end():])
            elif atom in SIZE_LETTERS and re.fullmatch(r"[a-z]", plain):
                name = f"{atom}_{plain}"
            else:
                found |= symbols(sub)
        if sup is not None:
            plain = sup.strip()
            if plain in NOT_SYMBOLS_SUP:
                pass
            elif plain == "*":
                name += "^*"
            elif _word(sup) is not None:
                name += f"^\\text{{{_word(sup)}}}"
            elif atom == "W" and re.match(r"[A-Z]", plain):
                name = "W_" + re.match(r"[A-Z]+", plain).group()  # chapter 6: W^{Q1}_{2,4}
                found |= symbols(plain[len(name) - 2:])
            elif re.fullmatch(r"[A-Z]{2,}", plain) or (
                    atom[0].islower() and re.fullmatch(r"[A-Z]", plain)):
                name += "^{" + plain + "}"
            else:
                found |= symbols(sup)
        found.add(name + (prime[0] if prime else ""))
    return found


# --- the notation page ----------------------------------------------------------------------

def toc_pages() -> list[str]:
    """Every page of _toc.yml, in order (paths from the root, without suffix)."""
    import yaml

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("root", "file") and isinstance(value, str):
                    yield value
                else:
                    yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    return list(walk(yaml.safe_load((ROOT / "_toc.yml").read_text())))


def page_names(pages: list[str]) -> dict[str, str]:
    """Page path -> its name for ``where``: ``1``..``24`` for chapters, else a word."""
    names, chapter = {}, 0
    for page in pages:
        if re.search(r"/part[12345]/", page):
            chapter += 1
            names[page] = str(chapter)
        else:
            names[page] = Path(page).name.replace("_", " ")
    return names


PARTS = {"I": range(1, 9), "II": range(9, 14), "III": range(14, 19),
         "IV": range(19, 22), "V": range(22, 25)}


def where_pages(cell: str) -> set[str]:
    """The page names a ``where`` cell stands for (see the module docstring)."""
    cell = re.sub(r"\([^)]*\)", " ", cell)
    names: set[str] = set()
    for item in re.split(r"[,;]", cell):
        item = item.strip().replace("–", "-").replace("—", "-")
        if not item:
            continue
        if item in PARTS:
            names |= {str(c) for c in PARTS[item]}
        elif re.fullmatch(r"\d+\s*-\s*\d+", item):
            lo, hi = (int(x) for x in item.split("-"))
            names |= {str(c) for c in range(lo, hi + 1)}
        elif re.fullmatch(r"\d+", item):
            names.add(item)
        else:
            names.add(item)  # all, intro, first look, glossary
    return names


def _cells(line: str) -> list[str]:
    line = line.strip().strip("|")
    cells, cur, math = [], "", False
    for ch in line:  # a | inside $...$ (\mid, |x|) does not split cells
        if ch == "$":
            math = not math
        if ch == "|" and not math:
            cells.append(cur.strip())
            cur = ""
        else:
            cur += ch
    cells.append(cur.strip())
    return cells


def table_rows(text: str):
    """(line number, lower-cased header cells, cells) for every body row of every table."""
    header = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip().startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = [c.lower() for c in cells]
        elif not all(set(c) <= set("-: ") for c in cells):  # not the |---| line
            yield number, header, cells


def notation_tables(text: str) -> list[tuple[str, str, int]]:
    """(symbol cell, where cell, line number) for every row of a table with a ``where`` column."""
    rows = []
    for number, header, cells in table_rows(text):
        if "where" in header:
            key = next((k for k, h in enumerate(header) if h in ("symbol", "letter")), 0)
            rows.append((cells[key], cells[header.index("where")], number))
    return rows


def definitions(text: str) -> dict[str, set[str]]:
    """Symbol -> the page names where the notation page defines it."""
    defined: dict[str, set[str]] = defaultdict(set)
    for symbol_cell, where_cell, _ in notation_tables(text):
        pages = where_pages(where_cell)
        for tex in re.findall(r"\$([^$]+)\$", symbol_cell):
            for sym in symbols(tex):
                defined[sym] |= pages
    return defined


def undefined(page_name: str, markdown: str, defined: dict[str, set[str]]) -> dict[str, str]:
    """Symbol -> the first piece of math that uses it, for each symbol not defined on the page."""
    missing: dict[str, str] = {}
    for tex in page_math(markdown):
        for sym in sorted(symbols(tex)):
            where = defined.get(sym, set())
            if "all" in where or page_name in where or sym in missing:
                continue
            missing[sym] = tex.strip()[:80]
    return missing


def check_book() -> dict[str, dict[str, str]]:
    """Page -> its undefined symbols (symbol -> where it is used); empty when the page is true."""
    defined = definitions(NOTATION.read_text(encoding="utf-8"))
    pages = toc_pages()
    names = page_names(pages)
    report = {}
    for page in pages:
        if page == "book/notation":
            continue
        path = next((ROOT / (page + s) for s in (".ipynb", ".md") if (ROOT / (page + s)).exists()),
                    None)
        if path is None:
            continue
        missing = undefined(names[page], page_markdown(path), defined)
        if missing:
            report[page] = missing
    return report


def size_primes(text: str) -> dict[int, set[str]]:
    """Prime -> the symbols that the sizes table (its column ``running example``) gives that size."""
    primes: dict[int, set[str]] = defaultdict(set)
    for _, header, cells in table_rows(text):
        col = next((k for k, h in enumerate(header) if h == "running example"), None)
        if col is None or col >= len(cells):
            continue
        value = cells[col].replace(",", "").strip()
        if not re.fullmatch(r"\d+", value):
            continue
        value = int(value)
        if value < 2 or any(value % p == 0 for p in range(2, int(value ** 0.5) + 1)):
            continue
        syms = re.findall(r"\$([^$]+)\$", cells[0])
        if syms:
            primes[value].add(syms[0].strip().replace(" ", ""))
    return primes


def page_symbols() -> dict[str, set[str]]:
    """Page name (``where``) -> every symbol its mathematics uses (the notation page left out)."""
    pages = toc_pages()
    names = page_names(pages)
    used: dict[str, set[str]] = {}
    for page in pages:
        path = next((ROOT / (page + s) for s in (".ipynb", ".md") if (ROOT / (page + s)).exists()),
                    None)
        if path is None or page == "book/notation":
            continue
        used[names[page]] = set().union(*map(symbols, page_math(page_markdown(path))))
    return used


def stale_rows(text: str, used: dict[str, set[str]]) -> list[str]:
    """Rows that name only chapters (no ``all``, part or range) and a symbol none of them uses."""
    stale = []
    for symbol_cell, where_cell, line in notation_tables(text):
        items = [x.strip() for x in re.split(r"[,;]", re.sub(r"\([^)]*\)", " ", where_cell))]
        if not items or not all(re.fullmatch(r"\d+|glossary|intro|first look", x) for x in items):
            continue
        cell_symbols = set().union(*map(symbols, re.findall(r"\$([^$]+)\$", symbol_cell)))
        for sym in sorted(cell_symbols):
            if not any(sym in used.get(x, set()) for x in items):
                stale.append(f"notation.md line {line}: {sym} is used on none of {where_cell}")
    return stale


if __name__ == "__main__":
    bad = check_book()
    for page, missing in bad.items():
        for sym, where in missing.items():
            print(f"{page}: {sym}    in: {where}")
    print(f"{sum(len(m) for m in bad.values())} undefined symbol(s) on {len(bad)} page(s)")
    stale = stale_rows(NOTATION.read_text(encoding="utf-8"), page_symbols())
    print("\n".join(stale))
    print(f"{len(stale)} stale symbol(s) on the notation page")
