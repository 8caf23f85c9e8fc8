"""The run key of DP-SGD (snapaudit_jax.dpsgd.keys): secret by default, kept only as private state.

Oracles: the bytes :func:`secrets.token_bytes` returned (patched) against the key data; a training run given the
stored key explicitly against the default run that drew it (bitwise); hashlib over the key's words for the
digest; the files of a checkpoint folder searched for the key's words.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat

import jax
import numpy as np
import pytest

from snapaudit_jax.dpsgd import DPSGDConfig, train
from snapaudit_jax.dpsgd import keys as keys_mod
from snapaudit_jax.dpsgd.keys import KEY_FILE, fresh_key, key_digest, resolve_run_key, stored_key
from snapaudit_jax.utils.errors import InputError
from tests.snapaudit_jax.dpsgd.test_dpsgd import BASE, DATA, flat, make_model, params_of

CONFIG = dict(steps=4, learning_rate=0.1, clip_norm=1.0, noise_multiplier=1.3, sampling_rate=0.3, **BASE)


def _words(key) -> list[int]:
    return [int(x) for x in np.asarray(jax.random.key_data(key))]


def test_fresh_key_is_the_operating_systems_bytes_as_threefry_key_data(monkeypatch):
    monkeypatch.setattr(keys_mod.secrets, "token_bytes", lambda n: bytes(range(1, n + 1)))
    key = fresh_key()
    assert str(jax.random.key_impl(key)) == "threefry2x32"
    assert _words(key) == [int.from_bytes(bytes([1, 2, 3, 4]), "little"), int.from_bytes(bytes([5, 6, 7, 8]),
                                                                                         "little")]
    monkeypatch.undo()
    assert _words(fresh_key()) != _words(fresh_key())  # 2**-64 chance of a false failure


def test_key_digest_names_the_key_without_holding_it():
    key = jax.random.wrap_key_data(np.asarray([7, 2**32 - 1], np.uint32), impl="threefry2x32")
    h = hashlib.sha256(b"snapaudit-jax run key\0threefry2x32\0")
    h.update(np.asarray([7, 2**32 - 1], "<u4").tobytes())
    assert key_digest(key) == h.hexdigest()
    assert key_digest(key) != key_digest(jax.random.wrap_key_data(np.asarray([7, 2**32 - 2], np.uint32)))


def test_stored_key_is_drawn_once_private_and_refused_when_damaged(tmp_path):
    folder = tmp_path / "state"
    first = stored_key(folder)
    assert _words(stored_key(folder)) == _words(first)  # read back, not redrawn
    path = folder / KEY_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(folder) == [KEY_FILE]  # no temporary left
    assert json.loads(path.read_text())["key_data"] == _words(first)
    other = tmp_path / "other"
    assert _words(stored_key(other)) != _words(first)
    path.write_text('{"format": 1, "impl": "threefry2x32", "key_data": [1]}')
    with pytest.raises(InputError, match=r"run key .*run_key.json: must hold format 1"):
        stored_key(folder)
    path.write_text("{")
    with pytest.raises(InputError, match=r"run key .*run_key.json: not readable"):
        stored_key(folder)


def test_resolve_run_key_sources(tmp_path):
    given = jax.random.key(3)
    assert resolve_run_key(given, 5, tmp_path) == (None, "caller")
    key, source = resolve_run_key(None, 5, tmp_path)
    assert source == "seed" and _words(key) == _words(jax.random.key(5))
    assert not os.listdir(tmp_path)  # a seeded run keeps no key
    key, source = resolve_run_key(None, None, tmp_path)
    assert source == "secret" and _words(key) == json.loads((tmp_path / KEY_FILE).read_text())["key_data"]
    key2, _ = resolve_run_key(None, None, None)
    assert _words(key2) != _words(key)


@pytest.mark.slow  # five trainings and a cold compile: 3 to 6 s
def test_default_runs_draw_secret_noise_and_resume_bitwise(tmp_path):
    """Two default runs differ; a default run stopped and resumed equals the uninterrupted run given its stored
    key (bitwise); no checkpoint file but run_key.json holds the key's words; the report names the source."""
    config = DPSGDConfig(**CONFIG)
    assert config.seed is None
    a, _, report_a = train(make_model(), DATA, config)
    b, _, _ = train(make_model(), DATA, config)
    assert not np.array_equal(flat(params_of(a)), flat(params_of(b)))
    assert "secret key" in report_a.randomness and "operating system" in report_a.randomness
    folder = tmp_path / "ckpt"
    train(make_model(), DATA, config, checkpoint_dir=str(folder), stop_after=2)
    resumed, history, report = train(make_model(seed=9), DATA, config, checkpoint_dir=str(folder))
    words = json.loads((folder / KEY_FILE).read_text())["key_data"]
    key = jax.random.wrap_key_data(np.asarray(words, np.uint32), impl="threefry2x32")
    whole, whole_history, whole_report = train(make_model(), DATA, config, key=key)
    assert np.array_equal(flat(params_of(resumed)), flat(params_of(whole)))
    np.testing.assert_array_equal(history["batch_size"], whole_history["batch_size"])
    assert "caller" in whole_report.randomness and report.randomness == report_a.randomness
    # The key's two words appear in no checkpoint file (meta.json holds the digest).
    needles = [str(w) for w in words] + [np.asarray(words, "<u4").tobytes().hex()]
    for root, _, files in os.walk(folder):
        for name in files:
            if name == KEY_FILE:
                continue
            text = open(os.path.join(root, name), "rb").read()
            assert np.asarray(words, "<u4").tobytes() not in text, name
            if name == "meta.json":
                meta = json.loads(text)
                assert meta["run"]["key_sha256"] == key_digest(key)
                assert not any(n in text.decode() for n in needles[:2]), "a key word in meta.json"


@pytest.mark.slow  # three trainings and a cold compile
def test_a_seeded_run_is_replayable_and_says_so():
    config = DPSGDConfig(**CONFIG, seed=11)
    a, _, report = train(make_model(), DATA, config)
    b, _, _ = train(make_model(), DATA, config)
    c, _, _ = train(make_model(), DATA, config, key=jax.random.key(11))
    assert np.array_equal(flat(params_of(a)), flat(params_of(b)))
    assert np.array_equal(flat(params_of(a)), flat(params_of(c)))
    assert "only while that seed stays secret" in report.randomness
    assert report.to_dict()["randomness"] == report.randomness
    with pytest.raises(InputError, match=r"seed"):
        DPSGDConfig(**CONFIG, seed=-1)
