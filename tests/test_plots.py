"""Every figure function returns a Figure that draws what it claims to."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mha_lit import plots  # noqa: E402,F401

# --- Part I, chapters 1-3 -----------------------------------------------------------------

def _texts(ax):
    return [t.get_text() for t in ax.texts]


@pytest.mark.parametrize("a,b,c,entry", [(3, 5, 7, (2, 3)), (2, 3, 5, (1, 1)), (7, 2, 3, (7, 3))])
def test_product_shapes_draws_every_cell_and_highlights_row_column_entry(a, b, c, entry):
    fig = plots.product_shapes(a, b, c, entry=entry)
    assert isinstance(fig, plt.Figure) and len(fig.axes) == 1
    ax = fig.axes[0]
    gids = [p.get_gid() for p in ax.patches]
    assert len(gids) == a * b + b * c + a * c
    assert gids.count("highlight") == b + b + 1  # row x of A, column y of B, entry R_xy
    texts = _texts(ax)
    labels = (f"A\n{a} × {b}", f"B\n{b} × {c}", f"R\n{a} × {c}", f"{b} columns", f"{b} rows")
    assert all(label in texts for label in labels)
    x, y = entry
    hot = [p.get_xy() for p in ax.patches if p.get_gid() == "highlight"]
    assert (b + 2.0 + c + 2.0 + (y - 1), -x) in hot  # the entry sits at row x, column y of R


def test_product_shapes_refuses_bad_sizes_and_entries():
    with pytest.raises(ValueError, match="positive sizes"):
        plots.product_shapes(3, 0, 7)
    with pytest.raises(ValueError, match="outside the 3 x 7 result"):
        plots.product_shapes(3, 5, 7, entry=(4, 1))


def test_matrix_panels_one_axis_per_matrix_with_every_number():
    E = np.arange(15.0).reshape(3, 5) - 7
    P = np.ones((3, 5))
    fig = plots.matrix_panels([E, P, E + P], ["E", "P", "X"], ops=["+", "="],
                              row_labels=["the", "cat", "sat"])
    assert isinstance(fig, plt.Figure) and len(fig.axes) == 3
    for ax, M, name in zip(fig.axes, [E, P, E + P], "EPX"):
        assert ax.get_title() == f"{name}  (3 × 5)"
        numbers = [t for t in _texts(ax) if t not in ("+", "=")]
        assert sorted(numbers) == sorted(format(v, ".2f") for v in M.ravel())
        assert [t.get_text() for t in ax.get_yticklabels()] == ["the", "cat", "sat"]
    ops = [a.get_text() for ax in fig.axes for a in ax.texts if a.get_text() in "+="]
    assert ops == ["+", "="]


def test_matrix_panels_refuses_mismatched_names():
    with pytest.raises(ValueError, match="2 matrices"):
        plots.matrix_panels([np.ones((2, 3)), np.ones((2, 3))], ["A"])


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_attention_heatmap_marks_masked_cells_and_writes_weights(n):
    from mha_lit import causal_mask, softmax

    S = softmax(causal_mask(np.arange(n * n, dtype=float).reshape(n, n) / 3))
    fig = plots.attention_heatmap(S, title="S", tokens=[f"t{k}" for k in range(n)])
    assert isinstance(fig, plt.Figure) and len(fig.axes) == 1
    ax = fig.axes[0]
    assert ax.get_title() == "S"
    masked = [p for p in ax.patches if p.get_gid() == "masked"]
    assert len(masked) == n * (n - 1) // 2
    assert {(p.get_x() + 0.5, p.get_y() + 0.5) for p in masked} == {
        (j, i) for i in range(n) for j in range(n) if j > i}
    texts = _texts(ax)
    assert texts.count("masked") == n * (n - 1) // 2
    weights = [t for t in texts if t != "masked"]
    assert sorted(weights) == sorted(format(S[i, j], ".3f") for i in range(n) for j in range(i + 1))
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"t{k}" for k in range(n)]
    assert ax.get_xlabel().startswith("key") and ax.get_ylabel() == "query"


def test_attention_heatmap_without_mask_and_refusals():
    S = np.full((3, 3), 1 / 3)
    ax = plots.attention_heatmap(S, causal=False).axes[0]
    assert not [p for p in ax.patches if p.get_gid() == "masked"] and len(ax.texts) == 9
    with pytest.raises(ValueError, match="non-zero weight above the diagonal"):
        plots.attention_heatmap(S)
    with pytest.raises(ValueError, match="3 columns but 2 token labels"):
        plots.attention_heatmap(np.eye(3), tokens=["a", "b"])

# --- end of Part I, chapters 1-3 ------------------------------------------------------------

# --- Part I, chapters 4-7 -----------------------------------------------------------------

# --- end of Part I, chapters 4-7 --------------------------------------------------------------

# --- Part I, chapter 8 -------------------------------------------------------------------

# --- end of Part I, chapter 8 ------------------------------------------------------------------

# --- Part II ----------------------------------------------------------------------------

# --- end of Part II --------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")
