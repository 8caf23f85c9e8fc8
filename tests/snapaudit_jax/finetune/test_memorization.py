"""Memorization evidence (:mod:`snapaudit_jax.finetune.memorization`) on a tiny GPT-2 that memorised one canary.

Oracles: every one of the 10^4 four-digit secrets scored one at a time by a float64 log-softmax over the logits of a
plain forward pass, and the exact rank counted by a loop; the one-run bound against direct calls of
:func:`snapaudit_jax.estimation.one_run.one_run_audit` per repetition group and against guesses counted by hand
(each pair's right "in" and "out" guesses walked one canary at a time, the pair's bound from ``one_run_epsilon``).
The model (width 32, 2 layers, a 300-token BPE) is trained with plain Adam on four filler texts and one canary
repeated four times (about 5 s, mostly compilation); the other five canaries are held out. No statistical test:
everything is deterministic for the fixed seeds.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

pytest.importorskip("tokenizers")

from snapaudit_jax.dpsgd import (  # noqa: E402
    CanaryConfig,
    CanarySet,
    canary_continuation,
    make_canaries,
    sequence_losses,
)
from snapaudit_jax.estimation.one_run import (  # noqa: E402
    DeclaredGrid,
    default_grid,
    one_run_audit,
    one_run_epsilon,
)
from snapaudit_jax.finetune.memorization import (  # noqa: E402
    ExposureReport,
    ExtractionReport,
    canary_exposure,
    canary_extraction,
    canaries_for_a_positive_bound,
    one_run_bound,
    one_run_ceiling,
    secret_scores,
)
from snapaudit_jax.models import lm as lm_module  # noqa: E402
from snapaudit_jax.models.inference import frame  # noqa: E402
from snapaudit_jax.utils.errors import InputError  # noqa: E402
from tests.helpers.attack_lm import bpe_tokenizer, gpt2  # noqa: E402

CONFIG = CanaryConfig(n_canaries=6, digits=4, seed=11)
FILLER = ["the weather is nice today", "my name is bob and I like tea", "please call me at home",
          "my dog is called rex"]
SPACE = 10**4
LENGTH = 32


def _train(model, tok, texts, *, steps=100, learning_rate=1e-2):
    """Full-batch Adam on the mean per-record loss of the framed texts (no privacy: a memorising baseline)."""
    tokens = np.zeros((len(texts), LENGTH), np.int32)
    mask = np.zeros((len(texts), LENGTH), bool)
    for i, t in enumerate(texts):
        ids = frame(tok, t)
        tokens[i, : len(ids)] = ids
        mask[i, : len(ids)] = True
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.adam(learning_rate)

    @jax.jit
    def step(params, opt_state):
        def loss(p):
            return sequence_losses(nnx.merge(graphdef, p, rest), jnp.asarray(tokens), jnp.asarray(mask)).mean()

        grads = jax.grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    opt_state = tx.init(params)
    for _ in range(steps):
        params, opt_state = step(params, opt_state)
    return nnx.merge(graphdef, params, rest)


@pytest.fixture(scope="module")
def setup():
    """``(tokenizer, trained model, canaries with only canary 0 inserted, the Bernoulli(1/2) canaries as drawn)``."""
    drawn = make_canaries(CONFIG)
    memo = CanarySet(CONFIG, tuple(dataclasses.replace(c, inserted=c.index == 0) for c in drawn.canaries))
    tok = bpe_tokenizer(FILLER + [c.text for c in drawn.canaries] + [f"pin {i:04d}" for i in range(0, SPACE, 37)])
    model = _train(gpt2(tok, 3), tok, FILLER + [memo.canaries[0].text] * 4)
    return tok, model, memo, drawn


@pytest.fixture(scope="module")
def untrained():
    """``(tokenizer, the untrained model, canaries with only canary 0 inserted)``: for refusals, which read no score."""
    drawn = make_canaries(CONFIG)
    memo = CanarySet(CONFIG, tuple(dataclasses.replace(c, inserted=c.index == 0) for c in drawn.canaries))
    tok = bpe_tokenizer(FILLER + [c.text for c in drawn.canaries] + [f"pin {i:04d}" for i in range(0, SPACE, 37)])
    return tok, gpt2(tok, 3), memo


@pytest.fixture(scope="module")
def report(setup):
    tok, model, memo, _ = setup
    return canary_exposure(model, tok, memo, key=jax.random.key(0))


def _oracle_scores(model, tok, prefix, continuations) -> np.ndarray:
    """``log P(continuation | framed prefix)`` one candidate at a time: float64 log-softmax of a plain forward pass
    (all positions real, no mask or cache) over one right-padded row."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def logits(state, row):
        m = nnx.merge(graphdef, state)
        hidden, _ = m(row, jnp.arange(row.shape[1])[None], jnp.ones(row.shape, bool))
        return m.logits(hidden)

    head = frame(tok, prefix, eos=False)
    out = np.empty(len(continuations))
    for i, c in enumerate(continuations):
        ids = head + tok.encode_continuation(c)
        row = np.zeros((1, LENGTH), np.int32)
        row[0, : len(ids)] = ids
        z = np.asarray(logits(state, jnp.asarray(row)), np.float64)[0, : len(ids) - 1]
        z = z - z.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        out[i] = sum(logp[t - 1, ids[t]] for t in range(len(head), len(ids)))
    return out


@pytest.mark.slow
def test_exact_exposure_equals_a_one_at_a_time_oracle(setup, report):
    tok, model, memo, _ = setup
    secrets = [f"{i:04d}" for i in range(SPACE)]
    oracle = _oracle_scores(model, tok, "my pin is", [canary_continuation(CONFIG.template, s) for s in secrets])
    np.testing.assert_allclose(secret_scores(model, tok, "my pin is", secrets[:97], template=CONFIG.template),
                               oracle[:97], rtol=1e-5, atol=1e-5)
    assert isinstance(report, ExposureReport) and report.method == "exact" and report.space_size == SPACE
    tol = 1e-4  # float32 scores: the oracle's rank is bracketed by the candidates within tol of the canary
    for row, c in zip(report.rows, memo.canaries):
        i = int(c.secret)
        assert row.score == pytest.approx(oracle[i], rel=1e-5, abs=1e-5)
        low = 1 + sum(1 for j in range(SPACE) if j != i and oracle[j] > oracle[i] + tol)
        high = 1 + sum(1 for j in range(SPACE) if j != i and oracle[j] >= oracle[i] - tol)
        assert low <= row.rank <= high and high - low <= 1
        assert row.exact == pytest.approx(math.log2(SPACE) - math.log2(row.rank), abs=1e-12)
        assert abs(row.extrapolated - row.exact) < 1.0 or row.rank == 1
    assert report.scores.tolist() == [r.score for r in report.rows]


@pytest.mark.slow
def test_memorised_canary_is_exposed_and_extracted_and_held_out_ones_are_not(setup, report):
    tok, model, memo, _ = setup
    inserted, *held = report.rows
    assert inserted.inserted and inserted.rank == 1 and inserted.exact == math.log2(SPACE)
    assert inserted.extrapolated == math.log2(SPACE)  # the fit's tail is far below 1 / |R|: capped
    assert all(not r.inserted and r.exact < 4.0 for r in held)  # ~1 bit expected for a secret never seen
    summary = report.summary()
    assert summary["inserted"]["n"] == 1 and summary["inserted"]["exact"]["max"] == math.log2(SPACE)
    assert summary["held_out"]["exact"]["max"] == max(r.exact for r in held)
    assert summary["held_out"]["exact"]["median"] == float(np.median([r.exact for r in held]))
    assert report.to_dict()["summary"] == summary
    # Extraction, exact top-k from the report's ranks, then from a fresh scoring of the space: same shapes, no
    # recompilation of the scoring kernel.
    got = canary_extraction(model, tok, memo, exposure=report)
    before = lm_module._packed_option_logprobs._cache_size()
    again = canary_extraction(model, tok, memo)
    assert lm_module._packed_option_logprobs._cache_size() == before
    for out in (got, again):
        assert isinstance(out, ExtractionReport) and out.method == "exact" and out.top_k == (1, 10)
        assert out.greedy_continuation.startswith(memo.canaries[0].continuation)
        assert out.rates()["inserted"] == {"n": 1, "greedy": 1.0, "top_1": 1.0, "top_10": 1.0}
        assert out.rates()["held_out"] == {"n": 5, "greedy": 0.0, "top_1": 0.0, "top_10": 0.0}
    assert got.rows == again.rows


@pytest.mark.slow
def test_large_space_path_extrapolates_and_extracts_by_beam_search(setup, report):
    """``exact_limit=100`` treats the 10^4 secrets as too many to score: extrapolation from 500 samples, a beam
    of width 3. The estimate agrees with the exact exposure to within a bit for every canary."""
    tok, model, memo, _ = setup
    big = canary_exposure(model, tok, memo, key=jax.random.key(1), exact_limit=100, sample_size=500)
    assert big.method == "extrapolated" and big.sample_size == 500 and big.summary()["inserted"]["exact"]["max"] is None
    assert all(r.exact is None and r.rank is None for r in big.rows)
    np.testing.assert_allclose(big.scores, report.scores, rtol=1e-5, atol=1e-5)
    assert big.rows[0].extrapolated == math.log2(SPACE)
    for r, e in zip(big.rows[1:], report.rows[1:]):
        assert abs(r.extrapolated - e.exact) < 1.0
    beam = canary_extraction(model, tok, memo, top_k=(1, 3), exact_limit=100)
    assert beam.method == "beam" and len(beam.candidates) == 3 and beam.candidates[0] == memo.canaries[0].secret
    assert beam.rates()["inserted"]["top_1"] == 1.0 and beam.rates()["held_out"]["top_3"] == 0.0
    # One group of four digits: the beam is the exact top 3 of the space.
    exact_top = np.argsort(-secret_scores(model, tok, "my pin is", [f"{i:04d}" for i in range(SPACE)]),
                           kind="stable")[:3]
    assert list(beam.candidates) == [f"{i:04d}" for i in exact_top]


@pytest.mark.slow
def test_beam_search_over_two_groups_against_brute_force_over_its_beam(setup):
    """Five-digit secrets "dddd d": step 1 keeps the 2 best first groups (exact scores over all 10^4), step 2 ranks
    their 20 completions; oracle: the same two stages by :func:`secret_scores` and sorting."""
    tok, model, _, _ = setup
    five = make_canaries(CanaryConfig(n_canaries=2, digits=5, seed=1))
    got = canary_extraction(model, tok, five, top_k=2, exact_limit=100)
    first = secret_scores(model, tok, "my pin is", [f"{i:04d}" for i in range(SPACE)])
    groups = [f"{i:04d}" for i in np.argsort(-first, kind="stable")[:2]]
    completions = [f"{g}{d}" for g in groups for d in range(10)]
    full = secret_scores(model, tok, "my pin is", completions)
    assert got.method == "beam" and got.top_k == (2,)
    assert list(got.candidates) == [f"{completions[i][:4]} {completions[i][4]}" for i in np.argsort(-full)[:2]]


def test_one_run_bound_is_the_canary_audits_one_run_bound():
    """Per repetition group, equal to one_run_audit on the group's canaries with default_grid of its size."""
    cs = make_canaries(CanaryConfig(n_canaries=61, digits=4, repetitions=(1, 2), seed=2))
    rng = np.random.default_rng(0)
    scores = cs.inserted * 3.0 + rng.normal(size=61)
    got = one_run_bound(scores, cs, delta=1e-5, alpha=0.05)
    assert sorted(got) == [1, 2]
    for r, result in got.items():
        group = cs.repetitions == r
        direct = one_run_audit(scores[group], cs.inserted[group], insert_probability=0.5, delta=1e-5, alpha=0.05,
                               rule=DeclaredGrid(default_grid(int(group.sum()))))
        assert result == direct and result.epsilon > 0.5
    declared = one_run_bound(scores, cs, delta=1e-5, pairs=((3, 0), (3, 3)))
    assert all(res.family_size == 2 for res in declared.values())
    # A pure eps claim admits any insertion probability; delta > 0 needs 1/2 (pitfall 11), refused first.
    skewed = make_canaries(CanaryConfig(n_canaries=61, digits=4, insert_probability=0.8, seed=2))
    assert one_run_bound(scores, skewed, delta=0.0)[1].insert_probability == 0.8
    with pytest.raises(InputError, match=r"insert_probability must be 1/2 .*got insert_probability=0.8"):
        one_run_bound(np.full(3, np.nan), skewed, delta=1e-5)


def _hand_bound(scores, coins, pairs, *, delta, alpha):
    """The declared-grid bound counted by hand: for each pair, walk the canaries from the highest score (ties by
    index), guess "in" for the first k+ and "out" for the last k-, count the right guesses one by one, and take the
    best pair's one_run_epsilon at level alpha / len(pairs)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    best = 0.0
    for kp, km in pairs:
        right_in = sum(1 for i in order[:kp] if coins[i])
        right_out = sum(1 for i in order[len(order) - km:] if not coins[i])
        best = max(best, one_run_epsilon(right_in, kp, right_out, km, canaries=len(scores), delta=delta,
                                         alpha=alpha / len(pairs), insert_probability=0.5))
    return best


def test_one_run_bound_and_its_ceiling_against_hand_counted_guesses():
    """one_run_bound per group equals the hand count; the ceiling is the hand count with every coin guessed right
    and is above the bound of any scores (40 random score vectors, one of them strong)."""
    cs = make_canaries(CanaryConfig(n_canaries=40, digits=4, repetitions=(1, 2), seed=5))
    rng = np.random.default_rng(1)
    strong = cs.inserted * 4.0 + rng.normal(size=40)
    got = one_run_bound(strong, cs, delta=1e-5)
    ceiling = one_run_ceiling(cs, delta=1e-5)
    assert sorted(got) == sorted(ceiling) == [1, 2]
    for r in got:
        group = np.flatnonzero(cs.repetitions == r)
        coins = [bool(cs.inserted[i]) for i in group]
        pairs = default_grid(len(group))
        assert got[r].epsilon == pytest.approx(_hand_bound([strong[i] for i in group], coins, pairs, delta=1e-5,
                                                           alpha=0.05), rel=1e-12)
        perfect = _hand_bound([float(c) for c in coins], coins, pairs, delta=1e-5, alpha=0.05)
        assert ceiling[r] == pytest.approx(perfect, rel=1e-12) and ceiling[r] >= got[r].epsilon > 0
        bounds = [one_run_bound(rng.normal(size=40) + cs.inserted * rng.uniform(0, 10), cs, delta=1e-5)[r].epsilon
                  for _ in range(20)]
        assert max(bounds) <= ceiling[r] and min(bounds) < ceiling[r]  # never above; weak scores stay below


def test_fewest_canaries_for_a_positive_bound():
    """The count returned gives a positive hand-counted ceiling and two fewer give none; a stricter level needs
    more; an unfair coin is refused."""
    m = canaries_for_a_positive_bound(delta=1e-5)
    assert m is not None and 4 <= m <= 64
    for count, positive in ((m, True), (m - 2, False)):
        coins = [i % 2 == 0 for i in range(count)]
        bound = _hand_bound([float(c) for c in coins], coins, default_grid(count), delta=1e-5, alpha=0.05)
        assert (bound > 0) is positive, (count, bound)
    assert canaries_for_a_positive_bound(delta=1e-5, alpha=0.001) > m  # a stricter level needs more
    with pytest.raises(InputError, match=r"insert_probability must be 1/2"):
        canaries_for_a_positive_bound(delta=1e-5, insert_probability=0.8)


@pytest.mark.parametrize("call, message", [
    (lambda tok, m, c: secret_scores(m, tok, "my pin is", []), r"secrets must be a non-empty list"),
    (lambda tok, m, c: secret_scores(m, tok, "my pin is", ["12a4"]),
     r"digits must be a non-empty string of decimal digits, got '12a4'"),
    (lambda tok, m, c: secret_scores(m, tok, "my pin is", ["1234"], template="pin: {secret}"),
     r"template must start with prefix 'my pin is' .*whose prefix is 'pin:'"),
    (lambda tok, m, c: secret_scores(m, tok, "", ["1234"]), r"prefix must be a non-empty text, got ''"),
    (lambda tok, m, c: secret_scores(m, tok, "my pin is ", ["1234"]),
     r"prefix must not end with whitespace .*got 'my pin is '"),
    (lambda tok, m, c: secret_scores(object(), tok, "my pin is", ["1234"]),
     r"model must be an NNX decoder .*got object"),
    (lambda tok, m, c: canary_exposure(m, tok, c, key=None), r"key must be a PRNG key .*got None"),
    (lambda tok, m, c: canary_exposure(m, tok, c, key=jax.random.key(0), sample_size=9995),
     r"sample_size must be <= 10\*\*digits - n_canaries = 9994 .*got 9995"),
    (lambda tok, m, c: canary_exposure(m, tok, c, key=jax.random.key(0), sample_size=9),
     r"sample_size must be .*10.*got 9"),
    (lambda tok, m, c: canary_exposure(m, tok, c.canaries, key=jax.random.key(0)),
     r"canaries must be a CanarySet .*got tuple"),
    (lambda tok, m, c: canary_exposure(m, tok, CanarySet(c.config, (dataclasses.replace(c.canaries[0], secret="1"),)),
                                       key=jax.random.key(0)),
     r"canaries\[0\] must be a 4-digit secret in the set's template 'my pin is \{secret\}'"),
    (lambda tok, m, c: canary_extraction(m, tok, c, top_k=()), r"top_k must be a positive integer or a non-empty"),
    (lambda tok, m, c: canary_extraction(m, tok, c, top_k=(1, 0)), r"top_k\[1\] must be"),
    (lambda tok, m, c: one_run_bound([1.0, 2.0], c, delta=1e-5),
     r"scores must be 1-dimensional with one score per canary \(6\), got shape \(2,\)"),
])
def test_bad_input_names_argument_rule_and_value(untrained, call, message):
    tok, model, memo = untrained
    with pytest.raises(InputError, match=message):
        call(tok, model, memo)


def test_candidate_continuations_are_written_as_the_canaries_are():
    config = CanaryConfig(n_canaries=7, digits=9, template="the code is  {secret}.", seed=4)
    for c in make_canaries(config).canaries:
        assert canary_continuation(config.template, c.secret.replace(" ", "")) == c.continuation
        assert c.continuation.startswith("  ") and c.continuation.endswith(".") and len(c.secret) == 11
