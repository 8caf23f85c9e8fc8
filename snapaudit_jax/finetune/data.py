"""A user's records as DP-SGD units: read, rendered, tokenised, truncated, grouped by user, split, canaried.

One record is one training sequence: a record longer than ``max_length`` tokens is truncated and counted, never
split into several sequences (that would turn one protected unit into several). A unit is a record
(``privacy.unit = "record"``) or all of one user's records (``"user"``), at most ``max_records_per_user`` of
them, drawn without replacement before training. The held-out part is a set of whole units (a user is never on
both sides); with a ``[sweep]``, a validation split of whole units is taken from the rest the same way.
Canaries (:mod:`snapaudit_jax.dpsgd.canaries`) are units of their own, each inserted with probability
``insert_probability``.

The records file is read in memory (:func:`~snapaudit_jax.dpicl.data.records.read_records`): no copy of the
data is written outside the run folder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from snapaudit_jax.dpicl.data.records import read_records
from snapaudit_jax.dpsgd.canaries import CanarySet, make_canaries
from snapaudit_jax.finetune.config import FinetuneConfig
from snapaudit_jax.models.inference import frame
from snapaudit_jax.utils.config import ConfigFileError
from snapaudit_jax.utils.errors import InputError

__all__ = ["FinetuneData", "load_texts", "prepare_data", "pack_units", "pack_records"]


@dataclasses.dataclass(frozen=True)
class FinetuneData:
    """The prepared data of a run (no text is kept beyond what training and evaluation need).

    Attributes:
      train_units: per training unit, its records' token ids (canaries included, one record each).
      held_out: token ids of the held-out records.
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


def load_texts(path: str, config: FinetuneConfig, tokenizer, key: str = "data.path") -> tuple[list[str], list | None]:
    """The records' texts (chat messages rendered) and their users, from one file.

    Args:
      path: the file.
      config: the run (``data.text_field`` / ``messages_field`` / ``user_field``).
      tokenizer: renders messages with its chat template.
      key: the config key naming ``path`` in errors.

    Returns:
      ``(texts, users)``; ``users`` is ``None`` without ``data.user_field``.

    Raises:
      ConfigFileError: an unreadable file, no records, a missing column, a text that is not a non-empty string,
        messages that are not a list of ``{"role", "content"}``, or a record without a user (naming the row).
    """
    data = config.data
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
                texts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=False))
            except InputError as err:
                raise ConfigFileError(f"data.messages_field: row {i} of {path}: {err}") from None
    else:
        for i, text in enumerate(_column(columns, data.text_field, "data.text_field", path)):
            if not isinstance(text, str) or not text.strip():
                kind = "an empty text" if isinstance(text, str) else type(text).__name__
                raise ConfigFileError(f"data.text_field: row {i} of {path} must hold a non-empty text, got {kind}")
            texts.append(text)
    users = None
    if data.user_field:
        users = list(_column(columns, data.user_field, "data.user_field", path))
        for i, user in enumerate(users):
            if user is None or (isinstance(user, str) and not user.strip()) or isinstance(user, (list, dict, float)):
                shown = "missing" if user is None or isinstance(user, str) else type(user).__name__
                raise ConfigFileError(f"data.user_field: row {i} of {path} has no user ({shown}); every record "
                                      "needs one (a string or an integer)")
    return texts, users


def _truncate(ids: list[int], length: int) -> tuple[tuple[int, ...], bool]:
    return tuple(ids[:length]), len(ids) > length


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
    rng = np.random.default_rng([config.seed, 0xF17E])
    texts, users = load_texts(data.path, config, tokenizer)
    n_records = len(texts)
    encoded = tokenizer.encode_batch(texts)
    start = frame(tokenizer, "", eos=False)
    end = [int(tokenizer.eos_ids[0])] if tokenizer.eos_ids else []
    truncated = 0
    records = []
    for ids in encoded:
        row, cut = _truncate(start + list(ids) + end, data.max_length)
        truncated += cut
        records.append(row)
    del texts, encoded

    by_user: dict[Any, list[int]] = {}
    if privacy.unit == "user":
        for i, user in enumerate(users):
            by_user.setdefault(user, []).append(i)
        groups = list(by_user.values())
    else:
        groups = [[i] for i in range(n_records)]

    held: list[tuple[int, ...]] = []
    if data.held_out_path:
        held_texts, _ = load_texts(data.held_out_path, config, tokenizer, key="data.held_out_path")
        for ids in tokenizer.encode_batch(held_texts):
            held.append(_truncate(start + list(ids) + end, data.max_length)[0])
        train_groups = groups
    else:
        order = rng.permutation(len(groups))
        n_held = int(round(data.held_out_fraction * len(groups)))
        if n_held == 0:
            raise ConfigFileError(
                f"data.held_out_fraction: {data.held_out_fraction} of {len(groups)} units holds out none; raise it "
                "or give data.held_out_path")
        if n_held >= len(groups):
            raise ConfigFileError(f"data.held_out_fraction: holds out every one of the {len(groups)} units")
        held = [records[i] for g in sorted(order[:n_held]) for i in groups[g]]
        train_groups = [groups[g] for g in sorted(order[n_held:])]
    if not held:
        raise ConfigFileError(f"data.held_out_path: {data.held_out_path} holds no records")
    validation: list[tuple[int, ...]] = []
    if config.sweep is not None:
        # Whole units, drawn from a stream of their own (runs without a sweep split as before).
        fraction = config.sweep.validation_fraction
        order = np.random.default_rng([config.seed, 0x5EE9]).permutation(len(train_groups))
        n_val = int(round(fraction * len(train_groups)))
        if n_val == 0 or n_val >= len(train_groups):
            raise ConfigFileError(
                f"sweep.validation_fraction: {fraction} of the {len(train_groups)} training units holds out "
                f"{n_val}; it must leave at least one unit on each side")
        validation = [records[i] for g in sorted(order[:n_val]) for i in train_groups[g]]
        train_groups = [train_groups[g] for g in sorted(order[n_val:])]

    capped_users = dropped = 0
    units: list[tuple[tuple[int, ...], ...]] = []
    for group in train_groups:
        if privacy.unit == "user" and len(group) > privacy.max_records_per_user:
            keep = rng.choice(len(group), size=privacy.max_records_per_user, replace=False)
            capped_users += 1
            dropped += len(group) - privacy.max_records_per_user
            group = [group[j] for j in sorted(keep)]
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
        "max_length": data.max_length,
        "unit": privacy.unit,
        "users": len(by_user) if privacy.unit == "user" else None,
        "records_per_user_max": longest_user if privacy.unit == "user" else None,
        "users_capped": capped_users if privacy.unit == "user" else None,
        "records_dropped_by_cap": dropped if privacy.unit == "user" else 0,
        "max_records_per_user": privacy.max_records_per_user if privacy.unit == "user" else None,
        "train_units": len(units),
        "train_records": sum(len(u) for u in units),
        "held_out_records": len(held),
        "held_out_source": data.held_out_path or f"fraction {data.held_out_fraction} of the units",
        "canaries": config.canaries.n_canaries,
        "canaries_inserted": len(canary_units),
    }
    if config.sweep is not None:
        stats["validation_records"] = len(validation)
        stats["validation_fraction"] = config.sweep.validation_fraction
    return FinetuneData(tuple(units), tuple(held), canaries, tuple(canary_units), stats, tuple(validation))


def pack_units(units: Sequence[Sequence[Sequence[int]]], *, user_level: bool, length: int | None = None):
    """Right-padded token and mask arrays of the units, for :func:`snapaudit_jax.dpsgd.train`.

    Args:
      units: per unit, its records' ids.
      user_level: ``(N, k, L)`` arrays (``k`` the largest unit, empty rows padding) instead of ``(N, L)``.
      length: ``L`` (default: the longest record).

    Returns:
      ``(tokens, mask)`` int32 / bool.
    """
    longest = max(len(r) for u in units for r in u)
    length = longest if length is None else length
    if not user_level:
        return pack_records([u[0] for u in units], length=length)
    k = max(len(u) for u in units)
    tokens = np.zeros((len(units), k, length), np.int32)
    mask = np.zeros((len(units), k, length), bool)
    for i, unit in enumerate(units):
        for j, row in enumerate(unit):
            tokens[i, j, :len(row)] = row
            mask[i, j, :len(row)] = True
    return tokens, mask


def pack_records(records: Sequence[Sequence[int]], *, length: int | None = None):
    """Right-padded ``(N, L)`` token and mask arrays of records.

    Args:
      records: the records' ids.
      length: ``L`` (default: the longest).

    Returns:
      ``(tokens, mask)`` int32 / bool.
    """
    length = max(len(r) for r in records) if length is None else length
    tokens = np.zeros((len(records), length), np.int32)
    mask = np.zeros((len(records), length), bool)
    for i, row in enumerate(records):
        tokens[i, :len(row)] = row[:length]
        mask[i, :len(row)] = True
    return tokens, mask
