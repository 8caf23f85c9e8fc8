"""Suite-wide hooks: the fast tier's limits (:mod:`tests.helpers.tiers`)."""

from tests.helpers.tiers import (  # noqa: F401  (pytest finds hooks by name in this module)
    pytest_addoption,
    pytest_collection_finish,
    pytest_configure,
    pytest_deselected,
    pytest_runtest_makereport,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_testnodedown,
)
