"""Tests for the neighbouring check of ``snapaudit simulate`` (snapaudit_jax.audits.command.neighbour_check): each
mechanism's distance in the norm its sensitivity bounds, the warning in the table and ``--out``, and the refusal
under ``--strict-neighbours``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from snapaudit_jax.audits.command import SimulateConfig, build_snapshots, neighbour_check, run_simulate
from snapaudit_jax.cli import main
from snapaudit_jax.simulation.snapshots import Snapshots, save_snapshots
from snapaudit_jax.utils.errors import InputError


def _check(mechanism, w, wo, **kw):
    config = SimulateConfig(mechanism=mechanism, clean_with=tuple(w), clean_without=tuple(wo), snapshots=2, **kw)
    return neighbour_check(config, build_snapshots(config)[0])


@pytest.mark.parametrize("mechanism,w,wo,kw,apart", [
    # PV: L2 <= sqrt(2) (one vote moves between two classes); the edge passes, a second vote does not.
    ("pv", (1, 2, 5), (0, 3, 5), {}, None),
    ("pv", (2, 1, 5), (0, 3, 5), {}, 2 * math.sqrt(2)),
    # PoE: L-infinity <= clip. Every utility moving by the clip is an L2 distance of 5 sqrt(3) > 5: still neighbours.
    ("poe", (-5, 0, -5), (0, -5, 0), {}, None),
    ("poe", (-5.1, 0), (0, 0), {}, 5.1),
    # KSA: largest increase + largest decrease <= 2 (replace-one); five +1 and one -1 (L2 sqrt(6) > 2) pass.
    ("ksa", (2, 2, 2, 2, 2, 0), (1, 1, 1, 1, 1, 1), {}, None),
    ("ksa", (3, 1, 1), (1, 1, 1), {}, None),  # one count up by 2 and none down: 2
    ("ksa", (3, 0, 1), (1, 1, 1), {}, 3.0),
    ("ksa", (2, 0, 1), (1, 1, 1), {"sensitivity": 1.0}, 2.0),  # add/remove neighbours: Delta_u = 1
])
def test_neighbour_distance_is_in_the_norm_of_each_mechanisms_sensitivity(mechanism, w, wo, kw, apart):
    message = _check(mechanism, w, wo, **kw)
    if apart is None:
        assert message is None
    else:
        assert f"are {apart:.6g} apart ({mechanism}'s neighbour distance)" in message and "not neighbouring" in message


def test_esa_shorthand_means_are_neighbours_at_2_over_t_and_not_below():
    config = SimulateConfig(mechanism="esa", distance=2.0, dim=8, partitions=4, snapshots=2)
    assert neighbour_check(config, build_snapshots(config)[0]) is None  # |u1 - u2| / T = 2 / T: the edge
    forced = SimulateConfig(mechanism="esa", distance=2.0, dim=8, partitions=4, snapshots=2, sensitivity=0.25)
    assert "distance 2: the ESA shorthand's means are 0.5 apart" in neighbour_check(forced, build_snapshots(forced)[0])


def test_strict_neighbours_refuses_before_any_audit_and_the_default_warns(tmp_path, capsys):
    far = dict(mechanism="pv", clean_with=(3.0, 0.0), clean_without=(0.0, 3.0), epsilons=(1.0,), trials=500,
               snapshots=3)
    with pytest.raises(InputError, match=r"clean_with and clean_without are 4.24264 apart .*\(strict_neighbours\)"):
        run_simulate(SimulateConfig(**far, strict_neighbours=True))
    out = tmp_path / "r.json"
    argv = ["simulate", "--mechanism", "pv", "--clean-with=3,0", "--clean-without=0,3", "--epsilon", "1", "--trials",
            "500", "--snapshots", "3", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "warning: the reference clean outputs are 4.24264 apart" in table
    assert any("4.24264 apart" in w for w in json.loads(out.read_text())[0]["warnings"])
    assert main([*argv[:-2], "--strict-neighbours"]) == 2 and "not neighbouring" in capsys.readouterr().err
    near = [a.replace("3,0", "1,0").replace("0,3", "0,1") for a in argv]  # sqrt(2) apart: neighbours
    assert main(near) == 0 and "warning" not in capsys.readouterr().out
    assert json.loads(out.read_text())[0]["warnings"] == []


def test_a_snapshot_file_is_checked_on_the_means_of_all_its_snapshots(tmp_path):
    """The audit's own check sees its selection snapshots; the file's means are checked as well and the warning
    carried by every row. Its first snapshots are neighbours, the rest are not."""
    w = np.array([[1.0, 0.0]] * 2 + [[9.0, 0.0]] * 8)
    wo = np.array([[0.0, 1.0]] * 10)
    save_snapshots(tmp_path / "s.npz", Snapshots(w, wo))
    config = SimulateConfig(mechanism="pv", snapshot=str(tmp_path / "s.npz"), epsilons=(1.0, 2.0), trials=300)
    results = run_simulate(config)
    assert all(any("the means of 'with' and 'without' are 7.46726 apart" in x for x in r.warnings) for r in results)
    with pytest.raises(InputError, match=r"snapshot file .*s.npz.*: the means .* not neighbouring"):
        run_simulate(SimulateConfig(mechanism="pv", snapshot=str(tmp_path / "s.npz"), trials=300,
                                    strict_neighbours=True))
