"""Exact attack success probabilities ``h_b(v)`` (host-side, float64).

``h_b(v) = P_noise[A(g(v, noise)) = 1]`` for one clean output ``v`` has a
closed form or a one-dimensional integral for:

* PV, black-box, any ``k``:
  ``P(argmax(v + sigma Z) = t) = int phi(z) prod_{j != t} Phi((v_t - v_j)/sigma + z) dz``;
* PV and ESA, white-box (score ``<noisy, w>`` is Gaussian; PV uses the
  contrast part ``w - mean(w)``): ``P(score >= tau) = Phi((<v, w> - tau) / (sigma |w|))``;
* PoE, black-box: ``softmax(scale * U)_t`` (Gumbel-max);
* PoE, white-box (noisy margin ~ ``Logistic(m_t - LSE_{j != t} m_j, 1)``):
  ``P(margin >= tau) = sigmoid(m_t - LSE_{j != t} m_j - tau)``;
* ESA, black-box, two candidates:
  ``Phi((2 <m, u> - |c_t|^2 + |c_o|^2) / (2 sigma |u|))`` with ``u = c_t - c_o``.

Every function returns the pair ``(p, 1 - p)`` with both members computed
directly, so probabilities within ``1e-16`` of 1 keep their precision. They
remove the Monte Carlo term from the audit (``method="exact"``) and are the
simulator's test oracle.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import integrate, optimize, special

from snapaudit_jax.mechanisms import Attack, EmbeddingSpaceAggregation, Mechanism, PrivateVoting, ProductOfExperts
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "exact_hit_probability",
    "exact_output_distribution",
    "exact_release_epsilon",
    "exact_score_probability",
    "exact_score_grid",
    "pv_argmax_probability",
    "supports_exact",
]


def supports_exact(mechanism: Mechanism, threat: str) -> bool:
    """Whether the exact probabilities exist for this mechanism and threat.

    Args:
      mechanism: the mechanism.
      threat: ``"black"`` (PV, PoE, two-candidate ESA) or ``"white"`` (PV, ESA, PoE).

    Returns:
      ``True`` where a closed form exists.
    """
    if threat == "black":
        if isinstance(mechanism, EmbeddingSpaceAggregation):
            return np.asarray(mechanism.candidates).shape[0] == 2
        return isinstance(mechanism, (PrivateVoting, ProductOfExperts))
    return isinstance(mechanism, (PrivateVoting, EmbeddingSpaceAggregation, ProductOfExperts))


def _unsupported(mechanism: Mechanism, threat: str) -> InputError:
    what = f"{mechanism.name} with the {threat}-box attack"
    if isinstance(mechanism, EmbeddingSpaceAggregation) and threat == "black":
        what += f" and {np.asarray(mechanism.candidates).shape[0]} candidates (exact needs 2)"
    return InputError(f"method='exact' has no closed form for {what}; use method='simulate'")


def _argmax_integral(a: np.ndarray) -> float:
    """``int phi(z) prod_j Phi(a_j + z) dz`` to ~1e-10 relative accuracy."""
    if a.size == 1:
        return float(special.ndtr(a[0] / math.sqrt(2.0)))

    def log_f(z: float) -> float:
        return -0.5 * z * z - 0.5 * math.log(2.0 * math.pi) + float(np.sum(special.log_ndtr(a + z)))

    # log_f is strictly concave with curvature <= -1: unimodal, width <= 1.
    res = optimize.minimize_scalar(lambda z: -log_f(z), bracket=(-1.0, 1.0 + float(np.max(-a, initial=0.0))))
    z_star = float(res.x)
    peak = log_f(z_star)
    val, _ = integrate.quad(
        lambda z: math.exp(log_f(z) - peak), z_star - 16.0, z_star + 16.0, epsabs=0.0, epsrel=1e-11, limit=200,
        points=[z_star],
    )
    return float(min(1.0, math.exp(peak) * val))


def pv_argmax_probability(votes, sigma: float, target: int) -> tuple[float, float]:
    """``P(argmax(votes + sigma Z) = target)`` and its complement, ``Z ~ N(0, I_k)``.

    The complement is the sum of the other classes' probabilities, each its own integral, so both members are
    accurate to ~1e-10 relative.

    Args:
      votes: ``(k,)`` clean vote vector.
      sigma: noise standard deviation (> 0).
      target: the class index.

    Returns:
      ``(p, 1 - p)`` as floats.
    """
    v = np.asarray(votes, np.float64)
    k = v.size

    def prob(t: int) -> float:
        return _argmax_integral((v[t] - np.delete(v, t)) / sigma)

    return prob(target), sum(prob(j) for j in range(k) if j != target)


def exact_hit_probability(mechanism: Mechanism, clean, attack: Attack) -> tuple[np.ndarray, np.ndarray]:
    """Exact black-box success probability ``h_b(v)`` for each clean output.

    Args:
      mechanism: PV, PoE or two-candidate ESA.
      clean: ``(D, ...)`` clean outputs.
      attack: the attack (its ``target`` is used).

    Returns:
      ``(p, 1 - p)``, each ``(D,)`` float64.

    Raises:
      InputError: no closed form for this mechanism.
    """
    x = np.asarray(clean, np.float64)
    t = int(attack.target)
    if isinstance(mechanism, PrivateVoting):
        sigma = float(mechanism.sigma)
        pairs = np.array([pv_argmax_probability(v, sigma, t) for v in x]).reshape(-1, 2)
        return pairs[:, 0], pairs[:, 1]
    if isinstance(mechanism, ProductOfExperts):
        logits = x * float(mechanism.scale)
        log_z = special.logsumexp(logits, axis=1)
        return np.exp(logits[:, t] - log_z), np.exp(special.logsumexp(np.delete(logits, t, axis=1), axis=1) - log_z)
    if isinstance(mechanism, EmbeddingSpaceAggregation) and supports_exact(mechanism, "black"):
        cand = np.asarray(mechanism.candidates, np.float64)
        other = 1 - t
        u = cand[t] - cand[other]
        z = (2.0 * (x @ u) - cand[t] @ cand[t] + cand[other] @ cand[other]) / (
            2.0 * float(mechanism.sigma) * np.linalg.norm(u)
        )
        return special.ndtr(z), special.ndtr(-z)
    raise _unsupported(mechanism, "black")


def exact_output_distribution(mechanism: Mechanism, clean, attack: Attack) -> np.ndarray:
    """The black-box release's exact output distribution for each clean output.

    PV: ``P(argmax = j)`` for every class (one integral each); PoE: ``softmax(scale * u)``; two-candidate ESA:
    ``(P(nearest = c_0), P(nearest = c_1))`` ordered by candidate index.

    Args:
      mechanism: PV, PoE or two-candidate ESA.
      clean: ``(D, ...)`` clean outputs.
      attack: the attack (ESA uses its ``target``).

    Returns:
      ``(D, K)`` float64 probabilities, ``K`` the number of possible releases.

    Raises:
      InputError: no closed form for this mechanism.
    """
    x = np.asarray(clean, np.float64)
    if isinstance(mechanism, PrivateVoting):
        sigma = float(mechanism.sigma)
        return np.array([[_argmax_integral((v[j] - np.delete(v, j)) / sigma) for j in range(v.size)] for v in x])
    if isinstance(mechanism, ProductOfExperts):
        logits = x * float(mechanism.scale)
        return np.exp(logits - special.logsumexp(logits, axis=1, keepdims=True))
    if isinstance(mechanism, EmbeddingSpaceAggregation) and supports_exact(mechanism, "black"):
        p, q = exact_hit_probability(mechanism, x, attack)
        return np.stack([p, q], axis=1) if int(attack.target) == 0 else np.stack([q, p], axis=1)
    raise _unsupported(mechanism, "black")


def exact_release_epsilon(mechanism: Mechanism, with_canary, without_canary, attack: Attack, threat: str,
                          delta: float) -> float | None:
    """Exact ``eps(delta)`` of the release for fixed clean outputs, or ``None`` where it has no closed form.

    Black-box (PV, PoE, two-candidate ESA): the released label's distribution, averaged over the given clean outputs
    (a mixture over recorded assignments), through the hockey-stick profile
    (:func:`snapaudit_jax.simulation.profiles.discrete_epsilon`). White-box with one distinct clean output per
    hypothesis: PV and ESA release the whole Gaussian-noised vector (``mu = |m_1 - m_0| / sigma`` exactly); PoE
    releases the noisy margin (a logistic location pair). White-box mixtures: ``None``.

    Args:
      mechanism: the mechanism.
      with_canary: ``(n1, ...)`` clean outputs with the canary.
      without_canary: ``(n0, ...)`` clean outputs without it.
      attack: the attack (its ``target`` defines PoE's margin and ESA's candidate order).
      threat: ``"black"`` or ``"white"``.
      delta: the ``delta`` of the profile.

    Returns:
      ``eps(delta)`` as a float (possibly ``inf``), or ``None``.

    Raises:
      InputError: ``delta`` out of the profile's range (``[0, 1)`` black-box, ``(0, 1)`` white-box).

    Guarantees:
      Exact for the stated release: the ``eps`` any attack on it can certify at most.
    """
    from snapaudit_jax.simulation.profiles import discrete_epsilon, gaussian_epsilon, logistic_epsilon
    from snapaudit_jax.simulation.snapshots import dedupe

    x1, x0 = np.asarray(with_canary, np.float64), np.asarray(without_canary, np.float64)
    if threat == "black":
        if not supports_exact(mechanism, "black"):
            return None
        parts = []
        for x in (x1, x0):
            distinct, _, counts = dedupe(x)
            parts.append(counts @ exact_output_distribution(mechanism, distinct, attack) / counts.sum())
        p1, p0 = (p / p.sum() for p in parts)
        return discrete_epsilon(p1, p0, delta)
    d1, d0 = dedupe(x1)[0], dedupe(x0)[0]
    if len(d1) != 1 or len(d0) != 1 or not supports_exact(mechanism, "white"):
        return None
    if isinstance(mechanism, ProductOfExperts):
        loc = _margin_location(np.concatenate([d1, d0]), float(mechanism.scale), int(attack.target))
        return logistic_epsilon(float(loc[0] - loc[1]), delta)
    return gaussian_epsilon(float(np.linalg.norm(d1[0] - d0[0])), float(mechanism.sigma), delta)


def _margin_location(utilities: np.ndarray, scale: float, target: int) -> np.ndarray:
    m = utilities * scale
    return m[:, target] - special.logsumexp(np.delete(m, target, axis=1), axis=1)


def _direction(mechanism: Mechanism, attack: Attack) -> np.ndarray:
    """The white-box score direction: ``w`` (ESA) or its contrast part ``w - mean(w)`` (PV)."""
    w = np.asarray(attack.reference_with, np.float64) - np.asarray(attack.reference_without, np.float64)
    return w - w.mean() if isinstance(mechanism, PrivateVoting) else w


def _score_z(mechanism: Mechanism, clean: np.ndarray, attack: Attack, thresholds: np.ndarray):
    """``(z, kind)``: P(score >= tau) = F(z) with F = Phi ('normal') or sigmoid ('logistic')."""
    if isinstance(mechanism, ProductOfExperts):
        loc = _margin_location(clean, float(mechanism.scale), int(attack.target))
        return loc[:, None] - thresholds[None, :], "logistic"
    w = _direction(mechanism, attack)
    centre = (clean @ w)[:, None] - thresholds[None, :]
    spread = float(mechanism.sigma) * float(np.linalg.norm(w))
    if spread == 0.0:
        return np.where(centre >= 0, np.inf, -np.inf), "normal"
    return centre / spread, "normal"


def exact_score_probability(mechanism: Mechanism, clean, attack: Attack, threshold) -> tuple[np.ndarray, np.ndarray]:
    """Exact ``P(score >= threshold)`` of the white-box attack (PV, ESA, PoE).

    Args:
      mechanism: PV, ESA or PoE.
      clean: ``(D, ...)`` clean outputs.
      attack: the attack (its references / target define the score).
      threshold: a scalar, or ``(G,)`` thresholds.

    Returns:
      ``(p, 1 - p)``, each ``(D,)`` float64, or ``(D, G)`` for an array of thresholds.

    Raises:
      InputError: no closed form for this mechanism (KSA).
    """
    if not supports_exact(mechanism, "white"):
        raise _unsupported(mechanism, "white")
    thr = np.asarray(threshold, np.float64)
    z, kind = _score_z(mechanism, np.asarray(clean, np.float64), attack, thr.reshape(-1))
    cdf = special.expit if kind == "logistic" else special.ndtr
    p, q = cdf(z), cdf(-z)
    if thr.ndim == 0:
        return p[:, 0], q[:, 0]
    return p, q


def exact_score_grid(mechanism: Mechanism, clean, attack: Attack, num: int = 4001) -> np.ndarray:
    """Thresholds spanning the white-box score distributions of ``clean`` (threshold search).

    Args:
      mechanism: PV, ESA or PoE.
      clean: ``(D, ...)`` clean outputs.
      attack: the attack.
      num: number of thresholds.

    Returns:
      ``(num,)`` float64 evenly spaced thresholds (PoE: location range +- 40; PV, ESA: centre range +- 12 standard
      deviations), or the distinct score centres when the score has no noise.
    """
    x = np.asarray(clean, np.float64)
    if isinstance(mechanism, ProductOfExperts):
        loc = _margin_location(x, float(mechanism.scale), int(attack.target))
        return np.linspace(loc.min() - 40.0, loc.max() + 40.0, num)
    w = _direction(mechanism, attack)
    centres = x @ w
    spread = float(mechanism.sigma) * float(np.linalg.norm(w))
    if spread == 0.0:
        return np.unique(centres)
    return np.linspace(centres.min() - 12.0 * spread, centres.max() + 12.0 * spread, num)
