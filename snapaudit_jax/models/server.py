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

:class:`~snapaudit_jax.models.client.OpenAIClient` is the transport (:mod:`~snapaudit_jax.models.client`;
the configuration is :mod:`~snapaudit_jax.models.server_config`'s, the checks of answers
:mod:`~snapaudit_jax.models.verification`'s): bounded concurrency; a deadline of ``timeout_s`` on each whole attempt
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

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence

import numpy as np

from snapaudit_jax.models.client import MAX_BODY_BYTES, OpenAIClient
from snapaudit_jax.models.lm import Generation, chat_prompt, prompt_ids
from snapaudit_jax.models.server_config import ServerConfig, server_from_table
from snapaudit_jax.models.tokenizer import Tokenizer
from snapaudit_jax.models.verification import (
    _BadAnswer,
    _check_fingerprint,
    _check_model,
    _choices,
    _echo_kind,
    _fingerprint,
    _rendering_mismatch,
    echoed_logprobs,
)
from snapaudit_jax.utils.errors import InputError, ServerError

__all__ = ["Capabilities", "MAX_BODY_BYTES", "OpenAIClient", "ServerConfig", "ServerLanguageModel", "connect",
           "echoed_logprobs", "probe", "connect_configured", "server_from_table"]


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
