"""Phase A through a real OpenAI-compatible server: ``transformers serve`` on loopback, serving SmolLM2.

``transformers serve`` takes text prompts only and ignores ``logprobs`` and ``echo``: the probe must find
that, PoE must stop with the capability error before any output exists, and PV's copy checks must run by
greedy decoding. Its greedy answers are compared with our Flax backend on the same prompts (the same
dequantised float32 weights on both sides).
"""

from __future__ import annotations

import json
import pytest

from snapaudit_jax.models.serving import TransformersServe, serving_available, write_hf_folder

pytestmark = pytest.mark.skipif(serving_available() is not None, reason=str(serving_available()))

QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "Say hello in one word."]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = write_hf_folder(str(tmp_path_factory.mktemp("served") / "smollm2"))
    with TransformersServe(folder) as srv:
        yield srv


@pytest.fixture(scope="module")
def remote(served):
    from snapaudit_jax.models import load_tokenizer
    from snapaudit_jax.models.server import ServerConfig, connect

    return connect(ServerConfig(served.base_url, served.model_id, max_concurrency=2), load_tokenizer("smollm2"))


@pytest.mark.slow
def test_the_probe_finds_a_text_only_server_without_log_probs(remote, served):
    from snapaudit_jax.models.server import ServerError

    model, caps = remote
    assert caps.model_ids == (served.model_id,) and caps.completions
    assert not caps.token_prompts and "prompt must be a string" in caps.notes["token_prompts"]
    assert not caps.logprobs and not model.logprobs
    with pytest.raises(ServerError, match="PoE needs logprobs from the model server, but http://127.0.0.1:"):
        caps.require("logprobs", "PoE", served.base_url)


@pytest.mark.slow
def test_greedy_answers_match_the_flax_backend(remote):
    from tests.helpers.embedded import smollm2

    model, _ = remote
    flax = smollm2()
    prompts = [flax.chat_prompt(q) for q in QUESTIONS]
    assert [model.chat_prompt(q) for q in QUESTIONS] == prompts
    ours = flax.generate(prompts, max_new_tokens=8)
    theirs = model.generate(prompts, max_new_tokens=8)
    assert [g.text for g in theirs] == [g.text for g in ours]
    # the copy check by decoding agrees with the teacher-forced one
    continuations = [g.text for g in ours]
    assert model.greedy_continues_with(prompts, continuations).tolist() == \
        flax.greedy_continues_with(prompts, continuations).tolist() == [True] * 3
    wrong = [" Zebra" + c for c in continuations]
    assert model.greedy_continues_with(prompts, wrong).tolist() == [False] * 3


def _config(served, pipelines: str) -> str:
    return (f'[model]\nllm = "openai"\n[model.server]\nbase_url = "{served.base_url}"\nmodel = "{served.model_id}"\n'
            'tokenizer = "smollm2"\nmax_concurrency = 2\n'
            '[audit]\nepsilons = [4]\nquery = "copy"\nthreats = ["black"]\nsnapshots = 4\ntrials = 2000\n'
            f'passive_runs = 2\nverify = 2\n{pipelines}')


def _run(path, out):
    from snapaudit_jax.dpicl.config import load_config
    from snapaudit_jax.dpicl.run import run_audit

    return run_audit(load_config(path), str(out), progress=False)


@pytest.mark.slow
def test_a_small_pv_audit_runs_through_the_server(served, tmp_path):
    path = tmp_path / "served.toml"
    path.write_text(_config(served, "[pipelines.pv]\nnum_exemplars = 4\npartitions = 2\n"))
    out = tmp_path / "run"
    result = _run(path, out)
    assert {r["pipeline"] for r in result["rows"]} == {"pv"}
    manifests = json.dumps(result["summary"])
    assert f'"server": {{"backend": "openai", "base_url": "{served.base_url}", "model": "{served.model_id}"}}' \
        in manifests and f"openai:{served.model_id}" in manifests
    assert (out / "results.json").exists() and (out / "table.md").exists()
    with open(out / "llm_cache.jsonl") as fh:
        assert len(fh.readlines()) > 0  # every server answer went through the answer cache


@pytest.mark.slow
def test_poe_through_the_server_stops_before_any_output(served, tmp_path):
    from snapaudit_jax.utils.errors import EXIT_INPUT, ServerError

    path = tmp_path / "poe.toml"
    path.write_text(_config(served, "[pipelines.poe]\nnum_exemplars = 4\n"))
    out = tmp_path / "run"
    with pytest.raises(ServerError, match=r"PoE \(label log-probabilities\) needs logprobs from the model server.*"
                                          r"cannot run through this server") as err:
        _run(path, out)
    assert err.value.exit_code == EXIT_INPUT
    assert not out.exists()
