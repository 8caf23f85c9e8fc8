"""Named-entity tagging of PII, its evaluation against ground truth, and scrubbing.

Any object with ``tag(texts) -> list[list[Span]]`` is a :class:`Tagger` (a Flair or Presidio wrapper would
do). The default, :class:`GazetteerTagger`, is offline and fast: regular expressions for e-mail addresses,
phone numbers, postal addresses and dates, and gazetteers built from Faker's word lists (first and last names,
city prefixes and suffixes, street and company suffixes) for people, cities and organisations. It misses names
that are not in its gazetteers (the corpus's foreign names) by design: a scrubber is only as good as its
tagger, and what it misses is what a scrubbed model can still leak. Leakage measured with the same tagger is
therefore a lower bound (Lukas et al. 2023, Section V).

References:
  Lukas et al., "Analyzing Leakage of Personally Identifiable Information in Language Models", IEEE S&P 2023,
  Algorithm 1 (scrubbing) and Section IV-B (Flair/Presidio tagging).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from attacks.corpus import LABELS, Span
from snapaudit_jax.utils.errors import InputError

__all__ = ["Tagger", "GazetteerTagger", "default_tagger", "evaluate_tagger", "scrub", "scrub_text", "MASK"]

MASK = "[MASK]"

# Overlapping candidates are resolved by this priority, then by length (longest first), then by position.
_PRIORITY = {"EMAIL": 0, "PHONE": 1, "ADDRESS": 2, "DATE": 3, "ORG": 4, "PERSON": 5, "CITY": 6}

_MONTHS = ("January February March April May June July August September October November December").split()
_MONTH = "(?:" + "|".join(_MONTHS) + ")"
_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])")
_PHONE = re.compile(
    r"(?<![\w+-])(?:\+1-|001-)?(?:\(\d{3}\)\d{3}-\d{4}|\d{3}-\d{3}-\d{4}|\d{3}\.\d{3}\.\d{4}|\d{10})"
    r"(?:x\d{1,5})?(?![\w-])"
)
_DATES = (
    re.compile(rf"\b\d{{1,2}} {_MONTH} \d{{4}}\b"),
    re.compile(rf"\b{_MONTH} \d{{1,2}}, \d{{4}}\b"),
    re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),
    re.compile(r"\b\d{1,2}/\d{1,2}/\d{4}\b"),
)
_CAP = r"[A-Z][a-z']+(?:-[A-Z][a-z']+)?"
_PERSON = re.compile(rf"(?=\b({_CAP}) ({_CAP})\b)")
_WORD = re.compile(rf"\b{_CAP}\b")


@runtime_checkable
class Tagger(Protocol):
    """A PII tagger: one list of non-overlapping :class:`~attacks.corpus.Span` per text, sorted by start."""

    def tag(self, texts: Sequence[str]) -> list[list[Span]]:
        """Tags every text.

        Args:
          texts: ``n`` texts.

        Returns:
          ``n`` lists of non-overlapping spans, each sorted by start.
        """
        ...


class GazetteerTagger:
    """Regex + gazetteer PII tagger (see the module docstring)."""

    def __init__(
        self,
        first_names: Iterable[str],
        last_names: Iterable[str],
        city_prefixes: Iterable[str],
        city_suffixes: Iterable[str],
        street_suffixes: Iterable[str],
        company_suffixes: Iterable[str],
        labels: Iterable[str] = LABELS,
    ):
        """Compiles the tagger's patterns from its gazetteers.

        Args:
          first_names: person first-name gazetteer.
          last_names: person last-name gazetteer.
          city_prefixes: city-name prefixes (cities are ``[prefix] name[suffix]`` with a name from the
            gazetteers and at least one affix).
          city_suffixes: city-name suffixes.
          street_suffixes: last word of a street name (``Avenue``, ``Forks`` ...).
          company_suffixes: ``Inc``, ``LLC`` ...; organisations are ``Last Suffix``, ``Last-Last`` or
            ``Last, Last and Last``.
          labels: the labels it reports (a subset of :data:`~attacks.corpus.LABELS`).

        Raises:
          ValueError: a label outside :data:`~attacks.corpus.LABELS`.
        """
        self.first_names = frozenset(first_names)
        self.last_names = frozenset(last_names)
        self.names = self.first_names | self.last_names
        self.city_prefixes = tuple(city_prefixes)
        self.city_suffixes = tuple(sorted(set(city_suffixes), key=len, reverse=True))
        self.labels = tuple(labels)
        for label in self.labels:
            if label not in LABELS:
                raise InputError(f"labels must be a subset of {', '.join(LABELS)}, got {label!r}")
        street = "|".join(sorted(map(re.escape, set(street_suffixes)), key=len, reverse=True))
        company = "|".join(sorted(map(re.escape, set(company_suffixes)), key=len, reverse=True))
        prefixes = "|".join(map(re.escape, self.city_prefixes))
        # number, street words, street suffix, optional unit, city, state, ZIP (one line).
        self._address = re.compile(
            rf"\b\d{{1,6}}(?: [A-Z][a-z']+)+? (?:{street})(?: (?:Apt\.|Suite) \d{{1,5}})?, "
            rf"(?:[A-Z][a-z']+ )?[A-Z][a-z']+, [A-Z]{{2}} \d{{5}}(?:-\d{{4}})?\b"
        )
        self._org_suffix = re.compile(rf"(?=\b({_CAP}) (?:{company})\b)")
        self._org_suffix_full = re.compile(rf"\b{_CAP} (?:{company})\b")
        self._org_hyphen = re.compile(r"\b([A-Z][a-z']+)-([A-Z][a-z']+)\b")
        self._org_and = re.compile(r"\b([A-Z][a-z']+), ([A-Z][a-z']+) and ([A-Z][a-z']+)\b")
        self._city = re.compile(rf"\b(?:(?:{prefixes}) )?[A-Z][a-z']+\b")
        self._city_prefix = re.compile(rf"^(?:{prefixes}) ")

    # --- candidates ------------------------------------------------------------
    def _is_city(self, text: str) -> bool:
        m = self._city_prefix.match(text)
        word = text[m.end():] if m else text
        if m and word in self.first_names:
            return True
        for suffix in self.city_suffixes:
            if word.endswith(suffix) and word[: -len(suffix)] in self.names:
                return True
        return False

    def _candidates(self, text: str) -> list[tuple[int, int, str]]:
        out: list[tuple[int, int, str]] = []
        out += [(m.start(), m.end(), "EMAIL") for m in _EMAIL.finditer(text)]
        out += [(m.start(), m.end(), "PHONE") for m in _PHONE.finditer(text)]
        out += [(m.start(), m.end(), "ADDRESS") for m in self._address.finditer(text)]
        for pattern in _DATES:
            out += [(m.start(), m.end(), "DATE") for m in pattern.finditer(text)]
        for m in self._org_suffix.finditer(text):
            if m.group(1) in self.last_names:
                full = self._org_suffix_full.match(text, m.start())
                if full:
                    out.append((full.start(), full.end(), "ORG"))
        for m in self._org_hyphen.finditer(text):
            if m.group(1) in self.last_names and m.group(2) in self.last_names:
                out.append((m.start(), m.end(), "ORG"))
        for m in self._org_and.finditer(text):
            if all(g in self.last_names for g in m.groups()):
                out.append((m.start(), m.end(), "ORG"))
        for m in _PERSON.finditer(text):
            first, last = m.group(1), m.group(2)
            if first in self.first_names and last in self.last_names:
                out.append((m.start(1), m.end(2), "PERSON"))
        for m in self._city.finditer(text):
            if self._is_city(m.group(0)):
                out.append((m.start(), m.end(), "CITY"))
        return out

    def tag_one(self, text: str) -> list[Span]:
        """Spans of one text (non-overlapping, sorted by start).

        Args:
          text: the text.

        Returns:
          Its spans of the reported labels; overlapping candidates are resolved by label priority, then length.
        """
        chosen: list[tuple[int, int, str]] = []
        for start, end, kind in sorted(self._candidates(text), key=lambda c: (_PRIORITY[c[2]], c[0] - c[1], c[0])):
            if all(end <= s or start >= e for s, e, _ in chosen):
                chosen.append((start, end, kind))
        spans = []
        for start, end, kind in sorted(chosen):
            label = "LOC" if kind in ("ADDRESS", "CITY") else kind
            if label in self.labels:
                spans.append(Span(start, end, label, text[start:end]))
        return spans

    def tag(self, texts: Sequence[str]) -> list[list[Span]]:
        """Spans of every text.

        Args:
          texts: ``n`` texts (a sequence of strings, not one string).

        Returns:
          ``n`` lists of spans (:meth:`tag_one` of each text).

        Raises:
          ValueError: an element of ``texts`` is not a string.
        """
        if isinstance(texts, str):
            raise InputError("texts must be a sequence of strings, got a single str")
        out = []
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InputError(f"texts[{i}] must be a str, got {type(text).__name__}")
            out.append(self.tag_one(text))
        return out


def default_tagger(locale: str = "en_US", labels: Iterable[str] = LABELS) -> GazetteerTagger:
    """A :class:`GazetteerTagger` whose gazetteers are the word lists of Faker's ``locale`` providers.

    Args:
      locale: the Faker locale (its ``person``, ``address`` and ``company`` providers).
      labels: the labels it reports.

    Returns:
      The tagger.

    Raises:
      ValueError: ``locale`` has no Faker person, address or company provider, or a label is unknown.
    """
    import importlib

    def provider(kind: str):
        try:
            return importlib.import_module(f"faker.providers.{kind}.{locale}").Provider
        except ImportError:
            raise InputError(f"locale must have Faker {kind} providers, got {locale!r}") from None

    person, address, company = provider("person"), provider("address"), provider("company")
    return GazetteerTagger(
        first_names=list(person.first_names),
        last_names=list(person.last_names),
        city_prefixes=getattr(address, "city_prefixes", ()),
        city_suffixes=getattr(address, "city_suffixes", ()),
        street_suffixes=getattr(address, "street_suffixes", ()),
        company_suffixes=getattr(company, "company_suffixes", ()),
        labels=labels,
    )


def evaluate_tagger(predicted: Sequence[Sequence[Span]], truth: Sequence[Sequence[Span]]) -> dict:
    """Span-level precision and recall per label (exact match of start, end and label).

    Args:
      predicted: tagger output, one list of spans per text.
      truth: ground-truth spans, one list per text (same length).

    Returns:
      ``{label: {"precision", "recall", "f1", "tp", "fp", "fn"}}`` for every label seen in either, plus
      ``"all"`` (micro-averaged). A rate with a zero denominator is ``nan``.

    Raises:
      ValueError: the two lists differ in length.
    """
    if len(predicted) != len(truth):
        raise InputError(f"predicted and truth must have the same length, got {len(predicted)} and {len(truth)}")
    counts: dict[str, list[int]] = {}
    for pred, true in zip(predicted, truth):
        p = {(s.start, s.end, s.label) for s in pred}
        t = {(s.start, s.end, s.label) for s in true}
        for key, group in (("tp", p & t), ("fp", p - t), ("fn", t - p)):
            for _, _, label in group:
                for name in (label, "all"):
                    counts.setdefault(name, [0, 0, 0])[("tp", "fp", "fn").index(key)] += 1
    out = {}
    for label in sorted(counts, key=lambda k: (k == "all", k)):
        tp, fp, fn = counts[label]
        precision = tp / (tp + fp) if tp + fp else float("nan")
        recall = tp / (tp + fn) if tp + fn else float("nan")
        f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else float("nan")
        out[label] = {"precision": precision, "recall": recall, "f1": f1, "tp": tp, "fp": fp, "fn": fn}
    return out


def scrub_text(text: str, spans: Iterable[Span], mask: str = MASK) -> str:
    """``text`` with every span replaced by ``mask`` (spans must not overlap).

    Args:
      text: the text.
      spans: spans of ``text`` (any order).
      mask: the replacement of each span.

    Returns:
      The scrubbed text.

    Raises:
      ValueError: spans overlap or fall outside the text.
    """
    parts = []
    last = 0
    for s in sorted(spans, key=lambda s: s.start):
        if s.start < last or s.end > len(text) or s.start > s.end:
            raise InputError(f"spans must be non-overlapping and inside the text (length {len(text)}), got {s}")
        parts += [text[last:s.start], mask]
        last = s.end
    parts.append(text[last:])
    return "".join(parts)


def scrub(texts: Sequence[str], tagger: Tagger | None = None, *, mask: str = MASK) -> list[str]:
    """Scrubbing (Lukas et al. 2023, Algorithm 1): every PII span the tagger finds becomes ``mask``.

    Args:
      texts: the texts.
      tagger: a :class:`Tagger` (default: :func:`default_tagger`).
      mask: the replacement string.

    Returns:
      The scrubbed texts; text outside the tagged spans is unchanged.
    """
    tagger = default_tagger() if tagger is None else tagger
    return [scrub_text(t, spans, mask) for t, spans in zip(texts, tagger.tag(list(texts)))]
