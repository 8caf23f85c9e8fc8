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

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["target_logprobs", "target_logprobs_values", "head_target_logprobs", "head_weights", "vocab_slices",
           "slice_ids", "slice_probabilities", "slice_cotangents", "off_target", "checked_chunk"]


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


def vocab_slices(weight: jax.Array, bias: jax.Array | None, chunk: int):
    """The head in ``ceil(V / chunk)`` float32 slices: ``(weights (n, chunk, D), biases (n, chunk), valid (n,
    chunk))``, the last slice padded with rows that ``valid`` marks (their logits are ``-inf``).

    Args:
      weight: ``(V, D)`` the head's rows.
      bias: ``(V,)`` or ``None``.
      chunk: rows a slice, ``>= 1``; above ``V``, one slice of ``V`` rows (never padded beyond the head).

    Returns:
      The stacked slices.
    """
    vocab, width = weight.shape
    chunk = min(chunk, vocab)
    count = -(-vocab // chunk)
    pad = count * chunk - vocab
    rows = jnp.pad(weight.astype(jnp.float32), ((0, pad), (0, 0))).reshape(count, chunk, width)
    bias = jnp.zeros(vocab, jnp.float32) if bias is None else bias.astype(jnp.float32)
    biases = jnp.pad(bias, (0, pad)).reshape(count, chunk)
    valid = (jnp.arange(count * chunk) < vocab).reshape(count, chunk)
    return rows, biases, valid


def slice_ids(rows: jax.Array) -> jax.Array:
    """The vocabulary id of each row of :func:`vocab_slices`' rows.

    Args:
      rows: ``(n, chunk, D)`` the stacked slices.

    Returns:
      ``(n, chunk)`` int32 ids (``>= V`` on the padding rows).
    """
    return jnp.arange(rows.shape[0] * rows.shape[1], dtype=jnp.int32).reshape(rows.shape[:2])


def off_target(p: jax.Array, ids: jax.Array, targets: jax.Array) -> jax.Array:
    """``q = p`` with each position's target entry zeroed, on one slice.

    With ``m = sum_v q[v] = 1 - p[y]`` (no cancellation), ``e_y - p = m e_y - q``: the logits' cotangent as
    products of small numbers however confident the model, where ``1 - p[y]`` formed in float32 keeps only
    ``2^-24`` absolute.

    Args:
      p: ``(..., chunk)`` the slice's probabilities.
      ids: ``(chunk,)`` the slice's vocabulary ids (:func:`slice_ids`).
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
    """``p = softmax(h W^T + b)`` on one slice of the vocabulary: ``(..., chunk)``, ``0`` on padding rows.

    Args:
      hidden: ``(..., D)`` float32 hidden states.
      rows, biases, valid: one slice of :func:`vocab_slices` (``(chunk, D)``, ``(chunk,)``, ``(chunk,)``).
      lse: ``(...)`` the positions' log-sum-exp over the whole vocabulary.

    Returns:
      The slice's probabilities.
    """
    logits = jnp.einsum("...d,vd->...v", hidden, rows) + biases
    return jnp.where(valid, jnp.exp(logits - lse[..., None]), 0.0)


def _logsumexp(hidden, rows, biases, valid, targets):
    """``(lse, m)``: the online log-sum-exp over the slices and, in the same pass, the off-target mass
    ``m = sum_{v != y} p_v`` (its own running sum, rescaled alike)."""
    def body(carry, xs):
        top, total, off = carry
        ids, w, b, ok = xs
        logits = jnp.where(ok, jnp.einsum("...d,vd->...v", hidden, w) + b, -jnp.inf)
        new_top = jnp.maximum(top, jnp.max(logits, axis=-1))
        rescale = jnp.exp(top - new_top)
        e = jnp.exp(logits - new_top[..., None])
        total = total * rescale + jnp.sum(e, axis=-1)
        off = off * rescale + jnp.sum(jnp.where(ids != targets[..., None], e, 0.0), axis=-1)
        return (new_top, total, off), None

    zeros = jnp.zeros(hidden.shape[:-1], jnp.float32)
    start = (jnp.full(hidden.shape[:-1], -jnp.inf, jnp.float32), zeros, zeros)
    (top, total, off), _ = jax.lax.scan(body, start, (slice_ids(rows), rows, biases, valid))
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
    rows, biases, valid = vocab_slices(weight, bias, chunk)
    lse, mass = _logsumexp(h, rows, biases, valid, targets)
    at_target = jnp.sum(h * jnp.take(weight, targets, axis=0).astype(jnp.float32), axis=-1)
    if bias is not None:
        at_target = at_target + jnp.take(bias, targets).astype(jnp.float32)
    return (at_target - lse, lse), (hidden, weight, bias, targets, lse, mass)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _target_logprobs(hidden, weight, bias, targets, chunk):
    return _forward(hidden, weight, bias, targets, chunk)[0]


def _backward(chunk, residuals, cotangents):
    hidden, weight, bias, targets, lse, mass = residuals
    u, w = (c.astype(jnp.float32) for c in cotangents)
    h = hidden.astype(jnp.float32)
    rows, biases, valid = vocab_slices(weight, bias, chunk)
    lead = tuple(range(h.ndim - 1))

    def body(dh, xs):
        ids, r, b, ok = xs
        weighted = slice_cotangents(slice_probabilities(h, r, b, ok, lse), ids, targets, u, w)
        return dh + weighted @ r, (jnp.tensordot(weighted, h, axes=(lead, lead)), jnp.sum(weighted, axis=lead))

    dh, (dw, db) = jax.lax.scan(body, jnp.zeros_like(h), (slice_ids(rows), rows, biases, valid))
    vocab, width = weight.shape
    flat = targets.reshape(-1)
    at_target = u * mass
    dh = dh + at_target[..., None] * jnp.take(weight, targets, axis=0).astype(jnp.float32)
    dw = dw.reshape(-1, width)[:vocab].at[flat].add((at_target[..., None] * h).reshape(-1, width))
    dbias = None
    if bias is not None:
        dbias = db.reshape(-1)[:vocab].at[flat].add(at_target.reshape(-1)).astype(bias.dtype)
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
