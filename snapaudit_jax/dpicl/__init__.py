"""The DP-ICL application: real pipelines on a language model, audited end to end (``snapaudit audit``).

* :mod:`~snapaudit_jax.dpicl.data` -- the datasets (AG News, TREC, SAMSum, XSum) and audit contexts;
* :mod:`~snapaudit_jax.dpicl.pipelines` -- prompts and the four pipelines (PV, PoE, ESA, KSA) over a model;
* :mod:`~snapaudit_jax.dpicl.msgs` -- ESA signal-pair search (GS, MSGS);
* :mod:`~snapaudit_jax.dpicl.one_run` -- one-run audits of the pipelines (many canaries in one private set);
* :mod:`~snapaudit_jax.dpicl.config` -- the ``snapaudit audit`` configuration (:func:`load_config`);
* :mod:`~snapaudit_jax.dpicl.run` -- :func:`run_audit`: Phase A on the model, then the active and passive audits;
* :mod:`~snapaudit_jax.dpicl.report` -- ``table.md`` and the plots;
* :mod:`~snapaudit_jax.dpicl.command` -- the ``snapaudit audit`` command object.
"""

from snapaudit_jax.dpicl import config, data, msgs, one_run, pipelines, report, run
from snapaudit_jax.dpicl.config import AuditConfig, load_config
from snapaudit_jax.dpicl.run import run_audit

__all__ = ["AuditConfig", "config", "data", "load_config", "msgs", "one_run", "pipelines", "report", "run", "run_audit"]
