"""The PII experiment's data preparation (:mod:`attacks.data`): a record too long for the model and a distractor
pool too small for the inference game are config errors raised before anything is trained or written."""

from __future__ import annotations

import pytest

from attacks.config import load_pii_config
from attacks.run import run_pii
from snapaudit_jax.utils.config import ConfigFileError
from tests.helpers.pii import tiny_pii_toml, write_toml

TINY = tiny_pii_toml("{variants}")


def test_too_short_max_length_fails_before_writing(tmp_path):
    cfg = load_pii_config(write_toml(tmp_path, TINY.format(variants="").replace("max_length = 192", "max_length = 24")))
    out = tmp_path / "out"
    with pytest.raises(ConfigFileError, match="model.max_length: must be >= "):
        run_pii(cfg, str(out), progress=False)
    assert not out.exists()


def test_inference_pool_too_small_fails_before_writing(tmp_path):
    cfg = load_pii_config(write_toml(tmp_path, TINY.format(variants="").replace("n_candidates = 5",
                                                                                "n_candidates = [5, 500]")))
    assert cfg.inference.sizes == (5, 500)
    out = tmp_path / "out"
    with pytest.raises(ConfigFileError, match=r"inference.n_candidates: \|C\| = 500 needs at least that many"):
        run_pii(cfg, str(out), progress=False)
    assert not out.exists()
