"""Split-conformal calibration kernels: nonconformity scores, the exact threshold, ambiguity sets.

Shapes: ``n`` documents, ``m`` candidates. ``probs`` is ``(n, m)``, each row a
distribution over the candidate pool (an attacker's posterior, a softmax of
similarities, or sampling frequencies); ``labels`` is ``(n,)``, the position of
the true identity in the pool.

Exact arithmetic. Scores are functions of the probabilities quantised to
fixed point, ``q = floor(p * 2**30)`` (``uint32``), and summed as integers,
so a score does not depend on summation order: the score a calibration
document gets from :func:`aps_scores` is bit-for-bit the score the same
candidate gets inside :func:`prediction_sets` (a different XLA program), which
is what makes ``y in C(x)  <=>  s(x, y) <= qhat`` hold exactly. Probabilities
below ``2**-30`` count as 0 in APS and raw-probability scores; ties in ``q``
are ties. Rank scores only count, so they compare the float32 values
themselves.

Caller's precision. Scores the kernels return are float32: the fixed-point
value ``M * 2**-30`` rounded to nearest. Scores a caller brings (float64, say)
are never rounded to float32 on the way to a decision: :func:`threshold`
returns one of the caller's own values in the caller's dtype, :func:`pvalues`
compares exactly, and :func:`prediction_sets` decides ``s <= qhat`` in the
precision of ``qhat``: against the float32 scores for a float32 threshold,
against ``M * 2**-30`` exactly for a float64 one (pitfall 10 of the
conventions: a float32 copy can round the threshold below the order statistic,
or a score above the threshold, and lose coverage).

The kernels are pure and jit/vmap-able; when called eagerly with concrete
arrays they validate their input (NaN, negative or unnormalised rows, labels
outside the pool) and raise ``ValueError``. Under ``jit`` the checks are
skipped (validate at your own boundary).

References:
  Vovk et al. 2005 (split conformal); Romano et al. 2020 (APS); Huang et al.
  2026, Conformal Privacy Auditing, eqs. (6), (8), (9), Lemma 5.1.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

from snapaudit_jax.utils.errors import InputError

__all__ = [
    "SCORES",
    "FIXED_POINT_BITS",
    "quantize",
    "aps_scores",
    "rank_scores",
    "prob_scores",
    "scores",
    "candidate_scores",
    "conformal_rank",
    "threshold",
    "prediction_sets",
    "set_sizes",
    "leakage_proxy",
    "pvalues",
    "sample_frequencies",
    "frequencies_from_samples",
    "truncate_top_k",
]

SCORES = ("aps", "rank", "prob")
FIXED_POINT_BITS = 30
_ONE = 1 << FIXED_POINT_BITS  # the fixed-point 1.0
_SCALE = float(2.0**-FIXED_POINT_BITS)
_ROW_SUM_TOL = 1e-3


# ---------------------------------------------------------------------------
# Validation (eager calls only)
# ---------------------------------------------------------------------------


def _concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def _check_probs(probs, name: str = "probs") -> None:
    p = np.asarray(probs)
    if p.ndim != 2:
        raise InputError(f"{name} must have shape (n, m), got shape {p.shape}")
    if p.shape[1] == 0:
        raise InputError(f"{name}: the candidate pool is empty (m = 0)")
    if not np.issubdtype(p.dtype, np.floating):
        raise InputError(f"{name} must be floating point, got dtype {p.dtype}")
    # Fast path, two passes: a non-negative minimum and finite row sums imply every entry is finite and >= 0
    # (NaN fails the comparison, +-inf makes a sum non-finite).
    sums = p.sum(axis=1, dtype=np.float64)
    if p.size and p.min() >= 0 and np.all(np.abs(sums - 1.0) <= _ROW_SUM_TOL):
        return
    bad = ~np.isfinite(p)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise InputError(f"{name} must be finite, got {p[i, j]} at [{i}, {j}]")
    if (p < 0).any():
        i, j = np.argwhere(p < 0)[0]
        raise InputError(f"{name} must be >= 0, got {p[i, j]} at [{i}, {j}]")
    off = np.abs(sums - 1.0) > _ROW_SUM_TOL
    if off.any():
        i = int(np.argmax(off))
        raise InputError(f"{name} rows must sum to 1 (within {_ROW_SUM_TOL}), row {i} sums to {sums[i]:.6g}")


def _check_labels(labels, n: int, m: int) -> None:
    y = np.asarray(labels)
    if y.shape != (n,):
        raise InputError(f"labels must have shape ({n},), got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"labels must be integers, got dtype {y.dtype}")
    bad = (y < 0) | (y >= m)
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(
            f"labels must index the candidate pool [0, {m}), got {y[i]} for document {i} "
            "(an identity missing from the pool: use the open-world accounting of conformal.calibrate)"
        )


# ---------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------


def quantize(probs: jax.Array) -> jax.Array:
    """``floor(p * 2**30)`` as ``uint32`` (``p`` clipped to ``[0, 1]``): the fixed point all scores use.

    Args:
      probs: probabilities of any shape.

    Returns:
      ``uint32`` array of the shape of ``probs``.
    """
    p = jnp.clip(jnp.asarray(probs, jnp.float32), 0.0, 1.0)
    return jnp.floor(p * float(_ONE)).astype(jnp.uint32)


def _order_keys(probs: jax.Array) -> jax.Array:
    """``uint32`` keys with the order of the (non-negative) float32 probabilities: their bit patterns.

    Rank scores compare probabilities at full float32 resolution (counts are
    exact; nothing is summed), so no ordering is lost to the fixed point.
    """
    p = jnp.maximum(jnp.asarray(probs, jnp.float32), 0.0) + 0.0  # +0.0: no negative zero
    return jax.lax.bitcast_convert_type(p, jnp.uint32)


_KEY_LIMIT = 0x7F800001  # just above the bit pattern of +inf


def _to_score(mass: jax.Array) -> jax.Array:
    """Fixed-point mass -> float32 score (monotone, elementwise, program-independent)."""
    return mass.astype(jnp.float32) * jnp.float32(_SCALE)


def _mass_at_least(q: jax.Array, t: jax.Array) -> jax.Array:
    """``sum_j q_j [q_j >= t]`` per row, exact in ``uint32``: ``q`` ``(n, m)``, ``t`` ``(n,)``."""
    return jnp.sum(jnp.where(q >= t[:, None], q, jnp.uint32(0)), axis=-1, dtype=jnp.uint32)


def _count_at_least(q: jax.Array, t: jax.Array) -> jax.Array:
    return jnp.sum(q >= t[:, None], axis=-1, dtype=jnp.int32)


@jax.jit
def _aps(probs, labels):
    q = quantize(probs)
    qy = jnp.take_along_axis(q, labels[:, None].astype(jnp.int32), axis=1)[:, 0]
    return _to_score(_mass_at_least(q, qy))


@jax.jit
def _rank(probs, labels):
    keys = _order_keys(probs)
    ky = jnp.take_along_axis(keys, labels[:, None].astype(jnp.int32), axis=1)[:, 0]
    return _count_at_least(keys, ky).astype(jnp.float32)


@jax.jit
def _prob(probs, labels):
    q = quantize(probs)
    qy = jnp.take_along_axis(q, labels[:, None].astype(jnp.int32), axis=1)[:, 0]
    return _to_score(jnp.uint32(_ONE) - qy)


# --- the float64 path: concrete float64 probabilities are scored on the host in their own precision ----------
# The float32 kernels above quantise at 2**-30 after a float32 cast, so two float64 masses closer than float32's
# resolution would score alike and a set could differ from one decided in float64. Concrete float64 input is
# therefore scored in NumPy at the fixed point 2**-62 (uint64 sums, exact; rows sum to at most 1 + 1e-3, below
# 2**63), each score the float64 nearest to its fixed-point mass (monotone in the mass). Every function of the
# path computes the same integer masses, so ``y in prediction_sets(p, qhat)`` iff ``aps_scores(p, y) <= qhat``.
FIXED_POINT_BITS_64 = 62
_ONE64 = 1 << FIXED_POINT_BITS_64
_HOST_BLOCK = 1 << 22  # entries per block of rows (32 MiB of uint64)


def _wide(probs) -> bool:
    """Concrete float64 probabilities: scored on the host in float64."""
    return _concrete(probs) and np.asarray(probs).dtype == np.float64


def _quantize64(p: np.ndarray) -> np.ndarray:
    return np.floor(np.clip(p, 0.0, 1.0) * float(_ONE64)).astype(np.uint64)  # exact: a power of two, then floor


def _to_score64(mass: np.ndarray) -> np.ndarray:
    return mass.astype(np.float64) * 2.0**-FIXED_POINT_BITS_64


def _row_blocks(n: int, m: int):
    rows = max(1, _HOST_BLOCK // max(m, 1))
    for start in range(0, n, rows):
        yield slice(start, min(n, start + rows))


def _host_scores(probs, labels, score: str) -> np.ndarray:
    """:func:`scores` of concrete float64 ``probs``, ``(n,)`` float64."""
    p = np.asarray(probs, np.float64)
    y = np.asarray(labels).astype(np.int64)
    out = np.empty(p.shape[0], np.float64)
    for rows in _row_blocks(*p.shape):
        block, yb = p[rows], y[rows]
        if score == "rank":
            keys = np.maximum(block, 0.0) + 0.0
            ky = np.take_along_axis(keys, yb[:, None], axis=1)
            out[rows] = np.sum(keys >= ky, axis=1)
            continue
        q = _quantize64(block)
        qy = np.take_along_axis(q, yb[:, None], axis=1)
        if score == "prob":
            out[rows] = _to_score64(np.uint64(_ONE64) - qy[:, 0])
        else:
            out[rows] = _to_score64(np.sum(np.where(q >= qy, q, np.uint64(0)), axis=1, dtype=np.uint64))
    return out


def _host_all_scores(probs, score: str) -> np.ndarray:
    """:func:`candidate_scores` of concrete float64 ``probs``, ``(n, m)`` float64 (the masses of
    :func:`_host_scores`, every candidate at once: one sort per row)."""
    p = np.asarray(probs, np.float64)
    n, m = p.shape
    out = np.empty((n, m), np.float64)
    for rows in _row_blocks(n, m):
        block = p[rows]
        if score == "prob":
            out[rows] = _to_score64(np.uint64(_ONE64) - _quantize64(block))
            continue
        keys = np.maximum(block, 0.0) + 0.0 if score == "rank" else _quantize64(block)
        order = np.argsort(-keys if score == "rank" else keys, axis=1, kind="stable")
        if score != "rank":
            order = order[:, ::-1]  # descending
        ranked = np.take_along_axis(keys, order, axis=1)
        # each position's tie group ends at the next position whose key differs from the one after it
        last = np.empty(ranked.shape, bool)
        last[:, -1] = True
        last[:, :-1] = ranked[:, :-1] != ranked[:, 1:]
        ends = np.where(last, np.arange(m), m)
        ends = np.minimum.accumulate(ends[:, ::-1], axis=1)[:, ::-1]
        if score == "rank":
            value = (ends + 1).astype(np.float64)
        else:
            prefix = np.cumsum(ranked, axis=1, dtype=np.uint64)
            value = _to_score64(np.take_along_axis(prefix, ends, axis=1))
        scattered = np.empty_like(value)
        np.put_along_axis(scattered, order, value, axis=1)
        out[rows] = scattered
    return out


def _scores(kernel, probs, labels):
    if _concrete(probs, labels):
        _check_probs(probs)
        _check_labels(labels, np.shape(probs)[0], np.shape(probs)[1])
        if _wide(probs):
            return _host_scores(probs, labels, {_aps: "aps", _rank: "rank", _prob: "prob"}[kernel])
    return kernel(jnp.asarray(probs, jnp.float32), jnp.asarray(labels, jnp.int32))


def aps_scores(probs: jax.Array, labels: jax.Array) -> jax.Array:
    """APS mass score of the true candidate: ``s = sum_{j: p_j >= p_y} p_j`` in ``(0, 1]``.

    Ties with ``p_y`` count in the mass (the "<=" rule of eq. 9: a candidate
    tied with the truth is in the set whenever the truth is).

    Args:
      probs: ``(n, m)`` rows summing to 1.
      labels: ``(n,)`` int, positions of the true identities.

    Returns:
      ``(n,)`` float32 scores (smaller: the attacker is surer of the truth); float64 scores for concrete float64
      ``probs`` (the float64 path: fixed point ``2**-62`` on the host).

    References:
      CPA eq. (6); Romano et al. 2020 (non-randomised APS).
    """
    return _scores(_aps, probs, labels)


def rank_scores(probs: jax.Array, labels: jax.Array) -> jax.Array:
    """Rank score: ``#{j : p_j >= p_y}`` (1 for the strict favourite; ties count against), ``(n,)`` float32.

    Needs only the attacker's ranking: any monotone transform of ``probs``
    gives the same scores, and ties are ties of the float32 values (not of
    the fixed point), so tiny probabilities keep their order.

    Args:
      probs: ``(n, m)`` attacker weights (only their order matters).
      labels: ``(n,)`` int, positions of the true identities.

    Returns:
      ``(n,)`` float32 ranks in ``[1, m]``.
    """
    return _scores(_rank, probs, labels)


def prob_scores(probs: jax.Array, labels: jax.Array) -> jax.Array:
    """Raw-probability score: ``1 - p_y``, ``(n,)`` float32.

    Args:
      probs: ``(n, m)`` rows summing to 1.
      labels: ``(n,)`` int, positions of the true identities.

    Returns:
      ``(n,)`` float32 scores in ``[0, 1]``.
    """
    return _scores(_prob, probs, labels)


_SCORE_FNS = {"aps": aps_scores, "rank": rank_scores, "prob": prob_scores}


def scores(probs: jax.Array, labels: jax.Array, score: str = "aps") -> jax.Array:
    """The score named ``score`` (one of :data:`SCORES`) of the true candidates.

    Args:
      probs: ``(n, m)`` rows summing to 1.
      labels: ``(n,)`` int, positions of the true identities.
      score: ``"aps"``, ``"rank"`` or ``"prob"``.

    Returns:
      ``(n,)`` float32 scores, as :func:`aps_scores`, :func:`rank_scores` or :func:`prob_scores`.

    Raises:
      ValueError: for an unknown ``score``.
    """
    if score not in _SCORE_FNS:
        raise InputError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    return _SCORE_FNS[score](probs, labels)


@functools.partial(jax.jit, static_argnames=("score",))
def _all_scores(probs, score):
    m = probs.shape[1]

    def at_least(keys):  # #{j : key_j >= key_y} for every y (ties included), from the sorted row
        ascending = jnp.sort(keys, axis=-1)
        return m - jax.vmap(lambda row, v: jnp.searchsorted(row, v, side="left"))(ascending, keys), ascending

    if score == "rank":
        return at_least(_order_keys(probs))[0].astype(jnp.float32)
    q = quantize(probs)
    if score == "prob":
        return _to_score(jnp.uint32(_ONE) - q)
    count, ascending = at_least(q)
    # The mass of the at_least largest values: exact uint32 prefix sums of the descending row.
    prefix = jnp.cumsum(ascending[:, ::-1], axis=-1, dtype=jnp.uint32)
    return _to_score(jnp.take_along_axis(prefix, count - 1, axis=-1))


def candidate_scores(probs: jax.Array, score: str = "aps") -> jax.Array:
    """The score of every candidate, ``(n, m)`` float32: ``out[i, y]`` equals ``scores(probs, y)[i]`` exactly.

    Sorts each row (``O(m log m)``): meant for small pools (attribute
    vocabularies); for large pools use :func:`prediction_sets`, which never sorts.

    Args:
      probs: ``(n, m)`` rows summing to 1.
      score: one of :data:`SCORES`.

    Returns:
      ``(n, m)`` float32 scores of every candidate (float64 for concrete float64 ``probs``).

    Raises:
      ValueError: for an unknown ``score``, or (concrete input) probabilities that are not ``(n, m)`` non-negative rows
        summing to 1.
    """
    if score not in SCORES:
        raise InputError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    if _concrete(probs):
        _check_probs(probs)
        if _wide(probs):
            return _host_all_scores(probs, score)
    return _all_scores(jnp.asarray(probs, jnp.float32), score)


# ---------------------------------------------------------------------------
# The split-conformal threshold
# ---------------------------------------------------------------------------


def _alpha_fraction(alpha) -> Fraction:
    """``alpha`` as the decimal it prints as (``0.3`` is 3/10, not the binary float just below it)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.floating, np.integer, Fraction)):
        raise InputError(f"alpha must be a number in (0, 1), got {alpha!r}")
    if isinstance(alpha, Fraction):
        frac = alpha
    else:
        value = float(alpha)
        if math.isnan(value):
            raise InputError("alpha must be a number in (0, 1), got nan")
        frac = Fraction(repr(value))
    if not 0 < frac < 1:
        raise InputError(f"alpha must be in (0, 1), got {alpha!r}")
    return frac


def _alpha_list(alpha) -> tuple[list, bool]:
    """``(levels, scalar)``: the levels of ``alpha`` (one number or a sequence of them) as given, unconverted.

    A sequence keeps its items (``[0.1, True]`` reports ``True``, not ``1.0``); a string is refused whole.
    """
    if isinstance(alpha, (str, bytes)):
        raise InputError(f"alpha must be a number in (0, 1) or a sequence of them, got {alpha!r}")
    if isinstance(alpha, np.ndarray):
        scalar = alpha.ndim == 0
        alphas = [alpha.item()] if scalar else alpha.ravel().tolist()
    elif isinstance(alpha, Sequence):
        scalar, alphas = False, list(alpha)
    else:
        scalar, alphas = True, [alpha]
    if not alphas:
        raise InputError("alpha must not be empty")
    for a in alphas:
        _alpha_fraction(a)
    return alphas, scalar


def conformal_rank(n: int, alpha) -> int:
    """``k = ceil((n + 1)(1 - alpha))``, computed exactly; ``k > n`` means the threshold is ``+inf``.

    Args:
      n: number of calibration scores (>= 1).
      alpha: miscoverage level in (0, 1), read as the decimal it prints as.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"the calibration set must hold at least 1 score, got n = {n!r}")
    k = (n + 1) * (1 - _alpha_fraction(alpha))
    return int(math.ceil(k))


def _score_dtype(*xs) -> np.dtype:
    """The dtype the caller's scores are compared in: the promotion of the floating ones (float32 if none is).

    A Python float counts as the float64 it is. Promoting float32 to float64 is exact, so comparisons in this
    dtype are comparisons of the values as given. Non-floating input (integers, bools) is float32, as always.
    """
    dtypes = [np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype for x in xs]
    floats = [d for d in dtypes if jnp.issubdtype(d, jnp.floating)]
    return np.dtype(functools.reduce(jnp.promote_types, floats)) if floats else np.dtype(np.float32)


def _jax_keeps(dtype: np.dtype) -> bool:
    """Whether a JAX array can hold ``dtype`` (float64 only with ``jax_enable_x64``)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype)) == dtype


@functools.partial(jax.jit, static_argnames=("ranks",))
def _order_statistics(cal_scores, ranks):
    # n is small next to the test pools (calibration sets of 10^2..10^4), so one sort serves every alpha.
    ordered = jnp.sort(cal_scores)
    n = cal_scores.shape[0]
    picks = [ordered[k - 1] if k <= n else jnp.array(jnp.inf, ordered.dtype) for k in ranks]
    return jnp.stack(picks)


def _host_order_statistics(cal_scores: np.ndarray, ranks: tuple[int, ...]) -> np.ndarray:
    """:func:`_order_statistics` in NumPy, in the dtype of ``cal_scores`` (a selection, not a sort: pitfall 8)."""
    n = cal_scores.shape[0]
    kth = sorted({k - 1 for k in ranks if k <= n})
    part = np.partition(cal_scores, kth) if kth else cal_scores
    return np.array([part[k - 1] if k <= n else np.inf for k in ranks], cal_scores.dtype)


def threshold(cal_scores: jax.Array, alpha: float | Sequence[float]) -> jax.Array | np.ndarray:
    """The split-conformal threshold: the ``ceil((n+1)(1-alpha))``-th smallest calibration score, or ``+inf``.

    Args:
      cal_scores: ``(n,)`` scores of the calibration documents' true identities.
      alpha: a miscoverage level in (0, 1), or a sequence of them (concrete
        Python numbers: the order statistic's index is static).

    Returns:
      A scalar (one ``alpha``) or ``(len(alpha),)`` array in the dtype of
      ``cal_scores`` (float32 for non-floating input); ``+inf`` (full sets)
      where ``ceil((n+1)(1-alpha)) > n``, never the maximum score. A
      ``jax.Array``, except for concrete scores of a dtype JAX cannot hold
      (float64 without ``jax_enable_x64``): then a NumPy array (or NumPy
      scalar), selected on the host with ``np.partition``.

    Guarantees:
      If the ``n`` calibration documents and a test document are exchangeable
      (their scores computed the same way; Lemma 5.1 for sampled attackers),
      ``P(s_test <= qhat) >= 1 - alpha`` (CPA Theorem 5.2), and
      ``<= 1 - alpha + 1/(n+1)`` when scores have no ties. ``qhat`` is one of
      the caller's own values, bit for bit and in the caller's dtype (never a
      float32 copy, which can round below the order statistic and lose
      coverage: pitfall 10), so ``s_test <= qhat`` compared in that precision
      is the rule the guarantee is about; :func:`prediction_sets`,
      :func:`pvalues` and :func:`conformal.coverage_check` compare that way.
      Under ``jit``/``vmap`` the scores are traced JAX arrays: float64 NumPy
      input has already been converted to float32 there unless
      ``jax_enable_x64`` is on, so call eagerly with float64 scores.

    References:
      CPA eq. (8); the off-by-one of np.quantile-based thresholds (MAPIE issue 973).
    """
    alphas, scalar = _alpha_list(alpha)
    dtype = _score_dtype(cal_scores)
    concrete = _concrete(cal_scores)
    if concrete:
        s = np.asarray(cal_scores)
        if s.ndim != 1:
            raise InputError(f"cal_scores must have shape (n,), got shape {s.shape}")
        if s.size == 0:
            raise InputError("cal_scores is empty: the calibration set must hold at least 1 document")
        if np.isnan(s).any():
            raise InputError(f"cal_scores must not be NaN (index {int(np.argmax(np.isnan(s)))})")
    n = int(np.shape(cal_scores)[0])
    ranks = tuple(conformal_rank(n, a) for a in alphas)
    if concrete and not _jax_keeps(dtype):
        out = _host_order_statistics(np.asarray(cal_scores, dtype), ranks)
    else:
        out = _order_statistics(jnp.asarray(cal_scores, dtype), ranks)
    return out[0] if scalar else out


# ---------------------------------------------------------------------------
# Ambiguity sets
# ---------------------------------------------------------------------------


def _smallest_passing_level(q, passes, limit):
    """Per row, the smallest ``uint32`` level ``t`` in ``[0, limit]`` with ``passes(t)`` true.

    ``passes`` must be monotone in ``t`` (false ... false true ... true) and
    true at ``limit`` (above every key: the empty set). 31 bisection steps
    over ``(n,)`` levels (``limit < 2**31``), each a masked reduction over
    ``m``: no sort of the candidate pool.
    """
    n = q.shape[0]
    lo = jnp.zeros((n,), jnp.uint32)
    hi = jnp.full((n,), limit, jnp.uint32)

    def step(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        ok = passes(mid)
        return jnp.where(ok, lo, mid + 1), jnp.where(ok, mid, hi)

    lo, _ = jax.lax.fori_loop(0, FIXED_POINT_BITS + 1, step, (lo, hi))
    return lo


def _next_integer(x: jax.Array) -> jax.Array:
    """The smallest float32 integer above the float32 integer ``x >= -1`` (``x + 1`` rounds down above ``2**24``)."""
    return jnp.maximum(x + 1, jnp.nextafter(x, jnp.float32(jnp.inf)))


def _passes(mass: jax.Array, limit) -> jax.Array:
    """``mass <= limit`` for ``uint32`` masses; ``limit = (largest mass that passes, whether any does)``."""
    largest, some = limit
    return some & (mass <= largest)


def _aps_block_levels(qf, limit):
    """Per row of a block, a level ``P`` with ``{y : mass(q_y) <= limit} == {y : q_y >= P}`` exactly.

    ``qf`` is the ``(b, m)`` fixed point as float32 (every ``q <= 2**30`` is a float32 integer, so comparisons are
    exact and no value is subnormal); ``limit`` is the pair of ``(b,)`` arrays of :func:`_mass_limits` (the largest
    mass that passes, whether any does). The state per row is a bracket ``(F, P)``: every present ``q <= F``
    fails (its mass is above the limit), every present ``q >= P`` passes. One pass over the row at an integer
    level ``F < t < P`` yields, in one variadic reduction, the exact ``uint32`` mass of ``{q >= t}`` (the same
    integer :func:`_mass_at_least` sums, so the same score), ``a = min{q >= t}`` and
    ``b = max{q < t}``. Mass is non-increasing in the level, and ``mass(a) = mass(t)``, so: if ``t`` passes,
    every present ``q >= t`` passes and none lies in ``(b, t)`` (``P <- next integer after b``); if it fails,
    every present ``q <= a`` fails (``F <- a``). The row is decided once no float32 integer lies in ``(F, P)``,
    or after a passing step with ``b <= F``. Levels are chosen by linear interpolation of the mass between the
    bracket's ends, alternating with bisection (at least a halving every two passes); a row of the benchmark's
    ``m = 10**4`` needs ~12 passes instead of the 31 of a fixed bisection. Only the choice of ``t`` is heuristic:
    every update above is exact, whatever ``t`` is.
    """
    f32, u32 = jnp.float32, jnp.uint32
    inf = f32(jnp.inf)

    def reduce(mass, low, high):  # one pass: (sum, min, max) of three (b, m) operands, along the rows
        return jax.lax.reduce(
            (mass, low, high), (u32(0), inf, -inf),
            lambda x, y: (x[0] + y[0], jnp.minimum(x[1], y[1]), jnp.maximum(x[2], y[2])), (1,),
        )

    b = qf.shape[0]
    total, qmin, qmax = reduce(qf.astype(u32), qf, qf)
    full = _passes(total, limit)
    F = jnp.where(full, f32(-1), qmin)
    P = jnp.where(full, f32(0), _next_integer(qmax))  # no present q >= P: "all pass" holds vacuously
    target = jnp.where(limit[1], limit[0].astype(f32), f32(-1))  # only steers; the decisions compare integers
    state = (F, P, total.astype(f32), jnp.zeros((b,), f32), full | (_next_integer(F) >= P), jnp.int32(0))

    def body(state):
        F, P, mass_F, mass_P, done, it = state
        frac = jnp.clip((mass_F - target) / (mass_F - mass_P), 0.0, 1.0)
        frac = jnp.where((it % 2 == 0) & ~jnp.isnan(frac), frac, 0.5)
        lower, upper = _next_integer(F), jnp.minimum(P - 1, jnp.nextafter(P, -inf))  # integers in (F, P)
        t = jnp.clip(jnp.ceil(F + (P - F) * frac), lower, upper)
        ge = qf >= t[:, None]  # mass of {q >= t}; a = min({q >= t} + {P}); below = max({q < t} + {F})
        mass, a, below = reduce(jnp.where(ge, qf.astype(u32), u32(0)), jnp.where(ge, qf, P[:, None]),
                                jnp.where(ge, F[:, None], qf))
        ok = _passes(mass, limit)
        new_F = jnp.where(ok, F, a)
        new_P = jnp.where(ok, jnp.minimum(t, _next_integer(below)), P)
        fin = (ok & (below <= F)) | (_next_integer(new_F) >= new_P)
        mass = mass.astype(f32)
        return (jnp.where(done, F, new_F), jnp.where(done, P, new_P), jnp.where(done | ok, mass_F, mass),
                jnp.where(done | ~ok, mass_P, mass), done | fin, it + 1)

    return jax.lax.while_loop(lambda state: ~jnp.all(state[4]), body, state)[1]


def _aps_block_rows(m: int) -> int:
    """Rows per block of the APS search: about 32k entries (128 KiB), so a block stays in cache across its passes."""
    return max(1, min(64, 32768 // m))


def _mass_limits(qhat, score: str, xp=jnp):
    """``qhat`` -> ``(limit, some)``: the largest integer that passes (``uint32``) and whether any does, per entry.

    A score is an integer ``M`` (fixed-point mass, ``2**30 - q_y``, or a count) shown in the caller's precision:
    ``score(M) = float32(M) * 2**-30`` for a float32 (or narrower) ``qhat`` -- the kernels' float32 scores, as
    :func:`aps_scores` returns them -- and exactly ``M * 2**-30`` for a wider one (float64), whose every
    fixed-point value is representable; rank scores are the counts ``M`` themselves. ``score`` is monotone in
    ``M``, so ``{M : score(M) <= qhat} = {M <= limit}``. For float32 ``x = qhat * 2**30`` (exact) at or above
    ``2**24`` the integers that round to ``x`` reach up to ``x + ulp(x) / 2``, included when ``x``'s mantissa is
    even (ties to even). NaN passes nothing; ``x`` beyond ``uint32`` passes every mass.

    ``xp`` is ``np`` for concrete thresholds (on the host: exact IEEE arithmetic, float64 without x64) or ``jnp``
    for traced ones.
    """
    dtype = _score_dtype(qhat)
    q = xp.asarray(qhat, dtype)
    narrow = np.finfo(dtype).bits <= 32
    if xp is jnp:
        # XLA's CPU backend reads subnormal floats as zero, so a negative subnormal qhat would pass a zero score.
        # No score lies strictly between it and 0: the smallest negative normal number decides the same.
        width, mantissa = np.finfo(dtype).bits, np.finfo(dtype).nmant
        signed = jax.lax.bitcast_convert_type(q, jnp.dtype(f"int{width}"))
        low = np.iinfo(np.dtype(f"int{width}")).min
        negative_subnormal = (signed > low) & (signed < low + (1 << mantissa))
        q = jnp.where(negative_subnormal, -jnp.finfo(dtype).tiny, q)
    scale = 1.0 if score == "rank" else float(_ONE)
    x = q * xp.asarray(scale, dtype)  # exact: a power of two (an overflow is +inf, which passes everything)
    x = xp.where(xp.isnan(x), -1.0, x)
    top = 2.0**32 - 256 if narrow else 2.0**32 - 1  # the largest value below 2**32 of the dtype: exact casts
    floor = xp.floor(xp.clip(x, -1.0, top))
    some = floor >= 0
    limit = xp.maximum(floor, 0).astype(xp.uint32)
    if score != "rank" and narrow:
        x32 = xp.asarray(x, xp.float32)
        big = (x32 >= 2.0**24) & (x32 < 2.0**32)
        safe = xp.where(big, x32, xp.float32(2.0**24))
        half = ((xp.nextafter(safe, xp.float32(xp.inf)) - safe) / 2).astype(xp.uint32)
        bits = safe.view(xp.uint32) if xp is np else jax.lax.bitcast_convert_type(safe, jnp.uint32)
        limit = xp.where(big, safe.astype(xp.uint32) + half - (bits & 1), limit)
    limit = xp.where(x >= 2.0**32, xp.uint32(2**32 - 1), limit)
    return xp.asarray(limit, xp.uint32), xp.asarray(some, bool)


@functools.partial(jax.jit, static_argnames=("score",))
def _sets(probs, largest, some, score):
    q = quantize(probs)
    n, m = q.shape
    largest = jnp.broadcast_to(jnp.asarray(largest, jnp.uint32), (n,))
    some = jnp.broadcast_to(jnp.asarray(some, bool), (n,))
    if score == "prob":
        return _passes(jnp.uint32(_ONE) - q, (largest[:, None], some[:, None]))
    if score == "aps":
        # y is in the set iff mass(q_y) <= limit; rows are searched a block at a time (padded with empty rows,
        # which are dropped), so the block stays in cache across the passes of _aps_block_levels.
        rows = _aps_block_rows(m)
        blocks = -(-n // rows)
        pad = blocks * rows - n
        qf = jnp.pad(q.astype(jnp.float32), ((0, pad), (0, 0)))
        lim = (jnp.pad(largest, (0, pad)).reshape(blocks, rows), jnp.pad(some, (0, pad)).reshape(blocks, rows))

        def block(args):
            qf, limit = args
            return qf >= _aps_block_levels(qf, limit)[:, None]

        out = jax.lax.map(block, (qf.reshape(blocks, rows, m), lim))
        return out.reshape(blocks * rows, m)[:n]
    keys = _order_keys(probs)
    level = _smallest_passing_level(
        keys, lambda t: _passes(_count_at_least(keys, t).astype(jnp.uint32), (largest, some)), _KEY_LIMIT)
    return keys >= level[:, None]


def prediction_sets(probs: jax.Array, qhat, score: str = "aps") -> jax.Array:
    """Conformal ambiguity sets ``C(x) = {y : s(x, y) <= qhat}`` for a batch of documents.

    Args:
      probs: ``(n, m)`` rows summing to 1.
      qhat: threshold from :func:`threshold` (scalar), or ``(n,)`` per-document
        thresholds (Mondrian calibration); ``+inf`` gives the full pool.
      score: one of :data:`SCORES`; must be the score used for calibration.

    Returns:
      ``(n, m)`` bool membership. ``y in C(x)`` iff the score of ``y``
      (computed exactly as :func:`aps_scores` etc. would) is ``<= qhat``. Sets
      may be empty when ``qhat`` is below every candidate's score.

    Guarantees:
      Concrete float64 ``probs`` are scored in float64 (fixed point ``2**-62``, the scores :func:`aps_scores`
      returns for them) and ``s <= qhat`` is decided in float64. Otherwise the probabilities are float32 and
      ``s <= qhat`` is decided exactly, in the caller's precision (the dtype of
      ``qhat``, as :func:`threshold` returns the caller's own values). A
      float32 ``qhat`` is compared with the kernels' float32 scores, those
      :func:`aps_scores`, :func:`prob_scores` and :func:`rank_scores` return. A
      wider ``qhat`` (float64: a threshold of float64 calibration scores, a
      Python float) is compared with the scores at full precision -- the
      fixed-point mass ``M * 2**-30`` exactly, not its float32 rounding, which
      can lie above ``qhat`` when ``M * 2**-30`` does not (a float32 decision
      would then drop a candidate split conformal keeps). Either way the
      decision is an integer comparison of the fixed-point value with the
      largest one that passes, so no rounding enters it.
    """
    if score not in SCORES:
        raise InputError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    if _concrete(probs, qhat):
        _check_probs(probs)
        qh = np.asarray(qhat, np.float64)
        if qh.ndim not in (0, 1) or (qh.ndim == 1 and qh.shape[0] != np.shape(probs)[0]):
            raise InputError(f"qhat must be a scalar or have shape ({np.shape(probs)[0]},), got shape {qh.shape}")
        if np.isnan(qh).any():
            raise InputError("qhat must not be NaN")
        if _wide(probs):  # float64 probabilities: decided in float64, against the same scores aps_scores gives
            limit = qh if qh.ndim == 0 else qh[:, None]
            return _host_all_scores(probs, score) <= limit
    xp = np if _concrete(qhat) else jnp  # concrete thresholds on the host: IEEE subnormals, float64 without x64
    largest, some = _mass_limits(qhat, score, xp)
    return _sets(jnp.asarray(probs, jnp.float32), jnp.asarray(largest), jnp.asarray(some), score)


def set_sizes(sets: jax.Array) -> jax.Array:
    """``|C(x)|`` per document: ``(n,)`` int32.

    Args:
      sets: ``(n, m)`` boolean membership, as :func:`prediction_sets` returns.

    Returns:
      ``(n,)`` int32 set sizes.
    """
    return jnp.sum(jnp.asarray(sets), axis=-1, dtype=jnp.int32)


def leakage_proxy(sizes: jax.Array) -> jax.Array:
    """``L = 1 / max(1, |C|)`` (CPA eq. 4): a monotone transform of set size, not a probability.

    Args:
      sizes: ``(n,)`` set sizes.

    Returns:
      ``(n,)`` float32 values in ``(0, 1]`` (an empty set counts as size 1).
    """
    return 1.0 / jnp.maximum(1, jnp.asarray(sizes)).astype(jnp.float32)


# ---------------------------------------------------------------------------
# Conformal p-values
# ---------------------------------------------------------------------------


def _nearest_float32_ratio(num: jax.Array, den: int) -> jax.Array:
    """The float32 nearest to ``num / den`` (ties to even), exactly, for integers ``1 <= num <= den < 2**31``.

    ``x / (n + 1.0)`` is not that: XLA rewrites a division by a broadcast
    scalar into a multiplication by its rounded reciprocal (one ulp off for
    ~30% of ``num`` at ``den = 100``), which can push a p-value below its
    exact value. Binary long division in ``uint32`` (remainders stay below
    ``2 * den``) gives the 24 significant bits, the round bit and the sticky
    bit on every backend.
    """
    den_u = jnp.uint32(den)
    steps = den.bit_length() + 25  # leading zeros of num/den >= 2**-bit_length, then 24 bits + round bit
    zero = jnp.zeros(num.shape, jnp.uint32)

    def step(_, state):
        rem, lead, acc, taken = state
        rem = rem * 2
        bit = rem >= den_u
        rem = jnp.where(bit, rem - den_u, rem)
        started = (taken > 0) | bit
        lead = jnp.where(started, lead, lead + 1)  # binary places before the leading 1
        take = started & (taken < 25)
        acc = jnp.where(take, acc * 2 + bit.astype(jnp.uint32), acc)
        return rem, lead, acc, taken + take.astype(jnp.uint32)

    rem, lead, acc, _ = jax.lax.fori_loop(0, steps, step, (num.astype(jnp.uint32), zero, zero, zero))
    mantissa, round_bit = acc >> 1, acc & 1
    up = (round_bit == 1) & ((rem != 0) | ((mantissa & 1) == 1))
    mantissa = mantissa + up.astype(jnp.uint32)  # may carry to 2**24: still exact in float32
    # num/den = mantissa * 2**-(lead + 24); the power of two is built from its bit pattern (exact).
    scale = jax.lax.bitcast_convert_type((jnp.uint32(127 - 24) - lead) << 23, jnp.float32)
    return mantissa.astype(jnp.float32) * scale


@jax.jit
def _pvalues(cal_scores, test_scores):
    n = cal_scores.shape[0]
    # (1 + #{i : S_i >= T}) / (n + 1); count via a sorted calibration vector (n log n once, then log n per test).
    ordered = jnp.sort(cal_scores)
    below = jnp.searchsorted(ordered, test_scores, side="left")  # #{S_i < T}
    return _nearest_float32_ratio(1 + n - below, n + 1)


@functools.partial(jax.jit, static_argnames=("n",))
def _pvalues_from_below(below, n):
    return _nearest_float32_ratio(1 + n - below, n + 1)


def pvalues(cal_scores: jax.Array, test_scores: jax.Array) -> jax.Array:
    """Conformal p-values ``p = (1 + #{i : S_i >= T}) / (n + 1)`` of test scores ``(k,)``.

    ``T <= threshold(S, alpha)`` iff ``p > alpha`` (the same sets), and under
    exchangeability ``P(p <= u) <= u`` for every ``u``. Each p-value is the
    float32 nearest to the exact fraction (correctly rounded, on any backend),
    so compare it with float32 levels.

    Guarantees:
      The counts ``#{i : S_i >= T}`` compare the scores in their promoted
      dtype (float64 if either is float64; exact, as is :func:`threshold`'s
      order statistic), so ``T <= threshold(S, alpha)`` iff ``p > alpha``
      holds for float64 scores too. Concrete float64 scores that JAX cannot
      hold (no ``jax_enable_x64``) are counted on the host; float32 scores as
      before, in JAX.

    Args:
      cal_scores: ``(n,)`` calibration scores of the true identities, ``n >= 1``.
      test_scores: ``(k,)`` test scores.

    Returns:
      ``(k,)`` float32 p-values in ``[1 / (n + 1), 1]``.

    Raises:
      ValueError: (concrete input) an empty calibration set or a NaN score.
    """
    dtype = _score_dtype(cal_scores, test_scores)
    concrete = _concrete(cal_scores, test_scores)
    if concrete:
        if np.size(cal_scores) == 0:
            raise InputError("cal_scores is empty: the calibration set must hold at least 1 document")
        if np.isnan(np.asarray(cal_scores)).any() or np.isnan(np.asarray(test_scores)).any():
            raise InputError("scores must not be NaN")
    if concrete and not _jax_keeps(dtype):
        ordered = np.sort(np.asarray(cal_scores, dtype))
        below = np.searchsorted(ordered, np.asarray(test_scores, dtype), side="left")  # #{S_i < T}
        return _pvalues_from_below(jnp.asarray(below, jnp.int32), int(ordered.shape[0]))
    return _pvalues(jnp.asarray(cal_scores, dtype), jnp.asarray(test_scores, dtype))


# ---------------------------------------------------------------------------
# Sampling-only attackers
# ---------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("m",))
def _sample_counts(keys, probs, m):
    def one(key, p):
        cdf = jnp.cumsum(p)
        u = jax.random.uniform(key, (m,), jnp.float32) * cdf[-1]
        draws = jnp.clip(jnp.searchsorted(cdf, u, side="right"), 0, p.shape[0] - 1)
        return jnp.zeros(p.shape, jnp.int32).at[draws].add(1)

    return jax.vmap(one)(keys, probs)


def sample_frequencies(key: jax.Array, probs: jax.Array, m: int, *, example_ids: jax.Array | None = None) -> jax.Array:
    """Empirical frequencies of ``m`` forced-choice samples per document, ``(n, n_candidates)``.

    Simulates a sampling-only attacker whose answer distribution is ``probs``
    (for a real attacker, collect its answers and use
    :func:`frequencies_from_samples`). Document ``i`` draws with the key
    ``fold_in(key, example_ids[i])`` (default ``i``): the randomness is per
    example, independent of the data and of the batch it is processed in
    (the condition of CPA Lemma 5.1).

    Args:
      key: PRNG key (first, as every kernel here).
      probs: ``(n, n_candidates)`` answer distributions.
      m: samples per document (the sampling budget).
      example_ids: ``(n,)`` int ids that fix each document's stream.
    """
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise InputError(f"m (samples per document) must be an integer >= 1, got {m!r}")
    if _concrete(probs):
        _check_probs(probs)
    n = np.shape(probs)[0]
    ids = jnp.arange(n, dtype=jnp.uint32) if example_ids is None else jnp.asarray(example_ids, jnp.uint32)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(ids)
    counts = _sample_counts(keys, jnp.asarray(probs, jnp.float32), int(m))
    return counts.astype(jnp.float32) / jnp.float32(m)


def frequencies_from_samples(samples: jax.Array, n_candidates: int) -> jax.Array:
    """``(n, m)`` answers (candidate positions) of a sampling-only attacker -> ``(n, n_candidates)`` frequencies.

    Args:
      samples: ``(n, m)`` int candidate positions, ``m >= 1`` answers per document.
      n_candidates: the pool size ``C``.

    Returns:
      ``(n, C)`` float32 answer frequencies (each row sums to 1).

    Raises:
      ValueError: (concrete input) a wrong shape, a non-integer dtype or a position outside ``[0, C)``.
    """
    s = jnp.asarray(samples)
    if _concrete(samples):
        a = np.asarray(samples)
        if a.ndim != 2 or a.shape[1] == 0:
            raise InputError(f"samples must have shape (n, m) with m >= 1, got shape {a.shape}")
        if not np.issubdtype(a.dtype, np.integer):
            raise InputError(f"samples must be integer candidate positions, got dtype {a.dtype}")
        bad = (a < 0) | (a >= n_candidates)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise InputError(f"samples[{i}, {j}] = {a[i, j]} is outside the candidate pool [0, {n_candidates})")
    onehot = jax.nn.one_hot(s, n_candidates, dtype=jnp.float32)  # (n, m, C)
    return jnp.mean(onehot, axis=1)


# ---------------------------------------------------------------------------
# Top-K truncation of the candidate pool
# ---------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("k",))
def _top_k(probs, labels, k):
    vals, idx = jax.lax.top_k(probs, k)
    kept = vals / jnp.sum(vals, axis=-1, keepdims=True)
    hit = idx == labels[:, None]
    position = jnp.where(jnp.any(hit, axis=-1), jnp.argmax(hit, axis=-1), -1)
    return idx, kept, position


def truncate_top_k(probs: jax.Array, k: int, labels: jax.Array | None = None):
    """Restricts each document's pool to its ``k`` most likely candidates (renormalised).

    Args:
      probs: ``(n, m)`` rows summing to 1.
      k: the truncated pool size, ``1 <= k <= m``.
      labels: ``(n,)`` int positions of the true identities, or ``None``.

    Returns:
      ``(indices (n, k), probs (n, k), positions (n,))``: pool indices kept,
      the renormalised distribution over them, and where the true identity
      sits in the truncated pool (``-1``: dropped, a candidate miss; all
      ``-1`` when ``labels`` is None). Coverage conditional on inclusion is
      what calibration on the kept documents guarantees; unconditionally it is
      at least ``(1 - miss rate)(1 - alpha)`` (CPA Corollary 5.3).

    Raises:
      ValueError: for ``k`` not an integer >= 1, or (concrete input) bad probabilities or ``k > m``.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InputError(f"k (top-K pool size) must be an integer >= 1, got {k!r}")
    if _concrete(probs):
        _check_probs(probs)
        if k > np.shape(probs)[1]:
            raise InputError(f"k = {k} exceeds the candidate pool size {np.shape(probs)[1]}")
    n = np.shape(probs)[0]
    lab = jnp.full((n,), -1, jnp.int32) if labels is None else jnp.asarray(labels, jnp.int32)
    return _top_k(jnp.asarray(probs, jnp.float32), lab, int(k))
