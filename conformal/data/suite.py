"""The linkage suite: released documents, their true identities and the attacker's candidate pool.

A :class:`LinkageSuite` is one declared threat configuration of the CPA paper
(Section 3, Table 8): a release mechanism applied to ``n`` documents, a
knowledge level ``w`` that fixes what the attacker's candidate profiles
contain, and a finite candidate pool ``Y(x, w)`` of ``m`` identities. It is
plain immutable data (tuples and read-only mappings) and JSON round-trips.

Open world: a document whose identity is not among ``candidates`` gets label
``-1`` in :meth:`LinkageSuite.label_indices`; :meth:`LinkageSuite.miss_rate`
is the empirical candidate-miss rate ``rho(w)`` (eq. 3).

References:
  Huang et al. 2026, Conformal Privacy Auditing, Sections 3 and 6.1, Tables 7-8.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from snapaudit_jax.utils.errors import InputError, MissingFileError
from snapaudit_jax.utils.files import read_regular

__all__ = ["LinkageSuite", "FORMAT_VERSION"]

FORMAT_VERSION = 1

def _as_str_tuple(field: str, values: Any, *, allow_none: bool = False) -> tuple:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InputError(f"{field} must be a sequence of strings, got {type(values).__name__}")
    out = tuple(values)
    for i, v in enumerate(out):
        if v is None and allow_none:
            continue
        if not isinstance(v, str):
            raise InputError(f"{field}[{i}] must be a string{' or None' if allow_none else ''}, got {v!r}")
    return out


def _check_json(field: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InputError(f"{field} must be JSON-serialisable, got {value!r} ({e})") from None


def _freeze_json(value: Any) -> Any:
    """Read-only deep copy of JSON-like data (dicts become mappingproxies, lists tuples)."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze_json(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze_json(v) for v in value)
    return value


def _thaw_json(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw_json(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw_json(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class LinkageSuite:
    """One release x knowledge-level configuration of an identity-linkage audit.

    Shapes: ``n = len(documents)`` released documents, ``m = len(candidates)``
    candidate identities.

    Attributes:
      name: Suite name, e.g. ``"synthetic/K2/direct"``, ``"blog/W3"``, ``"tab/K1"``.
      knowledge_level: Attacker knowledge level ``w``: ``"K1"``, ``"K2"``, ``"K3"``,
        ``"W1"``, ``"W3"``, ``"W10"``, ``"demo"`` or another declared string.
      release: Release mechanism that produced ``documents`` (``"direct"``,
        ``"quasi_id_redaction"``, ``"rewrite"``, or a dataset-specific name).
      documents: ``(n,)`` released texts.
      doc_ids: ``(n,)`` unique document ids.
      identities: ``(n,)`` true identity id of each document's subject.
      candidates: ``(m,)`` unique candidate identity ids (the pool ``Y(x, w)``).
      profiles: ``(m,)`` profile text of each candidate (the attacker's side information).
      attributes: Attribute name -> its finite value vocabulary (unique strings), for
        attribute-extraction attackers. May be empty.
      candidate_attributes: Attribute -> ``(m,)`` value of each candidate (``None``:
        unknown). Every key must be declared in ``attributes``.
      document_attributes: Attribute -> ``(n,)`` true value for each document's
        subject (ground truth for tests and evaluation, never attacker input).
      meta: JSON-serialisable generator/loader parameters (seed, sizes, paths, ...).

    Raises:
      ValueError: On construction, naming the field, the rule and the offending value,
        if a length disagrees, ids repeat, a value lies outside its vocabulary, a text
        is not a string, or a required sequence is empty.
    """

    name: str
    knowledge_level: str
    release: str
    documents: tuple[str, ...]
    doc_ids: tuple[str, ...]
    identities: tuple[str, ...]
    candidates: tuple[str, ...]
    profiles: tuple[str, ...]
    attributes: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    candidate_attributes: Mapping[str, tuple[str | None, ...]] = dataclasses.field(default_factory=dict)
    document_attributes: Mapping[str, tuple[str | None, ...]] = dataclasses.field(default_factory=dict)
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        def put(field: str, value: Any) -> None:
            object.__setattr__(self, field, value)

        for field in ("name", "knowledge_level", "release"):
            v = getattr(self, field)
            if not isinstance(v, str) or not v:
                raise InputError(f"{field} must be a non-empty string, got {v!r}")
        for field in ("documents", "doc_ids", "identities", "candidates", "profiles"):
            put(field, _as_str_tuple(field, getattr(self, field)))
        n, m = len(self.documents), len(self.candidates)
        if n == 0:
            raise InputError("documents must be non-empty, got 0 documents")
        if m == 0:
            raise InputError("candidates must be non-empty, got 0 candidates")
        for field, want, what in (("doc_ids", n, "document"), ("identities", n, "document"),
                                  ("profiles", m, "candidate")):
            got = len(getattr(self, field))
            if got != want:
                raise InputError(f"{field} must have one entry per {what} ({want}), got {got}")
        for field in ("doc_ids", "candidates"):
            seen: dict[str, int] = {}
            for i, v in enumerate(getattr(self, field)):
                if v in seen:
                    raise InputError(f"{field} must be unique, got {v!r} at positions {seen[v]} and {i}")
                seen[v] = i

        if not isinstance(self.attributes, Mapping):
            raise InputError(f"attributes must be a mapping, got {type(self.attributes).__name__}")
        vocab: dict[str, tuple[str, ...]] = {}
        for attr, values in self.attributes.items():
            if not isinstance(attr, str) or not attr:
                raise InputError(f"attributes keys must be non-empty strings, got {attr!r}")
            vals = _as_str_tuple(f"attributes[{attr!r}]", values)
            if not vals:
                raise InputError(f"attributes[{attr!r}] must be a non-empty vocabulary, got ()")
            if len(set(vals)) != len(vals):
                dup = next(v for v in vals if vals.count(v) > 1)
                raise InputError(f"attributes[{attr!r}] must have unique values, got {dup!r} twice")
            vocab[attr] = vals
        put("attributes", MappingProxyType(vocab))

        for field, length, what in (
            ("candidate_attributes", m, "candidate"),
            ("document_attributes", n, "document"),
        ):
            table = getattr(self, field)
            if not isinstance(table, Mapping):
                raise InputError(f"{field} must be a mapping, got {type(table).__name__}")
            frozen = {}
            for attr, values in table.items():
                if attr not in vocab:
                    raise InputError(f"{field} key {attr!r} must be declared in attributes {sorted(vocab)}")
                vals = _as_str_tuple(f"{field}[{attr!r}]", values, allow_none=True)
                if len(vals) != length:
                    raise InputError(f"{field}[{attr!r}] must have one value per {what} ({length}), got {len(vals)}")
                allowed = set(vocab[attr])
                for i, v in enumerate(vals):
                    if v is not None and v not in allowed:
                        raise InputError(
                            f"{field}[{attr!r}][{i}] must be in the vocabulary attributes[{attr!r}], got {v!r}"
                        )
                frozen[attr] = vals
            put(field, MappingProxyType(frozen))

        if not isinstance(self.meta, Mapping):
            raise InputError(f"meta must be a mapping, got {type(self.meta).__name__}")
        _check_json("meta", _thaw_json(dict(self.meta)))
        put("meta", _freeze_json(dict(self.meta)))

    # -- sizes and labels ------------------------------------------------------------------------

    @property
    def n_documents(self) -> int:
        """The number of released documents."""
        return len(self.documents)

    @property
    def n_candidates(self) -> int:
        """The size of the candidate pool."""
        return len(self.candidates)

    def label_indices(self) -> np.ndarray:
        """Position of each document's true identity in ``candidates``.

        Returns:
          ``(n,)`` int64 array; ``-1`` where the identity is absent from the pool (open world).
        """
        pos = {c: j for j, c in enumerate(self.candidates)}
        return np.fromiter((pos.get(y, -1) for y in self.identities), dtype=np.int64, count=self.n_documents)

    def miss_rate(self) -> float:
        """Empirical candidate-miss rate: the share of documents whose identity is not in the pool (eq. 3)."""
        return float(np.mean(self.label_indices() < 0))

    def check_closed_world(self) -> LinkageSuite:
        """Asserts the closed-world condition (every document's identity is a candidate) and returns ``self``.

        Use it where a configuration is declared closed-world (Theorem 5.2); open-world suites
        instead report :meth:`miss_rate` and carry label ``-1`` for the misses.

        Raises:
          ValueError: naming the first document whose identity is not in ``candidates``, and the miss rate.
        """
        labels = self.label_indices()
        missing = np.flatnonzero(labels < 0)
        if missing.size:
            i = int(missing[0])
            raise InputError(
                f"identities[{i}] = {self.identities[i]!r} (doc_id {self.doc_ids[i]!r}) must be in candidates "
                f"(closed world) in suite {self.name!r}, got {missing.size} of {self.n_documents} documents outside "
                f"the pool (miss rate {missing.size / self.n_documents:.4g})"
            )
        return self

    # -- derived suites --------------------------------------------------------------------------

    def subset(self, indices: Sequence[int] | np.ndarray) -> LinkageSuite:
        """The same pool with only the documents at ``indices`` (in that order).

        Args:
          indices: ``(k,)`` distinct positions in ``range(n)``, or a boolean mask of length ``n``.

        Returns:
          A new suite; ``meta`` gains ``parent_n_documents``.

        Raises:
          ValueError: if an index is out of range or repeated, or the subset is empty.
        """
        idx = self._indices("indices", indices, self.n_documents)
        pick = lambda seq: tuple(seq[i] for i in idx)  # noqa: E731
        return dataclasses.replace(
            self,
            documents=pick(self.documents),
            doc_ids=pick(self.doc_ids),
            identities=pick(self.identities),
            document_attributes={k: pick(v) for k, v in self.document_attributes.items()},
            meta={**_thaw_json(dict(self.meta)), "parent_n_documents": self.n_documents},
        )

    def subset_candidates(self, indices: Sequence[int] | np.ndarray) -> LinkageSuite:
        """The same documents with the candidate pool restricted to ``indices`` (in that order).

        Documents whose identity is dropped become open-world misses (label ``-1``).

        Args:
          indices: ``(k,)`` distinct positions in ``candidates``.

        Returns:
          A new suite with ``k`` candidates and the same documents.

        Raises:
          ValueError: if an index is out of range or repeated, or the pool becomes empty.
        """
        idx = self._indices("indices", indices, self.n_candidates)
        pick = lambda seq: tuple(seq[i] for i in idx)  # noqa: E731
        return dataclasses.replace(
            self,
            candidates=pick(self.candidates),
            profiles=pick(self.profiles),
            candidate_attributes={k: pick(v) for k, v in self.candidate_attributes.items()},
            meta={**_thaw_json(dict(self.meta)), "parent_n_candidates": self.n_candidates},
        )

    @staticmethod
    def _indices(field: str, indices: Any, size: int) -> list[int]:
        arr = np.asarray(indices)
        if arr.dtype == bool:
            if arr.shape != (size,):
                raise InputError(f"{field} as a mask must have shape ({size},), got {arr.shape}")
            arr = np.flatnonzero(arr)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise InputError(f"{field} must be a 1-D sequence of integers, got {indices!r}")
        out = [int(i) for i in arr]
        if not out:
            raise InputError(f"{field} must select at least one entry, got none")
        bad = [i for i in out if not 0 <= i < size]
        if bad:
            raise InputError(f"{field} must lie in [0, {size}), got {bad[0]}")
        if len(set(out)) != len(out):
            raise InputError(f"{field} must not repeat, got {next(i for i in out if out.count(i) > 1)} twice")
        return out

    # -- reporting -------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Sizes and simple statistics (JSON-serialisable)."""
        words = lambda texts: float(np.mean([len(t.split()) for t in texts]))  # noqa: E731
        return {
            "name": self.name,
            "knowledge_level": self.knowledge_level,
            "release": self.release,
            "n_documents": self.n_documents,
            "n_candidates": self.n_candidates,
            "n_identities": len(set(self.identities)),
            "miss_rate": self.miss_rate(),
            "mean_document_words": words(self.documents),
            "mean_profile_words": words(self.profiles),
            "attributes": {k: len(v) for k, v in self.attributes.items()},
        }

    # -- serialisation ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (lists instead of tuples), with a ``format_version``."""
        return {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "knowledge_level": self.knowledge_level,
            "release": self.release,
            "documents": list(self.documents),
            "doc_ids": list(self.doc_ids),
            "identities": list(self.identities),
            "candidates": list(self.candidates),
            "profiles": list(self.profiles),
            "attributes": {k: list(v) for k, v in self.attributes.items()},
            "candidate_attributes": {k: list(v) for k, v in self.candidate_attributes.items()},
            "document_attributes": {k: list(v) for k, v in self.document_attributes.items()},
            "meta": _thaw_json(dict(self.meta)),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LinkageSuite:
        """Inverse of :meth:`to_dict`.

        Args:
          data: a record of :meth:`to_dict` (``format_version`` included).

        Returns:
          The suite.

        Raises:
          ValueError: if ``data`` is not a mapping, has another ``format_version``, lacks a
            required field, or fails the constructor's validation.
        """
        if not isinstance(data, Mapping):
            raise InputError(f"a LinkageSuite record must be a JSON object, got {type(data).__name__}")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise InputError(f"format_version must be {FORMAT_VERSION}, got {version!r}")
        required = ("name", "knowledge_level", "release", "documents", "doc_ids", "identities", "candidates",
                    "profiles")
        missing = [f for f in required if f not in data]
        if missing:
            raise InputError(f"a LinkageSuite record must have field {missing[0]!r}; missing {missing}")
        kwargs = {f: data[f] for f in required}
        for f in ("attributes", "candidate_attributes", "document_attributes", "meta"):
            kwargs[f] = data.get(f, {})
        return cls(**kwargs)

    def to_json(self) -> str:
        """The suite as a JSON string (:meth:`to_dict`; non-ASCII kept, NaN refused).

        Returns:
          The JSON text.
        """
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> LinkageSuite:
        """Inverse of :meth:`to_json`.

        Args:
          text: the JSON text.

        Returns:
          The suite.

        Raises:
          ValueError: if ``text`` is not valid JSON, or as :meth:`from_dict`.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"a LinkageSuite must be valid JSON: {e}") from None
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the suite as JSON atomically (temporary file in the same folder + ``os.replace``).

        Args:
          path: the output file.
        """
        from snapaudit_jax.utils.io import atomic_write

        data = self.to_json().encode("utf-8")
        atomic_write(path, lambda fh: fh.write(data))

    @classmethod
    def load(cls, path: str | os.PathLike) -> LinkageSuite:
        """Reads a suite written by :meth:`save`.

        Args:
          path: a file written by :meth:`save`.

        Returns:
          The suite.

        Raises:
          FileNotFoundError: if ``path`` does not exist.
          ValueError: naming the file, if it is not a file, not UTF-8, not JSON or not a valid suite.
        """
        path = os.fspath(path)
        if not os.path.exists(path):
            raise MissingFileError(f"LinkageSuite file {path!r} does not exist")
        raw = read_regular(path, "LinkageSuite file")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{path}: a LinkageSuite file must be UTF-8 JSON ({e})") from None
        try:
            return cls.from_json(text)
        except ValueError as e:
            raise InputError(f"{path}: {e}") from None
