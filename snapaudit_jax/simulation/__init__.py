"""Phase B: DP-noise trials on snapshotted clean outputs, and the exact alternatives.

* :mod:`~snapaudit_jax.simulation.snapshots` -- clean-output snapshots (validation, de-duplication, ``.npz``);
* :mod:`~snapaudit_jax.simulation.trials` -- :func:`simulate`, the sharded, chunked bootstrap/stratified kernel;
* :mod:`~snapaudit_jax.simulation.exact` -- exact attack success probabilities ``h_b(v)`` (no trials);
* :mod:`~snapaudit_jax.simulation.profiles` -- exact privacy profiles ``eps(delta)`` of a release.
"""

from snapaudit_jax.simulation import exact, profiles, snapshots, trials
from snapaudit_jax.simulation.exact import (
    exact_hit_probability,
    exact_output_distribution,
    exact_release_epsilon,
    exact_score_grid,
    exact_score_probability,
    pv_argmax_probability,
    supports_exact,
)
from snapaudit_jax.simulation.snapshots import Snapshots, check_clean, dedupe, load_snapshots, save_snapshots
from snapaudit_jax.simulation.trials import BLOCK_TRIALS, MAX_TRIALS, SimulationCounts, simulate

__all__ = [
    "BLOCK_TRIALS", "MAX_TRIALS", "SimulationCounts", "Snapshots", "check_clean", "dedupe", "exact",
    "exact_hit_probability", "exact_output_distribution", "exact_release_epsilon", "exact_score_grid",
    "exact_score_probability", "load_snapshots", "profiles", "pv_argmax_probability", "save_snapshots", "simulate",
    "snapshots", "supports_exact", "trials",
]
