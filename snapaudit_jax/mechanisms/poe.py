"""Product of Experts (PoE): Gumbel-max (exponential mechanism) over clipped utilities."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from snapaudit_jax.mechanisms import variates
from snapaudit_jax.mechanisms.base import Mechanism, Release, pytree_dataclass
from snapaudit_jax.mechanisms.noise import exponential_mechanism_scale, float32_noise_parameter

__all__ = ["ProductOfExperts"]


@pytree_dataclass
class ProductOfExperts(Mechanism):
    """Product of Experts (Romijnders et al. 2026; SnapAudit Alg. 4).

    Releases ``argmax_k (U_k * scale + Gumbel(0, 1))`` where ``U`` (``(k,)``) is the sum over experts of label
    log-probabilities clipped to ``[-Gamma, 0]``.

    Attributes:
      scale: ``eps / (2 Gamma)``, ``()`` float32.

    Guarantees:
      ``eps``-DP (pure) for replace-one neighbours, which move each ``U_k`` by at most ``Gamma`` (exponential
      mechanism, McSherry & Talwar 2007).

    White-box statistic: the noisy margin ``x_t - max_{j != t} x_j``. By max-stability of the Gumbel law it is
    ``Logistic(m_t - LSE_{j != t} m_j, 1)`` with ``m = scale * U``, whose location moves by at most ``eps`` between
    neighbours, so releasing it stays ``eps``-DP and the white-box audit tests the claim itself. (The full noisy
    vector is *not* covered by the claim: its Gumbel coordinates leak through their light left tail.)
    """

    scale: jax.Array
    name: ClassVar[str] = "poe"
    gaussian: ClassVar[bool] = False

    @classmethod
    def calibrated(cls, epsilon: float, clip: float):
        """PoE with the exponential-mechanism scale ``epsilon / (2 clip)`` (pure ``epsilon``-DP per query).

        Args:
          epsilon: the claimed ``eps`` (> 0).
          clip: the clip ``Gamma`` (> 0) of the utilities, their sensitivity.

        Returns:
          The calibrated :class:`ProductOfExperts`.

        Raises:
          InputError: ``epsilon`` or ``clip`` is not a finite number > 0, or ``epsilon / (2 clip)`` is not a normal
            float32.
        """
        scale = exponential_mechanism_scale(epsilon, clip)
        return cls(scale=jnp.float32(float32_noise_parameter("scale", scale, epsilon=epsilon, sensitivity=clip)))

    @classmethod
    def from_claim(cls, epsilon: float, delta: float, sensitivity: float):
        """The registry's constructor: :meth:`calibrated` with ``clip = sensitivity``.

        Args:
          epsilon: the claimed ``eps`` (> 0).
          delta: unused (pure DP).
          sensitivity: the clip ``Gamma``.

        Returns:
          The calibrated :class:`ProductOfExperts`.

        Raises:
          InputError: as :meth:`calibrated`.
        """
        return cls.calibrated(epsilon, sensitivity)

    @classmethod
    def neighbour_distance(cls, reference_with, reference_without):
        """L-infinity distance ``max_k |U_k - U'_k|`` (the clip bounds each utility's move).

        See :meth:`Mechanism.neighbour_distance`.
        """
        return float(np.max(np.abs(np.asarray(reference_with) - np.asarray(reference_without))))

    def noise_unit(self):
        """``1 / scale``. See :meth:`Mechanism.noise_unit`."""
        return 1.0 / float(self.scale)

    def __call__(self, key, clean):
        """One trial on ``(k,)`` utilities: ``Release(argmax label, noisy scores (k,))``.

        See :meth:`Mechanism.__call__`.
        """
        utility = jnp.asarray(clean, jnp.float32)
        noisy = utility * self.scale + variates.gumbel(key, utility.shape)
        return Release(jnp.argmax(noisy), noisy)

    def prepare(self, clean, attack):
        # Location of the noisy margin (Gumbel max-stability): m_t - LSE_{j != t} m_j.
        """The ``()`` float32 location ``m_t - LSE_{j != t} m_j`` of the noisy margin. See :meth:`Mechanism.prepare`."""
        m = jnp.asarray(clean, jnp.float32) * self.scale
        others = jnp.where(jnp.arange(m.shape[-1]) == attack.target, -jnp.inf, m)
        return m[attack.target] - jax.nn.logsumexp(others)

    def noise(self, key, num, prepared):
        """``(num,)`` float32 standard logistic variates (the margin's noise). See :meth:`Mechanism.noise`."""
        return variates.logistic(key, (num,))

    def outcomes(self, noise, prepared, attack):
        """Score: the noisy margin; hit: the margin is positive (the release is the target).

        See :meth:`Mechanism.outcomes`.
        """
        margin = prepared + noise  # the release is the target iff the margin is positive
        return margin > 0, margin
