"""Extreme but parseable numbers in every shipped configuration and every ``simulate`` flag: refused naming the
field, or accepted, never a traceback.

For each example configuration, every numeric key (and numeric list) in turn is set to each of
:data:`VALUES` (the largest float, its negative, a subnormal, infinities, NaN) and the command's configuration
loader must either accept it or raise :class:`InputError` naming the key; any other exception (an
``OverflowError`` from ``int(1e308)``, a solver's ``ValueError`` on a NaN) is a failure. The loaders are where
every value is checked before work starts; the settings only data or a model can refute are in the bad-input
suite.
"""

from __future__ import annotations

import contextlib
import io
import tomllib

import pytest

from snapaudit_jax.cli import main
from snapaudit_jax.utils.errors import InputError
from tests.helpers.paths import ROOT

VALUES = ("1e308", "-1e308", "5e-324", "inf", "-inf", "nan", "1.7976931348623157e308")


def _loaders():
    from attacks.config import load_pii_config
    from conformal.config import load_cpa_config
    from snapaudit_jax.dpicl.config import load_config
    from snapaudit_jax.finetune.config import load_finetune_config

    return {"finetune_small.toml": load_finetune_config, "finetune_gpu.toml": load_finetune_config,
            "finetune_scale.toml": load_finetune_config, "finetune_scale_eps3.toml": load_finetune_config,
            "finetune_scale_full.toml": load_finetune_config,
            "quickstart.toml": load_config, "one_run.toml": load_config, "one_run_wide.toml": load_config,
            "pii_small.toml": load_pii_config, "pii_gpu.toml": load_pii_config,
            "cpa_synthetic.toml": load_cpa_config, "cpa_llm.toml": load_cpa_config}


def _numeric_keys(doc: dict, prefix: tuple = ()):
    for key, value in doc.items():
        if isinstance(value, dict):
            yield from _numeric_keys(value, prefix + (key,))
        elif (isinstance(value, (int, float)) and not isinstance(value, bool)) or (
                isinstance(value, list) and value and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                          for x in value)):
            yield prefix + (key,), isinstance(value, list)


def _replaced(lines: list[str], path: tuple, text: str) -> list[str] | None:
    """The configuration's lines with ``path``'s key line replaced by ``key = text`` (None: not found)."""
    section, key, current = ".".join(path[:-1]), path[-1], ""
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("[") and not stripped.startswith("[["):
            current = stripped[1:stripped.index("]")]
        elif current == section and stripped.split("=")[0].strip() == key:
            return lines[:i] + [f"{key} = {text}"] + lines[i + 1:]
    return None


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(_loaders()))
def test_every_numeric_key_takes_extreme_values_without_a_traceback(example, tmp_path):
    loader = _loaders()[example]
    source = ROOT / "examples" / example
    text = source.read_text()
    lines, tried, failures = text.splitlines(), 0, []
    for path, is_list in _numeric_keys(tomllib.loads(text)):
        for value in VALUES:
            changed = _replaced(lines, path, f"[{value}]" if is_list else value)
            if changed is None:
                continue
            target = source.parent / f".extreme-{tmp_path.name}.toml"  # beside it: relative data paths resolve
            try:
                target.write_text("\n".join(changed) + "\n")
                tried += 1
                try:
                    loader(str(target))
                except InputError as err:
                    if path[-1] not in str(err):
                        failures.append((".".join(path), value, f"the error does not name the key: {err}"))
                except Exception as err:  # noqa: BLE001  (any other exception is the defect tested)
                    failures.append((".".join(path), value, f"{type(err).__name__}: {err}"))
            finally:
                target.unlink(missing_ok=True)
    assert tried >= 5 * len(VALUES)
    assert not failures, failures[:10]


FLAGS = ("--epsilon", "--delta", "--sensitivity", "--clean-with", "--clean-without", "--distance", "--dim",
         "--partitions", "--clip", "--top-k", "--target", "--trials", "--snapshots", "--confidence", "--seed",
         "--curve-points")


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["pv", "poe", "esa", "ksa"])
def test_every_simulate_flag_takes_extreme_values_without_a_traceback(mechanism):
    """Each numeric flag of ``snapaudit simulate`` at each extreme value: exit 0 or 2, never an internal error
    (``--epsilon 1e308`` was one: the analytic calibration's solver met a NaN)."""
    extra = ["--distance", "1", "--dim", "4"] if mechanism == "esa" else []
    failures = []
    for flag in FLAGS:
        for value in VALUES:
            given = f"{value},0" if flag in ("--clean-with", "--clean-without") else value
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    code = main(["simulate", "--mechanism", mechanism, "--trials", "2000", "--quiet", *extra,
                                 f"{flag}={given}"])
                except SystemExit as exit_:  # argparse refusing a value
                    code = exit_.code
            if code not in (0, 2) or "internal error" in err.getvalue():
                failures.append((flag, value, code, err.getvalue().strip()[-300:]))
            elif code == 2 and flag.removesuffix("out") not in err.getvalue():  # the pair: "--clean-with"
                failures.append((flag, value, "the error does not name the flag", err.getvalue().strip()[-300:]))
    assert not failures, failures[:10]


def test_the_largest_float_as_epsilon_is_refused_naming_the_flag(capsys):
    """The reported case, in the fast tier: ``--epsilon 1e308`` ended in the solver's NaN traceback."""
    assert main(["simulate", "--mechanism", "pv", "--epsilon", "1e308", "--trials", "100", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--epsilon" in err and "no analytic Gaussian calibration" in err and "internal error" not in err
