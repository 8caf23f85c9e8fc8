"""LLM prefill and greedy decode in bfloat16: our Flax Llama against transformers' PyTorch model, same weights.

Usage::

    python benchmarks/gpu/llm.py [--out FILE.json] [--json] [--archs NAME,NAME] \
        [--deadline SECONDS | --deadline-at UNIX_TIME] [--batch B] [--prompt-tokens L] \
        [--decode-prompt-tokens P] [--new-tokens N] [--repeats R] [--seed S] [--cpu-smoke] \
        [--share {auto,dlpack,numpy}]

For each architecture shape (SmolLM2-135M, Llama-3.2-1B, Llama-3-8B; random weights, bfloat16), in one
process: transformers builds ``LlamaForCausalLM`` from the config directly on the device in bfloat16
(random init there, no CPU copy), and our :class:`~snapaudit_jax.models.Llama` takes the same weights
(``jax.dlpack.from_dlpack`` on the GPU: no host round trip, untransposed tensors alias torch's memory; NumPy on
CPU) through :func:`~snapaudit_jax.models.weights.build_model`. Then, each side warmed up first, timed calls
alternating, medians:

* prefill: ``B x L`` random prompt tokens, last-position log-probs over the vocabulary. Ours:
  :func:`~snapaudit_jax.models.last_token_logprobs` jitted; torch: ``model(input_ids, attention_mask,
  logits_to_keep=1, use_cache=False)`` + float32 log-softmax in ``torch.inference_mode()``.
* decode: greedy continuation of the first ``P`` tokens of each prompt by ``N`` new tokens (no end-of-sequence
  token, so every row emits ``N``). Ours: :func:`~snapaudit_jax.models.decode` (prefill into a bfloat16 KV
  cache and a ``lax.while_loop``); torch: ``model.generate(do_sample=False)`` (its default dynamic cache).

``--cpu-smoke`` runs the same code with tiny configs on CPU (JAX and torch), in well under a minute, so the
script cannot rot where no GPU is at hand. ``--deadline`` skips the architectures that would not finish in
time (recorded as skipped, with the reason). An error inside one architecture is recorded in its row and the
script goes on; it then exits with status 1. Bad flags exit with status 2.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if os.path.dirname(HERE) not in sys.path:  # benchmarks/_common.py (light: no JAX or torch)
    sys.path.insert(0, os.path.dirname(HERE))

from _common import number_at_least  # noqa: E402

# name -> transformers LlamaConfig fields of the real models (published config.json files).
ARCHS = {
    "smollm2-135m": dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, rope_theta=1e5, rms_norm_eps=1e-5,
        tie_word_embeddings=True),
    "llama-3.2-1b": dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=131072, rope_theta=5e5, rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192}),
    "llama-3-8b": dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=8192, rope_theta=5e5, rms_norm_eps=1e-5,
        tie_word_embeddings=False),
}
# The same three shapes shrunk for --cpu-smoke: same head ratios, tying, RoPE base and scaling; prime-ish sizes.
SMOKE_ARCHS = {
    "smollm2-135m": dict(ARCHS["smollm2-135m"], vocab_size=257, hidden_size=48, intermediate_size=97,
                         num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
                         max_position_embeddings=256),
    "llama-3.2-1b": dict(ARCHS["llama-3.2-1b"], vocab_size=311, hidden_size=64, intermediate_size=131,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                         max_position_embeddings=256,
                         rope_scaling=dict(ARCHS["llama-3.2-1b"]["rope_scaling"], original_max_position_embeddings=32)),
    "llama-3-8b": dict(ARCHS["llama-3-8b"], vocab_size=331, hidden_size=64, intermediate_size=113,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256),
}
# Rough wall seconds of one architecture (build, both compilations, warm-ups, timed calls), used by --deadline.
GPU_ESTIMATE_S = {"smollm2-135m": 60, "llama-3.2-1b": 60, "llama-3-8b": 100}
SMOKE_ESTIMATE_S = dict.fromkeys(ARCHS, 10)
DECODE_SHARE = 0.5  # part of an architecture's estimate that its decode phase needs
GPU_DEFAULTS = dict(batch=8, prompt_tokens=512, decode_prompt_tokens=128, new_tokens=64, repeats=3)
SMOKE_DEFAULTS = dict(batch=2, prompt_tokens=37, decode_prompt_tokens=13, new_tokens=7, repeats=2)


# ---------------------------------------------------------------------------
# Flags (no JAX or torch imported yet: bad flags fail fast)
# ---------------------------------------------------------------------------


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    return parse


def _arch_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ARCHS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"must be a comma-separated list of {', '.join(ARCHS)}, got {text!r}")
    return list(dict.fromkeys(names))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON result to this file (atomically)")
    parser.add_argument("--json", action="store_true", help="print the JSON result instead of the summary")
    parser.add_argument("--archs", type=_arch_list, default=list(ARCHS),
                        help=f"comma-separated architectures, in order (default: {','.join(ARCHS)})")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--deadline", type=number_at_least(0, strict=True),
                      help="finish within this many seconds of the start: later architectures are skipped")
    when.add_argument("--deadline-at", type=number_at_least(0, strict=True),
                      help="finish by this Unix time (seconds since the epoch), e.g. a kit's common deadline")
    parser.add_argument("--batch", type=_int_at_least(1), help="rows per prefill and decode batch (GPU 8, smoke 2)")
    parser.add_argument("--prompt-tokens", type=_int_at_least(2), help="prefill prompt length (GPU 512, smoke 37)")
    parser.add_argument("--decode-prompt-tokens", type=_int_at_least(1),
                        help="decode prompt length, at most --prompt-tokens (GPU 128, smoke 13)")
    parser.add_argument("--new-tokens", type=_int_at_least(1), help="greedy tokens per row (GPU 64, smoke 7)")
    parser.add_argument("--repeats", type=_int_at_least(1), help="timed calls per implementation (GPU 3, smoke 2)")
    parser.add_argument("--seed", type=_int_at_least(0), default=0, help="seed of the weights and prompts")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny configs on CPU (JAX and torch): checks the code path in well under a minute")
    parser.add_argument("--share", choices=("auto", "dlpack", "numpy"), default="auto",
                        help="how our model gets torch's weights: auto = DLPack on the GPU, NumPy copies on CPU "
                             "(--share dlpack checks the GPU's path in a CPU smoke run)")
    args = parser.parse_args(argv)
    for key, value in (SMOKE_DEFAULTS if args.cpu_smoke else GPU_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.decode_prompt_tokens > args.prompt_tokens:
        parser.error(f"argument --decode-prompt-tokens: must be <= --prompt-tokens={args.prompt_tokens}, "
                     f"got {args.decode_prompt_tokens}")
    if args.deadline_at is not None and args.deadline_at <= time.time():
        parser.error(f"argument --deadline-at: must be a Unix time in the future, got {args.deadline_at:.0f} "
                     f"(now {time.time():.0f})")
    archs = SMOKE_ARCHS if args.cpu_smoke else ARCHS
    for name in args.archs:
        limit = archs[name]["max_position_embeddings"]
        if max(args.prompt_tokens, args.decode_prompt_tokens + args.new_tokens) > limit:
            parser.error(f"argument --prompt-tokens/--new-tokens: prompts and new tokens must fit {name}'s {limit} "
                         f"positions, got {args.prompt_tokens} and {args.decode_prompt_tokens}+{args.new_tokens}")
    return args


# ---------------------------------------------------------------------------
# One architecture
# ---------------------------------------------------------------------------


class Bench:
    """The imported libraries and the device of one run (imports happen after the environment is set)."""

    def __init__(self, smoke: bool, share: str = "auto"):
        import jax
        import jax.numpy as jnp
        import numpy as np
        import torch
        import transformers
        from flax import nnx

        import _common
        from snapaudit_jax.models import Greedy, decode, last_token_logprobs
        from snapaudit_jax.models.config import config_from_hf
        from snapaudit_jax.models.decoders import empty_cache
        from snapaudit_jax.models.weights import build_model

        self.jax, self.jnp, self.np, self.torch, self.transformers, self.nnx = jax, jnp, np, torch, transformers, nnx
        self.common = _common
        self.Greedy, self.decode, self.last_token_logprobs = Greedy, decode, last_token_logprobs
        self.config_from_hf, self.build_model, self.empty_cache = config_from_hf, build_model, empty_cache
        self.smoke = smoke
        self.cuda = not smoke
        self.device = "cpu" if smoke else "cuda"
        self.dlpack = share == "dlpack" or (share == "auto" and self.cuda)
        transformers.logging.set_verbosity_error()

    # --- device helpers --------------------------------------------------------
    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def memory(self) -> dict:
        """Peak device memory: torch's since the architecture started, JAX's since the process started."""
        out = {}
        stats = self.jax.devices()[0].memory_stats() or {}
        for key in ("peak_bytes_in_use", "bytes_in_use", "bytes_limit"):
            if key in stats:
                out[f"jax_{key}"] = int(stats[key])
        if self.cuda:
            out["torch_max_memory_allocated"] = int(self.torch.cuda.max_memory_allocated())
            out["torch_max_memory_reserved"] = int(self.torch.cuda.max_memory_reserved())
        return out

    def free(self) -> None:
        """Releases what the last architecture left: Python objects, XLA executables, torch's cached blocks."""
        gc.collect()
        self.jax.clear_caches()
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()

    # --- models ----------------------------------------------------------------
    def torch_model(self, fields: dict, seed: int):
        """transformers' ``LlamaForCausalLM`` of ``fields``, random bfloat16 weights created on the device."""
        torch = self.torch
        cfg = self.transformers.LlamaConfig(**fields, bos_token_id=None, eos_token_id=None, pad_token_id=0)
        torch.manual_seed(seed)
        with torch.device(self.device):
            model = self.transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model = model.to(self.device).eval()
        model.generation_config.pad_token_id = 0
        model.generation_config.eos_token_id = None
        self.sync()
        return model, cfg

    def share(self, model, cfg):
        """Our bfloat16 Llama from the torch model's tensors: DLPack (no copy; transposes and fused projections
        made on the device) or NumPy copies."""
        self.sync()
        state = model.state_dict()
        if self.dlpack:
            def get(name):
                t = state.get(name)
                return None if t is None else self.jax.dlpack.from_dlpack(t.detach())
        else:
            def get(name):
                t = state.get(name)
                return None if t is None else t.detach().float().numpy()
        ours = self.build_model(self.config_from_hf(cfg.to_dict()), get, "transformers state dict",
                                dtype=self.jnp.bfloat16)
        self.jax.block_until_ready(self.nnx.state(ours))
        aliased = (ours.embed.embedding[...].unsafe_buffer_pointer()
                   == state["model.embed_tokens.weight"].data_ptr())
        return ours, {"transfer": "dlpack" if self.dlpack else "numpy", "embedding_aliases_torch": bool(aliased)}

    # --- timed calls -----------------------------------------------------------
    def torch_prefill_fn(self, model, ids):
        torch = self.torch
        mask = torch.ones_like(ids)

        def run():
            with torch.inference_mode():
                logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=1, use_cache=False).logits
                out = torch.log_softmax(logits[:, -1].float(), dim=-1)
            self.sync()
            return out

        return run

    def ours_prefill_fn(self, ours, tokens):
        jax, jnp, nnx = self.jax, self.jnp, self.nnx
        graphdef, state = nnx.split(ours)
        mask = jnp.ones(tokens.shape, bool)
        vocab = ours.cfg.vocab_size

        @jax.jit
        def prefill(state, tokens, mask):
            return self.last_token_logprobs(nnx.merge(graphdef, state), tokens, mask, jnp.arange(vocab))

        return lambda: prefill(state, tokens, mask)

    def torch_decode_fn(self, model, ids, new_tokens):
        torch = self.torch
        mask = torch.ones_like(ids)

        def run():
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                                     min_new_tokens=new_tokens, pad_token_id=0, temperature=None, top_p=None,
                                     top_k=None)
            self.sync()
            return out[:, ids.shape[1]:]

        return run

    def ours_decode_fn(self, ours, tokens, new_tokens):
        mask = self.jnp.ones(tokens.shape, bool)
        return lambda: self.decode(ours, tokens, mask, self.Greedy(), max_new_tokens=new_tokens)

    def teacher_forced(self, model, prompts, ours_tokens) -> dict:
        """torch's greedy choice after each prefix of our continuation, and how close its disagreements are."""
        torch = self.torch
        seq = torch.cat([prompts, ours_tokens], dim=1)
        n = ours_tokens.shape[1]
        with torch.inference_mode():
            logits = model(input_ids=seq, logits_to_keep=n + 1, use_cache=False).logits[:, :-1].float()
        best = logits.argmax(-1)
        gap = (logits.max(-1).values - logits.gather(-1, ours_tokens[..., None])[..., 0]).cpu().numpy()
        agree = (best == ours_tokens).cpu().numpy()
        top = float(logits.abs().max())
        return {"agreement": round(float(agree.mean()), 4),
                "max_gap_where_different": round(float(gap[~agree].max()), 5) if (~agree).any() else None,
                "bf16_logit_spacing_at_max": 2.0 ** (math.floor(math.log2(top)) - 7) if top > 0 else None}

    def run_arch(self, name: str, fields: dict, args, time_left) -> dict:
        """Builds, shares, times prefill and decode of one architecture; returns its row."""
        np, torch, jnp, common = self.np, self.torch, self.jnp, self.common
        row: dict = {"arch": name, "status": "ok"}
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        (model, cfg), build_s = _timed(self.torch_model, fields, args.seed)
        row["torch_build_seconds"] = round(build_s, 3)
        row["params"] = int(sum(p.numel() for p in model.parameters()))
        row["torch_attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        row["torch_param_device"] = str(next(model.parameters()).device)
        (ours, weights), share_s = _timed(self.share, model, cfg)
        row["weights"] = dict(weights, share_seconds=round(share_s, 3))
        row["dtypes"] = {"torch": str(next(model.parameters()).dtype).replace("torch.", ""),
                         "ours_params": str(ours.dtype),
                         "ours_kv_cache": str(self.empty_cache(ours, 1, 1)[0].k.dtype),
                         "ours_logits": "float32"}

        rng = np.random.default_rng(args.seed)
        prompts = rng.integers(0, fields["vocab_size"], (args.batch, args.prompt_tokens)).astype(np.int32)
        ids = torch.from_numpy(prompts.astype(np.int64)).to(self.device)
        tokens = jnp.asarray(prompts)
        compiles = 0

        # Prefill.
        fns = {"ours": self.ours_prefill_fn(ours, tokens), "torch": self.torch_prefill_fn(model, ids)}
        alt = common.alternate(fns, args.repeats)
        compiles += alt.compiles_timed
        count = args.batch * args.prompt_tokens
        ours_lp = np.asarray(alt.outs["ours"], np.float64)
        torch_lp = alt.outs["torch"].cpu().numpy().astype(np.float64)
        row["prefill"] = {
            "batch": args.batch, "prompt_tokens": args.prompt_tokens, "tokens": count,
            **{side: _rates(count, alt.seconds[side], alt.first[side], "tokens_per_s") for side in fns},
            "max_abs_logprob_diff": round(float(np.abs(ours_lp - torch_lp).max()), 5),
            "argmax_agreement": round(float(np.mean(ours_lp.argmax(-1) == torch_lp.argmax(-1))), 4),
        }
        row["prefill"]["ratio_ours_over_torch"] = _ratio(row["prefill"], "tokens_per_s")
        del fns, alt, ours_lp, torch_lp

        # Decode.
        left = time_left()
        need = DECODE_SHARE * args.estimate[name]
        if left is not None and left < need:
            row["decode"] = {"status": "skipped", "reason": f"deadline: {left:.0f} s left, decode needs about "
                                                             f"{need:.0f} s"}
        else:
            dec_prompts = prompts[:, : args.decode_prompt_tokens]
            dec_ids = ids[:, : args.decode_prompt_tokens].contiguous()
            fns = {"ours": self.ours_decode_fn(ours, jnp.asarray(dec_prompts), args.new_tokens),
                   "torch": self.torch_decode_fn(model, dec_ids, args.new_tokens)}
            alt = common.alternate(fns, args.repeats)
            compiles += alt.compiles_timed
            ours_tokens = np.asarray(alt.outs["ours"])
            torch_tokens = alt.outs["torch"].cpu().numpy()
            same = ours_tokens == torch_tokens
            count = args.batch * args.new_tokens
            row["decode"] = {
                "batch": args.batch, "prompt_tokens": args.decode_prompt_tokens, "new_tokens": args.new_tokens,
                "torch_cache": "DynamicCache (generate's default)",
                **{side: _rates(count, alt.seconds[side], alt.first[side], "new_tokens_per_s") for side in fns},
                "agreement": {
                    "fraction_identical": round(float(same.mean()), 4),
                    "rows_identical": int(same.all(axis=1).sum()),
                    "first_divergence": [None if r.all() else int(np.argmin(r)) for r in same],
                    "torch_teacher_forced_on_ours": self.teacher_forced(
                        model, dec_ids, torch.from_numpy(ours_tokens.astype(np.int64)).to(self.device)),
                },
            }
            row["decode"]["ratio_ours_over_torch"] = _ratio(row["decode"], "new_tokens_per_s")
            del fns, alt
        row["jax_compiles_timed"] = compiles
        row["memory"] = self.memory()
        return row


def _timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def _rates(count: int, seconds: list[float], first: dict, key: str) -> dict:
    median = statistics.median(seconds)
    return {key: round(count / median, 2), "seconds_median": round(median, 5),
            "seconds": [round(s, 5) for s in seconds], "first_call_seconds": first["first_call_seconds"],
            "compile_seconds": first["compile_seconds"], "compiles": first["compiles"]}


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def _ratio(part: dict, key: str) -> float:
    return round(part["ours"][key] / part["torch"][key], 3)


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def summary(result: dict) -> str:
    lines = [f"{result['device']} | jax {result['versions']['jax']}, torch {result['versions']['torch']}, "
             f"transformers {result['versions']['transformers']} | {result['mode']}, bfloat16"]
    for row in result["architectures"]:
        head = f"{row['arch']}: "
        if row["status"] != "ok":
            lines.append(head + f"{row['status']} ({row.get('reason') or row.get('error')})")
            continue
        p = row["prefill"]
        lines.append(
            head + f"{_count(row['params'])} params | prefill {p['batch']}x{p['prompt_tokens']}: ours "
            f"{p['ours']['tokens_per_s']:,.0f} tok/s, torch {p['torch']['tokens_per_s']:,.0f} "
            f"(x{p['ratio_ours_over_torch']}), compile {p['ours']['compile_seconds']:.1f} s, "
            f"max |dlogp| {p['max_abs_logprob_diff']:.3f}")
        d = row["decode"]
        if d.get("status") == "skipped":
            lines.append(f"  decode skipped ({d['reason']})")
        else:
            a = d["agreement"]
            lines.append(
                f"  decode {d['batch']}x{d['new_tokens']} after {d['prompt_tokens']}: ours "
                f"{d['ours']['new_tokens_per_s']:,.0f} new tok/s, torch {d['torch']['new_tokens_per_s']:,.0f} "
                f"(x{d['ratio_ours_over_torch']}), compile {d['ours']['compile_seconds']:.1f} s | identical tokens "
                f"{a['fraction_identical']:.0%}, rows {a['rows_identical']}/{d['batch']}, first divergence "
                f"{a['first_divergence']}, torch agrees on our prefixes "
                f"{a['torch_teacher_forced_on_ours']['agreement']:.0%}")
        memory = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in row["memory"].items() if "peak" in k or "max" in k)
        lines.append(f"  jax compiles timed {row['jax_compiles_timed']} | {memory or 'no device memory stats'} | "
                     f"weights {row['weights']['transfer']} (embedding aliases torch: "
                     f"{row['weights']['embedding_aliases_torch']}) | {row['wall_seconds']:.1f} s")
    lines.append(f"total {result['wall_seconds']:.1f} s")
    return "\n".join(lines)


def main(argv=None) -> int:
    start = time.perf_counter()
    start_epoch = time.time()
    args = parse_args(argv)
    # Before JAX is imported (snapaudit_jax imports it): no preallocation, since torch shares the GPU;
    # --cpu-smoke keeps JAX on the CPU.
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    os.environ.setdefault("TQDM_DISABLE", "1")
    if args.cpu_smoke:
        os.environ["JAX_PLATFORMS"] = "cpu"
    if ROOT not in sys.path:  # the package, unless it is installed
        sys.path.append(ROOT)
    if args.out:
        from snapaudit_jax.utils.errors import InputError
        from snapaudit_jax.utils.io import check_output_file

        try:
            check_output_file("--out", args.out, ("json",))
        except InputError as err:
            print(f"{os.path.basename(__file__)}: error: {err}", file=sys.stderr)
            return 2
    if args.deadline is not None:
        end = start_epoch + args.deadline
    else:
        end = args.deadline_at

    def time_left():
        return None if end is None else end - time.time()

    bench = Bench(args.cpu_smoke, args.share)
    jax, torch = bench.jax, bench.torch
    if not args.cpu_smoke and (not torch.cuda.is_available() or jax.devices()[0].platform != "gpu"):
        print(f"error: no GPU visible to both torch (cuda available: {torch.cuda.is_available()}) and JAX (default "
              f"device: {jax.devices()[0]}); run with --cpu-smoke for the CPU check", file=sys.stderr)
        return 2
    import flax
    import jaxlib
    import transformers

    args.estimate = SMOKE_ESTIMATE_S if args.cpu_smoke else GPU_ESTIMATE_S
    archs = SMOKE_ARCHS if args.cpu_smoke else ARCHS
    result = {
        "benchmark": "llm prefill and decode, bfloat16, ours (Flax) vs transformers (PyTorch), same random weights",
        "mode": "cpu-smoke" if args.cpu_smoke else "gpu",
        "device": torch.cuda.get_device_name(0) if bench.cuda else (platform.processor() or platform.machine()),
        "jax_device": str(jax.devices()[0].device_kind),
        "versions": {"python": platform.python_version(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
                     "flax": flax.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                     "numpy": bench.np.__version__},
        "settings": {"batch": args.batch, "prompt_tokens": args.prompt_tokens,
                     "decode_prompt_tokens": args.decode_prompt_tokens, "new_tokens": args.new_tokens,
                     "repeats": args.repeats, "seed": args.seed, "archs": args.archs, "dtype": "bfloat16",
                     "share": "dlpack" if bench.dlpack else "numpy",
                     "deadline_seconds_from_start": None if end is None else round(end - start_epoch, 1),
                     "estimate_seconds": {n: args.estimate[n] for n in args.archs},
                     "xla_flags": os.environ.get("XLA_FLAGS", ""),
                     "xla_python_client_preallocate": os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"],
                     "torch_threads": torch.get_num_threads()},
        "architectures": [],
    }
    failed = False
    spent, planned = 0.0, 0.0  # wall and estimated seconds of the architectures run so far
    for name in args.archs:
        fields = archs[name]
        left = time_left()
        # A machine slower than the estimates so far is assumed to stay that much slower.
        need = args.estimate[name] * max(1.0, spent / planned if planned else 1.0)
        if left is not None and left < need:
            result["architectures"].append({"arch": name, "status": "skipped", "config": fields,
                                            "reason": f"deadline: {left:.0f} s left, this architecture needs about "
                                                      f"{need:.0f} s"})
            continue
        arch_start = time.perf_counter()
        try:
            row = bench.run_arch(name, fields, args, time_left)
        except Exception as err:  # recorded in the row; the next architecture still runs
            failed = True
            row = {"arch": name, "status": "error", "error": f"{type(err).__name__}: {err}",
                   "traceback": traceback.format_exc(limit=8)}
            print(f"error in {name}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        row["config"] = fields
        row["wall_seconds"] = round(time.perf_counter() - arch_start, 2)
        spent, planned = spent + row["wall_seconds"], planned + args.estimate[name]
        result["architectures"].append(row)
        bench.free()
        print(f"[{time.perf_counter() - start:.0f} s] {name}: {row['status']}", file=sys.stderr, flush=True)
    result["wall_seconds"] = round(time.perf_counter() - start, 2)
    from snapaudit_jax.utils.io import dumps, write_json

    print(dumps(result, indent=2) if args.json else summary(result), flush=True)
    if args.out:
        write_json(args.out, result)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
