"""``snapaudit cpa`` (``conformal.command``): a bad configuration exits non-zero and writes nothing.

In-process through :func:`snapaudit_jax.cli.main`; the ``python -m snapaudit_jax`` process and its exit status are
tested in ``tests/snapaudit_jax/test_cli.py``.
"""

from __future__ import annotations

from snapaudit_jax.cli import main
from tests.helpers.cpa import SMALL, write_config


# --------------------------------------------------------------------------- configuration errors


def test_cli_error_exit_code_and_no_output(tmp_path, capsys):
    path = write_config(tmp_path, SMALL.replace("n_test = 60", "n_test = -4"))
    out = tmp_path / "out"
    assert main(["cpa", path, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "n_test" in err and "-4" in err
    assert not out.exists()
