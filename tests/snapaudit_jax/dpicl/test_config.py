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


# --------------------------------------------------------------------------- limits checked before any model call


def _load_no_llm(tmp_path, text: str):
    path = tmp_path / "c.toml"
    path.write_text('[model]\nllm = "/no/such/model"\n' + text)
    return load_config(path)


def test_epsilon_limit_is_the_32_bit_key_fold_of_the_passive_runs(tmp_path):
    """run_audit folds int(epsilon * 1000) into a uint32: the largest epsilon accepted is the last that fits."""
    import jax

    from snapaudit_jax.dpicl.config import MAX_EPSILON

    key = jax.random.key(0)
    for eps, fits in ((MAX_EPSILON, True), (4294967.2959, True), (4294967.296, False)):
        text = f"[audit]\nepsilons = [{eps!r}]\n[pipelines.poe]\n"
        if fits:
            jax.random.fold_in(key, int(eps * 1000))
            assert _load_no_llm(tmp_path, text).epsilons == (eps,)
        else:
            with pytest.raises(OverflowError):  # the limit is real
                jax.random.fold_in(key, int(eps * 1000))
            with pytest.raises(ConfigFileError, match=r"audit.epsilons: epsilon must be below 4294967.296 \(.*32-bit"):
                _load_no_llm(tmp_path, text)


def test_trials_limit_and_seed_range(tmp_path):
    from snapaudit_jax.simulation.trials import MAX_TRIALS

    text = f"[audit]\ntrials = {MAX_TRIALS}\nseed = {2**63 - 1}\n[pipelines.pv]\n"
    assert _load_no_llm(tmp_path, text).trials == MAX_TRIALS
    with pytest.raises(ConfigFileError, match=f"audit.trials: must be <= {MAX_TRIALS}"):
        _load_no_llm(tmp_path, f"[audit]\ntrials = {MAX_TRIALS + 1}\n[pipelines.pv]\n")
    with pytest.raises(ConfigFileError, match=r"audit.case_seed: case_seed must be an integer in \[0, 2\*\*63 - 1\]"):
        _load_no_llm(tmp_path, f"[audit]\ncase_seed = {2**63}\n[pipelines.pv]\n")


def test_claims_are_calibrated_for_each_pipeline_at_load_no_llm(tmp_path):
    """An epsilon PV cannot be calibrated for at this delta is refused naming audit.epsilons and the pipeline;
    the same epsilon passes for PoE, which has no delta (the check follows each pipeline's mechanism)."""
    text = "[audit]\nepsilons = [1e-8]\ndelta = 1e-300\n"
    with pytest.raises(ConfigFileError, match=r"audit.epsilons: epsilon 1e-08 with delta 1e-300 .*\(pipelines.pv\)"):
        _load_no_llm(tmp_path, text + "[pipelines.pv]\n")
    assert _load_no_llm(tmp_path, text + "[pipelines.poe]\n").epsilons == (1e-8,)
    with pytest.raises(ConfigFileError, match=r"one_run.epsilons: epsilon 1e-08 with delta 1e-300"):
        _load_no_llm(tmp_path, "[audit]\ndelta = 1e-300\n[pipelines.poe]\n[one_run]\nepsilons = [1e-8]\n")


def test_num_exemplars_is_checked_against_the_dataset_before_the_run_folder(tmp_path):
    """The shipped AG News demo has n distinct examples: num_exemplars = n - 1 fits (a canary and n - 1
    exemplars), n does not, and the refusal names the key without creating the folder."""
    from snapaudit_jax.dpicl.data import load_examples
    from snapaudit_jax.dpicl.data.datasets import _content
    from snapaudit_jax.dpicl.run import _load_datasets, run_audit

    n = len({_content(e) for e in load_examples("agnews", None)})
    assert _load_datasets(_load_no_llm(tmp_path, f"[pipelines.pv]\nnum_exemplars = {n - 1}\n"))
    config = _load_no_llm(tmp_path, f"[pipelines.pv]\nnum_exemplars = {n}\n")
    with pytest.raises(ConfigFileError, match=f"pipelines.pv.num_exemplars: .*at least num_exemplars \\+ 1 = {n + 1}"):
        run_audit(config, str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run").exists()
