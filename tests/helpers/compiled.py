"""Bounds what compiled XLA programs a test process keeps (hooks registered by ``tests/conftest.py``).

Every program XLA:CPU compiles is loaded into memory maps of its own (about three: code, read-only data,
data), and jax's caches keep each program, and so its maps, for the life of the process. Linux refuses a
process more maps than ``vm.max_map_count`` (65530 by default); past it an ``mmap`` fails and XLA, which does
not expect that, dies of a segmentation fault wherever it happens to be. One worker of the whole suite compiles
about 20,000 programs: in a clean-clone run of 2026-12-06 a worker reached 65,368 maps and died in a compile
(earlier runs lost workers in the persistent compilation cache's serialisation, and pytest-xdist hung on them).

So a test process lets go of its compiled programs (:func:`jax.clear_caches`) after any test that leaves it
holding more than :data:`MAPS_FRACTION` of its limit: a worker of the whole suite does so a few times a run, and
the tests after it compile again what they use. (Letting go after every test module instead cost the fast tier
a third more time, 4 min against 3, in programs that later modules compile again.)
"""

from __future__ import annotations

import functools
import gc
import os

import pytest

#: The share of ``vm.max_map_count`` past which the process lets go of its compiled programs after a test.
MAPS_FRACTION = 0.5
_MAPS = "/proc/self/maps"
_LIMIT = "/proc/sys/vm/max_map_count"


def map_count() -> int | None:
    """The memory maps this process holds now.

    Returns:
      The number of lines of ``/proc/self/maps``, or ``None`` where there is no such file (not Linux).
    """
    if not os.path.exists(_MAPS):
        return None
    with open(_MAPS, "rb") as maps:
        return sum(1 for _ in maps)


@functools.cache
def map_limit() -> int | None:
    """The most memory maps the kernel gives a process (read once).

    Returns:
      ``vm.max_map_count``, or ``None`` where it cannot be read (not Linux).
    """
    try:
        with open(_LIMIT) as limit:
            return int(limit.read().strip())
    except (OSError, ValueError):
        return None


def release_compiled() -> None:
    """Drops jax's caches of traced and compiled functions and collects the garbage, so their programs unload."""
    import jax

    jax.clear_caches()
    gc.collect()


def over_share(count: int | None, limit: int | None, fraction: float = MAPS_FRACTION) -> bool:
    """Whether ``count`` maps exceed ``fraction`` of ``limit`` (``False`` where either is unknown).

    Args:
      count: the maps held (:func:`map_count`).
      limit: the most maps allowed (:func:`map_limit`).
      fraction: the share of ``limit`` allowed.

    Returns:
      ``count > fraction * limit``, or ``False`` if ``count`` or ``limit`` is ``None``.
    """
    return count is not None and limit is not None and count > fraction * limit


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After a test's teardown, lets go of the compiled programs if the process holds more than
    :data:`MAPS_FRACTION` of its maps."""
    result = yield
    if over_share(map_count(), map_limit(), MAPS_FRACTION):
        release_compiled()
    return result
