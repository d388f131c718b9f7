"""Label the bibliography by author and year, as the citations in the text are.

With `bibtex_reference_style: author_year` a citation reads "[Ba et al., 2016]", but the
bibliography's entries keep pybtex's default "alpha" labels ("[BKH16]"), so a reader who follows
a citation lands on a label that does not match it. This registers the pybtex formatting style
`plain_author_year`: pybtex's "plain" style with labels "Ba et al., 2016", "Hendrycks and
Gimpel, 2016", "OpenAI, 2019" (a, b, ... added when two entries would share a label), sorted by
author, year and title with names compared as printed, so "{OpenAI}" sorts under O.
`_config.yml` selects it with `bibtex_default_style`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pybtex.plugin
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting.author_year_title import (
    SortingStyle as AuthorYearTitleSorting,
)


def _last_name(person) -> str:
    """The printed last name of a pybtex Person, with LaTeX braces and accents resolved."""
    return Text.from_latex(" ".join(person.prelast_names + person.last_names)).render_as("text")


def _author_year(entry) -> str:
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_last_name(p) for p in people]
    if not names:
        who = entry.fields.get("organization", entry.key)
    elif len(names) == 1:
        who = names[0]
    elif len(names) == 2:
        who = f"{names[0]} and {names[1]}"
    else:
        who = f"{names[0]} et al."
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabelStyle(BaseLabelStyle):
    """Labels "Author, Year", "Author and Other, Year" or "Author et al., Year"."""

    def format_labels(self, sorted_entries):
        sorted_entries = list(sorted_entries)
        labels = [_author_year(entry) for entry in sorted_entries]
        repeated = {label for label, count in Counter(labels).items() if count > 1}
        seen: Counter = Counter()
        for label in labels:
            if label in repeated:
                seen[label] += 1
                label = f"{label}{chr(ord('a') + seen[label] - 1)}"
            yield label


class PrintedNameSorting(AuthorYearTitleSorting):
    """Sort by author, year, title, comparing names as printed: "{OpenAI}" sorts as "openai"."""

    def person_key(self, person):
        return Text.from_latex(super().person_key(person)).render_as("text").lower()


class PlainAuthorYearStyle(PlainStyle):
    """pybtex's plain style, labelled by author and year."""

    default_label_style = "author_year_label"
    default_sorting_style = "printed_author_year_title"


def setup(app) -> dict[str, Any]:
    pybtex.plugin.register_plugin("pybtex.style.labels", "author_year_label", AuthorYearLabelStyle)
    pybtex.plugin.register_plugin("pybtex.style.sorting", "printed_author_year_title",
                                  PrintedNameSorting)
    pybtex.plugin.register_plugin("pybtex.style.formatting", "plain_author_year",
                                  PlainAuthorYearStyle)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
