"""The README and the user guide (docs/): short README, every page linked and every link resolving, every page with
a runnable example; the guide's doctests run, and every example configuration it names loads."""

from __future__ import annotations

import doctest
import re

import pytest

from tests.helpers.paths import ROOT

DOCS = ROOT / "docs"
GUIDE = sorted(p for p in DOCS.glob("*.md") if p.name != "architecture.md")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.S)
DOCTESTED = sorted(p.name for p in GUIDE if ">>> " in p.read_text())


def test_the_readme_is_short_and_links_every_guide_page():
    readme = (ROOT / "README.md").read_text()
    assert readme.count("\n") <= 200
    linked = {target.split("#")[0] for target in LINK.findall(readme)}
    assert {f"docs/{p.name}" for p in GUIDE} | {"docs/architecture.md", "CONTRIBUTING.md"} <= linked
    assert len(GUIDE) >= 11


def test_the_guide_shows_a_screenshot_of_every_kind_of_report():
    cli = (DOCS / "cli.md").read_text()
    for kind in ("audit", "cpa", "pii", "finetune", "simulate"):
        image = DOCS / "img" / f"report_{kind}.png"
        assert f"(img/report_{kind}.png)" in cli and image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", kind


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *GUIDE, DOCS / "architecture.md"],
                         ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.name}: {target}"


@pytest.mark.parametrize("page", GUIDE, ids=lambda p: p.name)
def test_every_guide_page_has_a_runnable_example(page):
    blocks = FENCE.findall(page.read_text())
    assert any(kind in ("sh", "pycon", "python") for kind, _ in blocks), page.name
    # the files its commands name exist (example configurations and scripts, benchmarks)
    for kind, body in blocks:
        if kind != "sh":
            continue
        for path in re.findall(r"\b((?:examples|benchmarks)/[\w./-]+\.(?:toml|py|sh))", body):
            assert (ROOT / path).is_file(), f"{page.name}: {path}"


@pytest.mark.slow
def test_every_example_configuration_the_guide_runs_loads():
    """``snapaudit <command> examples/<name>.toml`` anywhere in the guide or the README: the file loads with that
    command's own loader (every check a run makes before its work)."""
    from snapaudit_jax.cli import _config_commands
    from snapaudit_jax.utils.commands import resolve

    commands = _config_commands()
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *GUIDE])
    found = set(re.findall(r"snapaudit (\w+) (examples/[\w./-]+\.toml)", text))
    assert {"audit", "cpa", "pii", "finetune"} <= {name for name, _ in found}
    for name, path in sorted(found):
        assert name in commands, name
        resolve(commands[name].load)(str(ROOT / path))


@pytest.mark.slow
@pytest.mark.parametrize("name", DOCTESTED)
def test_the_guide_doctests_pass(name):
    assert set(DOCTESTED) >= {"library.md", "bounds.md", "one_run.md"}
    # a Markdown fence closes an example's expected output (doctest would read it as output)
    text = re.sub(r"^```\w*$", "", (DOCS / name).read_text(), flags=re.M)
    test = doctest.DocTestParser().get_doctest(text, {}, name, str(DOCS / name), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    failures, tried = runner.summarize(verbose=False)
    assert tried >= 5 and failures == 0, (name, failures, tried)
