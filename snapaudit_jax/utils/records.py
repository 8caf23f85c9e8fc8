"""A user's own records, read from a local JSON Lines, JSON, CSV or Parquet file into memory.

:func:`read_records` is the one reader of user data files: the DP-ICL audit's ``data_path``
(:func:`~snapaudit_jax.dpicl.data.load_examples`) and ``snapaudit finetune``'s records file go through it. The file
is parsed in this process and nothing else is written: no Arrow copy in a Hugging Face cache, no lock file, no
temporary file (``datasets.load_dataset`` writes all three under the user's global cache, which is how a
privacy audit used to copy the text it protects outside its run folder).

Formats, chosen by the file's extension (:data:`FORMATS`):

* ``.jsonl`` / ``.json`` -- JSON Lines (one object per line; blank lines skipped), a JSON array of objects, or
  a single JSON object (one record). Strict UTF-8 (a leading byte-order mark is skipped) and strict JSON: no
  ``NaN``/``Infinity``, no key repeated within an object, no lone surrogate escape (``"\\ud800"``) in a string.
  Values keep their JSON types (``str``, ``int``, ``float``, ``bool``, ``None``, lists, dicts); a key absent
  from a record is ``None`` in that row.
* ``.csv`` -- comma-separated with a header row (RFC 4180 quoting), strict UTF-8. Every row must have as many
  fields as the header (blank lines are skipped); header names must be distinct (an empty one is named
  ``"Unnamed: <index>"``, as pandas names an index column). An empty cell is ``None``; no other text is taken
  for missing (``"NA"`` and ``"null"`` stay text). A column whose non-empty cells all spell integers holds
  ``int``; else one whose cells all spell decimal numbers holds ``float``; else every cell is its text.
* ``.parquet`` -- read with pyarrow (installed with the project's ``data`` extra); values are the columns'
  Python values (``Table.to_pydict``).

The whole file is held in memory at once (sized for audit and fine-tuning sets, not for corpora larger than
RAM).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import types
from collections.abc import Mapping
from typing import Any

from snapaudit_jax.utils.errors import InputError, MissingFileError
from snapaudit_jax.utils.files import open_regular

__all__ = ["FORMATS", "read_records"]

FORMATS: Mapping[str, str] = types.MappingProxyType(
    {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
)
"""File extension -> format read by :func:`read_records` (read-only)."""

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_SURROGATE = re.compile("[\ud800-\udfff]")

def read_records(path: str | os.PathLike) -> dict[str, list]:
    """Reads every record of a local data file into memory, as columns.

    Args:
      path: a regular ``.jsonl``, ``.json``, ``.csv`` or ``.parquet`` file (see the module docstring for each
        format's rules); a symbolic link to one is followed. Its type is checked before it is opened
        (:func:`snapaudit_jax.utils.files.open_regular`).

    Returns:
      ``{column: values}`` in the file's column order (JSON: the order in which keys first appear), every list
      ``num_rows`` long; ``{}`` for a JSON file holding no record. Values are plain Python values.

    Raises:
      MissingFileError: ``path`` does not exist.
      InputError: ``path`` is not a regular file (a folder, a FIFO, a device), has another extension, is
        empty (0 bytes), is not UTF-8 text (JSON, CSV), or breaks its format's rules; the message names the file,
        the line (JSON, CSV) and the rule, and never quotes the records' text.
      ImportError: a Parquet file without pyarrow installed.

    Guarantees:
      Nothing is written anywhere: the file is read once, parsed in memory and closed.
    """
    path = os.fspath(path)
    source = f"file {path!r}"
    try:
        os.stat(path)
    except FileNotFoundError:
        raise MissingFileError(f"{source} does not exist") from None
    except OSError:
        pass  # a symlink loop or a permission: named by open_regular below
    ext = os.path.splitext(path)[1].lower()
    # the type is checked before the file is opened (a FIFO or a device would block or never end)
    with open_regular(path, "data file") as fh:
        if ext not in FORMATS:
            raise InputError(f"file extension must be one of {', '.join(FORMATS)}, got {ext or '(none)'!r} for "
                             f"{path!r}")
        if os.fstat(fh.fileno()).st_size == 0:
            raise InputError(f"{source} is empty (no rows)")
        fmt = FORMATS[ext]
        raw = fh.read()
    if fmt == "parquet":
        return _read_parquet(raw, source)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise InputError(f"{source} could not be read as {fmt}: it must be UTF-8 text, byte {err.start} "
                         f"(line {line}) is {raw[err.start:err.start + 1]!r} ({err.reason})") from None
    return _read_json(text, source) if fmt == "json" else _read_csv(text, source)


# --------------------------------------------------------------------------------------------------------------
# JSON and JSON Lines.


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {key!r} is repeated within one object")
    return out


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _loads(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def _json_error(err: ValueError) -> str:
    if isinstance(err, json.JSONDecodeError):  # its message quotes no content, only the position
        return f"{err.msg} (column {err.colno})"
    return str(err)


def _read_json(text: str, source: str) -> dict[str, list]:
    where = []
    if text.lstrip().startswith("["):
        try:
            value = _loads(text)
        except ValueError as err:
            raise InputError(f"{source} could not be read as json: not a valid JSON array: "
                             f"{_json_error(err)}") from None
        records = value
        where = [f"item {i}" for i in range(len(records))]
    else:
        records = []
        for lineno, line in enumerate(text.split("\n"), start=1):  # not splitlines(): U+2028 may sit in a string
            if not line.strip():
                continue
            try:
                records.append(_loads(line))
            except ValueError as err:
                try:  # one (pretty-printed) JSON object is one record
                    whole = _loads(text)
                except ValueError:
                    whole = None
                if not isinstance(whole, dict):
                    raise InputError(f"{source} could not be read as json: line {lineno} is not valid JSON: "
                                     f"{_json_error(err)}") from None
                records, where = [whole], ["the document"]
                break
            where.append(f"line {lineno}")
    for place, record in zip(where, records):
        if not isinstance(record, dict):
            raise InputError(f"{source} could not be read as json: {place} must be a JSON object, got "
                             f"{type(record).__name__}")
        if _has_surrogate(record):
            raise InputError(f"{source} could not be read as json: {place} holds a lone surrogate escape "
                             f"(\\ud800-\\udfff), which is not Unicode text")
    keys = dict.fromkeys(key for record in records for key in record)
    return {key: [record.get(key) for record in records] for key in keys}


# --------------------------------------------------------------------------------------------------------------
# CSV.


def _typed(cells: list[str | None]) -> list:
    present = [c for c in cells if c is not None]
    if present and all(_INT.fullmatch(c) for c in present):
        return [None if c is None else int(c) for c in cells]
    if present and all(_FLOAT.fullmatch(c) for c in present):
        return [None if c is None else float(c) for c in cells]
    return cells


def _read_csv(text: str, source: str) -> dict[str, list]:
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        while header == []:  # blank lines before the header
            header = next(reader, None)
        if header is None:
            raise InputError(f"{source} could not be read as csv: it has no header row")
        names = [name if name else f"Unnamed: {i}" for i, name in enumerate(header)]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise InputError(f"{source} could not be read as csv: the header repeats column(s) {repeated}")
        columns: list[list[str | None]] = [[] for _ in names]
        for row in reader:
            if not row:
                continue
            if len(row) != len(names):
                raise InputError(f"{source} could not be read as csv: line {reader.line_num} has {len(row)} "
                                 f"field(s), the header has {len(names)}")
            for column, cell in zip(columns, row):
                column.append(cell if cell != "" else None)
    except csv.Error as err:  # its message quotes no content
        raise InputError(f"{source} could not be read as csv: line {reader.line_num}: {err}") from None
    return {name: _typed(cells) for name, cells in zip(names, columns)}


# --------------------------------------------------------------------------------------------------------------
# Parquet.


def _read_parquet(raw: bytes, source: str) -> dict[str, list]:
    """The columns of the Parquet file whose bytes are ``raw``.

    Read synchronously, in this thread, and closed here. ``pq.read_table`` goes through pyarrow's dataset
    scanner, whose pool threads release the reader and with it the buffer of Python bytes (that needs the GIL);
    one still doing so when the interpreter exits aborts the process (SIGABRT, "terminate called without an
    active exception", apache/arrow#34314): seen here in about one run in fifteen on a loaded machine, when a
    run stopped with an input error just after reading its data.
    """
    try:
        import pyarrow as pa  # noqa: PLC0415 -- optional dependency (the data extra), Parquet only.
        import pyarrow.parquet as pq  # noqa: PLC0415 -- optional dependency (the data extra), Parquet only.
    except ImportError as err:
        raise ImportError(f"reading the Parquet {source} needs pyarrow; install it (pip install pyarrow, or the "
                          f"project's data extra: pip install 'snapaudit-jax[data]')") from err
    try:
        with pq.ParquetFile(pa.BufferReader(raw), pre_buffer=False) as pf:
            table = pf.read(use_threads=False)
        names = table.column_names
        if len(set(names)) != len(names):
            repeated = sorted({n for n in names if names.count(n) > 1})
            raise InputError(f"{source} could not be read as parquet: it repeats column(s) {repeated}")
        return {name: table.column(i).to_pylist() for i, name in enumerate(names)}
    except InputError:
        raise
    except Exception as err:  # pyarrow raises ArrowInvalid, OSError and others for a damaged file
        raise InputError(f"{source} could not be read as parquet: {type(err).__name__}: {err}") from None
