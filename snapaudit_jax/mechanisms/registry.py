"""The mechanism registry: one name -> class table that every caller uses.

The command line's ``--mechanism`` choices, the ``snapaudit simulate`` runner,
the DP-ICL pipelines and the ``snapaudit audit`` configuration read their
mechanism names from here. A user's own :class:`~snapaudit_jax.mechanisms.Mechanism`
subclass joins with :func:`register` and is then built by :func:`build` like
the four of the paper.
"""

from __future__ import annotations

from snapaudit_jax.mechanisms.base import Mechanism
from snapaudit_jax.mechanisms.esa import EmbeddingSpaceAggregation
from snapaudit_jax.mechanisms.ksa import KeywordSpaceAggregation
from snapaudit_jax.mechanisms.poe import ProductOfExperts
from snapaudit_jax.mechanisms.pv import PrivateVoting
from snapaudit_jax.utils.errors import InputError

__all__ = ["build", "mechanism_class", "names", "register"]

_REGISTRY: dict[str, type[Mechanism]] = {}


def register(cls: type[Mechanism]) -> type[Mechanism]:
    """Adds ``cls`` under ``cls.name``; usable as a class decorator.

    Args:
      cls: a :class:`~snapaudit_jax.mechanisms.Mechanism` subclass with a ``name`` class attribute and a
        :meth:`~snapaudit_jax.mechanisms.Mechanism.from_claim` constructor.

    Returns:
      ``cls`` unchanged.

    Raises:
      TypeError: ``cls`` is not a Mechanism subclass or has no ``name``.
      ValueError: another class is registered under the same name.
    """
    if not (isinstance(cls, type) and issubclass(cls, Mechanism)):
        raise TypeError(f"register expects a Mechanism subclass, got {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} needs a non-empty class attribute 'name'")
    if _REGISTRY.get(name, cls) is not cls:
        raise ValueError(f"mechanism name {name!r} is taken by {_REGISTRY[name].__name__}")
    _REGISTRY[name] = cls
    return cls


for _cls in (PrivateVoting, ProductOfExperts, EmbeddingSpaceAggregation, KeywordSpaceAggregation):
    register(_cls)


def names() -> tuple[str, ...]:
    """The registered mechanism names, in registration order (``("pv", "poe", "esa", "ksa")`` built in)."""
    return tuple(_REGISTRY)


def mechanism_class(name: str, *, field: str = "mechanism") -> type[Mechanism]:
    """The class registered as ``name``.

    Args:
      name: a registered name such as ``"pv"``.
      field: the flag or config key named in the error.

    Returns:
      The :class:`~snapaudit_jax.mechanisms.Mechanism` subclass.

    Raises:
      InputError: ``name`` is not registered (the message lists the registered names).
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise InputError(f"{field} must be one of {', '.join(map(repr, _REGISTRY))}, got {name!r}") from None


def build(name: str, epsilon: float, delta: float, sensitivity: float, *, field: str = "mechanism",
          **options) -> Mechanism:
    """The mechanism ``name`` calibrated to the claim ``(epsilon, delta)``.

    Args:
      name: a registered mechanism name.
      epsilon: the claimed epsilon per release (> 0).
      delta: the claimed delta (unused by the pure-DP mechanisms PoE and KSA).
      sensitivity: the sensitivity the calibration assumes (PV, ESA: L2; PoE: the clip; KSA: the utility's).
      field: the flag or config key named if ``name`` is unknown.
      **options: the mechanism's own options (PV: ``calibration``; ESA: ``candidates`` ``(c, d)``,
        ``partitions``, ``calibration``; KSA: ``top_k``, ``num_values``).

    Returns:
      The calibrated mechanism, a pytree ready for the jitted kernels.

    Raises:
      InputError: an unknown name or an invalid claim or option.
      TypeError: an option the mechanism does not take.
    """
    return mechanism_class(name, field=field).from_claim(epsilon, delta, sensitivity, **options)
