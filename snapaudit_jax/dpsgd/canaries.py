"""Audit canaries for DP-SGD: unique random secrets in a fixed template, each inserted with its own coin.

A canary (Carlini et al. 2019) is a random secret in a fixed template ("my pin is 7302 9144"); each is inserted
independently with probability ``insert_probability`` (``repetitions`` times), and the others are held out to give
the score distribution of non-members. :func:`make_canaries` draws them, :func:`insert_canaries` appends the
inserted ones to the training texts. The secrets are uniform over ``digits``-digit strings, so the randomness space
of the exposure metric (:mod:`snapaudit_jax.estimation.exposure`) is every such string, written in groups of four
(:func:`group_digits`) in the same template (:func:`canary_continuation`).

Everything is deterministic for a given configuration (a NumPy ``Generator`` seeded with ``[seed, 0xCA7A]``).

References:
  Carlini, Liu, Erlingsson, Kos, Song, "The Secret Sharer: Evaluating and Testing Unintended Memorization in
  Neural Networks", USENIX Security 2019 (canaries).
  Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023 (independent insertion
  with probability 1/2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "Canary",
    "CanaryConfig",
    "CanarySet",
    "canary_continuation",
    "canary_prefix",
    "group_digits",
    "insert_canaries",
    "make_canaries",
]


MAX_DIGITS = 32
"""The longest secret (digits): its randomness space 10**32 is far beyond any exposure estimate's reach."""


@dataclasses.dataclass(frozen=True)
class CanaryConfig:
    """Configuration of :func:`make_canaries` (frozen, hashable).

    Attributes:
      n_canaries: number of canaries (inserted and held out together).
      template: text with one ``{secret}`` field, e.g. ``"my pin is {secret}"``.
      digits: digits of each secret (written in groups of four), in ``[4, MAX_DIGITS]``.
      repetitions: canary ``i`` is inserted ``repetitions[i % len(repetitions)]`` times if it is inserted.
      insert_probability: each canary is inserted independently with this probability. The one-run auditor
        of Steinke et al. 2023 requires exactly ``1/2`` for a claim with ``delta > 0``
        (:func:`snapaudit_jax.estimation.one_run.check_design`; the PII experiment's canary audit
        (``attacks.canary``) refuses any other for jax_privacy's cross-check too); the Clopper-Pearson bounds of
        that audit condition on membership and allow any value in ``(0, 1)``.
      seed: seeds the secrets and the inclusion draws.
    """

    n_canaries: int = 200
    template: str = "my pin is {secret}"
    digits: int = 8
    repetitions: tuple[int, ...] = (1,)
    insert_probability: float = 0.5
    seed: int = 0

    def validate(self) -> "CanaryConfig":
        """Checks every field; returns ``self`` (errors name the field, the rule and the value)."""
        validate.positive_int("n_canaries", self.n_canaries, minimum=2)
        if not isinstance(self.template, str) or self.template.count("{secret}") != 1:
            raise InputError(f"template must contain '{{secret}}' exactly once, got {self.template!r}")
        if self.template.split("{secret}")[0].strip() == "":
            raise InputError(f"template must have a non-empty prefix before '{{secret}}', got {self.template!r}")
        validate.positive_int("digits", self.digits, minimum=4, maximum=MAX_DIGITS)
        if not self.repetitions:
            raise InputError("repetitions must not be empty, got ()")
        for r in self.repetitions:
            validate.positive_int("repetitions[...]", r)
        validate.open_unit("insert_probability", self.insert_probability)
        validate.positive_int("seed", self.seed, minimum=0)
        if self.n_canaries > 10 ** self.digits // 2:
            raise InputError(f"n_canaries must be <= 10**digits / 2 = {10 ** self.digits // 2}, got {self.n_canaries}")
        return self


@dataclasses.dataclass(frozen=True)
class Canary:
    """One canary: ``text == prefix + continuation``, the secret is the continuation's digits."""

    index: int
    text: str
    prefix: str
    continuation: str
    secret: str
    repetitions: int
    inserted: bool


@dataclasses.dataclass(frozen=True)
class CanarySet:
    """Output of :func:`make_canaries`: all canaries, inserted (members) and held out (non-members)."""

    config: CanaryConfig
    canaries: tuple[Canary, ...]

    @property
    def inserted(self) -> np.ndarray:
        """``(n_canaries,)`` bool membership."""
        return np.array([c.inserted for c in self.canaries], bool)

    @property
    def repetitions(self) -> np.ndarray:
        """``(n_canaries,)`` int64 times each canary is inserted if it is inserted."""
        return np.array([c.repetitions for c in self.canaries], np.int64)

    @property
    def insert_probability(self) -> float:
        """The probability with which each canary was independently inserted (``config.insert_probability``)."""
        return float(self.config.insert_probability)


def group_digits(digits: str) -> str:
    """A secret as the canaries write it: the digits in groups of four, separated by single spaces.

    Args:
      digits: a string of decimal digits (``"73029144"``); spaces already in it are ignored.

    Returns:
      The grouped secret (``"7302 9144"``).

    Raises:
      InputError: ``digits`` is empty or holds anything but digits and spaces.
    """
    raw = digits.replace(" ", "") if isinstance(digits, str) else None
    if not raw or not (raw.isascii() and raw.isdigit()):
        raise InputError(f"digits must be a non-empty string of decimal digits, got {digits!r}")
    return " ".join(raw[i:i + 4] for i in range(0, len(raw), 4))


def canary_prefix(template: str) -> str:
    """The prefix every canary of ``template`` shares: the text before ``{secret}``, trailing whitespace removed.

    Args:
      template: a template with one ``{secret}`` field.

    Returns:
      The prefix (``"my pin is"`` for ``"my pin is {secret}"``).

    Raises:
      InputError: ``template`` does not contain ``{secret}`` exactly once, or nothing but whitespace precedes it.
    """
    if not isinstance(template, str) or template.count("{secret}") != 1:
        raise InputError(f"template must contain '{{secret}}' exactly once, got {template!r}")
    prefix = template.split("{secret}")[0].rstrip()
    if not prefix.strip():
        raise InputError(f"template must have a non-empty prefix before '{{secret}}', got {template!r}")
    return prefix


def canary_continuation(template: str, secret: str) -> str:
    """The text a model must emit after :func:`canary_prefix` to write ``secret`` in ``template``.

    It starts with the whitespace between the prefix and the secret (``" 7302 9144"``) and ends with the template's
    text after ``{secret}``: exactly a :class:`Canary`'s ``continuation`` for that secret.

    Args:
      template: a template with one ``{secret}`` field.
      secret: the digits, grouped or not (grouped here by :func:`group_digits`).

    Returns:
      The continuation text.

    Raises:
      InputError: an invalid template or secret.
    """
    prefix = canary_prefix(template)
    return template.format(secret=group_digits(secret))[len(prefix):]


def make_canaries(config: CanaryConfig = CanaryConfig()) -> CanarySet:
    """Unique random secrets in ``config.template``, each inserted independently with ``insert_probability``.

    Args:
      config: the canaries' configuration.

    Returns:
      A :class:`CanarySet`. Secrets are distinct, uniform over ``digits``-digit strings (leading zeros allowed).

    Raises:
      ValueError: an invalid configuration.
    """
    config.validate()
    rng = np.random.default_rng([config.seed, 0xCA7A])
    secrets: dict[str, None] = {}
    while len(secrets) < config.n_canaries:
        digits = "".join(str(int(d)) for d in rng.integers(0, 10, config.digits))
        secrets.setdefault(group_digits(digits), None)
    inserted = rng.random(config.n_canaries) < config.insert_probability
    prefix = canary_prefix(config.template)
    out = []
    for i, secret in enumerate(secrets):
        text = config.template.format(secret=secret)
        reps = config.repetitions[i % len(config.repetitions)]
        out.append(Canary(i, text, prefix, text[len(prefix):], secret, int(reps), bool(inserted[i])))
    return CanarySet(config, tuple(out))


def insert_canaries(texts: Sequence[str], canaries: CanarySet) -> list[str]:
    """Training texts followed by every inserted canary, each ``repetitions`` times (as separate records).

    Order does not matter under Poisson sampling; the original texts keep their indices.

    Args:
      texts: the training texts.
      canaries: the canaries; the inserted ones are appended.

    Returns:
      ``texts`` followed by the inserted canaries' texts.
    """
    out = list(texts)
    for c in canaries.canaries:
        if c.inserted:
            out.extend([c.text] * c.repetitions)
    return out
