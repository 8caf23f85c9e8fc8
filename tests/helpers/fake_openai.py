"""A loopback OpenAI-compatible server in vLLM's completions format, backed by one of our Flax models.

``/v1/models`` lists one model (with vLLM's ``max_model_len`` and ``root``); ``/v1/completions`` takes token-id
prompts (one list or a list of lists) and answers

* ``echo`` + ``max_tokens = 0`` + ``logprobs = k``: for every prompt token ``t >= 1`` its log-probability given
  the tokens before it, the top-1 token's, keys ``token_id:N`` (vLLM's ``return_tokens_as_token_ids``);
  the first token's entries are ``null``, as vLLM's are;
* otherwise greedy (``temperature = 0``) or seeded sampled generation with the model, ``text`` and
  ``token_ids``.

Every answer names ``model_id`` and, when ``fingerprint`` is set, reports it as ``system_fingerprint``.

The log-probabilities come from one full forward pass (right-padded, jitted) and a float32 log-softmax over the
whole vocabulary, a different code path from the client-side kernels they are compared with.

Faults for the transport tests: ``server.faults`` is a list consumed one per request, each ``None`` (answer
normally) or one of ``"500"``, ``"429"`` (with ``Retry-After: 1``), ``"hang"`` (answer after ``hang_s``),
``"truncate"`` (a ``Content-Length`` larger than the body sent, then close), ``"garbage"`` (200 with a body
that is not JSON), ``"reset"`` (close without answering), ``"drop_logprobs"`` (answer without them, as
``transformers serve`` does), or one of the misbehaviours below for that request alone.

Misbehaviours (:data:`MODES`), applied to every request while they are in ``server.modes`` (so that the probe
itself meets them) or to one request as a fault:

* ``"swap_choices"``: the choices of a request of several prompts in reverse order, without ``index``;
* ``"no_index"``: the choices in order, without ``index``;
* ``"lying_index"``: the choices in reverse order, each with the index of its position (a wrong match);
* ``"other_model"``: every answer names the model ``"other-model"``;
* ``"no_model"``: every answer lacks the ``model`` field;
* ``"other_fingerprint"``: every answer reports the ``system_fingerprint`` ``"other-fingerprint"``;
* ``"no_tokens"``: echo answers without ``logprobs.tokens``;
* ``"text_tokens"``: echo answers name the tokens by their text (the tokenizer's rendering of each id);
* ``"trickle"``: the body sent one byte every ``trickle_s`` seconds;
* ``"slow_headers"``: the status line and headers sent one byte every ``trickle_s`` seconds;
* ``"oversized"``: a ``Content-Length`` of 1 TiB, then bytes until the client leaves;
* ``"unsized"``: the body without ``Content-Length``, delimited by closing the connection.

``noise`` > 0 makes the server non-deterministic, as batched GPU servers are at temperature 0: every echo
request adds fresh Gaussian noise of that scale (seeded by ``noise_seed``, drawn in request order) to its
logits (then renormalised), so a recomputed answer can differ from the first one.

:func:`tiny_served_model` builds one tiny model per test process for the tests that need a server but not a
particular model (the fault tests, the bad-input suite's server cases).
"""

from __future__ import annotations

import atexit
import functools
import http.server
import json
import shutil
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from snapaudit_jax.models.layers import positions_from_mask

MODES = frozenset({"swap_choices", "no_index", "lying_index", "other_model", "no_model", "other_fingerprint",
                   "no_tokens", "text_tokens", "trickle", "slow_headers", "oversized", "unsized"})
TINY_TEXTS = ["the quick brown fox jumps over the lazy dog", "positive negative neutral answer label",
              "a b c d e f g h i j k l m n o p"] * 20  # the tokenizer's corpus


@functools.lru_cache(maxsize=1)
def tiny_served_model():
    """``(folder, lm)``: a tiny random Llama folder (under a temporary folder removed at exit) and its model.

    Returns:
      The folder (a tokenizer for ``[model.server] tokenizer``) and the loaded
      :class:`~snapaudit_jax.models.lm.LanguageModel`.
    """
    from snapaudit_jax.models import load_language_model
    from tests.helpers.tiny_llm import make_tiny_llm_folder

    root = tempfile.mkdtemp(prefix="snapaudit-served-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    folder = make_tiny_llm_folder(f"{root}/tiny", TINY_TEXTS)
    return folder, load_language_model(folder, data_parallel=False)


_TABLES: dict[int, tuple] = {}  # id(lm) -> (lm, jitted table): one compilation per model, not per server


def _table_of(lm):
    if id(lm) not in _TABLES:
        graphdef, state = lm.graphdef, lm.state

        @jax.jit
        def table(state, tokens, mask):  # one compilation per length bucket; weights as an argument
            model = nnx.merge(graphdef, state)
            hidden, _ = model(tokens, positions_from_mask(mask), mask)
            return jax.nn.log_softmax(model.logits(hidden).astype(jnp.float32), axis=-1)

        _TABLES[id(lm)] = (lm, functools.partial(table, state))
    return _TABLES[id(lm)][1]


class _Quiet(http.server.ThreadingHTTPServer):
    """Silent when a client leaves before its answer is sent (a deadline passed, a body refused)."""

    def handle_error(self, request, client_address):
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeOpenAI:
    """The server; ``with FakeOpenAI(lm) as srv: srv.base_url``.

    Args:
      lm: a :class:`~snapaudit_jax.models.lm.LanguageModel` (its module answers the requests).
      model_id: the id ``/v1/models`` lists and answers name.
      logprobs: answer echo requests with log-probabilities (``False``: ignore ``logprobs`` and ``echo``).
      hang_s: seconds a ``"hang"`` fault waits before answering.
      require_key: the bearer token every request must carry (401 otherwise), or ``None``.
      token_prompts: take token-id prompts; ``False``: refuse them with 400 "prompt must be a string" and
        tokenise text prompts with the model's tokenizer (as ``transformers serve`` does).
      noise: scale of the Gaussian noise added to every echo request's log-probabilities (0: deterministic).
      noise_seed: seed of that noise.
      modes: misbehaviours applied to every request (:data:`MODES`); ``server.modes`` may change mid-run.
      trickle_s: seconds between two bytes of a ``"trickle"`` or ``"slow_headers"`` answer.
      fingerprint: the ``system_fingerprint`` of every answer (``None``: the field is absent).
      root: the model card's ``root`` (``None``: absent).
      port: the port to listen on (0: a free one).
    """

    def __init__(self, lm, model_id: str = "tiny", *, logprobs: bool = True, hang_s: float = 3.0,
                 require_key: str | None = None, token_prompts: bool = True, noise: float = 0.0,
                 noise_seed: int = 0, modes=(), trickle_s: float = 0.3, fingerprint: str | None = None,
                 root: str | None = None, port: int = 0):
        unknown = set(modes) - MODES
        if unknown:
            raise ValueError(f"unknown modes {sorted(unknown)}; known: {sorted(MODES)}")
        self.lm = lm
        self.model_id = model_id
        self.logprobs = logprobs
        self.hang_s = hang_s
        self.require_key = require_key
        self.token_prompts = token_prompts
        self.noise = noise
        self.modes = set(modes)
        self.trickle_s = trickle_s
        self.fingerprint = fingerprint
        self.root = root
        self.port = port
        self._noise_rng = np.random.default_rng(noise_seed)
        self.faults: list[str | None] = []
        self.log: list[tuple[str, dict | None]] = []  # (path, body) of every request that reached a handler
        self.answered = 0
        self._lock = threading.Lock()
        self._table = _table_of(lm)
        self._httpd = None

    # --- model -----------------------------------------------------------------
    def _logprob_table(self, seq: list[int]) -> np.ndarray:
        """``(len(seq), vocab)`` next-token log-probabilities: right-padded to a multiple of 32 (causal attention:
        the padding changes no real position)."""
        length = -(-len(seq) // 32) * 32
        tokens = np.zeros((1, length), np.int32)
        tokens[0, :len(seq)] = seq
        mask = np.zeros((1, length), bool)
        mask[0, :len(seq)] = True
        table = np.asarray(self._table(jnp.asarray(tokens), jnp.asarray(mask)))[0, :len(seq)]
        if self.noise:
            with self._lock:
                noisy = table + self._noise_rng.normal(scale=self.noise, size=table.shape)
            top = noisy.max(axis=-1, keepdims=True)  # renormalised: still log-probabilities
            table = noisy - top - np.log(np.exp(noisy - top).sum(axis=-1, keepdims=True))
        return table

    def _echo(self, seq: list[int]) -> dict:
        table = self._logprob_table(seq)
        values, top = [None], [None]
        for t in range(1, len(seq)):
            row = table[t - 1]
            best = int(np.argmax(row))
            values.append(float(row[seq[t]]))
            top.append({f"token_id:{seq[t]}": float(row[seq[t]]), f"token_id:{best}": float(row[best])})
        return {"text": "", "index": 0, "finish_reason": "length",
                "logprobs": {"tokens": [f"token_id:{t}" for t in seq], "token_logprobs": values,
                             "top_logprobs": top, "text_offset": [0] * len(seq)}}

    def _generate(self, seq: list[int], body: dict) -> dict:
        temperature = float(body.get("temperature", 1.0))
        kw = {}
        if temperature > 0:
            kw = {"temperature": temperature, "key": jax.random.key(int(body.get("seed", 0)))}
        gen = self.lm.generate([seq], max_new_tokens=int(body.get("max_tokens", 16)), batch_size=1, **kw)[0]
        return {"text": gen.text, "index": 0, "token_ids": list(gen.token_ids), "logprobs": None,
                "finish_reason": "stop" if gen.token_ids and gen.token_ids[-1] in self.lm.tokenizer.eos_ids
                else "length"}

    def completions(self, body: dict, faults=frozenset()) -> dict | None:
        """The answer to one ``/v1/completions`` body (``None``: a prompt this server refuses), with the
        misbehaviours in ``faults`` applied."""
        prompt = body["prompt"]
        if not self.token_prompts:
            if not isinstance(prompt, str):
                return None
            prompt = self.lm.tokenizer.encode(prompt)
        seqs = prompt if prompt and isinstance(prompt[0], list) else [prompt]
        echo = self.logprobs and body.get("echo") and body.get("logprobs") is not None
        choices = []
        for i, seq in enumerate(seqs):
            if echo and int(body.get("max_tokens", 16)) == 0:
                choice = self._echo(seq)
                if "no_tokens" in faults:
                    del choice["logprobs"]["tokens"]
                elif "text_tokens" in faults:
                    choice["logprobs"]["tokens"] = [self.lm.tokenizer.decode([t], skip_special_tokens=False)
                                                    for t in seq]
            elif int(body.get("max_tokens", 16)) == 0:  # echo and logprobs ignored: nothing to say
                choice = {"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}
            else:
                choice = self._generate(seq, body)
            choice["index"] = i
            choices.append(choice)
        if len(choices) > 1 and faults & {"swap_choices", "lying_index"}:
            choices.reverse()
        if len(choices) > 1:
            for position, c in enumerate(choices):
                if faults & {"swap_choices", "no_index"}:
                    del c["index"]
                elif "lying_index" in faults:
                    c["index"] = position
        answer = {"id": "cmpl-test", "object": "text_completion", "model": self.model_id, "choices": choices}
        if "other_model" in faults:
            answer["model"] = "other-model"
        if "no_model" in faults:
            del answer["model"]
        if self.fingerprint is not None:
            answer["system_fingerprint"] = self.fingerprint
        if "other_fingerprint" in faults:
            answer["system_fingerprint"] = "other-fingerprint"
        return answer

    # --- HTTP ------------------------------------------------------------------
    def _handler(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, payload, headers=None):
                raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            def _dribble(self, data: bytes):
                for i in range(len(data)):
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(server.trickle_s)

            def _send_faulty(self, raw: bytes, faults) -> bool:
                """Sends ``raw`` as a faulty 200 answer; ``False`` when ``faults`` holds no transport fault."""
                self.close_connection = True
                try:
                    if "slow_headers" in faults:
                        self._dribble(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                      f"{len(raw)}\r\n\r\n".encode())
                        self.wfile.write(raw)
                    elif "trickle" in faults:
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(raw)))
                        self.end_headers()
                        self.wfile.flush()
                        self._dribble(raw)
                    elif "oversized" in faults:
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(2 ** 40))
                        self.end_headers()
                        for _ in range(4096):  # 256 MiB at most, until the client leaves
                            self.wfile.write(b" " * 65536)
                    elif "unsized" in faults:
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Connection", "close")
                        self.end_headers()
                        self.wfile.write(raw)
                    else:
                        self.close_connection = False
                        return False
                    self.wfile.flush()
                except OSError:  # the client left (its deadline, or a body it refused)
                    pass
                return True

            def _handle(self, body):
                with server._lock:
                    server.log.append((self.path, body))
                    fault = server.faults.pop(0) if server.faults else None
                    faults = set(server.modes) | ({fault} if fault in MODES else set())
                if server.require_key is not None and \
                        self.headers.get("Authorization") != f"Bearer {server.require_key}":
                    # as several servers do, the refusal quotes the key it was given
                    given = self.headers.get("Authorization", "").removeprefix("Bearer ")
                    return self._send(401, {"error": {"message": f"invalid api key {given}"}})
                if fault == "500":
                    return self._send(500, {"error": {"message": "internal error (injected)"}})
                if fault == "429":
                    return self._send(429, {"error": {"message": "rate limited (injected)"}}, {"Retry-After": "1"})
                if fault == "reset":
                    self.close_connection = True
                    return None
                if fault == "hang":
                    time.sleep(server.hang_s)
                if self.path == "/v1/models":
                    card = {"id": server.model_id, "object": "model", "max_model_len": 4096}
                    if server.root is not None:
                        card["root"] = server.root
                    answer = {"object": "list", "data": [card]}
                elif self.path == "/v1/completions" and body is not None:
                    answer = server.completions(body, frozenset(faults))
                    if answer is None:
                        return self._send(400, {"detail": "prompt must be a string."})
                    if fault == "drop_logprobs":
                        for c in answer["choices"]:
                            c["logprobs"] = None
                else:
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                raw = json.dumps(answer).encode()
                if fault == "garbage":
                    return self._send(200, b"<html>proxy error</html>")
                if fault == "truncate":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw[: len(raw) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return None
                if self._send_faulty(raw, faults):
                    return None
                with server._lock:
                    server.answered += 1
                return self._send(200, raw)

            def do_GET(self):  # noqa: N802
                self._handle(None)

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length", 0))
                self._handle(json.loads(self.rfile.read(n)))

        return Handler

    def __enter__(self):
        self._httpd = _Quiet(("127.0.0.1", self.port), self._handler())
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def completions_made(self) -> int:
        """Requests that reached ``/v1/completions`` (faulted ones included)."""
        return sum(1 for path, _ in self.log if path == "/v1/completions")
