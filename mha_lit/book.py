"""The book's glue, with or without MyST-NB.

The book's pages put computed numbers into their prose with MyST-NB's
``glue``; a reader's notebook (Colab, a plain Jupyter) runs without
MyST-NB. Every chapter imports ``glue`` from here: with MyST-NB it is
``myst_nb.glue`` itself, so the stored outputs the build reads are
unchanged; without it, ``glue(name, value)`` shows the value,
``glue(name, figure, display=False)`` shows the figure where it was made,
and ``glue(name, number, display=False)`` does nothing.
"""

__all__ = ["glue"]

try:
    from myst_nb import glue
except ImportError:

    def glue(name: str, variable, display: bool = True) -> None:
        """Show ``variable`` if ``display``, or if it is a figure.

        A figure (a Matplotlib Figure, or an interactive heatmap, which has
        an HTML form) is glued into a page's figure in the book; without the
        book it is shown where it was made. A number glued into the prose
        (``display=False``) is shown nowhere: the prose is not there.
        """
        figure = hasattr(variable, "savefig") or hasattr(
            variable, "_repr_html_")
        if display or figure:
            from IPython.display import display as show

            show(variable)
