"""Checkpoint loading: refused inputs raise CheckpointError/TokenizerError naming the file (and tensor).

Tiny GPT-2, Llama and BERT checkpoints are built with transformers and then
damaged on purpose; the loaders must refuse them with a message that names
what is wrong. Checkpoints that are valid in another layout (sharded
safetensors, a trusted pickle, a GGUF file written with llama.cpp's
conventions) must load to exactly the same weights (GGUF: the same logits as
transformers). Everything here is deterministic.
"""

from __future__ import annotations

import functools
import json
import shutil
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from flax import nnx  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from snapaudit_jax.models import CheckpointError, TokenizerError, load_embedder, load_language_model  # noqa: E402
from snapaudit_jax.models.weights import load_gguf, load_hf_folder  # noqa: E402
from snapaudit_jax.models.layers import positions_from_mask  # noqa: E402

VOCAB = 97


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``name -> (transformers model, folder)`` for a tiny gpt2 (with tokenizer.json) and bert."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    out = {}
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2)).eval()
    folder = tmp_path_factory.mktemp("gpt2")
    gpt2.save_pretrained(folder, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    out["gpt2"] = (gpt2, folder)
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64)).eval()
    folder = tmp_path_factory.mktemp("bert")
    bert.save_pretrained(folder, safe_serialization=True)
    out["bert"] = (bert, folder)
    return out


def _copy(folder, tmp_path, name="copy"):
    dst = tmp_path / name
    shutil.copytree(folder, dst)
    return dst


def _weights(module) -> dict:
    return {path: np.asarray(v[...]) for path, v in nnx.to_flat_state(nnx.state(module))}


def _assert_same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for path in wa:
        np.testing.assert_array_equal(wa[path], wb[path], err_msg=str(path))


def _raises(fn, *needles, error=CheckpointError):
    """Calls ``fn``; it must raise ``error`` whose message contains every needle."""
    with pytest.raises(error) as info:
        fn()
    message = str(info.value)
    for needle in needles:
        assert str(needle) in message, f"{needle!r} not in {message!r}"
    return message


# ---------------------------------------------------------------------------
# Folders and config.json
# ---------------------------------------------------------------------------


def test_missing_folder(tmp_path):
    absent = tmp_path / "absent"
    _raises(lambda: load_hf_folder(absent), absent, "does not exist")
    _raises(lambda: load_embedder(str(absent)), absent)
    _raises(lambda: load_language_model(str(absent)), absent)


def test_missing_config_json(folders, tmp_path):
    folder = _copy(folders["gpt2"][1], tmp_path)
    (folder / "config.json").unlink()
    _raises(lambda: load_hf_folder(folder), folder, "config.json")


def test_config_json_not_json(folders, tmp_path):
    folder = _copy(folders["gpt2"][1], tmp_path)
    (folder / "config.json").write_text("{model_type: gpt2")
    _raises(lambda: load_hf_folder(folder), folder / "config.json", "JSON")


@pytest.mark.parametrize(
    "config, needle",
    [
        ({"model_type": "t5", "vocab_size": 97}, "'t5'"),
        ({"model_type": "gpt2", "vocab_size": 97, "n_positions": 8, "n_embd": 8, "n_layer": 1, "n_head": 2,
          "activation_function": "relu"}, "activation_function 'relu'"),
        ({"model_type": "llama", "vocab_size": 97, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn'"),
        ({"model_type": "gpt2", "vocab_size": 97, "n_embd": 8, "n_layer": 1, "n_head": 2}, "'n_positions'"),
    ],
    ids=["model_type_t5", "gpt2_relu", "llama_yarn", "gpt2_missing_field"],
)
def test_unsupported_config(tmp_path, config, needle):
    (tmp_path / "config.json").write_text(json.dumps(config))
    _raises(lambda: load_hf_folder(tmp_path), tmp_path / "config.json", needle)


def test_folder_without_weights(folders, tmp_path):
    folder = _copy(folders["gpt2"][1], tmp_path)
    (folder / "model.safetensors").unlink()
    _raises(lambda: load_hf_folder(folder), folder, "model.safetensors")


# ---------------------------------------------------------------------------
# Pickle weights
# ---------------------------------------------------------------------------


def test_pickle_refused_unless_allowed(folders, tmp_path):
    model, src = folders["gpt2"]
    folder = _copy(src, tmp_path)
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    _raises(lambda: load_hf_folder(folder), folder / "pytorch_model.bin", "allow_pickle")
    _raises(lambda: load_language_model(str(folder)), folder / "pytorch_model.bin", "allow_pickle")
    _, from_pickle = load_hf_folder(folder, allow_pickle=True)
    _assert_same_weights(from_pickle, load_hf_folder(src)[1])
    assert load_language_model(str(folder), allow_pickle=True).config.n_layer == 2


def test_weights_file_instead_of_folder(folders, tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save(folders["gpt2"][0].state_dict(), path)
    _raises(lambda: load_language_model(str(path)), path, "folder")


# ---------------------------------------------------------------------------
# Damaged safetensors
# ---------------------------------------------------------------------------


def test_truncated_safetensors(folders, tmp_path):
    folder = _copy(folders["gpt2"][1], tmp_path)
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    _raises(lambda: load_hf_folder(folder), path, "safetensors")


@pytest.mark.parametrize("damage", ["garbled_json", "huge_header_length", "empty"])
def test_corrupted_safetensors_header(folders, tmp_path, damage):
    folder = _copy(folders["gpt2"][1], tmp_path)
    path = folder / "model.safetensors"
    data = path.read_bytes()
    if damage == "garbled_json":
        data = data[:8] + b"#" * 16 + data[24:]
    elif damage == "huge_header_length":
        data = struct.pack("<Q", 1 << 40) + data[8:]
    else:
        data = b""
    path.write_bytes(data)
    _raises(lambda: load_hf_folder(folder), path, "not a readable safetensors file")


def test_missing_tensor(folders, tmp_path):
    folder = _copy(folders["gpt2"][1], tmp_path)
    path = folder / "model.safetensors"
    tensors = load_file(path)
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    save_file(tensors, path)
    _raises(lambda: load_hf_folder(folder), path, "missing tensor", "h.1.mlp.c_fc.bias")


def test_shape_mismatch(folders, tmp_path):
    folder = _copy(folders["gpt2"][1], tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["n_embd"] = 48
    (folder / "config.json").write_text(json.dumps(cfg))
    message = _raises(lambda: load_hf_folder(folder), folder / "model.safetensors", "has shape", "expected")
    assert "tensor '" in message


# ---------------------------------------------------------------------------
# Sharded safetensors
# ---------------------------------------------------------------------------


def _shard(folder):
    """Splits model.safetensors over two shards plus model.safetensors.index.json (as save_pretrained does)."""
    tensors = load_file(folder / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, folder / file)
        weight_map.update({k: file for k in keys})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "model.safetensors").unlink()
    return list(shards)


def test_sharded_checkpoint_loads(folders, tmp_path):
    src = folders["gpt2"][1]
    folder = _copy(src, tmp_path)
    _shard(folder)
    _, sharded = load_hf_folder(folder)
    _assert_same_weights(sharded, load_hf_folder(src)[1])


def test_sharded_checkpoint_with_missing_shard(folders, tmp_path):
    folder = _copy(folders["gpt2"][1], tmp_path)
    second = _shard(folder)[1]
    (folder / second).unlink()
    _raises(lambda: load_hf_folder(folder), folder / "model.safetensors.index.json", second)


def test_sharded_index_not_json(folders, tmp_path):
    folder = _copy(folders["gpt2"][1], tmp_path)
    _shard(folder)
    (folder / "model.safetensors.index.json").write_text("{\"weight_map\": ")
    _raises(lambda: load_hf_folder(folder), folder / "model.safetensors.index.json")


# ---------------------------------------------------------------------------
# Wrong kind of model, missing tokenizer
# ---------------------------------------------------------------------------


def test_embedder_refuses_gpt2_and_language_model_refuses_bert(folders):
    gpt2, bert = folders["gpt2"][1], folders["bert"][1]
    _raises(lambda: load_embedder(str(gpt2)), gpt2, "BERT")
    _raises(lambda: load_language_model(str(bert)), bert, "load_embedder")


def test_language_model_without_tokenizer(folders, tmp_path):
    folder = _copy(folders["gpt2"][1], tmp_path)
    (folder / "tokenizer.json").unlink()
    _raises(lambda: load_language_model(str(folder)), folder, "tokenizer.json", error=TokenizerError)


# ---------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------

try:
    import gguf
except ImportError:  # the GGUF tests below are skipped
    gguf = None
needs_gguf = pytest.mark.skipif(gguf is None, reason="needs the gguf package")

_GGUF_BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
               "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_GGUF_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def _llama_cpp_permute(w, heads):
    # llama.cpp convert_hf_to_gguf.py, LlamaModel.permute: half-split -> interleaved rotary pairs.
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_llama_gguf(path, model, rope_freqs=None, rope_scaling_type=None):
    """A float32 GGUF of a transformers Llama, written as llama.cpp's converter writes it."""
    c = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    if rope_scaling_type is not None:
        writer.add_rope_scaling_type(rope_scaling_type)
    writer.add_vocab_size(c.vocab_size)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(_rope_theta(c))
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, np.float32))
    for name, tensor in model.state_dict().items():
        w = tensor.numpy()
        if name in _GGUF_TOP:
            writer.add_tensor(_GGUF_TOP[name], np.ascontiguousarray(w, np.float32))
            continue
        _, _, layer, rest = name.split(".", 3)
        module, suffix = rest.rsplit(".", 1)
        if module == "self_attn.q_proj":
            w = _llama_cpp_permute(w, c.num_attention_heads)
        elif module == "self_attn.k_proj":
            w = _llama_cpp_permute(w, c.num_key_value_heads)
        writer.add_tensor(f"blk.{layer}.{_GGUF_BLOCK[module]}.{suffix}", np.ascontiguousarray(w, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _rope_theta(config):
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def _llama3_rope_freqs(theta, dim, factor, low, high, old):
    # llama.cpp convert_hf_to_gguf.py, LlamaModel.generate_extra_tensors (rope_freqs.weight for rope_type llama3).
    out = []
    for freq in 1.0 / theta ** (np.arange(0, dim, 2) / dim):
        wavelen = 2 * np.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def _tiny_llama(**extra):
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=43, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rope_theta=5e5, tie_word_embeddings=False,
        initializer_range=0.1, **extra)).eval()


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids):
    model = nnx.merge(graphdef, state)
    mask = jnp.ones(ids.shape, bool)
    hidden, _ = model(ids, positions_from_mask(mask), mask)
    return model.logits(hidden)


def _gguf_max_diff(path, hf_model):
    _, module, _ = load_gguf(path)
    ids = np.random.default_rng(0).integers(0, VOCAB, (2, 41))  # 41 > 16: past the llama3 original context
    ours = _forward(*nnx.split(module), jnp.asarray(ids, jnp.int32))
    with torch.no_grad():
        ref = hf_model(torch.tensor(ids)).logits.numpy()
    return float(np.abs(np.asarray(ours) - ref).max())


@needs_gguf
def test_gguf_written_like_llama_cpp_matches_transformers(tmp_path):
    """Q/K un-permutation, tensor names and rope_theta of the GGUF loader (float32, so exact up to round-off)."""
    model = _tiny_llama()
    assert _gguf_max_diff(_write_llama_gguf(tmp_path / "tiny.gguf", model), model) <= 1e-4


@needs_gguf
def test_gguf_llama3_rope_freqs_match_transformers(tmp_path):
    """Llama 3.x GGUFs carry the llama3 RoPE scaling as a ``rope_freqs.weight`` tensor of frequency divisors."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    model = _tiny_llama(rope_scaling=scaling)
    freqs = _llama3_rope_freqs(5e5, 8, 8.0, 1.0, 4.0, 16)
    assert _gguf_max_diff(_write_llama_gguf(tmp_path / "llama3.gguf", model, rope_freqs=freqs), model) <= 1e-4
    # Power: the same file without rope_freqs (the scaling ignored) is far off.
    assert _gguf_max_diff(_write_llama_gguf(tmp_path / "plain.gguf", model), model) > 1e-2


@needs_gguf
def test_truncated_gguf(tmp_path):
    path = _write_llama_gguf(tmp_path / "tiny.gguf", _tiny_llama())
    data = path.read_bytes()
    for cut in (len(data) - 16, len(data) // 2, 64):
        path.write_bytes(data[:cut])
        _raises(lambda: load_gguf(path), path, "not a readable GGUF file")


@needs_gguf
def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "weights.gguf"
    path.write_bytes(b"PK\x03\x04 this is a zip, not a GGUF file " * 20)
    _raises(lambda: load_language_model(str(path)), path, "not a readable GGUF file")
    _raises(lambda: load_gguf(tmp_path / "absent.gguf"), tmp_path / "absent.gguf", "does not exist")


@needs_gguf
def test_gguf_of_unsupported_architecture(tmp_path):
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((VOCAB, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _raises(lambda: load_language_model(str(path)), path, "architecture 'gpt2'")


@needs_gguf
def test_gguf_with_unsupported_rope_scaling(tmp_path):
    path = _write_llama_gguf(tmp_path / "yarn.gguf", _tiny_llama(), rope_scaling_type=gguf.RopeScalingType.YARN)
    _raises(lambda: load_gguf(path), path, "'yarn'")


def test_sharded_index_may_not_lead_out_of_the_folder_but_a_hugging_face_cache_may_use_its_blobs(folders, tmp_path):
    """Hugging Face's cache keeps <repo>/snapshots/<rev>/<shard> as symlinks to <repo>/blobs/<sha>: that loads.
    The same shard symlinked anywhere else, or named with '..', is refused naming the index."""
    src = folders["gpt2"][1]
    rev = tmp_path / "models--tiny" / "snapshots" / "abc123"
    folder = _copy(src, rev.parent, rev.name)
    blobs = tmp_path / "models--tiny" / "blobs"
    blobs.mkdir()
    for i, shard in enumerate(_shard(folder)):
        (folder / shard).rename(blobs / f"sha{i}")
        (folder / shard).symlink_to(f"../../blobs/sha{i}")
    _assert_same_weights(load_hf_folder(folder)[1], load_hf_folder(src)[1])
    elsewhere = _copy(folder, tmp_path, "plain")  # copytree copies the shards' contents
    for i, shard in enumerate(sorted(p.name for p in elsewhere.glob("model-*"))):
        (elsewhere / shard).unlink()
        (elsewhere / shard).symlink_to(blobs / f"sha{i}")  # out of a folder that is no cache snapshot
    _raises(lambda: load_hf_folder(elsewhere), elsewhere / "model.safetensors.index.json",
            "leads outside the model folder")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: "../abc123/" + v for k, v in index["weight_map"].items()}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    _raises(lambda: load_hf_folder(folder), "must be a path inside the model folder", "'..'")
