"""mha_lit.train: the data, Adam, the training of chapter 21 and what it learned."""

import math

import numpy as np
import pytest

from mha_lit import (
    Decoder,
    attention_weights,
    gpt_block,
    gpt_forward,
    init_gpt_weights,
    layer_norm,
    masks,
    multi_head_attention,
    train,
)
from mha_lit.grad import gpt_loss, loss_and_grads
from mha_lit.shapes import Dims

# --- the data ----------------------------------------------------------------------------


@pytest.mark.parametrize("batch, vocab, half", [(1, 2, 1), (7, 16, 8), (13, 5, 11), (3, 97, 2)])
def test_repeat_sequences_are_a_random_half_then_the_same_half(batch, vocab, half):
    seq = train.repeat_sequences(np.random.default_rng(batch + half), batch, vocab, half)
    assert seq.shape == (batch, 2 * half) and seq.dtype == np.int64
    assert seq.min() >= 0 and seq.max() < vocab
    assert np.array_equal(seq[:, half:], seq[:, :half])


def test_repeat_sequences_draw_every_token_uniformly_with_replacement():
    seq = train.repeat_sequences(np.random.default_rng(0), 4000, 16, 8)
    counts = np.bincount(seq[:, :8].ravel(), minlength=16)  # 32,000 draws
    expected = seq[:, :8].size / 16
    assert np.abs(counts - expected).max() < 5 * math.sqrt(expected)  # 5 standard deviations
    # with replacement: a half of 8 tokens from 16 repeats one with probability
    # 1 - 16!/(8! 16^8) = 0.88
    repeats = np.mean([len(set(row)) < 8 for row in seq[:, :8]])
    assert abs(repeats - (1 - math.perm(16, 8) / 16**8)) < 0.02


@pytest.mark.parametrize("periods, length", [([1, 2, 3], 7), ([5, 4], 10), ([11], 11), ([2, 7, 3, 13], 29)])
def test_periodic_sequences_repeat_their_first_k_tokens(periods, length):
    seq = train.periodic_sequences(np.random.default_rng(1), np.array(periods), 19, length)
    assert seq.shape == (len(periods), length)
    for row, k in zip(seq, periods, strict=True):
        assert np.array_equal(row, np.resize(row[:k], length))


def test_the_same_seed_draws_the_same_sequences():
    a = train.repeat_sequences(np.random.default_rng(5), 3, 16, 8)
    b = train.repeat_sequences(np.random.default_rng(5), 3, 16, 8)
    assert np.array_equal(a, b)


def test_data_refusals_name_the_argument():
    rng = np.random.default_rng(0)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        train.repeat_sequences(0, 3, 16, 8)
    for args, name in (((0, 16, 8), "batch"), ((3, 0, 8), "vocab_size"),
                       ((3, 16, 0), "half_length")):
        with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
            train.repeat_sequences(rng, *args)
    with pytest.raises(TypeError, match="half_length must be a positive integer"):
        train.repeat_sequences(rng, 3, 16, 2.5)
    with pytest.raises(ValueError, match="periods must be a 1-D array of integers >= 1"):
        train.periodic_sequences(rng, np.array([3, 0]), 16, 8)
    with pytest.raises(ValueError, match="periods must be a 1-D array"):
        train.periodic_sequences(rng, np.array([[3]]), 16, 8)


@pytest.mark.parametrize("k, length", [(4, 15), (8, 15), (2, 5), (13, 29)])
def test_counted_positions_are_those_whose_current_token_copies_one_a_period_back(k, length):
    counted = train.counted_positions(np.array([k]), length)[0]
    assert counted.tolist() == [t >= k for t in range(length)]
    seq = train.periodic_sequences(np.random.default_rng(k), np.array([k]), 1000, length + 1)[0]
    assert all(seq[t] == seq[t - k] and seq[t + 1] == seq[t + 1 - k]
               for t in range(length) if counted[t])
    assert len(set(seq[:k])) == k  # 1000 ids: no chance repeats within a period here
    for t in range(length):  # counted: the current token occurred before, followed by the target
        earlier = [u for u in range(t) if seq[u] == seq[t]]
        assert counted[t] == bool(earlier)
        if counted[t]:
            assert seq[earlier[-1] + 1] == seq[t + 1]
    assert counted.sum() == max(length - k, 0)


def test_counted_loss_is_the_mean_over_the_counted_positions_only():
    G = init_gpt_weights(layers=2, vocab_size=13, context_length=11)
    rng = np.random.default_rng(4)
    tokens, targets = rng.integers(0, 13, (2, 2, 11))
    counted = train.counted_positions(np.array([3, 7]), 11)  # (2, 11)
    loss, dG = loss_and_grads(G, tokens, targets, counted)
    assert abs(loss - gpt_loss(G, tokens, targets, counted)) < 1e-12
    assert counted.sum(axis=1).tolist() == [8, 4]
    # the mean of the per-position losses over the 12 counted positions
    per_position = [gpt_loss(G, tokens[b], targets[b], np.arange(11) == p)
                    for b in range(2) for p in range(11) if counted[b, p]]
    assert abs(loss - np.mean(per_position)) < 1e-12
    # targets at uncounted positions do not matter
    other = np.where(counted, targets, (targets + 5) % 13)
    loss_other, dG_other = loss_and_grads(G, tokens, other, counted)
    assert abs(loss_other - loss) < 1e-12
    for name, a in train.parameters(dG_other).items():
        assert np.allclose(a, train.parameters(dG)[name], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="counted must be booleans of the tokens' shape"):
        loss_and_grads(G, tokens, targets, counted.astype(int))
    with pytest.raises(ValueError, match="at least one position"):
        loss_and_grads(G, tokens, targets, np.zeros((2, 11), bool))


# --- Adam --------------------------------------------------------------------------------


def _small_gpt(seed=0, layers=2):
    dims = Dims(d_model=5, d_k=3, d_v=2, heads=2)
    return init_gpt_weights(dims, layers=layers, vocab_size=7, context_length=5, d_ff=3, seed=seed)


def test_parameters_round_trip_and_name_every_array():
    G = _small_gpt()
    arrays = train.parameters(G)
    assert list(arrays)[:4] == ["E", "P", "gamma_f", "beta_f"]
    assert "1 W_Q" in arrays and "2 b_2" in arrays and len(arrays) == 4 + 2 * 16
    again = train.with_parameters(G, arrays)
    for name, a in train.parameters(again).items():
        assert np.array_equal(a, arrays[name])
    with pytest.raises(ValueError, match=r"missing \['E'\]"):
        train.with_parameters(G, {k: a for k, a in arrays.items() if k != "E"})


def _quadratic_gradient(G, T):
    """dG of 0.5 * sum (G - T)^2 over every array: G - T."""
    target = train.parameters(T)
    return train.with_parameters(G, {k: a - target[k] for k, a in train.parameters(G).items()})


def test_adam_first_step_moves_every_entry_by_lr_against_its_gradient_sign():
    G, T = _small_gpt(0), _small_gpt(1)
    dG = _quadratic_gradient(G, T)
    lr = 0.01
    G1, state = train.adam_step(G, dG, train.adam_start(G), lr)
    assert state.steps == 1
    for name, a in train.parameters(G).items():
        g = train.parameters(dG)[name]
        # m_hat = g and v_hat = g^2 after one step: the step is lr g / (|g| + eps)
        expected = a - lr * g / (np.abs(g) + 1e-8)
        assert np.allclose(train.parameters(G1)[name], expected, rtol=0, atol=1e-15)


def test_adam_reaches_the_minimum_of_a_quadratic():
    G, T = _small_gpt(0), _small_gpt(1)
    state = train.adam_start(G)
    for step in range(1, 1501):
        lr = 0.05 * (1 + math.cos(math.pi * (step - 1) / 1500)) / 2
        G, state = train.adam_step(G, _quadratic_gradient(G, T), state, lr, beta_v=0.99)
    gap = max(np.abs(a - train.parameters(T)[k]).max() for k, a in train.parameters(G).items())
    assert gap < 1e-3


def test_adam_matches_the_papers_algorithm_written_out_for_one_entry():
    G, T = _small_gpt(0), _small_gpt(1)
    x, x_star = G.E[2, 3], T.E[2, 3]
    m = v = 0.0
    state = train.adam_start(G)
    for s in range(1, 6):
        g = x - x_star
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        x = x - 0.1 * (m / (1 - 0.9**s)) / (math.sqrt(v / (1 - 0.999**s)) + 1e-8)
        G, state = train.adam_step(G, _quadratic_gradient(G, T), state, 0.1)
        assert abs(G.E[2, 3] - x) < 1e-12


def test_adam_refusals():
    G = _small_gpt()
    other = _small_gpt(layers=1)
    state = train.adam_start(G)
    with pytest.raises(ValueError, match=r"2 W_Q is \(2, 5, 3\) in G, but None in dG"):
        train.adam_step(G, other, state)
    with pytest.raises(ValueError, match="Adam needs lr > 0"):
        train.adam_step(G, G, state, lr=-1.0)
    with pytest.raises(ValueError, match="beta_v=1.0"):
        train.adam_step(G, G, state, beta_v=1.0)
    with pytest.raises(TypeError, match="state must be an AdamState"):
        train.adam_step(G, G, {})


# --- training ----------------------------------------------------------------------------


def test_learning_rate_falls_on_a_cosine_from_its_start():
    rates = [train.learning_rate(s, 100) for s in range(1, 101)]
    assert rates[0] == train.LEARNING_RATE and all(np.diff(rates) < 0) and rates[-1] > 0


def test_training_is_deterministic_for_a_seed_and_reports_each_step():
    seen = []
    G_a = train.train_repeat(7, 3, 1, steps=5, seed=3, callback=lambda *a: seen.append(a))
    G_b = train.train_repeat(7, 3, 1, steps=5, seed=3)
    G_c = train.train_repeat(7, 3, 1, steps=5, seed=4)
    for name, a in train.parameters(G_a).items():  # the same code on the same machine
        assert np.array_equal(a, train.parameters(G_b)[name])
    assert not np.array_equal(G_a.E, G_c.E)
    assert [(s, n) for s, n, _ in seen] == [(s, 5) for s in range(1, 6)]
    assert all(loss > 0 for _, _, loss in seen)
    assert G_a.context_length == 5 and G_a.vocab_size == 7 and G_a.layers == 1


def test_training_refusals_name_the_argument():
    for kwargs, error, match in (
            (dict(vocab_size=1), ValueError, "vocab_size >= 2"),
            (dict(half_length=1), ValueError, "half_length >= 2"),
            (dict(n_layers=0), ValueError, "n_layers must be a positive integer"),
            (dict(steps=0), ValueError, "steps must be a positive integer"),
            (dict(seed=-1), ValueError, "seed must be an integer >= 0"),
            (dict(seed=1.5), ValueError, "seed must be an integer >= 0")):
        args = dict(vocab_size=16, half_length=8, n_layers=2) | kwargs
        with pytest.raises(error, match=match):
            train.train_repeat(**args)


def test_default_training_continues_fresh_sequences():
    """The book's promise: with vocabulary 16, half length 8 and 2 layers, >= 95 %."""
    G = train.train_repeat(16, 8, 2)
    assert G.layers == 2 and G.vocab_size == 16 and G.context_length == 15
    accuracy = train.repeat_accuracy(G, 8)
    assert accuracy >= 0.95, accuracy
    # usable with the Decoder: fed a fresh sequence token by token, its greedy
    # guesses are gpt_forward's (to rounding: a near-tie may go either way)
    seq = train.repeat_sequences(np.random.default_rng([0, 23]), 20, 16, 8)
    same = []
    for row in seq:
        decoder = Decoder(G)
        decoder.prefill(row[:9])
        expected = gpt_forward(row[:-1], G).argmax(axis=1)  # (15,)
        for p in range(8, 15):
            same.append(int(decoder.logits.argmax()) == expected[p])
            if p < 14:
                decoder.decode_step(int(row[p + 1]))
    assert np.mean(same) >= 0.98
    # and it continues a sequence of 8 different words on its own
    row = next(r for r in seq if len(set(r[:8])) == 8)
    assert np.array_equal(Decoder(G).generate(row[:9], steps=6), row[9:15])


# --- what the model learned --------------------------------------------------------------


def test_attention_maps_are_the_weights_each_block_uses():
    G = init_gpt_weights(Dims(d_model=5, d_k=7, d_v=11, heads=2), layers=3, vocab_size=13,
                         context_length=19)
    tokens = np.random.default_rng(2).integers(0, 13, 9)
    maps = train.attention_maps(G, tokens)
    assert maps.shape == (3, 2, 9, 9)
    assert np.allclose(maps.sum(axis=-1), 1, rtol=0, atol=1e-12)
    assert np.all(maps[..., ~masks.causal(9)] == 0)
    X = G.E[tokens] + G.P[:9]
    for layer, block in enumerate(G.blocks):
        W = block.attn
        a = layer_norm(X, block.gamma_1, block.beta_1)
        V = a @ W.W_V + W.bias("b_V")[:, None, :]  # (h, n, d_v)
        H = maps[layer] @ V  # the heads' outputs from the maps
        Y = np.concatenate(list(H), axis=1) @ W.W_O + W.bias("b_O")
        assert np.allclose(Y, multi_head_attention(a, W), rtol=0, atol=1e-12)
        Q = a @ W.W_Q[0] + W.b_Q[0]
        K = a @ W.W_K[0] + W.b_K[0]
        assert np.allclose(maps[layer, 0], attention_weights(Q, K, masks.causal(9)),
                           rtol=0, atol=1e-12)
        X = gpt_block(X, block)
    with pytest.raises(ValueError, match="a sequence of 20 tokens does not fit"):
        train.attention_maps(G, np.zeros(20, int))
    with pytest.raises(ValueError, match="tokens must lie in 0 .. 12"):
        train.attention_maps(G, np.array([3, 13]))


def test_greedy_predictions_and_accuracy_follow_gpt_forward():
    G = _small_gpt()
    tokens = np.random.default_rng(3).integers(0, 7, (4, 5))
    guesses = train.greedy_predictions(G, tokens)
    assert np.array_equal(guesses, np.stack([gpt_forward(t, G).argmax(axis=1) for t in tokens]))
    G_long = init_gpt_weights(layers=1, vocab_size=7, context_length=9)
    accuracy = train.repeat_accuracy(G_long, 5, sequences=50)
    seq = train.repeat_sequences(np.random.default_rng([1, 22]), 50, 7, 5)
    guess = train.greedy_predictions(G_long, seq[:, :-1])
    assert accuracy == np.mean(guess[:, 5:] == seq[:, 6:])
    with pytest.raises(ValueError, match="half_length >= 2"):
        train.repeat_accuracy(G_long, 1)


# --- the chapter's figures ---------------------------------------------------------------

SMALLEST_TEXT_PT = 7  # as tests/test_plots.py: no figure text below 7 pt


def _small_texts(fig):
    import matplotlib.text

    fig.canvas.draw()
    return [(t.get_text(), t.get_fontsize()) for t in fig.findobj(matplotlib.text.Text)
            if t.get_visible() and t.get_text().strip() and t.get_fontsize() < SMALLEST_TEXT_PT]


def test_training_loss_draws_each_step_the_running_mean_and_the_uniform_guess():
    import matplotlib.pyplot as plt

    from mha_lit import plots

    losses = np.exp(-np.linspace(0, 5, 120)) * 3 + 0.01
    fig = plots.training_loss(losses, 16, window=10)
    ax = fig.axes[0]
    lines = {line.get_gid(): line for line in ax.get_lines()}
    assert np.array_equal(lines["step"].get_ydata(), losses)
    assert np.allclose(lines["mean"].get_ydata(), np.convolve(losses, np.ones(10) / 10, "valid"))
    assert lines["mean"].get_xdata()[0] == 10  # the first full window ends at step 10
    assert np.allclose(lines["guess"].get_ydata(), math.log(16))
    assert ax.get_yscale() == "log" and "ln 16 = 2.77" in [t.get_text() for t in ax.get_legend().get_texts()][2]
    assert _small_texts(fig) == []
    plt.close(fig)
    with pytest.raises(ValueError, match="at least window = 50"):
        plots.training_loss(losses[:20], 16)
    with pytest.raises(ValueError, match="finite and positive"):
        plots.training_loss(np.r_[losses, 0.0], 16, window=10)


def test_learned_attention_draws_each_panel_with_its_marks_and_the_mask():
    import matplotlib.pyplot as plt

    from mha_lit import plots

    rng = np.random.default_rng(6)
    S = np.tril(rng.random((2, 7, 7)))
    S /= S.sum(axis=-1, keepdims=True)
    t, u = np.indices((7, 7))
    marks = np.stack([u == t - 1, (t >= 4) & (u == t - 3)])
    fig = plots.learned_attention(S, [3, 1, 4, 1, 5, 9, 2], marks, ["first", "second"])
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["first", "second"]
    for ax, M, mark in zip(panels, S, marks, strict=True):
        assert np.allclose(ax.images[0].get_array(), M)
        gids = [p.get_gid() for p in ax.patches]
        assert gids.count("masked") == 21 and gids.count("mark") == mark.sum()
        outlined = {(round(p.get_y() + 0.5), round(p.get_x() + 0.5)) for p in ax.patches
                    if p.get_gid() == "mark"}
        assert outlined == set(zip(*np.nonzero(mark), strict=True))
        assert [x.get_text() for x in ax.get_yticklabels()][:2] == ["0: 3", "1: 1"]
    assert _small_texts(fig) == []
    plt.close(fig)
    with pytest.raises(ValueError, match="need 7 tokens and 2 titles"):
        plots.learned_attention(S, [1, 2], marks, ["a", "b"])
    with pytest.raises(ValueError, match=r"maps must be \(panels, n, n\)"):
        plots.learned_attention(S[0], [1] * 7, marks[0], ["a"])
