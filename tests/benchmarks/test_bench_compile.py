"""benchmarks/bench_compile.py on a tiny GPT-2: compile time of every DP step against depth, unrolled and under a
scan, and its flags.

The script runs in subprocesses (tests never import benchmarks) that share a compilation cache
(:mod:`tests.helpers.bench`).
"""

import json
import os

import pytest

from tests.helpers.bench import bench_env, run_script

TINY = ["--dim", "32", "--heads", "2", "--vocab", "128", "--seq", "16", "--batch", "4", "--records", "16"]


@pytest.mark.slow
def test_tiny_depths_report_both_layouts_and_the_cost_per_layer(tmp_path):
    """Both layouts at depths 2 and 3: every step lowered, compiled and run; the unrolled step's module grows with
    depth where the scanned one's stays within 2 % (a structural fact, not a timing); the fits and the ratios
    are there."""
    out = tmp_path / "compile.json"
    proc = run_script("bench_compile.py", [*TINY, "--layers", "3,2", "--paths", "book_keeping", "--run-steps", "2",
                                           "--json", "--out", str(out)], bench_env(tmp_path / "cache"), 300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert json.loads(proc.stdout) == r and r["layers"] == [2, 3] and r["layouts"] == ["unrolled", "scan"]
    for layout in ("unrolled", "scan"):
        for depth in ("2", "3"):
            assert set(r["steps"][layout][depth]) == {"book_keeping", "nonprivate"}
            for step in r["steps"][layout][depth].values():
                assert step["lower_seconds"] > 0 and step["compile_seconds"] > 0 and step["hlo_kb"] > 0
                assert step["step_seconds"] > 0
        for name in ("book_keeping", "nonprivate"):
            assert set(r["per_layer"][layout][name]) == {"seconds_per_layer", "seconds_at_0"}
    for name in ("book_keeping", "nonprivate"):
        unrolled, scan = ([r["steps"][layout][d][name]["hlo_kb"] for d in ("2", "3")]
                          for layout in ("unrolled", "scan"))
        assert unrolled[1] > 1.1 * unrolled[0]
        assert abs(scan[1] - scan[0]) <= 0.02 * scan[0]
        assert set(r["scan_over_unrolled"]["3"][name]) == {"compile", "step"}


@pytest.mark.parametrize("flags, message", [
    (["--layers", "0,2"], "--layers must be integers >= 1, comma-separated"),
    (["--paths", "per_record,fast"], "--paths must name some of per_record, book_keeping, ghost once each"),
    (["--layouts", "scan,stacked"], "--layouts must name some of unrolled, scan once each"),
    (["--layers", "1,2"], "--layers must be >= 2 with the scan layout"),
])
def test_bad_flags_exit_2_naming_them(tmp_path, flags, message):
    proc = run_script("bench_compile.py", [*flags, "--out", str(tmp_path / "o.json")], dict(os.environ), 60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-500:]
    assert not (tmp_path / "o.json").exists()
