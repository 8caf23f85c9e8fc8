"""Command line: ``snapaudit`` / ``python -m snapaudit_jax``.

Thin layer: flags -> :class:`~snapaudit_jax.audits.command.SimulateConfig` ->
:func:`~snapaudit_jax.audits.command.run_simulate`. Output files are written only after
every audit succeeded, and atomically. Exit status (see
:mod:`snapaudit_jax.utils.errors`): 0 done; 2 bad input (the message names the
flag or ``section.key``), a missing dependency, or an operating-system error
(disk, permissions); 3 a refuted claim under ``--fail-on-violation``; 1 an
internal bug, printed with its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys


__all__ = ["main", "build_parser"]

from snapaudit_jax.utils.io import dumps
from snapaudit_jax.utils.errors import EXIT_BUG, EXIT_INPUT, EXIT_OK, EXIT_VIOLATION, SnapAuditError
from snapaudit_jax.utils.secrets import redact

# The registry's built-in names, spelled here so that `snapaudit --help` needs no JAX import; a test checks
# they equal snapaudit_jax.mechanisms.names().
BUILT_IN_MECHANISMS = ("pv", "poe", "esa", "ksa")
EXIT_USAGE = EXIT_INPUT  # argparse's own errors share the bad-input status


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: same status as ours
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="snapaudit", description=(
        "Auditing and guaranteeing the privacy of LLM pipelines: snapshot audits of DP in-context learning, "
        "conformal re-identification audits, PII leakage of fine-tuned models, DP fine-tuning."))
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
    s.add_argument("--mechanism", required=True, choices=BUILT_IN_MECHANISMS)
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
    s.add_argument("--out", default=None, metavar="FILE.json",
                   help="write the full results (all fields), and their HTML report as FILE.html beside it")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--strict-neighbours", action="store_true",
                   help="refuse clean outputs farther apart than the sensitivity (default: audit them with a warning)")
    s.add_argument("--fail-on-violation", action="store_true",
                   help=f"exit with status {EXIT_VIOLATION} if a claim is violated, family-wise over the epsilons "
                        "(Holm at 1 - confidence); with --estimator gdp the mu-GDP claims count too")

    for command in _config_commands().values():
        p = sub.add_parser(command.name, help=command.help, description=command.description)
        p.add_argument("config", help=f"TOML configuration (see examples/{command.example})")
        p.add_argument("--out", default=None, help="output folder (default: runs/<config name>)")
        p.add_argument("--quiet", action="store_true", help="no progress on stderr")
        if command.plan:
            p.add_argument("--plan", action="store_true", help="print the run's plan and write nothing")

    r = sub.add_parser("report", help="(re)write a finished run's report.html from its files",
                       description="Renders the self-contained HTML report of a finished run folder (audit, cpa, "
                                   "pii, finetune) from the files the run wrote, and prints its path.")
    r.add_argument("run_dir", metavar="RUN_DIR", help="the run folder")
    r.add_argument("--out", default=None, metavar="FILE.html", help="write here instead (default RUN_DIR/report.html)")

    g = sub.add_parser("generate", help="generate text with a Flax language model")
    g.add_argument("--model", default="smollm2",
                   help="smollm2, a .gguf file, a Hugging Face folder, or openai (an OpenAI-compatible server)")
    g.add_argument("--prompt", required=True)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=None, help="sample at this temperature (default: greedy)")
    g.add_argument("--seed", type=int, default=None, help="PRNG seed for sampling (required with --temperature)")
    g.add_argument("--allow-pickle", action="store_true", help="accept pickle checkpoints (.bin/.pt)")
    g.add_argument("--base-url", default=None, help="with --model openai: the server's URL (no credentials)")
    g.add_argument("--server-model", default=None, help="with --model openai: the served model's id")
    g.add_argument("--api-key-env", default=None, help="with --model openai: environment variable of the API key")
    g.add_argument("--tokenizer", default="smollm2",
                   help="with --model openai: the served model's tokenizer (smollm2, a .gguf file or a folder)")
    g.add_argument("--json", action="store_true")

    e = sub.add_parser("embed", help="sentence embeddings (L2-normalised) with a Flax BERT encoder")
    e.add_argument("--model", default="minilm", help="minilm or a Hugging Face BERT folder")
    e.add_argument("--text", action="append", required=True, help="a text (repeat for several)")
    e.add_argument("--allow-pickle", action="store_true")
    e.add_argument("--json", action="store_true")
    return parser


def _config_commands() -> dict:
    """``audit`` (built in), then the commands of the ``snapaudit.commands`` entry points (``cpa``, ``pii``)."""
    from snapaudit_jax.dpicl.command import COMMAND as AUDIT
    from snapaudit_jax.finetune.command import COMMAND as FINETUNE
    from snapaudit_jax.utils.commands import discover

    built_in = {AUDIT.name: AUDIT, FINETUNE.name: FINETUNE}
    return {**built_in, **{name: c for name, c in discover().items() if name not in built_in}}


def _run_config(args) -> int:
    """``snapaudit NAME CONFIG.toml``: load, run into ``--out``, print the report (and the command's summary)."""
    from snapaudit_jax.utils.commands import default_out, resolve, run_command
    from snapaudit_jax.utils.quiet import quiet_libraries

    command = _config_commands()[args.command]
    if getattr(args, "plan", False):
        with quiet_libraries(args.quiet):
            print(resolve(command.plan)(resolve(command.load)(args.config)))
        return EXIT_OK
    with quiet_libraries(args.quiet):  # --quiet: nothing from the libraries either
        result, report = run_command(command, args.config, args.out, progress=not args.quiet)
        from snapaudit_jax.report.html import write_report

        # report.html, from the files the run wrote (`snapaudit report OUT` writes it again)
        write_report(args.out or default_out(args.config))
    print(report)
    line = resolve(command.summary)(result) if command.summary else None
    if line:
        print(line)
    return EXIT_OK


def _config_from_args(args):
    from snapaudit_jax.audits.command import SimulateConfig, parse_vector

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
        strict_neighbours=args.strict_neighbours,
        **({} if args.curve_points is None else {"curve_points": args.curve_points}),
    ).validate()


def _name_flag(message: str) -> str:
    """Prefixes a library message that starts with a config field by its flag."""
    import dataclasses

    from snapaudit_jax.audits.command import SimulateConfig

    fields = {f.name for f in dataclasses.fields(SimulateConfig)} | {"epsilon"}
    head = message.split(" ", 1)[0].rstrip(":")
    if head in fields:
        return f"--{head.replace('_', '-')}: {message}"
    return message


def _simulate(args) -> int:
    import warnings

    from snapaudit_jax.audits.command import run_simulate
    from snapaudit_jax.utils.io import PLOT_FORMATS, check_output_file, write_json

    config = _config_from_args(args)
    # Every output is checked before the audits run: a bad path costs nothing and writes nothing.
    if args.out is not None:
        check_output_file("--out", args.out, ("json",))
        check_output_file("--out", os.path.splitext(args.out)[0] + ".html", ("html",))  # its report, beside it
    if args.plot is not None:
        check_output_file("--plot", args.plot, PLOT_FORMATS)
        from snapaudit_jax.report import pyplot

        pyplot()  # fail before the audits if matplotlib is missing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # surfaced in the table / JSON instead
        results = run_simulate(config, progress=not args.quiet and not args.json)
    from snapaudit_jax.report import format_table

    if args.json:
        print(dumps([r.summary() for r in results]))
    else:
        print(format_table(results))
    if args.out is not None:
        write_json(args.out, [r.to_dict() for r in results])
        from snapaudit_jax.report.html import write_report

        folder, name = os.path.split(os.path.abspath(args.out))
        write_report(folder, os.path.splitext(os.path.abspath(args.out))[0] + ".html", results_file=name,
                     title=f"snapaudit simulate: {config.mechanism} ({config.threat}-box, {config.method})",
                     figures=_simulate_figures(config, results),
                     markdown=f"```\n{format_table(results)}\n```")
    if args.plot is not None:
        from snapaudit_jax.report.plots import plot_epsilon

        label = f"{config.mechanism} {config.threat}-box, {config.method}"
        plot_epsilon(args.plot, {label: results}, title=f"{config.mechanism}: calibration={config.calibration}",
                     curves=results)
    if args.fail_on_violation and any(r.familywise_violation or r.mu_familywise_violation for r in results):
        return EXIT_VIOLATION
    return EXIT_OK


def _generate(args) -> int:
    from snapaudit_jax.models.command import generate_text

    server = {k: v for k, v in (("base_url", args.base_url), ("model", args.server_model),
                                ("api_key_env", args.api_key_env)) if v is not None}
    out = generate_text(args.model, args.prompt, chat=args.chat, max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, seed=args.seed, allow_pickle=args.allow_pickle,
                        server=server or None, tokenizer=args.tokenizer)
    print(dumps(out) if args.json else out["text"])
    return EXIT_OK


def _embed(args) -> int:
    from snapaudit_jax.models.command import embed_texts

    out = embed_texts(args.model, args.text, allow_pickle=args.allow_pickle)
    if args.json:
        print(dumps({"model": out["model"], "embeddings": out["embeddings"].astype(float).tolist()}))
    else:
        for text, v in zip(args.text, out["embeddings"]):
            print(f"{text[:40]!r}: dim {v.size}, first {v[:4].round(4).tolist()}")
    return EXIT_OK


def _simulate_figures(config, results) -> list[tuple[bytes, str]]:
    """The report's figure of a simulate run: the bounds against the claims (and the certified trade-off curves of
    white-box results), as SVG; none without matplotlib (the page then has the tables only)."""
    import tempfile

    try:
        from snapaudit_jax.report.plots import plot_epsilon, pyplot

        pyplot()
    except SnapAuditError:
        return []
    label = f"{config.mechanism} {config.threat}-box, {config.method}"
    with tempfile.TemporaryDirectory(prefix="snapaudit-report-") as scratch:
        path = os.path.join(scratch, "epsilon.svg")
        plot_epsilon(path, {label: results}, title=f"{config.mechanism}: calibration={config.calibration}",
                     curves=results)
        with open(path, "rb") as fh:
            return [(fh.read(), "epsilon lower bounds against the claims (and certified trade-off curves)")]


def _report(args) -> int:
    from snapaudit_jax.report.html import REPORT_FILE, write_report
    from snapaudit_jax.utils.io import check_output_file

    out = args.out or os.path.join(args.run_dir, REPORT_FILE)
    if args.out is not None:
        check_output_file("--out", args.out, ("html",))
    print(write_report(args.run_dir, out))
    return EXIT_OK


_COMMANDS = {"simulate": _simulate, "generate": _generate, "embed": _embed, "report": _report}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from snapaudit_jax.utils.platform import use_all_cpu_cores

    use_all_cpu_cores()
    try:
        return _COMMANDS.get(args.command, _run_config)(args)
    except SnapAuditError as err:
        message = _name_flag(str(err)) if args.command == "simulate" else str(err)  # its fields are its flags
        print(f"snapaudit {args.command}: error: {redact(message)}", file=sys.stderr)
        return err.exit_code
    except OSError as err:  # the environment (a full disk, a permission), not the program
        print(f"snapaudit {args.command}: error: {redact(str(err))}", file=sys.stderr)
        return EXIT_INPUT
    except Exception:  # anything else is a bug: say so, with the traceback
        import traceback

        print(redact(traceback.format_exc()), end="", file=sys.stderr)
        print(f"snapaudit {args.command}: internal error (a bug in snapaudit-jax; the traceback above locates it)",
              file=sys.stderr)
        return EXIT_BUG


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
