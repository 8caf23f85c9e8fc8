"""Exporting a (fine-tuned) decoder as folders that serving engines load, written natively (NumPy, no torch).

* :func:`write_hf_folder`: a Hugging Face checkpoint folder (``config.json``, ``model.safetensors``, tokenizer
  files, ``generation_config.json``) of a GPT-2 or Llama, what ``transformers.AutoModelForCausalLM``, vLLM, SGLang
  or TGI load. LoRA adapters are folded into the weights (:func:`~snapaudit_jax.finetune.lora.merge_lora`), or left
  out to pair the base with :func:`write_peft_adapter`.
* :func:`write_peft_adapter`: a PEFT LoRA adapter folder (``adapter_config.json``, ``adapter_model.safetensors``),
  what ``peft.PeftModel.from_pretrained`` (or vLLM's ``--enable-lora``) loads over the base folder.
* :func:`read_peft_adapter`: the way back, our model with the adapter of such a folder.

Layouts: our kernels are ``(in, out)`` (flax); Hugging Face ``nn.Linear`` weights are ``(out, in)`` (Llama: written
transposed), GPT-2's ``Conv1D`` weights ``(in, out)`` (written as they are). Our fused projections (Llama's
``qkv_proj``, ``gate_up_proj``) are split back along the output columns of
:func:`~snapaudit_jax.finetune.lora.target_slices`. The tensor names come from the loader's own name maps
(:mod:`snapaudit_jax.models.weights`), so every export loads back bitwise with
:func:`~snapaudit_jax.models.weights.load_hf_folder`.

The tokenizer files are generated from our :class:`~snapaudit_jax.models.tokenizer.Tokenizer` (whose
``tokenizer.json`` is the ``tokenizers`` backend itself), so a model read from GGUF metadata (the embedded
SmolLM2) exports as well as one read from a folder; when ``source`` is a Hugging Face folder whose tokenizer is
exactly ``tokenizer`` (and whose post-processor adds the BOS our encode adds), its tokenizer files are copied as
they are.

A folder is written atomically: into a temporary sibling in the same parent, then renamed into place, so the
target is either absent (or as it was) or complete. An existing non-empty target is refused unless
``overwrite=True``.

References:
  Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022.
  Hugging Face, safetensors format, https://huggingface.co/docs/safetensors; PEFT ``save_pretrained`` layout.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flax import nnx

from snapaudit_jax.finetune.lora import (
    TARGETS,
    LoRAConfig,
    LoRAProjection,
    apply_lora,
    lora_adapters,
    merge_lora,
    target_slices,
)
from snapaudit_jax.models.config import GPT2Config, LlamaConfig
from snapaudit_jax.models.decoders import GPT2, Llama
from snapaudit_jax.models.tokenizer import Tokenizer
# The loader's name maps are the one source of the checkpoint names: an export cannot drift from what loads.
from snapaudit_jax.models.weights import CheckpointError, gpt2_weight_map, llama_weight_map, read_folder_json
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import check_output_dir, dumps, named_os_errors, save_safetensors

__all__ = ["LORA_MODES", "hf_config", "hf_tensors", "read_peft_adapter", "write_hf_folder", "write_peft_adapter"]

LORA_MODES = ("merge", "base")
"""What :func:`write_hf_folder` does with adapters: fold them into the weights, or write the base weights only."""

# Files a Hugging Face folder may hold for its tokenizer (copied from a matching ``source`` folder).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                    "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model")

# PEFT module path of each target (``{i}``: the block), under ``base_model.model.``.
_PEFT_MODULES = {
    "llama": {
        "q_proj": "model.layers.{i}.self_attn.q_proj", "k_proj": "model.layers.{i}.self_attn.k_proj",
        "v_proj": "model.layers.{i}.self_attn.v_proj", "o_proj": "model.layers.{i}.self_attn.o_proj",
        "gate_proj": "model.layers.{i}.mlp.gate_proj", "up_proj": "model.layers.{i}.mlp.up_proj",
        "down_proj": "model.layers.{i}.mlp.down_proj",
    },
    "gpt2": {
        "c_attn": "transformer.h.{i}.attn.c_attn", "attn.c_proj": "transformer.h.{i}.attn.c_proj",
        "c_fc": "transformer.h.{i}.mlp.c_fc", "mlp.c_proj": "transformer.h.{i}.mlp.c_proj",
    },
}


# ---------------------------------------------------------------------------
# Models and their tensors
# ---------------------------------------------------------------------------


def _decoder(model, name: str = "model"):
    """The NNX decoder of a :class:`GPT2` / :class:`Llama` or of a ``LanguageModel``."""
    from snapaudit_jax.models.lm import LanguageModel

    if isinstance(model, LanguageModel):
        model = model.module
    if not isinstance(model, (GPT2, Llama)):
        raise InputError(f"{name} must be a GPT-2 or Llama decoder (or a LanguageModel of one), got "
                         f"{type(model).__name__}")
    return model


def _family(cfg) -> str:
    return "llama" if isinstance(cfg, LlamaConfig) else "gpt2"


def _without_lora(model):
    """A copy of ``model`` with every :class:`LoRAProjection` replaced by its base projection (adapters dropped)."""
    plain = nnx.clone(model)
    for block in plain.blocks:
        for attr, value in list(vars(block).items()):
            if isinstance(value, LoRAProjection):
                setattr(block, attr, value.base)
    return plain


def _plain(model, lora: str):
    """``model`` without adapters: merged into the weights (``"merge"``) or dropped (``"base"``)."""
    if lora not in LORA_MODES:
        raise InputError(f"lora must be one of {', '.join(map(repr, LORA_MODES))}, got {lora!r}")
    if not any(isinstance(v, LoRAProjection) for block in model.blocks for v in vars(block).values()):
        return model
    return merge_lora(model) if lora == "merge" else _without_lora(model)


def hf_tensors(model, *, lora: str = "merge") -> dict[str, np.ndarray]:
    """The model's parameters as transformers names and lays them out in ``model.safetensors``.

    Llama: ``model.embed_tokens.weight``, ``model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`` (``(out, in)``;
    Q, K and V split out of our fused ``qkv_proj``, gate and up out of ``gate_up_proj``), ``model.norm.weight`` and
    ``lm_head.weight`` only when the embeddings are untied. GPT-2: ``transformer.*`` with the Conv1D weights
    ``(in, out)`` and no ``lm_head.weight`` (tied).

    Args:
      model: a :class:`~snapaudit_jax.models.decoders.GPT2` / ``Llama`` (or a ``LanguageModel``), with or without
        LoRA adapters (not modified).
      lora: ``"merge"``: adapters folded into the weights (``W + (alpha / r) A B``); ``"base"``: the base weights.

    Returns:
      ``{name: C-contiguous host array}`` in the parameters' own dtype (bitwise their values).

    Raises:
      InputError: not a GPT-2 / Llama decoder, or an unknown ``lora`` mode.
    """
    model = _plain(_decoder(model), lora)
    cfg = model.cfg
    llama = isinstance(cfg, LlamaConfig)
    entries, prefix = (llama_weight_map(cfg), "model.") if llama else (gpt2_weight_map(cfg), "transformer.")
    flat = {path: var[...] for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    slices = target_slices(cfg)
    out: dict[str, np.ndarray] = {}
    for path, names, transpose in entries:
        array = np.asarray(flat.pop(path))
        names = (names,) if isinstance(names, str) else names
        if len(names) == 1:
            parts = [array]
        else:  # a fused projection: its parts' widths are their HF modules' output widths
            widths = [slices[n.split(".")[-2]][2] - slices[n.split(".")[-2]][1] for n in names]
            if sum(widths) != array.shape[-1]:
                raise InputError(f"internal error: {path} has {array.shape[-1]} columns, expected {sum(widths)}")
            parts = np.split(array, np.cumsum(widths)[:-1], axis=-1)
        for name, part in zip(names, parts):
            key = name if name.startswith("lm_head.") else prefix + name
            out[key] = np.ascontiguousarray(part.T if transpose else part)
    if flat:
        raise InputError(f"internal error: parameters without a checkpoint name: {sorted(map(str, flat))[:3]}")
    return out


def _dtype_name(model) -> str:
    return str(np.dtype(model.dtype))


def _rope_entries(cfg: LlamaConfig) -> tuple[dict | None, dict]:
    """``(rope_scaling, rope_parameters)``: transformers 4's and 5's forms of the RoPE settings."""
    rs = cfg.rope_scaling
    if rs.rope_type == "default":
        scaling = None
    elif rs.rope_type == "linear":
        scaling = {"rope_type": "linear", "factor": rs.factor}
    elif rs.rope_type == "llama3":
        scaling = {"rope_type": "llama3", "factor": rs.factor, "low_freq_factor": rs.low_freq_factor,
                   "high_freq_factor": rs.high_freq_factor,
                   "original_max_position_embeddings": rs.original_max_position_embeddings}
    else:
        raise InputError(
            f"model.cfg.rope_scaling must be 'default', 'linear' or 'llama3' to be written as a Hugging Face "
            f"config.json, got {rs.rope_type!r} (explicit per-frequency factors, e.g. a GGUF rope_freqs tensor, have "
            "no config.json form)")
    return scaling, {"rope_type": rs.rope_type, "rope_theta": cfg.rope_theta, **(scaling or {})}


def _token_ids(value):
    return list(value) if isinstance(value, tuple) else value


def hf_config(cfg, *, dtype: str = "float32") -> dict[str, Any]:
    """The ``config.json`` dictionary from which transformers rebuilds exactly our config.

    Both transformers 5's ``rope_parameters`` and transformers 4's ``rope_theta`` / ``rope_scaling`` are written
    (they agree), and both ``dtype`` and ``torch_dtype``. GPT-2 dropout probabilities are 0 (our model has none).

    Args:
      cfg: a :class:`~snapaudit_jax.models.config.GPT2Config` or ``LlamaConfig``.
      dtype: the weights' dtype name (``"float32"``, ``"bfloat16"`` ...).

    Returns:
      The dictionary; :func:`~snapaudit_jax.models.config.config_from_hf` of it equals ``cfg``.

    Raises:
      InputError: not a GPT-2 / Llama config, or a RoPE scaling Hugging Face has no form for (``freq_factors``).
    """
    common = {"bos_token_id": cfg.bos_token_id, "eos_token_id": _token_ids(cfg.eos_token_id), "dtype": dtype,
              "torch_dtype": dtype, "use_cache": True}
    if isinstance(cfg, LlamaConfig):
        scaling, parameters = _rope_entries(cfg)
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "max_position_embeddings": cfg.max_position_embeddings,
            "rms_norm_eps": cfg.rms_norm_eps, "hidden_act": "silu", "rope_theta": cfg.rope_theta,
            "rope_scaling": scaling, "rope_parameters": parameters,
            "tie_word_embeddings": cfg.tie_word_embeddings, "attention_bias": cfg.attention_bias,
            "mlp_bias": cfg.mlp_bias, "attention_dropout": 0.0, "pretraining_tp": 1, **common,
        }
    if isinstance(cfg, GPT2Config):
        return {
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": cfg.vocab_size, "n_positions": cfg.n_positions, "n_embd": cfg.n_embd,
            "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": cfg.n_inner,
            "layer_norm_epsilon": cfg.layer_norm_epsilon, "activation_function": cfg.activation,
            "tie_word_embeddings": True, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False, "add_cross_attention": False,
            "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, **common,
        }
    raise InputError(f"model.cfg must be a GPT-2 or Llama config, got {type(cfg).__name__}")


# ---------------------------------------------------------------------------
# Tokenizer files
# ---------------------------------------------------------------------------


def _token(tokenizer: Tokenizer, field: str, token_id) -> str:
    text = tokenizer.backend.id_to_token(int(token_id))
    if text is None:
        raise InputError(f"tokenizer.{field} must be a token id of the vocabulary (0 .. {tokenizer.vocab_size - 1}), "
                         f"got {token_id}")
    return text


def _post_processor(existing, tokenizer: Tokenizer):
    """A post-processor that adds exactly what :meth:`Tokenizer.encode` adds: the BOS when ``add_bos``, else
    nothing (a ByteLevel offsets step is kept), so ``encode(text)`` with transformers' default
    ``add_special_tokens=True`` gives our ids."""
    if tokenizer.add_bos and tokenizer.bos_id is not None:
        bos = _token(tokenizer, "bos_id", tokenizer.bos_id)
        first = {"SpecialToken": {"id": bos, "type_id": 0}}
        return {
            "type": "TemplateProcessing",
            "single": [first, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [first, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": bos, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [int(tokenizer.bos_id)], "tokens": [bos]}},
        }
    if not existing or existing.get("type") == "ByteLevel":
        return existing or None
    if existing.get("type") == "Sequence":
        kept = [p for p in existing.get("processors", []) if p.get("type") == "ByteLevel"]
        return kept[0] if len(kept) == 1 else ({"type": "Sequence", "processors": kept} if kept else None)
    return None


def _tokenizer_files(tokenizer: Tokenizer, model_max_length: int) -> dict[str, bytes]:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` of our tokenizer."""
    from tokenizers import Tokenizer as Backend

    spec = json.loads(tokenizer.backend.to_str())
    spec["post_processor"] = _post_processor(spec.get("post_processor"), tokenizer)
    text = json.dumps(spec, ensure_ascii=False, indent=2)
    Backend.from_str(text)  # the file must load as it is written
    special: dict[str, str] = {}
    if tokenizer.bos_id is not None:
        special["bos_token"] = _token(tokenizer, "bos_id", tokenizer.bos_id)
    if tokenizer.eos_ids:
        special["eos_token"] = _token(tokenizer, "eos_ids", tokenizer.eos_ids[0])
    unk = (tokenizer.special_tokens or {}).get("unk_token")
    if unk is not None and tokenizer.backend.token_to_id(unk) is not None:
        special["unk_token"] = unk
    special["pad_token"] = _token(tokenizer, "pad_id", tokenizer.pad_id)
    config = {
        # The generic fast tokenizer reads tokenizer.json as it is (a model-specific class may rebuild it).
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": bool(tokenizer.add_bos),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,  # our decode does not clean up spaces
        "model_max_length": int(model_max_length),
    }
    if tokenizer.chat_template:
        config["chat_template"] = tokenizer.chat_template
    return {
        "tokenizer.json": text.encode(),
        "tokenizer_config.json": (dumps(config, indent=2, ensure_ascii=False) + "\n").encode(),
        "special_tokens_map.json": (dumps(special, indent=2, ensure_ascii=False) + "\n").encode(),
    }


def _same_tokenizer(a: Tokenizer, b: Tokenizer) -> bool:
    return (json.loads(a.backend.to_str()) == json.loads(b.backend.to_str())
            and (a.bos_id, tuple(a.eos_ids), a.pad_id, bool(a.add_bos), a.chat_template)
            == (b.bos_id, tuple(b.eos_ids), b.pad_id, bool(b.add_bos), b.chat_template))


def _source_folder(source, cfg, tokenizer: Tokenizer) -> tuple[str | None, bool]:
    """``(folder or None, copy its tokenizer files)`` of the ``source`` argument."""
    if source is None:
        return None, False
    if source == "smollm2":
        return None, False
    source = os.fspath(source)
    if not os.path.exists(source):
        raise InputError(f"source must be the checkpoint the model came from (a folder, a .gguf file or 'smollm2'), "
                         f"but {source!r} does not exist")
    if not os.path.isdir(source):
        return None, False
    if not os.path.isfile(os.path.join(source, "tokenizer.json")):
        return source, False
    try:
        theirs = Tokenizer.from_folder(source, eos_token_id=cfg.eos_token_id)
    except InputError:
        return source, False
    existing = json.loads(theirs.backend.to_str()).get("post_processor")
    # Copied only if transformers' encode(text) of the files is ours too (the BOS rule of _post_processor).
    return source, _same_tokenizer(theirs, tokenizer) and _post_processor(existing, tokenizer) == existing


def _generation_config(cfg, tokenizer: Tokenizer, folder: str | None, generation) -> dict:
    out: dict[str, Any] = {}
    path = None if folder is None else os.path.join(folder, "generation_config.json")
    if path is not None and os.path.isfile(path):
        try:
            with open(path) as fh:
                base = json.load(fh)
        except (OSError, ValueError) as err:
            raise InputError(f"source: {path} is not valid JSON ({err})") from None
        if isinstance(base, dict):
            out.update(base)
    bos = cfg.bos_token_id if cfg.bos_token_id is not None else tokenizer.bos_id
    eos = list(tokenizer.eos_ids)
    out.update({"bos_token_id": bos, "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
                "pad_token_id": int(tokenizer.pad_id)})
    out.update(generation or {})
    return out


def _check_generation(generation) -> dict | None:
    if generation is None:
        return None
    if not isinstance(generation, Mapping) or not all(isinstance(k, str) for k in generation):
        raise InputError(f"generation must be a mapping of generation_config.json fields (str keys), got "
                         f"{type(generation).__name__}")
    try:
        dumps(dict(generation))
    except TypeError as err:
        raise InputError(f"generation must hold JSON values only: {err}") from None
    return dict(generation)


# ---------------------------------------------------------------------------
# Atomic folders
# ---------------------------------------------------------------------------


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _put(folder: str, name: str, data: bytes) -> None:
    path = os.path.join(folder, name)
    with named_os_errors(path), open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _put_safetensors(folder: str, name: str, tensors: dict[str, np.ndarray]) -> None:
    # transformers refuses a file without format "pt"
    save_safetensors(tensors, os.path.join(folder, name), metadata={"format": "pt"})


def _check_target(out_dir, overwrite: bool) -> str:
    """The absolute target folder, refused (before any work) if it could not be written or replaced."""
    if not isinstance(out_dir, (str, os.PathLike)):
        raise InputError(f"out_dir must be a folder path, got {type(out_dir).__name__}")
    path = os.path.abspath(os.fspath(out_dir))
    check_output_dir("out_dir", path)
    if os.path.isdir(path):
        entries = list(os.scandir(path))
        if entries and not overwrite:
            raise InputError(f"out_dir must be a new or empty folder (or pass overwrite=True), but {path!r} holds "
                             f"{len(entries)} entries, e.g. {entries[0].name!r}")
        odd = [e.name for e in entries if not e.is_file(follow_symlinks=False)]
        if odd:
            raise InputError(f"out_dir: overwrite=True replaces a folder of plain files only (an earlier export), but "
                             f"{path!r} holds {odd[0]!r}, which is not a plain file")
    return path


def _commit_folder(path: str, fill: Callable[[str], None]) -> None:
    """Runs ``fill(tmp)`` on a temporary sibling of ``path``, then renames it to ``path`` (an existing folder,
    checked by :func:`_check_target`, is moved aside first and deleted after); on any error nothing changes."""
    parent, base = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=parent)
    old = None
    moved = False
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # the permissions os.mkdir would give, not mkdtemp's 0700
        fill(tmp)
        _fsync_dir(tmp)
        if os.path.isdir(path) and os.listdir(path):
            old = tempfile.mkdtemp(prefix=f".{base}.old-", dir=parent)
            os.rename(path, old)  # onto the empty placeholder
            moved = True
        try:
            os.rename(tmp, path)  # onto a missing or empty folder only
        except OSError as err:
            raise InputError(f"out_dir: {path!r} could not be replaced ({err.strerror or err}); someone else may have "
                             "written into it meanwhile; nothing was changed") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            if moved and not os.path.exists(path):
                os.rename(old, path)
            else:
                shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(parent)


# ---------------------------------------------------------------------------
# Hugging Face folder
# ---------------------------------------------------------------------------


def write_hf_folder(model, tokenizer: Tokenizer | None, out_dir: str | os.PathLike, *, source=None,
                    generation: Mapping[str, Any] | None = None, lora: str = "merge",
                    overwrite: bool = False) -> str:
    """Writes a Hugging Face checkpoint folder of a GPT-2 or Llama (no torch needed), atomically.

    The folder holds ``config.json`` (:func:`hf_config`), ``model.safetensors`` (:func:`hf_tensors`, the weights'
    own dtype, metadata ``format: pt``), ``tokenizer.json`` (our tokenizer's backend, its post-processor adding
    exactly the BOS :meth:`Tokenizer.encode` adds), ``tokenizer_config.json`` (``PreTrainedTokenizerFast``, the
    BOS / EOS / pad / unk tokens, ``add_bos_token``, the chat template, ``model_max_length``),
    ``special_tokens_map.json`` and ``generation_config.json`` (BOS, EOS ids we stop on, pad id).

    Args:
      model: a :class:`~snapaudit_jax.models.decoders.GPT2` / ``Llama`` (or a ``LanguageModel``), with or without
        LoRA adapters (not modified).
      tokenizer: its :class:`~snapaudit_jax.models.tokenizer.Tokenizer`; ``None``: the ``LanguageModel``'s own.
      out_dir: the folder to create (its parent is created if needed).
      source: the checkpoint the model was loaded from, or ``None``. A Hugging Face folder: its
        ``generation_config.json`` (sampling defaults) is the base of ours, and its tokenizer files are copied as
        they are when they describe exactly ``tokenizer`` and their post-processor adds the BOS our encode adds
        (else generated). A ``.gguf`` file or ``"smollm2"``: the
        files are generated from ``tokenizer`` (what :meth:`Tokenizer.from_gguf` read).
      generation: extra ``generation_config.json`` fields (e.g. ``{"temperature": 0.7, "do_sample": True}``),
        written last.
      lora: ``"merge"`` (default): adapters folded into the weights (:func:`merge_lora`); ``"base"``: the base
        weights only, to serve with :func:`write_peft_adapter`'s adapter.
      overwrite: replace an existing non-empty ``out_dir`` (a folder of plain files only, e.g. an earlier export).

    Returns:
      The absolute path of the folder.

    Raises:
      InputError: not a GPT-2 / Llama decoder or not a :class:`Tokenizer`; a tokenizer with more tokens than the
        model's vocabulary or special ids outside it; a RoPE scaling without a ``config.json`` form; a bad
        ``lora``, ``generation`` or ``source``; or an ``out_dir`` that is a file, not writable, or an existing
        non-empty folder without ``overwrite`` (nothing is written then).

    Guarantees:
      The folder appears complete or not at all (written into a temporary sibling, then renamed). Loaded with
      :func:`~snapaudit_jax.models.weights.load_hf_folder` it gives bitwise the parameters written (for
      ``lora="merge"``, those of :func:`merge_lora`), and transformers computes the same function (float32
      round-off; tested against ``AutoModelForCausalLM`` and ``AutoTokenizer``).
    """
    from snapaudit_jax.models.lm import LanguageModel

    decoder = _decoder(model)
    if tokenizer is None and isinstance(model, LanguageModel):
        tokenizer = model.tokenizer
    if not isinstance(tokenizer, Tokenizer):
        raise InputError(f"tokenizer must be a snapaudit_jax Tokenizer, got {type(tokenizer).__name__}")
    generation = _check_generation(generation)
    if lora not in LORA_MODES:
        raise InputError(f"lora must be one of {', '.join(map(repr, LORA_MODES))}, got {lora!r}")
    path = _check_target(out_dir, overwrite)
    cfg = decoder.cfg
    if tokenizer.vocab_size > cfg.vocab_size:
        raise InputError(f"tokenizer has {tokenizer.vocab_size} tokens, more than the model's vocab_size "
                         f"{cfg.vocab_size}")
    config = hf_config(cfg, dtype=_dtype_name(decoder))
    folder, copy_tokenizer = _source_folder(source, cfg, tokenizer)
    max_length = cfg.max_position_embeddings if isinstance(cfg, LlamaConfig) else cfg.n_positions
    files = {} if copy_tokenizer else _tokenizer_files(tokenizer, max_length)
    files["config.json"] = (dumps(config, indent=2) + "\n").encode()
    files["generation_config.json"] = (dumps(_generation_config(cfg, tokenizer, folder, generation), indent=2)
                                       + "\n").encode()
    tensors = hf_tensors(decoder, lora=lora)

    def fill(tmp):
        _put_safetensors(tmp, "model.safetensors", tensors)
        for name, data in files.items():
            _put(tmp, name, data)
        if copy_tokenizer:
            for name in _TOKENIZER_FILES:
                src = os.path.join(folder, name)
                if os.path.isfile(src):
                    shutil.copyfile(src, os.path.join(tmp, name))

    _commit_folder(path, fill)
    return path


# ---------------------------------------------------------------------------
# PEFT adapters
# ---------------------------------------------------------------------------


def _lora_alpha(scale: float, rank: int):
    """The ``lora_alpha`` whose ``lora_alpha / r`` is exactly ``scale`` (PEFT's scaling), as an int when integral."""
    for alpha in (round(scale * rank, 9), round(scale * rank, 6), scale * rank):
        if alpha / rank == scale:
            return int(alpha) if float(alpha).is_integer() else float(alpha)
    return scale * rank


def write_peft_adapter(model, out_dir: str | os.PathLike, *, base_model_name_or_path: str | None,
                       overwrite: bool = False) -> str:
    """Writes the model's LoRA adapters as a PEFT adapter folder (no torch needed), atomically.

    ``adapter_config.json``: ``peft_type`` ``LORA``, ``task_type`` ``CAUSAL_LM``, ``r``, ``lora_alpha`` (PEFT's
    scaling ``lora_alpha / r`` equals ours), ``target_modules`` (the Hugging Face names of
    :data:`~snapaudit_jax.finetune.lora.TARGETS`, e.g. ``q_proj``, ``attn.c_proj``), ``fan_in_fan_out`` (true for
    GPT-2's Conv1D), ``bias`` ``none``, ``lora_dropout`` 0. ``adapter_model.safetensors``:
    ``base_model.model.<module>.lora_A.weight`` ``(r, in)`` and ``lora_B.weight`` ``(out, r)`` (our ``A.T``,
    ``B.T``), e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` or
    ``base_model.model.transformer.h.0.attn.c_attn.lora_A.weight``.

    Args:
      model: a :class:`~snapaudit_jax.models.decoders.GPT2` / ``Llama`` (or a ``LanguageModel``) with adapters
        (:func:`~snapaudit_jax.finetune.lora.apply_lora`); not modified.
      out_dir: the folder to create.
      base_model_name_or_path: the base checkpoint PEFT names in the adapter (e.g. the folder of
        :func:`write_hf_folder` with ``lora="base"``), or ``None``.
      overwrite: replace an existing non-empty ``out_dir`` (a folder of plain files only).

    Returns:
      The absolute path of the folder.

    Raises:
      InputError: not a GPT-2 / Llama decoder, no adapters, adapters of several ranks or scales or on some blocks
        only (PEFT's single ``r`` / ``lora_alpha`` / ``target_modules`` cannot say that), a bad
        ``base_model_name_or_path``, or an ``out_dir`` refused as for :func:`write_hf_folder`.

    Guarantees:
      The folder appears complete or not at all. ``peft.PeftModel.from_pretrained`` over the base folder computes
      our adapted model's function (float32 round-off; tested), and :func:`read_peft_adapter` reads the adapters
      back bitwise.
    """
    decoder = _decoder(model)
    if base_model_name_or_path is not None and not isinstance(base_model_name_or_path, (str, os.PathLike)):
        raise InputError(f"base_model_name_or_path must be a string or None, got "
                         f"{type(base_model_name_or_path).__name__}")
    adapters = lora_adapters(decoder)
    if not adapters:
        raise InputError("model must have LoRA adapters (apply_lora) to write a PEFT adapter, got a model without any")
    path = _check_target(out_dir, overwrite)
    family = _family(decoder.cfg)
    ranks = sorted({int(a.shape[1]) for a, _, _ in adapters.values()})
    scales = sorted({float(s) for _, _, s in adapters.values()})
    if len(ranks) != 1 or len(scales) != 1:
        raise InputError(f"model's adapters must share one rank and one scale for a PEFT adapter, got ranks {ranks} "
                         f"and scales {scales}")
    targets = tuple(t for t in TARGETS[family] if any(name == t for _, name in adapters))
    expected = {(i, t) for i in range(len(decoder.blocks)) for t in targets}
    if set(adapters) != expected:
        missing = sorted(expected - set(adapters))[0]
        raise InputError(f"model's adapters must cover the same projections in every block, but block {missing[0]} "
                         f"has none on {missing[1]!r}")
    tensors: dict[str, np.ndarray] = {}
    for (i, name), (a, b, _) in adapters.items():
        module = "base_model.model." + _PEFT_MODULES[family][name].format(i=i)
        tensors[module + ".lora_A.weight"] = np.ascontiguousarray(np.asarray(a).T)
        tensors[module + ".lora_B.weight"] = np.ascontiguousarray(np.asarray(b).T)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": None if base_model_name_or_path is None else os.fspath(base_model_name_or_path),
        "revision": None,
        "r": ranks[0],
        "lora_alpha": _lora_alpha(scales[0], ranks[0]),
        "lora_dropout": 0.0,
        "target_modules": list(targets),
        "fan_in_fan_out": family == "gpt2",  # GPT-2's Conv1D stores (in, out)
        "bias": "none",
        "lora_bias": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }

    def fill(tmp):
        _put_safetensors(tmp, "adapter_model.safetensors", tensors)
        _put(tmp, "adapter_config.json", (dumps(config, indent=2) + "\n").encode())

    _commit_folder(path, fill)
    return path


def read_peft_adapter(model, folder: str | os.PathLike):
    """Our model with the LoRA adapter of a PEFT adapter folder (the reverse of :func:`write_peft_adapter`).

    Args:
      model: the base :class:`~snapaudit_jax.models.decoders.GPT2` / ``Llama`` (or a ``LanguageModel``) without
        adapters; not modified.
      folder: a PEFT LoRA folder (``adapter_config.json``, ``adapter_model.safetensors``) for this base.

    Returns:
      A copy of ``model`` with :class:`~snapaudit_jax.finetune.lora.LoRAProjection` adapters holding the folder's
      ``A`` and ``B`` (cast to the model's dtype; float32 values bitwise).

    Raises:
      InputError: not a decoder, or a model that already has adapters.
      CheckpointError: missing or invalid files; a LoRA variant we do not compute (DoRA, rsLoRA, biases, rank or
        alpha patterns, some layers only, modules to save); target modules that are not projections of the
        model; missing, unexpected or mis-shaped tensors (the message names the file and the tensor).
    """
    import jax
    from safetensors.numpy import load_file

    decoder = _decoder(model)
    if lora_adapters(decoder):
        raise InputError("model must be a base model without LoRA adapters, got one with adapters")
    folder = os.fspath(folder)
    config_path = os.path.join(folder, "adapter_config.json")
    weights_path = os.path.join(folder, "adapter_model.safetensors")
    config = read_folder_json(folder, "adapter_config.json", "a PEFT adapter folder")
    if not os.path.isfile(weights_path):
        raise CheckpointError(f"{folder}: no adapter_model.safetensors (not a PEFT adapter folder)")
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise CheckpointError(f"{config_path}: peft_type must be 'LORA', got {config.get('peft_type')!r}")
    for key, fine in (("use_dora", False), ("use_rslora", False), ("bias", "none"), ("lora_bias", False)):
        if config.get(key, fine) != fine:
            raise CheckpointError(f"{config_path}: {key} must be {fine!r} (not supported otherwise), got "
                                  f"{config[key]!r}")
    for key in ("rank_pattern", "alpha_pattern", "layers_to_transform", "modules_to_save", "layer_replication"):
        if config.get(key):
            raise CheckpointError(f"{config_path}: {key} is not supported, got {config[key]!r}")
    family = _family(decoder.cfg)
    modules = config.get("target_modules")
    if not isinstance(modules, list) or not modules or not all(isinstance(m, str) for m in modules):
        raise CheckpointError(f"{config_path}: target_modules must be a list of module names (a regex is not "
                              f"supported), got {modules!r}")
    paths = {t: _PEFT_MODULES[family][t].format(i=0) for t in TARGETS[family]}

    def matches(path, module):  # PEFT: the module's name, or its dotted suffix
        return path == module or path.endswith("." + module)

    unknown = [m for m in modules if not any(matches(p, m) for p in paths.values())]
    if unknown:
        raise CheckpointError(f"{config_path}: target_modules must be projections of a {family} model "
                              f"({', '.join(TARGETS[family])}), got {unknown[0]!r}")
    targets = tuple(t for t in TARGETS[family] if any(matches(paths[t], m) for m in modules))
    try:
        lora_config = LoRAConfig(rank=config.get("r"), alpha=config.get("lora_alpha"), targets=targets)
    except InputError as err:
        raise CheckpointError(f"{config_path}: {err}") from None
    try:
        tensors = load_file(weights_path)
    except Exception as err:  # safetensors raises its own error types for truncated or corrupt files
        raise CheckpointError(f"{weights_path}: not a readable safetensors file ({err})") from None
    adapted = apply_lora(nnx.clone(decoder), lora_config, key=jax.random.key(0))
    for i, block in enumerate(adapted.blocks):
        for proj in vars(block).values():
            if not isinstance(proj, LoRAProjection):
                continue
            for j, name in enumerate(proj.names):
                module = "base_model.model." + _PEFT_MODULES[family][name].format(i=i)
                for part, var in (("lora_A", proj.lora_a[j]), ("lora_B", proj.lora_b[j])):
                    key = f"{module}.{part}.weight"
                    tensor = tensors.pop(key, None)
                    if tensor is None:
                        raise CheckpointError(f"{weights_path}: missing tensor {key!r}")
                    want = tuple(var.shape[::-1])
                    if tuple(tensor.shape) != want:
                        raise CheckpointError(f"{weights_path}: tensor {key!r} has shape {tuple(tensor.shape)}, "
                                              f"expected {want}")
                    var[...] = jax.device_put(np.ascontiguousarray(tensor.T).astype(var.dtype))  # jnp.asarray compiles
    if tensors:
        raise CheckpointError(f"{weights_path}: unexpected tensor {sorted(tensors)[0]!r} (not an adapter of "
                              f"{', '.join(targets)} in this {family} model)")
    return adapted
