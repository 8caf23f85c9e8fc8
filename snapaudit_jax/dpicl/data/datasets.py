"""The four DP-ICL audit datasets: specs, loading, validation and audit contexts.

The SnapAudit DP-ICL audits use two classification datasets (AG News, TREC) and two summarisation datasets
(SAMSum, XSum). Every source is read into one common record, :class:`Example`, after checking every row that is
returned: a bad file raises ``ValueError`` rather than yielding partial data.

Sources (``path`` argument of :func:`load_examples`):

* ``None`` -- the small demo file shipped with the package (``demo/<name>_demo.jsonl``, split ``"train"`` only),
  written for this project and read with the standard library, so tests and the quickstart run offline and
  without ``datasets``;
* a local ``.jsonl``/``.json``/``.csv``/``.parquet`` file, or a directory holding one ``<split>.<ext>`` file per
  split -- read into memory by :func:`~snapaudit_jax.utils.records.read_records`, which writes nothing
  anywhere (no copy of the records in a Hugging Face cache);
* ``"hub"`` -- the Hugging Face Hub copy of the dataset, read with ``datasets.load_dataset`` and cached where
  ``datasets`` caches (public data; network access; never used in the tests).

References:
  SnapAudit, the DP-ICL audit: neighbouring contexts C1 = {e_1, ..., e_{k-1}, e_canary} and C0 = {e_1, ..., e_k}.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import importlib.util
import json
import math
import os
import re
import types
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from snapaudit_jax.utils.records import FORMATS, read_records
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "DATASETS",
    "AuditContext",
    "DatasetSpec",
    "Example",
    "get_spec",
    "load_examples",
    "sample_audit_context",
]

_TASKS = ("classification", "summarization")
_SPLIT_RE = re.compile(r"\w+(\.\w+)*")


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    r"""How one dataset's columns map onto :class:`Example`.

    Attributes:
      name: short name used by :func:`load_examples` (``"agnews"``, ``"trec"``, ``"samsum"``, ``"xsum"``).
      task: ``"classification"`` or ``"summarization"``.
      text_fields: columns joined (with ``"\n"``, in order) into :attr:`Example.text`.
      label_field: for classification the integer class column (:attr:`Example.label`); for summarisation the
        reference summary column (:attr:`Example.target`).
      label_names: class names in label order (label ``i`` is ``label_names[i]``); empty for summarisation.
      hub_id: the Hugging Face Hub id used by ``path="hub"``.
      label_aliases: other accepted names of ``label_field`` (older releases), tried in order after it.
      id_field: column holding an example id; when a source has no such column, ids are ``"<name>-<split>-<row>"``.

    Raises:
      InputError: (on construction) an unknown ``task``, no ``text_fields``, or ``label_names`` empty for
        classification / non-empty for summarisation.
    """

    name: str
    task: str
    text_fields: tuple[str, ...]
    label_field: str
    label_names: tuple[str, ...]
    hub_id: str
    label_aliases: tuple[str, ...] = ()
    id_field: str = "id"

    def __post_init__(self):
        if self.task not in _TASKS:
            raise InputError(f"DatasetSpec.task must be one of {_TASKS}, got {self.task!r}")
        if not self.text_fields:
            raise InputError(f"DatasetSpec.text_fields must name at least one column, got {self.text_fields!r}")
        if (self.task == "classification") != bool(self.label_names):
            raise InputError(
                f"DatasetSpec.label_names must be non-empty exactly for classification, got task={self.task!r} "
                f"and label_names={self.label_names!r}"
            )

    @property
    def num_classes(self) -> int:
        """Number of classes (0 for summarisation)."""
        return len(self.label_names)

    @property
    def demo_file(self) -> str:
        """File name of the shipped demo data, inside ``snapaudit_jax/data/demo/``."""
        return f"{self.name}_demo.jsonl"


DATASETS: Mapping[str, DatasetSpec] = types.MappingProxyType(
    {
        "agnews": DatasetSpec(
            name="agnews",
            task="classification",
            text_fields=("text",),
            label_field="label",
            label_names=("World", "Sports", "Business", "Sci/Tech"),
            hub_id="ag_news",
        ),
        "trec": DatasetSpec(
            name="trec",
            task="classification",
            text_fields=("text",),
            label_field="coarse_label",
            label_names=("ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM"),
            hub_id="trec",
            label_aliases=("label-coarse",),
        ),
        "samsum": DatasetSpec(
            name="samsum",
            task="summarization",
            text_fields=("dialogue",),
            label_field="summary",
            label_names=(),
            hub_id="knkarthick/samsum",
        ),
        "xsum": DatasetSpec(
            name="xsum",
            task="summarization",
            text_fields=("document",),
            label_field="summary",
            label_names=(),
            hub_id="EdinburghNLP/xsum",
        ),
    }
)
"""The supported datasets by name (read-only)."""


@dataclasses.dataclass(frozen=True)
class Example:
    """One record, common to all four datasets.

    Attributes:
      text: the input -- the news snippet or question (classification), the dialogue or document (summarisation).
      label: the class index (classification), else ``None``.
      target: the reference summary (summarisation), else ``None``.
      id: an identifier, unique within the source it was loaded from.

    Raises:
      InputError: (on construction) an empty ``text`` or ``id``, both or neither of ``label`` and ``target``, a
        ``label`` that is not an integer ``>= 0``, or an empty ``target``.
    """

    text: str
    label: int | None
    target: str | None
    id: str

    def __post_init__(self):
        if not isinstance(self.text, str) or not self.text.strip():
            raise InputError(f"Example.text must be a non-empty string, got {self.text!r}")
        if (self.label is None) == (self.target is None):
            raise InputError(
                f"Example must have exactly one of label (classification) and target (summarization), got "
                f"label={self.label!r} and target={self.target!r}"
            )
        if self.label is not None and (
            isinstance(self.label, bool) or not isinstance(self.label, int) or self.label < 0
        ):
            raise InputError(f"Example.label must be an integer >= 0, got {self.label!r}")
        if self.target is not None and (not isinstance(self.target, str) or not self.target.strip()):
            raise InputError(f"Example.target must be a non-empty string, got {self.target!r}")
        if not isinstance(self.id, str) or not self.id:
            raise InputError(f"Example.id must be a non-empty string, got {self.id!r}")


@dataclasses.dataclass(frozen=True)
class AuditContext:
    """A pair of neighbouring in-context exemplar sets for one DP-ICL audit.

    The two contexts have the same length ``k = len(exemplars) + 1`` and differ in exactly one position,
    ``position``, which holds the canary in :attr:`with_canary` and the replacement in :attr:`without_canary`
    (the canary *replaces* one exemplar).

    Attributes:
      canary: the example whose presence the audit tests for.
      replacement: the exemplar the canary replaces (the ``k``-th exemplar of the clean context).
      exemplars: the ``k - 1`` exemplars shared by both contexts, in prompt order.
      position: index in ``[0, k)`` of the canary/replacement in the contexts.

    Raises:
      InputError: (on construction) fields of the wrong type, ``position`` outside ``[0, k)``, or a canary with
        the replacement's content.

    References:
      SnapAudit, DP-ICL audit: C1 = {e_1, ..., e_{k-1}, e_canary} (``b = 1``) and C0 = {e_1, ..., e_k} (``b = 0``).
    """

    canary: Example
    replacement: Example
    exemplars: tuple[Example, ...]
    position: int

    def __post_init__(self):
        if not isinstance(self.exemplars, tuple) or not all(isinstance(e, Example) for e in self.exemplars):
            raise InputError(f"AuditContext.exemplars must be a tuple of Example, got {type(self.exemplars).__name__}")
        for field in ("canary", "replacement"):
            if not isinstance(getattr(self, field), Example):
                raise InputError(f"AuditContext.{field} must be an Example, got {type(getattr(self, field)).__name__}")
        if isinstance(self.position, bool) or not isinstance(self.position, int):
            raise InputError(f"AuditContext.position must be an integer, got {self.position!r}")
        if not 0 <= self.position <= len(self.exemplars):
            raise InputError(
                f"AuditContext.position must be in [0, {len(self.exemplars)}] (k - 1 = {len(self.exemplars)} "
                f"shared exemplars), got {self.position}"
            )
        if _content(self.canary) == _content(self.replacement):
            raise InputError(
                f"AuditContext.canary and replacement must differ in content, both are {_content(self.canary)!r}"
            )

    @property
    def num_exemplars(self) -> int:
        """Context length ``k``."""
        return len(self.exemplars) + 1

    @property
    def with_canary(self) -> tuple[Example, ...]:
        """The context C1 (``b = 1``): the shared exemplars with the canary at :attr:`position`; length ``k``."""
        return self.exemplars[: self.position] + (self.canary,) + self.exemplars[self.position :]

    @property
    def without_canary(self) -> tuple[Example, ...]:
        """The context C0 (``b = 0``): the shared exemplars with the replacement at :attr:`position`; length ``k``."""
        return self.exemplars[: self.position] + (self.replacement,) + self.exemplars[self.position :]


def get_spec(name: str) -> DatasetSpec:
    """The :class:`DatasetSpec` of a dataset name.

    Args:
      name: one of :data:`DATASETS` (``"agnews"``, ``"trec"``, ``"samsum"``, ``"xsum"``).

    Returns:
      The spec.

    Raises:
      InputError: ``name`` is not one of :data:`DATASETS`.
    """
    if not isinstance(name, str) or name not in DATASETS:
        raise InputError(f"dataset name must be one of {', '.join(map(repr, DATASETS))}, got {name!r}")
    return DATASETS[name]


def load_examples(
    name: str,
    path: str | os.PathLike | None = None,
    split: str = "train",
    limit: int | None = None,
    seed: int | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
) -> list[Example]:
    """Loads and validates one split of a dataset as a list of :class:`Example`.

    Args:
      name: one of ``"agnews"``, ``"trec"``, ``"samsum"``, ``"xsum"``.
      path: ``None`` for the shipped demo data (split ``"train"`` only); a local ``.jsonl``/``.json``/``.csv``/
        ``.parquet`` file (taken to be the split ``split``); a directory holding exactly one ``<split>.<ext>``
        file for the requested split (e.g. ``train.jsonl``, ``test.csv``); or ``"hub"`` for the Hugging Face Hub
        copy (needs network access). Local files are read into memory by
        :func:`~snapaudit_jax.utils.records.read_records` (its rules for each format apply); the hub with
        ``datasets.load_dataset``.
      split: the split to load.
      limit: return at most this many examples; ``None`` for all. It must not exceed the split's size.
      seed: ``None`` keeps the source order (the first ``limit`` rows). An integer ``>= 0`` returns a seeded
        random sample without replacement, in random order: the first ``limit`` entries of
        ``numpy.random.default_rng(seed).permutation(n)``; with ``limit=None`` a seeded shuffle of the whole split.
        Samples for the same seed are nested: a smaller ``limit`` gives a prefix of a larger one.
      cache_dir: passed to ``datasets.load_dataset`` for ``path="hub"``; local files are never cached, so it is
        ignored for them.

    Returns:
      The examples, ``len == limit`` (or the split's size). Classification examples have ``label`` set and
      ``target=None``; summarisation examples have ``target`` (the summary) set and ``label=None``. Ids come from
      the ``id`` column when there is one, else are ``"<name>-<split>-<row>"`` with ``row`` the source row.

    Raises:
      ImportError: ``datasets`` (the project's ``data`` extra, the dependency of every non-demo source) is not
        installed and ``path`` is not ``None``.
      InputError: unknown dataset name; missing path; unsupported file extension; no (or more than one) file for
        the split in a directory; a path that is not a regular file (a FIFO, a device); an empty or unreadable
        file; missing required column (the message names the source and the
        column and lists the columns found); a returned row with an empty or non-string text or summary, or a
        label that is not an integer in ``[0, num_classes)``; duplicate ids among the returned rows; an empty
        split; ``limit`` larger than the split; invalid ``split``, ``limit`` or ``seed``.

    Guarantees:
      Deterministic: the same source, ``split``, ``limit`` and ``seed`` give the same list under the same NumPy
      version (``numpy.random.Generator`` streams are platform-independent but may change between versions).
      Every returned row was validated; nothing is dropped or repaired silently. Only the returned rows are read
      and checked (with ``limit``, a bad row elsewhere in a large hub split is not looked at). A local file is
      parsed in memory: no copy of its records is written anywhere, whether the load succeeds or fails.
    """
    spec = get_spec(name)
    if not isinstance(split, str) or not _SPLIT_RE.fullmatch(split):
        raise InputError(f"split must be a name of word characters and dots (e.g. 'train'), got {split!r}")
    if limit is not None:
        limit = validate.positive_int("limit", limit)
    if seed is not None:
        seed = validate.positive_int("seed", seed, minimum=0)

    if path is None:
        source, table = _read_demo(spec, split)
    elif isinstance(path, str) and path == "hub":
        source, table = _read_hub(spec, split, cache_dir)
    else:
        source, table = _read_local(spec, os.fspath(path), split)

    n = table.num_rows
    if n == 0:
        raise InputError(f"{source}: split {split!r} of dataset {spec.name!r} has no rows")
    text_columns = [_require_column(table, field, (), source, spec) for field in spec.text_fields]
    label_column = _require_column(table, spec.label_field, spec.label_aliases, source, spec)
    id_column = spec.id_field if spec.id_field in table.columns else None
    if limit is not None and limit > n:
        raise InputError(f"limit must be <= the {n} rows of {source} (split {split!r}), got {limit}")
    if seed is None:
        rows = np.arange(n if limit is None else limit)
    else:
        rows = np.random.default_rng(seed).permutation(n)[:limit]

    texts = [table.column(c, rows) for c in text_columns]
    labels = table.column(label_column, rows)
    ids = table.column(id_column, rows) if id_column is not None else None
    examples = []
    seen_ids: dict[str, int] = {}
    for j, row in enumerate(rows.tolist()):
        parts = [_text(source, row, column, values[j]) for column, values in zip(text_columns, texts)]
        if spec.task == "classification":
            label, target = _label(source, row, label_column, labels[j], spec), None
        else:
            label, target = None, _text(source, row, label_column, labels[j])
        if ids is None:
            example_id = f"{spec.name}-{split}-{row}"
        else:
            example_id = _identifier(source, row, id_column, ids[j])
        if example_id in seen_ids:
            raise InputError(
                f"{source}: column {id_column!r} must hold unique ids, row {row} repeats {example_id!r} "
                f"of row {seen_ids[example_id]}"
            )
        seen_ids[example_id] = row
        examples.append(Example(text="\n".join(parts), label=label, target=target, id=example_id))
    return examples


def sample_audit_context(examples: Sequence[Example], *, num_exemplars: int, seed: int) -> AuditContext:
    """Draws a canary and ``num_exemplars`` exemplars for one DP-ICL audit.

    With ``rng = numpy.random.default_rng(seed)``: ``k + 1`` distinct examples are drawn without replacement
    (``k = num_exemplars``) from the examples whose content (text, label, target; ids ignored) is distinct --
    the first occurrence of each content is kept -- the first drawn is the canary, the remaining ``k`` form the
    clean context C0 in drawn order; then ``position = rng.integers(k)`` picks the exemplar the canary replaces
    in C1.

    Args:
      examples: the pool, e.g. from :func:`load_examples`.
      num_exemplars: context length ``k >= 1``.
      seed: integer ``>= 0``.

    Returns:
      An :class:`AuditContext` whose :attr:`~AuditContext.with_canary` and :attr:`~AuditContext.without_canary`
      have length ``k`` and differ only at :attr:`~AuditContext.position`. The canary's content differs from that
      of every exemplar in either context.

    Raises:
      InputError: ``examples`` is not a sequence of :class:`Example` or has fewer than ``k + 1`` distinct
        contents; ``num_exemplars`` or ``seed`` is invalid.

    Guarantees:
      Deterministic: the same ``examples`` (in the same order), ``num_exemplars`` and ``seed`` give the same
      context under the same NumPy version.

    References:
      SnapAudit, DP-ICL audit setup: C1 = {e_1, ..., e_{k-1}, e_canary}, C0 = {e_1, ..., e_k}.
    """
    k = validate.positive_int("num_exemplars", num_exemplars)
    seed = validate.positive_int("seed", seed, minimum=0)
    if isinstance(examples, (str, bytes)) or not isinstance(examples, Sequence):
        raise InputError(f"examples must be a sequence of Example, got {type(examples).__name__}")
    first: dict[tuple, int] = {}
    for i, example in enumerate(examples):
        if not isinstance(example, Example):
            raise InputError(f"examples must be a sequence of Example, item {i} is {type(example).__name__}")
        first.setdefault(_content(example), i)
    pool = list(first.values())
    if len(pool) < k + 1:
        raise InputError(
            f"examples must hold at least num_exemplars + 1 = {k + 1} distinct examples (a canary and "
            f"{k} exemplars), got {len(pool)} distinct out of {len(examples)}"
        )
    rng = np.random.default_rng(seed)
    drawn = [examples[pool[i]] for i in rng.choice(len(pool), size=k + 1, replace=False).tolist()]
    canary, clean = drawn[0], drawn[1:]
    position = int(rng.integers(k))
    return AuditContext(
        canary=canary,
        replacement=clean[position],
        exemplars=tuple(clean[:position] + clean[position + 1 :]),
        position=position,
    )


# --------------------------------------------------------------------------------------------------------------
# Sources.


class _Table:
    """Columns of one split: either a dict of lists or a `datasets.Dataset` (read lazily, selected rows only)."""

    def __init__(self, columns: Sequence[str], num_rows: int, getter):
        self.columns = list(columns)
        self.num_rows = num_rows
        self._getter = getter

    def column(self, name: str, rows: np.ndarray) -> list:
        return self._getter(name, rows)


def _dict_table(data: dict[str, list]) -> _Table:
    num_rows = len(next(iter(data.values()))) if data else 0
    return _Table(list(data), num_rows, lambda name, rows: [data[name][i] for i in rows.tolist()])


def _dataset_table(dataset) -> _Table:
    def getter(name, rows):
        subset = dataset.select_columns([name])
        if not (rows.size == len(dataset) and np.array_equal(rows, np.arange(rows.size))):
            subset = subset.select(rows.tolist())
        return list(subset[name])

    return _Table(dataset.column_names, len(dataset), getter)


def _read_demo(spec: DatasetSpec, split: str) -> tuple[str, _Table]:
    if split != "train":
        raise InputError(f"split of the demo data (path=None) must be 'train', got {split!r}")
    resource = importlib.resources.files(__package__).joinpath("demo", spec.demo_file)
    source = f"demo file {spec.demo_file!r}"
    if not resource.is_file():
        raise InputError(f"{source} is missing from the installed package (package data not installed?)")
    lines = resource.read_text(encoding="utf-8").splitlines()
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{source}: line {lineno} is not valid JSON: {err}") from None
        if not isinstance(record, dict):
            raise InputError(f"{source}: line {lineno} must be a JSON object, got {type(record).__name__}")
        records.append(record)
    keys = dict.fromkeys(key for record in records for key in record)
    return source, _dict_table({key: [record.get(key) for record in records] for key in keys})


def _read_hub(spec: DatasetSpec, split: str, cache_dir) -> tuple[str, _Table]:
    datasets = _import_datasets("path='hub'")
    dataset = datasets.load_dataset(spec.hub_id, split=split, cache_dir=_fspath(cache_dir))
    return f"hub dataset {spec.hub_id!r}", _dataset_table(dataset)


def _read_local(spec: DatasetSpec, path: str, split: str) -> tuple[str, _Table]:
    if not os.path.exists(path):
        raise InputError(f"path must be an existing file or directory (or None, or 'hub'), got {path!r}")
    if os.path.isdir(path):
        candidates = [os.path.join(path, split + ext) for ext in FORMATS]
        found = [c for c in candidates if os.path.isfile(c)]
        if not found:
            present = sorted(os.listdir(path))
            raise InputError(
                f"directory {path!r} must hold a file for split {split!r} named one of "
                f"{', '.join(os.path.basename(c) for c in candidates)}; found {present}"
            )
        if len(found) > 1:
            raise InputError(
                f"directory {path!r} must hold exactly one file for split {split!r}, found "
                f"{[os.path.basename(f) for f in found]}"
            )
        path = found[0]
    ext = _extension(path)
    if ext not in FORMATS:
        raise InputError(f"file extension must be one of {', '.join(FORMATS)}, got {ext or '(none)'!r} for {path!r}")
    _require_datasets(f"reading {path!r}")
    return f"file {path!r}", _dict_table(read_records(path))


# --------------------------------------------------------------------------------------------------------------
# Row validation.


def _require_column(table: _Table, field: str, aliases: tuple[str, ...], source: str, spec: DatasetSpec) -> str:
    for column in (field, *aliases):
        if column in table.columns:
            return column
    accepted = " or ".join(repr(c) for c in (field, *aliases))
    raise InputError(
        f"{source}: dataset {spec.name!r} requires column {accepted}, which is missing; columns found: {table.columns}"
    )


def _text(source: str, row: int, column: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{source}: row {row}: column {column!r} must be a non-empty string, got {value!r}")
    return value


def _label(source: str, row: int, column: str, value: Any, spec: DatasetSpec) -> int:
    # Integral floats are accepted because CSV readers widen integer columns to float when a cell is blank.
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        value = int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InputError(
            f"{source}: row {row}: column {column!r} must be an integer label in [0, {spec.num_classes}), got {value!r}"
        )
    if not 0 <= value < spec.num_classes:
        raise InputError(
            f"{source}: row {row}: column {column!r} must be an integer label in [0, {spec.num_classes}) "
            f"({', '.join(spec.label_names)}), got {value}"
        )
    return int(value)


def _identifier(source: str, row: int, column: str, value: Any) -> str:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (str, int, np.integer)) or not str(value).strip():
        raise InputError(
            f"{source}: row {row}: column {column!r} must be a non-empty string or integer id, got {value!r}"
        )
    return str(value)


def _content(example: Example) -> tuple:
    return (example.text, example.label, example.target)


# --------------------------------------------------------------------------------------------------------------
# Small helpers.


def _extension(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def _fspath(path) -> str | None:
    return None if path is None else os.fspath(path)


def _require_datasets(purpose: str) -> None:
    # Local files are parsed without `datasets` (read_records), but the data extra stays the one documented
    # dependency of every non-demo source: it brings pyarrow, which Parquet needs, so a configuration does not
    # start failing when its file changes format. find_spec, not import: `import datasets` takes a second.
    if importlib.util.find_spec("datasets") is None:
        raise ImportError(
            f"the 'datasets' package is required for {purpose}; install it (pip install datasets) "
            f"or use path=None for the demo data"
        )


def _import_datasets(purpose: str):
    _require_datasets(purpose)
    import datasets  # noqa: PLC0415 -- optional dependency, only for the hub.

    return datasets
