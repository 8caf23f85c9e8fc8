"""The profile attacker's identity scores and attribute sets (``conformal.profile``) against a per-attribute loop."""

from __future__ import annotations


import numpy as np
import pytest

from conformal import candidate_scores
from conformal.profile import attribute_sets, identity_scores


# --------------------------------------------------------------------------- attackers vs oracles


def test_identity_scores_match_attribute_loop_and_sets():
    rng = np.random.default_rng(5)
    attributes = {"city": ("Leeds", "York", "Bath"), "job": ("nurse", "baker", "pilot", "teacher")}
    n, m = 7, 11
    freqs = {a: rng.dirichlet(np.ones(len(v)), n).astype(np.float32) for a, v in attributes.items()}
    cand = {"city": [attributes["city"][i % 3] for i in range(m)],
            "job": [None if i == 4 else attributes["job"][(i * 7) % 4] for i in range(m)]}
    for score in ("aps", "rank", "prob"):
        got = identity_scores(freqs, attributes, cand, score)
        per = {a: np.asarray(candidate_scores(freqs[a], score)) for a in attributes}
        for i in range(n):
            for y in range(m):
                expect = max(0.0 if cand[a][y] is None else float(per[a][i, attributes[a].index(cand[a][y])])
                             for a in attributes)
                assert got[i, y] == np.float32(expect)
        # identity set at qhat == the candidates whose known attributes all lie in the certified attribute sets
        qhat = float(np.quantile(got, 0.6))
        sets = attribute_sets(freqs, qhat, score)
        for i in range(n):
            consistent = [all(cand[a][y] is None or sets[a][i, attributes[a].index(cand[a][y])] for a in attributes)
                          for y in range(m)]
            np.testing.assert_array_equal(got[i] <= qhat, consistent)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        identity_scores(freqs, attributes, {"city": ["Paris"] * m, "job": cand["job"]})
