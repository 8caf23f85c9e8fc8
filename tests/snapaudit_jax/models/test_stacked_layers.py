"""Tests for the decoders' stacked layers (``stack_layers``, ``unstack_layers``, ``StackedBlocks``).

Oracles: the same model with one module per block (the unrolled loop, itself checked against transformers in
test_models.py): logits, losses and gradients equal to float32 rounding, the KV-cache decode equal, the round
trip bitwise; the lowered step's StableHLO, whose size grows with every unrolled block and must not grow with a
stacked one (a structural fact, not a timing).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from snapaudit_jax.dpsgd import clipped_grad_sum, ghost, sequence_losses
from snapaudit_jax.finetune.lora import LoRAConfig, apply_lora
from snapaudit_jax.models import Greedy, decode
from snapaudit_jax.models.config import GPT2Config, LlamaConfig
from snapaudit_jax.models.decoders import GPT2, Llama, StackedBlocks, empty_cache, stack_layers, unstack_layers
from snapaudit_jax.models.layers import LayerCache
from snapaudit_jax.utils.errors import InputError

VOCAB = 41


def gpt2(layers: int = 3, seed: int = 0):
    return GPT2(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=layers, n_head=2, n_inner=32),
                rngs=nnx.Rngs(seed))


def llama(layers: int = 3, seed: int = 0, tied: bool = False):
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=4, max_position_embeddings=32,
                      tie_word_embeddings=tied)
    return Llama(cfg, rngs=nnx.Rngs(seed))


def batch(rows: int = 5, length: int = 12, seed: int = 0):
    """Tokens with left- and right-padded rows of 3..length real tokens."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, (rows, length)).astype(np.int32)
    lens = rng.integers(3, length + 1, rows)
    pos = np.arange(length)[None, :]
    mask = np.where((np.arange(rows) % 2 == 0)[:, None], pos < lens[:, None], pos >= (length - lens)[:, None])
    return jnp.asarray(tokens), jnp.asarray(mask)


def flat_params(model) -> dict[str, np.ndarray]:
    return {".".join(map(str, path)): np.asarray(v[...]) for path, v in nnx.to_flat_state(nnx.state(model))}


def loss_and_grads(model, tokens, mask, trainable=nnx.Param):
    graphdef, params, rest = nnx.split(model, trainable, ...)

    def loss(p, r, t, m):
        return jnp.sum(sequence_losses(nnx.merge(graphdef, p, r), t, m))

    value, grads = jax.jit(jax.value_and_grad(loss))(params, rest, tokens, mask)
    return float(value), grads


def _rows(model, tokens, mask):
    graphdef, state = nnx.split(model)
    return jax.jit(lambda s, t, m: sequence_losses(nnx.merge(graphdef, s), t, m))(state, tokens, mask)


def unstacked_grads(grads, layers: int) -> dict[str, np.ndarray]:
    """A stacked model's gradients by the unrolled model's parameter names."""
    out = {}
    for path, v in nnx.to_flat_state(grads):
        value = np.asarray(v[...])
        if path[:2] == ("blocks", "layers"):
            for i in range(layers):
                out[".".join(map(str, ("blocks", i) + tuple(path[2:])))] = value[i]
        else:
            out[".".join(map(str, path))] = value
    return out


def test_round_trip_is_bitwise_and_leaves_the_model_alone():
    """Stacked parameters carry a leading layer axis holding block i at index i; unstacking gives the same
    parameters bit for bit; neither call modifies its argument; stacking twice is stacking once."""
    model = gpt2(layers=3)
    before = flat_params(model)
    stacked = stack_layers(model)
    assert isinstance(stacked.blocks, StackedBlocks) and len(stacked.blocks) == 3
    kernel = np.asarray(stacked.blocks.layers.c_fc.kernel[...])
    assert kernel.shape == (3, 16, 32)
    for i in range(3):
        np.testing.assert_array_equal(kernel[i], before[f"blocks.{i}.c_fc.kernel"])
    assert stack_layers(stacked) is stacked
    back = unstack_layers(stacked)
    after = flat_params(back)
    assert after.keys() == before.keys()
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert flat_params(model).keys() == before.keys() and isinstance(model.blocks, nnx.List)
    assert unstack_layers(model) is model
    stacked.blocks.layers.c_fc.kernel[...] = 0.0  # the stack is a copy
    np.testing.assert_array_equal(np.asarray(model.blocks[0].c_fc.kernel[...]), before["blocks.0.c_fc.kernel"])


@pytest.mark.slow
@pytest.mark.parametrize("make", [gpt2, llama, lambda layers: llama(layers, tied=True)],
                         ids=["gpt2", "llama-untied", "llama-tied"])
def test_stacked_model_computes_the_same_losses_and_gradients(make):
    """Per-row losses and every parameter's gradient of the stacked model equal the unrolled model's (float32,
    1e-5 relative to the largest entry), on padded rows of several lengths; power: a stack with two blocks
    swapped differs."""
    model = make(3)
    tokens, mask = batch()
    stacked = stack_layers(model)
    rows = np.asarray(_rows(model, tokens, mask))
    np.testing.assert_allclose(np.asarray(_rows(stacked, tokens, mask)), rows, rtol=1e-5)
    value, grads = loss_and_grads(model, tokens, mask)
    value_s, grads_s = loss_and_grads(stacked, tokens, mask)
    assert value_s == pytest.approx(value, rel=1e-6)
    want = {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(grads)}
    got = unstacked_grads(grads_s, 3)
    assert got.keys() == want.keys()
    for name, g in want.items():
        np.testing.assert_allclose(got[name], g, rtol=0, atol=1e-5 * max(1e-12, float(np.abs(g).max())), err_msg=name)
    swapped = stack_layers(model)
    graphdef, state = nnx.split(swapped.blocks.layers)
    nnx.update(swapped.blocks.layers, jax.tree.map(lambda v: v[jnp.array([1, 0, 2])], state))
    assert not np.allclose(np.asarray(_rows(swapped, tokens, mask)), rows, rtol=1e-3)


@pytest.mark.slow
def test_lora_adapters_stack_and_train_only_themselves():
    """A LoRA model (adapters on every block) stacks; its adapters' gradients equal the unrolled model's and
    the stacked base weights get none (trainable = LoRA parameters)."""
    model = apply_lora(llama(3), LoRAConfig(rank=2, alpha=4.0), key=jax.random.key(1))
    # non-zero B so that A's gradient is not zero
    for block in model.blocks:
        for proj in (block.qkv_proj, block.o_proj):
            if hasattr(proj, "lora_b"):
                for b in proj.lora_b:
                    b[...] = jax.random.normal(jax.random.key(2), b.shape) * 0.1
    tokens, mask = batch()
    _, grads = loss_and_grads(model, tokens, mask, nnx.LoRAParam)
    _, grads_s = loss_and_grads(stack_layers(model), tokens, mask, nnx.LoRAParam)
    want = {".".join(map(str, p)): np.asarray(v[...]) for p, v in nnx.to_flat_state(grads)}
    got = unstacked_grads(grads_s, 3)
    assert got.keys() == want.keys() and any("lora_a" in name for name in want)
    for name, g in want.items():
        assert np.abs(g).max() > 0, name
        np.testing.assert_allclose(got[name], g, rtol=0, atol=1e-5 * float(np.abs(g).max()), err_msg=name)


@pytest.mark.slow
def test_decoding_a_stacked_model_with_its_cache_matches():
    """Greedy decoding of a stacked model (its cache stacked too: prefill and cached steps under one scan) gives
    the unrolled model's tokens; a tuple of per-layer caches still works on it, block by block."""
    model = llama(3)
    stacked = stack_layers(model)
    cache = empty_cache(stacked, 2, 10)
    assert isinstance(cache, LayerCache) and cache.k.shape == (3, 2, 10, 2, 4)
    tokens4 = jnp.asarray([[3, 5, 7, 9]] * 2, jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(4), (2, 4))
    key_mask = jnp.zeros((2, 10), bool).at[:, :4].set(True)
    h_scan, c_scan = stacked(tokens4, positions, key_mask, cache=cache, index=0)
    h_loop, c_loop = stacked(tokens4, positions, key_mask, cache=empty_cache(model, 2, 10), index=0)
    np.testing.assert_allclose(np.asarray(h_scan), np.asarray(h_loop), rtol=1e-5, atol=1e-6)
    for i in range(3):
        np.testing.assert_allclose(np.asarray(c_scan.k[i]), np.asarray(c_loop[i].k), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(c_scan.v[i]), np.asarray(c_loop[i].v), rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(c_scan.k[:, :, :4]).max()) > 0 and float(jnp.abs(c_scan.k[:, :, 4:]).max()) == 0
    tokens = jnp.asarray([[3, 5, 7, 9], [0, 0, 11, 2]], jnp.int32)
    mask = jnp.asarray([[True] * 4, [False, False, True, True]])
    want = np.asarray(decode(model, tokens, mask, Greedy(), max_new_tokens=6))
    got = np.asarray(decode(stack_layers(model), tokens, mask, Greedy(), max_new_tokens=6))
    np.testing.assert_array_equal(got, want)
    assert len(set(want.ravel().tolist())) > 1


def test_blocks_that_differ_or_too_few_are_refused():
    """Blocks of different structure (adapters on one block only) and a single block cannot be stacked: an
    InputError names the block or the count."""
    model = gpt2(3)
    other = apply_lora(gpt2(3), LoRAConfig(rank=2), key=jax.random.key(0))
    model.blocks[1] = other.blocks[1]
    with pytest.raises(InputError, match=r"block 1 differs in structure from block 0"):
        stack_layers(model)
    with pytest.raises(InputError, match=r"at least two blocks, got 1"):
        stack_layers(gpt2(1))


def _by_unrolled_name(tree, layers: int) -> dict[str, np.ndarray]:
    return unstacked_grads(tree, layers)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2-full", "llama-lora"])
def test_fast_clipping_on_stacked_blocks_equals_the_per_record_path(kind):
    """The ghost norms and the book-keeping and ghost clipped sums of a stacked model (its blocks tapped inside the
    scan) equal jax_privacy's per-record path on the unrolled model: norms to 1e-5 relative, every parameter's
    clipped sum to 1e-5 of its largest entry, with most units clipped; nothing is left uncovered. Power: a stacked
    parameter's norm is the sum of its layers' (the unrolled per-parameter norms), not any one layer's."""
    layers = 3
    if kind == "gpt2-full":
        model, trainable = gpt2(layers), nnx.Param
    else:
        model = apply_lora(llama(layers), LoRAConfig(rank=2), key=jax.random.key(1))
        for block in model.blocks:
            for b in block.qkv_proj.lora_b:
                b[...] = jax.random.normal(jax.random.key(2), b.shape) * 0.1
        trainable = nnx.LoRAParam
    stacked = stack_layers(model)
    tokens, mask = batch(rows=6)
    assert ghost.not_covered(*nnx.split(stacked, trainable, ...), tokens[:1], mask[:1]) == ()
    oracle = clipped_grad_sum(model, tokens, mask, clip_norm=float("inf"), trainable=trainable)
    norms = ghost.dense_sq_norms(stacked, tokens, mask, trainable=trainable)
    np.testing.assert_allclose(np.sqrt(np.asarray(norms.total)), np.asarray(oracle.norms), rtol=1e-5)
    unrolled = ghost.dense_sq_norms(model, tokens, mask, trainable=trainable)
    name = sorted(n for n in norms.per_param if n.startswith("blocks.layers."))[-1]
    parts = [np.asarray(unrolled.per_param[name.replace("blocks.layers.", f"blocks.{i}.")]) for i in range(layers)]
    np.testing.assert_allclose(np.asarray(norms.per_param[name]), sum(parts), rtol=1e-5)
    assert all(not np.allclose(np.asarray(norms.per_param[name]), part, rtol=1e-3) for part in parts)
    clip = float(np.median(np.asarray(oracle.norms))) / 2
    want = _by_unrolled_name(clipped_grad_sum(model, tokens, mask, clip_norm=clip, trainable=trainable).grad_sum,
                             layers)
    for method in ("book_keeping", "ghost"):
        got = _by_unrolled_name(clipped_grad_sum(stacked, tokens, mask, clip_norm=clip, trainable=trainable,
                                                 method=method).grad_sum, layers)
        assert got.keys() == want.keys()
        for n, g in want.items():
            np.testing.assert_allclose(got[n], g, rtol=0, atol=1e-5 * float(np.abs(g).max()), err_msg=f"{method} {n}")


def _lowered_kb(model, tokens, mask) -> float:
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p, r, t, m):
        return jnp.sum(sequence_losses(nnx.merge(graphdef, p, r), t, m))

    return len(jax.jit(jax.grad(loss)).lower(params, rest, tokens, mask).as_text()) / 1024


def _decode_kb(model, tokens, mask) -> float:
    from snapaudit_jax.models.inference import Greedy, decode_tokens

    graphdef, state = nnx.split(model)

    def run(s, t, m):
        return decode_tokens(nnx.merge(graphdef, s), t, m, Greedy(), jnp.int32(4), max_new=4)

    return len(jax.jit(run).lower(state, tokens, mask).as_text()) / 1024


@pytest.mark.slow
def test_the_stacked_step_does_not_grow_with_depth():
    """The lowered gradient step and the lowered decode loop of a stacked model are as large at 8 blocks as at 2
    (within 2 %: only the parameters' shapes change), where the unrolled ones grow by more than half (power)."""
    tokens, mask = batch(rows=2)
    two, eight = (_lowered_kb(stack_layers(gpt2(n)), tokens, mask) for n in (2, 8))
    assert abs(eight - two) <= 0.02 * two, (two, eight)
    two_u, eight_u = (_lowered_kb(gpt2(n), tokens, mask) for n in (2, 8))
    assert eight_u > 1.5 * two_u, (two_u, eight_u)
    # decoding (prefill and the cached steps) alike
    two, eight = (_decode_kb(stack_layers(llama(n)), tokens, mask) for n in (2, 8))
    assert abs(eight - two) <= 0.02 * two, (two, eight)
    two_u, eight_u = (_decode_kb(llama(n), tokens, mask) for n in (2, 8))
    assert eight_u > 1.5 * two_u, (two_u, eight_u)
