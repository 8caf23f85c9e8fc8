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

:class:`OpenAIClient` is the transport: bounded concurrency, retries with exponential backoff and full
jitter on timeouts, refused or reset connections, truncated bodies, 429 and 5xx (honouring ``Retry-After``),
and an error naming the request for anything else. The API key is read from the environment variable the
configuration names; it is sent in the ``Authorization`` header only, and no message, manifest or cache
holds it. A base URL with embedded credentials is refused.

:func:`probe` checks the server up front (``/v1/models``, one tiny completion, one echo request with
log-probs, optionally ``/v1/embeddings``) so that a missing capability is reported before any output exists.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import email.utils
import http.client
import json
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from snapaudit_jax.models.lm import Generation, chat_prompt, prompt_ids
from snapaudit_jax.models.tokenizer import Tokenizer
from snapaudit_jax.utils.errors import InputError, ServerError

__all__ = ["Capabilities", "OpenAIClient", "ServerConfig", "ServerLanguageModel", "connect", "echoed_logprobs", "probe",
           "connect_configured", "server_from_table"]

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """``[model.server]``: where the OpenAI-compatible server is and how to talk to it.

    Attributes:
      base_url: the server's root, e.g. ``http://127.0.0.1:8000`` (``/v1`` is appended unless present);
        ``http`` or ``https``; no credentials, query or fragment.
      model: the model id the server serves (one of ``/v1/models``).
      api_key_env: name of the environment variable holding the API key (``None``: no key is sent).
      timeout_s: seconds before one HTTP request is abandoned (and retried).
      max_concurrency: requests in flight at once.
      max_retries: retries of one request after its first attempt.
      backoff_s: the first retry's delay cap; the cap doubles per retry, up to ``max_backoff_s``, and the delay
        is drawn uniformly below it (full jitter).
      max_backoff_s: the largest delay between two attempts (a longer ``Retry-After`` is honoured up to it).
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
    section: str = dataclasses.field(default="model.server", compare=False, repr=False)

    def __post_init__(self):
        where = self.section
        if not isinstance(self.base_url, str) or not self.base_url:
            raise InputError(f"{where}.base_url must be a non-empty http(s) URL, got {self.base_url!r}")
        parts = urllib.parse.urlsplit(self.base_url)
        if parts.username is not None or parts.password is not None:
            raise InputError(f"{where}.base_url must not embed credentials (user:password@host); put the API key in "
                             f"an environment variable and name it in {where}.api_key_env")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InputError(f"{where}.base_url must be an http:// or https:// URL with a host, got "
                             f"{self.base_url!r}")
        if parts.query or parts.fragment:
            raise InputError(f"{where}.base_url must have no query or fragment, got {self.base_url!r}")
        if not isinstance(self.model, str) or not self.model:
            raise InputError(f"{where}.model must be the served model's id (a non-empty string), got {self.model!r}")
        if self.api_key_env is not None and (not isinstance(self.api_key_env, str) or not self.api_key_env):
            raise InputError(f"{where}.api_key_env must name an environment variable, got {self.api_key_env!r}")
        for name, low in (("timeout_s", 0.0), ("backoff_s", 0.0), ("max_backoff_s", 0.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > low:
                raise InputError(f"{where}.{name} must be a number > {low:g}, got {value!r}")
        for name, low in (("max_concurrency", 1), ("max_retries", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InputError(f"{where}.{name} must be an integer >= {low}, got {value!r}")

    @property
    def api_root(self) -> str:
        """The URL requests are made under: ``base_url`` ending in ``/v1`` (no trailing slash)."""
        root = self.base_url.rstrip("/")
        return root if root.endswith("/v1") else root + "/v1"

    def public(self) -> dict:
        """What a manifest may record of the server: ``{"base_url", "model"}`` (the URL holds no credentials).

        Returns:
          The two fields.
        """
        return {"base_url": self.base_url, "model": self.model}


def server_from_table(body: dict | None, where: str, needed_by: str) -> tuple[ServerConfig, str]:
    """A configuration file's server table -> ``(ServerConfig, tokenizer)``.

    The table holds the :class:`ServerConfig` fields users set (``base_url``, ``model``, ``api_key_env``,
    ``timeout_s``, ``max_concurrency``, ``max_retries``) and ``tokenizer``: the served model's tokenizer, read
    locally (``"smollm2"``, a ``.gguf`` file or a model folder), which renders and tokenises the prompts.

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
        f"context {caps.max_model_len or 'not reported'}")
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


class OpenAIClient:
    """JSON over HTTP to an OpenAI-compatible server, with retries and bounded concurrency.

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
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if config.api_key_env is not None:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise InputError(f"model.server.api_key_env names {config.api_key_env!r}, which is not set in the "
                                 "environment")
            self._headers["Authorization"] = f"Bearer {key}"
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

    def request(self, path: str, body: dict | None = None, *, what: str) -> Any:
        """One JSON request: ``GET path`` when ``body`` is ``None``, else ``POST`` of ``body``; retried as configured.

        Args:
          path: the endpoint under ``/v1`` (``"/completions"``).
          body: the JSON body, or ``None`` for a GET.
          what: the request's description in error messages (``"label log-probs of prompt 3"``).

        Returns:
          The decoded JSON answer.

        Raises:
          ServerError: a non-retryable status (the server's message included), or the retries exhausted (the last
            failure named).
        """
        url = self.config.api_root + path
        data = None if body is None else json.dumps(body).encode()
        last = ""
        for attempt in range(self.config.max_retries + 1):
            retry_after = None
            with self._lock:
                self.attempts += 1
            try:
                req = urllib.request.Request(url, data=data, headers=self._headers,
                                             method="GET" if body is None else "POST")
                with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
                    raw = resp.read()
                try:
                    return json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as err:
                    last = f"malformed JSON body ({len(raw)} bytes: {err})"
            except urllib.error.HTTPError as err:
                message = _error_message(err)
                if err.code not in RETRY_STATUS:
                    raise ServerError(f"{what}: {url} answered HTTP {err.code}: {message}") from None
                last = f"HTTP {err.code}: {message}"
                retry_after = _retry_after(err.headers.get("Retry-After") if err.headers else None)
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout,
                    TimeoutError) as err:
                reason = getattr(err, "reason", err)
                last = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
            if attempt == self.config.max_retries:
                break
            delay = self._delay(attempt, retry_after)
            with self._lock:
                self.retries += 1
                self.delays.append(delay)
            self._sleep(delay)
        raise ServerError(f"{what}: {url} failed after {self.config.max_retries + 1} attempts; last: {last}")

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


def _error_message(err: urllib.error.HTTPError) -> str:
    """The server's error text (OpenAI ``{"error": {"message"}}`` or the raw body), shortened."""
    try:
        raw = err.read()
    except (OSError, http.client.HTTPException):
        raw = b""
    text = raw.decode(errors="replace").strip()
    try:
        body = json.loads(text)
        if isinstance(body, dict):
            e = body.get("error", body)
            text = str(e.get("message", e) if isinstance(e, dict) else e)
    except json.JSONDecodeError:
        pass
    return (text or err.reason or "no message")[:300]


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
    """

    model_ids: tuple[str, ...]
    max_model_len: int | None
    completions: bool
    token_prompts: bool
    logprobs: bool
    embeddings: bool
    notes: dict

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


def _choices(answer: Any, n: int, what: str) -> list[dict]:
    """The ``n`` completion choices of ``answer``, ordered by ``index``; a malformed answer is a ServerError."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or len(choices) != n or not all(isinstance(c, dict) for c in choices):
        got = len(choices) if isinstance(choices, list) else type(choices).__name__
        raise ServerError(f"{what}: the server answered {got} choices where {n} were asked for")
    if all(isinstance(c.get("index"), int) for c in choices):
        choices = sorted(choices, key=lambda c: c["index"])
    return choices


def echoed_logprobs(choice: dict, ids: Sequence[int], what: str) -> tuple[list, list]:
    """The echoed log-probabilities of one completion choice in vLLM's format, checked against the ids sent.

    Args:
      choice: one ``choices[i]`` of an ``echo`` + ``logprobs`` answer (``logprobs.token_logprobs``, optionally
        ``tokens`` as ``"token_id:N"`` and ``top_logprobs``).
      ids: the prompt's token ids as sent.
      what: the request's description in error messages.

    Returns:
      ``(token_logprobs, top_logprobs)``, one entry per prompt token (the first ``None``: it has no context;
      vLLM writes ``-inf`` as ``-9999.0``); ``top_logprobs`` is all ``None`` when the answer has none.

    Raises:
      ServerError: no echoed log-probabilities, a different number of tokens than sent, echoed token ids that
        differ from those sent, or a value that is not a log-probability.
    """
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
        raise ServerError(f"{what}: the answer has no echoed token log-probabilities (choices[].logprobs."
                          "token_logprobs); the server ignores 'echo' or 'logprobs'")
    values, top = lp["token_logprobs"], lp.get("top_logprobs")
    if len(values) != len(ids):
        raise ServerError(f"{what}: the server echoed {len(values)} tokens for a prompt of {len(ids)} token ids "
                          "(it truncated or re-tokenised the prompt)")
    tokens = lp.get("tokens")
    if isinstance(tokens, list) and tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        echoed = [int(t.split(":", 1)[1]) for t in tokens]
        if echoed != list(ids):
            first = next(i for i, (a, b) in enumerate(zip(echoed, ids)) if a != b)
            raise ServerError(f"{what}: the server echoed token {echoed[first]} at position {first} where {ids[first]} "
                              "was sent")
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
      name: the label in reports and answer-cache keys (default ``"openai:<model>"``, so cached answers of a
        server never mix with those of an in-process model).
      logprobs: the server returns echoed log-probabilities (:attr:`Capabilities.logprobs`); without them
        :meth:`label_logprobs` refuses and :meth:`greedy_continues_with` decodes greedily instead.
      token_prompts: the server takes token-id prompts (:attr:`Capabilities.token_prompts`); without, prompts
        are sent as text (token-id prompts decoded, special tokens kept) and the server tokenises them.

    Attributes:
      config: the configuration.
      tokenizer: the tokenizer.
      client: the transport.
      name: the label.
      max_length: prompt plus new tokens, at most.
      logprobs: whether echoed log-probabilities are used.
      token_prompts: whether prompts are sent as token ids.
      streams_answers: ``True``: the methods take ``on_result(i, answer)``, called as each prompt's answer
        arrives, which :class:`~snapaudit_jax.models.oracle.LLMOracle` uses to cache every answer at once.
    """

    streams_answers = True

    def __init__(self, config: ServerConfig, tokenizer: Tokenizer, *, client: OpenAIClient | None = None,
                 max_length: int | None = None, name: str | None = None, logprobs: bool = True,
                 token_prompts: bool = True):
        """Binds the server and the tokenizer (no request is made: call :func:`probe` first).

        Args:
          config: see :class:`ServerLanguageModel`.
          tokenizer: see :class:`ServerLanguageModel`.
          client: see :class:`ServerLanguageModel`.
          max_length: see :class:`ServerLanguageModel`.
          name: see :class:`ServerLanguageModel`.
          logprobs: see :class:`ServerLanguageModel`.
          token_prompts: see :class:`ServerLanguageModel`.
        """
        self.config = config
        self.logprobs = bool(logprobs) and bool(token_prompts)
        self.token_prompts = bool(token_prompts)
        self.tokenizer = tokenizer
        self.client = client or OpenAIClient(config)
        self.name = name or f"openai:{config.model}"
        self.max_length = int(max_length or 4096)

    @property
    def server_info(self) -> dict:
        """What a manifest records of the backend: ``{"backend": "openai", "base_url", "model"}``."""
        return {"backend": "openai", **self.config.public()}

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

    def _completion(self, prompt, what: str, **fields) -> dict:
        body = {"model": self.config.model, "prompt": prompt, **fields}
        return self.client.request("/completions", body, what=what)

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
          ServerError: a failed request or an answer without text.
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
            choice = _choices(self._completion(self._wire(prompts[i], rows[i]), what, **fields), 1, what)[0]
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
          batch_size: unused (one request per prompt holds all its labels).
          on_result: called as ``on_result(i, row)`` (``row``: the prompt's list of floats) as soon as prompt ``i``
            is answered.

        Returns:
          ``(n_prompts, n_labels)`` float64 log-probabilities (summed over a label's tokens).

        Raises:
          InputError: as :meth:`LanguageModel.label_logprobs`.
          ServerError: a failed request, an answer without echoed log-probabilities, or one whose echoed tokens
            differ from those sent.
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
            answer = self._completion(seqs, what, max_tokens=0, echo=True, logprobs=0, temperature=0.0,
                                      return_tokens_as_token_ids=True)
            out = []
            for j, (choice, seq) in enumerate(zip(_choices(answer, len(seqs), what), seqs)):
                values, _ = echoed_logprobs(choice, seq, f"{what}, label {labels[j]!r}")
                out.append(float(np.sum(values[len(rows[i]):], dtype=np.float64)))
            if normalize:
                out = (np.asarray(out) - np.logaddexp.reduce(out)).tolist()
            return out

        rows_out = self.client.map(one, range(len(rows)), on_result)
        return np.asarray(rows_out, np.float64).reshape(len(rows), len(labels))

    def greedy_continues_with(self, prompts: Sequence[str], continuations: Sequence[str], *,
                              batch_size: int = 8, on_result: Callable[[int, bool], None] | None = None) -> np.ndarray:
        """Whether greedy decoding of each prompt begins with its continuation; see
        :meth:`LanguageModel.greedy_continues_with`.

        With log-probabilities, the top-1 token at every continuation position of one echo request decides
        (ties aside). Without them, the server decodes ``len(continuation)`` tokens greedily: its token ids are
        compared when it returns them, else its text must begin with the continuation's text.

        Args:
          prompts: the prompt texts.
          continuations: one continuation per prompt.
          batch_size: unused.
          on_result: called as ``on_result(i, matches)`` as soon as prompt ``i`` is answered.

        Returns:
          ``(n,)`` bool.

        Raises:
          InputError: as :meth:`LanguageModel.greedy_continues_with`.
          ServerError: a failed request or an answer without top-1 log-probabilities per echoed token.
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
            answer = self._completion(self._wire(prompts[i], rows[i]), what, max_tokens=len(conts[i]),
                                      temperature=0.0)
            choice = _choices(answer, 1, what)[0]
            ids = choice.get("token_ids")
            if isinstance(ids, list) and all(isinstance(t, int) for t in ids):
                return ids[:len(conts[i])] == conts[i]
            text = choice.get("text")
            if not isinstance(text, str):
                raise ServerError(f"{what}: the answer has no text (choices[0].text)")
            return text.startswith(continuations[i])

        def one(i):
            if not self.logprobs:
                return decoded(i)
            what = f"greedy check of prompt {i}"
            seq = rows[i] + conts[i]
            answer = self._completion(seq, what, max_tokens=0, echo=True, logprobs=1, temperature=0.0,
                                      return_tokens_as_token_ids=True)
            _, top = echoed_logprobs(_choices(answer, 1, what)[0], seq, what)
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


def probe(config: ServerConfig, tokenizer: Tokenizer, *, client: OpenAIClient | None = None,
          embeddings: bool = False) -> Capabilities:
    """Checks the server before any work: the model is served, completions answer, log-probabilities come back.

    Args:
      config: the server.
      tokenizer: the served model's tokenizer (the probe prompt is two of its tokens).
      client: the transport (default: a new :class:`OpenAIClient`).
      embeddings: also try ``/v1/embeddings``.

    Returns:
      The :class:`Capabilities`.

    Raises:
      ServerError: the server cannot be reached, does not serve ``config.model`` (the message lists what it
        serves), or its completions endpoint fails.
    """
    client = client or OpenAIClient(config)
    listing = client.request("/models", what="model listing (/v1/models)")
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        raise ServerError(f"model listing (/v1/models): {config.api_root}/models answered no 'data' list")
    ids = tuple(str(m.get("id")) for m in data if isinstance(m, dict))
    if config.model not in ids:
        raise ServerError(f"model.server.model is {config.model!r}, but {config.base_url} serves {list(ids)}")
    entry = next(m for m in data if isinstance(m, dict) and m.get("id") == config.model)
    max_len = entry.get("max_model_len")
    max_len = int(max_len) if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 0 else None
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
    choice = _choices(answer, 1, what)[0]
    if not isinstance(choice.get("text"), str):
        raise ServerError(f"{what}: the answer has no text (choices[0].text)")
    logprobs = token_prompts
    if not token_prompts:
        notes["logprobs"] = "echoed log-probabilities are read at token positions, which needs token-id prompts"
    seq = tokenizer.encode("Hello world") or ids_probe
    try:
        if token_prompts:
            answer = client.request("/completions", {"model": config.model, "prompt": seq, "max_tokens": 0,
                                                     "echo": True, "logprobs": 1, "temperature": 0.0,
                                                     "return_tokens_as_token_ids": True}, what="probe log-probs")
            echoed_logprobs(_choices(answer, 1, "probe log-probs")[0], seq, "probe log-probs")
    except ServerError as err:
        logprobs = False
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
    return Capabilities(ids, max_len, True, token_prompts, logprobs, has_embeddings, notes)


def connect(config: ServerConfig, tokenizer: Tokenizer, *, needs: Sequence[tuple[str, str]] = (),
            client: OpenAIClient | None = None) -> tuple[ServerLanguageModel, Capabilities]:
    """Probes the server, checks every capability the run needs, and returns the backend.

    Args:
      config: the server.
      tokenizer: the served model's tokenizer.
      needs: ``(capability, needed_by)`` pairs, e.g. ``[("logprobs", "PoE")]``.
      client: the transport (default: a new :class:`OpenAIClient`).

    Returns:
      ``(model, capabilities)``; the model uses log-probabilities iff the server returns them.

    Raises:
      ServerError: the probe failed or a needed capability is missing (before any model call of the run).
    """
    client = client or OpenAIClient(config)
    caps = probe(config, tokenizer, client=client)
    for capability, needed_by in needs:
        caps.require(capability, needed_by, config.base_url)
    return ServerLanguageModel(config, tokenizer, client=client, max_length=caps.max_model_len,
                               logprobs=caps.logprobs, token_prompts=caps.token_prompts), caps
