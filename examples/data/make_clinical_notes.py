"""Writes examples/data/clinical_notes.jsonl: synthetic clinical-note-style records with PII, several per patient.

The records come from :func:`snapaudit_jax.finetune.synthetic.clinical_notes` (160 patients, seed 0): every name,
date, number and address is drawn at random from small lists (no real person); each record is one note
``{"patient": ..., "text": ...}``, and a patient writes 1 to 6 notes, so the file serves both record-level and
user-level DP. Run ``python examples/data/make_clinical_notes.py`` to regenerate it. A corpus of any size is made
at run time by ``[data] generate = "clinical_notes"`` instead (``examples/finetune_scale.toml``).
"""

from __future__ import annotations

import json
import os

from snapaudit_jax.finetune.synthetic import clinical_notes

if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clinical_notes.jsonl")
    with open(path, "w") as fh:
        for note in clinical_notes(160, seed=0):
            fh.write(json.dumps(note) + "\n")
    print(path)
