"""Private Voting (PV): Gaussian noise on the vote vector, arg-max label release."""

from __future__ import annotations

import math
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from snapaudit_jax.mechanisms import variates
from snapaudit_jax.mechanisms.base import SQRT2, Attack, Mechanism, Release, pytree_dataclass
from snapaudit_jax.mechanisms.noise import float32_noise_parameter, gaussian_sigma

__all__ = ["PrivateVoting", "contrast_basis", "contrast_direction"]


class _PvPrepared(NamedTuple):
    votes: jax.Array  # (k,)
    basis: jax.Array  # (k, k - 1) orthonormal basis of the contrast space 1^perp
    direction: jax.Array  # (k,) contrast part of the attack direction


def contrast_direction(attack: Attack) -> jax.Array:
    """PV's white-box direction ``w - mean(w)`` for ``w = reference_with - reference_without``.

    Args:
      attack: the attack; its references are ``(k,)`` vote vectors.

    Returns:
      ``(k,)`` float32, the part of ``w`` orthogonal to the all-ones vector.
    """
    w = attack.reference_with - attack.reference_without
    return w - jnp.mean(w)


@pytree_dataclass
class PrivateVoting(Mechanism):
    """Private Voting (Wu et al. 2023; SnapAudit Alg. 3).

    Adds ``N(0, sigma^2)`` to every class count of the clean vote vector ``(k,)`` and releases the arg-max label.

    Attributes:
      sigma: noise standard deviation, ``()`` float32 (a traced leaf: changing it does not recompile).

    Guarantees:
      With ``sigma = analytic_gaussian_sigma(eps, delta, sqrt(2))`` the release is ``(eps, delta)``-DP for
      replace-one neighbours (one vote moves between two classes: L2 sensitivity ``sqrt(2)``).

    The arg-max ignores noise along the all-ones vector, and vote vectors of neighbouring contexts have equal
    totals, so the white-box score is ``<noisy, w - mean(w)>`` and the simulator draws the noise in the
    ``(k - 1)``-dimensional contrast space only.
    """

    sigma: jax.Array
    name: ClassVar[str] = "pv"
    gaussian: ClassVar[bool] = True

    @classmethod
    def calibrated(cls, epsilon: float, delta: float, sensitivity: float = SQRT2, calibration: str = "analytic"):
        """PV with ``sigma`` calibrated to ``(epsilon, delta)`` at L2 ``sensitivity``.

        Args:
          epsilon: the claimed ``eps`` (> 0).
          delta: the claimed ``delta`` in ``(0, 1)``.
          sensitivity: L2 sensitivity of the vote vector (default ``sqrt(2)``, replace-one neighbours).
          calibration: ``"analytic"`` (exact, Balle & Wang 2018) or ``"classical"`` (Dwork & Roth; valid only for
            ``eps < 1``).

        Returns:
          The calibrated :class:`PrivateVoting`.

        Raises:
          InputError: an out-of-range ``epsilon``, ``delta`` or ``sensitivity``, an unknown ``calibration``, or a
            ``sigma`` that is not a normal float32 (:func:`~snapaudit_jax.mechanisms.noise.float32_noise_parameter`).
        """
        sigma = gaussian_sigma(epsilon, delta, sensitivity, calibration)
        return cls(sigma=jnp.float32(float32_noise_parameter("sigma", sigma, epsilon=epsilon, delta=delta,
                                                             sensitivity=sensitivity)))

    @classmethod
    def from_claim(cls, epsilon: float, delta: float, sensitivity: float, *, calibration: str = "analytic"):
        """The registry's constructor: :meth:`calibrated` (see :func:`snapaudit_jax.mechanisms.build`).

        Args:
          epsilon: the claimed ``eps`` (> 0).
          delta: the claimed ``delta`` in ``(0, 1)``.
          sensitivity: L2 sensitivity of the vote vector.
          calibration: ``"analytic"`` or ``"classical"``.

        Returns:
          The calibrated :class:`PrivateVoting`.

        Raises:
          InputError: as :meth:`calibrated`.
        """
        return cls.calibrated(epsilon, delta, sensitivity, calibration)

    def noise_unit(self):
        """``sigma``. See :meth:`Mechanism.noise_unit`."""
        return float(self.sigma)

    def __call__(self, key, clean):
        """One trial on a ``(k,)`` vote vector: ``Release(argmax label, noisy votes (k,))``.

        See :meth:`Mechanism.__call__`.
        """
        votes = jnp.asarray(clean, jnp.float32)
        noisy = votes + self.sigma * variates.normal(key, votes.shape)
        return Release(jnp.argmax(noisy), noisy)

    def prepare(self, clean, attack):
        """Votes ``(k,)``, an orthonormal basis ``(k, k - 1)`` of the contrast space, the contrast direction ``(k,)``.

        See :meth:`Mechanism.prepare`.
        """
        votes = jnp.asarray(clean, jnp.float32)
        return _PvPrepared(votes, contrast_basis(votes.shape[-1]), contrast_direction(attack))

    def noise(self, key, num, prepared):
        """``(k - 1, num)`` float32 standard normals in the contrast space. See :meth:`Mechanism.noise`."""
        return variates.normal(key, (prepared.basis.shape[-1], num))

    def outcomes(self, noise, prepared, attack):
        """Hit: the noisy arg-max is the target; score: ``<noisy, w - mean(w)>``. See :meth:`Mechanism.outcomes`."""
        # noisy = votes + sigma * basis @ noise, one class row at a time: the Householder basis is a rank-one update
        # of the identity (O(k) per trial), and per-row expressions keep XLA from recomputing the noise once per
        # consumer, which a concatenated (k, num) array provokes on CPU.
        k = noise.shape[0] + 1
        a, b = _householder_coefficients(k)
        s = jnp.sum(noise, axis=0)
        rows = [prepared.votes[i] + self.sigma * (noise[i] - a * s) for i in range(k - 1)]
        rows.append(prepared.votes[k - 1] + self.sigma * (b * s))
        top = rows[attack.target]
        hit = jnp.ones(top.shape, bool)
        for j, row in enumerate(rows):  # jnp.argmax's ties: the first maximum wins
            if j != attack.target:
                hit &= (row < top) if j < attack.target else (row <= top)
        score = sum(row * prepared.direction[i] for i, row in enumerate(rows))
        return hit, score

    def hit_noise(self, key, num, prepared):
        """From 4 classes on: ``(2, 2, num)`` uint32, the words of the target's normal and of a uniform coin (two
        words each, whatever ``k``); fewer classes: :meth:`noise`. See :meth:`Mechanism.hit_noise`."""
        if prepared.votes.shape[0] < _CONDITIONAL_FROM:
            return self.noise(key, num, prepared)
        return variates.random_words(key, (2, 2, num))

    def hit_outcomes(self, noise, prepared, attack):
        """The arg-max is the target, sampled from its exact conditional law given the target's noise.

        With ``k`` i.i.d. normals ``Z`` (the arg-max ignores the all-ones direction, so this is the release's law),
        ``P(hit | Z_t = z) = prod_{j != t} Phi((v_t - v_j) / sigma + z)``; the coin ``V`` decides ``V < p``, as
        ``u < p`` or ``u > 1 - p`` for ``V = u`` or ``1 - u``, with ``p = exp(L)`` and ``1 - p = -expm1(L)`` from
        ``L = sum_j log Phi(.)`` (``log_ndtr``), so both tails keep their relative precision. Four words per trial
        instead of ``2 (k - 1)``. Fewer than 4 classes: the hit of :meth:`outcomes`.

        See :meth:`Mechanism.hit_outcomes`.
        """
        k = prepared.votes.shape[0]
        if k < _CONDITIONAL_FROM:
            return self.outcomes(noise, prepared, attack)[0]
        z = variates.normal_from_bits(noise[0])
        heads, u = variates.sign_and_half_uniform(noise[1])
        top = prepared.votes[attack.target]
        log_p = sum(jax.scipy.special.log_ndtr((top - prepared.votes[j]) / self.sigma + z)
                    for j in range(k) if j != attack.target)
        return jnp.where(heads, u < jnp.exp(log_p), u > -jnp.expm1(log_p))


_CONDITIONAL_FROM = 4  # classes from which the conditional hit draws fewer words than k - 1 normals


def _householder_coefficients(k: int) -> tuple[float, float]:
    # H = I - 2 v v^T / (v^T v), v = e_k - 1 / sqrt(k), maps e_k to 1 / sqrt(k) and e_k^perp onto 1^perp; for
    # x in R^(k-1), H (x, 0) = (x - a sum(x), b sum(x)) with a = 1 / (sqrt(k) (sqrt(k) - 1)), b = 1 / sqrt(k).
    r = math.sqrt(k)
    return 1.0 / (r * (r - 1.0)), 1.0 / r


def contrast_basis(k: int) -> jax.Array:
    """PV's orthonormal basis of the contrast space ``1^perp`` of ``R^k``: the first ``k - 1`` columns of the
    Householder reflection that maps ``e_k`` to ``1 / sqrt(k)``.

    :meth:`PrivateVoting.outcomes` applies it in ``O(k)`` per trial (a rank-one update), not as a matrix product.

    Args:
      k: number of classes (>= 2).

    Returns:
      ``(k, k - 1)`` float32 ``B`` with ``B^T B = I`` and ``1^T B = 0``.
    """
    a, b = _householder_coefficients(k)
    head = jnp.eye(k - 1, dtype=jnp.float32) - jnp.float32(a)
    return jnp.concatenate([head, jnp.full((1, k - 1), b, jnp.float32)], axis=0)
