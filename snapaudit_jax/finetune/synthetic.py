"""Synthetic records made at run time: a corpus of any size for fine-tuning at scale, never committed.

:func:`clinical_notes` writes clinical-note-style records with PII (names, record numbers, dates of birth,
clinicians), several per patient, so that one corpus serves record-level and user-level DP; every value is drawn
at random from the small lists below (no real person). ``[data] generate = "clinical_notes"`` in a
``snapaudit finetune`` configuration trains on ``generate_units`` patients of it instead of a file (made in
memory at run time, identical for a seed: the run's fingerprint is its digest), and the shipped
``examples/data/clinical_notes.jsonl`` is its first 160 patients of seed 0.
"""

from __future__ import annotations

import functools
import hashlib
import json

import numpy as np

__all__ = ["BYTES_PER_UNIT", "GENERATORS", "MAX_UNITS", "clinical_notes", "digest", "generated"]

MAX_UNITS = 1_000_000  # patients a configuration may ask for (about 3.5 notes each, made in memory)
# The made columns hold about 1.15 KB a patient (Python strings of 3.5 notes and their patient ids, measured with
# tracemalloc at 20,000 patients; 1.8 KB at the peak while they are made): the lower bound checked against the
# machine's memory before anything is made (tokens and packed arrays come on top).
BYTES_PER_UNIT = 1024

FIRST = ("Maria James Linh Omar Grace Peter Aisha Tomas Elena Samuel Noor Daniel Hana Victor Ruth Kofi Ines Marco "
         "Leila Jonas Priya Ivan Sofia Mateo Amara Felix Yara Lucas Mei Hugo").split()
LAST = ("Garcia Okafor Nguyen Haddad Fischer Novak Rahman Silva Kowalski Moreau Jensen Rossi Tanaka Mensah Duarte "
        "Petrov Alvarez Lindqvist Osei Brennan Castillo Ferreira Horvat Ibrahim Kaur").split()
CONDITIONS = ("type 2 diabetes", "hypertension", "asthma", "migraine", "atrial fibrillation", "hypothyroidism",
              "chronic kidney disease stage 2", "major depressive disorder", "osteoarthritis of the knee",
              "iron-deficiency anaemia")
DRUGS = ("metformin 500 mg twice daily", "lisinopril 10 mg daily", "salbutamol inhaler as needed",
         "sumatriptan 50 mg as needed", "apixaban 5 mg twice daily", "levothyroxine 75 mcg daily",
         "sertraline 50 mg daily", "ibuprofen 400 mg as needed", "ferrous sulfate 200 mg daily")
VISITS = ("follow-up visit", "telephone consultation", "annual review", "urgent appointment", "medication review")
FINDINGS = ("blood pressure 138/86", "HbA1c 7.4 percent", "peak flow 410 L/min", "heart rate 92 irregular",
            "TSH 5.1 mU/L", "eGFR 72", "PHQ-9 score 14", "haemoglobin 10.9 g/dL", "no acute distress")
PLANS = ("continue current treatment", "increase the dose and review in four weeks", "refer to the specialist clinic",
         "order blood tests before the next visit", "advise lifestyle changes and review in three months")
CLINICIANS = ("Dr. Adeyemi", "Dr. Baker", "Dr. Chen", "Dr. Dubois", "Dr. Eriksen", "Dr. Farouk")


def _date(rng, lo: int, hi: int) -> str:
    return f"{int(rng.integers(lo, hi))}-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}"


def clinical_notes(n_patients: int = 160, seed: int = 0) -> list[dict[str, str]]:
    """Synthetic clinical notes: 1 to 6 notes per patient, in a seeded random order.

    Args:
      n_patients: patients ``>= 1``; patient ``p`` is ``"P%04d" % p``.
      seed: the NumPy generator's seed.

    Returns:
      ``[{"patient": ..., "text": ...}, ...]``; the same list for the same arguments on every machine (NumPy's
      PCG64 stream). Each note names its patient, record number and date of birth (the PII a leakage attack
      looks for), a visit, a clinician, a condition and its treatment, a finding and a plan.

    Raises:
      ValueError: ``n_patients < 1``.
    """
    if int(n_patients) < 1:
        raise ValueError(f"n_patients must be >= 1, got {n_patients!r}")
    rng = np.random.default_rng(seed)
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    notes = []
    for p in range(int(n_patients)):
        name = f"{pick(FIRST)} {pick(LAST)}"
        mrn = f"MRN {int(rng.integers(10**6, 10**7))}"
        dob = _date(rng, 1935, 2005)
        condition, drug = pick(CONDITIONS), pick(DRUGS)
        for _ in range(int(rng.integers(1, 7))):
            text = (f"{name}, {mrn}, born {dob}: {pick(VISITS)} on {_date(rng, 2021, 2025)}, {pick(CLINICIANS)}. "
                    f"Known {condition} on {drug}; {pick(FINDINGS)}. Plan: {pick(PLANS)}.")
            notes.append({"patient": f"P{p:04d}", "text": text})
    order = rng.permutation(len(notes))
    return [notes[i] for i in order]


GENERATORS = {"clinical_notes": clinical_notes}
"""The generators ``[data] generate`` may name: name -> ``f(n_units, seed) -> records``."""


@functools.lru_cache(maxsize=2)
def generated(name: str, n_units: int, seed: int) -> tuple[dict[str, tuple], str]:
    """The columns of generator ``name``'s corpus (as :func:`~snapaudit_jax.utils.records.read_records` gives a
    file's) and its :func:`digest`, made once per arguments (the run's preparation and its folder's stamp share
    them).

    Args:
      name: a key of :data:`GENERATORS`.
      n_units: the generator's units (patients).
      seed: its seed.

    Returns:
      ``({column: values}, sha256)``, the values as tuples.

    Raises:
      KeyError: an unknown generator.
    """
    records = GENERATORS[name](n_units, seed)
    columns = {key: tuple(r[key] for r in records) for key in records[0]}
    return columns, digest(records)


def digest(records: list[dict]) -> str:
    """SHA-256 of the records as JSON Lines (sorted keys): the fingerprint of a generated corpus.

    Args:
      records: the generated records.

    Returns:
      The hex digest, equal to ``sha256`` of the file the records would be written as.
    """
    h = hashlib.sha256()
    for record in records:
        h.update((json.dumps(record, sort_keys=True) + "\n").encode())
    return h.hexdigest()
