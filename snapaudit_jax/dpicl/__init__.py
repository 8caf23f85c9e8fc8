"""The DP-ICL application: real pipelines on a language model, audited end to end (``snapaudit audit``).

* :mod:`~snapaudit_jax.dpicl.data` -- the datasets (AG News, TREC, SAMSum, XSum) and audit contexts;
* :mod:`~snapaudit_jax.dpicl.pipelines` -- prompts and the four pipelines (PV, PoE, ESA, KSA) over a model;
* :mod:`~snapaudit_jax.dpicl.msgs` -- ESA signal-pair search (GS, MSGS);
* :mod:`~snapaudit_jax.dpicl.one_run` -- one-run audits of the pipelines (many canaries in one private set);
* :mod:`~snapaudit_jax.dpicl.run` -- the ``snapaudit audit`` command: :func:`load_config` -> :func:`run_audit`.
"""

from snapaudit_jax.dpicl import data, msgs, one_run, pipelines, run
from snapaudit_jax.dpicl.run import AuditConfig, load_config, run_audit

__all__ = ["AuditConfig", "data", "load_config", "msgs", "one_run", "pipelines", "run", "run_audit"]
