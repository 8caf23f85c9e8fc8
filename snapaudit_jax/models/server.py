"""Phase A through an OpenAI-compatible model server (vLLM, TGI, llama.cpp, ``transformers serve``).

:class:`ServerLanguageModel` answers the calls :class:`~snapaudit_jax.models.oracle.LLMOracle` makes of a
:class:`~snapaudit_jax.models.lm.LanguageModel` -- greedy and sampled generation, label log-probabilities,
greedy-continuation checks -- over HTTP. Prompts are rendered and tokenised locally with the served model's
own tokenizer and sent to ``/v1/completions`` as token ids, so the server computes exactly the token sequence
our Flax backend would, and every log-probability is read at a known position:

* ``log P(label | prompt)``: one request per prompt holding ``prompt + label`` for every label, with
  ``echo``, ``max_tokens = 0`` and ``logprobs``: the sum of the echoed log-probabilities of the label's
  positions (vLLM's documented completions format: ``choices[i].logprobs.token_logprobs``);
* greedy continuation: the same echo request with ``logprobs = 1``; greedy decoding emits the continuation
  iff the top-1 token at every continuation position is the continuation's token;
* generation: ``max_tokens``, ``temperature = 0`` (greedy) or the temperature with a per-prompt ``seed``.

Answers are verified, never trusted. Every answer must name the configured model (``model``) and report the
``system_fingerprint`` the probe saw; the choices of a request of several prompts are matched by their
``index`` (a permutation of ``0..n-1``, else refused), and each choice's echoed prompt tokens must be the ids
sent (``token_id:N``) or this tokenizer's rendering of them (text tokens); a server that echoes no tokens gets
one prompt per request, so its choices cannot be confused. Any inconsistency is a :class:`ServerError` naming
the request, raised before the answer reaches the answer cache. The answer cache keys every answer by the
server's :attr:`ServerLanguageModel.identity` (base URL, served model id, and the model card's ``root`` and
the answers' ``system_fingerprint`` where the server reports them), so answers of one server are never reused
for another.

:class:`OpenAIClient` is the transport: bounded concurrency; a deadline of ``timeout_s`` on each whole attempt
(connect, request, headers and body, read in chunks against a monotonic clock), a body larger than
:data:`MAX_BODY_BYTES` refused without reading it; retries with exponential backoff and full jitter on
timeouts, refused or reset connections, truncated bodies, 429 and 5xx (honouring ``Retry-After``), bounded in
count (``max_retries``) and in total time (:attr:`ServerConfig.budget_s`); and an error naming the request for
anything else. Requests go to ``base_url`` directly: no environment proxy, no redirect followed. The API key is
read from the environment variable the configuration names; it is sent in the ``Authorization`` header only,
and no message, manifest or cache holds it. A base URL with embedded credentials is refused.

:func:`probe` checks the server up front (``/v1/models``, one tiny completion, one echo request of two prompts
with log-probs, optionally ``/v1/embeddings``) so that a missing capability or a misbehaving server is
reported before any output exists.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import email.utils
import hashlib
import http.client
import io
import json
import math
import os
import random
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from snapaudit_jax.models.lm import Generation, chat_prompt, prompt_ids
from snapaudit_jax.models.tokenizer import Tokenizer
from snapaudit_jax.utils.errors import InputError, ServerError
from snapaudit_jax.utils.secrets import redact_url, register

__all__ = ["Capabilities", "MAX_BODY_BYTES", "OpenAIClient", "ServerConfig", "ServerLanguageModel", "connect",
           "echoed_logprobs", "probe", "connect_configured", "server_from_table"]

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})

# The largest answer body read. A label-scoring echo answer costs about 120 bytes per echoed token (the token,
# its log-probability, a top-1 entry and an offset; measured on vLLM's format), so 64 MiB holds some 550,000
# echoed tokens -- e.g. 14 labels on a 32,768-token prompt, or 1,000 labels on a 500-token one -- far above
# what an audit asks for;
# decoding the JSON holds several times the body in memory. A larger body is a fault (or a proxy's error
# page streamed for ever) and is refused without being read to its end.
MAX_BODY_BYTES = 64 * 2 ** 20
_CHUNK = 2 ** 16  # bytes read from the socket at a time, each read against the attempt's deadline
_MAX_TIMEOUT_S = 3600.0  # one attempt (and one backoff) may take at most an hour
_MAX_BUDGET_S = 86400.0  # one request, retries included, at most a day
# What the default budget allows each attempt beyond its deadline: noticing it and closing the connection take a
# moment, longer on a loaded machine; without it, an attempt that ended a few milliseconds late denied the last
# retry that ``max_retries`` allows.
_OVERRUN_S = 1.0
_MAX_RETRIES = 100
_MAX_CONCURRENCY = 256


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """``[model.server]``: where the OpenAI-compatible server is and how to talk to it.

    Attributes:
      base_url: the server's root, e.g. ``http://127.0.0.1:8000`` (``/v1`` is appended unless present);
        ``http`` or ``https``; no credentials, query or fragment.
      model: the model id the server serves (one of ``/v1/models``); every answer must name it.
      api_key_env: name of the environment variable holding the API key (``None``: no key is sent).
      timeout_s: seconds one attempt of a request may take in all -- connect, send, headers and the whole
        body -- before it is abandoned (and retried); a finite number in ``(0, 3600]``.
      max_concurrency: requests in flight at once, an integer in ``[1, 256]``.
      max_retries: retries of one request after its first attempt, an integer in ``[0, 100]``.
      backoff_s: the first retry's delay cap; the cap doubles per retry, up to ``max_backoff_s``, and the delay
        is drawn uniformly below it (full jitter); in ``(0, 3600]``.
      max_backoff_s: the largest delay between two attempts (a longer ``Retry-After`` is honoured up to it);
        in ``(0, 3600]``.
      request_budget_s: the most seconds one request may take with all its attempts and delays (a retry is not
        started when it could not finish within it); ``None``: :attr:`budget_s`'s default. A finite number in
        ``[timeout_s, 86400]``.
      section: the configuration table these fields come from, named by every error (``model.server`` in
        ``snapaudit audit``, ``server`` in ``snapaudit cpa``); not part of the server's identity.
    """

    base_url: str
    model: str
    api_key_env: str | None = None
    timeout_s: float = 60.0
    max_concurrency: int = 4
    max_retries: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    request_budget_s: float | None = None
    section: str = dataclasses.field(default="model.server", compare=False, repr=False)

    def __post_init__(self):
        where = self.section
        if not isinstance(self.base_url, str) or not self.base_url:
            raise InputError(f"{where}.base_url must be a non-empty http(s) URL, got {redact_url(self.base_url)}")
        try:
            parts = urllib.parse.urlsplit(self.base_url)
        except ValueError as err:  # an invalid IPv6 literal, a bad port form
            raise InputError(f"{where}.base_url is not a URL ({err}), got {redact_url(self.base_url)}") from None
        if parts.username is not None or parts.password is not None:
            raise InputError(f"{where}.base_url must not embed credentials (user:password@host); put the API key in "
                             f"an environment variable and name it in {where}.api_key_env")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InputError(f"{where}.base_url must be an http:// or https:// URL with a host, got "
                             f"{redact_url(self.base_url)}")
        try:
            _ = parts.port
        except ValueError:
            raise InputError(f"{where}.base_url must have a port in [0, 65535], got {redact_url(self.base_url)}") \
                from None
        if parts.query or parts.fragment:
            raise InputError(f"{where}.base_url must have no query or fragment (a credential there would travel in "
                             f"every request and log; name the key's variable in {where}.api_key_env), got "
                             f"{redact_url(self.base_url)}")
        if not isinstance(self.model, str) or not self.model:
            raise InputError(f"{where}.model must be the served model's id (a non-empty string), got {self.model!r}")
        if self.api_key_env is not None and (not isinstance(self.api_key_env, str) or not self.api_key_env):
            raise InputError(f"{where}.api_key_env must name an environment variable, got {self.api_key_env!r}")
        for name in ("timeout_s", "backoff_s", "max_backoff_s"):
            _seconds(where, name, getattr(self, name), 0.0, _MAX_TIMEOUT_S)
        for name, low, high in (("max_concurrency", 1, _MAX_CONCURRENCY), ("max_retries", 0, _MAX_RETRIES)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputError(f"{where}.{name} must be an integer in [{low}, {high}], got {value!r}")
            if value < low:
                raise InputError(f"{where}.{name} must be an integer >= {low}, got {value!r}")
            if value > high:
                raise InputError(f"{where}.{name} must be an integer <= {high}, got {value!r}")
        if self.request_budget_s is not None:
            _seconds(where, "request_budget_s", self.request_budget_s, 0.0, _MAX_BUDGET_S)
            if self.request_budget_s < self.timeout_s:
                raise InputError(f"{where}.request_budget_s must be >= {where}.timeout_s = {self.timeout_s:g} (one "
                                 f"attempt must fit), got {self.request_budget_s!r}")

    @property
    def api_root(self) -> str:
        """The URL requests are made under: ``base_url`` ending in ``/v1`` (no trailing slash)."""
        root = self.base_url.rstrip("/")
        return root if root.endswith("/v1") else root + "/v1"

    @property
    def budget_s(self) -> float:
        """Seconds one request may take with all its attempts and delays.

        ``request_budget_s`` when set; by default every attempt at its deadline, with a second more for ending
        it (``_OVERRUN_S``), plus the largest delays the backoff draws: ``(max_retries + 1) * (timeout_s + 1) +
        sum_r min(max_backoff_s, backoff_s * 2^r)`` over the ``max_retries`` retries, at most 86400 s; by default
        it binds only when a ``Retry-After`` asks for longer than the backoff's cap.
        """
        if self.request_budget_s is not None:
            return float(self.request_budget_s)
        delays = sum(min(self.max_backoff_s, self.backoff_s * 2 ** r) for r in range(self.max_retries))
        return min(_MAX_BUDGET_S, (self.max_retries + 1) * (self.timeout_s + _OVERRUN_S) + delays)

    def public(self) -> dict:
        """What a manifest may record of the server: ``{"base_url", "model"}`` (the URL holds no credentials).

        Returns:
          The two fields.
        """
        return {"base_url": self.base_url, "model": self.model}


def _seconds(where: str, name: str, value, low: float, high: float) -> None:
    """Refuses a duration that is not a finite number in ``(low, high]``, naming ``where.name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > low:
        raise InputError(f"{where}.{name} must be a number > {low:g}, got {value!r}")
    if not math.isfinite(value) or value > high:
        raise InputError(f"{where}.{name} must be a finite number of seconds <= {high:g}, got {value!r}")


def server_from_table(body: dict | None, where: str, needed_by: str) -> tuple[ServerConfig, str]:
    """A configuration file's server table -> ``(ServerConfig, tokenizer)``.

    The table holds the :class:`ServerConfig` fields users set (``base_url``, ``model``, ``api_key_env``,
    ``timeout_s``, ``max_concurrency``, ``max_retries``, ``request_budget_s``) and ``tokenizer``: the served
    model's tokenizer, read locally (``"smollm2"``, a ``.gguf`` file or a model folder), which renders and
    tokenises the prompts.

    Args:
      body: the parsed table (consumed), or ``None`` when the file has none.
      where: the table's name in the file (``model.server``, ``server``); every error names ``where.key``.
      needed_by: what asked for a server, for the message when the table is missing.

    Returns:
      The server's configuration and the tokenizer's name.

    Raises:
      ConfigFileError: a missing table or key, an unknown key, or a value :class:`ServerConfig` refuses.
    """
    from snapaudit_jax.utils.config import ConfigFileError, reject_unknown, string, take

    if body is None:
        raise ConfigFileError(f"{where}: {needed_by} needs a [{where}] table with base_url, model and tokenizer")
    if not isinstance(body, dict):
        raise ConfigFileError(f"{where}: must be a table, got {body!r}")
    for key in ("base_url", "model", "tokenizer"):
        if key not in body:
            raise ConfigFileError(f"{where}.{key}: required with {needed_by}")
    tokenizer = take(body, "tokenizer", where, string, None)
    fields = {f.name for f in dataclasses.fields(ServerConfig)} - {"backoff_s", "max_backoff_s", "section"}
    kw = {k: body.pop(k) for k in list(body) if k in fields}
    reject_unknown(body, where)
    try:
        return ServerConfig(**kw, section=where), tokenizer
    except InputError as err:
        raise ConfigFileError(str(err)) from None


def connect_configured(config: ServerConfig, tokenizer: str, *, needs: Sequence[tuple[str, str]] = (),
                       log: Callable[[str], None] = lambda message: None) -> ServerLanguageModel:
    """The served model of a configuration file's server table: tokenizer loaded, server probed, needs checked.

    Args:
      config: the server (its ``section`` names the table in errors).
      tokenizer: the served model's tokenizer (``"smollm2"``, a ``.gguf`` file or a model folder).
      needs: ``(capability, needed_by)`` pairs the run requires (see :func:`connect`).
      log: progress lines.

    Returns:
      The backend.

    Raises:
      ConfigFileError: the tokenizer cannot be loaded (naming ``<section>.tokenizer``).
      ServerError: as :func:`connect`.
    """
    from snapaudit_jax.models import load_tokenizer
    from snapaudit_jax.utils.config import ConfigFileError

    try:
        tok = load_tokenizer(tokenizer)
    except (ValueError, OSError) as err:
        raise ConfigFileError(f"{config.section}.tokenizer: {err}") from None
    log(f"connecting to {config.base_url} (model {config.model})")
    lm, caps = connect(config, tok, needs=needs)
    log(f"server: models {list(caps.model_ids)}, log-probs {'yes' if caps.logprobs else 'no'}, "
        f"echoed tokens {caps.echo_tokens}, context {caps.max_model_len or 'not reported'}, identity {lm.identity}")
    return lm


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



@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a server can do, as :func:`probe` measured it.

    Attributes:
      model_ids: the ids ``/v1/models`` lists.
      max_model_len: the served context length if the server reports it (vLLM's ``max_model_len``), else ``None``.
      completions: ``/v1/completions`` answers.
      token_prompts: it takes prompts as token-id lists (else text prompts are sent, tokenised by the server).
      logprobs: echoed prompt log-probabilities of token-id prompts come back (label scoring and the exact
        greedy checks need them).
      embeddings: ``/v1/embeddings`` answers.
      notes: why a capability is missing, by capability.
      echo_tokens: how an echo answer names the prompt tokens, which decides how its choices are verified:
        ``"token_ids"`` (``token_id:N``, compared with the ids sent), ``"text"`` (strings equal to this
        tokenizer's rendering of the ids sent, compared with it) or ``"none"`` (no tokens, or text that this
        tokenizer renders otherwise: label scoring sends one prompt per request).
      fingerprint: the ``system_fingerprint`` the probe's answers report (``None``: none reported); every later
        answer must report the same.
      model_root: the model card's ``root`` (vLLM: the served weights' path or repository), ``None`` if absent.
    """

    model_ids: tuple[str, ...]
    max_model_len: int | None
    completions: bool
    token_prompts: bool
    logprobs: bool
    embeddings: bool
    notes: dict
    echo_tokens: str = "none"
    fingerprint: str | None = None
    model_root: str | None = None

    def require(self, capability: str, needed_by: str, base_url: str) -> None:
        """Raises unless the server has ``capability``.

        Args:
          capability: ``"completions"``, ``"logprobs"`` or ``"embeddings"``.
          needed_by: who needs it, for the message (``"PoE"``).
          base_url: the server, for the message.

        Raises:
          ServerError: the capability is missing; the message names it, who needs it and why it is missing.
        """
        if not getattr(self, capability, False):
            raise ServerError(f"{needed_by} needs {capability} from the model server, but {base_url} has none: "
                              f"{self.notes.get(capability, 'not available')}; {needed_by} cannot run through this "
                              "server")


# --- verification of answers ------------------------------------------------------------------------------------
class _BadAnswer(ServerError):
    """A well-formed answer that contradicts the request (another model, choices out of order, other tokens, a
    changed fingerprint): never a missing capability, always a stop."""


def _same_model(answered, configured: str) -> bool:
    # transformers serve names a Hub repository by its canonical id, "repo@main" for the default revision
    return answered == configured or answered == f"{configured}@main"


def _check_model(answer: Any, config: ServerConfig, what: str) -> None:
    """Refuses an answer that is not an object or does not name the configured model in its ``model`` field."""
    if not isinstance(answer, dict):
        raise _BadAnswer(f"{what}: {config.base_url} answered a JSON {type(answer).__name__}, not an object")
    got = answer.get("model")
    if got is None:
        raise _BadAnswer(f"{what}: {config.base_url} answered without a 'model' field, so the answer cannot be "
                         f"checked against {config.section}.model = {config.model!r}")
    if not _same_model(got, config.model):
        raise _BadAnswer(f"{what}: {config.base_url} answered as model {got!r}, but {config.section}.model is "
                         f"{config.model!r}: another model answers there; its answers are refused")


def _fingerprint(answer: dict) -> str | None:
    value = answer.get("system_fingerprint")
    return value if isinstance(value, str) and value else None


def _check_fingerprint(answer: dict, expected: str | None, config: ServerConfig, what: str) -> None:
    got = _fingerprint(answer)
    if got != expected:
        raise _BadAnswer(f"{what}: {config.base_url} reports system_fingerprint {got!r}, but its answers at the "
                         f"probe reported {expected!r}: the server changed (another build or model) mid-run, and "
                         "answers of two servers are never mixed; rerun to audit against the new one")


def _choices(answer: Any, n: int, what: str, base_url: str = "the server") -> list[dict]:
    """The ``n`` completion choices of ``answer`` in the order of the prompts sent, matched by ``index``.

    One choice may omit ``index`` (it can be 0 only); of ``n > 1`` every choice must carry an integer ``index``
    and the indices must be ``0..n-1``: a server that answers in another order without saying so would give
    every prompt another prompt's answer.
    """
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or len(choices) != n or not all(isinstance(c, dict) for c in choices):
        got = len(choices) if isinstance(choices, list) else type(choices).__name__
        raise _BadAnswer(f"{what}: {base_url} answered {got} choices where {n} were asked for")
    indices = [c.get("index") for c in choices]
    integer = [isinstance(i, int) and not isinstance(i, bool) for i in indices]
    if n == 1:
        if indices[0] is not None and (not integer[0] or indices[0] != 0):
            raise _BadAnswer(f"{what}: {base_url} answered one choice with index {indices[0]!r} where one prompt "
                             "(index 0) was sent")
        return choices
    if not all(integer):
        raise _BadAnswer(f"{what}: {base_url} answered {n} choices without an integer 'index' on each (got "
                         f"{indices}), so they cannot be matched to the {n} prompts sent")
    if sorted(indices) != list(range(n)):
        raise _BadAnswer(f"{what}: {base_url} answered choices with indices {indices}, not each of 0..{n - 1} once")
    return sorted(choices, key=lambda c: c["index"])


def _echo_kind(choice: dict) -> str:
    """How a choice names its echoed tokens: ``"token_ids"``, ``"text"`` or ``"none"``."""
    lp = choice.get("logprobs")
    tokens = lp.get("tokens") if isinstance(lp, dict) else None
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        return "none"
    return "token_ids" if all(t.startswith("token_id:") for t in tokens) else "text"


def _rendering_mismatch(tokens: Sequence[str], ids: Sequence[int], tokenizer: Tokenizer) -> tuple | None:
    """The first position whose echoed text differs from this tokenizer's rendering of the id sent, or ``None``.

    A token whose rendering alone is not valid UTF-8 (part of a multi-byte character, rendered with U+FFFD) is
    skipped: servers render such pieces in their own ways.
    """
    for pos, (text, token) in enumerate(zip(tokens, ids)):
        mine = tokenizer.decode([token], skip_special_tokens=False)
        if "\ufffd" not in mine and text != mine:
            return pos, text, token, mine
    return None


def echoed_logprobs(choice: dict, ids: Sequence[int], what: str, *, tokenizer: Tokenizer | None = None,
                    require_tokens: bool = False, base_url: str | None = None) -> tuple[list, list]:
    """The echoed log-probabilities of one completion choice in vLLM's format, checked against the ids sent.

    Args:
      choice: one ``choices[i]`` of an ``echo`` + ``logprobs`` answer (``logprobs.token_logprobs``, optionally
        ``tokens`` as ``"token_id:N"`` or as text, and ``top_logprobs``).
      ids: the prompt's token ids as sent.
      what: the request's description in error messages.
      tokenizer: compare echoed text tokens with this tokenizer's rendering of ``ids`` (``None``: text tokens
        are not compared; ``token_id:N`` tokens always are).
      require_tokens: the echoed tokens must be present and compared (a choice of a request of several
        prompts: without them it could be another prompt's).
      base_url: the server, named by the messages (``None``: "the server").

    Returns:
      ``(token_logprobs, top_logprobs)``, one entry per prompt token (the first ``None``: it has no context;
      vLLM writes ``-inf`` as ``-9999.0``); ``top_logprobs`` is all ``None`` when the answer has none.

    Raises:
      ServerError: no echoed log-probabilities, a different number of tokens than sent, echoed tokens that
        differ from those sent (or, with ``require_tokens``, that are absent or not compared), or a value that is
        not a log-probability.
    """
    who = base_url or "the server"
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
        raise ServerError(f"{what}: the answer has no echoed token log-probabilities (choices[].logprobs."
                          f"token_logprobs); {who} ignores 'echo' or 'logprobs'")
    values, top = lp["token_logprobs"], lp.get("top_logprobs")
    if len(values) != len(ids):
        raise _BadAnswer(f"{what}: {who} echoed {len(values)} tokens for a prompt of {len(ids)} token ids (it "
                         "truncated or re-tokenised the prompt, or answered another one)")
    kind = _echo_kind(choice)
    tokens = lp.get("tokens")
    if kind != "none" and len(tokens) != len(ids):
        raise _BadAnswer(f"{what}: {who} echoed {len(tokens)} tokens (logprobs.tokens) for a prompt of "
                         f"{len(ids)} token ids")
    if kind == "token_ids":
        try:
            echoed = [int(t.split(":", 1)[1]) for t in tokens]
        except ValueError:
            raise _BadAnswer(f"{what}: {who} echoed tokens that are not 'token_id:N': {tokens[:4]}") from None
        if echoed != list(ids):
            first = next(i for i, (a, b) in enumerate(zip(echoed, ids)) if a != b)
            raise _BadAnswer(f"{what}: {who} echoed token {echoed[first]} at position {first} where {ids[first]} "
                             "was sent")
    elif kind == "text" and tokenizer is not None:
        bad = _rendering_mismatch(tokens, ids, tokenizer)
        if bad is not None:
            pos, text, token, mine = bad
            raise _BadAnswer(f"{what}: {who} echoed {text!r} at position {pos} where token {token} ({mine!r}) was "
                             "sent")
    elif require_tokens:
        raise _BadAnswer(f"{what}: the answer of {who} echoes no prompt tokens that can be compared with those "
                         "sent (logprobs.tokens), so it cannot be matched to its prompt")
    for i, v in enumerate(values[1:], 1):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v > 1e-6:
            raise ServerError(f"{what}: token_logprobs[{i}] = {v!r} is not a log-probability")
    return values, top if isinstance(top, list) else [None] * len(values)


class ServerLanguageModel:
    """A served decoder model behind :class:`~snapaudit_jax.models.lm.LanguageModel`'s interface.

    Args:
      config: the :class:`ServerConfig`.
      tokenizer: the served model's tokenizer (chat template and token ids; e.g. from the same checkpoint).
      client: the transport (default: an :class:`OpenAIClient` of ``config``).
      max_length: the context length (default: what :func:`probe` read from the server, else 4096).
      name: the label in reports (default ``"openai:<model>"``).
      logprobs: the server returns echoed log-probabilities (:attr:`Capabilities.logprobs`); without them
        :meth:`label_logprobs` refuses and :meth:`greedy_continues_with` decodes greedily instead.
      token_prompts: the server takes token-id prompts (:attr:`Capabilities.token_prompts`); without, prompts
        are sent as text (token-id prompts decoded, special tokens kept) and the server tokenises them.
      echo_tokens: how the server echoes prompt tokens (:attr:`Capabilities.echo_tokens`): ``"token_ids"``
        and ``"text"`` are compared with those sent and let one request hold every label of a prompt;
        ``"none"`` sends one prompt per request; the greedy checks read top-1 tokens with ``"token_ids"`` only
        and decode otherwise.
      fingerprint: the ``system_fingerprint`` every answer must report (:attr:`Capabilities.fingerprint`).
      model_root: the model card's ``root`` (:attr:`Capabilities.model_root`), part of :attr:`identity`.

    Attributes:
      config: the configuration.
      tokenizer: the tokenizer.
      client: the transport.
      name: the label.
      max_length: prompt plus new tokens, at most.
      logprobs: whether echoed log-probabilities are used.
      token_prompts: whether prompts are sent as token ids.
      echo_tokens: how echoed prompt tokens are verified.
      fingerprint: the ``system_fingerprint`` answers must report, or ``None``.
      model_root: the model card's ``root``, or ``None``.
      streams_answers: ``True``: the methods take ``on_result(i, answer)``, called as each prompt's answer
        arrives, which :class:`~snapaudit_jax.models.oracle.LLMOracle` uses to cache every answer at once.
    """

    streams_answers = True

    def __init__(self, config: ServerConfig, tokenizer: Tokenizer, *, client: OpenAIClient | None = None,
                 max_length: int | None = None, name: str | None = None, logprobs: bool = True,
                 token_prompts: bool = True, echo_tokens: str = "token_ids", fingerprint: str | None = None,
                 model_root: str | None = None):
        """Binds the server and the tokenizer (no request is made: call :func:`probe` first).

        Args:
          config: see :class:`ServerLanguageModel`.
          tokenizer: see :class:`ServerLanguageModel`.
          client: see :class:`ServerLanguageModel`.
          max_length: see :class:`ServerLanguageModel`.
          name: see :class:`ServerLanguageModel`.
          logprobs: see :class:`ServerLanguageModel`.
          token_prompts: see :class:`ServerLanguageModel`.
          echo_tokens: see :class:`ServerLanguageModel`.
          fingerprint: see :class:`ServerLanguageModel`.
          model_root: see :class:`ServerLanguageModel`.

        Raises:
          InputError: ``echo_tokens`` is not one of ``"token_ids"``, ``"text"``, ``"none"``.
        """
        if echo_tokens not in ("token_ids", "text", "none"):
            raise InputError(f"echo_tokens must be 'token_ids', 'text' or 'none', got {echo_tokens!r}")
        self.config = config
        self.logprobs = bool(logprobs) and bool(token_prompts)
        self.token_prompts = bool(token_prompts)
        self.tokenizer = tokenizer
        self.client = client or OpenAIClient(config)
        self.name = name or f"openai:{config.model}"
        self.max_length = int(max_length or 4096)
        self.echo_tokens = echo_tokens
        self.fingerprint = fingerprint
        self.model_root = model_root

    @property
    def server_info(self) -> dict:
        """What a manifest records of the backend: ``{"backend": "openai", "base_url", "model"}``."""
        return {"backend": "openai", **self.config.public()}

    @property
    def identity(self) -> str:
        """The server's identity, which keys the answer cache: ``openai:<model>@<16 hex digits>``.

        The digits are a SHA-256 of the API root (``base_url`` ending in ``/v1``), the served model id, the
        model card's ``root`` and the answers' ``system_fingerprint`` (each ``None`` where not reported): a
        rerun against another server, another model under the same URL, or a rebuilt server that reports
        another fingerprint computes its answers afresh instead of reusing those of the first.
        """
        parts = [self.config.api_root, self.config.model, self.model_root, self.fingerprint]
        return f"openai:{self.config.model}@{hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]}"

    # --- prompts ---------------------------------------------------------------
    def chat_prompt(self, user: str, system: str | None = None) -> str:
        """The chat-template rendering of one user turn; see :meth:`LanguageModel.chat_prompt`.

        Args:
          user: the user message.
          system: a system message, or ``None``.

        Returns:
          The rendered prompt, ending with the assistant turn's generation prompt.
        """
        return chat_prompt(self.tokenizer, user, system)

    def _ids(self, prompts) -> list[list[int]]:
        return prompt_ids(self.tokenizer, prompts, self.max_length)

    def _wire(self, prompt, ids: list[int]):
        """What goes into the request's ``prompt``: the token ids, or text where the server takes only text."""
        if self.token_prompts:
            return ids
        return prompt if isinstance(prompt, str) else self.tokenizer.decode(ids, skip_special_tokens=False)

    def _completion(self, prompt, what: str, n: int = 1, **fields) -> list[dict]:
        """The ``n`` choices of one completion request, in the order of its prompts, after every check of the
        answer as a whole (the model named, the fingerprint, the choices' indices)."""
        body = {"model": self.config.model, "prompt": prompt, **fields}
        answer = self.client.request("/completions", body, what=what)
        _check_model(answer, self.config, what)
        _check_fingerprint(answer, self.fingerprint, self.config, what)
        return _choices(answer, n, what, self.config.base_url)

    def _echo(self, seqs: list[list[int]], what: str, each: list[str], top: int) -> list[tuple[list, list]]:
        """``echoed_logprobs`` of every sequence (``each[j]`` names sequence ``j`` in errors): one request for all
        where the echoed tokens tell the choices apart, else one request per sequence."""
        fields = {"max_tokens": 0, "echo": True, "logprobs": top, "temperature": 0.0,
                  "return_tokens_as_token_ids": True}
        tok = self.tokenizer if self.echo_tokens == "text" else None
        url = self.config.base_url
        if len(seqs) == 1:
            return [echoed_logprobs(self._completion(seqs[0], what, **fields)[0], seqs[0], each[0], tokenizer=tok,
                                    base_url=url)]
        if self.echo_tokens == "none":
            return [echoed_logprobs(self._completion(seq, name, **fields)[0], seq, name, tokenizer=tok, base_url=url)
                    for seq, name in zip(seqs, each)]
        choices = self._completion(seqs, what, len(seqs), **fields)
        return [echoed_logprobs(c, seq, name, tokenizer=tok, require_tokens=True, base_url=url)
                for c, seq, name in zip(choices, seqs, each)]

    # --- generation ------------------------------------------------------------
    def generate(self, prompts, *, max_new_tokens: int = 32, temperature: float | None = None, key=None,
                 batch_size: int = 8, on_result: Callable[[int, Generation], None] | None = None) -> list[Generation]:
        """Continues every prompt on the server; see :meth:`LanguageModel.generate`.

        Args:
          prompts: texts (tokenised locally) or token id lists.
          max_new_tokens: tokens to emit at most, ``>= 1``.
          temperature: sampling temperature; ``None``: greedy (``temperature = 0``).
          key: a JAX key (required with ``temperature``): prompt ``i`` is sampled with the server ``seed`` drawn
            from ``fold_in(key, i)``.
          batch_size: unused (the server batches); accepted for interface compatibility.
          on_result: called as ``on_result(i, generation)`` as soon as prompt ``i`` is answered.

        Returns:
          One :class:`~snapaudit_jax.models.lm.Generation` per prompt; its ``token_ids`` are the server's when it
          returns them (``choices[].token_ids``), else the local tokenisation of the text.

        Raises:
          InputError: bad arguments (as :meth:`LanguageModel.generate`).
          ServerError: a failed request, an answer without text, or one that fails a check (another model
            named, a changed ``system_fingerprint``, a choice of another index).
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        prompts = list(prompts)
        rows = self._ids(prompts)
        seeds = [None] * len(rows)
        if temperature is not None:
            if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
                raise InputError(f"temperature must be > 0, got {temperature!r}")
            if key is None:
                raise InputError("sampling (temperature given) needs a PRNG key")
            import jax

            seeds = [int(np.asarray(jax.random.randint(jax.random.fold_in(key, i), (), 0, 2 ** 31 - 1)))
                     for i in range(len(rows))]

        def one(i):
            fields = {"max_tokens": max_new_tokens, "temperature": 0.0 if temperature is None else float(temperature)}
            if seeds[i] is not None:
                fields["seed"] = seeds[i]
            what = f"generation of prompt {i}"
            choice = self._completion(self._wire(prompts[i], rows[i]), what, **fields)[0]
            text = choice.get("text")
            if not isinstance(text, str):
                raise ServerError(f"{what}: the answer has no text (choices[0].text)")
            ids = choice.get("token_ids")
            if not (isinstance(ids, list) and all(isinstance(t, int) for t in ids)):
                ids = self.tokenizer.encode_continuation(text) if text else []
            return Generation(text, tuple(ids), len(rows[i]))

        return self.client.map(one, range(len(rows)), on_result)

    # --- scoring ---------------------------------------------------------------
    def label_logprobs(self, prompts: Sequence[str], labels: Sequence[str], *, normalize: bool = False,
                       batch_size: int = 8, on_result: Callable[[int, list], None] | None = None) -> np.ndarray:
        """``log P(label | prompt)`` for every prompt and label, from the server's echoed log-probabilities.

        See :meth:`LanguageModel.label_logprobs`; labels are tokenised on their own and appended to the prompt.

        Args:
          prompts: the prompt texts.
          labels: the label texts (non-empty).
          normalize: renormalise over the labels (log-softmax per prompt).
          batch_size: unused (one request per prompt holds all its labels; one per label where the server echoes
            no comparable tokens, :attr:`echo_tokens` ``"none"``).
          on_result: called as ``on_result(i, row)`` (``row``: the prompt's list of floats) as soon as prompt ``i``
            is answered.

        Returns:
          ``(n_prompts, n_labels)`` float64 log-probabilities (summed over a label's tokens).

        Raises:
          InputError: as :meth:`LanguageModel.label_logprobs`.
          ServerError: a failed request, an answer without echoed log-probabilities, or one that fails a check:
            echoed tokens that differ from those sent, choices without their ``index``, another model named, a
            changed ``system_fingerprint``.
        """
        if not labels:
            raise InputError("labels must not be empty")
        if not self.logprobs:
            raise ServerError(f"label log-probabilities need echoed log-probs, which {self.config.base_url} does not "
                              "return (see probe)")
        label_ids = [self.tokenizer.encode_continuation(lab) for lab in labels]
        for lab, ids in zip(labels, label_ids):
            if not ids:
                raise InputError(f"label {lab!r} is empty after tokenisation")
        rows = self._ids(list(prompts))
        longest = max(map(len, rows)) + max(map(len, label_ids))
        if longest > self.max_length:
            raise InputError(f"a prompt plus its longest label has {longest} tokens, more than the model's "
                             f"{self.max_length} positions")

        def one(i):
            what = f"label log-probs of prompt {i}"
            seqs = [rows[i] + ids for ids in label_ids]
            echoes = self._echo(seqs, what, [f"{what}, label {lab!r}" for lab in labels], top=0)
            out = [float(np.sum(values[len(rows[i]):], dtype=np.float64)) for values, _ in echoes]
            if normalize:
                out = (np.asarray(out) - np.logaddexp.reduce(out)).tolist()
            return out

        rows_out = self.client.map(one, range(len(rows)), on_result)
        return np.asarray(rows_out, np.float64).reshape(len(rows), len(labels))

    def greedy_continues_with(self, prompts: Sequence[str], continuations: Sequence[str], *,
                              batch_size: int = 8, on_result: Callable[[int, bool], None] | None = None) -> np.ndarray:
        """Whether greedy decoding of each prompt begins with its continuation; see
        :meth:`LanguageModel.greedy_continues_with`.

        With log-probabilities and echoed token ids, the top-1 token at every continuation position of one echo
        request decides (ties aside). Otherwise the server decodes ``len(continuation)`` tokens greedily: its
        token ids are compared when it returns them, else its text must begin with the continuation's text.

        Args:
          prompts: the prompt texts.
          continuations: one continuation per prompt.
          batch_size: unused.
          on_result: called as ``on_result(i, matches)`` as soon as prompt ``i`` is answered.

        Returns:
          ``(n,)`` bool.

        Raises:
          InputError: as :meth:`LanguageModel.greedy_continues_with`.
          ServerError: a failed request, an answer without top-1 log-probabilities per echoed token, or one that
            fails a check (as :meth:`label_logprobs`).
        """
        if len(prompts) != len(continuations):
            raise InputError(f"got {len(prompts)} prompts but {len(continuations)} continuations")
        rows = self._ids(list(prompts))
        conts = [self.tokenizer.encode_continuation(c) for c in continuations]
        for c, ids in zip(continuations, conts):
            if not ids:
                raise InputError(f"continuation {c!r} is empty after tokenisation")

        def decoded(i):
            what = f"greedy check of prompt {i} (by decoding)"
            choice = self._completion(self._wire(prompts[i], rows[i]), what, max_tokens=len(conts[i]),
                                      temperature=0.0)[0]
            ids = choice.get("token_ids")
            if isinstance(ids, list) and all(isinstance(t, int) for t in ids):
                return ids[:len(conts[i])] == conts[i]
            text = choice.get("text")
            if not isinstance(text, str):
                raise ServerError(f"{what}: the answer has no text (choices[0].text)")
            return text.startswith(continuations[i])

        def one(i):
            if not self.logprobs or self.echo_tokens != "token_ids":
                return decoded(i)
            what = f"greedy check of prompt {i}"
            seq = rows[i] + conts[i]
            [(_, top)] = self._echo([seq], what, [what], top=1)
            for pos in range(len(rows[i]), len(seq)):
                step = top[pos]
                if not isinstance(step, dict) or not step:
                    raise ServerError(f"{what}: no top log-probabilities at position {pos} (top_logprobs)")
                best = max(step, key=lambda t: step[t])
                if not (isinstance(best, str) and best.startswith("token_id:")):
                    raise ServerError(f"{what}: top_logprobs keys must be 'token_id:N' (the request set "
                                      f"return_tokens_as_token_ids), got {best!r}")
                if int(best.split(":", 1)[1]) != seq[pos]:
                    return False
            return True

        return np.asarray(self.client.map(one, range(len(rows)), on_result), bool)




def _probe_pair(tokenizer: Tokenizer) -> list[list[int]]:
    """Two different token sequences of one length for the probe's echo request: only the choices' indices and
    echoed tokens, not their lengths, can tell which is which."""
    first = tokenizer.encode("Hello world, hello") or [0, 1]
    if len(first) == 1:
        first = first * 2
    second = first[::-1] if first[::-1] != first else first[1:] + first[:1]
    if second == first:  # every token the same
        second = [t + 1 if t + 1 < tokenizer.vocab_size else t - 1 for t in first]
    return [first, second]


def probe(config: ServerConfig, tokenizer: Tokenizer, *, client: OpenAIClient | None = None,
          embeddings: bool = False) -> Capabilities:
    """Checks the server before any work: the model is served and answers as itself, completions answer,
    log-probabilities come back, and echo answers can be matched to their prompts.

    The echo request holds two prompts: its choices must carry the indices 0 and 1 and echo each prompt's
    tokens -- as ``token_id:N`` (compared with the ids sent) or as text (compared with this tokenizer's
    rendering; a server that renders them otherwise, or echoes none, gets one prompt per request later).

    Args:
      config: the server.
      tokenizer: the served model's tokenizer (the probe prompts are a few of its tokens).
      client: the transport (default: a new :class:`OpenAIClient`).
      embeddings: also try ``/v1/embeddings``.

    Returns:
      The :class:`Capabilities`.

    Raises:
      ServerError: the server cannot be reached, does not serve ``config.model`` (the message lists what it
        serves), its completions endpoint fails, or an answer fails a check: another model named, choices
        without their ``index`` or out of it, echoed token ids other than those sent, ``system_fingerprint``
        differing between two answers.
    """
    client = client or OpenAIClient(config)
    where = f"{config.section}.model"
    listing = client.request("/models", what="model listing (/v1/models)")
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        raise ServerError(f"model listing (/v1/models): {config.api_root}/models answered no 'data' list")
    ids = tuple(str(m.get("id")) for m in data if isinstance(m, dict))
    if config.model not in ids:
        raise ServerError(f"{where} is {config.model!r}, but {config.base_url} serves {list(ids)}")
    entry = next(m for m in data if isinstance(m, dict) and m.get("id") == config.model)
    max_len = entry.get("max_model_len")
    max_len = int(max_len) if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 0 else None
    root = entry.get("root") if isinstance(entry.get("root"), str) and entry.get("root") else None
    notes = {}
    ids_probe = tokenizer.encode("Hello")[:2] or [0]
    what = "probe completion"
    token_prompts = True
    try:
        answer = client.request("/completions", {"model": config.model, "prompt": ids_probe, "max_tokens": 1,
                                                 "temperature": 0.0}, what=what)
    except ServerError as err:
        if "HTTP 400" not in str(err) and "HTTP 422" not in str(err):
            raise
        token_prompts = False  # e.g. transformers serve: "prompt must be a string"
        notes["token_prompts"] = f"a token-id prompt was refused ({err})"
        answer = client.request("/completions", {"model": config.model, "prompt": "Hello", "max_tokens": 1,
                                                 "temperature": 0.0}, what=what)
    _check_model(answer, config, what)
    fingerprint = _fingerprint(answer)
    choice = _choices(answer, 1, what, config.base_url)[0]
    if not isinstance(choice.get("text"), str):
        raise ServerError(f"{what}: the answer has no text (choices[0].text)")
    logprobs = token_prompts
    echo_tokens = "none"
    if not token_prompts:
        notes["logprobs"] = "echoed log-probabilities are read at token positions, which needs token-id prompts"
    else:
        what = "probe log-probs (two prompts)"
        seqs = _probe_pair(tokenizer)
        try:
            answer = client.request("/completions", {"model": config.model, "prompt": seqs, "max_tokens": 0,
                                                     "echo": True, "logprobs": 1, "temperature": 0.0,
                                                     "return_tokens_as_token_ids": True}, what=what)
            _check_model(answer, config, what)
            _check_fingerprint(answer, fingerprint, config, what)
            choices = _choices(answer, len(seqs), what, config.base_url)
            echo_tokens = _echo_kind(choices[0])
            for j, (c, seq) in enumerate(zip(choices, seqs)):
                echoed_logprobs(c, seq, f"{what}, prompt {j}", base_url=config.base_url)
                if _echo_kind(c) != echo_tokens:
                    raise _BadAnswer(f"{what}: {config.base_url} echoed the tokens of its two choices in two forms")
            if echo_tokens == "text":
                bad = next((b for b in (_rendering_mismatch(c["logprobs"]["tokens"], seq, tokenizer)
                                        for c, seq in zip(choices, seqs)) if b is not None), None)
                if bad is not None:
                    echo_tokens = "none"
                    notes["echo_tokens"] = (f"the echoed text tokens differ from this tokenizer's rendering "
                                            f"({bad[1]!r} where it renders {bad[3]!r}): one prompt per request")
            elif echo_tokens == "none":
                notes["echo_tokens"] = "the echo answers name no prompt tokens: one prompt per request"
        except _BadAnswer:
            raise
        except ServerError as err:
            logprobs, echo_tokens = False, "none"
            notes["logprobs"] = f"an echo request with logprobs = 1 failed ({err})"
    has_embeddings = False
    if embeddings:
        try:
            answer = client.request("/embeddings", {"model": config.model, "input": ["Hello"]},
                                    what="probe embeddings")
            rows = answer.get("data") if isinstance(answer, dict) else None
            has_embeddings = (isinstance(rows, list) and len(rows) == 1 and isinstance(rows[0], dict)
                              and isinstance(rows[0].get("embedding"), list))
            if not has_embeddings:
                notes["embeddings"] = "/v1/embeddings answered no data[0].embedding"
        except ServerError as err:
            notes["embeddings"] = f"/v1/embeddings failed ({err})"
    return Capabilities(ids, max_len, True, token_prompts, logprobs, has_embeddings, notes, echo_tokens,
                        fingerprint, root)


def connect(config: ServerConfig, tokenizer: Tokenizer, *, needs: Sequence[tuple[str, str]] = (),
            client: OpenAIClient | None = None) -> tuple[ServerLanguageModel, Capabilities]:
    """Probes the server, checks every capability the run needs, and returns the backend.

    Args:
      config: the server.
      tokenizer: the served model's tokenizer.
      needs: ``(capability, needed_by)`` pairs, e.g. ``[("logprobs", "PoE")]``.
      client: the transport (default: a new :class:`OpenAIClient`).

    Returns:
      ``(model, capabilities)``; the model uses log-probabilities iff the server returns them, verifies echoed
      tokens as the probe found them, and expects the probe's ``system_fingerprint`` in every answer.

    Raises:
      ServerError: the probe failed or a needed capability is missing (before any model call of the run).
    """
    client = client or OpenAIClient(config)
    caps = probe(config, tokenizer, client=client)
    for capability, needed_by in needs:
        caps.require(capability, needed_by, config.base_url)
    return ServerLanguageModel(config, tokenizer, client=client, max_length=caps.max_model_len,
                               logprobs=caps.logprobs, token_prompts=caps.token_prompts,
                               echo_tokens=caps.echo_tokens, fingerprint=caps.fingerprint,
                               model_root=caps.model_root), caps
