"""The pipelines by name (``[pipelines.<name>]`` in an audit configuration)."""

from __future__ import annotations

from snapaudit_jax.dpicl.pipelines.esa import EmbeddingPipeline
from snapaudit_jax.dpicl.pipelines.ksa import KeywordPipeline
from snapaudit_jax.dpicl.pipelines.poe import ProductOfExpertsPipeline
from snapaudit_jax.dpicl.pipelines.pv import PrivateVotingPipeline

__all__ = ["PIPELINES"]

PIPELINES = {"pv": PrivateVotingPipeline, "poe": ProductOfExpertsPipeline, "esa": EmbeddingPipeline,
             "ksa": KeywordPipeline}
