"""The LM head's target log-probabilities a vocabulary chunk at a time: no ``(tokens, V)`` array at any point.

Training scores each position by ``log p(y | h) = h . W_y + b_y - lse(h W^T + b)``. Formed whole, the logits
and their cotangent are two ``(tokens, V)`` float32 arrays: with GPT-2's 50,257-entry vocabulary, 64 records of
128 tokens hold 1.6 GB in each, more than the rest of a small model's step. :func:`target_logprobs` computes the
same numbers by scanning over ``V / chunk`` slices of the head (an online log-sum-exp forward), and its custom
VJP recomputes each slice's probabilities ``p = exp(h W_c^T + b_c - lse)`` on the way back:

* ``dh = u W_y + (w - u) p W`` and ``dW = u e_y h^T + (w - u) p^T h`` (``db`` alike), with ``u`` and ``w`` the
  cotangents of the target log-probability and of ``lse``;

so the largest array is one ``(tokens, chunk)`` slice. The target's entry is taken apart (:func:`off_target`:
``e_y - p = m e_y - q`` with ``m = 1 - p_y`` summed from the other entries), so a confident model's gradient keeps
its relative precision where ``1 - p_y`` formed in float32 would not. The price is one more product with the
head (the forward slice recomputed backwards): 4 against 3, which is why it is an option (``vocab_chunk``), not
the default.
Everything runs in float32 whatever the model's dtype (the weights are cast a slice at a time).

The book-keeping and ghost clipping paths (:mod:`snapaudit_jax.dpsgd.ghost`) tap this call as one layer and take
the head's per-unit terms from ``h``, the targets, ``lse`` and ``u`` alone (the same slices scanned again).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["target_logprobs", "target_logprobs_values", "head_target_logprobs", "head_weights", "VocabSlice",
           "slice_plan", "vocab_slice", "scan_vocab", "add_slice_rows", "slice_probabilities", "slice_cotangents",
           "off_target", "checked_chunk", "rows_product", "transposed_is_smaller"]


def checked_chunk(vocab_chunk) -> int | None:
    """A ``vocab_chunk`` argument checked: ``None`` (the whole logits) or a positive int.

    Args:
      vocab_chunk: the caller's value.

    Returns:
      ``None``, or ``vocab_chunk`` as an int.

    Raises:
      InputError: naming ``vocab_chunk``, for anything else.
    """
    from snapaudit_jax.utils import validate

    return None if vocab_chunk is None else validate.positive_int("vocab_chunk", vocab_chunk)


class VocabSlice(NamedTuple):
    """One slice of the head, read in place (:func:`vocab_slice`).

    ``start``: the first row's id (``()`` int32); ``ids``: the rows' ids (``(chunk,)`` int32); ``rows``: their
    weights in float32 (``(chunk, D)``); ``biases``: theirs, zeros without a bias (``(chunk,)``); ``valid``: ``False``
    on the rows the previous slice already had (the last slice ends at the head's last row, so it may overlap).
    """

    start: jax.Array
    ids: jax.Array
    rows: jax.Array
    biases: jax.Array
    valid: jax.Array


def slice_plan(vocab: int, chunk: int) -> tuple[int, int]:
    """``(rows a slice, slices)`` for a head of ``vocab`` rows read ``chunk`` rows at a time.

    Args:
      vocab: the head's rows ``V``.
      chunk: rows a slice, ``>= 1``; above ``V``, one slice of ``V`` rows.

    Returns:
      ``(min(chunk, V), ceil(V / min(chunk, V)))``.
    """
    chunk = min(int(chunk), int(vocab))
    return chunk, -(-int(vocab) // chunk)


def vocab_slice(weight: jax.Array, bias: jax.Array | None, chunk: int, index: jax.Array) -> VocabSlice:
    """Slice ``index`` of the head, ``chunk`` rows read where they lie (no copy of the head): rows ``[index chunk,
    index chunk + chunk)``, the last slice moved back to end at row ``V`` with the rows it repeats marked invalid.

    Args:
      weight: ``(V, D)`` the head's rows.
      bias: ``(V,)`` or ``None``.
      chunk: rows a slice, ``1 <= chunk <= V`` (:func:`slice_plan`).
      index: the slice's index (may be traced).

    Returns:
      The :class:`VocabSlice`.
    """
    vocab = weight.shape[0]
    first = jnp.asarray(index, jnp.int32) * chunk
    start = jnp.minimum(first, vocab - chunk)
    rows = jax.lax.dynamic_slice_in_dim(weight, start, chunk).astype(jnp.float32)
    biases = (jnp.zeros(chunk, jnp.float32) if bias is None
              else jax.lax.dynamic_slice_in_dim(bias, start, chunk).astype(jnp.float32))
    ids = start + jnp.arange(chunk, dtype=jnp.int32)
    return VocabSlice(start, ids, rows, biases, ids >= first)


def scan_vocab(body, init, weight: jax.Array, bias: jax.Array | None, chunk: int):
    """``carry = body(carry, slice)`` over the head's slices in order (a ``lax.scan``; :func:`vocab_slice`).

    Args:
      body: ``(carry, VocabSlice) -> carry``.
      init: the first carry.
      weight, bias: the head (``(V, D)``, ``(V,)`` or ``None``).
      chunk: rows a slice, ``>= 1``.

    Returns:
      The last carry.
    """
    chunk, count = slice_plan(weight.shape[0], chunk)

    def step(carry, index):
        return body(carry, vocab_slice(weight, bias, chunk, index)), None

    carry, _ = jax.lax.scan(step, init, jnp.arange(count, dtype=jnp.int32))
    return carry


def add_slice_rows(total: jax.Array, piece: VocabSlice, part: jax.Array) -> jax.Array:
    """``total`` (``(V, ...)``) with ``part`` (``(chunk, ...)``, zero on the slice's invalid rows) added to the
    slice's rows, in place.

    Args:
      total: the whole head's accumulator.
      piece: the slice.
      part: the slice's rows' contribution.

    Returns:
      The updated accumulator.
    """
    current = jax.lax.dynamic_slice_in_dim(total, piece.start, part.shape[0])
    return jax.lax.dynamic_update_slice_in_dim(total, current + part, piece.start, axis=0)


def off_target(p: jax.Array, ids: jax.Array, targets: jax.Array) -> jax.Array:
    """``q = p`` with each position's target entry zeroed, on one slice.

    With ``m = sum_v q[v] = 1 - p[y]`` (no cancellation), ``e_y - p = m e_y - q``: the logits' cotangent as
    products of small numbers however confident the model, where ``1 - p[y]`` formed in float32 keeps only
    ``2^-24`` absolute.

    Args:
      p: ``(..., chunk)`` the slice's probabilities.
      ids: ``(chunk,)`` the slice's vocabulary ids.
      targets: ``(...)`` each position's target id.

    Returns:
      ``(..., chunk)`` the off-target probabilities.
    """
    return jnp.where(ids != targets[..., None], p, 0.0)


def slice_cotangents(p: jax.Array, ids: jax.Array, targets: jax.Array, u: jax.Array, w: jax.Array) -> jax.Array:
    """One slice's part of the logits' cotangent of ``u picked + w lse`` without its targets' ``u m e_y``.

    ``d / d logits = u (e_y - p) + w p = u m e_y + (w p - u q)`` (:func:`off_target`); on a slice,
    ``w p - u q`` is ``p w`` on the target's entry and ``p (w - u)`` elsewhere: one product an entry, no
    difference of numbers near 1.

    Args:
      p: ``(..., chunk)`` the slice's probabilities.
      ids: ``(chunk,)`` the slice's vocabulary ids.
      targets: ``(...)`` each position's target id.
      u, w: ``(...)`` the cotangents of the target log-probability and of ``lse``.

    Returns:
      ``(..., chunk)`` float32.
    """
    return p * jnp.where(ids == targets[..., None], w[..., None], (w - u)[..., None])


def slice_probabilities(hidden: jax.Array, rows: jax.Array, biases: jax.Array, valid: jax.Array,
                        lse: jax.Array) -> jax.Array:
    """``p = softmax(h W^T + b)`` on one slice of the vocabulary: ``(..., chunk)``, ``0`` on invalid rows.

    Args:
      hidden: ``(..., D)`` float32 hidden states.
      rows, biases, valid: one :class:`VocabSlice`'s (``(chunk, D)``, ``(chunk,)``, ``(chunk,)``).
      lse: ``(...)`` the positions' log-sum-exp over the whole vocabulary.

    Returns:
      The slice's probabilities.
    """
    logits = jnp.einsum("...d,vd->...v", hidden, rows) + biases
    return jnp.where(valid, jnp.exp(logits - lse[..., None]), 0.0)


def _logsumexp(hidden, weight, bias, chunk, targets):
    """``(lse, m)``: the online log-sum-exp over the slices and, in the same pass, the off-target mass
    ``m = sum_{v != y} p_v`` (its own running sum, rescaled alike)."""
    def body(carry, piece):
        top, total, off = carry
        logits = jnp.where(piece.valid, jnp.einsum("...d,vd->...v", hidden, piece.rows) + piece.biases, -jnp.inf)
        new_top = jnp.maximum(top, jnp.max(logits, axis=-1))
        rescale = jnp.exp(top - new_top)
        e = jnp.exp(logits - new_top[..., None])
        total = total * rescale + jnp.sum(e, axis=-1)
        off = off * rescale + jnp.sum(jnp.where(piece.ids != targets[..., None], e, 0.0), axis=-1)
        return new_top, total, off

    zeros = jnp.zeros(hidden.shape[:-1], jnp.float32)
    start = (jnp.full(hidden.shape[:-1], -jnp.inf, jnp.float32), zeros, zeros)
    top, total, off = scan_vocab(body, start, weight, bias, chunk)
    return top + jnp.log(total), off / total


def target_logprobs_values(hidden, weight, bias, targets, chunk: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`target_logprobs`'s values without its VJP (the forward both it and the gradient taps run), and each
    position's off-target mass.

    Args:
      hidden, weight, bias, targets, chunk: as :func:`target_logprobs`.

    Returns:
      ``(picked, lse, m)``: ``m = sum_{v != y} p_v``, ``1 - p_y`` summed from the other entries
      (:func:`off_target`).
    """
    (picked, lse), residuals = _forward(hidden, weight, bias, targets, chunk)
    return picked, lse, residuals[-1]


def _forward(hidden, weight, bias, targets, chunk):
    h = hidden.astype(jnp.float32)
    lse, mass = _logsumexp(h, weight, bias, chunk, targets)
    at_target = jnp.sum(h * jnp.take(weight, targets, axis=0).astype(jnp.float32), axis=-1)
    if bias is not None:
        at_target = at_target + jnp.take(bias, targets).astype(jnp.float32)
    return (at_target - lse, lse), (hidden, weight, bias, targets, lse, mass)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _target_logprobs(hidden, weight, bias, targets, chunk):
    return _forward(hidden, weight, bias, targets, chunk)[0]


def rows_product(a: jax.Array, b: jax.Array, precision=None) -> jax.Array:
    """``sum_r a_r^T b_r`` over every leading axis of ``a`` and ``b`` (``(..., p)`` and ``(..., q)``): ``(p, q)``,
    taken as ``(b^T a)^T`` where that copies less (:func:`transposed_is_smaller`; a slice's rows' gradient, GPT-2 4
    x 256 in slices of 4096 rows: the non-private step at 32 records 2.67 -> 1.99 s; book-keeping's clipped sum of a
    whole-logits head 2.61 -> 2.44 s).

    Args:
      a: ``(..., p)``.
      b: ``(..., q)``, the same leading axes.
      precision: the product's (:func:`jax.lax.dot_general`), ``None`` for the backend's default.

    Returns:
      ``(p, q)``.
    """
    lead = tuple(range(a.ndim - 1))
    if transposed_is_smaller(a.size // a.shape[-1], a.shape[-1], b.shape[-1]):
        return jnp.tensordot(b, a, axes=(lead, lead), precision=precision).T
    return jnp.tensordot(a, b, axes=(lead, lead), precision=precision)


def transposed_is_smaller(rows: int, wide: int, narrow: int) -> bool:
    """Whether ``sum_r a_r^T b_r`` (``a``: ``rows x wide``, ``b``: ``rows x narrow``) is better formed as
    ``(b^T a)^T``: XLA:CPU copies the operand contracted over its leading axis into its layout, so the plain form
    copies ``a`` (``rows * wide`` numbers) and the transposed one ``b`` and the result (``rows * narrow + wide *
    narrow``). A batch's whole logits or vocabulary slice is the large ``a``; one record's is not.

    Args:
      rows: the contracted length (positions of every unit).
      wide: ``a``'s width.
      narrow: ``b``'s width.

    Returns:
      ``True`` where the transposed form copies fewer numbers.
    """
    return rows * wide > rows * narrow + wide * narrow


def _backward(chunk, residuals, cotangents):
    hidden, weight, bias, targets, lse, mass = residuals
    u, w = (c.astype(jnp.float32) for c in cotangents)
    h = hidden.astype(jnp.float32)
    lead = tuple(range(h.ndim - 1))
    vocab, width = weight.shape

    def body(carry, piece):
        dh, dw, db = carry
        weighted = slice_cotangents(slice_probabilities(h, piece.rows, piece.biases, piece.valid, lse), piece.ids,
                                    targets, u, w)
        dw = add_slice_rows(dw, piece, rows_product(weighted, h))
        if db is not None:
            db = add_slice_rows(db, piece, jnp.sum(weighted, axis=lead))
        return dh + weighted @ piece.rows, dw, db

    start = (jnp.zeros_like(h), jnp.zeros((vocab, width), jnp.float32),
             None if bias is None else jnp.zeros(vocab, jnp.float32))
    dh, dw, db = scan_vocab(body, start, weight, bias, chunk)
    flat = targets.reshape(-1)
    at_target = u * mass
    dh = dh + at_target[..., None] * jnp.take(weight, targets, axis=0).astype(jnp.float32)
    dw = dw.at[flat].add((at_target[..., None] * h).reshape(-1, width))
    dbias = None
    if bias is not None:
        dbias = db.at[flat].add(at_target.reshape(-1)).astype(bias.dtype)
    return dh.astype(hidden.dtype), dw.astype(weight.dtype), dbias, None


_target_logprobs.defvjp(lambda hidden, weight, bias, targets, chunk: _forward(hidden, weight, bias, targets, chunk),
                        _backward)


def target_logprobs(hidden: jax.Array, weight: jax.Array, bias: jax.Array | None, targets: jax.Array,
                    chunk: int) -> tuple[jax.Array, jax.Array]:
    """``(log p(targets | hidden), lse)`` through the head ``(weight, bias)``, ``chunk`` vocabulary rows at a time.

    Differentiable in ``hidden``, ``weight`` and ``bias`` (a custom VJP that recomputes each slice's
    probabilities; module docstring); traceable, and vmappable (per-record gradients).

    Args:
      hidden: ``(..., D)`` hidden states.
      weight: ``(V, D)`` the head's rows (a tied embedding's table; an ``nnx.Linear`` head's kernel transposed).
      bias: ``(V,)`` or ``None``.
      targets: ``(...)`` int ids in ``[0, V)``.
      chunk: vocabulary rows a slice, ``>= 1`` (``>= V``: one slice).

    Returns:
      ``(picked, lse)``, both ``(...)`` float32: ``h . W_y + b_y - lse`` and ``log sum_v exp(h . W_v + b_v)``.
    """
    return _target_logprobs(hidden, weight, bias, targets, int(chunk))


def head_weights(module) -> tuple[jax.Array, jax.Array | None]:
    """``(weight (V, D), bias or None)`` of an LM head: a tied ``nnx.Embed`` (its table) or an ``nnx.Linear``.

    Args:
      module: the head module.

    Returns:
      The rows and the bias.

    Raises:
      TypeError: another kind of module.
    """
    if isinstance(module, nnx.Embed):
        return module.embedding[...], None
    if isinstance(module, nnx.Linear):
        return module.kernel[...].T, None if module.bias is None else module.bias[...]
    raise TypeError(f"an LM head must be an nnx.Embed (tied) or an nnx.Linear, got {type(module).__name__}")


def head_target_logprobs(module, hidden: jax.Array, targets: jax.Array, chunk: int) -> jax.Array:
    """:func:`target_logprobs`'s ``picked`` through a model's head module (``model.vocab_head()``).

    A module standing in for the head with its own ``target_logprobs`` method (the gradient taps of
    :mod:`snapaudit_jax.dpsgd.ghost`) is asked instead.

    Args:
      module: the head (``nnx.Embed`` or ``nnx.Linear``), or a tap.
      hidden: ``(..., D)`` hidden states.
      targets: ``(...)`` int ids.
      chunk: vocabulary rows a slice.

    Returns:
      ``(...)`` float32 target log-probabilities.
    """
    tapped = getattr(module, "target_logprobs", None)
    if tapped is not None:
        return tapped(hidden, targets, chunk)
    weight, bias = head_weights(module)
    return target_logprobs(hidden, weight, bias, targets, chunk)[0]
