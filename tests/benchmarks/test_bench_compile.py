"""benchmarks/bench_compile.py on a tiny GPT-2: compile time of every DP step against depth, and its flags.

The script runs in subprocesses (tests never import benchmarks) that share a compilation cache
(:mod:`tests.helpers.bench`).
"""

import json
import os

import pytest

from tests.helpers.bench import bench_env, run_script

TINY = ["--dim", "32", "--heads", "2", "--vocab", "128", "--seq", "16", "--batch", "4", "--records", "16"]


@pytest.mark.slow
def test_tiny_depths_report_lowering_compilation_and_the_cost_per_layer(tmp_path):
    out = tmp_path / "compile.json"
    proc = run_script("bench_compile.py", [*TINY, "--layers", "2,1", "--paths", "book_keeping", "--json", "--out",
                                           str(out)], bench_env(tmp_path / "cache"), 300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert json.loads(proc.stdout) == r and r["layers"] == [1, 2]
    for depth in ("1", "2"):
        assert set(r["steps"][depth]) == {"book_keeping", "nonprivate"}
        for step in r["steps"][depth].values():
            assert step["lower_seconds"] > 0 and step["compile_seconds"] > 0 and step["hlo_kb"] > 0
    # every layer is unrolled today: a deeper model lowers to a larger module
    for name in ("book_keeping", "nonprivate"):
        assert r["steps"]["2"][name]["hlo_kb"] > r["steps"]["1"][name]["hlo_kb"]
        assert set(r["per_layer"][name]) == {"seconds_per_layer", "seconds_at_0"}


@pytest.mark.parametrize("flags, message", [
    (["--layers", "0,2"], "--layers must be integers >= 1, comma-separated"),
    (["--paths", "per_record,fast"], "--paths must name some of per_record, book_keeping, ghost once each"),
])
def test_bad_flags_exit_2_naming_them(tmp_path, flags, message):
    proc = run_script("bench_compile.py", [*flags, "--out", str(tmp_path / "o.json")], dict(os.environ), 60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-500:]
    assert not (tmp_path / "o.json").exists()
