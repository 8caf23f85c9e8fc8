"""bfloat16 inference of the Flax decoders against transformers' PyTorch models in bfloat16 (the oracle).

A tiny random Llama (grouped-query attention: 6 query and 2 key/value heads, an untied head, Llama-3 RoPE
scaling) and a tiny GPT-2 are built by transformers in bfloat16, with random norm weights (all-ones norms
would hide where a norm's scale is applied). Our models take the same weights: through NumPy (bfloat16 ->
float32 -> bfloat16 is exact) or through DLPack (no copy). A float32 copy of the same weights in torch is the
exact reference.

Tolerances. bfloat16 keeps 8 significant bits (unit roundoff ``u = 2**-8``), so two bfloat16 implementations
that round at different points differ per operation by ``O(u)`` relative, and their logits differ by about
as much as either differs from float32 (here ~0.004 rms, up to ~0.05, on logits up to ~3). The tolerance is
therefore transformers' own bfloat16 error, measured in the test: with ``e = torch_bf16 - torch_f32`` and
``d = ours - torch_bf16`` over the ~320 real positions of a left-padded batch,

* ``rms(d) <= 1.25 rms(e)``: ours rounds where transformers rounds. Measured over 4 model seeds: Llama
  0.99-1.09, GPT-2 1.13-1.16 (XLA evaluates GPT-2's tanh-GELU without rounding each step, so ours is closer to
  float32 there), and 1.37-1.43 with the RMSNorm statistics in bfloat16 (no float32 upcast);
* ``rms(ours - torch_f32) <= 1.1 rms(e)``: ours is as accurate as transformers' bfloat16 (measured 0.86-1.02;
  1.09-1.16 without the upcast);
* ``max |d| <= 2.5 max |e|``: no outlier (measured at most 1.1).

The RMSNorm itself is checked bit for bit against ``LlamaRMSNorm`` (which also catches an RMSNorm that applies
its scale before rounding, as Flax's does). Greedy tokens are compared only over the
steps where the float32 model's top-2 logit gap is at least ``MARGIN = 0.1``, more than twice the largest
bfloat16 logit error of either implementation (asserted), so a tie cannot flip them; the prompts are chosen
so that these steps are at least half of all steps (asserted). Everything is deterministic (fixed seeds): no
test here has a false-failure probability.
"""

from __future__ import annotations

from tests.helpers.batches import left_padded

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from flax import nnx  # noqa: E402

from snapaudit_jax.models import Greedy, cast_model, decode  # noqa: E402
from snapaudit_jax.models import decoders  # noqa: E402
from snapaudit_jax.models.config import config_from_hf  # noqa: E402
from snapaudit_jax.models.decoders import empty_cache  # noqa: E402
from snapaudit_jax.models.layers import positions_from_mask  # noqa: E402
from snapaudit_jax.models.weights import build_model  # noqa: E402
from snapaudit_jax.utils.errors import InputError  # noqa: E402

VOCAB = 97
LENGTHS = (61, 53, 47, 41, 37, 29, 23, 17, 11, 5)  # left-padded batch; > 16 = the llama3 original context
RMS_RATIO = 1.25
ACCURACY_RATIO = 1.1
MAX_RATIO = 2.5
MARGIN = 0.1
STEPS = 8

_CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=67, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rope_theta=5e5, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16},
        bos_token_id=None, eos_token_id=None, pad_token_id=0, initializer_range=0.1,
    ),
    "gpt2": lambda: transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=None, eos_token_id=None,
        pad_token_id=0, initializer_range=0.1,
    ),
}


def _torch_models(name: str, seed: int = 0):
    """``(bf16 model, float32 model with the same weights, HF config)``; norm weights are random."""
    cfg = _CONFIGS[name]()
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or ".ln_" in pname:
                p.copy_((p.float() + 0.2 * torch.randn_like(p, dtype=torch.float32)).to(p.dtype))
    ref = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    return model, ref, cfg


def _numpy_tensors(model) -> dict:
    return {k: v.float().numpy() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def tiny():
    """``name -> (bf16 torch model, float32 torch model, our bf16 model)`` for llama and gpt2."""
    out = {}
    for name in _CONFIGS:
        model, ref, cfg = _torch_models(name)
        ours = build_model(config_from_hf(cfg.to_dict()), _numpy_tensors(model).get, name, dtype=jnp.bfloat16)
        out[name] = (model, ref, ours)
    return out


def _batch(lengths=LENGTHS, seed=1):
    return left_padded(lengths, seed, VOCAB)


def _torch_logits(model, ids, mask) -> np.ndarray:
    pos = np.where(mask, np.cumsum(mask, -1) - 1, 1)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=torch.tensor(pos))
    return out.logits.double().numpy()


def _our_forward(module, ids, mask):
    """``(hidden, logits)`` of a fresh jitted forward (traced anew: a patched helper takes effect)."""
    graphdef, state = nnx.split(module)

    @jax.jit
    def forward(state, tokens, mask):
        model = nnx.merge(graphdef, state)
        hidden, _ = model(tokens, positions_from_mask(mask), mask)
        return hidden, model.logits(hidden)

    return forward(state, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, bool))


def _errors(hf_bf16, hf_f32, module) -> dict:
    """Error statistics of our logits and transformers' bfloat16 logits, both against float32."""
    ids, mask = _batch()
    real = mask.astype(bool)
    _, logits = _our_forward(module, ids, mask)
    ours = np.asarray(logits, np.float64)[real]
    t16, t32 = _torch_logits(hf_bf16, ids, mask)[real], _torch_logits(hf_f32, ids, mask)[real]
    rms = lambda x: float(np.sqrt(np.mean(np.square(x))))  # noqa: E731
    e, d = t16 - t32, ours - t16
    return {"rms_ratio": rms(d) / rms(e), "accuracy_ratio": rms(ours - t32) / rms(e),
            "max_ratio": float(np.abs(d).max() / np.abs(e).max()), "torch_bf16_max_error": float(np.abs(e).max()),
            "ours_max_error": float(np.abs(ours - t32).max())}


def _parity_ok(stats: dict) -> bool:
    return (stats["rms_ratio"] <= RMS_RATIO and stats["accuracy_ratio"] <= ACCURACY_RATIO
            and stats["max_ratio"] <= MAX_RATIO)


# ---------------------------------------------------------------------------
# Forward parity
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_bf16_logits_match_transformers_bf16(tiny, name):
    hf_bf16, hf_f32, ours = tiny[name]
    assert ours.dtype == jnp.bfloat16
    hidden, logits = _our_forward(ours, *_batch())
    assert hidden.dtype == jnp.bfloat16 and logits.dtype == jnp.float32
    stats = _errors(hf_bf16, hf_f32, ours)
    assert _parity_ok(stats), stats


def _bf16_rms_norm(norm, x):
    """The mistake the power check must catch: RMSNorm statistics in bfloat16 (no float32 upcast)."""
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    return norm.scale[...] * (x * jax.lax.rsqrt(ms + jnp.asarray(norm.epsilon, x.dtype)))


def _scale_before_rounding(norm, x):
    """Another mistake: Flax's RMSNorm, which scales in float32 and rounds once (LlamaRMSNorm rounds, then scales)."""
    return norm(x)


def test_rms_norm_is_bitwise_llama_rms_norm(tiny):
    """The upcast RMSNorm equals transformers' ``LlamaRMSNorm`` bit for bit on bfloat16 inputs."""
    hf_bf16, _, ours = tiny["llama"]
    x = (torch.randn(5, 31, 48, generator=torch.Generator().manual_seed(2)) * 3).to(torch.bfloat16)
    with torch.no_grad():
        expected = hf_bf16.model.norm(x).float().numpy()
    xj = jnp.asarray(x.float().numpy(), jnp.bfloat16)
    got = np.asarray(jax.jit(lambda x: decoders._rms_norm(ours.norm, x))(xj), np.float32)
    assert np.array_equal(got, expected)
    for wrong in (_bf16_rms_norm, _scale_before_rounding):  # power: each variant differs in many entries
        other = np.asarray(jax.jit(lambda x, wrong=wrong: wrong(ours.norm, x))(xj), np.float32)
        assert np.mean(other != expected) > 0.1


def test_power_rms_norm_without_upcast_fails_the_parity_check(tiny, monkeypatch):
    """The model-level check catches bfloat16 RMSNorm statistics (the scale-before-rounding variant, slightly
    more accurate than transformers, is caught by the bitwise test above only)."""
    hf_bf16, hf_f32, ours = tiny["llama"]
    monkeypatch.setattr(decoders, "_rms_norm", _bf16_rms_norm)
    stats = _errors(hf_bf16, hf_f32, ours)
    assert stats["rms_ratio"] > RMS_RATIO, stats


def test_power_unshared_weight_fails_the_parity_check(tiny):
    """One tensor taken from another random model (weights not shared) is caught."""
    hf_bf16, hf_f32, _ = tiny["llama"]
    tensors = _numpy_tensors(hf_bf16)
    other, _, cfg = _torch_models("llama", seed=1)
    name = "model.layers.1.self_attn.v_proj.weight"
    tensors[name] = other.state_dict()[name].float().numpy()
    wrong = build_model(config_from_hf(cfg.to_dict()), tensors.get, "mixed", dtype=jnp.bfloat16)
    stats = _errors(hf_bf16, hf_f32, wrong)
    assert not _parity_ok(stats) and stats["rms_ratio"] > 3, stats


# ---------------------------------------------------------------------------
# Greedy decoding, KV cache, float32
# ---------------------------------------------------------------------------


def _torch_generate(model, ids, mask):
    """``(tokens, top-2 gaps)``, each ``(B, STEPS)``: greedy continuation and the margin of every choice."""
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=STEPS,
                             min_new_tokens=STEPS, do_sample=False, pad_token_id=0, output_scores=True,
                             return_dict_in_generate=True)
    top2 = torch.stack(out.scores, 1).float().topk(2, dim=-1).values.numpy()
    return out.sequences[:, ids.shape[1]:].numpy(), top2[..., 0] - top2[..., 1]


# Prompt seeds whose greedy paths have a clear winner (margin >= MARGIN) at most steps; asserted below.
@pytest.mark.slow
@pytest.mark.parametrize("name,seed", [("llama", 3), ("gpt2", 2)])
def test_bf16_greedy_decode_matches_transformers(tiny, name, seed):
    hf_bf16, hf_f32, ours = tiny[name]
    ids, mask = _batch((17, 13, 11, 7, 5, 3), seed=seed)
    t32, margin = _torch_generate(hf_f32, ids, mask)
    t16, _ = _torch_generate(hf_bf16, ids, mask)
    got = np.asarray(decode(ours, ids, mask.astype(bool), Greedy(), max_new_tokens=STEPS))
    # Margins are meaningful only if both bf16 models' logits stay within MARGIN / 2 of float32 along this path.
    full, full_mask = np.concatenate([ids, t32], 1), np.concatenate([mask, np.ones_like(t32)], 1)
    _, logits = _our_forward(ours, full, full_mask)
    steps = slice(ids.shape[1] - 1, full.shape[1] - 1)
    reference = _torch_logits(hf_f32, full, full_mask)[:, steps]
    assert np.abs(np.asarray(logits, np.float64)[:, steps] - reference).max() < MARGIN / 2
    assert np.abs(_torch_logits(hf_bf16, full, full_mask)[:, steps] - reference).max() < MARGIN / 2
    protected = np.cumprod(margin >= MARGIN, axis=1).astype(bool)  # leading steps with a clear winner
    assert protected.sum() >= protected.size / 2, margin
    assert np.array_equal(got[protected], t32[protected])
    assert np.array_equal(t16[protected], t32[protected])


def test_bf16_kv_cache_and_float32_unchanged(tiny):
    hf_bf16, hf_f32, ours = tiny["llama"]
    cache = empty_cache(ours, 2, 5)
    assert all(c.k.dtype == c.v.dtype == jnp.bfloat16 for c in cache)
    tokens, mask = jnp.ones((2, 3), jnp.int32), jnp.ones((2, 3), bool)
    slots = jnp.zeros((2, 5), bool).at[:, :3].set(True)
    hidden, new = jax.eval_shape(lambda m: m(tokens, positions_from_mask(mask), slots, cache=cache, index=0), ours)
    assert hidden.dtype == jnp.bfloat16 and all(c.k.dtype == jnp.bfloat16 for c in new)

    # The same weights in float32: a float32 cache, float32 activations, and the float32 parity of test_models.
    f32 = cast_model(ours, jnp.float32)
    built = build_model(ours.cfg, _numpy_tensors(hf_f32).get, "f32")
    assert f32.dtype == built.dtype == jnp.float32
    assert all(c.k.dtype == jnp.float32 for c in empty_cache(f32, 2, 5))
    ids, mask = _batch()
    a, b = _our_forward(f32, ids, mask)[1], _our_forward(built, ids, mask)[1]
    assert np.array_equal(np.asarray(a), np.asarray(b))
    real = mask.astype(bool)
    assert np.abs(np.asarray(a, np.float64) - _torch_logits(hf_f32, ids, mask))[real].max() <= 1e-4


@pytest.mark.slow
def test_build_model_takes_device_arrays_without_copy(tiny):
    """DLPack tensors stay on their device: untransposed parameters alias torch's memory, and the model equals
    the one built from NumPy copies of the same weights."""
    hf_bf16, _, ours = tiny["llama"]
    state = hf_bf16.state_dict()
    shared = {k: jax.dlpack.from_dlpack(v.detach()) for k, v in state.items()}
    model = build_model(ours.cfg, shared.get, "dlpack", dtype=jnp.bfloat16)
    assert model.embed.embedding[...].unsafe_buffer_pointer() == state["model.embed_tokens.weight"].data_ptr()
    assert model.norm.scale[...].unsafe_buffer_pointer() == state["model.norm.weight"].data_ptr()
    assert model.blocks[0].qkv_proj.kernel[...].dtype == jnp.bfloat16
    ids, mask = _batch()
    assert np.array_equal(np.asarray(_our_forward(model, ids, mask)[1]), np.asarray(_our_forward(ours, ids, mask)[1]))
    up = build_model(ours.cfg, shared.get, "dlpack", dtype="float32")  # cast on the device
    assert up.dtype == jnp.float32 and up.blocks[2].down_proj.kernel[...].dtype == jnp.float32


@pytest.mark.parametrize("dtype", ["int8", "not-a-dtype", bool])
def test_bad_dtype_is_refused(tiny, dtype):
    _, _, ours = tiny["gpt2"]
    with pytest.raises(InputError, match="dtype must be a floating-point dtype"):
        cast_model(ours, dtype)
    with pytest.raises(InputError, match="dtype must be a floating-point dtype"):
        build_model(ours.cfg, lambda name: None, "none", dtype=dtype)
