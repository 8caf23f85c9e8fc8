"""Helpers shared by the benchmark scripts (run as ``python benchmarks/bench_*.py``: this folder is on the path).

Its helpers import jax when they are called, so a script can check its flags before JAX loads; import jax (or
call a helper) only after any environment variable the script sets for XLA.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from typing import NamedTuple

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CLIPPING_PATHS = ("per_record", "book_keeping", "ghost")  # DPSGDConfig.clipping's paths ("auto" takes one of them)


def machine_info() -> dict:
    """Where a benchmark ran: load at start, CPUs, platform, Python, jax version, backend and device count."""
    import jax

    return {
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "jax_version": jax.__version__,
        "jax_backend": jax.default_backend(),
        "jax_devices": len(jax.devices()),
    }


class CompileCounter:
    """Counts XLA backend compilations and their seconds while active (a context manager)."""

    def __init__(self):
        self.count, self.seconds = 0, 0.0

    def _listen(self, event: str, duration: float, **kwargs) -> None:
        if event == COMPILE_EVENT:
            self.count += 1
            self.seconds += duration

    def __enter__(self):
        import jax

        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc):
        import jax

        jax.monitoring.unregister_event_duration_listener(self._listen)


def int_at_least(minimum: int, maximum: int | None = None):
    """An argparse type: an integer in ``[minimum, maximum]``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
            raise argparse.ArgumentTypeError(f"must be an integer {bound}, got {text}")
        return value

    return parse


def number_at_least(minimum: float, *, strict: bool = False):
    """An argparse type: a finite number ``>= minimum`` (``> minimum`` where ``strict``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value > minimum if strict else value >= minimum)):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {minimum:g}, "
                                             f"got {text}")
        return value

    return parse


def sweep_batches(parser: argparse.ArgumentParser, text: str, records: int) -> list[int]:
    """The sorted distinct expected batches of ``--sweep-batches`` (``""``: none), each in ``[1, records]``; a bad
    value exits through ``parser.error`` naming the flag."""
    try:
        batches = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        parser.error(f"--sweep-batches must be integers >= 1, comma-separated, got {text!r}")
    if batches and not 1 <= batches[0] <= batches[-1] <= records:
        parser.error(f"--sweep-batches must be integers from 1 to --records ({records}), got "
                     f"{','.join(map(str, batches))}")
    return batches


def rotate_steps(steps: dict, repeats: int) -> tuple[dict, int]:
    """Times ``steps[name](t)`` for ``t = 1 .. repeats``, every name once per ``t``, the order rotating from step to
    step (no variant always follows the same one).

    Returns:
      ``({name: [wall seconds per step]}, XLA compilations during the timed steps)``.
    """
    names = list(steps)
    wall = {name: [] for name in names}
    with CompileCounter() as compiles:
        for t in range(1, repeats + 1):
            shift = (t - 1) % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                steps[name](t)
                wall[name].append(time.perf_counter() - start)
    return wall, compiles.count


class Progress:
    """Where a long run is: one line per phase on standard error, after the seconds since the run began (standard
    output keeps the table or the JSON alone)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        print(f"[{time.perf_counter() - self.start:7.1f} s] {message}", file=sys.stderr, flush=True)


def paired_ratio(wall: dict, a: str, b: str) -> float:
    """The median over steps of ``a``'s step time over ``b``'s on the same step (3 decimals)."""
    import statistics

    return round(statistics.median(x / y for x, y in zip(wall[a], wall[b])), 3)


def timed(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), wall seconds)``, waiting for any JAX arrays in the result."""
    start = time.perf_counter()
    import jax

    out = jax.block_until_ready(fn(*args, **kwargs))
    return out, time.perf_counter() - start


class Alternation(NamedTuple):
    """What :func:`alternate` measured."""

    outs: dict  # last output of each implementation
    seconds: dict  # name -> wall seconds of each timed call
    cpu: dict  # name -> process CPU time / wall time over the timed calls (at most the core count)
    first: dict  # name -> {"first_call_seconds", "compile_seconds", "compiles"} of the warm-up call
    compiles_timed: int  # XLA compilations during the timed calls (expected 0)


def alternate(fns: dict, repeats: int) -> Alternation:
    """Warms each ``fn`` up once, then calls them in turn ``repeats`` times (so load drifts hit all alike)."""
    outs, first = {}, {}
    for name, fn in fns.items():
        with CompileCounter() as compiles:
            outs[name], s = timed(fn)
        first[name] = {"first_call_seconds": round(s, 4), "compile_seconds": round(compiles.seconds, 4),
                       "compiles": compiles.count}
    seconds = {name: [] for name in fns}
    cpu = dict.fromkeys(fns, 0.0)
    with CompileCounter() as compiles:
        for _ in range(repeats):
            for name, fn in fns.items():
                cpu0 = time.process_time()
                outs[name], s = timed(fn)
                cpu[name] += time.process_time() - cpu0
                seconds[name].append(s)
    return Alternation(outs, seconds, {k: round(cpu[k] / sum(seconds[k]), 2) for k in fns}, first, compiles.count)


# ---------------------------------------------------------------------------
# Memory: the peak RSS of one call
# ---------------------------------------------------------------------------


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def measured(fn) -> tuple[float, float, float | None]:
    """``(wall seconds, process CPU seconds, peak RSS rise in MB or None)`` of ``fn()``."""
    reset = _reset_peak()
    rss0 = _status_kb("VmRSS") if reset else None
    start, cpu0 = time.perf_counter(), time.process_time()
    fn()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    hwm = _status_kb("VmHWM") if reset else None
    rise = None if rss0 is None or hwm is None else (hwm - rss0) / 1024.0
    return wall, cpu, rise
