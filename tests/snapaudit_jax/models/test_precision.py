"""snapaudit_jax.models.precision: the full-float32 context of correctness checks, by backend."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from snapaudit_jax.models.precision import full_float32_precision


@pytest.mark.parametrize("backend", ["gpu", "tpu"])
def test_accelerators_check_at_highest_precision_and_restore_the_default(backend):
    before = jax.config.jax_default_matmul_precision
    with full_float32_precision(backend):
        assert jax.config.jax_default_matmul_precision == "highest"
    assert jax.config.jax_default_matmul_precision == before


def test_the_cpu_context_changes_nothing_and_the_check_sees_float32_products():
    before = jax.config.jax_default_matmul_precision
    with full_float32_precision("cpu"):
        assert jax.config.jax_default_matmul_precision == before
    # On this process's backend, a float32 product checked inside the context is float32-exact up to rounding:
    # against a float64 product, relative error near float32's epsilon (TF32 would give about 1e-3).
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 256)), rng.standard_normal((256, 64))
    with full_float32_precision():
        got = np.asarray(jax.jit(jnp.matmul)(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)), np.float64)
    want = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
