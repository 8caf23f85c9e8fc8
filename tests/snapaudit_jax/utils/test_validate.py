"""Tests for the limits of snapaudit_jax.utils.validate and the file checks of utils.config and utils.io."""

from __future__ import annotations

import os

import numpy as np
import pytest

from snapaudit_jax.utils import validate
from snapaudit_jax.utils.config import ConfigFileError, read_toml
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import check_output_dir, check_output_file


@pytest.mark.parametrize("value,ok", [(0, True), (2**63 - 1, True), (3.0, True), (np.int64(7), True),
                                      (2**63, False), (-1, False), (2**64, False), (True, False), (1.5, False),
                                      ("3", False)])
def test_seed_range_is_what_jax_random_key_takes(value, ok):
    import jax

    if ok:
        assert validate.seed("seed", value) == int(value)
        jax.random.key(validate.seed("seed", value))  # the whole range is usable
    else:
        with pytest.raises(InputError, match=r"seed must be an integer in \[0, 2\*\*63 - 1\]"):
            validate.seed("seed", value)
        if isinstance(value, int) and not isinstance(value, bool) and value > 2**63 - 1:
            with pytest.raises(OverflowError):  # the limit is real: one more and JAX cannot take it
                jax.random.key(value)


@pytest.mark.parametrize("name,ok", [("r", True), ("retrieval_2.k-3", True), ("a" * 64, True), ("a" * 65, False),
                                     ("..", False), (".hidden", False), ("a/b", False), ("", False), ("a b", False),
                                     ("-x", False), ("é", False), (3, False)])
def test_file_name_pattern(name, ok):
    if ok:
        assert validate.file_name("attacker name", name) == name
    else:
        with pytest.raises(InputError, match="attacker name must be 1 to 64 letters"):
            validate.file_name("attacker name", name)


def test_utf8_text_refuses_lone_surrogates_and_names_the_byte():
    assert validate.utf8_text("--prompt", "café ☕") == "café ☕"
    with pytest.raises(InputError, match=r"--prompt must be valid UTF-8 text, but character 3 is not \(byte 0xe9"):
        validate.utf8_text("--prompt", b"caf\xe9".decode("utf-8", "surrogateescape"))


@pytest.mark.parametrize("value,what", [
    (np.array([[1 + 2j, 3]]), "complex"),
    ([[1.0, 2j]], "complex"),
    (np.array([["1.5", "2"]]), "non-numeric"),
    (np.array([[1, None]], dtype=object), "non-numeric"),
    (np.array([[np.datetime64("2020-01-01")]]), "non-numeric"),
])
def test_finite_array_never_casts_complex_text_or_objects(value, what):
    with pytest.raises(InputError, match=f"x must be a rectangular array of real numbers, got {what}"):
        validate.finite_array("x", value)


def test_finite_array_accepts_bools_integers_and_reals():
    for value in ([[True, False]], np.array([[1, 2]], np.uint8), [[1, 2.5]], np.array([[1.5]], np.float32)):
        out = validate.finite_array("x", value)
        assert out.dtype == np.float64 and np.array_equal(out, np.asarray(value, np.float64))
    with pytest.raises(InputError, match="ragged or non-numeric"):
        validate.finite_array("x", [[1.0, 2.0], [3.0]])


def test_read_toml_refuses_utf16_fifos_loops_and_missing_files_without_opening(tmp_path):
    good = tmp_path / "bom.toml"
    good.write_bytes("\ufeffa = 1\n".encode("utf-8"))
    assert read_toml(good) == {"a": 1}  # a UTF-8 byte-order mark is harmless
    utf16 = tmp_path / "u.toml"
    utf16.write_bytes("a = 1\n".encode("utf-16"))
    with pytest.raises(ConfigFileError, match=r"u.toml: a TOML configuration must be UTF-8 text, but it is UTF-16"):
        read_toml(utf16)
    latin = tmp_path / "l.toml"
    latin.write_bytes('a = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ConfigFileError, match=r"byte 8 \(0xe9\) is not UTF-8"):
        read_toml(latin)
    os.mkfifo(tmp_path / "f.toml")  # open() would block: the check must come first
    with pytest.raises(ConfigFileError, match=r"must be a regular file, got a FIFO \(named pipe\) \(not opened\)"):
        read_toml(tmp_path / "f.toml")
    os.symlink(tmp_path / "b.toml", tmp_path / "a.toml")
    os.symlink(tmp_path / "a.toml", tmp_path / "b.toml")
    with pytest.raises(ConfigFileError, match="a.toml: cannot read the configuration: it is a symlink loop"):
        read_toml(tmp_path / "a.toml")
    with pytest.raises(ConfigFileError, match="cannot read the configuration: it does not exist"):
        read_toml(tmp_path / "none.toml")
    with pytest.raises(ConfigFileError, match="is a folder, not a file"):
        read_toml(tmp_path)


def test_output_names_longer_than_the_file_system_allows_are_refused_before_any_work(tmp_path):
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    fits = "r" * (name_max - len(".json")) + ".json"
    assert check_output_file("--out", tmp_path / fits, ("json",)) == "json"  # exactly NAME_MAX bytes
    with pytest.raises(InputError, match=f"--out: each name in the path must be at most {name_max} bytes"):
        check_output_file("--out", tmp_path / ("r" + fits), ("json",))
    check_output_dir("--out", tmp_path / ("d" * name_max) / "run")
    with pytest.raises(InputError, match=f"got {name_max + 1} bytes"):
        check_output_dir("--out", tmp_path / ("d" * (name_max + 1)) / "run")
    multibyte = "é" * (name_max // 2 + 1)  # fewer characters than NAME_MAX, more bytes
    with pytest.raises(InputError, match="NAME_MAX"):
        check_output_dir("--out", tmp_path / multibyte)
    path_max = os.pathconf(tmp_path, "PC_PATH_MAX")
    deep = os.path.join(str(tmp_path), *(["d" * 200] * (path_max // 200 + 1)))
    with pytest.raises(InputError, match=f"shorter than {path_max} bytes"):
        check_output_dir("--out", deep)
    assert sorted(os.listdir(tmp_path)) == []  # nothing was created
