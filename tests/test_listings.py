"""Each chapter's listing is its chapter's mathematics: nothing a later chapter teaches.

The book prints mha_lit's functions with `literalinclude :pyobject:`, so a printed function is
a paragraph of its chapter. FIRST_TAUGHT says in which chapter each later feature is first
taught, by the names its code uses; a function printed in chapter c may name no feature first
taught after c. Docstrings and comments are prose and may point ahead; the code may not.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from pathlib import Path

import book_pages
import pytest

ROOT = book_pages.ROOT

# chapter -> the names its features bring into the code
FIRST_TAUGHT = {
    8: {"key_mask", "has_biases", "bias", "b_Q", "b_K", "b_V", "b_O", "per_sequence", "batch",
        "dropout"},
    12: {"fused_weights", "fused_biases", "few_rows_product", "project_heads",
         "output_projection", "choose_sizes", "attend", "attend_tiled", "fast"},
    14: {"kv_heads", "group", "repeat_kv", "group_queries", "ungroup"},
    15: {"rope_base", "rope", "rotate", "rotate_heads"},
    16: {"window", "band", "window_reach"},
    17: {"latent", "LatentWeights", "LatentKVCache", "latent_rows"},
}
PART_START = {"part1": 1, "part2": 9, "part3": 14, "part4": 19,
              "part5": 22}
INCLUDE = re.compile(r"```\{literalinclude\}\s*(\S+)\s*\n:pyobject:\s*(\S+)")


def chapter_of(page: str) -> int:
    """Chapter number of a page of _toc.yml: book/part2/03_x -> 11; 0 before Part I."""
    parts = Path(page).parts
    if len(parts) < 3 or parts[1] not in PART_START:
        return 0
    return PART_START[parts[1]] + int(parts[2][:2]) - 1


def listings() -> list[tuple[str, int, Path, str]]:
    """(page, chapter, source file, object) of every `literalinclude :pyobject:` in the book."""
    found = []
    for page in book_pages.toc_pages():
        path = (ROOT / page).with_suffix(".ipynb")
        if not path.exists():
            continue
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                for src, obj in INCLUDE.findall("".join(cell["source"])):
                    found.append((page, chapter_of(page), (path.parent / src).resolve(), obj))
    return found


def printed_source(path: Path, obj: str) -> str:
    """The source `literalinclude :pyobject: obj` prints: a function, class or Class.method."""
    tree = ast.parse(path.read_text())
    node = tree
    for name in obj.split("."):
        node = next(n for n in ast.iter_child_nodes(node)
                    if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name)
    lines = path.read_text().splitlines()
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return "\n".join(lines[start - 1:node.end_lineno])


def code_names(source: str) -> set[str]:
    """The names the code uses (identifiers and attributes), without docstrings and comments."""
    names = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME:
            names.add(tok.string)
    return names


def later_features(chapter: int, source: str) -> dict[int, set[str]]:
    """The names of features first taught after ``chapter`` that ``source``'s code uses."""
    used = code_names(source)
    return {c: used & names for c, names in FIRST_TAUGHT.items() if c > chapter and used & names}


LISTINGS = listings()


def test_the_book_prints_listings_in_every_part():
    chapters = {chapter for _, chapter, _, _ in LISTINGS}
    assert len(LISTINGS) > 40
    assert chapters & set(range(1, 9)) and chapters & set(range(9, 14)) and chapters & set(range(14, 19))


@pytest.mark.parametrize("page, chapter, path, obj", LISTINGS,
                         ids=[f"ch{c}-{o}" for _, c, _, o in LISTINGS])
def test_a_listing_names_nothing_a_later_chapter_teaches(page, chapter, path, obj):
    source = printed_source(path, obj)
    assert later_features(chapter, source) == {}, (
        f"{page} (chapter {chapter}) prints {obj}, whose code uses names first taught in "
        f"later chapters: {later_features(chapter, source)}")


def test_the_listing_test_can_fail():
    """A chapter-7 cache step with a window and RoPE in it is caught; its docstring is not."""
    source = '''def step(self, x):
    """Chapter 16 adds a window and chapter 15 rope_base."""
    slot = self.L % self.window  # a ring (chapter 16)
    return rope.rotate(x, slot)
'''
    assert later_features(7, source) == {15: {"rope", "rotate"}, 16: {"window"}}
    assert later_features(16, source) == {}
    assert code_names('"""window"""\n# window\nx = 1\n') == {"x"}
