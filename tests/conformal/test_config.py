"""The CPA configuration (``conformal.config.load_cpa_config``): every error names the field."""

from __future__ import annotations


import pytest

from conformal.config import load_cpa_config
from snapaudit_jax.utils.config import ConfigFileError

from tests.helpers.cpa import LLM_CONFIG, SMALL, write_config


# --------------------------------------------------------------------------- configuration errors


@pytest.mark.parametrize("edit, match", [
    (("alphas = [0.05, 0.1, 0.2]", "alphas = [0.05, 1.5]"), "alpha"),
    (("n_cal = 60", "n_cal = 0"), "n_cal"),
    (("splits = 1", "splits = 1\nbogus = 2"), "bogus"),
    (('score = "aps"', 'score = "lac"'), "score"),
    (('kind = "retrieval"\ntemperature', 'kind = "oracle"\ntemperature'), "kind"),
    (("temperature = 0.5", "temperature = -1"), "temperature"),
    (("[data.synthetic]", "[data.nonsense]"), "data.nonsense"),
    (('calibrate = "synthetic/K2/direct"', 'calibrate = 3'), "calibrate"),
    (('attacker = "retrieval"\nsuite', 'attacker = "nobody"\nsuite'), "truncation"),
    (('suites = ["synthetic/K2/direct", "synthetic/K2/quasi_id_redaction"]', 'suites = ["synthetic/K2/direct"]'),
     "mondrian.suites"),
    (("report_alpha = 0.1", "report_alpha = 0.3"), "report_alpha"),
])
def test_config_errors_name_the_field(tmp_path, edit, match):
    old, new = edit
    assert old in SMALL
    with pytest.raises(ConfigFileError, match=match):
        load_cpa_config(write_config(tmp_path, SMALL.replace(old, new, 1)))


# --------------------------------------------------------------------------- LLM attackers (tiny random model)


def test_llm_model_path_is_checked(tmp_path):
    with pytest.raises(ConfigFileError, match="attackers.clues.model"):
        load_cpa_config(write_config(tmp_path, LLM_CONFIG.format(model=str(tmp_path / "missing"))))
