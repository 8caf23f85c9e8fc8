"""DP-ICL aggregation mechanisms as pure, key-first JAX kernels.

Each mechanism maps a *clean intermediate output* -- what the non-private
counterpart ``M'`` of the pipeline returns -- to a private release.

=========  ==========================  ============================  ==========================
mechanism  clean output                release (black-box)           noisy intermediate (white-box)
=========  ==========================  ============================  ==========================
PV         vote vector ``(k,)``        argmax label                  noisy votes ``(k,)``
PoE        clipped utility ``(k,)``    argmax label                  noisy scores ``(k,)``
ESA        mean embedding ``(d,)``     index of nearest candidate    noisy mean ``(d,)``
KSA        keyword histogram ``(d,)``  top-K keyword sequence (JEM)  the sequence ``(K,)``
=========  ==========================  ============================  ==========================

Every mechanism offers two layers:

* ``mechanism(key, clean) -> Release``: one trial, pure, key first; vmap it
  over keys in your own code.
* the simulator protocol used by :mod:`snapaudit_jax.simulate`:
  ``prepare(clean, attack)`` (deterministic, once per distinct snapshot),
  ``noise(key, num, prepared)`` (the DP randomness of ``num`` trials in one
  batched draw, trial axis *last*) and ``outcomes(noise, prepared, attack)
  -> (hit, score)`` (deterministic; ``prepared`` leaves carry a trailing
  trial axis of size 1 -- shared -- or ``num``). ``outcome`` is the same for
  one trial. ``outcome(noise(key, 1, p)[..., 0], p, a)`` has exactly the
  distribution of ``attack`` applied to ``mechanism(key, clean)``; the split
  lets the simulator draw noise for a whole block at once, and the trailing
  trial axis keeps XLA's CPU loops vectorised (a small minor axis does not).

The simulator protocol draws only the noise the outcome depends on (the
*sufficient noise*): PV draws ``k - 1`` normals in the contrast space of the
votes, PoE one logistic variate (the noisy margin), ESA ``c`` normals in the
span of the candidate differences and the attack direction, KSA two words for
an alias-table draw plus ``K`` position words. All variates come from
:mod:`snapaudit_jax.sampling`, which is exact in the tails.

The :class:`Attack` is the membership-inference attack: ``hit`` is the
black-box decision "the release is the target" (for KSA: "the target keyword
is selected") and ``score`` is the white-box log-likelihood-ratio statistic
between the two reference clean outputs (larger means "canary present"). With
deterministic clean outputs equal to the references it is the Neyman-Pearson
optimal white-box test.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from snapaudit_jax import sampling
from snapaudit_jax.calibration import exponential_mechanism_scale, gaussian_sigma
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "Attack",
    "Release",
    "Mechanism",
    "PrivateVoting",
    "ProductOfExperts",
    "EmbeddingSpaceAggregation",
]

SQRT2 = math.sqrt(2.0)


class Release(NamedTuple):
    """One mechanism output: ``output`` is public, ``noisy`` is white-box only."""

    output: jax.Array
    noisy: jax.Array


def _pytree_dataclass(cls):
    return jax.tree_util.register_dataclass(dataclasses.dataclass(frozen=True)(cls))


def _static(default=dataclasses.MISSING):
    return dataclasses.field(default=default, metadata=dict(static=True))


@_pytree_dataclass
class Attack:
    """A membership-inference attack on one mechanism.

    Attributes:
      target: the release (label, candidate index or keyword id) that signals
        "canary present" (static).
      reference_with: reference clean output with the canary, shape of one
        clean output.
      reference_without: reference clean output without the canary.
    """

    reference_with: jax.Array
    reference_without: jax.Array
    target: int = _static(0)


class Mechanism(abc.ABC):
    """Interface shared by the four mechanisms (see the module docstring)."""

    name: ClassVar[str]
    gaussian: ClassVar[bool]  # Gaussian noise: the GDP estimator applies.
    clean_ndim: ClassVar[int] = 1

    @abc.abstractmethod
    def __call__(self, key: jax.Array, clean: jax.Array) -> Release:
        """One trial of the mechanism on one clean output."""

    @abc.abstractmethod
    def prepare(self, clean: jax.Array, attack: Attack) -> Any:
        """Deterministic per-snapshot preprocessing (vmapped over snapshots)."""

    @abc.abstractmethod
    def noise(self, key: jax.Array, num: int, prepared: Any) -> Any:
        """DP randomness for ``num`` trials, trial axis last."""

    @abc.abstractmethod
    def outcomes(self, noise: Any, prepared: Any, attack: Attack) -> tuple[jax.Array, jax.Array]:
        """``(hit, score)`` of a batch: ``(num,)`` bool black-box decisions and float32 statistics.

        ``noise`` leaves end with the trial axis ``num``; ``prepared`` leaves
        end with an axis of size 1 (one snapshot for all trials) or ``num``.
        """

    def outcome(self, noise: Any, prepared: Any, attack: Attack) -> tuple[jax.Array, jax.Array]:
        """``(hit, score)`` of one trial (no trial axis)."""
        add = functools.partial(jax.tree_util.tree_map, lambda x: jnp.asarray(x)[..., None])
        hit, score = self.outcomes(add(noise), add(prepared), attack)
        return hit[0], score[0]

    # Host-side helpers ---------------------------------------------------
    @classmethod
    def default_target(cls, reference_with: np.ndarray, reference_without: np.ndarray, **context) -> int:
        """The release the canary moves towards."""
        return int(np.argmax(np.asarray(reference_with) - np.asarray(reference_without)))

    @classmethod
    def num_targets(cls, clean_shape: tuple[int, ...], **context) -> int:
        return int(clean_shape[-1])

    @classmethod
    def neighbour_distance(cls, reference_with: np.ndarray, reference_without: np.ndarray) -> float:
        """Distance between two clean outputs in the norm the sensitivity bounds."""
        return float(np.linalg.norm(np.asarray(reference_with) - np.asarray(reference_without)))

    def with_static(self, **changes) -> "Mechanism":
        return dataclasses.replace(self, **changes)


class _PvPrepared(NamedTuple):
    votes: jax.Array  # (k,)
    basis: jax.Array  # (k, k - 1) orthonormal basis of the contrast space 1^perp
    direction: jax.Array  # (k,) contrast part of the attack direction


def contrast_direction(attack: Attack) -> jax.Array:
    """``w - mean(w)`` for ``w = reference_with - reference_without`` (PV's white-box direction)."""
    w = attack.reference_with - attack.reference_without
    return w - jnp.mean(w)


@_pytree_dataclass
class PrivateVoting(Mechanism):
    """Private Voting (Wu et al. 2023; SnapAudit Alg. 3).

    Adds ``N(0, sigma^2)`` to every class count of the clean vote vector and
    releases the arg-max label.

    Attributes:
      sigma: noise standard deviation (a traced leaf: changing it does not
        recompile).

    Guarantees:
      With ``sigma = analytic_gaussian_sigma(eps, delta, sqrt(2))`` the
      release is ``(eps, delta)``-DP for replace-one neighbours (one vote moves
      between two classes: L2 sensitivity ``sqrt(2)``).

    The arg-max ignores noise along the all-ones vector, and vote vectors of
    neighbouring contexts have equal totals, so the white-box score is
    ``<noisy, w - mean(w)>`` and the simulator draws the noise in the
    ``(k - 1)``-dimensional contrast space only.
    """

    sigma: jax.Array
    name: ClassVar[str] = "pv"
    gaussian: ClassVar[bool] = True

    @classmethod
    def calibrated(cls, epsilon: float, delta: float, sensitivity: float = SQRT2, calibration: str = "analytic"):
        return cls(sigma=jnp.float32(gaussian_sigma(epsilon, delta, sensitivity, calibration)))

    def __call__(self, key, clean):
        votes = jnp.asarray(clean, jnp.float32)
        noisy = votes + self.sigma * sampling.normal(key, votes.shape)
        return Release(jnp.argmax(noisy), noisy)

    def prepare(self, clean, attack):
        votes = jnp.asarray(clean, jnp.float32)
        k = votes.shape[-1]
        contrasts = jnp.eye(k, k - 1).at[k - 1].set(-1.0)  # columns e_i - e_{k-1}, a basis of 1^perp
        basis, _ = jnp.linalg.qr(contrasts)
        return _PvPrepared(votes, basis, contrast_direction(attack))

    def noise(self, key, num, prepared):
        return sampling.normal(key, (prepared.basis.shape[-1], num))

    def outcomes(self, noise, prepared, attack):
        # votes (k, T), basis (k, k-1, T), noise (k-1, num): noisy (k, num).
        noisy = prepared.votes + self.sigma * jnp.sum(prepared.basis * noise[None], axis=1)
        return jnp.argmax(noisy, axis=0) == attack.target, jnp.sum(noisy * prepared.direction, axis=0)


@_pytree_dataclass
class ProductOfExperts(Mechanism):
    """Product of Experts (Romijnders et al. 2026; SnapAudit Alg. 4).

    Releases ``argmax_k (U_k * scale + Gumbel(0, 1))`` where ``U`` is the sum
    over experts of label log-probabilities clipped to ``[-Gamma, 0]``.

    Attributes:
      scale: ``eps / (2 Gamma)``.

    Guarantees:
      ``eps``-DP (pure) for replace-one neighbours, which move each ``U_k`` by
      at most ``Gamma`` (exponential mechanism, McSherry & Talwar 2007).

    White-box statistic: the noisy margin ``x_t - max_{j != t} x_j``. By
    max-stability of the Gumbel law it is ``Logistic(m_t - LSE_{j != t} m_j, 1)``
    with ``m = scale * U``, whose location moves by at most ``eps`` between
    neighbours, so releasing it stays ``eps``-DP and the white-box audit tests
    the claim itself. (The full noisy vector is *not* covered by the claim:
    its Gumbel coordinates leak through their light left tail.)
    """

    scale: jax.Array
    name: ClassVar[str] = "poe"
    gaussian: ClassVar[bool] = False

    @classmethod
    def calibrated(cls, epsilon: float, clip: float):
        return cls(scale=jnp.float32(exponential_mechanism_scale(epsilon, clip)))

    @classmethod
    def neighbour_distance(cls, reference_with, reference_without):
        return float(np.max(np.abs(np.asarray(reference_with) - np.asarray(reference_without))))

    def __call__(self, key, clean):
        utility = jnp.asarray(clean, jnp.float32)
        noisy = utility * self.scale + sampling.gumbel(key, utility.shape)
        return Release(jnp.argmax(noisy), noisy)

    def prepare(self, clean, attack):
        # Location of the noisy margin (Gumbel max-stability): m_t - LSE_{j != t} m_j.
        m = jnp.asarray(clean, jnp.float32) * self.scale
        others = jnp.where(jnp.arange(m.shape[-1]) == attack.target, -jnp.inf, m)
        return m[attack.target] - jax.nn.logsumexp(others)

    def noise(self, key, num, prepared):
        return sampling.logistic(key, (num,))

    def outcomes(self, noise, prepared, attack):
        margin = prepared + noise  # the release is the target iff the margin is positive
        return margin > 0, margin


class _EsaPrepared(NamedTuple):
    sq_dist: jax.Array  # (c,) |m - c_i|^2
    cand_proj: jax.Array  # (c, r) c_i - c_0 in the orthonormal basis
    dir_proj: jax.Array  # (r,) attack direction in the basis
    score0: jax.Array  # () <m, w>


@_pytree_dataclass
class EmbeddingSpaceAggregation(Mechanism):
    """Embedding Space Aggregation (Wu et al. 2023; SnapAudit Alg. 5).

    Adds ``N(0, sigma^2 I)`` to the mean of the per-partition response
    embeddings and releases the index of the candidate embedding nearest to
    the noisy mean.

    Attributes:
      sigma: noise standard deviation.
      candidates: candidate embeddings ``(c, d)``.

    Guarantees:
      With unit-norm embeddings and ``T`` partitions the mean has L2
      sensitivity ``2/T`` (SnapAudit Lemma C.1); ``calibrated`` uses it unless
      a sensitivity is forced (e.g. the flawed value 1).

    The simulator never draws ``d``-dimensional noise: the release depends on
    the noise only through ``<Z, c_i - c_0>`` and the white-box score through
    ``<Z, w>``, so it draws ``N(0, I_r)`` in an orthonormal basis of
    ``span(c_1 - c_0, ..., c_{c-1} - c_0, w)`` (``r = min(c, d)``), which has
    the same distribution.
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
        partitions = validate.positive_int("partitions", partitions)
        if sensitivity is None:
            sensitivity = 2.0 / partitions
        cand = validate.finite_array("candidates", candidates, ndim_min=2)
        if cand.ndim != 2:
            raise InputError(f"candidates must have shape (c, d), got {cand.shape}")
        sigma = gaussian_sigma(epsilon, delta, sensitivity, calibration)
        return cls(sigma=jnp.float32(sigma), candidates=jnp.asarray(cand, jnp.float32))

    @classmethod
    def default_target(cls, reference_with, reference_without, *, candidates=None, **context):
        if candidates is None:
            raise InputError("ESA needs candidates to choose a default target")
        # The candidate whose squared distance to the mean shrinks most.
        w = np.asarray(reference_with) - np.asarray(reference_without)
        return int(np.argmax(np.asarray(candidates) @ w))

    @classmethod
    def num_targets(cls, clean_shape, *, candidates=None, **context):
        return int(np.asarray(candidates).shape[0])

    def __call__(self, key, clean):
        mean = jnp.asarray(clean, jnp.float32)
        noisy = mean + self.sigma * sampling.normal(key, mean.shape)
        sq = jnp.sum(jnp.square(noisy[None, :] - self.candidates), axis=-1)
        return Release(jnp.argmin(sq), noisy)

    def prepare(self, clean, attack):
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
        return sampling.normal(key, (prepared.dir_proj.shape[-1], num))

    def outcomes(self, noise, prepared, attack):
        # |m + sZ - c_i|^2 = |m - c_i|^2 - 2s<Z, c_i - c_0> + (terms common to all i).
        # cand_proj (c, r, T), noise (r, num): projections (c, num).
        proj = jnp.sum(prepared.cand_proj * noise[None], axis=1)
        release = jnp.argmin(prepared.sq_dist - 2.0 * self.sigma * proj, axis=0)
        score = prepared.score0 + self.sigma * jnp.sum(prepared.dir_proj * noise, axis=0)
        return release == attack.target, score
