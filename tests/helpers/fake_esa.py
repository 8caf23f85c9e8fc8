"""A scripted language model and a hashing sentence embedder: ESA's mechanics without any real model.

``ScriptedLM`` answers ESA's prompts by rule, like a perfectly leaking model: a copy prompt with
``" <y1>."`` when ``y1`` (the canary's secret) is in its context, else ``" <y2>."``; a prompt of the
0-shot candidate stage (``"Random number: N"``) with ``candidate(N, i)``, ``i`` counting the candidate
prompts it has computed. It records every prompt it computes, so tests count what reached the model.
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

import numpy as np

from snapaudit_jax.dpicl.pipelines import prompts as P


class Generation(NamedTuple):
    text: str


class ScriptedLM:
    name = "scripted-lm"

    def __init__(self, signals: tuple[str, str], candidate):
        self.signals, self.candidate = signals, candidate
        self.computed: list[str] = []
        self.candidate_prompts: list[str] = []

    def chat_prompt(self, user, system=None):
        return user if system is None else f"{system}\n\n{user}"

    def generate(self, prompts, max_new_tokens, batch_size=8):
        out = []
        for p in prompts:
            self.computed.append(p)
            seed = re.search(r"^Random number: (\d+)$", p, flags=re.M)
            if seed:
                out.append(self.candidate(int(seed.group(1)), len(self.candidate_prompts)))
                self.candidate_prompts.append(p)
            else:
                context = p.split("\n\n" + P.COPY_INSTRUCTION)[0]
                y1, y2 = self.signals
                out.append(f" {y1}." if y1 in context else f" {y2}.")
        return [Generation(t) for t in out]


class HashEmbedder:
    """Unit vectors ``(n, 16)`` seeded by each text's SHA-256: equal texts, equal embeddings."""

    name = "hash-embedder"

    def embed(self, texts, batch_size=16):
        rows = []
        for t in texts:
            rng = np.random.default_rng(list(hashlib.sha256(t.encode()).digest()[:8]))
            v = rng.normal(size=16)
            rows.append(v / np.linalg.norm(v))
        return np.asarray(rows, np.float32)
