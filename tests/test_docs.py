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


def test_the_guide_lists_the_keys_pii_writes():
    """``results.json`` of ``snapaudit pii`` holds :data:`attacks.config.RESULT_KEYS` per variant (tested on a
    run in tests/attacks/test_run.py): the guide lists exactly those."""
    from attacks.config import RESULT_KEYS
    from tests.helpers.docs import documented_keys

    assert documented_keys("pii.md", "Every run writes `results.json`", "`null` where") == set(RESULT_KEYS)


def _simulate_commands() -> list[str]:
    """Every ``snapaudit simulate`` command of the guide's shell examples (continuation lines joined, comments
    dropped)."""
    commands = []
    for page in [ROOT / "README.md", *GUIDE]:
        for kind, body in FENCE.findall(page.read_text()):
            if kind != "sh":
                continue
            for line in body.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].strip()
                if line.startswith("snapaudit simulate"):
                    commands.append(line)
    return commands


@pytest.mark.slow
def test_the_guides_simulate_commands_run_and_print_the_keys_it_lists(tmp_path, monkeypatch, capsys):
    """Each ``snapaudit simulate`` command the guide shows runs with its flags (in a fresh folder, its
    ``snaps.npz`` made from the default KSA histograms; trials capped at 200,000: the command is tested here, its
    figures by the simulation tests), ``--json`` prints an object per epsilon with every key the command-line page
    lists, ``--out`` writes the JSON and its HTML report beside it, and ``--plot`` its figure."""
    import json
    import shlex

    import numpy as np

    from snapaudit_jax.audits.command import DEFAULT_CLEAN
    from snapaudit_jax.cli import main
    from tests.helpers.docs import documented_keys

    commands = _simulate_commands()
    assert len(commands) >= 5 and any("--json" in c for c in commands) and any("--out" in c for c in commands)
    listed = documented_keys("cli.md", "an object per epsilon, with keys", "rows of")
    assert {"epsilon_emp", "tpr_low", "fpr_up", "violation"} <= listed
    monkeypatch.chdir(tmp_path)
    with_, without = (np.tile(np.asarray(v, np.float32), (200, 1)) for v in DEFAULT_CLEAN["ksa"])
    np.savez("snaps.npz", **{"with": with_, "without": without})
    for command in commands:
        argv = shlex.split(command)[1:]
        if "--trials" not in argv:
            argv += ["--trials", "200000"]
        argv[argv.index("--trials") + 1] = str(min(int(argv[argv.index("--trials") + 1]), 200_000))
        assert main([*argv, "--quiet"]) == 0, command
        printed = capsys.readouterr().out
        if "--json" in argv:
            rows = json.loads(printed)
            assert rows and all(listed <= set(row) for row in rows), (command, listed - set(rows[0]))
        if "--out" in argv:
            out = tmp_path / argv[argv.index("--out") + 1]
            assert out.is_file() and out.with_suffix(".html").is_file(), command
        if "--plot" in argv:
            assert (tmp_path / argv[argv.index("--plot") + 1]).is_file(), command
