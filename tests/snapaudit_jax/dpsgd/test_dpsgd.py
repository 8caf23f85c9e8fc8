"""Tests for snapaudit_jax.dpsgd against independent oracles.

Oracles: per-record Python loops of ``jax.grad`` with NumPy float64 clipping and summing; NumPy
cross-entropy from the model's logits; the chi-square and binomial distributions (scipy) for the
noise and the Poisson sampler, and jax_privacy's ``CyclicPoissonSampling`` for the latter;
dp_accounting's accountants composed directly and jax_privacy's own DP-SGD accountant and
calibration for epsilon and sigma; a hand-written optax loop for non-private training; JAX's
trace/compile events and the jit cache for recompilation. Statistical tests use fixed seeds and
state their false-failure probability; each has a power check (the wrong sigma / the wrong sampler
is rejected).

Tiny models (prime-sized shapes: vocabulary 37, 29 records of length 11, batches of 7) share one
compiled DP-SGD step: privacy settings are traced arguments of the kernel.
"""

from __future__ import annotations

import json
import math
import os

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from flax import nnx
from jax_privacy import accounting as jp_accounting
from jax_privacy import batch_selection
from scipy import stats

from snapaudit_jax.dpsgd import (
    DPSGDConfig,
    calibrate_noise_multiplier,
    clipped_grad_sum,
    compute_epsilon,
    loss_summary,
    poisson_batch,
    record_losses,
    sampling_probability,
    sequence_losses,
    train,
    unit_losses,
)
from snapaudit_jax.dpsgd.train import _dp_step
from snapaudit_jax.models.config import GPT2Config, LlamaConfig
from snapaudit_jax.models.decoders import GPT2, Llama
from snapaudit_jax.utils.errors import InputError

VOCAB, N, L = 37, 29, 11
GPT2_CFG = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=8, n_layer=1, n_head=2, n_inner=16)
LLAMA_CFG = LlamaConfig(
    vocab_size=VOCAB, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=1, head_dim=4, max_position_embeddings=64,
)
ALPHA = 1e-6  # false-failure probability of each statistical check
# The DP-SGD tests share one compiled step: same model, N, L, microbatch and optimizer kind.
BASE = dict(optimizer="sgd", microbatch_size=4, delta=1e-5)


def make_model(kind: str = "gpt2", seed: int = 0):
    if kind == "gpt2":
        return GPT2(GPT2_CFG, rngs=nnx.Rngs(seed))
    return Llama(LLAMA_CFG, rngs=nnx.Rngs(seed))


def make_data(n: int = N, length: int = L, seed: int = 0):
    """Records of 2..L real tokens; even rows right-padded, odd rows left-padded."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, (n, length)).astype(np.int32)
    lens = rng.integers(2, length + 1, n)
    pos = np.arange(length)[None, :]
    right = pos < lens[:, None]
    left = pos >= (length - lens)[:, None]
    mask = np.where((np.arange(n) % 2 == 0)[:, None], right, left)
    return tokens, mask


def params_of(model):
    return nnx.state(model, nnx.Param)


def flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


DATA = make_data()


# ---------------------------------------------------------------------------
# 1. Loss and per-record clipped gradients
# ---------------------------------------------------------------------------


def test_a_loss_mask_scores_only_its_target_tokens_and_attends_to_the_context():
    """An int loss mask (0 padding, 1 context, 2 target): the loss is the NumPy cross-entropy of the unpadded
    sequence's logits over the target positions only, the context conditioning them, on either padding side. A
    mask without a target, or with a value outside {0, 1, 2}, is refused."""
    model = make_model()
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(4)
    seq = rng.integers(0, VOCAB, 8).astype(np.int32)

    @jax.jit  # one compiled forward of the unpadded sequence (eager dispatch costs seconds)
    def logits_of(state, tokens):
        m = nnx.merge(graphdef, state)
        hidden, _ = m(tokens, jnp.arange(tokens.shape[1])[None], jnp.ones(tokens.shape, bool))
        return m.logits(hidden)

    logits = np.asarray(logits_of(state, jnp.asarray(seq[None])), np.float64)[0, :-1]
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    trained = [5, 6, 7]  # the "answer": tokens 5..7, predicted from everything before them
    oracle = -np.mean([logp[t - 1, seq[t]] for t in trained])
    every = -np.mean([logp[t - 1, seq[t]] for t in range(1, 8)])
    tokens = np.zeros((3, L), np.int32)
    mask = np.zeros((3, L), np.int8)
    tokens[0, :8], mask[0, :8] = seq, 1
    mask[0, trained] = 2
    tokens[1, 1:9], mask[1, 1:9] = seq, 1  # left-padded by one: the same positions after the padding
    mask[1, [t + 1 for t in trained]] = 2
    tokens[2, :8], mask[2, :8] = seq, 2  # power: every token a target gives the all-token loss, not the answer's
    got = record_losses(model, (tokens, mask))  # one compiled call for the three rows
    np.testing.assert_allclose(got, [oracle, oracle, every], rtol=1e-5)
    assert abs(every - oracle) > 1e-3
    assert loss_summary(model, (tokens, mask)).targets.tolist() == [3, 3, 7]
    first_only = (mask[:1] > 0).astype(np.int8)
    first_only[0, 0] = 2  # the only target is the first token: nothing predicts it
    with pytest.raises(ValueError, match=r"row 0 has no next-token target"):
        record_losses(model, (tokens[:1], first_only))
    with pytest.raises(ValueError, match=r"loss mask of 0 \(padding\), 1 .* got values \[0, 1, 3\]"):
        record_losses(model, (tokens, np.where(mask == 2, 3, mask)))


def test_a_units_loss_is_the_sum_of_its_records_losses():
    """``unit_losses``: ``(U, L)`` is one record a unit (the records' own losses); ``(U, k, L)`` sums a user's
    ``k`` records (oracle: ``sequence_losses`` of the flat records), an all-padding row adding 0; one unit never
    mixes two units' records (power: the units' losses differ)."""
    graphdef, state = nnx.split(make_model())
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, VOCAB, (3, 2, 9)).astype(np.int32)
    mask = np.arange(9)[None, None, :] < np.array([[9, 5], [3, 0], [7, 8]])[:, :, None]

    @jax.jit
    def both(st, units, units_mask):
        model = nnx.merge(graphdef, st)
        length = units.shape[-1]
        return (sequence_losses(model, units.reshape(-1, length), units_mask.reshape(-1, length)),
                unit_losses(model, units, units_mask))

    flat, got = (np.asarray(x) for x in both(state, tokens, mask))
    assert flat[3] == 0.0  # the all-padding record
    np.testing.assert_allclose(got, flat.reshape(3, 2).sum(axis=1), rtol=1e-6)
    assert len(set(np.round(got, 4).tolist())) == 3
    _, records = (np.asarray(x) for x in both(state, tokens[:, 0], mask[:, 0]))
    np.testing.assert_allclose(records, flat.reshape(3, 2)[:, 0], rtol=1e-6)


@pytest.mark.slow
def test_sequence_loss_is_mean_next_token_cross_entropy_of_real_tokens():
    """Oracle: NumPy log-softmax of the unpadded sequence's logits; padding side and length do not matter.
    record_losses / loss_summary (batched, padded last batch) give the same per-record losses; on prefixes of
    unequal length (oracle: the same logits, by causality) the record mean and token mean differ as stated."""
    model = make_model()
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(3)
    seq = rng.integers(0, VOCAB, 7).astype(np.int32)

    @jax.jit
    def logits_of(state, tokens):
        m = nnx.merge(graphdef, state)
        hidden, _ = m(tokens, jnp.arange(tokens.shape[1])[None], jnp.ones(tokens.shape, bool))
        return m.logits(hidden)

    logits = np.asarray(logits_of(state, seq[None]), np.float64)[0, :-1]
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    oracle = -np.mean(logp[np.arange(6), seq[1:]])

    tokens = np.zeros((3, L), np.int32)
    mask = np.zeros((3, L), bool)
    tokens[0, :7], mask[0, :7] = seq, True  # right padding
    tokens[1, L - 7 :], mask[1, L - 7 :] = seq, True  # left padding
    tokens[2, 2:9], mask[2, 2:9] = seq, True  # both
    tokens[~mask] = rng.integers(0, VOCAB, (~mask).sum())  # garbage under the mask
    losses = jax.jit(lambda st, t, m: sequence_losses(nnx.merge(graphdef, st), t, m))
    got = np.asarray(losses(state, jnp.asarray(tokens), jnp.asarray(mask)))
    np.testing.assert_allclose(got, oracle, rtol=1e-5)

    # Batched evaluation: 3 records in batches of 2 (the last one padded); garbage is zeroed first.
    np.testing.assert_allclose(record_losses(model, (tokens, mask), batch_size=2), oracle, rtol=1e-5)
    summary = loss_summary(model, (tokens, mask), batch_size=2)
    assert summary.targets.tolist() == [6, 6, 6]
    assert summary.mean_loss == pytest.approx(oracle, rel=1e-5)
    assert summary.token_loss == pytest.approx(oracle, rel=1e-5)
    assert summary.perplexity == pytest.approx(math.exp(oracle), rel=1e-5)
    assert json.loads(json.dumps(summary.to_dict())) == {
        "num_records": 3, "num_targets": 18, "mean_loss": summary.mean_loss, "perplexity": summary.perplexity,
        "token_loss": summary.token_loss, "token_perplexity": summary.token_perplexity,
    }
    lengths = np.array([7, 4, 2])
    prefix_mask = np.arange(L)[None] < lengths[:, None]
    prefixes = np.where(prefix_mask, np.resize(seq, L)[None], 0), prefix_mask
    per_record = np.array([-np.mean(logp[np.arange(k - 1), seq[1:k]]) for k in lengths])
    summary = loss_summary(model, prefixes, batch_size=2)
    np.testing.assert_allclose(summary.losses, per_record, rtol=1e-5)
    assert summary.mean_loss == pytest.approx(per_record.mean(), rel=1e-5)
    assert summary.token_loss == pytest.approx(np.sum(per_record * (lengths - 1)) / np.sum(lengths - 1), rel=1e-5)
    assert summary.token_perplexity == pytest.approx(math.exp(summary.token_loss), rel=1e-12)
    with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1, got 0"):
        record_losses(model, DATA, batch_size=0)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_clipped_grad_sum_matches_per_record_python_loop(kind):
    """jax_privacy vmapped clipping == a loop of jax.grad per record, clipped and summed in float64."""
    model = make_model(kind)
    tokens, mask = (x[:5] for x in DATA)
    padding = np.array([False, False, False, True, False])
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    @jax.jit
    def one_grad(p, t, m):
        return jax.value_and_grad(lambda q: sequence_losses(nnx.merge(graphdef, q, rest), t, m)[0])(p)

    losses, grads = zip(*(one_grad(params, tokens[i : i + 1], mask[i : i + 1]) for i in range(5)))
    grads = [flat(g) for g in grads]
    norms = np.array([np.linalg.norm(g) for g in grads])
    clip = float(np.median(norms))  # some records clipped, some not
    oracle = sum(g * min(1.0, clip / n) for g, n, pad in zip(grads, norms, padding) if not pad)
    out = clipped_grad_sum(model, tokens, mask, clip_norm=clip, padding=padding)
    clipped = norms[~padding] > clip
    assert clipped.any() and not clipped.all()
    np.testing.assert_allclose(np.asarray(out.norms), norms, rtol=1e-5)
    np.testing.assert_allclose(flat(out.grad_sum), oracle, rtol=2e-5, atol=1e-6 * np.abs(oracle).max())
    np.testing.assert_allclose(np.asarray(out.losses), np.asarray(losses), rtol=1e-5)


def test_clipping_bounds_each_records_contribution():
    """||S(D) - S(D without i)|| <= C for every record i; power: unclipped sums move by ||g_i|| >> C."""
    model = make_model()
    tokens, mask = (x[:7] for x in DATA)
    clip = 0.05
    full = flat(clipped_grad_sum(model, tokens, mask, clip_norm=clip).grad_sum)
    raw_full = flat(clipped_grad_sum(model, tokens, mask, clip_norm=math.inf).grad_sum)
    for i in range(7):
        without = np.arange(7) == i
        moved = np.linalg.norm(full - flat(clipped_grad_sum(model, tokens, mask, clip_norm=clip, padding=without)[0]))
        assert moved <= clip * (1 + 1e-4), (i, moved)
        assert moved >= clip * (1 - 1e-4)  # every norm is >> C here, so each record moves the sum by exactly C
        raw_without = clipped_grad_sum(model, tokens, mask, clip_norm=math.inf, padding=without).grad_sum
        raw = np.linalg.norm(raw_full - flat(raw_without))
        assert raw > 10 * clip  # an unclipped implementation fails the bound


# ---------------------------------------------------------------------------
# 2. Noise and sampling (statistical, fixed seeds)
# ---------------------------------------------------------------------------


def _chi2_accepts(stat: float, dof: int) -> bool:
    return stats.chi2.ppf(ALPHA / 2, dof) <= stat <= stats.chi2.isf(ALPHA / 2, dof)


@pytest.mark.slow
def test_noise_is_gaussian_sigma_c_on_the_sum_divided_by_qn():
    """Zero-gradient construction: C = 1e-20 makes the clipped sum ~1e-19 while sigma C = 0.1.

    With SGD at learning rate 1 each step moves the parameters by exactly the noise over q N. Per
    step, sum(d^2) / tau^2 ~ chi2_D with tau = sigma C / (q N) (D > 900 parameters); accepted within
    the two-sided chi-square quantiles at ALPHA = 1e-6 (3 steps and the pooled steps: 4 checks), and
    6 z-tests at |z| < 5 (two-sided 5.7e-7 each: zero mean per step, no correlation between steps);
    false failure < 4e-6 + 3.5e-6 < 1e-5 overall. Power (each must be rejected by the same chi-square
    check): sigma off by 2x either way (2 tau, tau / 2), noise of std sigma C added to the mean instead
    of the sum (tau q N), and noise divided by q N twice (tau / (q N)).
    """
    q, sigma, clip = 0.5, 1e19, 1e-20
    config = DPSGDConfig(steps=3, learning_rate=1.0, clip_norm=clip, noise_multiplier=sigma, sampling_rate=q, **BASE)
    model = make_model()
    key = jax.random.key(11)
    thetas = [flat(params_of(model))]
    for stop in (1, 2, 3):
        trained, _, _ = train(model, DATA, config, key=key, stop_after=stop)
        thetas.append(flat(params_of(trained)))
    tau = sigma * clip / (q * N)
    noises = [(a - b) for a, b in zip(thetas, thetas[1:])]
    dof = noises[0].size
    assert dof > 900
    for noise in noises:
        stat = float(np.sum(noise**2) / tau**2)
        assert _chi2_accepts(stat, dof), (stat, dof)
        assert abs(noise.mean()) * math.sqrt(dof) / tau < 5.0
        for wrong in (2 * tau, tau / 2, tau * q * N, tau / (q * N)):  # power
            assert not _chi2_accepts(float(np.sum(noise**2) / wrong**2), dof)
    pooled = np.concatenate(noises)
    assert _chi2_accepts(float(np.sum(pooled**2) / tau**2), pooled.size)
    for a, b in ((0, 1), (1, 2), (0, 2)):  # fresh noise each step
        corr = np.dot(noises[a], noises[b]) / math.sqrt(np.dot(noises[a], noises[a]) * np.dot(noises[b], noises[b]))
        assert abs(corr) * math.sqrt(dof) < 5.0


def test_poisson_batch_sizes_are_binomial_and_records_independent():
    """Counts over 4001 steps: chi-square goodness of fit to Binomial(N, q) at ALPHA, mean z-test
    at ALPHA, per-record inclusion rates with Bonferroni over N records at ALPHA, and a two-sample
    chi-square test against jax_privacy's CyclicPoissonSampling (cycle 1, no truncation) at ALPHA
    (total false failure < 5e-6). Power: a fixed-size sampler of round(q N) records is rejected by
    the fit and by the two-sample test."""
    n, q, steps = 101, 0.13, 4001
    key = jax.random.key(5)
    masks = np.asarray(jax.jit(jax.vmap(lambda t: _mask(key, t, n, q)))(jnp.arange(steps)))
    assert np.array_equal(masks[17], np.asarray(poisson_batch(key, 17, n, q)))  # the public sampler
    counts = masks.sum(1)
    p = sampling_probability(q)
    assert q - 2.0**-32 < p <= q

    support = np.arange(n + 1)
    expected = steps * stats.binom.pmf(support, n, p)
    lo, hi = support[np.cumsum(expected) >= 5][0], support[::-1][np.cumsum(expected[::-1]) >= 5][0]

    def binned(values):  # tails merged so that every expected cell holds >= 5
        x = np.bincount(values, minlength=n + 1) if values.dtype.kind in "iu" else values
        return np.concatenate([[x[: lo + 1].sum()], x[lo + 1 : hi], [x[hi:].sum()]])

    def gof_pvalue(observed_counts):
        return stats.chisquare(binned(observed_counts), binned(expected)).pvalue

    assert gof_pvalue(counts) > ALPHA
    z = abs(counts.mean() - n * p) / math.sqrt(n * p * (1 - p) / steps)
    assert z < stats.norm.isf(ALPHA / 2)
    rates = masks.mean(0)
    zmax = np.max(np.abs(rates - p)) / math.sqrt(p * (1 - p) / steps)
    assert zmax < stats.norm.isf(ALPHA / (2 * n))
    fixed = np.full(steps, round(q * n))
    assert gof_pvalue(fixed) < ALPHA  # power

    strategy = batch_selection.CyclicPoissonSampling(
        sampling_prob=p, iterations=steps, partition_type=batch_selection.PartitionType.INDEPENDENT
    )
    theirs = np.array([b.size for b in strategy.batch_iterator(n, rng=np.random.default_rng(5))])
    assert stats.chi2_contingency(np.stack([binned(counts), binned(theirs)])).pvalue > ALPHA
    assert stats.chi2_contingency(np.stack([binned(fixed), binned(theirs)])).pvalue < ALPHA  # power


def _mask(key, t, n, q):
    from snapaudit_jax.dpsgd.sampling import _poisson_mask, inclusion_threshold

    return _poisson_mask(key, t, n, inclusion_threshold(q))


@pytest.mark.slow
def test_train_uses_the_documented_poisson_batches():
    """history batch sizes == poisson_batch(fold_in(key, 0), t, N, q) counts, step by step."""
    q = 0.3
    key = jax.random.key(2)
    config = DPSGDConfig(steps=5, learning_rate=0.1, clip_norm=1.0, noise_multiplier=1.0, sampling_rate=q, **BASE)
    _, history, _ = train(make_model(), DATA, config, key=key)
    expected = [int(poisson_batch(jax.random.fold_in(key, 0), t, N, q).sum()) for t in range(5)]
    assert history["batch_size"].tolist() == expected
    assert set(history) >= {"loss", "grad_norm_mean", "grad_norm_max", "clipped_fraction"}


@pytest.mark.parametrize("m, t", [(1, 1), (4, 4), (8, 2), (8, 3), (10, 3), (16, 6), (32, 8), (7, 7)])
def test_each_selected_unit_enters_the_sum_once_through_full_and_tail_microbatches(m, t, monkeypatch):
    """``_local_sums`` with a stand-in clipped sum that adds a one-hot row per unit it is given: for every batch
    size 0..N (random selections) each selected unit is added exactly once and no other, so no microbatch slice
    was clamped (``t`` not dividing ``m`` included) and padding never counted; the stand-in is traced at sizes
    ``{m, t}`` (``{m}`` when ``t = m``) and called, as the step ran, ``floor(K / m)`` times at ``m`` and the rest
    ``ceil((K mod m) / t)`` times at ``t``, or once more at ``m`` where ``K mod m > m - t``; the counts and the
    metrics come out as the selection's. With ``N = 31`` the tail of a full batch overruns ``ceil(N / m) m``
    entries at ``(8, 3)`` and ``(16, 6)`` (power: a slice clamped there would add a unit twice)."""
    import importlib

    from snapaudit_jax.dpsgd import gradients

    train_mod = importlib.import_module("snapaudit_jax.dpsgd.train")  # the package exports the function train

    n = 31
    sizes, calls = set(), []

    def fake(clipping, graphdef, params, rest, tokens, mask, padding, clip_norm, **_):
        size = tokens.shape[0]
        sizes.add(size)
        jax.debug.callback(lambda: calls.append(size), ordered=True)
        onehot = jax.nn.one_hot(tokens[:, 0], n) * (~padding)[:, None]
        norms = 1.0 + tokens[:, 0].astype(jnp.float32)
        return gradients.ClippedGrads({"w": onehot.sum(0)}, jnp.ones(tokens.shape[0]), norms)

    monkeypatch.setattr(train_mod, "_path_clipped_sum", fake)
    hyper = train_mod._Hyper(jnp.uint32(0), jnp.float32(10.5), jnp.float32(0), jnp.float32(1), jnp.float32(1))
    tokens = jnp.arange(n, dtype=jnp.int32)[:, None] * jnp.ones((1, 3), jnp.int32)
    run = jax.jit(lambda selected: train_mod._local_sums(
        {"w": jnp.zeros(n)}, None, hyper, tokens, tokens > -1, selected, graphdef=None, microbatch_size=m,
        tail_size=t))
    rng = np.random.default_rng(m * 100 + t)
    for count in range(n + 1):
        selected = np.zeros(n, bool)
        selected[rng.choice(n, count, replace=False)] = True
        calls.clear()
        grad_sum, sums, maxima = run(jnp.asarray(selected))
        jax.effects_barrier()
        whole, rem = divmod(count, m)
        if rem > m - t:
            want = [m] * (whole + 1)
        else:
            want = [m] * whole + [t] * -(-rem // t)
        assert calls == want, count
        assert 0 <= sum(calls) - count < t
        np.testing.assert_array_equal(np.asarray(grad_sum["w"]), selected.astype(np.float32))
        ids = np.flatnonzero(selected)
        assert int(sums["batch_size"]) == count and float(sums["loss_sum"]) == count
        assert float(sums["norm_sum"]) == np.sum(1.0 + ids)
        assert float(maxima["norm_max"]) == (1.0 + ids.max() if count else 0.0)
        assert int(sums["clipped"]) == np.sum(1.0 + ids > 10.5)
    assert sizes == {m, t}


def test_the_tail_microbatch_defaults_to_a_quarter_from_eight_units_and_is_checked():
    """``tail_for``: ``m`` below 8 units or from an expected batch of 8 microbatches, else ``ceil(m / 4)``; a set
    value is kept, and one above the microbatch is refused naming the field, rule and value."""
    config = DPSGDConfig(steps=1, learning_rate=0.1, clip_norm=1.0, noise_multiplier=1.0, sampling_rate=0.1,
                         delta=1e-5)  # q N = 100 at N = 1000
    assert [config.tail_for(1000, m) for m in (1, 4, 7, 8, 9, 12, 13, 16, 30, 32)] == [1, 4, 7, 8, 9, 12, 4, 4, 8, 8]
    sized = DPSGDConfig(**{**config.__dict__, "sampling_rate": None, "batch_size": 256})
    assert [sized.tail_for(1000, m) for m in (16, 32, 33)] == [16, 32, 9]  # 256 = 8 x 32 microbatches
    kept = DPSGDConfig(**{**config.__dict__, "tail_microbatch_size": 5})
    assert kept.tail_for(1000, 32) == 5 and kept.tail_for(1000, 5) == 5
    with pytest.raises(InputError, match=r"tail_microbatch_size must be <= the microbatch size 4, got 5"):
        kept.tail_for(1000, 4)
    with pytest.raises(InputError, match=r"tail_microbatch_size must be <= microbatch_size=4, got 5"):
        DPSGDConfig(**{**config.__dict__, "tail_microbatch_size": 5, "microbatch_size": 4})
    with pytest.raises(InputError, match=r"tail_microbatch_size must be an integer >= 1, got 0"):
        DPSGDConfig(**{**config.__dict__, "tail_microbatch_size": 0})


# ---------------------------------------------------------------------------
# 3. Accounting, calibration and the report
# ---------------------------------------------------------------------------


def _dpa_epsilon(sigma, q, steps, delta, accountant, disc=1e-4):
    acc = RdpAccountant() if accountant == "rdp" else PLDAccountant(value_discretization_interval=disc)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    return acc.compose(event, steps).get_epsilon(delta)


def test_calibrated_sigma_hits_target_and_agrees_with_jax_privacy():
    """epsilon(sigma) <= target < epsilon(sigma - 2 tol) by dp_accounting directly; jax_privacy's own
    calibration (its DP-SGD accountant with the same RDP orders) lands within 2 tol."""
    target, delta, records, batch, steps, tol = 2.0, 1e-5, 10_000, 100, 400, 1e-4
    q = batch / records
    sigma = calibrate_noise_multiplier(target_epsilon=target, delta=delta, sampling_rate=q, steps=steps, tol=tol)
    assert _dpa_epsilon(sigma, q, steps, delta, "rdp") <= target
    assert _dpa_epsilon(sigma - 2 * tol, q, steps, delta, "rdp") > target
    jp = jp_accounting.DpsgdTrainingAccountant(
        jp_accounting.RdpAccountantConfig(orders=dp_accounting.rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
    )
    theirs = jp_accounting.calibrate_noise_multiplier(
        target_epsilon=target, accountant=jp, batch_sizes=batch, num_updates=steps, num_samples=records,
        target_delta=delta, tol=tol,
    )
    assert abs(theirs - sigma) <= 2 * tol
    params = jp_accounting.DpParams(noise_multipliers=sigma, num_samples=records, delta=delta, batch_size=batch)
    assert compute_epsilon(noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=delta) == pytest.approx(
        jp.compute_epsilon(steps, params), rel=1e-12
    )


def test_pld_calibration_and_pld_epsilon_match_dp_accounting():
    target, delta, q, steps, tol, disc = 3.0, 1e-5, 0.1, 20, 1e-3, 1e-3
    sigma = calibrate_noise_multiplier(
        target_epsilon=target, delta=delta, sampling_rate=q, steps=steps, accountant="pld", tol=tol,
        pld_discretization=disc,
    )
    assert _dpa_epsilon(sigma, q, steps, delta, "pld", disc) <= target
    assert _dpa_epsilon(sigma - 2 * tol, q, steps, delta, "pld", disc) > target
    ours = compute_epsilon(
        noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=delta, accountant="pld", pld_discretization=disc
    )
    assert ours == _dpa_epsilon(sigma, q, steps, delta, "pld", disc)


REPORT_KEYS = {
    "dp", "epsilon", "epsilon_rdp", "epsilon_pld", "delta", "noise_multiplier", "clip_norm", "sampling",
    "sampling_rate", "sampling_probability", "expected_batch_size", "steps", "steps_planned", "dataset_size",
    "protected_unit", "adjacency", "target_epsilon", "calibration_accountant", "accountants", "software",
    "optimizer", "learning_rate", "microbatch_size", "tail_microbatch_size", "not_covered", "randomness", "clipping",
    "clipping_reason", "clipped_sum_dtype", "layers", "layers_reason", "noise", "noise_coordinates", "sampler_delta",
    "delta_total",
}


@pytest.mark.slow
def test_report_holds_the_claim_and_matches_dp_accounting():
    """Report: both epsilons equal dp_accounting's, computed here independently; strict JSON with every
    field seed 002 asks for."""
    config = DPSGDConfig(
        steps=4, learning_rate=0.1, clip_norm=0.7, target_epsilon=20.0, sampling_rate=0.25, pld_discretization=1e-3,
        **BASE,
    )
    _, _, report = train(make_model(), DATA, config, key=jax.random.key(0))
    sigma = report.noise_multiplier
    assert report.dp and report.sampling == "poisson" and report.steps == 4 and report.dataset_size == N
    assert report.clip_norm == 0.7 and report.delta == 1e-5 and report.target_epsilon == 20.0
    assert report.calibration_accountant == "rdp" and "one training sequence" in report.protected_unit
    assert report.adjacency == "add/remove one record" and report.expected_batch_size == pytest.approx(0.25 * N)
    assert report.epsilon_rdp == _dpa_epsilon(sigma, 0.25, 4, 1e-5, "rdp") <= 20.0
    assert report.epsilon_pld == _dpa_epsilon(sigma, 0.25, 4, 1e-5, "pld", 1e-3)
    assert report.epsilon == min(report.epsilon_rdp, report.epsilon_pld)
    assert report.accountants["rdp"]["version"] == report.software["dp-accounting"] != "unknown"
    assert report.accountants["pld"]["value_discretization_interval"] == 1e-3
    assert report.not_covered
    data = json.loads(report.to_json())
    assert set(data) == REPORT_KEYS
    assert data["epsilon_pld"] == report.epsilon_pld and data["noise_multiplier"] == sigma
    assert data["epsilon"] == report.epsilon and data["sampling"] == "poisson"
    assert "caller" in data["randomness"]  # the key was passed in
    assert "epsilon" in report.summary() and "Poisson" in report.summary()
    # the sampler's term: every trainable coordinate of every step, (1 + e^eps) 2^-71 each
    coordinates = sum(int(np.size(v)) for v in jax.tree.leaves(nnx.state(make_model(), nnx.Param)))
    assert report.noise_coordinates == coordinates
    assert report.sampler_delta == pytest.approx((1 + math.exp(report.epsilon)) * 4 * coordinates / 2.0**71, rel=1e-12)
    assert data["delta_total"] == 1e-5 + report.sampler_delta and "2^-96" in data["noise"]


@pytest.mark.slow
def test_non_private_report_says_so_and_stays_strict_json():
    # momentum 0.9 like the optax-loop test below: the two share one compiled step
    config = DPSGDConfig(
        steps=1, learning_rate=0.1, non_private=True, sampling_rate=0.5, momentum=0.9, **{**BASE, "delta": None}
    )
    _, _, report = train(make_model(), DATA, config, key=jax.random.key(0))
    assert not report.dp and math.isinf(report.epsilon_rdp) and math.isinf(report.clip_norm)
    data = json.loads(report.to_json())
    assert data["epsilon_rdp"] is None and data["dp"] is False
    assert "NOT differentially private" in report.summary()
    assert data["noise"] == "none (no noise added)" and data["sampler_delta"] == 0.0 and data["delta_total"] is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(clip_norm=0.0), r"clip_norm must be .*> 0, got 0\.0"),
        (dict(clip_norm=-1.0), r"clip_norm must be .*> 0, got -1\.0"),
        (dict(noise_multiplier=-0.5), r"noise_multiplier must be .*>= 0, got -0\.5"),
        (dict(delta=1.0), r"delta must be in \(0, 1\), got 1\.0"),
        (dict(delta=0.0), r"delta must be in \(0, 1\), got 0\.0"),
        (dict(delta=None), r"delta must be in \(0, 1\), got None"),
        (dict(sampling_rate=0.0), r"sampling_rate must be in \(0, 1\], got 0\.0"),
        (dict(sampling_rate=1.5), r"sampling_rate must be in \(0, 1\], got 1\.5"),
        (dict(steps=0), r"steps must be an integer >= 1, got 0"),
        (dict(learning_rate=0.0), r"learning_rate must be .*> 0, got 0\.0"),
        (dict(noise_multiplier=None), r"exactly one of noise_multiplier and target_epsilon"),
        (dict(target_epsilon=1.0), r"exactly one of noise_multiplier and target_epsilon"),
        (dict(sampling_rate=None), r"exactly one of sampling_rate and batch_size"),
        (dict(optimizer="lion"), r"optimizer must be one of 'sgd', 'adam', 'adamw', got 'lion'"),
        (dict(microbatch_size=0), r"microbatch_size must be an integer >= 1, got 0"),
        (dict(accountant="gdp"), r"accountant must be one of 'rdp', 'pld', got 'gdp'"),
        (dict(clipping="fast"), r"clipping must be one of 'auto', 'per_record', 'book_keeping', 'ghost', got 'fast'"),
        (dict(clipped_sum_dtype="float16"), r"clipped_sum_dtype must be one of 'float32', 'bfloat16', got 'float16'"),
        (dict(clipped_sum_dtype="bfloat16", clipping="ghost"),
         r"clipped_sum_dtype = 'bfloat16' needs the book-keeping path, got clipping = 'ghost'"),
    ],
)
def test_bad_config_names_field_rule_and_value(kwargs, match):
    base = dict(steps=3, learning_rate=0.1, clip_norm=1.0, noise_multiplier=1.0, delta=1e-5, sampling_rate=0.1)
    with pytest.raises(ValueError, match=match):
        DPSGDConfig(**{**base, **kwargs})


def test_unreachable_target_and_bad_dataset_raise():
    with pytest.raises(ValueError, match=r"target_epsilon=0\.001 is unreachable with the rdp accountant"):
        calibrate_noise_multiplier(target_epsilon=1e-3, delta=1e-5, sampling_rate=0.5, steps=100)
    config = DPSGDConfig(steps=3, learning_rate=0.1, clip_norm=1.0, noise_multiplier=1.0, sampling_rate=0.1, **BASE)
    with pytest.raises(ValueError, match=r"target_epsilon=0\.001 is unreachable"):
        train(make_model(), DATA, DPSGDConfig(**{**config.__dict__, "noise_multiplier": None, "target_epsilon": 1e-3}))
    with pytest.raises(ValueError, match=r"batch_size must be <= the number of records N=29, got 30"):
        train(make_model(), DATA, DPSGDConfig(**{**config.__dict__, "sampling_rate": None, "batch_size": 30}))
    tokens, mask = (x.copy() for x in DATA)
    mask[3] = False
    mask[3, 0] = True
    with pytest.raises(ValueError, match=r"dataset mask row 3 has no next-token target"):
        train(make_model(), (tokens, mask), config)
    tokens, mask = (x.copy() for x in DATA)
    tokens[0, 0], mask[0, 0] = VOCAB, True
    with pytest.raises(ValueError, match=r"dataset tokens must be in \[0, vocab_size=37\), got token id 37"):
        train(make_model(), (tokens, mask), config)
    with pytest.raises(ValueError, match=r"stop_after must be <= config.steps=3, got 4"):
        train(make_model(), DATA, config, stop_after=4)


# ---------------------------------------------------------------------------
# 4. Training: plain optax equivalence, resume, compilation
# ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("microbatch", [dict(), dict(microbatch_size=8, tail_microbatch_size=3)],
                         ids=["m4", "m8_tail3"])
def test_non_private_equals_hand_written_optax_loop(microbatch):
    """Clip and noise off: the same updates as optax SGD-momentum on grad(sum of batch losses / (q N))
    over the same Poisson batches (float32 summation order differs: rtol 1e-5); also with the batch's remainder in
    microbatches of 3 after those of 8 (batches of 8 to 16 records: every split of full and tail calls)."""
    q, lr, steps = 0.4, 0.5, 4
    key = jax.random.key(7)
    config = DPSGDConfig(
        steps=steps, learning_rate=lr, non_private=True, sampling_rate=q, momentum=0.9,
        **{**BASE, "delta": None, **microbatch}
    )
    model = make_model()
    trained, history, _ = train(model, DATA, config, key=key)

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt = optax.sgd(lr, momentum=0.9)
    state = opt.init(params)
    tokens, mask = (jnp.asarray(x) for x in DATA)

    @jax.jit
    def grad(p, rows):
        def loss(p):
            losses = sequence_losses(nnx.merge(graphdef, p, rest), tokens, mask)
            return jnp.sum(jnp.where(rows, losses, 0.0)) / (q * N)

        return jax.grad(loss)(p)

    for t in range(steps):
        rows = poisson_batch(jax.random.fold_in(key, 0), t, N, q)
        updates, state = opt.update(grad(params, rows), state, params)
        params = optax.apply_updates(params, updates)
    ours, theirs = flat(params_of(trained)), flat(params)
    assert np.abs(ours - flat(params_of(model))).max() > 1e-2  # it did train
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert np.all(history["clipped_fraction"] == 0)


@pytest.mark.slow
def test_resume_from_checkpoint_gives_identical_parameters(tmp_path):
    """Stopped at step 3 (checkpoints at 2 and 3) and resumed from a model with other weights: bit for bit
    the uninterrupted run (parameters, history, report). A checkpoint of another config, key or dataset
    is refused; progress callbacks see every tenth step."""
    config = DPSGDConfig(steps=5, learning_rate=0.1, clip_norm=1.0, noise_multiplier=1.3, sampling_rate=0.3, **BASE)
    key = jax.random.key(4)
    seen = []
    whole, history, report = train(make_model(), DATA, config, key=key, progress=seen.append)
    assert [info["step"] for info in seen] == [1, 2, 3, 4, 5]
    assert [info["batch_size"] for info in seen] == history["batch_size"].tolist()
    np.testing.assert_allclose([info["loss"] for info in seen], history["loss"], rtol=1e-12)
    folder = tmp_path / "ckpt"
    _, partial, partial_report = train(
        make_model(), DATA, config, key=key, checkpoint_dir=str(folder), checkpoint_every=2, stop_after=3
    )
    assert sorted(os.listdir(folder)) == ["step_00000002", "step_00000003"]  # atomic: no temporaries left
    assert sorted(os.listdir(folder / "step_00000003")) == ["meta.json", "state.safetensors"]
    assert partial_report.steps == 3 and partial_report.steps_planned == 5
    assert partial_report.epsilon_rdp < report.epsilon_rdp  # the stopped run accounts 3 steps
    # A fresh model with other weights: everything comes from the checkpoint.
    resumed, resumed_history, resumed_report = train(
        make_model(seed=9), DATA, config, key=key, checkpoint_dir=str(folder)
    )
    assert np.array_equal(flat(params_of(resumed)), flat(params_of(whole)))
    for name in history:
        np.testing.assert_array_equal(resumed_history[name], history[name])
    assert resumed_report == report
    with open(folder / "step_00000005" / "meta.json") as fh:
        meta = json.load(fh)
    assert meta["step"] == 5 and meta["accountant"]["steps"] == 5
    assert meta["accountant"]["epsilon_rdp"] == pytest.approx(report.epsilon_rdp, rel=1e-12)
    other = DPSGDConfig(**{**config.__dict__, "noise_multiplier": 1.4})
    with pytest.raises(ValueError, match=r"config differs from this run"):
        train(make_model(), DATA, other, key=key, checkpoint_dir=str(folder))
    with pytest.raises(ValueError, match=r"key_sha256 differs from this run"):
        train(make_model(), DATA, config, key=jax.random.key(5), checkpoint_dir=str(folder))
    tokens = DATA[0].copy()
    col = int(np.argmax(DATA[1][0]))  # one real token of record 0 changed
    tokens[0, col] = (tokens[0, col] + 1) % VOCAB
    with pytest.raises(ValueError, match=r"dataset_sha256 differs from this run"):
        train(make_model(), (tokens, DATA[1]), config, key=key, checkpoint_dir=str(folder))


_EVENTS = {"active": False, "trace": 0, "compile": 0}


def _on_event(event, duration, **kwargs):
    if not _EVENTS["active"]:
        return
    if event == "/jax/core/compile/jaxpr_trace_duration":
        _EVENTS["trace"] += 1
    elif event == "/jax/core/compile/backend_compile_duration":
        _EVENTS["compile"] += 1


@pytest.mark.slow
def test_steps_and_later_runs_do_not_recompile():
    """After one run, a longer run with other q, sigma, C and learning rate traces and compiles nothing:
    the step's jit cache keeps one entry and JAX reports no trace or backend compilation (power: a new
    jitted function is counted by both)."""
    first = DPSGDConfig(steps=2, learning_rate=0.1, clip_norm=1.0, noise_multiplier=1.0, sampling_rate=0.3, **BASE)
    train(make_model(), DATA, first, key=jax.random.key(0))
    entries = _dp_step._cache_size()
    second = DPSGDConfig(steps=6, learning_rate=0.03, clip_norm=0.5, noise_multiplier=2.0, sampling_rate=0.6, **BASE)
    jax.monitoring.register_event_duration_secs_listener(_on_event)
    try:
        _EVENTS.update(active=True, trace=0, compile=0)
        _, history, _ = train(make_model(), DATA, second, key=jax.random.key(1))
        steady = dict(_EVENTS)
        jax.jit(lambda x: x * 3 + 1)(np.float32(2.0))
        fresh = {name: _EVENTS[name] - steady[name] for name in ("trace", "compile")}
    finally:
        _EVENTS["active"] = False
        jax.monitoring.unregister_event_duration_listener(_on_event)
    assert len(history["step"]) == 6 and len(set(history["batch_size"].tolist())) > 1  # batch sizes varied
    assert _dp_step._cache_size() == entries
    assert steady["trace"] == 0 and steady["compile"] == 0, steady
    assert fresh["trace"] >= 1 and fresh["compile"] >= 1


@pytest.mark.slow
def test_llama_trains_with_dp_sgd_and_the_default_microbatch():
    """Llama through the default microbatch of the path ``"auto"`` takes (q N = 8.7: 2 units a clipped-gradient call
    of book-keeping on CPU, 9 on accelerators)."""
    config = DPSGDConfig(
        steps=3, learning_rate=0.05, clip_norm=1.0, noise_multiplier=0.8, sampling_rate=0.3, delta=1e-5,
        optimizer="adam",
    )
    model = make_model("llama")
    trained, history, report = train(model, DATA, config, key=jax.random.key(0))
    assert report.clipping == "book_keeping"
    assert report.microbatch_size == config.microbatch_for(N, clipping=report.clipping) == (
        2 if jax.default_backend() == "cpu" else 9)
    assert np.all(np.isfinite(history["loss"])) and report.dp and math.isfinite(report.epsilon_pld)
    assert np.abs(flat(params_of(trained)) - flat(params_of(model))).max() > 0


def test_default_microbatch_by_backend_and_clipping_path():
    config = DPSGDConfig(steps=1, learning_rate=0.1, noise_multiplier=1.0, delta=1e-5, batch_size=40)
    for path in ("per_record", "book_keeping", "ghost"):  # accelerators: min(32, ceil(q N)) on every path
        assert config.microbatch_for(1000, backend="gpu", clipping=path) == 32
        assert config.microbatch_for(50, backend="tpu", clipping=path) == 32
        assert DPSGDConfig(**{**config.__dict__, "batch_size": 7}).microbatch_for(1000, "gpu", path) == 7
        assert DPSGDConfig(**{**config.__dict__, "microbatch_size": 5}).microbatch_for(1000, "cpu", path) == 5
    # CPU: per-unit gradients one at a time; the fast paths the largest power of two <= min(4, q N / 4)
    for expected_batch, m in {1: 1, 7: 1, 8: 2, 15: 2, 16: 4, 40: 4, 1000: 4}.items():
        sized = DPSGDConfig(**{**config.__dict__, "batch_size": expected_batch})
        assert sized.microbatch_for(1000, "cpu", "per_record") == 1
        assert sized.microbatch_for(1000, "cpu", "book_keeping") == sized.microbatch_for(1000, "cpu", "ghost") == m
        assert m == 1 or m <= expected_batch / 4  # the expected padding stays under an eighth of the batch
    rate = DPSGDConfig(steps=1, learning_rate=0.1, noise_multiplier=1.0, delta=1e-5, sampling_rate=0.0159)
    assert rate.microbatch_for(1000, "cpu", "book_keeping") == 2  # q N = 15.9
    with pytest.raises(InputError, match=r"clipping must be a resolved path \(per_record, book_keeping, ghost\), "
                                         r"got 'auto'"):
        config.microbatch_for(1000, "cpu", "auto")


def test_a_run_whose_noise_sampler_would_add_over_a_tenth_of_delta_is_refused(monkeypatch):
    """The sampler's term ``(1 + e^eps) T d p`` against a tenth of delta, with ``eps`` RDP's for a given sigma and
    ``d`` the trainable coordinates: with the tail probability ``p`` set 1% above the limit the run is refused
    before training, naming delta and the terms; 1% below, the check passes."""
    from snapaudit_jax.dpsgd import noise
    from snapaudit_jax.dpsgd.train import _check_sampler_delta, resolve_privacy

    config = DPSGDConfig(steps=2, learning_rate=0.1, clip_norm=1.0, noise_multiplier=1.0, sampling_rate=0.5, **BASE)
    coordinates = sum(int(np.size(v)) for v in jax.tree.leaves(nnx.state(make_model(), nnx.Param)))
    eps = compute_epsilon(noise_multiplier=1.0, sampling_rate=0.5, steps=2, delta=1e-5, accountant="rdp")
    limit = 0.1 * 1e-5 / ((1 + math.exp(eps)) * 2 * coordinates)
    monkeypatch.setattr(noise, "TAIL_PROBABILITY", limit * 1.01)
    with pytest.raises(InputError, match=rf"delta: the noise sampler's tails would add 1\.01e-06 to delta = 1e-05, "
                                         rf"more than 0\.1 of it .*T = 2 noisy steps, d = {coordinates} trainable"):
        train(make_model(), DATA, config, key=jax.random.key(0))
    monkeypatch.setattr(noise, "TAIL_PROBABILITY", limit * 0.99)
    _check_sampler_delta(config, resolve_privacy(config, N), coordinates)
