"""Answers of a model server verified, never trusted: the served model named in every answer, the system
fingerprint the probe saw, choices matched by a permutation of their indices, and the echoed prompt tokens
equal to the ids sent (:mod:`snapaudit_jax.models.server`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from snapaudit_jax.models.server_config import ServerConfig
from snapaudit_jax.models.tokenizer import Tokenizer
from snapaudit_jax.utils.errors import ServerError

__all__ = ["echoed_logprobs"]

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
