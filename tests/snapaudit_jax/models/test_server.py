"""The OpenAI-compatible server backend: parity with the in-process model, vLLM's format, the transport's faults.

The server in most tests is :class:`tests.helpers.fake_openai.FakeOpenAI` on loopback, answering in vLLM's
completions format from one full forward pass of the same tiny Flax model the local backend runs; the
local :class:`LanguageModel` (its packed label kernels and KV-cache decode) is the oracle.
"""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest

from snapaudit_jax.models.server import (
    OpenAIClient,
    ServerConfig,
    ServerLanguageModel,
    echoed_logprobs,
    connect,
    probe,
)
from snapaudit_jax.utils.errors import InputError, ServerError

from tests.helpers.fake_openai import FakeOpenAI, tiny_served_model

PROMPTS = ["Review: great film. Sentiment:", "Review: dull and long. Sentiment:", "the quick brown"]
LABELS = [" positive", " negative", " neutral answer"]  # the last one spans several tokens


@pytest.fixture(scope="module")
def tiny_folder():
    return tiny_served_model()[0]  # one tiny model per test process, shared with the fault tests


@pytest.fixture(scope="module")
def lm():
    return tiny_served_model()[1]


@pytest.fixture
def server(lm):
    with FakeOpenAI(lm) as srv:
        yield srv


def _remote(srv, lm, **kw):
    cfg = ServerConfig(srv.base_url, "tiny", **{"backoff_s": 0.01, "max_backoff_s": 2.0, **kw})
    sleeps = []
    client = OpenAIClient(cfg, sleep=sleeps.append)
    return ServerLanguageModel(cfg, lm.tokenizer, client=client), sleeps


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize("field,value,message", [
    ("base_url", "http://user:s3cret@host:8000", "must not embed credentials"),
    ("base_url", "ftp://host", "must be an http:// or https:// URL"),
    ("base_url", "http://host/v1?key=1", "no query or fragment"),
    ("base_url", "", "non-empty"),
    ("model", "", "model.server.model must be"),
    ("timeout_s", 0, "model.server.timeout_s must be a number > 0, got 0"),
    ("max_concurrency", 0, "model.server.max_concurrency must be an integer >= 1, got 0"),
    ("max_retries", -1, "model.server.max_retries must be an integer >= 0, got -1"),
    ("api_key_env", "", "api_key_env must name an environment variable"),
    ("timeout_s", float("inf"), r"model.server.timeout_s must be a finite number of seconds <= 3600, got inf"),
    ("timeout_s", float("nan"), r"model.server.timeout_s must be a number > 0, got nan"),
    ("timeout_s", 3601, r"model.server.timeout_s must be a finite number of seconds <= 3600, got 3601"),
    ("backoff_s", float("inf"), r"model.server.backoff_s must be a finite number of seconds <= 3600"),
    ("max_retries", 1e9, r"model.server.max_retries must be an integer in \[0, 100\], got 1000000000.0"),
    ("max_retries", 10 ** 9, r"model.server.max_retries must be an integer <= 100, got 1000000000"),
    ("max_concurrency", 100000, r"model.server.max_concurrency must be an integer <= 256, got 100000"),
    ("max_concurrency", True, r"model.server.max_concurrency must be an integer in \[1, 256\], got True"),
    ("request_budget_s", 30, r"model.server.request_budget_s must be >= model.server.timeout_s = 60 \(one attempt "
                             r"must fit\), got 30"),
    ("request_budget_s", float("inf"), r"model.server.request_budget_s must be a finite number of seconds <= 86400"),
    ("base_url", "http://host:99999", r"model.server.base_url must have a port in \[0, 65535\]"),
])
def test_bad_server_configs_are_refused_naming_the_field(field, value, message):
    kw = {"base_url": "http://127.0.0.1:8000", "model": "m", field: value}
    with pytest.raises(InputError, match=message) as err:
        ServerConfig(**kw)
    assert "s3cret" not in str(err.value)


def test_api_root_and_public_fields():
    assert ServerConfig("http://h:1", "m").api_root == "http://h:1/v1"
    assert ServerConfig("http://h:1/v1/", "m").api_root == "http://h:1/v1"
    assert ServerConfig("https://h/api", "m", api_key_env="K").public() == {"base_url": "https://h/api", "model": "m"}


def test_the_key_comes_from_the_named_variable_and_never_appears_in_messages(lm, monkeypatch):
    cfg = ServerConfig("http://127.0.0.1:1", "tiny", api_key_env="SNAPAUDIT_TEST_KEY")
    monkeypatch.delenv("SNAPAUDIT_TEST_KEY", raising=False)
    with pytest.raises(InputError, match="'SNAPAUDIT_TEST_KEY', which is not set"):
        OpenAIClient(cfg)
    monkeypatch.setenv("SNAPAUDIT_TEST_KEY", "sk-very-secret")
    with FakeOpenAI(lm, require_key="sk-very-secret") as srv:
        good = ServerConfig(srv.base_url, "tiny", api_key_env="SNAPAUDIT_TEST_KEY")
        assert probe(good, lm.tokenizer).logprobs
        monkeypatch.setenv("SNAPAUDIT_TEST_KEY", "sk-wrong-secret")
        with pytest.raises(ServerError, match="HTTP 401: invalid api key") as err:
            probe(good, lm.tokenizer)
        assert "sk-wrong-secret" not in str(err.value) and "sk-very-secret" not in str(err.value)
        assert len(srv.log) == 4  # the probe made 3 requests; the 401 is not retried


# --------------------------------------------------------------------------- parity with the Flax backend


def test_label_logprobs_match_the_in_process_model(lm, server):
    remote, _ = _remote(server, lm)
    prompts = [lm.chat_prompt(p) for p in PROMPTS]
    assert remote.chat_prompt(PROMPTS[0]) == prompts[0]
    ours = lm.label_logprobs(prompts, LABELS)
    theirs = remote.label_logprobs(prompts, LABELS)
    assert theirs.shape == (3, 3) and np.all(theirs < 0)
    np.testing.assert_allclose(theirs, ours, atol=2e-4)
    np.testing.assert_allclose(remote.label_logprobs(prompts, LABELS, normalize=True),
                               lm.label_logprobs(prompts, LABELS, normalize=True), atol=2e-4)
    assert server.completions_made() == 6  # one request per prompt holds all of its labels


def _clean_greedy(lm, n_tokens):
    """Prompts whose greedy continuation round-trips through text (a random model often emits partial UTF-8)."""
    candidates = [f"{a} {b}" for a in ("the", "quick", "a b c", "over the", "positive") for b in range(8)]
    gens = lm.generate(candidates, max_new_tokens=n_tokens)
    keep = [(p, g.text) for p, g in zip(candidates, gens)
            if g.text and lm.tokenizer.encode_continuation(g.text) == list(g.token_ids)]
    assert len(keep) >= 2, "too few clean greedy continuations to test with"
    return [p for p, _ in keep[:4]], [t for _, t in keep[:4]]


@pytest.mark.slow
def test_greedy_generation_and_continuation_checks_match(lm, server):
    remote, _ = _remote(server, lm, max_concurrency=3)
    ours = lm.generate(PROMPTS, max_new_tokens=6)
    theirs = remote.generate(PROMPTS, max_new_tokens=6)
    assert [g.text for g in theirs] == [g.text for g in ours]
    assert [g.token_ids for g in theirs] == [g.token_ids for g in ours]
    prompts, continuations = _clean_greedy(lm, 2)
    wrong = ["zq" + c for c in continuations]
    assert lm.greedy_continues_with(prompts, continuations).all()
    assert remote.greedy_continues_with(prompts, continuations).all()
    np.testing.assert_array_equal(remote.greedy_continues_with(prompts, wrong),
                                  lm.greedy_continues_with(prompts, wrong))
    assert not remote.greedy_continues_with(prompts, wrong).any()


def test_sampling_sends_one_seed_per_prompt_drawn_from_the_key(lm, server):
    import jax

    remote, _ = _remote(server, lm)
    a = remote.generate(PROMPTS, max_new_tokens=4, temperature=1.0, key=jax.random.key(3))
    b = remote.generate(PROMPTS, max_new_tokens=4, temperature=1.0, key=jax.random.key(3))
    assert [g.text for g in a] == [g.text for g in b]
    sent = [(tuple(body["prompt"]), body["seed"]) for path, body in server.log if body and "seed" in body]
    assert len(sent) == 6 and len(set(sent)) == 3  # the same seed for the same prompt in both calls
    assert len({seed for _, seed in sent}) == 3  # and one seed per prompt
    with pytest.raises(InputError, match="needs a PRNG key"):
        remote.generate(PROMPTS, temperature=1.0)


# --------------------------------------------------------------------------- vLLM's documented format


VLLM_ECHO = {  # an echo + max_tokens=0 + logprobs=1 answer as vLLM writes it (return_tokens_as_token_ids)
    "id": "cmpl-1", "object": "text_completion", "model": "m",
    "choices": [{"index": 0, "text": "Hi there", "finish_reason": "length", "logprobs": {
        "text_offset": [0, 2, 8], "tokens": ["token_id:5", "token_id:9", "token_id:11"],
        "token_logprobs": [None, -1.25, -9999.0],
        "top_logprobs": [None, {"token_id:9": -1.25, "token_id:4": -0.5}, {"token_id:11": -9999.0,
                                                                           "token_id:2": -0.01}]}}],
}


def testechoed_logprobs_are_read_at_their_positions_in_vllms_format():
    values, top = echoed_logprobs(VLLM_ECHO["choices"][0], [5, 9, 11], "t")
    assert values == [None, -1.25, -9999.0]  # the first token has no context; vLLM clamps -inf to -9999
    assert max(top[1], key=top[1].get) == "token_id:4"
    with pytest.raises(ServerError, match="echoed token 9 at position 1 where 8 was sent"):
        echoed_logprobs(VLLM_ECHO["choices"][0], [5, 8, 11], "t")
    with pytest.raises(ServerError, match="echoed 3 tokens for a prompt of 4 token ids"):
        echoed_logprobs(VLLM_ECHO["choices"][0], [5, 9, 11, 12], "t")
    bad = json.loads(json.dumps(VLLM_ECHO["choices"][0]))
    bad["logprobs"]["token_logprobs"][1] = 0.5
    with pytest.raises(ServerError, match=r"token_logprobs\[1\] = 0.5 is not a log-probability"):
        echoed_logprobs(bad, [5, 9, 11], "t")
    with pytest.raises(ServerError, match="ignores 'echo' or 'logprobs'"):
        echoed_logprobs({"index": 0, "text": "", "logprobs": None}, [5, 9, 11], "t")


# --------------------------------------------------------------------------- capabilities


def test_probe_reports_the_models_and_log_prob_support(lm, server):
    caps = probe(ServerConfig(server.base_url, "tiny"), lm.tokenizer)
    assert caps.model_ids == ("tiny",) and caps.max_model_len == 4096 and caps.completions and caps.logprobs
    caps.require("logprobs", "PoE", server.base_url)
    with pytest.raises(ServerError, match=r"model.server.model is 'other', but http://127.0.0.1:\d+ serves \['tiny'\]"):
        probe(ServerConfig(server.base_url, "other"), lm.tokenizer)


def test_a_server_that_ignores_logprobs_cannot_run_poe(lm):
    with FakeOpenAI(lm, logprobs=False) as srv:
        caps = probe(ServerConfig(srv.base_url, "tiny"), lm.tokenizer)
        assert caps.completions and not caps.logprobs
        with pytest.raises(ServerError, match="PoE needs logprobs from the model server.*PoE cannot run through"):
            caps.require("logprobs", "PoE", srv.base_url)
        remote, _ = _remote(srv, lm, max_concurrency=1)  # the first prompt fails first: one request at a time
        with pytest.raises(ServerError, match="label log-probs of prompt 0, label ' positive': the answer has no "
                                              "echoed token log-probabilities"):
            remote.label_logprobs(PROMPTS, LABELS)
        with pytest.raises(ServerError, match=r"PoE \(label log-probabilities\) needs logprobs"):
            connect(ServerConfig(srv.base_url, "tiny"), lm.tokenizer,
                    needs=[("logprobs", "PoE (label log-probabilities)")])
        remote, caps = connect(ServerConfig(srv.base_url, "tiny"), lm.tokenizer)
        assert not remote.logprobs and remote.max_length == 4096
        with pytest.raises(ServerError, match="label log-probabilities need echoed log-probs"):
            remote.label_logprobs(PROMPTS, LABELS)
        # PV's copy checks still run: by greedy decoding, compared on the server's token ids
        prompts, continuations = _clean_greedy(lm, 2)
        wrong = ["zq" + c for c in continuations]
        assert remote.greedy_continues_with(prompts, continuations).all()
        assert not remote.greedy_continues_with(prompts, wrong).any()


@pytest.mark.slow
def test_a_text_only_server_gets_text_prompts_and_decoded_greedy_checks(lm):
    with FakeOpenAI(lm, token_prompts=False) as srv:
        remote, caps = connect(ServerConfig(srv.base_url, "tiny"), lm.tokenizer)
        assert not caps.token_prompts and not caps.logprobs and "prompt must be a string" in caps.notes["token_prompts"]
        assert not remote.token_prompts and not remote.logprobs
        prompts = [lm.chat_prompt(p) for p in PROMPTS]
        ours = lm.generate(prompts, max_new_tokens=5)
        assert [g.text for g in remote.generate(prompts, max_new_tokens=5)] == [g.text for g in ours]
        assert all(isinstance(body["prompt"], str) for path, body in srv.log[-3:])
        prompts, continuations = _clean_greedy(lm, 2)
        assert remote.greedy_continues_with(prompts, continuations).all()
        assert not remote.greedy_continues_with(prompts, ["zq" + c for c in continuations]).any()


# --------------------------------------------------------------------------- faults


@pytest.mark.parametrize("fault", ["500", "429", "truncate", "garbage", "reset", "drop_logprobs"])
def test_transient_faults_are_retried_and_malformed_answers_refused(lm, server, fault):
    remote, sleeps = _remote(server, lm)
    expected = lm.label_logprobs(PROMPTS[:1], LABELS[:2])
    server.faults = [fault]
    if fault == "drop_logprobs":  # a well-formed answer without the data: an error, never a silent guess
        with pytest.raises(ServerError, match="no echoed token log-probabilities"):
            remote.label_logprobs(PROMPTS[:1], LABELS[:2])
        assert remote.client.retries == 0
        return
    got = remote.label_logprobs(PROMPTS[:1], LABELS[:2])
    np.testing.assert_allclose(got, expected, atol=2e-4)
    assert remote.client.retries == 1 and server.completions_made() == 2
    if fault == "429":
        assert sleeps == [pytest.approx(1.0, abs=0.02)]  # Retry-After: 1 beats the 0.01 s backoff
    else:
        assert 0 <= sleeps[0] <= 0.01


def test_a_hung_response_times_out_and_is_retried(lm):
    expected = lm.generate(PROMPTS[:1], max_new_tokens=3)[0].text  # compiled here, so the server answers in time
    with FakeOpenAI(lm, hang_s=1.5) as srv:
        remote, _ = _remote(srv, lm, timeout_s=0.4)
        srv.faults = ["hang"]
        out = remote.generate(PROMPTS[:1], max_new_tokens=3)
        assert out[0].text == expected
        assert remote.client.retries == 1


def test_retries_are_bounded_and_the_error_names_the_request(lm, server):
    remote, sleeps = _remote(server, lm, max_retries=2, backoff_s=0.1, max_backoff_s=0.25)
    server.faults = ["500"] * 5
    with pytest.raises(ServerError, match=r"label log-probs of prompt 0: http://127.0.0.1:\d+/v1/completions failed "
                                          r"after 3 attempts; last: HTTP 500: internal error \(injected\)"):
        remote.label_logprobs(PROMPTS[:1], LABELS[:1])
    assert server.completions_made() == 3 and len(sleeps) == 2
    assert 0 <= sleeps[0] <= 0.1 and 0 <= sleeps[1] <= 0.2  # full jitter under a doubling cap


def test_a_refused_connection_is_retried_then_reported(lm):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    cfg = ServerConfig(f"http://127.0.0.1:{port}", "tiny", max_retries=1, backoff_s=0.01)
    with pytest.raises(ServerError, match=r"model listing \(/v1/models\): .*failed after 2 attempts; "
                                          r"last: ConnectionRefusedError"):
        probe(cfg, lm.tokenizer, client=OpenAIClient(cfg, sleep=lambda s: None))


def test_not_found_is_not_retried(lm, server):
    cfg = ServerConfig(server.base_url + "/nowhere", "tiny")
    client = OpenAIClient(cfg, sleep=lambda s: None)
    with pytest.raises(ServerError, match="HTTP 404: no route /nowhere/v1/models"):
        probe(cfg, lm.tokenizer, client=client)
    assert client.attempts == 1


def test_map_reports_each_result_at_once_and_stops_after_a_failure(lm):
    cfg = ServerConfig("http://127.0.0.1:1", "m", max_concurrency=2)
    client = OpenAIClient(cfg)
    seen = []
    assert client.map(lambda x: x * x, range(6), on_result=lambda i, v: seen.append((i, v))) == [0, 1, 4, 9, 16, 25]
    assert sorted(seen) == [(i, i * i) for i in range(6)]

    started = []

    def fail_on_one(x):
        started.append(x)
        if x == 1:
            raise ServerError("boom")
        return x

    with pytest.raises(ServerError, match="boom"):
        OpenAIClient(ServerConfig("http://127.0.0.1:1", "m", max_concurrency=1)).map(fail_on_one, range(50))
    assert started == [0, 1]


# --------------------------------------------------------------------------- the answer cache


def test_a_run_killed_mid_phase_a_resumes_without_repeating_a_call(lm, server, tmp_path):
    from snapaudit_jax.models import LLMOracle

    prompts = [f"{p} {i}" for i in range(3) for p in PROMPTS[:2]]  # 6 distinct prompts
    cache = str(tmp_path / "llm_cache.jsonl")
    remote, _ = _remote(server, lm, max_retries=0, max_concurrency=1)
    server.faults = [None, None, "500"]  # the third request dies: the run stops there
    with pytest.raises(ServerError, match="label log-probs of prompt 2"):
        LLMOracle(remote, cache_path=cache).label_logprobs(prompts, LABELS[:2])
    with open(cache) as fh:
        assert len(fh.readlines()) == 2  # both finished answers were stored at once
    remote, _ = _remote(server, lm, max_concurrency=3)
    oracle = LLMOracle(remote, cache_path=cache)
    got = oracle.label_logprobs(prompts, LABELS[:2])
    assert server.completions_made() == 3 + 4 and server.answered == 6  # no answer was asked for twice
    assert oracle.stats.computed == 4 and oracle.stats.cached == 2
    np.testing.assert_allclose(got, lm.label_logprobs(prompts, LABELS[:2]), atol=2e-4)
    again = LLMOracle(remote, cache_path=cache)
    np.testing.assert_array_equal(again.label_logprobs(prompts, LABELS[:2]), got)
    assert server.completions_made() == 7
    texts = again.generate(prompts[:2], 4)
    assert texts == LLMOracle(lm).generate(prompts[:2], 4)


# --------------------------------------------------------------------------- snapaudit generate --model openai


def test_generate_command_through_the_server(lm, tiny_folder, server, capsys):
    from snapaudit_jax.cli import main

    argv = ["generate", "--model", "openai", "--base-url", server.base_url, "--server-model", "tiny",
            "--tokenizer", tiny_folder, "--prompt", PROMPTS[0], "--max-new-tokens", "5", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == lm.generate([PROMPTS[0]], max_new_tokens=5)[0].text
    assert main(["generate", "--model", "openai", "--base-url", server.base_url, "--prompt", "x"]) == 2
    assert "--server-model is required with --model openai" in capsys.readouterr().err
    assert main(["generate", "--base-url", server.base_url, "--prompt", "x"]) == 2
    assert "need --model openai, got --model 'smollm2'" in capsys.readouterr().err
    assert main(["generate", "--model", "openai", "--base-url", "http://u:pw@127.0.0.1:1", "--server-model", "m",
                 "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "--base-url must not embed credentials" in err and "pw" not in err
