"""The notation page is true: every symbol in the mathematics of a page is defined there for
that page, no row names a symbol its chapters do not use, and no prime size names two axes.

The reader of the mathematics is `notation_check.py` (its docstring gives the rules). These
tests read text only and take well under a second, so they are not marked `book`: they run in
the fast `-m "not book"` loop too. `python tests/notation_check.py` prints the same report.
"""

from __future__ import annotations

import notation_check as nc

TEXT = nc.NOTATION.read_text(encoding="utf-8")


def test_every_symbol_of_every_page_is_on_the_notation_page():
    bad = nc.check_book()
    lines = [f"{page}: {sym}  (in ${tex}$)" for page, missing in bad.items()
             for sym, tex in missing.items()]
    assert not lines, ("symbols that book/notation.md does not define for the page that uses "
                       "them (add a row, or its chapter to a row's `where`):\n"
                       + "\n".join(lines))


def test_no_row_names_a_symbol_its_chapters_do_not_use():
    stale = nc.stale_rows(TEXT, nc.page_symbols())
    assert not stale, "rows of book/notation.md that no listed chapter uses:\n" + "\n".join(stale)


def test_no_prime_size_is_listed_for_two_axes():
    primes = nc.size_primes(TEXT)
    assert {3, 5, 7, 11, 13, 17} <= set(primes), primes  # the table was read
    shared = {p: sorted(syms) for p, syms in primes.items() if len(syms) > 1}
    assert not shared, f"one prime, two axes in the sizes of book/notation.md: {shared}"


def test_the_prime_check_can_fail():
    table = ("| symbol | running example | what it counts |\n|---|---|---|\n"
             "| $n_\\text{vocab}$ | 13 | vocabulary |\n| $d_c$ | 13 | latent width |\n")
    assert nc.size_primes(table)[13] == {"n_\\text{vocab}", "d_c"}


def test_the_checker_reports_an_undefined_symbol():
    defined = nc.definitions(TEXT)
    page = (
        "Text with $Q K^T / \\sqrt{d_k}$ and $\\operatorname{softmax}(Z)$, `code $\\xi$`,\n"
        "an undefined $\\xi_t + \\Omega$ and a symbol of chapter 17 only, $d_c$.\n\n"
        "```python\nlam = 1  # $\\lambda$ in code is not mathematics\n```\n"
    )
    missing = nc.undefined("3", page, defined)
    assert set(missing) == {"\\xi", "\\Omega", "d_c"}, missing
    assert set(nc.undefined("17", "$d_c$", defined)) == set()


def test_the_stale_check_can_fail():
    table = "| symbol | meaning | where |\n|---|---|---|\n| $\\kappa$ | a strength | 4 |\n"
    assert nc.stale_rows(table, {"4": {"\\kappa"}}) == []
    assert len(nc.stale_rows(table, {"4": {"t"}})) == 1


def test_the_tokeniser_follows_its_rules():
    assert nc.symbols(r"d_\text{model} \times d_k") == {r"d_\text{model}", "d_k"}
    assert nc.symbols(r"(Q_i)_t = X_t W_{Qi} + b_{Qi}") == {"Q", "i", "t", "X", "W_Q", "b_Q"}
    assert nc.symbols(r"W_{UKi}^T (C^{KV})^T") == {"W_UK", "i", "C^{KV}"}
    assert nc.symbols(r"\tilde H_t' = \sum_{u'} e^{z_{u'} - m'}") == {
        "H'", "t", "u'", "e", "z", "m'"}
    assert nc.symbols(r"\operatorname{softmax}(Z)\,\text{peak} + \mathcal{R}_{p_t}") == {
        "Z", r"\mathcal{R}", "p", "t"}
    assert nc.symbols(r"W^{Q1}_{2,4} + D^L + I^* + \omega_j") == {
        "W_Q", "D", "L", "I^*", r"\omega", "j"}
    assert nc.symbols(r"h_\text{kv} = 2, \; n_b, \; d_c'") == {r"h_\text{kv}", "n_b", "d_c'"}


def test_math_is_found_and_code_is_not():
    page = (
        "Inline $a$, display\n\n$$\nb\n$$ (eq-x)\n\nand a role {glue:text}`c_name`.\n\n"
        "```{math}\n:label: eq-y\nc\n```\n\n```python\nd = '$e$'\n```\n"
        "A $multi\nline$ span, `$f$` in code, \\$ 5 and {math}`g`.\n"
    )
    assert nc.page_math(page) == ["c", "g", "a", "\nb\n", "multi\nline"]
