"""The figure of chapter 19, "The backward pass of attention": plots.softmax_backward_panels."""

import numpy as np
import pytest
from matplotlib import pyplot as plt

from mha_lit import attention_weights, masks, plots
from tests.test_plots import SMALLEST_TEXT_PT, _text_below


def _softmax_backward(n, seed):
    """dS, S, dZ of one causal head: random scores and a random dS."""
    rng = np.random.default_rng(seed)
    Q, K = rng.standard_normal((2, n, 3))
    S = attention_weights(Q, K, masks.causal(n))  # (n, n)
    dS = rng.standard_normal((n, n))
    dZ = S * (dS - (dS * S).sum(axis=1, keepdims=True))
    return dS, S, dZ


@pytest.mark.parametrize("n", [1, 3, 5])
def test_three_panels_draw_the_matrices_and_hatch_exactly_the_masked_zeros(n):
    dS, S, dZ = _softmax_backward(n, seed=n)
    fig = plots.softmax_backward_panels(dS, S, dZ)
    assert len(fig.axes) == 3
    above = np.triu(np.ones((n, n), bool), k=1)
    for ax, M, hatched in zip(fig.axes, (dS, S, dZ), (False, True, True)):
        drawn = np.asarray(ax.images[0].get_array(), dtype=float)
        mask = above if hatched else np.zeros_like(above)
        assert np.array_equal(np.isnan(drawn), mask)
        assert np.array_equal(drawn[~mask], M[~mask])
        zeros = [p for p in ax.patches if p.get_gid() == "zero"]
        assert len(zeros) == mask.sum()
        cells = {(round(p.get_y() + 0.5), round(p.get_x() + 0.5)) for p in zeros}
        assert cells == set(zip(*np.nonzero(mask)))
    # row 1 of dZ is exactly 0 (weight 1 on one key) and written "0", unhatched
    first = [t for t in fig.axes[2].texts if t.get_position() == (0, 0)]
    assert [t.get_text() for t in first] == ["0"]
    assert not _text_below(fig, SMALLEST_TEXT_PT)
    plt.close(fig)


def test_labels_name_the_tokens_and_the_panels():
    dS, S, dZ = _softmax_backward(3, seed=0)
    fig = plots.softmax_backward_panels(dS, S, dZ, tokens=["the", "cat", "sat"])
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["the", "cat", "sat"]
    titles = [ax.get_title() for ax in fig.axes]
    assert "every entry" in titles[0] and "0 above the diagonal" in titles[1]
    assert "0 where $S$ is 0" in titles[2]
    plt.close(fig)


@pytest.mark.parametrize("change, message", [
    (lambda dS, S, dZ: (dS[:2], S, dZ), r"one shape, got \(2, 3\), \(3, 3\) and \(3, 3\)"),
    (lambda dS, S, dZ: (dS, S + np.triu(np.ones((3, 3)), 1), dZ),
     r"S \(3 x 3\) has a non-zero entry above the diagonal"),
    (lambda dS, S, dZ: (dS, S, dZ + 1.0), r"dZ \(3 x 3\) has a non-zero entry above"),
])
def test_refuses_matrices_that_do_not_fit_naming_the_shapes(change, message):
    with pytest.raises(ValueError, match=message):
        plots.softmax_backward_panels(*change(*_softmax_backward(3, seed=1)))


def test_refuses_a_wrong_number_of_token_labels():
    with pytest.raises(ValueError, match="3 x 3 matrices need 3 token labels, got 2"):
        plots.softmax_backward_panels(*_softmax_backward(3, seed=2), tokens=["a", "b"])
