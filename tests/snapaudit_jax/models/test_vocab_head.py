"""The vocabulary-sliced head (``snapaudit_jax.models.vocab_head``) against the whole-logits computation.

Oracles: ``jax.nn.log_softmax`` / ``logsumexp`` of the whole logits in float64 (values), and ``jax.grad`` of the
whole-logits loss (gradients of the hidden states, the head's rows and bias, every model parameter); slices
that divide the vocabulary and slices that do not (a padded last slice), one slice, per-record gradients under
``vmap``. Power: a backward that drops the probability term misses by far more than the tolerance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from snapaudit_jax.dpsgd.gradients import sequence_losses
from snapaudit_jax.models import vocab_head
from snapaudit_jax.models.config import GPT2Config, LlamaConfig
from snapaudit_jax.models.decoders import GPT2, Llama

VOCAB = 37


def _head(seed=0, vocab=VOCAB, width=6, rows=(3, 5)):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=rows + (width,)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(vocab, width)), jnp.float32)
    bias = jnp.asarray(rng.normal(size=vocab), jnp.float32)
    targets = jnp.asarray(rng.integers(0, vocab, rows), jnp.int32)
    return hidden, weight, bias, targets


def _whole(hidden, weight, bias, targets):
    logits = hidden @ weight.T + (0.0 if bias is None else bias)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - lse, lse


@pytest.mark.parametrize("chunk", [1, 5, 8, VOCAB, 64])
@pytest.mark.parametrize("with_bias", [True, False])
def test_values_equal_the_whole_softmax_in_float64(chunk, with_bias):
    hidden, weight, bias, targets = _head()
    bias = bias if with_bias else None
    picked, lse = vocab_head.target_logprobs(hidden, weight, bias, targets, chunk)
    logits = np.asarray(hidden, np.float64) @ np.asarray(weight, np.float64).T
    if with_bias:
        logits = logits + np.asarray(bias, np.float64)
    top = logits.max(-1, keepdims=True)
    want_lse = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[..., 0]
    want = np.take_along_axis(logits, np.asarray(targets)[..., None], -1)[..., 0] - want_lse
    np.testing.assert_allclose(lse, want_lse, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(picked, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 5, 8, VOCAB])
def test_gradients_of_both_outputs_equal_the_whole_logits(chunk):
    """A loss weighting both outputs (the target log-probability and ``lse``) so both cotangents are exercised."""
    hidden, weight, bias, targets = _head(seed=1)
    u = jnp.asarray(np.random.default_rng(2).normal(size=targets.shape), jnp.float32)
    w = jnp.asarray(np.random.default_rng(3).normal(size=targets.shape), jnp.float32)

    def loss(fn):
        return lambda h, W, b: jnp.sum(u * fn(h, W, b)[0] + w * fn(h, W, b)[1])

    sliced = jax.grad(loss(lambda h, W, b: vocab_head.target_logprobs(h, W, b, targets, chunk)), (0, 1, 2))
    whole = jax.grad(loss(lambda h, W, b: _whole(h, W, b, targets)), (0, 1, 2))
    for got, want in zip(sliced(hidden, weight, bias), whole(hidden, weight, bias)):
        assert float(jnp.max(jnp.abs(want))) > 0.1  # something to compare
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_the_rows_gradient_takes_the_orientation_that_copies_less():
    """A batch's slice is transposed through the narrow operand, one record's is not; the gradient test above runs
    both forms (15 positions: one slice of 37 rows transposed, slices of 8 and fewer not)."""
    assert vocab_head.transposed_is_smaller(32 * 127, 4096, 256)
    assert not vocab_head.transposed_is_smaller(127, 4096, 256)
    assert vocab_head.transposed_is_smaller(15, VOCAB, 6) and not vocab_head.transposed_is_smaller(15, 8, 6)


def test_per_record_gradients_under_vmap_equal_the_whole_logits():
    hidden, weight, bias, targets = _head(seed=4)

    def grads(fn):
        per_row = jax.vmap(lambda h, y: jax.grad(lambda W: jnp.sum(fn(h, W, y)))(weight))
        return per_row(hidden, targets)

    got = grads(lambda h, W, y: vocab_head.target_logprobs(h, W, bias, y, 7)[0])
    want = grads(lambda h, W, y: _whole(h, W, bias, y)[0])
    assert got.shape == (3, VOCAB, 6)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_backward_without_the_probability_term_fails_the_oracle(monkeypatch):
    """Power: the comparison above separates a correct backward from one that keeps the target's term only (a
    padded slice's rows without their mask fail the value test: ``chunk`` 5 and 8 do not divide 37)."""
    hidden, weight, bias, targets = _head(seed=5)
    want = jax.grad(lambda W: jnp.sum(_whole(hidden, W, bias, targets)[0]))(weight)

    def got():
        return jax.grad(lambda W: jnp.sum(vocab_head.target_logprobs(hidden, W, bias, targets, 8)[0]))(weight)

    np.testing.assert_allclose(got(), want, rtol=2e-5, atol=2e-6)
    real = vocab_head.slice_probabilities
    monkeypatch.setattr(vocab_head, "slice_probabilities", lambda *a: 0.0 * real(*a))
    assert float(jnp.max(jnp.abs(got() - want))) > 0.1


def _gpt2():
    return GPT2(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=8, n_layer=2, n_head=2, n_inner=24),
                rngs=nnx.Rngs(0))


def _llama(tied=False):
    return Llama(LlamaConfig(vocab_size=VOCAB, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=4, max_position_embeddings=64,
                             tie_word_embeddings=tied), rngs=nnx.Rngs(1))


@pytest.mark.parametrize("make", [
    # gpt2 and llama take 3-6 s cold (two models' gradients compiled): the slow tier; the tied head stays fast
    pytest.param(_gpt2, id="gpt2", marks=pytest.mark.slow), pytest.param(_llama, id="llama", marks=pytest.mark.slow),
    pytest.param(lambda: _llama(tied=True), id="llama_tied"),
])
def test_sequence_losses_and_their_gradients_match_the_whole_head(make):
    model = make()
    rng = np.random.default_rng(6)
    tokens = jnp.asarray(rng.integers(0, VOCAB, (4, 9)), jnp.int32)
    mask = jnp.asarray(np.arange(9)[None, :] < np.array([9, 5, 2, 7])[:, None])
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p, chunk):
        return sequence_losses(nnx.merge(graphdef, p, rest), tokens, mask, vocab_chunk=chunk)

    def summed(p, chunk):
        losses = loss(p, chunk)
        return jnp.sum(losses), losses

    (_, sliced), got = jax.jit(jax.value_and_grad(summed, has_aux=True), static_argnums=1)(params, 10)
    (_, whole), want = jax.jit(jax.value_and_grad(summed, has_aux=True), static_argnums=1)(params, None)
    np.testing.assert_allclose(sliced, whole, rtol=1e-5, atol=1e-6)
    flat_got, flat_want = dict(nnx.to_flat_state(got)), dict(nnx.to_flat_state(want))
    assert set(flat_got) == set(flat_want)
    for path, value in flat_want.items():
        np.testing.assert_allclose(flat_got[path][...], value[...], rtol=2e-4, atol=2e-6, err_msg=str(path))


def test_evaluation_in_slices_gives_the_whole_logits_losses():
    """``loss_summary(..., vocab_chunk=)`` (the fine-tuning run's held-out evaluation) equals the whole-logits one
    to float32 rounding; a bad value is refused naming the field."""
    from snapaudit_jax.dpsgd import loss_summary
    from snapaudit_jax.utils.errors import InputError

    rng = np.random.default_rng(7)
    tokens = rng.integers(0, VOCAB, (5, 9)).astype(np.int32)
    mask = np.arange(9)[None, :] < np.array([9, 4, 2, 7, 6])[:, None]
    model = _llama()
    whole = loss_summary(model, (tokens, mask), batch_size=2)
    sliced = loss_summary(model, (tokens, mask), batch_size=2, vocab_chunk=10)
    np.testing.assert_allclose(sliced.losses, whole.losses, rtol=1e-5)
    assert sliced.perplexity == pytest.approx(whole.perplexity, rel=1e-5)
    with pytest.raises(InputError, match="vocab_chunk must be an integer >= 1, got 0"):
        loss_summary(model, (tokens, mask), vocab_chunk=0)


def test_a_slice_wider_than_the_vocabulary_is_one_slice_of_the_vocabulary():
    """``chunk`` above ``V`` gives one slice of ``V`` rows (no array of ``chunk`` rows is formed)."""
    _, weight, bias, _ = _head()
    assert vocab_head.slice_plan(VOCAB, 10**6) == (VOCAB, 1)
    piece = vocab_head.vocab_slice(weight, bias, VOCAB, 0)
    assert piece.rows.shape == (VOCAB, 6) and bool(piece.valid.all())
    np.testing.assert_array_equal(piece.rows, weight)


@pytest.mark.parametrize("with_bias", [True, False])
def test_the_slices_cover_every_row_once_read_in_place(with_bias):
    """Slices of 8 rows over 37: the last one ends at row 37 and marks the 3 rows it repeats invalid; every row
    is valid in exactly one slice with its own weights and bias; ``add_slice_rows`` adds a slice's part to its
    rows only; and the sliced head's program pads no copy of the head."""
    hidden, weight, bias, targets = _head()
    bias = bias if with_bias else None
    chunk, count = vocab_head.slice_plan(VOCAB, 8)
    assert (chunk, count) == (8, 5)
    seen = np.zeros(VOCAB, int)
    total = jnp.zeros((VOCAB, 2), jnp.float32)
    for index in range(count):
        piece = vocab_head.vocab_slice(weight, bias, chunk, jnp.int32(index))
        ids, valid = np.asarray(piece.ids), np.asarray(piece.valid)
        assert int(piece.start) == min(8 * index, VOCAB - 8)
        np.testing.assert_array_equal(valid, ids >= 8 * index)
        np.testing.assert_array_equal(piece.rows, np.asarray(weight)[ids])
        np.testing.assert_array_equal(piece.biases, np.asarray(bias)[ids] if with_bias else np.zeros(8))
        seen[ids[valid]] += 1
        total = vocab_head.add_slice_rows(total, piece, jnp.where(piece.valid[:, None], piece.ids[:, None] + 1.0,
                                                                  0.0) * jnp.ones((1, 2)))
    assert seen.tolist() == [1] * VOCAB
    np.testing.assert_array_equal(total, np.repeat(np.arange(1.0, VOCAB + 1)[:, None], 2, axis=1))
    program = str(jax.make_jaxpr(jax.grad(lambda w: jnp.sum(vocab_head.target_logprobs(
        hidden, w, bias, targets, 8)[0])))(weight))
    assert "pad" not in program and "dynamic_slice" in program


def test_head_weights_of_a_linear_head_are_its_kernel_transposed_and_other_modules_are_refused():
    head = nnx.Linear(4, VOCAB, rngs=nnx.Rngs(0))
    weight, bias = vocab_head.head_weights(head)
    assert weight.shape == (VOCAB, 4) and bias.shape == (VOCAB,)
    np.testing.assert_array_equal(weight, head.kernel[...].T)
    with pytest.raises(TypeError, match="an LM head must be an nnx.Embed .* or an nnx.Linear, got LayerNorm"):
        vocab_head.head_weights(nnx.LayerNorm(4, rngs=nnx.Rngs(0)))
