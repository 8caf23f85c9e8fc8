"""Datasets for the DP-ICL audits: AG News, TREC, SAMSum, XSum.

* :class:`DatasetSpec` and :data:`DATASETS` -- how each dataset's columns map onto :class:`Example`;
* :func:`load_examples` -- shipped demo data (offline), local files, or the Hugging Face Hub;
* :func:`sample_audit_context` -- a canary and neighbouring exemplar contexts (:class:`AuditContext`).
"""

from snapaudit_jax.dpicl.data.datasets import (
    DATASETS,
    AuditContext,
    DatasetSpec,
    Example,
    get_spec,
    load_examples,
    sample_audit_context,
)

__all__ = [
    "DATASETS",
    "AuditContext",
    "DatasetSpec",
    "Example",
    "get_spec",
    "load_examples",
    "sample_audit_context",
]
