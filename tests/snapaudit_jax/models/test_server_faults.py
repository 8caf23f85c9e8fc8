"""A misbehaving model server: every inconsistency of its answers is a stop naming the request, every request
ends by its deadline, and answers of one server are never reused for another.

The server is :class:`tests.helpers.fake_openai.FakeOpenAI` with its fault modes (persistent ones, which the
probe meets, and per-request ones, met mid-run); the tiny in-process model it serves is the oracle of the
numbers. Power checks show that each fault, unchecked, would have produced other numbers or hung.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import time

import numpy as np
import pytest

from snapaudit_jax.models import LLMOracle
from snapaudit_jax.models import client as client_module
from snapaudit_jax.models import server as server_module
from snapaudit_jax.models.server import (
    OpenAIClient,
    ServerConfig,
    ServerLanguageModel,
    _check_model,
    _choices,
    connect,
    probe,
)
from snapaudit_jax.utils.errors import ServerError

from tests.helpers.fake_openai import FakeOpenAI, tiny_served_model

PROMPTS = ["the quick brown", "a b c d", "Hello world, this"]
LABELS = [" negative", " label", " answer"]  # one token each: a swap changes no length, only the tokens


@pytest.fixture(scope="module")
def lm():
    return tiny_served_model()[1]


@pytest.fixture(scope="module")
def truth(lm):
    return lm.label_logprobs(PROMPTS, LABELS)


def _config(srv, **kw):
    return ServerConfig(srv.base_url, srv.model_id, **{"backoff_s": 0.01, "max_backoff_s": 0.05, **kw})


def _connect(srv, lm, **kw):
    return connect(_config(srv, **kw), lm.tokenizer)


# --------------------------------------------------------------------------- refused in the probe


@pytest.mark.parametrize("mode,message", [
    ("swap_choices", r"probe log-probs \(two prompts\): http://127.0.0.1:\d+ answered 2 choices without an integer "
                     r"'index' on each \(got \[None, None\]\), so they cannot be matched to the 2 prompts sent"),
    ("no_index", r"probe log-probs \(two prompts\): http://127.0.0.1:\d+ answered 2 choices without an integer "
                 r"'index'"),
    ("lying_index", r"probe log-probs \(two prompts\), prompt 0: http://127.0.0.1:\d+ echoed token \d+ at position "
                    r"0 where \d+ was sent"),
    ("other_model", r"probe completion: http://127.0.0.1:\d+ answered as model 'other-model', but "
                    r"model.server.model is 'tiny': another model answers there"),
    ("no_model", r"probe completion: http://127.0.0.1:\d+ answered without a 'model' field, so the answer cannot "
                 r"be checked against model.server.model = 'tiny'"),
])
def test_a_misbehaving_server_is_refused_by_the_probe_naming_the_request(lm, mode, message):
    with FakeOpenAI(lm, modes=[mode]) as srv:
        with pytest.raises(ServerError, match=message):
            probe(_config(srv), lm.tokenizer)
    with FakeOpenAI(lm) as srv:  # the same probe passes against the well-behaved server
        caps = probe(_config(srv), lm.tokenizer)
        assert caps.logprobs and caps.echo_tokens == "token_ids" and caps.fingerprint is None


def test_swapped_choices_would_have_given_other_numbers(lm, truth):
    """Power check: the swapped server's answers, read in arrival order, are other numbers; read by the echoed
    tokens (the order the checks enforce) they are the model's."""
    rows = lm.tokenizer.encode_batch(PROMPTS)
    label_ids = [lm.tokenizer.encode_continuation(lab) for lab in LABELS]
    with FakeOpenAI(lm, modes=["swap_choices"]) as srv:
        client = OpenAIClient(_config(srv))
        arrival, by_tokens = [], []
        for row in rows:
            seqs = [row + ids for ids in label_ids]
            answer = client.request("/completions", {"model": "tiny", "prompt": seqs, "max_tokens": 0, "echo": True,
                                                     "logprobs": 0}, what="raw")
            assert all("index" not in c for c in answer["choices"])
            sums = [float(np.sum(c["logprobs"]["token_logprobs"][len(row):])) for c in answer["choices"]]
            arrival.append(sums)
            echoed = [[int(t.split(":")[1]) for t in c["logprobs"]["tokens"]] for c in answer["choices"]]
            by_tokens.append([sums[echoed.index(seq)] for seq in seqs])
        np.testing.assert_allclose(by_tokens, truth, atol=2e-4)
        assert np.abs(np.asarray(arrival) - truth).max() > 0.05  # the first and last labels exchanged
        remote = ServerLanguageModel(_config(srv, max_concurrency=1), lm.tokenizer)
        with pytest.raises(ServerError, match="label log-probs of prompt 0: .* without an integer 'index'"):
            remote.label_logprobs(PROMPTS, LABELS)


def test_with_the_index_check_removed_the_echoed_tokens_still_refuse_a_swap(lm, monkeypatch):
    """Two independent checks: taking the choices in arrival order, the echoed token ids give the swap away."""
    with FakeOpenAI(lm, modes=["swap_choices"]) as srv:
        monkeypatch.setattr(server_module, "_choices", lambda answer, n, what, base_url="": answer["choices"])
        remote = ServerLanguageModel(_config(srv, max_concurrency=1), lm.tokenizer)
        with pytest.raises(ServerError, match=r"label log-probs of prompt 0, label ' negative': http://127.0.0.1:\d+ "
                                              r"echoed token \d+ at position \d+ where \d+ was sent"):
            remote.label_logprobs(PROMPTS, LABELS)


def test_the_model_field_and_choice_indices_are_checked_on_their_own():
    cfg = ServerConfig("http://h:1", "org/m", section="server")
    _check_model({"model": "org/m"}, cfg, "w")
    _check_model({"model": "org/m@main"}, cfg, "w")  # transformers serve's canonical id of a Hub repository
    for answer, message in [({"model": "org/m@dev"}, "answered as model 'org/m@dev', but server.model is 'org/m'"),
                            ({"choices": []}, "answered without a 'model' field"),
                            ([1], "answered a JSON list, not an object")]:
        with pytest.raises(ServerError, match=message):
            _check_model(answer, cfg, "w")
    assert _choices({"choices": [{"text": "a"}]}, 1, "w") == [{"text": "a"}]  # one choice may omit its index
    assert [c["i"] for c in _choices({"choices": [{"index": 1, "i": 1}, {"index": 0, "i": 0}]}, 2, "w")] == [0, 1]
    for choices, n, message in [([{"index": 3}], 1, "one choice with index 3"),
                                ([{"index": 0}, {"index": 0}], 2, r"indices \[0, 0\], not each of 0..1 once"),
                                ([{"index": 0}, {"index": True}], 2, "without an integer 'index'"),
                                ([{"index": 0}], 2, "answered 1 choices where 2 were asked for")]:
        with pytest.raises(ServerError, match=message):
            _choices({"choices": choices}, n, "w", "http://h:1")


# --------------------------------------------------------------------------- mid-run faults and the cache


@pytest.mark.parametrize("fault,message", [
    ("swap_choices", "label log-probs of prompt 1: .* without an integer 'index'"),
    ("lying_index", r"label log-probs of prompt 1, label ' negative': .* echoed token \d+ at position \d+ where"),
    ("other_model", "label log-probs of prompt 1: .* answered as model 'other-model'"),
    ("other_fingerprint", "label log-probs of prompt 1: .* reports system_fingerprint 'other-fingerprint', but its "
                          "answers at the probe reported 'fp-1': the server changed"),
])
def test_a_fault_mid_run_stops_it_and_nothing_of_that_request_is_cached(lm, truth, tmp_path, fault, message):
    cache = str(tmp_path / "llm_cache.jsonl")
    with FakeOpenAI(lm, fingerprint="fp-1") as srv:
        remote, caps = _connect(srv, lm, max_concurrency=1)
        assert caps.fingerprint == "fp-1"
        srv.faults = [None, fault]
        with pytest.raises(ServerError, match=message):
            LLMOracle(remote, cache_path=cache).label_logprobs(PROMPTS, LABELS)
        with open(cache) as fh:
            stored = [json.loads(line)["v"] for line in fh]
        np.testing.assert_allclose(stored, truth[:1], atol=2e-4)  # prompt 0 only: the faulted answer is not there
        srv.faults = []
        remote, _ = _connect(srv, lm, max_concurrency=1)  # a correct rerun against the same folder
        oracle = LLMOracle(remote, cache_path=cache)
        got = oracle.label_logprobs(PROMPTS, LABELS)
        assert oracle.stats.computed == 2 and oracle.stats.cached == 1
        np.testing.assert_array_equal(got, LLMOracle(remote).label_logprobs(PROMPTS, LABELS))  # never faulted
        np.testing.assert_allclose(got, truth, atol=2e-4)


def test_generation_refuses_another_model_mid_run(lm):
    with FakeOpenAI(lm) as srv:
        remote, _ = _connect(srv, lm, max_concurrency=1)
        srv.faults = [None, "other_model"]
        with pytest.raises(ServerError, match="generation of prompt 1: .* answered as model 'other-model'"):
            remote.generate(PROMPTS[:2], max_new_tokens=2)
        srv.faults = ["other_model"]
        with pytest.raises(ServerError, match=r"greedy check of prompt 0: .* answered as model 'other-model'"):
            remote.greedy_continues_with(PROMPTS[:1], [" x"])


@pytest.mark.parametrize("change", ["nothing", "base_url", "model", "root", "fingerprint"])
def test_answers_of_one_server_are_never_reused_for_another(lm, tmp_path, change):
    cache = str(tmp_path / "llm_cache.jsonl")
    with FakeOpenAI(lm, root="/models/a", fingerprint="fp-a") as a, FakeOpenAI(lm, root="/models/a",
                                                                               fingerprint="fp-a") as b:
        first, _ = _connect(a, lm)
        assert LLMOracle(first, cache_path=cache).label_logprobs(PROMPTS[:2], LABELS[:2]).shape == (2, 2)
        srv = b if change == "base_url" else a
        if change == "model":
            srv.model_id = "tiny-v2"  # the same URL now serves another model
        elif change == "root":
            srv.root = "/models/b"
        elif change == "fingerprint":
            srv.fingerprint = "fp-b"
        second, _ = _connect(srv, lm)
        oracle = LLMOracle(second, cache_path=cache)
        oracle.label_logprobs(PROMPTS[:2], LABELS[:2])
    assert second.name == first.name or change == "model"  # the report's label names the model only
    if change == "nothing":
        assert second.identity == first.identity and oracle.stats.computed == 0 and oracle.stats.cached == 2
    else:
        assert second.identity != first.identity and oracle.stats.computed == 2 and oracle.stats.cached == 0


def test_the_identity_is_the_api_root_model_root_and_fingerprint(lm):
    def identity(url="http://h:1", model="m", **kw):
        return ServerLanguageModel(ServerConfig(url, model), lm.tokenizer, **kw).identity

    assert identity() == identity("http://h:1/v1/") and identity().startswith("openai:m@")
    assert len({identity(), identity("http://h:2"), identity(model="n"), identity(model_root="/w"),
                identity(fingerprint="fp")}) == 5
    oracle = LLMOracle(ServerLanguageModel(ServerConfig("http://h:1", "m"), lm.tokenizer))
    # in-process: the model's own identity, its name and (loaded from files) their digest
    assert oracle.model_identity == identity() and LLMOracle(lm).model_identity == lm.identity
    assert lm.identity.startswith(lm.name)


# --------------------------------------------------------------------------- how echoed tokens are verified


def test_a_server_echoing_no_tokens_gets_one_prompt_per_request(lm, truth):
    with FakeOpenAI(lm, modes=["no_tokens"]) as srv:
        remote, caps = _connect(srv, lm)
        assert caps.logprobs and caps.echo_tokens == "none" and "one prompt per request" in caps.notes["echo_tokens"]
        before = srv.completions_made()
        np.testing.assert_allclose(remote.label_logprobs(PROMPTS, LABELS), truth, atol=2e-4)
        sent = [body["prompt"] for path, body in srv.log[-9:]]
        assert srv.completions_made() - before == 9 and all(isinstance(p[0], int) for p in sent)
        srv.modes.add("swap_choices")  # harmless now: no request holds two prompts
        np.testing.assert_allclose(remote.label_logprobs(PROMPTS, LABELS), truth, atol=2e-4)


def test_text_tokens_are_compared_with_the_local_rendering(lm, truth):
    with FakeOpenAI(lm, modes=["text_tokens"]) as srv:
        remote, caps = _connect(srv, lm, max_concurrency=1)
        assert caps.echo_tokens == "text"
        np.testing.assert_allclose(remote.label_logprobs(PROMPTS, LABELS), truth, atol=2e-4)
        srv.faults = ["lying_index"]
        with pytest.raises(ServerError, match=r"label log-probs of prompt 0, label ' negative': .* echoed '.+' at "
                                              r"position \d+ where token \d+ \('.+'\) was sent"):
            remote.label_logprobs(PROMPTS[:1], LABELS)
        gens = remote.generate(PROMPTS, max_new_tokens=2)  # the greedy checks decode: text tokens name no top-1 id
        clean = [(p, g.text) for p, g in zip(PROMPTS, gens)
                 if lm.tokenizer.encode_continuation(g.text) == list(g.token_ids)]
        assert clean, "no greedy continuation round-trips through text"
        prompts, continuations = zip(*clean)
        before = len(srv.log)
        assert remote.greedy_continues_with(prompts, continuations).all()
        assert not remote.greedy_continues_with(prompts, ["zq" + c for c in continuations]).any()
        assert all(body["max_tokens"] > 0 and "echo" not in body for _, body in srv.log[before:])

        class OtherRendering:  # a tokenizer whose pieces render otherwise than the server's
            def __init__(self, tok):
                self._tok = tok

            def decode(self, ids, skip_special_tokens=True):
                return self._tok.decode(ids, skip_special_tokens).upper() + "~"

            def __getattr__(self, name):
                return getattr(self._tok, name)

        caps = probe(_config(srv), OtherRendering(lm.tokenizer))
        assert caps.logprobs and caps.echo_tokens == "none" and "differ from this tokenizer" in caps.notes[
            "echo_tokens"]


# --------------------------------------------------------------------------- deadlines and sizes


def test_a_trickling_body_is_abandoned_at_the_deadline(lm):
    """1 byte every 0.3 s: each read is well within timeout_s = 0.6, so only a deadline on the whole attempt
    stops it (the listing's ~90 bytes would take ~27 s per attempt)."""
    with FakeOpenAI(lm, modes=["trickle"], trickle_s=0.3) as srv:
        conn = http.client.HTTPConnection("127.0.0.1", int(srv.base_url.rsplit(":", 1)[1]), timeout=0.6)
        conn.request("GET", "/v1/models")
        assert conn.getresponse().read(3) == b'{"o'  # power: a per-read timeout of 0.6 s never fires
        conn.close()
        client = OpenAIClient(_config(srv, timeout_s=0.6, max_retries=1, backoff_s=0.05))
        start = time.monotonic()
        with pytest.raises(ServerError, match=r"model listing: http://127.0.0.1:\d+/v1/models failed after 2 "
                                              r"attempts; last: no complete answer within model.server.timeout_s = "
                                              r"0.6 s \(connect, headers and body\)"):
            client.request("/models", what="model listing")
        elapsed = time.monotonic() - start
        assert 2 * 0.6 - 0.05 < elapsed < 2 * 0.6 + 0.05 + 0.5, elapsed
        assert client.attempts == 2


def test_an_attempt_ending_late_still_gets_its_retries_under_the_default_budget():
    """Each attempt overruns its 0.3 s deadline by 0.2 s (a loaded machine notices a deadline late): the default
    budget leaves each attempt a second to end, so all ``max_retries`` retries are made. Power: with
    ``request_budget_s`` at the attempts' deadlines and delays alone, the same overrun denies the last retry."""
    def late(method, path, data, deadline):
        time.sleep(max(0.0, deadline - time.monotonic()) + 0.2)
        raise TimeoutError("timed out")

    cfg = ServerConfig("http://127.0.0.1:9", "m", timeout_s=0.3, max_retries=2, backoff_s=0.01, max_backoff_s=0.01)
    client = OpenAIClient(cfg)
    client._attempt = late
    with pytest.raises(ServerError, match="failed after 3 attempts; last: no complete answer within"):
        client.request("/models", what="model listing")
    tight = OpenAIClient(dataclasses.replace(cfg, request_budget_s=3 * 0.3 + 2 * 0.01))
    tight._attempt = late
    with pytest.raises(ServerError, match="failed after 2 attempts; another could not finish within"):
        tight.request("/models", what="model listing")


def test_slow_headers_are_abandoned_at_the_deadline(lm):
    with FakeOpenAI(lm, modes=["slow_headers"], trickle_s=0.2) as srv:
        client = OpenAIClient(_config(srv, timeout_s=0.5, max_retries=0))
        start = time.monotonic()
        with pytest.raises(ServerError, match="failed after 1 attempt; last: no complete answer within"):
            client.request("/models", what="model listing")
        assert time.monotonic() - start < 0.5 + 0.4


def test_retries_stop_at_the_request_budget(lm):
    cfg = ServerConfig("http://h:1", "m", timeout_s=60, max_retries=5, backoff_s=0.5, max_backoff_s=30)
    assert cfg.budget_s == 6 * (60 + 1) + (0.5 + 1 + 2 + 4 + 8)  # every attempt at its deadline and 1 s to end it,
    # the largest delays
    assert ServerConfig("http://h:1", "m", timeout_s=3600, max_retries=100).budget_s == 86400
    with FakeOpenAI(lm, modes=["trickle"], trickle_s=0.3) as srv:
        client = OpenAIClient(_config(srv, timeout_s=0.4, max_retries=100, request_budget_s=1.0))
        start = time.monotonic()
        with pytest.raises(ServerError, match=r"failed after 2 attempts; another could not finish within the "
                                              r"request's budget of 1 s \(model.server.request_budget_s\); last: no "
                                              "complete answer"):
            client.request("/models", what="model listing")
        assert time.monotonic() - start < 1.0 + 0.3 and client.attempts == 2  # not 101 attempts


def test_an_oversized_body_is_refused_without_reading_it(lm, monkeypatch):
    with FakeOpenAI(lm, modes=["oversized"]) as srv:
        client = OpenAIClient(_config(srv, timeout_s=5))
        start = time.monotonic()
        with pytest.raises(ServerError, match=r"model listing: http://127.0.0.1:\d+/v1/models answered a body of "
                                              r"1099511627776 bytes \(its Content-Length\), more than the 67108864 "
                                              r"bytes \(MAX_BODY_BYTES\)"):
            client.request("/models", what="model listing")
        assert time.monotonic() - start < 1.0 and client.attempts == 1  # not retried: it would come again
    with FakeOpenAI(lm, modes=["unsized"]) as srv:  # no Content-Length: counted as it is read
        client = OpenAIClient(_config(srv))
        assert client.request("/models", what="model listing")["data"][0]["id"] == "tiny"  # power: read whole
        monkeypatch.setattr(client_module, "MAX_BODY_BYTES", 40)
        with pytest.raises(ServerError, match=r"answered a body of \d+ bytes \(counted as read, without a "
                                              r"Content-Length\), more than the 40 bytes"):
            client.request("/models", what="model listing")


def test_a_local_model_rewritten_at_the_same_path_gets_another_cache_identity(tmp_path):
    """The answer cache keys a local model by its path and its files' names, sizes and times: new weights written
    to the same folder (a new fine-tuning export) never reuse the old model's answers."""
    import os

    from snapaudit_jax.models import load_language_model, local_identity
    from tests.helpers.tiny_llm import make_tiny_llm_folder

    folder = make_tiny_llm_folder(str(tmp_path / "m"), ["a few words of text", "more words"], vocab_size=300)
    lm = load_language_model(folder)
    first = LLMOracle(lm).model_identity
    assert first == lm.identity == local_identity(folder, folder) and first.startswith(f"{folder} files:")
    assert local_identity(folder, folder) == first  # stable while nothing changes
    weights = os.path.join(folder, "model.safetensors")
    st = os.stat(weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert LLMOracle(load_language_model(folder)).model_identity != first
