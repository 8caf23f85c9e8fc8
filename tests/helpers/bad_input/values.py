"""Bad-input cases: values out of range, sizes that cannot fit, silent coercions, odd files
(see :mod:`tests.helpers.bad_input`)."""

from __future__ import annotations

from tests.helpers.bad_input.common import Case

CASES: list[Case] = []
