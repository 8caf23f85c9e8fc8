"""``DPSGDConfig.clipping`` in :func:`snapaudit_jax.dpsgd.train`: book-keeping and ghost clipping train the
per-record path's model, DP-LoRA and full fine-tuning.

The oracle is the per-record path (jax_privacy's vmapped per-unit gradients, itself tested against a Python
loop in ``test_dpsgd.py``): the same key, so the same Poisson batches and the same noise draw, and the clipped
sums equal to float32 rounding, so the trained adapters agree to 1e-5 after several steps with some units
clipped and some not. Power: the clip norm is below most units' norms, so a path that clipped wrongly (or not
at all) would move the adapters elsewhere -- the unclipped run is checked to differ by far more.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from snapaudit_jax.dpsgd import DPSGDConfig, train
from snapaudit_jax.finetune.lora import LoRAConfig, apply_lora
from snapaudit_jax.models.config import GPT2Config
from snapaudit_jax.models.decoders import GPT2
from snapaudit_jax.utils.errors import InputError

VOCAB, N, L = 53, 24, 12


def _model(lora: bool = True):
    model = GPT2(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=1, n_head=2, n_inner=32),
                 rngs=nnx.Rngs(0))
    return apply_lora(model, LoRAConfig(rank=2), key=jax.random.key(1)) if lora else model


def _data(shape=(N, L), seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, shape).astype(np.int32)
    lens = rng.integers(3, shape[-1] + 1, shape[:-1])
    mask = np.arange(shape[-1]) < lens[..., None]
    return tokens, mask


def _config(**kw):
    return DPSGDConfig(**{"steps": 3, "learning_rate": 0.05, "clip_norm": 4.0, "noise_multiplier": 0.7,
                          "delta": 1e-5, "batch_size": 8, "seed": 5, **kw})


def _adapters(model) -> dict[str, np.ndarray]:
    return {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))}


def _close(got, want, scale):
    assert set(got) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6 * scale, err_msg=name)


def _run(dataset, **kw):
    model, history, report = train(_model(), dataset, _config(**kw), trainable=nnx.LoRAParam)
    return _adapters(model), history, report


@pytest.mark.slow
def test_book_keeping_trains_dp_lora_to_the_per_record_model():
    """Microbatches of 8 units, so that the fast path's microbatches hold padding units."""
    data = _data()
    want, hist_want, rep_want = _run(data, clipping="per_record", microbatch_size=8)
    got, hist_got, rep_got = _run(data, clipping="book_keeping", microbatch_size=8)
    assert (rep_want.clipping, rep_got.clipping) == ("per_record", "book_keeping")
    assert rep_got.clipping_reason.startswith('requested (clipping = "book_keeping"; the fast paths cover every '
                                             'trainable parameter')
    assert rep_got.microbatch_size == rep_want.microbatch_size == 8
    np.testing.assert_array_equal(hist_got["batch_size"], hist_want["batch_size"])  # the same Poisson batches
    np.testing.assert_allclose(hist_got["grad_norm_mean"], hist_want["grad_norm_mean"], rtol=1e-5)
    assert 0 < np.nanmean(hist_want["clipped_fraction"]) < 1
    scale = max(float(np.abs(v).max()) for v in want.values())
    _close(got, want, scale)
    free, _, _ = _run(data, clipping="per_record", clip_norm=1e3, microbatch_size=8)  # power: clipping matters
    assert max(float(np.abs(free[k] - want[k]).max()) for k in want) > 1e3 * 1e-6 * scale
    assert rep_got.epsilon == rep_want.epsilon and "book_keeping" in rep_got.to_json()


@pytest.mark.slow
def test_user_level_units_train_alike_on_every_path():
    """Units of 3 rows each (user-level DP: the rows' losses summed, the unit clipped once), empty rows inside."""
    tokens, mask = _data((N // 2, 3, L), seed=3)
    mask[::4, 2] = False  # some users have two records
    want, hist_want, _ = _run((tokens, mask), clipping="per_record", batch_size=5, clip_norm=5.5, microbatch_size=4)
    assert 0 < np.nanmean(hist_want["clipped_fraction"]) < 1
    for clipping in ("ghost", "book_keeping"):
        got, hist_got, report = _run((tokens, mask), clipping=clipping, batch_size=5, clip_norm=5.5,
                                     microbatch_size=4)
        assert report.clipping == clipping and report.microbatch_size == 4
        np.testing.assert_array_equal(hist_got["batch_size"], hist_want["batch_size"])
        _close(got, want, max(float(np.abs(v).max()) for v in want.values()))


@pytest.mark.slow
def test_full_fine_tuning_trains_the_per_record_model_on_every_path():
    """Full fine-tuning (embeddings, positions, the tied head and the LayerNorms trained too): book-keeping and
    ghost clipping train the per-record model to 1e-5, some units clipped; ``auto`` resolves to book-keeping.
    Power: the unclipped run lands elsewhere."""
    from snapaudit_jax.dpsgd import resolve_clipping

    data = _data()
    flat = lambda m: {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(m, nnx.Param))}  # noqa
    config = dict(steps=2, clip_norm=5.0)  # about the units' median norm
    model, hist_want, report = train(_model(lora=False), data, _config(clipping="per_record", **config))
    want = flat(model)
    assert report.clipping == "per_record"
    assert resolve_clipping("auto", *nnx.split(_model(lora=False), nnx.Param, ...),
                            *(x[:1] for x in data))[0] == "book_keeping"
    clipped = np.asarray(hist_want["clipped_fraction"])
    assert np.nanmax(clipped) > 0 and np.nanmin(clipped) < 1  # some units clipped, some not
    scale = max(float(np.abs(v).max()) for v in want.values())
    for clipping in ("book_keeping", "ghost"):
        model, hist_got, report = train(_model(lora=False), data, _config(clipping=clipping, **config))
        assert report.clipping == clipping
        np.testing.assert_array_equal(hist_got["batch_size"], hist_want["batch_size"])
        _close(flat(model), want, scale)
    free = flat(train(_model(lora=False), data, _config(steps=2, clip_norm=1e6))[0])
    assert any(not np.allclose(free[k], want[k], rtol=1e-3, atol=1e-4 * scale) for k in want)


@pytest.mark.slow
def test_a_vocabulary_sliced_head_trains_the_whole_logits_model_on_every_path():
    """``vocab_chunk`` (10 rows a slice of a 53-token vocabulary, the last slice padded) changes memory only:
    full fine-tuning by book-keeping and by the per-record path, and the non-private twin, train the
    whole-logits per-record model to 1e-5 (same key: same batches and noise), some units clipped. A checkpoint
    names the slices (float32 rounding), and a bad value is refused naming the field."""
    data = _data()
    flat = lambda m: {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(nnx.state(m, nnx.Param))}  # noqa
    config = dict(steps=2, clip_norm=5.0)
    model, hist_want, _ = train(_model(lora=False), data, _config(clipping="per_record", **config))
    want = flat(model)
    clipped = np.asarray(hist_want["clipped_fraction"])
    assert np.nanmax(clipped) > 0 and np.nanmin(clipped) < 1
    scale = max(float(np.abs(v).max()) for v in want.values())
    for clipping in ("book_keeping", "per_record"):
        model, hist_got, report = train(_model(lora=False), data, _config(clipping=clipping, vocab_chunk=10,
                                                                           **config))
        assert report.clipping == clipping
        np.testing.assert_allclose(hist_got["grad_norm_max"], hist_want["grad_norm_max"], rtol=1e-5)
        _close(flat(model), want, scale)
    # SGD for the twin: without noise, Adam turns the exactly-zero gradient of the attention's key bias (its
    # rounding, 1e-8 either way) into steps of the learning rate's size
    twin = dict(steps=2, learning_rate=0.05, batch_size=8, seed=5, non_private=True, optimizer="sgd")
    whole = flat(train(_model(lora=False), data, DPSGDConfig(**twin))[0])
    _close(flat(train(_model(lora=False), data, DPSGDConfig(**twin, vocab_chunk=10))[0]), whole, scale)
    with pytest.raises(InputError, match="vocab_chunk must be an integer >= 1, got 0"):
        _config(vocab_chunk=0)


def test_a_forced_fast_path_is_refused_where_a_parameter_is_read_outside_its_layer():
    """A bfloat16 GPT-2 computes its logits from the raw embedding table (float32 accumulation), outside the
    tied head's tap: full fine-tuning's ``wte.embedding`` is then not covered, so a forced fast path is refused
    naming it and ``auto`` stays per-record, never a silently wrong norm."""
    import jax.numpy as jnp

    from snapaudit_jax.dpsgd import resolve_clipping
    from snapaudit_jax.models.weights import cast_model

    tokens, mask = _data((1, L))
    full = nnx.split(cast_model(_model(lora=False), jnp.bfloat16), nnx.Param, ...)
    path, reason = resolve_clipping("auto", *full, tokens, mask)
    assert path == "per_record" and reason == ("auto: the fast paths do not cover this model: 1 trainable "
                                               "parameter not covered (wte.embedding)")
    for forced in ("book_keeping", "ghost"):
        with pytest.raises(InputError, match=rf"clipping = '{forced}' does not cover this model: 1 trainable "
                                             r"parameter not covered \(wte\.embedding\); use \"auto\" or "
                                             r"\"per_record\""):
            resolve_clipping(forced, *full, tokens, mask)


@pytest.mark.slow
def test_a_checkpoint_resumes_only_on_its_clipping_path(tmp_path):
    """The path sets the float32 summation order, so it is part of the run's identity; a per-record checkpoint
    keeps the identity it had before the fast paths existed."""
    data = _data()
    whole, _, _ = _run(data, clipping="book_keeping")
    model, _, _ = train(_model(), data, _config(clipping="book_keeping"), trainable=nnx.LoRAParam,
                        checkpoint_dir=str(tmp_path / "a"), stop_after=1)
    with pytest.raises(InputError, match=r"clipping differs from this run \(checkpoint 'book_keeping', run None\)"):
        train(_model(), data, _config(clipping="per_record"), trainable=nnx.LoRAParam,
              checkpoint_dir=str(tmp_path / "a"))
    resumed, _, _ = train(_model(), data, _config(clipping="book_keeping"), trainable=nnx.LoRAParam,
                          checkpoint_dir=str(tmp_path / "a"))
    for name, value in whole.items():
        np.testing.assert_array_equal(_adapters(resumed)[name], value, err_msg=name)


def test_bfloat16_clipped_sums_are_refused_where_auto_resolves_to_another_path():
    """``auto`` on a bfloat16 GPT-2's full fine-tuning resolves to per-record (its tied table is read outside the
    tap), where bfloat16 operands have no meaning: refused before anything compiles, naming the path and why."""
    import jax.numpy as jnp

    from snapaudit_jax.models.weights import cast_model

    with pytest.raises(InputError, match=r"clipped_sum_dtype = 'bfloat16' needs the book-keeping path; clipping "
                                         r"resolved to 'per_record' \(auto: the fast paths do not cover this model"):
        train(cast_model(_model(lora=False), jnp.bfloat16), _data(), _config(clipped_sum_dtype="bfloat16"),
              trainable=nnx.Param)


def test_the_kernel_refuses_bfloat16_operands_off_book_keeping():
    """``clipped_grad_sum(..., sum_dtype=...)``: bfloat16 on the per-record path, and an unknown dtype, are
    refused by name before anything compiles."""
    from snapaudit_jax.dpsgd import clipped_grad_sum

    tokens, mask = _data((4, L), seed=4)
    model = _model()
    with pytest.raises(InputError, match=r"sum_dtype = 'bfloat16' needs the book-keeping path; method is "
                                         r"'per_record' \(requested\)"):
        clipped_grad_sum(model, tokens, mask, clip_norm=1.0, trainable=nnx.LoRAParam, sum_dtype="bfloat16")
    with pytest.raises(InputError, match=r"sum_dtype must be one of 'float32', 'bfloat16', got 'int8'"):
        clipped_grad_sum(model, tokens, mask, clip_norm=1.0, sum_dtype="int8")


@pytest.mark.slow
def test_the_kernel_takes_bfloat16_operands_on_book_keeping():
    """``clipped_grad_sum(..., sum_dtype="bfloat16")`` is the book-keeping kernel's bfloat16 sum (``auto``
    resolving to book-keeping on DP-LoRA: bitwise the forced path's), off the float32 sum but near it."""
    from snapaudit_jax.dpsgd import clipped_grad_sum

    tokens, mask = _data((4, L), seed=4)
    model = _model()
    flat = lambda out: np.concatenate([np.asarray(v[...]).ravel() for _, v in nnx.to_flat_state(out.grad_sum)])  # noqa
    low = clipped_grad_sum(model, tokens, mask, clip_norm=1.0, trainable=nnx.LoRAParam, method="book_keeping",
                           sum_dtype="bfloat16")
    auto = clipped_grad_sum(model, tokens, mask, clip_norm=1.0, trainable=nnx.LoRAParam, method="auto",
                            sum_dtype="bfloat16")
    full = clipped_grad_sum(model, tokens, mask, clip_norm=1.0, trainable=nnx.LoRAParam, method="book_keeping")
    np.testing.assert_array_equal(flat(auto), flat(low))
    assert 0 < np.linalg.norm(flat(low) - flat(full)) <= 2.0**-7 * np.linalg.norm(flat(full))  # the rounding


@pytest.mark.slow
def test_bfloat16_clipped_sums_train_near_the_float32_model_and_are_reported(tmp_path):
    """DP-LoRA with bfloat16 clipped-sum operands (same key: same batches and noise) ends near the float32 run
    (within a tenth of how far training moved the adapters) but not on it, the report says bfloat16, and the
    operands are part of the run's identity (a float32 run does not resume its checkpoint)."""
    data = _data()
    init = _adapters(_model())
    f32, _, report32 = _run(data, clipping="book_keeping")
    bf16, _, report = _run(data, clipping="book_keeping", clipped_sum_dtype="bfloat16")
    assert (report.clipped_sum_dtype, report32.clipped_sum_dtype) == ("bfloat16", "float32")
    moved = np.sqrt(sum(np.sum((f32[k] - init[k]) ** 2) for k in f32))
    apart = np.sqrt(sum(np.sum((bf16[k] - f32[k]) ** 2) for k in f32))
    assert 0 < apart <= 0.1 * moved, (apart, moved)
    train(_model(), data, _config(clipped_sum_dtype="bfloat16"), trainable=nnx.LoRAParam,
          checkpoint_dir=str(tmp_path), stop_after=1)
    with pytest.raises(InputError, match=r"clipped_sum_dtype differs from this run \(checkpoint 'bfloat16', run "
                                         r"None\)"):
        train(_model(), data, _config(), trainable=nnx.LoRAParam, checkpoint_dir=str(tmp_path))


def test_auto_takes_book_keeping_exactly_where_it_covers_every_trainable_parameter():
    """Resolved on the model, abstractly (nothing trains), the same on every backend: DP-LoRA's adapters and full
    fine-tuning's every parameter (embeddings, positions, tied head, LayerNorms) are covered; a LayerNorm
    replaced by a module the taps do not know (here ``nnx.GroupNorm``) is not, named by kind (each block's copy
    once)."""
    from snapaudit_jax.dpsgd import resolve_clipping

    tokens, mask = _data((1, L))
    lora = nnx.split(_model(), nnx.LoRAParam, ...)
    full = nnx.split(_model(lora=False), nnx.Param, ...)
    path, reason = resolve_clipping("auto", *lora, tokens, mask)
    assert path == "book_keeping" and reason.startswith("auto: the fast paths cover every trainable parameter")
    assert "measured" in reason
    assert resolve_clipping("auto", *full, tokens, mask)[0] == "book_keeping"
    assert resolve_clipping("ghost", *lora, tokens, mask)[0] == "ghost"
    assert resolve_clipping("ghost", *full, tokens, mask)[0] == "ghost"
    assert resolve_clipping("per_record", *lora, tokens, mask)[0] == "per_record"
    odd = _model(lora=False)
    odd.blocks[0].ln_2 = nnx.GroupNorm(16, num_groups=1, rngs=nnx.Rngs(0))  # the same function, another module
    odd = nnx.split(odd, nnx.Param, ...)
    path, reason = resolve_clipping("auto", *odd, tokens, mask)
    assert path == "per_record" and reason.endswith("2 trainable parameters not covered (blocks.*.ln_2.bias, "
                                                    "blocks.*.ln_2.scale)")
    with pytest.raises(InputError, match=r"clipping = 'book_keeping' does not cover this model: 2 trainable "
                                         r"parameters not covered"):
        resolve_clipping("book_keeping", *odd, tokens, mask)


@pytest.mark.slow
def test_clipped_grad_sum_takes_every_path_as_a_kernel():
    """The eager kernel (``clipped_grad_sum(..., method=...)``): book-keeping and ghost equal the per-record sum
    to 1e-5 on DP-LoRA with some records clipped and one padding record; ``auto`` on full fine-tuning is the
    path :func:`resolve_clipping` gives (book-keeping: bitwise that path's sum, within 1e-5 of the per-record
    one); an unknown method is refused by name."""
    from snapaudit_jax.dpsgd import clipped_grad_sum, resolve_clipping

    tokens, mask = _data((5, L), seed=4)
    padding = np.array([False, False, True, False, False])
    model = _model()
    free = clipped_grad_sum(model, tokens, mask, clip_norm=np.inf, trainable=nnx.LoRAParam)
    clip = float(np.median(np.asarray(free.norms)))
    want = clipped_grad_sum(model, tokens, mask, clip_norm=clip, padding=padding, trainable=nnx.LoRAParam)
    flat = lambda out: {str(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(out.grad_sum)}  # noqa: E731
    scale = max(float(np.abs(v).max()) for v in flat(want).values())
    for method in ("book_keeping", "ghost", "auto"):
        got = clipped_grad_sum(model, tokens, mask, clip_norm=clip, padding=padding, trainable=nnx.LoRAParam,
                               method=method)
        np.testing.assert_allclose(np.asarray(got.norms), np.asarray(want.norms), rtol=1e-5)
        _close(flat(got), flat(want), scale)
    clipped = (np.asarray(want.norms) > clip) & ~padding
    assert clipped.any() and (~clipped & ~padding).any()
    full = _model(lora=False)
    per_record = clipped_grad_sum(full, tokens, mask, clip_norm=clip)
    auto = clipped_grad_sum(full, tokens, mask, clip_norm=clip, method="auto")
    assert resolve_clipping("auto", *nnx.split(full, nnx.Param, ...), tokens[:1], mask[:1])[0] == "book_keeping"
    book = clipped_grad_sum(full, tokens, mask, clip_norm=clip, method="book_keeping")
    for name, value in flat(book).items():
        np.testing.assert_array_equal(flat(auto)[name], value)
    _close(flat(auto), flat(per_record), max(float(np.abs(v).max()) for v in flat(per_record).values()))
    with pytest.raises(InputError, match=r"method must be one of 'auto', 'per_record', 'book_keeping', 'ghost', "
                                         r"got 'fast'"):
        clipped_grad_sum(model, tokens, mask, clip_norm=1.0, method="fast")
