"""Synthetic re-identification benchmarks: Faker people with a knowledge ladder (blog-style authors:
:mod:`conformal.data.synthetic_blogs`).

People. :func:`make_people` draws ``n`` people whose quasi-identifiers overlap on
purpose (20 cities, 36 occupations, 80 employers, ages 20-79, three genders),
so that linkage is genuinely ambiguous at low knowledge; life events come from
a pool of ~300 templated events (rarer, more identifying) and each person has
three clues (rare facts: a license plate, a named pet, a counted collection,
...). :func:`synthetic_suite` releases one short narrative per sampled person
under a release mechanism and builds the candidate profiles at a knowledge
level of the ladder (Table 7 of the paper):

* ``K1``: coarse fields only: gender, 10-year age bracket, city, occupation.
* ``K2``: K1 + interest keywords + *coarsened* life events (the event type,
  e.g. "ran a marathon", without city/year/detail).
* ``K3``: K2 + employer + the detailed life events + the clues.

Release mechanisms: ``direct`` (as written); ``quasi_id_redaction`` (every
mention of an age, city, occupation, employer or person name written in a
quasi-identifier slot, the subject's or a relative's, becomes ``[AGE]``,
``[CITY]``, ``[OCCUPATION]``, ``[EMPLOYER]``, ``[NAME]``; then any remaining
whole-word occurrence of the subject's own values is masked the same way;
events and clues otherwise stay); ``rewrite`` (deterministic seeded
paraphrase: phrase synonyms from a small table, occupation synonyms, sentences
reordered, some filler/keyword/relative/employer sentences dropped; events
and clues are kept verbatim).

Blog authors are :mod:`conformal.data.synthetic_blogs`'s.

Determinism: every draw comes from ``numpy.random.default_rng`` keyed by the
seed (and by the person index where a draw is per person) and from a seeded
``Faker`` instance (``seed_instance``; the global Faker seed is never touched).

References:
  Huang et al. 2026, Conformal Privacy Auditing, Sections 3.3 and 6.1, Tables 4, 7 and 8.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np
from faker import Faker

from conformal.data import _vocab as V
from conformal.data.suite import LinkageSuite
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "Person",
    "DocumentDraft",
    "KNOWLEDGE_LEVELS",
    "RELEASES",
    "PLACEHOLDERS",
    "make_people",
    "profile_text",
    "draft_document",
    "render_document",
    "synthetic_suite",
    "synthetic_ladder",
    "age_range",
]

KNOWLEDGE_LEVELS = ("K1", "K2", "K3")
RELEASES = ("direct", "quasi_id_redaction", "rewrite")
PLACEHOLDERS = {"name": "[NAME]", "age": "[AGE]", "city": "[CITY]", "occupation": "[OCCUPATION]",
                "employer": "[EMPLOYER]"}
# Segment tags: quasi-identifier slots (masked by the redaction), protected spans (kept verbatim by
# the rewrite) and plain text (paraphrased by the rewrite).
_QI_TAGS = ("name", "age", "city", "occupation", "employer")
_PROTECTED_TAGS = ("event", "clue", "keyword")

N_EMPLOYERS = 80
N_EVENT_POOL = 320
EVENTS_PER_PERSON = 4
KEYWORDS_PER_PERSON = 5
CLUES_PER_PERSON = 3
K2_KEYWORDS = 3  # a K2 profile knows the first 3 of the 5 interests (side information is partial)

# Mention probabilities of the narrative (per person; see `draft_document`).
P_NAME, P_AGE, P_GENDER_WORD, P_OCCUPATION, P_CITY, P_EMPLOYER = 0.5, 0.7, 0.4, 0.6, 0.6, 0.5
P_EVENT, P_KEYWORD, P_CLUE, P_RELATIVE = 0.35, 0.3, 0.4, 0.8
# The rewrite release: probability of dropping a droppable sentence / of an occupation synonym.
P_DROP, P_OCC_SYNONYM = 0.35, 0.6


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _check_count(field: str, value, lo: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise InputError(f"{field} must be an integer >= {lo}, got {value!r}")
    return int(value)


def age_range(age: int) -> str:
    """10-year bracket of an age, e.g. ``37 -> "30-39"``.

    Args:
      age: an age in years.

    Returns:
      The bracket ``"{lo}-{lo + 9}"``.
    """
    lo = (int(age) // 10) * 10
    return f"{lo}-{lo + 9}"


# ------------------------------------------------------------------------------------------------
# People
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Person:
    """A synthetic person.

    Attributes:
      pid: Unique identity id (``"p00042"``).
      name: ``"First Last"``.
      age: 20-79.
      gender: ``"female"``, ``"male"`` or ``"nonbinary"``.
      occupation, city, employer: Quasi-identifiers from small shared vocabularies.
      events: Detailed life-event phrases (``"ran the Denver marathon in 2011"``).
      keywords: Interest keywords.
      clues: Rare distinctive facts (``"drives a teal Bronco with license plate KXR-4821"``).
      event_types: Coarsened version of each event (``"ran a marathon"``), aligned with ``events``;
        what a ``K2`` profile knows.
    """

    pid: str
    name: str
    age: int
    gender: str
    occupation: str
    city: str
    employer: str
    events: tuple[str, ...]
    keywords: tuple[str, ...]
    clues: tuple[str, ...]
    event_types: tuple[str, ...] = ()


# (coarse type, detailed template); fields are filled by `_fill`.
_EVENT_TEMPLATES = (
    ("ran a marathon", "ran the {city} marathon in {year}"),
    ("won an award", "won a regional {award} award in {year}"),
    ("took up an instrument", "took up the {instrument} in {year}"),
    ("taught abroad", "spent a year teaching English in {country}"),
    ("hiked a long trail", "hiked the {trail} Trail in {year}"),
    ("climbed a mountain", "climbed Mount {mountain} in {year}"),
    ("survived a disaster", "survived a {disaster} in {year}"),
    ("restored a vintage car", "restored a {oldyear} {car}"),
    ("competed in a tournament", "competed in a national {game} tournament in {year}"),
    ("served in the military", "served in the {branch} for {n} years"),
    ("graduated from college", "graduated from {university} in {year}"),
    ("ran a food stall", "ran a {food} stall at the farmers market for {n} summers"),
    ("built something at home", "built a {structure} in the backyard in {year}"),
    ("founded a club", "founded a {club} club in {year}"),
    ("won a state title", "played on a {sport} team that won the state title in {year}"),
    ("wrote a novel", "self-published a {genre} novel in {year}"),
    ("got married abroad", "got married in {country} in {year}"),
    ("adopted a pet", "adopted a rescue {pet} in {year}"),
    ("was on a game show", "appeared on a {genre} trivia game show in {year}"),
    ("broke a bone", "broke an arm playing {sport} in {year}"),
    ("volunteered", "volunteered at an animal shelter for {n} years"),
    ("lived abroad", "lived in {country} for {n} years"),
    ("started a business", "opened a small {food} shop in {year}"),
    ("sang in a choir", "toured with a gospel choir in {year}"),
    ("studied cooking", "studied cooking in {country} in {year}"),
    ("cycled across the country", "cycled from coast to coast in {year}"),
    ("went back to school", "went back to school at {university} in {year}"),
    ("lost a home", "lost a house to a {disaster} in {year}"),
    ("adopted a child", "adopted a child from {country} in {year}"),
    ("won a lottery prize", "won a small lottery prize in {year}"),
    ("rescued someone", "pulled a swimmer out of a lake in {year}"),
    ("had twins", "had twins in {year}"),
    ("changed careers", "changed careers after a layoff in {year}"),
    ("moved back home", "moved back from {country} in {year}"),
    ("coached a youth team", "coached a youth {sport} team for {n} seasons"),
    ("recovered from an illness", "recovered from a long illness in {year}"),
    ("sailed an ocean", "crossed the Atlantic on a sailboat in {year}"),
    ("became a grandparent", "became a grandparent in {year}"),
    ("bought a farm", "bought a small {animalfarm} farm in {year}"),
    ("exhibited art", "exhibited {medium} paintings at a gallery in {year}"),
)

_FILLS = {
    "city": V.CITIES, "award": V.AWARDS, "instrument": V.INSTRUMENTS, "country": V.COUNTRIES,
    "trail": V.TRAILS, "mountain": V.MOUNTAINS, "disaster": V.DISASTERS, "car": V.CAR_MODELS, "game": V.GAMES,
    "branch": V.BRANCHES, "university": V.UNIVERSITIES, "food": V.FOODS, "structure": V.STRUCTURES,
    "club": V.CLUBS, "sport": V.SPORTS, "genre": V.GENRES, "pet": V.PETS, "n": V.NUMBER_WORDS,
    "animalfarm": ("goat", "alpaca", "lavender", "pumpkin", "dairy", "christmas tree", "oyster", "blueberry"),
    "medium": ("watercolor", "oil", "acrylic", "gouache", "ink"),
}
_FIELD_RE = re.compile(r"\{(\w+)\}")


def _fill(template: str, rng: np.random.Generator) -> str:
    def one(m: re.Match) -> str:
        field = m.group(1)
        if field == "year":  # four digits: never equal to an age (20-79) as a whole word
            return str(int(rng.integers(1985, 2024)))
        if field == "oldyear":
            return str(int(rng.integers(1955, 1981)))
        vocab = _FILLS[field]
        return vocab[int(rng.integers(len(vocab)))]

    return _FIELD_RE.sub(one, template)


def _event_pool(rng: np.random.Generator) -> list[tuple[str, str]]:
    """~N_EVENT_POOL distinct (coarse, detailed) events: every template with several fillings."""
    per = -(-N_EVENT_POOL // len(_EVENT_TEMPLATES))
    pool: dict[str, str] = {}
    for coarse, template in _EVENT_TEMPLATES:
        for _ in range(4 * per):  # fillings may collide; stop at `per` distinct ones
            detailed = _fill(template, rng)
            if detailed not in pool:
                pool[detailed] = coarse
            if sum(1 for c in pool.values() if c == coarse) >= per:
                break
    return [(c, d) for d, c in pool.items()]


def _plate(rng: np.random.Generator) -> str:
    letters = "ABCDEFGHJKLMNPRSTUVWXYZ"
    return "".join(letters[int(i)] for i in rng.integers(len(letters), size=3)) + f"-{int(rng.integers(1000, 10000))}"


def _clue(kind: int, rng: np.random.Generator, fake: Faker) -> str:
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    if kind == 0:
        return f"drives a {pick(V.COLORS)} {pick(V.CAR_MODELS)} with license plate {_plate(rng)}"
    if kind == 1:
        return f"has a {pick(V.BREEDS)} named {fake.first_name()}"
    if kind == 2:
        return f"has a tattoo of a {pick(V.TATTOO_ANIMALS)} on the {pick(V.BODY_PARTS)}"
    if kind == 3:  # three digits: never equal to an age as a whole word
        return f"owns a collection of {int(rng.integers(100, 1000))} {pick(V.COLLECTIBLES)}"
    if kind == 4:
        a, b = rng.choice(len(V.LANGUAGES), size=2, replace=False)
        return f"speaks fluent {V.LANGUAGES[int(a)]} and some {V.LANGUAGES[int(b)]}"
    if kind == 5:
        item = pick(("baseball", "guitar", "movie poster", "cookbook", "football", "vinyl record"))
        return f"keeps a {item} signed by {fake.first_name()} {fake.last_name()}"
    if kind == 6:
        return f"brews a {pick(V.BEVERAGES)} called {fake.word().title()} {fake.word().title()}"
    return f"met {fake.first_name()} {fake.last_name()} at {pick(V.VENUES)}"


_N_CLUE_KINDS = 8
# Every clue starts with one third-person verb; its base form for "I"/"they" narratives.
_CLUE_VERB_BASE = {"drives": "drive", "has": "have", "owns": "own", "speaks": "speak", "keeps": "keep",
                   "brews": "brew", "met": "met"}


def make_people(n: int, *, seed: int) -> tuple[Person, ...]:
    """Draws ``n`` synthetic people, deterministically for ``seed``.

    Args:
      n: Number of people (>= 1).
      seed: Non-negative integer; seeds ``numpy.random.default_rng`` and a private ``Faker`` instance.

    Returns:
      ``(n,)`` people with ids ``p00000 ... p{n-1:05d}``.

    Raises:
      ValueError: if ``n`` < 1 or ``seed`` is not a non-negative integer.
    """
    n = _check_count("n", n)
    seed = _check_seed(seed)
    rng = np.random.default_rng([seed, 101])
    fake = Faker("en_US")
    fake.seed_instance(seed)

    employers: list[str] = []
    while len(employers) < N_EMPLOYERS:
        c = fake.company()
        if c not in employers:
            employers.append(c)
    events = _event_pool(rng)
    # Zipf-like popularity of the interest keywords, in a seed-dependent order.
    kw_order = rng.permutation(len(V.KEYWORDS))
    kw_p = 1.0 / (np.arange(len(V.KEYWORDS)) + 3.0) ** 0.8
    kw_p /= kw_p.sum()

    people = []
    for i in range(n):
        gender = V.GENDERS[int(rng.choice(len(V.GENDERS), p=V.GENDER_P))]
        first = {"female": fake.first_name_female, "male": fake.first_name_male,
                 "nonbinary": fake.first_name_nonbinary}[gender]()
        name = f"{first} {fake.last_name()}"
        age = int(rng.integers(V.AGE_MIN, V.AGE_MAX + 1))
        ev = rng.choice(len(events), size=EVENTS_PER_PERSON, replace=False)
        kw = rng.choice(len(V.KEYWORDS), size=KEYWORDS_PER_PERSON, replace=False, p=kw_p)
        clue_kinds = rng.choice(_N_CLUE_KINDS, size=CLUES_PER_PERSON, replace=False)
        people.append(Person(
            pid=f"p{i:05d}",
            name=name,
            age=age,
            gender=gender,
            occupation=V.OCCUPATIONS[int(rng.integers(len(V.OCCUPATIONS)))],
            city=V.CITIES[int(rng.integers(len(V.CITIES)))],
            employer=employers[int(rng.integers(len(employers)))],
            events=tuple(events[int(j)][1] for j in ev),
            keywords=tuple(V.KEYWORDS[int(kw_order[int(j)])] for j in kw),
            clues=tuple(_clue(int(k), rng, fake) for k in clue_kinds),
            event_types=tuple(events[int(j)][0] for j in ev),
        ))
    return tuple(people)


def profile_text(person: Person, knowledge_level: str) -> str:
    """The candidate profile of ``person`` at a knowledge level (``K1``, ``K2``, ``K3``; see module doc).

    Args:
      person: a person of :func:`make_people`.
      knowledge_level: ``"K1"``, ``"K2"`` or ``"K3"``.

    Returns:
      The profile text; each level's text holds the previous level's information.

    Raises:
      ValueError: for an unknown knowledge level.
    """
    if knowledge_level not in KNOWLEDGE_LEVELS:
        raise InputError(f"knowledge_level must be one of {KNOWLEDGE_LEVELS}, got {knowledge_level!r}")
    decade = V.DECADE_WORD[person.age // 10]
    parts = [
        f"gender: {person.gender} ({V.GENDER_WORD[person.gender]}).",
        f"age: {age_range(person.age)} ({decade}).",
        f"city: {person.city}.",
        f"occupation: {person.occupation}.",
    ]
    if knowledge_level in ("K2", "K3"):
        known = person.keywords if knowledge_level == "K3" else person.keywords[:K2_KEYWORDS]
        parts.append(f"interests: {', '.join(known)}.")
        parts.append(f"life events: {'; '.join(person.event_types)}.")
    if knowledge_level == "K3":
        parts.append(f"employer: {person.employer}.")
        parts.append(f"event details: {'; '.join(person.events)}.")
        parts.append(f"distinctive facts: {'; '.join(person.clues)}.")
    return " ".join(parts)


# ------------------------------------------------------------------------------------------------
# Documents
# ------------------------------------------------------------------------------------------------

Segment = tuple[str, str]  # (text, tag); tag "" = plain text


@dataclasses.dataclass(frozen=True)
class DocumentDraft:
    """A released narrative before the release mechanism: tagged sentences and what they mention.

    Attributes:
      pid: The subject.
      sentences: Sentences in narrative order; each a tuple of ``(text, tag)`` segments where ``tag``
        is ``""`` (plain), a quasi-identifier slot (``name``, ``age``, ``city``, ``occupation``,
        ``employer``), or a protected span (``event``, ``clue``, ``keyword``).
      kinds: ``(len(sentences),)`` sentence kind: ``intro`` (name introduction), ``name``, ``age``,
        ``gender``, ``occupation``, ``city``, ``employer``, ``event``, ``keyword``, ``clue``, ``relative``,
        ``filler``.
      events, keywords, clues: The subject's events/keywords/clues that the narrative mentions. Events
        and keywords appear verbatim; a clue appears with its leading verb conjugated for the
        narrative's voice (``"I have a pug named Rex"``), the rest verbatim.
      first_person: Narrative voice.
    """

    pid: str
    sentences: tuple[tuple[Segment, ...], ...]
    kinds: tuple[str, ...]
    events: tuple[str, ...]
    keywords: tuple[str, ...]
    clues: tuple[str, ...]
    first_person: bool


def _a(noun: str) -> str:
    """``noun`` with its indefinite article (inside the quasi-identifier slot, so a redaction hides it)."""
    return ("an " if noun[0].lower() in "aeiou" else "a ") + noun


def _pick(rng: np.random.Generator, seq: Sequence):
    return seq[int(rng.integers(len(seq)))]


def _mentioned(rng: np.random.Generator, items: Sequence[str], p: float, at_least: int) -> tuple[str, ...]:
    keep = rng.random(len(items)) < p
    if keep.sum() < at_least:
        keep[rng.choice(len(items), size=at_least, replace=False)] = True
    return tuple(x for x, k in zip(items, keep) if k)


def draft_document(person: Person, *, seed) -> DocumentDraft:
    """Writes the narrative about ``person`` (before any release mechanism).

    The narrative is first- or third-person and mentions, each with its own probability, the
    name, age, a gender word, the occupation, the city and the employer; at least one of the life
    events (each with probability ``P_EVENT``); some keywords and clues; 1-2 sentences about a
    relative with another city/occupation (distractors); 2-4 filler sentences; in random order.

    Args:
      person: The subject.
      seed: Anything ``numpy.random.default_rng`` accepts (an int or a sequence of ints).
    """
    rng = np.random.default_rng(seed)
    fp = bool(rng.random() < 0.5)
    subj, obj, poss, _refl, be = V.PRONOUNS[person.gender]
    base_verbs = fp or person.gender == "nonbinary"  # "I work", "they work" vs "she works"
    S = "I" if fp else subj.capitalize()  # sentence-initial subject
    s = "I" if fp else subj  # subject inside a sentence
    BE = "am" if fp else be
    POSS = "my" if fp else poss
    verb = (lambda v: v) if base_verbs else (lambda v: v + "s")
    first = person.name.split(" ", 1)[0]
    sentences: list[tuple[Segment, ...]] = []
    kinds: list[str] = []

    def add(kind: str, *segments: Segment) -> None:
        sentences.append(tuple(segments))
        kinds.append(kind)

    if rng.random() < P_NAME:
        add("intro", ("My name is " if fp else "Meet ", ""), (person.name, "name"), (".", ""))
    if rng.random() < P_AGE:
        form = int(rng.integers(3))
        if form == 0:
            add("age", (f"{S} {BE} ", ""), (f"{person.age} years old", "age"), (".", ""))
        elif form == 1:
            half = "early" if person.age % 10 < 5 else "late"
            add("age", (f"{S} {BE} ", ""), (f"in {POSS} {half} {V.DECADE_WORD[person.age // 10]}", "age"),
                (".", ""))
        else:
            add("age", (f"{S} turned ", ""), (str(person.age), "age"), (" this year.", ""))
    if rng.random() < P_GENDER_WORD:
        add("gender", (f"As a {V.GENDER_WORD[person.gender]}, {s} {verb('feel')} strongly about fair pay.", ""))
    if rng.random() < P_OCCUPATION:
        add("occupation", (f"{S} {verb('work')} as ", ""), (_a(person.occupation), "occupation"), (".", ""))
    if rng.random() < P_CITY:
        add("city", (f"{S} {verb('live')} in ", ""), (person.city, "city"), (".", ""))
    if rng.random() < P_EMPLOYER:
        add("employer", (f"{S} {BE} employed at ", ""), (person.employer, "employer"), (".", ""))

    events = _mentioned(rng, person.events, P_EVENT, at_least=1)
    for e in events:  # every event phrase starts with a past-tense verb
        frame = ("{S} ", "Once, {s} ", "Friends still talk about how {s} ")[int(rng.integers(3))]
        add("event", (frame.format(S=S, s=s), ""), (e, "event"), (".", ""))
    keywords = _mentioned(rng, person.keywords, P_KEYWORD, at_least=0)
    for k in keywords:
        frame = f"In {POSS} free time {s} {verb('enjoy')} " if rng.random() < 0.5 else "Weekends are for "
        add("keyword", (frame, ""), (k, "keyword"), (".", ""))
    clues = _mentioned(rng, person.clues, P_CLUE, at_least=0)
    for c in clues:
        v, rest = c.split(" ", 1)
        add("clue", (f"{S} {_CLUE_VERB_BASE[v] if base_verbs else v} ", ""), (rest, "clue"), (".", ""))
    n_rel = int(rng.random() < P_RELATIVE) + int(rng.random() < P_RELATIVE / 2)
    for _ in range(n_rel):
        rel = _pick(rng, V.RELATIVES)
        add("relative", (f"{POSS.capitalize()} {rel} is ", ""), (_a(_pick(rng, V.OCCUPATIONS)), "occupation"),
            (" in ", ""), (_pick(rng, V.CITIES), "city"), (".", ""))
    for j in rng.choice(len(V.FILLERS), size=int(rng.integers(2, 5)), replace=False):
        add("filler", (V.FILLERS[int(j)], ""))
    if not fp and "intro" in kinds and rng.random() < 0.5:  # a second mention of the name
        add("name", ("People who know ", ""), (first, "name"), (f" describe {obj} as reliable.", ""))

    # Random order; a name introduction, when present, opens the narrative.
    order = sorted(rng.permutation(len(sentences)).tolist(), key=lambda i: kinds[i] != "intro")
    return DocumentDraft(
        pid=person.pid,
        sentences=tuple(sentences[i] for i in order),
        kinds=tuple(kinds[i] for i in order),
        events=events,
        keywords=keywords,
        clues=clues,
        first_person=fp,
    )


# Phrase synonyms of the `rewrite` release (applied to plain segments only).
_PHRASE_SYNONYMS = (
    ("My name is ", "People call me "),
    ("Meet ", "This is "),
    (" years old", " years of age"),
    ("turned ", "reached the age of "),
    (" work as ", " make a living as "),
    (" works as ", " makes a living as "),
    (" live in ", " reside in "),
    (" lives in ", " resides in "),
    (" employed at ", " on the payroll of "),
    ("In my free time ", "When off duty, "),
    ("In her free time ", "When off duty, "),
    ("In his free time ", "When off duty, "),
    ("In their free time ", "When off duty, "),
    (" enjoy ", " like "),
    (" enjoys ", " likes "),
    ("Weekends are for ", "Days off mean "),
    ("Friends still talk about how ", "It is well known that "),
    ("Once, ", "At one point "),
    (" feel strongly about fair pay", " care a lot about equal wages"),
    (" feels strongly about fair pay", " cares a lot about equal wages"),
    ("As a ", "Being a "),
    ("The weather", "The climate"),
    ("unpredictable", "erratic"),
    ("non-negotiable", "mandatory"),
    ("constant complaint", "daily annoyance"),
    ("long breakfast", "slow brunch"),
    ("friendly but a little noisy", "kind if somewhat loud"),
    ("favorite season", "best time of year"),
    ("hard to come by", "rare"),
    ("big deal", "major event"),
    ("staying in", "remaining indoors"),
    ("plenty of time", "lots of time"),
    (" describe ", " call "),
    (" as reliable", " dependable"),
)


def _rewrite_plain(text: str) -> str:
    for old, new in _PHRASE_SYNONYMS:
        text = text.replace(old, new)
    return text


def _mask_subject_values(text: str, person: Person) -> str:
    """Masks whole-word occurrences of the subject's own quasi-identifier values anywhere."""
    values = [(person.employer, "employer"), (person.occupation, "occupation"), (person.city, "city"),
              (str(person.age), "age")]
    values += [(part, "name") for part in person.name.split()]
    for value, tag in sorted(values, key=lambda vt: -len(vt[0])):
        text = re.sub(r"(?<!\w)" + re.escape(value) + r"(?!\w)", PLACEHOLDERS[tag], text, flags=re.IGNORECASE)
    return text


def render_document(draft: DocumentDraft, person: Person, *, release: str, seed=None) -> str:
    """Applies a release mechanism to a draft (see module doc).

    Args:
      draft: From :func:`draft_document` for ``person``.
      person: The subject (its values are masked by ``quasi_id_redaction``).
      release: ``"direct"``, ``"quasi_id_redaction"`` or ``"rewrite"``.
      seed: Seed of the ``rewrite`` paraphrase (required for it; ignored otherwise).

    Raises:
      ValueError: for an unknown release, a draft of another person, or a rewrite without a seed.
    """
    if release not in RELEASES:
        raise InputError(f"release must be one of {RELEASES}, got {release!r}")
    if draft.pid != person.pid:
        raise InputError(f"draft.pid must be the person's pid {person.pid!r}, got {draft.pid!r}")
    if release == "direct":
        return " ".join("".join(t for t, _ in s) for s in draft.sentences)
    if release == "quasi_id_redaction":
        text = " ".join("".join(PLACEHOLDERS[tag] if tag in _QI_TAGS else t for t, tag in s)
                        for s in draft.sentences)
        return _mask_subject_values(text, person)
    if seed is None:
        raise InputError("seed is required for release 'rewrite', got None")
    rng = np.random.default_rng(seed)
    droppable = {"filler", "keyword", "relative", "employer", "gender"}
    keep = [i for i, k in enumerate(draft.kinds) if k not in droppable or rng.random() >= P_DROP]
    if not keep:  # never the case in practice (there is always an event), kept for safety
        keep = [0]
    order = [keep[int(j)] for j in rng.permutation(len(keep))]
    out = []
    for i in order:
        parts = []
        for text, tag in draft.sentences[i]:
            if tag == "" and text:
                parts.append(_rewrite_plain(text))
            elif tag == "occupation" and text.split(" ", 1)[1] in V.OCCUPATION_SYNONYMS and (
                    rng.random() < P_OCC_SYNONYM):
                parts.append(_a(V.OCCUPATION_SYNONYMS[text.split(" ", 1)[1]]))
            else:
                parts.append(text)
        out.append("".join(parts))
    return " ".join(out)


# ------------------------------------------------------------------------------------------------
# Suites
# ------------------------------------------------------------------------------------------------

_ATTRIBUTES = {
    "gender": V.GENDERS,
    "age_range": tuple(age_range(a) for a in range(V.AGE_MIN, V.AGE_MAX + 1, 10)),
    "occupation": V.OCCUPATIONS,
    "city": V.CITIES,
}


def _person_attributes(p: Person) -> dict[str, str]:
    return {"gender": p.gender, "age_range": age_range(p.age), "occupation": p.occupation, "city": p.city}


def _released_and_pool(n_people: int, n_documents: int, seed: int, pool) -> tuple[np.ndarray, int]:
    rng = np.random.default_rng([seed, 202])
    released = rng.choice(n_people, size=n_documents, replace=False)
    if pool is None:
        return released, n_documents
    if isinstance(pool, bool) or not isinstance(pool, (float, int, np.floating)) or not 0.0 < float(pool) <= 1.0:
        raise InputError(f"pool must be None or a fraction in (0, 1], got {pool!r}")
    return released, int(round(float(pool) * n_documents))


def synthetic_suite(
    people: Sequence[Person],
    *,
    knowledge_level: str,
    release: str,
    n_documents: int,
    seed: int,
    pool: float | None = None,
) -> LinkageSuite:
    """One (knowledge level, release) suite over ``people``.

    ``n_documents`` people are released (one narrative each, in a random order); the candidate
    pool is all ``people`` (released subjects and distractors), in ``people`` order. The released
    subjects and their narratives depend only on ``seed`` and ``people``, never on the level or
    the release, so suites built with the same seed share their subjects.

    Open world: with ``pool = f < 1`` the first ``round(f * n_documents)`` released subjects (in
    release order) stay in the pool and the others are removed from it, so the candidate-miss rate
    is exactly ``1 - round(f * n_documents) / n_documents`` (their documents get label ``-1``).

    Args:
      people: From :func:`make_people` (unique ``pid``).
      knowledge_level: ``"K1"``, ``"K2"`` or ``"K3"``.
      release: ``"direct"``, ``"quasi_id_redaction"`` or ``"rewrite"``.
      n_documents: ``1 <= n_documents <= len(people)``.
      seed: Non-negative integer.
      pool: ``None`` (closed world) or the fraction of released subjects kept in the pool.

    Returns:
      A :class:`LinkageSuite` named ``"synthetic/{level}/{release}"`` with attributes ``gender``,
      ``age_range``, ``occupation``, ``city``.

    Raises:
      ValueError: naming the argument, for an unknown level/release, bad sizes, repeated pids,
        a bad seed or a pool fraction outside (0, 1].
    """
    if knowledge_level not in KNOWLEDGE_LEVELS:
        raise InputError(f"knowledge_level must be one of {KNOWLEDGE_LEVELS}, got {knowledge_level!r}")
    if release not in RELEASES:
        raise InputError(f"release must be one of {RELEASES}, got {release!r}")
    people = tuple(people)
    if not people or not all(isinstance(p, Person) for p in people):
        raise InputError("people must be a non-empty sequence of Person (from make_people)")
    n_documents = _check_count("n_documents", n_documents)
    if n_documents > len(people):
        raise InputError(f"n_documents must be <= len(people) = {len(people)}, got {n_documents}")
    seed = _check_seed(seed)
    released, n_keep = _released_and_pool(len(people), n_documents, seed, pool)
    missing = {int(i) for i in released[n_keep:]}
    drafts_docs = []
    for i in released:
        i = int(i)
        p = people[i]
        draft = draft_document(p, seed=[seed, 303, i])
        drafts_docs.append(render_document(draft, p, release=release, seed=[seed, 404, i]))
    subjects = [people[int(i)] for i in released]
    cand = [p for j, p in enumerate(people) if j not in missing]
    return LinkageSuite(
        name=f"synthetic/{knowledge_level}/{release}",
        knowledge_level=knowledge_level,
        release=release,
        documents=tuple(drafts_docs),
        doc_ids=tuple(f"doc-{p.pid}" for p in subjects),
        identities=tuple(p.pid for p in subjects),
        candidates=tuple(p.pid for p in cand),
        profiles=tuple(profile_text(p, knowledge_level) for p in cand),
        attributes=_ATTRIBUTES,
        candidate_attributes={a: tuple(_person_attributes(p)[a] for p in cand) for a in _ATTRIBUTES},
        document_attributes={a: tuple(_person_attributes(p)[a] for p in subjects) for a in _ATTRIBUTES},
        meta={"generator": "conformal.data.synthetic.synthetic_suite", "seed": seed, "n_people": len(people),
              "n_documents": n_documents, "pool": None if pool is None else float(pool),
              "n_missing": len(missing)},
    )


def synthetic_ladder(
    n_people: int,
    n_documents: int,
    *,
    seed: int,
    releases: Sequence[str] = RELEASES,
    levels: Sequence[str] = KNOWLEDGE_LEVELS,
    pool: float | None = None,
) -> dict[tuple[str, str], LinkageSuite]:
    """The knowledge ladder x release grid over the SAME people, subjects and narratives.

    Args:
      n_people: Number of people drawn by :func:`make_people`.
      n_documents: Released subjects, ``1 <= n_documents <= n_people``.
      seed: Non-negative integer.
      releases: Release mechanisms, each one of :data:`RELEASES`.
      levels: Knowledge levels, each one of :data:`KNOWLEDGE_LEVELS`.
      pool: ``None`` (closed world) or the fraction of released subjects kept in the pool.

    Returns:
      ``{(level, release): LinkageSuite}`` for every level in ``levels`` and release in ``releases``.

    Raises:
      ValueError: as :func:`make_people` and :func:`synthetic_suite`.
    """
    people = make_people(n_people, seed=seed)
    return {(lv, r): synthetic_suite(people, knowledge_level=lv, release=r, n_documents=n_documents, seed=seed,
                                     pool=pool)
            for lv in levels for r in releases}
