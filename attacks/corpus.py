"""Synthetic PII corpus with ground-truth spans, controlled PII repetition, and audit canaries.

Records imitate the two private domains of Lukas et al. 2023 (Enron e-mails and ECHR court cases): short
e-mail-style and court-case-style texts that mention people (``PERSON``), their e-mail addresses (``EMAIL``),
phone numbers (``PHONE``) and postal addresses (``LOC``), organisations (``ORG``), cities (``LOC``) and dates
(``DATE``). Every PII string is recorded as a :class:`Span` (character offsets, label, string) while the text is
rendered, so the ground truth is exact.

Repetition is *controlled*, not sampled: the ``n_records * people_per_record`` person slots are divided among a
pool of ``n_people`` people in proportion to a Zipf law ``w_i ~ (i + 1)^-s`` by largest remainders
(:func:`zipf_counts`), so person ``i`` is mentioned in exactly ``counts[i]`` records (some people in hundreds of
records, many in one, some in none: these are PII that the training data does not contain). Organisations are
allocated the same way (one per record).

Canaries (:func:`make_canaries`) are unique random secrets in a fixed template ("my pin is 7302 9144"); each is
inserted independently with probability ``insert_probability`` (``repetitions`` times), and the others are held
out to give the score distribution of non-members. They live in the engine
(:mod:`snapaudit_jax.dpsgd.canaries`, shared with ``snapaudit finetune``) and are re-exported here.

Everything is deterministic for a given configuration (Faker instances seeded with ``seed_instance`` and a NumPy
``Generator``), for a given installed Faker version: Faker's word lists may change between releases.

References:
  Lukas, Salem, Sim, Tople, Wutschitz, Zanella-Béguelin, "Analyzing Leakage of Personally Identifiable
  Information in Language Models", IEEE S&P 2023 (Sections III-IV, Table VII).
  Carlini, Liu, Erlingsson, Kos, Song, "The Secret Sharer", USENIX Security 2019 (canaries).
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from snapaudit_jax.dpsgd.canaries import Canary, CanaryConfig, CanarySet, insert_canaries, make_canaries
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "LABELS",
    "Span",
    "Person",
    "Record",
    "CorpusConfig",
    "Corpus",
    "make_corpus",
    "zipf_counts",
    "pii_record_counts",
    "PublicFiller",
    "Canary",
    "CanaryConfig",
    "CanarySet",
    "make_canaries",
    "insert_canaries",
]

LABELS = ("PERSON", "EMAIL", "PHONE", "LOC", "DATE", "ORG")
KINDS = ("email", "court")


@dataclasses.dataclass(frozen=True, order=True)
class Span:
    """One PII mention: ``text[start:end] == value`` with entity ``label``."""

    start: int
    end: int
    label: str
    value: str


@dataclasses.dataclass(frozen=True)
class Person:
    """A member of the people pool: the PII that travels with a name."""

    name: str
    email: str
    phone: str
    address: str
    locale: str


@dataclasses.dataclass(frozen=True)
class Record:
    """One training record.

    Attributes:
      index: position in the corpus.
      kind: ``"email"`` or ``"court"``.
      text: the record.
      spans: ground-truth PII spans, sorted by ``start``, non-overlapping.
      people: pool indices of the people the record mentions (distinct).
      org: pool index of the organisation it mentions.
    """

    index: int
    kind: str
    text: str
    spans: tuple[Span, ...]
    people: tuple[int, ...]
    org: int


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
    """Configuration of :func:`make_corpus` (frozen, hashable).

    Attributes:
      n_records: number of records.
      seed: seeds Faker and the structural random choices.
      locale: Faker locale of the people pool (and of the default tagger's gazetteer).
      n_people: size of the people pool.
      zipf_exponent: ``s >= 0`` of the person and organisation repetition law (``0``: as even as possible).
      people_per_record: distinct people mentioned per record (the templates use 2).
      n_orgs: size of the organisation pool.
      n_cities: size of the city pool (cities are drawn uniformly per record).
      email_fraction: probability that a record is e-mail-style (else court-case-style).
      foreign_name_fraction: fraction of the pool whose names come from ``foreign_locales`` (names a
        gazetteer tagger for ``locale`` mostly misses; their other PII stays in ``locale``'s formats).
      foreign_locales: Faker locales of the foreign names.
      year_range: dates are uniform over ``[year_range[0], year_range[1]]``.
      record_topics: open each record with a subject line drawn per record (not PII), the record-specific
        context of real e-mails and cases; without it a record's only distinctive content is its PII.
    """

    n_records: int = 1000
    seed: int = 0
    locale: str = "en_US"
    n_people: int = 300
    zipf_exponent: float = 1.0
    people_per_record: int = 2
    n_orgs: int = 40
    n_cities: int = 25
    email_fraction: float = 0.5
    foreign_name_fraction: float = 0.05
    foreign_locales: tuple[str, ...] = ("de_DE", "fr_FR", "es_ES")
    year_range: tuple[int, int] = (1990, 2022)
    record_topics: bool = True

    def validate(self) -> "CorpusConfig":
        """Checks every field; returns ``self``.

        Raises:
          ValueError: naming the field, the rule and the value.
        """
        validate.positive_int("n_records", self.n_records)
        validate.positive_int("seed", self.seed, minimum=0)
        validate.positive_int("n_people", self.n_people)
        validate.nonnegative_float("zipf_exponent", self.zipf_exponent)
        if self.people_per_record != 2:
            raise InputError(f"people_per_record must be 2 (the templates mention two people), "
                             f"got {self.people_per_record!r}")
        if self.n_people < self.people_per_record:
            raise InputError(f"n_people must be >= people_per_record={self.people_per_record}, got {self.n_people}")
        validate.positive_int("n_orgs", self.n_orgs)
        validate.positive_int("n_cities", self.n_cities)
        for name in ("email_fraction", "foreign_name_fraction"):
            value = validate.nonnegative_float(name, getattr(self, name))
            if value > 1.0:
                raise InputError(f"{name} must be in [0, 1], got {value!r}")
        if self.foreign_name_fraction > 0 and not self.foreign_locales:
            raise InputError("foreign_locales must not be empty when foreign_name_fraction > 0, got ()")
        _check_locale("locale", self.locale, tagger=True)
        for loc in self.foreign_locales:
            _check_locale("foreign_locales[...]", loc)
        if not isinstance(self.record_topics, bool):
            raise InputError(f"record_topics must be true or false, got {self.record_topics!r}")
        lo, hi = self.year_range
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi <= 9999):
            raise InputError(f"year_range must be (first, last) years with 1 <= first <= last <= 9999, "
                             f"got {self.year_range!r}")
        head = int(zipf_counts(self.n_records * self.people_per_record, self.n_people, self.zipf_exponent)[0])
        if head > self.n_records:
            raise InputError(
                f"zipf_exponent={self.zipf_exponent} puts the most frequent person in {head} records, more than "
                f"n_records={self.n_records}: lower zipf_exponent or raise n_people")
        return self


def _check_locale(name: str, locale, *, tagger: bool = False) -> None:
    """A Faker locale; ``tagger``: also with the person, address and company providers the default tagger reads."""
    import importlib.util

    from faker.config import AVAILABLE_LOCALES

    if locale not in AVAILABLE_LOCALES:
        raise InputError(f"{name} must be a Faker locale such as 'en_US', got {locale!r}")
    if not tagger:
        return
    kinds = ("person", "address", "company")
    missing = [k for k in kinds if importlib.util.find_spec(f"faker.providers.{k}.{locale}") is None]
    if missing:
        raise InputError(f"{name} must be a Faker locale with {', '.join(kinds)} providers of its own (the default "
                         f"tagger's gazetteers), got {locale!r}, which has no {', '.join(missing)} provider")


def zipf_counts(total: int, n: int, exponent: float) -> np.ndarray:
    """Largest-remainder allocation of ``total`` mentions to ``n`` items with weights ``(i + 1)^-exponent``.

    Args:
      total: number of mentions to allocate (``>= 0``).
      n: number of items (``>= 1``).
      exponent: Zipf exponent ``s >= 0``.

    Returns:
      ``(n,)`` int64 counts summing to ``total``, non-increasing, with ``|counts[i] - total * w_i| < 1``
      (Hamilton's method; remainders tied in value go to the lower index).
    """
    total = validate.positive_int("total", total, minimum=0)
    n = validate.positive_int("n", n)
    exponent = validate.nonnegative_float("exponent", exponent)
    w = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    quota = total * w / w.sum()
    counts = np.floor(quota).astype(np.int64)
    rest = total - int(counts.sum())
    order = np.lexsort((np.arange(n), -(quota - counts)))  # largest remainder first, then lower index
    counts[order[:rest]] += 1
    return counts


# ---------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------

_FIELD_LABELS = {
    "A": "PERSON", "B": "PERSON", "A_email": "EMAIL", "B_email": "EMAIL", "A_phone": "PHONE", "B_phone": "PHONE",
    "A_address": "LOC", "B_address": "LOC", "city": "LOC", "org": "ORG", "date": "DATE",
}

_TEMPLATES = {
    "email": (
        "From: {A} <{A_email}>\nTo: {B} <{B_email}>\nDate: {date}\n\nHi {B}, please call me at {A_phone} about "
        "the {org} account. Thanks, {A}",
        "{A} <{A_email}> wrote on {date}: the meeting with {org} moved to {A_address}. You can reach {B} at "
        "{B_phone}.",
        "Dear {B}, {org} has approved the transfer. Send the papers to {A_address} or write to {A_email}. "
        "Regards, {A} ({date})",
        "Subject: {org} contract\nFrom: {A_email}\nTo: {B_email}\n\n{B}, call {A} on {A_phone} before {date}.",
    ),
    "court": (
        "The applicant, {A}, lives at {A_address}. On {date} the applicant brought proceedings against {org}. "
        "The applicant was represented by {B}, a lawyer practising in {city}.",
        "On {date} the court in {city} heard {A} (tel. {A_phone}), an employee of {org}. Counsel for the "
        "applicant, {B}, submitted that {A} had not been notified.",
        "The case originated in an application lodged on {date} by {A}, who was born in {city}. The applicant "
        "was represented by {B} of {org}, {B_address}.",
    ),
}

# A record-specific subject line (not PII): the non-PII context that lets a model memorise which record
# a name belongs to, as the distinct facts of a real e-mail or case do.
_TOPIC_LINES = {"email": "Re: {topic}\n", "court": "Case concerning {topic}. "}

_FIELD = re.compile(r"\{(\w+)\}")


def _render(template: str, values: Mapping[str, str]) -> tuple[str, tuple[Span, ...]]:
    """The filled template and the spans of its labelled fields."""
    parts: list[str] = []
    spans: list[Span] = []
    pos = last = 0
    for m in _FIELD.finditer(template):
        literal = template[last:m.start()]
        parts.append(literal)
        pos += len(literal)
        value = values[m.group(1)]
        parts.append(value)
        if m.group(1) in _FIELD_LABELS:  # other fields (the topic) are not PII
            spans.append(Span(pos, pos + len(value), _FIELD_LABELS[m.group(1)], value))
        pos += len(value)
        last = m.end()
    parts.append(template[last:])
    return "".join(parts), tuple(spans)


def _ascii(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def _faker(locale: str, seed: int):
    from faker import Faker

    fake = Faker(locale)
    fake.seed_instance(seed)
    return fake


def _address(fake) -> str:
    """A one-line civilian postal address (no military APO/FPO forms)."""
    return f"{fake.street_address()}, {fake.city()}, {fake.state_abbr(include_territories=False)} {fake.postcode()}"


def _email(name: str, fake) -> str:
    parts = [p for p in re.split(r"[^a-z]+", _ascii(name).lower()) if p]
    return f"{parts[0]}.{parts[-1]}@{fake.free_email_domain()}"


def _date(rng: np.random.Generator, year_range: tuple[int, int], style: str) -> str:
    """A uniform date written ``"dmy"`` (3 March 2004), ``"iso"`` (2004-03-03) or ``"mdy"`` (March 3, 2004)."""
    first = datetime.date(year_range[0], 1, 1).toordinal()
    last = datetime.date(year_range[1], 12, 31).toordinal()
    d = datetime.date.fromordinal(int(rng.integers(first, last + 1)))
    if style == "dmy":
        return f"{d.day} {d:%B} {d.year}"
    return d.isoformat() if style == "iso" else f"{d:%B} {d.day}, {d.year}"


def _date_style(text: str) -> str:
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        return "iso"
    return "dmy" if re.fullmatch(r"\d{1,2} [A-Z][a-z]+ \d{4}", text) else "mdy"


def _people(config: CorpusConfig, rng: np.random.Generator) -> tuple[Person, ...]:
    fake = _faker(config.locale, config.seed)
    foreign = {loc: _faker(loc, config.seed + 1 + i) for i, loc in enumerate(config.foreign_locales)}
    n_foreign = int(round(config.n_people * config.foreign_name_fraction))
    foreign_idx = set(rng.choice(config.n_people, size=n_foreign, replace=False).tolist()) if n_foreign else set()
    names: set[str] = set()
    phones: set[str] = set()
    emails: set[str] = set()
    out = []
    for i in range(config.n_people):
        locale = config.locale
        source = fake
        if i in foreign_idx:
            locale = config.foreign_locales[int(rng.integers(len(config.foreign_locales)))]
            source = foreign[locale]
        for _ in range(1000):
            name = f"{source.first_name()} {source.last_name()}"
            email = _email(name, fake)
            if name not in names and email not in emails:
                break
        else:
            raise InputError(f"n_people={config.n_people} exceeds the distinct names Faker {locale} can produce")
        phone = fake.phone_number()
        while phone in phones:
            phone = fake.phone_number()
        names.add(name)
        emails.add(email)
        phones.add(phone)
        out.append(Person(name, email, phone, _address(fake), locale))
    return tuple(out)


def _distinct(make, n: int, what: str) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for _ in range(100 * n + 100):
        if len(seen) == n:
            break
        seen.setdefault(make(), None)
    if len(seen) < n:
        raise InputError(f"could not draw {n} distinct {what}")
    return tuple(seen)


def _assign(counts: np.ndarray, n_records: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_records, k)`` pool indices with item ``i`` in exactly ``counts[i]`` rows, never twice in a row.

    A random layout, then swaps that keep every count: a repeated item in row ``r`` is exchanged with an item of
    another row that neither row contains.
    """
    slots = np.repeat(np.arange(len(counts)), counts)
    rng.shuffle(slots)
    grid = slots.reshape(n_records, k)
    for r in range(n_records):
        for j in range(1, k):
            tries = 0
            while grid[r, j] in grid[r, :j]:
                r2, j2 = int(rng.integers(n_records)), int(rng.integers(k))
                p, q = grid[r, j], grid[r2, j2]
                if r2 != r and q not in grid[r] and p not in np.delete(grid[r2], j2):
                    grid[r, j], grid[r2, j2] = q, p
                tries += 1
                if tries > 100_000:
                    raise InputError("could not place people without repeats in a record: lower zipf_exponent")
    return grid


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Output of :func:`make_corpus`.

    Attributes:
      config: the configuration.
      records: the records.
      people: the people pool (index ``i`` is mentioned in ``person_counts[i]`` records).
      person_counts: ``(n_people,)`` records mentioning each person (the Zipf allocation).
      orgs: the organisation pool; ``org_counts``: records mentioning each.
      cities: the city pool.
    """

    config: CorpusConfig
    records: tuple[Record, ...]
    people: tuple[Person, ...]
    person_counts: np.ndarray
    orgs: tuple[str, ...]
    org_counts: np.ndarray
    cities: tuple[str, ...]

    @property
    def texts(self) -> list[str]:
        """The records' texts, in record order."""
        return [r.text for r in self.records]

    @property
    def spans(self) -> list[tuple[Span, ...]]:
        """The records' ground-truth spans, in record order."""
        return [r.spans for r in self.records]

    def pii_record_counts(self, labels: Iterable[str] | None = None) -> Counter:
        """``(label, value) -> number of records containing it`` (see :func:`pii_record_counts`).

        Args:
          labels: count only these labels (``None``: all).

        Returns:
          A :class:`collections.Counter` over ``(label, value)``.
        """
        return pii_record_counts(self.records, labels)


def pii_record_counts(records: Sequence[Record], labels: Iterable[str] | None = None) -> Counter:
    """How many records contain each ground-truth PII string.

    Args:
      records: records with ground-truth spans.
      labels: restrict to these labels (default: all).

    Returns:
      ``Counter`` mapping ``(label, value)`` to the number of records with at least one such span (record-level
      repetition, the unit record-level DP protects).
    """
    keep = None if labels is None else set(labels)
    out: Counter = Counter()
    for r in records:
        out.update({(s.label, s.value) for s in r.spans if keep is None or s.label in keep})
    return out


def make_corpus(config: CorpusConfig = CorpusConfig()) -> Corpus:
    """Generates the synthetic PII corpus.

    Args:
      config: a :class:`CorpusConfig`.

    Returns:
      A :class:`Corpus`; ``text[s.start:s.end] == s.value`` for every span ``s`` of every record.

    Raises:
      ValueError: an invalid configuration (naming the field, the rule and the value).
    """
    config.validate()
    rng = np.random.default_rng(config.seed)
    people = _people(config, rng)
    fake = _faker(config.locale, config.seed + 1000)
    orgs = _distinct(fake.company, config.n_orgs, "organisations")
    cities = _distinct(fake.city, config.n_cities, "cities")
    topic_fake = _faker("en_US", config.seed + 2000)
    k = config.people_per_record
    person_counts = zipf_counts(config.n_records * k, config.n_people, config.zipf_exponent)
    grid = _assign(person_counts, config.n_records, k, rng)
    org_counts = zipf_counts(config.n_records, config.n_orgs, config.zipf_exponent)
    org_of = np.repeat(np.arange(config.n_orgs), org_counts)
    rng.shuffle(org_of)
    records = []
    for i in range(config.n_records):
        kind = "email" if rng.random() < config.email_fraction else "court"
        templates = _TEMPLATES[kind]
        template = templates[int(rng.integers(len(templates)))]
        if config.record_topics:
            template = _TOPIC_LINES[kind] + template
        a, b = (people[int(p)] for p in grid[i])
        values = {
            "A": a.name, "A_email": a.email, "A_phone": a.phone, "A_address": a.address,
            "B": b.name, "B_email": b.email, "B_phone": b.phone, "B_address": b.address,
            "org": orgs[int(org_of[i])], "city": cities[int(rng.integers(len(cities)))],
            "date": _date(rng, config.year_range, "dmy" if kind == "court" else ("iso", "mdy")[int(rng.integers(2))]),
        }
        if config.record_topics:  # its own Faker stream: the PII draws do not depend on this option
            values["topic"] = topic_fake.catch_phrase().lower()
        text, spans = _render(template, values)
        records.append(Record(i, kind, text, spans, tuple(int(p) for p in grid[i]), int(org_of[i])))
    return Corpus(config, tuple(records), people, person_counts, orgs, org_counts, cities)


class PublicFiller:
    """Fresh PII values from public knowledge (the data distribution), to fill ``[MASK]`` in attack queries.

    The attacker of Lukas et al. fills the non-target masks of a reconstruction query with a public masked LM;
    here a Faker instance with an attacker-chosen seed draws a value of the same label and shape instead (a
    postal address for an address, a city for a city, the same date format). It shares no state with the
    corpus generator.
    """

    def __init__(self, seed: int, locale: str = "en_US"):
        """Seeds the filler's own Faker instance and random stream.

        Args:
          seed: seed of the filler's Faker instance (an integer >= 0).
          locale: Faker locale.

        Raises:
          ValueError: a negative or non-integer ``seed``.
        """
        self._fake = _faker(locale, validate.positive_int("seed", seed, minimum=0))
        self._rng = np.random.default_rng(seed)

    def value(self, label: str, like: str = "") -> str:
        """A fresh value for ``label`` shaped like ``like``.

        Args:
          label: one of :data:`LABELS`.
          like: the value it replaces (its shape, e.g. a date format, is kept).

        Returns:
          The value.

        Raises:
          ValueError: ``label`` is not one of :data:`LABELS`.
        """
        f = self._fake
        if label == "PERSON":
            return f"{f.first_name()} {f.last_name()}"
        if label == "EMAIL":
            return _email(f"{f.first_name()} {f.last_name()}", f)
        if label == "PHONE":
            return f.phone_number()
        if label == "LOC":
            return _address(f) if any(c.isdigit() for c in like) else f.city()
        if label == "DATE":
            return _date(self._rng, (1990, 2022), _date_style(like))
        if label == "ORG":
            return f.company()
        raise InputError(f"label must be one of {', '.join(LABELS)}, got {label!r}")
