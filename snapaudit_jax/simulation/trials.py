"""Phase B: bootstrap simulation of DP-noise trials from clean snapshots.

The simulator keeps sufficient statistics, never raw trials:

* black-box successes (and trials) per *unit* -- per snapshot under the
  ``"stratified"`` scheme, per distinct snapshot under ``"bootstrap"``;
* white-box successes ``score >= threshold`` per unit, when a threshold is given;
* a fixed-bin histogram of the white-box score (for threshold search in
  ``O(bins)``) and its min/max.

Trials are organised in *blocks* whose size depends only on the snapshot
count; block ``b`` draws its randomness from ``fold_in(stream_key, b)``. Blocks
are spread over every device of a 1-D mesh (``jax.sharding``; multi-host meshes
through ``jax.distributed`` work the same way) and scanned inside one jitted
call per *chunk*; integer counts are summed with ``psum``. Hence, for a given
key, the counts are identical whatever the chunk size, the device count or the
number of processes, and memory is bounded by the chunk, not the trial count.

Schemes:

* ``"bootstrap"`` (SnapAudit Alg. 1): each trial draws a snapshot index
  uniformly. Conditional on the snapshots, trial outcomes are i.i.d.
  Bernoulli(``theta_tilde``).
* ``"stratified"``: every snapshot receives the same number ``q`` of trials.
  The per-snapshot success rates are then i.i.d. across snapshots with mean
  equal to the true attack success rate, which is what the empirical
  Bernstein bound of :mod:`snapaudit_jax.audits.active` needs.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from snapaudit_jax.mechanisms import Attack, Mechanism, variates
from snapaudit_jax.simulation.snapshots import dedupe
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.memory import check_fits, format_bytes
from snapaudit_jax.utils.progress import Counter

__all__ = [
    "SimulationCounts", "simulate", "accelerator_parallel_blocks", "BLOCK_TRIALS", "CHUNK_TRIALS",
    "ACCELERATOR_CHUNK_TRIALS", "ACCELERATOR_STEP_TRIALS", "ACCELERATOR_STEP_ELEMENTS", "MAX_TRIALS",
    "check_float32_clean",
]

BLOCK_TRIALS = 1 << 14
CHUNK_TRIALS = 1 << 22  # trials per jitted call on CPU (memory bound)
ACCELERATOR_CHUNK_TRIALS = 1 << 28  # on GPU/TPU: fewer host round trips
ACCELERATOR_STEP_TRIALS = 1 << 22  # on GPU/TPU: trials of the blocks vectorised in one scan step, at most
ACCELERATOR_STEP_ELEMENTS = 1 << 26  # on GPU/TPU: noise elements of one scan step, at most (256 MB of float32)
# Trial indices b * block + j, block indices and the per-call counts are int32 in the kernels, and a vectorised
# step may run up to parallel_blocks - 1 padding blocks past the last one: (num_blocks + parallel_blocks) * block
# must stay below 2^31 (checked in simulate). 2e9 trials leave room for 9,000 padding blocks of 2^14 trials.
MAX_TRIALS = 2_000_000_000
_INDEX_LIMIT = 2**31 - 1
_AXIS = "devices"


@dataclasses.dataclass(frozen=True)
class SimulationCounts:
    """Sufficient statistics of one simulation (one hypothesis).

    A *unit* is a snapshot (``"stratified"``), a distinct snapshot (``"bootstrap"`` with ``per_unit``) or the
    whole run (one unit).

    Attributes:
      scheme: ``"stratified"`` or ``"bootstrap"``.
      unit_index: ``(n_snapshots,)`` int, the unit of every input snapshot.
      trials: ``(units,)`` int64 trials per unit.
      hits: ``(units,)`` int64 black-box successes per unit.
      score_hits: ``(units,)`` int64 white-box successes (``score >= threshold``), ``(units, G)`` for a grid of
        thresholds, or ``None`` without a threshold.
      histogram: ``(bins + 2,)`` int64 score counts (underflow, bins, overflow), or ``None``.
      score_min: smallest white-box score (``nan`` if not tracked).
      score_max: largest white-box score (``nan`` if not tracked).
    """

    scheme: str
    unit_index: np.ndarray
    trials: np.ndarray
    hits: np.ndarray
    score_hits: np.ndarray | None
    histogram: np.ndarray | None
    score_min: float
    score_max: float

    @property
    def total_trials(self) -> int:
        """Trials over all units."""
        return int(self.trials.sum())


@dataclasses.dataclass(frozen=True)
class _Plan:
    scheme: str
    units: int  # accumulator length (snapshots, distinct snapshots or 1)
    n: int  # snapshots (for index sampling / stratification)
    rounds: int  # stratified: rounds per block
    block: int  # trials per block
    blocks_per_device: int  # a multiple of parallel_blocks
    parallel_blocks: int  # blocks vectorised together in one scan step (1 on CPU)
    sample_index: bool  # bootstrap with more than one distinct snapshot
    per_unit: bool
    want_threshold: bool
    num_thresholds: int  # G white-box thresholds counted together (1 for a scalar threshold)
    bins: int  # 0: no histogram
    scores: bool  # a white-box statistic is counted (threshold, histogram or score range): the full noise is drawn
    track_scores: bool
    shared_leaves: tuple[bool, ...]  # prepared leaves equal for every distinct snapshot
    mesh: jax.sharding.Mesh


def _mesh(devices) -> jax.sharding.Mesh:
    devs = list(jax.devices() if devices is None else devices)
    return jax.sharding.Mesh(np.array(devs), (_AXIS,), axis_types=(jax.sharding.AxisType.Auto,))


def _bucket(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _noise_shapes(mechanism: Mechanism, attack: Attack, snapshot: np.ndarray, scores: bool) -> list:
    """Shapes and dtypes of the leaves one trial draws: the full draw when scores are counted, else the
    black-box-only draw (:meth:`~snapaudit_jax.mechanisms.base.Mechanism.hit_noise`). Nothing is computed."""
    def draw(key, snap):
        example = mechanism.prepare(snap, attack)
        return (mechanism.noise if scores else mechanism.hit_noise)(key, 1, example)

    shapes = jax.eval_shape(draw, jax.random.key(0), jax.ShapeDtypeStruct(np.shape(snapshot), jnp.float32))
    return jax.tree_util.tree_leaves(shapes)


def _noise_elements(mechanism: Mechanism, attack: Attack, snapshot: np.ndarray, scores: bool) -> int:
    """Noise elements one trial draws (see :func:`_noise_shapes`), at least 1."""
    return max(1, sum(math.prod(leaf.shape) for leaf in _noise_shapes(mechanism, attack, snapshot, scores)))


def accelerator_parallel_blocks(block: int, elements_per_trial: int) -> int:
    """Blocks of ``block`` trials vectorised in one scan step on an accelerator, a power of two.

    Enough blocks for :data:`ACCELERATOR_STEP_TRIALS` trials (rounded up), unless that many trials would draw more
    than :data:`ACCELERATOR_STEP_ELEMENTS` noise elements: then as many as fit under that cap (rounded down, at least
    one block). A wide draw (PV's full noise over ``k`` classes, ``k - 1`` normals a trial) so keeps one step's arrays
    in the hundreds of megabytes instead of ``2^22 (k - 1)`` floats, on a GPU of any size; the counts do not depend
    on it.

    Args:
      block: trials of one block (:data:`BLOCK_TRIALS`, or whole rounds of the snapshots under ``"stratified"``).
      elements_per_trial: noise elements one trial draws (all leaves of the mechanism's draw for one trial).

    Returns:
      The ``parallel_blocks`` that :func:`simulate` uses by default on an accelerator.

    Raises:
      InputError: ``block`` or ``elements_per_trial`` below 1.
    """
    if block < 1 or elements_per_trial < 1:
        raise InputError(f"block and elements_per_trial must be >= 1, got {block} and {elements_per_trial}")
    wanted = _bucket(max(1, ACCELERATOR_STEP_TRIALS // block))
    fits = ACCELERATOR_STEP_ELEMENTS // (block * elements_per_trial)
    if wanted <= fits:
        return wanted
    return 1 << max(0, int(fits).bit_length() - 1)


def _above(score, threshold):
    """``score >= threshold_g`` as int32, thresholds on a new last axis ``(..., G)``."""
    return (score[..., None] >= threshold).astype(jnp.int32)


def _accumulate(plan: _Plan, hit, score, valid, unit, threshold, lo, width):
    """Reduces one block of trials to the accumulators."""
    acc = {}
    v = valid.astype(jnp.int32)
    if plan.scheme == "stratified":  # shapes (rounds, n): units are columns
        acc["hits"] = jnp.sum(hit.astype(jnp.int32) * v, axis=0)
        acc["trials"] = jnp.sum(v, axis=0)
        if plan.want_threshold:
            acc["score_hits"] = jnp.sum(_above(score, threshold) * v[..., None], axis=0)
    elif plan.per_unit and plan.units > 1:
        acc["hits"] = jax.ops.segment_sum(hit.astype(jnp.int32) * v, unit, plan.units)
        acc["trials"] = jax.ops.segment_sum(v, unit, plan.units)
        if plan.want_threshold:
            acc["score_hits"] = jax.ops.segment_sum(_above(score, threshold) * v[:, None], unit, plan.units)
    else:
        acc["hits"] = jnp.sum(hit.astype(jnp.int32) * v)[None]
        acc["trials"] = jnp.sum(v)[None]
        if plan.want_threshold:
            acc["score_hits"] = jnp.sum(_above(score, threshold) * v[:, None], axis=0)[None]
    if plan.bins:
        pos = jnp.floor((score - lo) / width)
        idx = jnp.clip(pos, -1, plan.bins).astype(jnp.int32) + 1
        idx = jnp.where(jnp.isnan(score), 0, idx)
        acc["histogram"] = jax.ops.segment_sum(v.reshape(-1), idx.reshape(-1), plan.bins + 2)
    if plan.track_scores:
        acc["score_min"] = jnp.min(jnp.where(valid, score, jnp.inf))
        acc["score_max"] = jnp.max(jnp.where(valid, score, -jnp.inf))
    return acc


def _combine(a, b):
    out = {}
    for name in a:
        if name == "score_min":
            out[name] = jnp.minimum(a[name], b[name])
        elif name == "score_max":
            out[name] = jnp.maximum(a[name], b[name])
        else:
            out[name] = a[name] + b[name]
    return out


def _reduce_blocks(per_block):
    """Accumulators with a leading block axis -> one accumulator (integer sums are exact in any order)."""
    out = {}
    for name, value in per_block.items():
        if name == "score_min":
            out[name] = jnp.min(value, axis=0)
        elif name == "score_max":
            out[name] = jnp.max(value, axis=0)
        else:
            out[name] = jnp.sum(value, axis=0)
    return out


def _columns(plan: _Plan, prepared, unit_of_snapshot):
    """Prepared leaves ``(D, ...)`` -> trial-last tables, once per call (outside the scan over blocks).

    Shared leaves (equal for every distinct snapshot, e.g. a basis that only depends on the attack) become
    ``(..., 1)``; under ``"stratified"`` the others become ``(..., rounds * n)``, the columns of a whole block;
    under ``"bootstrap"`` ``(..., D)``, one column per distinct snapshot, gathered per block.
    """
    leaves, treedef = jax.tree_util.tree_flatten(prepared)
    out = []
    for x, same in zip(leaves, plan.shared_leaves):
        if same or not (plan.scheme == "stratified" or plan.sample_index):
            out.append(x[0][..., None])
        elif plan.scheme == "stratified":  # trial j * n + i of a block is round j of snapshot i
            per_snapshot = _gather_columns(jnp.moveaxis(x, 0, -1), unit_of_snapshot)
            out.append(jnp.tile(per_snapshot, (1,) * (x.ndim - 1) + (plan.rounds,)))
        else:
            out.append(jnp.moveaxis(x, 0, -1))
    return jax.tree_util.tree_unflatten(treedef, out)


def _gather_columns(table: jax.Array, index: jax.Array) -> jax.Array:
    """``table[..., index]`` as one 1-D gather per row of ``table`` ``(..., D)``: ``(..., T)``.

    XLA's CPU gather of multi-element slices (``x[index]`` on ``(D, m)``, or ``take`` along the last axis) runs
    several times slower than ``m`` scalar gathers.
    """
    flat = table.reshape(-1, table.shape[-1])
    return lax.optimization_barrier(jnp.stack([row[index] for row in flat])).reshape(*table.shape[:-1], index.shape[0])


def _uniform_index(key: jax.Array, num: int, n: int) -> jax.Array:
    """``(num,)`` int32 indices uniform on ``[0, n)``, exactly: one word each, rejection above ``n floor(2^32 / n)``.

    A rejected word (probability below ``n / 2^32``) is redrawn from ``fold_in(key, round)`` until none is left.
    """
    words = variates.random_words(key, (num,))
    if n & (n - 1) == 0:
        return (words & jnp.uint32(n - 1)).astype(jnp.int32)
    limit = jnp.uint32((1 << 32) - (1 << 32) % n)

    def redraw(state):
        w, rnd = state
        fresh = variates.random_words(jax.random.fold_in(key, rnd), (num,))
        return jnp.where(w >= limit, fresh, w), rnd + 1

    words, _ = lax.while_loop(lambda state: jnp.any(state[0] >= limit), redraw, (words, jnp.int32(1)))
    return (words % jnp.uint32(n)).astype(jnp.int32)


def _outcomes(plan: _Plan, mechanism: Mechanism, attack: Attack, key, num: int, example, rows):
    """``(hit, score)`` of ``num`` trials; without white-box counts, the mechanism's black-box-only draw and
    ``score = None`` (an override of ``hit_noise``/``hit_outcomes`` may draw less randomness per trial)."""
    if plan.scores:
        return mechanism.outcomes(mechanism.noise(key, num, example), rows, attack)
    return mechanism.hit_outcomes(mechanism.hit_noise(key, num, example), rows, attack), None


def _block_outcomes(plan: _Plan, mechanism: Mechanism, attack: Attack, example, columns, unit_of_snapshot,
                    block_key, b, total):
    """Runs one block: returns ``(hit, score, valid, unit)``."""
    if plan.scheme == "stratified":
        r, n = plan.rounds, plan.n
        hit, score = _outcomes(plan, mechanism, attack, block_key, r * n, example, columns)
        rounds = b * r + jnp.arange(r)
        valid = jnp.broadcast_to((rounds < total)[:, None], (r, n))
        return hit.reshape(r, n), None if score is None else score.reshape(r, n), valid, None
    key_index, key_noise = jax.random.split(block_key)
    if plan.sample_index:
        unit = unit_of_snapshot[_uniform_index(key_index, plan.block, plan.n)]
        rows = jax.tree_util.tree_map(lambda x: x if x.shape[-1] == 1 else _gather_columns(x, unit), columns)
    else:
        unit = jnp.zeros((plan.block,), jnp.int32)
        rows = columns
    hit, score = _outcomes(plan, mechanism, attack, key_noise, plan.block, example, rows)
    valid = (b * plan.block + jnp.arange(plan.block)) < total
    return hit, score, valid, unit


def _zeros(plan: _Plan):
    acc = {"hits": jnp.zeros((plan.units,), jnp.int32), "trials": jnp.zeros((plan.units,), jnp.int32)}
    if plan.want_threshold:
        acc["score_hits"] = jnp.zeros((plan.units, plan.num_thresholds), jnp.int32)
    if plan.bins:
        acc["histogram"] = jnp.zeros((plan.bins + 2,), jnp.int32)
    if plan.track_scores:
        acc["score_min"] = jnp.float32(jnp.inf)
        acc["score_max"] = jnp.float32(-jnp.inf)
    return acc


@functools.partial(jax.jit, static_argnames=("plan",))
def _run_chunk(args, *, plan: _Plan):
    def local(args):
        stream_key, base, total, num_blocks, mechanism, attack, prepared, unit_of_snapshot, threshold, lo, width = args
        dev = lax.axis_index(_AXIS)
        example = jax.tree_util.tree_map(lambda x: x[0], prepared)
        columns = _columns(plan, prepared, unit_of_snapshot)

        def one_block(b):
            hit, score, valid, unit = _block_outcomes(
                plan, mechanism, attack, example, columns, unit_of_snapshot, jax.random.fold_in(stream_key, b), b, total
            )
            return _accumulate(plan, hit, score, valid, unit, threshold, lo, width)

        def body(acc, j):
            first = base + dev * plan.blocks_per_device + j * plan.parallel_blocks

            def run_blocks(acc):
                if plan.parallel_blocks == 1:
                    return _combine(acc, one_block(first))
                # Blocks past the end have no valid trial, so they add nothing.
                per_block = jax.vmap(one_block)(first + jnp.arange(plan.parallel_blocks))
                return _combine(acc, _reduce_blocks(per_block))

            # The last call of a run is padded with blocks past the end: skip their work.
            return lax.cond(first < num_blocks, run_blocks, lambda acc: acc, acc), None

        steps = plan.blocks_per_device // plan.parallel_blocks
        acc, _ = lax.scan(body, _zeros(plan), jnp.arange(steps))
        out = {}
        for name, value in acc.items():
            if name == "score_min":
                out[name] = lax.pmin(value, _AXIS)
            elif name == "score_max":
                out[name] = lax.pmax(value, _AXIS)
            else:
                out[name] = lax.psum(value, _AXIS)
        return out

    return jax.shard_map(local, mesh=plan.mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec(), check_vma=False)(
        args
    )


@functools.partial(jax.jit, static_argnames=())
def _prepare_all(mechanism, attack, distinct):
    return jax.vmap(mechanism.prepare, in_axes=(0, None))(distinct, attack)


def _to_host(x) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = x.addressable_data(0)
    return np.asarray(x)


def check_float32_clean(name: str, mechanism: Mechanism, clean) -> None:
    """Refuses clean outputs that float32, the kernels' precision, cannot carry with the mechanism's noise.

    A clean value beyond float32's range would become inf; one whose float32 spacing (``numpy.spacing`` at the
    largest magnitude) exceeds the noise unit (:meth:`~snapaudit_jax.mechanisms.base.Mechanism.noise_unit`:
    ``sigma``, or ``1 / scale``) leaves the noisy output indistinguishable from the clean one in float32.

    Args:
      name: the field named in errors (a flag, a config key or a file's array).
      mechanism: the calibrated mechanism.
      clean: the clean outputs, any shape.

    Raises:
      InputError: a value beyond float32's range, or a float32 spacing above the noise unit.
    """
    host = np.asarray(clean)
    if not host.size or host.dtype.kind not in "biuf":
        return
    peak = float(np.max(np.abs(host)))
    if peak > float(np.finfo(np.float32).max):
        raise InputError(f"{name} must be within float32's range (the simulator computes in float32), found a value "
                         f"of magnitude {peak:.6g}")
    unit = mechanism.noise_unit()
    spacing = float(np.spacing(np.float32(peak)))
    if unit is not None and spacing > unit:
        raise InputError(f"{name}: float32 spaces values of magnitude {peak:.6g} by {spacing:.3g}, more than the "
                         f"noise unit {unit:.3g} of {mechanism.name} (sigma, or 1/scale): the simulated noise would "
                         "vanish in rounding; shift or rescale the clean outputs, or claim a smaller epsilon")


def _planned_sizes(mechanism: Mechanism, attack: Attack, distinct_shape: tuple[int, ...], scores: bool
                   ) -> tuple[int, int]:
    """``(noise elements of one trial, bytes of the prepared distinct snapshots)``, from their shapes only.

    Traced once per mechanism class, static fields and shapes (:func:`_traced_sizes`), not once per call."""
    leaves, treedef = jax.tree_util.tree_flatten((mechanism, attack))
    specs = tuple((tuple(np.shape(x)), np.dtype(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype))
                  for x in leaves)
    return _traced_sizes(treedef, specs, tuple(int(n) for n in distinct_shape), bool(scores))


@functools.lru_cache(maxsize=256)
def _traced_sizes(treedef, specs, distinct_shape: tuple[int, ...], scores: bool) -> tuple[int, int]:
    mechanism, attack = jax.tree_util.tree_unflatten(treedef, [jax.ShapeDtypeStruct(s, d) for s, d in specs])

    def draw(mechanism, attack, key, snap):
        example = mechanism.prepare(snap, attack)
        return (mechanism.noise if scores else mechanism.hit_noise)(key, 1, example)

    def prepare(mechanism, attack, distinct):
        return jax.vmap(mechanism.prepare, in_axes=(0, None))(distinct, attack)

    noise = jax.eval_shape(draw, mechanism, attack, jax.eval_shape(lambda: jax.random.key(0)),
                           jax.ShapeDtypeStruct(distinct_shape[1:], jnp.float32))
    prepared = jax.eval_shape(prepare, mechanism, attack, jax.ShapeDtypeStruct(distinct_shape, jnp.float32))
    elements = max(1, sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(noise)))
    size = sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(prepared))
    return elements, size


def _check_memory(name: str, prepared_bytes: int, step_trials: int, elements: int, units: int,
                  num_thresholds: int, want_threshold: bool, bins: int) -> None:
    """Refuses, before compiling anything, a simulation whose arrays cannot fit: the prepared snapshots (their
    exact shapes from ``eval_shape``), one scan step's noise (float32), its white-box comparisons ``(trials, G)``
    and the accumulators ``(units, G)`` (int32 on the device, int64 on the host). A lower bound: XLA's temporaries
    come on top."""
    noise_bytes = 4 * elements * step_trials
    grid = num_thresholds if want_threshold else 0
    compare_bytes = 4 * step_trials * grid
    accumulator_bytes = 12 * units * max(1, grid) + 12 * (bins + 2)
    total = prepared_bytes + noise_bytes + compare_bytes + accumulator_bytes
    check_fits("simulate", total, f"the simulation of {name} (prepared snapshots {format_bytes(prepared_bytes)}, a "
               f"step's noise {format_bytes(noise_bytes)} and threshold comparisons {format_bytes(compare_bytes)} for "
               f"{grid} threshold(s), counts {format_bytes(accumulator_bytes)})")


def simulate(
    key: jax.Array,
    mechanism: Mechanism,
    attack: Attack,
    snapshots,
    *,
    trials: int,
    scheme: str = "bootstrap",
    per_unit: bool = True,
    threshold: float | None = None,
    histogram: tuple[float, float, int] | None = None,
    track_scores: bool = False,
    devices=None,
    chunk_trials: int | None = None,
    parallel_blocks: int | None = None,
    progress: str | None = None,
) -> SimulationCounts:
    """Simulates ``trials`` DP-noise trials for one hypothesis.

    Args:
      key: PRNG key of this stream (hypothesis and pass already folded in).
      mechanism: a :class:`~snapaudit_jax.mechanisms.base.Mechanism`.
      attack: the :class:`~snapaudit_jax.mechanisms.base.Attack`.
      snapshots: clean outputs ``(n, ...)``, cast to float32 (refused beyond float32's range, or where float32's
        spacing at their largest magnitude exceeds the mechanism's noise unit).
      trials: number of trials in ``[1, MAX_TRIALS]`` (``"stratified"`` rounds it up to a multiple of ``n``).
      scheme: ``"bootstrap"`` (a uniform snapshot per trial) or ``"stratified"`` (equal trials per snapshot).
      per_unit: bootstrap only: count per distinct snapshot (else one total).
      threshold: count ``score >= threshold`` as white-box successes; a ``(G,)`` array counts every threshold of a
        grid in the same trials (``score_hits`` then has shape ``(units, G)``); ``None``: no white-box counts.
      histogram: ``(lo, hi, bins)`` for a score histogram of ``bins`` equal bins on ``[lo, hi)``; ``None``: none.
      track_scores: record the min and max score.
      devices: devices of the 1-D mesh (default: all global devices).
      chunk_trials: trials per jitted call (memory bound; the counts do not depend on it); ``None``:
        :data:`CHUNK_TRIALS` on CPU, :data:`ACCELERATOR_CHUNK_TRIALS` on accelerators.
      parallel_blocks: blocks vectorised (``vmap``) in one step of the scan over blocks, a power of two; ``None``: 1
        on CPU (one block of :data:`BLOCK_TRIALS` stays in cache); on accelerators enough for
        :data:`ACCELERATOR_STEP_TRIALS` trials per step (one block is far too small to fill a GPU), fewer where that
        would draw more than :data:`ACCELERATOR_STEP_ELEMENTS` noise elements (:func:`accelerator_parallel_blocks`).
        The counts do not depend on it.
      progress: a label to show a progress bar on stderr; ``None`` is silent.

    Returns:
      :class:`SimulationCounts`; for a given key they are identical whatever ``chunk_trials`` and the device count.

    Raises:
      InputError: ``trials`` out of range, an unknown ``scheme``, a ``threshold`` that is not a number or a
        non-empty 1-D array, a histogram with ``lo >= hi``, ``chunk_trials < 1``, a ``parallel_blocks`` that is
        not a power of two or that would index trials beyond int32, snapshots float32 cannot carry (see
        ``snapshots``), or arrays larger than the machine's memory (planned before compiling).
    """
    if trials < 1 or trials > MAX_TRIALS:
        raise InputError(f"trials must be in [1, {MAX_TRIALS}], got {trials}")
    check_float32_clean("snapshots", mechanism, snapshots)
    snaps = np.asarray(snapshots, np.float32)
    n = snaps.shape[0]
    if scheme not in ("bootstrap", "stratified"):
        raise InputError(f"scheme must be 'bootstrap' or 'stratified', got {scheme!r}")
    thr_host = np.atleast_1d(np.asarray(0.0 if threshold is None else threshold, np.float64))
    if thr_host.ndim != 1 or thr_host.size < 1:
        raise InputError(f"threshold must be a number or a non-empty 1-D array, got shape {thr_host.shape}")
    distinct, inverse, _ = dedupe(snaps)
    num_distinct = distinct.shape[0]
    padded = _bucket(num_distinct)
    if padded > num_distinct:
        distinct = np.concatenate([distinct, np.repeat(distinct[:1], padded - num_distinct, axis=0)])
    mesh = _mesh(devices)
    num_devices = mesh.devices.size
    on_cpu = mesh.devices.flat[0].platform == "cpu"
    if chunk_trials is None:
        chunk_trials = CHUNK_TRIALS if on_cpu else ACCELERATOR_CHUNK_TRIALS
    if chunk_trials < 1:
        raise InputError(f"chunk_trials must be >= 1, got {chunk_trials}")
    if parallel_blocks is not None and (parallel_blocks < 1 or parallel_blocks & (parallel_blocks - 1)):
        raise InputError(f"parallel_blocks must be a power of two >= 1, got {parallel_blocks}")

    if scheme == "stratified":
        rounds = max(1, BLOCK_TRIALS // n)
        block = rounds * n
        total = -(-trials // n)  # rounds per snapshot (trials per snapshot)
        num_blocks = -(-total // rounds)
        units = n
        sample_index = False
    else:
        rounds, block, total = 1, BLOCK_TRIALS, trials
        num_blocks = -(-trials // block)
        sample_index = num_distinct > 1
        units = padded if (per_unit and sample_index) else 1
    bins = 0 if histogram is None else int(histogram[2])
    scores = threshold is not None or bins > 0 or track_scores
    elements, prepared_bytes = _planned_sizes(mechanism, attack, distinct.shape, scores)
    if parallel_blocks is None:
        parallel_blocks = 1 if on_cpu else accelerator_parallel_blocks(block, elements)
    if (num_blocks + parallel_blocks) * block > _INDEX_LIMIT:
        raise InputError(f"trials={trials} in blocks of {block} with parallel_blocks={parallel_blocks} would index "
                         f"trials beyond the kernels' int32 range (2^31); lower trials or parallel_blocks")
    _check_memory(mechanism.name, prepared_bytes, block * parallel_blocks, elements, units, thr_host.size,
                  threshold is not None, bins)
    # Blocks per device per call: the chunk size, or fewer (rounded up to a power of two, so that nearby trial
    # counts share one compiled function) for short runs; a whole number of vectorised steps.
    per_device = max(1, min(chunk_trials // (block * num_devices), _bucket(-(-num_blocks // num_devices))))
    per_device = -(-per_device // parallel_blocks) * parallel_blocks
    prepared = _prepare_all(mechanism, attack, jnp.asarray(distinct))
    shared = tuple(
        bool(np.all(leaf[:num_distinct] == leaf[:1]))
        for leaf in map(_to_host, jax.tree_util.tree_leaves(prepared))
    )
    plan = _Plan(
        scheme=scheme,
        units=units,
        n=n,
        rounds=rounds,
        block=block,
        blocks_per_device=per_device,
        parallel_blocks=parallel_blocks,
        sample_index=sample_index,
        per_unit=per_unit,
        want_threshold=threshold is not None,
        num_thresholds=thr_host.size,
        bins=bins,
        scores=scores,
        track_scores=track_scores,
        shared_leaves=shared,
        mesh=mesh,
    )
    lo, hi = (0.0, 1.0) if histogram is None else (float(histogram[0]), float(histogram[1]))
    width = (hi - lo) / plan.bins if plan.bins else 1.0
    if plan.bins and not width > 0:
        raise InputError(f"histogram range must satisfy lo < hi, got ({lo}, {hi})")
    unit_of_snapshot = jnp.asarray(inverse, jnp.int32)
    thr = jnp.asarray(thr_host, jnp.float32)

    acc = None
    blocks_per_call = per_device * num_devices
    bar = Counter(progress or "", total * (n if scheme == "stratified" else 1), progress is not None, unit="trials")
    for call in range(-(-num_blocks // blocks_per_call)):
        base = call * blocks_per_call
        out = _run_chunk(
            (key, jnp.int32(base), jnp.int32(total), jnp.int32(num_blocks), mechanism, attack, prepared,
             unit_of_snapshot, thr, jnp.float32(lo), jnp.float32(width)),
            plan=plan,
        )
        out = {name: _to_host(value) for name, value in out.items()}
        if acc is None:
            acc = {name: value.astype(np.float64 if name.startswith("score_m") else np.int64)
                   for name, value in out.items()}
        else:
            for name, value in out.items():
                if name == "score_min":
                    acc[name] = np.minimum(acc[name], value)
                elif name == "score_max":
                    acc[name] = np.maximum(acc[name], value)
                else:
                    acc[name] = acc[name] + value
        done_blocks = min(num_blocks, base + blocks_per_call)
        bar.update(min(done_blocks * block, total * (n if scheme == "stratified" else 1)))

    if scheme == "stratified":
        unit_index = np.arange(n)
    elif units == 1:
        unit_index = np.zeros(n, np.int64)
    else:
        unit_index = inverse
    cut = num_distinct if (scheme == "bootstrap" and units > 1) else units
    return SimulationCounts(
        scheme=scheme,
        unit_index=np.asarray(unit_index),
        trials=acc["trials"][:cut],
        hits=acc["hits"][:cut],
        score_hits=(None if "score_hits" not in acc else
                    acc["score_hits"][:cut, 0] if np.ndim(threshold) == 0 else acc["score_hits"][:cut]),
        histogram=acc.get("histogram"),
        score_min=float(acc["score_min"]) if "score_min" in acc else math.nan,
        score_max=float(acc["score_max"]) if "score_max" in acc else math.nan,
    )
