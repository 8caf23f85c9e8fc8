"""snapaudit_jax.models.flops: matrix-product operations counted from the jaxpr, against closed forms."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from snapaudit_jax.dpsgd import sequence_losses
from snapaudit_jax.models import GPT2, GPT2Config, Llama, LlamaConfig, count_matmul_flops
from snapaudit_jax.models.decoders import stack_layers
from snapaudit_jax.models.flops import jaxpr_matmul_flops
from snapaudit_jax.utils.errors import InputError


def _shape(*dims, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(dims, dtype)


def test_a_product_counts_two_operations_per_multiply_add_split_by_operand_dtype():
    x, w = _shape(3, 5, 7), _shape(7, 11)
    assert count_matmul_flops(lambda x, w: x @ w, x, w) == (2 * 3 * 5 * 7 * 11, {"float32": 2 * 3 * 5 * 7 * 11}, 1)
    # batch dimensions multiply, contracting ones count once
    a, b = _shape(4, 6, 9, 8), _shape(4, 6, 8, 10)
    assert count_matmul_flops(lambda a, b: jnp.einsum("hbik,hbkj->hbij", a, b), a, b).total == 2 * 4 * 6 * 9 * 8 * 10
    low = count_matmul_flops(lambda x, w: jnp.matmul(x, w, preferred_element_type=jnp.float32),
                             _shape(3, 7, dtype=jnp.bfloat16), _shape(7, 11, dtype=jnp.bfloat16))
    assert low.by_operands == {"bfloat16": 2 * 3 * 7 * 11}
    mixed = count_matmul_flops(lambda x, w: jax.lax.dot(x, w, preferred_element_type=jnp.float32),
                               _shape(3, 7, dtype=jnp.bfloat16), _shape(7, 11))
    assert mixed.by_operands == {"bfloat16*float32": 2 * 3 * 7 * 11}
    # the precision a product asks for, by argument or by a default set around the trace: an accelerator's rate
    # differs (full float32 runs without its matrix units)
    def square(x, **kw):
        return jnp.dot(x, x.T, **kw)

    rows = _shape(3, 7)
    assert count_matmul_flops(square, rows, precision="highest").by_operands == {"float32@highest": 2 * 3 * 3 * 7}
    assert count_matmul_flops(square, rows, precision=("default", "high")).by_operands == {"float32@high": 126}
    assert count_matmul_flops(square, rows, precision=jax.lax.DotAlgorithmPreset.BF16_BF16_F32).by_operands == {
        "float32@bf16_bf16_f32": 126}
    with jax.default_matmul_precision("highest"):
        assert count_matmul_flops(square, rows).by_operands == {"float32@highest": 126}
    assert count_matmul_flops(square, rows).by_operands == {"float32": 126}
    # element-wise work is not counted
    assert count_matmul_flops(lambda x: jnp.tanh(x) * 2 + jnp.sum(x), x) == (0, {}, 0)


def test_a_gradient_counts_the_products_it_needs_and_no_dead_forward():
    x, w = _shape(32, 16, 24), _shape(24, 40)
    one = 2 * 32 * 16 * 24 * 40

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w))

    assert count_matmul_flops(jax.grad(loss), w, x).total == 2 * one  # the forward (tanh needs it) and dW
    assert count_matmul_flops(jax.grad(loss, argnums=(0, 1)), w, x).total == 3 * one  # and dx
    assert count_matmul_flops(jax.grad(lambda w, x: jnp.sum(x @ w)), w, x).total == one  # the forward is dead code
    # per-example gradients under vmap: the same operations as the batch's
    per_example = jax.vmap(jax.grad(loss), in_axes=(None, 0))
    assert count_matmul_flops(per_example, w, x).total == 2 * one


def test_loops_count_what_they_execute():
    x, w = _shape(6, 8), _shape(8, 8)
    one = 2 * 6 * 8 * 8

    def scanned(x, w):
        return jax.lax.scan(lambda c, _: (c @ w, None), x, None, length=5)[0]

    assert count_matmul_flops(scanned, x, w) == (5 * one, {"float32": 5 * one}, 5)
    assert count_matmul_flops(lambda x, w: jax.lax.fori_loop(0, 7, lambda i, c: c @ w, x), x, w).total == 7 * one
    nested = count_matmul_flops(lambda x, w: jax.lax.scan(lambda c, _: (scanned(c, w), None), x, None, length=3)[0],
                                x, w)
    assert nested.total == 15 * one and nested.products == 15
    assert count_matmul_flops(jax.jit(scanned), x, w).total == 5 * one  # a nested jit once
    assert count_matmul_flops(jax.checkpoint(scanned), x, w).total == 5 * one
    assert count_matmul_flops(lambda xs, w: jax.lax.map(lambda r: r @ w, xs), _shape(9, 6, 8), w).total == 9 * one

    def branches(x, w):  # the costliest branch: an upper bound where they differ
        return jax.lax.cond(jnp.sum(x) > 0, lambda x: (x @ w) @ w, lambda x: x @ w, x)

    assert count_matmul_flops(branches, x, w) == (2 * one, {"float32": 2 * one}, 2)


def test_what_cannot_be_counted_is_refused_by_name():
    x, w = _shape(6, 8), _shape(8, 8)

    def until(x, w):
        return jax.lax.while_loop(lambda c: jnp.sum(c) < 1e3, lambda c: c @ w, x)

    with pytest.raises(InputError, match="'while'.*traced number of times"):
        count_matmul_flops(until, x, w)
    with pytest.raises(InputError, match="'while'"):  # inside a scan, too
        count_matmul_flops(lambda x, w: jax.lax.scan(lambda c, _: (until(c, w), None), x, None, length=2)[0], x, w)
    with pytest.raises(InputError, match="'while'"):  # a loop whose bound is traced
        count_matmul_flops(lambda x, w, n: jax.lax.fori_loop(0, n, lambda i, c: c @ w, x), x, w,
                           _shape(dtype=jnp.int32))
    conv = lambda x, k: jax.lax.conv_general_dilated(x, k, (1,), "SAME")  # noqa: E731
    with pytest.raises(InputError, match="'conv_general_dilated'"):
        count_matmul_flops(conv, _shape(1, 2, 9), _shape(3, 2, 3))
    with pytest.raises(InputError, match="fn must be callable, got int"):
        count_matmul_flops(3)
    with pytest.raises(InputError, match="jaxpr must be a jaxpr"):
        jaxpr_matmul_flops("not a jaxpr")


def _gpt2_backbone(batch, length, d, layers, ff):
    """Every block: Q/K/V and the output projection, the scores and their weighted values, the MLP's two."""
    rows = batch * length
    return layers * (2 * rows * d * 3 * d + 2 * 2 * batch * length * length * d + 2 * rows * d * d
                     + 2 * 2 * rows * d * ff)


@pytest.mark.parametrize("stacked", [False, True])
def test_gpt2_forward_and_training_gradient_match_the_closed_form(stacked):
    batch, length, d, layers, heads, vocab = 3, 16, 64, 3, 4, 97
    model = GPT2(GPT2Config(vocab_size=vocab, n_positions=length, n_embd=d, n_layer=layers, n_head=heads,
                            n_inner=4 * d), rngs=nnx.Rngs(0))
    model = stack_layers(model) if stacked else model  # power: a scan counted once would give a third
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens, mask = _shape(batch, length, dtype=jnp.int32), _shape(batch, length, dtype=jnp.bool_)
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    backbone = _gpt2_backbone(batch, length, d, layers, 4 * d)
    keys = jnp.ones((batch, length), bool)
    hidden = count_matmul_flops(lambda p, t: nnx.merge(graphdef, p, rest)(t, positions, keys), params, tokens)
    assert hidden.total == backbone
    # the next-token loss: the tied head on the L - 1 positions with a target; its gradient (every parameter)
    # takes each product's two cotangent products, except that the token ids have none
    head = 2 * batch * (length - 1) * d * vocab

    def loss(p, t, m):
        return jnp.sum(sequence_losses(nnx.merge(graphdef, p, rest), t, m))

    assert count_matmul_flops(jax.value_and_grad(loss), params, tokens, mask).total == 3 * (backbone + head)
    # the head a slice of all V rows at a time: the logits formed once more in its backward pass
    sliced = count_matmul_flops(jax.value_and_grad(lambda p, t, m: jnp.sum(sequence_losses(
        nnx.merge(graphdef, p, rest), t, m, vocab_chunk=vocab))), params, tokens, mask)
    assert sliced.total == 3 * backbone + 4 * head


def test_llama_with_grouped_query_attention_matches_the_closed_form():
    batch, length, d, layers, heads, kv, head_dim, ff, vocab = 2, 12, 48, 2, 6, 2, 8, 80, 101
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=ff, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                      max_position_embeddings=length, tie_word_embeddings=False)
    model = Llama(cfg, rngs=nnx.Rngs(0))
    rows, width = batch * length, heads * head_dim
    block = (2 * rows * d * width + 2 * 2 * rows * d * kv * head_dim + 2 * 2 * batch * length * length * width
             + 2 * rows * width * d + 3 * 2 * rows * d * ff)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p, t, m):
        return jnp.sum(sequence_losses(nnx.merge(graphdef, p, rest), t, m))

    count = count_matmul_flops(jax.value_and_grad(loss), params, _shape(batch, length, dtype=jnp.int32),
                               _shape(batch, length, dtype=jnp.bool_))
    assert count.total == 3 * (layers * block + 2 * batch * (length - 1) * d * vocab)
