"""report.html (snapaudit_jax.report.html): the page of a run folder, its Markdown, its tables cell for cell, its
figures, notes and provenance; ``snapaudit report``; ``simulate --out``'s page, checked in headless Chromium."""

from __future__ import annotations

import base64
import json
import os

import pytest

from snapaudit_jax.cli import main
from snapaudit_jax.report.html import cell_text, markdown_to_html, render, write_report
from snapaudit_jax.utils.errors import InputError
from tests.helpers.report import CHROMIUM, NO_CHROMIUM, check_report

SVG = (b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="120" height="80">'
       b'<rect width="120" height="80" fill="#36c"/></svg>')
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def _run_folder(tmp_path):
    """A finished run's files: results (records, one with a long text), the full results with notes and a
    training history, a Markdown report, a stamp, an SVG and a PNG figure."""
    out = tmp_path / "run"
    out.mkdir()
    rows = [{"pipeline": "pv", "epsilon_theory": 1.0, "epsilon_emp": 0.3620605832295989, "violation": False,
             "note": None, "curve": {"fpr": [0.1]}},
            {"pipeline": "poe <b>", "epsilon_theory": 4.0, "epsilon_emp": float("inf"), "violation": True,
             "assumptions": "A long sentence of assumptions that the results table leaves out of its columns, "
                            "stated in words under the assumptions."}]
    (out / "results.json").write_text(json.dumps(rows))
    full = {"summary": {"warnings": ["noise seed is public: epsilon does not hold"],
                        "training_history": {"loss": [3.0, 2.0, 1.5], "batch_size": [4, 5, 3]}},
            "results": [{"assumptions": "trials are i.i.d."}, {"assumptions": "trials are i.i.d."}],
            "releases": [{"release": "history", "status": "NOT covered"}]}
    (out / "results_full.json").write_text(json.dumps(full))
    (out / "table.md").write_text("# Audit of <pipelines>\n\nSome **bold** and `code <x>`.\n\n"
                                  "| eps | bound |\n|---:|---|\n| 1 | 0.36 |\n\n- one\n- two\n")
    (out / "run.json").write_text(json.dumps({"format": 1, "command": "audit", "version": 3,
                                              "fingerprint": "ab" * 32, "config": {"audit": {"trials": 10}}}))
    (out / "pv.svg").write_bytes(SVG)
    (out / "pv.png").write_bytes(PNG)  # drawn as the SVG: shown once
    (out / "old.png").write_bytes(PNG)  # an older run's PNG without an SVG: shown as PNG
    return out, rows


def test_markdown_subset_renders_escaped():
    got = markdown_to_html("# T <x>\n\ntext *em* **b** `c<d>`\nmore\n\n| a | b |\n|---|---:|\n| 1 | <2> |\n\n"
                           "1. x\n2. y\n\n```\n<raw>\n```\n")
    assert "<h2>T &lt;x&gt;</h2>" in got
    assert "<p>text <em>em</em> <strong>b</strong> <code>c&lt;d&gt;</code> more</p>" in got
    assert '<th class="text">a</th><th>b</th>' in got and '<td class="text">1</td><td>&lt;2&gt;</td>' in got
    assert "<ol><li>x</li><li>y</li></ol>" in got and "<pre>&lt;raw&gt;</pre>" in got
    assert "<x>" not in got and "<raw>" not in got


def test_a_run_folder_renders_every_part(tmp_path):
    out, rows = _run_folder(tmp_path)
    path = write_report(str(out))
    assert path == str(out / "report.html")
    page = open(path).read()
    for section in ("headline", "figures", "assumptions", "results", "provenance"):
        assert f'<section id="{section}">' in page, section
    assert "<title>snapaudit audit: run</title>" in page and "ab" * 32 in page
    assert "<h2>Audit of &lt;pipelines&gt;</h2>" in page
    # the figures: the SVG (not its PNG twin), the older PNG, the training curves drawn from the history
    assert page.count("data:image/svg+xml;base64,") == 2 and page.count("data:image/png;base64,") == 1
    assert "training curves: summary.training_history" in page
    # the notes, each text once with its places; the long text is a note, not a column
    assert page.count("trials are i.i.d.") == 1 and "results[0].assumptions, results[1].assumptions" in page
    assert "noise seed is public: epsilon does not hold" in page and "NOT covered" in page
    assert "long text fields not shown: assumptions" in page
    # cell for cell: strings as they are (escaped), the rest as JSON text; inf and false as JSON writes them
    assert cell_text("poe <b>") == "poe <b>" and cell_text(float("inf")) == "Infinity" and cell_text(False) == "false"
    parsed = check_report(path, str(out / "results.json"), figures=3)["parsed"]
    assert parsed.tables[0]["rows"][1][:2] == [("pipeline", "poe <b>"), ("epsilon_theory", "4.0")]
    # provenance: the files read with their SHA-256, the config
    assert "results_full.json" in page and "&quot;trials&quot;: 10" in page


def test_power_a_changed_cell_fails_the_check(tmp_path):
    out, rows = _run_folder(tmp_path)
    path = write_report(str(out))
    rows[0]["epsilon_emp"] = 0.36206058322959  # one digit fewer: the page no longer equals the file
    (out / "results.json").write_text(json.dumps(rows))
    with pytest.raises(AssertionError):
        check_report(path, str(out / "results.json"))


def test_an_object_of_results_renders_as_names_and_values(tmp_path):
    out = tmp_path / "ft"
    out.mkdir()
    card = {"claim": {"epsilon": 3.0, "unit": "user", "dp": True}, "models": {"private": {"ppl": 12.5}},
            "releases": [{"release": "model", "status": "covered"},
                         {"release": "history", "status": "NOT covered: per-step losses and gradient norms computed "
                                                          "without noise, from the private data"}],
            "tags": ["a", "b"], "dotted.key": {"x": 1}}
    (out / "report.json").write_text(json.dumps(card))
    (out / "report.md").write_text("# DP fine-tuning report\n")
    path = write_report(str(out))
    check_report(path, str(out / "report.json"))
    page = open(path).read()
    assert 'data-key="claim.epsilon">3.0<' in page and 'data-key="tags">[&quot;a&quot;, &quot;b&quot;]<' in page
    # a narrow table (releases and their status) keeps its sentences
    assert 'data-key="status">NOT covered: per-step losses' in page and "long text fields" not in page


def test_refusals_name_the_folder(tmp_path):
    with pytest.raises(InputError, match="RUN_DIR must be a run folder"):
        render(str(tmp_path / "missing"))
    with pytest.raises(InputError, match=r"holds no results file \(results.json or summary.json or report.json\)"):
        render(str(tmp_path))


def test_snapaudit_report_command(tmp_path, capsys):
    out, _ = _run_folder(tmp_path)
    assert main(["report", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "report.html") and (out / "report.html").is_file()
    assert main(["report", str(out), "--out", str(tmp_path / "copy.html")]) == 0
    assert (tmp_path / "copy.html").read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "snapaudit report: error: RUN_DIR must be a run folder" in capsys.readouterr().err
    assert main(["report", str(out), "--out", str(tmp_path / "x.txt")]) == 2
    assert "--out: must end in .html" in capsys.readouterr().err
    assert not (tmp_path / "x.txt").exists()


@pytest.mark.slow
def test_simulate_writes_its_page_beside_its_json_and_it_loads_in_chromium(tmp_path, capsys):
    out = tmp_path / "sim" / "pv.json"
    assert main(["simulate", "--mechanism", "pv", "--clean-with", "1,0", "--clean-without", "0,1", "--trials",
                 "4000", "--epsilon", "1,4", "--threat", "white", "--quiet", "--out", str(out)]) == 0
    page = tmp_path / "sim" / "pv.html"
    assert sorted(os.listdir(tmp_path / "sim")) == ["pv.html", "pv.json"]
    checked = check_report(str(page), str(out), figures=1)
    text = page.read_text()
    assert "<title>snapaudit simulate: pv (white-box, simulate)</title>" in text and "eps_theory" in text
    if CHROMIUM is None:
        pytest.skip(f"parsed only: {NO_CHROMIUM}")
    assert checked["browser"]["figures"][0]["w"] > 100
