"""Phase B simulator: sufficient statistics, chunk/device independence, no recompilation."""

import functools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from scipy import stats

import snapaudit_jax as sa
from snapaudit_jax.audits.active import make_attack
from snapaudit_jax.mechanisms import variates
from snapaudit_jax.simulation.trials import _run_chunk, _uniform_index, simulate
from snapaudit_jax.utils.errors import InputError

from tests.helpers.paths import ROOT as _ROOT

ROOT = str(_ROOT)
WORKER = str(Path(ROOT) / "tests" / "helpers" / "sharding_worker.py")

PV = sa.PrivateVoting.calibrated(2.0, 1e-5)
VOTES = np.array([[1.0, 2.0], [1.0, 2.0], [2.0, 1.0], [1.0, 2.0], [0.0, 3.0]])
ATTACK = make_attack(PV, [1.0, 2.0], [0.0, 3.0])


def test_counts_do_not_depend_on_chunk_size():
    """Same key, different chunk sizes: identical counts (randomness is per block, not per chunk)."""
    key = jax.random.key(7)
    a = simulate(key, PV, ATTACK, VOTES, trials=100_003, threshold=0.3, chunk_trials=1 << 14)
    b = simulate(key, PV, ATTACK, VOTES, trials=100_003, threshold=0.3, chunk_trials=1 << 20)
    np.testing.assert_array_equal(a.hits, b.hits)
    np.testing.assert_array_equal(a.trials, b.trials)
    np.testing.assert_array_equal(a.score_hits, b.score_hits)
    assert a.total_trials == 100_003


def test_stratified_gives_every_snapshot_the_same_trials():
    """Stratified scheme: q = ceil(trials / n) trials per snapshot, counts per snapshot."""
    out = simulate(jax.random.key(1), PV, ATTACK, VOTES, trials=10_001, scheme="stratified")
    assert out.trials.tolist() == [2001] * 5
    assert out.hits.shape == (5,)
    assert np.array_equal(out.unit_index, np.arange(5))
    # Snapshot 2 ([2, 1]) favours the target far more than snapshot 4 ([0, 3]).
    assert out.hits[2] > out.hits[0] > out.hits[4]


def test_bootstrap_units_are_distinct_snapshots_sampled_by_multiplicity():
    """Bootstrap: per-distinct counts; trials per distinct ~ Multinomial(multiplicity / n) (chi-square, p > 1e-6)."""
    out = simulate(jax.random.key(2), PV, ATTACK, VOTES, trials=200_000)
    assert out.unit_index.tolist() == [0, 0, 1, 0, 2]
    assert out.trials.sum() == 200_000
    assert stats.chisquare(out.trials, 200_000 * np.array([3, 1, 1]) / 5).pvalue > 1e-6


@pytest.mark.parametrize("n", [1, 3, 2048, 3 * 2**29])
def test_uniform_index_is_exactly_uniform(n):
    """Snapshot indices are uniform on [0, n): chi-square over 3 equal-probability cells (false-failure prob 1e-6).
    n = 3 * 2^29 rejects a quarter of the words, so the redraw loop runs; power: the plain modulo of one word
    (no rejection) is rejected there, since it doubles the probability of the indices below 2^32 - n."""
    num = 300_001
    index = np.asarray(jax.jit(_uniform_index, static_argnums=(1, 2))(jax.random.key(n), num, n), np.int64)
    assert index.min() >= 0 and index.max() < n
    if n == 1:
        return
    cells = np.bincount(index * 3 // n, minlength=3)
    assert stats.chisquare(cells).pvalue > 1e-6
    if n == 3 * 2**29:
        plain = np.asarray(variates.random_words(jax.random.key(n), (num,)), np.int64) % n
        assert stats.chisquare(np.bincount(plain * 3 // n, minlength=3)).pvalue < 1e-6


def test_pv_outcomes_are_the_arg_max_of_the_noisy_votes():
    """PV's per-row outcome equals jnp.argmax of votes + sigma * basis @ noise (ties to the first maximum) and the
    score <noisy, direction>, for a target in the middle of 7 classes and noise rows that make exact ties."""
    k, target = 7, 3
    mech = sa.PrivateVoting(sigma=np.float32(0.8))
    votes = np.array([2.0, 1.0, 3.0, 3.0, 0.5, 3.0, 1.0], np.float32)
    attack = make_attack(mech, votes + np.eye(k)[target], votes, target=target)
    prepared = mech.prepare(votes, attack)
    noise = np.array(jax.random.normal(jax.random.key(3), (k - 1, 4001)), np.float32)
    noise[:, :7] = 0.0  # noisy = votes: classes 2, 3 and 5 tie, so the release is 2, not the target
    hit, score = mech.outcomes(noise, jax.tree_util.tree_map(lambda x: x[..., None], prepared), attack)
    basis = np.asarray(prepared.basis)
    noisy = votes[:, None] + np.float32(0.8) * (basis @ noise)
    assert not np.asarray(hit)[:7].any()
    assert np.array_equal(np.asarray(hit), np.argmax(noisy, axis=0) == target)
    np.testing.assert_allclose(np.asarray(score), np.asarray(prepared.direction) @ noisy, rtol=1e-5, atol=1e-5)
    assert 0.1 < np.asarray(hit).mean() < 0.6


def test_histogram_and_threshold_counts_agree():
    """The histogram tail at a bin edge equals the threshold count, and it holds every trial."""
    lo, hi, bins = -6.0, 6.0, 48
    edge = lo + (hi - lo) / bins * 30
    out = simulate(jax.random.key(3), PV, ATTACK, VOTES[:1], trials=50_000, threshold=edge,
                   histogram=(lo, hi, bins), per_unit=False, track_scores=True)
    assert out.histogram.sum() == 50_000
    assert out.histogram[31:].sum() == out.score_hits.sum()
    assert (out.histogram[0] > 0) == (out.score_min < lo)  # underflow bin
    assert (out.histogram[-1] > 0) == (out.score_max >= hi)  # overflow bin


def test_second_call_does_not_recompile():
    """A new sigma (epsilon), key or trial count reuses the compiled chunk function."""
    simulate(jax.random.key(0), PV, ATTACK, VOTES, trials=70_000, chunk_trials=1 << 15)
    size = _run_chunk._cache_size()
    other = sa.PrivateVoting.calibrated(8.0, 1e-5)
    simulate(jax.random.key(5), other, ATTACK, VOTES, trials=70_000, chunk_trials=1 << 15)
    simulate(jax.random.key(6), other, ATTACK, VOTES, trials=250_001, chunk_trials=1 << 15)
    assert _run_chunk._cache_size() == size


def test_bad_arguments():
    with pytest.raises(ValueError, match="trials"):
        simulate(jax.random.key(0), PV, ATTACK, VOTES, trials=0)
    with pytest.raises(ValueError, match="scheme"):
        simulate(jax.random.key(0), PV, ATTACK, VOTES, trials=10, scheme="poisson")
    with pytest.raises(ValueError, match="histogram range"):
        simulate(jax.random.key(0), PV, ATTACK, VOTES, trials=10, histogram=(1.0, 1.0, 4))


@functools.lru_cache(maxsize=None)
def _run_worker(*args, timeout=300):
    """The worker's counts for ``args`` (run once per process: the single-device reference serves two tests)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    # PYTHONPATH: this tree, not an installed copy; the worker adds its device count to the suite's XLA_FLAGS
    proc = subprocess.run([sys.executable, WORKER, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


@pytest.mark.slow
def test_same_counts_on_one_and_eight_devices():
    """Sharding over 8 host devices gives exactly the counts of 1 device."""
    one = _run_worker(1)
    eight = _run_worker(8)
    assert one["devices"] == 1 and eight["devices"] == 8
    for key in one:
        if key != "devices":
            assert one[key] == eight[key], key


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one_process():
    """jax.distributed with two CPU processes (gloo) gives exactly the single-process counts."""
    coordinator = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    # PYTHONPATH: this tree, not an installed copy; the worker adds its device count to the suite's XLA_FLAGS
    procs = [
        subprocess.Popen([sys.executable, WORKER, "2", coordinator, "2", str(pid)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
        for pid in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    multi = json.loads([line for line in outs[0][0].splitlines() if line.startswith("{")][-1])
    single = _run_worker(1)
    assert multi["devices"] == 4
    for key in single:
        if key != "devices":
            assert single[key] == multi[key], key


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pv", "poe", "esa", "ksa"])
def test_vectorised_blocks_give_the_same_counts(name):
    """Blocks vectorised 4 at a time (the accelerator layout) give exactly the counts of one block per scan step
    (the CPU layout), for every mechanism, with per-unit counts, a threshold grid and a histogram."""
    from snapaudit_jax.audits.command import DEFAULT_CLEAN, esa_unit_pair
    from snapaudit_jax.mechanisms.ksa import bucket_num_values

    if name == "esa":
        u1, u2 = esa_unit_pair(1.3, 16)
        mech = sa.EmbeddingSpaceAggregation.calibrated(4.0, 1e-5, np.stack([u1, u2]))
        w, wo = u1, u2
    else:
        w, wo = map(np.asarray, DEFAULT_CLEAN[name])
        mech = {"pv": PV, "poe": sa.ProductOfExperts.calibrated(4.0, clip=5.0),
                "ksa": sa.KeywordSpaceAggregation.calibrated(4.0, top_k=3, num_values=bucket_num_values(
                    np.stack([w, wo])))}[name]
    attack = make_attack(mech, w, wo)
    snaps = np.stack([w, wo, w, (w + wo) / 2])
    options = dict(trials=70_001, threshold=np.array([-0.5, 0.0, 0.5]), histogram=(-6.0, 6.0, 24), track_scores=True)
    key = jax.random.key(13)
    one = simulate(key, mech, attack, snaps, parallel_blocks=1, **options)
    many = simulate(key, mech, attack, snaps, parallel_blocks=4, chunk_trials=1 << 15, **options)
    for field in ("hits", "trials", "score_hits", "histogram"):
        np.testing.assert_array_equal(getattr(one, field), getattr(many, field), err_msg=f"{name} {field}")
    assert (one.score_min, one.score_max) == (many.score_min, many.score_max)
    if name == "pv":
        strat = [simulate(key, mech, attack, snaps, scheme="stratified", trials=30_000, parallel_blocks=p).hits
                 for p in (1, 4)]
        np.testing.assert_array_equal(*strat)


def test_accelerator_step_is_capped_by_noise_elements():
    """Accelerator default: 2^22 trials a scan step unless the noise would pass 2^26 elements (closed forms)."""
    from snapaudit_jax.simulation.trials import (
        ACCELERATOR_STEP_ELEMENTS, ACCELERATOR_STEP_TRIALS, _noise_elements, accelerator_parallel_blocks)

    assert (ACCELERATOR_STEP_TRIALS, ACCELERATOR_STEP_ELEMENTS) == (1 << 22, 1 << 26)
    block = 1 << 14
    assert accelerator_parallel_blocks(block, 1) == 256
    assert accelerator_parallel_blocks(block, 16) == 256  # exactly 2^26 elements: not capped
    assert accelerator_parallel_blocks(block, 17) == 128  # 2^26 / (17 * 2^14) = 240.9 -> 128
    assert accelerator_parallel_blocks(block, 999) == 4  # 4.1 -> 4
    assert accelerator_parallel_blocks(block, 10**7) == 1  # one block even when it alone is above the cap
    assert accelerator_parallel_blocks(16_000, 1) == 512  # stratified blocks: 262.1 rounded up
    assert accelerator_parallel_blocks(16_000, 15) == 256  # 279.6 -> 256
    with pytest.raises(InputError, match="elements_per_trial"):
        accelerator_parallel_blocks(block, 0)
    # What a PV trial draws: k - 1 normals with scores; the black-box draw from 4 classes on is 4 words.
    for k, full, hit in ((2, 1, 1), (3, 2, 2), (4, 3, 4), (1000, 999, 4)):
        w = np.arange(k, dtype=np.float32)
        attack = make_attack(PV, w, w[::-1].copy())
        assert (_noise_elements(PV, attack, w, True), _noise_elements(PV, attack, w, False)) == (full, hit), k


# --------------------------------------------------------------------------- limits checked before compiling


def test_float32_resolution_limit_is_the_spacing_of_the_largest_clean_value():
    """With sigma = 1, float32 spaces 2^23 by 1 (the noise still moves the output) and 2^24 by 2 (it cannot):
    the first is simulated, the second refused naming the field."""
    import jax.numpy as jnp

    from snapaudit_jax.mechanisms import PrivateVoting
    from snapaudit_jax.simulation.trials import check_float32_clean

    mech = PrivateVoting(sigma=jnp.float32(1.0))
    check_float32_clean("clean_with", mech, [[2.0**23, 0.0]])
    assert np.float32(2.0**24) + np.float32(0.9) == np.float32(2.0**24)  # the noise vanishes there
    with pytest.raises(InputError, match=r"clean_with: float32 spaces values of magnitude 1.67772e\+07 by 2"):
        check_float32_clean("clean_with", mech, [[0.0, -(2.0**24)]])
    with pytest.raises(InputError, match="clean_with must be within float32's range"):
        check_float32_clean("clean_with", mech, [[1e39, 0.0]])
    with pytest.raises(InputError, match="snapshots: float32 spaces"):
        simulate(jax.random.key(0), mech, make_attack(mech, [2.0**24, 0.0], [0.0, 2.0**24]),
                 np.array([[2.0**24, 0.0]]), trials=10)


def test_simulate_plans_its_memory_and_int32_indices_before_compiling(monkeypatch):
    from snapaudit_jax.mechanisms import PrivateVoting
    from snapaudit_jax.simulation import trials as T
    from snapaudit_jax.utils import memory

    mech = PrivateVoting.calibrated(1.0, 1e-5)
    attack = make_attack(mech, [1.0, 0.0, 0.0], [0.0, 1.0, 0.0])
    snaps = np.array([[1.0, 0.0, 0.0]])
    with pytest.raises(InputError, match=r"int32 range \(2\^31\)"):
        simulate(jax.random.key(0), mech, attack, snaps, trials=T.MAX_TRIALS, parallel_blocks=2**14)
    # 4001 thresholds: one block's comparisons alone are 2^14 x 4001 int32 = 250 MiB. One block a step
    # (parallel_blocks=1, the CPU's default; an accelerator's default vectorises many blocks a step and plans
    # that many times more), so that the planned size is the same on every backend.
    monkeypatch.setattr(memory, "available_bytes", lambda: 200 * 2**20)
    assert T.BLOCK_TRIALS == 2**14
    with pytest.raises(InputError, match=r"simulate: the simulation of pv .* threshold comparisons 250.1 MiB for "
                                         "4001 threshold"):
        simulate(jax.random.key(0), mech, attack, snaps, trials=10, threshold=np.linspace(-1, 1, 4001),
                 parallel_blocks=1)
    counts = simulate(jax.random.key(0), mech, attack, snaps, trials=10, threshold=np.linspace(-1, 1, 3),
                      parallel_blocks=1)
    assert counts.total_trials == 10  # a small grid fits the same machine
