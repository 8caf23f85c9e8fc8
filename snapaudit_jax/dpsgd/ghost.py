"""Per-unit gradient norms and clipped sums without per-unit gradients (ghost norms and book-keeping).

DP-SGD clips each unit's gradient (a record, or a user's records summed) to norm ``C``, so it needs each unit's
gradient norm. :mod:`snapaudit_jax.dpsgd.gradients` gets it by computing every unit's whole gradient (a vmap
over units); for the layers of our decoders the norm follows from quantities the ordinary backward pass of
the *summed* loss already has: each layer's inputs and the cotangents of the summed loss at its outputs (unit
``i``'s loss is the only one that depends on its own outputs, so these are exactly ``dL_i / dy``). With ``S``
a unit's positions (its tokens, a user's rows laid end to end):

* **Dense layers** ``y = x W + b`` (``nnx.Linear``; the LM head when untied): ``dW = a^T g``, ``db = sum_s g_s``,
  and ``||a^T g||_F^2 = sum_{s,t} (a_s . a_t)(g_s . g_t)`` (the ghost identity, Li et al. 2021), which costs
  ``S^2 (d_in + d_out)`` per unit against ``S d_in d_out`` for forming ``a^T g`` directly.
  :func:`choose_method` takes the cheaper of the two for each layer's shape (``method="auto"``: the ghost form
  when ``S (d_in + d_out) < d_in d_out``, long inputs and narrow layers going direct), or the one forced.
* **LoRA adapters** (:class:`~snapaudit_jax.finetune.lora.LoRAProjection`, ``y = x W + b + s (x A) B`` on a
  slice of the columns): ``dB = s (x A)^T h`` and ``dA = s x^T (h B^T)`` with ``h`` the slice's cotangent, each
  a dense layer of its own input and cotangent.
* **Embeddings** (``nnx.Embed`` looked up by the decoders' ``_embed`` -- GPT-2's ``wte`` and ``wpe``, Llama's
  ``embed`` -- or called directly, as other NNX models do): row ``v`` of unit ``i``'s gradient is
  ``sum_s [x_s = v] e_s`` (``e`` the lookup's cotangents), so ``||dE||^2 = sum_{s,t} [x_s = x_t] (e_s . e_t)``
  by token co-occurrence, with no vocabulary-sized per-unit tensor.
* **The tied head** (``nnx.Embed.attend``, ``logits = h E^T``): ``dE`` gains ``dl^T h`` (``dl`` the logits'
  cotangents), a dense term of its own, and the cross term with the lookup,
  ``2 sum_{s,t} dl_t[x_s] (e_s . h_t)``.
* **A vocabulary-sliced head** (``vocab_chunk``: :mod:`snapaudit_jax.models.vocab_head`, tied or an
  ``nnx.Linear``, its bias too): the logits' cotangent at position ``s`` is ``d_s = u_s (e_{y_s} - p_s)`` (``u``
  the target log-probability's cotangent, ``y`` the target, ``p_s`` the softmax), so the rows' norm is
  ``sum_{s,t} (h_s . h_t) u_s u_t ([y_s = y_t] - p_t[y_s] - p_s[y_t] + p_s . p_t)``: the last term a Gram of the
  slices' probabilities formed in the backward pass the head runs anyway, the others from the targets' rows; the
  cross term with a tied lookup from the looked-up ids' rows; the clipped sum a slice at a time. No
  ``(B, S, V)`` array is formed.
* **LayerNorm and RMSNorm** (``y = n(x) * scale (+ bias)``): ``dscale = sum_s n(x_s) * g_s``, computed per unit
  directly (``E`` numbers a unit), ``n`` recomputed from the recorded input as flax computes it (float32
  statistics); the bias as a dense bias.

The inputs and cotangents are captured by taps: every covered module of a fresh copy of the model (the one
:func:`flax.nnx.merge` builds inside the traced function; the caller's model is never touched) is replaced by
a :class:`_Tap` that records its input and adds a zero-valued probe to its output, and the gradient of the
summed loss with respect to the probes is ``g``. One forward and one backward of the summed loss give every
covered parameter's per-unit norm.

Stacked blocks (:func:`~snapaudit_jax.models.decoders.stack_layers`: one scan over parameters with a leading
layer axis) are tapped inside the scan body: each tapped call's inputs leave the scan stacked over the layers, its
probes enter it stacked alike, and a stacked parameter's terms carry the layer axis: its per-unit squared norm is
the sum of its layers' (each computed as above, vectorised over the layers) and its clipped sum is stacked like
the parameter. The traced function stays one block long whatever the depth.

Never silently wrong: a trainable parameter without a tapped call, one read outside its tap (the decoders'
low-precision paths compute with the raw weights: bfloat16 RMSNorm and logits), or one shared between two
modules is *not covered*, and :func:`not_covered` names it; the fast paths refuse such a model. A tapped layer
called more than once per forward pass (weights shared across calls: its per-unit gradient has cross terms
between the calls) is refused.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from snapaudit_jax.dpsgd.config import CLIPPED_SUM_DTYPES
from snapaudit_jax.dpsgd.gradients import unit_losses
from snapaudit_jax.models.vocab_head import (
    add_slice_rows, checked_chunk, head_weights, off_target, scan_vocab, slice_cotangents, slice_probabilities,
    rows_product, target_logprobs_values,
)
from snapaudit_jax.utils.errors import InputError

__all__ = ["GRAM_MAP_WIDTH", "METHODS", "SPLIT_ERROR", "DenseNorms", "book_keeping_clipped_sum",
           "book_keeping_clipped_sum_traced", "choose_method", "dense_sq_norms", "dense_sq_norms_traced",
           "direct_sq_norm", "ghost_clipped_sum_traced", "ghost_sq_norm", "not_covered", "unit_gram"]

METHODS = ("auto", "ghost", "direct")
SPLIT_ERROR = {"float32": 0.0, "bfloat16": 2.0**-15 + 2.0**-23}
"""Relative error bound, per entry, of book-keeping's weighted operand ``c g`` as its products take it
(:func:`book_keeping_clipped_sum_traced`): none in float32; with bfloat16 operands ``c g`` (a float32 product,
``2^-24``) is split into ``hi + lo``, two bfloat16 terms whose sum is within ``u^2 = 2^-16`` of it (``u = 2^-8``),
both bounds doubled."""
_SPLIT_TERMS = 2  # the terms c g enters the products as with bfloat16 operands (SPLIT_ERROR's bound takes two)


GRAM_MAP_WIDTH = 1024
"""The contracted width from which :func:`unit_gram` forms a CPU's Grams one unit at a time: XLA's CPU backend
runs a batched ``(S, d) x (d, S)`` product with a long ``d`` at a fraction of its rate for one matrix (GPT-2's
logits' cotangent, ``32 x 127 x 50257``: 476 ms batched against 208 ms a unit at a time, its rows padded to 128;
``32 x 128 x 1024``: 5.4 against 4.0 ms), while for narrow ones the loop costs more than it saves."""


_GRAM_ROWS = 8  # a unit's rows, padded to a multiple of this in the CPU's loop: 127 x 50257 runs 1.6x slower than 128


_HIGHEST = jax.lax.Precision.HIGHEST


def _hi(equation: str, *operands):
    return jnp.einsum(equation, *operands, precision=_HIGHEST)


def _exact_product(equation: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """``einsum(equation, x, y)`` in float32 without rounding a product: two bfloat16 operands enter as they are (a
    product of two is exact in float32; accumulated in float32, on accelerators' matrix units), any other pair at
    float32 with full precision (the norms' products; :func:`_hi` takes float32 factors as they are)."""
    if x.dtype == y.dtype == jnp.bfloat16:
        return jnp.einsum(equation, x, y, preferred_element_type=jnp.float32)
    return _hi(equation, x.astype(jnp.float32), y.astype(jnp.float32))


def unit_gram(x: jax.Array, y: jax.Array | None = None) -> jax.Array:
    """Each unit's Gram matrix ``x_i y_i^T`` in float32, no product rounded: ``(..., S, S)`` from ``(..., S, d)``.

    Float32 operands multiply at full precision; two bfloat16 operands (book-keeping's rounded factors) enter the
    products as they are, each product exact in float32 and accumulated in float32, so an accelerator forms them
    on its matrix units and the result is the float32 Gram of the same numbers up to the order of accumulation.
    The same products on every backend; how they are batched is chosen when the program is lowered
    (:func:`jax.lax.platform_dependent`): on a CPU, a loop over the units where ``d >= GRAM_MAP_WIDTH``, and one
    batched product elsewhere; the loop pads each unit's rows to a multiple of 8 (zero rows, whose products are
    cut off: a next-token loss's 127 positions take 1.6x the time of 128).

    Args:
      x: ``(..., S, d)``, the leading axes numbering units (and layers).
      y: ``(..., S, d)`` of the same shape (``None``: ``x``).

    Returns:
      ``(..., S, S)`` float32 with ``[..., s, t] = x[..., s, :] . y[..., t, :]``.
    """
    y = x if y is None else y
    if x.shape != y.shape:
        raise InputError(f"unit_gram needs operands of one shape, got {x.shape} and {y.shape}")

    def batched(x, y):
        return _exact_product("...sd,...td->...st", x, y)

    if x.shape[-1] < GRAM_MAP_WIDTH or x.ndim < 3:
        return batched(x, y)

    def looped(x, y):
        lead, (length, width) = x.shape[:-2], x.shape[-2:]
        rows = -(-length // _GRAM_ROWS) * _GRAM_ROWS

        def one(pair):  # the unit's rows padded with zeros (each slice is copied anyway): zero rows add nothing
            a, b = (jnp.pad(m, ((0, rows - length), (0, 0))) for m in pair)
            return _exact_product("sd,td->st", a, b)[:length, :length]

        grams = jax.lax.map(one, (x.reshape(-1, length, width), y.reshape(-1, length, width)))
        return grams.reshape(lead + (length, length))

    return jax.lax.platform_dependent(x, y, cpu=looped, default=batched)


def ghost_sq_norm(a: jax.Array, g: jax.Array) -> jax.Array:
    """``||a_i^T g_i||_F^2`` per unit through the ``S x S`` Gram products: ``(B,)``.

    Args:
      a: ``(B, S, d_in)`` input activations.
      g: ``(B, S, d_out)`` output cotangents (both bfloat16: their products taken exactly, as :func:`unit_gram`).

    Returns:
      ``(B,)`` float32 squared Frobenius norms.
    """
    return jnp.sum(unit_gram(a) * unit_gram(g), axis=(1, 2))


def direct_sq_norm(a: jax.Array, g: jax.Array) -> jax.Array:
    """``||a_i^T g_i||_F^2`` per unit by forming the ``d_in x d_out`` gradient: ``(B,)``.

    Args:
      a: ``(B, S, d_in)`` input activations.
      g: ``(B, S, d_out)`` output cotangents (both bfloat16: their products taken exactly, as :func:`unit_gram`).

    Returns:
      ``(B,)`` float32 squared Frobenius norms.
    """
    grads = _exact_product("bsi,bso->bio", a, g)
    return jnp.sum(grads * grads, axis=(1, 2))


def choose_method(length: int, d_in: int, d_out: int) -> str:
    """``"ghost"`` when its cost ``S^2 (d_in + d_out)`` is below the direct ``S d_in d_out``, else ``"direct"``.

    Args:
      length: ``S``, the unit's tokens (rows times sequence length).
      d_in: the layer's input width.
      d_out: the layer's output width.

    Returns:
      The cheaper method's name.
    """
    return "ghost" if length * (d_in + d_out) < d_in * d_out else "direct"


class DenseNorms(NamedTuple):
    """Output of :func:`dense_sq_norms`.

    Attributes:
      total: ``(B,)`` per-unit squared gradient norm over every covered parameter.
      per_param: parameter path (``"blocks.0.c_fc.kernel"``) -> ``(B,)`` its per-unit squared norm.
      losses: ``(B,)`` per-unit losses (the sum of the unit's rows' mean token losses).
    """

    total: jax.Array
    per_param: dict[str, jax.Array]
    losses: jax.Array


def _name(path: tuple) -> str:
    return ".".join(map(str, path))


class _Guard:
    """Stands in for a parameter of a tapped module: its shape and dtype may be read, but reading its value marks
    the parameter as used outside the tap (a low-precision path computing with the raw weights), so its
    gradient is not covered -- reported as such, never silently wrong."""

    _META = ("dtype", "shape", "ndim", "size", "sharding")

    def __init__(self, variable, name: str, record: dict):
        self._variable, self._name, self._record = variable, name, record

    def __getattr__(self, attr):
        if attr not in self._META:
            self._record["bypassed"].add(self._name)
        return getattr(self._variable, attr)

    def __getitem__(self, index):
        self._record["bypassed"].add(self._name)
        return self._variable[index]


class _Tap:
    """Stands in for one module of a traced copy: each tapped call records its input and adds its probe to its
    output, so the summed loss's gradient with respect to the probe is the call's output cotangent.

    ``kind`` names the call: ``"dense"`` (``nnx.Linear``: ``y = x W + b``), ``"layer_norm"`` and ``"rms_norm"``
    (``y = n(x) * scale (+ bias)``), ``"lookup"`` (an embedding's rows: through the decoders' ``_embed``, or
    ``nnx.Embed`` called directly) and ``"attend"`` (a tied head, ``logits = h E^T``). Any other attribute is
    the module's own; reading one of its parameters' values directly marks that parameter as not covered
    (:class:`_Guard`).
    """

    def __init__(self, module, path: tuple, record: dict, kind: str):
        object.__setattr__(self, "_tap", (module, path, record, kind))

    def _register(self, call: str) -> int:
        """Records one tapped call (refusing a second call of the same layer); returns its probe's index."""
        _, path, record, _ = self._tap
        if (path, call) in record["calls"]:
            raise InputError(f"layer {_name(path)} is called more than once per forward pass (shared weights): its "
                             "per-unit gradient has cross terms the ghost norm omits")
        record["calls"].append((path, call))
        return len(record["calls"]) - 1

    def _probe(self, call: str, recorded, y):
        record = self._tap[2]
        index = self._register(call)
        record["inputs"].append(recorded)
        probes = record["probes"]
        if probes is None:
            record["outputs"].append(y)
            return y
        return y + probes[index].astype(y.dtype)

    def __call__(self, x, *args, **kwargs):
        module, _, _, kind = self._tap
        if kind != "embed":
            return self._probe(kind, x, module(x))
        if args or any(v is not None for v in kwargs.values()):
            # a sharded call (out_sharding): the module's own, whose table then has no terms (named as not covered)
            return module(x, *args, **kwargs)
        # nnx.Embed.__call__: the table cast to the module's dtype, its rows by jnp.take (one row: every id is 0)
        if not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError("Input type must be an integer or unsigned integer.")
        (table,) = module.promote_dtype((module.embedding[...],), dtype=module.dtype, inexact=False)
        ids = jnp.zeros_like(x) if module.num_embeddings == 1 else x
        return self._probe("lookup", ids, jnp.take(table, ids, axis=0))

    def lookup(self, ids):
        """The embedding's rows of ``ids`` in the table's dtype, as ``jnp.take`` gives them (the decoders'
        ``_embed``)."""
        module = self._tap[0]
        return self._probe("lookup", ids, jnp.take(module.embedding[...], ids, axis=0))

    def attend(self, hidden):
        """``nnx.Embed.attend``: the tied head's logits."""
        module = self._tap[0]
        return self._probe("attend", hidden, module.attend(hidden))

    def target_logprobs(self, hidden, targets, chunk: int):
        """The head a vocabulary slice at a time (:func:`~snapaudit_jax.models.vocab_head.head_target_logprobs`):
        records the hidden states, targets and log-sum-exp; its probe is a pair, one added to the target
        log-probabilities (their cotangents) and one through which the backward pass returns each unit's Gram of
        the slices' probabilities (:func:`_head_with_gram`)."""
        module, path, record, _ = self._tap
        index = self._register("head")
        units = record["units"]
        # the Gram only where the head's parameters train (not for LoRA: an empty probe, nothing computed)
        trains = any(_name(path + (attr,)) in record["trainable"] for attr in ("embedding", "kernel", "bias"))
        side = hidden.shape[0] // units * hidden.shape[1] if trains else 0
        probes = record["probes"]
        added, gram_probe = (None, jnp.zeros((units, side, side + bool(side)), jnp.float32)) if probes is None \
            else probes[index]
        weight, bias = head_weights(module)
        picked, lse = _head_with_gram(hidden, gram_probe, weight, bias, targets, chunk)
        record["heads"][path] = chunk
        record["inputs"].append((hidden, targets, jax.lax.stop_gradient(lse)))
        if probes is None:
            record["outputs"].append((picked, gram_probe))
            return picked
        return picked + added

    def __getattr__(self, attr):
        module, path, record, _ = self._tap
        value = getattr(module, attr)
        if isinstance(value, nnx.Variable):
            return _Guard(value, _name(path + (attr,)), record)
        return value


def _head_with_gram(hidden, gram_probe, weight, bias, targets, chunk: int):
    """``(picked, lse)`` of :func:`~snapaudit_jax.models.vocab_head.target_logprobs`, differentiable in ``hidden``
    only, whose backward pass also returns, as the "cotangent" of ``gram_probe`` (zeros ``(units, S, S + 1)``, on
    which the outputs do not depend), each unit's off-target probability products and masses: ``[..., :S]`` holds
    ``sum_{v != y_s, y_t} p_s[v] p_t[v]`` and ``[..., S]`` holds ``m_s = sum_{v != y_s} p_s[v]`` (``1 - p_s[y_s]``
    without the cancellation: accurate however confident the model). The slices' probabilities are formed there
    anyway, so the head's norm costs no extra pass over the vocabulary (an empty ``(units, 0, 0)`` probe: nothing,
    for a head that does not train). The head's weights are closed over and get no cotangent: the taps
    differentiate the probes only (:func:`_factors`), never the parameters."""
    units, with_gram = gram_probe.shape[0], gram_probe.shape[-1] > 0

    @jax.custom_vjp
    def head(h, probe):
        return target_logprobs_values(h, weight, bias, targets, chunk)[:2]

    def forward(h, probe):
        picked, lse, mass = target_logprobs_values(h, weight, bias, targets, chunk)
        return (picked, lse), (h, lse, mass)

    def backward(residuals, cotangents):
        h, lse, mass = residuals
        u, w = (c.astype(jnp.float32) for c in cotangents)
        h32 = h.astype(jnp.float32)

        def body(carry, piece):  # as vocab_head's backward: u (e_y - p) + w p = u m e_y + (w p - u q)
            dh, gram = carry
            p = slice_probabilities(h32, piece.rows, piece.biases, piece.valid, lse)
            if with_gram:
                per_unit = off_target(p, piece.ids, targets).reshape(units, -1, p.shape[-1])
                gram = gram + unit_gram(per_unit)
            return dh + slice_cotangents(p, piece.ids, targets, u, w) @ piece.rows, gram

        side = gram_probe.shape[1]
        start = (jnp.zeros_like(h32), jnp.zeros((units, side, side), jnp.float32))
        dh, gram = scan_vocab(body, start, weight, bias, chunk)
        dh = dh + (u * mass)[..., None] * jnp.take(weight, targets, axis=0).astype(jnp.float32)
        packed = (jnp.concatenate([gram, mass.reshape(units, side, 1)], axis=-1) if with_gram
                  else jnp.zeros(gram_probe.shape))
        return dh.astype(h.dtype), packed

    head.defvjp(forward, backward)
    return head(hidden, gram_probe)


class _ScanTap:
    """Stands in for a :class:`~snapaudit_jax.models.decoders.StackedBlocks` of a traced copy: runs its scan with
    every block's covered modules tapped inside the scan body, so each tapped call's inputs come out of the scan
    stacked over the layers (``(n, ...)``) and its probes go in stacked alike. The calls are recorded once, under
    the stacked parameters' paths (``blocks.layers.c_fc``), their indices in ``record["stacked"]``."""

    scans_blocks = True

    def __init__(self, stacked, path: tuple, record: dict):
        self._tap = (stacked, path, record)

    def __len__(self) -> int:
        return len(self._tap[0])

    def __call__(self, x, *args):
        stacked, path, record = self._tap
        graphdef, state = nnx.split(stacked.layers)
        prefix = path + ("layers",)

        def layer(h, layer_state, layer_probes):
            block = nnx.merge(graphdef, layer_state)
            inner = dict(calls=[], inputs=[], outputs=[], probes=layer_probes, lora={}, heads={}, bypassed=set(),
                         modules={tuple(p): m for p, m in nnx.iter_modules(block)})
            _tap_modules(block, inner)
            h, _ = block(h, *args, None, 0)
            return h, inner

        meta: dict = {}

        def dry(h, layer_state):  # the calls of one block (their count sets which probes are this scan's)
            h, inner = layer(h, layer_state, None)
            meta.update(inner)
            return h

        jax.eval_shape(dry, x, jax.tree.map(lambda leaf: leaf[0], state))
        first, count = len(record["calls"]), len(meta["calls"])
        probes = None if record["probes"] is None else record["probes"][first:first + count]

        def body(h, xs):
            layer_state, layer_probes = xs
            h, inner = layer(h, layer_state, layer_probes)
            return h, (inner["inputs"], inner["outputs"])

        h, (inputs, outputs) = jax.lax.scan(body, x, (state, probes))
        record["stacked"].update(range(first, first + count))
        record["calls"].extend((prefix + cpath, call) for cpath, call in meta["calls"])
        record["inputs"].extend(inputs)
        if record["probes"] is None:
            record["outputs"].extend(outputs)
        record["lora"].update({prefix + lpath: spans for lpath, spans in meta["lora"].items()})
        record["bypassed"].update(_name(prefix) + "." + name for name in meta["bypassed"])
        record["modules"].update({prefix + mpath: module for mpath, module in meta["modules"].items() if mpath})
        return h


def _tap_kind(module) -> str | None:
    """The :class:`_Tap` kind of a module whose parameters' per-unit gradients the factors cover, else ``None``."""
    if isinstance(module, nnx.Linear):
        return "dense"
    if isinstance(module, nnx.Embed):
        return "embed"
    if isinstance(module, (nnx.LayerNorm, nnx.RMSNorm)) and module.reduction_axes in (-1, (-1,)) \
            and module.feature_axes in (-1, (-1,)) and module.axis_name is None:
        return "layer_norm" if isinstance(module, nnx.LayerNorm) else "rms_norm"
    return None


def _parent(model, path: tuple):
    """The module holding the attribute or list item at ``path`` (a path of :func:`flax.nnx.iter_modules`)."""
    parent = model
    for key in path[:-1]:
        parent = parent[key] if isinstance(key, int) else getattr(parent, key)
    return parent


def _tap_modules(model, record: dict) -> None:
    """Replaces every covered module of ``model`` (a fresh traced copy, its modules in ``record["modules"]``) by a
    :class:`_Tap` and every stacked block by a :class:`_ScanTap` (which taps the block's modules inside its scan);
    for the base projection of a LoRA adapter, records the adapter's ``(scale, spans)`` under the adapter's
    path."""
    from snapaudit_jax.finetune.lora import LoRAProjection
    from snapaudit_jax.models.decoders import StackedBlocks

    stacks = [path for path, module in record["modules"].items() if isinstance(module, StackedBlocks)]
    for path in stacks:  # a stacked block's modules run inside a scan: tapped there, layer by layer
        object.__setattr__(_parent(model, path), path[-1], _ScanTap(record["modules"][path], path, record))
    for path, module in record["modules"].items():
        kind = _tap_kind(module)
        if kind is None or not path or any(path[:len(stack)] == stack for stack in stacks):
            continue
        parent = _parent(model, path)
        if isinstance(parent, LoRAProjection) and path[-1] == "base":
            record["lora"][path[:-1]] = (parent.scale, tuple(parent.spans))
        tap = _Tap(module, path, record, kind)
        if isinstance(path[-1], int):
            parent[path[-1]] = tap
        else:
            object.__setattr__(parent, path[-1], tap)


def _forward(graphdef, params, rest, tokens, mask, probes, record: dict, vocab_chunk: int | None = None):
    """Summed loss of every unit, with ``(per-unit losses, tapped inputs, tapped outputs)``; ``record`` receives
    the tapped calls ``(path, kind)`` in call order, the LoRA adapters' ``(scale, spans)`` by path and the
    parameters read outside their taps."""
    record.update(calls=[], inputs=[], outputs=[], probes=probes, lora={}, heads={}, bypassed=set(), modules={},
                  stacked=set(), units=tokens.shape[0],
                  trainable={_name(tuple(path)) for path, _ in nnx.to_flat_state(params)})
    model = nnx.merge(graphdef, params, rest)
    record["modules"] = {tuple(path): m for path, m in nnx.iter_modules(model)}
    _tap_modules(model, record)
    per_unit = unit_losses(model, tokens, mask, vocab_chunk=vocab_chunk)
    return jnp.sum(per_unit), (per_unit, record["inputs"], record["outputs"])


class _Head(NamedTuple):
    """A vocabulary-sliced head's call (:mod:`snapaudit_jax.models.vocab_head`), a unit's positions end to end:
    ``hidden`` ``(B, S, D)``, ``targets`` and ``lse`` ``(B, S)``, the head's float32 ``weight`` ``(V, D)`` and
    ``bias`` (or ``None``), its slices' ``chunk``; ``transpose``: the parameter is ``weight.T`` (an
    ``nnx.Linear`` kernel); ``gram`` ``(B, S, S + 1)``: the off-target products ``sum_{v != y_s, y_t} p_s[v]
    p_t[v]`` of every pair of a unit's positions and, last, each position's off-target mass ``m_s`` (from the
    backward pass, :func:`_head_with_gram`)."""

    hidden: jax.Array
    targets: jax.Array
    lse: jax.Array
    weight: jax.Array
    bias: jax.Array | None
    chunk: int
    transpose: bool
    gram: jax.Array

    def products(self) -> tuple[jax.Array, jax.Array]:
        """``(off-target products (B, S, S), off-target masses (B, S))``."""
        return self.gram[..., :-1], self.gram[..., -1]

    def at(self, ids: jax.Array) -> jax.Array:
        """``p_t[ids_s]`` for every pair: ``(B, T, S)``, ``t`` the head's positions, ``s`` those of ``ids``."""
        logits = _hi("btd,bsd->bts", self.hidden, jnp.take(self.weight, ids, axis=0))
        if self.bias is not None:
            logits = logits + jnp.take(self.bias, ids)[:, None, :]
        return jnp.exp(logits - self.lse[:, :, None])


class _Term(NamedTuple):
    """One additive part of a parameter's per-unit gradient, from tensors of every unit's ``S`` positions.

    ``"outer"``: ``a_i^T g_i`` (``a`` ``(B, S, p)``, ``g`` ``(B, S, q)``; a dense kernel, a bias with ``a = 1``,
    a tied head with ``a`` the logits' cotangents and ``g`` the hidden states). ``"diag"``: ``sum_s a_s * g_s``
    (a norm's scale: ``a`` the normalised input). ``"lookup"``: row ``v`` is ``sum_s [a_s = v] g_s`` (an
    embedding: ``a`` ``(B, S)`` the ids looked up). ``"softmax"``: a vocabulary-sliced head's rows (``head``),
    ``sum_s a_s (e_{y_s} - p_s) g_s^T`` with ``a`` ``(B, S)`` the target log-probabilities' cotangents, ``y`` the
    targets, ``p_s`` the softmax at position ``s`` and ``g`` ``(B, S, q)`` the hidden states (ones: its bias);
    ``(V, q)``, transposed for a kernel. A stacked block's parameter (``layers``) has one such term per layer,
    stacked: ``a`` and ``g`` with a leading layer axis ``n``.
    """

    kind: str
    a: jax.Array
    g: jax.Array
    layers: bool = False  # a stacked parameter's term: ``a`` and ``g`` carry a leading layer axis
    head: Any = None  # a "softmax" term's _Head


def _normalised(module, x, kind: str) -> jax.Array:
    """``n(x)`` of a LayerNorm or RMSNorm in float32 (its output is ``n(x) * scale (+ bias)``), as flax computes
    its statistics: float32, the fast variance ``E[x^2] - E[x]^2`` clipped at zero where the module uses it."""
    x = x.astype(jnp.float32)
    if kind == "rms_norm":
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + module.epsilon)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    if module.use_fast_variance:
        var = jnp.maximum(0.0, jnp.mean(x * x, axis=-1, keepdims=True) - mean * mean)
    else:
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + module.epsilon)


def _factors(graphdef, params, rest, tokens, mask, vocab_chunk=None):
    """One forward and one backward of the summed loss: ``(per-unit losses, {name: [terms]}, missing)``, unit
    ``i``'s gradient of ``name`` being the sum of its :class:`_Term` s (float32, ``S`` a unit's positions, its
    rows end to end), and ``missing`` the trainable parameters without terms (or read outside their taps)."""
    covered = {_name(tuple(path)) for path, _ in nnx.to_flat_state(params)}
    values = {_name(tuple(path)): v for path, v in nnx.to_flat_state(params)}
    shapes = jax.eval_shape(lambda p: _forward(graphdef, p, rest, tokens, mask, None, {}, vocab_chunk)[1][2], params)
    probes = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    record: dict = {}
    _, pullback, (losses, inputs, _) = jax.vjp(
        lambda pr: _forward(graphdef, params, rest, tokens, mask, pr, record, vocab_chunk), probes, has_aux=True)
    cotangents = pullback(jnp.ones((), jnp.float32))[0]
    units = tokens.shape[0]
    factors: dict[str, list[_Term]] = {}

    for index, ((path, call), a, g) in enumerate(zip(record["calls"], inputs, cotangents)):
        lead = g.shape[:1] if index in record["stacked"] else ()  # a stacked block's calls: (n, ...) over layers

        def add(name, kind, a, g, layers=bool(lead), head=None):
            if name in covered:
                factors.setdefault(name, []).append(_Term(kind, a, g, layers, head))

        if call == "head":  # a vocabulary-sliced head: its rows (and bias) from h, y, lse, u and the Gram alone
            hidden, targets, lse = a
            g, gram = g
            module = record["modules"][path]
            weight, bias = head_weights(module)
            h = hidden.reshape(units, -1, hidden.shape[-1]).astype(jnp.float32)
            head = _Head(h, targets.reshape(units, -1), lse.reshape(units, -1), weight.astype(jnp.float32),
                         None if bias is None else bias.astype(jnp.float32), record["heads"][path],
                         isinstance(module, nnx.Linear), gram)
            u = g.reshape(units, -1).astype(jnp.float32)
            add(_name(path + ("embedding" if isinstance(module, nnx.Embed) else "kernel",)), "softmax", u, h, head=head)
            if bias is not None:
                add(_name(path + ("bias",)), "softmax", u, jnp.ones(h.shape[:-1] + (1,), jnp.float32),
                    head=head._replace(transpose=False))
            continue
        g = g.reshape(lead + (units, -1, g.shape[-1])).astype(jnp.float32)  # a unit's rows end to end: S = k * L
        if call == "lookup":
            add(_name(path + ("embedding",)), "lookup", a.reshape(lead + (units, -1)), g)
            continue
        a = a.reshape(lead + (units, -1, a.shape[-1])).astype(jnp.float32)
        if call == "attend":  # logits = h E^T: dE = dlogits^T h
            add(_name(path + ("embedding",)), "outer", g, a)
            continue
        if call in ("layer_norm", "rms_norm"):
            add(_name(path + ("scale",)), "diag", _normalised(record["modules"][path], a, call), g)
            add(_name(path + ("bias",)), "outer", jnp.ones(a.shape[:-1] + (1,), jnp.float32), g)
            continue
        add(_name(path + ("kernel",)), "outer", a, g)
        add(_name(path + ("bias",)), "outer", jnp.ones(a.shape[:-1] + (1,), jnp.float32), g)
        if path[-1] == "base" and path[:-1] in record["lora"]:
            # y = x W + b + scale (x A_i) B_i on columns [start, stop): with h = scale g[start:stop], unit i's
            # dB_i = (x A_i)^T h and dA_i = x^T (h B_i^T) -- dense layers of their own
            scale, spans = record["lora"][path[:-1]]
            for i, (start, stop) in enumerate(spans):
                a_name, b_name = _name(path[:-1] + ("lora_a", i)), _name(path[:-1] + ("lora_b", i))
                h = g[..., start:stop] * scale
                add(b_name, "outer", _hi("...bsi,...ir->...bsr", a, values[a_name].astype(jnp.float32)), h)
                add(a_name, "outer", a, _hi("...bso,...ro->...bsr", h, values[b_name].astype(jnp.float32)))
    owners: dict[int, list[str]] = {}  # a Variable held by two tapped modules gets terms under one name only
    for path, module in record["modules"].items():
        if _tap_kind(module) is not None:
            for attr, value in vars(module).items():
                if isinstance(value, nnx.Variable):
                    owners.setdefault(id(value), []).append(_name(path + (attr,)))
    shared = {name for names in owners.values() if len(names) > 1 for name in names}
    for name in record["bypassed"] | shared:
        factors.pop(name, None)
    return losses, factors, covered - set(factors)


def _inner(x: _Term, y: _Term) -> jax.Array:
    """``<G_x, G_y>`` per unit of two terms of one parameter (``(B,)``), without forming either gradient."""
    if x.kind == "diag" or y.kind == "diag":
        if x.kind != y.kind:
            raise InputError("a norm scale's gradient has one term")  # no model combines these
        return jnp.sum(jnp.sum(x.a * x.g, axis=1) * jnp.sum(y.a * y.g, axis=1), axis=-1)
    if x.kind == "outer" and y.kind == "outer":
        return jnp.sum(unit_gram(x.a, y.a) * unit_gram(x.g, y.g), axis=(1, 2))
    if x.kind == "lookup" and y.kind == "lookup":
        same = x.a[:, :, None] == y.a[:, None, :]
        return jnp.sum(jnp.where(same, _hi("bsq,btq->bst", x.g, y.g), 0.0), axis=(1, 2))
    if x.kind == "softmax" or y.kind == "softmax":
        return _softmax_inner(x, y)
    lookup, outer = (x, y) if x.kind == "lookup" else (y, x)
    # sum_v (sum_s [ids_s = v] e_s) . (sum_t a_t[v] g_t) = sum_{s,t} a_t[ids_s] (e_s . g_t)
    picked = jnp.take_along_axis(outer.a, jnp.broadcast_to(lookup.a[:, None, :], outer.a.shape[:2]
                                                           + lookup.a.shape[1:]), axis=2)  # (B, T, S)
    return jnp.sum(picked * _hi("bsq,btq->bts", lookup.g, outer.g), axis=(1, 2))


def _softmax_inner(x: _Term, y: _Term) -> jax.Array:
    """``<G_x, G_y>`` per unit where one term is a vocabulary-sliced head's (:class:`_Term` ``"softmax"``).

    With ``d_s = a_s (e_{y_s} - p_s)`` the logits' cotangent at position ``s``, write ``e_{y_s} - p_s = m_s e_{y_s}
    - q_s``: ``m_s = 1 - p_s[y_s]`` the off-target mass and ``q_s`` the off-target probabilities (``p_s`` with its
    target's entry zeroed). Two terms of the same head give ``sum_{s,t} (g_s . g'_t) a_s a'_t K_st`` with
    ``K_st = q_s . q_t - m_t q_s[y_t] - m_s q_t[y_s] + [y_s = y_t] m_s m_t``: every part a product of small
    numbers where the model is confident, none a difference of numbers near 1 (``[y_s = y_t] - p_t[y_s] - ...``
    loses the norm to float32 rounding once ``1 - p`` nears ``1e-4``); ``q_s . q_t`` and ``m`` come from the
    backward pass's slices (``_Head.gram``, never a ``(B, S, V)`` array). With an embedding lookup of the same
    table (a tied head), ``sum_{s,t} d_t[ids_s] (e_s . g_t)``, ``d_t[v] = a_t m_t`` at ``v = y_t`` and
    ``-a_t p_t[v]`` elsewhere."""
    if x.kind == "softmax" and y.kind == "softmax":
        head = x.head
        if y.head is not head:
            raise InputError("a parameter's gradient has terms of two vocabulary heads")  # no model does this
        products, mass = head.products()
        same = head.targets[:, :, None] == head.targets[:, None, :]
        off = jnp.where(same, 0.0, head.at(head.targets))  # [s, t] = q_s[y_t]
        kernel = (products - mass[:, None, :] * off - mass[:, :, None] * jnp.swapaxes(off, 1, 2)
                  + jnp.where(same, mass[:, :, None] * mass[:, None, :], 0.0))
        weights = x.a[:, :, None] * y.a[:, None, :]
        return jnp.sum(_hi("bsq,btq->bst", x.g, y.g) * weights * kernel, axis=(1, 2))
    lookup, soft = (x, y) if x.kind == "lookup" else (y, x)
    if lookup.kind != "lookup":
        raise InputError(f"a vocabulary head's rows share no {lookup.kind} term")  # no model combines these
    head = soft.head
    _, mass = head.products()
    hit = head.targets[:, :, None] == lookup.a[:, None, :]
    cotangent = soft.a[:, :, None] * jnp.where(hit, mass[:, :, None], -head.at(lookup.a))  # [t, s] = d_t[ids_s]
    return jnp.sum(cotangent * _hi("bsq,btq->bts", lookup.g, soft.g), axis=(1, 2))


def _term_sq_norm(term: _Term, method: str) -> jax.Array:
    if term.kind == "outer":
        return _sq_norm(term.a, term.g, method)
    return _inner(term, term)


def _per_layer(fn, terms: list[_Term], *args) -> jax.Array:
    """``fn(terms, *args)`` for each layer of a stacked parameter's terms, stacked on a leading axis."""
    kinds = [t.kind for t in terms]
    return jax.vmap(lambda arrays: fn([_Term(k, a, g) for k, (a, g) in zip(kinds, arrays)], *args))(
        [(t.a, t.g) for t in terms])


def _param_sq_norm(terms: list[_Term], method: str) -> jax.Array:
    """``||sum_j G_j||^2`` per unit: the terms' own norms and twice their cross products (a stacked parameter's
    summed over its layers)."""
    if terms[0].layers:
        return jnp.sum(_per_layer(_param_sq_norm, terms, method), axis=0)
    total = sum(_term_sq_norm(t, method) for t in terms)
    for j in range(len(terms)):
        for k in range(j + 1, len(terms)):
            total = total + 2.0 * _inner(terms[j], terms[k])
    return total


def _weighted_sum(terms: list[_Term], weights: jax.Array, shape: tuple, operands=jnp.float32) -> jax.Array:
    """``sum_i w_i G_i`` of one parameter from its terms (units with ``w_i = 0`` masked out: their tensors may
    hold NaN, and ``0 * NaN`` is NaN); a stacked parameter's layer by layer. With bfloat16 ``operands`` the dense
    terms' ``a`` (already rounded) and ``w g`` (split into two terms) enter their products in bfloat16, accumulated
    in float32."""
    if terms[0].layers:
        return _per_layer(_weighted_sum, terms, weights, shape[1:], operands)
    keep = weights > 0
    total = jnp.zeros(shape, jnp.float32)
    for term in terms:
        if term.kind == "softmax":
            total = total + _softmax_weighted_sum(term, weights, keep, shape)
            continue
        g = jnp.where(keep.reshape((-1,) + (1,) * (term.g.ndim - 1)), term.g * weights.reshape(
            (-1,) + (1,) * (term.g.ndim - 1)), 0.0)
        if term.kind == "lookup":
            total = total + jnp.zeros((shape[0], g.shape[-1]), jnp.float32).at[term.a.reshape(-1)].add(
                g.reshape(-1, g.shape[-1]), mode="drop").reshape(shape)
        elif term.kind == "diag":
            total = total + jnp.sum(jnp.where(keep[:, None, None], term.a, 0.0) * g, axis=(0, 1)).reshape(shape)
        elif operands == jnp.float32:
            total = total + rows_product(jnp.where(keep[:, None, None], term.a, 0.0), g, _HIGHEST).reshape(shape)
        else:  # a is already rounded to ``operands`` (exact); w g enters as hi + lo
            a = jnp.where(keep[:, None, None], term.a, 0.0).astype(operands)
            for _ in range(_SPLIT_TERMS):
                part = g.astype(operands)
                g = g - part.astype(jnp.float32)
                total = total + jnp.einsum("bsp,bsq->pq", a, part, preferred_element_type=jnp.float32).reshape(shape)
    return total


def _softmax_weighted_sum(term: _Term, weights: jax.Array, keep: jax.Array, shape: tuple) -> jax.Array:
    """``sum_i w_i G_i`` of a vocabulary-sliced head's term: ``sum_{i,s} w_i a_is (m_is e_{y_is} - q_is) g_is^T``
    (:func:`_softmax_inner`'s split, so the sum is as precise as the norms that clip it), the targets' rows
    scattered and the off-target part a slice at a time (dropped units masked out first)."""
    head = term.head
    _, mass = head.products()
    coef = jnp.where(keep[:, None], term.a * weights[:, None], 0.0)
    weighted = coef[:, :, None] * jnp.where(keep[:, None, None], term.g, 0.0)  # (B, S, q)
    hidden = jnp.where(keep[:, None, None], head.hidden, 0.0)
    lse = jnp.where(keep[:, None], head.lse, 0.0)
    vocab, width = head.weight.shape[0], weighted.shape[-1]

    def body(total, piece):
        q = off_target(slice_probabilities(hidden, piece.rows, piece.biases, piece.valid, lse), piece.ids,
                       head.targets)
        return add_slice_rows(total, piece, -rows_product(q, weighted, _HIGHEST))

    parts = scan_vocab(body, jnp.zeros((vocab, width), jnp.float32), head.weight, head.bias, head.chunk)
    at_target = jnp.where(keep[:, None, None], mass[:, :, None] * weighted, 0.0)
    grad = parts.at[head.targets.reshape(-1)].add(at_target.reshape(-1, width))
    return (grad.T if head.transpose else grad).reshape(shape)


def _sq_norm(a, g, method: str):
    chosen = choose_method(a.shape[1], a.shape[2], g.shape[2]) if method == "auto" else method
    return (ghost_sq_norm if chosen == "ghost" else direct_sq_norm)(a, g)


def dense_sq_norms_traced(graphdef, params, rest, tokens, mask, *, method: str = "auto",
                          vocab_chunk: int | None = None) -> DenseNorms:
    """:func:`dense_sq_norms` on a split model, traceable (call it inside ``jax.jit``).

    Args:
      graphdef, params, rest: ``nnx.split(model, trainable, ...)``; ``params`` are differentiated.
      tokens: ``(B, L)`` or ``(B, k, L)`` int token ids.
      mask: ``tokens``' shape, bool.
      method: as :func:`dense_sq_norms`.
      vocab_chunk: ``None``, or the head's vocabulary rows a slice (:mod:`snapaudit_jax.models.vocab_head`; the
        head's terms then come from its hidden states and targets, never a ``(B, S, V)`` array).

    Returns:
      :class:`DenseNorms`.
    """
    losses, factors, _ = _factors(graphdef, params, rest, tokens, mask, vocab_chunk)
    per_param = {name: _param_sq_norm(terms, method) for name, terms in factors.items()}
    total = sum(per_param.values(), jnp.zeros(tokens.shape[0], jnp.float32))
    return DenseNorms(total, per_param, losses)


def book_keeping_clipped_sum_traced(graphdef, params, rest, tokens, mask, padding, clip_norm, *,
                                    method: str = "auto", vocab_chunk: int | None = None,
                                    sum_dtype: str = "float32"):
    """The clipped gradient sum by book-keeping: one forward, one backward, no per-unit gradient.

    Unit ``i``'s norm comes from the ghost norms of its factors; with ``c_i = min(1, C / ||g_i||)`` (``0`` for a
    padding unit or a non-finite norm), the sum is ``sum_i c_i a_i^T g_i`` per parameter, from the stored
    activations and cotangents (Bu et al.'s book-keeping).

    ``sum_dtype="bfloat16"`` forms the products ``a^T (c g)`` of the dense terms (kernels, biases, LoRA adapters,
    a tied head's whole logits) from bfloat16 operands with float32 accumulation, at the rate of the matrix units of
    accelerators (a float32 product at full precision runs without them; at the backend's default precision it is
    rounded in ways a library cannot bound). The dense factors are rounded to bfloat16 first and held so, and the
    norms (cross terms included) are those of the rounded factors, their Gram products from the bfloat16 operands
    too (each product exact in float32, accumulated there: :func:`unit_gram`), so they are the norms of the
    gradient released. The weighted operand ``c g`` is not a bfloat16 number; it enters as two, ``hi + lo``
    (``hi`` its rounding, ``lo`` the rounding of the rest), in two products, which leaves each unit's share off
    ``c_i a_i^T g_i`` by at most ``e c_i sum_s ||a_s|| ||g_s||`` per term (``e`` = :data:`SPLIT_ERROR`, about
    ``2^-15``). The clip factors leave that margin, ``c_i = min(1, C / (||g_i|| + m_i))`` with ``m_i = e (sum
    over the parameters of (their dense terms' sum_s ||a_s|| ||g_s||)^2)^(1/2)``, so every unit's share of the
    released sum keeps norm at most ``C`` (up to float32 accumulation, as on every path); the margin is about
    ``10^-4`` of a 128-token unit's norm.
    Two bfloat16 products cost what one TF32 product does on a GPU. The sum differs from the float32 path's by
    the factors' rounding (``2^-8`` relative an entry). The embeddings' rows, the norms' scales and a sliced head's
    rows are summed in float32 as before.

    Args:
      graphdef, params, rest: ``nnx.split(model, trainable, ...)``; every trainable parameter must be covered.
      tokens: ``(B, L)`` or ``(B, k, L)`` int token ids.
      mask: ``tokens``' shape, bool.
      padding: ``(B,)`` bool, units that contribute nothing.
      clip_norm: ``C > 0``.
      method: the norms' method, as :func:`dense_sq_norms`.
      vocab_chunk: ``None``, or the head's vocabulary rows a slice (:mod:`snapaudit_jax.models.vocab_head`; the
        head's terms then come from its hidden states and targets, never a ``(B, S, V)`` array).
      sum_dtype: one of :data:`~snapaudit_jax.dpsgd.config.CLIPPED_SUM_DTYPES`: the dense products' operands
        (above).

    Returns:
      ``(grad_sum, losses, norms)`` as :class:`~snapaudit_jax.dpsgd.gradients.ClippedGrads` (``norms``: the
      units' gradient norms, of the rounded factors with bfloat16 operands, without the margin).

    Raises:
      InputError: (at trace time) a trainable parameter the factors do not cover, named; an unknown ``sum_dtype``.
    """
    from snapaudit_jax.dpsgd.gradients import ClippedGrads

    if sum_dtype not in CLIPPED_SUM_DTYPES:
        raise InputError(f"sum_dtype must be one of {', '.join(CLIPPED_SUM_DTYPES)}, got {sum_dtype!r}")
    losses, factors, norms, scale = _clip_factors(graphdef, params, rest, tokens, mask, padding, clip_norm, method,
                                                  vocab_chunk, sum_dtype)
    operands = jnp.dtype(sum_dtype)
    leaves = []
    for path, variable in nnx.to_flat_state(params):
        grad = _weighted_sum(factors[_name(tuple(path))], scale, variable.shape, operands)
        leaves.append((path, variable.replace(grad.astype(variable.dtype))))
    return ClippedGrads(nnx.from_flat_state(leaves), losses, norms)


def _clip_factors(graphdef, params, rest, tokens, mask, padding, clip_norm, method, vocab_chunk=None,
                  operands: str = "float32"):
    """``(losses, factors, norms, scale)``: the factors of every trainable parameter (refusing any not covered;
    with bfloat16 ``operands`` the dense ones rounded to it), the units' norms and their clip factors ``c_i``
    (``0`` for padding and non-finite norms), leaving the margin of the weighted operand's split
    (:func:`book_keeping_clipped_sum_traced`)."""
    losses, factors, missing = _factors(graphdef, params, rest, tokens, mask, vocab_chunk)
    if missing:
        raise InputError(f"book-keeping and ghost clipping cover dense layers, LoRA adapters, embeddings, the tied "
                         f"head and LayerNorm/RMSNorm computed by their modules; not covered: "
                         f"{', '.join(sorted(missing))} (use the per-record path)")
    if operands != "float32":
        factors = {name: [_rounded(term, jnp.dtype(operands)) for term in terms] for name, terms in factors.items()}
    total = sum((_param_sq_norm(terms, method) for terms in factors.values()),
                jnp.zeros(tokens.shape[0], jnp.float32))
    norms = jnp.sqrt(total)
    bound = norms
    if SPLIT_ERROR[operands]:
        spread = sum((jnp.square(_dense_spread(terms)) for terms in factors.values()),
                     jnp.zeros(tokens.shape[0], jnp.float32))
        bound = norms + SPLIT_ERROR[operands] * jnp.sqrt(spread)
    finite = jnp.isfinite(bound)
    scale = jnp.where(finite & ~padding, jnp.minimum(1.0, clip_norm / jnp.where(finite & (bound > 0), bound, 1.0)),
                      0.0)
    return losses, factors, norms, scale


def _rounded(term: _Term, dtype) -> _Term:
    """A dense term with its factors rounded to and held in ``dtype`` (half their float32 size; their products,
    exact in float32 and accumulated there, run on accelerators' matrix units); other kinds unchanged."""
    if term.kind != "outer":
        return term
    return term._replace(a=term.a.astype(dtype), g=term.g.astype(dtype))


def _dense_spread(terms: list[_Term]) -> jax.Array:
    """``sum_s ||a_s|| ||g_s||`` per unit over a parameter's dense (``"outer"``) terms, a stacked parameter's layers
    summed: what an error of the weighted operand can move ``a^T g`` by, in units of its relative size
    (``(B,)``)."""
    total = 0.0
    for term in terms:
        if term.kind != "outer":
            continue
        a, g = term.a.astype(jnp.float32), term.g.astype(jnp.float32)
        spread = jnp.sum(jnp.sqrt(jnp.sum(a * a, axis=-1) * jnp.sum(g * g, axis=-1)), axis=-1)
        total = total + (jnp.sum(spread, axis=0) if term.layers else spread)
    return jnp.asarray(total, jnp.float32)


def ghost_clipped_sum_traced(graphdef, params, rest, tokens, mask, padding, clip_norm, *, method: str = "auto",
                             vocab_chunk: int | None = None):
    """The clipped gradient sum by ghost clipping: the norms from one backward pass, then a second backward pass
    of the weighted loss ``sum_i c_i L_i`` (Li et al. 2021), whose gradient is ``sum_i c_i g_i``.

    Costs a second forward and backward against :func:`book_keeping_clipped_sum_traced`, but no activation or
    cotangent outlives the first pass's norms (XLA frees each layer's once its norm is taken): the variant for
    when memory, not time, is short. A unit with ``c_i = 0`` (padding, a non-finite norm) is left out of the
    second pass (replaced by a kept unit at weight zero), so it adds exactly zero.

    Both passes run every matrix product at full float32 precision (``jax.default_matmul_precision("highest")``):
    the sum's gradients are recomputed, not the ones whose norms set ``c_i``, and at a backend's default precision
    (TF32 on recent GPUs: operands rounded to ``2^-11``) the two would differ by more than float32 rounding, so a
    unit's share could pass ``C``. Book-keeping needs no such care (its sum is formed from the very factors its
    norms were taken of).

    Args:
      graphdef, params, rest: ``nnx.split(model, trainable, ...)``; every trainable parameter must be covered.
      tokens: ``(B, L)`` or ``(B, k, L)`` int token ids.
      mask: ``tokens``' shape, bool (or an int8 loss mask).
      padding: ``(B,)`` bool, units that contribute nothing.
      clip_norm: ``C > 0``.
      method: the norms' method, as :func:`dense_sq_norms`.
      vocab_chunk: ``None``, or the head's vocabulary rows a slice (:mod:`snapaudit_jax.models.vocab_head`; the
        head's terms then come from its hidden states and targets, never a ``(B, S, V)`` array).

    Returns:
      ``(grad_sum, losses, norms)`` as :class:`~snapaudit_jax.dpsgd.gradients.ClippedGrads`.

    Raises:
      InputError: (at trace time) a trainable parameter the factors do not cover, named.
    """
    with jax.default_matmul_precision("highest"):
        return _ghost_clipped_sum(graphdef, params, rest, tokens, mask, padding, clip_norm, method, vocab_chunk)


def _ghost_clipped_sum(graphdef, params, rest, tokens, mask, padding, clip_norm, method, vocab_chunk):
    from snapaudit_jax.dpsgd.gradients import ClippedGrads

    losses, _, norms, scale = _clip_factors(graphdef, params, rest, tokens, mask, padding, clip_norm, method,
                                            vocab_chunk)
    scale = jax.lax.stop_gradient(scale)
    # A dropped unit (c_i = 0) is replaced by a kept one at weight 0: its own data may make the forward pass NaN,
    # and a zero cotangent through a NaN activation is NaN. With no unit kept, the sum is zero.
    kept = scale > 0
    first = jnp.argmax(kept)
    shape = (-1,) + (1,) * (tokens.ndim - 1)
    tokens = jnp.where(kept.reshape(shape), tokens, tokens[first])
    mask = jnp.where(kept.reshape(shape), mask, mask[first])

    def weighted(p):
        return jnp.sum(scale * unit_losses(nnx.merge(graphdef, p, rest), tokens, mask, vocab_chunk=vocab_chunk))

    grads = jax.grad(weighted)(params)
    grads = jax.tree.map(lambda g: jnp.where(jnp.any(kept), g, jnp.zeros_like(g)), grads)
    return ClippedGrads(grads, losses, norms)


def not_covered(graphdef, params, rest, tokens, mask, *, vocab_chunk: int | None = None) -> tuple[str, ...]:
    """The trainable parameters the book-keeping and ghost paths do not cover, by path (``()``: all covered).

    Traces one forward and backward abstractly (:func:`jax.eval_shape`; nothing is computed).

    Args:
      graphdef, params, rest: ``nnx.split(model, trainable, ...)``.
      tokens, mask: a few units of the data (shapes and dtypes matter, not values).
      vocab_chunk: the head's vocabulary rows a slice, or ``None`` (whole logits).

    Returns:
      The uncovered parameters' paths, sorted.

    Raises:
      InputError: a dense layer called more than once per forward pass (shared weights).
    """
    def struct(tree):
        leaves, treedef = jax.tree.flatten(tree)
        return treedef, tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves)

    # Cached on the shapes alone (what the coverage depends on), so a later run of the same model and data shapes
    # traces nothing new (tested: later runs neither trace nor compile).
    return _not_covered(graphdef, struct(params), struct(rest), struct(tokens), struct(mask), vocab_chunk)


@functools.lru_cache(maxsize=64)
def _not_covered(graphdef, params, rest, tokens, mask, vocab_chunk) -> tuple[str, ...]:
    found: list = []
    params, rest, tokens, mask = (jax.tree.unflatten(treedef, leaves) for treedef, leaves in (params, rest, tokens,
                                                                                              mask))

    def probe(p, r, t, m):
        losses, _, missing = _factors(graphdef, p, r, t, m, vocab_chunk)
        found.append(missing)
        return losses

    jax.eval_shape(probe, params, rest, tokens, mask)
    return tuple(sorted(found[0]))


_bk_jit = jax.jit(book_keeping_clipped_sum_traced, static_argnames=("graphdef", "method", "vocab_chunk", "sum_dtype"))
_ghost_jit = jax.jit(ghost_clipped_sum_traced, static_argnames=("graphdef", "method", "vocab_chunk"))


def book_keeping_clipped_sum(model, tokens, mask, *, clip_norm: float, padding=None, trainable=nnx.LoRAParam,
                             method: str = "auto", vocab_chunk: int | None = None, sum_dtype: str = "float32"):
    """:func:`snapaudit_jax.dpsgd.gradients.clipped_grad_sum` by book-keeping, for models whose every trainable
    parameter is covered (module docstring): DP-LoRA (``trainable=nnx.LoRAParam``) and full fine-tuning of our
    float32 decoders (``trainable=nnx.Param``).

    Args:
      model: the decoder; not modified.
      tokens: ``(B, L)`` or ``(B, k, L)`` int token ids.
      mask: ``tokens``' shape, bool.
      clip_norm: ``C > 0``.
      padding: optional ``(B,)`` bool; padding units contribute exactly zero.
      trainable: the state filter of the differentiated parameters.
      method: the norms' method (``"auto"``, ``"ghost"``, ``"direct"``).
      vocab_chunk: ``None``, or the head's vocabulary rows a slice (:mod:`snapaudit_jax.models.vocab_head`).
      sum_dtype: ``"float32"`` (default) or ``"bfloat16"``: the dense products' operands, the norms those of the
        rounded factors and the clip factors leaving the margin of the weighted operand's split
        (:func:`book_keeping_clipped_sum_traced`).

    Returns:
      :class:`~snapaudit_jax.dpsgd.gradients.ClippedGrads` ``(grad_sum, losses, norms)``.

    Raises:
      InputError: bad arguments, or a trainable parameter not covered (named).

    Guarantees:
      ``grad_sum = sum_i [not padding_i] g_i min(1, C / ||g_i||)`` (non-finite norms zeroed, as jax_privacy's
      ``nan_safe`` clipping), equal to the per-unit path's to ``1e-5`` relative in float32 (tested), so one unit
      changes it by at most ``C`` in L2 norm up to float32 rounding. With ``sum_dtype="bfloat16"`` each unit's
      share of ``grad_sum`` (what leaving it out removes) still has norm at most ``C`` up to float32 rounding
      (tested against each unit's share computed alone in float64), a clipped unit's within about ``10^-4`` of
      ``C``, and ``grad_sum`` is the float32 path's to the factors' rounding (0.2% on the tested models).
    """
    from snapaudit_jax.utils import validate

    tokens, mask = _checked(method, tokens, mask)
    clip_norm = validate.positive_float("clip_norm", clip_norm)
    padding = jnp.zeros(tokens.shape[0], bool) if padding is None else jnp.asarray(padding, bool)
    graphdef, params, rest = nnx.split(model, trainable, ...)
    return _bk_jit(graphdef, params, rest, tokens, mask, padding, jnp.float32(clip_norm), method=method,
                   vocab_chunk=checked_chunk(vocab_chunk), sum_dtype=sum_dtype)


def _checked(method: str, tokens, mask):
    """``(tokens, mask)`` as int32 and bool arrays, after the checks the eager entry points share."""
    if method not in METHODS:
        raise InputError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    tokens, mask = jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, bool)
    if tokens.ndim not in (2, 3) or mask.shape != tokens.shape:
        raise InputError(f"tokens and mask must both be (B, L) or (B, k, L), got {tokens.shape} and {mask.shape}")
    return tokens, mask


_dense_jit = jax.jit(dense_sq_norms_traced, static_argnames=("graphdef", "method", "vocab_chunk"))


def dense_sq_norms(model, tokens, mask, *, method: str = "auto", trainable=nnx.Param,
                   vocab_chunk: int | None = None) -> DenseNorms:
    """Per-unit squared gradient norms of every covered trainable parameter, from one backward pass.

    Covered (see the module docstring): dense kernels and biases, LoRA adapters, embeddings (GPT-2's positions
    too), the tied head and LayerNorm/RMSNorm scales and biases; a trainable parameter not covered is absent
    from ``per_param`` and ``total`` (:func:`not_covered` names them).

    Args:
      model: a decoder (:class:`~snapaudit_jax.models.decoders.GPT2` or ``Llama``) or any NNX module that
        :func:`snapaudit_jax.dpsgd.gradients.sequence_losses` evaluates; not modified.
      tokens: ``(B, L)`` token ids (a unit is a record) or ``(B, k, L)`` (a unit is ``k`` rows, their losses
        summed: user-level DP).
      mask: ``tokens``' shape, bool, real tokens.
      method: ``"auto"`` (per layer, :func:`choose_method`), ``"ghost"`` or ``"direct"``.
      trainable: the ``nnx`` filter of the differentiated state; parameters outside it are left out.
      vocab_chunk: ``None``, or the head's vocabulary rows a slice (:mod:`snapaudit_jax.models.vocab_head`).

    Returns:
      :class:`DenseNorms`; ``total`` sums ``per_param``.

    Raises:
      InputError: an unknown ``method``, ``tokens``/``mask`` of other shapes, or a tapped layer called twice.

    Guarantees:
      ``per_param[p][i] = ||dL_i / dp||^2`` for every covered parameter ``p`` (``L_i``: unit ``i``'s loss as
      :func:`snapaudit_jax.dpsgd.gradients.clipped_grad_sum` defines it), in float32 up to rounding: equal to the
      per-unit vmapped gradients' norms to ``1e-5`` relative (tested on GPT-2 and Llama with tied and untied
      embeddings, padding, variable lengths, user-level units, both methods, every parameter).
    """
    tokens, mask = _checked(method, tokens, mask)
    graphdef, params, rest = nnx.split(model, trainable, ...)
    return _dense_jit(graphdef, params, rest, tokens, mask, method=method, vocab_chunk=checked_chunk(vocab_chunk))
