"""Memorization evidence on a trained decoder: canary exposure, canary extraction and the one-run epsilon bound.

The canaries of :func:`snapaudit_jax.dpsgd.make_canaries` are uniform ``d``-digit secrets in one template
("my pin is {secret}"), each inserted into the training data with its own coin. Three measurements, from weakest to
strongest claim:

* :func:`canary_exposure` -- how far up the trained model ranks each canary's secret among the ``10^d`` it could
  have been (Carlini et al. 2019; :mod:`snapaudit_jax.estimation.exposure`): exact when the whole space is scored
  (``10^d <= exact_limit``), and always the skew-normal extrapolation from a uniform sample beside it. Held-out
  canaries are the control: their exposure is about 1 bit whatever the model;
* :func:`canary_extraction` -- whether an attacker who knows the prefix gets the secret out: the greedy continuation
  of the prefix, and whether the secret is among the ``k`` most likely secrets (exact ranks, or a beam search over
  digit strings when the space is too large to score);
* :func:`one_run_bound` -- a lower bound on the training run's ``eps`` from the canaries' scores and coins
  (Steinke, Nasr, Jagielski 2023; :func:`snapaudit_jax.estimation.one_run.one_run_audit`), the only one of the
  three that is a privacy statement.

Scores are ``log P(continuation | prefix)`` under the model, the prefix framed as training framed it
(:func:`snapaudit_jax.models.inference.frame`: the start token, then the prefix's tokens) and the continuation --
the whitespace before the secret, the secret in groups of four, the template's tail
(:func:`snapaudit_jax.dpsgd.canary_continuation`) -- tokenised on its own, as the model would emit it after the
prefix. With a byte-level BPE the continuation's leading space starts a new pre-token, so this is the tokenisation
of the whole canary text.

Scoring is batched by :meth:`snapaudit_jax.models.LanguageModel.label_logprobs`: every candidate secret shares the
canaries' one prefix, so the prefix is run once per pass and the candidates are packed after it (512 candidate
tokens per forward pass, each candidate seeing the prefix and its own earlier tokens only), all passes of one call
with one compiled shape: scoring all ``10^4`` four-digit secrets of four or five tokens each is about 100 passes,
and no model call is made per candidate.

Guarantees:
  Exposure and extraction are *evidence* of memorisation, not bounds: a high exposure of inserted canaries next to
  ~1 bit for held-out ones shows that the model memorised them; a low one does not show privacy.
  :func:`one_run_bound` is a lower bound on ``eps`` with probability ``>= 1 - alpha`` under the design of
  :mod:`snapaudit_jax.estimation.one_run` (each canary inserted independently with probability 1/2 for
  ``delta > 0``; refused otherwise), per repetition group (a canary inserted ``r`` times is protected at group size
  ``r`` only).

References:
  Carlini, Liu, Erlingsson, Kos, Song, "The Secret Sharer: Evaluating and Testing Unintended Memorization in
  Neural Networks", USENIX Security 2019 (exposure; secret extraction by search).
  Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from snapaudit_jax.dpsgd.canaries import CanarySet, canary_continuation, canary_prefix, group_digits
from snapaudit_jax.estimation.exposure import MIN_SAMPLE, exposure_exact, exposure_extrapolated
from snapaudit_jax.estimation.one_run import DeclaredGrid, OneRunResult, check_design, default_grid, one_run_audit
from snapaudit_jax.models.inference import frame
from snapaudit_jax.models.lm import LanguageModel
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "DEFAULT_EXACT_LIMIT",
    "DEFAULT_SAMPLE_SIZE",
    "CanaryExposure",
    "CanaryExtraction",
    "ExposureReport",
    "ExtractionReport",
    "canary_exposure",
    "canary_extraction",
    "one_run_bound",
    "one_run_ceiling",
    "canaries_for_a_positive_bound",
    "secret_scores",
]

DEFAULT_EXACT_LIMIT = 10**4
DEFAULT_SAMPLE_SIZE = 4096


# --- scoring ----------------------------------------------------------------------------------------------


def _language_model(model, tokenizer) -> LanguageModel:
    cfg = getattr(model, "cfg", None)
    if cfg is None or not callable(getattr(model, "logits", None)):
        raise InputError(f"model must be an NNX decoder (snapaudit_jax.models.GPT2 or Llama), got "
                         f"{type(model).__name__}")
    return LanguageModel("memorization", cfg, model, tokenizer)


def _template(prefix, template) -> str:
    if not isinstance(prefix, str) or not prefix.strip():
        raise InputError(f"prefix must be a non-empty text, got {prefix!r}")
    if prefix != prefix.rstrip():
        raise InputError(f"prefix must not end with whitespace (it starts the secret's continuation, which the model "
                         f"emits), got {prefix!r}")
    if template is None:
        return prefix.replace("{", "{{").replace("}", "}}") + " {secret}"
    got = canary_prefix(template)
    if got != prefix:
        raise InputError(f"template must start with prefix {prefix!r} (then whitespace and '{{secret}}'), got "
                         f"{template!r}, whose prefix is {got!r}")
    return template


def _score(lm: LanguageModel, tokenizer, prefix: str, continuations: list[str]) -> np.ndarray:
    """``(n,)`` float64 ``log P(continuation | framed prefix)``: the continuations' token tree after one prefix
    (:meth:`~snapaudit_jax.models.LanguageModel.continuation_logprobs`, each shared prefix computed once)."""
    return lm.continuation_logprobs(frame(tokenizer, prefix, eos=False), continuations)


def secret_scores(model, tokenizer, prefix: str, secrets: Sequence[str], *, template: str | None = None) -> np.ndarray:
    """``log P(secret's continuation | prefix)`` of candidate secrets under ``model`` (module docstring).

    Args:
      model: an NNX decoder (:class:`~snapaudit_jax.models.decoders.GPT2` or ``Llama``).
      tokenizer: its :class:`~snapaudit_jax.models.tokenizer.Tokenizer`.
      prefix: the canaries' shared prefix (``"my pin is"``), framed with the start token.
      secrets: ``n`` digit strings, grouped in fours or not (``"7302 9144"`` or ``"73029144"``).
      template: the canaries' template (``CanaryConfig.template``), whose text before ``{secret}`` is ``prefix``
        and whitespace; ``None``: ``prefix + " {secret}"``. Each secret's continuation is
        :func:`~snapaudit_jax.dpsgd.canary_continuation` of it, the leading whitespace included.

    Returns:
      ``(n,)`` float64 summed log-probabilities of the continuations' tokens (natural log).

    Raises:
      InputError: an empty prefix, one ending with whitespace, an empty list of secrets, a secret that is not
        digits, a template whose prefix is not ``prefix``, a model that is not a decoder, or a prefix plus
        continuation longer than the model's context.
    """
    if isinstance(secrets, str) or len(secrets) == 0:
        raise InputError(f"secrets must be a non-empty list of digit strings, got {secrets!r}")
    template = _template(prefix, template)
    continuations = [canary_continuation(template, s) for s in secrets]
    return _score(_language_model(model, tokenizer), tokenizer, prefix, continuations)


# --- the canaries' randomness space -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Space:
    """What the canaries share: template, prefix, digits; ``size = 10^digits``."""

    template: str
    prefix: str
    digits: int

    @property
    def size(self) -> int:
        return 10**self.digits

    def secret(self, index: int) -> str:
        return group_digits(f"{index:0{self.digits}d}")

    def continuation(self, secret: str) -> str:
        return canary_continuation(self.template, secret)


def _space(canaries) -> _Space:
    if not isinstance(canaries, CanarySet):
        raise InputError(f"canaries must be a CanarySet (snapaudit_jax.dpsgd.make_canaries), got "
                         f"{type(canaries).__name__}")
    template, digits = canaries.config.template, int(canaries.config.digits)
    space = _Space(template, canary_prefix(template), digits)
    for c in canaries.canaries:
        if c.prefix != space.prefix or c.continuation != space.continuation(c.secret) \
                or len(c.secret.replace(" ", "")) != digits:
            raise InputError(f"canaries[{c.index}] must be a {digits}-digit secret in the set's template "
                             f"{template!r} (as make_canaries writes it), got text {c.text!r}")
    if len({c.secret for c in canaries.canaries}) != len(canaries.canaries):
        raise InputError("canaries must have distinct secrets (as make_canaries draws them)")
    return space


def _rng(key) -> np.random.Generator:
    if key is None:
        raise InputError("key must be a PRNG key (jax.random.key) for the candidate sample (no hidden default key), "
                         "got None")
    try:
        bits = jax.random.bits(key, (4,), jnp.uint32)
    except (TypeError, ValueError) as err:
        raise InputError(f"key must be a PRNG key (jax.random.key), got {key!r}: {err}") from None
    return np.random.default_rng(np.asarray(bits).tolist())


def _sample(key, space: _Space, exclude: set[str], n: int) -> list[str]:
    """``n`` distinct secrets drawn uniformly from the space without ``exclude`` (rejection of i.i.d. digit draws:
    the first ``n`` distinct accepted draws are a uniform ``n``-subset, in random order)."""
    rng = _rng(key)
    out: dict[str, None] = {}
    while len(out) < n:
        draws = rng.integers(0, 10, size=(max(64, 2 * (n - len(out))), space.digits))
        for row in draws:
            s = group_digits("".join(map(str, row)))
            if s not in exclude:
                out.setdefault(s, None)
                if len(out) == n:
                    break
    return list(out)


def _index(secret: str) -> int:
    return int(secret.replace(" ", ""))


# --- exposure ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CanaryExposure:
    """Exposure of one canary.

    Attributes:
      index: the canary's index in its :class:`~snapaudit_jax.dpsgd.CanarySet`.
      inserted: whether it was in the training data (``False``: a held-out control).
      repetitions: times it was (or would have been) inserted.
      score: ``log P(continuation | prefix)`` (natural log).
      exact: exposure by the definition (bits), or ``None`` when the space was not scored.
      rank: its exact rank in the space (ties count against it), or ``None``.
      extrapolated: the skew-normal estimate (bits), capped at ``log2 |R|``.
      rank_estimate: the sample's estimate of the rank.
    """

    index: int
    inserted: bool
    repetitions: int
    score: float
    exact: float | None
    rank: int | None
    extrapolated: float
    rank_estimate: float


def _stats(values: list[float]) -> dict:
    if not values:
        return {"median": None, "max": None}
    return {"median": float(np.median(values)), "max": float(np.max(values))}


@dataclasses.dataclass(frozen=True)
class ExposureReport:
    """Output of :func:`canary_exposure`.

    Attributes:
      rows: one :class:`CanaryExposure` per canary, in canary order.
      space_size: ``|R| = 10^digits``.
      method: ``"exact"`` (every canary has ``exact`` and ``rank``) or ``"extrapolated"`` (only the estimates).
      sample_size: candidates in the extrapolation's sample (no canary among them).
      fit: the skew-normal ``(a, loc, scale)`` of the sample's ``-score``.
    """

    rows: tuple[CanaryExposure, ...]
    space_size: int
    method: str
    sample_size: int
    fit: tuple[float, float, float]

    @property
    def scores(self) -> np.ndarray:
        """``(n,)`` float64 canary scores (the membership scores of :func:`one_run_bound`), in canary order."""
        return np.array([r.score for r in self.rows], np.float64)

    @property
    def max_exposure(self) -> float:
        """``log2 space_size``, the exposure of a secret ranked first."""
        return math.log2(self.space_size)

    def summary(self) -> dict:
        """Median and max exposure of the inserted canaries and of the held-out controls.

        Returns:
          ``{"inserted": {"n", "exact": {"median", "max"}, "extrapolated": {"median", "max"}}, "held_out": {...},
          "max_exposure", "method"}`` (``exact`` entries ``None`` for ``"extrapolated"``, all ``None`` for an empty
          group).
        """
        out = {"max_exposure": self.max_exposure, "method": self.method}
        for name, flag in (("inserted", True), ("held_out", False)):
            rows = [r for r in self.rows if r.inserted == flag]
            out[name] = {"n": len(rows), "exact": _stats([r.exact for r in rows if r.exact is not None]),
                         "extrapolated": _stats([r.extrapolated for r in rows])}
        return out

    def headline(self) -> dict:
        """The report cards' exposure entry (``snapaudit finetune`` and ``snapaudit pii`` alike).

        Returns:
          ``{"method", "space_size", "max_possible", "median_inserted", "max_inserted", "median_held_out",
          "max_held_out", "summary", "rows", "fit"}``: the exact values where the space was scored whole, else the
          extrapolated ones.
        """
        summary = self.summary()
        kind = "exact" if self.method == "exact" else "extrapolated"
        inserted, held_out = summary["inserted"][kind], summary["held_out"][kind]
        return {"method": self.method, "space_size": self.space_size, "max_possible": self.max_exposure,
                "median_inserted": inserted["median"], "max_inserted": inserted["max"],
                "median_held_out": held_out["median"], "max_held_out": held_out["max"],
                "summary": summary, "rows": [dataclasses.asdict(r) for r in self.rows], "fit": list(self.fit)}

    def to_dict(self) -> dict:
        """The fields, ``rows`` as dicts, and :meth:`summary`, ready for JSON."""
        return {"rows": [dataclasses.asdict(r) for r in self.rows], "space_size": self.space_size,
                "method": self.method, "sample_size": self.sample_size, "fit": list(self.fit),
                "summary": self.summary()}


def canary_exposure(model, tokenizer, canaries: CanarySet, *, key: jax.Array, exact_limit: int = DEFAULT_EXACT_LIMIT,
                    sample_size: int = DEFAULT_SAMPLE_SIZE) -> ExposureReport:
    """Exposure of every canary, inserted and held out: exact if the space is small enough, extrapolated always.

    Exact (``10^digits <= exact_limit``): every secret of the space is scored once (one batched call) and each
    canary ranked among them (:func:`~snapaudit_jax.estimation.exposure_exact`; the canaries share the space, so one
    scoring serves all). Extrapolated: ``sample_size`` secrets drawn uniformly from the space *without any canary's
    secret* (so neither the canary itself nor the other -- possibly memorised -- canaries enter the reference fit),
    the skew-normal fit of their ``-score`` (:func:`~snapaudit_jax.estimation.exposure_extrapolated`), one fit for
    all canaries. In the exact case the sample's scores are read off the full scoring (no second model call).

    Args:
      model: the trained NNX decoder (``GPT2`` or ``Llama``).
      tokenizer: its tokenizer.
      canaries: the :class:`~snapaudit_jax.dpsgd.CanarySet` (inserted canaries were in the training data).
      key: PRNG key of the candidate sample.
      exact_limit: score the whole space when ``10^digits <= exact_limit``.
      sample_size: candidates of the extrapolation, ``10 <= sample_size <= 10^digits - n_canaries``.

    Returns:
      An :class:`ExposureReport` (per-canary rows, :meth:`~ExposureReport.summary` over inserted canaries and over
      the held-out controls).

    Raises:
      InputError: ``canaries`` not a ``CanarySet`` of the template's ``digits``-digit secrets, ``key`` missing,
        ``exact_limit`` or ``sample_size`` out of range, or the model and prefix as for :func:`secret_scores`.

    Guarantees:
      None (a measurement, see the module docstring): the exact exposure is the definition's value for this model;
      the extrapolated one is a model-based estimate.
    """
    space = _space(canaries)
    exact_limit = validate.positive_int("exact_limit", exact_limit)
    secrets = [c.secret for c in canaries.canaries]
    room = space.size - len(secrets)
    sample_size = validate.positive_int("sample_size", sample_size, minimum=MIN_SAMPLE)
    if sample_size > room:
        raise InputError(f"sample_size must be <= 10**digits - n_canaries = {room} (the sample holds no canary), "
                         f"got {sample_size}")
    lm = _language_model(model, tokenizer)
    sample = _sample(key, space, set(secrets), sample_size)
    if space.size <= exact_limit:
        everything = _score(lm, tokenizer, space.prefix, [space.continuation(space.secret(i))
                                                           for i in range(space.size)])
        own = everything[[_index(s) for s in secrets]]
        reference = everything[[_index(s) for s in sample]]
        exact = exposure_exact(own, everything)
    else:
        scored = _score(lm, tokenizer, space.prefix, [space.continuation(s) for s in sample + secrets])
        reference, own = scored[:sample_size], scored[sample_size:]
        exact = None
    extra = exposure_extrapolated(own, reference, space.size)
    rows = tuple(
        CanaryExposure(index=c.index, inserted=bool(c.inserted), repetitions=int(c.repetitions), score=float(own[i]),
                       exact=None if exact is None else float(exact.exact[i]),
                       rank=None if exact is None else int(exact.rank[i]), extrapolated=float(extra.extrapolated[i]),
                       rank_estimate=float(extra.rank[i]))
        for i, c in enumerate(canaries.canaries))
    return ExposureReport(rows=rows, space_size=space.size, method="extrapolated" if exact is None else "exact",
                          sample_size=sample_size, fit=extra.fit)


# --- extraction -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CanaryExtraction:
    """Extraction of one canary.

    Attributes:
      index: the canary's index.
      inserted: whether it was in the training data.
      greedy: the greedy continuation of the prefix begins with the canary's continuation (its secret).
      top_k: per ``k`` of :attr:`ExtractionReport.top_k`, whether the secret is among the ``k`` best candidates.
    """

    index: int
    inserted: bool
    greedy: bool
    top_k: tuple[bool, ...]


@dataclasses.dataclass(frozen=True)
class ExtractionReport:
    """Output of :func:`canary_extraction`.

    Attributes:
      rows: one :class:`CanaryExtraction` per canary, in canary order.
      top_k: the ``k`` values, increasing.
      method: ``"exact"`` (top-k from exact ranks over the whole space) or ``"beam"`` (a digit-level beam search).
      greedy_continuation: the decoded greedy continuation of the prefix (the attacker's single guess).
      candidates: the beam's final candidates, best first (``"beam"``), else ``None``.
    """

    rows: tuple[CanaryExtraction, ...]
    top_k: tuple[int, ...]
    method: str
    greedy_continuation: str
    candidates: tuple[str, ...] | None

    def rates(self) -> dict:
        """Extraction rates of the inserted canaries and of the held-out controls.

        Returns:
          ``{"inserted": {"n", "greedy", "top_<k>"...}, "held_out": {...}}``: fractions in ``[0, 1]`` (``None``
          for an empty group).
        """
        out = {}
        for name, flag in (("inserted", True), ("held_out", False)):
            rows = [r for r in self.rows if r.inserted == flag]
            group = {"n": len(rows), "greedy": float(np.mean([r.greedy for r in rows])) if rows else None}
            for j, k in enumerate(self.top_k):
                group[f"top_{k}"] = float(np.mean([r.top_k[j] for r in rows])) if rows else None
            out[name] = group
        return out

    def to_dict(self) -> dict:
        """The fields, ``rows`` as dicts, and :meth:`rates`, ready for JSON."""
        return {"rows": [dataclasses.asdict(r) for r in self.rows], "top_k": list(self.top_k), "method": self.method,
                "greedy_continuation": self.greedy_continuation,
                "candidates": None if self.candidates is None else list(self.candidates), "rates": self.rates()}


def _top_k(top_k) -> tuple[int, ...]:
    if isinstance(top_k, (int, np.integer)) and not isinstance(top_k, bool):
        top_k = (top_k,)
    try:
        values = tuple(top_k)
    except TypeError:
        raise InputError(f"top_k must be a positive integer or a non-empty tuple of them, got {top_k!r}") from None
    if not values:
        raise InputError("top_k must be a positive integer or a non-empty tuple of them, got ()")
    return tuple(sorted({validate.positive_int(f"top_k[{i}]", k) for i, k in enumerate(values)}))


def _beam(lm: LanguageModel, tokenizer, space: _Space, width: int) -> tuple[str, ...]:
    """The ``width`` best secrets of a beam search over the secret's groups of four digits, best first.

    Step ``j`` scores every value of group ``j`` after each surviving partial secret (the partial secrets are the
    prompts, the ``10^4`` group values the packed labels); the ``width`` best partial sums survive. The final
    candidates are rescored on their whole continuation (template tail included) and ranked by that score.
    """
    gap = space.template.split("{secret}")[0][len(space.prefix):]
    head = frame(tokenizer, space.prefix, eos=False)
    sizes = [4] * (space.digits // 4) + ([space.digits % 4] if space.digits % 4 else [])
    beams, totals = [""], np.zeros(1)
    for j, size in enumerate(sizes):
        values = [f"{v:0{size}d}" for v in range(10**size)]
        labels = [(gap if j == 0 else " ") + v for v in values]
        prompts = [head + frame(tokenizer, gap + group_digits(b), eos=False, start=False) if b else head
                   for b in beams]
        sums = totals[:, None] + np.stack([lm.continuation_logprobs(p, labels) for p in prompts])  # (beams, 10^size)
        keep = np.argsort(-sums, axis=None, kind="stable")[:width]  # ties: earlier beam, then smaller value
        beams = [beams[k // len(values)] + values[k % len(values)] for k in keep]
        totals = sums.reshape(-1)[keep]
    final = _score(lm, tokenizer, space.prefix, [space.continuation(b) for b in beams])
    return tuple(group_digits(beams[k]) for k in np.lexsort((np.arange(len(beams)), -final)))


def canary_extraction(
    model,
    tokenizer,
    canaries: CanarySet,
    *,
    top_k: int | Sequence[int] = (1, 10),
    exact_limit: int = DEFAULT_EXACT_LIMIT,
    exposure: ExposureReport | None = None,
) -> ExtractionReport:
    """Does an attacker who knows the prefix get the secrets out? Greedy decoding and top-k guesses.

    * **Greedy**: the prefix is decoded greedily (:meth:`~snapaudit_jax.models.LanguageModel.generate`, as many new
      tokens as the longest continuation has characters); a canary is extracted iff the decoded text begins with its
      continuation. The canaries share the prefix, so the greedy guess is one string and at most one canary is
      extracted this way.
    * **Top-k, exact** (``10^digits <= exact_limit``, or an exact ``exposure`` report given): the secret is among the
      ``k`` best iff its exact rank -- ties counted against it -- is ``<= k``.
    * **Top-k, beam** (larger spaces): a beam search of width ``max(top_k)`` over the secret's groups of four
      digits: each step scores all ``10^4`` values of the next group after every surviving partial secret and keeps
      the ``width`` best sums; the final candidates are rescored on their whole continuation and the secret is among
      the ``k`` best iff it is among the first ``k`` of them. A group ends where the written secret has a space, and
      byte-level BPE pre-tokenisers start a new pre-token there, so a partial secret's score is exactly the first
      part of its completions' scores (for other tokenisers the search is a heuristic; the final ranking is exact
      either way). The search is an attack: its candidates carry exact scores, but a secret outside the beam
      may still outrank them in the whole space.

    Args:
      model: the trained NNX decoder.
      tokenizer: its tokenizer.
      canaries: the :class:`~snapaudit_jax.dpsgd.CanarySet`.
      top_k: the ``k`` values (positive integers).
      exact_limit: rank over the whole space when ``10^digits <= exact_limit`` (as :func:`canary_exposure`).
      exposure: the :func:`canary_exposure` report of the same model and canaries; if exact, its ranks are used
        instead of scoring the space again.

    Returns:
      An :class:`ExtractionReport` (per-canary rows, :meth:`~ExtractionReport.rates` for inserted and held-out).

    Raises:
      InputError: invalid ``canaries``, ``top_k``, ``exact_limit``, an ``exposure`` report of other canaries, or a
        prefix plus the continuation longer than the model's context.

    Guarantees:
      None (an attack's success rate, see the module docstring).
    """
    space = _space(canaries)
    ks = _top_k(top_k)
    exact_limit = validate.positive_int("exact_limit", exact_limit)
    items = canaries.canaries
    if exposure is not None and (not isinstance(exposure, ExposureReport) or exposure.space_size != space.size
                                 or [r.index for r in exposure.rows] != [c.index for c in items]):
        raise InputError("exposure must be the canary_exposure report of these canaries, got one of other canaries")
    lm = _language_model(model, tokenizer)
    prompt = frame(tokenizer, space.prefix, eos=False)
    new = max(len(c.continuation) for c in items)
    if len(prompt) + new > lm.max_length:
        raise InputError(f"the prefix has {len(prompt)} tokens; with {new} new tokens for the secret that exceeds the "
                         f"model's {lm.max_length} positions")
    greedy = lm.generate([prompt], max_new_tokens=new)[0].text
    candidates = None
    if exposure is not None and exposure.method == "exact":
        ranks = [r.rank for r in exposure.rows]
        method = "exact"
    elif space.size <= exact_limit:
        everything = _score(lm, tokenizer, space.prefix, [space.continuation(space.secret(i))
                                                           for i in range(space.size)])
        ranks = exposure_exact(everything[[_index(c.secret) for c in items]], everything).rank.tolist()
        method = "exact"
    else:
        candidates = _beam(lm, tokenizer, space, max(ks))
        position = {s: i + 1 for i, s in enumerate(candidates)}
        ranks = [position.get(c.secret, math.inf) for c in items]
        method = "beam"
    rows = tuple(CanaryExtraction(index=c.index, inserted=bool(c.inserted), greedy=greedy.startswith(c.continuation),
                                  top_k=tuple(bool(ranks[i] <= k) for k in ks)) for i, c in enumerate(items))
    return ExtractionReport(rows=rows, top_k=ks, method=method, greedy_continuation=greedy, candidates=candidates)


# --- the one-run bound ------------------------------------------------------------------------------------


def one_run_bound(scores, canaries: CanarySet, *, delta: float, alpha: float = 0.05,
                  pairs: Sequence[tuple[int, int]] | None = None) -> dict[int, OneRunResult]:
    """One-run lower bounds on ``eps`` from the canaries' membership scores, one per repetition count.

    As the PII experiment's canary audit (``attacks.canary.canary_audit``) does: the canaries assigned ``r``
    repetitions (by index, before the coins) form group ``r``; each group is audited as one run by
    :func:`~snapaudit_jax.estimation.one_run.one_run_audit` with its coins, the set's insertion probability and a
    :class:`~snapaudit_jax.estimation.one_run.DeclaredGrid` of guess pairs fixed before the scores
    (:func:`~snapaudit_jax.estimation.one_run.default_grid` of the group's size, or ``pairs``).

    Args:
      scores: ``(n,)`` finite membership scores in canary order, higher = "inserted" (e.g.
        :attr:`ExposureReport.scores`, ``log P(continuation | prefix)``).
      canaries: the :class:`~snapaudit_jax.dpsgd.CanarySet` whose coins the scores are tested against.
      delta: the claim's ``delta`` in ``[0, 1)``; ``delta > 0`` requires ``insert_probability = 1/2``.
      alpha: each group's failure probability, in ``(0, 1)``.
      pairs: the declared ``(k_plus, k_minus)`` grid for every group (default: each group's ``default_grid``).

    Returns:
      ``{r: OneRunResult}`` for each repetition count ``r``, increasing; ``result.epsilon`` is the bound (group
      privacy for ``r`` records).

    Raises:
      InputError: ``canaries`` not a ``CanarySet``; a design the bound does not cover (``delta > 0`` with
        ``insert_probability != 1/2``, checked first); scores not finite, not 1-D or not one per canary; ``alpha``
        out of range; a pair too large for a group.

    Guarantees:
      Each group's ``epsilon`` is below the run's ``eps`` at ``delta`` (for ``r`` records) with probability
      ``>= 1 - alpha``, given independent insertion with the stated probability and scores that depend on the
      trained model alone (:mod:`snapaudit_jax.estimation.one_run`); the groups' bounds hold separately, not
      simultaneously.
    """
    if not isinstance(canaries, CanarySet):
        raise InputError(f"canaries must be a CanarySet (snapaudit_jax.dpsgd.make_canaries), got "
                         f"{type(canaries).__name__}")
    check_design(canaries.insert_probability, delta)
    s = validate.finite_array("scores", scores)
    if s.ndim != 1 or s.shape[0] != len(canaries.canaries):
        raise InputError(f"scores must be 1-dimensional with one score per canary ({len(canaries.canaries)}), got "
                         f"shape {s.shape}")
    inserted, reps = canaries.inserted, canaries.repetitions
    out = {}
    for r in sorted(set(reps.tolist())):
        group = reps == r
        grid = tuple(tuple(p) for p in pairs) if pairs is not None else default_grid(int(group.sum()))
        out[int(r)] = one_run_audit(s[group], inserted[group], insert_probability=canaries.insert_probability,
                                    delta=delta, alpha=alpha, rule=DeclaredGrid(grid))
    return out


def one_run_ceiling(canaries: CanarySet, *, delta: float, alpha: float = 0.05,
                    pairs: Sequence[tuple[int, int]] | None = None) -> dict[int, float]:
    """The largest bound :func:`one_run_bound` can give on this canary design: every coin guessed right.

    An attack can do no better than scores that rank every inserted canary above every other one; its bound is
    the ceiling of what the design can show, whatever the model memorised. A ceiling of 0 means the canaries are
    too few for any non-trivial one-run bound (see :func:`canaries_for_a_positive_bound`).

    Args:
      canaries: the design (its coins and repetition groups).
      delta: as :func:`one_run_bound`.
      alpha: as :func:`one_run_bound`.
      pairs: as :func:`one_run_bound`.

    Returns:
      ``{r: epsilon}`` per repetition count, as :func:`one_run_bound`.
    """
    if not isinstance(canaries, CanarySet):
        raise InputError(f"canaries must be a CanarySet (snapaudit_jax.dpsgd.make_canaries), got "
                         f"{type(canaries).__name__}")
    perfect = canaries.inserted.astype(np.float64)
    return {r: res.epsilon for r, res in one_run_bound(perfect, canaries, delta=delta, alpha=alpha,
                                                        pairs=pairs).items()}


def canaries_for_a_positive_bound(*, delta: float, alpha: float = 0.05, insert_probability: float = 0.5,
                                  limit: int = 4096) -> int | None:
    """The fewest canaries whose one-run bound can be positive: every coin guessed right, half of them inserted.

    Args:
      delta: the claim's ``delta``.
      alpha: the bound's failure probability.
      insert_probability: each canary's inclusion probability (``1/2`` with ``delta > 0``).
      limit: the largest count tried.

    Returns:
      The smallest even ``m <= limit`` whose perfect guesses (``m / 2`` inserted, each guessed right, the
      :func:`~snapaudit_jax.estimation.one_run.default_grid` of ``m``) reject ``epsilon = 0`` at level ``alpha``;
      ``None`` if none does.
    """
    check_design(insert_probability, delta)
    for m in range(2, limit + 1, 2):
        inserted = np.arange(m) % 2 == 0
        result = one_run_audit(inserted.astype(np.float64), inserted, insert_probability=insert_probability,
                               delta=delta, alpha=alpha, rule=DeclaredGrid(default_grid(m)))
        if result.epsilon > 0.0:
            return m
    return None
