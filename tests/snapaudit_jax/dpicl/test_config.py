"""``[model] llm = "openai"`` and ``[model.server]`` in the audit configuration."""

from __future__ import annotations

import pytest

from snapaudit_jax.dpicl.config import load_config
from snapaudit_jax.dpicl.run import server_needs
from snapaudit_jax.models.server import ServerConfig
from snapaudit_jax.utils.errors import ConfigFileError

SERVER = '[model.server]\nbase_url = "http://127.0.0.1:8000"\nmodel = "m"\ntokenizer = "smollm2"\n'


def _load(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return load_config(path)


def test_the_server_section_is_read_with_llm_openai(tmp_path):
    cfg = _load(tmp_path, '[model]\nllm = "openai"\n' + SERVER + 'api_key_env = "K"\nmax_concurrency = 16\n'
                '[audit]\nquery = "copy"\n[pipelines.pv]\n')
    assert cfg.server == ServerConfig("http://127.0.0.1:8000", "m", api_key_env="K", max_concurrency=16)
    assert cfg.server_tokenizer == "smollm2"
    assert server_needs(cfg) == []  # PV's copy checks decode when the server has no log-probs
    assert _load(tmp_path, "[pipelines.pv]\n").server is None


@pytest.mark.parametrize("text,message", [
    ('[model]\nllm = "openai"\n[pipelines.pv]\n', r"model.server: \[model\] llm = \"openai\" needs a \[model.server\]"),
    ('[model]\nllm = "openai"\n[model.server]\nbase_url = "http://h"\nmodel = "m"\n[pipelines.pv]\n',
     "model.server.tokenizer: required"),
    ('[model]\nllm = "openai"\n' + SERVER.replace("127.0.0.1", "u:pw@127.0.0.1") + "[pipelines.pv]\n",
     "model.server.base_url must not embed credentials"),
    ('[model]\nllm = "openai"\n' + SERVER + "timeout_s = -1\n[pipelines.pv]\n",
     "model.server.timeout_s must be a number > 0, got -1"),
    ('[model]\nllm = "openai"\n' + SERVER + "retries = 3\n[pipelines.pv]\n", "model.server.*retries"),
    ("[model]\n" + SERVER + "[pipelines.pv]\n", r"model.server: only read with \[model\] llm = \"openai\""),
])
def test_bad_server_sections_name_the_key(tmp_path, text, message):
    with pytest.raises(ConfigFileError, match=message) as err:
        _load(tmp_path, text)
    assert "pw@" not in str(err.value)


def test_needs_follow_the_pipelines_and_query(tmp_path):
    cfg = _load(tmp_path, '[model]\nllm = "openai"\n' + SERVER + '[audit]\nquery = "direct"\n[pipelines.pv]\n'
                "[pipelines.poe]\n[pipelines.esa]\n")
    assert [who for _, who in server_needs(cfg)] == ["PoE (label log-probabilities)",
                                                     "PV in the direct query mode (Yes/No log-probabilities)"]
