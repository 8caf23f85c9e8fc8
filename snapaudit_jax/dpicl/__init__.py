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

from snapaudit_jax.utils.lazy import lazy_package

# Each loads on first use (:mod:`snapaudit_jax.utils.lazy`): the ``snapaudit`` command line registers
# ``snapaudit audit`` through :mod:`~snapaudit_jax.dpicl.command` without loading the pipelines or JAX.
_EXPORTS = {"config": ("AuditConfig", "load_config"), "run": ("run_audit",)}
_SUBMODULES = ("data", "msgs", "one_run", "pipelines", "report")
__all__ = [*_EXPORTS, *_SUBMODULES, *(attr for attrs in _EXPORTS.values() for attr in attrs)]
__getattr__, __dir__ = lazy_package(__name__, _EXPORTS, _SUBMODULES)
