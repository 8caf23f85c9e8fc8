"""benchmarks/bench_dpsgd.py on a tiny GPT-2: it runs, reports every clipping path against the non-private step
(time, peak memory, compiled memory, goals), and its correctness check can fail.

The script runs in subprocesses (tests never import benchmarks) that share a compilation cache
(:mod:`tests.helpers.bench`).
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.helpers.bench import bench_env, run_script
from tests.helpers.paths import ROOT

HAS_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "peft", "opacus"))
TORCH_FLAGS = [] if HAS_TORCH else ["--skip-torch"]
TINY = ["--layers", "1", "--dim", "32", "--heads", "2", "--seq", "16", "--vocab", "128", "--batch", "8",
        "--records", "32", "--repeats", "2", "--vmap-microbatch", "8", "--memory-microbatches", "4,8"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return bench_env(tmp_path_factory.mktemp("jax_cache"))


def _run(args, env, timeout=300):
    return run_script("bench_dpsgd.py", args, env, timeout)


@pytest.mark.slow
def test_tiny_run_reports_every_path_against_the_nonprivate_step(tmp_path, env):
    out = tmp_path / "dpsgd.json"
    proc = _run([*TINY, *TORCH_FLAGS, "--memory-budget-mb", "2", "--sweep-batches", "32,4", "--sweep-repeats", "1",
                 "--json", "--out", str(out)], env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert json.loads(proc.stdout) == r  # standard output holds the JSON alone; where the run is goes to stderr
    phases = [line.split("] ", 1)[1] for line in proc.stderr.splitlines() if line.startswith("[")]
    assert phases[0].startswith("the check's oracle: ") and phases[0].endswith(" per-record gradients, one at a time")
    assert [p for p in phases if p.startswith("timed step")] == [f"timed step {t} of 2: {len(r['variants'])} variants"
                                                                 for t in (1, 2)]
    assert phases.index("sweep: expected batch 4") < phases.index("sweep: expected batch 32") < phases.index(
        "memory: XLA's analysis of every step's plan")
    names = ["default", "per_record", "per_record_vmap8", "book_keeping", "ghost"]
    torch_names = ["torch_opacus", "torch_nonprivate"] if HAS_TORCH else []
    assert list(r["variants"]) == [*names, "nonprivate", *torch_names]
    assert list(r["ratios_over_nonprivate"]) == names
    # the default: auto resolves to book-keeping (every GPT-2 parameter is covered) at the library's microbatch
    # (on CPU, the largest power of two <= min(4, q N / 4): 2 at q N = 8; per-unit gradients one at a time)
    cpu = r["jax_backend"] == "cpu"
    assert r["clipping"] == {"default": "book_keeping", "per_record": "per_record", "per_record_vmap8": "per_record",
                             "book_keeping": "book_keeping", "ghost": "ghost"}
    assert r["microbatch_size"] == {"default": 2 if cpu else 8, "per_record": 1 if cpu else 8, "per_record_vmap8": 8,
                                    "book_keeping": 8, "ghost": 8}
    # a batch's remainder: the library's, a quarter of a microbatch of 8 units or more (DPSGDConfig.tail_for)
    assert r["tail_microbatch_size"] == {name: 2 if m == 8 else m for name, m in r["microbatch_size"].items()}
    for v in r["variants"].values():
        assert v["median_step_seconds"] > 0 and len(v["step_seconds"]) == 2
    # the matrix products of the timed steps, against GPT-2's closed form: every block's Q/K/V, scores, weighted
    # values, projection and MLP, the tied head on the L - 1 positions with a target; each with its two cotangent
    # products (the token ids have none); the per-record paths compute the same a unit slot at a time, padded ones
    # included
    m = r["model"]
    d, length, vocab = m["dim"], m["seq"], m["vocab"]
    record = 3 * (m["layers"] * (2 * length * d * 3 * d + 2 * 2 * length * length * d + 2 * length * d * d
                                 + 2 * 2 * length * d * 4 * d) + 2 * (length - 1) * d * vocab)
    products = r["matmul_products"]
    assert set(products) == {*names, "nonprivate"}
    assert products["nonprivate"]["flops"] == record * sum(r["batch_sizes"])
    for name in ("per_record", "per_record_vmap8"):
        mb, tail = r["microbatch_size"][name], r["tail_microbatch_size"][name]
        slots = 0
        for size in r["batch_sizes"]:
            full = (size + tail - 1) // mb
            slots += full * mb + (-(-(size - full * mb) // tail) * tail if tail < mb and size > full * mb else 0)
        assert products[name]["flops"] == record * slots, name
    assert 1 < products["book_keeping"]["over_nonprivate"] < products["ghost"]["over_nonprivate"]
    assert products["ghost"]["by_operands"] == {"float32@highest": 1.0}  # both passes at full precision
    # the non-private baseline runs each batch at its own size (no padded records timed), compiled before timing
    assert r["nonprivate_batch_sizes"] == sorted(set(r["batch_sizes"]))
    assert all(x > 0 for x in r["ratios_over_nonprivate"].values()) and r["jax_compiles_timed"] == 0
    # one step's noise over every parameter, timed apart, ours beside jax_privacy's
    draw = r["noise_draw"]
    assert draw["coordinates"] == r["model"]["parameters"] and draw["ours_seconds"] > 0
    assert draw["ratio"] == pytest.approx(draw["ours_seconds"] / draw["jax_privacy_seconds"], abs=1e-3)
    # every DP path's clipped sum and the non-private gradient against the independent per-record loop (Opacus's
    # per-sample gradients against autograd)
    assert set(r["check_rel_error"]) == {*names, "nonprivate", *torch_names[:1]}
    assert max(r["check_rel_error"].values()) <= 1e-4
    mem = r["memory"]
    assert mem["microbatches"] == [4, 8] and set(mem["compiled_mb"]) == {"nonprivate", "per_record",
                                                                        "book_keeping", "ghost"}
    for name, mbs in mem["compiled_mb"].items():  # more records at once, more memory
        assert len(mbs) == 2 and 0 < mbs[0] < mbs[1], name
        within = [m for m, mb in zip([4, 8], mbs) if mb <= 2]
        assert mem["largest_within_budget"][name] == (max(within) if within else None)
    assert set(r["goals"]) == {"book_keeping_time", "default_time", "book_keeping_memory",
                               "book_keeping_largest_batch"}
    assert r["goals"]["book_keeping_time"]["limit"] == 1.25 and r["goals"]["book_keeping_memory"]["limit"] == 1.3
    default = r["goals"]["default_time"]
    assert default["ratio"] == r["ratios_over_nonprivate"]["default"] and default["met"] == (default["ratio"] <= 1.25)
    assert (default["clipping"], default["microbatch"]) == (r["clipping"]["default"], r["microbatch_size"]["default"])
    largest = mem["largest_within_budget"]
    assert r["goals"]["book_keeping_largest_batch"]["nonprivate_ratio"] == (
        None if not largest["per_record"] or largest["nonprivate"] is None
        else round(largest["nonprivate"] / largest["per_record"], 2))
    # the batch sweep: every variant at each expected batch, sorted, q = b / N, nothing compiled while timed
    assert list(r["sweep"]) == ["4", "32"]
    for b, point in r["sweep"].items():
        assert point["sampling_rate"] == int(b) / 32 and len(point["batch_sizes"]) == 1
        assert point["nonprivate_batch_sizes"] == point["batch_sizes"]
        assert list(point["median_step_seconds"]) == [*names, "nonprivate", *torch_names]
        assert list(point["ratios_over_nonprivate"]) == names and point["jax_compiles_timed"] == 0
        if HAS_TORCH:
            assert list(point["ratios_vs_torch"]) == [f"{n}_over_opacus" for n in [*names, "nonprivate"]] + [
                "opacus_over_torch_nonprivate"]
            assert point["check_rel_error"]["torch_opacus"] <= 1e-4 and point["updates_ok"] is True
    assert r["sweep"]["32"]["batch_sizes"] == [32]  # q = 1 takes every record
    if HAS_TORCH:
        t = r["torch"]
        assert not t["skipped"] and t["opacus"] == "1.6.0" and t["updates_ok"] is True
        assert t["opacus_ghost_unsupported"] == "Opacus: Parameter tying is not supported with Ghost Clipping"
        # transformers' GPT-2 holds our weights: the same per-record losses and gradient norms (an Opacus step
        # with the position embedding's per-sample gradients of one shared row would have failed)
        assert t["parity"]["loss_max_abs_diff"] < 1e-4 and t["parity"]["record_grad_norms_rel_error"] < 1e-4
        assert set(r["ratios_vs_torch"]) == {f"{n}_over_opacus" for n in [*names, "nonprivate"]} | {
            "opacus_over_torch_nonprivate", "nonprivate_over_torch_nonprivate"}
        assert all(v > 0 for v in r["ratios_vs_torch"].values())
    else:
        assert r["torch"] == {"skipped": True} and r["ratios_vs_torch"] == {}


@pytest.mark.slow
def test_a_sliced_head_is_checked_timed_and_measured_beside_the_whole_logits(tmp_path, env):
    """``--vocab-chunk 40`` (a 128-token vocabulary: four slices, the last padded): every sliced step passes the
    check against the independent per-record loop (which forms the logits whole), and the memory analysis holds
    the sliced and the whole-logits steps side by side (at one microbatch: the tiny run above checks that memory
    grows with it). ``--tail-microbatch 3``: the steps at microbatch 8 run a batch's remainder 3 units at a time
    (not dividing 8), the default step keeps the library's sizes. ``--paths`` leaves out the per-record path one
    unit at a time: it is neither timed nor checked, and the memory analysis keeps the per-record path (the
    vectorised variant's)."""
    out = tmp_path / "dpsgd.json"
    proc = _run([*TINY, "--skip-torch", "--vocab-chunk", "40", "--memory-budget-mb", "2", "--tail-microbatch", "3",
                 "--memory-microbatches", "8", "--paths", "book_keeping,per_record_vmap,default,ghost",
                 "--out", str(out)], env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "head in slices of 40 rows" in proc.stdout and "book_keeping (whole logits)" in proc.stdout
    assert proc.stdout.startswith("GPT-2 1 layers x 32 dim, vocab 128, seq 16")  # the model's line heads the table
    r = json.loads(out.read_text())
    assert r["paths"] == ["book_keeping", "per_record_vmap", "default", "ghost"]
    assert list(r["variants"]) == ["default", "per_record_vmap8", "book_keeping", "ghost", "nonprivate"]
    micro, tail = r["microbatch_size"], r["tail_microbatch_size"]
    assert {name: tail[name] for name in ("per_record_vmap8", "book_keeping", "ghost")} == dict.fromkeys(
        ("per_record_vmap8", "book_keeping", "ghost"), 3)
    assert tail["default"] == (2 if micro["default"] == 8 else micro["default"])
    assert "8 (rest 3)" in proc.stdout
    assert r["model"]["vocab_chunk"] == 40 and r["memory"]["vocab_chunk"] == 40
    assert max(r["check_rel_error"].values()) <= 1e-4 and set(r["check_rel_error"]) == set(r["variants"])
    mem, whole = r["memory"], r["memory"]["whole_logits"]
    assert set(whole) == {"compiled_mb", "largest_within_budget"}
    assert set(whole["compiled_mb"]) == set(mem["compiled_mb"]) == {"nonprivate", "per_record", "book_keeping",
                                                                     "ghost"}
    assert mem["microbatches"] == [8]
    for name, mbs in whole["compiled_mb"].items():
        assert len(mbs) == 1 and mbs[0] > 0, name
    # two analyses of different programs: at this tiny shape (logits of 30 KB) a plan may tie to 0.01 MB or even
    # grow by a slice's buffers, but not every one of them
    assert mem["compiled_mb"] != whole["compiled_mb"]


@pytest.mark.slow
def test_steps_whose_plan_exceeds_fit_mb_are_not_run_and_the_rest_are(tmp_path, env):
    """``--fit-mb``: a shape whose 32 vectorised per-record gradients (83k parameters: 10 MB) outweigh the
    book-keeping step's plan; the limit between them drops that step alone, and a limit under every DP plan stops
    the run. (Two of the variants: every plan is compiled and analysed by the same code.)"""
    shape = ["--layers", "1", "--dim", "64", "--heads", "2", "--seq", "8", "--vocab", "512", "--batch", "8",
             "--records", "32", "--repeats", "2", "--vmap-microbatch", "32", "--memory-microbatches", "32",
             "--skip-torch", "--paths", "per_record_vmap,book_keeping"]
    out = tmp_path / "dpsgd.json"
    proc = _run([*shape, "--fit-mb", "16", "--out", str(out)], env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    fit = r["fit"]
    names = ["per_record_vmap32", "book_keeping"]
    assert fit["limit_mb"] == 16 and list(fit["compiled_mb"]) == ["nonprivate", *names]
    # the plans the run measured decide, and the shape separates them: one step over the limit, the rest under it
    assert fit["skipped"] == [n for n in names if fit["compiled_mb"][n] > 16] == ["per_record_vmap32"]
    kept = [n for n in names if n not in fit["skipped"]]
    assert list(r["variants"]) == [*kept, "nonprivate"] and list(r["ratios_over_nonprivate"]) == kept
    assert set(r["check_rel_error"]) == {*kept, "nonprivate"} and max(r["check_rel_error"].values()) <= 1e-4
    assert r["goals"]["book_keeping_time"]["ratio"] == r["ratios_over_nonprivate"]["book_keeping"]
    assert "not run (compiled step over --fit-mb 16): per_record_vmap32" in proc.stdout
    # a limit that the baseline meets and no DP step does: status 1 before timing, the sizes named, no file
    under = (fit["compiled_mb"]["nonprivate"] + min(fit["compiled_mb"][n] for n in names)) / 2
    assert fit["compiled_mb"]["nonprivate"] < under
    out.unlink()
    proc = _run([*shape, "--fit-mb", f"{under:.3f}", "--out", str(out)], env)
    assert proc.returncode == 1 and proc.stdout == "" and not out.exists()
    assert f"--fit-mb {float(f'{under:.3f}'):g}: every DP variant needs more" in proc.stderr
    assert "nothing was timed" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("side", ["book_keeping", "torch", "sweep"])
def test_a_perturbed_sum_fails_the_check_before_timing_exit_1_and_no_file(tmp_path, env, side):
    if side != "book_keeping" and not HAS_TORCH:
        pytest.skip("opacus / peft / transformers / torch not installed")
    out = tmp_path / "dpsgd.json"
    # (only the variant the check is about, or the default step beside the torch side: no other step is compiled)
    flags = {"book_keeping": ["--skip-torch", "--paths", "book_keeping"], "torch": ["--paths", "default"],
             "sweep": ["--paths", "default", "--repeats", "1", "--sweep-batches", "4,16", "--sweep-repeats", "1"]}[side]
    proc = _run([*TINY, *flags, "--memory-microbatches", "4", "--perturb-check", side, "--out", str(out)], env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    expected = {"torch": "torch_opacus's sum differs from autograd's batched gradient",
                "book_keeping": "book_keeping's sum differs from the per-record loop's",
                # a sweep point's torch side is checked as the main run's is: the main run passed, the point did not
                "sweep": "sweep 4: torch_opacus's sum differs from autograd's batched gradient"}[side]
    assert f"correctness check failed: {expected}" in proc.stderr
    assert proc.stdout == "" and not out.exists()  # no table, no file


@pytest.mark.parametrize("flags, message", [
    (["--memory-microbatches", "8,x"], "--memory-microbatches must be integers >= 1"),
    pytest.param(["--fit-mb", "0"], "argument --fit-mb: must be a number of MB above 0, got 0"),
    pytest.param(["--sweep-batches", "8,x"], "--sweep-batches must be integers >= 1, comma-separated, got '8,x'"),
    pytest.param(["--sweep-batches", "8,256", "--records", "128"],
                 "--sweep-batches must be integers from 1 to --records (128), got 8,256"),
    pytest.param(["--sweep-batches", "0,8"], "--sweep-batches must be integers from 1 to --records (128), got 0,8"),
    pytest.param(["--skip-torch", "--perturb-check", "torch"], "--perturb-check torch needs the torch baseline"),
    pytest.param(["--perturb-check", "sweep"], "--perturb-check sweep needs --sweep-batches"),
    pytest.param(["--paths", "default,bk"], "--paths must name distinct variants of default, per_record, "
                 "per_record_vmap, book_keeping, ghost, comma-separated, got 'default,bk'"),
    pytest.param(["--paths", "ghost,ghost"], "--paths must name distinct variants of default, per_record, "
                 "per_record_vmap, book_keeping, ghost, comma-separated, got 'ghost,ghost'"),
    pytest.param(["--skip-torch", "--paths", "ghost", "--perturb-check", "book_keeping"],
                 "--perturb-check book_keeping needs that variant in --paths, got 'ghost'"),
])
def test_bad_flags_exit_2_naming_them(tmp_path, flags, message):
    proc = _run([*flags, "--out", str(tmp_path / "o.json")], dict(os.environ), timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-500:]
    assert not (tmp_path / "o.json").exists()


_PROBE = """
import os, runpy, sys
script = sys.argv[1]
sys.path.insert(0, os.path.dirname(script))
sys.argv = [script, "--paths", "x"]
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as stop:
    print(stop.code, [m for m in ("jax", "flax", "optax", "torch", "snapaudit_jax") if m in sys.modules])
"""


def test_a_bad_flag_is_answered_before_jax_or_torch_loads():
    script = os.path.join(str(ROOT), "benchmarks", "bench_dpsgd.py")
    proc = subprocess.run([sys.executable, "-c", _PROBE, script], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split("\n")[-2] == "2 []", proc.stdout[-500:] + proc.stderr[-500:]
    assert "--paths must name distinct variants" in proc.stderr
