"""Command line: ``snapaudit`` / ``python -m snapaudit_jax``.

Thin layer: flags -> :class:`~snapaudit_jax.runner.SimulateConfig` ->
:func:`~snapaudit_jax.runner.run_simulate`. Output files are written only after
every audit succeeded, and atomically. Exit status (see
:mod:`snapaudit_jax.utils.errors`): 0 done; 2 bad input (the message names the
flag or ``section.key``), a missing dependency, or an operating-system error
(disk, permissions); 3 a refuted claim under ``--fail-on-violation``; 1 an
internal bug, printed with its traceback.
"""

from __future__ import annotations

import argparse
import math
import sys

from snapaudit_jax.utils.errors import InputError

__all__ = ["main", "build_parser"]

from snapaudit_jax.utils.io import dumps
from snapaudit_jax.utils.errors import EXIT_BUG, EXIT_INPUT, EXIT_OK, EXIT_VIOLATION, SnapAuditError

EXIT_USAGE = EXIT_INPUT  # argparse's own errors share the bad-input status


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: same status as ours
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="snapaudit", description="Active (snapshot) auditing of DP in-context learning mechanisms.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    s = sub.add_parser(
        "simulate",
        help="audit PV/PoE/ESA/KSA from clean outputs by simulating DP-noise trials",
        description=(
            "Audit one DP-ICL mechanism at one or more claimed epsilons. Clean outputs come from --clean-with/"
            "--clean-without (fixed neighbouring outputs), the ESA shorthand --distance/--dim/--partitions, or a "
            "--snapshot .npz file of LLM draws. Prints a table, or with --json a list with one object per epsilon."
        ),
    )
    s.add_argument("--mechanism", required=True, choices=("pv", "poe", "esa", "ksa"))
    s.add_argument("--epsilon", default="1,2,4,8,16", help="claimed epsilons, comma-separated (default 1,2,4,8,16)")
    s.add_argument("--delta", type=float, default=1e-5, help="claimed delta (default 1e-5)")
    s.add_argument("--threat", choices=("black", "white"), default="black")
    s.add_argument("--calibration", choices=("analytic", "classical"), default="analytic",
                   help="Gaussian noise calibration for pv/esa")
    s.add_argument("--sensitivity", type=float, default=None,
                   help="force the sensitivity (defaults: pv sqrt(2), esa 2/T, poe the clip, ksa 2)")
    s.add_argument("--clean-with", default=None, help="clean output with the canary, e.g. 1,2")
    s.add_argument("--clean-without", default=None, help="clean output without the canary, e.g. 0,3")
    s.add_argument("--snapshot", default=None, help=".npz with arrays 'with', 'without' (and 'candidates' for esa)")
    s.add_argument("--distance", type=float, default=None, help="esa: distance of the two unit signal vectors")
    s.add_argument("--dim", type=int, default=None, help="esa: embedding dimension (default 384)")
    s.add_argument("--partitions", type=int, default=None, help="esa: number of partitions T (default 1)")
    s.add_argument("--clip", type=float, default=None, help="poe: clip Gamma (default 5)")
    s.add_argument("--top-k", type=int, default=None, help="ksa: number of selected keywords K (default 4)")
    s.add_argument("--target", type=int, default=None, help="release signalling 'canary present'")
    s.add_argument("--trials", type=int, default=1_000_000, help="DP-noise trials per hypothesis")
    s.add_argument("--snapshots", type=int, default=2000, help="n_llm: copies of the given clean outputs")
    s.add_argument("--confidence", type=float, default=0.95)
    s.add_argument("--method", choices=("simulate", "exact", "paper"), default="simulate",
                   help="paper: SnapAudit App. C.2's radius, a heuristic that never flags a violation")
    s.add_argument("--estimator", choices=("gdp", "std"), default=None,
                   help="std (default): assumption-free (eps, delta) bound; gdp: also audits the mu-GDP claim "
                        "mu = sensitivity/sigma of pv/esa (refused for poe/ksa, which claim no mu)")
    s.add_argument("--clean", choices=("auto", "fixed", "sampled"), default="auto",
                   help="fixed: clean outputs known exactly; sampled: i.i.d. LLM draws (auto: fixed for vectors, "
                        "sampled for --snapshot)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--curve-points", type=int, default=None,
                   help="white-box: thresholds of the certified trade-off curve, fixed on selection data (default "
                        "24; 0: none; simulation counts every one, so it costs throughput)")
    s.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    s.add_argument("--plot", default=None, metavar="FILE.png",
                   help="plot eps_emp against eps_theory (format from the suffix: .png, .pdf, .svg, ...)")
    s.add_argument("--out", default=None, metavar="FILE.json", help="write the full results (all fields)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--fail-on-violation", action="store_true",
                   help=f"exit with status {EXIT_VIOLATION} if a claim is violated, family-wise over the epsilons "
                        "(Holm at 1 - confidence); with --estimator gdp the mu-GDP claims count too")

    _config_command(
        sub, "audit", "quickstart.toml",
        help="run real DP-ICL audits from a TOML config (phase A on the LLM, active and passive audits)",
        description="Audit DP-ICL pipelines on a language model as configured in CONFIG.toml (see "
                    "examples/quickstart.toml); writes results.json, results_full.json, table.md and PNG plots.",
    )
    _config_command(
        sub, "cpa", "cpa_synthetic.toml",
        help="conformal privacy audit of re-identification attackers (certified ambiguity sets)",
        description="Calibrates the declared attackers of CONFIG.toml on each linkage suite and writes "
                    "summary.json, report.md, per-document JSONL and plots to the output folder.",
    )
    _config_command(
        sub, "pii", "pii_small.toml",
        help="PII leakage of a small GPT-2 trained undefended, with DP-SGD, scrubbed and both",
        description="Trains the four variants of CONFIG.toml on a synthetic PII corpus, runs the extraction, "
                    "reconstruction, inference, membership and canary attacks, and writes results.json, "
                    "results_full.json, table.md and leakage.png to the output folder (a rerun resumes).",
    )

    g = sub.add_parser("generate", help="generate text with a Flax language model")
    g.add_argument("--model", default="smollm2", help="smollm2, a .gguf file or a Hugging Face folder")
    g.add_argument("--prompt", required=True)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=None, help="sample at this temperature (default: greedy)")
    g.add_argument("--seed", type=int, default=None, help="PRNG seed for sampling (required with --temperature)")
    g.add_argument("--allow-pickle", action="store_true", help="accept pickle checkpoints (.bin/.pt)")
    g.add_argument("--json", action="store_true")

    e = sub.add_parser("embed", help="sentence embeddings (L2-normalised) with a Flax BERT encoder")
    e.add_argument("--model", default="minilm", help="minilm or a Hugging Face BERT folder")
    e.add_argument("--text", action="append", required=True, help="a text (repeat for several)")
    e.add_argument("--allow-pickle", action="store_true")
    e.add_argument("--json", action="store_true")
    return parser


def _config_command(sub, name: str, example: str, **kwargs) -> None:
    """A ``snapaudit NAME CONFIG.toml [--out DIR] [--quiet]`` sub-command."""
    p = sub.add_parser(name, **kwargs)
    p.add_argument("config", help=f"TOML configuration (see examples/{example})")
    p.add_argument("--out", default=None, help="output folder (default: runs/<config name>)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _run_config(args, load, run, report: str):
    """Loads ``args.config``, runs it into ``--out`` (default ``runs/<config name>``), prints ``report``."""
    import os

    from snapaudit_jax.utils.io import check_output_dir

    config = load(args.config)
    out = args.out or os.path.join("runs", os.path.splitext(os.path.basename(args.config))[0])
    check_output_dir("--out", out)  # before any work: nothing is created if it could not be written
    result = run(config, out, progress=not args.quiet)
    with open(os.path.join(out, report)) as fh:
        print(fh.read())
    return result


def _config_from_args(args):
    from snapaudit_jax.runner import SimulateConfig, parse_vector

    return SimulateConfig(
        mechanism=args.mechanism,
        epsilons=parse_vector("--epsilon", args.epsilon),
        delta=args.delta,
        threat=args.threat,
        calibration=args.calibration,
        sensitivity=args.sensitivity,
        clean_with=None if args.clean_with is None else parse_vector("--clean-with", args.clean_with),
        clean_without=None if args.clean_without is None else parse_vector("--clean-without", args.clean_without),
        snapshot=args.snapshot,
        distance=args.distance,
        dim=args.dim,
        partitions=args.partitions,
        clip=args.clip,
        top_k=args.top_k,
        target=args.target,
        trials=args.trials,
        snapshots=args.snapshots,
        confidence=args.confidence,
        method=args.method,
        estimator=args.estimator,
        clean=args.clean,
        seed=args.seed,
        **({} if args.curve_points is None else {"curve_points": args.curve_points}),
    ).validate()


def _name_flag(message: str) -> str:
    """Prefixes a library message that starts with a config field by its flag."""
    import dataclasses

    from snapaudit_jax.runner import SimulateConfig

    fields = {f.name for f in dataclasses.fields(SimulateConfig)} | {"epsilon"}
    head = message.split(" ", 1)[0].rstrip(":")
    if head in fields:
        return f"--{head.replace('_', '-')}: {message}"
    return message


def _fmt(x, spec):
    return f"{x:{spec}}" if isinstance(x, (int, float)) and math.isfinite(x) else str(x)


def format_table(results) -> str:
    """The ``snapaudit simulate`` table: one row per claimed epsilon, then labels, warnings and assumptions."""
    r0 = results[0]
    gdp = r0.estimator == "gdp" and any(r.mu_claim is not None for r in results)
    curve = any(r.epsilon_curve is not None for r in results)
    several = len(results) > 1
    head = (
        f"mechanism={r0.mechanism} threat={r0.threat} method={r0.method} estimator={r0.estimator} "
        f"clean={r0.clean} delta={r0.delta:g} confidence={r0.confidence:g} trials/hyp={r0.trials:,} "
        f"snapshots={r0.snapshots:,}"
    )
    cols = f"{'eps_theory':>10} {'eps_emp':>9} {'mu_emp':>8} {'TPR_hat':>10} {'FPR_hat':>10} {'TPR_low':>10} " \
           f"{'FPR_up':>10} {'violation':>9}"
    if several:
        cols += f" {'holm':>5}"
    if gdp:
        cols += f" {'mu_claim':>8} {'mu_viol':>7} {'eps_env':>8}"
    if curve:
        cols += f" {'eps_curve':>9}"
    cols += f" {'seconds':>8}"
    lines = [head, cols]
    for r in results:
        line = (
            f"{_fmt(r.epsilon_theory, '10.3g')} {_fmt(r.epsilon_emp, '9.3f')} {_fmt(r.mu_emp, '8.3f')} "
            f"{_fmt(r.tpr_hat, '10.4g')} {_fmt(r.fpr_hat, '10.4g')} {_fmt(r.tpr_low, '10.4g')} "
            f"{_fmt(r.fpr_up, '10.4g')} {('YES' if r.violation else 'no'):>9}"
        )
        if several:
            line += f" {('YES' if r.familywise_violation else 'no'):>5}"
        if gdp:
            line += (f" {_fmt(r.mu_claim, '8.3f')} {('YES' if r.mu_violation else 'no'):>7} "
                     f"{_fmt(r.epsilon_gdp, '8.3f')}")
        if curve:
            line += f" {_fmt(r.epsilon_curve, '9.3f')}"
        lines.append(line + f" {_fmt(r.seconds, '8.2f')}")
    if r0.heuristic:
        lines.append("note: method=paper is SnapAudit's heuristic radius: eps_emp is not certified and no violation "
                     "is flagged")
    elif any(r.epsilon_profile is not None for r in results):
        lines.append("eps_emp: the exact privacy profile eps(delta) of the release for the audited pair")
    else:
        lines.append("eps_emp: (eps, delta) lower bound at the stated confidence"
                     + (" (GDP conversion: the release is Gaussian by construction)"
                        if any(r.gaussian_by_construction for r in results) else " (assumption-free)"))
    if several:
        lines.append("holm: violation family-wise over the rows (Holm at 1 - confidence); each row uses its own "
                     "key stream")
    if gdp:
        lines.append(f"mu_viol: mu_emp > mu_claim (the mu-GDP claim); eps_env: {r0.epsilon_gdp_label}")
    if curve:
        lines.append("eps_curve: max over the certified trade-off curve's grid (Bonferroni over the grid; "
                     "full curve in --out, drawn by --plot)")
    for w in sorted({w for r in results for w in r.warnings}):
        lines.append(f"warning: {w}")
    lines.append(f"assumptions: {r0.assumptions}")
    return "\n".join(lines)


def _simulate(args) -> int:
    import warnings

    from snapaudit_jax.runner import run_simulate
    from snapaudit_jax.utils.io import PLOT_FORMATS, check_output_file, write_json

    config = _config_from_args(args)
    # Every output is checked before the audits run: a bad path costs nothing and writes nothing.
    if args.out is not None:
        check_output_file("--out", args.out, ("json",))
    if args.plot is not None:
        check_output_file("--plot", args.plot, PLOT_FORMATS)
        from snapaudit_jax.plotting import _pyplot

        _pyplot()  # fail before the audits if matplotlib is missing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # surfaced in the table / JSON instead
        results = run_simulate(config, progress=not args.quiet and not args.json)
    if args.json:
        print(dumps([r.summary() for r in results]))
    else:
        print(format_table(results))
    if args.out is not None:
        write_json(args.out, [r.to_dict() for r in results])
    if args.plot is not None:
        from snapaudit_jax.plotting import plot_epsilon

        label = f"{config.mechanism} {config.threat}-box, {config.method}"
        plot_epsilon(args.plot, {label: results}, title=f"{config.mechanism}: calibration={config.calibration}",
                     curves=results)
    if args.fail_on_violation and any(r.familywise_violation or r.mu_familywise_violation for r in results):
        return EXIT_VIOLATION
    return EXIT_OK


def _audit(args) -> int:
    from snapaudit_jax.experiment import load_config, run_audit

    result = _run_config(args, load_config, run_audit, "table.md")
    if result["mia"]:
        print(f"MIA AUC rows: {len(result['mia']['rows'])} (mia.json)")
    return EXIT_OK


def _cpa(args) -> int:
    from conformal.runner import load_cpa_config, run_cpa

    _run_config(args, load_cpa_config, run_cpa, "report.md")
    return EXIT_OK


def _pii(args) -> int:
    from attacks.experiment import load_pii_config, run_pii

    _run_config(args, load_pii_config, run_pii, "table.md")
    return EXIT_OK


def _generate(args) -> int:
    import time

    import jax

    from snapaudit_jax.models import load_language_model

    if args.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.temperature is not None and args.seed is None:
        raise InputError("--seed is required with --temperature (sampling needs an explicit key)")
    if args.temperature is not None and not 0 < args.temperature < math.inf:
        raise InputError(f"--temperature must be a finite number > 0, got {args.temperature}")
    if not args.prompt.strip():
        raise InputError("--prompt must not be empty")
    lm = _load_model(load_language_model, args)
    prompt = lm.chat_prompt(args.prompt) if args.chat else args.prompt
    n_prompt = len(lm.tokenizer.encode(prompt))
    if n_prompt + args.max_new_tokens > lm.max_length:
        raise InputError(f"--max-new-tokens: the prompt's {n_prompt} tokens plus {args.max_new_tokens} new tokens "
                         f"exceed the model's {lm.max_length} positions (at most {lm.max_length - n_prompt} here), "
                         f"got {args.max_new_tokens}")
    start = time.perf_counter()
    key = None if args.seed is None else jax.random.key(args.seed)
    gen = lm.generate([prompt], max_new_tokens=args.max_new_tokens, temperature=args.temperature, key=key)[0]
    seconds = time.perf_counter() - start
    if args.json:
        print(dumps({"model": args.model, "text": gen.text, "token_ids": list(gen.token_ids),
                          "seconds": seconds}))
    else:
        print(gen.text)
    return EXIT_OK


def _load_model(load, args):
    """``load(--model)``; a checkpoint that cannot be loaded names the flag."""
    if not args.model.strip():
        raise InputError(f"--model must name a model, a .gguf file or a checkpoint folder, got {args.model!r}")
    try:
        return load(args.model, allow_pickle=args.allow_pickle)
    except (ValueError, OSError) as err:
        raise InputError(f"--model: {err}") from None


def _embed(args) -> int:
    from snapaudit_jax.models import load_embedder

    for i, text in enumerate(args.text):
        if not text.strip():
            raise InputError(f"--text must not be empty, got {text!r} (text {i + 1})")
    embedder = _load_model(load_embedder, args)
    vectors = embedder.embed(args.text)
    if args.json:
        print(dumps({"model": args.model, "embeddings": vectors.astype(float).tolist()}))
    else:
        for text, v in zip(args.text, vectors):
            print(f"{text[:40]!r}: dim {v.size}, first {v[:4].round(4).tolist()}")
    return EXIT_OK


_COMMANDS = {"simulate": _simulate, "audit": _audit, "cpa": _cpa, "pii": _pii, "generate": _generate, "embed": _embed}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from snapaudit_jax.utils.platform import use_all_cpu_cores

    use_all_cpu_cores()
    try:
        return _COMMANDS[args.command](args)
    except SnapAuditError as err:
        message = _name_flag(str(err)) if args.command == "simulate" else str(err)  # its fields are its flags
        print(f"snapaudit {args.command}: error: {message}", file=sys.stderr)
        return err.exit_code
    except OSError as err:  # the environment (a full disk, a permission), not the program
        print(f"snapaudit {args.command}: error: {err}", file=sys.stderr)
        return EXIT_INPUT
    except Exception:  # anything else is a bug: say so, with the traceback
        import traceback

        traceback.print_exc()
        print(f"snapaudit {args.command}: internal error (a bug in snapaudit-jax; the traceback above locates it)",
              file=sys.stderr)
        return EXIT_BUG


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
