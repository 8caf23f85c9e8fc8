"""Data parallelism of the DP-SGD step over a 1-D device mesh.

The ``N`` units of the dataset are split over the mesh axis (``N`` padded up to a multiple ``N_pad`` of the
device count ``D`` with empty padding units, which are never selected); parameters, optimizer state and the
model's other state are replicated. Per step (:func:`~snapaudit_jax.dpsgd.train`):

1. the Poisson mask over all ``N`` units is the single-device one (same key, same stream), so the batch of a
   step does not depend on ``D``; padded with ``False`` to ``N_pad``, each device reads its
   ``N_pad / D`` entries;
2. each device compacts the selected units it holds and runs the microbatch loop over them (per-unit clipped
   gradients where the records live, ``ceil(count_d / m)`` microbatches of ``m`` units);
3. the clipped sums and the metrics are summed (``lax.psum``; ``lax.pmax`` for maxima) over the axis;
4. outside the per-device program, on the replicated sum: one Gaussian draw, the scaling and the optimizer
   update, replicated (the same computation and the same noise as on one device).

Only the order of the float32 summation differs from one device (``D`` partial sums added by the
all-reduce), so the parameters agree with the single-device run up to that rounding, and a run is
bit-for-bit reproducible for a fixed ``D``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from snapaudit_jax.utils.errors import InputError

__all__: list[str] = []

DEFAULT_AXIS = "data"


def _resolve_mesh(mesh) -> Mesh | None:
    """``None``, or the 1-D mesh of local devices ``mesh`` names (an int ``n``: the first ``n`` local devices).

    A :class:`jax.sharding.Mesh` is rebuilt over the same devices and axis name with an ``Auto`` axis type (the
    step places its arrays itself; ``jax.make_mesh`` defaults to ``Explicit`` axes).
    """
    if mesh is None:
        return None
    local = jax.local_devices()
    if isinstance(mesh, (int, np.integer)) and not isinstance(mesh, (bool, np.bool_)):
        n = int(mesh)
        if not 1 <= n <= len(local):
            raise InputError(f"mesh must be a number of local devices in [1, {len(local)}], got {mesh!r}")
        return jax.make_mesh((n,), (DEFAULT_AXIS,), axis_types=(AxisType.Auto,), devices=local[:n])
    if not isinstance(mesh, Mesh):
        raise InputError(
            f"mesh must be None, a number of local devices or a 1-D jax.sharding.Mesh, got {type(mesh).__name__} "
            f"{mesh!r}"
        )
    if len(mesh.axis_names) != 1:
        raise InputError(
            f"mesh must be 1-D (one data axis), got axes {tuple(mesh.axis_names)} of shape {tuple(mesh.devices.shape)}"
        )
    devices = list(np.asarray(mesh.devices).reshape(-1))
    if len(devices) > len(local):
        raise InputError(f"mesh must have at most the {len(local)} local devices, got {len(devices)} devices")
    foreign = [d for d in devices if d not in local]
    if foreign:
        raise InputError(f"mesh must hold local devices only (this process's), got {foreign[0]!r}")
    return Mesh(np.asarray(devices), tuple(mesh.axis_names), axis_types=(AxisType.Auto,))


def _axis(mesh: Mesh) -> str:
    return mesh.axis_names[0]


def _replicate(mesh: Mesh, tree):
    """A copy of ``tree`` on every device of ``mesh``."""
    return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))


def _constrain_replicated(mesh: Mesh, tree):
    """Inside jit: ``tree`` replicated on ``mesh`` (keeps the step's output shardings equal to its inputs')."""
    return lax.with_sharding_constraint(tree, NamedSharding(mesh, PartitionSpec()))


def _shard_units(mesh: Mesh, tokens: np.ndarray, mask: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """``(N_pad, ...)`` tokens and mask split over the mesh axis; the padding units are empty (mask ``False``)."""
    n, size = tokens.shape[0], mesh.devices.size
    pad = -(-n // size) * size - n
    widths = [(0, pad)] + [(0, 0)] * (tokens.ndim - 1)
    tokens = np.pad(tokens, widths)
    mask = np.pad(mask, widths)
    sharding = NamedSharding(mesh, PartitionSpec(_axis(mesh)))
    return jax.device_put(tokens, sharding), jax.device_put(mask, sharding)


def _sharded_sums(
    mesh: Mesh,
    local: Callable[..., tuple[Any, dict[str, jax.Array], dict[str, jax.Array]]],
    replicated: tuple,
    tokens: jax.Array,
    mask: jax.Array,
    selected: jax.Array,
) -> tuple[Any, dict[str, jax.Array]]:
    """Traceable: ``local(*replicated, tokens_d, mask_d, selected_d)`` on every device's units, reduced over the axis.

    Args:
      mesh: the 1-D mesh.
      local: the per-device program; returns ``(grad_sum, sums, maxima)``: the gradient pytree and the metrics
        to add and to maximise over devices.
      replicated: its leading arguments, the same on every device.
      tokens: ``(N_pad, ...)`` units (split over the axis).
      mask: ``tokens``' shape.
      selected: ``(N,)`` bool, the global Poisson mask (``N <= N_pad``; padded with ``False``).

    Returns:
      ``(grad_sum, metrics)``, replicated: ``grad_sum`` and the ``sums`` added over devices, the ``maxima``
      maximised.
    """
    axis = _axis(mesh)
    selected = jnp.pad(selected, (0, tokens.shape[0] - selected.shape[0]))  # padding units: never selected

    def program(replicated, tokens, mask, selected):
        grad_sum, sums, maxima = local(*replicated, tokens, mask, selected)
        metrics = {name: lax.psum(value, axis) for name, value in sums.items()}
        metrics.update({name: lax.pmax(value, axis) for name, value in maxima.items()})
        return lax.psum(grad_sum, axis), metrics

    # check_vma=False: each device differentiates its own units' losses; with check_vma the transpose of the
    # implicit pvary of the replicated parameters would psum every microbatch's gradient inside the loop, whose
    # trip count differs between devices. The only collectives are the explicit ones above.
    units = PartitionSpec(axis)
    return jax.shard_map(
        program,
        mesh=mesh,
        in_specs=(PartitionSpec(), units, units, units),
        out_specs=(PartitionSpec(), PartitionSpec()),
        check_vma=False,
    )(replicated, tokens, mask, selected)
