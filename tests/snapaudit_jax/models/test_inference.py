"""The inference kernels (:mod:`snapaudit_jax.models.inference`) and the one ROC AUC.

Oracles: step-by-step decoding without a KV cache (full forward passes on the unpadded sequence, arg-max or
top-k set of the last logits), a per-token float64 log-softmax loop, and ``sklearn.metrics.roc_auc_score``.
Shapes are tiny and prime: vocabulary 53, prompts of 2, 3, 5 and 7 tokens, 7 new tokens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from sklearn import metrics as sklearn_metrics

from snapaudit_jax.estimation import roc_auc
from snapaudit_jax.models import (
    GPT2,
    BatchSample,
    GPT2Config,
    Greedy,
    Llama,
    LlamaConfig,
    Sample,
    decode,
    greedy_matches,
    inference,
    last_token_logprobs,
    sequence_nll,
    token_logprobs,
)

VOCAB = 53
NEW = 7
PROMPTS = [[3, 17], [5, 11, 2], [7, 1, 29, 31, 4], [13, 19, 23, 37, 41, 43, 47]]


def _models():
    gpt2 = GPT2(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2, n_inner=32),
                nnx.Rngs(3))
    llama = Llama(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=32),
                  nnx.Rngs(5))
    return {"gpt2": gpt2, "llama": llama}


MODELS = _models()


def _left_pad(rows, width):
    tokens = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, ids in enumerate(rows):
        tokens[i, width - len(ids):] = ids
        mask[i, width - len(ids):] = True
    return tokens, mask


@functools.lru_cache(maxsize=None)
def _full_forward(name):
    graphdef, state = nnx.split(MODELS[name])

    @jax.jit
    def logits(state, tokens):
        model = nnx.merge(graphdef, state)
        ones = jnp.ones_like(tokens, bool)
        hidden, _ = model(tokens, jnp.cumsum(ones, axis=-1) - 1, ones)
        return model.logits(hidden)

    return functools.partial(logits, state)


def _last_logits(model, ids) -> np.ndarray:
    """Oracle: logits after ``ids`` by one full forward pass without a cache, on ``ids`` followed by filler
    tokens (by causality the filler cannot change earlier logits)."""
    name = next(k for k, v in MODELS.items() if v is model)
    row = np.zeros((1, 32), np.int32)
    row[0, : len(ids)] = ids
    return np.asarray(_full_forward(name)(jnp.asarray(row)), np.float64)[0, len(ids) - 1]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_greedy_decode_is_argmax_stepping_without_cache(name):
    model = MODELS[name]
    tokens, mask = _left_pad(PROMPTS, 11)
    out = np.asarray(decode(model, tokens, mask, Greedy(), max_new_tokens=NEW, max_new=11))
    assert out.shape == (len(PROMPTS), 11) and (out[:, NEW:] == 0).all()
    for row, ids in zip(out, PROMPTS):
        seq = list(ids)
        for _ in range(NEW):
            seq.append(int(np.argmax(_last_logits(model, seq))))
        assert list(row[:NEW]) == seq[len(ids):]


def test_eos_stops_a_row_and_pads_after_it():
    model = MODELS["gpt2"]
    tokens, mask = _left_pad(PROMPTS, 7)
    free = np.asarray(decode(model, tokens, mask, max_new_tokens=NEW))
    eos = int(free[1, 2])
    out = np.asarray(decode(model, tokens, mask, max_new_tokens=NEW, eos_ids=(eos,), pad_id=51))
    for f, o in zip(free, out):
        stop = list(f).index(eos) + 1 if eos in f else NEW
        assert list(o[:stop]) == list(f[:stop]) and (o[stop:] == 51).all()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_top_k_never_leaves_the_top_k(name):
    """At temperature 7 the draws spread over the whole top 3; each token is checked against the top-3 set of
    the no-cache logits of its own prefix."""
    model, k = MODELS[name], 3
    tokens, mask = _left_pad(PROMPTS * 5, 7)
    keys = jax.random.split(jax.random.key(11), len(tokens))
    out = np.asarray(decode(model, tokens, mask, Sample(keys, 7.0, top_k=k), max_new_tokens=NEW))
    seen_rank = set()
    for row, ids in zip(out, PROMPTS * 5):
        seq = list(ids)
        for t in row[:NEW]:
            order = np.argsort(-_last_logits(model, seq), kind="stable")
            assert int(t) in order[:k]
            seen_rank.add(int(np.flatnonzero(order == t)[0]))
            seq.append(int(t))
    assert seen_rank == set(range(k))  # power: not greedy in disguise


@pytest.mark.slow
def test_per_row_keys_make_rows_independent():
    """Row ``b`` depends on its key and prompt only: alone, permuted or next to other rows, the same tokens."""
    model = MODELS["llama"]
    tokens, mask = _left_pad(PROMPTS, 7)
    keys = jax.random.split(jax.random.key(2), len(PROMPTS))
    full = np.asarray(decode(model, tokens, mask, Sample(keys, 1.3), max_new_tokens=NEW))
    perm = np.array([2, 0, 3, 1])
    permuted = np.asarray(decode(model, tokens[perm], mask[perm], Sample(keys[perm], 1.3), max_new_tokens=NEW))
    np.testing.assert_array_equal(permuted, full[perm])
    alone = np.asarray(decode(model, tokens[2:3], mask[2:3], Sample(keys[2:3], 1.3), max_new_tokens=NEW))
    np.testing.assert_array_equal(alone[0], full[2])
    # Power: another key changes the row.
    other = np.asarray(decode(model, tokens[2:3], mask[2:3], Sample(keys[3:4], 1.3), max_new_tokens=NEW))
    assert not np.array_equal(other[0], full[2])


@pytest.mark.slow
def test_batch_sample_stream_splits_one_key_per_step():
    """:class:`BatchSample`: step ``s`` draws every row with ``sub`` of the ``(s + 1)``-th ``key, sub = split(key)``
    (oracle: the same draws made step by step without a cache)."""
    model = MODELS["gpt2"]
    tokens, mask = _left_pad(PROMPTS, 7)
    key = jax.random.key(5)
    out = np.asarray(decode(model, tokens, mask, BatchSample(key, 0.7), max_new_tokens=NEW))
    seqs = [list(p) for p in PROMPTS]
    for s in range(NEW):
        key, sub = jax.random.split(key)
        logits = jnp.asarray(np.stack([_last_logits(model, q) for q in seqs]), jnp.float32)
        draw = np.asarray(jax.random.categorical(sub, logits / jnp.float32(0.7), axis=-1))
        for q, t, o in zip(seqs, draw, out[:, s]):
            assert int(o) == int(t)
            q.append(int(t))


def test_decode_reuses_its_compilation_and_validates():
    model = MODELS["gpt2"]
    tokens, mask = _left_pad(PROMPTS, 7)
    decode(model, tokens, mask, max_new_tokens=5, max_new=11, live=[True] * 4)
    before = inference._decode._cache_size()
    decode(model, tokens[::-1], mask[::-1], max_new_tokens=3, max_new=11, live=[True, True, True, False])
    assert inference._decode._cache_size() == before
    with pytest.raises(ValueError, match=r"Sample.key must hold one key per row, shape \(4,\)"):
        decode(model, tokens, mask, Sample(jax.random.split(jax.random.key(0), 3)), max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got 0"):
        decode(model, tokens, mask, max_new_tokens=0)
    with pytest.raises(ValueError, match="max_new must be >= max_new_tokens=5, got 3"):
        decode(model, tokens, mask, max_new_tokens=5, max_new=3)
    with pytest.raises(ValueError, match="row 1 has none"):
        decode(model, tokens, mask & (np.arange(4) != 1)[:, None], max_new_tokens=2)
    with pytest.raises(ValueError, match="exceeds the model's 32 positions"):
        decode(model, tokens, mask, max_new_tokens=26)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_scoring_equals_a_per_token_float64_loop(name):
    model = MODELS[name]
    width = 11
    tokens = np.zeros((len(PROMPTS), width), np.int32)
    mask = np.zeros((len(PROMPTS), width), bool)
    for i, ids in enumerate(PROMPTS):
        tokens[i, : len(ids)] = ids
        mask[i, : len(ids)] = True
    lp = np.asarray(token_logprobs(model, jnp.asarray(tokens), jnp.asarray(mask)))
    score_from = np.array([1, 2, 3, 5], np.int32)
    nll, count = sequence_nll(model, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(score_from))
    assert lp.shape == (len(PROMPTS), width - 1)
    for i, ids in enumerate(PROMPTS):
        oracle = []
        for t in range(1, len(ids)):
            z = _last_logits(model, ids[:t])
            z = z - z.max()
            oracle.append(z[ids[t]] - np.log(np.exp(z).sum()))
        np.testing.assert_allclose(lp[i, : len(ids) - 1], oracle, rtol=1e-5, atol=1e-6)
        assert (lp[i, len(ids) - 1:] == 0).all()
        np.testing.assert_allclose(float(nll[i]), -sum(oracle[score_from[i] - 1:]), rtol=1e-5, atol=1e-6)
        assert int(count[i]) == len(ids) - score_from[i]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_label_kernels_equal_a_float64_oracle(name):
    """last_token_logprobs and greedy_matches against log-softmax / argmax of full no-cache forward passes."""
    model = MODELS[name]
    tokens, mask = _left_pad(PROMPTS, 9)
    labels = np.array([4, 8, 50], np.int32)
    lp = np.asarray(last_token_logprobs(model, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(labels)))
    best = []
    for i, ids in enumerate(PROMPTS):
        z = _last_logits(model, ids)
        z = z - z.max()
        np.testing.assert_allclose(lp[i], z[labels] - np.log(np.exp(z).sum()), rtol=1e-5, atol=1e-6)
        best.append(int(np.argmax(z)))
    # a one-token candidate matches iff it is the argmax after the prompt
    rows = [ids + [b] for ids, b in zip(PROMPTS, best)]
    rows[1][-1] = (rows[1][-1] + 1) % VOCAB
    t2, m2 = _left_pad(rows, 10)
    target = np.array([[r[-1]] for r in rows], np.int32)
    got = greedy_matches(model, jnp.asarray(t2), jnp.asarray(m2), jnp.asarray(target), jnp.ones((4, 1), bool), span=1)
    assert np.asarray(got).tolist() == [True, False, True, True]


def test_roc_auc_equals_sklearn_with_ties():
    rng = np.random.default_rng(7)
    for n1, n0 in ((1, 1), (3, 5), (31, 17)):
        m = np.round(rng.normal(0.4, 1.0, n1), 1)  # rounded: many ties
        n = np.round(rng.normal(0.0, 1.0, n0), 1)
        y = np.r_[np.ones(n1), np.zeros(n0)]
        assert roc_auc(m, n) == pytest.approx(sklearn_metrics.roc_auc_score(y, np.r_[m, n]), abs=1e-12)
    assert roc_auc([1.0, 1.0], [1.0]) == 0.5
    with pytest.raises(ValueError, match="nonmember_scores must be finite"):
        roc_auc([0.0], [np.inf])
    with pytest.raises(ValueError, match=r"member_scores must be 1-dimensional, got shape \(1, 2\)"):
        roc_auc([[0.0, 1.0]], [0.0])
