"""Progress on stderr for long runs: one protocol, one printer.

Long work (simulations, snapshot generation, training, attack suites) reports
through a :class:`Progress`: timestamped lines (``log("message")``) and counters
(``log.bar(done, total, label)``). :class:`RunLog` is the printer; with
``enabled=False`` it is silent, so library code never tests a flag.
:class:`Counter` is the rate-limited single-line bar both use for counts.
"""

from __future__ import annotations

import sys
import time
from typing import Protocol, runtime_checkable

from snapaudit_jax.utils.secrets import redact

__all__ = ["Counter", "Progress", "RunLog"]


@runtime_checkable
class Progress(Protocol):
    """What long-running code may call to report progress (a runtime-checkable protocol)."""

    def __call__(self, message: str) -> None:
        """Reports one line (a stage starting or ending).

        Args:
          message: the line, without a newline.
        """

    def bar(self, done: int, total: int, label: str, unit: str = "items") -> None:
        """Reports ``done`` of ``total`` ``unit`` for ``label``; the last call has ``done >= total``.

        Args:
          done: the count so far.
          total: the count at completion.
          label: what is counted (one counter per label).
          unit: the counted things (``"trials"``, ``"prompts"``).
        """


class Counter:
    """A rate-limited ``label [####  ] 42.0% 420/1,000 unit 1,234/s`` line on stderr.

    Attributes:
      label: what is counted (printed first).
      total: the count at completion.
      enabled: ``False`` prints nothing.
      unit: the counted things.
      every_s: at most one update per this many seconds, except the final one.
      start: :func:`time.perf_counter` at construction (for the rate).
      last: time of the last update (-1 before the first).
    """

    def __init__(self, label: str, total: int, enabled: bool = True, *, unit: str = "items",
                 every_s: float = 0.5):
        """Starts the counter's clock.

        Args:
          label: what is counted (printed first).
          total: the count at completion.
          enabled: ``False`` prints nothing.
          unit: the counted things (``"trials"``, ``"prompts"``).
          every_s: at most one update per this many seconds, except the final one.
        """
        self.label, self.total, self.enabled, self.unit, self.every_s = label, total, enabled, unit, every_s
        self.start = time.perf_counter()
        self.last = -1.0

    def update(self, done: int) -> None:
        """Shows ``done`` of :attr:`total`: always at completion (ending the line), else at most every ``every_s``.

        Args:
          done: the count so far.
        """
        if not self.enabled:
            return
        now = time.perf_counter()
        if done < self.total and now - self.last < self.every_s:
            return
        self.last = now
        frac = done / max(self.total, 1)
        bar = "#" * int(30 * frac)
        rate = done / max(now - self.start, 1e-9)
        end = "\n" if done >= self.total else ""
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {100 * frac:5.1f}% {done:,}/{self.total:,} {self.unit} "
                         f"{rate:,.0f}/s{end}")
        sys.stderr.flush()


class RunLog:
    """The :class:`Progress` printer of the command-line runs: timestamped lines and counters on stderr.

    Attributes:
      enabled: ``False`` makes every call a no-op.
      start: :func:`time.perf_counter` at construction (lines show the seconds since).
      clock: lines show the seconds since ``start`` (``False``: no times, for runs whose duration is private).
    """

    def __init__(self, enabled: bool, *, clock: bool = True):
        """Starts the run's clock.

        Args:
          enabled: ``False`` makes every call a no-op.
          clock: prefix lines with the elapsed seconds.
        """
        self.enabled = enabled
        self.clock = clock
        self.start = time.perf_counter()
        self._counters: dict[str, Counter] = {}

    def __call__(self, message: str) -> None:
        """Writes ``[elapsed s] message`` (``message`` without a clock) to stderr, secrets redacted
        (:func:`snapaudit_jax.utils.secrets.redact`).

        Args:
          message: the line, without a newline.
        """
        if self.enabled:
            stamp = f"[{time.perf_counter() - self.start:7.1f}s] " if self.clock else ""
            sys.stderr.write(f"{stamp}{redact(message)}\n")
            sys.stderr.flush()

    def bar(self, done: int, total: int, label: str, unit: str = "new prompts") -> None:
        """Updates the counter of ``label`` (one :class:`Counter` per label and total; removed when complete).

        Args:
          done: the count so far.
          total: the count at completion.
          label: what is counted.
          unit: the counted things (default ``"new prompts"``).
        """
        if not self.enabled:
            return
        counter = self._counters.get(label)
        if counter is None or counter.total != total:
            counter = self._counters[label] = Counter(f"    {label}", total, unit=unit)
        counter.update(done)
        if done >= total:
            self._counters.pop(label, None)
