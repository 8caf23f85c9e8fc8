"""Command line: JSON contract, outputs, exit codes and bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers.paths import ROOT

from snapaudit_jax.cli import main
from snapaudit_jax.simulation.snapshots import Snapshots, save_snapshots

KEYS = {
    "mechanism", "threat", "method", "estimator", "epsilon_theory", "delta", "epsilon_emp", "mu_emp", "tpr_hat",
    "fpr_hat", "tpr_low", "fpr_up", "trials", "snapshots", "confidence", "violation", "seconds",
}


def run(capsys, *argv):
    code = main(["simulate", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_contract(capsys):
    """--json prints one list, one object per epsilon, with exactly the documented keys."""
    code, out, _ = run(capsys, "--mechanism", "pv", "--epsilon", "1,16", "--calibration", "classical", "--trials",
                       "100000", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r["epsilon_theory"] for r in rows] == [1.0, 16.0]
    for r in rows:
        assert set(r) == KEYS
        assert r["mechanism"] == "pv" and r["threat"] == "black" and r["estimator"] == "std"
        assert r["trials"] == 100000 and r["snapshots"] == 2000 and r["confidence"] == 0.95
        assert r["tpr_low"] <= r["tpr_hat"] and r["fpr_up"] >= r["fpr_hat"]


def test_json_marks_heuristic_rows(capsys, tmp_path):
    """--method paper: every --json object says it is heuristic (the note the table prints), as --out does; a
    certified run's objects carry exactly the documented keys (the marker is not printed everywhere)."""
    from snapaudit_jax.estimation import HEURISTIC_NOTE

    full = tmp_path / "r.json"
    code, out, _ = run(capsys, "--mechanism", "pv", "--epsilon", "2,4", "--method", "paper", "--trials", "20000",
                       "--json", "--out", full)
    assert code == 0
    rows = json.loads(out)
    assert [set(r) for r in rows] == [KEYS | {"heuristic", "note"}] * 2
    assert all(r["heuristic"] is True and r["note"] == HEURISTIC_NOTE and r["violation"] is False for r in rows)
    assert all(r["heuristic"] is True for r in json.loads(full.read_text()))
    code, out, _ = run(capsys, "--mechanism", "pv", "--epsilon", "2", "--method", "paper", "--trials", "20000")
    assert code == 0 and f"note: {HEURISTIC_NOTE}" in out
    code, out, _ = run(capsys, "--mechanism", "pv", "--epsilon", "2", "--trials", "20000", "--json")
    assert code == 0 and set(json.loads(out)[0]) == KEYS


def test_table_plot_and_full_results(capsys, tmp_path):
    """Default output is a table; --plot writes a PNG and --out the full results."""
    png, full = tmp_path / "p.png", tmp_path / "r.json"
    code, out, _ = run(capsys, "--mechanism", "esa", "--distance", "1.419", "--dim", "32", "--partitions", "1",
                       "--sensitivity", "1", "--epsilon", "1", "--method", "exact", "--threat", "white", "--plot", png,
                       "--out", full)
    assert code == 0
    assert "eps_theory" in out and "YES" in out and "warning:" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads(full.read_text())
    assert rows[0]["violation"] is True and rows[0]["tpr"]["trials"] == 0


def test_fail_on_violation_exit_code(capsys):
    code, _, _ = run(capsys, "--mechanism", "pv", "--calibration", "classical", "--epsilon", "16", "--method",
                     "exact", "--threat", "white", "--fail-on-violation", "--json")
    assert code == 3
    code, _, _ = run(capsys, "--mechanism", "pv", "--epsilon", "16", "--method", "exact", "--fail-on-violation",
                     "--json")
    assert code == 0


@pytest.mark.parametrize("mechanism,extra", [("poe", ["--threat", "white"]), ("ksa", ["--top-k", "3"])])
def test_exponential_mechanisms(capsys, mechanism, extra):
    code, out, _ = run(capsys, "--mechanism", mechanism, "--epsilon", "4", "--trials", "50000", "--json", *extra)
    assert code == 0
    row = json.loads(out)[0]
    assert row["estimator"] == "std" and 0.0 <= row["epsilon_emp"] < 4.0


def test_snapshot_file(capsys, tmp_path):
    """--snapshot reads LLM draws (clean model 'sampled'); the npz may carry the target."""
    path = tmp_path / "s.npz"
    rng = np.random.default_rng(0)
    without = np.array([[0.0, 3.0], [1.0, 2.0]])[rng.integers(0, 2, 1000)]
    save_snapshots(path, Snapshots(without + [1.0, -1.0], without, target=0))
    code, out, _ = run(capsys, "--mechanism", "pv", "--snapshot", path, "--epsilon", "2", "--trials", "200000",
                       "--json")
    assert code == 0
    row = json.loads(out)[0]
    assert row["snapshots"] == 1000 and 0 < row["epsilon_emp"] < 2


BAD = [
    (["--mechanism", "pv", "--epsilon", "1,-2"], "--epsilon"),
    (["--mechanism", "pv", "--epsilon", "0"], "--epsilon"),
    (["--mechanism", "pv", "--epsilon", "one"], "--epsilon"),
    (["--mechanism", "pv", "--delta", "0"], "--delta"),
    (["--mechanism", "pv", "--delta", "1"], "--delta"),
    (["--mechanism", "pv", "--confidence", "1.5"], "--confidence"),
    (["--mechanism", "pv", "--trials", "0"], "--trials"),
    (["--mechanism", "pv", "--curve-points", "-1"], "--curve-points"),
    (["--mechanism", "ksa", "--estimator", "gdp"], "--estimator"),
    (["--mechanism", "pv", "--snapshots", "0"], "--snapshots"),
    (["--mechanism", "pv", "--clean-with", "1,2", "--clean-without", "0,3,1"], "--clean-with"),
    (["--mechanism", "pv", "--clean-with", "1,nan", "--clean-without", "0,3"], "--clean-with"),
    (["--mechanism", "pv", "--clean-with", "1,inf", "--clean-without", "0,3"], "--clean-with"),
    (["--mechanism", "pv", "--clean-with", "", "--clean-without", "0,3"], "--clean-with"),
    (["--mechanism", "pv", "--clean-with", "1,2"], "--clean-with"),
    (["--mechanism", "pv", "--clean-with", "1", "--clean-without", "0"], "with"),
    (["--mechanism", "esa", "--distance", "2.5"], "--distance"),
    (["--mechanism", "esa", "--dim", "1"], "--dim"),
    (["--mechanism", "pv", "--distance", "1.0"], "--distance"),
    (["--mechanism", "ksa", "--method", "exact"], "method='exact'"),
    (["--mechanism", "poe", "--calibration", "classical"], "--calibration"),
    (["--mechanism", "ksa", "--top-k", "11"], "top_k"),
    (["--mechanism", "pv", "--snapshot", "missing.npz"], "does not exist"),
]


@pytest.mark.parametrize("argv,needle", BAD)
def test_bad_input_exits_2_names_the_flag_and_writes_nothing(capsys, tmp_path, argv, needle):
    out_json, png = tmp_path / "r.json", tmp_path / "p.png"
    extra = [] if "--trials" in argv else ["--trials", "1000"]
    code, out, err = run(capsys, *argv, *extra, "--out", out_json, "--plot", png)
    assert code == 2
    assert needle in err
    assert out == ""
    assert not out_json.exists() and not png.exists()
    assert os.listdir(tmp_path) == []


def test_unknown_mechanism_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--mechanism", "laplace"])
    assert exc.value.code == 2
    assert "--mechanism" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"not a zip", "not a readable .npz"),
        ("missing_key", "has no array 'without'"),
        ("ragged", "must be finite"),
        ("mismatch", "per snapshot"),
    ],
)
def test_bad_snapshot_files(capsys, tmp_path, content, needle):
    path = tmp_path / "bad.npz"
    if content == "missing_key":
        np.savez(path, **{"with": np.ones((3, 2))})
    elif content == "ragged":
        np.savez(path, **{"with": np.array([[1.0, np.nan]]), "without": np.ones((1, 2))})
    elif content == "mismatch":
        np.savez(path, **{"with": np.ones((3, 2)), "without": np.ones((3, 3))})
    else:
        path.write_bytes(content)
    code, _, err = run(capsys, "--mechanism", "pv", "--snapshot", path, "--trials", "100")
    assert code == 2 and needle in err


@pytest.mark.slow
def test_python_dash_m_entry_point():
    """`python -m snapaudit_jax` is the same command (checked in a fresh process)."""
    proc = subprocess.run(
        [sys.executable, "-m", "snapaudit_jax", "simulate", "--mechanism", "pv", "--epsilon", "2", "--method", "exact",
         "--threat", "white", "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["epsilon_emp"] == pytest.approx(2.0, rel=1e-6)
