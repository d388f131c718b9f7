"""Copy the book's own static files (book.css, book.js) again whenever they change.

Why: Sphinx copies `html_static_path` into the output only in the last phase of a build that
writes at least one page. When no page is out of date, an incremental build reports "no
targets are out of date" and stops before that phase, so a changed style sheet or script
never reaches `_build/html/_static/`, and the built site keeps the old one. This extension
compares each static file with its copy in the output; if one differs, it names the root
page as outdated, so that the build writes it and then copies every static file.
"""

from __future__ import annotations

import filecmp
from pathlib import Path

from sphinx.application import Sphinx


def _stale_static_files(app: Sphinx) -> list[str]:
    """Static files of `html_static_path` whose copy in the output is missing or differs."""
    stale = []
    out = Path(app.outdir) / "_static"
    for folder in app.config.html_static_path:
        source = Path(app.confdir) / folder
        if not source.is_dir():
            continue
        for path in source.rglob("*"):
            if path.is_file():
                copy = out / path.relative_to(source)
                if not copy.is_file() or not filecmp.cmp(path, copy, shallow=False):
                    stale.append(str(path.relative_to(source)))
    return stale


def _outdated(app: Sphinx, env, added, changed, removed) -> list[str]:
    if app.builder.format != "html" or not _stale_static_files(app):
        return []
    return [app.config.root_doc]


def setup(app: Sphinx) -> dict:
    app.connect("env-get-outdated", _outdated)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
