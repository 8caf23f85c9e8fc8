"""Loading checkpoints into the Flax NNX models.

* Hugging Face folders: ``config.json`` + ``model.safetensors`` (or a sharded
  ``model.safetensors.index.json``) for GPT-2, Llama and BERT.
* GGUF files of the Llama architecture (llama.cpp): tensors are dequantised
  with ``gguf``; llama.cpp stores Q and K with rows permuted for its
  interleaved rotary convention, which is undone here.

Pickle-based checkpoints (``.bin``, ``.pt``, ``.pth``, ``.pkl``, ``.ckpt``) can
execute code when loaded and are refused unless ``allow_pickle=True``.
Every failure names the file and, where it applies, the tensor.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from snapaudit_jax.models.bert import Bert
from snapaudit_jax.models.config import BertConfig, ConfigError, GPT2Config, LlamaConfig, RopeScaling, config_from_hf
from snapaudit_jax.models.decoders import GPT2, Llama
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.files import JSON_MAX_BYTES, check_regular_file, read_regular

__all__ = ["CheckpointError", "load_hf_folder", "load_gguf", "build_model", "cast_model", "open_gguf",
           "PICKLE_SUFFIXES"]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


class CheckpointError(InputError):
    """A checkpoint that cannot be loaded: missing, truncated, corrupted or mismatched."""


# ---------------------------------------------------------------------------
# Name maps: our parameter path -> (checkpoint name, transpose)
# ---------------------------------------------------------------------------

# A checkpoint name, or several whose (transposed) tensors are concatenated
# along the last axis (fused projections such as Llama's Q/K/V).
Entry = tuple[tuple, "str | tuple[str, ...]", bool]


def gpt2_weight_map(cfg: GPT2Config) -> list[Entry]:
    """Where each of our GPT-2 parameters lives in a Hugging Face checkpoint.

    Args:
      cfg: the model's shape.

    Returns:
      ``[(our state path, Hugging Face tensor name without the "transformer." prefix, transposed), ...]``; the
      fused projections appear once each (GPT-2's Conv1D already stores ``(in, out)``).
    """
    out: list[Entry] = [
        (("wte", "embedding"), "wte.weight", False),
        (("wpe", "embedding"), "wpe.weight", False),
        (("ln_f", "scale"), "ln_f.weight", False),
        (("ln_f", "bias"), "ln_f.bias", False),
    ]
    for i in range(cfg.n_layer):
        hf = f"h.{i}."
        for ours, theirs in (("ln_1", "ln_1"), ("ln_2", "ln_2")):
            out += [(("blocks", i, ours, "scale"), hf + theirs + ".weight", False),
                    (("blocks", i, ours, "bias"), hf + theirs + ".bias", False)]
        # Conv1D stores (in, out): no transpose.
        for ours, theirs in (("c_attn", "attn.c_attn"), ("attn_proj", "attn.c_proj"), ("c_fc", "mlp.c_fc"),
                             ("mlp_proj", "mlp.c_proj")):
            out += [(("blocks", i, ours, "kernel"), hf + theirs + ".weight", False),
                    (("blocks", i, ours, "bias"), hf + theirs + ".bias", False)]
    return out


def llama_weight_map(cfg: LlamaConfig) -> list[Entry]:
    """Where each of our Llama parameters lives in a Hugging Face checkpoint.

    Args:
      cfg: the model's shape.

    Returns:
      ``[(our state path, Hugging Face tensor name(s) without the "model." prefix, transposed), ...]``: a fused
      projection (``qkv_proj``, ``gate_up_proj``) names its Hugging Face parts, concatenated along the output axis.
    """
    out: list[Entry] = [
        (("embed", "embedding"), "embed_tokens.weight", False),
        (("norm", "scale"), "norm.weight", False),
    ]
    if not cfg.tie_word_embeddings:
        out.append((("lm_head", "kernel"), "lm_head.weight", True))
    for i in range(cfg.num_hidden_layers):
        hf = f"layers.{i}."
        out += [(("blocks", i, "input_norm", "scale"), hf + "input_layernorm.weight", False),
                (("blocks", i, "post_norm", "scale"), hf + "post_attention_layernorm.weight", False)]
        fused = (("qkv_proj", tuple(f"self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj")), cfg.attention_bias),
                 ("o_proj", ("self_attn.o_proj",), cfg.attention_bias),
                 ("gate_up_proj", ("mlp.gate_proj", "mlp.up_proj"), cfg.mlp_bias),
                 ("down_proj", ("mlp.down_proj",), cfg.mlp_bias))
        for ours, theirs, has_bias in fused:
            out.append((("blocks", i, ours, "kernel"), tuple(hf + n + ".weight" for n in theirs), True))
            if has_bias:
                out.append((("blocks", i, ours, "bias"), tuple(hf + n + ".bias" for n in theirs), False))
    return out


def _bert_map(cfg: BertConfig) -> list[Entry]:
    out: list[Entry] = [
        (("word", "embedding"), "embeddings.word_embeddings.weight", False),
        (("position", "embedding"), "embeddings.position_embeddings.weight", False),
        (("token_type", "embedding"), "embeddings.token_type_embeddings.weight", False),
        (("embed_norm", "scale"), "embeddings.LayerNorm.weight", False),
        (("embed_norm", "bias"), "embeddings.LayerNorm.bias", False),
    ]
    for i in range(cfg.num_hidden_layers):
        hf = f"encoder.layer.{i}."
        for ours, theirs in (("query", "attention.self.query"), ("key", "attention.self.key"),
                             ("value", "attention.self.value"), ("attn_out", "attention.output.dense"),
                             ("intermediate", "intermediate.dense"), ("output", "output.dense")):
            out += [(("layers", i, ours, "kernel"), hf + theirs + ".weight", True),
                    (("layers", i, ours, "bias"), hf + theirs + ".bias", False)]
        for ours, theirs in (("attn_norm", "attention.output.LayerNorm"), ("out_norm", "output.LayerNorm")):
            out += [(("layers", i, ours, "scale"), hf + theirs + ".weight", False),
                    (("layers", i, ours, "bias"), hf + theirs + ".bias", False)]
    return out


_MODELS: dict[type, tuple[type, Callable, tuple[str, ...]]] = {
    GPT2Config: (GPT2, gpt2_weight_map, ("transformer.", "")),
    LlamaConfig: (Llama, llama_weight_map, ("model.", "")),
    BertConfig: (Bert, _bert_map, ("bert.", "")),
}


def _concat_parts(parts, names, source, dtype):
    """Concatenates the tensors of a fused parameter along their output axis (on the device if one of them is a
    ``jax.Array``, on the host otherwise)."""
    lead = parts[0].shape[:-1]
    for name, part in zip(names, parts):
        if part.shape[:-1] != lead:
            raise CheckpointError(
                f"{source}: tensor {name!r} has input size {part.shape[:-1]}, but {names[0]!r} has {lead}"
            )
    if any(isinstance(part, jax.Array) for part in parts):
        return jnp.concatenate([jnp.asarray(part, dtype) for part in parts], axis=-1)
    return np.concatenate(parts, axis=-1)


def _float_dtype(name: str, dtype) -> np.dtype:
    """``dtype`` as a NumPy dtype, refused unless it is a floating-point one."""
    try:
        out = jnp.dtype(dtype)
    except TypeError:
        out = None
    if out is None or not jnp.issubdtype(out, jnp.floating):
        raise InputError(f"{name} must be a floating-point dtype (e.g. float32, bfloat16), got {dtype!r}")
    return out


def cast_model(model, dtype):
    """The model with its floating-point parameters cast to ``dtype`` (integer state is kept).

    :class:`~snapaudit_jax.models.decoders.GPT2` and :class:`~snapaudit_jax.models.decoders.Llama` compute in
    their parameters' dtype: cast to ``jnp.bfloat16``, they run in bfloat16 with a bfloat16 KV cache and keep
    float32 where transformers does (norm statistics, attention softmax, logits).

    Args:
      model: an NNX module (e.g. a loaded decoder); it is not modified.
      dtype: the floating-point dtype (``jnp.bfloat16``, ``"bfloat16"``, ``jnp.float32`` ...).

    Returns:
      A new module of the same structure whose floating parameters are ``dtype`` arrays (on their devices).

    Raises:
      InputError: ``dtype`` is not a floating-point dtype.
    """
    dtype = _float_dtype("dtype", dtype)
    graphdef, state = nnx.split(model)
    state = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
    return nnx.merge(graphdef, state)


def _read_tensor(tensor, transpose: bool, dtype):
    """A checkpoint tensor as a float32 NumPy array, or a ``dtype`` array on its device if it is a ``jax.Array``,
    transposed if asked."""
    if isinstance(tensor, jax.Array):
        array = jnp.asarray(tensor, dtype)
        return array.T if transpose else array
    array = np.asarray(tensor, np.float32)
    return array.T if transpose else array


def build_model(cfg, get_tensor: Callable[[str], "np.ndarray | jax.Array | None"], source: str, *,
                dtype=jnp.float32):
    """Builds the NNX model of ``cfg`` from named tensors (no random initialisation).

    Each parameter's checkpoint name is tried with and without the architecture's prefix (``transformer.``,
    ``model.``, ``bert.``); tensors are transposed or concatenated (fused projections) as the name map says.
    Host tensors (NumPy arrays, or anything ``np.asarray`` reads) are read as float32, arranged on the host and
    placed on the default device as ``dtype``. A ``jax.Array`` stays on its device, with no host round trip
    (e.g. ``jax.dlpack.from_dlpack`` of a PyTorch CUDA tensor): it is cast to ``dtype`` there and transposed or
    concatenated there; a parameter taken as is (same dtype, no transpose) shares the array's memory.

    Args:
      cfg: a model config (:class:`GPT2Config`, :class:`LlamaConfig` or :class:`BertConfig`).
      get_tensor: returns the checkpoint tensor of a name, or ``None`` if absent.
      source: the file(s) the tensors come from (for error messages).
      dtype: the parameters' floating-point dtype; the decoders compute in it (float32, the default, or
        bfloat16).

    Returns:
      The :class:`~snapaudit_jax.models.decoders.GPT2`, :class:`~snapaudit_jax.models.decoders.Llama` or
      :class:`~snapaudit_jax.models.bert.Bert` with the checkpoint's weights.

    Raises:
      CheckpointError: a missing tensor or a shape mismatch (naming the tensor).
      InputError: ``dtype`` is not a floating-point dtype.
    """
    dtype = _float_dtype("dtype", dtype)
    cls, name_map, prefixes = _MODELS[type(cfg)]
    abstract = nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    wanted = {path: (name, transpose) for path, name, transpose in name_map(cfg)}
    pairs = []
    for path, var in nnx.to_flat_state(state):
        if path not in wanted:
            raise CheckpointError(f"{source}: internal error, no checkpoint name for parameter {path}")
        names, transpose = wanted[path]
        names = (names,) if isinstance(names, str) else names
        parts, found = [], []
        for name in names:
            tensor = None
            for prefix in prefixes:
                tensor = get_tensor(prefix + name)
                if tensor is not None:
                    found.append(prefix + name)
                    break
            if tensor is None:
                raise CheckpointError(f"{source}: missing tensor {name!r}")
            parts.append(_read_tensor(tensor, transpose, dtype))
        array = parts[0] if len(parts) == 1 else _concat_parts(parts, found, source, dtype)
        expected = tuple(var.shape)
        if array.shape != expected:
            shown = " + ".join(f"{n!r} {tuple(p.shape[::-1] if transpose else p.shape)}" for n, p in zip(found, parts))
            raise CheckpointError(
                f"{source}: tensor {shown} has shape {tuple(array.shape[::-1] if transpose else array.shape)} "
                f"in all, expected {expected[::-1] if transpose else expected} for this config"
            )
        pairs.append((path, var.replace(jnp.asarray(array, dtype))))
    return nnx.merge(graphdef, nnx.from_flat_state(pairs))


# ---------------------------------------------------------------------------
# Hugging Face folders
# ---------------------------------------------------------------------------


def _safetensors_reader(files: Iterable[str]):
    from safetensors import safe_open

    handles = {}
    index = {}
    for path in files:
        try:
            handle = safe_open(path, framework="numpy")
        except Exception as err:  # safetensors raises its own error types for truncated/corrupt headers
            raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None
        handles[path] = handle
        for key in handle.keys():
            index[key] = path

    def get(name: str):
        path = index.get(name)
        if path is None:
            return None
        try:
            return handles[path].get_tensor(name)
        except Exception as err:
            raise CheckpointError(
                f"{path}: tensor {name!r} is unreadable (truncated or corrupted file: {err})") from None

    return get, set(index)


def _pickle_reader(path: str):
    try:
        import torch
    except ImportError as err:
        raise CheckpointError(f"{path}: reading a pickle checkpoint needs torch (pip install torch)") from err
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{path}: not a readable torch checkpoint ({err})") from None
    arrays = {k: v.float().numpy() for k, v in state.items()}
    return arrays.get, set(arrays)


def _shard_path(index: str, folder: str, name: str) -> str:
    """A shard file named by a safetensors index, refused unless it lies inside the model folder.

    A checkpoint folder is data from elsewhere: an absolute path, a ``..`` or a symlink in it must not make the
    loader read files outside the folder (in a Hugging Face cache, the repository's ``blobs`` folder counts as
    inside: its snapshots are symlinks there).
    """
    if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        raise CheckpointError(f"{index}: shard file {name!r} must be a path inside the model folder (no absolute "
                              "path, no '..')")
    path = os.path.join(folder, name)
    roots = [os.path.realpath(folder)]
    parent = os.path.dirname(os.path.abspath(folder))
    if os.path.basename(parent) == "snapshots":  # a Hugging Face cache: <repo>/snapshots/<rev>/f -> ../../blobs/<sha>
        roots.append(os.path.realpath(os.path.join(parent, os.pardir, "blobs")))
    target = os.path.realpath(path)
    if not any(os.path.commonpath([root, target]) == root for root in roots):
        raise CheckpointError(f"{index}: shard file {name!r} leads outside the model folder (a symlink to "
                              f"{target!r})")
    return path


def _weight_files(folder: str, allow_pickle: bool) -> tuple[str, list[str]]:
    index = os.path.join(folder, "model.safetensors.index.json")
    single = os.path.join(folder, "model.safetensors")
    if os.path.lexists(single):  # present: it must be a regular file (a FIFO or device is refused, not opened)
        check_regular_file(single, "weights file", CheckpointError)
        return "safetensors", [single]
    if os.path.lexists(index):
        raw = read_regular(index, "safetensors index", CheckpointError, max_bytes=JSON_MAX_BYTES)
        try:
            weight_map = json.loads(raw)["weight_map"]
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{index}: not a valid safetensors index ({err})") from None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) and f for f in weight_map.values()):
            raise CheckpointError(f"{index}: not a valid safetensors index (weight_map must map tensor names to shard "
                                  "file names)")
        shards = sorted({_shard_path(index, folder, f) for f in weight_map.values()})
        missing = [s for s in shards if not os.path.lexists(s)]
        if missing:
            raise CheckpointError(f"{index}: shard file {missing[0]!r} does not exist")
        for shard in shards:
            check_regular_file(shard, "weights shard", CheckpointError)
        return "safetensors", shards
    pickles = sorted(f for f in os.listdir(folder) if f.endswith(PICKLE_SUFFIXES))
    if pickles:
        if not allow_pickle:
            raise CheckpointError(
                f"{os.path.join(folder, pickles[0])}: pickle checkpoints can run arbitrary code when loaded and are "
                "refused; convert it to safetensors or pass allow_pickle=True (--allow-pickle) if you trust it"
            )
        return "pickle", [os.path.join(folder, pickles[0])]
    raise CheckpointError(f"{folder}: no model.safetensors, model.safetensors.index.json or weights file found")


def read_folder_json(folder: str, name: str, kind: str):
    """The parsed JSON file ``name`` of a model folder.

    Args:
      folder: the folder.
      name: the file's name in it (``config.json``, ``adapter_config.json``...).
      kind: what a folder holding the file is, for the error (``"a Hugging Face checkpoint folder"``).

    Returns:
      The parsed JSON value.

    Raises:
      CheckpointError: the file is missing (the folder is not ``kind``), unreadable, or not valid JSON.
    """
    path = os.path.join(folder, name)
    if not os.path.lexists(path):
        raise CheckpointError(f"{folder}: no {name} (not {kind})")
    text = read_regular(path, name, CheckpointError, max_bytes=JSON_MAX_BYTES)
    try:
        return json.loads(text)
    except ValueError as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None


def read_config(folder: str):
    """The model config of a Hugging Face checkpoint folder's ``config.json``.

    Args:
      folder: the checkpoint folder.

    Returns:
      ``(config, raw)``: the config object (see :func:`~snapaudit_jax.models.config.config_from_hf`) and the
      parsed ``config.json`` dictionary.

    Raises:
      CheckpointError: ``config.json`` is missing, not valid JSON, or describes an unsupported model.
    """
    path = os.path.join(folder, "config.json")
    raw = read_folder_json(folder, "config.json", "a Hugging Face checkpoint folder")
    try:
        return config_from_hf(raw, source=path), raw
    except ConfigError as err:
        raise CheckpointError(str(err)) from None


def load_hf_folder(folder: str | os.PathLike, *, allow_pickle: bool = False):
    """``(config, model)`` from a Hugging Face checkpoint folder.

    Args:
      folder: a folder with ``config.json`` and ``model.safetensors`` (or a sharded
        ``model.safetensors.index.json``).
      allow_pickle: accept pickle weights (``.bin``, ``.pt`` ...) when there are no safetensors; they can
        execute code (read with ``torch.load(weights_only=True)``).

    Returns:
      ``(config, model)``: the config object and the NNX model with the checkpoint's weights.

    Raises:
      CheckpointError: missing or invalid files, refused pickle weights, unsupported architecture, missing
        tensors or shape mismatches.
    """
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder}: checkpoint folder does not exist")
    cfg, _ = read_config(folder)
    kind, files = _weight_files(folder, allow_pickle)
    get, _ = _safetensors_reader(files) if kind == "safetensors" else _pickle_reader(files[0])
    source = files[0] if len(files) == 1 else f"{folder} (sharded)"
    return cfg, build_model(cfg, get, source)


# ---------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------

_GGUF_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def gguf_field(reader, key: str, default=None):
    """The value of a GGUF metadata field.

    Args:
      reader: a ``gguf.GGUFReader``.
      key: the field name, e.g. ``"llama.block_count"``.
      default: returned when the field is absent.

    Returns:
      The field's contents (a scalar, string or list), or ``default``.
    """
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _unpermute_rotary(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved -> half-split rotary pairs)."""
    out_dim, in_dim = w.shape
    return w.reshape(heads, out_dim // heads // 2, 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)


def open_gguf(path: str):
    """A ``gguf.GGUFReader`` of ``path`` (metadata and memory-mapped tensors; nothing is dequantised).

    Args:
      path: the ``.gguf`` file.

    Returns:
      The reader.

    Raises:
      CheckpointError: the file does not exist or is not a readable GGUF file.
    """
    from gguf import GGUFReader

    if not os.path.lexists(path):
        raise CheckpointError(f"{path}: GGUF file does not exist")
    check_regular_file(path, "GGUF file", CheckpointError)  # memory-mapped by the reader: no FIFO or device
    try:
        return GGUFReader(path)
    except Exception as err:
        raise CheckpointError(f"{path}: not a readable GGUF file (truncated or corrupted: {err})") from None


def gguf_llama_config(reader, path: str) -> LlamaConfig:
    """The :class:`LlamaConfig` of a GGUF file's ``llama.*`` metadata.

    RoPE scaling ``linear`` is read from the metadata, Llama-3 scaling from the ``rope_freqs.weight`` tensor
    (as ``"freq_factors"``); embeddings are tied when there is no ``output.weight`` tensor.

    Args:
      reader: a ``gguf.GGUFReader`` of the file.
      path: the file name used in error messages.

    Returns:
      The config.

    Raises:
      CheckpointError: an architecture other than ``llama``, missing required metadata, an unsupported RoPE
        scaling type, or a ``rope_freqs.weight`` of the wrong size or combined with another scaling.
    """
    arch = gguf_field(reader, "general.architecture")
    if arch != "llama":
        raise CheckpointError(f"{path}: GGUF architecture {arch!r} is not supported (llama)")

    def need(key):
        value = gguf_field(reader, f"llama.{key}")
        if value is None:
            raise CheckpointError(f"{path}: GGUF metadata is missing 'llama.{key}'")
        return value

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    names = {t.name for t in reader.tensors}
    vocab = gguf_field(reader, "llama.vocab_size")
    if vocab is None:
        vocab = len(gguf_field(reader, "tokenizer.ggml.tokens", []))
    head_dim = int(gguf_field(reader, "llama.rope.dimension_count", hidden // heads))
    scaling_type = gguf_field(reader, "llama.rope.scaling.type")
    if scaling_type not in (None, "none", "linear"):
        raise CheckpointError(f"{path}: GGUF llama.rope.scaling.type {scaling_type!r} is not supported (none, linear)")
    rope_scaling = RopeScaling()
    if scaling_type == "linear":
        rope_scaling = RopeScaling.from_hf(
            {"rope_type": "linear", "factor": gguf_field(reader, "llama.rope.scaling.factor")}, source=path
        )
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:  # Llama 3.x: the llama3 RoPE scaling as per-frequency divisors
        from gguf.quants import dequantize

        factors = np.asarray(dequantize(freqs.data, freqs.tensor_type), np.float64).ravel()
        if factors.size != head_dim // 2 or rope_scaling.rope_type != "default":
            raise CheckpointError(
                f"{path}: tensor 'rope_freqs.weight' has {factors.size} entries (expected head_dim / 2 = "
                f"{head_dim // 2}) or is combined with rope scaling {scaling_type!r}; not supported"
            )
        rope_scaling = RopeScaling("freq_factors", freq_factors=tuple(map(float, factors)))
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_hidden_layers=int(need("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(gguf_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=head_dim,
        max_position_embeddings=int(gguf_field(reader, "llama.context_length", 8192)),
        rms_norm_eps=float(gguf_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(gguf_field(reader, "llama.rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=gguf_field(reader, "tokenizer.ggml.eos_token_id"),
    )


def load_gguf(path: str | os.PathLike):
    """``(config, model, reader)`` from a Llama-architecture GGUF file (no torch needed).

    Tensors are dequantised to float32 and llama.cpp's Q/K row permutation is undone.

    Args:
      path: the ``.gguf`` file.

    Returns:
      ``(config, model, reader)``: the :class:`LlamaConfig`, the :class:`~snapaudit_jax.models.decoders.Llama`
      with the file's weights, and the ``gguf.GGUFReader`` (for :meth:`Tokenizer.from_gguf`).

    Raises:
      CheckpointError: missing or unreadable file, unsupported architecture, missing, undequantisable or
        mis-shaped tensors.
    """
    from gguf.quants import dequantize

    path = os.fspath(path)
    reader = open_gguf(path)
    cfg = gguf_llama_config(reader, path)
    by_name = {}
    for tensor in reader.tensors:
        name = tensor.name
        if name in _GGUF_NAMES:
            by_name[_GGUF_NAMES[name]] = tensor
        elif name.startswith("blk."):
            _, layer, kind, suffix = name.split(".", 3)
            if kind in _GGUF_BLOCK:
                by_name[f"layers.{layer}.{_GGUF_BLOCK[kind]}.{suffix}"] = tensor

    def get(name: str):
        tensor = by_name.get(name)
        if tensor is None:
            return None
        try:
            w = dequantize(tensor.data, tensor.tensor_type)
        except Exception as err:
            raise CheckpointError(f"{path}: tensor {tensor.name!r} cannot be dequantised ({err})") from None
        # GGUF lists dimensions innermost first; the data is already row-major (out, in).
        w = np.asarray(w, np.float32).reshape(tuple(int(d) for d in reversed(tensor.shape)))
        if name.endswith("self_attn.q_proj.weight"):
            w = _unpermute_rotary(w, cfg.num_attention_heads)
        elif name.endswith("self_attn.k_proj.weight"):
            w = _unpermute_rotary(w, cfg.num_key_value_heads)
        return w

    return cfg, build_model(cfg, get, path), reader
