"""Every figure function returns a Figure that draws what it claims to."""

import re
from html.parser import HTMLParser

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
    assert gids.count("highlight") == b + b + 1  # row x of A, column y of C, entry R_xy
    texts = _texts(ax)
    labels = (f"A\n{a} × {b}", f"C\n{b} × {c}", f"R\n{a} × {c}", f"{b} columns", f"{b} rows")
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


def _figure_texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


@pytest.mark.parametrize("h, n", [(2, 3), (1, 2), (3, 5)])
def test_head_heatmaps_one_panel_per_head_with_the_mask(h, n):
    rng = np.random.default_rng(h * n)
    S = np.tril(rng.random((h, n, n)))
    S /= S.sum(axis=-1, keepdims=True)
    fig = plots.head_heatmaps(S)
    assert len(fig.axes) == h
    assert [ax.get_title() for ax in fig.axes] == [f"head {i + 1}: $S_{i + 1}$" for i in range(h)]
    assert _figure_texts(fig).count("masked") == h * n * (n - 1) // 2
    assert f"{S[-1, -1, 0]:.3f}" in [t.get_text() for t in fig.axes[-1].texts]
    with pytest.raises(ValueError, match=r"\(heads, n, n\), got shape \(3, 3\)"):
        plots.head_heatmaps(np.ones((3, 3)))
    named = plots.head_heatmaps(S, titles=[f"panel {i}" for i in range(h)])
    assert [ax.get_title() for ax in named.axes] == [f"panel {i}" for i in range(h)]
    with pytest.raises(ValueError, match=f"{h + 1} titles for {h} heads"):
        plots.head_heatmaps(S, titles=["title"] * (h + 1))


def test_concat_output_outlines_each_head_block():
    rng = np.random.default_rng(0)
    H, W_O = rng.standard_normal((2, 3, 11)), rng.standard_normal((22, 5))
    fig = plots.concat_output(H, W_O)
    titles = [ax.get_title() for ax in fig.axes]
    assert "Concat$(H_1, H_2)$: 3 × 22" in titles and "$W_O$: 22 × 5" in titles
    assert "$Y$: 3 × 5" in titles
    y_ax = fig.axes[titles.index("$Y$: 3 × 5")]
    assert np.allclose(y_ax.images[0].get_array(), np.concatenate(list(H), axis=1) @ W_O)
    outlined = [p for ax in fig.axes for p in ax.patches]
    assert len(outlined) == 4  # two blocks of Concat's columns, two of W_O's rows
    # head 1's outline differs from head 2's, and neither is the red or blue of the values
    styles = {(tuple(p.get_edgecolor()), p.get_linestyle()) for p in outlined}
    assert len(styles) == 2
    for (r, g, b, _), _ in styles:
        assert not (r > 0.6 and g < 0.4 and b < 0.4) and not (b > 0.6 and r < 0.4 and g < 0.6)
    with pytest.raises(ValueError, match=r"got H \(2, 3, 11\), W_O \(21, 5\)"):
        plots.concat_output(H, W_O[:21])


def test_dependency_grid_labels_exact_zeros():
    D = np.array([[1.0, 0, 0], [0.5, 2.0, 0], [0.1, 0.2, 0.3]])
    fig = plots.dependency_grid(D, "test")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts].count("0") == 3
    assert sum(p.get_gid() == "zero" for p in ax.patches) == 3
    assert [t.get_text() for t in ax.get_xticklabels()] == ["$X_1$", "$X_2$", "$X_3$"]
    with pytest.raises(ValueError, match="square"):
        plots.dependency_grid(np.ones((2, 3)))
    with pytest.raises(ValueError, match="square"):
        plots.dependency_grid(-np.eye(2))


def test_kv_cost_curves_draws_both_counts_and_their_sums():
    n = np.arange(1, 9)
    cached, recomputed = 10 * n, n**2
    fig = plots.kv_cost_curves(n, cached, recomputed)
    per, total = fig.axes
    assert [line.get_label() for line in per.lines] == ["recompute every row", "with the KV cache"]
    assert np.array_equal(per.lines[1].get_ydata(), cached)
    assert np.array_equal(total.lines[0].get_ydata(), np.cumsum(recomputed))
    # log axes: linear growth and quadratic growth have visibly different slopes
    assert all(ax.get_xscale() == ax.get_yscale() == "log" for ax in (per, total))
    with pytest.raises(ValueError, match="one length"):
        plots.kv_cost_curves(n, cached[:-1], recomputed)


class _Elements(HTMLParser):
    """Every start tag of an HTML text, with its attributes, in order (stdlib parser)."""

    def __init__(self, text):
        super().__init__()
        self.found = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, dict(attrs)))


def _panels(html):
    """data-head of each panel -> the attributes of its weight cells, and the hidden flags."""
    panels, hidden, current = {}, {}, None
    for tag, attrs in _Elements(html).found:
        if tag == "div" and "mha-attn-panel" in attrs.get("class", ""):
            current = int(attrs["data-head"])
            panels[current], hidden[current] = [], "hidden" in attrs
        elif tag == "rect" and "data-w" in attrs:
            panels[current].append(attrs)
    return panels, hidden


@pytest.mark.parametrize("h, n, m", [(2, 3, 3), (1, 3, 3), (3, 5, 5), (2, 1, 4), (1, 2, 7)])
def test_interactive_heatmaps_one_rect_per_weight_with_its_printed_value(h, n, m):
    rng = np.random.default_rng(100 * h + 10 * n + m)
    allowed = ~np.triu(np.ones((n, m), dtype=bool), k=1 + m - n)  # (n, m)
    S = np.where(allowed, rng.random((h, n, m)), 0.0)
    S /= S.sum(axis=-1, keepdims=True)
    tokens = [f"w{k}" for k in range(m)]
    shown = plots.interactive_heatmaps(S, tokens=tokens)
    panels, hidden = _panels(shown.html)
    assert sorted(panels) == list(range(h))
    assert hidden == {i: i > 0 for i in range(h)}  # head 1 shows first
    for i, cells in panels.items():
        assert len(cells) == n * m  # one rect per weight
        for cell in cells:
            r, c = int(cell["data-i"]), int(cell["data-j"])
            assert cell["data-w"] == f"{S[i, r, c]:.3f}" == shown.weights[i][r][c]
            assert (cell["data-q"], cell["data-k"]) == (tokens[m - n + r], tokens[c])
            assert ("data-masked" in cell) == (not allowed[r, c])
        assert {(int(c["data-i"]), int(c["data-j"])) for c in cells} == {
            (r, c) for r in range(n) for c in range(m)}
    buttons = [a for tag, a in _Elements(shown.html).found if tag == "button"]
    assert [b["data-head"] for b in buttons] == ([str(i) for i in range(h)] if h > 1 else [])
    assert [b["aria-pressed"] for b in buttons] == (["true"] + ["false"] * (h - 1) if h > 1 else [])
    assert shown.html.count("<script>") == 1 and shown.html.count("<style>") == 1
    assert shown._repr_png_().startswith(b"\x89PNG\r\n\x1a\n")
    assert repr(shown) == f"<interactive attention heatmaps: {h} head(s), {n} queries x {m} keys>"
    assert not plt.get_fignums()  # the PNG's figure is closed: no second copy in a notebook


def test_interactive_heatmaps_loads_nothing_and_escapes_tokens():
    S = np.array([[1.0, 0.0], [0.25, 0.75]])  # (2, 2)
    shown = plots.interactive_heatmaps(S, tokens=['<b>', 'say "hi"'], titles=["a & b"])
    tags = _Elements(shown.html).found
    assert not [a for _, a in tags if {"src", "href"} & set(a)]  # nothing fetched
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg\")", shown.html)
    assert "<b>" not in shown.html and "&lt;b&gt;" in shown.html
    cell = _panels(shown.html)[0][0][3]  # query 'say "hi"', key 'say "hi"'
    assert (cell["data-q"], cell["data-k"], cell["data-w"]) == ('say "hi"', 'say "hi"', "0.750")
    assert "a &amp; b" in shown.html
    assert _panels(shown.html)[0][0][0]["data-w"] == "1.000"


def test_interactive_heatmaps_prints_rounding_noise_as_zero_and_draws_its_figure():
    S = np.array([[1 + 2e-16, 0.0], [-1e-17, 1.0]])  # rounding around 0 and 1
    shown = plots.interactive_heatmaps(S, decimals=2)
    assert [c["data-w"] for c in _panels(shown.html)[0][0]] == ["1.00", "0.00", "0.00", "1.00"]
    assert "-0" not in shown.html
    fig = plots.head_heatmaps(np.stack([S, S]))
    assert plots.interactive_heatmaps(np.stack([S, S]), figure=fig).png.startswith(b"\x89PNG")
    assert not plt.fignum_exists(fig.number)


def test_interactive_heatmaps_refuses_bad_input_naming_the_shape():
    good = np.tril(np.full((3, 3), 0.5))  # (3, 3); rows need not sum to 1 here
    with pytest.raises(ValueError, match=r"shape \(heads, n, m\) or \(n, m\).*got shape \(3,\)"):
        plots.interactive_heatmaps(np.ones(3))
    with pytest.raises(ValueError, match=r"got shape \(1, 2, 3, 3\)"):
        plots.interactive_heatmaps(good[None, None].repeat(2, axis=1))
    with pytest.raises(ValueError, match=r"got shape \(0, 3, 3\)"):
        plots.interactive_heatmaps(np.zeros((0, 3, 3)))
    with pytest.raises(ValueError, match=r"shape \(4, 3\) has 4 queries but only 3 keys"):
        plots.interactive_heatmaps(np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"shape \(2, 3, 3\) has non-zero weight above the diag"):
        plots.interactive_heatmaps(np.full((2, 3, 3), 1 / 3))
    assert plots.interactive_heatmaps(np.full((2, 3, 3), 1 / 3), causal=False).weights[1][0][2] == "0.333"
    with pytest.raises(ValueError, match=r"shape \(3, 3\) must hold weights in \[0, 1\]"):
        plots.interactive_heatmaps(good * 3)
    with pytest.raises(ValueError, match=r"shape \(3, 3\) must hold weights in \[0, 1\]"):
        plots.interactive_heatmaps(np.where(good > 0, np.nan, 0))
    with pytest.raises(ValueError, match=r"shape \(1, 3, 3\) has 3 keys but 2 token labels"):
        plots.interactive_heatmaps(good[None], tokens=["a", "b"])
    with pytest.raises(ValueError, match=r"2 titles for 1 heads \(S of shape \(3, 3\)\)"):
        plots.interactive_heatmaps(good, titles=["a", "b"])
    assert not plt.get_fignums()  # a refusal leaves no figure behind

# --- end of Part I, chapters 4-7 --------------------------------------------------------------

# --- Part I, chapter 8 -------------------------------------------------------------------

def _gpt_parts(fig):
    ax = fig.axes[0]
    gids = [p.get_gid() or "" for p in ax.patches]
    nodes = [gid[len("node:"):] for gid in gids if gid.startswith("node:")]
    arrows = [gid for gid in gids if gid in ("arrow", "residual")]
    texts = [t.get_text() for t in ax.texts]
    return nodes, arrows, texts


def test_gpt_block_diagram_post_ln_boxes_arrows_and_shapes():
    fig = plots.gpt_block_diagram(pre_ln=False)
    nodes, arrows, texts = _gpt_parts(fig)
    assert nodes == ["Token + position embedding", "Masked multi-head attention",
                     "Add & layer norm 1", "Feed-forward network", "Add & layer norm 2",
                     "Linear: output layer", "Softmax"]
    assert arrows.count("arrow") == len(nodes) - 1 and arrows.count("residual") == 2
    assert all(title in texts for title in nodes)
    assert "GELU, per row: 5 → 17 → 5" in texts and texts.count("3 × 5") == 5
    assert "3 × 13" in texts  # n_vocab = 13 scores per row
    assert any(t.startswith("× L") for t in texts)
    assert [p.get_gid() for p in fig.axes[0].patches].count("frame") == 1


def test_gpt_block_diagram_pre_ln_has_norms_before_sublayers_and_a_final_norm():
    fig = plots.gpt_block_diagram(pre_ln=True, n=7, d_model=11, d_ff=17)
    nodes, arrows, texts = _gpt_parts(fig)
    assert nodes == ["Token + position embedding", "Layer norm 1", "Masked multi-head attention",
                     "+", "Layer norm 2", "Feed-forward network", "+", "Final layer norm",
                     "Linear: output layer", "Softmax"]
    assert arrows.count("arrow") == 9 and arrows.count("residual") == 2
    assert "GELU, per row: 11 → 17 → 11" in texts and "7 × 11" in texts
    assert "pre-LN" in fig.axes[0].get_title()


def test_gpt_block_diagram_residuals_skip_a_sublayer_and_end_at_an_addition():
    for pre_ln, first_add in ((False, "node:Add & layer norm 1"), (True, "node:+")):
        fig = plots.gpt_block_diagram(pre_ln=pre_ln)
        ax = fig.axes[0]
        fig.canvas.draw()
        to_data = ax.transData.inverted()
        boxes = {}
        for p in ax.patches:  # data-coordinate (x0, y0, x1, y1) of each drawn patch
            bb = p.get_window_extent()
            (x0, y0), (x1, y1) = to_data.transform([[bb.x0, bb.y0], [bb.x1, bb.y1]])
            boxes.setdefault(p.get_gid(), []).append((x0, y0, x1, y1))
        skips = sorted(boxes["residual"], key=lambda b: -b[3])
        attn = boxes["node:Masked multi-head attention"][0]
        add_y = (boxes[first_add][0][1] + boxes[first_add][0][3]) / 2
        assert skips[0][3] > attn[3] and abs(skips[0][1] - add_y) < 0.15  # around attention
        assert skips[0][2] > attn[2]  # passes on the right of the attention box
        ffn = boxes["node:Feed-forward network"][0]
        assert skips[1][3] > ffn[3] > ffn[1] > skips[1][1]  # and around the FFN

# --- end of Part I, chapter 8 ------------------------------------------------------------------

# --- Part II ----------------------------------------------------------------------------


def test_one_hot_product_draws_three_matrices_with_shapes():
    from mha_lit import counting

    E = np.random.default_rng(0).standard_normal((13, 5))
    O = counting.one_hot(np.array([2, 7, 11]), 13)
    fig = plots.one_hot_product(O, E, O @ E)
    assert isinstance(fig, plt.Figure) and len(fig.axes) == 3
    assert [ax.get_title().split("\n")[1] for ax in fig.axes] == ["3 × 13", "13 × 5", "3 × 5"]
    assert np.array_equal(fig.axes[2].images[0].get_array(), O @ E)
    with pytest.raises(ValueError, match="cannot give"):
        plots.one_hot_product(O, E, E)


def test_matmul_count_bars_heights_are_the_counts():
    sep = {"a": 10, "b": 3, "c": 1}
    fused = {"a": 1, "b": 1, "c": 1}
    macs = {"a": 1e9, "b": 2e6, "c": 5.0}
    fig = plots.matmul_count_bars(sep, fused, macs, title="t")
    assert len(fig.axes) == 2
    counts, work = fig.axes
    widths = [p.get_width() for p in counts.patches]
    assert widths == [10, 3, 1, 1, 1, 1]
    assert [p.get_width() for p in work.patches] == [1e9, 2e6, 5.0]
    assert [t.get_text() for t in counts.get_yticklabels()] == ["a", "b", "c"]
    assert len(plots.matmul_count_bars(sep, fused).axes) == 1
    with pytest.raises(ValueError, match="same components"):
        plots.matmul_count_bars(sep, {"a": 1, "b": 1})


def test_flops_vs_length_draws_curves_and_marks():
    n = np.array([1, 10, 100])
    models = {"m1": {"linear": n * 5.0, "quadratic": n**2 * 1.0},
              "m2": {"linear": n * 7.0, "quadratic": n**2 * 2.0}}
    fig = plots.flops_vs_length(n, models, {"m1": 5, "m2": 3.5}, {"m1": 64, "m2": 32})
    assert len(fig.axes) == 2
    ax = fig.axes[0]
    assert np.array_equal(ax.lines[1].get_ydata(), n**2 * 1.0)
    assert ax.lines[2].get_xdata()[0] == 5 and ax.lines[3].get_xdata()[0] == 64
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    fig = plots.flops_vs_length(n, models, {"m1": 5, "m2": 3.5}, {"m1": 64, "m2": 32},
                                crossovers_ffn={"m1": 15, "m2": 10.5})
    marks = [(ln.get_xdata()[0], ln.get_linestyle()) for ln in fig.axes[1].lines[2:]]
    assert marks == [(3.5, "--"), (10.5, "-."), (32, ":")]
    with pytest.raises(ValueError, match="2 values for 3 lengths"):
        plots.flops_vs_length(n, {"m": {"x": [1, 2]}}, {"m": 1})
    with pytest.raises(ValueError, match="positive"):
        plots.flops_vs_length([0, 1], models, {"m1": 1, "m2": 1})


@pytest.mark.parametrize("n, block", [(1024, None), (1000, 128), (37, 5), (6, 1), (3, 8)])
def test_causal_block_grid_kinds_match_a_brute_force_count(n, block):
    from mha_lit import fast

    B = fast.BLOCK_ROWS if block is None else block
    allowed = np.tril(np.ones((n, n), dtype=bool))  # key j <= query i
    expected = []  # brute force: look at every entry of every tile
    for r0 in range(0, n, B):
        row = []
        for c0 in range(0, n, B):
            tile = allowed[r0:r0 + B, c0:c0 + B]
            row.append(fast.COMPUTED if tile.all() else fast.MASKED if tile.any()
                       else fast.SKIPPED)
        expected.append(row)
    kinds = fast.causal_block_kinds(n, block)
    assert np.array_equal(kinds, expected)
    fig = plots.causal_block_grid(n, block)
    drawn = np.asarray(fig.axes[0].collections[0].get_array()).reshape(kinds.shape)
    assert np.array_equal(drawn, kinds)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    counts = [int(t.rsplit("(", 1)[1].rstrip(")")) for t in legend]
    assert counts == [(kinds == k).sum() for k in (fast.COMPUTED, fast.MASKED, fast.SKIPPED)]
    skipped_entries = n * n - sum(min(r0 + B, n) * (min(r0 + B, n) - r0) for r0 in range(0, n, B))
    assert f"{skipped_entries / n**2:.0%} of the score entries skipped" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match="positive"):
        fast.causal_block_kinds(0, 4)

# --- end of Part II --------------------------------------------------------------------------


# The smallest text a figure may carry. The book shows figures as PNGs at 100 dpi (the notebook's
# inline backend): 7 pt is 9.7 px at full size, and the book never draws a figure below 0.62 of
# its size (book/_static/book.js), so no text of a figure falls below 6 px, even on a phone.
SMALLEST_TEXT_PT = 7


def _text_below(fig, smallest: float) -> list[tuple[str, float]]:
    """Every visible, non-empty text of a drawn figure smaller than `smallest` points."""
    fig.canvas.draw()  # tick labels exist once the figure is drawn
    return [(t.get_text(), t.get_fontsize()) for t in fig.findobj(matplotlib.text.Text)
            if t.get_visible() and t.get_text().strip() and t.get_fontsize() < smallest]


@pytest.fixture(autouse=True)
def _close_figures():
    """After each test, every figure it drew has no text below SMALLEST_TEXT_PT; then close."""
    yield
    try:
        small = {n: _text_below(plt.figure(n), SMALLEST_TEXT_PT) for n in plt.get_fignums()}
        small = {n: texts for n, texts in small.items() if texts}
        assert not small, f"text below {SMALLEST_TEXT_PT} pt (figure: [(text, size)]): {small}"
    finally:
        plt.close("all")


def test_small_text_is_found():
    """The check above can fail: a 6.5 pt label is reported, a 7 pt one is not."""
    fig, ax = plt.subplots()
    ax.text(0.5, 0.5, "small", fontsize=6.5)
    ax.set_title("big enough", fontsize=7)
    assert _text_below(fig, SMALLEST_TEXT_PT) == [("small", 6.5)]
    plt.close(fig)


# --- mutation-test gaps (shared/reviews/mutation.md): numbering, layout, a refusal -----------

@pytest.mark.parametrize("shapes", [[(3, 5), (3, 5)], [(2, 4), (4, 1), (2, 1)], [(1, 7)]])
def test_matrix_panels_number_columns_and_rows_from_1(shapes):
    """The book counts from 1: every panel's columns are 1 .. cols, its rows 1 .. rows
    by default (plots.part1-601)."""
    matrices = [np.arange(r * c, dtype=float).reshape(r, c) for r, c in shapes]
    fig = plots.matrix_panels(matrices, [f"M{k}" for k in range(len(shapes))])
    assert len(fig.axes) == len(shapes)
    for ax, (r, c) in zip(fig.axes, shapes):
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(j) for j in range(1, c + 1)]
        assert [t.get_text() for t in ax.get_yticklabels()] == [str(i) for i in range(1, r + 1)]
        assert list(ax.get_xticks()) == list(range(c))  # label j + 1 on column j


class _SvgParts(HTMLParser):
    def __init__(self, html):
        super().__init__()
        self.svgs, self.texts, self._text = [], [], None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "svg":
            self.svgs.append({"viewBox": attrs["viewbox"], "cells": [], "texts": []})
        elif tag == "rect" and "data-i" in attrs:
            self.svgs[-1]["cells"].append(attrs)
        elif tag == "text":
            self._text = attrs

    def handle_data(self, data):
        if self._text is not None:
            self.svgs[-1]["texts"].append((data, self._text))
            self._text = None


@pytest.mark.parametrize("h, n, m", [(1, 3, 3), (2, 3, 3), (2, 2, 5)])
def test_interactive_heatmaps_put_the_key_label_below_the_grid_inside_the_picture(h, n, m):
    """The "key" axis label sits under the last row of cells and inside the SVG's viewBox
    (plots.part1-625); the token labels of the keys sit between the grid and it."""
    S = np.full((h, n, m), 1.0 / m)
    svgs = _SvgParts(plots.interactive_heatmaps(S, causal=False).html).svgs
    assert len(svgs) == h
    for svg in svgs:
        _, _, width, height = (float(v) for v in svg["viewBox"].split())
        cells = svg["cells"]
        assert len(cells) == n * m
        bottom = max(float(c["y"]) + float(c["height"]) for c in cells)
        right = max(float(c["x"]) + float(c["width"]) for c in cells)
        assert bottom < height and right < width
        texts = {text: attrs for text, attrs in svg["texts"]}
        key = texts["key (the token attended to)"]
        assert bottom < float(key["y"]) <= height
        left = min(float(c["x"]) for c in cells)
        assert left < float(key["x"]) < right  # centred under the grid
        column_ys = [float(a["y"]) for t, a in svg["texts"]
                     if t.startswith("token ") and a["text-anchor"] == "middle"]
        assert len(column_ys) == m and all(bottom < y < float(key["y"]) for y in column_ys)


@pytest.mark.parametrize("h, n, m", [(1, 3, 3), (1, 2, 7), (2, 2, 5), (3, 1, 4)])
def test_interactive_heatmaps_default_figure_has_an_inch_per_key(monkeypatch, h, n, m):
    """For one head, or n < m, the PNG's figure is h attention_heatmap panels side by side:
    1 inch for each of the m keys of every panel, plus 1.8 (plots.part1-745)."""
    closed = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
    S = np.full((h, n, m), 1.0 / m)
    plots.interactive_heatmaps(S, causal=False)
    figs = [f for f in closed if isinstance(f, plt.Figure)]
    assert len(figs) == 1 and len(figs[0].axes) == h
    width, height = figs[0].get_size_inches()
    assert width == pytest.approx(1.0 * m * h + 1.8) and height == pytest.approx(0.9 * n + 1.5)


@pytest.mark.parametrize("O, E, X", [
    (np.ones(3), np.ones((3, 2)), np.ones((1, 2))),
    (np.eye(3), np.ones(3), np.ones((3, 3))),
    (np.eye(3), np.ones((3, 2)), np.ones((1, 3, 2))),
    (np.ones((1, 3, 3)), np.ones((3, 2)), np.ones((3, 2))),
])
def test_one_hot_product_refuses_non_matrices(O, E, X):
    """Each of O, E, X must be 2-D; the refusal names the three shapes (plots.part2-0)."""
    shapes = ", ".join(str(np.shape(a)) for a in (O, E, X))
    with pytest.raises(ValueError, match=re.escape(f"O, E, X must be matrices, got shapes {shapes}")):
        plots.one_hot_product(O, E, X)


# --- Part V, chapter 22: what each rank holds -------------------------------------------------

def _split_steps(p, heads=None):
    """The steps of chapter 22's figure for the running example on p ranks."""
    heads = p if heads is None else heads
    share = heads // p
    return [("", [("$X$", (3, 5))] * p),
            ("", [(f"$W_Q^{{({r})}}$", (5, 7 * share)) for r in range(p)]),
            ("→", [(f"$H^{{({r})}}$", (3, 11 * share)) for r in range(p)]),
            ("×", [(f"$W_O^{{({r})}}$", (11 * share, 5)) for r in range(p)])]


@pytest.mark.parametrize("p", [1, 2, 3])
def test_head_split_ranks_draws_one_cell_per_entry_in_every_lane(p):
    fig = plots.head_split_ranks(_split_steps(p), ("$Y$", (3, 5)), after="+ $b_O$")
    gids = [r.get_gid() for r in fig.axes[0].patches]
    own = 35 + 33 + 55  # W_Q^(r), H^(r), W_O^(r): each rank's own arrays
    if p == 1:  # one rank holds everything whole
        assert gids.count("whole") == 15 + own and gids.count("share") == 0
    else:
        assert gids.count("whole") == p * 15  # X, the same on every rank
        assert gids.count("share") == p * own
    assert gids.count("total") == p * 15  # Y on every rank, after the sum
    assert gids.count("allreduce") == 1
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("3 × 5") == 2 * p and texts.count("+ $b_O$") == p
    assert [t for t in texts if t.startswith("rank ")] == [f"rank {r}" for r in range(p)]


def test_head_split_ranks_refuses_uneven_steps_and_bad_shapes():
    steps = _split_steps(2)
    steps[1] = ("", steps[1][1][:1])  # one array for two ranks
    with pytest.raises(ValueError, match=r"one array per rank.*\[2, 1, 2, 2\]"):
        plots.head_split_ranks(steps, ("$Y$", (3, 5)))
    with pytest.raises(ValueError, match="step 0, rank 1: a shape is"):
        plots.head_split_ranks([("", [("$X$", (3, 5)), ("$X$", 3)])], ("$Y$", (3, 5)))
    with pytest.raises(ValueError, match="total: 3 x 50 cannot be drawn"):
        plots.head_split_ranks(_split_steps(1), ("$Y$", (3, 50)))
    with pytest.raises(ValueError, match="3 lane names for 2 ranks"):
        plots.head_split_ranks(_split_steps(2), ("$Y$", (3, 5)), lanes=["a", "b", "c"])


# --- Part V, chapter 23: ring attention --------------------------------------------------


@pytest.mark.parametrize("n, p", [(1024, 4), (10, 3), (7, 1), (16, 2)])
def test_ring_work_grid_draws_the_counts_and_each_steps_busiest_rank(n, p):
    from mha_lit import parallel

    works = {layout: parallel.ring_work(n, p, layout) for layout in parallel.LAYOUTS}
    fig = plots.ring_work_grid(works)
    assert len(fig.axes) == 2
    for ax, (layout, w) in zip(fig.axes, works.items()):
        drawn = np.asarray(ax.images[0].get_array())
        assert np.array_equal(drawn, np.vstack([w, w.max(axis=0)]))  # ranks, then busiest
        texts = _texts(ax)
        assert sorted(texts) == sorted(f"{v:,d}" for v in drawn.ravel())
        assert ax.get_title() == f"{layout}: sum of busiest = {w.max(axis=0).sum():,}"
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels == [f"rank {r}" for r in range(p)] + ["busiest"]


def test_ring_work_grid_refuses_counts_of_other_shapes():
    with pytest.raises(ValueError, match=r"\(p, p\) array.*\(2, 3\)"):
        plots.ring_work_grid({"a": np.zeros((2, 2), int), "b": np.zeros((2, 3), int)})
    with pytest.raises(ValueError, match="integers >= 0"):
        plots.ring_work_grid({"a": -np.ones((2, 2), int)})
    with pytest.raises(ValueError, match="at least one layout"):
        plots.ring_work_grid({})


@pytest.mark.parametrize("n, p", [(16, 4), (10, 4), (5, 2), (3, 1)])
def test_ring_steps_names_the_held_block_hatches_skipped_cells_and_draws_the_sends(n, p):
    from mha_lit import parallel

    layouts = {layout: parallel.sequence_blocks(n, p, layout) for layout in parallel.LAYOUTS}
    fig = plots.ring_steps(layouts)
    assert len(fig.axes) == 2
    for ax, blocks in zip(fig.axes, layouts.values()):
        arrows = [t for t in ax.texts if isinstance(t, matplotlib.text.Annotation)]
        held = [t.get_text() for t in ax.texts if t not in arrows]
        assert len(held) == p * p
        cells = [q for q in ax.patches if q.get_gid() in ("held", "skipped")]
        assert len(cells) == p * p
        for text, cell in zip(held, cells):  # drawn rank by rank, step by step
            r, j = round(cell.get_y() + 0.4), round(cell.get_x() + 0.45)  # rank, step
            src = (r - j) % p  # r', whose block rank r holds at step j
            assert text.startswith(f"K, V of rank {src}\n")
            skipped = blocks[src].min() > blocks[r].max()  # every key after every query
            assert (cell.get_gid() == "skipped") == skipped
            assert text.endswith("(nothing to compute)") == skipped
        sends = [t for t in arrows if t.get_gid() == "send"]
        assert len(sends) == (p - 1) * p  # p - 1 passes of p blocks
        assert len(arrows) == len(sends) + (p - 1)  # and p - 1 arrive at rank 0
    first = [t.get_text() for t in fig.axes[1].get_yticklabels()][0]
    assert first.startswith("rank 0\nqueries 0")


def test_ring_steps_refuses_layouts_of_different_rank_counts():
    with pytest.raises(ValueError, match="same number of ranks"):
        plots.ring_steps({"a": [np.arange(2)], "b": [np.arange(1), np.arange(1, 2)]})
    with pytest.raises(ValueError, match="same number of ranks"):
        plots.ring_steps({"a": [np.arange(2), np.arange(0)]})


# --- Part V, chapter 24: the cost of talking ---------------------------------------------------

def test_comm_compute_ratio_one_colour_per_model_one_style_per_link():
    x = np.array([2.0, 4.0, 8.0])
    panels = [("left", "ranks", {"A, fast": (x, x / 10), "A, slow": (x, x),
                                 "B, fast": (x, x / 20)}),
              ("right", "rows", {"B, slow": (x, 1 / x), "A, fast": (x, 2 / x)})]
    fig = plots.comm_compute_ratio(panels)
    assert len(fig.axes) == 2
    lines = {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines()}
    assert {g for g in lines if g != "break-even"} == {
        "left:A, fast", "left:A, slow", "left:B, fast", "right:B, slow", "right:A, fast"}
    assert [ln.get_gid() for ax in fig.axes for ln in ax.get_lines()].count("break-even") == 2
    colour = {g: lines[g].get_color() for g in lines if g != "break-even"}
    assert colour["left:A, fast"] == colour["left:A, slow"] == colour["right:A, fast"]
    assert colour["left:B, fast"] == colour["right:B, slow"] != colour["left:A, fast"]
    style = {g: lines[g].get_linestyle() for g in colour}
    assert style["left:A, fast"] == style["left:B, fast"] == style["right:A, fast"] == "-"
    assert style["left:A, slow"] == style["right:B, slow"] == "--"
    assert np.allclose(lines["left:A, slow"].get_ydata(), x)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "A, fast", "A, slow", "B, fast", "B, slow"]  # each label once
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in fig.axes)


def test_comm_compute_ratio_refuses_bad_curves():
    x = np.array([1.0, 2.0])
    with pytest.raises(ValueError, match="'<model>, <link>'"):
        plots.comm_compute_ratio([("t", "x", {"no link": (x, x)})])
    with pytest.raises(ValueError, match="<= 0"):
        plots.comm_compute_ratio([("t", "x", {"A, b": (x, [1.0, 0.0])})])
    with pytest.raises(ValueError, match="shapes"):
        plots.comm_compute_ratio([("t", "x", {"A, b": (x, [1.0])})])
    with pytest.raises(ValueError, match="at least one"):
        plots.comm_compute_ratio([])


def test_alpha_beta_fit_draws_measured_points_and_model_lines_in_one_colour():
    from mha_lit import parallel

    sizes = np.array([4.0, 64.0, 1024.0, 2.0**20])
    times = parallel.alpha_beta_time(sizes, 3e-6, 5e9)
    fig = plots.alpha_beta_fit({"ping": (sizes, times * 1.1), "ar": (sizes, times * 3)},
                               {"ping": (sizes, times),
                                "ar": (sizes, parallel.all_reduce_time(sizes, 2, 3e-6, 5e9))})
    ax = fig.axes[0]
    lines = {ln.get_gid(): ln for ax in fig.axes for ln in ax.get_lines()}
    assert set(lines) == {"measured:ping", "predicted:ping", "measured:ar", "predicted:ar"}
    assert lines["measured:ping"].get_linestyle() == "None"  # dots, no line
    assert lines["measured:ping"].get_marker() == "o"
    assert lines["measured:ping"].get_color() == lines["predicted:ping"].get_color()
    assert lines["measured:ar"].get_color() != lines["measured:ping"].get_color()
    assert np.allclose(lines["predicted:ping"].get_ydata(), times)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="<= 0"):
        plots.alpha_beta_fit({"a": (sizes, -times)}, {})
    with pytest.raises(ValueError, match="at least one"):
        plots.alpha_beta_fit({}, {})
