"""Exported Hugging Face folders and PEFT adapters against transformers and peft (the oracles).

Three tiny random decoders, each with LoRA adapters on every projection and random nonzero ``B``:

* ``llama_tied``: the transformers-built folder of :func:`tests.helpers.tiny_llm.make_tiny_llm_folder` (tied
  embeddings, 4 query / 2 key-value heads, a real byte-level BPE and a ChatML template), loaded by our loader;
* ``llama_untied``: our own Llama with untied embeddings, 3 query heads over 1 key-value head, Q/K/V/O and MLP
  biases, Llama-3 RoPE scaling, two EOS ids and a tokenizer that prepends a BOS;
* ``gpt2``: the tiny GPT-2 of :mod:`tests.helpers.attack_lm` (Conv1D layout, its BPE), random by NumPy.

Each is exported merged (``write_hf_folder``), as base + adapter (``lora="base"`` + ``write_peft_adapter``), and
compared with ``AutoModelForCausalLM`` / ``PeftModel`` logits, ``AutoTokenizer`` ids, a real PEFT save's names,
and our own loader (bitwise). Everything is deterministic (fixed seeds), so no test has a false-failure
probability. The logit tolerance is relative to the logits' scale, ``max|Δ| <= TOL * max(1, max|ours|)``, a
float32 round-off bound (measured ~1e-6); the power checks corrupt an export (a transposed or swapped tensor, a
wrong LoRA scale) and must exceed it a hundredfold.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from flax import nnx  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from snapaudit_jax.finetune import export  # noqa: E402
from snapaudit_jax.finetune.export import hf_config, read_peft_adapter, write_hf_folder, write_peft_adapter  # noqa: E402
from snapaudit_jax.finetune.lora import TARGETS, LoRAConfig, LoRAProjection, apply_lora, lora_adapters, merge_lora  # noqa: E402
from snapaudit_jax.models import CheckpointError, load_language_model, load_tokenizer  # noqa: E402
from snapaudit_jax.models.config import GPT2Config, LlamaConfig, RopeScaling  # noqa: E402
from snapaudit_jax.models.decoders import GPT2, Llama  # noqa: E402
from snapaudit_jax.models.weights import read_config  # noqa: E402
from snapaudit_jax.utils.errors import InputError  # noqa: E402

from tests.helpers.attack_lm import bpe_tokenizer  # noqa: E402
from tests.helpers.tiny_llm import make_tiny_llm_folder  # noqa: E402

TOL = 1e-5  # max|Δlogits| / max(1, max|logits|), float32
RANK, ALPHA = 3, 5.0  # scale 5/3: not a power of two, so lora_alpha must be recovered exactly
LENGTH = 13
TEXTS = [
    "The quick brown fox jumps over the lazy dog, 12345 times.",
    "Dear Alice Smith, please call Bob Jones at 555-0199 about order #8842.",
    "Hello world! Numbers 678 and e-mails like a.b@example.com, naïve café.",
    "  leading spaces\tand\ttabs\nnew lines  ",
] * 4
PROBES = ["Hello world 12345!", "Dear Bob, call 555-0199.", "  spaces\t\ttabs\n", "naïve café ☕", "a1b22c333",
          "<|im_start|>user\nHi<|im_end|>\n"]
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"},
            {"role": "user", "content": "Thanks!"}]


# ---------------------------------------------------------------------------
# Tiny models
# ---------------------------------------------------------------------------


def _randomize(model, seed: int):
    """Every parameter random (norm scales near 1), so zero-initialised biases and scales also carry signal.

    ``model`` may be abstract (``nnx.eval_shape``); NumPy draws placed with ``device_put`` compile nothing (an
    eager initialiser or ``jnp.asarray`` compiles once per shape)."""
    rng = np.random.default_rng(seed)
    graphdef, state = nnx.split(model)
    pairs = []
    for path, var in nnx.to_flat_state(state):
        noise = rng.standard_normal(var.shape).astype(np.float32)
        pairs.append((path, var.replace(jax.device_put(1.0 + 0.1 * noise if path[-1] == "scale" else 0.2 * noise))))
    return nnx.merge(graphdef, nnx.from_flat_state(pairs))


def _random_decoder(cfg, seed: int):
    cls = Llama if isinstance(cfg, LlamaConfig) else GPT2
    return _randomize(nnx.eval_shape(lambda: cls(cfg, nnx.Rngs(0))), seed)


def _gpt2_config(tokenizer) -> GPT2Config:
    """The tiny GPT-2 of :func:`tests.helpers.attack_lm.gpt2` (width 32, 2 layers, 64 positions)."""
    return GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=64)


def _adapt(model, seed: int):
    """A copy with LoRA on every projection of the family and random nonzero ``B``."""
    family = "llama" if isinstance(model, Llama) else "gpt2"
    adapted = apply_lora(nnx.clone(model), LoRAConfig(rank=RANK, alpha=ALPHA, targets=TARGETS[family]),
                         key=jax.random.key(seed))
    rng = np.random.default_rng(seed)
    for block in adapted.blocks:
        for proj in vars(block).values():
            if isinstance(proj, LoRAProjection):
                for b in proj.lora_b:
                    b[...] = jax.device_put((0.3 * rng.standard_normal(b.shape)).astype(b.dtype))
    return adapted


def _ids(vocab: int) -> np.ndarray:
    return np.random.default_rng(11).integers(0, vocab, (2, LENGTH))


@functools.lru_cache(maxsize=None)
def _forward(graphdef):
    """The jitted logits of a full batch (one compilation per model structure, not one per eager op)."""

    @jax.jit
    def logits(state, ids):
        model = nnx.merge(graphdef, state)
        hidden, _ = model(ids, jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape), jnp.ones(ids.shape, bool))
        return model.logits(hidden)

    return logits


def _ours(model, ids) -> np.ndarray:
    graphdef, state = nnx.split(model)
    return np.asarray(_forward(graphdef)(state, jax.device_put(np.asarray(ids, np.int32))))


def _theirs(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.numpy()


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def _hf(folder):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
    return model.eval()


@dataclasses.dataclass
class Case:
    name: str
    source: str | None
    base: object
    adapted: object
    tokenizer: object
    merged_dir: str
    base_dir: str
    adapter_dir: str


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def tiny_source(root):
    return make_tiny_llm_folder(str(root / "source"), TEXTS)


def _build(name: str, root, tiny_source):
    if name == "llama_tied":
        lm = load_language_model(tiny_source)
        base, tokenizer, source = _randomize(lm.module, 1), lm.tokenizer, tiny_source
    elif name == "llama_untied":
        tok = load_tokenizer(tiny_source)
        tokenizer = dataclasses.replace(tok, bos_id=1, add_bos=True, eos_ids=(2, 0))
        cfg = LlamaConfig(
            vocab_size=tok.vocab_size, hidden_size=24, intermediate_size=37, num_hidden_layers=2,
            num_attention_heads=3, num_key_value_heads=1, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-5,
            rope_theta=5e5, rope_scaling=RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                     original_max_position_embeddings=16),
            tie_word_embeddings=False, attention_bias=True, mlp_bias=True, bos_token_id=1, eos_token_id=(2, 0))
        base, source = _random_decoder(cfg, 2), None
    else:
        tokenizer = bpe_tokenizer(TEXTS)
        base, source = _random_decoder(_gpt2_config(tokenizer), 3), None
    adapted = _adapt(base, 5)
    merged_dir = write_hf_folder(adapted, tokenizer, root / name / "merged", source=source)
    base_dir = write_hf_folder(adapted, tokenizer, root / name / "base", lora="base")
    adapter_dir = write_peft_adapter(adapted, root / name / "adapter", base_model_name_or_path=base_dir)
    return Case(name, source, base, adapted, tokenizer, merged_dir, base_dir, adapter_dir)


_CASES: dict[str, Case] = {}


def _case(name: str, root, tiny_source) -> Case:
    """The case ``name``, built and exported once per test session (the power checks reuse the exports)."""
    if name not in _CASES:
        _CASES[name] = _build(name, root, tiny_source)
    return _CASES[name]


@pytest.fixture(scope="module", params=["llama_tied", "llama_untied", "gpt2"])
def case(request, root, tiny_source) -> Case:
    return _case(request.param, root, tiny_source)


def _flat(model) -> dict:
    return {path: np.asarray(v[...]) for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _assert_bitwise(a, b):
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for path in fa:
        assert fa[path].dtype == fb[path].dtype and np.array_equal(fa[path], fb[path]), path


# ---------------------------------------------------------------------------
# Parity with transformers and peft
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_merged_export_matches_transformers(case):
    ids = _ids(case.base.cfg.vocab_size)
    ours, before = _ours(case.adapted, ids), _ours(case.base, ids)
    assert _rel(before, ours) > 1e3 * TOL  # the adapters matter: the parity below is not the base model's
    assert _rel(_theirs(_hf(case.merged_dir), ids), ours) <= TOL
    assert read_config(case.merged_dir)[0] == case.base.cfg  # transformers' config.json round-trips ours exactly


def test_base_plus_peft_adapter_matches_peft(case):
    ids = _ids(case.base.cfg.vocab_size)
    hf_base = _hf(case.base_dir)
    assert _rel(_theirs(hf_base, ids), _ours(case.base, ids)) <= TOL
    adapted = peft.PeftModel.from_pretrained(hf_base, case.adapter_dir).eval()
    assert _rel(_theirs(adapted, ids), _ours(case.adapted, ids)) <= TOL


def test_adapter_names_and_config_match_a_real_peft_save(case, tmp_path):
    ours = json.loads(open(os.path.join(case.adapter_dir, "adapter_config.json")).read())
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(case.base_dir)
    config = peft.LoraConfig(r=ours["r"], lora_alpha=ours["lora_alpha"], target_modules=ours["target_modules"],
                             fan_in_fan_out=ours["fan_in_fan_out"], lora_dropout=0.0, task_type="CAUSAL_LM")
    peft.get_peft_model(hf_base, config).save_pretrained(tmp_path)
    theirs = json.loads((tmp_path / "adapter_config.json").read_text())
    shapes = {k: v.shape for k, v in load_file(tmp_path / "adapter_model.safetensors").items()}
    assert shapes == {k: v.shape for k, v in load_file(os.path.join(case.adapter_dir, "adapter_model.safetensors"))
                      .items()}
    for key in ("peft_type", "task_type", "r", "lora_alpha", "fan_in_fan_out", "bias", "use_rslora", "use_dora"):
        assert ours[key] == theirs[key], key
    assert sorted(ours["target_modules"]) == sorted(theirs["target_modules"])
    assert ours["fan_in_fan_out"] == (case.name == "gpt2") and ours["lora_alpha"] / ours["r"] == ALPHA / RANK


def test_tokenizer_files_encode_like_ours(case):
    folders = [case.merged_dir, case.base_dir]
    if case.name == "llama_tied":  # from the source folder: its tokenizer files copied as they are
        for name in ("tokenizer.json", "tokenizer_config.json"):
            assert open(os.path.join(case.merged_dir, name), "rb").read() == \
                open(os.path.join(case.source, name), "rb").read()
    for folder in folders:
        hf = transformers.AutoTokenizer.from_pretrained(folder)
        mine = load_tokenizer(folder)
        for text in PROBES:
            ids = case.tokenizer.encode(text)
            assert hf.encode(text) == ids == mine.encode(text), (folder, text)
            assert hf.decode(ids, skip_special_tokens=True) == case.tokenizer.decode(ids), (folder, text)
        if case.tokenizer.chat_template:
            assert hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == \
                case.tokenizer.apply_chat_template(MESSAGES)
        generation = json.loads(open(os.path.join(folder, "generation_config.json")).read())
        eos = list(case.tokenizer.eos_ids)
        assert generation["eos_token_id"] == (eos[0] if len(eos) == 1 else eos)
        assert generation["pad_token_id"] == case.tokenizer.pad_id
    if case.name == "llama_untied":
        assert hf.encode("hi")[0] == 1  # the BOS our encode prepends, added once by the written post-processor


def test_a_tokenizer_unlike_the_source_folders_is_generated_and_generation_fields_are_written(root, tiny_source,
                                                                                              tmp_path):
    case = _case("llama_tied", root, tiny_source)
    tokenizer = dataclasses.replace(case.tokenizer, bos_id=1, add_bos=True)  # the source folder adds no BOS
    folder = write_hf_folder(case.adapted, tokenizer, tmp_path / "bos", source=tiny_source,
                             generation={"do_sample": True, "temperature": 0.7})
    assert "special_tokens_map.json" in os.listdir(folder)  # generated, not copied
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    for text in PROBES:
        assert hf.encode(text) == tokenizer.encode(text) == load_tokenizer(folder).encode(text), text
    generation = transformers.GenerationConfig.from_pretrained(folder)
    source = json.loads(open(os.path.join(tiny_source, "generation_config.json")).read())
    assert (generation.do_sample, generation.temperature, generation.pad_token_id) == (True, 0.7, tokenizer.pad_id)
    assert generation.eos_token_id == source["eos_token_id"] == case.tokenizer.eos_ids[0]


def test_round_trips_are_bitwise(case):
    merged = load_language_model(case.merged_dir)
    _assert_bitwise(merged.module, merge_lora(case.adapted))
    assert merged.config == case.base.cfg
    base = load_language_model(case.base_dir).module
    _assert_bitwise(base, case.base)
    back = lora_adapters(read_peft_adapter(base, case.adapter_dir))
    want = lora_adapters(case.adapted)
    assert back.keys() == want.keys()
    for k in want:
        assert np.array_equal(back[k][0], want[k][0]) and np.array_equal(back[k][1], want[k][1]), k
        assert back[k][2] == want[k][2]


# ---------------------------------------------------------------------------
# Power: a wrong layout must fail the parity
# ---------------------------------------------------------------------------


def _swap(tensors, a, b):
    tensors[a], tensors[b] = tensors[b].copy(), tensors[a].copy()


CORRUPTIONS = {
    "llama_untied k_proj/v_proj swapped": (
        "llama_untied", "merged", lambda t: _swap(t, "model.layers.0.self_attn.k_proj.weight",
                                                  "model.layers.0.self_attn.v_proj.weight")),
    "llama_tied o_proj transposed": (
        "llama_tied", "merged", lambda t: t.update({"model.layers.1.self_attn.o_proj.weight":
                                                    np.ascontiguousarray(t["model.layers.1.self_attn.o_proj.weight"].T)})),
    "gpt2 Conv1D attn.c_proj transposed": (
        "gpt2", "merged", lambda t: t.update({"transformer.h.0.attn.c_proj.weight":
                                              np.ascontiguousarray(t["transformer.h.0.attn.c_proj.weight"].T)})),
    "llama_tied adapter lora_B of q_proj swapped between blocks": (
        "llama_tied", "adapter", lambda t: _swap(t, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
                                                 "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight")),
    "gpt2 adapter lora_alpha = r (scale 1 instead of alpha / r)": ("gpt2", "adapter", "alpha"),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_power_a_corrupted_export_fails_the_parity(corruption, root, tiny_source, tmp_path):
    name, kind, edit = CORRUPTIONS[corruption]
    case = _case(name, root, tiny_source)
    folder = shutil.copytree(case.merged_dir if kind == "merged" else case.adapter_dir, tmp_path / kind)
    if edit == "alpha":
        path = folder / "adapter_config.json"
        config = json.loads(path.read_text())
        config["lora_alpha"] = config["r"]
        path.write_text(json.dumps(config))
    else:
        weights = folder / ("model.safetensors" if kind == "merged" else "adapter_model.safetensors")
        tensors = load_file(weights)
        edit(tensors)
        save_file(tensors, weights, metadata={"format": "pt"})
    ids = _ids(case.base.cfg.vocab_size)
    model = _hf(folder) if kind == "merged" else peft.PeftModel.from_pretrained(_hf(case.base_dir), folder).eval()
    assert _rel(_theirs(model, ids), _ours(case.adapted, ids)) > 100 * TOL


# ---------------------------------------------------------------------------
# Bad input and atomicity
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small():
    """A small adapted GPT-2 and its tokenizer, for the refusal tests."""
    tokenizer = bpe_tokenizer(TEXTS)
    return _adapt(_random_decoder(_gpt2_config(tokenizer), 13), 17), tokenizer


def _leftovers(parent) -> list[str]:
    return [n for n in os.listdir(parent) if n.startswith(".")]


def test_existing_non_empty_folder_is_refused_and_nothing_is_written(small, tmp_path):
    model, tokenizer = small
    target = tmp_path / "taken"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    named = rf"out_dir must be a new or empty folder .*{re.escape(str(target))}"
    with pytest.raises(InputError, match=named + r".*notes\.txt"):
        write_hf_folder(model, tokenizer, target)
    with pytest.raises(InputError, match=named):
        write_peft_adapter(model, target, base_model_name_or_path=None)
    assert os.listdir(target) == ["notes.txt"] and (target / "notes.txt").read_text() == "mine"
    assert _leftovers(tmp_path) == []
    (target / "sub").mkdir()
    with pytest.raises(InputError, match=r"overwrite=True replaces a folder of plain files only .*'sub'"):
        write_hf_folder(model, tokenizer, target, overwrite=True)
    assert sorted(os.listdir(target)) == ["notes.txt", "sub"]


def test_overwrite_replaces_an_earlier_export_and_an_empty_folder_is_used(small, tmp_path):
    model, tokenizer = small
    target = tmp_path / "out"
    target.mkdir()  # empty: taken as it is
    write_hf_folder(model, tokenizer, target, lora="base")
    write_hf_folder(model, tokenizer, target, overwrite=True)
    _assert_bitwise(load_language_model(str(target)).module, merge_lora(model))
    assert _leftovers(tmp_path) == []


def test_a_failure_while_writing_leaves_no_folder(small, tmp_path, monkeypatch):
    model, tokenizer = small

    def fail(folder, name, tensors):
        open(os.path.join(folder, name), "wb").write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "_put_safetensors", fail)
    with pytest.raises(OSError, match="No space left"):
        write_hf_folder(model, tokenizer, tmp_path / "new")
    with pytest.raises(OSError, match="No space left"):
        write_peft_adapter(model, tmp_path / "adapter", base_model_name_or_path=None)
    assert os.listdir(tmp_path) == []


def test_bad_arguments_are_refused_by_name(small, tmp_path):
    model, tokenizer = small
    with pytest.raises(InputError, match=r"model must have LoRA adapters"):
        write_peft_adapter(merge_lora(model), tmp_path / "a", base_model_name_or_path=None)
    with pytest.raises(InputError, match=r"lora must be one of 'merge', 'base', got 'fold'"):
        write_hf_folder(model, tokenizer, tmp_path / "b", lora="fold")
    with pytest.raises(InputError, match=r"tokenizer must be a snapaudit_jax Tokenizer, got str"):
        write_hf_folder(model, "gpt2", tmp_path / "c")
    with pytest.raises(InputError, match=r"model must be a GPT-2 or Llama decoder .*got dict"):
        write_hf_folder({}, tokenizer, tmp_path / "d")
    with pytest.raises(InputError, match=r"generation must be a mapping"):
        write_hf_folder(model, tokenizer, tmp_path / "e", generation=[("temperature", 0.7)])
    small_vocab = dataclasses.replace(model.cfg, vocab_size=tokenizer.vocab_size - 1)
    with pytest.raises(InputError, match=rf"tokenizer has {tokenizer.vocab_size} tokens, more than the model's"):
        write_hf_folder(nnx.eval_shape(lambda: GPT2(small_vocab, nnx.Rngs(0))), tokenizer, tmp_path / "f")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match=r"out_dir: must be a folder, but .*file.* is a file"):
        write_hf_folder(model, tokenizer, tmp_path / "file")
    freq = LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=4, rope_scaling=RopeScaling("freq_factors",
                                                                                   freq_factors=(1.0, 2.0)))
    with pytest.raises(InputError, match=r"rope_scaling must be 'default', 'linear' or 'llama3' .*'freq_factors'"):
        hf_config(freq)
    assert sorted(os.listdir(tmp_path)) == ["file"]  # nothing written by any refusal


# ---------------------------------------------------------------------------
# The embedded SmolLM2 (GGUF): tokenizer files generated from the GGUF metadata
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_gguf_tokenizer_exports_to_transformers(tmp_path):
    """The SmolLM2 tokenizer (rebuilt from GGUF metadata: digits split one by one, control tokens, ChatML) written
    as Hugging Face files encodes, decodes and renders the chat template as ours; with a tiny random Llama of the
    GGUF's own config (shrunk) the folder also runs in transformers. The 135M weights are not exported here
    (loading them takes ~9 s, writing 0.5 GB more): the tiny models above check the weight layout."""
    from snapaudit_jax.models import Tokenizer, default_model_path
    from snapaudit_jax.models.weights import gguf_llama_config, open_gguf

    try:
        path = default_model_path("smollm2")
    except CheckpointError as err:
        pytest.skip(f"the embedded SmolLM2 package is not installed: {err}")
    reader = open_gguf(path)  # parsing the metadata takes seconds: once
    tokenizer, gguf_cfg = Tokenizer.from_gguf(reader, path), gguf_llama_config(reader, path)
    cfg = dataclasses.replace(gguf_cfg, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    model = _random_decoder(cfg, 4)
    folder = write_hf_folder(model, tokenizer, tmp_path / "smollm2", source=path)
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    for text in PROBES + ["Pi is 3.14159 and 2024-06-01", "<|endoftext|>x<|im_end|>"]:
        ids = tokenizer.encode(text)
        assert hf.encode(text) == ids, text
        assert hf.decode(ids, skip_special_tokens=True) == tokenizer.decode(ids), text
    assert hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == \
        tokenizer.apply_chat_template(MESSAGES)
    assert (hf.eos_token, hf.bos_token, hf.pad_token) == ("<|im_end|>", "<|im_start|>", "<|im_end|>")
    raw = json.loads(open(os.path.join(folder, "config.json")).read())
    assert (raw["rope_theta"], raw["max_position_embeddings"], raw["tie_word_embeddings"]) == \
        (gguf_cfg.rope_theta, gguf_cfg.max_position_embeddings, True)
    ids = np.asarray([tokenizer.encode(PROBES[0])[:7], tokenizer.encode(PROBES[1])[:7]])
    assert _rel(_theirs(_hf(folder), ids), _ours(model, ids)) <= TOL
