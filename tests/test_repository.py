"""The README Quickstart and CI stay in step."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _quickstart_lines():
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quickstart", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line for line in block.strip().splitlines() if line.strip()]


def test_quickstart_has_two_lines_and_ci_runs_the_test_line():
    lines = _quickstart_lines()
    assert len(lines) == 2
    assert "snapaudit audit examples/quickstart.toml" in lines[0]
    assert "pytest" in lines[1]
    assert lines[1] in (ROOT / ".ci" / "run").read_text()
