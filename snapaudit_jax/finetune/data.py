"""A user's records as DP-SGD units: read, rendered, tokenised, truncated, grouped by user, split, canaried.

One record is one training sequence: a record longer than ``max_length`` tokens is truncated and counted, never
split into several sequences (that would turn one protected unit into several). A unit is a record
(``privacy.unit = "record"``) or all of one user's records (``"user"``), at most ``max_records_per_user`` of
them, chosen before training. The held-out part is a set of whole units (a user is never on both sides); with a
``[sweep]``, a validation split of whole units is taken from the rest the same way.

Every such choice is made for each unit on its own, by a keyed hash of its id (:func:`unit_coin`: SHA-256 of the
run's ``seed``, the choice's name and the id, read as a uniform number in ``[0, 1)``): a unit is held out when its
coin is below ``held_out_fraction``, and a user over the cap keeps the records with the smallest coins. So adding
or removing one unit (a user with all their records, or one record) moves no other unit between training,
held-out and validation, and changes no other user's kept records: the unit guarantee holds for the input file,
not only for the realised training split. The held-out count is therefore binomial, not exact. A unit's id is
its user's canonical id (``privacy.unit = "user"``, :func:`canonical_user`) or its record's rendered text
(``"record"``: identical records share a side).

User ids are compared in one canonical form, so that one person is one unit under every spelling a file may
hold: an integer and its decimal string are one user (``3``, ``"3"``, ``"03"``, ``"+3"``), and a string is
compared after Unicode NFKC normalisation, with its whitespace trimmed and inner runs of whitespace made one
space, and case-folded (``"Ann Lee"``, ``" ann  lee "`` and the full-width ``"ＡＮＮ ＬＥＥ"`` are one user).
Merging can only join spellings into a larger unit, which the user-level guarantee still covers (each person's
records lie inside one unit); splitting one person into two units would not be covered, so the form errs on the
side of merging. Booleans and floats are refused as user ids. The report counts the distinct users and the
users whose records used several spellings.

A ``held_out_path`` file must be disjoint from the training file: the same file (or the same bytes) is refused,
and so are records whose rendered text is also in the training file and, with ``privacy.unit = "user"``, users
who also have training records -- unless ``data.allow_held_out_overlap = true``, which leaves those records out
of the held-out part and counts them in the report.
Canaries (:mod:`snapaudit_jax.dpsgd.canaries`) are units of their own, each inserted with probability
``insert_probability``.

The records file is read in memory (:func:`~snapaudit_jax.utils.records.read_records`): no copy of the
data is written outside the run folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np

from snapaudit_jax.utils.records import read_records
from snapaudit_jax.dpsgd.canaries import CanarySet, make_canaries
from snapaudit_jax.finetune.config import FinetuneConfig
from snapaudit_jax.finetune.synthetic import generated
from snapaudit_jax.models.inference import CONTEXT, TARGET, frame
from snapaudit_jax.utils.config import ConfigFileError
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.files import sha256_file

__all__ = ["FinetuneData", "canonical_user", "load_texts", "prepare_data", "pack_units", "pack_records", "unit_coin",
           "unit_id"]

_DECIMAL = re.compile(r"[+-]?[0-9]+")


def canonical_user(user: Any) -> str:
    """The one form in which user ids are compared (see the module docstring).

    Args:
      user: an ``int`` or a ``str`` as read from the data file.

    Returns:
      The decimal string of an integer (or of a string spelling one: ``"03"`` -> ``"3"``); otherwise the string
      NFKC-normalised, whitespace-trimmed with inner whitespace runs made one space, and case-folded.

    Raises:
      TypeError: ``user`` is a ``bool``, a ``float`` or anything but an ``int`` or ``str``.
      ValueError: a string that is empty once normalised.
    """
    if isinstance(user, bool) or not isinstance(user, (int, str)):
        raise TypeError(f"a user id must be a string or an integer, got {type(user).__name__}")
    if isinstance(user, int):
        return str(user)
    text = " ".join(unicodedata.normalize("NFKC", user).split()).casefold()
    if not text:
        raise ValueError("a user id must not be empty or only whitespace")
    return str(int(text)) if _DECIMAL.fullmatch(text) else text


USER_ID_RULE = ("user ids compared in one canonical form: an integer and its decimal string are one user; strings "
                "NFKC-normalised, whitespace trimmed and collapsed, case-folded")
SPLIT_RULE = ("each unit on its own, by a keyed hash of its id (adding or removing one unit moves no other unit and "
              "changes no other user's kept records)")


def unit_id(user: Any | None, text: str | None = None) -> bytes:
    """The bytes that name a unit (a user) or, with ``text``, a record (of ``user`` if given).

    Args:
      user: the user id (compared in :func:`canonical_user`'s form), or ``None`` for a record-level unit.
      text: the record's rendered text, or ``None`` for the user itself.

    Returns:
      The id's bytes.
    """
    parts = []
    if user is not None:
        parts.append(b"user\0" + canonical_user(user).encode())
    if text is not None:
        parts.append(b"record\0" + text.encode())
    return b"\0".join(parts)


def unit_coin(seed: int, choice: str, ident: bytes) -> float:
    """A unit's uniform number in ``[0, 1)`` for one choice: the first 64 bits of
    ``SHA-256("snapaudit-jax finetune split" | choice | seed | id)`` over ``2**64``.

    Args:
      seed: the run's ``seed``.
      choice: ``"held_out"``, ``"validation"`` or ``"cap"``.
      ident: :func:`unit_id`'s bytes.

    Returns:
      The coin.
    """
    h = hashlib.sha256(b"snapaudit-jax finetune split\0" + choice.encode() + b"\0"
                       + int(seed).to_bytes(8, "little") + ident)
    return int.from_bytes(h.digest()[:8], "little") / 2.0**64


@dataclasses.dataclass(frozen=True)
class FinetuneData:
    """The prepared data of a run (no text is kept beyond what training and evaluation need).

    Attributes:
      train_units: per training unit, its records' token ids (canaries included, one record each). A chat
        record trained on its answers only stores each context token (the system and user turns, the template's
        headers) as ``-1 - id``: attended to, never a target (:func:`pack_units` turns them into a loss mask).
      held_out: token ids of the held-out records (context tokens likewise).
      canaries: the canaries (``None`` without).
      canary_units: indices into ``train_units`` of the inserted canaries.
      stats: counts for the report (records read, truncated, users, capped users, dropped records ...).
      validation: with a ``[sweep]``, token ids of the validation records that score the candidates (whole units
        taken out of training, disjoint from ``held_out``); else empty.
    """

    train_units: tuple[tuple[tuple[int, ...], ...], ...]
    held_out: tuple[tuple[int, ...], ...]
    canaries: CanarySet | None
    canary_units: tuple[int, ...]
    stats: dict[str, Any]
    validation: tuple[tuple[int, ...], ...] = ()

    @property
    def num_units(self) -> int:
        """``N``, the training units (canaries included)."""
        return len(self.train_units)


def _column(columns: dict[str, list], field: str, key: str, source: str) -> list:
    if field not in columns:
        shown = ", ".join(sorted(map(str, columns)))[:300] or "none"
        raise ConfigFileError(f"{key}: the column {field!r} is not in {source} (its columns: {shown})")
    return columns[field]


_PROBE = "snapaudit-system-probe-7f3a"


def _template_default_system(tokenizer, messages: list[dict]) -> bool:
    """Whether the chat template inserts a system prompt of its own into ``messages`` (which have none): the
    conversation rendered alone holds text where a system message of the probe's would stand."""
    plain = tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    probe = tokenizer.apply_chat_template([{"role": "system", "content": _PROBE}] + messages,
                                          add_generation_prompt=False)
    at = probe.find(_PROBE)
    if at < 0:
        return False  # the template drops system messages
    before, after = probe[:at], probe[at + len(_PROBE):]
    return plain.startswith(before) and plain.endswith(after) and len(plain) > len(before) + len(after)


def render_chat(tokenizer, messages: Sequence[dict], *, system_prompt: str = "",
                spans: bool = True) -> tuple[str, tuple[tuple[int, int], ...]]:
    """A conversation rendered once with the model's chat template, and the character spans of its answers.

    Without a system message, ``system_prompt`` (if given) is added as one; else a template that would insert a
    default system prompt of its own (SmolLM2's "You are a helpful AI assistant named SmolLM ...") gets an empty
    system message, so no system prompt is trained on that the data did not hold. An answer's span runs from the
    end of the template's assistant header (the rendering of the conversation before it with the generation
    prompt) to the end of its turn (the rendering up to it, end-of-turn tokens included).

    Args:
      tokenizer: the model's tokenizer (:class:`~snapaudit_jax.models.tokenizer.Tokenizer`).
      messages: ``{"role", "content"}`` dicts.
      system_prompt: the system message for a conversation without one (``""``: none).
      spans: compute the answers' spans (``False``: an empty tuple).

    Returns:
      ``(text, spans)``: the rendered text and the ``[start, end)`` character spans of the assistant turns.

    Raises:
      InputError: a template error, or a template that does not render a conversation's beginning as a prefix of
        the whole (the answers cannot be located).
    """
    msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
    if msgs and msgs[0]["role"] != "system":
        if system_prompt:
            msgs = [{"role": "system", "content": system_prompt}] + msgs
        elif _template_default_system(tokenizer, msgs):
            msgs = [{"role": "system", "content": ""}] + msgs
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=False)
    found = []
    for k, m in enumerate(msgs if spans else ()):
        if m["role"] != "assistant":
            continue
        try:
            head = tokenizer.apply_chat_template(msgs[:k], add_generation_prompt=True)
            whole = tokenizer.apply_chat_template(msgs[:k + 1], add_generation_prompt=False)
        except InputError:
            head = whole = None
        if head is None or not (text.startswith(whole) and whole.startswith(head) and len(whole) > len(head)):
            raise InputError("the chat template does not render the conversation before an answer as a prefix of "
                             "the whole, so the answers cannot be located; set data.train_on = \"all\"")
        found.append((len(head), len(whole)))
    return text, tuple(found)


def load_texts(path: str, config: FinetuneConfig, tokenizer, key: str = "data.path",
               spans: list | None = None, spellings: dict | None = None) -> tuple[list[str], list | None]:
    """The records' texts (chat messages rendered) and their users, from one file.

    Args:
      path: the file.
      config: the run (``data.text_field`` / ``messages_field`` / ``user_field``).
      tokenizer: renders messages with its chat template.
      key: the config key naming ``path`` in errors.
      spans: with chat messages and ``data.train_on = "assistant"``, a list that receives each record's answer
        spans (:func:`render_chat`).
      spellings: a dict that receives, for each canonical user id, the set of ``(type name, value)`` spellings
        read for it.

    Returns:
      ``(texts, users)``; ``users`` (each record's :func:`canonical_user` id) is ``None`` without
      ``data.user_field``.

    Raises:
      ConfigFileError: an unreadable file, no records, a missing column, a text that is not a non-empty string,
        messages that are not a list of ``{"role", "content"}``, or a record without a user, or whose user is not
        a string or an integer (naming the row).
    """
    data = config.data
    if key == "data.path" and data.generate:  # made in memory at run time (finetune.synthetic)
        columns, _ = generated(data.generate, data.generate_units, data.generate_seed)
        path = f"the generated {data.generate} corpus"
    else:
        try:
            columns = read_records(path)
        except InputError as err:
            raise ConfigFileError(f"{key}: {err}") from None
    n = max((len(v) for v in columns.values()), default=0)
    if n == 0:
        raise ConfigFileError(f"{key}: {path} holds no records")
    texts: list[str] = []
    if data.messages_field:
        for i, messages in enumerate(_column(columns, data.messages_field, "data.messages_field", path)):
            if not isinstance(messages, list) or not messages:
                raise ConfigFileError(f"data.messages_field: row {i} of {path} must hold a non-empty list of "
                                      f"messages, got {type(messages).__name__}")
            try:
                text, found = render_chat(tokenizer, messages, system_prompt=data.system_prompt,
                                          spans=spans is not None)
            except InputError as err:
                raise ConfigFileError(f"data.messages_field: row {i} of {path}: {err}") from None
            texts.append(text)
            if spans is not None:
                spans.append(found)
    else:
        for i, text in enumerate(_column(columns, data.text_field, "data.text_field", path)):
            if not isinstance(text, str) or not text.strip():
                kind = "an empty text" if isinstance(text, str) else type(text).__name__
                raise ConfigFileError(f"data.text_field: row {i} of {path} must hold a non-empty text, got {kind}")
            texts.append(text)
    users = None
    if data.user_field:
        users = []
        for i, user in enumerate(_column(columns, data.user_field, "data.user_field", path)):
            try:
                if user is None:
                    raise ValueError
                canonical = canonical_user(user)
            except (TypeError, ValueError):
                shown = ("missing" if user is None or isinstance(user, str) else
                         f"{type(user).__name__}, not a string or an integer")
                raise ConfigFileError(f"data.user_field: row {i} of {path} has no user ({shown}); every record "
                                      "needs one (a string or an integer)") from None
            users.append(canonical)
            if spellings is not None:
                spellings.setdefault(canonical, set()).add((type(user).__name__, user))
    return texts, users


def _truncate(ids: list[int], length: int) -> tuple[tuple[int, ...], bool]:
    return tuple(ids[:length]), len(ids) > length


def _encode(texts: list[str], spans: list | None, tokenizer, config: FinetuneConfig) -> tuple[list, dict[str, int]]:
    """Token records of the texts and the counts of what was cut: ``(records, counts)``.

    A text record is framed (start token, EOS) and truncated to ``max_length``. A chat record is the template's
    rendering as is (no start or EOS token added: the template holds its own). With answer ``spans``, a token is a
    target when it starts inside an answer and context otherwise (stored as ``-1 - id``); the record is cut after
    its last answer that fits ``max_length`` whole, and a record with no whole answer within it (or with no
    answer) is unusable: ``None``, counted, never trained on with its answer cut away.
    """
    data = config.data
    counts = {"truncated": 0, "without_answer": 0, "answer_cut": 0}
    records: list = []
    if not data.messages_field:
        start = frame(tokenizer, "", eos=False)
        end = [int(tokenizer.eos_ids[0])] if tokenizer.eos_ids else []
        for ids in tokenizer.encode_batch(texts):
            row, cut = _truncate(start + list(ids) + end, data.max_length)
            counts["truncated"] += cut
            records.append(row)
        return records, counts
    encodings = tokenizer.backend.encode_batch(list(texts), add_special_tokens=False)
    for i, enc in enumerate(encodings):
        ids = list(enc.ids)
        if spans is None:
            row, cut = _truncate(ids, data.max_length)
            counts["truncated"] += cut
            records.append(row)
            continue
        if not spans[i]:
            counts["without_answer"] += 1
            records.append(None)
            continue
        starts = [o[0] for o in enc.offsets]
        target = [any(a <= x < b for a, b in spans[i]) for x in starts]
        ends = [max((t for t, x in enumerate(starts) if x < b), default=-1) + 1 for _, b in spans[i]]
        fit = [e for e in ends if e <= data.max_length]
        if not fit:
            counts["answer_cut"] += 1
            records.append(None)
            continue
        cut = max(fit)
        counts["truncated"] += cut < len(ids)
        records.append(tuple(t if target[j] else -1 - t for j, t in enumerate(ids[:cut])))
    return records, counts


def prepare_data(config: FinetuneConfig, tokenizer) -> FinetuneData:
    """Reads, renders, tokenises, groups, caps, splits and canaries the records of ``config``.

    Args:
      config: the run.
      tokenizer: the base model's tokenizer.

    Returns:
      The :class:`FinetuneData`.

    Raises:
      ConfigFileError: as :func:`load_texts`; an empty training or held-out part; a canary that does not fit
        ``data.max_length``.
    """
    data, privacy = config.data, config.privacy
    chat_spans = [] if data.messages_field and data.train_on == "assistant" else None
    spellings: dict[str, set] = {}
    texts, users = load_texts(data.path, config, tokenizer, spans=chat_spans, spellings=spellings)
    n_records = len(texts)
    records, counts = _encode(texts, chat_spans, tokenizer, config)
    truncated = counts["truncated"]

    by_user: dict[Any, list[int]] = {}
    if privacy.unit == "user":
        for i, user in enumerate(users):
            by_user.setdefault(user, []).append(i)
        usable = {u: [i for i in rows if records[i] is not None] for u, rows in by_user.items()}
        groups = [rows for rows in usable.values() if rows]
        ids = [unit_id(u) for u, rows in usable.items() if rows]
    else:
        groups = [[i] for i in range(n_records) if records[i] is not None]
        ids = [unit_id(None, texts[g[0]]) for g in groups]
    if not groups:
        raise ConfigFileError(f"data.max_length: no record of {data.path} is usable: {counts['without_answer']} "
                              f"hold no assistant answer and {counts['answer_cut']} have no whole answer within "
                              f"max_length = {data.max_length} tokens; raise max_length or check "
                              "data.messages_field")
    coin = lambda choice, g: unit_coin(config.seed, choice, ids[g])  # noqa: E731

    held: list[tuple[int, ...]] = []
    overlapping = 0
    if data.held_out_path:
        held_spans = [] if chat_spans is not None else None
        held_texts, held_users = load_texts(data.held_out_path, config, tokenizer, key="data.held_out_path",
                                            spans=held_spans)
        shared = _held_out_overlap(config, texts, users, held_texts, held_users)
        overlapping = sum(shared)
        held = [r for r, s in zip(_encode(held_texts, held_spans, tokenizer, config)[0], shared)
                if r is not None and not s]
        train_idx = list(range(len(groups)))
    else:
        fraction = data.held_out_fraction
        held_idx = [g for g in range(len(groups)) if coin("held_out", g) < fraction]
        if not held_idx:
            raise ConfigFileError(
                f"data.held_out_fraction: {fraction} of {len(groups)} units held out none (each unit is held out "
                f"with probability {fraction}, by a keyed hash of its id); raise it or give data.held_out_path")
        if len(held_idx) == len(groups):
            raise ConfigFileError(f"data.held_out_fraction: held out every one of the {len(groups)} units (each "
                                  f"with probability {fraction}); lower it")
        held = [records[i] for g in held_idx for i in groups[g]]
        chosen = set(held_idx)
        train_idx = [g for g in range(len(groups)) if g not in chosen]
    if not held:
        left = f" once the {overlapping} it shares with data.path are left out" if overlapping else ""
        raise ConfigFileError(f"data.held_out_path: {data.held_out_path} holds no records{left}")
    validation: list[tuple[int, ...]] = []
    if config.sweep is not None:
        # Whole units, by a coin of their own (runs without a sweep split as before).
        fraction = config.sweep.validation_fraction
        val_idx = [g for g in train_idx if coin("validation", g) < fraction]
        if not val_idx or len(val_idx) == len(train_idx):
            raise ConfigFileError(
                f"sweep.validation_fraction: {fraction} of the {len(train_idx)} training units held out "
                f"{len(val_idx)} (each with probability {fraction}); it must leave at least one unit on each side")
        validation = [records[i] for g in val_idx for i in groups[g]]
        chosen = set(val_idx)
        train_idx = [g for g in train_idx if g not in chosen]

    capped_users = dropped = 0
    units: list[tuple[tuple[int, ...], ...]] = []
    for g in train_idx:
        group = groups[g]
        if privacy.unit == "user" and len(group) > privacy.max_records_per_user:
            user = users[group[0]]
            coins = [unit_coin(config.seed, "cap", unit_id(user, texts[i])) for i in group]
            order = sorted(range(len(group)), key=lambda j: (coins[j], j))
            keep = sorted(order[:privacy.max_records_per_user])
            capped_users += 1
            dropped += len(group) - privacy.max_records_per_user
            group = [group[j] for j in keep]
        units.append(tuple(records[i] for i in group))
    if not units:
        raise ConfigFileError("data.path: no training units are left after the held-out split")

    canaries, canary_units = None, []
    if config.canaries.n_canaries:
        canaries = make_canaries(config.canaries.canary_config())
        for c in canaries.canaries:
            ids = frame(tokenizer, c.text)
            if len(ids) > data.max_length:
                raise ConfigFileError(f"canaries.template: a canary takes {len(ids)} tokens, more than "
                                      f"data.max_length = {data.max_length}")
            if c.inserted:
                canary_units.append(len(units))
                units.append((tuple(ids),))
    longest_user = max((len(by_user[u]) for u in by_user), default=1) if by_user else 1
    stats = {
        "records_read": n_records,
        "records_truncated": truncated,
        "records_without_answer": counts["without_answer"],
        "records_answer_cut": counts["answer_cut"],
        "train_on": ("assistant turns" if chat_spans is not None else "every token"),
        "max_length": data.max_length,
        "unit": privacy.unit,
        "users": len(by_user) if privacy.unit == "user" else None,
        "users_with_several_spellings": (sum(len(v) > 1 for v in spellings.values()) if privacy.unit == "user"
                                         else None),
        "user_id_rule": (USER_ID_RULE if privacy.unit == "user" else None),
        "records_per_user_max": longest_user if privacy.unit == "user" else None,
        "users_capped": capped_users if privacy.unit == "user" else None,
        "records_dropped_by_cap": dropped if privacy.unit == "user" else 0,
        "max_records_per_user": privacy.max_records_per_user if privacy.unit == "user" else None,
        "train_units": len(units),
        "train_records": sum(len(u) for u in units),
        "held_out_records": len(held),
        "held_out_source": data.held_out_path or f"fraction {data.held_out_fraction} of the units",
        "held_out_records_left_out_as_overlapping": overlapping,
        "split": SPLIT_RULE,
        "canaries": config.canaries.n_canaries,
        "canaries_inserted": len(canary_units),
    }
    if config.sweep is not None:
        stats["validation_records"] = len(validation)
        stats["validation_fraction"] = config.sweep.validation_fraction
    return FinetuneData(tuple(units), tuple(held), canaries, tuple(canary_units), stats, tuple(validation))


def _held_out_overlap(config: FinetuneConfig, texts, users, held_texts, held_users) -> list[bool]:
    """For each held-out record, whether it is shared with the training file: the same rendered text, or (user
    level) a user who also has training records. Refuses the same file, and any overlap unless
    ``data.allow_held_out_overlap``."""
    data = config.data
    try:
        same = os.path.samefile(data.path, data.held_out_path)
        sizes = os.path.getsize(data.path), os.path.getsize(data.held_out_path)
    except OSError:  # both were just read: only a file replaced meanwhile gets here
        same, sizes = False, (0, 1)
    # the bytes are compared only when the sizes allow a copy (each file is read once more)
    copy = not same and sizes[0] == sizes[1] and (
        sha256_file(data.path, "data file") == sha256_file(data.held_out_path, "data file"))
    if same or copy:
        raise ConfigFileError(f"data.held_out_path: {data.held_out_path} is the training file data.path itself "
                              f"({'the same file' if same else 'the same bytes'}): a held-out perplexity must come "
                              "from records never trained on")
    trained = set(texts)
    by_text = [t in trained for t in held_texts]
    by_user = [False] * len(held_texts)
    if config.privacy.unit == "user" and held_users is not None:
        train_users = set(users)
        by_user = [u in train_users for u in held_users]
    shared = [a or b for a, b in zip(by_text, by_user)]
    if any(shared) and not data.allow_held_out_overlap:
        parts = []
        if any(by_text):
            parts.append(f"{sum(by_text)} record(s) whose text is also in data.path")
        if any(by_user):
            parts.append(f"{sum(by_user)} record(s) of users who also have records in data.path (privacy.unit = "
                         "'user'; ids compared in canonical form)")
        raise ConfigFileError(f"data.held_out_path: {data.held_out_path} is not disjoint from the training data: "
                              f"{' and '.join(parts)} of its {len(held_texts)}; the held-out perplexity would be "
                              "computed on trained data. Remove them, or set data.allow_held_out_overlap = true to "
                              "leave them out of the held-out part (counted in the report)")
    return shared


def _context_marked(rows) -> bool:
    return any(t < 0 for r in rows for t in r)


def pack_units(units: Sequence[Sequence[Sequence[int]]], *, user_level: bool, length: int | None = None):
    """Right-padded token and mask arrays of the units, for :func:`snapaudit_jax.dpsgd.train`.

    Args:
      units: per unit, its records' ids (a context token, never a target, as ``-1 - id``).
      user_level: ``(N, k, L)`` arrays (``k`` the largest unit, empty rows padding) instead of ``(N, L)``.
      length: ``L`` (default: the longest record).

    Returns:
      ``(tokens, mask)``: int32 ids and a bool real-token mask, or, when a record holds context tokens, an int8
      loss mask (``0`` padding, ``CONTEXT``, ``TARGET``; :func:`~snapaudit_jax.models.inference.token_logprobs`).
    """
    longest = max(len(r) for u in units for r in u)
    length = longest if length is None else length
    if not user_level:
        return pack_records([u[0] for u in units], length=length)
    k = max(len(u) for u in units)
    rows = [r for u in units for r in u]
    tokens = np.zeros((len(units), k, length), np.int32)
    mask = np.zeros((len(units), k, length), np.int8 if _context_marked(rows) else bool)
    for i, unit in enumerate(units):
        for j, row in enumerate(unit):
            tokens[i, j, :len(row)], mask[i, j, :len(row)] = _row(row, mask.dtype)
    return tokens, mask


def _row(row: Sequence[int], dtype) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(row, np.int64)
    context = ids < 0
    tokens = np.where(context, -1 - ids, ids)
    if dtype == np.bool_:
        return tokens, np.ones(ids.shape, bool)
    return tokens, np.where(context, CONTEXT, TARGET).astype(np.int8)


def pack_records(records: Sequence[Sequence[int]], *, length: int | None = None):
    """Right-padded ``(N, L)`` token and mask arrays of records.

    Args:
      records: the records' ids (a context token as ``-1 - id``).
      length: ``L`` (default: the longest).

    Returns:
      ``(tokens, mask)``: int32 ids and a bool mask, or an int8 loss mask as :func:`pack_units`.
    """
    length = max(len(r) for r in records) if length is None else length
    tokens = np.zeros((len(records), length), np.int32)
    mask = np.zeros((len(records), length), np.int8 if _context_marked(records) else bool)
    for i, row in enumerate(records):
        row = row[:length]
        tokens[i, :len(row)], mask[i, :len(row)] = _row(row, mask.dtype)
    return tokens, mask
