"""Random token batches shared by the model tests."""

from __future__ import annotations

import numpy as np


def left_padded(lengths, seed: int = 0, vocab: int = 97) -> tuple[np.ndarray, np.ndarray]:
    """Random ``(B, L)`` int64 ids in ``[3, vocab)`` and their ``(B, L)`` 0/1 mask, left-padded with id 0."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = np.zeros((len(lengths), width), np.int64)
    mask = np.zeros((len(lengths), width), np.int64)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = rng.integers(3, vocab, n)
        mask[i, width - n:] = 1
    return ids, mask
