"""DP-ICL pipelines on real language models: prompts, cached model calls, the four pipelines."""

from snapaudit_jax.dpicl.pipelines.dpicl import (
    PIPELINES,
    AuditCase,
    CandidatePool,
    EmbeddingPipeline,
    KeywordPipeline,
    Pipeline,
    PrivateVotingPipeline,
    ProductOfExpertsPipeline,
    candidate_text,
    keywords_of,
    make_case,
)
from snapaudit_jax.models.oracle import CallStats, LLMOracle

__all__ = [
    "PIPELINES",
    "AuditCase",
    "CallStats",
    "CandidatePool",
    "EmbeddingPipeline",
    "KeywordPipeline",
    "LLMOracle",
    "Pipeline",
    "PrivateVotingPipeline",
    "ProductOfExpertsPipeline",
    "candidate_text",
    "keywords_of",
    "make_case",
]
