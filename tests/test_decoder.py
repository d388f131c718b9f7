"""The small GPT that generates: caches per layer give what recomputing everything gives."""

import numpy as np
import pytest

from mha_lit import Dims
from mha_lit.decoder import Decoder, GPTWeights, gpt_forward, init_gpt_weights

G = init_gpt_weights(Dims(), layers=3, seed=1)  # book sizes: d_model 5, vocab 13, ctx 19


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
        tokens, logits = _greedy_by_recomputing(p, steps)
        assert out[b].tolist() == tokens.tolist()
        top2 = np.sort(logits, axis=1)[:, -2:]
        assert np.all(top2[:, 1] - top2[:, 0] > 1e-6)  # no near tie decided by rounding


def test_float32_stack_decodes_like_float64():
    args = (Dims(d_model=12, d_k=4, d_v=4, heads=3), 2, 29, 40, 48, 5)
    G32 = init_gpt_weights(*args, dtype=np.float32)
    G64 = init_gpt_weights(*args)  # the same numbers, in float64
    assert np.array_equal(G32.E, G64.E.astype(np.float32))
    prompt = np.arange(10) % 29
    d32, d64 = Decoder(G32), Decoder(G64)
    assert d32.prefill(prompt).dtype == np.float32
    d64.prefill(prompt)
    for _ in range(12):
        assert d32.decode_step() == d64.decode_step()
        # float32 rounds the weights and every sum: agreement to 1e-3 on logits of size ~10
        assert np.allclose(d32.logits, d64.logits, rtol=0, atol=1e-3)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda d: d.prefill(np.array([1, 13])), ValueError, r"tokens must lie in 0 \.\. 12"),
        (lambda d: d.prefill(np.array([1.0, 2.0])), TypeError, r"tokens must be integer token ids"),
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
    with pytest.raises(ValueError, match=r"key_mask has shape \(2, 4\) but needs one entry per "
                       r"token of the prompt, shape \(2, 3\)"):
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
    with pytest.raises(ValueError, match="layers must be a positive integer"):
        init_gpt_weights(layers=0)
    with pytest.raises(TypeError, match="vocab_size must be a positive integer, got True"):
        init_gpt_weights(vocab_size=True)
    assert init_gpt_weights(layers=np.int64(1)).layers == 1
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
    with pytest.raises(ValueError, match=r"tokens must lie in 0 \.\. 12 \(vocab_size = 13\), got id 13"):
        dec.decode_step(13)
    with pytest.raises(ValueError, match=r"tokens must be integers of shape \(\)"):
        dec.decode_step(np.array([1, 2]))
    with pytest.raises(TypeError, match="tokens must be integer token ids"):
        dec.decode_step(2.0)
    with pytest.raises(TypeError, match="steps must be a non-negative integer, got 2.0"):
        dec.generate(prompt, 2.0)
    with pytest.raises(ValueError, match="steps must be a non-negative integer, got -1"):
        dec.generate(prompt, -1)
    assert dec.lengths.tolist() == [6]
    batched = Decoder(G, batch=2)
    batched.prefill(np.array([[1, 2], [3, 4]]))
    assert batched.decode_step(np.array([5, 6])).tolist() == [5, 6]
    for b, seq in enumerate(([1, 2, 5], [3, 4, 6])):  # the fed tokens are in the caches
        assert np.allclose(batched.logits[b], gpt_forward(np.array(seq), G)[-1],
                           rtol=0, atol=1e-10)


def test_key_mask_without_a_batch_caches_only_the_real_tokens():
    dec = Decoder(G)
    dec.prefill(np.array([3, 1, 4, 9]), key_mask=np.array([True, False, True, False]))
    assert dec.lengths.tolist() == [2]
    assert np.allclose(dec.logits, gpt_forward(np.array([3, 4]), G)[-1], rtol=0, atol=1e-10)
    t = dec.decode_step()
    assert np.allclose(dec.logits, gpt_forward(np.array([3, 4, t]), G)[-1], rtol=0, atol=1e-10)
    with pytest.raises(TypeError, match="key_mask must be boolean"):
        dec.prefill(np.array([1, 2]), key_mask=np.array([1, 1]))


def test_a_layer_that_refuses_deep_in_the_stack_leaves_every_cache_as_it_was():
    """Block 2's W_2 so large that its output overflows to inf: layer 3 refuses the NaN/inf
    rows. Layers 1 and 2 had already cached the new tokens; they must be rolled back."""
    from mha_lit import BlockWeights

    bad = G.blocks[1]
    huge = BlockWeights(gamma_1=bad.gamma_1, beta_1=bad.beta_1, attn=bad.attn,
                        gamma_2=bad.gamma_2, beta_2=bad.beta_2, W_1=bad.W_1, b_1=bad.b_1,
                        W_2=bad.W_2 * 1e308, b_2=bad.b_2)
    G_bad = GPTWeights(E=G.E, P=G.P, blocks=(G.blocks[0], huge, G.blocks[2]),
                       gamma_f=G.gamma_f, beta_f=G.beta_f)
    dec = Decoder(G_bad)
    with np.errstate(over="ignore", invalid="ignore"):
        with pytest.raises(ValueError, match="NaN or infinite"):
            dec.prefill(np.array([2, 3, 4]))
    assert [len(c) for c in dec.caches] == [0, 0, 0]
    with pytest.raises(RuntimeError, match="call prefill first"):
        dec.decode_step()


def test_logits_are_a_copy_and_reset_starts_over():
    dec = Decoder(G)
    first = dec.generate(np.array([4, 8]), 3)
    dec.logits[:] = 0  # a copy: the decoder is not changed
    assert dec.decode_step() == _greedy_by_recomputing([4, 8], 4)[0][-1]
    dec.reset()
    assert dec.lengths.tolist() == [0]
    assert dec.generate(np.array([4, 8]), 3).tolist() == first.tolist()


# --- mutation-test gaps (shared/reviews/mutation.md): the seed rule, GPTWeights is frozen -----

@pytest.mark.parametrize("seed", [0, 2])
def test_block_l_has_the_documented_seed(seed):
    """init_gpt_weights' docstring: block l is init_block_weights(dims, d_ff,
    seed=1000 * seed + l), GPT-2's attention biases by default (decoder-91). seed 0, the
    default, is the case where a wrong sign would ask for a negative seed."""
    from mha_lit import init_block_weights

    kwargs = {} if seed == 0 else {"seed": seed}
    G3 = init_gpt_weights(Dims(), layers=3, **kwargs)
    for layer, block in enumerate(G3.blocks):
        want = init_block_weights(Dims(), 17, seed=1000 * seed + layer, attn_biases=True)
        got = block.arrays()
        assert got.keys() == want.arrays().keys()
        for name, arr in want.arrays().items():
            assert np.array_equal(got[name], arr), (layer, name)  # the same draws: exact


def test_gpt_weights_are_frozen_and_compare_by_identity():
    import dataclasses

    G2, G2b = init_gpt_weights(Dims()), init_gpt_weights(Dims())
    for name in ("E", "P", "blocks", "gamma_f"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(G2, name, getattr(G2, name))
    assert G2 == G2 and G2 != G2b
    assert {G2: 1}[G2] == 1 and len({G2, G2b}) == 2
