"""``[sweep]``: an accounted hyperparameter search in ``snapaudit finetune``, and its sigma calibration.

Oracles: dp_accounting directly (the composition of every candidate's run, and the single-event form the
calibration uses for runs of one sampling rate), the sweep record's own validation losses (the selection), and the
data split's counts (the validation split disjoint from training and from the held-out part).
"""

from __future__ import annotations

import json
import math
import re

import dp_accounting
import jax
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant

from snapaudit_jax.cli import main
from snapaudit_jax.dpsgd.accounting import dpsgd_event
from snapaudit_jax.dpsgd.tuning import TruncatedNegativeBinomial, account_sweep, calibrate_sweep, draw_candidates
from snapaudit_jax.finetune.config import load_finetune_config
from snapaudit_jax.finetune.run import _PLAN_STREAM, plan_dict, prepare
from snapaudit_jax.utils.config import ConfigFileError
from snapaudit_jax.utils.errors import InputError
from tests.snapaudit_jax.finetune.test_finetune import (  # noqa: F401  (tiny: the module's fixture)
    _checkpoint_arrays,
    _toml,
    tiny,
)

ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def _pld(events, delta):
    return PLDAccountant(ADD_REMOVE, value_discretization_interval=1e-4).compose(
        dp_accounting.ComposedDpEvent(events)).get_epsilon(delta)


@pytest.mark.slow
def test_merged_composition_equals_dp_accounting_composition_of_every_run():
    """account_sweep composes runs of one (sigma, q) as one self-composition: dp_accounting's composition of the
    separate runs gives the same epsilon (to its discretisation)."""
    cands = [(1.1, 0.05, 10), (1.1, 0.05, 6), (1.1, 0.1, 5)]
    acc = account_sweep(cands, 1e-5)
    separate = _pld([dpsgd_event(*c) for c in cands], 1e-5)
    assert acc.epsilon_pld == pytest.approx(separate, rel=2e-3)
    single = account_sweep(cands[:1], 1e-5)
    assert acc.epsilon_pld > single.epsilon_pld  # the sweep costs more than any run


@pytest.mark.slow
@pytest.mark.parametrize("rule, runs, target", [
    ("compose", [(0.05, 10), (0.05, 20)], 1.0),
    ("compose", [(0.1, 5), (0.05, 10), (0.05, 3)], 2.0),
    ("random_stopping", [(0.02, 40), (0.02, 80)], 1.0),
    ("random_stopping", [(0.02, 40), (0.02, 80)], 4.0),
])
def test_calibrate_sweep_lands_within_one_percent_below_the_target(rule, runs, target):
    params = {"distribution": TruncatedNegativeBinomial.with_mean(1.0, 3.0)} if rule == "random_stopping" else {}
    sigma, acc = calibrate_sweep(target, 1e-5, runs, rule, **params)
    assert 0.99 * target <= acc.epsilon <= target
    # the search costs more than its costliest run alone (dp_accounting's PLD of that run at the same sigma)
    alone = max(_pld([dpsgd_event(sigma, q, t)], 1e-5) for q, t in runs)
    assert acc.epsilon > alone
    if rule == "compose":  # independent oracle: dp_accounting's composition of every run at that sigma
        assert min(acc.epsilon_rdp, _pld([dpsgd_event(sigma, q, t) for q, t in runs], 1e-5)) == pytest.approx(
            acc.epsilon, rel=2e-3)
    # power: 2% less noise breaks the target (the calibration does not overshoot)
    assert account_sweep([(0.98 * sigma, q, t) for q, t in runs], 1e-5, rule, **params).epsilon > target


def test_calibrate_sweep_refuses_what_it_cannot_do():
    with pytest.raises(InputError, match="unreachable"):
        calibrate_sweep(1e-6, 1e-9, [(1.0, 1000)])
    with pytest.raises(InputError, match=r"runs\[0\] must be \(sampling_rate, steps\)"):
        calibrate_sweep(1.0, 1e-5, [(0.1,)])
    with pytest.raises(InputError, match="max_margin must be in"):
        calibrate_sweep(1.0, 1e-5, [(0.1, 10)], max_margin=0.0)


SWEEP = 'learning_rate = [0.003, 0.03]\nvalidation_fraction = 0.15\n'
GIVEN = "noise_multiplier = 1.0\ntarget_epsilon = 0.0\nclip_norm = 1.0\n"  # the runs' tests: no calibration


@pytest.mark.parametrize("body, key", [
    ("rule = \"compose\"\n", "sweep.learning_rate"),  # a table that sweeps nothing
    ("learning_rate = [0.01, 0.01]\n", "sweep.learning_rate"),
    ("learning_rate = [-0.01]\n", "sweep.learning_rate"),
    ("steps = [0, 3]\n", "sweep.steps"),
    ("clip_norm = \"1\"\n", "sweep.clip_norm"),
    ("learning_rate = [0.1]\nrule = \"best\"\n", "sweep.rule"),
    ("learning_rate = [0.1]\nvalidation_fraction = 1.0\n", "sweep.validation_fraction"),
    ("learning_rate = [0.1]\nmean_runs = 0.5\n", "sweep.mean_runs"),
    ("learning_rate = [0.1]\neta = -1.0\n", "sweep.eta"),
    ("learning_rate = [0.1]\nbogus = 1\n", "sweep: unknown key"),
    ("learning_rate = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]\nclip_norm = [1, 2, 3, 4, 5, 6, 7, 8, 9]\n",
     "sweep.learning_rate"),
])
def test_bad_sweep_tables_are_refused_naming_the_key(tiny, tmp_path, body, key):  # noqa: F811
    root, model, data, _ = tiny
    with pytest.raises(ConfigFileError, match=key.replace(".", r"\.")):
        load_finetune_config(_toml(root, model, data, sweep=body))


@pytest.mark.slow
def test_sweep_plan_accounts_the_search_and_splits_validation_units(tiny):  # noqa: F811
    root, model, data, rows = tiny
    prep = prepare(load_finetune_config(_toml(root, model, data, sweep=SWEEP + "steps = [2, 3]\n",
                                              privacy="target_epsilon = 1.0\nclip_norm = 1.0\n")))
    acc = prep.sweep["accounting"]
    assert len(prep.sweep["candidates"]) == 4 and acc.rule == "compose"
    assert 0.99 * 1.0 <= acc.epsilon <= 1.0 and max(acc.candidate_epsilons) < acc.epsilon
    q = prep.sampling_rate
    runs = [(prep.noise_multiplier, q, c["steps"]) for c in prep.sweep["candidates"]]
    assert acc.epsilon_pld == pytest.approx(_pld([dpsgd_event(*r) for r in runs], prep.delta), rel=2e-3)
    # whole records on exactly one side: training, validation, held out (no user split without unit = "user")
    stats = prep.data.stats
    assert stats["validation_records"] == len(prep.data.validation) > 0
    assert stats["train_units"] - stats["canaries_inserted"] + stats["validation_records"] + \
        stats["held_out_records"] == len(rows)
    info = plan_dict(prep, timing=False)
    assert info["sweep"]["epsilon"] == acc.epsilon and info["epsilon_pld"] == acc.epsilon_pld
    # the same data without a sweep splits as before: the validation draw has a stream of its own
    plain = prepare(load_finetune_config(_toml(root, model, data, privacy=GIVEN)))
    assert set(plain.data.held_out) == set(prep.data.held_out) and not plain.data.validation


def _sweep_run(tiny, out, sweep: str, **sections):  # noqa: F811
    """A 2-step LoRA run of the tiny fixture with ``sweep`` at the given sigma: ``(config, card, sweep.json)``."""
    root, model, data, _ = tiny
    cfg = _toml(root, model, data, sweep=sweep, privacy=GIVEN,
                finetune="method = \"lora\"\nrank = 2\nsteps = 2\nbatch_size = 4\n",
                canaries="n_canaries = 0\n", export="hf = false\n", **sections)
    assert main(["finetune", cfg, "--out", str(out), "--quiet"]) == 0
    return cfg, json.loads((out / "report.json").read_text()), json.loads((out / "sweep.json").read_text())


@pytest.mark.slow
def test_compose_sweep_releases_the_best_run_at_the_sweeps_epsilon(tiny, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    cfg, card, record = _sweep_run(tiny, out, SWEEP)
    losses = [r["validation_loss"] for r in record["runs"]]
    assert [r["learning_rate"] for r in record["runs"]] == [0.003, 0.03]
    assert record["selected_run"] == int(np.argmin(losses))  # the selection is the argmin of its own scores
    claim = card["claim"]
    assert claim["accounted_epsilon"] == record["accounting"]["epsilon"]
    assert record["accounting"]["epsilon"] == account_sweep(
        [(1.0, card["dpsgd"]["sampling_rate"], 2)] * 2, claim["accountant_delta"]).epsilon
    assert claim["selected_run_epsilon_alone"] < claim["accounted_epsilon"]
    assert claim["accounting_rule"].startswith("hyperparameter sweep: composition")
    # the noise sampler's term at the sweep's epsilon, over both candidates' 2 steps
    assert claim["sampler_delta"] == pytest.approx((1 + math.exp(claim["epsilon"])) * 4 * _adapters(out) / 2.0**71)
    assert card["sweep"]["runs"] == record["runs"]
    assert card["dpsgd"]["learning_rate"] == record["selected"]["learning_rate"]
    statuses = {r["release"]: r["status"] for r in card["releases"]}
    assert any(k.startswith("the validation split") and v.startswith("NOT covered") for k, v in statuses.items())
    assert not any("NOT accounted" in v for v in statuses.values())
    md = (out / "report.md").read_text()
    assert "## Hyperparameter sweep" in md and "not the released model's epsilon" in md
    # resume: every run and score is read back; the same card
    assert main(["finetune", cfg, "--out", str(out), "--quiet"]) == 0
    again = json.loads((out / "report.json").read_text())
    card.pop("seconds"), again.pop("seconds")
    assert again == card


def test_the_accounting_names_the_protected_unit():
    """The covered release names the unit of the configuration, for both rules; the epsilon does not change."""
    dist = {"distribution": TruncatedNegativeBinomial.with_mean(1.0, 2.0)}
    for rule, params in (("compose", {}), ("random_stopping", dist)):
        record = account_sweep([(1.0, 0.05, 5)] * 2, 1e-5, rule, **params)
        user = account_sweep([(1.0, 0.05, 5)] * 2, 1e-5, rule, unit="user", **params)
        assert "add/remove one record)" in record.covered and "user" not in record.covered
        assert "each user of the private training set (add/remove one user with all of their records)" in user.covered
        assert "one record" not in user.covered and user.epsilon == record.epsilon
    with pytest.raises(InputError, match=r"unit must be one of .*got 'person'"):
        account_sweep([(1.0, 0.05, 5)], 1e-5, unit="person")
    sigma, acc = calibrate_sweep(2.0, 1e-5, [(0.05, 5)], "random_stopping", unit="user", **dist)
    assert "one user with all of their records" in acc.covered


def _differences(a, b, path=""):
    """The paths where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{path}.{k}")]
    return [] if a == b else [path]


def _plan_length(noise_seed: int) -> int:
    """K of a random-stopping run with [run] noise_seed (mean 2 runs, 2 candidates), as finetune draws it."""
    root = jax.random.key(noise_seed)
    return len(draw_candidates(jax.random.fold_in(root, _PLAN_STREAM),
                               TruncatedNegativeBinomial.with_mean(1.0, 2.0), 2))


@pytest.mark.slow
def test_random_stopping_releases_and_logs_nothing_that_depends_on_k(tiny, tmp_path, capsys):  # noqa: F811
    """Two random-stopping runs whose K differ (1 and more runs): their cards differ only in the selected run's
    own values (its hyperparameters, epsilon alone, history, evaluations) and the seed's warning; their logs have
    the same lines apart from numbers and carry no clock; no line names a run. The selection is the argmin of the
    private record."""
    seeds = {}
    for s in range(1, 200):
        seeds.setdefault(_plan_length(s) == 1, s)
        if len(seeds) == 2:
            break
    cards, logs = [], []
    for _, seed in sorted(seeds.items()):
        out = tmp_path / f"run{seed}"
        root, model, data, _ = tiny
        cfg = _toml(root, model, data, sweep=SWEEP + "rule = \"random_stopping\"\nmean_runs = 2\n", privacy=GIVEN,
                    finetune="method = \"lora\"\nrank = 2\nsteps = 2\nbatch_size = 4\n",
                    canaries="n_canaries = 0\n", export="hf = false\n",
                    run=f"seed = 3\nnoise_seed = {seed}\nbaseline = false\neval_batch_size = 8\n")
        capsys.readouterr()
        assert main(["finetune", cfg, "--out", str(out)]) == 0
        logs.append(capsys.readouterr().err)
        card = json.loads((out / "report.json").read_text())
        record = json.loads((out / "sweep.json").read_text())
        assert len(record["runs"]) == _plan_length(seed)  # the oracle's K is the run's
        assert record["selected_run"] == int(np.argmin([r["validation_loss"] for r in record["runs"]]))
        assert card["claim"]["epsilon_pld"] is None and card["seconds"] is None and card["seconds_withheld"]
        assert card["claim"]["accounting_rule"].startswith("hyperparameter sweep: random stopping")
        assert isinstance(card["sweep"]["runs"], str)
        # the sampler's term over the expected noisy steps (mean_runs 2 times 2 steps), whatever K was
        eps = card["claim"]["epsilon"]
        assert card["claim"]["sampler_delta"] == pytest.approx((1 + math.exp(eps)) * 4 * _adapters(out) / 2.0**71)
        assert any("voids the random-stopping bound" in r["status"] for r in card["releases"])
        cards.append(card)
    assert {len(json.loads((tmp_path / f"run{s}" / "sweep.json").read_text())["runs"]) for s in seeds.values()} != {1}
    own = {".claim.warning", ".claim.selected_run_epsilon_alone", ".dpsgd.learning_rate", ".dpsgd.clip_norm",
           ".dpsgd.steps", ".histories", ".models.private", ".sweep.selected"}
    differ = _differences(cards[0], cards[1])
    assert differ and all(any(d == o or d.startswith(o + ".") for o in own) for d in differ), differ
    shapes = [[re.sub(r"[-+0-9.e]+", "#", line) for line in log.splitlines()] for log in logs]
    assert shapes[0] == shapes[1]
    assert not any(re.match(r"\[\s*[0-9.]+s\]", line) for log in logs for line in log.splitlines())
    assert not any("sweep run" in log for log in logs) and all("stay private" in log for log in logs)


def _adapters(out) -> int:
    """The adapter coordinates of the first sweep run's checkpoint."""
    return sum(v.size for k, v in _checkpoint_arrays(out, "sweep_0").items() if "lora" in k)


@pytest.mark.parametrize("name", ["finetune_small.toml", "finetune_gpu.toml"])
def test_the_shipped_finetune_examples_load(name):
    import os

    config = load_finetune_config(os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", name))
    assert config.data.path.endswith("clinical_notes.jsonl") and os.path.isfile(config.data.path)
    if name == "finetune_gpu.toml":
        assert config.sweep is not None and len(config.sweep.candidates(config.finetune, config.privacy)) == 3
        assert config.privacy.unit == "user" and config.finetune.method == "full"
