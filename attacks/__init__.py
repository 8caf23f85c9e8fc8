"""PII leakage attacks on fine-tuned decoder LMs (Lukas et al., IEEE S&P 2023) and a DP-SGD canary audit.

Stages, one module each:

* :mod:`~attacks.corpus` -- synthetic e-mail / court-case corpus with ground-truth PII spans, Zipf-controlled
  repetition, canaries;
* :mod:`~attacks.ner` -- the :class:`Tagger` protocol, the offline gazetteer tagger, its evaluation, scrubbing;
* :mod:`~attacks.blackbox` -- the black-box API: batched jitted log-likelihoods and top-k sampling;
* :mod:`~attacks.extraction` -- PII extraction, observed (Algorithm 3) and lazy (Algorithm 4);
* :mod:`~attacks.reconstruction` -- PII reconstruction (Algorithm 6);
* :mod:`~attacks.inference` -- PII inference over a candidate set;
* :mod:`~attacks.mia` -- loss-based membership inference, ROC AUC, TPR at low FPR;
* :mod:`~attacks.canary` -- epsilon lower bounds from canary scores (and jax_privacy's auditor).

The ``snapaudit pii`` experiment, config -> run -> report: :mod:`~attacks.config` (:class:`~attacks.config.PIIConfig`,
``load_pii_config``), :mod:`~attacks.data` (corpora, split, tokenizer, scrubbing), :mod:`~attacks.run` (training
the four variants, the attacks, resume: ``run_pii``), :mod:`~attacks.report` (``table.md``, ``leakage.png``) and
:mod:`~attacks.command`.

Every attack takes ``(model, tokenizer, records or texts, config, key)`` -- an NNX decoder from
:mod:`snapaudit_jax.models.decoders`, its :class:`~snapaudit_jax.models.tokenizer.Tokenizer`, a frozen config --
and returns a plain dict of metrics with per-item details.
"""

from snapaudit_jax.utils.lazy import lazy_package

# Each name loads on first use (:mod:`snapaudit_jax.utils.lazy`): the ``snapaudit`` command line registers
# ``snapaudit pii`` through :mod:`attacks.command` without loading JAX.
_EXPORTS = {
    "blackbox": ("SequenceScores", "continuation_logprobs", "encode_texts", "frame", "sample_texts", "score_texts"),
    "canary": ("CanaryAuditConfig", "canary_audit", "canary_scores", "epsilon_lower_bound", "jax_privacy_bounds"),
    "corpus": (
        "LABELS", "Canary", "CanaryConfig", "CanarySet", "Corpus", "CorpusConfig", "Person", "PublicFiller", "Record",
        "Span", "insert_canaries", "make_canaries", "make_corpus", "pii_record_counts", "zipf_counts",
    ),
    "extraction": (
        "ExtractionConfig", "extraction_attack", "extraction_metrics", "extraction_samples", "lazy_extractability",
        "normalize_pii", "tagged_pii",
    ),
    "config": ("ModelConfig", "PIIConfig", "TrainingConfig", "load_pii_config"),
    "inference": ("InferenceConfig", "candidate_sets", "inference_attack"),
    "mia": ("membership_scores", "mia_attack", "roc_auc", "roc_curve", "roc_point", "tpr_at_fpr_heldout"),
    "ner": ("MASK", "GazetteerTagger", "Tagger", "default_tagger", "evaluate_tagger", "scrub", "scrub_text"),
    "reconstruction": (
        "T_MASK", "Query", "ReconstructionConfig", "make_queries", "pick_candidate", "rank_candidates",
        "reconstruction_attack", "sample_candidates",
    ),
    "run": ("run_pii",),
}
__all__ = [attr for attrs in _EXPORTS.values() for attr in attrs]
__getattr__, __dir__ = lazy_package(__name__, _EXPORTS, ("data", "report"))
