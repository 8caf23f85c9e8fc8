"""Embedding Space Aggregation (ESA): Gaussian noise on the mean embedding, nearest-candidate release."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from snapaudit_jax.mechanisms import variates
from snapaudit_jax.mechanisms.base import Mechanism, Release, pytree_dataclass
from snapaudit_jax.mechanisms.noise import float32_noise_parameter, gaussian_sigma
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["EmbeddingSpaceAggregation"]


class _EsaPrepared(NamedTuple):
    sq_dist: jax.Array  # (c,) |m - c_i|^2
    cand_proj: jax.Array  # (c, r) c_i - c_0 in the orthonormal basis
    dir_proj: jax.Array  # (r,) attack direction in the basis
    score0: jax.Array  # () <m, w>


@pytree_dataclass
class EmbeddingSpaceAggregation(Mechanism):
    """Embedding Space Aggregation (Wu et al. 2023; SnapAudit Alg. 5).

    Adds ``N(0, sigma^2 I)`` to the mean ``(d,)`` of the per-partition response embeddings and releases the index
    of the candidate embedding nearest to the noisy mean.

    Attributes:
      sigma: noise standard deviation, ``()`` float32.
      candidates: candidate embeddings, ``(c, d)`` float32.

    Guarantees:
      With unit-norm embeddings and ``T`` partitions the mean has L2 sensitivity ``2/T`` (SnapAudit Lemma C.1);
      :meth:`calibrated` uses it unless a sensitivity is forced (e.g. the flawed value 1).

    The simulator never draws ``d``-dimensional noise: the release depends on the noise only through
    ``<Z, c_i - c_0>`` and the white-box score through ``<Z, w>``, so it draws ``N(0, I_r)`` in an orthonormal basis
    of ``span(c_1 - c_0, ..., c_{c-1} - c_0, w)`` (``r = min(c, d)``), which has the same distribution.
    """

    sigma: jax.Array
    candidates: jax.Array
    name: ClassVar[str] = "esa"
    gaussian: ClassVar[bool] = True

    @classmethod
    def calibrated(
        cls,
        epsilon: float,
        delta: float,
        candidates,
        partitions: int = 1,
        sensitivity: float | None = None,
        calibration: str = "analytic",
    ):
        """ESA with ``sigma`` calibrated to ``(epsilon, delta)``.

        Args:
          epsilon: the claimed ``eps`` (> 0).
          delta: the claimed ``delta`` in ``(0, 1)``.
          candidates: ``(c, d)`` finite candidate embeddings.
          partitions: number ``T >= 1`` of partitions whose embeddings are averaged.
          sensitivity: L2 sensitivity of the mean; ``None`` uses ``2 / partitions`` (unit-norm embeddings).
          calibration: ``"analytic"`` or ``"classical"``.

        Returns:
          The calibrated :class:`EmbeddingSpaceAggregation`.

        Raises:
          InputError: ``partitions`` not a positive integer, ``candidates`` not a finite ``(c, d)`` array within
            float32's range, an out-of-range ``epsilon``, ``delta`` or ``sensitivity``, an unknown ``calibration``,
            or a ``sigma`` that is not a normal float32.
        """
        partitions = validate.positive_int("partitions", partitions)
        if sensitivity is None:
            sensitivity = 2.0 / partitions
        cand = validate.finite_array("candidates", candidates, ndim_min=2)
        if cand.ndim != 2:
            raise InputError(f"candidates must have shape (c, d), got {cand.shape}")
        if float(np.max(np.abs(cand))) > float(np.finfo(np.float32).max):
            raise InputError(f"candidates must be within float32's range (the kernels compute in float32), found "
                             f"{float(np.max(np.abs(cand))):.6g}")
        sigma = float32_noise_parameter("sigma", gaussian_sigma(epsilon, delta, sensitivity, calibration),
                                        epsilon=epsilon, delta=delta, sensitivity=sensitivity)
        return cls(sigma=jnp.float32(sigma), candidates=jnp.asarray(cand, jnp.float32))

    @classmethod
    def from_claim(cls, epsilon: float, delta: float, sensitivity: float, *, candidates, partitions: int = 1,
                   calibration: str = "analytic"):
        """The registry's constructor: :meth:`calibrated` (see :func:`snapaudit_jax.mechanisms.build`).

        Args:
          epsilon: the claimed ``eps`` (> 0).
          delta: the claimed ``delta`` in ``(0, 1)``.
          sensitivity: L2 sensitivity of the mean embedding.
          candidates: ``(c, d)`` candidate embeddings.
          partitions: number of partitions ``T``.
          calibration: ``"analytic"`` or ``"classical"``.

        Returns:
          The calibrated :class:`EmbeddingSpaceAggregation`.

        Raises:
          InputError: as :meth:`calibrated`.
        """
        return cls.calibrated(epsilon, delta, candidates, partitions=partitions, sensitivity=sensitivity,
                              calibration=calibration)

    @classmethod
    def default_target(cls, reference_with, reference_without, *, candidates=None, **context):
        """The candidate whose squared distance to the mean shrinks most: ``argmax_i <c_i, w>``.

        Args:
          reference_with: ``(d,)`` mean embedding with the canary.
          reference_without: ``(d,)`` mean embedding without it.
          candidates: ``(c, d)`` candidate embeddings (required).
          **context: ignored.

        Returns:
          The candidate index.

        Raises:
          InputError: ``candidates`` is not given.
        """
        if candidates is None:
            raise InputError("ESA needs candidates to choose a default target")
        # The candidate whose squared distance to the mean shrinks most.
        w = np.asarray(reference_with) - np.asarray(reference_without)
        return int(np.argmax(np.asarray(candidates) @ w))

    @classmethod
    def num_targets(cls, clean_shape, *, candidates=None, **context):
        """The number ``c`` of candidates. See :meth:`Mechanism.num_targets`."""
        return int(np.asarray(candidates).shape[0])

    def noise_unit(self):
        """``sigma``. See :meth:`Mechanism.noise_unit`."""
        return float(self.sigma)

    def __call__(self, key, clean):
        """One trial on a ``(d,)`` mean: ``Release(nearest candidate index, noisy mean (d,))``.

        See :meth:`Mechanism.__call__`.
        """
        mean = jnp.asarray(clean, jnp.float32)
        noisy = mean + self.sigma * variates.normal(key, mean.shape)
        sq = jnp.sum(jnp.square(noisy[None, :] - self.candidates), axis=-1)
        return Release(jnp.argmin(sq), noisy)

    def prepare(self, clean, attack):
        """Squared distances ``(c,)``, candidate differences ``(c, r)``, direction ``(r,)`` (in a basis), ``<mean, w>``.

        See :meth:`Mechanism.prepare`.
        """
        mean = jnp.asarray(clean, jnp.float32)
        w = attack.reference_with - attack.reference_without
        diffs = self.candidates[1:] - self.candidates[:1]
        basis, _ = jnp.linalg.qr(jnp.concatenate([diffs, w[None, :]], axis=0).T)
        return _EsaPrepared(
            sq_dist=jnp.sum(jnp.square(mean[None, :] - self.candidates), axis=-1),
            cand_proj=(self.candidates - self.candidates[:1]) @ basis,
            dir_proj=w @ basis,
            score0=jnp.dot(mean, w),
        )

    def noise(self, key, num, prepared):
        """``(r, num)`` float32 standard normals in the ``r``-dimensional basis. See :meth:`Mechanism.noise`."""
        return variates.normal(key, (prepared.dir_proj.shape[-1], num))

    def outcomes(self, noise, prepared, attack):
        # |m + sZ - c_i|^2 = |m - c_i|^2 - 2s<Z, c_i - c_0> + (terms common to all i).
        # cand_proj (c, r, T), noise (r, num): projections (c, num).
        """Hit: the nearest candidate is the target; score: ``<noisy mean, w>``. See :meth:`Mechanism.outcomes`."""
        proj = jnp.sum(prepared.cand_proj * noise[None], axis=1)
        release = jnp.argmin(prepared.sq_dist - 2.0 * self.sigma * proj, axis=0)
        score = prepared.score0 + self.sigma * jnp.sum(prepared.dir_proj * noise, axis=0)
        return release == attack.target, score
