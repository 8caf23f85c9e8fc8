"""The transport to an OpenAI-compatible model server (:class:`OpenAIClient`): bounded concurrency, a deadline on
each whole attempt, bodies read in chunks and bounded by :data:`MAX_BODY_BYTES`, retries with backoff and full
jitter bounded in count and time, no proxy, no redirect (:mod:`snapaudit_jax.models.server`)."""

from __future__ import annotations

import concurrent.futures
import email.utils
import http.client
import io
import json
import os
import random
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from snapaudit_jax.models.server_config import RETRY_STATUS, ServerConfig
from snapaudit_jax.utils.errors import InputError, ServerError
from snapaudit_jax.utils.secrets import register

__all__ = ["MAX_BODY_BYTES", "OpenAIClient"]

# The largest answer body read. A label-scoring echo answer costs about 120 bytes per echoed token (the token,
# its log-probability, a top-1 entry and an offset; measured on vLLM's format), so 64 MiB holds some 550,000
# echoed tokens -- e.g. 14 labels on a 32,768-token prompt, or 1,000 labels on a 500-token one -- far above
# what an audit asks for;
# decoding the JSON holds several times the body in memory. A larger body is a fault (or a proxy's error
# page streamed for ever) and is refused without being read to its end.
MAX_BODY_BYTES = 64 * 2 ** 20
_CHUNK = 2 ** 16  # bytes read from the socket at a time, each read against the attempt's deadline


def _retry_after(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta seconds or an HTTP date), ``None`` if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


# --- one attempt against a deadline -----------------------------------------------------------------------------
class _DeadlineExceeded(TimeoutError):
    """The attempt's deadline passed before the answer was complete."""


class _TooLarge(Exception):
    """A body over :data:`MAX_BODY_BYTES` (declared or read so far)."""

    def __init__(self, size: int, how: str):
        super().__init__(f"a body of {size} bytes ({how})")


class _DeadlineSocket:
    """A connected socket whose every send and receive gets the time left before ``deadline`` as its timeout,
    so that a server trickling its headers or body cannot stretch one attempt past the deadline.

    ``close`` leaves the socket open: http.client closes its connection as soon as a response that ends with the
    connection's close begins, and reads that response from the socket afterwards; the attempt that owns the
    socket closes it (:meth:`_DeadlineHTTPConnection.release`).
    """

    def __init__(self, sock, deadline: float):
        self._sock = sock
        self._deadline = deadline

    def _arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:  # never settimeout(0): that is non-blocking mode, not an expired deadline
            raise _DeadlineExceeded("the deadline passed")
        self._sock.settimeout(left)

    def sendall(self, data, *args):
        self._arm()
        return self._sock.sendall(data, *args)

    def recv_into(self, buffer, *args):
        self._arm()
        return self._sock.recv_into(buffer, *args)

    def makefile(self, mode="rb", *args, **kwargs):
        return io.BufferedReader(_DeadlineReader(self))

    def close(self):
        pass

    def __getattr__(self, name):
        return getattr(self._sock, name)


class _DeadlineReader(io.RawIOBase):
    """The raw stream http.client reads a response from: each read is one ``recv_into`` against the deadline."""

    def __init__(self, sock: _DeadlineSocket):
        super().__init__()
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._sock.recv_into(buffer)


class _DeadlineHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection whose connect, send and every receive end by ``deadline`` (``time.monotonic()``)."""

    def __init__(self, host: str, port: int, deadline: float, **kwargs):
        self._deadline = deadline
        super().__init__(host, port, timeout=max(deadline - time.monotonic(), 1e-3), **kwargs)

    def connect(self):
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise _DeadlineExceeded("the deadline passed before connecting")
        self.timeout = left  # the TCP connect (and a TLS handshake) get the time left
        super().connect()
        self._owned = self.sock
        self.sock = _DeadlineSocket(self.sock, self._deadline)

    def release(self) -> None:
        """Closes the connection and its socket."""
        self.close()
        owned = getattr(self, "_owned", None)
        if owned is not None:
            owned.close()
            self._owned = None


class _DeadlineHTTPSConnection(_DeadlineHTTPConnection, http.client.HTTPSConnection):
    """The HTTPS twin of :class:`_DeadlineHTTPConnection` (certificates verified by the default context)."""


def _body_error(raw: bytes, reason: str) -> str:
    """The server's error text (OpenAI ``{"error": {"message"}}`` or the raw body), shortened."""
    text = raw.decode(errors="replace").strip()
    try:
        body = json.loads(text)
        if isinstance(body, dict):
            e = body.get("error", body)
            text = str(e.get("message", e) if isinstance(e, dict) else e)
    except json.JSONDecodeError:
        pass
    return (text or reason or "no message")[:300]


class OpenAIClient:
    """JSON over HTTP to an OpenAI-compatible server, with deadlines, bounded retries and bounded concurrency.

    Args:
      config: the :class:`ServerConfig`.
      sleep: the delay function between attempts (tests pass a recorder).
      seed: seed of the backoff jitter.

    Attributes:
      config: the configuration.
      attempts: HTTP attempts made, retries included.
      retries: attempts that were retries.
      delays: the delay slept before each retry, in seconds.

    Raises:
      InputError: ``config.api_key_env`` names a variable that is not set.
    """

    def __init__(self, config: ServerConfig, *, sleep: Callable[[float], None] = time.sleep, seed: int = 0):
        """Reads the API key from the environment (kept in the request headers only).

        Args:
          config: see :class:`OpenAIClient`.
          sleep: see :class:`OpenAIClient`.
          seed: see :class:`OpenAIClient`.
        """
        self.config = config
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._headers = {"Content-Type": "application/json", "Accept": "application/json", "Connection": "close"}
        if config.api_key_env is not None:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise InputError(f"{config.section}.api_key_env names {config.api_key_env!r}, which is not set in "
                                 "the environment")
            register(key)  # redacted from every message, log line and JSON file from here on
            self._headers["Authorization"] = f"Bearer {key}"
        parts = urllib.parse.urlsplit(config.api_root)
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path
        self.attempts = 0
        self.retries = 0
        self.delays: list[float] = []
        self._lock = threading.Lock()  # the counters and the jitter generator are shared by the worker threads

    def _delay(self, retry: int, retry_after: float | None) -> float:
        cap = min(self.config.max_backoff_s, self.config.backoff_s * 2 ** retry)
        with self._lock:
            delay = self._rng.uniform(0.0, cap)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.config.max_backoff_s))
        return delay

    def _attempt(self, method: str, path: str, data: bytes | None, deadline: float):
        """One HTTP exchange ending by ``deadline``: ``(status, reason, headers, body)``.

        Raises ``_DeadlineExceeded``/``TimeoutError`` past the deadline, ``_TooLarge`` for a body over
        :data:`MAX_BODY_BYTES`, ``http.client.IncompleteRead`` for a body shorter than its ``Content-Length``,
        and the socket's ``OSError`` / ``http.client.HTTPException`` for anything else.
        """
        cls = _DeadlineHTTPSConnection if self._https else _DeadlineHTTPConnection
        conn = cls(self._host, self._port, deadline)
        try:
            conn.request(method, path, body=data, headers=self._headers)
            resp = conn.getresponse()
            declared = resp.length  # None: chunked or delimited by the connection's close
            if declared is not None and declared > MAX_BODY_BYTES:
                raise _TooLarge(declared, "its Content-Length")
            chunks, size = [], 0
            while True:
                chunk = resp.read(_CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise _TooLarge(size, "counted as read, without a Content-Length")
                chunks.append(chunk)
            raw = b"".join(chunks)
            if declared is not None and size < declared:
                raise http.client.IncompleteRead(raw, declared - size)
            return resp.status, resp.reason, resp.headers, raw
        finally:
            conn.release()

    def request(self, path: str, body: dict | None = None, *, what: str) -> Any:
        """One JSON request: ``GET path`` when ``body`` is ``None``, else ``POST`` of ``body``; retried as configured.

        Each attempt must be complete -- connected, sent, headers and body read -- within ``timeout_s``; a
        retry is made after a timeout, a refused, reset or truncated connection, a body that is not JSON, 429
        or 5xx, at most ``max_retries`` times and only while it can finish within :attr:`ServerConfig.budget_s`
        of the request's start.

        Args:
          path: the endpoint under ``/v1`` (``"/completions"``).
          body: the JSON body, or ``None`` for a GET.
          what: the request's description in error messages (``"label log-probs of prompt 3"``).

        Returns:
          The decoded JSON answer.

        Raises:
          ServerError: a non-retryable status (the server's message included), a body over
            :data:`MAX_BODY_BYTES`, a certificate that fails verification, or the retries or the budget exhausted
            (the last failure named).
        """
        cfg = self.config
        url = cfg.api_root + path
        data = None if body is None else json.dumps(body).encode()
        method = "GET" if body is None else "POST"
        budget_end = time.monotonic() + cfg.budget_s
        last, made = "", 0
        for attempt in range(cfg.max_retries + 1):
            retry_after = None
            made += 1
            with self._lock:
                self.attempts += 1
            try:
                status, reason, headers, raw = self._attempt(method, self._prefix + path, data,
                                                             time.monotonic() + cfg.timeout_s)
            except _TooLarge as err:
                raise ServerError(f"{what}: {url} answered {err}, more than the {MAX_BODY_BYTES} bytes "
                                  "(MAX_BODY_BYTES) an answer may hold; refused without reading it") from None
            except ssl.SSLCertVerificationError as err:
                raise ServerError(f"{what}: {url}: the server's TLS certificate fails verification "
                                  f"({err.verify_message or err})") from None
            except TimeoutError:  # _DeadlineExceeded, or a socket operation's timeout (the time left)
                last = (f"no complete answer within {cfg.section}.timeout_s = {cfg.timeout_s:g} s (connect, "
                        "headers and body)")
            except (OSError, http.client.HTTPException) as err:
                last = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            else:
                if 200 <= status < 300:
                    try:
                        return json.loads(raw)
                    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
                        last = f"malformed JSON body ({len(raw)} bytes: {err})"
                else:
                    message = _body_error(raw, reason)
                    if status not in RETRY_STATUS:
                        raise ServerError(f"{what}: {url} answered HTTP {status}: {message}")
                    last = f"HTTP {status}: {message}"
                    retry_after = _retry_after(headers.get("Retry-After"))
            if attempt == cfg.max_retries:
                break
            delay = self._delay(attempt, retry_after)
            if time.monotonic() + delay + cfg.timeout_s > budget_end:
                raise ServerError(f"{what}: {url} failed after {made} attempt{'s' if made > 1 else ''}; another "
                                  f"could not finish within the request's budget of {cfg.budget_s:g} s "
                                  f"({cfg.section}.request_budget_s); last: {last}")
            with self._lock:
                self.retries += 1
                self.delays.append(delay)
            self._sleep(delay)
        raise ServerError(f"{what}: {url} failed after {made} attempt{'s' if made > 1 else ''}; last: {last}")

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any],
            on_result: Callable[[int, Any], None] | None = None) -> list:
        """``[fn(x) for x in items]`` with at most ``max_concurrency`` calls in flight, in order.

        Args:
          fn: the call (typically one :meth:`request` per item).
          items: its arguments.
          on_result: called as ``on_result(i, result)`` in this thread as soon as item ``i`` is done (the answer
            cache stores each answer at once, so a killed run loses no finished call).

        Returns:
          The results in the order of ``items``.

        Raises:
          ServerError: the first failure of a call; calls not yet started are cancelled, those in flight finish
            (and reach ``on_result``) first.
        """
        items = list(items)
        results: list = [None] * len(items)
        if len(items) <= 1 or self.config.max_concurrency == 1:
            for i, x in enumerate(items):
                results[i] = fn(x)
                if on_result:
                    on_result(i, results[i])
            return results
        pool = concurrent.futures.ThreadPoolExecutor(self.config.max_concurrency)
        failure = None
        try:
            futures = {pool.submit(fn, x): i for i, x in enumerate(items)}
            for future in concurrent.futures.as_completed(futures):
                if future.cancelled():
                    continue
                err = future.exception()
                if err is not None:
                    if failure is None:
                        failure = err
                        for f in futures:
                            f.cancel()
                    continue
                i = futures[future]
                results[i] = future.result()
                if on_result:
                    on_result(i, results[i])
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if failure is not None:
            raise failure
        return results
