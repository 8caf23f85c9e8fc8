"""``snapaudit_jax.utils.files``: what is not a regular file is refused before it is opened, and never blocks.

Each refusal runs in a worker thread joined with a deadline, so a regression that blocks on a FIFO fails the
test instead of hanging the suite (a FIFO's reader also gets released by a writer thread after the deadline).
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import threading
import time

import pytest

from snapaudit_jax.utils import files
from snapaudit_jax.utils.errors import ConfigFileError, InputError

DEADLINE = 20.0


def _within_deadline(fn):
    """``fn()``'s result or exception, failing the test if it has not returned within :data:`DEADLINE`."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001  (re-raised in the test's thread)
            box["error"] = err

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(DEADLINE)
    assert not worker.is_alive(), f"blocked for {DEADLINE} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _release_after(fifo, seconds):
    """Writes to ``fifo`` once a reader waits on it after ``seconds`` (a regression's reader gets unblocked)."""
    def run():
        deadline = time.monotonic() + seconds + 30
        time.sleep(seconds)
        while time.monotonic() < deadline:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as err:
                if err.errno == errno.ENXIO:
                    time.sleep(0.1)
                    continue
                return
            os.write(fd, b"x")
            os.close(fd)
            return
    threading.Thread(target=run, daemon=True).start()


@pytest.fixture
def odd(tmp_path):
    """A FIFO, a socket, a folder, links to a device, to the FIFO, to nothing and to themselves."""
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    _release_after(str(fifo), DEADLINE + 1)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock.jsonl"))
    (tmp_path / "folder.jsonl").mkdir()
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")
    (tmp_path / "to_fifo.jsonl").symlink_to(fifo)
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "gone.jsonl")
    (tmp_path / "loop.jsonl").symlink_to(tmp_path / "loop.jsonl")
    yield tmp_path
    sock.close()


@pytest.mark.parametrize("name, found", [
    ("pipe.jsonl", "got a FIFO (named pipe) (not opened)"),
    ("to_fifo.jsonl", "got a FIFO (named pipe) (not opened)"),
    ("sock.jsonl", "got a socket (not opened)"),
    ("zero.jsonl", "got a character device (not opened)"),
    ("folder.jsonl", "is a folder, not a file"),
    ("dangling.jsonl", "it is a symbolic link to"),
    ("loop.jsonl", "symlink loop"),
    ("missing.jsonl", "it does not exist"),
])
@pytest.mark.parametrize("reader", ["open_regular", "read_regular", "read_regular_text", "sha256_file",
                                    "check_regular_file"])
def test_anything_but_a_regular_file_is_refused_without_blocking(odd, name, found, reader):
    fn = getattr(files, reader)

    def call():
        out = fn(odd / name, "data file", ConfigFileError, field="data.path")
        if hasattr(out, "close"):
            out.close()

    with pytest.raises(ConfigFileError) as info:
        _within_deadline(call)
    message = str(info.value)
    assert message.startswith(f"data.path: {odd / name}: ") and found in message
    if name == "dangling.jsonl":
        assert str(odd / "gone.jsonl") in message


def test_a_regular_file_reads_whole_and_its_digest_is_hashlibs(tmp_path):
    body = os.urandom(3 << 20) + b"tail"  # more than one 1 MiB block
    (tmp_path / "d.bin").write_bytes(body)
    (tmp_path / "link.bin").symlink_to(tmp_path / "d.bin")
    for name in ("d.bin", "link.bin"):
        assert files.read_regular(tmp_path / name, "data file") == body
        assert files.sha256_file(tmp_path / name, "data file") == hashlib.sha256(body).hexdigest()
        assert files.check_regular_file(tmp_path / name, "data file") == len(body)
    (tmp_path / "t.txt").write_bytes(b"\xef\xbb\xbfcaf\xc3\xa9")
    assert files.read_regular_text(tmp_path / "t.txt", "text") == "café"
    (tmp_path / "l.txt").write_bytes(b"caf\xe9")
    with pytest.raises(InputError, match=r"l\.txt: the text is not UTF-8 text \(byte 3\)"):
        files.read_regular_text(tmp_path / "l.txt", "text")


def test_the_size_limit_is_checked_before_reading_and_while_reading(tmp_path, monkeypatch):
    (tmp_path / "c.toml").write_bytes(b"a" * 101)
    with pytest.raises(InputError, match=r"c\.toml: the configuration must be at most 100 bytes, got 101"):
        files.read_regular(tmp_path / "c.toml", "configuration", max_bytes=100)
    assert files.read_regular(tmp_path / "c.toml", "configuration", max_bytes=101) == b"a" * 101
    # a file that grows after its size was checked: the read stops at the limit and refuses it
    real = files._check_mode
    monkeypatch.setattr(files, "_check_mode", lambda *a: real(*a[:5], None))
    with pytest.raises(InputError, match="grew past that while being read"):
        files.read_regular(tmp_path / "c.toml", "configuration", max_bytes=100)


def test_a_path_swapped_for_a_fifo_after_the_check_is_refused_on_the_descriptor(tmp_path, monkeypatch):
    """The check by path passes on a regular file, which is then replaced by a FIFO before the open: the open is
    non-blocking and the descriptor's own type is checked, so the FIFO is refused, not waited on."""
    path = tmp_path / "d.jsonl"
    path.write_text("{}\n")
    real = files.check_regular_file

    def check_then_swap(p, *args, **kwargs):
        size = real(p, *args, **kwargs)
        os.unlink(p)
        os.mkfifo(p)
        _release_after(str(p), DEADLINE + 1)
        return size

    monkeypatch.setattr(files, "check_regular_file", check_then_swap)
    with pytest.raises(InputError, match=r"d\.jsonl: the data file must be a regular file, got a FIFO"):
        _within_deadline(lambda: files.read_regular(path, "data file"))
