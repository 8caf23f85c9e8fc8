"""Datasets for the DP-ICL audits: AG News, TREC, SAMSum, XSum.

* :class:`DatasetSpec` and :data:`DATASETS` -- how each dataset's columns map onto :class:`Example`;
* :func:`load_examples` -- shipped demo data (offline), local files, or the Hugging Face Hub;
* :func:`read_records` -- a user's own JSONL/JSON/CSV/Parquet file read into memory as columns, with nothing
  written anywhere (:mod:`~snapaudit_jax.utils.records`, shared with ``snapaudit finetune``; every user data file goes
  through it);
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
from snapaudit_jax.utils.records import read_records

__all__ = [
    "DATASETS",
    "AuditContext",
    "DatasetSpec",
    "Example",
    "get_spec",
    "load_examples",
    "read_records",
    "sample_audit_context",
]
