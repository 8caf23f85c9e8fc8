"""Data parallelism of the DP-SGD step over a 1-D device mesh.

The ``N`` units of the dataset are split over the mesh axis (``N`` padded up to a multiple ``N_pad`` of the
device count ``D`` with empty padding units, which are never selected); parameters, optimizer state and the
model's other state are replicated. Per step (:func:`~snapaudit_jax.dpsgd.train`):

1. the Poisson mask over all ``N`` units is the single-device one (same key, same stream), so the batch of a
   step does not depend on ``D``; padded with ``False`` to ``N_pad``, each device reads its
   ``N_pad / D`` entries;
2. each device compacts the selected units it holds and runs the microbatch loop over them (per-unit clipped
   gradients where the records live, microbatches of ``m`` units and the remainder's of ``t``, as on one
   device);
3. the clipped sums and the metrics are summed (``lax.psum``; ``lax.pmax`` for maxima) over the axis;
4. outside the per-device program, on the replicated sum: one Gaussian draw, the scaling and the optimizer
   update, replicated (the same computation and the same noise as on one device).

Only the order of the float32 summation differs from one device (``D`` partial sums added by the
all-reduce), so the parameters agree with the single-device run up to that rounding, and a run is
bit-for-bit reproducible for a fixed ``D``.

Several processes (hosts), after ``jax.distributed.initialize`` (on CPU with
``jax.config.update("jax_cpu_collectives_implementation", "gloo")``): the mesh holds the devices of every process
(an int ``D`` names ``jax.devices()[:D]``, which must reach every process), and every process calls
:func:`~snapaudit_jax.dpsgd.train` with the same model, dataset, configuration and key. Each process holds the
whole dataset and supplies the units of its own devices (``jax.make_array_from_callback``); the replicated
arrays are placed from every process's identical copy. The step is the same program, its all-reduce now also
across processes, so the math is that of ``D`` devices in one process, except the summation order: the
cross-process all-reduce (gloo) adds the partial sums in another order, so a run is bit-for-bit reproducible
for a fixed ``D`` *and* process count (measured on 4 CPU devices, 2 processes x 2 against 1 x 4: within 2.4e-7,
not bitwise). Host reads (metrics, checkpoints, the returned model) use this process's replica. A mesh of this
process's devices only is a process-local run, as with one process.
"""

from __future__ import annotations

import functools
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
    """``None``, or the 1-D mesh ``mesh`` names.

    One process: an int ``n`` names the first ``n`` local devices, and a mesh must hold local devices only. Several
    processes (``jax.process_count() > 1``, after ``jax.distributed.initialize``): an int ``n`` names the first
    ``n`` global devices (``jax.devices()[:n]``, process by process), and a mesh either holds devices of this
    process only (a process-local run, as with one process) or devices of every process (a multi-process run;
    every process must call :func:`~snapaudit_jax.dpsgd.train` with the same arguments). A mesh that leaves out
    some process but not all would make the others wait for it, and is refused.

    A :class:`jax.sharding.Mesh` is rebuilt over the same devices and axis name with an ``Auto`` axis type (the
    step places its arrays itself; ``jax.make_mesh`` defaults to ``Explicit`` axes).
    """
    if mesh is None:
        return None
    processes = jax.process_count()
    local = jax.local_devices()
    if isinstance(mesh, (int, np.integer)) and not isinstance(mesh, (bool, np.bool_)):
        pool = local if processes == 1 else jax.devices()
        n = int(mesh)
        if not 1 <= n <= len(pool):
            what = "local devices" if processes == 1 else f"global devices (of {processes} processes)"
            raise InputError(f"mesh must be a number of {what} in [1, {len(pool)}], got {mesh!r}")
        devices = pool[:n]
        if processes > 1:
            missing = sorted(set(range(processes)) - {d.process_index for d in devices})
            if missing:
                raise InputError(
                    f"mesh must be a number of global devices that gives every process at least one (the first "
                    f"{n} of jax.devices() leave processes {missing} without one), got {mesh!r}"
                )
        return jax.make_mesh((n,), (DEFAULT_AXIS,), axis_types=(AxisType.Auto,), devices=devices)
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
    if processes == 1:
        if len(devices) > len(local):
            raise InputError(f"mesh must have at most the {len(local)} local devices, got {len(devices)} devices")
        foreign = [d for d in devices if d not in local]
        if foreign:
            raise InputError(f"mesh must hold local devices only (this process's), got {foreign[0]!r}")
    else:
        owners = {d.process_index for d in devices}
        if owners != {jax.process_index()} and owners != set(range(processes)):
            raise InputError(
                f"mesh must hold devices of this process ({jax.process_index()}) only or of every process "
                f"(0..{processes - 1}), got devices of processes {sorted(owners)}"
            )
    return Mesh(np.asarray(devices), tuple(mesh.axis_names), axis_types=(AxisType.Auto,))


def _spans_processes(mesh: Mesh | None) -> bool:
    """Whether ``mesh`` holds devices of more than one process (a ``jax.distributed`` run)."""
    return mesh is not None and len({d.process_index for d in mesh.devices.flat}) > 1


def _axis(mesh: Mesh) -> str:
    return mesh.axis_names[0]


def _replicate(mesh: Mesh, tree):
    """A copy of ``tree`` on every device of ``mesh``.

    Over several processes every process passes the same values (the same data, model, key and checkpoint);
    typed PRNG keys are placed as their key data and rewrapped, since ``jax.device_put`` refuses them there.
    """
    sharding = NamedSharding(mesh, PartitionSpec())
    if not _spans_processes(mesh):
        return jax.device_put(tree, sharding)

    def place(leaf):
        if hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            impl = jax.random.key_impl(leaf)
            data = jax.device_put(np.asarray(jax.random.key_data(leaf)), sharding)
            return jax.jit(functools.partial(jax.random.wrap_key_data, impl=impl), out_shardings=sharding)(data)
        return jax.device_put(np.asarray(leaf), sharding)

    return jax.tree.map(place, tree)


def _to_local(tree):
    """``tree`` with every array that spans other processes' devices replaced by this process's copy.

    The arrays are replicated (parameters, optimizer state, metrics), so the copy on this process's first device
    of the mesh is the whole value; arrays this process holds entirely are returned as they are.
    """

    def local(leaf):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            if not leaf.is_fully_replicated:
                raise ValueError(f"expected a replicated array, got sharding {leaf.sharding}")  # internal use only
            return leaf.addressable_data(0)
        return leaf

    return jax.tree.map(local, tree)


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
    if not _spans_processes(mesh):
        return jax.device_put(tokens, sharding), jax.device_put(mask, sharding)
    # Every process holds the whole dataset and supplies the slices of its own devices.
    return tuple(jax.make_array_from_callback(a.shape, sharding, lambda index, a=a: a[index]) for a in (tokens, mask))


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
