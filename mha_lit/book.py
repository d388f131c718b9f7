"""The book's glue, with or without MyST-NB.

The book's pages put computed numbers into their prose with MyST-NB's
``glue``; a reader's notebook (Colab, a plain Jupyter) runs without
MyST-NB. Every chapter imports ``glue`` from here: with MyST-NB it is
``myst_nb.glue`` itself, so the stored outputs the build reads are
unchanged; without it, ``glue(name, value)`` shows the value and
``glue(name, value, display=False)`` does nothing.
"""

__all__ = ["glue"]

try:
    from myst_nb import glue
except ImportError:

    def glue(name: str, variable, display: bool = True) -> None:
        """Show ``variable`` if ``display``; there is no page to glue into."""
        if display:
            from IPython.display import display as show

            show(variable)
