"""The consumers docs/finetune.md names for a ``snapaudit finetune`` export, each run on a real export.

One module-scoped fine-tune (``snapaudit finetune`` on a tiny transformers-built Llama folder: LoRA rank 2,
2 DP-SGD steps, a given sigma so no calibration runs, no baseline, no canaries; about 20 s on 2 cores) writes
``export/private`` (LoRA merged) and ``export/private_adapter``. Then:

* ``snapaudit generate --model export/private`` decodes greedily the token ids transformers'
  ``LlamaForCausalLM`` decodes from the same folder (the oracle; its own tokenizer and chat template);
* ``snapaudit audit`` with ``[model] llm = "export/private"`` runs a small PV audit, and every snapshot manifest
  names the export folder as the model;
* ``transformers serve export/private`` answers our client with the texts our greedy decoding gives;
* the pipeline's PEFT adapter over the base folder its ``adapter_config.json`` names, in ``peft``, computes the
  logits of the merged export (in transformers and in our own decoder) within float32 round-off.
  ``test_export.py`` checks the writers on hand-made adapters; this checks what the pipeline wrote: its targets,
  its scale, the base path it records, and that the 2 steps changed the adapters at all.

Everything is deterministic (fixed seeds, the noise's replayable ``noise_seed`` included, greedy decoding), so
no test has a false-failure probability. Greedy comparisons across two implementations could flip on a near-tie
of the top two logits: the decoding test compares the two paths up to the oracle's first near-tie, and feeds our
whole path to the oracle, where each of our tokens must be its argmax to within 1e-3.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from snapaudit_jax.cli import main  # noqa: E402
from tests.helpers.tiny_llm import make_tiny_llm_folder  # noqa: E402

WORDS = "alpha beta gamma delta kappa omega sigma tau rho zeta".split()
PROMPT = "note of u3: alpha"
NEW_TOKENS = 8
TOL = 1e-5  # max|Δlogits| / max(1, max|logits|), float32 (as test_export.py)


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))


def _ours(model, ids) -> np.ndarray:
    """Our decoder's logits of a full batch (``(B, T, vocab)``), jitted once."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def logits(state, ids):
        m = nnx.merge(graphdef, state)
        hidden, _ = m(ids, jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape), jnp.ones(ids.shape, bool))
        return m.logits(hidden)

    return np.asarray(logits(state, jax.device_put(np.asarray(ids, np.int32))))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """``(root, base folder, run folder)`` of one real ``snapaudit finetune`` run."""
    root = tmp_path_factory.mktemp("consumers")
    rng = np.random.default_rng(0)
    rows = [{"text": f"note of u{u}: {' '.join(rng.choice(WORDS, size=6))}."} for u in range(30)]
    base = make_tiny_llm_folder(str(root / "base"), [r["text"] for r in rows], vocab_size=300)
    (root / "notes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "ft.toml").write_text(
        f'[run]\nseed = 1\nnoise_seed = 11\nbaseline = false\neval_batch_size = 8\n'  # replayable: fixed weights
        f'[data]\npath = "{root / "notes.jsonl"}"\nmax_length = 24\nheld_out_fraction = 0.2\n'
        f'[model]\nbase = "{base}"\n'
        '[finetune]\nmethod = "lora"\nrank = 2\nsteps = 2\nbatch_size = 4\nlearning_rate = 0.05\n'
        # A given sigma: PLD calibration at a small sigma costs tens of seconds, and is tested elsewhere.
        '[privacy]\ntarget_epsilon = 0.0\nnoise_multiplier = 1.0\n'
        '[canaries]\nn_canaries = 0\n')
    out = root / "run"
    assert main(["finetune", str(root / "ft.toml"), "--out", str(out), "--quiet"]) == 0
    return root, base, out


@pytest.fixture(scope="module")
def private(run):
    return str(run[2] / "export" / "private")


@pytest.fixture(scope="module")
def hf_private(private):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(private, output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
    return model.eval()


@pytest.mark.slow
def test_the_export_is_the_folder_the_report_names(run, private):
    _, _, out = run
    card = json.loads((out / "report.json").read_text())
    assert os.path.samefile(card["exports"]["private"], private)
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= set(os.listdir(private))
    assert sorted(os.listdir(out / "export")) == ["private", "private_adapter"]  # no baseline, no temporary folder


@pytest.mark.slow
def test_snapaudit_generate_decodes_the_export_as_transformers_does(private, hf_private, capsys):
    assert main(["generate", "--model", private, "--prompt", PROMPT, "--chat", "--max-new-tokens", str(NEW_TOKENS),
                 "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(private)
    text = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                         add_generation_prompt=True)
    ids = torch.tensor([tokenizer.encode(text)])
    with torch.no_grad():
        gen = hf_private.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                  do_sample=False, output_scores=True, return_dict_in_generate=True)
    theirs = gen.sequences[0, ids.shape[1]:].tolist()
    # Greedy tokens are compared up to the first step whose top two logits (transformers') lie within 1e-3: there
    # round-off may pick either (the trained weights, and so the margins, depend on the backend's arithmetic).
    gaps = [float(np.diff(np.sort(s[0].numpy())[-2:])[0]) for s in gen.scores]
    decided = next((i for i, gap in enumerate(gaps) if gap <= 1e-3), len(gaps))
    assert ours["token_ids"][:decided] == theirs[:decided], (ours, theirs, gaps)
    assert len(ours["token_ids"]) == len(theirs) or decided < len(theirs)
    # Every step of our path, near-ties included: fed to transformers, each of our tokens is its argmax to within
    # 1e-3 of the top logit (a token another implementation would not pick falls short by its whole margin).
    path = torch.tensor([ids[0].tolist() + ours["token_ids"]])
    with torch.no_grad():
        logits = hf_private(path).logits[0, ids.shape[1] - 1:-1].numpy()
    chosen = logits[np.arange(len(ours["token_ids"])), ours["token_ids"]]
    assert np.all(chosen >= logits.max(axis=1) - 1e-3), (ours, theirs, gaps)
    eos = hf_private.generation_config.eos_token_id
    assert len(ours["token_ids"]) == NEW_TOKENS or ours["token_ids"][-1] in np.atleast_1d(eos).tolist()
    assert ours["text"] == tokenizer.decode(ours["token_ids"], skip_special_tokens=True)


@pytest.mark.slow
def test_snapaudit_audit_runs_with_the_export_as_its_model(run, private):
    root, _, _ = run
    config = root / "audit.toml"
    config.write_text(f'[model]\nllm = "{private}"\n\n[audit]\nepsilons = [2]\nsnapshots = 2\ntrials = 2000\n'
                      'passive_runs = 2\nverify = 0\nmethod = "exact"\nthreats = ["black"]\n\n'
                      '[pipelines.pv]\nnum_exemplars = 2\npartitions = 2\n')
    out = root / "audit"
    assert main(["audit", str(config), "--out", str(out), "--quiet"]) == 0
    manifest = json.loads((out / "snapshots" / "pv.manifest.json").read_text())
    # the answers are keyed by the export's path and a digest of its files: a rewritten export is another model
    from snapaudit_jax.models import local_identity

    assert manifest["model"] == private  # the label
    assert manifest["model_identity"] == local_identity(private, private)
    assert manifest["model_identity"].startswith(f"{private} files:")
    assert manifest["llm_calls"] > 0
    with np.load(out / "snapshots" / "pv.npz") as snaps:
        assert snaps["with"].shape[0] == snaps["without"].shape[0] == 2
    rows = json.loads((out / "results.json").read_text())
    assert {r["pipeline"] for r in rows} == {"pv"} and all(r["epsilon_emp"] >= 0 for r in rows)


@pytest.mark.slow
def test_transformers_serve_answers_as_our_greedy_decoding(private):
    from snapaudit_jax.models import load_language_model, load_tokenizer
    from snapaudit_jax.models.server import ServerConfig, connect
    from snapaudit_jax.models.serving import TransformersServe, serving_available

    if serving_available() is not None:
        pytest.skip(serving_available())
    lm = load_language_model(private)
    prompts = [lm.chat_prompt(q) for q in ("note of u1: beta", "note of u7: kappa omega")] + [PROMPT]
    ours = [g.text for g in lm.generate(prompts, max_new_tokens=NEW_TOKENS)]
    with TransformersServe(private) as served:
        remote, caps = connect(ServerConfig(served.base_url, served.model_id, max_concurrency=2),
                               load_tokenizer(private))
        assert caps.model_ids == (private,)
        theirs = [g.text for g in remote.generate(prompts, max_new_tokens=NEW_TOKENS)]
    assert theirs == ours and any(t.strip() for t in ours), (theirs, ours)


@pytest.mark.slow
def test_the_pipelines_peft_adapter_over_its_base_computes_the_merged_export(run, private, hf_private):
    from snapaudit_jax.finetune import lora_adapters, read_peft_adapter
    from snapaudit_jax.models import load_language_model

    _, base, out = run
    adapter = out / "export" / "private_adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == os.path.abspath(base)
    assert (config["r"], config["lora_alpha"]) == (2, 16)  # rank 2, the default alpha 16
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"]).eval()
    ids = np.random.default_rng(3).integers(0, hf_base.config.vocab_size, (2, 11))
    with torch.no_grad():
        before = hf_base(torch.tensor(ids)).logits.numpy()
        merged = hf_private(torch.tensor(ids)).logits.numpy()
        adapted = peft.PeftModel.from_pretrained(hf_base, str(adapter)).eval()(torch.tensor(ids)).logits.numpy()
    assert _rel(adapted, merged) <= TOL
    assert _rel(_ours(load_language_model(private).module, ids), merged) <= TOL
    # the adapters trained: lora_B starts at zero, and the merged model is not the base
    ours = read_peft_adapter(load_language_model(base).module, adapter)
    assert all(np.abs(np.asarray(b)).max() > 0 for _, b, _ in lora_adapters(ours).values())
    assert _rel(before, merged) > 100 * TOL
