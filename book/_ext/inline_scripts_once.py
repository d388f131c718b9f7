"""Emit each inline <script> of the HTML pages once (Sphinx 7.4 registers it twice).

Why: `Sphinx.add_js_file(None, body=...)` stores the script in the registry and hands it to the
HTML builder as filename `None`. Before writing, Sphinx 7.4's `prepare_writing` adds every
registry script again, this time as filename `''`; because `None != ''` the de-duplication in
`StandaloneHTMLBuilder.add_js_file` misses it, and the script appears twice in every page.
sphinx-thebe's `const THEBE_JS_URL = ...` then throws "Identifier 'THEBE_JS_URL' has already
been declared" in the browser. Sphinx 8.2 fixed this upstream (sphinx-doc/sphinx#13402:
"replace `None` filename with `''` before passing to HTML builder"); Jupyter Book 1 pins
Sphinx 7, so this extension applies the same normalisation to the builder.
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx


def _normalise_inline_filenames(app: Sphinx) -> None:
    """Make the HTML builder store an inline script under `''`, as its registry copy is."""
    builder = app.builder
    add_js_file = getattr(builder, "add_js_file", None)
    if add_js_file is None or getattr(add_js_file, "_inline_scripts_once", False):
        return

    def add_js_file_once(filename: str | None, **kwargs: Any) -> None:
        add_js_file("" if filename is None else filename, **kwargs)

    add_js_file_once._inline_scripts_once = True  # type: ignore[attr-defined]
    builder.add_js_file = add_js_file_once  # type: ignore[method-assign]
    # Scripts added before this hook ran (none in practice) get the same treatment.
    js_files = getattr(builder, "_js_files", None)
    if js_files is not None:
        deduplicated = []
        for asset in js_files:
            if asset.filename is None:
                asset = type(asset)("", priority=asset.priority, **asset.attributes)
            if asset not in deduplicated:
                deduplicated.append(asset)
        js_files[:] = deduplicated


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", _normalise_inline_filenames, priority=100)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
