"""Bad-input cases: user data that must stay in the run folder (see :mod:`tests.helpers.bad_input`)."""

from __future__ import annotations

from tests.helpers.bad_input.common import Case

CASES: list[Case] = []
