"""snapaudit_jax.utils.io: the one JSON rule and atomic writes."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from snapaudit_jax.utils import (
    atomic_write,
    dumps,
    to_json,
    write_json,
)



def test_to_json_one_rule_for_non_finite_numbers():
    obj = {"a": math.inf, "b": -np.inf, "c": np.float32("nan"), "d": np.float64(0.25), "e": np.int64(3),
           "f": (1, 2.5), "g": np.bool_(True), "h": np.array(2.0), 4: {"x": [np.float16(1.5), None, "s"]},
           "i": {2, 1}}
    out = to_json(obj)
    assert out == {"a": None, "b": None, "c": None, "d": 0.25, "e": 3, "f": [1, 2.5], "g": True, "h": 2.0,
                   "4": {"x": [1.5, None, "s"]}, "i": [1, 2]}
    assert type(out["e"]) is int and type(out["d"]) is float and type(out["g"]) is bool
    text = dumps(obj)
    assert "NaN" not in text and "Infinity" not in text and json.loads(text) == out
    with pytest.raises(TypeError, match="no JSON form for ndarray"):
        to_json({"v": np.zeros(3)})
    with pytest.raises(TypeError, match="no JSON form for object"):
        to_json([object()])


def test_write_json_is_atomic_and_strict(tmp_path):
    path = tmp_path / "sub" / "r.json"
    write_json(path, {"eps": math.inf, "n": np.int32(2)})
    assert json.loads(path.read_text()) == {"eps": None, "n": 2}
    before = path.read_bytes()

    def fail(fh):
        fh.write(b"{\"partial\": ")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, fail)
    assert path.read_bytes() == before  # the old file survives whole
    assert sorted(os.listdir(path.parent)) == ["r.json"]  # and no temporary file is left behind
    with pytest.raises(TypeError):
        write_json(tmp_path / "bad.json", {"x": object()})
    assert not (tmp_path / "bad.json").exists()


_FULL_DISK = r"""
import json, os, resource, signal, sys
import numpy as np
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # writes past 4 kB fail with EFBIG, as ENOSPC would
from snapaudit_jax.dpsgd.checkpoint import save_checkpoint
from snapaudit_jax.utils.io import atomic_write, save_safetensors, write_json
folder = sys.argv[1]
big = {"w": np.zeros(4096, np.float32)}
calls = {
    "atomic_write": lambda: atomic_write(os.path.join(folder, "a.bin"), lambda fh: fh.write(b"0" * 8192)),
    "write_json": lambda: write_json(os.path.join(folder, "r.json"), {"x": "y" * 8192}),
    "save_safetensors": lambda: save_safetensors(big, os.path.join(folder, "m.safetensors")),
    "save_checkpoint": lambda: save_checkpoint(os.path.join(folder, "ckpt"), 1, big, {}, {}),
}
out = {}
for name, call in calls.items():
    try:
        call()
        out[name] = None
    except OSError as err:
        out[name] = [err.errno, err.filename]
print(json.dumps(out))
"""


def test_write_failures_are_os_errors_naming_the_file_and_leave_nothing(tmp_path):
    """Under a 4 kB file size limit (a write fails as on a full disk), every writer raises OSError with the
    errno and the file's path (safetensors' own error type included), and no partial or temporary file stays."""
    import errno
    import subprocess
    import sys

    from tests.helpers.paths import ROOT

    proc = subprocess.run([sys.executable, "-c", _FULL_DISK, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) == {"atomic_write", "write_json", "save_safetensors", "save_checkpoint"}
    for name, found in out.items():
        assert found is not None, f"{name} wrote past the limit"
        code, path = found
        assert code == errno.EFBIG and path and path.startswith(str(tmp_path)), (name, found)
    assert out["save_safetensors"][1] == str(tmp_path / "m.safetensors")
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []  # no partial or temporary file
