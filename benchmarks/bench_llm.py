"""LLM inference throughput against transformers, and the model-call cost of active vs passive audits.

Usage::

    python benchmarks/bench_llm.py [--json] [--out FILE.json] [--batch B] [--prompt-tokens L] \
        [--repeats R] [--part {inference,audit,all}] [--target EPS] [--max-passive-runs N]

What is measured
----------------
``inference``: the embedded SmolLM2-135M-Instruct GGUF
(:func:`snapaudit_jax.models.load_language_model`, float32) against
transformers' PyTorch model loaded from the same file (dequantised to float32
too), in the same process, on the same token ids, after a warm-up of both.
The prompts are ``B`` real label-scoring prompts in the model's chat template:
AG News demo exemplars (``load_examples("agnews")``) followed by a Yes/No
question, as many exemplars as fit in ``L`` tokens, so prompt lengths differ
and the batch is left-padded (ours: by the engine, to its length bucket;
torch: ``tokenizer.pad(padding_side="left")`` with an attention mask).

* ``prefill``: ours is ``LanguageModel.label_logprobs(prompts, ["Yes", "No"])``
  (single-token labels: one forward pass and the last position's logits);
  torch is ``model(input_ids, attention_mask, position_ids).logits[:, -1]``,
  log-softmax and the two label ids, in ``torch.inference_mode()``, once with
  every position's logits (``torch_full_logits``, the plain call) and once
  with ``logits_to_keep=1`` (``torch_last_logits``, the same work as ours).
  ``position_ids`` are ``cumsum(mask) - 1`` as in transformers' ``generate``.
  Rates count real (unpadded) prompt tokens only; ``ratio`` is ours over the
  *faster* torch variant. ``max_abs_logprob_diff`` compares the label
  log-probs of ours and torch; beyond ``1e-3`` the script exits with status 1
  and writes no ``--out`` file.
* ``generate``: greedy decoding of 4 prompts (a request for a news article
  after the exemplars), 32 new tokens: ``LanguageModel.generate`` vs
  ``model.generate(do_sample=False, max_new_tokens=32)``. New tokens are
  counted per row up to and including the first end-of-sequence token.
  ``generate_tokens_match`` says whether the first prompt's tokens are
  identical (``generate_rows_match`` counts all rows).

Timed calls alternate between the two implementations, ``R`` times each; rates
use the median time. PyTorch uses ``torch.set_num_threads(os.cpu_count())``;
JAX exposes one host device per core like the CLI (``jax_devices``), but the
language model runs on the default device.

``audit``: the cost of an active and a passive audit reaching the same
epsilon lower bound, on the real pipeline: Private Voting in ``copy`` mode on
SmolLM2 (AG News demo, 6 exemplars, ``T = 3`` partitions), ``eps_theory = 8``,
``delta = 1e-5``, black-box, 95% confidence.

* active (:func:`snapaudit_jax.dpicl.pipelines.phase_a.generate_snapshots` with its
  default 4-answer determinism check, then :func:`snapaudit_jax.audits.active.audit`
  with ``clean="fixed"`` and 200,000 simulated trials per hypothesis), for
  ``n_llm`` = 2, 4, 8, ... snapshots per context;
* passive (``n`` end-to-end runs per context: fresh partition assignments,
  one private release each, :func:`snapaudit_jax.audits.passive.passive_bounds`
  with the assumption-free standard estimator, like the active audit), for ``n`` = 50, 100, 200, ... (at most
  ``--max-passive-runs``).

The target is ``--target`` or, by default, 0.8 times the active bound at
``n_llm = 100`` (the quickstart's snapshot count). Every rung is a complete
audit from an empty answer cache, timed on its own after a warm-up that
compiles every shape; ``llm_calls`` are the logical calls a deployed pipeline
pays (``2 x runs x T``), ``unique_computations`` the prompts actually run
through the model (greedy decoding is deterministic, so a repeated prompt is
answered from the cache), ``model_seconds`` the time inside the model,
``prompt_seconds`` the time rendering chat templates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# The audit simulator shards over host devices; XLA reads this when its backend starts.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={os.cpu_count() or 1}"
    ).strip()
# transformers' GGUF loader draws a tqdm bar on stderr; tqdm reads this when first imported.
os.environ.setdefault("TQDM_DISABLE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from _common import CompileCounter, alternate, int_at_least, timed  # noqa: E402
from snapaudit_jax.utils.io import write_json  # noqa: E402
from snapaudit_jax.audits.active import audit  # noqa: E402
from snapaudit_jax.dpicl.data import get_spec, load_examples  # noqa: E402
from snapaudit_jax.mechanisms import Attack  # noqa: E402
from snapaudit_jax.models import default_model_path, load_language_model  # noqa: E402
from snapaudit_jax.models.lm import length_bucket  # noqa: E402
from snapaudit_jax.audits.passive import passive_bounds  # noqa: E402
from snapaudit_jax.dpicl.pipelines import LLMOracle, PrivateVotingPipeline, make_case  # noqa: E402
from snapaudit_jax.dpicl.pipelines import prompts as P  # noqa: E402
from snapaudit_jax.dpicl.pipelines.phase_a import generate_snapshots  # noqa: E402

LABELS = ("Yes", "No")
LOGPROB_TOL = 1e-3
GEN_BATCH, NEW_TOKENS = 4, 32
MIN_PROMPT_TOKENS, MAX_PROMPT_TOKENS = 96, 4096
GEN_INSTRUCTION = "Write a short news article about the topics of the examples above."

# The audit case: the quickstart's PV pipeline (copy query, 6 exemplars, T = 3), claimed eps = 8.
EPSILON, DELTA, CONFIDENCE = 8.0, 1e-5, 0.95
NUM_EXEMPLARS, PARTITIONS = 6, 3
ACTIVE_TRIALS = 200_000
REFERENCE_SNAPSHOTS, TARGET_FRACTION = 100, 0.8
ACTIVE_LADDER = tuple(2**i for i in range(1, 11))  # 2 .. 1024
PASSIVE_START = 50
RELEASE_CHUNK = 1024





def build_prompts(lm, examples, spec, n: int, max_tokens: int, instruction=None) -> list[str]:
    """``n`` chat prompts of at most ``max_tokens`` tokens: as many exemplars as fit, then a question.

    Prompt ``i`` asks about example ``7 i`` (or gives ``instruction``) and shows the examples after it.
    """
    out = []
    for i in range(n):
        prompt = None
        for q in range(7 * i, 7 * i + len(examples)):  # a question short enough to fit with no exemplar
            question = examples[q % len(examples)].text
            ask = instruction or P.yes_no_instruction("direct", question)
            shown = []
            while len(shown) < len(examples) - 1:
                ex = examples[(q + 1 + len(shown)) % len(examples)]
                candidate = lm.chat_prompt(
                    P.context_block(shown + [P.format_exemplar(ex.text, spec.label_names[ex.label])]) + "\n\n" + ask)
                if len(lm.tokenizer.encode(candidate)) > max_tokens:
                    break
                shown.append(P.format_exemplar(ex.text, spec.label_names[ex.label]))
            prompt = lm.chat_prompt(P.context_block(shown) + "\n\n" + ask)
            if len(lm.tokenizer.encode(prompt)) <= max_tokens:
                break
            prompt = None
        if prompt is None:
            raise ValueError(f"prompt_tokens={max_tokens} is too small for any question of the demo data")
        out.append(prompt)
    return out


def load_torch_model():
    """transformers' float32 model and tokenizer from the embedded SmolLM2 GGUF file."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    path = default_model_path("smollm2")
    folder, name = os.path.dirname(path), os.path.basename(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return model, tok


def torch_batch(tok, rows):
    """Left-padded ``(input_ids, attention_mask, position_ids)`` tensors."""
    enc = tok.pad({"input_ids": rows}, padding_side="left", return_tensors="pt")
    mask = enc["attention_mask"]
    return enc["input_ids"], mask, (mask.cumsum(-1) - 1).clamp(min=0)


def torch_label_logprobs(model, tok, rows, label_ids, *, last_only: bool) -> np.ndarray:
    import torch

    ids, mask, pos = torch_batch(tok, rows)
    with torch.inference_mode():
        kwargs = {"logits_to_keep": 1} if last_only else {}
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, **kwargs).logits[:, -1]
        return torch.log_softmax(logits, dim=-1)[:, label_ids].numpy().astype(np.float64)


def torch_generate(model, tok, rows, eos_ids) -> list[list[int]]:
    import torch

    ids, mask, _ = torch_batch(tok, rows)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS,
                             pad_token_id=int(tok.pad_token_id if tok.pad_token_id is not None else eos_ids[0]),
                             eos_token_id=list(eos_ids), temperature=None, top_p=None, top_k=None)
    return [until_eos(row, eos_ids) for row in out[:, ids.shape[1]:].tolist()]


def until_eos(tokens, eos_ids) -> list[int]:
    """Tokens up to and including the first end-of-sequence token."""
    out = []
    for t in tokens:
        out.append(int(t))
        if int(t) in eos_ids:
            break
    return out


def rate(count: float, seconds: list[float]) -> float:
    return round(count / statistics.median(seconds), 2)


def inference(lm, batch: int, prompt_tokens: int, repeats: int) -> dict:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    spec = get_spec("agnews")
    examples = load_examples("agnews")
    (model, tok), torch_load_s = timed(load_torch_model)

    prompts = build_prompts(lm, examples, spec, batch, prompt_tokens)
    rows = lm.tokenizer.encode_batch(prompts)
    hf_rows = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    label_ids = [lm.tokenizer.encode_continuation(lab)[0] for lab in LABELS]
    hf_label_ids = [tok(lab, add_special_tokens=False)["input_ids"] for lab in LABELS]
    real_tokens = sum(map(len, rows))

    fns = {
        "ours": lambda: lm.label_logprobs(rows, list(LABELS), batch_size=batch),
        "torch_full_logits": lambda: torch_label_logprobs(model, tok, rows, label_ids, last_only=False),
        "torch_last_logits": lambda: torch_label_logprobs(model, tok, rows, label_ids, last_only=True),
    }
    outs, seconds, cpu, _, compiles = alternate(fns, repeats)
    diff = max(float(np.max(np.abs(outs["ours"] - outs[k]))) for k in fns if k != "ours")

    prefill = {name: {"prefill_tokens_per_s": rate(real_tokens, s), "label_scoring_prompts_per_s": rate(batch, s),
                      "seconds_median": round(statistics.median(s), 4), "seconds": [round(x, 4) for x in s],
                      "cpu_utilisation": cpu[name]}
               for name, s in seconds.items()}
    best = max(("torch_full_logits", "torch_last_logits"), key=lambda k: prefill[k]["prefill_tokens_per_s"])

    gen_prompts = build_prompts(lm, examples, spec, GEN_BATCH, prompt_tokens, instruction=GEN_INSTRUCTION)
    gen_rows = lm.tokenizer.encode_batch(gen_prompts)
    eos = tuple(lm.tokenizer.eos_ids)
    gen_fns = {
        "ours": lambda: [list(g.token_ids) for g in
                         lm.generate(gen_rows, max_new_tokens=NEW_TOKENS, batch_size=GEN_BATCH)],
        "torch": lambda: torch_generate(model, tok, gen_rows, eos),
    }
    gen_out, gen_seconds, gen_cpu, _, gen_compiles = alternate(gen_fns, repeats)
    gen = {name: {"new_tokens": sum(map(len, gen_out[name])), "seconds_median": round(statistics.median(s), 4),
                  "seconds": [round(x, 4) for x in s], "cpu_utilisation": gen_cpu[name]}
           for name, s in gen_seconds.items()}
    for name, g in gen.items():
        g["new_tokens_per_s"] = rate(g["new_tokens"], gen_seconds[name])

    return {
        "model": "smollm2 (SmolLM2-135M-Instruct GGUF, dequantised to float32)",
        "batch": batch,
        "prompt_tokens_max": prompt_tokens,
        "prompt_lengths": [len(r) for r in rows],
        "real_prompt_tokens": real_tokens,
        "padded_length_ours": length_bucket(max(map(len, rows))),
        "repeats": repeats,
        "prefill_tokens_per_s": {"ours": prefill["ours"]["prefill_tokens_per_s"],
                                 "torch": prefill[best]["prefill_tokens_per_s"]},
        "label_scoring_prompts_per_s": {"ours": prefill["ours"]["label_scoring_prompts_per_s"],
                                        "torch": prefill[best]["label_scoring_prompts_per_s"]},
        "ratio": round(prefill["ours"]["prefill_tokens_per_s"] / prefill[best]["prefill_tokens_per_s"], 3),
        "ratio_torch_variant": best,
        "ratio_vs_torch_full_logits": round(
            prefill["ours"]["prefill_tokens_per_s"] / prefill["torch_full_logits"]["prefill_tokens_per_s"], 3),
        "prefill": prefill,
        "max_abs_logprob_diff": diff,
        "token_ids_match_hf_tokenizer": hf_rows == rows,
        "label_ids_match": hf_label_ids == [[i] for i in label_ids],
        "generate": {
            "batch": GEN_BATCH,
            "max_new_tokens": NEW_TOKENS,
            "prompt_lengths": [len(r) for r in gen_rows],
            **gen,
            "ratio": round(gen["ours"]["new_tokens_per_s"] / gen["torch"]["new_tokens_per_s"], 3),
        },
        "generate_tokens_match": gen_out["ours"][0] == gen_out["torch"][0],
        "generate_rows_match": int(sum(a == b for a, b in zip(gen_out["ours"], gen_out["torch"]))),
        "jax_compiles_timed": compiles + gen_compiles,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "torch_load_seconds": round(torch_load_s, 2),
    }


# ---------------------------------------------------------------------------
# Part 2: active vs passive audit
# ---------------------------------------------------------------------------


class TimedModel:
    """Delegates to a :class:`LanguageModel`, adding up the time spent in the model and in chat templates."""

    def __init__(self, lm):
        self._lm = lm
        self.model_seconds = 0.0
        self.prompt_seconds = 0.0

    def __getattr__(self, name):
        return getattr(self._lm, name)

    def _model(self, fn, *args, **kwargs):
        out, s = timed(fn, *args, **kwargs)
        self.model_seconds += s
        return out

    def label_logprobs(self, *args, **kwargs):
        return self._model(self._lm.label_logprobs, *args, **kwargs)

    def greedy_continues_with(self, *args, **kwargs):
        return self._model(self._lm.greedy_continues_with, *args, **kwargs)

    def generate(self, *args, **kwargs):
        return self._model(self._lm.generate, *args, **kwargs)

    def chat_prompt(self, *args, **kwargs):
        out, s = timed(self._lm.chat_prompt, *args, **kwargs)
        self.prompt_seconds += s
        return out


def _release_one(mech, attack, key, t, clean):
    prepared = mech.prepare(clean, attack)
    noise = jax.tree_util.tree_map(lambda x: x[..., 0], mech.noise(jax.random.fold_in(key, t), 1, prepared))
    return mech.outcome(noise, prepared, attack)


_release_chunk = jax.jit(jax.vmap(_release_one, in_axes=(None, None, None, 0, 0)))


def release_outcomes(mech, attack, key, clean: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(hits, scores)`` of one private release per clean output; run ``t`` uses ``fold_in(key, t)``."""
    n = clean.shape[0]
    hits, scores = np.empty(n, bool), np.empty(n, np.float64)
    for start in range(0, n, RELEASE_CHUNK):
        stop = min(n, start + RELEASE_CHUNK)
        rows = np.concatenate([clean[start:stop], np.repeat(clean[:1], RELEASE_CHUNK - (stop - start), 0)])
        runs = np.arange(start, start + RELEASE_CHUNK, dtype=np.int32)  # made by NumPy: no XLA compilation
        h, s = _release_chunk(mech, attack, key, runs, rows.astype(np.float32))
        hits[start:stop], scores[start:stop] = np.asarray(h)[: stop - start], np.asarray(s)[: stop - start]
    return hits, scores


class AuditBench:
    """The PV copy-mode case and one complete active or passive audit per call, from an empty cache."""

    def __init__(self, lm, seed: int = 0):
        self.lm = lm
        self.seed = seed
        self.case = make_case(load_examples("agnews"), get_spec("agnews"), mode="copy",
                              num_exemplars=NUM_EXEMPLARS, seed=0)

    def _pipeline(self):
        model = TimedModel(self.lm)
        return model, PrivateVotingPipeline(LLMOracle(model, batch_size=8), self.case, partitions=PARTITIONS)

    def active(self, n_llm: int) -> dict:
        model, pipeline = self._pipeline()
        start = time.perf_counter()
        run = generate_snapshots(pipeline, snapshots=n_llm, seed=self.seed, verify=4)
        llm_s = time.perf_counter() - start
        snaps = run.snapshots
        res = audit(pipeline.mechanism(EPSILON, DELTA), snaps.with_canary, snaps.without_canary,
                    epsilon_theory=EPSILON, delta=DELTA, threat="black", trials=ACTIVE_TRIALS,
                    confidence=CONFIDENCE, clean="fixed", target=int(snaps.target),
                    sensitivity=pipeline.sensitivity, seed=self.seed)
        wall = time.perf_counter() - start
        m = run.manifest
        return {
            "n_llm": n_llm,
            "epsilon_emp": res.epsilon_emp,
            "llm_calls": m["llm_calls"],
            "unique_computations": m["unique_computations"],
            "determinism_check": m["determinism_check"],
            "distinct_snapshots": m["distinct_snapshots"],
            "wall_seconds": round(wall, 3),
            "phase_a_seconds": round(llm_s, 3),
            "model_seconds": round(model.model_seconds, 3),
            "prompt_seconds": round(model.prompt_seconds, 3),
            "simulation_seconds": round(wall - llm_s, 3),
            "trials": ACTIVE_TRIALS,
            "tpr_low": res.tpr_low,
            "fpr_up": res.fpr_up,
        }

    def passive(self, runs: int) -> dict:
        model, pipeline = self._pipeline()
        mech = pipeline.mechanism(EPSILON, DELTA)
        # The passive auditor's attack is fixed in advance: "the release is the vote for the canary's secret".
        attack = Attack(jnp.asarray([1.0, 0.0], jnp.float32), jnp.asarray([0.0, 1.0], jnp.float32),
                        int(pipeline.target))
        key = jax.random.fold_in(jax.random.key(self.seed), int(EPSILON * 1000))
        start = time.perf_counter()
        # Fresh partition assignments (seed stream seed + 1), like run_audit's passive runs.
        clean = {b: pipeline.clean_outputs(b, runs, self.seed + 1) for b in (1, 0)}
        llm_s = time.perf_counter() - start
        outcomes = {b: release_outcomes(mech, attack, jax.random.fold_in(key, b), clean[b]) for b in (1, 0)}
        res = passive_bounds(outcomes[1], outcomes[0], epsilon_theory=EPSILON, delta=DELTA, threat="black",
                             confidence=CONFIDENCE, name="pv")
        wall = time.perf_counter() - start
        stats = pipeline.oracle.stats
        return {
            "runs": runs,
            "epsilon_emp": res.epsilon_emp,
            "llm_calls": 2 * runs * pipeline.calls_per_clean,
            "oracle_calls": stats.calls,
            "unique_computations": stats.computed,
            "wall_seconds": round(wall, 3),
            "clean_stage_seconds": round(llm_s, 3),
            "model_seconds": round(model.model_seconds, 3),
            "prompt_seconds": round(model.prompt_seconds, 3),
            "release_and_bound_seconds": round(wall - llm_s, 3),
            "tpr_low": res.tpr_low,
            "fpr_up": res.fpr_up,
            "hits": {"with": int(outcomes[1][0].sum()), "without": int(outcomes[0][0].sum())},
        }


def audit_cost(lm, target: float | None, max_passive_runs: int) -> dict:
    bench = AuditBench(lm)
    # Compiles the model's shapes, the release kernel, and the audit simulator for n_llm = 2 and the reference
    # (its static plan holds the snapshot count, so every other n_llm compiles it once more: ~0.5 s).
    _, warm_s = timed(lambda: (bench.active(ACTIVE_LADDER[0]), bench.active(REFERENCE_SNAPSHOTS),
                               bench.passive(PASSIVE_START)))
    with CompileCounter() as compiles:
        reference = bench.active(REFERENCE_SNAPSHOTS)
        goal = TARGET_FRACTION * reference["epsilon_emp"] if target is None else target
        active_ladder = []
        for n in ACTIVE_LADDER:
            active_ladder.append(bench.active(n))
            if active_ladder[-1]["epsilon_emp"] >= goal:
                break
        passive_ladder = []
        runs = PASSIVE_START
        while runs <= max_passive_runs:
            passive_ladder.append(bench.passive(runs))
            if passive_ladder[-1]["epsilon_emp"] >= goal:
                break
            runs *= 2
    active_hit = active_ladder[-1] if active_ladder[-1]["epsilon_emp"] >= goal else None
    passive_hit = passive_ladder[-1] if passive_ladder[-1]["epsilon_emp"] >= goal else None
    out = {
        "case": {"pipeline": "pv", "query": "copy", "dataset": "agnews (demo)", "model": lm.name,
                 "num_exemplars": NUM_EXEMPLARS, "partitions": PARTITIONS, "epsilon_theory": EPSILON,
                 "delta": DELTA, "threat": "black", "confidence": CONFIDENCE, "canary_secret": bench.case.secret},
        "target_epsilon": round(goal, 4),
        "target_rule": (f"{TARGET_FRACTION} x the active bound at n_llm = {REFERENCE_SNAPSHOTS}" if target is None
                        else "--target"),
        "reference_active": reference,
        "active": active_hit,
        "passive": passive_hit,
        "active_ladder": [{k: r[k] for k in ("n_llm", "epsilon_emp", "llm_calls", "wall_seconds")}
                          for r in active_ladder],
        "passive_ladder": [{k: r[k] for k in ("runs", "epsilon_emp", "llm_calls", "wall_seconds")}
                           for r in passive_ladder],
        "ladder_wall_seconds": {"active": round(sum(r["wall_seconds"] for r in active_ladder), 2),
                                "passive": round(sum(r["wall_seconds"] for r in passive_ladder), 2)},
        "warmup_seconds": round(warm_s, 2),
        "jax_compiles_timed": compiles.count,
    }
    if active_hit and passive_hit:
        out["llm_calls_ratio_passive_over_active"] = round(passive_hit["llm_calls"] / active_hit["llm_calls"], 1)
        out["wall_ratio_passive_over_active"] = round(passive_hit["wall_seconds"] / active_hit["wall_seconds"], 2)
    return out


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def readable(r: dict) -> str:
    lines = []
    inf = r.get("inference")
    if inf:
        p, g = inf["prefill"], inf["generate"]
        lines.append(
            f"prefill: {inf['batch']} prompts, {inf['real_prompt_tokens']} real tokens (ours padded to "
            f"{inf['padded_length_ours']}) | ours {p['ours']['prefill_tokens_per_s']:,.0f} tok/s | torch full logits "
            f"{p['torch_full_logits']['prefill_tokens_per_s']:,.0f} | torch last logits "
            f"{p['torch_last_logits']['prefill_tokens_per_s']:,.0f} | ratio {inf['ratio']:.2f} | label scoring "
            f"{inf['label_scoring_prompts_per_s']['ours']:.2f} vs {inf['label_scoring_prompts_per_s']['torch']:.2f} "
            f"prompts/s | max |dlogp| {inf['max_abs_logprob_diff']:.1e}")
        lines.append(
            f"generate: {g['batch']} prompts x {g['max_new_tokens']} new | ours {g['ours']['new_tokens_per_s']:.1f} "
            f"tok/s ({g['ours']['new_tokens']} tokens) | torch {g['torch']['new_tokens_per_s']:.1f} tok/s "
            f"({g['torch']['new_tokens']} tokens) | ratio {g['ratio']:.2f} | first prompt identical: "
            f"{inf['generate_tokens_match']} ({inf['generate_rows_match']}/{g['batch']} rows) | torch threads "
            f"{inf['torch_threads']}, jax devices {r['jax_devices']}")
    a = r.get("audit")
    if a:
        lines.append(f"audit target eps >= {a['target_epsilon']:.3f} ({a['target_rule']}; reference "
                     f"{a['reference_active']['epsilon_emp']:.3f})")
        for mode, size in (("active", "n_llm"), ("passive", "runs")):
            hit = a[mode]
            if hit is None:
                lines.append(f"  {mode}: not reached ({a[mode + '_ladder'][-1]})")
                continue
            lines.append(
                f"  {mode}: {size}={hit[size]} eps {hit['epsilon_emp']:.3f} | {hit['llm_calls']} LLM calls, "
                f"{hit['unique_computations']} computed | {hit['wall_seconds']:.1f} s (model "
                f"{hit['model_seconds']:.1f} s, chat templates {hit['prompt_seconds']:.1f} s)")
    lines.append(f"total {r['wall_seconds_total']:.0f} s")
    return "\n".join(lines)


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of readable lines")
    parser.add_argument("--out", help="also write the JSON object to this file (atomically)")
    parser.add_argument("--batch", type=int_at_least(1), default=8, help="prompts per prefill batch")
    parser.add_argument("--prompt-tokens", type=int_at_least(MIN_PROMPT_TOKENS, MAX_PROMPT_TOKENS), default=256,
                        help="maximum prompt length in tokens")
    parser.add_argument("--repeats", type=int_at_least(1), default=5, help="timed calls per implementation")
    parser.add_argument("--part", choices=("inference", "audit", "all"), default="all")
    parser.add_argument("--target", type=positive_float, default=None,
                        help=f"epsilon bound to reach (default: {TARGET_FRACTION} x the active bound at "
                             f"n_llm={REFERENCE_SNAPSHOTS})")
    parser.add_argument("--max-passive-runs", type=int_at_least(PASSIVE_START), default=6400,
                        help="largest passive rung (runs per context)")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    result = {"part": args.part, "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
              "cpu_count": os.cpu_count(), "jax_devices": len(jax.devices()), "jax_version": jax.__version__}
    lm, load_s = timed(load_language_model, "smollm2")
    result["ours_load_seconds"] = round(load_s, 2)
    if args.part in ("inference", "all"):
        result["inference"] = inference(lm, args.batch, args.prompt_tokens, args.repeats)
    if args.part in ("audit", "all"):
        result["audit"] = audit_cost(lm, args.target, args.max_passive_runs)
    result["wall_seconds_total"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result) if args.json else readable(result), flush=True)
    inf = result.get("inference")
    if inf and not inf["generate_tokens_match"]:
        print("warning: greedy generation of the first prompt differs from transformers", file=sys.stderr)
    if inf and inf["max_abs_logprob_diff"] > LOGPROB_TOL:
        print(f"error: label log-probs differ from transformers by {inf['max_abs_logprob_diff']:.2e} > {LOGPROB_TOL}",
              file=sys.stderr)
        return 1
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
