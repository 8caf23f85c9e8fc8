"""Bad-input cases: user data files that must not be copied outside the run folder (see :mod:`tests.helpers.bad_input`).

Each case gives ``snapaudit audit`` a damaged or odd ``data_path`` (a FIFO, corrupted CSV and Parquet files,
JSON Lines that is not UTF-8 or repeats a key, an empty file) and expects exit status 2 naming
``pipelines.<name>.data_path`` (or ``one_run.data_path``), the rule and the file, with the ``tmp_path`` tree
unchanged.

``datasets`` reads its cache location from the environment once, when it is first imported, so setting
``HF_DATASETS_CACHE`` for an in-process case would not move it; instead :func:`watch_datasets_cache` points
``datasets.config``'s cache paths into ``tmp_path`` for the case: a reader that went back to
``datasets.load_dataset`` would leave its Arrow copy and lock files there, and the tree check would see them
(``tests/test_private_data.py`` checks that this watch sees them, and runs the commands in subprocesses under
fresh cache folders: the real check).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

import pytest

from tests.helpers.bad_input.common import NO_LLM, Case, _config_cmd, _write

_CACHE_PATHS = ("HF_DATASETS_CACHE", "DOWNLOADED_DATASETS_PATH", "EXTRACTED_DATASETS_PATH", "HF_MODULES_CACHE")


def watch_datasets_cache(tmp: Path, stack: contextlib.ExitStack) -> Path:
    """Points ``datasets``' default cache paths into ``tmp / "hf-datasets"`` until ``stack`` closes.

    Args:
      tmp: the case's folder.
      stack: the case's exit stack (the patches are undone when it closes).

    Returns:
      The watched cache folder (not created).
    """
    datasets = pytest.importorskip("datasets")
    cache = tmp / "hf-datasets"
    for name in _CACHE_PATHS:
        if hasattr(datasets.config, name):
            stack.enter_context(mock.patch.object(datasets.config, name, str(cache / name.lower())))
    return cache


def _release_if_read(fifo: str) -> None:
    """Opens ``fifo`` for writing once a reader waits on it (a regression), so the case fails instead of hanging."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            if err.errno == errno.ENXIO:  # no reader: the reader refused it, as it must
                time.sleep(0.2)
                continue
            return  # removed: the case is over
        os.write(fd, b"{}\n")
        os.close(fd)
        return


def _fifo(stack: contextlib.ExitStack, name: str) -> str:
    # Outside tmp_path: the suite's tree check opens every file under it, and opening a FIFO blocks.
    folder = tempfile.mkdtemp(prefix="snapaudit-fifo-")
    stack.callback(shutil.rmtree, folder, ignore_errors=True)
    path = os.path.join(folder, name)
    os.mkfifo(path)
    threading.Thread(target=_release_if_read, args=(path,), daemon=True).start()
    return path


def _parquet(path: Path, keep: float | None = None, junk: bytes | None = None) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": [f"private record {i}" for i in range(40)], "label": [i % 4 for i in range(40)]}),
                   path)
    data = path.read_bytes()
    path.write_bytes(junk if junk is not None else data[: int(len(data) * keep)])
    return str(path)


def _audit(make_path, *, one_run: bool = False):
    """A case's build: the data file made by ``make_path(tmp, stack)``, read by ``[pipelines.pv]`` (or
    ``[one_run]``), with ``datasets``' cache watched."""

    def build(tmp: Path, stack: contextlib.ExitStack) -> list[str]:
        watch_datasets_cache(tmp, stack)
        path = make_path(tmp, stack)
        body = f'[pipelines.pv]\n[one_run]\ndata_path = "{path}"\n' if one_run else \
            f'[pipelines.pv]\ndata_path = "{path}"\n'
        return _config_cmd("audit", NO_LLM + body)(tmp)

    return build


def _cpa(make_path, source: str = "textwash"):
    """A case's build: ``snapaudit cpa`` reading the file made by ``make_path(tmp, stack)`` as ``[data.<source>]``."""

    def build(tmp: Path, stack: contextlib.ExitStack) -> list[str]:
        toml = (f'[run]\nn_cal = 10\nn_test = 10\n\n[data.{source}]\npath = "{make_path(tmp, stack)}"\n\n'
                '[attackers.r]\nkind = "retrieval"\n')
        return _config_cmd("cpa", toml)(tmp)

    return build


_KEY = "pipelines.pv.data_path"

CASES: list[Case] = [
    Case("private-data-fifo", _audit(lambda t, s: _fifo(s, "ag.jsonl")),
         (_KEY, "ag.jsonl", "must be a regular file", "got a FIFO (named pipe)"), with_stack=True),
    Case("private-data-csv-unterminated-quote",
         _audit(lambda t, s: _write(t / "ag.csv", 'text,label\n"private record, 1\nanother,2\n')),
         (_KEY, "ag.csv", "could not be read as csv", "unexpected end of data"), absent=("private record",),
         with_stack=True),
    Case("private-data-csv-ragged-row",
         _audit(lambda t, s: _write(t / "ag.csv", "text,label\nprivate record,1\nanother,2,3\n")),
         (_KEY, "ag.csv", "line 3 has 3 field(s), the header has 2"), absent=("private record",), with_stack=True),
    Case("private-data-csv-not-utf8",
         _audit(lambda t, s: _write(t / "ag.csv", b"text,label\nprivate caf\xe9,1\n")),
         (_KEY, "ag.csv", "must be UTF-8 text", "line 2"), absent=("private",), with_stack=True),
    Case("private-data-parquet-truncated", _audit(lambda t, s: _parquet(t / "ag.parquet", keep=0.6)),
         (_KEY, "ag.parquet", "could not be read as parquet"), absent=("private record",), with_stack=True),
    Case("private-data-parquet-random-bytes",
         _audit(lambda t, s: _parquet(t / "ag.parquet", junk=b"PAR1" + bytes(range(256)) + b"PAR1")),
         (_KEY, "ag.parquet", "could not be read as parquet"), with_stack=True),
    Case("private-data-jsonl-not-utf8",
         _audit(lambda t, s: _write(t / "ag.jsonl", b'{"text": "fine", "label": 1}\n{"text": "\xff", "label": 2}\n')),
         (_KEY, "ag.jsonl", "must be UTF-8 text", "byte 39 (line 2) is b'\\xff'"), with_stack=True),
    Case("private-data-jsonl-repeated-key",
         _audit(lambda t, s: _write(t / "ag.jsonl", '{"text": "private record", "text": "other", "label": 1}\n')),
         (_KEY, "ag.jsonl", "line 1", "key 'text' is repeated within one object"), absent=("private record",),
         with_stack=True),
    Case("private-data-jsonl-lone-surrogate",
         _audit(lambda t, s: _write(t / "ag.jsonl", '{"text": "private \\udc80 record", "label": 1}\n')),
         (_KEY, "ag.jsonl", "line 1 holds a lone surrogate escape"), absent=("private",), with_stack=True),
    Case("private-data-empty-file", _audit(lambda t, s: _write(t / "ag.jsonl", b"")),
         (_KEY, "ag.jsonl", "is empty (no rows)"), with_stack=True),
    Case("private-data-one-run-parquet-truncated",
         _audit(lambda t, s: _parquet(t / "one.parquet", keep=0.5), one_run=True),
         ("one_run.data_path", "one.parquet", "could not be read as parquet"), absent=(_KEY,), with_stack=True),
    Case("private-data-cpa-textwash-fifo", _cpa(lambda t, s: _fifo(s, "textwash.csv")),
         ("data.textwash.path", "textwash.csv", "must be a regular file", "got a FIFO"), with_stack=True),
    Case("private-data-cpa-tab-not-utf8", _cpa(lambda t, s: _write(t / "tab.json", b'[{"doc_id": "caf\xe9"}]'), "tab"),
         ("data.tab.path", "tab.json", "must be UTF-8 text"), with_stack=True),
]
