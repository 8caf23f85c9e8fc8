"""What the attack tests (``tests/attacks/``) share: a small corpus, a byte-level BPE, a tiny random GPT-2, hand-built
records, a scripted tagger and the slow float64 oracle of the model's log-likelihoods.

One tiny random GPT-2 (vocabulary ~300 byte-level BPE, 2 layers, width 32) and short texts keep compiled shapes
few: every call uses ``batch_size=BATCH``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attacks import CanaryConfig, CorpusConfig, Record, Span, make_canaries, make_corpus
from snapaudit_jax.models import Tokenizer
from snapaudit_jax.models.config import GPT2Config
from snapaudit_jax.models.decoders import GPT2

BATCH = 8
SMALL = CorpusConfig(n_records=211, n_people=97, n_orgs=11, n_cities=7, seed=3)


def bpe_tokenizer(texts) -> Tokenizer:
    """A byte-level BPE of 300 tokens trained on ``texts`` (``<|endoftext|>`` = 0: start, end and padding).

    Args:
      texts: the training texts.

    Returns:
      The tokenizer.
    """
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return Tokenizer(backend=tok, bos_id=None, eos_ids=(0,), pad_id=0)


def tiny_lm(corpus):
    """``(model, tokenizer)``: random GPT-2 (width 32, 2 layers, 64 positions) and a BPE trained on the corpus.

    Args:
      corpus: the corpus whose texts (and 50 canaries) train the BPE.

    Returns:
      ``(model, tokenizer)``.
    """
    tok = bpe_tokenizer(corpus.texts + [c.text for c in make_canaries(CanaryConfig(n_canaries=50)).canaries])
    return gpt2(tok, 7), tok


@functools.cache
def small_lm():
    """:func:`tiny_lm` of the ``SMALL`` corpus, built once per test process and shared by every attacks test module
    (none of them changes the model; one model object also lets them share the jitted kernels' compilations).

    Returns:
      ``(model, tokenizer)``.
    """
    return tiny_lm(make_corpus(SMALL))


def gpt2(tok, seed: int):
    """A random GPT-2 of width 32, 2 layers and 64 positions for ``tok``'s vocabulary.

    Args:
      tok: the tokenizer.
      seed: the initialisation seed.

    Returns:
      The NNX model.
    """
    cfg = GPT2Config(vocab_size=tok.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=64)
    return GPT2(cfg, nnx.Rngs(seed))


def record(index: int, parts) -> Record:
    """A record from ``[str | (label, value)]`` parts, spans computed while joining.

    Args:
      index: the record's index.
      parts: plain strings and ``(label, value)`` PII pieces, in order.

    Returns:
      The e-mail record.
    """
    text, spans = "", []
    for p in parts:
        if isinstance(p, tuple):
            spans.append(Span(len(text), len(text) + len(p[1]), p[0], p[1]))
            p = p[1]
        text += p
    return Record(index, "email", text, tuple(spans), (0, 1), 0)


SHORT = [
    record(0, ["Dear ", ("PERSON", "Alice Smith"), ", call ", ("PERSON", "Bob Jones"), "."]),
    record(1, ["Hi ", ("PERSON", "Carol White"), ", see ", ("ORG", "Lee LLC"), "."]),
    record(2, ["Dear ", ("PERSON", "Dan Brown"), ", write ", ("PERSON", "Alice Smith"), "."]),
]


class FixedTagger:
    """Test tagger: sample ``i`` holds one PERSON slot at offset ``min(4, len)``, valued ``values[i % n]``."""

    def __init__(self, values):
        """Keeps the values.

        Args:
          values: the PERSON values, cycled over the texts.
        """
        self.values = values

    def tag(self, texts):
        """One slot per text.

        Args:
          texts: the texts.

        Returns:
          One empty-width PERSON span per text.
        """
        return [[Span(min(4, len(t)), min(4, len(t)), "PERSON", self.values[i % len(self.values)])]
                for i, t in enumerate(texts)]


@functools.lru_cache(maxsize=4)
def _full_forward(graphdef):
    """Logits of one row of 64 tokens, all real, positions 0..63 (no padding, no mask, no cache)."""

    @jax.jit
    def logits(state, tokens):
        m = nnx.merge(graphdef, state)
        hidden, _ = m(tokens, jnp.arange(64)[None], jnp.ones((1, 64), bool))
        return m.logits(hidden)

    return logits


def slow_logprobs(model, ids) -> np.ndarray:
    """Oracle: ``log p(ids[t] | ids[:t])`` for ``t >= 1`` by a per-token float64 loop over the logits of the
    sequence followed by filler tokens (by causality the filler cannot change earlier logits).

    Args:
      model: a GPT-2 of 64 positions.
      ids: at most 64 token ids.

    Returns:
      ``(len(ids) - 1,)`` float64 log-probabilities.
    """
    graphdef, state = nnx.split(model)
    row = np.zeros((1, 64), np.int32)
    row[0, : len(ids)] = ids
    logits = np.asarray(_full_forward(graphdef)(state, jnp.asarray(row)), np.float64)[0]
    out = []
    for t in range(1, len(ids)):
        z = logits[t - 1] - logits[t - 1].max()
        out.append(z[ids[t]] - np.log(np.exp(z).sum()))
    return np.array(out)
