"""Memory planning: refuse a size that cannot fit before anything is allocated.

Where a size is known before the work (trials, snapshots, dimensions, vocabularies, layers, the arrays of an
``.npz`` file read from its zip header), the caller estimates the bytes the work would allocate -- a coarse but
honest *lower bound* -- and :func:`check_fits` compares it with the memory this process can still get
(:func:`available_bytes`): ``MemAvailable`` of ``/proc/meminfo`` (what the kernel can hand out without
swapping), lowered by a cgroup memory limit when one is set, else the physical memory. A refusal is an
:class:`~snapaudit_jax.utils.errors.InputError` naming the field, the estimate and the limit, instead of a
``MemoryError`` traceback, an allocator abort or hours of swapping.
"""

from __future__ import annotations

import os

from snapaudit_jax.utils.errors import InputError

__all__ = ["available_bytes", "check_fits", "format_bytes"]

_MEMINFO = "/proc/meminfo"
# cgroup v2, then v1: (limit file, usage file) of the cgroup this process runs in, as a container sees them.
_CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def _read_int(path: str) -> int | None:
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _meminfo_available() -> int | None:
    try:
        with open(_MEMINFO) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _physical() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_bytes() -> int | None:
    """The memory this process can still allocate, in bytes.

    ``MemAvailable`` from ``/proc/meminfo`` (else the physical memory, ``SC_PHYS_PAGES`` pages), lowered to a
    cgroup's free share (``memory.max - memory.current``) when the process runs under a smaller limit.

    Returns:
      The bytes, or ``None`` when the platform tells neither (then nothing is refused).
    """
    found = _meminfo_available()
    if found is None:
        found = _physical()
    for limit_file, usage_file in _CGROUP_FILES:
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and (found is None or limit - usage < found):
            found = max(0, limit - usage)
            break
    return found


def format_bytes(n: float) -> str:
    """A byte count in binary units: ``format_bytes(3 * 2**30) == "3.0 GiB"``.

    Args:
      n: the number of bytes (>= 0).

    Returns:
      The count with a unit of B, KiB, MiB, GiB, TiB, PiB or EiB.
    """
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024.0:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return f"{n:.1f} EiB"


def check_fits(field: str, bytes_needed: float, what: str) -> None:
    """Refuses a planned allocation larger than :func:`available_bytes`, before it is made.

    Args:
      field: the flag or ``section.key`` whose value sets the size (named in the error).
      bytes_needed: a lower bound of the bytes the work would allocate.
      what: what the bytes are for, with the sizes behind the estimate (e.g. ``"2 x 10^10 snapshots of 2 float64
        values"``).

    Raises:
      InputError: ``bytes_needed`` exceeds the memory available (the message gives the estimate and the limit).
    """
    limit = available_bytes()
    if limit is not None and bytes_needed > limit:
        raise InputError(f"{field}: {what} would need at least {format_bytes(bytes_needed)} of memory, but this "
                         f"machine has {format_bytes(limit)} available; lower it")
