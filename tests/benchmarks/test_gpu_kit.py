"""The accelerator benchmark kit (benchmarks/gpu/) in its CPU smoke mode, so that it cannot rot."""

import json
import math
import os
import statistics
import subprocess
import sys

import pytest

from snapaudit_jax.dpsgd import DPSGDConfig
from tests.helpers.bench import FAST_COMPILE_XLA_FLAGS
from tests.helpers.paths import ROOT

RUN = os.path.join(str(ROOT), "benchmarks", "gpu", "run.sh")


def _env(tmp_path, **extra):
    env = dict(os.environ, PYTHON=sys.executable, KIT_OUT=str(tmp_path / "out"), KIT_SITE=str(tmp_path / "site"),
               KIT_WHEELS="0", XLA_FLAGS=FAST_COMPILE_XLA_FLAGS, **extra)
    env.pop("OUT", None)
    return env


def _refuses_numbers(script, tmp_path, cases):
    """Each ``(flag, value, rule)``: the script's smoke run exits 2 naming the flag and the rule, and writes no file."""
    for flag, value, rule in cases:
        proc = subprocess.run([sys.executable, script, "--cpu-smoke", flag, value, "--out", str(tmp_path / "x.json")],
                              capture_output=True, text=True, timeout=120, env=_env(tmp_path, JAX_PLATFORMS="cpu"),
                              cwd=str(ROOT))
        assert proc.returncode == 2, (flag, value, proc.stderr[-500:])
        assert f"argument {flag}: must be a finite number {rule}, got {value}" in proc.stderr, proc.stderr[-500:]
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_cpu_smoke_runs_every_part_and_writes_their_json(tmp_path):
    proc = subprocess.run(["bash", RUN, "--cpu-smoke"], env=_env(tmp_path), capture_output=True, text=True,
                          timeout=900, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "installed snapaudit-jax" in proc.stdout  # the offline --no-deps install of the project works
    out = tmp_path / "out"
    kit = json.loads((out / "kit.json").read_text())
    assert kit["mode"] == "cpu-smoke"
    assert {p: r["status"] for p, r in kit["parts"].items()} == dict.fromkeys(
        ["simulation", "dpsgd", "finetune", "llm", "tests"], "ok")
    # each part's deadline leaves every part after it the least time it measures something in, and is never
    # under its own least (or, short of that, the budget left less the margin); the tests part has no deadline
    names, least, margin = list(kit["parts"]), kit["least_seconds"], kit["margin_seconds"]
    for index, name in enumerate(names):
        row = kit["parts"][name]
        if name == "tests":
            assert row["deadline_seconds"] is None
            continue
        left = kit["budget_seconds"] - row["started_at_seconds"]
        later = sum(least[p] for p in names[index + 1:])
        assert row["deadline_seconds"] <= max(least[name], left - margin - later) + 0.1, (name, row)
        assert row["deadline_seconds"] >= min(least[name], left - margin) - 0.1, (name, row)
    assert kit["parts"]["simulation"]["deadline_seconds"] < kit["budget_seconds"] - margin - 200  # power
    tests = kit["parts"]["tests"]["summary"]
    assert tests["tests"] >= 3 and tests["failures"] == tests["errors"] == 0
    sim = json.loads((out / "simulation.json").read_text())
    rows = {row["case"]: row for row in sim["cases"]}
    assert {name: row["status"] for name, row in rows.items()} == dict.fromkeys(
        ["pv_k2", "pv_k16", "poe", "esa", "ksa"], "ok")
    # Words per black-box trial: 2 per normal or logistic variate (PV k = 2: one contrast; k = 16: the target's
    # normal and a coin; ESA: 2 basis normals), KSA K + 2 words.
    assert {name: row["words_per_trial"] for name, row in rows.items()} == {
        "pv_k2": 2, "pv_k16": 4, "poe": 2, "esa": 4, "ksa": 6}
    assert rows["pv_k16"]["scheme"] == "stratified" and min(rows["pv_k16"]["distinct_snapshots"]) > 1000
    for row in rows.values():
        assert row["jax_compiles_timed"] == 0
        assert row["fraction_of_limit_random_words"] > 0 and 0 < row["hit_rates"][1] < row["hit_rates"][0] < 1
    assert sim["random_bits"]["random_words"]["words_per_s"] > sim["random_bits"]["jax_random_bits"]["words_per_s"]
    dpsgd = json.loads((out / "dpsgd.json").read_text())
    # the check runs at full float32 precision on every backend (TF32 only in the timed steps): one tolerance
    tolerance = 1e-4
    assert dpsgd["status"] == "ok" and dpsgd["check_rel_error"] < tolerance and dpsgd["jax_compiles_timed"] == 0
    assert dpsgd["dp"]["records_per_s"] > 0 and dpsgd["nonprivate"]["records_per_s"] > 0
    assert dpsgd["nonprivate_batch_sizes"] == sorted(set(dpsgd["batch_sizes"]))  # each batch at its own size
    # every clipping path timed and checked; dp is the one clipping = "auto" takes on this backend
    assert list(dpsgd["paths"]) == ["book_keeping", "book_keeping_bf16", "per_record", "book_keeping_batch", "ghost"]
    assert all(r["records_per_s"] > 0 for r in dpsgd["paths"].values())
    for r in dpsgd["paths"].values():  # the median of the per-step ratios on the same batches
        ratios = [a / b for a, b in zip(r["step_seconds"], dpsgd["nonprivate"]["step_seconds"])]
        assert len(ratios) == len(dpsgd["batch_sizes"]) and r["median_step_time_ratio"] == round(
            statistics.median(ratios), 3)
    assert all(r["check_rel_error"] < tolerance for p, r in dpsgd["paths"].items() if p != "book_keeping_bf16")
    # bfloat16 operands: the float32 gradient to their rounding, and off it (they took effect)
    assert 1e-6 < dpsgd["paths"]["book_keeping_bf16"]["check_rel_error"] < 2.0**-6
    assert dpsgd["paths"]["book_keeping_bf16"]["clipped_sum_dtype"] == "bfloat16"
    assert dpsgd["dp_path"] == dpsgd["auto"]["path"] == "book_keeping"
    # each path at the microbatch (and remainder's) that the library gives a user on the backend, as the kit's
    # GPU run does: on the CPU one record for the per-record path and more on the fast ones (so one microbatch
    # forced on every path fails there; accelerators give every path the same)
    plan = DPSGDConfig(steps=1, learning_rate=1e-3, noise_multiplier=1.0, delta=1e-5,
                       sampling_rate=dpsgd["sampling_rate"])
    for name, r in dpsgd["paths"].items():
        m = plan.microbatch_for(dpsgd["records"], dpsgd["backend"], name.removesuffix("_bf16").removesuffix("_batch"))
        if name == "book_keeping_batch":  # the whole expected batch a microbatch
            m = math.ceil(dpsgd["expected_batch"])
        assert (r["microbatch_size"], r["tail_microbatch_size"]) == (m, plan.tail_for(dpsgd["records"], m)), name
    if dpsgd["backend"] == "cpu":
        assert dpsgd["paths"]["per_record"]["microbatch_size"] < dpsgd["paths"]["book_keeping"]["microbatch_size"]
    # The products each step executes, against the closed form of the smoke GPT-2 (whole logits): every block's
    # Q/K/V, scores, weighted values, projection and MLP, the tied head on the L - 1 positions with a target, each
    # product and its two cotangent products (the token ids have none), a record at a time.
    m = dpsgd["model"]
    d, length, vocab, blocks = m["dim"], m["seq"], m["vocab"], m["layers"]
    record = 3 * (blocks * (2 * length * d * 3 * d + 2 * 2 * length * length * d + 2 * length * d * d
                            + 2 * 2 * length * d * 4 * d) + 2 * (length - 1) * d * vocab)
    assert m["vocab_chunk"] is None
    assert dpsgd["nonprivate"]["matmul_flops"] == record * sum(dpsgd["batch_sizes"])
    # the per-record path runs the same products a unit slot at a time, padded slots included (none at microbatch 1)
    pr = dpsgd["paths"]["per_record"]
    slots = 0
    for size in dpsgd["batch_sizes"]:
        mb, tail = pr["microbatch_size"], pr["tail_microbatch_size"]
        full = (size + tail - 1) // mb
        slots += full * mb + (-(-(size - full * mb) // tail) * tail if tail < mb and size > full * mb else 0)
    assert pr["matmul_flops"] == record * slots and pr["arithmetic_ceiling"] <= 1.0
    assert 1.0 < dpsgd["paths"]["book_keeping"]["matmul_flops_over_nonprivate"] < (
        dpsgd["paths"]["ghost"]["matmul_flops_over_nonprivate"])  # the Gram products; ghost's second backward
    for r in dpsgd["paths"].values():
        assert abs(sum(r["matmul_flops_by_operands"].values()) - 1.0) < 1e-3 and r["achieved_tflop_per_s"] > 0
    assert dpsgd["paths"]["book_keeping_bf16"]["arithmetic_ceiling"] is None
    # the products at the device's measured rate per operand class: where a path's products are all of the
    # non-private step's class, the predicted share is its arithmetic ceiling
    rates = dpsgd["matmul_rates_tflop_per_s"]
    assert set(rates) == {"float32", "float32@highest", "bfloat16"} and min(rates.values()) > 0
    assert pr["matmul_flops_by_operands"] == {"float32": 1.0}
    assert pr["roofline_share"] == pytest.approx(pr["arithmetic_ceiling"], abs=2e-4)
    for r in dpsgd["paths"].values():
        assert r["share_of_roofline_share"] == pytest.approx(r["ratio_over_nonprivate"] / r["roofline_share"],
                                                             rel=2e-3)
    assert dpsgd["paths"]["book_keeping_bf16"]["matmul_flops_by_operands"]["bfloat16"] > 0.3
    assert dpsgd["skipped_paths"] == {}  # the kit's deadline left room for every path
    part = json.loads((out / "finetune.json").read_text())
    assert part["part"] == "finetune" and part["status"] == "ok" and part["methods"] == ["lora"]
    assert part["skipped_methods"] == {} and list(part["runs"]) == ["lora"]
    tune = part["runs"]["lora"]
    assert tune["methods"] == ["lora"] and tune["arguments"][tune["arguments"].index("--method") + 1] == "lora"
    assert tune["jax_compiles_timed"] == 0
    assert all(v <= tolerance for k, v in tune["checks"].items() if not isinstance(v, bool) and k != "tolerance")
    ours = {"ours_dp_lora", "ours_dp_per_record_lora", "ours_dp_ghost_lora", "ours_batched_lora"}
    assert ours <= set(tune["variants"])
    if not tune["torch"]["skipped"]:  # Opacus (hooks and ghost clipping) + PEFT on the device torch sees
        assert {"torch_opacus_lora", "torch_opacus_ghost_lora", "torch_nonprivate_lora"} <= set(tune["variants"])
    llm = json.loads((out / "llm.json").read_text())
    assert [row["arch"] for row in llm["architectures"]] == ["smollm2-135m", "llama-3.2-1b", "llama-3-8b"]
    assert all(row["status"] == "ok" for row in llm["architectures"])


@pytest.mark.slow
def test_dpsgd_times_the_auto_path_first_and_skips_what_the_deadline_leaves_no_room_for(tmp_path):
    script = os.path.join(str(ROOT), "benchmarks", "gpu", "dpsgd.py")
    out = tmp_path / "dpsgd.json"
    # a reserve for the timed steps far beyond the deadline: no path fits after the first one
    proc = subprocess.run([sys.executable, script, "--cpu-smoke", "--repeats", "1", "--deadline", "60", "--reserve",
                           "1000", "--out", str(out)], capture_output=True, text=True, timeout=300,
                          env=_env(tmp_path, JAX_PLATFORMS="cpu"), cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    dpsgd = json.loads(out.read_text())
    assert dpsgd["status"] == "ok" and dpsgd["dp_path"] == dpsgd["auto"]["path"] == "book_keeping"
    assert list(dpsgd["paths"]) == ["book_keeping"] and dpsgd["paths"]["book_keeping"]["records_per_s"] > 0
    assert dpsgd["paths"]["book_keeping"]["check_rel_error"] < 1e-4
    # bfloat16 operands next (the measurement that may settle the accelerators' default), ghost clipping last
    assert list(dpsgd["skipped_paths"]) == ["book_keeping_bf16", "per_record", "book_keeping_batch", "ghost"]
    first = dpsgd["skipped_paths"]["book_keeping_bf16"]
    assert "of the 60 s deadline" in first and "projected" in first, first
    assert set(dpsgd["skipped_paths"].values()) - {first} == {
        "not started: book_keeping_bf16, before it, did not fit the deadline"}
    assert set(dpsgd["compile_seconds"]) == {"nonprivate", "book_keeping"}
    assert "book_keeping_bf16 skipped: not started at" in proc.stdout
    _refuses_numbers(script, tmp_path, (("--reserve", "nan", ">= 0"), ("--deadline", "inf", ">= 0"),
                                        ("--deadline", "-1", ">= 0"), ("--tolerance", "0", "> 0")))


@pytest.mark.slow
def test_finetune_measures_lora_first_and_a_further_method_only_with_time_left(tmp_path):
    script = os.path.join(str(ROOT), "benchmarks", "gpu", "finetune.py")
    env = _env(tmp_path, JAX_PLATFORMS="cpu")
    runs = {}
    for name, extra in (("tight", ["--deadline", "90", "--next-factor", "1000"]), ("room", [])):
        out = tmp_path / f"{name}.json"
        proc = subprocess.run([sys.executable, script, "--cpu-smoke", "--method", "both", "--skip-torch",
                               *extra, "--out", str(out)], capture_output=True, text=True, timeout=600, env=env,
                              cwd=str(ROOT))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[name] = json.loads(out.read_text()), proc.stdout
    tight, stdout = runs["tight"]
    assert tight["methods"] == ["lora"] and list(tight["runs"]) == ["lora"]
    reason = tight["skipped_methods"]["full"]
    assert reason.startswith("not started at ") and "of the 90 s deadline" in reason and "under 1000 times" in reason
    assert f"finetune: full skipped: {reason}" in stdout
    room, _ = runs["room"]  # power: with no deadline both run, LoRA first, each checked and timed
    assert room["methods"] == ["lora", "full"] and room["skipped_methods"] == {}
    for method, run in room["runs"].items():
        assert run["methods"] == [method] and f"ours_dp_{method}" in run["variants"]
        assert all(v <= 1e-4 for k, v in run["checks"].items() if not isinstance(v, bool) and k != "tolerance")
    _refuses_numbers(script, tmp_path, (("--next-factor", "0", "> 0"), ("--deadline", "nan", ">= 0")))


@pytest.mark.slow
def test_bad_arguments_exit_2_naming_them(tmp_path):
    proc = subprocess.run(["bash", RUN, "--fast"], env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown argument '--fast'" in proc.stderr
    kit = os.path.join(str(ROOT), "benchmarks", "gpu", "kit.py")
    proc = subprocess.run([sys.executable, kit, "--out", str(tmp_path / "o"), "--parts", "simulation,train"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--parts must name some of simulation, dpsgd, finetune, llm, tests" in proc.stderr
    llm = os.path.join(str(ROOT), "benchmarks", "gpu", "llm.py")  # its flags are checked before JAX or torch load
    _refuses_numbers(llm, tmp_path, (("--deadline", "inf", "> 0"), ("--deadline-at", "0", "> 0")))
    for budget in ("inf", "0", "nan"):  # an infinite budget would hand its parts an infinite deadline
        proc = subprocess.run([sys.executable, kit, "--out", str(tmp_path / "o"), "--budget", budget],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and f"--budget must be a finite number of seconds > 0, got {float(budget)}" \
            in proc.stderr, proc.stderr[-500:]
    proc = subprocess.run(["bash", RUN, "--parts"], env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "run.sh: --parts needs a value" in proc.stderr
    tune = os.path.join(str(ROOT), "benchmarks", "gpu", "finetune.py")
    proc = subprocess.run([sys.executable, tune, "--out", str(tmp_path / "f.json")], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 2 and "no accelerator" in proc.stderr and not (tmp_path / "f.json").exists()
    sim = os.path.join(str(ROOT), "benchmarks", "gpu", "simulation.py")
    proc = subprocess.run([sys.executable, sim, "--out", str(tmp_path / "s.json")], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 2 and "no accelerator" in proc.stderr and not (tmp_path / "s.json").exists()
    proc = subprocess.run([sys.executable, sim, "--cpu-smoke", "--cases", "pv_k2,lasso"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "--cases must name some of" in proc.stderr
