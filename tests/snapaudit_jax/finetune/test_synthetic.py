"""The synthetic corpus made at run time (``snapaudit_jax.finetune.synthetic``).

Oracles: the shipped ``examples/data/clinical_notes.jsonl`` (the generator's first 160 patients of seed 0, record
for record) and hashlib's SHA-256 of that file for the digest.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from snapaudit_jax.finetune.config import load_finetune_config
from snapaudit_jax.finetune.synthetic import GENERATORS, clinical_notes, digest, generated
from tests.helpers.paths import ROOT

SHIPPED = os.path.join(ROOT, "examples", "data", "clinical_notes.jsonl")


def test_the_shipped_notes_are_the_generators_and_the_digest_is_the_files():
    """The committed file is clinical_notes(160, seed 0) line for line, and digest() is its SHA-256; another seed
    makes another corpus of the same form."""
    with open(SHIPPED) as fh:
        shipped = [json.loads(line) for line in fh]
    notes = clinical_notes(160, seed=0)
    assert notes == shipped
    with open(SHIPPED, "rb") as fh:
        assert digest(notes) == hashlib.sha256(fh.read()).hexdigest()
    other = clinical_notes(160, seed=1)
    assert other != notes and digest(other) != digest(notes)
    assert {r["patient"] for r in other} == {f"P{p:04d}" for p in range(160)}
    assert all(set(r) == {"patient", "text"} and r["text"].startswith(r["text"].split(",")[0]) for r in other)


def test_sizes_columns_and_refusals():
    """Every patient writes 1 to 6 notes naming them, the columns are the records' (cached per arguments), and
    fewer than one patient is refused."""
    notes = clinical_notes(500, seed=2)
    per = {}
    for r in notes:
        per.setdefault(r["patient"], []).append(r["text"])
    assert len(per) == 500 and all(1 <= len(texts) <= 6 for texts in per.values())
    assert all(len({t.split(":")[0] for t in texts}) == 1 for texts in per.values())  # one name, MRN, birth date
    columns, sha = generated("clinical_notes", 500, 2)
    assert columns["patient"] == tuple(r["patient"] for r in notes) and sha == digest(notes)
    assert generated("clinical_notes", 500, 2)[0] is columns
    assert set(GENERATORS) == {"clinical_notes"}
    with pytest.raises(ValueError, match="n_patients must be >= 1"):
        clinical_notes(0)


@pytest.mark.parametrize("name, epsilon, method", [("finetune_scale.toml", 8.0, "lora"),
                                                   ("finetune_scale_eps3.toml", 3.0, "lora"),
                                                   ("finetune_scale_full.toml", 8.0, "full")])
def test_the_scale_examples_are_sized_as_the_scale_run_needs(name, epsilon, method):
    """The scale examples load, make their corpus at run time (no data file) and have the sizes a DP run needs to
    learn: >= 20,000 units (patients), an expected batch >= 512, >= 200 steps, delta = 1 / (10 N) (0 in the file),
    epsilon 8 or 3 per patient, the non-private twin, canaries; their comments name them."""
    config = load_finetune_config(os.path.join(ROOT, "examples", name))
    data, ft, privacy = config.data, config.finetune, config.privacy
    assert data.generate == "clinical_notes" and data.path == "" and data.generate_units >= 20_000
    assert privacy.unit == "user" and data.user_field == "patient" and privacy.delta == 0.0
    assert privacy.target_epsilon == epsilon and ft.method == method
    assert ft.batch_size >= 512 and ft.steps >= 200 and config.baseline and config.canaries.n_canaries > 0
    with open(os.path.join(ROOT, "examples", name)) as fh:
        assert fh.readline().startswith(f"# snapaudit finetune examples/{name} --out runs/")


def test_a_corpus_larger_than_the_memory_is_refused_before_it_is_made(monkeypatch):
    """``generate_units`` is checked against the machine's memory (the made columns' measured bytes a patient, a
    lower bound) when the configuration is read, naming ``data.generate_units``; the boundary passes."""
    from snapaudit_jax.finetune.synthetic import BYTES_PER_UNIT
    from snapaudit_jax.utils import memory
    from snapaudit_jax.utils.config import ConfigFileError

    path = os.path.join(ROOT, "examples", "finetune_scale.toml")
    units = load_finetune_config(path).data.generate_units
    monkeypatch.setattr(memory, "available_bytes", lambda: units * BYTES_PER_UNIT - 1)
    with pytest.raises(ConfigFileError, match=rf"data: generate_units: {units} generated patients \(about 3.5 notes "
                                              r"each, made in memory\) would need at least .* of memory.*"
                                              r"\(data.generate_units\)"):
        load_finetune_config(path)
    monkeypatch.setattr(memory, "available_bytes", lambda: units * BYTES_PER_UNIT)
    assert load_finetune_config(path).data.generate_units == units
