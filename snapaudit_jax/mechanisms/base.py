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
* the simulator protocol used by :mod:`snapaudit_jax.simulation.trials`:
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
:mod:`snapaudit_jax.mechanisms.variates`, which is exact in the tails.

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


__all__ = ["Attack", "Mechanism", "Release", "SQRT2", "pytree_dataclass", "static_field"]

SQRT2 = math.sqrt(2.0)


class Release(NamedTuple):
    """One mechanism output: ``output`` is public, ``noisy`` is white-box only."""

    output: jax.Array
    noisy: jax.Array


def pytree_dataclass(cls):
    return jax.tree_util.register_dataclass(dataclasses.dataclass(frozen=True)(cls))


def static_field(default=dataclasses.MISSING):
    return dataclasses.field(default=default, metadata=dict(static=True))


@pytree_dataclass
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
    target: int = static_field(0)


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

    @classmethod
    def from_claim(cls, epsilon: float, delta: float, sensitivity: float, **options) -> "Mechanism":
        """The mechanism calibrated to the claim ``(epsilon, delta)`` at ``sensitivity``.

        The constructor the registry (:func:`snapaudit_jax.mechanisms.build`) calls; each mechanism takes its
        own keyword ``options`` (PV: ``calibration``; ESA: ``candidates``, ``partitions``, ``calibration``;
        KSA: ``top_k``). A mechanism that cannot be built from a claim raises :class:`TypeError`.
        """
        raise TypeError(f"{cls.__name__} has no from_claim constructor")

    def with_static(self, **changes) -> "Mechanism":
        """A copy with some fields (static ones included) replaced."""
        return dataclasses.replace(self, **changes)
