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


# --------------------------------------------------------------------------- limits checked before any work


def test_temperature_range_is_where_the_float32_softmax_stays_finite(tmp_path):
    """At the smallest normal float32 the retrieval posterior is finite (the limit is accepted); half of it, a
    subnormal, already makes it nan (and is refused)."""
    import jax.numpy as jnp
    import numpy as np

    from conformal.attackers import softmax_posterior
    from conformal.config import MIN_TEMPERATURE

    sims = jnp.asarray([[1.0, 0.25, -1.0]], jnp.float32)
    assert np.all(np.isfinite(softmax_posterior(sims, jnp.float32(MIN_TEMPERATURE))))
    assert np.isnan(softmax_posterior(sims, jnp.float32(MIN_TEMPERATURE / 2))).any()
    edge = SMALL.replace("temperature = 0.5", f"temperature = {MIN_TEMPERATURE!r}", 1)
    assert load_cpa_config(write_config(tmp_path, edge)).attackers[0].temperature == MIN_TEMPERATURE
    with pytest.raises(ConfigFileError, match=r"attackers.retrieval.temperature: must be in \[1.17549e-38"):
        load_cpa_config(write_config(tmp_path, SMALL.replace("temperature = 0.5", "temperature = 1e-308", 1)))


def test_sizes_are_planned_from_the_config(tmp_path, monkeypatch):
    from conformal.config import _PERSON_BYTES
    from snapaudit_jax.utils import memory

    text = SMALL.replace("n_people = 200", "n_people = 1000", 1)
    monkeypatch.setattr(memory, "available_bytes", lambda: 1000 * _PERSON_BYTES - 1)
    with pytest.raises(ConfigFileError, match="data.synthetic.n_people: 1000 people would need at least"):
        load_cpa_config(write_config(tmp_path, text))
    monkeypatch.setattr(memory, "available_bytes", lambda: 10**9)
    assert load_cpa_config(write_config(tmp_path, text)).data["synthetic"]["n_people"] == 1000
