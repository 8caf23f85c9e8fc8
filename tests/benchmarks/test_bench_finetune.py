"""benchmarks/bench_finetune.py on a tiny Llama: it runs, reports every variant, and its correctness checks can fail.

The script runs in subprocesses (tests never import benchmarks) that share a compilation cache
(:mod:`tests.helpers.bench`).
"""

import importlib.util
import json

import pytest

from tests.helpers.bench import bench_env, run_script

TINY = ["--layers", "1", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--intermediate", "96", "--vocab", "256",
        "--seq", "16", "--batch", "4", "--records", "16", "--repeats", "1", "--seed", "0"]
HAS_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "peft", "opacus"))
TORCH_FLAGS = [] if HAS_TORCH else ["--skip-torch"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return bench_env(tmp_path_factory.mktemp("jax_cache"))


def _run(args, env, timeout=240):
    return run_script("bench_finetune.py", args, env, timeout)


@pytest.mark.slow
def test_tiny_run_reports_every_variant_ratio_goal_and_check(tmp_path, env):
    out = tmp_path / "finetune.json"
    proc = _run([*TINY, *TORCH_FLAGS, "--method", "both", "--sweep-batches", "16", "--sweep-repeats", "1", "--json",
                 "--out", str(out)], env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert json.loads(proc.stdout) == r
    assert r["shape"]["layers"] == 1 and r["shape"]["hidden_size"] == 64 and not r["shape"]["full_shape"]
    assert r["methods"] == ["full", "lora"] and r["seq"] == 16 and r["expected_batch"] == 4
    sides = ["ours_dp", "ours_nonprivate", "ours_batched"] + (["torch_opacus", "torch_nonprivate"] if HAS_TORCH else [])
    # the default path is book-keeping (the fast paths cover full fine-tuning's embeddings, tied head and
    # RMSNorms too): per-record and ghost beside it for both methods; Opacus's ghost clipping runs LoRA only (it
    # refuses the tied embedding of full fine-tuning)
    paths = [f"ours_dp_{p}_{m}" for p in ("per_record", "ghost") for m in ("full", "lora")]
    opacus_ghost = ["torch_opacus_ghost_lora"] if HAS_TORCH else []
    assert sorted(r["variants"]) == sorted([f"{s}_{m}" for s in sides for m in ("full", "lora")] + paths
                                           + opacus_ghost)
    assert r["clipping"] == {"ours_dp_full": "book_keeping", "ours_dp_lora": "book_keeping",
                             **{p: p.split("_", 2)[2].rsplit("_", 1)[0] for p in paths}}
    # the library's default microbatch at q N = 4: 1 on CPU (under 8 on the fast paths, per-unit gradients always),
    # min(32, q N) elsewhere
    assert set(r["microbatch_sizes"].values()) == ({1} if r["jax_backend"] == "cpu" else {4})
    for v in r["variants"].values():
        assert v["median_step_seconds"] > 0 and v["tokens_per_s"] > 0 and len(v["step_seconds"]) == 1
    assert r["jax_compiles_timed"] == 0
    # our steps' matrix products: the per-record path computes the batched step's products a unit slot at a time
    # (padded slots included), exactly; book-keeping adds its norms' Gram products, ghost clipping a second backward
    products = r["matmul_products"]
    assert sorted(products) == sorted([f"ours_{k}_{m}" for k in ("dp", "batched") for m in ("full", "lora")]
                                      + paths)
    for m in ("full", "lora"):
        name = f"ours_dp_per_record_{m}"
        mb, tail = r["microbatch_sizes"][name], r["tail_microbatch_sizes"][name] or r["microbatch_sizes"][name]
        slots = 0
        for size in r["batch_sizes"]:
            full = (size + tail - 1) // mb
            slots += full * mb + (-(-(size - full * mb) // tail) * tail if tail < mb and size > full * mb else 0)
        assert products[name]["flops"] * sum(r["batch_sizes"]) == products[f"ours_batched_{m}"]["flops"] * slots
        assert products[f"ours_batched_{m}"]["over_batched"] == 1.0
        assert 1.0 < products[f"ours_dp_{m}"]["over_batched"] < products[f"ours_dp_ghost_{m}"]["over_batched"], m
    # the batch sweep: every variant again at q = 16 / 16 (every record), nothing compiled while timed
    point = r["sweep"]["16"]
    assert list(r["sweep"]) == ["16"] and point["sampling_rate"] == 1.0 and point["batch_sizes"] == [16]
    assert sorted(point["median_step_seconds"]) == sorted(r["variants"]) and point["jax_compiles_timed"] == 0
    assert {f"dp_{m}_over_batched" for m in ("full", "lora")} <= set(point["ratios"])
    assert all(v > 0 for v in point["ratios"].values())
    if HAS_TORCH:  # the main run's torch checks again at the point, recorded under the point in r["checks"] too
        assert point["torch_checks"] == {
            "torch_opacus_full": pytest.approx(0.0, abs=1e-4), "torch_opacus_full_updates": True,
            "torch_opacus_lora": pytest.approx(0.0, abs=1e-4), "torch_opacus_lora_updates": True,
            "torch_opacus_ghost_lora": pytest.approx(0.0, abs=1e-4),
            "torch_opacus_ghost_norms_lora": pytest.approx(0.0, abs=1e-4)}
        assert {k: r["checks"][f"sweep 16: {k}"] for k in point["torch_checks"]} == point["torch_checks"]
        assert {"dp_lora_over_opacus", "dp_lora_over_opacus_ghost", "opacus_full_over_torch_nonprivate"} <= set(
            point["ratios"])
    # the real tokens of the timed batches, and LoRA trains far fewer parameters than full fine-tuning
    assert r["real_tokens"][0] <= 16 * r["batch_sizes"][0] and r["real_tokens"][0] >= 8 * r["batch_sizes"][0]
    assert 0 < r["trainable_parameters"]["lora"] < r["trainable_parameters"]["full"] == r["shape"]["parameters"]["full"]
    # the noise of one step timed apart, ours and jax_privacy's, over exactly the trainable coordinates
    for m in ("full", "lora"):
        draw = r["noise_draw"][m]
        assert draw["coordinates"] == r["trainable_parameters"][m] and draw["ours_seconds"] > 0
        assert draw["ratio"] == pytest.approx(draw["ours_seconds"] / draw["jax_privacy_seconds"], abs=1e-3)
    # correctness checks ran before timing and passed: ours' clipped sums (C = inf, no noise) = the batched sum
    checks = r["checks"]
    for m in ("full", "lora"):
        assert checks[f"ours_dp_{m}"] <= 1e-4 and checks[f"ours_nonprivate_{m}"] <= 1e-4
        assert r["clip_norm"][m] > 0
    assert all(checks[p] <= 1e-4 for p in paths)
    goals = r["goals"]
    assert goals["lora_dp_within_1.25x_nonprivate"]["limit"] == 1.25
    assert goals["full_dp_within_2x_nonprivate"]["limit"] == 2.0
    for g in (goals["lora_dp_within_1.25x_nonprivate"], goals["full_dp_within_2x_nonprivate"]):
        assert isinstance(g["met_vs_batched"], bool) and g["ratio_vs_batched"] > 0
    if HAS_TORCH:
        import torch

        assert not r["torch"]["skipped"] and r["torch"]["opacus"] == "1.6.0"
        assert r["torch"]["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
        assert r["torch"]["opacus_ghost_unsupported"] == {
            "full": "Opacus: Parameter tying is not supported with Ghost Clipping"}
        # Opacus's ghost clipping: its norms and clipped sum equal those of its per-sample gradients
        assert checks["torch_opacus_ghost_lora"] <= 1e-4 and checks["torch_opacus_ghost_norms_lora"] <= 1e-4
        assert r["ratios"]["dp_over_opacus_ghost_lora"] > 0
        assert isinstance(goals["lora_dp_faster_than_opacus_ghost_peft"]["met"], bool)
        for m in ("full", "lora"):
            assert checks[f"torch_opacus_{m}"] <= 1e-4 and checks[f"torch_opacus_{m}_updates"] is True
            # the torch model holds our weights: the same per-record losses and gradient norms
            assert r["parity"][m]["loss_max_abs_diff"] < 1e-4
            norms = r["parity"][m]["mean_record_grad_norm"]
            assert norms["torch"] == pytest.approx(norms["ours"], rel=1e-3)
        assert r["threads"]["torch"] == r["threads"]["xla_cpu_intra_op"]
        assert isinstance(goals["lora_dp_faster_than_opacus_peft"]["met"], bool)
    else:
        assert r["torch"] == {"skipped": True} and goals["lora_dp_faster_than_opacus_peft"]["met"] is None


@pytest.mark.slow
@pytest.mark.parametrize("side", ["ours", "torch", "sweep"])
def test_a_perturbed_sum_fails_the_check_exit_1_and_no_file(tmp_path, env, side):
    if side != "ours" and not HAS_TORCH:
        pytest.skip("opacus / peft / transformers / torch not installed")
    out = tmp_path / "finetune.json"
    flags = {"ours": ["--skip-torch"], "torch": [], "sweep": ["--sweep-batches", "8", "--sweep-repeats", "1"]}[side]
    proc = _run([*TINY, *flags, "--method", "lora", "--perturb-check", side, "--out", str(out)], env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "correctness check failed" in proc.stderr
    if side == "ours":
        assert "ours_dp_lora" in proc.stderr
    elif side == "torch":  # both Opacus checks have the power to fail
        assert "torch_opacus_lora, torch_opacus_ghost_lora" in proc.stderr
    else:  # a sweep point's torch side is checked as the main run's is: the main run passed, the point did not
        assert "failed: sweep 8: torch_opacus_lora, sweep 8: torch_opacus_ghost_lora (" in proc.stderr
    assert not out.exists()


@pytest.mark.slow
def test_bad_flags_exit_2_naming_them(tmp_path, env):
    for args, message in [
        (["--dim", "63", "--heads", "4"], "--dim must be a multiple of --heads"),
        (["--targets", "q_proj", "wq"], "--targets must be distinct Llama projections"),
        (["--rank", "200"], "--rank/--targets: rank must be <= the width 192 of the targeted projection 'v_proj'"),
    ]:
        proc = _run([*args, "--skip-torch", "--out", str(tmp_path / "x.json")], env, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr[-500:])
    assert not (tmp_path / "x.json").exists()
