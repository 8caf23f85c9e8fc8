"""The arithmetic of a traced program's matrix products, counted from its jaxpr: what a step costs on any backend.

A step's time on an accelerator is bounded below by its matrix products' floating-point operations over the
device's rate, and the ratio of two steps' product counts is the share of throughput the costlier one can keep
at most when both run at the same rate: a backend-independent figure a CPU can compute for a GPU run
(book-keeping's clipped sum against the non-private gradient of the same batch, :mod:`snapaudit_jax.dpsgd.ghost`),
and the one that turns a measured rate into the device's utilisation.

:func:`count_matmul_flops` traces ``fn`` (nothing is compiled or run; arguments may be
:class:`jax.ShapeDtypeStruct`) and counts every ``dot_general`` -- ``jnp.dot``, ``matmul``, ``einsum``, the products
of a backward pass and of a ``vmap`` alike -- as ``2 x batch x M x N x K`` operations, whatever the backend fuses
or how it tiles them, after dead code is removed (``jax.grad`` of ``f`` traces ``f``'s forward products, which
XLA drops where the loss is not returned). Loops count what they execute: a ``lax.scan`` body (``lax.map``,
``fori_loop`` with fixed bounds, the scanned blocks of :func:`~snapaudit_jax.models.decoders.stack_layers`, a
vocabulary-sliced head) times its length, the costliest branch of a ``lax.cond`` (an upper bound where branches
differ; the branches of :func:`jax.lax.platform_dependent` do the same products), and every nested jit, remat and
custom-derivative call once. What the count cannot know is refused rather than guessed: a ``while`` loop (its
trip count is a traced value), a convolution, and a ``shard_map`` or ``pmap`` (their bodies run once per device)
raise :class:`~snapaudit_jax.utils.errors.InputError` naming the primitive. Element-wise work (softmax, norms, the
optimizer) is not counted: it is memory-bound on accelerators, and XLA's own ``cost_analysis`` counts it under
backend-specific fusion, its loop bodies once.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
from jax.extend import core

from snapaudit_jax.utils.errors import DependencyError, InputError

__all__ = ["MatmulCount", "count_matmul_flops", "jaxpr_matmul_flops"]

# Primitives whose operations the count cannot state: why, named in the refusal.
_REFUSED = {
    "while": "a while loop runs a traced number of times",
    "conv_general_dilated": "convolutions are not counted",
    "shard_map": "a shard_map body runs once per device",
    "xla_pmap": "a pmap body runs once per device",
}


class MatmulCount(NamedTuple):
    """Output of :func:`count_matmul_flops`.

    Attributes:
      total: floating-point operations of every matrix product (``2 x batch x M x N x K`` each), a Python int.
      by_operands: the same split by the products' operands, the rate a device gives each being different: their
        dtype (``"float32"``, ``"bfloat16"``, ...; two dtypes as ``"lhs*rhs"``), with ``"@highest"`` or ``"@high"``
        where the product asks for that precision (``precision=`` of ``jnp.dot`` / ``einsum``; a
        ``jax.lax.DotAlgorithmPreset`` by its name): an accelerator runs a float32 product at the default
        precision on its matrix units (TF32) and at ``"highest"`` without them, several times slower. A
        ``jax.default_matmul_precision`` around the call (or inside ``fn``) enters the trace and counts alike.
      products: how many products the program executes (a scanned product counted once per iteration).
    """

    total: int
    by_operands: dict[str, int]
    products: int


def _dot_flops(eqn) -> int:
    lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
    free_rhs = [d for i, d in enumerate(rhs) if i not in rhs_contract and i not in rhs_batch]
    return 2 * math.prod(lhs) * math.prod(free_rhs)  # lhs holds batch x M x K; times N, two operations each


_PRECISION_ORDER = ("DEFAULT", "HIGH", "HIGHEST")


def _operands_name(eqn) -> str:
    lhs, rhs = (str(v.aval.dtype) for v in eqn.invars[:2])
    name = lhs if lhs == rhs else f"{lhs}*{rhs}"
    precision = eqn.params.get("precision")
    if isinstance(precision, (tuple, list)):  # a Precision per operand: the higher one
        asked = max((getattr(p, "name", "DEFAULT") for p in precision if p is not None),
                    key=lambda n: _PRECISION_ORDER.index(n) if n in _PRECISION_ORDER else -1, default="DEFAULT")
        return name if asked == "DEFAULT" else f"{name}@{asked.lower()}"
    if precision is not None:  # a dot algorithm (jax.lax.DotAlgorithmPreset)
        asked = getattr(precision, "name", str(precision))
        return name if asked == "DEFAULT" else f"{name}@{asked.lower()}"
    return name


def _dce(jaxpr):
    """``jaxpr`` without the equations its outputs do not need (the products XLA would not run): JAX's own pass,
    imported here so that a JAX release without it fails this count alone, by name, not ``snapaudit_jax.models``."""
    try:
        from jax._src.interpreters.partial_eval import dce_jaxpr
    except ImportError as err:  # the pin (jax < 0.12) has it; a later release may move it
        raise DependencyError(f"count_matmul_flops needs JAX's dce_jaxpr (jax._src.interpreters.partial_eval), "
                              f"which jax {jax.__version__} does not have: {err}") from err
    return dce_jaxpr(jaxpr, True)


def _sub_jaxprs(value: Any):
    if isinstance(value, core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, core.Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _sub_jaxprs(item)


def _count(jaxpr, times: int, by_operands: dict[str, int], tally: list[int]) -> None:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _REFUSED:
            raise InputError(f"count_matmul_flops cannot count primitive {name!r}: {_REFUSED[name]}")
        if name == "dot_general":
            key = _operands_name(eqn)
            by_operands[key] = by_operands.get(key, 0) + times * _dot_flops(eqn)
            tally[0] += times
        elif name == "scan":
            _count(eqn.params["jaxpr"].jaxpr, times * int(eqn.params["length"]), by_operands, tally)
        elif name == "cond":  # the costliest branch
            best = None
            for branch in eqn.params["branches"]:
                counts, products = {}, [0]
                _count(branch.jaxpr, times, counts, products)
                if best is None or sum(counts.values()) > sum(best[0].values()):
                    best = (counts, products)
            for key, value in best[0].items():
                by_operands[key] = by_operands.get(key, 0) + value
            tally[0] += best[1][0]
        else:  # nested jit, remat, custom_jvp / custom_vjp calls: their jaxprs run once
            for value in eqn.params.values():
                for sub in _sub_jaxprs(value):
                    _count(sub, times, by_operands, tally)


def jaxpr_matmul_flops(jaxpr) -> MatmulCount:
    """:func:`count_matmul_flops` of a jaxpr already traced.

    Args:
      jaxpr: a :class:`jax.extend.core.ClosedJaxpr` (:func:`jax.make_jaxpr`'s output) or its ``Jaxpr``.

    Returns:
      :class:`MatmulCount` ``(total, by_operands, products)``, its dead code removed first.

    Raises:
      InputError: a ``while`` loop, a convolution, a ``shard_map`` or ``pmap`` anywhere in it (named).
    """
    jaxpr = jaxpr.jaxpr if isinstance(jaxpr, core.ClosedJaxpr) else jaxpr
    if not isinstance(jaxpr, core.Jaxpr):
        raise InputError(f"jaxpr must be a jaxpr (jax.make_jaxpr's output), got {type(jaxpr).__name__}")
    jaxpr, _ = _dce(jaxpr)
    by_operands: dict[str, int] = {}
    tally = [0]
    _count(jaxpr, 1, by_operands, tally)
    return MatmulCount(sum(by_operands.values()), dict(sorted(by_operands.items())), tally[0])


def count_matmul_flops(fn: Callable, *args, **kwargs) -> MatmulCount:
    """Floating-point operations of the matrix products ``fn(*args, **kwargs)`` executes, from its jaxpr.

    Nothing is compiled or run: ``args`` may be arrays or :class:`jax.ShapeDtypeStruct` (keyword arguments are
    static, as :func:`jax.make_jaxpr` takes them). Example (the products of one training step's gradient)::

        import jax, jax.numpy as jnp
        from snapaudit_jax.models.flops import count_matmul_flops

        x = jax.ShapeDtypeStruct((32, 128, 768), jnp.float32)
        w = jax.ShapeDtypeStruct((768, 3072), jnp.float32)
        count_matmul_flops(jax.value_and_grad(lambda w, x: jnp.sum(x @ w)), w, x).total
        # 2 * (2 * 32 * 128 * 768 * 3072): the forward product and the weight gradient's (x's is not asked)

    Args:
      fn: a function of arrays (jitted or not).
      *args: its positional arguments (arrays or shapes).
      **kwargs: its keyword arguments, static.

    Returns:
      :class:`MatmulCount` ``(total, by_operands, products)``.

    Raises:
      InputError: the program holds a ``while`` loop, a convolution, a ``shard_map`` or a ``pmap`` (named: their
        operations cannot be stated from the trace).
    """
    if not callable(fn):
        raise InputError(f"fn must be callable, got {type(fn).__name__}")
    return jaxpr_matmul_flops(jax.make_jaxpr(fn)(*args, **kwargs) if not kwargs
                              else jax.make_jaxpr(lambda *a: fn(*a, **kwargs))(*args))
