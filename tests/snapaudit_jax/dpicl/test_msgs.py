"""GreedyReplace, GS and MSGS against brute force and a literal Algorithm 2, with toy embedders."""

import itertools
import math
import zlib

import numpy as np
import pytest

from snapaudit_jax.dpicl.msgs import (
    SignalPair,
    greedy_replace,
    greedy_search,
    multi_sweep_greedy_search,
    word_vocabulary,
)

# ------------------------------------------------------------------------------------------------------------------
# Toy embedders


def _unit(rows):
    rows = np.asarray(rows, np.float64)
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def hash_bow_embed(texts, dim=16):
    """Bag of words: each word a fixed Gaussian vector in R^dim (seeded by crc32, not the salted hash())."""
    out = np.empty((len(texts), dim), np.float32)
    for i, text in enumerate(texts):
        total = sum(np.random.default_rng(zlib.crc32(w.encode())).standard_normal(dim) for w in text.split())
        out[i] = _unit(total)
    return out


SIX = ("ant", "bee", "cat", "dog", "eel", "fox")


def _table(vocab, lengths, dim, seed):
    """Every sentence of the given lengths over ``vocab`` mapped to an independent random unit vector."""
    rng = np.random.default_rng(seed)
    table = {}
    for length in lengths:
        for words in itertools.product(vocab, repeat=length):
            table[" ".join(words)] = _unit(rng.standard_normal(dim)).astype(np.float32)
    return table


TABLE = _table(SIX, (2, 3), dim=3, seed=11)


def table_embed(texts):
    return np.stack([TABLE[t] for t in texts])


ANGLE_WORDS = tuple(f"w{k}" for k in range(6))


def angle_embed(texts):
    """Sentence angle = sum of word angles (w_k has angle k*pi/20); embedding (cos, sin)."""
    theta = np.array([sum(int(w[1:]) for w in t.split()) * math.pi / 20 for t in texts])
    return np.stack([np.cos(theta), np.sin(theta)], axis=1)


class Spy:
    """Wraps an embedder and records every call's size."""

    def __init__(self, embed):
        self.embed = embed
        self.sizes = []

    def __call__(self, texts):
        self.sizes.append(len(texts))
        return self.embed(texts)


def _dist(embed, s, t):
    e = np.asarray(embed([s, t]), np.float64)
    return float(np.linalg.norm(e[0] - e[1]))


def _neighbours(words, vocab):
    for pos in range(len(words)):
        for w in vocab:
            if w != words[pos]:
                yield " ".join(words[:pos] + [w] + words[pos + 1 :])


def _brute_max(embed, vocab, length):
    sentences = [" ".join(w) for w in itertools.product(vocab, repeat=length)]
    e = np.asarray(embed(sentences), np.float64)
    return float(np.max(np.linalg.norm(e[:, None, :] - e[None, :, :], axis=-1)))


def _literal_msgs(seed, embed, vocab, sweeps, max_rounds=None):
    """Algorithm 2 for one seed, written out with the public greedy_replace (no shortcuts)."""
    a = b = seed.split()
    history = []
    kw = dict(batch_size=64, max_rounds=max_rounds)
    for t in range(1, sweeps + 1):
        if t % 2:
            b, d, _ = greedy_replace(b, embed([" ".join(a)])[0], embed, vocab, **kw)
        else:
            a, d, _ = greedy_replace(a, embed([" ".join(b)])[0], embed, vocab, **kw)
        history.append(d)
    return " ".join(a), " ".join(b), history


# ------------------------------------------------------------------------------------------------------------------
# GreedyReplace

BOW_VOCAB = ("red", "green", "blue", "sky", "sea", "stone", "tree", "cloud", "river", "iron", "salt")
BOW_SEEDS = ("the red tree by the sea", "sky sky sky", "a stone")


@pytest.mark.parametrize("seed", BOW_SEEDS)
def test_greedy_replace_reaches_a_local_optimum(seed):
    anchor = hash_bow_embed(["blue river cloud"])[0]
    words, distance, _ = greedy_replace(seed, anchor, hash_bow_embed, BOW_VOCAB, batch_size=13)
    assert len(words) == len(seed.split())
    direct = float(np.linalg.norm(hash_bow_embed([" ".join(words)])[0].astype(np.float64) - anchor))
    assert distance == direct
    neighbours = list(_neighbours(words, BOW_VOCAB))
    rows = hash_bow_embed(neighbours).astype(np.float64)
    assert np.max(np.linalg.norm(rows - anchor, axis=1)) <= distance  # brute force: no single replacement improves


def test_greedy_replace_path_never_decreases_and_changes_one_word_per_round():
    anchor = hash_bow_embed(["salt"])[0]
    seed = "the red tree by the sea"
    start = float(np.linalg.norm(hash_bow_embed([seed])[0].astype(np.float64) - anchor))
    path = [(seed.split(), start)]
    for rounds in range(1, 9):
        words, distance, _ = greedy_replace(seed, anchor, hash_bow_embed, BOW_VOCAB, batch_size=16, max_rounds=rounds)
        prev_words, prev_distance = path[-1]
        assert distance >= prev_distance
        assert sum(a != b for a, b in zip(words, prev_words)) <= 1
        assert (words == prev_words) == (distance == prev_distance)
        path.append((words, distance))
    assert path[-1][0] == greedy_replace(seed, anchor, hash_bow_embed, BOW_VOCAB)[0]  # 8 rounds reach the optimum
    assert path[-1][1] > start


def test_greedy_replace_counts_evaluations():
    anchor = hash_bow_embed(["iron"])[0]
    spy = Spy(hash_bow_embed)
    seed = "red zebra sea"  # "zebra" is not in the vocabulary: no no-op to skip at position 1
    _, _, evaluations = greedy_replace(seed, anchor, spy, BOW_VOCAB, batch_size=5, max_rounds=1)
    assert evaluations == sum(spy.sizes) == 1 + 3 * len(BOW_VOCAB) - 2
    spy.sizes.clear()
    _, _, evaluations = greedy_replace(seed, anchor, spy, BOW_VOCAB, batch_size=5)
    assert evaluations == sum(spy.sizes)
    # Angle toy from "w2 w3" against its own embedding: 2 improving rounds + 1 final round, 2 x 5 candidates each.
    anchor = angle_embed(["w2 w3"])[0]
    words, distance, evaluations = greedy_replace("w2 w3", anchor, angle_embed, ANGLE_WORDS, batch_size=4)
    assert evaluations == 1 + 3 * 2 * 5
    assert sorted(words) == ["w5", "w5"] or sorted(words) == ["w0", "w0"]
    assert distance == pytest.approx(2 * math.sin(math.pi / 8), abs=1e-12)


@pytest.mark.parametrize("batch_size", [1, 4, 7, 1000])
def test_batch_size_bounds_every_call_and_does_not_change_results(batch_size):
    anchor = hash_bow_embed(["cloud cloud"])[0]
    spy = Spy(hash_bow_embed)
    got = greedy_replace("the red tree by the sea", anchor, spy, BOW_VOCAB, batch_size=batch_size)
    assert max(spy.sizes) <= batch_size
    assert got == greedy_replace("the red tree by the sea", anchor, hash_bow_embed, BOW_VOCAB, batch_size=3)
    spy.sizes.clear()
    pair = multi_sweep_greedy_search(BOW_SEEDS, spy, BOW_VOCAB, sweeps=4, batch_size=batch_size)
    assert max(spy.sizes) <= batch_size
    assert pair.evaluations == sum(spy.sizes)
    assert pair == multi_sweep_greedy_search(BOW_SEEDS, hash_bow_embed, BOW_VOCAB, sweeps=4, batch_size=3)


def test_ties_go_to_lowest_position_then_lowest_vocabulary_index_and_need_strict_gain():
    # The embedding depends only on how many words are "x": every candidate of a round ties.
    levels = {2: [1.0, 0.0], 1: [0.0, 1.0], 0: [-1.0, 0.0]}

    def embed(texts):
        return np.array([levels[t.split().count("x")] for t in texts])

    anchor = embed(["x x"])[0]
    assert greedy_replace("x x", anchor, embed, ("b", "c", "a"), max_rounds=1)[0] == ["b", "x"]
    # max_rounds=9 only so that a non-strict rule fails here instead of cycling forever.
    assert greedy_replace("x x", anchor, embed, ("b", "c", "a"), max_rounds=9) == (["b", "b"], 2.0, 1 + 6 + 5 + 4)
    assert greedy_replace("x x", anchor, embed, ("c", "a", "b"), max_rounds=9)[0] == ["c", "c"]
    # A gain must exceed min_gain: sqrt(2) - 0 is applied, 2 - sqrt(2) is not.
    assert greedy_replace("x x", anchor, embed, ("b",), min_gain=0.6)[:2] == (["b", "x"], math.sqrt(2))


# ------------------------------------------------------------------------------------------------------------------
# GS and MSGS


def test_msgs_is_at_least_gs_and_at_most_the_brute_force_maximum():
    for length in (2, 3):
        brute = _brute_max(table_embed, SIX, length)
        seeds = [" ".join(w) for w in itertools.product(SIX, repeat=length)][:: 7 if length == 3 else 1]
        msgs = multi_sweep_greedy_search(seeds, table_embed, SIX, sweeps=6, batch_size=16)
        assert msgs.distance <= brute
        assert msgs.distance == max(h[-1] for h in msgs.history)
        assert _dist(table_embed, msgs.sentence_1, msgs.sentence_2) == msgs.distance
        for seed, history in zip(seeds, msgs.history):
            gs = greedy_search(seed, table_embed, SIX, batch_size=16)
            assert gs.sentence_1 == seed
            assert history[0] == gs.distance  # sweep 1 of MSGS is GS
            assert all(x <= y for x, y in zip(history, history[1:]))
            assert gs.distance <= history[-1] <= msgs.distance <= brute


def test_alternating_sweeps_beat_a_single_sweep_in_a_constructed_case():
    # Angle toy: one sweep can move B at most pi/4 away from the seed's angle pi/4; moving A too reaches pi/2.
    gs = greedy_search("w2 w3", angle_embed, ANGLE_WORDS)
    msgs = multi_sweep_greedy_search(["w2 w3"], angle_embed, ANGLE_WORDS, sweeps=2)
    brute = _brute_max(angle_embed, ANGLE_WORDS, 2)
    assert gs.distance == pytest.approx(2 * math.sin(math.pi / 8), abs=1e-12)
    assert msgs.distance == pytest.approx(math.sqrt(2), abs=1e-12) == brute
    assert msgs.distance > gs.distance + 0.6
    assert {msgs.sentence_1, msgs.sentence_2} == {"w0 w0", "w5 w5"}
    assert msgs.history == ((gs.distance, msgs.distance),)


@pytest.mark.parametrize("sweeps", [1, 2, 3, 7])
def test_msgs_matches_a_literal_algorithm_2(sweeps):
    seeds = ("ant bee", "fox fox eel", "cat dog ant")
    pair = multi_sweep_greedy_search(seeds, table_embed, SIX, sweeps=sweeps, batch_size=8)
    literal = [_literal_msgs(s, table_embed, SIX, sweeps) for s in seeds]
    assert pair.history == tuple(tuple(h) for _, _, h in literal)
    best = max(range(len(seeds)), key=lambda m: (literal[m][2][-1], -m))
    assert (pair.sentence_1, pair.sentence_2, pair.distance) == (*literal[best][:2], literal[best][2][-1])
    assert len(pair.sentence_1.split()) == len(seeds[best].split())


def test_msgs_matches_a_literal_algorithm_2_when_max_rounds_truncates_sweeps():
    # A sweep cut short by max_rounds leaves a sentence that is not a local optimum, so a later sweep without
    # a replacement must not end the search early.
    seeds = [" ".join(w) for w in itertools.product(SIX, repeat=3)][::5]
    pair = multi_sweep_greedy_search(seeds, table_embed, SIX, sweeps=5, max_rounds=1)
    assert pair.history == tuple(tuple(_literal_msgs(s, table_embed, SIX, 5, max_rounds=1)[2]) for s in seeds)


def test_equal_distances_across_seeds_go_to_the_earliest_seed():
    # Two-word bag of words: a seed and its reversal reach exactly the same distance with different word orders.
    first = multi_sweep_greedy_search(["red sky"], hash_bow_embed, BOW_VOCAB, sweeps=3)
    second = multi_sweep_greedy_search(["sky red"], hash_bow_embed, BOW_VOCAB, sweeps=3)
    assert first.distance == second.distance and first.sentence_1 != second.sentence_1
    both = multi_sweep_greedy_search(["red sky", "sky red"], hash_bow_embed, BOW_VOCAB, sweeps=3)
    assert (both.sentence_1, both.sentence_2) == (first.sentence_1, first.sentence_2)
    both = multi_sweep_greedy_search(["sky red", "red sky"], hash_bow_embed, BOW_VOCAB, sweeps=3)
    assert (both.sentence_1, both.sentence_2) == (second.sentence_1, second.sentence_2)


def test_converged_sweeps_are_skipped_without_changing_the_result():
    spy = Spy(table_embed)
    short = multi_sweep_greedy_search(["cat dog ant"], spy, SIX, sweeps=6)
    spent = sum(spy.sizes)
    long = multi_sweep_greedy_search(["cat dog ant"], spy, SIX, sweeps=60)
    assert long.evaluations == short.evaluations == spent
    assert (long.sentence_1, long.sentence_2, long.distance) == (short.sentence_1, short.sentence_2, short.distance)
    assert len(long.history[0]) == 60 and long.history[0][:6] == short.history[0]


def test_greedy_search_is_one_seed_one_sweep_and_counts_like_greedy_replace():
    seed = "the red tree by the sea"
    gs = greedy_search(seed, hash_bow_embed, BOW_VOCAB, batch_size=9)
    assert gs == multi_sweep_greedy_search([seed], hash_bow_embed, BOW_VOCAB, sweeps=1, batch_size=9)
    words, distance, evaluations = greedy_replace(seed, hash_bow_embed([seed])[0], hash_bow_embed, BOW_VOCAB)
    assert (gs.sentence_1, gs.sentence_2, gs.distance, gs.evaluations) == (seed, " ".join(words), distance, evaluations)
    assert gs.history == ((distance,),)


def test_search_is_deterministic_and_normalises_whitespace():
    a = multi_sweep_greedy_search(["  the red\ttree ", "sky sky sky"], hash_bow_embed, BOW_VOCAB, sweeps=3)
    b = multi_sweep_greedy_search(["the red tree", "sky sky sky"], hash_bow_embed, BOW_VOCAB, sweeps=3)
    assert isinstance(a, SignalPair) and a == b
    assert a.sentence_1 == " ".join(a.sentence_1.split()) and a.sentence_2 == " ".join(a.sentence_2.split())
    with pytest.raises(AttributeError):
        a.distance = 2.0  # frozen


# ------------------------------------------------------------------------------------------------------------------
# Validation


def _bad_shape(texts):
    return hash_bow_embed(texts)[:-1]


def _flat(texts):
    return hash_bow_embed(texts)[0]


def _nan(texts):
    out = hash_bow_embed(texts)
    out[-1, 0] = np.nan
    return out


def _not_unit(texts):
    return 1.01 * hash_bow_embed(texts)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(seeds=[]), "seeds must contain at least one"),
        (dict(seeds="red sky"), "seeds must be a sequence"),
        (dict(seeds=["red", "  "]), r"seeds\[1\] must contain at least one word"),
        (dict(seeds=["red", 3]), r"seeds\[1\] must be a string"),
        (dict(vocabulary=()), "vocabulary must contain at least one word"),
        (dict(vocabulary="red"), "vocabulary must be a sequence"),
        (dict(vocabulary=("red", "sea", "red")), "vocabulary must not repeat words, got 'red' at positions 0 and 2"),
        (dict(vocabulary=("red", "deep sea")), r"vocabulary\[1\] must be one non-empty word.*'deep sea'"),
        (dict(vocabulary=("red", "")), r"vocabulary\[1\] must be one non-empty word"),
        (dict(sweeps=0), "sweeps must be an integer >= 1, got 0"),
        (dict(sweeps=1.5), "sweeps must be an integer >= 1, got 1.5"),
        (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
        (dict(max_rounds=0), "max_rounds must be an integer >= 1, got 0"),
        (dict(min_gain=-1e-9), "min_gain must be a finite number >= 0"),
        (dict(embed="not callable"), "embed must be callable"),
        (dict(embed=_bad_shape), r"embed returned shape \(0, 16\) for 1 text\(s\); expected \(1, d\)"),
        (dict(embed=_flat), r"embed returned shape \(16,\) for 1 text"),
        (dict(embed=_nan), "embed returned non-finite values .* row 0 for text 'red sky'"),
        (dict(embed=_not_unit), r"L2-normalised rows .* got norm 1.01 in row 0"),
        (dict(embed=lambda texts: [["a"] * 16] * len(texts)), "embed must return a numeric"),
    ],
)
def test_msgs_validation(kwargs, match):
    args = dict(seeds=["red sky"], embed=hash_bow_embed, vocabulary=BOW_VOCAB, sweeps=2) | kwargs
    with pytest.raises(ValueError, match=match):
        multi_sweep_greedy_search(args.pop("seeds"), args.pop("embed"), args.pop("vocabulary"), **args)


def test_embed_checks_apply_to_candidate_batches_and_dimension():
    anchor = hash_bow_embed(["sea"])[0]

    def nan_on_candidates(texts):
        out = hash_bow_embed(texts)
        if "salt" in texts[-1]:
            out[-1] = np.nan
        return out

    with pytest.raises(ValueError, match="non-finite values"):
        greedy_replace("red sky", anchor, nan_on_candidates, BOW_VOCAB, batch_size=4)
    with pytest.raises(ValueError, match=r"embed returned shape \(1, 16\) for 1 text\(s\); expected \(1, 8\)"):
        greedy_replace("red sky", anchor[:8] / np.linalg.norm(anchor[:8]), hash_bow_embed, BOW_VOCAB)

    def dim_changes(texts):
        return hash_bow_embed(texts, dim=16 if len(texts) == 1 else 8)

    with pytest.raises(ValueError, match=r"expected \(\d+, 16\)"):
        greedy_search("red sky", dim_changes, BOW_VOCAB)


@pytest.mark.parametrize(
    "anchor, match",
    [
        (np.array([0.6, 0.8, 0.1]), "anchor_embedding must be L2-normalised"),
        (np.array([[1.0, 0.0]]), r"anchor_embedding must have shape \(d,\)"),
        (np.array([np.nan, 1.0]), "anchor_embedding must be finite"),
    ],
)
def test_greedy_replace_validation(anchor, match):
    with pytest.raises(ValueError, match=match):
        greedy_replace("w1 w2", anchor, angle_embed, ANGLE_WORDS)
    with pytest.raises(ValueError, match="sentence_words must contain at least one word"):
        greedy_replace([], np.array([1.0, 0.0]), angle_embed, ANGLE_WORDS)
    with pytest.raises(ValueError, match=r"sentence_words\[1\] must be one non-empty word"):
        greedy_replace(["w1", "w2 w3"], np.array([1.0, 0.0]), angle_embed, ANGLE_WORDS)


# ------------------------------------------------------------------------------------------------------------------
# Vocabulary

CORPUS = [
    "The cat sat on the mat.",
    "THE DOG sat; the cat ran!",
    "Don't feed 4 cats_2 the Café crème",
]


def test_word_vocabulary_orders_by_count_then_alphabet():
    # the:5, cat:2, sat:2, then count 1 alphabetically; "cats_2" gives "cats", "Don't" gives "don" and "t".
    assert word_vocabulary(CORPUS, max_words=5) == ("the", "cat", "sat", "café", "cats")
    everything = word_vocabulary(CORPUS, max_words=100)
    assert everything == ("the", "cat", "sat") + tuple(
        sorted(["café", "cats", "crème", "dog", "don", "feed", "mat", "on", "ran", "t"])
    )
    assert word_vocabulary(CORPUS, max_words=100, min_count=2) == ("the", "cat", "sat")
    assert word_vocabulary(iter(CORPUS), max_words=100, seed=3) == everything  # fewer eligible than max_words


def test_word_vocabulary_seeded_subsample():
    everything = word_vocabulary(CORPUS, max_words=100)
    sub = word_vocabulary(CORPUS, max_words=6, seed=7)
    assert len(sub) == 6 and len(set(sub)) == 6 and set(sub) <= set(everything)
    assert list(sub) == [w for w in everything if w in sub]  # still frequency order
    assert sub == word_vocabulary(CORPUS, max_words=6, seed=7)
    draws = {word_vocabulary(CORPUS, max_words=6, seed=s) for s in range(20)}
    assert len(draws) > 10  # C(13, 6) = 1716 subsets: seeds do change the draw


@pytest.mark.parametrize(
    "texts, kwargs, match",
    [
        ("the cat", dict(max_words=3), "texts must be a sequence of strings, got a single string"),
        (["the", 5], dict(max_words=3), r"texts\[1\] must be a string, got 5"),
        (CORPUS, dict(max_words=0), "max_words must be an integer >= 1, got 0"),
        (CORPUS, dict(max_words=3, min_count=0), "min_count must be an integer >= 1, got 0"),
        (CORPUS, dict(max_words=3, seed=-1), "seed must be an integer >= 0, got -1"),
        (CORPUS, dict(max_words=3, min_count=9), "no alphabetic word occurring at least min_count=9"),
        (["123 _ !!"], dict(max_words=3), "no alphabetic word"),
    ],
)
def test_word_vocabulary_validation(texts, kwargs, match):
    with pytest.raises(ValueError, match=match):
        word_vocabulary(texts, **kwargs)
