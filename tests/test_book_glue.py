"""``mha_lit.book.glue``: MyST-NB's own glue where it is installed, a plain display where not.

With MyST-NB (the book's build and tests) it must be ``myst_nb.glue`` itself, so every stored
output nbval compares stays as it is. Without it (Colab, a plain Jupyter) ``display=True``
shows the value once and ``display=False`` shows only a figure.
"""

import importlib
import sys

import pytest

import mha_lit.book


def test_with_myst_nb_it_is_myst_nb_glue():
    myst_nb = pytest.importorskip("myst_nb")
    assert mha_lit.book.glue is myst_nb.glue


@pytest.fixture
def without_myst_nb(monkeypatch):
    """mha_lit.book loaded as if MyST-NB were not installed; loaded again as it is afterwards."""
    shown = []
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "myst_nb", None)  # `import myst_nb` raises ImportError
        patch.setattr("IPython.display.display", lambda *objs, **kw: shown.append(objs))
        book = importlib.reload(mha_lit.book)
        yield book, shown
    importlib.reload(mha_lit.book)


def test_without_myst_nb_display_false_shows_nothing(without_myst_nb):
    book, shown = without_myst_nb
    assert book.glue.__module__ == "mha_lit.book"
    assert book.glue("a_number", 0.125, display=False) is None
    assert shown == []


def test_without_myst_nb_display_true_shows_the_value_once(without_myst_nb):
    book, shown = without_myst_nb
    value = object()
    book.glue("a_value", value)
    book.glue("a_value_again", 3, display=True)
    assert shown == [(value,), (3,)]


def test_without_myst_nb_a_figure_is_shown_where_it_was_made(without_myst_nb):
    """A glued figure appears in the notebook itself, display=False or not."""
    from matplotlib.figure import Figure

    book, shown = without_myst_nb
    figure = Figure()
    book.glue("fig_a_figure", figure, display=False)
    assert shown == [(figure,)]


def test_reloaded_with_myst_nb_it_is_myst_nb_glue_again():
    """After the tests above, the fixture has left the module as it found it."""
    myst_nb = pytest.importorskip("myst_nb")
    assert mha_lit.book.glue is myst_nb.glue
