"""LoRA adapters and the DP-SGD step they train: base bitwise unchanged, adapters move, user-level clipping,
GPT-2 position-embedding per-record gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from snapaudit_jax.dpsgd import DPSGDConfig, clipped_grad_sum, sequence_losses, train
from snapaudit_jax.finetune.lora import TRAINABLE, LoRAConfig, LoRAProjection, apply_lora, lora_adapters, merge_lora
from snapaudit_jax.models.config import GPT2Config, LlamaConfig
from snapaudit_jax.models.decoders import GPT2, Llama
from snapaudit_jax.utils.errors import InputError

LLAMA = LlamaConfig(vocab_size=53, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=4)
GPT = GPT2Config(vocab_size=53, n_positions=16, n_embd=16, n_layer=2, n_head=2, n_inner=32)


def _logits(model, tokens):
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    hidden, _ = model(tokens, positions, jnp.ones(tokens.shape, bool))
    return model.logits(hidden)


def _tokens(seed=0, shape=(3, 11)):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 53, shape), jnp.int32)


@pytest.mark.slow
@pytest.mark.parametrize("cls, cfg, targets", [
    (Llama, LLAMA, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    (Llama, LLAMA, ("v_proj", "up_proj")),
    (GPT2, GPT, ("c_attn", "attn.c_proj", "c_fc", "mlp.c_proj")),
])
def test_adapters_start_at_the_base_and_merge_exactly(cls, cfg, targets):
    base = cls(cfg, nnx.Rngs(0))
    tokens = _tokens()
    before = _logits(base, tokens)
    model = apply_lora(nnx.clone(base), LoRAConfig(rank=2, alpha=4.0, targets=targets), key=jax.random.key(1))
    np.testing.assert_array_equal(_logits(model, tokens), before)  # B = 0: exactly the base
    adapters = lora_adapters(model)
    assert {name for _, name in adapters} == set(targets) and len(adapters) == len(targets) * cfg_layers(cfg)
    rng = np.random.default_rng(2)
    for block in model.blocks:
        for value in vars(block).values():
            if isinstance(value, LoRAProjection):
                for b in value.lora_b:
                    b[...] = jnp.asarray(rng.normal(size=b.shape), jnp.float32)
    adapted = _logits(model, tokens)
    assert float(jnp.abs(adapted - before).max()) > 1e-2
    merged = merge_lora(model)
    assert not lora_adapters(merged)
    np.testing.assert_allclose(_logits(merged, tokens), adapted, rtol=1e-5, atol=1e-5)
    # Oracle for every adapter of block 0: it adds scale * x A B (NumPy float64) to exactly the output columns
    # of its Hugging Face projection (written out by hand below), and nothing to the others.
    for (i, name), (a, b, scale) in adapters.items():
        if i != 0:
            continue
        assert scale == 2.0 and a.shape[1] == 2 and b.shape[0] == 2
        attr, start, stop, width = HAND_SLICES[cls][name]
        proj = getattr(model.blocks[0], attr)
        xs = np.random.default_rng(4).normal(size=(5, width))
        got = np.asarray(proj(jnp.asarray(xs, jnp.float32)) - proj.base(jnp.asarray(xs, jnp.float32)), np.float64)
        own = {n: HAND_SLICES[cls][n][1:3] for n in proj.names}
        expected = np.zeros_like(got)
        for j, n in enumerate(proj.names):
            s0, s1 = own[n]
            expected[:, s0:s1] += 2.0 * xs @ np.asarray(proj.lora_a[j][...], np.float64) @ np.asarray(
                proj.lora_b[j][...], np.float64)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        assert np.abs(got[:, start:stop]).max() > 1e-3


# (module attribute, first output column, end column, input width) of each Hugging Face projection in our fused
# modules for LLAMA and GPT below, written out by hand: qkv_proj = [q | k | v], gate_up_proj = [gate | up].
HAND_SLICES = {
    Llama: {
        "q_proj": ("qkv_proj", 0, 16, 16),
        "k_proj": ("qkv_proj", 16, 24, 16),
        "v_proj": ("qkv_proj", 24, 32, 16),
        "o_proj": ("o_proj", 0, 16, 16),
        "gate_proj": ("gate_up_proj", 0, 24, 16),
        "up_proj": ("gate_up_proj", 24, 48, 16),
        "down_proj": ("down_proj", 0, 16, 24),
    },
    GPT2: {
        "c_attn": ("c_attn", 0, 48, 16),
        "attn.c_proj": ("attn_proj", 0, 16, 16),
        "c_fc": ("c_fc", 0, 32, 16),
        "mlp.c_proj": ("mlp_proj", 0, 16, 32),
    },
}


def cfg_layers(cfg):
    return getattr(cfg, "num_hidden_layers", None) or cfg.n_layer


def test_lora_config_errors_name_the_rule():
    with pytest.raises(InputError, match=r"rank must be <= the width 8 of the targeted projection 'k_proj', got 9"):
        LoRAConfig(rank=9, targets=("k_proj",)).resolved_targets(LLAMA)
    with pytest.raises(InputError, match=r"targets must be projections of a gpt2 model .*got 'q_proj'"):
        LoRAConfig(targets=("q_proj",)).resolved_targets(GPT)
    with pytest.raises(InputError, match="rank must be an integer >= 1"):
        LoRAConfig(rank=0)
    model = apply_lora(Llama(LLAMA, nnx.Rngs(0)), LoRAConfig(rank=2), key=jax.random.key(0))
    with pytest.raises(InputError, match="already has LoRA adapters"):
        apply_lora(model, LoRAConfig(rank=2), key=jax.random.key(0))


def _leaves(model, filt):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, filt))]


@pytest.mark.slow
@pytest.mark.parametrize("private", [False, True])
def test_lora_training_moves_only_the_adapters_and_the_loss_falls(private):
    model = apply_lora(Llama(LLAMA, nnx.Rngs(0)), LoRAConfig(rank=4, alpha=8.0), key=jax.random.key(1))
    tokens = np.tile(np.asarray(_tokens(3, (1, 12))), (24, 1))  # one sequence to learn, 24 copies
    mask = np.ones_like(tokens, bool)
    extra = dict(clip_norm=10.0, noise_multiplier=0.5, delta=1e-3) if private else dict(non_private=True)
    config = DPSGDConfig(steps=20, learning_rate=3e-2, batch_size=6, optimizer="adam", **extra)
    base_before = _leaves(model, nnx.Not(TRAINABLE))
    adapters_before = _leaves(model, TRAINABLE)
    trained, history, report = train(model, (tokens, mask), config, key=jax.random.key(5), trainable=TRAINABLE)
    for x, y in zip(base_before, _leaves(trained, nnx.Not(TRAINABLE)), strict=True):
        np.testing.assert_array_equal(x, y)  # the base stays bitwise unchanged
    moved = [float(np.abs(x - y).max()) for x, y in zip(adapters_before, _leaves(trained, TRAINABLE), strict=True)]
    assert min(moved) > 1e-4  # every A and every B moved (B starts at 0, A only after B has moved)
    first = float(np.mean(history["loss"][:3]))
    last = float(np.mean(history["loss"][-3:]))
    assert last < first - 0.3, (first, last)
    assert report.dp is private


def test_trainable_must_select_parameters():
    model = Llama(LLAMA, nnx.Rngs(0))
    tokens = np.asarray(_tokens(0, (4, 6)))
    with pytest.raises(InputError, match="trainable must select at least one parameter"):
        train(model, (tokens, np.ones_like(tokens, bool)), DPSGDConfig(steps=1, learning_rate=0.1, batch_size=1,
                                                                        non_private=True), trainable=TRAINABLE)


@pytest.mark.slow
def test_user_level_units_are_summed_then_clipped_together():
    """The clipped sum of (B, k, L) units equals clip(sum of the unit's per-record gradients), summed over units."""
    model = Llama(LLAMA, nnx.Rngs(0))
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, 53, (3, 2, 9)).astype(np.int32)
    mask = np.ones(tokens.shape, bool)
    mask[1, 1] = False  # unit 1 has one record (the empty row is padding)
    mask[2, 0, 6:] = False
    clip = 0.5
    out = clipped_grad_sum(model, tokens, mask, clip_norm=clip)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def record_loss(p, t, m):
        return jnp.sum(sequence_losses(nnx.merge(graphdef, p, rest), t[None], m[None]))

    grad = jax.jit(jax.grad(record_loss))
    expected = jax.tree.map(jnp.zeros_like, params)
    norms = []
    for i in range(3):
        g = jax.tree.map(jnp.zeros_like, params)
        for j in range(2):
            if mask[i, j].any():
                g = jax.tree.map(jnp.add, g, grad(params, tokens[i, j], mask[i, j]))
        norm = float(jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(g))))
        norms.append(norm)
        expected = jax.tree.map(lambda e, x, n=norm: e + x * min(1.0, clip / n), expected, g)
    np.testing.assert_allclose(np.asarray(out.norms), norms, rtol=1e-5)
    for x, y in zip(jax.tree.leaves(out.grad_sum), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)
    # Power: clipping each record separately (group privacy by per-record clipping) is a different sum.
    per_record = clipped_grad_sum(model, tokens.reshape(6, 9), mask.reshape(6, 9), clip_norm=clip,
                                  padding=~mask.reshape(6, 9).any(axis=1))
    gap = max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(per_record.grad_sum),
                                                          jax.tree.leaves(out.grad_sum)))
    assert gap > 1e-3


@pytest.mark.slow
def test_gpt2_position_embedding_per_record_gradients_are_each_records_own():
    """Records of different lengths: each one's wpe gradient (vmapped path) equals its gradient computed alone."""
    model = GPT2(GPT, nnx.Rngs(0))
    rng = np.random.default_rng(6)
    tokens = rng.integers(0, 53, (3, 10)).astype(np.int32)
    mask = np.ones(tokens.shape, bool)
    mask[0, 4:] = False
    mask[1, 7:] = False
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p, t, m):
        return jnp.sum(sequence_losses(nnx.merge(graphdef, p, rest), t, m))

    grad = jax.jit(jax.grad(loss))
    total = jax.tree.map(jnp.zeros_like, params)
    for i in range(3):
        one = grad(params, tokens[i:i + 1], mask[i:i + 1])
        alone = clipped_grad_sum(model, tokens[i:i + 1], mask[i:i + 1], clip_norm=float("inf"))
        np.testing.assert_allclose(np.asarray(alone.grad_sum["wpe"]["embedding"][...]),
                                   np.asarray(one["wpe"]["embedding"][...]), rtol=1e-5, atol=1e-7)
        # positions past a record's end get no gradient from it
        length = int(mask[i].sum())
        assert float(jnp.abs(one["wpe"]["embedding"][...][length:]).max()) == 0.0
        total = jax.tree.map(jnp.add, total, one)
    together = clipped_grad_sum(model, tokens, mask, clip_norm=float("inf"))
    np.testing.assert_allclose(np.asarray(together.grad_sum["wpe"]["embedding"][...]),
                               np.asarray(total["wpe"]["embedding"][...]), rtol=1e-5, atol=1e-6)
