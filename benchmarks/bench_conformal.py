"""Throughput of the conformal calibration kernels against plain NumPy and MAPIE.

Usage::

    python benchmarks/bench_conformal.py [--json] [--out FILE.json] [--sizes NxM ...] [--repeats R] \
        [--alpha A] [--seed S] [--no-mapie]

What is measured
----------------
Non-randomised APS (CPA eq. 6) on synthetic attacker posteriors: for each
size ``N x M`` (``N`` test documents and ``N`` calibration documents, ``M``
candidates; default ``1000x1000 1000x10000 10000x1000``), float32 rows
``softmax(beta_i (N(0, I) + 2 e_y))`` with ``beta_i ~ U(0.3, 3)``, a uniform
truth ``y``, and ``alpha = 0.1``. Rates count documents x candidates per
second (``N M / seconds``); three stages:

* ``calibrate``: calibration probabilities and labels to ``qhat``. Ours:
  ``threshold(aps_scores(probs, labels), alpha)``; NumPy: the sort-based
  score of the truth (argsort per row, cumsum in float64, the truth's entry,
  as MAPIE computes it) and the exact order statistic by ``np.partition``;
  MAPIE: ``SplitConformalClassifier(prefit=True).conformalize`` (the
  scores; MAPIE takes the quantile inside ``predict_set``) with its APS
  score made non-randomised (MAPIE 1.x always subtracts ``u p_y``; the
  subclass returns the cumulative mass through MAPIE's own
  ``get_true_label_cumsum_proba``), on a table-lookup classifier.
* ``candidate_scores``: the APS score of every candidate, ``(N, M)``. Ours:
  ``candidate_scores(probs, "aps")`` (a sort per row in XLA); NumPy: argsort
  per row, float64 cumsum, scattered back. MAPIE has no public call that
  returns every candidate's score (its cumulative sums live inside the set
  construction), so it is not timed here (``"mapie": null``).
* ``prediction_sets``: test probabilities and ``qhat`` to ``(N, M)`` bool sets.
  Ours: ``prediction_sets(probs, qhat)`` (bisection on the fixed-point level,
  no sort); NumPy: the stage above then ``<= qhat``; MAPIE:
  ``predict_set(..., include_last_label=False)`` of the conformalised
  classifier (float64, argsort, cumsum, and its own ``1e-8`` tolerances; its
  timing includes the classifier's table lookup, a negligible copy).

``ours`` is the public, validating call (``_check_probs`` reads every entry
once in NumPy) on host NumPy arrays, which is what a user writes;
``ours_jit`` wraps the same call in ``jax.jit`` on a device array (validation
skipped, no host-to-device copy). Both are timed after a warm-up call whose
wall time (``first_call_seconds``) and XLA backend compile time
(``compile_seconds``, summed from ``jax.monitoring``) are reported
separately; ``jax_compiles_timed`` counts compilations inside the timed calls
(expected 0). Timed calls alternate between implementations, ``R`` times
each; rates use the median and every call ends in ``block_until_ready``.
``cpu_utilisation`` is process CPU time over wall time (at most the cores).

``ratio_vs_numpy`` / ``ratio_vs_mapie`` are ours over theirs (ours: the
public call). ``headline`` is the ``prediction_sets`` stage at ``1000x10000``
(the per-document work of an audit once ``qhat`` is known), with the goal
``ratio_vs_numpy >= 3`` on CPU.

Agreement, checked in the same run: ``qhat`` of ours and NumPy differ by at
most ``TOL = M 2**-30 + 2**-23`` (the fixed point's truncation and float32
rounding), every ``candidate_scores`` entry not tied with another candidate
of its row is within ``TOL`` of NumPy's float64 score, and every set
membership that differs from NumPy's is within the fixed-point band
(``|score_numpy - qhat_numpy| <= 2 TOL``) or a fixed-point tie (candidates
with the same ``floor(p 2**30)``: ours counts every tied candidate in the
mass, NumPy separates them by sort order, so their scores may differ by a
whole probability). Any other difference
(``set_mismatches_unexplained``) makes the script exit with status 1 and write
no ``--out`` file. MAPIE's sets are compared the same way and also excuse its
documented differences (top-1 label added to empty sets, ``1e-8`` on masses
and on probabilities); they are reported, not enforced.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import conformal as cf
from conformal.mapie_adapter import MapieSplitAPS, mapie_version as mapie_available
from _common import alternate
from snapaudit_jax.utils.io import write_json

DEFAULT_SIZES = ((1000, 1000), (1000, 10000), (10000, 1000))
HEADLINE_SIZE = (1000, 10000)
GOAL_RATIO = 3.0
SIGNAL, SPREAD = 2.0, (0.3, 3.0)
MAPIE_EPSILON = 1e-8


def tol_score(m: int) -> float:
    """Fixed-point error of an APS mass over ``m`` candidates (see tests/conformal/test_kernels.py)."""
    return m * 2.0**-30 + 2.0**-23


def posteriors(rng: np.random.Generator, n: int, m: int):
    """``(probs (n, m) float32, labels (n,))``: softmax of ``beta_i (N(0, I) + SIGNAL e_y)``."""
    labels = rng.integers(0, m, n)
    logits = rng.standard_normal((n, m))
    logits[np.arange(n), labels] += SIGNAL
    logits *= rng.uniform(*SPREAD, size=(n, 1))
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    return p.astype(np.float32), labels


# ---------------------------------------------------------------------------
# The NumPy baseline: sort-based APS
# ---------------------------------------------------------------------------


def numpy_all_scores(probs: np.ndarray) -> np.ndarray:
    """APS mass of every candidate, ``(n, m)`` float64: argsort per row, cumsum, scattered back (ties: sort order)."""
    order = np.argsort(probs, axis=1)[:, ::-1]
    cums = np.cumsum(np.take_along_axis(probs, order, axis=1), axis=1, dtype=np.float64)
    out = np.empty_like(cums)
    np.put_along_axis(out, order, cums, axis=1)
    return out


def numpy_calibrate(probs: np.ndarray, labels: np.ndarray, alpha: float) -> float:
    """The truth's sort-based APS mass per document, then the ceil((n+1)(1-alpha))-th smallest (or +inf)."""
    order = np.argsort(probs, axis=1)[:, ::-1]
    cums = np.cumsum(np.take_along_axis(probs, order, axis=1), axis=1, dtype=np.float64)
    position = np.argmax(order == labels[:, None], axis=1)
    s = cums[np.arange(labels.size), position]
    k = cf.conformal_rank(s.size, alpha)
    return float(np.partition(s, k - 1)[k - 1]) if k <= s.size else math.inf


def numpy_sets(probs: np.ndarray, qhat: float) -> np.ndarray:
    return numpy_all_scores(probs) <= qhat


def tied_mask(probs: np.ndarray) -> np.ndarray:
    """``(n, m)`` bool: the entry's fixed point ``floor(p 2**30)`` equals another entry's of its row.

    Our APS counts such candidates as tied (each one's mass includes the other); NumPy's sort order separates them,
    so their scores differ by up to the other candidate's probability.
    """
    q = np.floor(probs.astype(np.float32).astype(np.float64) * 2.0**cf.FIXED_POINT_BITS)
    order = np.argsort(q, axis=1)
    srt = np.take_along_axis(q, order, axis=1)
    eq = srt[:, 1:] == srt[:, :-1]
    tied_sorted = np.zeros(probs.shape, bool)
    tied_sorted[:, 1:] |= eq
    tied_sorted[:, :-1] |= eq
    out = np.empty_like(tied_sorted)
    np.put_along_axis(out, order, tied_sorted, axis=1)
    return out


# ---------------------------------------------------------------------------
# MAPIE
# ---------------------------------------------------------------------------


def make_mapie(table_cal: np.ndarray, table_test: np.ndarray, alpha: float):
    """``(conformalize(), predict_set(), quantile())`` of the one MAPIE adapter (:mod:`conformal.mapie_adapter`)."""
    ref = MapieSplitAPS(np.concatenate([table_cal, table_test]), table_cal.shape[0], alpha)
    return ref.conformalize, ref.predict_sets, lambda: ref.quantile


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


def summarise(work: int, seconds: dict, first: dict, cpu: dict) -> dict:
    out = {}
    for name, s in seconds.items():
        median = statistics.median(s)
        out[name] = {"doc_candidates_per_s": round(work / median, 1), "seconds_median": round(median, 5),
                     "seconds": [round(x, 5) for x in s], "cpu_utilisation": cpu[name]}
        if name.startswith("ours"):
            out[name].update(first[name])
    return out


def ratios(stage: dict) -> dict:
    ours = stage["ours"]["doc_candidates_per_s"]
    out = {"ratio_vs_numpy": round(ours / stage["numpy"]["doc_candidates_per_s"], 3),
           "ratio_jit_vs_numpy": round(stage["ours_jit"]["doc_candidates_per_s"]
                                       / stage["numpy"]["doc_candidates_per_s"], 3)}
    if stage.get("mapie"):
        out["ratio_vs_mapie"] = round(ours / stage["mapie"]["doc_candidates_per_s"], 3)
    return out


def bench_size(n: int, m: int, alpha: float, repeats: int, seed: int, with_mapie: bool) -> dict:
    rng = np.random.default_rng([seed, n, m])
    p_cal, y_cal = posteriors(rng, n, m)
    p_test, _ = posteriors(rng, n, m)
    work = n * m
    tol = tol_score(m)
    result = {"n_docs": n, "n_candidates": m, "n_calibration": n, "alpha": alpha}

    # calibrate ------------------------------------------------------------
    jit_cal = jax.jit(lambda p, y: cf.threshold(cf.aps_scores(p, y), alpha))
    p_cal_dev, y_cal_dev = jnp.asarray(p_cal), jnp.asarray(y_cal, jnp.int32)
    fns = {
        "ours": lambda: cf.threshold(cf.aps_scores(p_cal, y_cal), alpha),
        "ours_jit": lambda: jit_cal(p_cal_dev, y_cal_dev),
        "numpy": lambda: numpy_calibrate(p_cal, y_cal, alpha),
    }
    conformalize = predict_set = quantile = None
    if with_mapie:
        conformalize, predict_set, quantile = make_mapie(p_cal, p_test, alpha)
        fns["mapie"] = lambda: conformalize(y_cal)
    outs, seconds, cpu, first, timed_compiles = alternate(fns, repeats)
    first["jax_compiles_timed"] = timed_compiles
    qhat, qhat_np = float(outs["ours"]), float(outs["numpy"])
    calibrate = summarise(work, seconds, first, cpu)
    calibrate["jax_compiles_timed"] = first["jax_compiles_timed"]
    calibrate.update(ratios(calibrate))
    result["qhat"] = {"ours": qhat, "numpy": qhat_np, "mapie": None}
    result["calibrate"] = calibrate

    # candidate_scores -----------------------------------------------------
    p_test_dev = jnp.asarray(p_test)
    jit_scores = jax.jit(lambda p: cf.candidate_scores(p, "aps"))
    fns = {
        "ours": lambda: cf.candidate_scores(p_test, "aps"),
        "ours_jit": lambda: jit_scores(p_test_dev),
        "numpy": lambda: numpy_all_scores(p_test),
    }
    outs, seconds, cpu, first, timed_compiles = alternate(fns, repeats)
    first["jax_compiles_timed"] = timed_compiles
    scores_ours, scores_np = np.asarray(outs["ours"], np.float64), outs["numpy"]
    stage = summarise(work, seconds, first, cpu)
    stage["mapie"] = None
    stage["jax_compiles_timed"] = first["jax_compiles_timed"]
    stage.update(ratios(stage))
    result["candidate_scores"] = stage

    # prediction_sets ------------------------------------------------------
    jit_sets = jax.jit(lambda p, q: cf.prediction_sets(p, q, "aps"))
    q32 = np.float32(qhat)
    fns = {
        "ours": lambda: cf.prediction_sets(p_test, q32),
        "ours_jit": lambda: jit_sets(p_test_dev, q32),
        "numpy": lambda: numpy_sets(p_test, qhat_np),
    }
    if with_mapie:
        fns["mapie"] = predict_set
    outs, seconds, cpu, first, timed_compiles = alternate(fns, repeats)
    first["jax_compiles_timed"] = timed_compiles
    sets_ours, sets_np = np.asarray(outs["ours"]), outs["numpy"]
    if with_mapie:
        result["qhat"]["mapie"] = quantile()
    stage = summarise(work, seconds, first, cpu)
    stage["jax_compiles_timed"] = first["jax_compiles_timed"]
    stage.update(ratios(stage))
    result["prediction_sets"] = stage

    # agreement --------------------------------------------------------------
    ties = tied_mask(p_test)
    band = np.abs(scores_np - qhat_np) <= 2 * tol
    differ = sets_ours != sets_np
    agreement = {
        "tolerance": tol,
        "qhat_abs_diff_vs_numpy": abs(qhat - qhat_np),
        "qhat_within_tolerance": abs(qhat - qhat_np) <= tol,
        "candidate_scores_max_abs_diff_untied": float(np.max(np.abs(scores_ours - scores_np)[~ties], initial=0.0)),
        "candidate_scores_within_tolerance": bool(np.all(np.abs(scores_ours - scores_np)[~ties] <= tol)),
        "candidate_scores_match_sets": bool(np.array_equal(np.asarray(outs["ours_jit"]), sets_ours)
                                            and np.array_equal(scores_ours <= q32, sets_ours)),
        "fixed_point_tied_entries": int(ties.sum()),
        "set_mismatches": int(differ.sum()),
        "set_mismatches_unexplained": int((differ & ~band & ~ties).sum()),
        "mean_set_size": float(sets_ours.sum(axis=1).mean()),
        "empty_set_rate": float(np.mean(~sets_ours.any(axis=1))),
    }
    if with_mapie:
        sets_mapie = np.asarray(outs["mapie"], bool)
        empty = ~sets_ours.any(axis=1)
        # MAPIE keeps every label with p >= p_last - 1e-8, p_last the probability of the last label whose float64
        # cumulative mass is <= its quantile + 1e-8 (or of ours' least likely label: the band decides which)
        mq = result["qhat"]["mapie"]
        p64 = p_test.astype(np.float64)
        near_prob = np.zeros(p_test.shape, bool)
        for member in (sets_ours, scores_np <= mq + MAPIE_EPSILON):
            p_last = np.where(member, p64, np.inf).min(axis=1)
            near_prob |= np.abs(p64 - p_last[:, None]) <= MAPIE_EPSILON
        mband = np.abs(scores_np - mq) <= 2 * tol + MAPIE_EPSILON
        mdiff = (sets_mapie != sets_ours) & ~empty[:, None]
        agreement.update({
            "qhat_abs_diff_vs_mapie": abs(qhat - result["qhat"]["mapie"]),
            "mapie_identical_rows": float(np.mean(np.all(sets_mapie == sets_ours, axis=1))),
            "mapie_set_mismatches": int((sets_mapie != sets_ours).sum()),
            "mapie_set_mismatches_unexplained": int((mdiff & ~mband & ~near_prob & ~ties).sum()),
        })
    result["agreement"] = agreement
    return result


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def readable(r: dict) -> str:
    lines = [f"jax {r['jax_version']} ({r['jax_backend']}), numpy {r['numpy_version']}, mapie {r['mapie_version']}, "
             f"{r['machine']['cpu_count']} cores, load {r['machine']['loadavg_at_start']}, alpha {r['alpha']}, "
             f"{r['repeats']} repeats; doc x candidates per second (median)"]
    head = f"{'size':>12} {'stage':>17} {'ours':>12} {'ours_jit':>12} {'numpy':>12} {'mapie':>12} " \
           f"{'x numpy':>8} {'x mapie':>8} {'compile s':>9}"
    lines.append(head)
    for s in r["sizes"]:
        size = f"{s['n_docs']}x{s['n_candidates']}"
        for stage in ("calibrate", "candidate_scores", "prediction_sets"):
            st = s[stage]
            mapie = st.get("mapie")
            lines.append(
                f"{size:>12} {stage:>17} {st['ours']['doc_candidates_per_s']:>12.3g} "
                f"{st['ours_jit']['doc_candidates_per_s']:>12.3g} {st['numpy']['doc_candidates_per_s']:>12.3g} "
                f"{(format(mapie['doc_candidates_per_s'], '12.3g') if mapie else '-'):>12} "
                f"{st['ratio_vs_numpy']:>8.2f} {(format(st['ratio_vs_mapie'], '8.2f') if mapie else '-'):>8} "
                f"{st['ours']['compile_seconds']:>9.2f}")
        a = s["agreement"]
        lines.append(f"{'':>12} agreement: |qhat - numpy| {a['qhat_abs_diff_vs_numpy']:.1e} "
                     f"(tol {a['tolerance']:.1e}), "
                     f"set mismatches {a['set_mismatches']} ({a['set_mismatches_unexplained']} unexplained), "
                     f"fixed-point ties {a['fixed_point_tied_entries']}, mean |C| {a['mean_set_size']:.1f}"
                     + (f", MAPIE identical rows {a['mapie_identical_rows']:.3f} "
                        f"({a['mapie_set_mismatches_unexplained']} unexplained)" if "mapie_identical_rows" in a
                        else ""))
    h = r["headline"]
    if h:
        lines.append(f"headline ({h['size']}, {h['stage']}): ours {h['doc_candidates_per_s']['ours']:.3g}/s, numpy "
                     f"{h['doc_candidates_per_s']['numpy']:.3g}/s, ratio {h['ratio_vs_numpy']:.2f} (goal >= "
                     f"{h['goal_ratio_vs_numpy']:.0f}: {'met' if h['goal_met'] else 'not met'})")
    lines.append(f"total {r['wall_seconds_total']:.0f} s")
    return "\n".join(lines)


def size_arg(text: str) -> tuple[int, int]:
    try:
        n, m = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must be NxM (documents x candidates), got {text!r}") from None
    if n < 2 or m < 2:
        raise argparse.ArgumentTypeError(f"size must have N >= 2 and M >= 2, got {text!r}")
    return n, m


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a readable table")
    parser.add_argument("--out", help="also write the JSON object to this file (atomically)")
    parser.add_argument("--sizes", type=size_arg, nargs="+", default=list(DEFAULT_SIZES),
                        help="NxM sizes (documents x candidates)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per implementation")
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-mapie", action="store_true", help="skip MAPIE even when it is installed")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    cf.conformal_rank(1, args.alpha)  # validates alpha

    start = time.perf_counter()
    mapie_version = None if args.no_mapie else mapie_available()
    result = {
        "benchmark": "conformal",
        "score": "aps",
        "alpha": args.alpha,
        "repeats": args.repeats,
        "seed": args.seed,
        "machine": {"cpu_count": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
                    "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version()},
        "jax_version": jax.__version__,
        "jax_backend": jax.default_backend(),
        "jax_devices": len(jax.devices()),
        "numpy_version": np.__version__,
        "mapie_version": mapie_version,
        "notes": [
            "ours = the public validating call on host arrays; ours_jit = the same call inside jax.jit on a device "
            "array (no validation, no host-to-device copy)",
            "numpy = sort-based APS (argsort per row, float64 cumsum); its sets stage includes computing the scores",
            "mapie candidate_scores: not comparable (MAPIE exposes no call returning every candidate's score)",
            "mapie calibrate = SplitConformalClassifier.conformalize, prediction_sets = predict_set("
            "include_last_label=False), both in float64 on a table-lookup prefit classifier, APS made "
            "non-randomised",
        ],
        "sizes": [],
    }
    for n, m in args.sizes:
        result["sizes"].append(bench_size(n, m, args.alpha, args.repeats, args.seed, mapie_version is not None))
    head = next((s for s in result["sizes"] if (s["n_docs"], s["n_candidates"]) == HEADLINE_SIZE), None)
    result["headline"] = None if head is None else {
        "size": f"{HEADLINE_SIZE[0]}x{HEADLINE_SIZE[1]}",
        "stage": "prediction_sets",
        "doc_candidates_per_s": {k: (head["prediction_sets"][k] or {}).get("doc_candidates_per_s")
                                 for k in ("ours", "ours_jit", "numpy", "mapie") if k in head["prediction_sets"]},
        "ratio_vs_numpy": head["prediction_sets"]["ratio_vs_numpy"],
        "ratio_vs_mapie": head["prediction_sets"].get("ratio_vs_mapie"),
        "candidate_scores_ratio_vs_numpy": head["candidate_scores"]["ratio_vs_numpy"],
        "calibrate_ratio_vs_numpy": head["calibrate"]["ratio_vs_numpy"],
        "goal_ratio_vs_numpy": GOAL_RATIO,
        "goal_met": head["prediction_sets"]["ratio_vs_numpy"] >= GOAL_RATIO,
    }
    result["wall_seconds_total"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result) if args.json else readable(result), flush=True)

    status = 0
    for s in result["sizes"]:
        a = s["agreement"]
        size = f"{s['n_docs']}x{s['n_candidates']}"
        ok = (a["qhat_within_tolerance"] and a["candidate_scores_within_tolerance"]
              and a["candidate_scores_match_sets"] and a["set_mismatches_unexplained"] == 0)
        if not ok:
            print(f"error: {size}: ours and NumPy disagree beyond the fixed-point tolerance: {a}", file=sys.stderr)
            status = 1
        compiles = sum(s[st]["jax_compiles_timed"] for st in ("calibrate", "candidate_scores", "prediction_sets"))
        if compiles:
            print(f"warning: {size}: {compiles} XLA compilation(s) inside the timed calls", file=sys.stderr)
        if a.get("mapie_set_mismatches_unexplained"):
            print(f"warning: {size}: {a['mapie_set_mismatches_unexplained']} set entries differ from MAPIE beyond "
                  "its documented tolerances", file=sys.stderr)
    if status == 0 and args.out:
        write_json(args.out, result)
    return status


if __name__ == "__main__":
    sys.exit(main())
