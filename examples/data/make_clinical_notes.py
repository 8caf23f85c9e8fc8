"""Writes examples/data/clinical_notes.jsonl: synthetic clinical-note-style records with PII, several per patient.

Every name, date, number and address is drawn at random from the small lists below (no real person); each record
is one note ``{"patient": ..., "text": ...}``, and a patient writes 1 to 6 notes, so the file serves both
record-level and user-level DP. Run ``python examples/data/make_clinical_notes.py`` to regenerate it (seeded).
"""

from __future__ import annotations

import json
import os

import numpy as np

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


def make_notes(n_patients: int = 160, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    notes = []
    for p in range(n_patients):
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


if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clinical_notes.jsonl")
    with open(path, "w") as fh:
        for note in make_notes():
            fh.write(json.dumps(note) + "\n")
    print(path)
