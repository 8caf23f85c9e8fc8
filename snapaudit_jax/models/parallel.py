"""Data parallelism for model inference: batch rows split over the local devices.

Parameters are replicated once; each batch is padded to a multiple of the
device count and its rows are split along the batch axis, so every device
runs the same program on its share (on a multi-core CPU with one XLA host
device per core this also parallelises the element-wise work that a single
device runs on one thread). With one device everything is a no-op.

On CPU the "devices" share the host's memory, so every replica is another
copy of the weights in RAM: :meth:`DataParallel.auto` only replicates there
while all copies together stay under :data:`CPU_REPLICA_BYTES`.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from snapaudit_jax.utils.errors import InputError

__all__ = ["DataParallel", "CPU_REPLICA_BYTES"]

CPU_REPLICA_BYTES = 2 << 30  # all CPU replicas of a model's weights together


class DataParallel:
    """Places parameters (replicated) and batches (rows split) on ``devices``.

    Args:
      devices: the devices to use; default all local devices of the default backend.

    Attributes:
      size: the number of devices.

    Raises:
      InputError: ``devices`` is empty.
    """

    def __init__(self, devices=None):
        """Builds the one-axis ``("batch",)`` mesh over ``devices`` (nothing with one device).

        Args:
          devices: see :class:`DataParallel`.

        Raises:
          InputError: ``devices`` is empty.
        """
        devices = list(jax.local_devices() if devices is None else devices)
        if not devices:
            raise InputError("devices must not be empty")
        self.size = len(devices)
        self._rows = self._replicated = None
        if self.size > 1:
            mesh = Mesh(np.asarray(devices), ("batch",), axis_types=(AxisType.Auto,))
            self._rows = NamedSharding(mesh, PartitionSpec("batch"))
            self._replicated = NamedSharding(mesh, PartitionSpec())

    @classmethod
    def auto(cls, params, enabled: bool | None = None) -> "DataParallel":
        """Data parallelism for a model with parameters ``params``.

        Args:
          params: the parameter pytree (only its size is read).
          enabled: ``True`` uses every local device, ``False`` one device; ``None`` uses every device, except on
            CPU when the replicas of the weights would exceed :data:`CPU_REPLICA_BYTES` of host memory.

        Returns:
          The :class:`DataParallel`.
        """
        devices = jax.local_devices()
        if enabled is None and devices[0].platform == "cpu":
            size = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(params))
            enabled = size * len(devices) <= CPU_REPLICA_BYTES
        return cls(devices if enabled or enabled is None else devices[:1])

    def batch_size(self, rows: int) -> int:
        """A batch size the devices share evenly.

        Args:
          rows: rows needed.

        Returns:
          ``rows`` rounded up to a multiple of the device count.
        """
        return -(-rows // self.size) * self.size

    def replicate(self, tree):
        """A copy of ``tree`` on every device (unchanged with one device).

        Args:
          tree: a pytree of arrays (the parameters).

        Returns:
          The replicated pytree.
        """
        return tree if self._replicated is None else jax.device_put(tree, self._replicated)

    def split(self, *arrays):
        """Arrays whose leading (batch) axis is split over the devices.

        Args:
          *arrays: arrays whose leading axis is a multiple of ``size`` (see :meth:`batch_size`).

        Returns:
          A tuple of the placed arrays (the inputs unchanged with one device).
        """
        if self._rows is None:
            return arrays
        return tuple(jax.device_put(a, self._rows) for a in arrays)
