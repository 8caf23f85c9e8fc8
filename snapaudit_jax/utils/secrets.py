"""Secrets never printed: credentials are redacted from every message, log line and JSON file.

Two kinds of secret reach the program: a model server's API key (read from the environment variable the
configuration names, kept in the request headers) and credentials a user may paste into a URL (``user:pass@``,
or query parameters such as ``api_key``, ``token`` or ``key``). They are handled at the two places where text
leaves the program:

* :func:`register` records a secret's value once it is read (the server client does, for its key); every
  registered value (and its URL-encoded form) is replaced by ``***`` by :func:`redact`, which the command line's
  error printer, the run log and the JSON writer (:func:`snapaudit_jax.utils.io.dumps`) apply, so an error
  message that quotes a server's answer echoing the key, or a log line, cannot print it.
* :func:`redact_url` shows a URL with its user-info and every query value and fragment replaced by ``***``
  (parameter names kept), for messages that refuse a URL.

Values shorter than :data:`MIN_SECRET_LENGTH` characters are not registered: replacing them everywhere would
mangle ordinary text, and such a key is no secret.
"""

from __future__ import annotations

import threading
import urllib.parse

__all__ = ["MIN_SECRET_LENGTH", "MASK", "redact", "redact_url", "register"]

MIN_SECRET_LENGTH = 6
MASK = "***"

_SECRETS: set[str] = set()
_LOCK = threading.Lock()


def register(value: str | None) -> None:
    """Adds ``value`` to the secrets :func:`redact` removes (for the rest of the process).

    Args:
      value: the secret (an API key); ``None`` or a value under :data:`MIN_SECRET_LENGTH` characters is ignored.
    """
    if not isinstance(value, str) or len(value) < MIN_SECRET_LENGTH:
        return
    forms = {value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value)}
    with _LOCK:
        _SECRETS.update(f for f in forms if len(f) >= MIN_SECRET_LENGTH)


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by :data:`MASK`.

    Args:
      text: a message, log line or JSON string.

    Returns:
      The text, unchanged when no secret is registered or none occurs in it.
    """
    if not _SECRETS or not isinstance(text, str):
        return text
    with _LOCK:
        secrets = sorted(_SECRETS, key=len, reverse=True)  # a longer form first (a key and its encoded form)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact_url(url: object) -> str:
    """The ``repr`` of a URL for a message, with its credentials replaced by :data:`MASK`.

    User-info (``user:password@``) becomes ``***@``; each query parameter keeps its name and loses its value
    (``?api_key=***&model=***``); a fragment becomes ``#***``. Anything that is not a string is shown by ``repr``.

    Args:
      url: the URL as given.

    Returns:
      The quoted, redacted URL (``'https://***@host/v1?token=***'``).
    """
    if not isinstance(url, str):
        return repr(url)
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return repr(MASK)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rsplit("@", 1)[1]
    query = "&".join(f"{pair.split('=', 1)[0]}={MASK}" if "=" in pair else MASK
                     for pair in parts.query.split("&") if pair) if parts.query else ""
    fragment = MASK if parts.fragment else ""
    return repr(redact(urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, fragment))))
