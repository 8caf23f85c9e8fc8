"""DP-ICL aggregation mechanisms: pure, key-first JAX kernels, their calibration and the name registry.

* :mod:`~snapaudit_jax.mechanisms.base` -- the :class:`Mechanism` interface, :class:`Attack`, :class:`Release`;
* :mod:`~snapaudit_jax.mechanisms.pv`, :mod:`~snapaudit_jax.mechanisms.poe`, :mod:`~snapaudit_jax.mechanisms.esa`,
  :mod:`~snapaudit_jax.mechanisms.ksa` -- one module per mechanism (KSA with the joint exponential mechanism);
* :mod:`~snapaudit_jax.mechanisms.noise` -- Gaussian/GDP calibration and exponential-mechanism scales;
* :mod:`~snapaudit_jax.mechanisms.variates` -- random variates exact in the tails, alias tables;
* :mod:`~snapaudit_jax.mechanisms.registry` -- name -> class (:func:`build`, :func:`names`, :func:`register`).
"""

from snapaudit_jax.mechanisms import base, esa, ksa, noise, poe, pv, registry, variates
from snapaudit_jax.mechanisms.base import Attack, Mechanism, Release
from snapaudit_jax.mechanisms.esa import EmbeddingSpaceAggregation
from snapaudit_jax.mechanisms.ksa import (
    JemTable,
    KeywordSpaceAggregation,
    jem_prepare,
    jem_select,
    joint_exponential_topk,
    sequence_utility,
)
from snapaudit_jax.mechanisms.noise import (
    analytic_gaussian_sigma,
    classical_gaussian_sigma,
    exponential_mechanism_scale,
    gaussian_sigma,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
)
from snapaudit_jax.mechanisms.poe import ProductOfExperts
from snapaudit_jax.mechanisms.pv import PrivateVoting, contrast_direction
from snapaudit_jax.mechanisms.registry import build, mechanism_class, names, register

__all__ = [
    "Attack", "EmbeddingSpaceAggregation", "JemTable", "KeywordSpaceAggregation", "Mechanism", "PrivateVoting",
    "ProductOfExperts", "Release", "analytic_gaussian_sigma", "base", "build", "classical_gaussian_sigma",
    "contrast_direction", "esa", "exponential_mechanism_scale", "gaussian_sigma", "gdp_delta", "gdp_epsilon",
    "gdp_mu", "jem_prepare", "jem_select", "joint_exponential_topk", "ksa", "mechanism_class", "names", "noise",
    "poe", "pv", "register", "registry", "sequence_utility", "variates",
]
