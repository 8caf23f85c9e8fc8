"""Helpers shared by the benchmark scripts (run as ``python benchmarks/bench_*.py``: this folder is on the path).

Import it after any environment variable a script sets for XLA: it imports jax.
"""

from __future__ import annotations

import argparse

import jax

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
    """Counts XLA backend compilations while active (a context manager)."""

    def __init__(self):
        self.count = 0

    def _listen(self, event: str, duration: float, **kwargs) -> None:
        if event == COMPILE_EVENT:
            self.count += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc):
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
