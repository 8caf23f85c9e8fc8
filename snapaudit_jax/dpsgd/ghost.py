"""Per-unit gradient norms of dense layers without per-unit gradients (ghost norms).

DP-SGD clips each unit's gradient (a record, or a user's records summed) to norm ``C``, so it needs each unit's
gradient norm. :mod:`snapaudit_jax.dpsgd.gradients` gets it by computing every unit's whole gradient (a vmap
over units); for a dense layer ``y = x W + b`` the norm follows from quantities the ordinary backward pass of
the *summed* loss already has. With ``a`` the layer's input activations of unit ``i`` (``S x d_in``: the unit's
tokens, a user's rows laid end to end) and ``g`` the cotangents of the summed loss at the layer's output
(``S x d_out``; unit ``i``'s loss is the only one that depends on its own outputs, so these are exactly
``dL_i / dy``), unit ``i``'s gradients are ``dW = a^T g`` and ``db = sum_s g_s``, and

    ||a^T g||_F^2 = sum_{s,t} (a_s . a_t)(g_s . g_t)        (the ghost identity, Li et al. 2021)

which costs ``S^2 (d_in + d_out)`` per unit against ``S d_in d_out`` for forming ``a^T g`` directly.
:func:`dense_sq_norms` takes the cheaper of the two for each layer's shape (``method="auto"``: the ghost form
when ``S (d_in + d_out) < d_in d_out``, long inputs and narrow layers going direct), or the one forced.

The cotangents are captured with zero-valued probes: every ``nnx.Linear`` of a fresh copy of the model (the one
:func:`flax.nnx.merge` builds inside the traced function; the caller's model is never touched) is wrapped so
that its output gets ``+ probe``, and the gradient of the summed loss with respect to the probes is ``g``. One
forward and one backward of the summed loss give every dense layer's per-unit norms.

Covered: ``nnx.Linear`` kernels and biases, and the LoRA adapters of
:class:`~snapaudit_jax.finetune.lora.LoRAProjection` (``y = x W + b + s (x A) B`` on a slice of the columns:
``dB = s (x A)^T h`` and ``dA = s x^T (h B^T)`` with ``h`` the slice's cotangent, each a dense layer of its own
input and cotangent). Embeddings and normalisation scales are not (their norms need their own identities):
:func:`dense_sq_norms` reports the parameters it covered by their paths, and a layer called more than once per
forward pass (shared weights: its per-unit gradient has cross terms between the calls) is refused.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from snapaudit_jax.dpsgd.gradients import sequence_losses
from snapaudit_jax.utils.errors import InputError

__all__ = ["METHODS", "DenseNorms", "book_keeping_clipped_sum", "book_keeping_clipped_sum_traced", "choose_method",
           "dense_sq_norms", "dense_sq_norms_traced", "direct_sq_norm", "ghost_clipped_sum_traced", "ghost_sq_norm",
           "not_covered"]

METHODS = ("auto", "ghost", "direct")


def ghost_sq_norm(a: jax.Array, g: jax.Array) -> jax.Array:
    """``||a_i^T g_i||_F^2`` per unit through the ``S x S`` Gram products: ``(B,)``.

    Args:
      a: ``(B, S, d_in)`` input activations.
      g: ``(B, S, d_out)`` output cotangents.

    Returns:
      ``(B,)`` float32 squared Frobenius norms.
    """
    a, g = a.astype(jnp.float32), g.astype(jnp.float32)
    gram_a = jnp.einsum("bsi,bti->bst", a, a, precision=jax.lax.Precision.HIGHEST)
    gram_g = jnp.einsum("bso,bto->bst", g, g, precision=jax.lax.Precision.HIGHEST)
    return jnp.sum(gram_a * gram_g, axis=(1, 2))


def direct_sq_norm(a: jax.Array, g: jax.Array) -> jax.Array:
    """``||a_i^T g_i||_F^2`` per unit by forming the ``d_in x d_out`` gradient: ``(B,)``.

    Args:
      a: ``(B, S, d_in)`` input activations.
      g: ``(B, S, d_out)`` output cotangents.

    Returns:
      ``(B,)`` float32 squared Frobenius norms.
    """
    grads = jnp.einsum("bsi,bso->bio", a.astype(jnp.float32), g.astype(jnp.float32),
                       precision=jax.lax.Precision.HIGHEST)
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
      per_param: parameter path (``"h.0.c_fc.kernel"``) -> ``(B,)`` its per-unit squared norm.
      losses: ``(B,)`` per-unit losses (the sum of the unit's rows' mean token losses).
    """

    total: jax.Array
    per_param: dict[str, jax.Array]
    losses: jax.Array


def _name(path: tuple) -> str:
    return ".".join(map(str, path))


class _Tap:
    """Stands in for one ``nnx.Linear`` of a traced copy: records its input, adds its probe to its output."""

    def __init__(self, linear: nnx.Linear, path: tuple, record: dict):
        self.linear, self.path, self.record = linear, path, record

    def __call__(self, x):
        if self.path in self.record["paths"]:
            raise InputError(f"dense layer {_name(self.path)} is called more than once per forward pass (shared "
                             "weights): its per-unit gradient has cross terms the ghost norm omits")
        y = self.linear(x)
        self.record["paths"].append(self.path)
        self.record["inputs"].append(x)
        probes = self.record["probes"]
        if probes is None:
            self.record["outputs"].append(y)
            return y
        return y + probes[len(self.record["paths"]) - 1].astype(y.dtype)


def _tap_linears(model, record: dict) -> None:
    """Replaces every ``nnx.Linear`` attribute of ``model`` (a fresh traced copy) by a :class:`_Tap`; for the base
    projection of a LoRA adapter, records the adapter's ``(scale, spans)`` under the adapter's path."""
    from snapaudit_jax.finetune.lora import LoRAProjection

    found = [(tuple(path), m) for path, m in nnx.iter_modules(model) if isinstance(m, nnx.Linear)]
    for path, linear in found:
        parent = model
        for key in path[:-1]:
            parent = parent[key] if isinstance(key, int) else getattr(parent, key)
        if isinstance(parent, LoRAProjection) and path[-1] == "base":
            record["lora"][path[:-1]] = (parent.scale, tuple(parent.spans))
        if isinstance(path[-1], int):
            parent[path[-1]] = _Tap(linear, path, record)
        else:
            object.__setattr__(parent, path[-1], _Tap(linear, path, record))


def _forward(graphdef, params, rest, tokens, mask, probes, paths: list, lora: dict | None = None):
    """Summed loss of every unit, with ``(per-unit losses, tapped inputs, tapped outputs)``; ``paths`` receives
    the tapped layers' paths in call order, ``lora`` the LoRA adapters' ``(scale, spans)`` by path."""
    record = {"paths": paths, "inputs": [], "outputs": [], "probes": probes, "lora": {} if lora is None else lora}
    model = nnx.merge(graphdef, params, rest)
    _tap_linears(model, record)
    length = tokens.shape[-1]
    rows = sequence_losses(model, tokens.reshape(-1, length), mask.reshape(-1, length))
    per_unit = rows.reshape(tokens.shape[0], -1).sum(axis=1)
    return jnp.sum(per_unit), (per_unit, record["inputs"], record["outputs"])


def _factors(graphdef, params, rest, tokens, mask):
    """One forward and one backward of the summed loss: ``(per-unit losses, {name: (a, g)})`` for every covered
    trainable parameter, unit ``i``'s gradient of ``name`` being ``a_i^T g_i`` (``a`` ``(B, S, p)``, ``g``
    ``(B, S, q)``, float32; a bias's ``a`` is ones)."""
    covered = {_name(tuple(path)) for path, _ in nnx.to_flat_state(params)}
    values = {_name(tuple(path)): v for path, v in nnx.to_flat_state(params)}
    shapes = jax.eval_shape(lambda p: _forward(graphdef, p, rest, tokens, mask, None, [])[1][2], params)
    probes = [jnp.zeros(s.shape, s.dtype) for s in shapes]
    paths: list = []
    lora: dict = {}
    _, pullback, (losses, inputs, _) = jax.vjp(
        lambda pr: _forward(graphdef, params, rest, tokens, mask, pr, paths, lora), probes, has_aux=True)
    cotangents = pullback(jnp.ones((), jnp.float32))[0]
    units = tokens.shape[0]
    factors: dict[str, tuple[jax.Array, jax.Array]] = {}
    for path, a, g in zip(paths, inputs, cotangents):
        a = a.reshape(units, -1, a.shape[-1]).astype(jnp.float32)  # a unit's rows end to end: S = k * L
        g = g.reshape(units, -1, g.shape[-1]).astype(jnp.float32)
        if _name(path + ("kernel",)) in covered:
            factors[_name(path + ("kernel",))] = (a, g)
        if _name(path + ("bias",)) in covered:
            factors[_name(path + ("bias",))] = (jnp.ones(a.shape[:2] + (1,), jnp.float32), g)
        if path[-1] == "base" and path[:-1] in lora:
            # y = x W + b + scale (x A_i) B_i on columns [start, stop): with h = scale g[start:stop], unit i's
            # dB_i = (x A_i)^T h and dA_i = x^T (h B_i^T) -- dense layers of their own
            scale, spans = lora[path[:-1]]
            for i, (start, stop) in enumerate(spans):
                a_name, b_name = _name(path[:-1] + ("lora_a", i)), _name(path[:-1] + ("lora_b", i))
                h = g[..., start:stop] * scale
                if b_name in covered:
                    factors[b_name] = (jnp.einsum("bsi,ir->bsr", a, values[a_name].astype(jnp.float32),
                                                  precision=jax.lax.Precision.HIGHEST), h)
                if a_name in covered:
                    factors[a_name] = (a, jnp.einsum("bso,ro->bsr", h, values[b_name].astype(jnp.float32),
                                                     precision=jax.lax.Precision.HIGHEST))
    return losses, factors, covered - set(factors)


def _sq_norm(a, g, method: str):
    chosen = choose_method(a.shape[1], a.shape[2], g.shape[2]) if method == "auto" else method
    return (ghost_sq_norm if chosen == "ghost" else direct_sq_norm)(a, g)


def dense_sq_norms_traced(graphdef, params, rest, tokens, mask, *, method: str = "auto") -> DenseNorms:
    """:func:`dense_sq_norms` on a split model, traceable (call it inside ``jax.jit``).

    Args:
      graphdef, params, rest: ``nnx.split(model, trainable, ...)``; ``params`` are differentiated.
      tokens: ``(B, L)`` or ``(B, k, L)`` int token ids.
      mask: ``tokens``' shape, bool.
      method: as :func:`dense_sq_norms`.

    Returns:
      :class:`DenseNorms`.
    """
    losses, factors, _ = _factors(graphdef, params, rest, tokens, mask)
    per_param = {name: _sq_norm(a, g, method) for name, (a, g) in factors.items()}
    total = sum(per_param.values(), jnp.zeros(tokens.shape[0], jnp.float32))
    return DenseNorms(total, per_param, losses)


def book_keeping_clipped_sum_traced(graphdef, params, rest, tokens, mask, padding, clip_norm, *,
                                    method: str = "auto"):
    """The clipped gradient sum by book-keeping: one forward, one backward, no per-unit gradient.

    Unit ``i``'s norm comes from the ghost norms of its factors; with ``c_i = min(1, C / ||g_i||)`` (``0`` for a
    padding unit or a non-finite norm), the sum is ``sum_i c_i a_i^T g_i`` per parameter, from the stored
    activations and cotangents (Bu et al.'s book-keeping).

    Args:
      graphdef, params, rest: ``nnx.split(model, trainable, ...)``; every trainable parameter must be covered.
      tokens: ``(B, L)`` or ``(B, k, L)`` int token ids.
      mask: ``tokens``' shape, bool.
      padding: ``(B,)`` bool, units that contribute nothing.
      clip_norm: ``C > 0``.
      method: the norms' method, as :func:`dense_sq_norms`.

    Returns:
      ``(grad_sum, losses, norms)`` as :class:`~snapaudit_jax.dpsgd.gradients.ClippedGrads`.

    Raises:
      InputError: (at trace time) a trainable parameter the factors do not cover, named.
    """
    from snapaudit_jax.dpsgd.gradients import ClippedGrads

    losses, factors, norms, scale = _clip_factors(graphdef, params, rest, tokens, mask, padding, clip_norm, method)
    keep = (scale > 0)[:, None, None]  # a dropped unit's factors may hold NaN, and 0 * NaN is NaN
    leaves = []
    for path, variable in nnx.to_flat_state(params):
        a, g = factors[_name(tuple(path))]
        grad = jnp.einsum("bsp,bsq->pq", jnp.where(keep, a * scale[:, None, None], 0.0), jnp.where(keep, g, 0.0),
                          precision=jax.lax.Precision.HIGHEST)
        leaves.append((path, variable.replace(grad.reshape(variable.shape).astype(variable.dtype))))
    return ClippedGrads(nnx.from_flat_state(leaves), losses, norms)


def _clip_factors(graphdef, params, rest, tokens, mask, padding, clip_norm, method):
    """``(losses, factors, norms, scale)``: the factors of every trainable parameter (refusing any not covered),
    the units' norms and their clip factors ``c_i`` (``0`` for padding and non-finite norms)."""
    losses, factors, missing = _factors(graphdef, params, rest, tokens, mask)
    if missing:
        raise InputError(f"book-keeping and ghost clipping cover dense layers and LoRA adapters only; not covered: "
                         f"{', '.join(sorted(missing))} (use the per-record path)")
    total = sum((_sq_norm(a, g, method) for a, g in factors.values()), jnp.zeros(tokens.shape[0], jnp.float32))
    norms = jnp.sqrt(total)
    finite = jnp.isfinite(norms)
    scale = jnp.where(finite & ~padding, jnp.minimum(1.0, clip_norm / jnp.where(finite & (norms > 0), norms, 1.0)),
                      0.0)
    return losses, factors, norms, scale


def ghost_clipped_sum_traced(graphdef, params, rest, tokens, mask, padding, clip_norm, *, method: str = "auto"):
    """The clipped gradient sum by ghost clipping: the norms from one backward pass, then a second backward pass
    of the weighted loss ``sum_i c_i L_i`` (Li et al. 2021), whose gradient is ``sum_i c_i g_i``.

    Costs a second forward and backward against :func:`book_keeping_clipped_sum_traced`, but no activation or
    cotangent outlives the first pass's norms (XLA frees each layer's once its norm is taken): the variant for
    when memory, not time, is short. A unit with ``c_i = 0`` (padding, a non-finite norm) is left out of the
    second pass (replaced by a kept unit at weight zero), so it adds exactly zero.

    Args:
      graphdef, params, rest: ``nnx.split(model, trainable, ...)``; every trainable parameter must be covered.
      tokens: ``(B, L)`` or ``(B, k, L)`` int token ids.
      mask: ``tokens``' shape, bool (or an int8 loss mask).
      padding: ``(B,)`` bool, units that contribute nothing.
      clip_norm: ``C > 0``.
      method: the norms' method, as :func:`dense_sq_norms`.

    Returns:
      ``(grad_sum, losses, norms)`` as :class:`~snapaudit_jax.dpsgd.gradients.ClippedGrads`.

    Raises:
      InputError: (at trace time) a trainable parameter the factors do not cover, named.
    """
    from snapaudit_jax.dpsgd.gradients import ClippedGrads

    losses, _, norms, scale = _clip_factors(graphdef, params, rest, tokens, mask, padding, clip_norm, method)
    scale = jax.lax.stop_gradient(scale)
    # A dropped unit (c_i = 0) is replaced by a kept one at weight 0: its own data may make the forward pass NaN,
    # and a zero cotangent through a NaN activation is NaN. With no unit kept, the sum is zero.
    kept = scale > 0
    first = jnp.argmax(kept)
    shape = (-1,) + (1,) * (tokens.ndim - 1)
    tokens = jnp.where(kept.reshape(shape), tokens, tokens[first])
    mask = jnp.where(kept.reshape(shape), mask, mask[first])
    length = tokens.shape[-1]

    def weighted(p):
        rows = sequence_losses(nnx.merge(graphdef, p, rest), tokens.reshape(-1, length), mask.reshape(-1, length))
        return jnp.sum(scale * rows.reshape(tokens.shape[0], -1).sum(axis=1))

    grads = jax.grad(weighted)(params)
    grads = jax.tree.map(lambda g: jnp.where(jnp.any(kept), g, jnp.zeros_like(g)), grads)
    return ClippedGrads(grads, losses, norms)


def not_covered(graphdef, params, rest, tokens, mask) -> tuple[str, ...]:
    """The trainable parameters the book-keeping and ghost paths do not cover, by path (``()``: all covered).

    Traces one forward and backward abstractly (:func:`jax.eval_shape`; nothing is computed).

    Args:
      graphdef, params, rest: ``nnx.split(model, trainable, ...)``.
      tokens, mask: a few units of the data (shapes and dtypes matter, not values).

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
    return _not_covered(graphdef, struct(params), struct(rest), struct(tokens), struct(mask))


@functools.lru_cache(maxsize=64)
def _not_covered(graphdef, params, rest, tokens, mask) -> tuple[str, ...]:
    found: list = []
    params, rest, tokens, mask = (jax.tree.unflatten(treedef, leaves) for treedef, leaves in (params, rest, tokens,
                                                                                              mask))

    def probe(p, r, t, m):
        losses, _, missing = _factors(graphdef, p, r, t, m)
        found.append(missing)
        return losses

    jax.eval_shape(probe, params, rest, tokens, mask)
    return tuple(sorted(found[0]))


_bk_jit = jax.jit(book_keeping_clipped_sum_traced, static_argnames=("graphdef", "method"))
_ghost_jit = jax.jit(ghost_clipped_sum_traced, static_argnames=("graphdef", "method"))


def book_keeping_clipped_sum(model, tokens, mask, *, clip_norm: float, padding=None, trainable=nnx.LoRAParam,
                             method: str = "auto"):
    """:func:`snapaudit_jax.dpsgd.gradients.clipped_grad_sum` by book-keeping, for models whose every trainable
    parameter is a dense kernel or bias or a LoRA adapter (DP-LoRA: ``trainable=nnx.LoRAParam``).

    Args:
      model: the decoder; not modified.
      tokens: ``(B, L)`` or ``(B, k, L)`` int token ids.
      mask: ``tokens``' shape, bool.
      clip_norm: ``C > 0``.
      padding: optional ``(B,)`` bool; padding units contribute exactly zero.
      trainable: the state filter of the differentiated parameters.
      method: the norms' method (``"auto"``, ``"ghost"``, ``"direct"``).

    Returns:
      :class:`~snapaudit_jax.dpsgd.gradients.ClippedGrads` ``(grad_sum, losses, norms)``.

    Raises:
      InputError: bad arguments, or a trainable parameter not covered (named).

    Guarantees:
      ``grad_sum = sum_i [not padding_i] g_i min(1, C / ||g_i||)`` (non-finite norms zeroed, as jax_privacy's
      ``nan_safe`` clipping), equal to the per-unit path's to ``1e-5`` relative in float32 (tested), so one unit
      changes it by at most ``C`` in L2 norm up to float32 rounding.
    """
    from snapaudit_jax.utils import validate

    tokens, mask = _checked(method, tokens, mask)
    clip_norm = validate.positive_float("clip_norm", clip_norm)
    padding = jnp.zeros(tokens.shape[0], bool) if padding is None else jnp.asarray(padding, bool)
    graphdef, params, rest = nnx.split(model, trainable, ...)
    return _bk_jit(graphdef, params, rest, tokens, mask, padding, jnp.float32(clip_norm), method=method)


def _checked(method: str, tokens, mask):
    """``(tokens, mask)`` as int32 and bool arrays, after the checks the eager entry points share."""
    if method not in METHODS:
        raise InputError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    tokens, mask = jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, bool)
    if tokens.ndim not in (2, 3) or mask.shape != tokens.shape:
        raise InputError(f"tokens and mask must both be (B, L) or (B, k, L), got {tokens.shape} and {mask.shape}")
    return tokens, mask


_dense_jit = jax.jit(dense_sq_norms_traced, static_argnames=("graphdef", "method"))


def dense_sq_norms(model, tokens, mask, *, method: str = "auto", trainable=nnx.Param) -> DenseNorms:
    """Per-unit squared gradient norms of every dense layer's kernel and bias, from one backward pass.

    Args:
      model: a decoder (:class:`~snapaudit_jax.models.decoders.GPT2` or ``Llama``) or any NNX module that
        :func:`snapaudit_jax.dpsgd.gradients.sequence_losses` evaluates; not modified.
      tokens: ``(B, L)`` token ids (a unit is a record) or ``(B, k, L)`` (a unit is ``k`` rows, their losses
        summed: user-level DP).
      mask: ``tokens``' shape, bool, real tokens.
      method: ``"auto"`` (per layer, :func:`choose_method`), ``"ghost"`` or ``"direct"``.
      trainable: the ``nnx`` filter of the differentiated state; a dense layer's kernel or bias outside it is
        left out.

    Returns:
      :class:`DenseNorms`; ``total`` sums ``per_param``.

    Raises:
      InputError: an unknown ``method``, ``tokens``/``mask`` of other shapes, or a dense layer called twice.

    Guarantees:
      ``per_param[p][i] = ||dL_i / dp||^2`` for every covered parameter ``p`` (``L_i``: unit ``i``'s loss as
      :func:`snapaudit_jax.dpsgd.gradients.clipped_grad_sum` defines it), in float32 up to rounding: equal to the
      per-unit vmapped gradients' norms to ``1e-5`` relative (tested on GPT-2 and Llama, padding, variable
      lengths, user-level units, both methods).
    """
    tokens, mask = _checked(method, tokens, mask)
    graphdef, params, rest = nnx.split(model, trainable, ...)
    return _dense_jit(graphdef, params, rest, tokens, mask, method=method)
