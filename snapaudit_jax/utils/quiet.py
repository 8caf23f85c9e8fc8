"""``--quiet`` for the libraries too: nothing they print reaches the terminal while a run works.

With ``--quiet`` the project's own progress (:class:`~snapaudit_jax.utils.progress.RunLog`) is off, so anything
still written to ``sys.stdout`` / ``sys.stderr`` during a run comes from a library: progress bars (tqdm, as used
by ``datasets`` and ``huggingface_hub``), Python warnings, log records (``datasets``, ``transformers``, JAX's
platform messages, matplotlib's "building the font cache"). :func:`quiet_libraries` silences all of them for the
duration of a ``with`` block. The command line prints the report and any error after the block, so they are
unaffected.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator

__all__ = ["quiet_libraries"]


class _Discard(io.TextIOBase):
    """A text stream that accepts and drops everything (no file descriptor, like a captured stream)."""

    encoding = "utf-8"

    def writable(self) -> bool:
        """Always ``True``."""
        return True

    def write(self, text: str) -> int:
        """Drops ``text``.

        Args:
          text: what a library wrote.

        Returns:
          ``len(text)``, as if written.
        """
        return len(text)


_SINK = _Discard()  # never closed: a log handler created inside the block keeps writing to it, harmlessly


@contextlib.contextmanager
def quiet_libraries(enabled: bool = True) -> Iterator[None]:
    """Silences what libraries print, inside a ``with`` block.

    While enabled: ``sys.stdout`` and ``sys.stderr`` are replaced by a sink that drops what is written (progress
    bars, warnings, prints, log handlers that look ``sys.stderr`` up when they write or are created inside the
    block), warnings are ignored, and logging is disabled at every level (handlers that libraries bound to the
    real stderr before the block). Everything is restored on exit, also when the block raises.

    Args:
      enabled: ``False`` makes the block a no-op (a run without ``--quiet``).

    Yields:
      Nothing; the block runs silenced.

    Guarantees:
      Python-level output only: what a native library writes to file descriptor 2 itself (none of the commands'
      libraries does so in a normal run) is not intercepted. A log handler a library creates inside the block
      keeps the sink as its stream for the rest of the process.
    """
    if not enabled:
        yield
        return
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(_SINK), contextlib.redirect_stderr(_SINK):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)
