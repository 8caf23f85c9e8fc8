"""``snapaudit cpa`` (``conformal.command``): a bad configuration exits non-zero and writes nothing."""

from __future__ import annotations

import subprocess
import sys



from tests.helpers.cpa import SMALL, write_config


# --------------------------------------------------------------------------- configuration errors


def test_cli_error_exit_code_and_no_output(tmp_path):
    path = write_config(tmp_path, SMALL.replace("n_test = 60", "n_test = -4"))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "snapaudit_jax", "cpa", path, "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "n_test" in proc.stderr and "-4" in proc.stderr
    assert not out.exists()
