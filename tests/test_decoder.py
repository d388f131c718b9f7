"""The small GPT that generates: caches per layer give what recomputing everything gives."""

import numpy as np
import pytest

from mha_lit import Dims
from mha_lit.decoder import Decoder, GPTWeights, gpt_forward, init_gpt_weights

G = init_gpt_weights(Dims(), n_layers=3, seed=1)  # book sizes: d_model 5, vocab 13, ctx 19


def _greedy_by_recomputing(prompt, steps, G=G):
    tokens, logits = list(prompt), []
    for _ in range(steps):
        row = gpt_forward(np.array(tokens), G)[-1]  # (V,): every row recomputed
        logits.append(row)
        tokens.append(int(row.argmax()))
    return np.array(tokens[len(prompt):]), np.array(logits)


@pytest.mark.parametrize("prompt", [[3], [0, 12, 5], [7, 7, 7, 1, 2, 9, 4]])
def test_cached_decoding_equals_recomputing_token_for_token(prompt):
    steps = G.context_length - len(prompt)
    expected, expected_logits = _greedy_by_recomputing(prompt, steps)
    dec = Decoder(G, capacity=2)
    logits = [dec.prefill(np.array(prompt))]
    tokens = []
    for _ in range(steps):
        tokens.append(dec.decode_step())
        logits.append(dec.logits)
    assert tokens == expected.tolist()
    assert np.allclose(np.array(logits[:-1]), expected_logits, rtol=0, atol=1e-10)
    # every position's logits separate clearly, so the greedy choice is not a near tie
    top2 = np.sort(expected_logits, axis=1)[:, -2:]
    assert np.all(top2[:, 1] - top2[:, 0] > 1e-6)
    with pytest.raises(ValueError, match="context of 19 positions is full"):
        dec.decode_step()


def test_generate_and_a_prompt_fed_in_two_parts():
    prompt = np.array([4, 8, 1, 11])
    expected, _ = _greedy_by_recomputing(prompt, 6)
    assert Decoder(G).generate(prompt, 6).tolist() == expected.tolist()
    dec = Decoder(G)
    dec.prefill(prompt[:1])
    dec.prefill(prompt[1:])  # the cache continues the same sequence
    assert [dec.decode_step() for _ in range(6)] == expected.tolist()
    assert Decoder(G).generate(prompt, 0).shape == (0,)


def test_batched_decoding_with_prompts_of_different_lengths():
    prompts = [[1, 2, 3, 4, 5], [6], [7, 8, 9], [12, 0]]
    m = max(map(len, prompts))
    tokens = np.zeros((4, m), dtype=np.int64)
    mask = np.zeros((4, m), dtype=bool)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)] = p
        mask[b, :len(p)] = True
    steps = 8
    out = Decoder(G, batch=4).generate(tokens, steps, key_mask=mask)
    assert out.shape == (4, steps)
    for b, p in enumerate(prompts):
        assert out[b].tolist() == _greedy_by_recomputing(p, steps)[0].tolist()


def test_float32_stack_decodes_like_float64():
    G32 = init_gpt_weights(Dims(d_model=12, d_k=4, d_v=4, heads=3), n_layers=2, vocab_size=29,
                           context_length=40, d_ff=48, seed=5, dtype=np.float32)
    dec = Decoder(G32)
    logits = dec.prefill(np.arange(10) % 29)
    assert logits.dtype == np.float32
    full = gpt_forward(np.arange(10) % 29, G32)[-1]
    assert np.allclose(logits, full, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda d: d.prefill(np.array([1, 13])), ValueError, r"token ids must lie in 0 \.\. 12"),
        (lambda d: d.prefill(np.array([1.0, 2.0])), ValueError, r"tokens must be integers"),
        (lambda d: d.prefill(np.arange(17) % 13), ValueError, r"do not fit the context of 19"),
        (lambda d: d.prefill(np.array([[1, 2]])), ValueError, r"shape \(m,\)"),
    ],
)
def test_a_refused_call_leaves_every_cache_intact(call, error, message):
    dec = Decoder(G)
    dec.prefill(np.array([2, 3, 4]))
    before = [(c.keys.copy(), c.values.copy()) for c in dec.caches]
    logits = dec.logits.copy()
    with pytest.raises(error, match=message):
        call(dec)
    for c, (k, v) in zip(dec.caches, before):
        assert np.array_equal(c.keys, k) and np.array_equal(c.values, v)
    assert np.array_equal(dec.logits, logits) and dec.lengths.tolist() == [3]


def test_batched_refusals():
    dec = Decoder(G, batch=2)
    with pytest.raises(ValueError, match="at least one real token"):
        dec.prefill(np.ones((2, 3), np.int64), key_mask=np.array([[1, 1, 0], [0, 0, 0]], bool))
    with pytest.raises(ValueError, match=r"key_mask must be a boolean array of shape \(2, 3\)"):
        dec.prefill(np.ones((2, 3), np.int64), key_mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match=r"\(B, m\) with B = 2"):
        dec.prefill(np.ones((3, 3), np.int64))
    assert dec.lengths.tolist() == [0, 0]
    with pytest.raises(RuntimeError, match="call prefill first"):
        dec.decode_step()


def test_weights_are_checked():
    with pytest.raises(TypeError, match="BlockWeights"):
        GPTWeights(E=G.E, P=G.P, blocks=(), gamma_f=G.gamma_f, beta_f=G.beta_f)
    with pytest.raises(ValueError, match=r"P has shape \(19, 4\), but the blocks have d_model = 5"):
        GPTWeights(E=G.E, P=G.P[:, :4], blocks=G.blocks, gamma_f=G.gamma_f, beta_f=G.beta_f)
    with pytest.raises(ValueError, match="n_layers must be a positive integer"):
        init_gpt_weights(n_layers=0)
    with pytest.raises(ValueError, match="does not fit"):
        gpt_forward(np.zeros(20, np.int64), G)
    assert G.E.flags.writeable is False and "L=3" in repr(G)


def test_feeding_known_tokens_step_by_step_equals_prefill():
    prompt = np.array([5, 9, 2, 2, 7, 0])
    at_once = Decoder(G).prefill(prompt)
    dec = Decoder(G)
    dec.prefill(prompt[:1])
    assert [dec.decode_step(int(t)) for t in prompt[1:]] == prompt[1:].tolist()
    assert np.allclose(dec.logits, at_once, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match=r"token ids must lie in 0 \.\. 12"):
        dec.decode_step(13)
    with pytest.raises(ValueError, match=r"tokens must be integers of shape \(\)"):
        dec.decode_step(np.array([1, 2]))
    assert dec.lengths.tolist() == [6]
    batched = Decoder(G, batch=2)
    batched.prefill(np.array([[1, 2], [3, 4]]))
    assert batched.decode_step(np.array([5, 6])).tolist() == [5, 6]
