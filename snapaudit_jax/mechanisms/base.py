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
    """One mechanism output.

    Attributes:
      output: the public (black-box) release: PV, PoE: the arg-max label, ``()`` int32; ESA: the index of the
        nearest candidate, ``()`` int32; KSA: the selected keyword ids, ``(K,)`` int32.
      noisy: the white-box noisy intermediate: PV, PoE: the noisy scores ``(k,)`` float32; ESA: the noisy mean
        ``(d,)`` float32; KSA: the sequence again ``(K,)`` int32.
    """

    output: jax.Array
    noisy: jax.Array


def pytree_dataclass(cls):
    """Makes ``cls`` a frozen dataclass registered as a JAX pytree whose tree definition names ``cls``.

    Fields declared with :func:`static_field` (or ``metadata={"static": True}``) become static (hashed into the jit
    cache); all other fields are traced leaves, so changing them does not recompile. The static part of the tree
    definition starts with ``cls`` itself: with :func:`jax.tree_util.register_dataclass` (jax 0.10), the tree
    definitions of two classes with the same fields compare equal while hashing differently, so a jitted function
    called with a ``ProductOfExperts`` could, on a hash-table collision in jit's cache, run the program traced for
    a ``PrivateVoting`` (seen as a PoE simulation handed PV's prepared snapshots).

    Args:
      cls: the class to decorate.

    Returns:
      The frozen dataclass ``cls``, registered with :func:`jax.tree_util.register_pytree_with_keys` (leaves keyed
      by attribute name, as ``register_dataclass`` keys them).
    """
    cls = dataclasses.dataclass(frozen=True)(cls)
    fields = dataclasses.fields(cls)
    data = tuple(f.name for f in fields if not f.metadata.get("static"))
    meta = tuple(f.name for f in fields if f.metadata.get("static"))
    keys = tuple(jax.tree_util.GetAttrKey(name) for name in data)

    def flatten_with_keys(obj):
        return [(k, getattr(obj, n)) for k, n in zip(keys, data)], (cls, *(getattr(obj, n) for n in meta))

    def flatten(obj):
        return [getattr(obj, n) for n in data], (cls, *(getattr(obj, n) for n in meta))

    def unflatten(aux, children):
        return cls(**dict(zip(data, children)), **dict(zip(meta, aux[1:])))

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    return cls


def static_field(default=dataclasses.MISSING):
    """A dataclass field marked static for :func:`pytree_dataclass`.

    Args:
      default: the field's default (none if omitted).

    Returns:
      A :func:`dataclasses.field` with ``metadata={"static": True}``.
    """
    return dataclasses.field(default=default, metadata=dict(static=True))


@pytree_dataclass
class Attack:
    """A membership-inference attack on one mechanism.

    Attributes:
      reference_with: reference clean output with the canary, shape of one clean output (float32 when built by
        :func:`snapaudit_jax.audits.make_attack`).
      reference_without: reference clean output without the canary, same shape.
      target: the release (label, candidate index or keyword id) that signals "canary present" (static field,
        default 0).
    """

    reference_with: jax.Array
    reference_without: jax.Array
    target: int = static_field(0)


class Mechanism(abc.ABC):
    """Interface shared by the four mechanisms (see the module docstring).

    Subclasses are decorated with :func:`pytree_dataclass`; their noise parameters are traced leaves.

    Attributes:
      name: registry name (``"pv"``, ``"poe"``, ``"esa"``, ``"ksa"``), a class attribute.
      gaussian: whether the noise is Gaussian, so that the GDP estimator (``estimator="gdp"``) applies.
      clean_ndim: number of axes of one clean output (1 for all four mechanisms).
    """

    name: ClassVar[str]
    gaussian: ClassVar[bool]  # Gaussian noise: the GDP estimator applies.
    clean_ndim: ClassVar[int] = 1

    @abc.abstractmethod
    def __call__(self, key: jax.Array, clean: jax.Array) -> Release:
        """Runs one trial of the mechanism on one clean output (pure; vmap it over keys).

        Args:
          key: PRNG key of this trial.
          clean: one clean output of the non-private pipeline (shape per mechanism, see the module docstring).

        Returns:
          The :class:`Release`: public ``output`` and white-box ``noisy`` intermediate.
        """

    @abc.abstractmethod
    def prepare(self, clean: jax.Array, attack: Attack) -> Any:
        """Deterministic per-snapshot preprocessing for the simulator (vmapped over distinct snapshots).

        Args:
          clean: one clean output.
          attack: the attack whose outcomes are to be simulated.

        Returns:
          A pytree of arrays (the mechanism's prepared values) that :meth:`noise` and :meth:`outcomes` consume.
        """

    @abc.abstractmethod
    def noise(self, key: jax.Array, num: int, prepared: Any) -> Any:
        """Draws the sufficient DP randomness of ``num`` trials in one batch, trial axis last.

        Args:
          key: PRNG key of the batch.
          num: number of trials (static).
          prepared: the output of :meth:`prepare` for one snapshot (used for shapes only).

        Returns:
          A pytree of arrays whose leaves end with an axis of size ``num``.
        """

    @abc.abstractmethod
    def outcomes(self, noise: Any, prepared: Any, attack: Attack) -> tuple[jax.Array, jax.Array]:
        """Attack outcomes of a batch of trials (deterministic given the noise).

        ``noise`` leaves end with the trial axis ``num``; ``prepared`` leaves end with an axis of size 1 (one
        snapshot for all trials) or ``num`` (one snapshot per trial).

        Args:
          noise: the output of :meth:`noise`.
          prepared: the output of :meth:`prepare` with a trailing trial axis.
          attack: the attack.

        Returns:
          ``(hit, score)``: ``(num,)`` bool black-box decisions "the release is ``attack.target``" (KSA: "the target
          keyword is selected") and ``(num,)`` float32 white-box statistics (larger means "canary present").
        """

    def hit_noise(self, key: jax.Array, num: int, prepared: Any) -> Any:
        """Draws the randomness of ``num`` black-box decisions only (the simulator's draw when it counts no
        white-box statistic); by default :meth:`noise`.

        Args:
          key: PRNG key of the batch.
          num: number of trials (static).
          prepared: the output of :meth:`prepare` for one snapshot (used for shapes only).

        Returns:
          A pytree of arrays whose leaves end with an axis of size ``num``, for :meth:`hit_outcomes`.
        """
        return self.noise(key, num, prepared)

    def hit_outcomes(self, noise: Any, prepared: Any, attack: Attack) -> jax.Array:
        """Black-box decisions of a batch of trials from :meth:`hit_noise`'s draw; by default the ``hit`` of
        :meth:`outcomes`.

        Guarantees:
          An override must give every trial's decision exactly the law of :meth:`outcomes`' ``hit`` (it may draw
          less randomness, e.g. by sampling the decision from its exact conditional probability given part of the
          noise); the joint law with the white-box score is not kept, and the simulator never needs it.

        Args:
          noise: the output of :meth:`hit_noise`.
          prepared: the output of :meth:`prepare` with a trailing trial axis (size 1 or ``num``).
          attack: the attack.

        Returns:
          ``(num,)`` bool: the release is ``attack.target`` (KSA: the target keyword is selected).
        """
        return self.outcomes(noise, prepared, attack)[0]

    def outcome(self, noise: Any, prepared: Any, attack: Attack) -> tuple[jax.Array, jax.Array]:
        """Attack outcome of one trial: :meth:`outcomes` without the trial axis.

        Args:
          noise: one trial's noise (the leaves of :meth:`noise` without their trailing axis).
          prepared: the output of :meth:`prepare` (no trial axis).
          attack: the attack.

        Returns:
          ``(hit, score)``: a bool scalar and a float32 scalar.
        """
        add = functools.partial(jax.tree_util.tree_map, lambda x: jnp.asarray(x)[..., None])
        hit, score = self.outcomes(add(noise), add(prepared), attack)
        return hit[0], score[0]

    # Host-side helpers ---------------------------------------------------
    @classmethod
    def default_target(cls, reference_with: np.ndarray, reference_without: np.ndarray, **context) -> int:
        """The release the canary moves towards (host-side).

        Args:
          reference_with: reference clean output with the canary.
          reference_without: reference clean output without the canary.
          **context: mechanism-specific context (ESA: ``candidates``).

        Returns:
          The target release: by default the index where ``reference_with - reference_without`` is largest.
        """
        return int(np.argmax(np.asarray(reference_with) - np.asarray(reference_without)))

    @classmethod
    def num_targets(cls, clean_shape: tuple[int, ...], **context) -> int:
        """Number of possible target releases (host-side).

        Args:
          clean_shape: the shape of one clean output.
          **context: mechanism-specific context (ESA: ``candidates``).

        Returns:
          The number of targets: by default the length of the last axis of a clean output.
        """
        return int(clean_shape[-1])

    @classmethod
    def neighbour_distance(cls, reference_with: np.ndarray, reference_without: np.ndarray) -> float:
        """Distance between two clean outputs in the norm the sensitivity bounds (host-side).

        Args:
          reference_with: one clean output.
          reference_without: another clean output of the same shape.

        Returns:
          The distance as a float: by default the L2 norm of the difference.
        """
        return float(np.linalg.norm(np.asarray(reference_with) - np.asarray(reference_without)))

    def noise_unit(self) -> float | None:
        """The scale of the DP noise in the units of a clean output (host-side), for the simulator's float32 check.

        The simulator refuses clean outputs whose float32 spacing (``numpy.spacing`` at their largest magnitude)
        exceeds this unit: float32 could not then tell the noisy output from the clean one.

        Returns:
          The unit as a float (Gaussian mechanisms: ``sigma``; exponential mechanisms: ``1 / scale``, the utility
          change that moves a log-probability by 1), or ``None`` for no check (this base implementation).
        """
        return None

    @classmethod
    def from_claim(cls, epsilon: float, delta: float, sensitivity: float, **options) -> "Mechanism":
        """The mechanism calibrated to the claim ``(epsilon, delta)`` at ``sensitivity``.

        The constructor the registry (:func:`snapaudit_jax.mechanisms.build`) calls; each mechanism takes its own
        keyword ``options`` (PV: ``calibration``; ESA: ``candidates``, ``partitions``, ``calibration``; KSA: ``top_k``,
        ``num_values``).

        Args:
          epsilon: the claimed ``eps`` per release (> 0).
          delta: the claimed ``delta`` (ignored by pure-DP mechanisms).
          sensitivity: the sensitivity the calibration assumes (in the norm of :meth:`neighbour_distance`).
          **options: the mechanism's own options.

        Returns:
          The calibrated mechanism.

        Raises:
          TypeError: the mechanism cannot be built from a claim (this base implementation always raises).
        """
        raise TypeError(f"{cls.__name__} has no from_claim constructor")

    def with_static(self, **changes) -> "Mechanism":
        """A copy with some fields (static ones included) replaced.

        Args:
          **changes: field names and their new values.

        Returns:
          A new mechanism of the same class (:func:`dataclasses.replace`).
        """
        return dataclasses.replace(self, **changes)
