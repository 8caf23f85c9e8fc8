"""The report card of a ``snapaudit finetune`` run: ``report.json`` and ``report.md``.

It holds every item of a credible DP-SGD report (the DP-for-LLMs source document, "What the accountant must
know"): the protected unit and adjacency, ``N``, ``q``, the expected batch, the steps, the clip norm, sigma,
``(epsilon, delta)`` by each accountant, the sampling actually run, the records truncated, the per-user cap, and
every other data-dependent release with its privacy status (the non-private baseline, evaluations on private
data, the training history). Hyperparameters chosen by the user on this data are not accounted: the report
says so. With a ``[sweep]`` the claim is the whole search's epsilon, the rule is named, and the validation split
and (random stopping) the runs' record are listed as releases the accounting does not cover.
"""

from __future__ import annotations

import os
from typing import Any

from snapaudit_jax.utils.io import to_json, write_json, write_text

__all__ = ["build_report", "write_report", "format_report", "compare_models", "GOALS", "RELEASE_STATUS"]

GOALS = {"private_over_baseline_perplexity": 1.5, "private_over_base_perplexity": 0.5}
"""The scale run's goals (docs/finetune.md): the DP model's held-out perplexity at most 1.5x the non-private
twin's and at most half the base's. Printed by every run with a twin and a base, never asserted: a goal missed is
a result, not an error."""

RELEASE_STATUS = {
    "private_model": "(epsilon, delta)-DP for the protected unit (the accounted release)",
    "private_adapter": "(epsilon, delta)-DP: the adapter is part of the private model's parameters",
    "private_canary_results": "post-processing of the private model on synthetic canaries: covered",
    "baseline_model": "NOT private: trained without clipping or noise; for comparison only, never release it",
    "baseline_evaluations": "NOT private: computed from the non-private baseline",
    "held_out_evaluations": "NOT covered: computed without noise from private held-out records",
    "training_history": "NOT covered: per-step losses and gradient norms computed without noise",
    "base_evaluations": "NOT covered: the public base model scored on private held-out records",
    "private_state": ("private state, never release it: whoever holds the run key or a checkpoint's optimizer "
                      "state can replay the noise, and the guarantee no longer holds against them"),
}
SEED_WARNING = ("the batches and the noise were drawn from [run] noise_seed = {seed}: the run is replayable, and "
                "the (epsilon, delta) guarantee holds only while that seed stays secret. Remove noise_seed for a "
                "secret key from the operating system's entropy.")


def build_report(prep, trainings: dict[str, tuple[dict, dict]], evaluations: dict[str, dict],
                 exports: dict[str, str], *, seconds: float | None,
                 sweep: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report card's dictionary.

    Args:
      prep: the :class:`~snapaudit_jax.finetune.run.Prepared` run.
      trainings: ``{"private" | "baseline": (history, DP report dict)}``.
      evaluations: ``{"base" | "private" | "baseline": evaluation}``.
      exports: the exported folders.
      seconds: the run's wall time (``None``: withheld, as with random stopping, where it reveals ``K``).
      sweep: with a ``[sweep]``, its record (``sweep.json``): the runs, the selection, the accounting.

    Returns:
      The card (strict JSON).
    """
    cfg = prep.config
    dp = trainings["private"][1]
    stats = prep.data.stats
    unit = cfg.privacy.unit
    releases = [
        {"release": "private model" + (" (LoRA adapters on the unchanged public base)" if prep.lora else ""),
         "status": RELEASE_STATUS["private_model"]},
        {"release": "held-out perplexity of every model", "status": RELEASE_STATUS["held_out_evaluations"]},
        {"release": "training history (losses, gradient norms, clipped fractions, batch sizes)",
         "status": RELEASE_STATUS["training_history"]},
    ]
    if "baseline" in trainings:
        releases.insert(1, {"release": "non-private baseline model and its evaluations",
                            "status": RELEASE_STATUS["baseline_model"]})
    if prep.data.canaries is not None:
        releases.append({"release": "canary exposure, extraction and one-run bound of the private model",
                         "status": RELEASE_STATUS["private_canary_results"]})
    if sweep is None:
        releases.append({"release": "hyperparameters (learning rate, clip norm, steps) if chosen by trying them on "
                                    "this data", "status": "NOT accounted: choose them on public or synthetic data, "
                                    "or use a [sweep] (every trial accounted)"})
    else:
        acc = sweep["accounting"]
        releases.append({"release": "the selected hyperparameters (the sweep's choice on the validation split)",
                         "status": f"accounted: {acc['covered']}"})
        releases.append({"release": "the validation split's records (they decide which model is released)",
                         "status": "NOT covered: " + acc["not_covered"][0]})
        if sweep["rule"] == "random_stopping":
            releases.append({"release": "sweep.json: the number of runs K, every run's candidate, validation loss "
                                        "and checkpoints (checkpoints/sweep_<j>)",
                             "status": "NOT covered, and releasing any of it voids the random-stopping bound: "
                                       "keep it with the private data"})
        else:
            releases.append({"release": "every candidate's model (checkpoints/sweep_<j>) and validation loss",
                             "status": "models: covered by the composition; validation losses: NOT covered "
                                       "(validation split)"})
    releases.append({"release": "checkpoints/ (every training's checkpoints"
                                + (" and run_key.json, the run's secret key" if cfg.noise_seed is None else "")
                                + ")", "status": RELEASE_STATUS["private_state"]})
    if unit == "record" and cfg.data.user_field:
        releases.append({"release": "users with several records",
                         "status": "protected per record only: group privacy over a user's records"})
    lora = None if prep.lora is None else {"rank": prep.lora.rank, "alpha": prep.lora.alpha,
                                           "targets": list(prep.lora.resolved_targets(prep.lm.module.cfg))}
    models = {}
    for name in ("base", "private", "baseline"):
        if name not in evaluations:
            continue
        ev = evaluations[name]
        row = {"held_out_perplexity": ev["held_out"]["token_perplexity"],
               "held_out_loss": ev["held_out"]["token_loss"],
               "release": {"base": "public pretrained base", "private": "DP", "baseline": "NOT private"}[name]}
        if "canaries" in ev:
            row["canaries"] = ev["canaries"]
        models[name] = row
    claim_extra = {}
    if sweep is not None:
        acc = sweep["accounting"]
        rule = ("composition of every candidate's run (dp_accounting ComposedDpEvent, PLD and RDP)"
                if sweep["rule"] == "compose" else
                f"random stopping (Papernot & Steinke 2022, RDP): K ~ {acc['distribution']} runs, each on a uniformly "
                "drawn candidate, only the best released")
        claim_extra = {"epsilon": acc["epsilon"], "epsilon_pld": acc["epsilon_pld"], "epsilon_rdp": acc["epsilon_rdp"],
                       "accounted_epsilon": acc["epsilon"], "accounting_rule": f"hyperparameter sweep: {rule}",
                       "selected_run_epsilon_alone": dp["epsilon"]}
    sampler = _sampler_delta(dp, sweep, prep)
    card = {
        "command": "finetune",
        "claim": {
            "dp": dp["dp"],
            "epsilon": dp["epsilon"], "epsilon_pld": dp["epsilon_pld"], "epsilon_rdp": dp["epsilon_rdp"],
            "delta": None if dp["delta"] is None else dp["delta"] + sampler,
            "accountant_delta": dp["delta"], "sampler_delta": sampler, "noise": dp["noise"],
            "delta_rule": "given" if cfg.privacy.delta else "1 / (10 N)",
            "protected_unit": dp["protected_unit"], "unit": unit,
            "adjacency": f"add/remove one {unit}" + (" with all of their records" if unit == "user" else ""),
            "accounted_epsilon": dp["epsilon"],
            "accounting_rule": "one run: SelfComposed(PoissonSampled(q, Gaussian(sigma)), steps)",
            "randomness": dp["randomness"],
        },
        "dpsgd": {
            "units": prep.data.num_units, "sampling": "poisson (each unit independently, every step)",
            "sampling_rate": dp["sampling_rate"], "sampler_probability": dp["sampling_probability"],
            "expected_batch": dp["expected_batch_size"], "steps": dp["steps"], "clip_norm": dp["clip_norm"],
            "noise_multiplier": dp["noise_multiplier"], "calibration": prep.calibration,
            "optimizer": dp["optimizer"], "learning_rate": dp["learning_rate"],
            "clipping": dp["clipping"], "clipping_reason": dp["clipping_reason"],
            "clipped_sum_dtype": dp.get("clipped_sum_dtype", "float32"),
            "layers": dp["layers"], "layers_reason": dp["layers_reason"],
            "microbatch_size": dp["microbatch_size"],
            "tail_microbatch_size": dp.get("tail_microbatch_size") or dp["microbatch_size"],
            "accountants": dp["accountants"], "software": dp["software"],
        },
        "data": {**stats, "truncation": "a record longer than max_length is truncated, never split (a chat record "
                                       "trained on its answers: after its last whole answer, or left out)"},
        "method": {"kind": cfg.finetune.method, "base": cfg.model.base, "lora": lora},
        "models": models,
        "comparison": compare_models(models),
        "releases": releases,
        "exports": exports,
        "histories": {name: h for name, (h, _) in trainings.items()},
        "seconds": seconds,
    }
    if seconds is None:
        card["seconds_withheld"] = "random stopping: the run's duration depends on the private number of runs K"
    card["claim"].update(claim_extra)
    if cfg.noise_seed is not None:
        card["claim"]["warning"] = SEED_WARNING.format(seed=cfg.noise_seed)
    if sweep is not None:
        card["sweep"] = {
            "rule": sweep["rule"], "candidates": list(prep.sweep["candidates"]),
            "selected": {k: sweep["selected"][k] for k in ("candidate", "learning_rate", "clip_norm", "steps",
                                                            "validation_loss")},
            "validation_records": stats.get("validation_records"),
            "accounting": sweep["accounting"],
        }
        if sweep["rule"] == "compose":
            card["sweep"]["runs"] = sweep["runs"]
        else:
            card["sweep"]["runs"] = "in sweep.json only (keep private: releasing K or the other runs voids the bound)"
    return to_json(card)


def compare_models(models: dict[str, dict]) -> dict[str, Any] | None:
    """What DP cost in utility and bought in memorization: the private model against its twin and the base.

    Args:
      models: the card's ``models`` (``base``, ``private`` and, with a twin, ``baseline``).

    Returns:
      ``None`` without the three models; else each ratio of :data:`GOALS` with its goal and whether it is met,
      and, with canaries, the median exposure of the inserted canaries and of the held-out controls for the twin
      and for the private model (the twin memorised when its inserted canaries stand above its controls; the
      private model should not).
    """
    if not {"base", "private", "baseline"} <= set(models):
        return None
    ppl = {name: models[name]["held_out_perplexity"] for name in ("base", "private", "baseline")}
    out: dict[str, Any] = {"note": "goals of the scale examples (docs/finetune.md), printed, never asserted"}
    for name, goal in GOALS.items():
        ratio = ppl["private"] / ppl["baseline" if "baseline" in name else "base"]
        out[name] = {"ratio": ratio, "goal": goal, "met": bool(ratio <= goal)}
    exposure = {name: (models[name].get("canaries") or {}).get("exposure") for name in ("private", "baseline")}
    if all(exposure.values()):
        out["exposure_median_inserted"] = {name: exposure[name]["median_inserted"] for name in exposure}
        out["exposure_median_held_out"] = {name: exposure[name]["median_held_out"] for name in exposure}
    return out


def _num(x, fmt: str = ".4g") -> str:
    return "n/a" if x is None else format(x, fmt)


def _one_run_cell(one: dict[str, Any]) -> str:
    if one.get("epsilon") is None:
        return "n/a"
    level = f" ({100 * one['confidence']:.0f}%)" if one.get("confidence") is not None else ""
    return f"{one['epsilon']:.3f}{level}"


def _clipping_row(d: dict[str, Any]) -> str:
    """The report's clipping row: the path, its microbatch and why, and the clipped sum's operands."""
    m, t = d["microbatch_size"], d.get("tail_microbatch_size") or d["microbatch_size"]
    size = f"{m} units a microbatch" + (f" (a batch's remainder {t} at a time)" if t < m else "")
    path = f"{d['clipping'].replace('_', '-')}, {size} ({d['clipping_reason']})"
    if d.get("clipped_sum_dtype", "float32") == "float32":
        return f"| clipping (the same clipped sum either way, to float32 rounding) | {path} |"
    return (f"| clipping (each unit's share of the sum within the clip norm either way) | {path}; the sum's "
            f"products from {d['clipped_sum_dtype']} operands, the norms of the rounded factors, the clip factors "
            "leaving the margin of the weighted operand's split (about 1e-4 of a unit's norm) |")


def format_report(card: dict[str, Any]) -> str:
    """``report.md``: the claim, the DP-SGD parameters, the data, the models side by side, the releases.

    Args:
      card: :func:`build_report`'s dictionary.

    Returns:
      The Markdown text.
    """
    c, d, data = card["claim"], card["dpsgd"], card["data"]
    cal = d.get("calibration")
    lines = [
        "# DP fine-tuning report", "",
        f"**Claim:** ({_num(c['epsilon_pld'])}, {c['delta']:.3g})-DP by PLD, ({_num(c['epsilon_rdp'])}, "
        f"{c['delta']:.3g}) by RDP, for {c['protected_unit']}; adjacency: {c['adjacency']}.",
        f"Accounting rule: {c['accounting_rule']}; accounted epsilon of the released model: "
        f"{_num(c['accounted_epsilon'])}.",
        f"Randomness: {c['randomness']}.",
    ]
    if c.get("warning"):
        lines.append(f"**Warning:** {c['warning']}")
    lines += [
        "",
        "| item | value |", "|---|---|",
        f"| protected unit | {c['unit']} |",
        f"| N units | {d['units']} |",
        f"| sampling actually run | {d['sampling']}; q = {d['sampling_rate']:.6g} (sampler inclusion probability "
        f"{d['sampler_probability']:.6g}) |",
        f"| expected batch | {d['expected_batch']:.4g} |",
        f"| steps | {d['steps']} |",
        f"| clip norm C | {d['clip_norm']:g} |",
        f"| noise multiplier sigma | {d['noise_multiplier']:.6g}"
        + (f" (calibrated to epsilon {cal['target_epsilon']:g} with {cal['accountant']}, "
           f"{100 * cal['margin']:.2f}% below it)" if cal else " (given)") + " |",
        f"| delta | {c['delta']:.3g}: the accountants' {c['accountant_delta']:.3g} ({c['delta_rule']}) + "
        f"{c['sampler_delta']:.2g} for the noise sampler's finite tails |",
        _clipping_row(d),
        f"| layers (the same function either way, to float32 rounding) | {d.get('layers', 'unrolled')}"
        + (f" ({d['layers_reason']})" if d.get("layers_reason") else "") + " |",
        f"| records read / truncated to {data['max_length']} tokens | {data['records_read']} / "
        f"{data['records_truncated']} |",
        f"| training records / held-out records | {data['train_records']} / {data['held_out_records']} |",
        f"| tokens trained on | {data.get('train_on', 'every token')} |",
    ]
    if data.get("users") is not None:
        lines.append(f"| users / capped at {data['max_records_per_user']} records / records dropped by the cap | "
                     f"{data['users']} / {data['users_capped']} / {data['records_dropped_by_cap']} |")
        lines.append(f"| users appearing under several spellings (merged: {data.get('user_id_rule')}) | "
                     f"{data.get('users_with_several_spellings', 0)} |")
    if data.get("held_out_records_left_out_as_overlapping"):
        lines.append(f"| held-out records shared with the training data, not held out (left out) | "
                     f"{data['held_out_records_left_out_as_overlapping']} |")
    if data.get("train_on") == "assistant turns":
        lines.append(f"| chat records left out: without an answer / first answer beyond {data['max_length']} tokens "
                     f"| {data['records_without_answer']} / {data['records_answer_cut']} |")
    if data.get("canaries"):
        lines.append(f"| canaries / inserted (probability 1/2 each) | {data['canaries']} / "
                     f"{data['canaries_inserted']} |")
    sw = card.get("sweep")
    if sw:
        sel = sw["selected"]
        lines += ["", "## Hyperparameter sweep", "",
                  f"Rule: {sw['rule']}; {len(sw['candidates'])} candidates (learning rate, clip norm, steps), scored "
                  f"by mean token loss on {sw['validation_records']} validation records; selected: learning rate "
                  f"{sel['learning_rate']:g}, clip {sel['clip_norm']:g}, {sel['steps']} steps. The released model's "
                  f"epsilon is the sweep's, {_num(c['accounted_epsilon'])}; the selected run alone would claim "
                  f"{_num(c.get('selected_run_epsilon_alone'))}, which is not the released model's epsilon."]
        if isinstance(sw.get("runs"), list):
            lines += ["", "| candidate | learning rate | clip | steps | validation loss (NOT covered) |",
                      "|---:|---:|---:|---:|---:|"]
            lines += [f"| {r['candidate']} | {r['learning_rate']:g} | {r['clip_norm']:g} | {r['steps']} | "
                      f"{_num(r['validation_loss'])} |" for r in sw["runs"]]
    lines += ["", "## Models", "", "| model | release | held-out perplexity | canary exposure (median / max, "
              "inserted) | greedy extraction | one-run epsilon lower bound (confidence) |",
              "|---|---|---:|---:|---:|---:|"]
    ceilings = []
    for name, row in card["models"].items():
        can = row.get("canaries") or {}
        exp = can.get("exposure") or {}
        ext = can.get("extraction") or {}
        one = can.get("one_run") or {}
        lines.append(
            f"| {name} | {row['release']} | {row['held_out_perplexity']:.3f} | "
            f"{_num(exp.get('median_inserted'), '.2f')} / {_num(exp.get('max_inserted'), '.2f')} | "
            f"{_num(ext.get('greedy_inserted'), '.2f')} | {_one_run_cell(one)} |")
        if one.get("ceiling") is not None:
            ceilings.append(one)
    if ceilings:
        one = ceilings[0]
        text = (f"One-run bounds: with these {one['canaries']} canaries, the largest bound any attack could show at "
                f"{100 * one['confidence']:.0f}% confidence is {one['ceiling']:.3f} (every coin guessed right)")
        if one["ceiling"] > 0:
            text += "; the bound can never reach a claimed epsilon above it."
        elif one.get("canaries_for_a_positive_bound"):
            text += (f": too few canaries for a non-trivial bound; {one['canaries_for_a_positive_bound']} would "
                     "give one (half of them inserted, every guess right).")
        else:
            text += ": too few canaries for a non-trivial bound."
        lines += ["", text]
    comparison = card.get("comparison")
    if comparison:
        lines += ["", "## DP against the twin and the base", "", f"({comparison['note']})", "",
                  "| measure | value | goal | met |", "|---|---:|---:|---|"]
        for name, label in (("private_over_baseline_perplexity", "held-out perplexity, private / twin"),
                            ("private_over_base_perplexity", "held-out perplexity, private / base")):
            row = comparison[name]
            lines.append(f"| {label} | {row['ratio']:.3f} | <= {row['goal']:g} | {'yes' if row['met'] else 'no'} |")
        if "exposure_median_inserted" in comparison:
            ins, held = comparison["exposure_median_inserted"], comparison["exposure_median_held_out"]
            for name, label in (("baseline", "twin"), ("private", "private")):
                lines.append(f"| canary exposure, {label}: inserted / held-out median (bits) | "
                             f"{_num(ins[name], '.2f')} / {_num(held[name], '.2f')} | | |")
    lines += ["", "## Every data-dependent release", "", "| release | privacy status |", "|---|---|"]
    lines += [f"| {r['release']} | {r['status']} |" for r in card["releases"]]
    if card.get("exports"):
        lines += ["", "## Exports", ""] + [f"- {k}: `{v}`" for k, v in card["exports"].items()]
    return "\n".join(lines) + "\n"


def write_report(out_dir: str, card: dict[str, Any]) -> None:
    """Writes ``report.json`` and ``report.md`` atomically.

    Args:
      out_dir: the run folder.
      card: :func:`build_report`'s dictionary.
    """
    write_json(os.path.join(out_dir, "report.json"), card)
    write_text(os.path.join(out_dir, "report.md"), format_report(card))


def _sampler_delta(dp: dict, sweep: dict | None, prep) -> float:
    """What the noise sampler's finite tails add to the released model's delta (:mod:`snapaudit_jax.dpsgd.noise`).

    One run: its report's ``sampler_delta`` (at its achieved epsilon). A sweep: the prepared run's
    (:attr:`~snapaudit_jax.finetune.run.Prepared.sampler_delta`: at the sweep's epsilon over every candidate's
    steps, or under random stopping the expected number of runs times the longest candidate).
    """
    if not dp["dp"]:
        return 0.0
    return dp["sampler_delta"] if sweep is None else prep.sampler_delta
