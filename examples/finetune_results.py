"""The DP fine-tuning table of docs/finetune.md: ``examples/finetune_small.toml`` at epsilon 1, 3 and 8, beside its baseline.

Usage::

    python examples/finetune_results.py [--config examples/finetune_small.toml] [--runs runs/finetune_results]
        [--epsilons 1 3 8] [--out FILE.json]

Each epsilon is a full ``snapaudit finetune`` run of the configuration with ``privacy.target_epsilon`` replaced,
in its own run folder ``RUNS/eps<epsilon>`` (so every run resumes after an interruption). The non-private
baseline does not depend on epsilon (same data, model, steps, Poisson batches, seed and LoRA initialisation), so
it is trained once, in the run of the largest epsilon. The table: held-out perplexity of the base, the baseline
and each private model; the exposure of the inserted canaries (median and max, bits); the greedy canary
extraction rate; and the one-run epsilon lower bound (95%) from the same canaries. ``--out`` writes the rows as
JSON (atomically).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from snapaudit_jax.finetune.config import load_finetune_config
from snapaudit_jax.finetune.run import run_finetune
from snapaudit_jax.utils.io import write_json

HERE = os.path.dirname(os.path.abspath(__file__))


def _row(name: str, model: dict, claim: dict | None) -> dict:
    can = model.get("canaries") or {}
    exp, ext, one = can.get("exposure") or {}, can.get("extraction") or {}, can.get("one_run") or {}
    return {
        "model": name,
        "epsilon": None if claim is None else claim["epsilon"],
        "delta": None if claim is None else claim["delta"],
        "held_out_perplexity": model["held_out_perplexity"],
        "exposure_median": exp.get("median_inserted"),
        "exposure_max": exp.get("max_inserted"),
        "exposure_max_possible": exp.get("max_possible"),
        "greedy_extraction": ext.get("greedy_inserted"),
        "one_run_epsilon_lower_bound": one.get("epsilon"),
    }


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def markdown(rows: list[dict]) -> str:
    """The table of docs/finetune.md."""
    lines = ["| model | (epsilon, delta) | held-out perplexity | canary exposure, median / max (bits) | greedy "
             "extraction | one-run epsilon lower bound (95%) |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        claim = "not private" if r["epsilon"] is None else f"({r['epsilon']:.3g}, {r['delta']:.2g})"
        if r["model"] == "base":
            claim = "public base, not fine-tuned"
        lines.append(f"| {r['model']} | {claim} | {r['held_out_perplexity']:.3f} | "
                     f"{_fmt(r['exposure_median'], '.2f')} / {_fmt(r['exposure_max'], '.2f')} | "
                     f"{_fmt(r['greedy_extraction'], '.2f')} | {_fmt(r['one_run_epsilon_lower_bound'], '.3f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", default=os.path.join(HERE, "finetune_small.toml"))
    parser.add_argument("--runs", default="runs/finetune_results")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 8.0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if any(not e > 0 for e in args.epsilons) or len(set(args.epsilons)) != len(args.epsilons):
        parser.error(f"--epsilons must be distinct positive numbers, got {args.epsilons}")
    base = load_finetune_config(args.config)
    epsilons = sorted(args.epsilons)
    cards = {}
    for eps in epsilons:
        config = dataclasses.replace(base, baseline=eps == epsilons[-1],
                                     privacy=dataclasses.replace(base.privacy, target_epsilon=eps,
                                                                 noise_multiplier=0.0))
        out = os.path.join(args.runs, f"eps{eps:g}")
        print(f"epsilon {eps:g} -> {out}", file=sys.stderr, flush=True)
        cards[eps] = run_finetune(config, out)
    last = cards[epsilons[-1]]
    rows = [_row("base", last["models"]["base"], None)]
    if "baseline" in last["models"]:
        rows.append(_row("baseline", last["models"]["baseline"], None))
    rows += [_row(f"DP, epsilon {eps:g}", cards[eps]["models"]["private"], cards[eps]["claim"]) for eps in epsilons]
    print(markdown(rows))
    if args.out:
        write_json(args.out, {"config": os.path.relpath(args.config), "rows": rows,
                              "steps": last["dpsgd"]["steps"], "units": last["dpsgd"]["units"],
                              "seconds": {f"{e:g}": cards[e]["seconds"] for e in epsilons}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
