"""Debian's Chromium, driven by Playwright, with the network shut off.

Used by `scripts/build_pdf.py` (which prints the book) and `tests/test_browser.py` (which opens
every page): both need the same browser, launched the same way, and pages that may load
nothing but the built site's own files.
"""

from __future__ import annotations

ARGS = ["--disable-gpu", "--disable-background-networking", "--disable-sync"]


def launch(playwright, chromium: str):
    """Headless Chromium from the executable ``chromium`` (no browser download)."""
    return playwright.chromium.launch(executable_path=chromium, args=ARGS)


def offline_page(context, problems: list[str], *, console: bool = True):
    """A new page of ``context`` that may load only ``file://`` URLs.

    Every other request is refused and recorded in ``problems``, as are JavaScript errors,
    failed requests and (with ``console``) console errors.
    """
    context.route(
        lambda url: not url.startswith("file:"),
        lambda route: (problems.append(f"blocked network request: {route.request.url}"),
                       route.abort())[1],
    )
    page = context.new_page()
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    if console:
        page.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}")
                if msg.type == "error" else None)
    page.on("requestfailed", lambda request: problems.append(
        f"request failed: {request.url} ({request.failure})"))
    return page
