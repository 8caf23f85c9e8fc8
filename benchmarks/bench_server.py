"""Phase A model calls per second: through an OpenAI-compatible server vs our in-process Flax backend.

Both answer the same Phase A calls on the same machine: ``--calls`` distinct chat prompts of PV's copy
mode (AG News demo exemplars, the copy instruction), each continued greedily for ``--new-tokens``
tokens -- what the copy check by decoding asks a server without log-probs. The server side is
``transformers serve`` of the embedded SmolLM2, written as a float32 Hugging Face folder from the same
GGUF our Flax backend loads, reached through :class:`~snapaudit_jax.models.server.ServerLanguageModel`
at each ``--concurrency``; the in-process side is :class:`~snapaudit_jax.models.lm.LanguageModel`
in batches of ``--batch``. Each side is warmed up first (compilation, model load); the greedy texts of
every side are compared with the Flax ones.

```
python benchmarks/bench_server.py [--calls 32] [--new-tokens 8] [--concurrency 1 4 16] [--batch 8]
    [--folder HF_FOLDER] [--json] [--out FILE.json]
```

Output (JSON): ``calls_per_s`` per backend (``flax``, ``server_c1``, ``server_c4``, ...), the ratio of each
server setting to Flax, the texts' agreement, the server's capabilities, and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

from _common import int_at_least
from snapaudit_jax.dpicl.data import get_spec, load_examples
from snapaudit_jax.dpicl.pipelines import prompts as P
from snapaudit_jax.models import load_language_model, load_tokenizer
from snapaudit_jax.models.server import ServerConfig, connect
from snapaudit_jax.models.serving import TransformersServe, write_hf_folder
from snapaudit_jax.utils.io import write_json


def build_prompts(lm, n: int) -> list[str]:
    """``n`` distinct copy-mode chat prompts from the AG News demo exemplars."""
    spec = get_spec("agnews")
    examples = load_examples("agnews")
    out = []
    for i in range(n):  # two exemplars in context, the copy instruction, the start of a third text to continue
        shots = [examples[(i + j) % len(examples)] for j in range(2)]
        block = P.context_block([P.format_exemplar(e.text, spec.label_names[e.label]) for e in shots])
        start = examples[(i + 2) % len(examples)].text.split()
        out.append(lm.chat_prompt(block + "\n\n" + P.COPY_INSTRUCTION) + " ".join(start[: 3 + i % 5]))
    if len(set(out)) != n:
        raise SystemExit(f"--calls {n}: the demo data gives fewer distinct prompts")
    return out


def timed_calls(fn, prompts, repeats: int) -> tuple[list[str], list[float]]:
    """The texts of ``fn(prompts)`` and the wall seconds of ``repeats`` calls (after one warm-up call)."""
    texts = fn(prompts)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(prompts)
        seconds.append(time.perf_counter() - start)
    return texts, seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int_at_least(1), default=32, help="distinct prompts (Phase A calls)")
    parser.add_argument("--new-tokens", type=int_at_least(1), default=8)
    parser.add_argument("--concurrency", type=int_at_least(1), nargs="+", default=[1, 4, 16])
    parser.add_argument("--batch", type=int_at_least(1), default=8, help="prompts per Flax batch")
    parser.add_argument("--repeats", type=int_at_least(1), default=2, help="timed passes per backend")
    parser.add_argument("--folder", help="a Hugging Face folder of SmolLM2 to serve (default: written from the GGUF)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", help="also write the JSON object to this file (atomically)")
    args = parser.parse_args(argv)

    flax = load_language_model("smollm2")
    prompts = build_prompts(flax, args.calls)
    result = {"benchmark": "server", "calls": args.calls, "new_tokens": args.new_tokens, "repeats": args.repeats,
              "machine": {"cpu_count": os.cpu_count(), "processor": platform.processor(),
                          "python": platform.python_version(), "loadavg_at_start": list(os.getloadavg())}}

    def run_flax(ps):
        return [g.text for g in flax.generate(ps, max_new_tokens=args.new_tokens, batch_size=args.batch)]

    reference, seconds = timed_calls(run_flax, prompts, args.repeats)
    rates = {"flax": args.calls / float(np.median(seconds))}
    agreement = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or write_hf_folder(os.path.join(tmp, "smollm2"))
        with TransformersServe(folder, log_path=os.path.join(tmp, "serve.log")) as srv:
            tokenizer = load_tokenizer("smollm2")
            for c in args.concurrency:
                remote, caps = connect(ServerConfig(srv.base_url, srv.model_id, max_concurrency=c), tokenizer)

                def run_server(ps, remote=remote):
                    return [g.text for g in remote.generate(ps, max_new_tokens=args.new_tokens)]

                texts, seconds = timed_calls(run_server, prompts, args.repeats)
                rates[f"server_c{c}"] = args.calls / float(np.median(seconds))
                agreement[f"server_c{c}"] = sum(a == b for a, b in zip(texts, reference)) / len(prompts)
            result["server"] = {"engine": "transformers serve (PyTorch, float32, CPU)", "token_prompts":
                                caps.token_prompts, "logprobs": caps.logprobs}
    result["calls_per_s"] = {k: round(v, 3) for k, v in rates.items()}
    result["ratio_vs_flax"] = {k: round(v / rates["flax"], 3) for k, v in rates.items() if k != "flax"}
    result["texts_equal_to_flax"] = agreement
    text = json.dumps(result, indent=None if args.json else 2)
    print(text)
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
