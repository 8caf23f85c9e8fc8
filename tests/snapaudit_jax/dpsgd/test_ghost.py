"""Ghost norms and book-keeping (``snapaudit_jax.dpsgd.ghost``) against per-unit gradients computed one by one.

The oracle is the definition: each unit's gradient by ``jax.grad`` of that unit's loss alone (a vmap over units,
as :func:`snapaudit_jax.dpsgd.gradients.clipped_grad_sum` computes them), and its squared norm per parameter:
every parameter of full fine-tuning (dense kernels and biases, embeddings, GPT-2's positions, the tied head,
LayerNorm and RMSNorm scales and biases) and LoRA's adapters. Models: GPT-2 and Llama (untied and tied
embeddings, biases on and off), records with left and right padding and variable lengths, and user-level units
(several rows summed). Power: dropping one layer's term, keeping only the Gram products' diagonal (the per-token
norms a naive shortcut would add), dropping the tied embedding's lookup-head cross term or its repeated-token
pairs misses the oracle by far more than the tolerance; parameters the taps cannot see are named, not guessed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from snapaudit_jax.dpsgd.gradients import _loss_fn
from snapaudit_jax.dpsgd.ghost import (
    GRAM_MAP_WIDTH, choose_method, dense_sq_norms, direct_sq_norm, ghost_sq_norm, unit_gram,
)
from snapaudit_jax.models.config import GPT2Config, LlamaConfig
from snapaudit_jax.utils.errors import InputError

VOCAB = 41
CONFIGS = {
    "gpt2": lambda: __import__("snapaudit_jax.models.decoders", fromlist=["GPT2"]).GPT2(
        GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=8, n_layer=2, n_head=2, n_inner=24), rngs=nnx.Rngs(0)),
    "llama": lambda: __import__("snapaudit_jax.models.decoders", fromlist=["Llama"]).Llama(
        LlamaConfig(vocab_size=VOCAB, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=4, max_position_embeddings=64), rngs=nnx.Rngs(1)),
    "llama_tied_biased": lambda: __import__("snapaudit_jax.models.decoders", fromlist=["Llama"]).Llama(
        LlamaConfig(vocab_size=VOCAB, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=2, head_dim=4, max_position_embeddings=64, tie_word_embeddings=True,
                    attention_bias=True, mlp_bias=True), rngs=nnx.Rngs(2)),
}


def _data(shape, seed=0):
    """Rows of 2..L real tokens, even rows right-padded and odd rows left-padded."""
    rng = np.random.default_rng(seed)
    length = shape[-1]
    rows = int(np.prod(shape[:-1]))
    tokens = rng.integers(0, VOCAB, (rows, length)).astype(np.int32)
    lens = rng.integers(2, length + 1, rows)
    pos = np.arange(length)[None, :]
    mask = np.where((np.arange(rows) % 2 == 0)[:, None], pos < lens[:, None], pos >= (length - lens)[:, None])
    return tokens.reshape(shape), mask.reshape(shape)


def _oracle(model, tokens, mask, trainable=nnx.Param, every=False):
    """Per-unit squared norms of every dense kernel and bias (``every``: of every trainable parameter): each
    unit's own gradient, vmapped."""
    graphdef, params, rest = nnx.split(model, trainable, ...)
    loss = _loss_fn(graphdef, rest)
    grads = jax.jit(jax.vmap(lambda t, m: jax.grad(loss)(params, t[None], m[None])))(jnp.asarray(tokens),
                                                                                      jnp.asarray(mask))
    dense = {".".join(map(str, p)) for p, m in nnx.iter_modules(model) if isinstance(m, nnx.Linear)}
    out = {}
    for path, value in nnx.to_flat_state(grads):
        name = ".".join(map(str, path))
        if every or name.rsplit(".", 1)[0] in dense:
            out[name] = np.asarray(jnp.sum(jnp.square(value.reshape(value.shape[0], -1)), axis=1))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CONFIGS))
@pytest.mark.parametrize("shape", [(6, 11), (4, 3, 7)], ids=["records", "users"])
def test_norms_of_every_parameter_equal_the_per_unit_gradients(kind, shape):
    model = CONFIGS[kind]()
    tokens, mask = _data(shape)
    oracle = _oracle(model, tokens, mask, every=True)
    assert any("embedding" in k for k in oracle) and any("norm" in k or "ln_" in k for k in oracle)
    for method in ("ghost", "direct"):  # "auto" picks one of them per layer (tested below)
        got = dense_sq_norms(model, tokens, mask, method=method)
        assert set(got.per_param) == set(oracle) and len(oracle) >= 4  # every parameter covered
        for name, want in oracle.items():
            np.testing.assert_allclose(np.asarray(got.per_param[name]), want, rtol=1e-5, atol=1e-12,
                                       err_msg=f"{method} {name}")
        np.testing.assert_allclose(np.asarray(got.total), sum(oracle.values()), rtol=1e-5)
    # the losses are the units' own (the sum of their rows' mean token losses)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    each = jax.vmap(lambda t, m: _loss_fn(graphdef, rest)(params, t[None], m[None]))(jnp.asarray(tokens),
                                                                                      jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(got.losses), np.asarray(each), rtol=1e-5)
    # power: dropping the largest layer's term misses the total
    biggest = max(oracle, key=lambda k: float(np.sum(oracle[k])))
    dropped = sum(v for k, v in oracle.items() if k != biggest)
    assert not np.allclose(dropped, np.asarray(got.total), rtol=1e-3)


def test_the_gram_identity_needs_every_pair_of_tokens():
    """Power: keeping only the diagonal of the Gram products (sum of per-token norms) is not the norm."""
    rng = np.random.default_rng(4)
    a, g = jnp.asarray(rng.standard_normal((3, 5, 4)), jnp.float32), jnp.asarray(rng.standard_normal((3, 5, 6)),
                                                                                  jnp.float32)
    exact = np.array([np.sum(np.square(np.asarray(a[i]).T @ np.asarray(g[i]))) for i in range(3)])
    np.testing.assert_allclose(np.asarray(ghost_sq_norm(a, g)), exact, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(direct_sq_norm(a, g)), exact, rtol=1e-5)
    diagonal = np.sum(np.sum(np.square(np.asarray(a)), -1) * np.sum(np.square(np.asarray(g)), -1), axis=1)
    assert not np.allclose(diagonal, exact, rtol=1e-2)


@pytest.mark.parametrize("lead", [(3,), (2, 3)])
def test_unit_grams_are_the_same_products_batched_or_a_unit_at_a_time(lead):
    """Each unit's ``x_i y_i^T`` against float64, narrow (one batched product) and wide (a CPU forms them a unit
    at a time), with a layer axis, under vmap; the program each backend gets: a loop on the CPU for the wide
    operands only, the batched product for a GPU (exported, not run)."""
    rng = np.random.default_rng(5)
    for width in (GRAM_MAP_WIDTH - 1, GRAM_MAP_WIDTH):
        x, y = (jnp.asarray(rng.standard_normal(lead + (5, width)), jnp.float32) for _ in range(2))
        want = np.einsum("...sd,...td->...st", np.asarray(x, np.float64), np.asarray(y, np.float64))
        tol = 1e-5 * np.sqrt(width)  # entries are sums of `width` unit-variance products: ~sqrt(width)
        np.testing.assert_allclose(np.asarray(jax.jit(unit_gram)(x, y)), want, rtol=0, atol=tol)
        np.testing.assert_allclose(np.asarray(jax.vmap(unit_gram)(x, y)), want, rtol=0, atol=tol)
        np.testing.assert_allclose(np.asarray(unit_gram(x)), np.einsum(
            "...sd,...td->...st", np.asarray(x, np.float64), np.asarray(x, np.float64)), rtol=0, atol=tol)
        looped = "stablehlo.while" in jax.jit(unit_gram).lower(x, y).as_text()
        assert looped == (width >= GRAM_MAP_WIDTH and jax.default_backend() == "cpu"), width
        for platform, loop in (("cpu", width >= GRAM_MAP_WIDTH), ("cuda", False)):
            text = jax.export.export(jax.jit(unit_gram), platforms=[platform])(x, y).mlir_module()
            assert ("stablehlo.while" in text) == loop and "dot_general" in text, (platform, width)
    with pytest.raises(InputError, match=r"unit_gram needs operands of one shape, got \(3, 5, 2\) and \(3, 4, 2\)"):
        unit_gram(jnp.ones((3, 5, 2)), jnp.ones((3, 4, 2)))


def test_bfloat16_operands_multiply_exactly_into_float32():
    """Two bfloat16 operands (book-keeping's rounded factors) give the float64 products of the same numbers up to
    float32 accumulation: a Gram narrow and wide, both norms, and the program a GPU gets takes them as bfloat16
    (its matrix units) with a float32 result; a bfloat16 and a float32 operand multiply in float32. Power: a
    product rounded to bfloat16 (the result's dtype left to the operands) misses by about 2^-9 of an entry."""
    rng = np.random.default_rng(6)
    for width in (GRAM_MAP_WIDTH - 1, GRAM_MAP_WIDTH):
        x, y = (jnp.asarray(rng.standard_normal((3, 5, width)), jnp.bfloat16) for _ in range(2))
        x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
        want = np.einsum("...sd,...td->...st", x64, y64)
        tol = 2e-7 * np.abs(x64).max() * np.abs(y64).max() * width  # float32 accumulation of `width` exact products
        got = jax.jit(unit_gram)(x, y)
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=tol)
        rounded = np.asarray(jnp.einsum("...sd,...td->...st", x, y).astype(jnp.float32))
        assert np.abs(rounded - want).max() > 20 * tol
        mixed = unit_gram(x, y.astype(jnp.float32))
        np.testing.assert_allclose(np.asarray(mixed), want, rtol=0, atol=tol)
        text = jax.export.export(jax.jit(unit_gram), platforms=["cuda"])(x, y).mlir_module()
        assert f"(tensor<3x5x{width}xbf16>, tensor<3x5x{width}xbf16>) -> tensor<3x5x5xf32>" in text
    a, g = (jnp.asarray(rng.standard_normal((3, 6, n)), jnp.bfloat16) for n in (7, 4))
    grads = np.einsum("bsi,bso->bio", np.asarray(a, np.float64), np.asarray(g, np.float64))
    for norm in (ghost_sq_norm, direct_sq_norm):
        got = jax.jit(norm)(a, g)
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got), np.sum(grads * grads, axis=(1, 2)), rtol=1e-5)


def test_bfloat16_book_keeping_keeps_its_dense_factors_in_bfloat16():
    """With ``sum_dtype="bfloat16"`` every product of the dense terms' norms takes the rounded factors as
    bfloat16 (the float32 path's as float32), on full fine-tuning and LoRA: recorded while tracing."""
    from snapaudit_jax.dpsgd import ghost

    tokens, mask = (jnp.asarray(x) for x in _data((4, 7)))
    for kind, trainable in (("gpt2", nnx.Param), ("llama", nnx.LoRAParam)):
        model = CONFIGS[kind]() if trainable is nnx.Param else _lora_model(kind, ("q_proj", "down_proj"))
        graphdef, params, rest = nnx.split(model, trainable, ...)
        for dtype in ("bfloat16", "float32"):
            seen = []
            exact = ghost._exact_product

            def recording(equation, x, y, exact=exact, seen=seen):
                seen.append((x.dtype, y.dtype))
                return exact(equation, x, y)

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(ghost, "_exact_product", recording)
                jax.eval_shape(lambda p: ghost.book_keeping_clipped_sum_traced(
                    graphdef, p, rest, tokens, mask, jnp.zeros(4, bool), 1.0, sum_dtype=dtype), params)
            assert len(seen) >= 4 and set(seen) == {(jnp.dtype(dtype),) * 2}, (kind, dtype, set(seen))


def test_the_cheaper_method_is_chosen_from_the_layer_shape():
    assert choose_method(8, 768, 3072) == "ghost"  # short records, wide layers: S (d_in + d_out) << d_in d_out
    assert choose_method(1024, 64, 64) == "direct"  # long records, narrow layers
    assert choose_method(32, 32, 32) == "direct"  # equal costs go direct (32 * 64 = 2048 > 1024 is not below)


def test_bad_arguments_are_refused():
    model = CONFIGS["gpt2"]()
    tokens, mask = _data((2, 5))
    with pytest.raises(InputError, match="method must be one of auto, ghost, direct"):
        dense_sq_norms(model, tokens, mask, method="book")
    with pytest.raises(InputError, match="tokens and mask must both be"):
        dense_sq_norms(model, tokens, mask[:, :3])


@pytest.mark.slow
@pytest.mark.parametrize("kind, targets", [("gpt2", ()), ("llama", ("q_proj", "v_proj", "down_proj"))])
def test_lora_adapter_norms_equal_the_per_unit_gradients(kind, targets, shape=(5, 9)):  # users: book-keeping test
    """LoRA training (only the adapters are trainable): every adapter's A and B, on whole projections and on
    column slices of fused ones (Llama's q and v in qkv_proj), equal the per-unit gradients' norms; B is set to
    random values so that dA is not trivially zero."""
    model = _lora_model(kind, targets)
    tokens, mask = _data(shape, seed=2)
    oracle = _oracle(model, tokens, mask, trainable=nnx.LoRAParam, every=True)
    assert any("lora_a" in k for k in oracle) and any("lora_b" in k for k in oracle)
    for method in ("ghost", "direct"):
        got = dense_sq_norms(model, tokens, mask, method=method, trainable=nnx.LoRAParam)
        assert set(got.per_param) == set(oracle)  # every trainable parameter is covered
        for name, want in oracle.items():
            np.testing.assert_allclose(np.asarray(got.per_param[name]), want, rtol=1e-5, atol=1e-12,
                                       err_msg=f"{method} {name}")


def _lora_model(kind, targets, seed=9):
    from snapaudit_jax.finetune.lora import LoRAConfig, apply_lora

    model = apply_lora(CONFIGS[kind](), LoRAConfig(rank=2, alpha=6.0, targets=targets), key=jax.random.key(3))
    rng = np.random.default_rng(seed)
    for _, variable in nnx.iter_graph(model):
        if isinstance(variable, nnx.LoRAParam):
            variable[...] = jnp.asarray(rng.standard_normal(variable.shape) * 0.3, variable.dtype)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("kind, targets", [("gpt2", ()), ("llama", ("q_proj", "v_proj", "down_proj")),
                                           ("gpt2", None), ("llama_tied_biased", None)],
                         ids=["gpt2-lora", "llama-lora", "gpt2-full", "llama_tied_biased-full"])
@pytest.mark.parametrize("shape", [(6, 9), (4, 2, 6)], ids=["records", "users"])
def test_book_keeping_clipped_sum_equals_the_per_unit_path(kind, targets, shape):
    """The book-keeping clipped sum of a DP-LoRA batch and of full fine-tuning (``targets=None``: every
    parameter) equals jax_privacy's per-unit clipped sum (:func:`snapaudit_jax.dpsgd.gradients.clipped_grad_sum`)
    to 1e-5: the clip norm at the units' median norm (some clipped, some not), one padding unit contributing
    nothing. Power: without clipping the sums differ."""
    from snapaudit_jax.dpsgd.ghost import book_keeping_clipped_sum
    from snapaudit_jax.dpsgd.gradients import clipped_grad_sum

    model = CONFIGS[kind]() if targets is None else _lora_model(kind, targets)
    trainable = nnx.Param if targets is None else nnx.LoRAParam
    tokens, mask = _data(shape, seed=5)
    padding = np.zeros(shape[0], bool)
    padding[1] = True
    free = clipped_grad_sum(model, tokens, mask, clip_norm=np.inf, trainable=trainable)
    clip = float(np.median(np.asarray(free.norms)))
    want = clipped_grad_sum(model, tokens, mask, clip_norm=clip, padding=padding, trainable=trainable)
    got = book_keeping_clipped_sum(model, tokens, mask, clip_norm=clip, padding=padding, trainable=trainable)
    np.testing.assert_allclose(np.asarray(got.norms), np.asarray(want.norms), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got.losses), np.asarray(want.losses), rtol=1e-5)
    flat_want = {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(want.grad_sum)}
    flat_got = {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(got.grad_sum)}
    assert set(flat_got) == set(flat_want) and len(flat_want) >= 4
    scale = max(float(np.abs(v).max()) for v in flat_want.values())
    for name, value in flat_want.items():
        np.testing.assert_allclose(flat_got[name], value, rtol=1e-5, atol=1e-6 * scale, err_msg=name)
    clipped = (np.asarray(want.norms) > clip) & ~padding
    assert clipped.any() and (~clipped & ~padding).any()
    unclipped = {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(free.grad_sum)}
    assert any(not np.allclose(unclipped[k], flat_want[k], rtol=1e-3) for k in flat_want)


def _flat(grads) -> np.ndarray:
    return np.concatenate([np.asarray(v[...], np.float64).ravel() for _, v in nnx.to_flat_state(grads)])


def _shares(fn, count: int, clip: float) -> np.ndarray:
    """Each unit's share of a clipped sum ``fn(padding, clip)``: the sum with every other unit as padding, its L2
    norm in float64."""
    return np.asarray([np.linalg.norm(_flat(fn(jnp.asarray(np.arange(count) != i), clip).grad_sum))
                       for i in range(count)])


def _summed(kind, targets, dtype):
    """``(fn(padding, clip), units)``: the jitted book-keeping sum of six units of ``kind``'s model with
    ``dtype`` operands."""
    from snapaudit_jax.dpsgd import ghost

    model = CONFIGS[kind]() if targets is None else _lora_model(kind, targets)
    graphdef, params, rest = nnx.split(model, nnx.Param if targets is None else nnx.LoRAParam, ...)
    tokens, mask = (jnp.asarray(x) for x in _data((6, 9), seed=5))
    step = jax.jit(lambda pad, clip: ghost.book_keeping_clipped_sum_traced(graphdef, params, rest, tokens, mask, pad,
                                                                           clip, sum_dtype=dtype))
    return (lambda pad, clip: step(pad, jnp.float32(clip))), 6


def test_bfloat16_products_keep_every_share_within_the_clip_norm():
    """With bfloat16 operands and every unit clipped (``C`` half the smallest norm), each unit's share of the sum
    (the sum with the others as padding, its norm in float64) is at most ``C`` up to float32 accumulation, and
    within 10^-3 below it (the norms are the rounded factors', the margin covers only the split of ``c g``);
    power in the next test (one bfloat16 term for ``c g`` and no margin: a share passes ``C``). Bad ``sum_dtype``
    refused, named."""
    from snapaudit_jax.dpsgd import ghost

    fn, units = _summed("gpt2", None, "bfloat16")
    clip = 0.5 * float(np.min(np.asarray(fn(jnp.zeros(units, bool), np.inf).norms)))
    shares = _shares(fn, units, clip)
    assert shares.max() <= clip * (1 + 1e-6) and shares.min() >= clip * (1 - 1e-3), shares / clip
    tokens, mask = _data((2, 5))
    with pytest.raises(InputError, match="sum_dtype must be one of float32, bfloat16, got 'float16'"):
        ghost.book_keeping_clipped_sum(CONFIGS["gpt2"](), tokens, mask, clip_norm=1.0, sum_dtype="float16")


@pytest.mark.slow
@pytest.mark.parametrize("kind, targets", [("gpt2", None), ("llama", ("q_proj", "v_proj", "down_proj"))],
                         ids=["gpt2-full", "llama-lora"])
def test_bfloat16_sums_are_the_float32_sums_to_their_rounding(kind, targets, monkeypatch):
    """The bfloat16 sum is the float32 one to 2^-7 relative (the factors' rounding; measured 0.2%), its norms the
    float32 path's to 2^-7 (those of the rounded factors), and its shares stay within ``C`` on DP-LoRA too;
    float32 operands keep every clipped share at ``C`` to 1e-6. Power: with ``c g`` in one bfloat16 term and no
    margin (the rounding of the weighted operand unaccounted for), some unit's share passes ``C`` by more than
    1e-4."""
    from snapaudit_jax.dpsgd import ghost

    (low, units), (full, _) = _summed(kind, targets, "bfloat16"), _summed(kind, targets, "float32")
    none = jnp.zeros(units, bool)
    clip = 0.5 * float(np.min(np.asarray(full(none, np.inf).norms)))
    assert _shares(low, units, clip).max() <= clip * (1 + 1e-6)
    np.testing.assert_allclose(_shares(full, units, clip), clip, rtol=1e-6)
    a, b = low(none, clip), full(none, clip)
    assert 0 < np.linalg.norm(_flat(a.grad_sum) - _flat(b.grad_sum)) <= 2.0**-7 * np.linalg.norm(_flat(b.grad_sum))
    np.testing.assert_allclose(np.asarray(a.norms), np.asarray(b.norms), rtol=2.0**-7)
    monkeypatch.setitem(ghost.SPLIT_ERROR, "bfloat16", 0.0)
    monkeypatch.setattr(ghost, "_SPLIT_TERMS", 1)
    assert _shares(_summed(kind, targets, "bfloat16")[0], units, clip).max() > clip * (1 + 1e-4)


def test_book_keeping_refuses_parameters_it_does_not_cover():
    """A bfloat16 Llama normalises in float32 outside its RMSNorm modules and computes its logits from the raw
    head weights (as transformers does): those parameters are read outside their taps, so they are not
    covered -- refused, naming them, never silently wrong."""
    from snapaudit_jax.dpsgd.ghost import book_keeping_clipped_sum, not_covered
    from snapaudit_jax.models.weights import cast_model

    tokens, mask = _data((2, 5))
    model = cast_model(CONFIGS["llama"](), jnp.bfloat16)
    assert not_covered(*nnx.split(model, nnx.Param, ...), jnp.asarray(tokens), jnp.asarray(mask)) == (
        "blocks.0.input_norm.scale", "blocks.0.post_norm.scale", "blocks.1.input_norm.scale",
        "blocks.1.post_norm.scale", "lm_head.kernel", "norm.scale")
    with pytest.raises(InputError, match=r"not covered: blocks\.0\.input_norm\.scale, .*lm_head\.kernel, norm\.scale"):
        book_keeping_clipped_sum(model, tokens, mask, clip_norm=1.0, trainable=nnx.Param)
    assert not_covered(*nnx.split(CONFIGS["llama"](), nnx.Param, ...), jnp.asarray(tokens), jnp.asarray(mask)) == ()


def test_a_parameter_shared_by_two_layers_is_not_covered():
    """Two LayerNorms holding one scale Variable: its gradient sums both layers' terms, so it is named as not
    covered rather than normed from one layer's term."""
    from snapaudit_jax.dpsgd.ghost import not_covered

    model = CONFIGS["gpt2"]()
    model.blocks[1].ln_1.scale = model.blocks[0].ln_1.scale
    tokens, mask = _data((2, 5))
    assert not_covered(*nnx.split(model, nnx.Param, ...), jnp.asarray(tokens), jnp.asarray(mask)) == (
        "blocks.0.ln_1.scale",)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "llama_tied_biased"])
def test_a_tied_embedding_needs_its_cross_term_and_every_repeated_token(kind):
    """The tied table's gradient is the lookup's rows plus the head's ``dl^T h``: its norm needs the cross term
    ``2 sum_{s,t} dl_t[x_s] (e_s . h_t)``, and the lookup's own norm every pair of positions holding the same
    token (not only ``s = t``). Power: without either, the norm misses the per-unit oracle."""
    from snapaudit_jax.dpsgd.ghost import _factors, _param_sq_norm, _term_sq_norm

    model = CONFIGS[kind]()
    tokens, mask = _data((3, 12), seed=7)
    tokens[:, 3] = tokens[:, 1]  # a repeated token in every row, both real where the row is long enough
    name = "wte.embedding" if kind == "gpt2" else "embed.embedding"
    want = _oracle(model, tokens, mask, every=True)[name]
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def norms(params, tokens, mask):
        terms = _factors(graphdef, params, rest, tokens, mask)[1][name]
        lookup = terms[0]
        return ([t.kind for t in terms] == ["lookup", "outer"], _param_sq_norm(terms, "ghost"),
                sum(_term_sq_norm(t, "ghost") for t in terms), _term_sq_norm(lookup, "ghost"),
                jnp.sum(jnp.square(lookup.g), axis=(1, 2)))  # the last: sum_s ||e_s||^2, the diagonal alone

    kinds, exact, without_cross, lookup, diagonal_only = norms(params, jnp.asarray(tokens), jnp.asarray(mask))
    assert kinds
    np.testing.assert_allclose(np.asarray(exact), want, rtol=1e-5)
    assert not np.allclose(np.asarray(without_cross), want, rtol=1e-2)
    assert not np.allclose(np.asarray(diagonal_only), np.asarray(lookup), rtol=1e-2)


@pytest.mark.slow
def test_a_unit_with_a_non_finite_gradient_adds_exactly_nothing():
    """One unit reads a token whose (frozen) embedding is NaN, so its loss, factors and norm are NaN: both fast
    paths give it ``c_i = 0`` and the others' sum unchanged, as jax_privacy's NaN-safe per-unit clipping does.
    Power: ``0 * NaN`` is NaN, so weighting the stored factors without masking the unit would poison every
    entry of the sum."""
    from snapaudit_jax.dpsgd.ghost import book_keeping_clipped_sum_traced, ghost_clipped_sum_traced
    from snapaudit_jax.dpsgd.gradients import clipped_grad_sum

    model = _lora_model("llama", ("q_proj", "v_proj", "down_proj"))  # untied: the head never reads the NaN row
    model.embed.embedding[...] = model.embed.embedding[...].at[7].set(jnp.nan)
    tokens, mask = _data((5, 8), seed=2)
    tokens = np.where(tokens == 7, 8, tokens)
    tokens[3, 1] = 7
    padding = np.zeros(5, bool)
    want = clipped_grad_sum(model, tokens, mask, clip_norm=0.5, padding=padding, trainable=nnx.LoRAParam)
    assert np.isnan(np.asarray(want.norms))[3] and np.isfinite(np.asarray(want.norms)).sum() == 4
    flat_want = {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(want.grad_sum)}
    graphdef, params, rest = nnx.split(model, nnx.LoRAParam, ...)
    args = (graphdef, params, rest, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(padding), jnp.float32(0.5))
    for fast in (book_keeping_clipped_sum_traced, ghost_clipped_sum_traced):
        got = jax.jit(fast, static_argnums=0)(*args)
        flat_got = {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(got.grad_sum)}
        for name, value in flat_want.items():
            assert np.isfinite(flat_got[name]).all(), (fast.__name__, name)
            np.testing.assert_allclose(flat_got[name], value, rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.slow  # 5.8 s from a cold compilation cache (three tracings of the patched forward): over the tier's limit
def test_an_embedding_called_directly_is_a_lookup(monkeypatch):
    """A model calling ``nnx.Embed`` itself (not through the decoders' ``_embed``): its tables are covered as
    lookups and their norms equal the per-unit gradients'; tables read outside their taps are named."""
    from snapaudit_jax.dpsgd.ghost import not_covered
    from snapaudit_jax.models import decoders

    model = CONFIGS["gpt2"]()
    tokens, mask = _data((4, 7), seed=3)
    tokens[:, 4] = tokens[:, 2]  # repeated tokens: the co-occurrence pairs count
    monkeypatch.setattr(decoders, "_embed", lambda embed, ids: embed(ids))
    assert not_covered(*nnx.split(model, nnx.Param, ...), jnp.asarray(tokens), jnp.asarray(mask)) == ()
    oracle = _oracle(model, tokens, mask, every=True)
    got = dense_sq_norms(model, tokens, mask, method="ghost")
    for name in ("wte.embedding", "wpe.embedding"):
        np.testing.assert_allclose(np.asarray(got.per_param[name]), oracle[name], rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(np.asarray(got.total), sum(oracle.values()), rtol=1e-5)
    # power: tables read outside their taps (their raw values, as a low-precision path would) are named
    # (other shapes: not_covered is cached on the shapes, and the patched forward must be traced anew)
    monkeypatch.setattr(decoders, "_embed", lambda embed, ids: jnp.take(embed.embedding[...], ids, axis=0))
    assert not_covered(*nnx.split(model, nnx.Param, ...), jnp.asarray(tokens[:, :6]), jnp.asarray(mask[:, :6])) == (
        "wpe.embedding", "wte.embedding")


def _biased_head_llama():
    """A Llama whose untied head has a bias (transformers' heads have none; the head's bias term is still
    covered, so it is tested on a model that has one)."""
    model = CONFIGS["llama"]()
    head = nnx.Linear(8, VOCAB, use_bias=True, rngs=nnx.Rngs(4))
    head.bias[...] = jnp.asarray(np.random.default_rng(8).standard_normal(VOCAB) * 0.5, jnp.float32)
    model.lm_head = head
    return model


SLICED = {"gpt2": lambda: CONFIGS["gpt2"](), "llama_biased_head": _biased_head_llama,
          "llama_tied_biased": lambda: CONFIGS["llama_tied_biased"]()}


@pytest.mark.slow
@pytest.mark.parametrize("kind, shape", [
    ("gpt2", (5, 9)),
    *[pytest.param(kind, shape) for kind, shape in [
        ("gpt2", (3, 2, 6)), ("llama_biased_head", (5, 9)), ("llama_biased_head", (3, 2, 6)),
        ("llama_tied_biased", (5, 9)), ("llama_tied_biased", (3, 2, 6))]]])
def test_a_vocabulary_sliced_head_gives_the_same_norms_and_clipped_sums(kind, shape):
    """With ``vocab_chunk`` (a slice that does not divide the vocabulary: a padded last slice) the head's terms
    come from its hidden states, targets and log-sum-exp alone: every parameter's per-unit norm equals the
    per-unit gradients' (whole logits), and the book-keeping and ghost clipped sums equal jax_privacy's
    per-unit clipped sum to 1e-5 (the tied table's cross term with the lookup included; the head's bias on a
    model that has one). Power: the whole-logits norms of the head's rows differ from the other parameters'."""
    from snapaudit_jax.dpsgd.ghost import book_keeping_clipped_sum
    from snapaudit_jax.dpsgd.gradients import clipped_grad_sum

    model = SLICED[kind]()
    tokens, mask = _data(shape, seed=11)
    oracle = _oracle(model, tokens, mask, every=True)
    got = dense_sq_norms(model, tokens, mask, vocab_chunk=8)
    assert set(got.per_param) == set(oracle)
    for name, want in oracle.items():
        np.testing.assert_allclose(np.asarray(got.per_param[name]), want, rtol=1e-5, atol=1e-12, err_msg=name)
    padding = np.zeros(shape[0], bool)
    padding[1] = True
    free = clipped_grad_sum(model, tokens, mask, clip_norm=np.inf)
    clip = float(np.median(np.asarray(free.norms)))
    want = clipped_grad_sum(model, tokens, mask, clip_norm=clip, padding=padding)
    flat_want = {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(want.grad_sum)}
    scale = max(float(np.abs(v).max()) for v in flat_want.values())
    for path in ("book_keeping", "ghost", "per_record"):
        out = clipped_grad_sum(model, tokens, mask, clip_norm=clip, padding=padding, method=path, vocab_chunk=8)
        np.testing.assert_allclose(np.asarray(out.norms), np.asarray(want.norms), rtol=1e-5, err_msg=path)
        flat = {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(out.grad_sum)}
        assert set(flat) == set(flat_want)
        for name, value in flat_want.items():
            np.testing.assert_allclose(flat[name], value, rtol=1e-5, atol=1e-6 * scale, err_msg=f"{path} {name}")
    direct = book_keeping_clipped_sum(model, tokens, mask, clip_norm=clip, padding=padding, trainable=nnx.Param,
                                      vocab_chunk=VOCAB)  # one slice
    np.testing.assert_allclose(np.asarray(direct.norms), np.asarray(want.norms), rtol=1e-5)
    assert (np.asarray(want.norms) > clip).any()


@pytest.mark.parametrize("kind, targets", [("gpt2", ()), pytest.param("llama", ("q_proj", "v_proj"),
                                                                      marks=pytest.mark.slow)])
def test_dp_lora_with_a_sliced_head_equals_the_per_unit_path(kind, targets):
    """DP-LoRA (the head does not train, so its tap forms no Gram): book-keeping with ``vocab_chunk`` equals the
    whole-logits per-unit clipped sum of the adapters to 1e-5, some units clipped."""
    from snapaudit_jax.dpsgd.gradients import clipped_grad_sum

    model = _lora_model(kind, targets)
    tokens, mask = _data((5, 9), seed=14)
    free = clipped_grad_sum(model, tokens, mask, clip_norm=np.inf, trainable=nnx.LoRAParam)
    clip = float(np.median(np.asarray(free.norms)))
    want = clipped_grad_sum(model, tokens, mask, clip_norm=clip, trainable=nnx.LoRAParam)
    got = clipped_grad_sum(model, tokens, mask, clip_norm=clip, trainable=nnx.LoRAParam, method="book_keeping",
                           vocab_chunk=8)
    np.testing.assert_allclose(np.asarray(got.norms), np.asarray(want.norms), rtol=1e-5)
    flat_want = {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(want.grad_sum)}
    flat_got = {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(got.grad_sum)}
    assert set(flat_got) == set(flat_want) and all("lora" in k for k in flat_want)
    scale = max(float(np.abs(v).max()) for v in flat_want.values())
    for name, value in flat_want.items():
        np.testing.assert_allclose(flat_got[name], value, rtol=1e-5, atol=1e-6 * scale, err_msg=name)
    assert (np.asarray(want.norms) > clip).any() and (np.asarray(want.norms) < clip).any()


@pytest.mark.slow
def test_the_sliced_heads_norm_needs_its_softmax_products_and_the_tied_cross_term(monkeypatch):
    """Power: the head's ``K_st`` without its ``p_s . p_t`` part, or the tied table without the lookup-head
    cross term, misses the per-unit oracle by far more than the tolerance."""
    from snapaudit_jax.dpsgd import ghost

    model = CONFIGS["gpt2"]()
    tokens, mask = _data((3, 9), seed=12)
    want = _oracle(model, tokens, mask, every=True)["wte.embedding"]
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def norm():  # traced afresh on each call, so a patched helper takes effect
        out = jax.jit(lambda p, t, m: ghost.dense_sq_norms_traced(graphdef, p, rest, t, m, vocab_chunk=8))(
            params, jnp.asarray(tokens), jnp.asarray(mask))
        return np.asarray(out.per_param["wte.embedding"])

    np.testing.assert_allclose(norm(), want, rtol=1e-5)
    real_probabilities, real_inner = ghost.slice_probabilities, ghost._softmax_inner
    monkeypatch.setattr(ghost, "slice_probabilities", lambda *a: 0.0 * real_probabilities(*a))
    assert not np.allclose(norm(), want, rtol=1e-2)
    monkeypatch.setattr(ghost, "slice_probabilities", real_probabilities)
    monkeypatch.setattr(ghost, "_softmax_inner",
                        lambda x, y: real_inner(x, y) if x.kind == y.kind else jnp.zeros(x.a.shape[0]))
    assert not np.allclose(norm(), want, rtol=1e-2)


def test_the_taps_head_returns_each_units_probability_gram_through_its_probe():
    """``_head_with_gram``: the gradient of the hidden states is the sliced head's; the probe's "cotangent" holds
    each unit's off-target products ``q_s . q_t`` and, last, the off-target masses ``1 - p_s[y_s]`` (here two
    units of two rows, against the whole softmax in float64)."""
    from snapaudit_jax.dpsgd.ghost import _head_with_gram
    from snapaudit_jax.models.vocab_head import target_logprobs

    rng = np.random.default_rng(13)
    hidden = jnp.asarray(rng.normal(size=(4, 5, 6)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(VOCAB, 6)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, VOCAB, (4, 5)), jnp.int32)
    probe = jnp.zeros((2, 10, 11), jnp.float32)
    got = jax.grad(lambda h: jnp.sum(_head_with_gram(h, probe, weight, None, targets, 8)[0]))(hidden)
    want = jax.grad(lambda h: jnp.sum(target_logprobs(h, weight, None, targets, 8)[0]))(hidden)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    packed = jax.grad(lambda p: jnp.sum(_head_with_gram(hidden, p, weight, None, targets, 8)[0]))(probe)
    logits = np.asarray(hidden, np.float64) @ np.asarray(weight, np.float64).T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    picked = np.take_along_axis(p, np.asarray(targets)[..., None], -1)[..., 0]
    q = np.where(np.arange(VOCAB) == np.asarray(targets)[..., None], 0.0, p).reshape(2, 10, VOCAB)
    np.testing.assert_allclose(packed[..., :10], np.einsum("bsv,btv->bst", q, q), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(packed[..., 10], (1.0 - picked).reshape(2, 10), rtol=1e-5)


def _confident_llama(bias: float):
    """A Llama whose biased head puts ``1 - exp(-bias)``-ish of its mass on token 5, and rows of token 5 (one 9):
    every target but one predicted with ``1 - p_y`` about ``36 e^-bias``."""
    model = _biased_head_llama()
    b = np.zeros(VOCAB, np.float32)
    b[5] = bias
    model.lm_head.bias[...] = jnp.asarray(b)
    tokens = np.full((3, 9), 5, np.int32)
    tokens[:, 0], tokens[1, 4] = 7, 9
    return model, tokens, np.ones((3, 9), bool)


def _head_oracle_float64(model, tokens, mask):
    """Each unit's gradient of the untied head's kernel and bias in float64 from the model's float32 hidden states:
    ``-(1 / count) sum_s (e_{y_s} - p_s) h_s^T`` with ``p`` the float64 softmax (every row's targets all real)."""
    from snapaudit_jax.models.layers import positions_from_mask

    hidden, _ = model(jnp.asarray(tokens), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))
    h = np.asarray(hidden, np.float64)[:, :-1]
    targets = tokens[:, 1:]
    logits = h @ np.asarray(model.lm_head.kernel[...], np.float64) + np.asarray(model.lm_head.bias[...], np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    d = -(np.eye(VOCAB)[targets] - p) / targets.shape[1]
    return np.einsum("bsi,bsv->biv", h, d), d.sum(1)


@pytest.mark.slow
def test_a_confident_heads_norms_and_sums_keep_their_precision_with_slices():
    """``1 - p_y`` near ``4e-6`` (head bias 16): with slices, the head's per-unit norms (kernel and bias) and the
    book-keeping sum of its gradients (no clipping) equal a float64 oracle to 1e-5, because the target's entry is
    taken apart (``m = sum_{v != y} p_v``). Power: the whole-logits path, which forms ``p_y - 1`` in float32,
    misses the same norms by over 0.1%, a hundred times the tolerance (by 0.38% to over 1%, as XLA's optimisation
    level fuses its softmax)."""
    from snapaudit_jax.dpsgd.ghost import book_keeping_clipped_sum

    model, tokens, mask = _confident_llama(16.0)
    kernel, bias = _head_oracle_float64(model, tokens, mask)
    want = {"lm_head.kernel": np.sum(kernel**2, axis=(1, 2)), "lm_head.bias": np.sum(bias**2, axis=1)}
    sliced = dense_sq_norms(model, tokens, mask, vocab_chunk=8)
    whole = dense_sq_norms(model, tokens, mask)
    for name, value in want.items():
        np.testing.assert_allclose(np.asarray(sliced.per_param[name]), value, rtol=1e-5, err_msg=name)
        assert np.max(np.abs(np.asarray(whole.per_param[name]) / value - 1)) > 1e-3, name
    out = book_keeping_clipped_sum(model, tokens, mask, clip_norm=1e9, trainable=nnx.Param, vocab_chunk=8)
    grads = {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(out.grad_sum)}
    for name, value in ((str(("lm_head", "kernel")), kernel.sum(0)), (str(("lm_head", "bias")), bias.sum(0))):
        assert np.linalg.norm(grads[name] - value) <= 1e-5 * np.linalg.norm(value), name


@pytest.mark.slow  # two float64 oracles and the sliced head's gradient: 5 s cold
def test_the_sliced_heads_gradient_keeps_its_precision_on_a_confident_model():
    """``target_logprobs``' custom VJP on the same confident head: the gradients of the summed target
    log-probabilities with respect to the head's rows and bias equal the float64 oracle to 1e-5 (L2)."""
    from snapaudit_jax.models.layers import positions_from_mask
    from snapaudit_jax.models.vocab_head import target_logprobs

    model, tokens, mask = _confident_llama(16.0)
    hidden, _ = model(jnp.asarray(tokens), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))
    kernel, bias = _head_oracle_float64(model, tokens, mask)
    weight, b = model.lm_head.kernel[...].T, model.lm_head.bias[...]
    scale = -1.0 / (tokens.shape[1] - 1)  # the oracle's loss: the mean negative log-likelihood of each row
    dw, db = jax.grad(lambda w, c: scale * jnp.sum(target_logprobs(hidden[:, :-1], w, c, jnp.asarray(tokens[:, 1:]),
                                                                   8)[0]), (0, 1))(weight, b)
    assert np.linalg.norm(np.asarray(dw).T - kernel.sum(0)) <= 1e-5 * np.linalg.norm(kernel.sum(0))
    assert np.linalg.norm(np.asarray(db) - bias.sum(0)) <= 1e-5 * np.linalg.norm(bias.sum(0))
