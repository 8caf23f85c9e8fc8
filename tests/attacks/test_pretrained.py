"""``snapaudit pii`` on the fine-tuning path: every variant fine-tunes a copy of a pretrained base, and the
untouched base is the public baseline.

Oracles: the base as loaded afresh from its folder (bitwise), the exported Hugging Face tensors of a model with
its adapters dropped (:func:`snapaudit_jax.finetune.export.hf_tensors`, ``lora="base"``), and the base's own
samples drawn again outside the run with the run's key.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from attacks.config import load_pii_config
from snapaudit_jax.utils.config import ConfigFileError
from tests.helpers.pii import tiny_pii_toml, tiny_pretrained_pii_toml, write_toml


def _refusal(tmp_path, text: str, match: str) -> None:
    with pytest.raises(ConfigFileError, match=match):
        load_pii_config(write_toml(tmp_path, text))


def test_keys_of_another_base_or_method_are_refused_before_any_model_is_read(tmp_path):
    """A key that would be ignored for the configured base or method is an error naming it (no base is read:
    ``"smollm2"`` would take seconds)."""
    pre = tiny_pretrained_pii_toml("smollm2")
    _refusal(tmp_path, pre.replace('method = "lora"', 'method = "lora"\nn_layer = 2'),
             r"model.n_layer: applies to base = 'scratch' only \(the pretrained base 'smollm2' has its own shape")
    _refusal(tmp_path, pre.replace('method = "lora"', 'method = "lora"\nvocab_size = 500'),
             "model.vocab_size: applies to base = 'scratch' only")
    _refusal(tmp_path, pre.replace("n_test = 16", "n_test = 16\npublic_records = 60"),
             r"run.public_records: applies to model.base = 'scratch' only \(the pretrained base 'smollm2' is the "
             "public baseline\\), got 60")
    _refusal(tmp_path, tiny_pretrained_pii_toml("smollm2", method="full").replace('method = "full"',
                                                                                 'method = "full"\nrank = 4'),
             "model.rank: applies to method = 'lora' only, got 4 with method = 'full'")
    _refusal(tmp_path, tiny_pii_toml().replace('method = "full"', 'method = "lora"'),
             r"method must be 'full' with base = 'scratch'.*\(model.method\)")
    _refusal(tmp_path, tiny_pretrained_pii_toml("smollm2").replace('method = "lora"', 'method = "adapters"'),
             r"method must be one of.*(model.method)")


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    """A tiny random Llama folder whose BPE was trained on the experiment's corpus (the "pretrained" base)."""
    from attacks.corpus import make_corpus
    from tests.helpers.tiny_llm import make_tiny_llm_folder

    cfg = load_pii_config(write_toml(tmp_path_factory.mktemp("cfg"), tiny_pii_toml()))
    return make_tiny_llm_folder(str(tmp_path_factory.mktemp("base") / "tiny"), make_corpus(cfg.corpus).texts)


def _prepared(folder, tmp_path, method="lora", run=""):
    from attacks.data import prepare_data
    from snapaudit_jax.finetune.base import load_base
    from snapaudit_jax.utils.progress import RunLog

    cfg = load_pii_config(write_toml(tmp_path, tiny_pretrained_pii_toml(folder, method=method, run=run)))
    return cfg, prepare_data(cfg, RunLog(False)), load_base(folder).module


def _tensors(model, lora="merge"):
    from snapaudit_jax.finetune.export import hf_tensors

    return hf_tensors(model, lora=lora)


@pytest.mark.slow
def test_lora_variants_train_adapters_only_and_leave_the_base_bitwise(tiny_base, tmp_path):
    from attacks.run import initial_model, train_variant
    from snapaudit_jax.finetune.lora import lora_adapters
    from snapaudit_jax.utils.progress import RunLog

    cfg, data, base = _prepared(tiny_base, tmp_path)
    assert data.public is None and data.tokenizer.vocab_size == base.cfg.vocab_size
    before = _tensors(base)
    first, second = initial_model(cfg, data, base)[0], initial_model(cfg, data, base)[0]
    start = lora_adapters(first)
    assert start and all(np.array_equal(a, lora_adapters(second)[k][0]) for k, (a, _, _) in start.items())
    texts = [r.text for r in data.train]
    for name, dp in (("undefended", False), ("dp", True)):
        model, report = train_variant(name, texts, dp, cfg, data, str(tmp_path / "out"), RunLog(False), base)
        assert report.dp is dp
        # the base's weights inside the variant: bitwise the base's
        frozen = _tensors(model, lora="base")
        assert frozen.keys() == before.keys() and all(np.array_equal(frozen[k], before[k]) for k in before)
        moved = lora_adapters(model)
        assert moved.keys() == start.keys()
        for block in {b for b, _ in start}:  # every block's adapters trained (B starts at zero)
            assert any(np.abs(np.asarray(moved[k][1])).max() > 0 for k in moved if k[0] == block), (name, block)
        merged = _tensors(model)
        assert any(not np.array_equal(merged[k], before[k]) for k in before)  # power: the merge sees them
    after = _tensors(base)
    assert all(np.array_equal(after[k], before[k]) for k in before)  # the public baseline: untouched


@pytest.mark.slow
def test_full_fine_tuning_moves_every_tensor_of_a_copy_and_never_the_base(tiny_base, tmp_path):
    from attacks.run import train_variant
    from snapaudit_jax.finetune.base import load_base
    from snapaudit_jax.utils.progress import RunLog

    cfg, data, base = _prepared(tiny_base, tmp_path, method="full")
    model, _ = train_variant("undefended", [r.text for r in data.train], False, cfg, data, str(tmp_path / "out"),
                             RunLog(False), base)
    trained, fresh = _tensors(model), _tensors(load_base(tiny_base).module)
    assert trained.keys() == fresh.keys()
    assert [k for k in fresh if np.array_equal(trained[k], fresh[k])] == []
    assert all(np.array_equal(_tensors(base)[k], fresh[k]) for k in fresh)


@pytest.mark.slow
def test_dp_noise_is_secret_by_default_and_replayable_only_with_a_noise_seed(tiny_base, tmp_path):
    from attacks.run import train_variant
    from snapaudit_jax.dpsgd.keys import RANDOMNESS
    from snapaudit_jax.finetune.lora import lora_adapters
    from snapaudit_jax.utils.progress import RunLog

    def adapters(run, folder):
        (tmp_path / folder).mkdir()
        cfg, data, base = _prepared(tiny_base, tmp_path / folder, run=run)
        out = tmp_path / folder / "out"
        model, report = train_variant("dp", [r.text for r in data.train], True, cfg, data, str(out), RunLog(False),
                                      base)
        return {k: np.asarray(b) for k, (_, b, _) in lora_adapters(model).items()}, report, out

    secret = [adapters("", f"s{i}") for i in range(2)]
    for _, report, out in secret:
        assert report.randomness == RANDOMNESS["secret"] and (out / "checkpoints" / "run_key.json").is_file()
    assert any(not np.array_equal(secret[0][0][k], secret[1][0][k]) for k in secret[0][0])
    seeded = [adapters("noise_seed = 5", f"n{i}") for i in range(2)]
    assert all(np.array_equal(seeded[0][0][k], seeded[1][0][k]) for k in seeded[0][0])
    assert seeded[0][1].randomness == RANDOMNESS["seed"]
    assert not (seeded[0][2] / "checkpoints" / "run_key.json").exists()


@pytest.mark.slow
def test_a_run_takes_the_base_as_its_public_baseline(tiny_base, tmp_path, monkeypatch):
    """The PII not counted as leaked is what the untouched base generates: the run's baseline file equals the
    base's own samples drawn again outside the run with the run's key (a stand-in tagger that tags each sample's
    first word makes the sets non-empty, so a run using any other model fails)."""
    import attacks.run as run_module
    from attacks.extraction import extraction_samples
    from attacks.run import run_pii
    from snapaudit_jax.finetune.base import load_base

    def first_words(samples, tagger, labels):
        return {("PERSON", s.split()[0].lower()) for s in samples if s.split()}

    monkeypatch.setattr(run_module, "tagged_pii", first_words)
    cfg = load_pii_config(write_toml(tmp_path, tiny_pretrained_pii_toml(tiny_base, variants='variants = ["dp"]')))
    out = tmp_path / "out"
    result = run_pii(cfg, str(out), progress=False)
    assert set(result["results"]) == {"dp"} and result["results"]["dp"]["epsilon_claimed"] <= 8.0 + 1e-9
    stored = {tuple(p) for p in json.loads((out / "variants" / "baseline_pii.json").read_text())}
    lm = load_base(tiny_base)
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(cfg.seed), 1000), 99)
    n = cfg.extraction.n_baseline_samples or cfg.extraction.n_samples
    again = first_words(extraction_samples(lm.module, lm.tokenizer, n, key, cfg.extraction), None, None)
    assert stored and stored == again
    full = json.loads((out / "results_full.json").read_text())
    assert full["baseline"]["model"] == tiny_base and full["baseline"]["kind"] == "pretrained base, untouched"
    assert full["corpus"]["public_records"] is None
    assert sorted(os.listdir(out / "checkpoints")) == ["dp", "run_key.json"]  # no baseline was trained
    # exposure: snapaudit finetune's function on the released model (resumed from its final checkpoint)
    from attacks.corpus import insert_canaries
    from attacks.data import prepare_data
    from attacks.run import train_variant
    from snapaudit_jax.finetune.memorization import canary_exposure
    from snapaudit_jax.utils.progress import RunLog

    data = prepare_data(cfg, RunLog(False))
    texts = insert_canaries([r.text for r in data.train], data.canaries)
    model, _ = train_variant("dp", texts, True, cfg, data, str(out), RunLog(False), lm.module)
    expected = canary_exposure(model, lm.tokenizer, data.canaries, key=jax.random.fold_in(jax.random.fold_in(
        jax.random.key(cfg.seed), 1000), 7), exact_limit=cfg.exposure.exact_limit, sample_size=cfg.exposure.samples)
    stored = full["variants"]["dp"]["exposure"]
    assert stored["median_inserted"] == pytest.approx(expected.headline()["median_inserted"], rel=1e-6)
    assert result["results"]["dp"]["canary_exposure"] == stored["median_inserted"]
    assert 0 <= stored["median_inserted"] <= stored["max_possible"] == pytest.approx(np.log2(10.0**8))


@pytest.mark.slow
def test_unreadable_base_weights_are_refused_before_the_folder_is_made(tiny_base, tmp_path):
    """The header reads (tokenizer, config), the weights do not: the run stops naming model.base and writes
    nothing (the weights load before the run folder is claimed)."""
    import shutil

    from attacks.run import run_pii

    broken = tmp_path / "broken"
    shutil.copytree(tiny_base, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    cfg = load_pii_config(write_toml(tmp_path, tiny_pretrained_pii_toml(str(broken))))
    out = tmp_path / "out"
    with pytest.raises(ConfigFileError, match="model.base: "):
        run_pii(cfg, str(out), progress=False)
    assert not out.exists()


@pytest.mark.slow
def test_the_base_header_is_read_once_per_run_and_again_when_its_files_change(tiny_base, tmp_path, monkeypatch):
    """Loading the configuration and preparing the data both need the header: the second answer comes from
    memory while the base's files are unchanged; a rewritten ``config.json`` is read afresh."""
    import shutil

    from attacks.data import prepare_data
    from snapaudit_jax.finetune.base import base_header
    from snapaudit_jax.models import weights
    from snapaudit_jax.utils.progress import RunLog

    folder = tmp_path / "base"
    shutil.copytree(tiny_base, folder)
    reads = []
    real = weights.read_config
    monkeypatch.setattr(weights, "read_config", lambda path: reads.append(path) or real(path))
    cfg = load_pii_config(write_toml(tmp_path, tiny_pretrained_pii_toml(str(folder))))
    data = prepare_data(cfg, RunLog(False))
    assert len(reads) == 1
    tokenizer, arch = base_header(str(folder))
    assert tokenizer is data.tokenizer and len(reads) == 1
    raw = json.loads((folder / "config.json").read_text())
    raw["max_position_embeddings"] = 96
    (folder / "config.json").write_text(json.dumps(raw) + " ")  # another size, whatever the clock's resolution
    tokenizer2, arch2 = base_header(str(folder))
    assert len(reads) == 2 and arch2.max_position_embeddings == 96 != arch.max_position_embeddings


def test_dp_variants_whose_noise_sampler_would_add_over_a_tenth_of_delta_are_refused_before_the_folder_is_made(
        tiny_base, tmp_path, monkeypatch):
    """The DP variants' adapters at the target epsilon and steps, with the sampler's tail probability set to pass a
    tenth of delta: refused naming training.delta and the adapters' count, nothing written; at the real
    probability the check passes (the other tests run such configurations)."""
    from flax import nnx

    from attacks.run import _check_noise_sampler, initial_model, run_pii
    from snapaudit_jax.dpsgd import noise

    cfg, data, base = _prepared(tiny_base, tmp_path)
    model, trainable = initial_model(cfg, data, base)
    coordinates = sum(int(np.size(x)) for x in jax.tree.leaves(nnx.state(model, trainable)))
    n = len(data.train) + int(data.canaries.inserted.sum())
    delta = cfg.training.delta if cfg.training.delta is not None else 1 / (10 * n)
    _check_noise_sampler(cfg, data, base)
    added = noise.sampler_delta(cfg.training.epsilon, cfg.training.steps, coordinates)
    monkeypatch.setattr(noise, "TAIL_PROBABILITY", 2.0**-71 * 0.1 * delta / added * 1.01)
    out = tmp_path / "out"
    with pytest.raises(ConfigFileError, match=rf"training.delta: the noise sampler's tails would add .* "
                                              rf"d = {coordinates} trainable parameters"):
        run_pii(cfg, str(out), progress=False)
    assert not out.exists()
