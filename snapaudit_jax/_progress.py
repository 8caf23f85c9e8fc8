"""Progress lines of long command-line runs (stderr; silent when disabled)."""

from __future__ import annotations

import sys
import time

__all__ = ["RunLog"]


class RunLog:
    """Timestamped messages and a progress counter on stderr."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.enabled:
            sys.stderr.write(f"[{time.perf_counter() - self.start:7.1f}s] {message}\n")
            sys.stderr.flush()

    def bar(self, done: int, total: int, label: str) -> None:
        if self.enabled:
            end = "\n" if done >= total else ""
            sys.stderr.write(f"\r    {label}: {done}/{total} new prompts{end}")
            sys.stderr.flush()
