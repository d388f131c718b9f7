"""The one-page HTML build (the book PDF's) renders every node the HTML build renders.

Sphinx looks up a node's HTML visitors under the builder's name ("singlehtml") and falls back to
its format ("html") only when no extension registered anything under that name. sphinx-exercise
registers its nodes for "singlehtml" too, so the fallback is lost for every other node that is
registered for "html" alone, MyST-NB's folded code cells among them, and the one-page build
fails on the first one. Here each "html" visitor is also made the "singlehtml" visitor, unless
an extension gave that node a visitor of its own.
"""

from __future__ import annotations


def _share_html_visitors(app) -> None:
    handlers = app.registry.translation_handlers
    single = handlers.setdefault("singlehtml", {})
    for node_name, visitors in handlers.get("html", {}).items():
        single.setdefault(node_name, visitors)


def setup(app):
    app.connect("builder-inited", _share_html_visitors)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
