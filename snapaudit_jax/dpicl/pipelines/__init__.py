"""DP-ICL pipelines on real language models: prompts, cached model calls, the four pipelines (one module each
beside their shared ``base``, as :mod:`snapaudit_jax.mechanisms` holds one per mechanism)."""

from snapaudit_jax.dpicl.pipelines.base import AuditCase, Pipeline, keywords_of, make_case
from snapaudit_jax.dpicl.pipelines.candidates import CandidatePool, candidate_text
from snapaudit_jax.dpicl.pipelines.esa import EmbeddingPipeline
from snapaudit_jax.dpicl.pipelines.ksa import KeywordPipeline
from snapaudit_jax.dpicl.pipelines.poe import ProductOfExpertsPipeline
from snapaudit_jax.dpicl.pipelines.pv import PrivateVotingPipeline
from snapaudit_jax.dpicl.pipelines.registry import PIPELINES
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
