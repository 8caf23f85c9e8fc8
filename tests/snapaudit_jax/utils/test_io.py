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
