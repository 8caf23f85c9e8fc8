"""The retrieval attacker (``conformal.attackers``) against a scikit-learn TF-IDF + NumPy cosine/softmax oracle."""

from __future__ import annotations


import numpy as np
import pytest

from conformal.attackers import RetrievalAttacker


# --------------------------------------------------------------------------- attackers vs oracles


def test_retrieval_posterior_matches_sklearn_numpy_oracle():
    from sklearn.feature_extraction.text import TfidfVectorizer

    profiles = ["nurse in Leeds who runs marathons", "baker from Cardiff, keeps bees",
                "Leeds baker and marathon runner", "retired pilot in Bath",
                "teacher in Cardiff who sings", "surgeon, York, rows"]
    docs = ["the marathon runner from Leeds", "a pilot who retired to Bath", "bees and bread in Cardiff",
            "nothing matching at all"]
    att = RetrievalAttacker(profiles, temperature=0.3, chunk=3)  # chunk 3: a padded last chunk
    vec = TfidfVectorizer(sublinear_tf=True, stop_words="english", lowercase=True).fit(profiles)
    p, q = vec.transform(profiles).toarray(), vec.transform(docs).toarray()
    sims = q @ p.T
    np.testing.assert_allclose(att.similarities(docs), sims, atol=1e-6)
    z = sims / 0.3
    expected = np.exp(z - z.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(att.posterior(docs), expected, atol=1e-6)
    np.testing.assert_allclose(att.posterior(docs)[3], np.full(6, 1 / 6), atol=1e-6)  # no overlap: uniform
    with pytest.raises(ValueError, match="temperature"):
        RetrievalAttacker(profiles, temperature=0.0)
    with pytest.raises(ValueError, match="profiles must not be empty"):
        RetrievalAttacker([])
