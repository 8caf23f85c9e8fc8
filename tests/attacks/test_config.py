"""The PII experiment's configuration (:mod:`attacks.config`): every bad key is refused at load time, naming the
field, and the canary design the one-run bounds need is enforced before anything is written (also for a
configuration built in code and on the command line)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest

from attacks.config import load_pii_config
from attacks.run import run_pii
from snapaudit_jax.utils.config import ConfigFileError
from tests.helpers.pii import tiny_pii_toml, write_toml

TINY = tiny_pii_toml("{variants}")


@pytest.mark.parametrize("old, new, match", [
    ("n_layer = 1", "n_layer = 0", "model: n_layer"),
    ("steps = 6", "steps = 6\nbogus = 1", "training: unknown key"),
    ("n_test = 16", "n_test = 80", "run.n_test"),
    ("{variants}", 'variants = ["dp", "nope"]', "variants"),
    ("n_canaries = 16", "n_canaries = 1", "canaries: n_canaries"),
    ("n_candidates = 5", "n_candidates = 1", "inference: n_candidates"),
    ("learning_rate = 1e-2", "learning_rate = -1.0", "training: learning_rate"),
])
def test_config_errors_name_the_field(tmp_path, old, new, match):
    text = TINY.replace(old, new) if old != "{variants}" else TINY.format(variants=new)
    with pytest.raises(ConfigFileError, match=match):
        load_pii_config(write_toml(tmp_path, text.replace("{variants}", "")))


@pytest.mark.slow
def test_cli_exit_code_on_bad_config(tmp_path):
    path = write_toml(tmp_path, TINY.format(variants="").replace("n_embd = 32", "n_embd = 33"))
    proc = subprocess.run([sys.executable, "-m", "snapaudit_jax", "pii", path, "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "n_embd" in proc.stderr and "33" in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_one_run_audit_refuses_unfair_canary_insertion_before_writing(tmp_path):
    """epsilon_audited is our one-run bound of an (eps, delta) claim, and jax_privacy's one-run value its
    cross-reference: both need canaries inserted with probability 1/2 (Steinke et al. 2023), so any other
    insert_probability is a config error at load time (and in run_pii for a config built in code), before
    anything is written; with audit.one_run and audit.jax_privacy off it is allowed."""
    unfair = TINY.format(variants="").replace("n_canaries = 16", "n_canaries = 16\ninsert_probability = 0.8")
    ours = ("canaries.insert_probability: must be 1/2 for our one-run bound of an (eps, delta) claim with delta = ")
    with pytest.raises(ConfigFileError, match=re.escape(ours) + r".*got 0.8; set it to 0.5 or set audit.one_run"):
        load_pii_config(write_toml(tmp_path, unfair))
    message = ("canaries.insert_probability: the one-run bound (Steinke et al. 2023) requires each canary inserted "
               "independently with probability 1/2, got 0.8; set it to 0.5 or set audit.jax_privacy = false")
    with pytest.raises(ConfigFileError, match=re.escape(message)):
        load_pii_config(write_toml(tmp_path, unfair + "\n[audit]\none_run = false\n", "jp.toml"))
    allowed = load_pii_config(write_toml(tmp_path, unfair + "\n[audit]\njax_privacy = false\none_run = false\n",
                                         "off.toml"))
    assert allowed.canaries.insert_probability == 0.8 and not allowed.audit.jax_privacy
    built = dataclasses.replace(allowed, audit=dataclasses.replace(allowed.audit, jax_privacy=True))
    with pytest.raises(ConfigFileError, match=re.escape(message)):
        run_pii(built, str(tmp_path / "out"), progress=False)
    assert not (tmp_path / "out").exists()
    proc = subprocess.run([sys.executable, "-m", "snapaudit_jax", "pii", write_toml(tmp_path, unfair), "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "canaries.insert_probability" in proc.stderr and "got 0.8" in proc.stderr
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- sizes planned before any data


def test_gpt2_parameters_count_the_model_every_variant_trains():
    """The planner's formula against the Flax GPT-2 itself (the oracle): the same number of parameters."""
    import jax
    from flax import nnx

    from attacks.config import ModelConfig, gpt2_parameters
    from snapaudit_jax.models.config import GPT2Config
    from snapaudit_jax.models.decoders import GPT2

    for m in (ModelConfig(n_layer=2, n_embd=12, n_head=3, max_length=7, vocab_size=301),):
        cfg = GPT2Config(vocab_size=m.vocab_size, n_positions=m.max_length, n_embd=m.n_embd, n_layer=m.n_layer,
                         n_head=m.n_head, n_inner=4 * m.n_embd)
        model = GPT2(cfg, nnx.Rngs(0))
        count = sum(x.size for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
        assert sum(gpt2_parameters(m).values()) == count


def test_check_sizes_counts_the_optimizer_state_and_the_tokenizer_tables(monkeypatch):
    import dataclasses

    from attacks.config import ModelConfig, PIIConfig, check_sizes, gpt2_parameters
    from snapaudit_jax.utils import memory

    config = PIIConfig(model=ModelConfig(base="scratch", method="full"))
    params = sum(gpt2_parameters(config.model).values())
    adam = params * 16 + config.model.vocab_size * 57  # params, grads, two moments; the BPE trainer's reservation
    monkeypatch.setattr(memory, "available_bytes", lambda: adam)
    check_sizes(config)
    monkeypatch.setattr(memory, "available_bytes", lambda: adam - 1)
    with pytest.raises(ConfigFileError, match="model.n_layer: a GPT-2 of .* trained with adamw would need"):
        check_sizes(config)
    sgd = dataclasses.replace(config, training=dataclasses.replace(config.training, optimizer="sgd"))
    check_sizes(sgd)  # no moments: 8 bytes a parameter


def test_the_tokenizer_trainer_is_never_asked_for_a_vocabulary_it_would_abort_on(monkeypatch):
    """The tokenizers trainer aborts the process (no exception) when its vocab_size tables cannot be allocated:
    train_tokenizer refuses first."""
    from attacks.data import train_tokenizer
    from snapaudit_jax.utils import memory
    from snapaudit_jax.utils.errors import InputError

    with pytest.raises(InputError, match="vocab_size must be <= 2147483647"):
        train_tokenizer(["a b"], 2**31)
    monkeypatch.setattr(memory, "available_bytes", lambda: 57 * 10**6 - 1)
    with pytest.raises(InputError, match="vocab_size: the BPE trainer's tables of 1000000 entries would need"):
        train_tokenizer(["a b"], 10**6)
    monkeypatch.setattr(memory, "available_bytes", lambda: 57 * 10**6)
    assert train_tokenizer(["a b"], 10**6).vocab_size >= 257


def test_the_dp_variants_clip_on_the_configured_path(tmp_path):
    """``[training] clipping`` reaches the DP variants' DPSGDConfig (the default ``auto`` too); the non-private
    variants never clip."""
    from attacks.run import _dpsgd_config

    for line, want in (("", "auto"), ('clipping = "book_keeping"\n', "book_keeping"),
                       ('clipping = "ghost"\n', "ghost")):
        text = TINY.format(variants="").replace("steps = 6", "steps = 6\n" + line)
        cfg = load_pii_config(write_toml(tmp_path, text))
        assert cfg.training.clipping == want
        assert _dpsgd_config(cfg, True, 100).clipping == want
        assert _dpsgd_config(cfg, False, 100).non_private


def test_every_variant_trains_in_the_configured_layout(tmp_path):
    """``[training] layers`` reaches every variant's DPSGDConfig, DP and non-private alike (the default ``auto``
    too); another value is refused naming the key."""
    from attacks.run import _dpsgd_config

    for line, want in (("", "auto"), ('layers = "scan"\n', "scan"), ('layers = "unrolled"\n', "unrolled")):
        text = TINY.format(variants="").replace("steps = 6", "steps = 6\n" + line)
        cfg = load_pii_config(write_toml(tmp_path, text))
        assert cfg.training.layers == want
        assert _dpsgd_config(cfg, True, 100).layers == want == _dpsgd_config(cfg, False, 100).layers
    text = TINY.format(variants="").replace("steps = 6", 'steps = 6\nlayers = "stacked"')
    refused = r"layers must be one of 'auto', 'scan', 'unrolled', got 'stacked' \(training\.layers\)"
    with pytest.raises(ConfigFileError, match=refused):
        load_pii_config(write_toml(tmp_path, text))


def test_vocab_chunk_reaches_every_variant_and_a_negative_one_is_refused(tmp_path):
    """``[training] vocab_chunk`` (memory only) reaches every variant's DPSGDConfig; ``0`` (default) is whole
    logits; a negative value is refused naming the key."""
    from attacks.run import _dpsgd_config

    for line, want in (("", None), ("vocab_chunk = 4096\n", 4096)):
        text = TINY.format(variants="").replace("steps = 6", "steps = 6\n" + line)
        cfg = load_pii_config(write_toml(tmp_path, text))
        assert _dpsgd_config(cfg, True, 100).vocab_chunk == want == _dpsgd_config(cfg, False, 100).vocab_chunk
    text = TINY.format(variants="").replace("steps = 6", "steps = 6\nvocab_chunk = -1")
    with pytest.raises(ConfigFileError, match=r"vocab_chunk must be an integer >= 0, got -1 \(training\.vocab_chunk\)"):
        load_pii_config(write_toml(tmp_path, text))


def test_clipped_sum_dtype_reaches_the_dp_variants_and_a_per_record_one_is_refused(tmp_path):
    """``[training] clipped_sum_dtype`` reaches the DP variants' DPSGDConfig; with ``clipping = "per_record"`` it
    is refused naming the key."""
    from attacks.run import _dpsgd_config

    text = TINY.format(variants="").replace("steps = 6", "steps = 6\nclipped_sum_dtype = \"bfloat16\"")
    assert _dpsgd_config(load_pii_config(write_toml(tmp_path, text)), True, 100).clipped_sum_dtype == "bfloat16"
    text = text.replace("steps = 6", "steps = 6\nclipping = \"per_record\"")
    with pytest.raises(ConfigFileError, match=r"clipped_sum_dtype = 'bfloat16' needs the book-keeping path, got "
                                              r"clipping = 'per_record'"):
        load_pii_config(write_toml(tmp_path, text))


def test_an_exposure_sample_larger_than_the_secret_space_is_refused(tmp_path):
    text = tiny_pii_toml().replace("n_canaries = 16", "n_canaries = 16\ndigits = 4") + "\n[exposure]\nsamples = 9990\n"
    with pytest.raises(ConfigFileError, match=r"exposure.samples: must be <= 10\*\*canaries.digits - "
                                              r"canaries.n_canaries = 9984 .*got 9990"):
        load_pii_config(write_toml(tmp_path, text))
    assert load_pii_config(write_toml(tmp_path, text.replace("9990", "9984"))).exposure.samples == 9984
