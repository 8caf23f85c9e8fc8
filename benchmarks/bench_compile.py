"""Compile time of the DP-SGD step against depth, with the blocks unrolled and under one scan.

Usage::

    python benchmarks/bench_compile.py [--json] [--out FILE.json] [--layers 2,12,30] [--dim 64] [--heads 4] \
        [--vocab 512] [--seq 32] [--batch 8] [--records 64] [--paths per_record,book_keeping,ghost] \
        [--layouts unrolled,scan] [--run-steps 3] [--seed 0]

What is measured
----------------
For each depth of ``--layers`` and each layout of ``--layouts`` (``DPSGDConfig.layers``: ``unrolled``, one traced
copy per block; ``scan``, the blocks stacked and run by one :func:`jax.lax.scan`,
:func:`snapaudit_jax.models.decoders.stack_layers`): a GPT-2 (:class:`snapaudit_jax.models.decoders.GPT2`,
float32, width ``--dim``, every parameter trained), and for each clipping path of ``--paths`` the jitted step of
:func:`snapaudit_jax.dpsgd.train` (``_prepare`` and ``_dp_step``, as ``bench_dpsgd.py`` calls them; microbatch
8), plus the non-private step (``bench_dpsgd.NonPrivate``: one batched gradient, AdamW) of the same batch and
layout:

* ``lower_seconds``: tracing and lowering to StableHLO (``jit(...).lower``);
* ``compile_seconds``: XLA's compilation of the lowered step (``.compile()``);
* ``hlo_kb``: the size of the lowered module's text, which grows with every unrolled block;
* ``step_seconds``: the median of ``--run-steps`` runs of the compiled step (after one untimed run): what the
  layout costs at run time.

Each step is lowered and compiled once, in a fresh jit cache entry (the depth changes the parameters' tree),
with the persistent compilation cache off. ``per_layer`` fits ``seconds = a + b layers`` (least squares) to each
path's lowering plus compilation: ``b`` is what each further block costs (about 0 under the scan), and
``scan_over_unrolled`` gives the scan's compile and step time over the unrolled one's at each depth.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from _common import CLIPPING_PATHS as PATHS
from _common import int_at_least  # (JAX and the models are imported after the flags are checked)

LAYOUTS = ("unrolled", "scan")  # DPSGDConfig.layers' layouts ("auto" takes one of them)


def _timed_compile(lower, call, steps: int):
    """Lowers and compiles one step, then runs the compiled step ``steps`` times: its timings and module size."""
    import jax

    start = time.perf_counter()
    lowered = lower()
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    out = {"lower_seconds": round(lowered_at - start, 3), "compile_seconds": round(done - lowered_at, 3),
           "hlo_kb": round(len(lowered.as_text()) / 1024, 1)}
    if steps:
        jax.block_until_ready(call(compiled))  # the first run (buffers, thread pools) is not timed
        times = []
        for _ in range(steps):
            began = time.perf_counter()
            jax.block_until_ready(call(compiled))
            times.append(time.perf_counter() - began)
        out["step_seconds"] = round(float(sorted(times)[len(times) // 2]), 5)
    return out


def measure(args, layers: int, layout: str) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from bench_dpsgd import NonPrivate, dp_config, make_data
    from snapaudit_jax.dpsgd.train import _dp_step, _prepare
    from snapaudit_jax.models.config import GPT2Config
    from snapaudit_jax.models.decoders import GPT2, stack_layers

    cfg = GPT2Config(vocab_size=args.vocab, n_positions=args.seq, n_embd=args.dim, n_layer=layers,
                     n_head=args.heads, n_inner=4 * args.dim)
    model = GPT2(cfg, rngs=nnx.Rngs(args.seed))
    data = make_data(args.records, args.seq, args.vocab, args.seed)
    q = args.batch / args.records
    key = jax.random.key(args.seed)
    out = {}
    for path in args.paths:
        run = _prepare(model, data, dp_config(args, q, 1.0, path, 8, 1, layers=layout), key)
        if run.identity["layers"] != (None if layout == "unrolled" else layout):
            raise RuntimeError(f"{path}: the step ran {run.identity['layers']}, not {layout}")
        state = {"params": jax.tree.map(jnp.array, run.params), "opt": jax.tree.map(jnp.array, run.opt_state)}

        def call(compiled, run=run, state=state):
            state["params"], state["opt"], _ = compiled(run.key, np.int32(0), state["params"], state["opt"], run.rest,
                                                        run.tokens, run.mask, run.hyper)
            return state["params"]

        out[path] = _timed_compile(lambda: _dp_step.lower(  # noqa: B023
            run.key, np.int32(0), run.params, run.opt_state, run.rest, run.tokens, run.mask, run.hyper,  # noqa: B023
            graphdef=run.graphdef, spec=run.spec), call, args.run_steps)  # noqa: B023
    plain = stack_layers(model) if layout == "scan" else model
    nonprivate = NonPrivate(plain, jnp.asarray(data[0]), jnp.asarray(data[1]),
                            normaliser=args.records * q, pad_to=-(-2 * args.batch // 8) * 8)
    idx, weight = nonprivate.padded(np.arange(args.batch))

    def step(compiled):
        nonprivate.params, nonprivate.opt_state, _ = compiled(nonprivate.params, nonprivate.opt_state, idx, weight)
        return nonprivate.params

    out["nonprivate"] = _timed_compile(lambda: nonprivate._step.lower(nonprivate.params, nonprivate.opt_state,
                                                                      idx, weight), step, args.run_steps)
    return out


def benchmark(args) -> dict:
    import numpy as np

    steps = {layout: {str(n): measure(args, n, layout) for n in args.layers} for layout in args.layouts}
    per_layer: dict = {}
    depths = np.asarray(args.layers, float)
    for layout, rows in steps.items():
        for name in [*args.paths, "nonprivate"]:
            total = np.asarray([rows[str(n)][name]["lower_seconds"] + rows[str(n)][name]["compile_seconds"]
                                for n in args.layers])
            if len(depths) >= 2:
                slope, intercept = np.polyfit(depths, total, 1)
                per_layer.setdefault(layout, {})[name] = {"seconds_per_layer": round(float(slope), 3),
                                                          "seconds_at_0": round(float(intercept), 3)}
    ratios: dict = {}
    if {"unrolled", "scan"} <= set(args.layouts):
        for depth in map(str, args.layers):
            for name in [*args.paths, "nonprivate"]:
                u, c = steps["unrolled"][depth][name], steps["scan"][depth][name]
                entry = {"compile": round((c["lower_seconds"] + c["compile_seconds"])
                                          / (u["lower_seconds"] + u["compile_seconds"]), 3)}
                if "step_seconds" in u:
                    entry["step"] = round(c["step_seconds"] / u["step_seconds"], 3)
                ratios.setdefault(depth, {})[name] = entry
    return {"model": {"kind": "GPT2", "dim": args.dim, "heads": args.heads, "vocab": args.vocab, "seq": args.seq,
                      "trained": "every parameter (full fine-tuning)"},
            "layers": list(args.layers), "layouts": list(args.layouts), "expected_batch": args.batch,
            "microbatch": 8, "run_steps": args.run_steps, "steps": steps, "per_layer": per_layer,
            "scan_over_unrolled": ratios}


def readable(r: dict) -> str:
    m = r["model"]
    lines = [f"GPT-2 width {m['dim']}, vocab {m['vocab']}, seq {m['seq']}, expected batch {r['expected_batch']}"]
    for layout, depths in r["steps"].items():
        names = list(next(iter(depths.values())))
        rows = [(layout, *(f"{n} lower+compile s" + (" | step ms" if r["run_steps"] else "") for n in names))]
        for depth, row in depths.items():
            rows.append((f"{depth} layers", *(f"{row[n]['lower_seconds']:.2f}+{row[n]['compile_seconds']:.2f}"
                                              + (f" | {1e3 * row[n]['step_seconds']:.1f}" if "step_seconds" in row[n]
                                                 else "") for n in names)))
        if layout in r["per_layer"]:
            rows.append(("s per layer", *(f"{r['per_layer'][layout][n]['seconds_per_layer']:.3f}" for n in names)))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a readable table")
    parser.add_argument("--out", help="also write the JSON object to this file (atomically)")
    parser.add_argument("--layers", default="2,12,30", help="depths, comma-separated")
    parser.add_argument("--dim", type=int_at_least(8), default=64)
    parser.add_argument("--heads", type=int_at_least(1), default=4)
    parser.add_argument("--vocab", type=int_at_least(2), default=512)
    parser.add_argument("--seq", type=int_at_least(4), default=32)
    parser.add_argument("--batch", type=int_at_least(1), default=8)
    parser.add_argument("--records", type=int_at_least(1), default=64)
    parser.add_argument("--paths", default=",".join(PATHS), help="clipping paths, comma-separated")
    parser.add_argument("--layouts", default="unrolled,scan",
                        help="how the blocks run (DPSGDConfig.layers): unrolled, scan, comma-separated")
    parser.add_argument("--run-steps", type=int_at_least(0), default=3,
                        help="compiled steps run and timed after each compilation (median; 0: none)")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    args = parser.parse_args(argv)
    try:
        args.layers = sorted({int(x) for x in args.layers.split(",") if x.strip()})
    except ValueError:
        parser.error(f"--layers must be integers >= 1, comma-separated, got {args.layers!r}")
    if not args.layers or args.layers[0] < 1:
        parser.error(f"--layers must be integers >= 1, comma-separated, got {args.layers!r}")
    args.paths = [p for p in args.paths.split(",") if p]
    if not args.paths or any(p not in PATHS for p in args.paths) or len(set(args.paths)) < len(args.paths):
        parser.error(f"--paths must name some of {', '.join(PATHS)} once each, got {','.join(args.paths)!r}")
    args.layouts = [x for x in args.layouts.split(",") if x]
    if not args.layouts or any(x not in LAYOUTS for x in args.layouts) or len(set(args.layouts)) < len(args.layouts):
        parser.error(f"--layouts must name some of {', '.join(LAYOUTS)} once each, got {','.join(args.layouts)!r}")
    if "scan" in args.layouts and args.layers[0] < 2:
        parser.error(f"--layers must be >= 2 with the scan layout (a stack needs two blocks), got {args.layers[0]}")
    if args.dim % args.heads:
        parser.error(f"--dim must be a multiple of --heads, got {args.dim} and {args.heads}")
    if args.batch > args.records:
        parser.error(f"--batch must be <= --records, got {args.batch} > {args.records}")
    import jax

    from _common import machine_info
    from snapaudit_jax.utils.io import write_json

    # Real compilations: a persistent compilation cache (JAX_COMPILATION_CACHE_DIR) would load them instead.
    jax.config.update("jax_enable_compilation_cache", False)
    start = time.perf_counter()
    result = machine_info()
    result.update(benchmark(args))
    result["wall_seconds_total"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result) if args.json else readable(result), flush=True)
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
