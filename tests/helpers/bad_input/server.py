"""Bad-input cases: model-server configurations and misbehaving servers (see :mod:`tests.helpers.bad_input`)."""

from __future__ import annotations

from tests.helpers.bad_input.common import Case

CASES: list[Case] = []
