"""The PII experiment's data: the private and public corpora, the train/test split, canaries, tokenizer, scrubbing.

:func:`prepare_data` builds everything the variants train on and the attacks query, from a
:class:`~attacks.config.PIIConfig` alone (deterministic in its seeds), and raises every data or config error
before anything is trained or written. The BPE (:func:`train_tokenizer`) is trained on the public corpus only, so
its vocabulary holds no private PII.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from attacks.blackbox import frame
from attacks.config import (
    _TOKENIZER_BYTES_PER_ENTRY,
    MAX_VOCAB_SIZE,
    PIIConfig,
    check_base,
    check_one_run_design,
    check_sizes,
)
from attacks.corpus import CanarySet, Corpus, Record, make_canaries, make_corpus
from attacks.extraction import normalize_pii
from attacks.ner import Tagger, default_tagger, evaluate_tagger, scrub_text
from snapaudit_jax.models.tokenizer import Tokenizer
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.config import ConfigFileError
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.memory import check_fits
from snapaudit_jax.utils.progress import RunLog

__all__ = ["PreparedData", "prepare_data", "train_tokenizer"]


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE (``<|endoftext|>`` = id 0: start, end and padding) trained on ``texts``.

    Args:
      texts: the training texts (the public corpus).
      vocab_size: the vocabulary size, the special token and the 256 byte symbols included.

    Returns:
      A :class:`~snapaudit_jax.models.tokenizer.Tokenizer` without BOS, EOS and padding id 0.

    Raises:
      InputError: ``vocab_size`` not an integer in ``[1, MAX_VOCAB_SIZE]``, or too large for the trainer's tables
        in the machine's memory (the trainer would abort the process instead of raising).
    """
    from tokenizers import Tokenizer as Backend

    if validate.positive_int("vocab_size", vocab_size) > MAX_VOCAB_SIZE:
        raise InputError(f"vocab_size must be <= {MAX_VOCAB_SIZE} (int32 token ids), got {vocab_size}")
    check_fits("vocab_size", vocab_size * _TOKENIZER_BYTES_PER_ENTRY, f"the BPE trainer's tables of {vocab_size} "
               "entries")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(list(texts), trainer)
    return Tokenizer(backend=backend, bos_id=None, eos_ids=(0,), pad_id=0)


@dataclasses.dataclass
class PreparedData:
    """Everything the variants train on and the attacks query (built by :func:`prepare_data`).

    Attributes:
      corpus: the private corpus (training and held-out records).
      train: the training records (members), in corpus order.
      test: the held-out records (non-members: perplexity and membership inference).
      public: ``model.base = "scratch"``: the public corpus (same generator, other people), the tokenizer's and the
        baseline model's text; ``None`` with a pretrained base (the base is the public model).
      canaries: the canaries, each with its insertion coin.
      tokenizer: the base's tokenizer, or (``"scratch"``) the BPE trained on the public corpus.
      tagger: the tagger that scrubs the training text and finds PII in generated text.
      scrubbed: the training records as the scrubbed variants train on them (tagged PII replaced by ``[MASK]``).
      scrubbed_test: the held-out records scrubbed alike (the scrubbed variants' evaluation text).
      tagged_train_pii: ``(label, normalised string)`` pairs the tagger finds in the training records (Table
        III's training PII).
      tagger_quality: the tagger's precision and recall on the training records (:func:`attacks.ner.evaluate_tagger`).
    """

    corpus: Corpus
    train: list[Record]
    test: list[Record]
    public: Corpus | None
    canaries: CanarySet
    tokenizer: Tokenizer
    tagger: Tagger
    scrubbed: list[str]
    scrubbed_test: list[str]
    tagged_train_pii: set[tuple[str, str]]
    tagger_quality: dict[str, Any]


def prepare_data(config: PIIConfig, log: RunLog) -> PreparedData:
    """Builds the corpora, the split, the canaries, the tokenizer and the scrubbed text of ``config``.

    The held-out records are the first ``n_test`` of a permutation seeded by ``[config.seed, 11]``. With
    ``model.base = "scratch"`` the public corpus is the same generator with seed ``corpus.seed + 7919`` and
    ``public_records`` records, and the BPE is trained on it; with a pretrained base the tokenizer is the base's
    (its header is read, not its weights) and there is no public corpus.

    Args:
      config: the experiment.
      log: progress log (one summary line).

    Returns:
      The :class:`PreparedData`.

    Raises:
      ConfigFileError: a canary design the one-run bounds do not cover, a model that cannot fit in memory or a base
        that cannot be fine-tuned (:func:`attacks.config.check_base`), fewer
        distinct PII strings of ``inference.label`` in the training records than the largest
        ``inference.n_candidates``, or a framed record or canary longer than ``model.max_length``.
    """
    check_one_run_design(config)  # also for a PIIConfig built in code, not read by load_pii_config
    if config.model.pretrained:
        tokenizer, _ = check_base(config)  # the base's tokenizer (header only: the weights load after every check)
    else:
        check_sizes(config)
    corpus = make_corpus(config.corpus)
    perm = np.random.default_rng([config.seed, 11]).permutation(len(corpus.records))
    test_idx = set(int(i) for i in perm[:config.n_test])
    train = [r for r in corpus.records if r.index not in test_idx]
    test = [r for r in corpus.records if r.index in test_idx]
    public = None
    if not config.model.pretrained:
        # The public corpus: same generator, another seed (other people, organisations, canaries absent).
        public = make_corpus(dataclasses.replace(config.corpus, seed=config.corpus.seed + 7919,
                                                 n_records=config.public_records))
        tokenizer = train_tokenizer(public.texts, config.model.vocab_size)
    canaries = make_canaries(config.canaries)
    tagger = default_tagger(config.corpus.locale)
    texts = [r.text for r in train]
    predicted = tagger.tag(texts)
    quality = evaluate_tagger(predicted, [r.spans for r in train])
    scrubbed = [scrub_text(t, spans) for t, spans in zip(texts, predicted)]  # scrub(), without tagging twice
    test_texts = [r.text for r in test]
    scrubbed_test = [scrub_text(t, spans) for t, spans in zip(test_texts, tagger.tag(test_texts))]
    tagged_train_pii = {(s.label, normalize_pii(s.value)) for spans in predicted for s in spans}
    label = config.inference.label
    pool = {normalize_pii(s.value) for r in train for s in r.spans if s.label == label}
    if len(pool) < max(config.inference.sizes):
        raise ConfigFileError(
            f"inference.n_candidates: |C| = {max(config.inference.sizes)} needs at least that many distinct "
            f"{label} strings in the training records (the distractor pool, with the truth drawn once), got "
            f"{len(pool)}; lower it or raise corpus.n_people / corpus.n_records")
    public_texts = public.texts if public is not None else []
    public_part = (f"{len(public.records)} public" if public is not None
                   else f"public model: the base {config.model.base!r}")
    log(f"corpus: {len(train)} training records, {len(test)} held out, {public_part}; "
        f"{int(canaries.inserted.sum())}/{len(canaries.canaries)} canaries inserted; "
        f"tagger recall {quality['all']['recall']:.3f}, precision {quality['all']['precision']:.3f}")
    longest = max(len(frame(tokenizer, t)) for t in texts + scrubbed + test_texts + scrubbed_test + public_texts
                  + [c.text for c in canaries.canaries])
    if longest > config.model.max_length:
        raise ConfigFileError(f"model.max_length: must be >= {longest} (the longest framed record), "
                              f"got {config.model.max_length}")
    return PreparedData(corpus, train, test, public, canaries, tokenizer, tagger, scrubbed, scrubbed_test,
                        tagged_train_pii, quality)

