"""examples/reproduce_flaws.py's report: the mu-GDP column and the list of chance exceedances.

The script's numbers come from the engine (tested elsewhere); here the report is checked on results built by
hand: a simulated bound above the exact value it bounds is listed (by setting, epsilon and estimator), a GDP
envelope of a label release is never counted as a bound, and the mu-GDP cell shows the per-row p-value with the
per-row and the family-wise (Holm) verdicts apart.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

from tests.helpers.paths import ROOT


def _load():
    spec = importlib.util.spec_from_file_location("reproduce_flaws", ROOT / "examples" / "reproduce_flaws.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(eps_emp, *, gaussian=True, mu_emp=1.0, mu_claim=1.0, p=1.0, mu_row=False, mu_family=False,
            violation=False, family=False):
    return SimpleNamespace(epsilon_emp=eps_emp, epsilon_gdp=eps_emp, gaussian_by_construction=gaussian,
                           mu_emp=mu_emp, mu_claim=mu_claim, mu_violation_p_value=p, mu_violation=mu_row,
                           mu_familywise_violation=mu_family, violation=violation, familywise_violation=family)


def test_report_lists_chance_exceedances_and_separates_row_and_family_verdicts():
    flaws = _load()
    eps = flaws.EPSILONS
    exact = [_result(e + 1.0) for e in eps]
    std = [_result(e) for e in eps]
    gdp = [_result(e) for e in eps]
    gdp[-1] = _result(eps[-1] + 1.0001, mu_emp=4.217, mu_claim=4.212, p=0.041, mu_row=True)  # above exact
    rows = {"white-box case": {"exact": exact, "std": std, "gdp": gdp},
            "label case": {"exact": exact, "std": list(std),
                           "gdp": [_result(e + 5.0, gaussian=False) for e in eps]}}  # envelopes: not bounds
    assert flaws.exceedances(rows) == [f"white-box case, eps {eps[-1]:g}, gdp: {eps[-1] + 1.0001:.4f} > exact "
                                       f"{eps[-1] + 1.0:.4f}"]
    assert flaws._mu_cell(gdp[-1]) == "4.217 vs 4.212 (p 0.041; per row only)"
    assert flaws._mu_cell(_result(1.0, p=0.001, mu_row=True, mu_family=True)).endswith("Holm: VIOLATED)")
    table = flaws.markdown(rows, 1000)
    assert "mu-GDP test" in table and "p 0.041; per row only" in table
    assert "chance exceedances of 95% bounds): white-box case, eps 16, gdp" in table
    rows["white-box case"]["gdp"][-1] = _result(eps[-1] + 0.5)  # power: within the exact value
    assert flaws.exceedances(rows) == [] and "95% bounds): none" in flaws.markdown(rows, 1000)
