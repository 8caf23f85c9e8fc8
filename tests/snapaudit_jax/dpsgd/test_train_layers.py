"""``DPSGDConfig.layers`` in :func:`snapaudit_jax.dpsgd.train`: the blocks under one scan train the unrolled
model, and the choice is resolved and reported honestly.

Oracles: the unrolled run (same key, so the same Poisson batches; SGD without noise, so the trained parameters
agree to float32 rounding whatever the noise draw's layout); the chi-square distribution (scipy) for the noise
of a stacked run, whose parameters are one array per kind instead of one per block; the checkpoint's refusal of
a run of the other layout.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from snapaudit_jax.dpsgd import DPSGDConfig, LAYERS, train
from snapaudit_jax.dpsgd.train import SCAN_MIN_LAYERS, resolve_layers
from snapaudit_jax.finetune.lora import LoRAConfig, apply_lora
from snapaudit_jax.models.config import GPT2Config
from snapaudit_jax.models.decoders import GPT2
from snapaudit_jax.utils.errors import InputError

VOCAB, N, L = 31, 20, 10
ALPHA = 1e-6  # false-failure probability of each chi-square check


def _model(layers: int = SCAN_MIN_LAYERS, seed: int = 0):
    return GPT2(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=8, n_layer=layers, n_head=2, n_inner=16),
                rngs=nnx.Rngs(seed))


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, (N, L)).astype(np.int32)
    mask = np.arange(L) < rng.integers(3, L + 1, N)[:, None]
    return tokens, mask


def _flat(model) -> np.ndarray:
    leaves = sorted(nnx.to_flat_state(nnx.state(model, nnx.Param)), key=lambda kv: str(kv[0]))
    return np.concatenate([np.ravel(np.asarray(v[...], np.float64)) for _, v in leaves])


BASE = dict(optimizer="sgd", microbatch_size=4, delta=1e-5, batch_size=6, learning_rate=0.5)


def test_auto_resolution_and_its_reasons():
    """auto scans our decoders of SCAN_MIN_LAYERS blocks and more on accelerators and stays unrolled on the CPU
    (with the measured reason); it stays unrolled below SCAN_MIN_LAYERS, for a filter that trains some blocks only
    and for other modules; "scan" forces the scan on any backend, and where it cannot run it is an InputError
    naming why."""
    assert LAYERS == ("auto", "scan", "unrolled")
    deep, shallow = _model(), _model(SCAN_MIN_LAYERS - 1)
    layers, why = resolve_layers("auto", deep, nnx.Param, backend="gpu")
    assert layers == "scan" and why.startswith(f"auto: {SCAN_MIN_LAYERS} blocks of one structure")
    layers, why = resolve_layers("auto", deep, nnx.Param, backend="cpu")
    assert layers == "unrolled" and "on the CPU unrolled" in why and "bench_compile.py" in why
    assert resolve_layers("scan", deep, nnx.Param, backend="cpu") == ("scan", 'requested (layers = "scan")')
    layers, why = resolve_layers("auto", shallow, nnx.Param, backend="gpu")
    assert layers == "unrolled" and f"fewer than {SCAN_MIN_LAYERS}" in why
    assert resolve_layers("scan", shallow, nnx.Param) == ("scan", 'requested (layers = "scan")')
    first_block = nnx.All(nnx.Param, nnx.PathContains(0))
    layers, why = resolve_layers("auto", deep, first_block, backend="tpu")
    assert layers == "unrolled" and "in some blocks only" in why and "blocks.*.c_fc.kernel" in why
    with pytest.raises(InputError, match=r'layers = "scan" cannot run this model: the trainable filter'):
        resolve_layers("scan", deep, first_block)
    layers, why = resolve_layers("auto", nnx.Linear(2, 2, rngs=nnx.Rngs(0)), nnx.Param, backend="gpu")
    assert layers == "unrolled" and "Linear is not one of the decoders" in why
    with pytest.raises(InputError, match=r"at least two blocks, got 1"):
        resolve_layers("scan", _model(1), nnx.Param)
    assert resolve_layers("unrolled", deep, nnx.Param)[0] == "unrolled"
    with pytest.raises(InputError, match=r"layers must be one of"):
        DPSGDConfig(steps=1, noise_multiplier=1.0, layers="stacked", **BASE)


@pytest.mark.slow
def test_scanned_training_equals_unrolled_training_and_gives_the_model_back_unrolled():
    """Four SGD steps without noise (units clipped): the scanned run's parameters equal the unrolled run's
    to 1e-6 relative, the model comes back with one module per block, and the report says which layout ran;
    power: the same run on other data moves the parameters by far more. With LoRA adapters on every block
    (trainable = LoRA parameters) clipped by book-keeping alike."""
    data = _data()
    runs = {}
    for layers in ("unrolled", "scan"):
        config = DPSGDConfig(steps=4, clip_norm=0.05, noise_multiplier=0.0, layers=layers, **BASE)
        model, history, report = train(_model(), data, config, key=jax.random.key(3))
        assert isinstance(model.blocks, nnx.List) and report.layers == layers
        assert history["clipped_fraction"].max() > 0
        runs[layers] = _flat(model)
    start = _flat(_model())
    moved = np.abs(runs["unrolled"] - start).max()
    np.testing.assert_allclose(runs["scan"], runs["unrolled"], rtol=1e-6, atol=1e-6 * moved)
    config = DPSGDConfig(steps=4, clip_norm=0.05, noise_multiplier=0.0, layers="scan", **BASE)
    other, _, _ = train(_model(), _data(seed=1), config, key=jax.random.key(3))
    assert np.abs(_flat(other) - runs["unrolled"]).max() > 100 * 1e-6 * moved
    lora = {}
    for layers in ("unrolled", "scan"):  # and by book-keeping, the blocks tapped inside the scan
        config = DPSGDConfig(steps=3, clip_norm=0.05, noise_multiplier=0.0, layers=layers, clipping="book_keeping",
                             **BASE)
        model = apply_lora(_model(), LoRAConfig(rank=2), key=jax.random.key(1))
        trained, _, report = train(model, data, config, key=jax.random.key(3), trainable=nnx.LoRAParam)
        assert report.layers == layers
        lora[layers] = np.concatenate([np.ravel(np.asarray(v[...])) for _, v in sorted(
            nnx.to_flat_state(nnx.state(trained, nnx.LoRAParam)), key=lambda kv: str(kv[0]))])
    assert np.abs(lora["unrolled"]).max() > 0
    np.testing.assert_allclose(lora["scan"], lora["unrolled"], rtol=1e-6, atol=1e-6 * np.abs(lora["unrolled"]).max())


@pytest.mark.slow
def test_scanned_blocks_with_a_sliced_head_train_the_unrolled_whole_logits_model():
    """Book-keeping taps the stacked blocks inside their scan and the sliced head outside it: two SGD steps
    without noise (units clipped) with ``layers="scan"`` and ``vocab_chunk=8`` (a 31-token vocabulary: four
    slices, the last padded) equal the unrolled whole-logits run to 1e-6 relative, every parameter."""
    data = _data()
    runs = {}
    for layers, chunk in (("unrolled", None), ("scan", 8)):
        config = DPSGDConfig(steps=2, clip_norm=0.05, noise_multiplier=0.0, layers=layers, vocab_chunk=chunk,
                             clipping="book_keeping", **BASE)
        model, history, report = train(_model(), data, config, key=jax.random.key(3))
        assert report.layers == layers and report.clipping == "book_keeping"
        assert history["clipped_fraction"].max() > 0
        runs[layers] = _flat(model)
    moved = np.abs(runs["unrolled"] - _flat(_model())).max()
    assert moved > 0
    np.testing.assert_allclose(runs["scan"], runs["unrolled"], rtol=1e-6, atol=1e-6 * moved)


def _chi2_accepts(stat: float, dof: int) -> bool:
    return stats.chi2.ppf(ALPHA / 2, dof) <= stat <= stats.chi2.isf(ALPHA / 2, dof)


@pytest.mark.slow
def test_noise_of_a_scanned_run_is_gaussian_sigma_c_over_qn_on_every_coordinate():
    """Zero-gradient construction (C = 1e-20, sigma C = 0.1): one SGD step at learning rate 1 moves every parameter
    by the noise over q N. sum(d^2) / tau^2 ~ chi2_D (D > 2000) accepted at ALPHA, and per stacked block (each
    block's share of the stacked arrays on its own: no block left without noise or with another's); power: 2 tau
    and tau / 2 are rejected. False failure < (1 + 4 + 2) ALPHA."""
    sigma, clip = 1e19, 1e-20
    config = DPSGDConfig(steps=1, clip_norm=clip, noise_multiplier=sigma, layers="scan",
                         **{**BASE, "learning_rate": 1.0})
    model = _model()
    trained, _, report = train(model, _data(), config, key=jax.random.key(11))
    assert report.layers == "scan"
    tau = sigma * clip / BASE["batch_size"]
    before = {".".join(map(str, p)): np.asarray(v[...], np.float64) for p, v in nnx.to_flat_state(nnx.state(model))}
    after = {".".join(map(str, p)): np.asarray(v[...], np.float64) for p, v in nnx.to_flat_state(nnx.state(trained))}
    noise = {name: after[name] - before[name] for name in before}
    everything = np.concatenate([v.ravel() for v in noise.values()])
    assert everything.size > 2000
    assert _chi2_accepts(float(np.sum(everything**2) / tau**2), everything.size)
    for wrong in (2 * tau, tau / 2):
        assert not _chi2_accepts(float(np.sum(everything**2) / wrong**2), everything.size)
    for i in range(SCAN_MIN_LAYERS):
        block = np.concatenate([v.ravel() for name, v in noise.items() if name.startswith(f"blocks.{i}.")])
        assert _chi2_accepts(float(np.sum(block**2) / tau**2), block.size), i
    draws = [np.concatenate([v.ravel() for name, v in noise.items() if name.startswith(f"blocks.{i}.")])
             for i in range(2)]
    corr = np.dot(*draws) / np.sqrt(np.dot(draws[0], draws[0]) * np.dot(draws[1], draws[1]))
    assert abs(corr) * np.sqrt(draws[0].size) < 5.0  # blocks get independent draws


@pytest.mark.slow
def test_a_checkpoint_resumes_only_in_its_own_layout(tmp_path):
    """A scanned run stopped at step 2 resumes bit for bit; the unrolled run of the same config refuses its
    checkpoint (its parameters' tree differs), naming layers."""
    data = _data()
    config = DPSGDConfig(steps=3, clip_norm=0.5, noise_multiplier=1.0, layers="scan", **BASE)
    key = jax.random.key(5)
    whole, _, _ = train(_model(), data, config, key=key)
    folder = tmp_path / "ckpt"
    train(_model(), data, config, key=key, checkpoint_dir=str(folder), stop_after=2)
    resumed, _, _ = train(_model(seed=7), data, config, key=key, checkpoint_dir=str(folder))
    np.testing.assert_array_equal(_flat(resumed), _flat(whole))
    unrolled = DPSGDConfig(steps=3, clip_norm=0.5, noise_multiplier=1.0, layers="unrolled", **BASE)
    with pytest.raises(ValueError, match=r"layers differs from this run"):
        train(_model(), data, unrolled, key=key, checkpoint_dir=str(folder))
