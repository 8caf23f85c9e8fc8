"""The black-box API (:mod:`attacks.blackbox`) against independent oracles: per-prefix float64 loops of the
model's forward pass and :func:`snapaudit_jax.dpsgd.sequence_losses` (log-likelihoods), greedy decoding of
:class:`snapaudit_jax.models.LanguageModel` (top-1 sampling), and a chi-square test against the truncated softmax
(top-k sampler; false-failure probability ALPHA, with a power check).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

pytest.importorskip("tokenizers")
pytest.importorskip("faker")

from attacks import (  # noqa: E402
    ExtractionConfig,
    continuation_logprobs,
    encode_texts,
    extraction_attack,
    frame,
    sample_texts,
    score_texts,
)
from attacks import blackbox  # noqa: E402
from snapaudit_jax.dpsgd import sequence_losses  # noqa: E402
from snapaudit_jax.models import LanguageModel  # noqa: E402
from tests.helpers.attack_lm import (  # noqa: E402
    BATCH,
    SHORT,
    slow_logprobs,
    small_lm,
)

ALPHA = 1e-6  # false-failure probability of each statistical check


@pytest.fixture(scope="module")
def lm():
    """``(model, tokenizer)``: random GPT-2 (width 32, 2 layers, 64 positions) and a BPE trained on the small
    corpus."""
    return small_lm()


@pytest.mark.slow
def test_scores_match_slow_loop_training_loss_and_do_not_recompile(lm):
    model, tok = lm
    texts = [r.text for r in SHORT]
    got = score_texts(model, tok, texts, batch_size=BATCH)
    for i, t in enumerate(texts):
        oracle = slow_logprobs(model, frame(tok, t))
        assert got.tokens[i] == len(oracle)
        np.testing.assert_allclose(got.nll[i], -oracle.sum(), rtol=1e-5)
    tokens, mask = encode_texts(tok, texts, 48)
    np.testing.assert_allclose(got.mean_nll, np.asarray(sequence_losses(model, jnp.asarray(tokens),
                                                                        jnp.asarray(mask))), rtol=1e-5)
    # Continuations: the same oracle on prefix + continuation tokens.
    lp = continuation_logprobs(model, tok, ["my pin is", "Dear"], [" 1234 5678", " Alice Smith"], batch_size=BATCH)
    for value, (p, c) in zip(lp, [("my pin is", " 1234 5678"), ("Dear", " Alice Smith")]):
        head = frame(tok, p, eos=False)
        oracle = slow_logprobs(model, head + tok.encode_continuation(c))
        np.testing.assert_allclose(value, oracle[len(head) - 1:].sum(), rtol=1e-5)
    before = blackbox._logprob_kernel._cache_size()
    score_texts(model, tok, ["Hi Carol White.", "Dear Bob Jones, call Dan Brown."], batch_size=BATCH)
    assert blackbox._logprob_kernel._cache_size() == before


@pytest.mark.slow
def test_top1_sampling_is_greedy_decoding(lm):
    """Oracle: LanguageModel.generate (greedy) on the same framed prompts."""
    model, tok = lm
    prompts = ["", "Dear", "my pin is"]
    ids = blackbox._sample_ids(model, tok, prompts, jax.random.key(0), top_k=1, max_new_tokens=12,
                               temperature=1.0, batch_size=BATCH)
    greedy = LanguageModel("tiny", model.cfg, model, tok, data_parallel=False).generate(
        [frame(tok, p, eos=False) for p in prompts], max_new_tokens=12, batch_size=BATCH)
    for mine, g in zip(ids, greedy):
        expected = [t for t in g.token_ids]
        if 0 in expected:
            expected = expected[: expected.index(0)]
        assert mine == expected


@pytest.mark.slow
def test_topk_sampler_draws_the_truncated_softmax(lm):
    """First tokens of 1600 unconditional samples with k = 5, at temperatures 1 and 1/2: none outside the top 5,
    and a chi-square test against the renormalised top-5 probabilities at that temperature (false failure
    < ALPHA each). Power: each sample set rejects the other temperature's distribution (expected p-values
    ~1e-35). Batching does not change the draws."""
    model, tok = lm
    k, n = 5, 1600
    hidden, _ = model(jnp.asarray([[0]]), jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1), bool))
    logits = np.asarray(model.logits(hidden[:, -1]), np.float64)[0]
    top = np.argsort(-logits)[:k]

    def law(temperature):
        p = np.exp((logits[top] - logits[top].max()) / temperature)
        return p / p.sum()

    for temperature, other in ((1.0, 0.5), (0.5, 1.0)):
        ids = blackbox._sample_ids(model, tok, [""] * n, jax.random.key(1), top_k=k, max_new_tokens=1,
                                   temperature=temperature, batch_size=32)
        first = np.array([row[0] if row else 0 for row in ids])  # an empty row drew the EOS token 0
        assert set(first.tolist()) <= set(top.tolist())
        observed = np.array([(first == t).sum() for t in top])
        assert stats.chisquare(observed, n * law(temperature)).pvalue > ALPHA
        assert stats.chisquare(observed, n * law(other)).pvalue < ALPHA
    again = sample_texts(model, tok, [""] * 12, jax.random.key(1), top_k=k, max_new_tokens=1, temperature=0.5,
                         batch_size=BATCH)
    assert again == [tok.decode(r) for r in ids[:12]]


def test_bad_model_inputs_name_the_limit(lm):
    model, tok = lm
    with pytest.raises(ValueError, match=r"top_k must be <= the vocabulary size \d+, got 100000"):
        sample_texts(model, tok, [""], jax.random.key(0), top_k=100000)
    with pytest.raises(ValueError, match=r"prompts\[0\] has \d+ tokens; with max_new_tokens=64 that exceeds"):
        sample_texts(model, tok, ["Dear Alice"], jax.random.key(0), max_new_tokens=64)
    with pytest.raises(ValueError, match=r"texts\[0\] has \d+ tokens framed, more than length=4"):
        encode_texts(tok, ["Dear Alice Smith"], 4)
    with pytest.raises(ValueError, match=r"give at most one of baseline_model and baseline_pii"):
        extraction_attack(model, tok, SHORT, ExtractionConfig(), jax.random.key(0), baseline_model=model,
                          baseline_pii=[])
