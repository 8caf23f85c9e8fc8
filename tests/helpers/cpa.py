"""Shared data, oracles and fixtures of the conformal tests (``tests/conformal``).

* Kernels and calibration: attacker posteriors of a known generative model, random splits of a fixed pool,
  the exact split-conformal coverage of a finite pool, the brute-force order statistic, the Monte Carlo
  tolerance ``mc_tol`` (false failure about 1e-6 per assertion).
* The cpa run: the small TOML configurations ``SMALL`` and ``LLM_CONFIG`` and :func:`write_config`.
* The data layer: the fixture paths and the generated WikiBio and Blog fixtures; ``python -m
  tests.helpers.cpa`` (from the repository root) rewrites ``tests/fixtures/conformal/{wikibio,blog}``.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
from scipy import stats
from scipy.special import gammaln

import conformal as cf
from tests.helpers.paths import FIXTURES


# =========================================================================== kernels and calibration


Z = float(stats.norm.isf(1e-6))  # one-sided normal quantile of a 1e-6 false-failure probability


ALPHAS = (0.05, 0.1, 0.2)


POOL_DOCS, POOL_CANDIDATES = 2000, 37


def mc_tol(values) -> float:
    """Normal-approximation half-width of the mean of i.i.d. per-split values at false-failure 1e-6."""
    v = np.asarray(values, np.float64)
    return Z * float(v.std(ddof=1)) / math.sqrt(v.shape[0])


# --------------------------------------------------------------------------- data


def posteriors(rng, n, m, signal=2.0, spread=(0.3, 3.0), labels=None):
    """Attacker posteriors of a known generative model, ``(probs (n, m) float64, labels (n,))``.

    The truth is uniform over the pool (or the given ``labels``); logits are ``beta_i * (signal * e_y + N(0, I))``
    with a per-document sharpness ``beta_i ~ U(spread)`` (documents differ in how identifiable they are).
    """
    labels = rng.integers(0, m, n) if labels is None else np.asarray(labels)
    beta = rng.uniform(*spread, size=(n, 1))
    logits = beta * (rng.standard_normal((n, m)) + signal * np.eye(m)[labels])
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True), labels


def all_candidate_scores(probs, score):
    """``(n, m)``: the kernel's score of every candidate ``y`` of every document (one batched call)."""
    n, m = probs.shape
    return np.asarray(cf.scores(np.repeat(probs, m, axis=0), np.tile(np.arange(m), n), score)).reshape(n, m)


def random_splits(rng, n_pool, n_cal, reps):
    """``(reps, n_pool)`` independent uniformly random permutations; the first ``n_cal`` are calibration."""
    return np.argsort(rng.random((reps, n_pool)), axis=1)


def exact_split_coverage(pool_scores, n: int, k):
    """E[coverage] of the k-th order statistic over uniformly random splits of a finite pool, ties allowed.

    A test score v is covered iff fewer than k calibration scores are < v; the n calibration documents are a
    uniform n-subset of the other N - 1, so that count is hypergeometric (float32 comparisons, as the kernels).
    ``k`` an int (returns a float) or a sequence of them (returns an array).
    """
    v = np.sort(pool_scores)
    lows, counts = np.unique(np.searchsorted(v, pool_scores, side="left"), return_counts=True)
    big, x, low = v.size - 1, np.arange(n + 1)[None, :], lows[:, None]

    def log_choose(a, b):  # -inf outside 0 <= b <= a
        ok = (b >= 0) & (b <= a)
        a, b = np.where(ok, a, 0), np.where(ok, b, 0)
        return np.where(ok, gammaln(a + 1) - gammaln(b + 1) - gammaln(a - b + 1), -np.inf)

    pmf = np.exp(log_choose(low, x) + log_choose(big - low, n - x) - log_choose(big, n))  # Hypergeometric(big, low, n)
    cdf = np.cumsum(pmf, axis=1)
    ks = np.atleast_1d(k)
    out = np.array([1.0 if kk > n else float(counts @ cdf[:, kk - 1]) / v.size for kk in ks])
    return float(out[0]) if np.ndim(k) == 0 else out


# --------------------------------------------------------------------------- set/score identity


def assert_set_identity(p, qhat, score):
    """``prediction_sets(p, qhat)[i, y] == (score of y <= qhat_i)`` bit-exactly, compared as the kernel does: in
    the promotion of the scores' dtype (float32, or float64 for float64 ``p``) and ``qhat``'s."""
    full = all_candidate_scores(p, score)
    q = np.broadcast_to(np.asarray(qhat), (p.shape[0],))
    sets = np.asarray(cf.prediction_sets(p, qhat, score))
    expected = full <= q[:, None]
    np.testing.assert_array_equal(sets, expected, err_msg=f"{score} qhat={qhat}")
    return sets


# --------------------------------------------------------------------------- the order statistic


def brute_threshold(s, alpha) -> float:
    """Smallest calibration score t with #{S_i <= t} >= (1 - alpha)(n + 1), in exact fractions; +inf if none."""
    need = (1 - Fraction(repr(float(alpha)))) * (len(s) + 1)
    for t in sorted(set(s.tolist())):
        if np.count_nonzero(s <= t) >= need:
            return t
    return math.inf


# --------------------------------------------------------------------------- the caller's precision (pitfall 10)


REPRO_VALUES, REPRO_COUNTS, REPRO_ALPHA = np.array([0.5, 0.7, 0.9]), (5, 12, 3), 0.2


def repro_scores() -> np.ndarray:
    """Pitfall 10's reproducer: 0.5 x5, 0.7 x12, 0.9 x3 as float64 (n = 20; alpha = 0.2 gives k = 17, a 0.7)."""
    return np.repeat(REPRO_VALUES, REPRO_COUNTS)


# --------------------------------------------------------------------------- top-K truncation, open world


@functools.lru_cache(maxsize=None)
def truncated_pool():
    """A pool of 2000 documents over 61 candidates, truncated to each document's top 8 (some truths dropped)."""
    probs, labels = posteriors(np.random.default_rng(30), 2000, 61, signal=2.2, spread=(0.3, 2.0))
    idx, kept, pos = (np.asarray(x) for x in cf.truncate_top_k(probs, 8, labels))
    included = pos >= 0
    s = np.full(labels.shape, np.inf, np.float32)
    s[included] = np.asarray(cf.aps_scores(kept[included], pos[included]))
    return probs, labels, idx, kept, pos, s


# =========================================================================== the cpa run


# Every section of a cpa configuration, on the synthetic K1-K3 ladder (120 documents, 200 people).
SMALL = """
[run]
seed = 3
alphas = [0.05, 0.1, 0.2]
report_alpha = 0.1
n_cal = 60
n_test = 60
splits = 1
score = "aps"

[data.synthetic]
n_people = 200
n_documents = 120
levels = ["K1", "K2", "K3"]
releases = ["direct", "quasi_id_redaction"]

[attackers.retrieval]
kind = "retrieval"
temperature = 0.5

[[drift]]
attacker = "retrieval"
calibrate = "synthetic/K2/direct"
test = "synthetic/K2/quasi_id_redaction"

[truncation]
attacker = "retrieval"
suite = "synthetic/K2/direct"
top_k = [2, 10]

[mondrian]
attacker = "retrieval"
suites = ["synthetic/K2/direct", "synthetic/K2/quasi_id_redaction"]
"""


def write_config(tmp_path, text, name="cfg.toml"):
    """Writes the TOML ``text`` to ``tmp_path / name`` and returns the path as a string."""
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --------------------------------------------------------------------------- LLM attackers (tiny random model)


LLM_CONFIG = """
[run]
seed = 2
alphas = [0.2]
n_cal = 20
n_test = 16
batch_size = 8

[data.synthetic]
n_people = 60
n_documents = 40
levels = ["K2"]
releases = ["direct"]

[attackers.clues]
kind = "clues"
model = "{model}"
max_new_tokens = 4

[attackers.profile]
kind = "profile"
model = "{model}"
samples = 5

[attackers.profile_gender]
kind = "profile"
model = "{model}"
samples = 5
attributes = ["gender"]
"""


# =========================================================================== the data layer


FIX = FIXTURES / "conformal"


TAB = FIX / "tab"


TEXTWASH = FIX / "textwash"


WIKIBIO = FIX / "wikibio"


BLOG = FIX / "blog"


def word_in(word: str, text: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(word) + r"(?!\w)", text, flags=re.IGNORECASE) is not None


# ------------------------------------------------------------------------------------------------
# Generated fixtures (WikiBio, Blog Authorship)
# ------------------------------------------------------------------------------------------------


# (id, title, infobox fields in order (None: "<none>"), tokenised lower-case sentences).
WIKIBIO_PEOPLE = (
    ("1001", "Ada Brennan",
     (("name", "ada brennan"), ("image", None), ("caption", None), ("birth_date", "12 march 1931"),
      ("birth_place", "cork , ireland"), ("nationality", "irish"), ("occupation", "chemist"),
      ("known_for", "synthetic dyes"), ("article_title", "ada brennan")),
     ("ada brennan -lrb- 12 march 1931 -- 4 june 2001 -rrb- was an irish chemist .",
      "brennan is known for her work on synthetic dyes at the university of cork .")),
    ("1002", "Tomas Okafor (footballer)",
     (("name", "tomas okafor"), ("nickname", "the wall"), ("birth_date", "3 july 1988"),
      ("birth_place", "lagos , nigeria"), ("nationality", "nigerian"), ("occupation", "footballer"),
      ("position", "goalkeeper"), ("clubs", "enugu rangers"), ("article_title", "tomas okafor")),
     ("tomas okafor -lrb- born 3 july 1988 -rrb- is a nigerian footballer who plays as a goalkeeper .",
      "nicknamed `` the wall '' , okafor played for enugu rangers .")),
    ("1003", "Michael of Valdora",
     (("name", "michael of valdora"), ("birth_date", "1450"), ("occupation", "bishop"),
      ("religion", "catholic"), ("see", "valdora"), ("article_title", "michael of valdora")),
     ("michael of valdora -lrb- c. 1450 -- 1502 -rrb- was a bishop of the catholic church .",
      "he served as bishop of the see from 1480 until his death .")),
    ("1004", "Lena Sorvino",
     (("name", "lena sorvino"), ("birth_date", "22 may 1975"), ("birth_place", "turin , italy"),
      ("nationality", "italian"), ("occupation", "tennis player"), ("tournament", "wimbledon"),
      ("plays", "right-handed"), ("website", "www.sorvino.example"), ("article_title", "lena sorvino")),
     ("lena sorvino -lrb- born 22 may 1975 -rrb- is an italian former tennis player .",
      "sorvino reached the quarter-finals at wimbledon in 1998 .",
      "she plays right-handed .")),
    ("1005", "Priya Raman",
     (("name", "priya raman"), ("birth_name", "priya lakshmi raman"), ("birth_date", "1 january 1962"),
      ("birth_place", "chennai , india"), ("nationality", "indian"), ("occupation", "architect"),
      ("awards", "aga khan award"), ("article_title", "priya raman")),
     ("priya raman -lrb- born 1 january 1962 -rrb- is an indian architect .",
      "she received the aga khan award in 2004 .")),
)


# (file name, topic words, number of posts). Author 1001234's file is Latin-1 and malformed on purpose.
BLOG_AUTHORS = (
    ("1000331.female.37.indUnk.Leo.xml", ("tomatoes", "compost", "seedlings", "greenhouse", "trowel"), 12),
    ("1001234.male.15.Student.Aries.xml", ("joystick", "speedrun", "boss", "console", "respawn"), 12),
    ("1002001.female.24.Arts.Pisces.xml", ("canvas", "gouache", "easel", "palette", "gallery"), 12),
    ("1003002.male.45.Technology.Virgo.xml", ("kernel", "compiler", "terminal", "router", "debugger"), 12),
    ("1004003.female.17.Student.Gemini.xml", ("homework", "locker", "prom", "biology", "algebra"), 3),
)


_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


def blog_post(k: int, words) -> str:
    """Post ``k`` of an author: deterministic text built from the author's topic words."""
    a, b, c = words[k % 5], words[(k + 2) % 5], words[(k + 4) % 5]
    return (f"Entry number {k}. Today the {a} and the {b} took all my time, again. "
            f"Tomorrow maybe the {c}; I keep a list of {a} notes number {k * 7 + 3}.")


def _blog_file(name: str, words, n: int) -> bytes:
    parts = ["<Blog>\n\n"]
    for k in range(n):
        text = blog_post(k, words)
        if name.startswith("1001234"):
            if k == 0:
                text += " Mom made caf\u00e9 au lait &amp; cr\u00eapes &nbsp;yum & more <3"
            if k == 5:  # an unclosed post: ends at the next <date>
                parts.append(f"<date>{k + 1},{_MONTHS[k % 12]},2004</date>\n<post>\n\n      {text}\n\n\n")
                continue
        parts.append(f"<date>{k + 1},{_MONTHS[k % 12]},2004</date>\n<post>\n\n      {text}\n\n\n</post>\n\n\n")
    parts.append("<date>30,December,2004</date>\n<post>\n\n   \n</post>\n\n")  # an empty post: dropped
    parts.append("</Blog>\n")
    return "".join(parts).encode("latin-1")


def _box_line(fields) -> str:
    toks = []
    for f, v in fields:
        if v is None:
            toks.append(f"{f}:<none>")
        else:
            toks += [f"{f}_{i + 1}:{w}" for i, w in enumerate(v.split())]
    return "\t".join(toks)


def write_generated_fixtures(root: Path) -> None:
    """Writes ``root/wikibio`` and ``root/blog`` (deterministic; no randomness)."""
    raw = root / "wikibio" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    files = {".box": [], ".nb": [], ".sent": [], ".title": [], ".id": []}
    for pid, title, fields, sents in WIKIBIO_PEOPLE:
        files[".box"].append(_box_line(fields))
        files[".nb"].append(str(len(sents)))
        files[".sent"] += list(sents)
        files[".title"].append(title)
        files[".id"].append(pid)
    for ext, lines in files.items():
        (raw / f"mini{ext}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with open(root / "wikibio" / "mini.jsonl", "w", encoding="utf-8") as fh:
        for pid, title, fields, sents in WIKIBIO_PEOPLE:
            table = {"column_header": [f for f, _ in fields], "row_number": [1] * len(fields),
                     "content": ["<none>" if v is None else v for _, v in fields]}
            if pid == "1003":  # the list-of-objects variant of `table`
                table = [{"column_header": f, "content": "<none>" if v is None else v} for f, v in fields]
            rec = {"id": pid, "input_text": {"table": table, "context": title}, "target_text": " ".join(sents) + "\n"}
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    blog = root / "blog"
    blog.mkdir(parents=True, exist_ok=True)
    for name, words, n in BLOG_AUTHORS:
        (blog / name).write_bytes(_blog_file(name, words, n))


# ------------------------------------------------------------------------------------------------
# TAB
# ------------------------------------------------------------------------------------------------


TAB_IDS = ("001-900001", "001-900002", "001-900003", "001-900004")


# ------------------------------------------------------------------------------------------------
# load_source (the CPA runner's adapter)
# ------------------------------------------------------------------------------------------------


if __name__ == "__main__":  # regenerate the WikiBio and Blog fixtures
    write_generated_fixtures(FIX)
    print(f"wrote {FIX / 'wikibio'} and {FIX / 'blog'}", file=sys.stderr)
