"""Bad-input cases: run folders owned by another configuration or run (see :mod:`tests.helpers.bad_input`)."""

from __future__ import annotations

from tests.helpers.bad_input.common import Case

CASES: list[Case] = []
