"""Bad-input cases: model-server configurations and misbehaving servers (see :mod:`tests.helpers.bad_input`).

The configuration cases are refused while the file is read. The server cases start the fault-injecting loopback
server (:class:`tests.helpers.fake_openai.FakeOpenAI`, serving the tiny model of
:func:`tests.helpers.fake_openai.tiny_served_model`, built once per process outside the case's folder) with one
persistent misbehaviour, which the probe meets before the run folder exists.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from tests.helpers.bad_input.common import CPA_OK, Case, _config_cmd

_URL = "http://127.0.0.1:9"  # never reached: these configurations are refused while they are read


def _audit_server(extra: str, url: str = _URL, tokenizer: str = "smollm2") -> str:
    return (f'[model]\nllm = "openai"\n[model.server]\nbase_url = "{url}"\nmodel = "tiny"\n'
            f'tokenizer = "{tokenizer}"\n{extra}[pipelines.pv]\n')


def _cpa_server(extra: str) -> str:
    return (CPA_OK + '\n[attackers.c]\nkind = "clues"\nmodel = "openai"\n'
            f'\n[server]\nbase_url = "{_URL}"\nmodel = "tiny"\ntokenizer = "smollm2"\n{extra}')


def _faulty(command: str, mode: str, extra: str = "max_retries = 0\n"):
    """A case building a loopback server with the persistent fault ``mode`` and a configuration that uses it."""

    def build(tmp: Path, stack: contextlib.ExitStack) -> list[str]:
        from tests.helpers.fake_openai import FakeOpenAI, tiny_served_model

        folder, lm = tiny_served_model()
        srv = stack.enter_context(FakeOpenAI(lm, modes=[mode], trickle_s=0.2))
        if command == "audit":
            toml = _audit_server(extra, srv.base_url, folder)
        else:
            toml = (_cpa_server(extra).replace(_URL, srv.base_url).replace('tokenizer = "smollm2"',
                                                                            f'tokenizer = "{folder}"'))
        return _config_cmd(command, toml)(tmp)

    return build


CASES: list[Case] = [
    # --- ranges of the transport settings, refused as the configuration is read
    Case("audit-server-timeout-infinite", _config_cmd("audit", _audit_server("timeout_s = inf\n")),
         ("model.server.timeout_s", "must be a finite number of seconds <= 3600", "got inf")),
    Case("audit-server-timeout-zero", _config_cmd("audit", _audit_server("timeout_s = 0\n")),
         ("model.server.timeout_s", "must be a number > 0", "got 0")),
    Case("audit-server-timeout-nan", _config_cmd("audit", _audit_server("timeout_s = nan\n")),
         ("model.server.timeout_s", "must be a number > 0", "got nan")),
    Case("audit-server-retries-float", _config_cmd("audit", _audit_server("max_retries = 1e9\n")),
         ("model.server.max_retries", "must be an integer in [0, 100]", "got 1000000000.0")),
    Case("audit-server-retries-huge", _config_cmd("audit", _audit_server("max_retries = 1000000000\n")),
         ("model.server.max_retries", "must be an integer <= 100", "got 1000000000")),
    Case("audit-server-concurrency-huge", _config_cmd("audit", _audit_server("max_concurrency = 100000\n")),
         ("model.server.max_concurrency", "must be an integer <= 256", "got 100000")),
    Case("audit-server-budget-below-timeout",
         _config_cmd("audit", _audit_server("timeout_s = 10\nrequest_budget_s = 5\n")),
         ("model.server.request_budget_s", "must be >= model.server.timeout_s = 10", "got 5")),
    Case("cpa-server-timeout-infinite", _config_cmd("cpa", _cpa_server("timeout_s = inf\n")),
         ("server.timeout_s", "must be a finite number of seconds <= 3600", "got inf"), absent=("model.server",)),
    Case("cpa-server-retries-float", _config_cmd("cpa", _cpa_server("max_retries = 1e9\n")),
         ("server.max_retries", "must be an integer in [0, 100]", "got 1000000000.0"), absent=("model.server",)),
    # --- credentials in a base_url: refused, and never printed (the URL is shown with them masked)
    *[Case(f"audit-server-url-credential-{name}", _config_cmd("audit", _audit_server("", url)),
           ("model.server.base_url", *shown), absent=("s3cr3tv4lue",))
      for name, url, shown in (
          ("api-key-query", "https://h.example/v1?api_key=s3cr3tv4lue", ("no query or fragment", "api_key=***")),
          ("token-query-bad-port", "https://h.example:99999/?token=s3cr3tv4lue", ("port in [0, 65535]",
                                                                                  "token=***")),
          ("key-query-bad-scheme", "ftp://h.example/?key=s3cr3tv4lue", ("http:// or https://", "key=***")),
          ("user-info", "https://me:s3cr3tv4lue@h.example/v1", ("must not embed credentials",)),
          ("fragment", "https://h.example/v1#s3cr3tv4lue", ("no query or fragment", "#***")),
      )],
    # --- misbehaving servers, refused by the probe before the run folder exists
    Case("audit-server-swapped-choices", _faulty("audit", "swap_choices"),
         ("probe log-probs (two prompts)", "http://127.0.0.1:", "answered 2 choices without an integer 'index'",
          "cannot be matched to the 2 prompts sent"), with_stack=True),
    Case("audit-server-missing-index", _faulty("audit", "no_index"),
         ("probe log-probs (two prompts)", "without an integer 'index' on each (got [None, None])"), with_stack=True),
    Case("audit-server-lying-index", _faulty("audit", "lying_index"),
         ("probe log-probs (two prompts), prompt 0", "echoed token", "at position 0 where"), with_stack=True),
    Case("audit-server-other-model", _faulty("audit", "other_model"),
         ("probe completion", "answered as model 'other-model'", "model.server.model is 'tiny'"), with_stack=True),
    Case("audit-server-no-model-field", _faulty("audit", "no_model"),
         ("probe completion", "without a 'model' field", "model.server.model = 'tiny'"), with_stack=True),
    Case("audit-server-trickling-body", _faulty("audit", "trickle", "timeout_s = 0.5\nmax_retries = 0\n"),
         ("model listing (/v1/models)", "failed after 1 attempt",
          "no complete answer within model.server.timeout_s = 0.5 s"), with_stack=True),
    Case("audit-server-oversized-body", _faulty("audit", "oversized"),
         ("model listing (/v1/models)", "answered a body of 1099511627776 bytes (its Content-Length)",
          "MAX_BODY_BYTES", "refused without reading it"), with_stack=True),
    Case("cpa-server-other-model", _faulty("cpa", "other_model"),
         ("probe completion", "answered as model 'other-model'", "server.model is 'tiny'"), with_stack=True),
    Case("cpa-server-swapped-choices", _faulty("cpa", "swap_choices"),
         ("probe log-probs (two prompts)", "without an integer 'index'"), with_stack=True),
]
