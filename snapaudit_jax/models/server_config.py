"""How to reach an OpenAI-compatible model server: :class:`ServerConfig` (address, model, key variable, deadlines,
retries, concurrency) and its ``[model.server]`` table (:func:`server_from_table`), every value checked before
any connection (:mod:`snapaudit_jax.models.server`)."""

from __future__ import annotations

import dataclasses
import math
import urllib.parse

from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.secrets import redact_url

__all__ = ["RETRY_STATUS", "ServerConfig", "server_from_table"]

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})

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
