"""What the user guide (``docs/``) says a command writes, read from the page so that tests compare it with what the
command writes."""

from __future__ import annotations

import re

from tests.helpers.paths import ROOT

_QUOTED = re.compile(r'"[^"]*"')
_NAME = re.compile(r"\b[a-z][a-z0-9_]*\b")


def documented_keys(page: str, start: str, end: str) -> set[str]:
    """The key names a guide page lists between two phrases: every bare name inside the backquoted spans there
    (quoted strings, e.g. a key's values, and the JSON literals ``null``, ``true``, ``false`` left out).

    Args:
      page: the page's file name under ``docs/`` (``"pii.md"``).
      start: the phrase that opens the list (its first occurrence on the page).
      end: the phrase that closes it (the first occurrence after ``start``).

    Returns:
      The names.

    Raises:
      AssertionError: a phrase is not on the page, or no name lies between them.
    """
    text = (ROOT / "docs" / page).read_text()
    assert start in text, f"docs/{page}: {start!r} not found"
    tail = text[text.index(start) + len(start):]
    assert end in tail, f"docs/{page}: {end!r} not found after {start!r}"
    spans = re.findall(r"`([^`]*)`", tail[:tail.index(end)])
    names = {name for span in spans for name in _NAME.findall(_QUOTED.sub("", span))} - {"null", "true", "false"}
    assert names, f"docs/{page}: no key between {start!r} and {end!r}"
    return names
