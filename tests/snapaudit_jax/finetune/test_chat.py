"""Chat records in ``snapaudit finetune``: the template applied once, no default system prompt, loss on answers.

Oracles: transformers' ``apply_chat_template(messages, tokenize=True)`` on the same tokenizer folder (a ChatML
template, SmolLM2-Instruct's template with its default system prompt, a Llama-3 template that writes its own BOS)
and on the embedded SmolLM2 GGUF (transformers' GGUF reader); the target tokens decoded back to the answers'
text; token counts done by hand for the truncation rules.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from snapaudit_jax.finetune.config import DataConfig, FinetuneConfig
from snapaudit_jax.finetune.data import _encode, pack_records, render_chat
from snapaudit_jax.models.inference import CONTEXT, TARGET
from snapaudit_jax.models.tokenizer import Tokenizer
from snapaudit_jax.utils.errors import InputError

CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SMOL_DEFAULT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
SMOL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n" + SMOL_DEFAULT + "<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3 = (
    "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
TEMPLATES = {
    "chatml": (CHATML, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], {"eos_token": "<|im_end|>"},
               "<|im_end|>\n"),
    "smollm2": (SMOL, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, "<|im_end|>\n"),
    "llama3": (LLAMA3, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "<|eot_id|>"),
}
CHATS = [
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Where is the clinic?"},
     {"role": "assistant", "content": "On the hill road, next to the old mill."}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Green."},
     {"role": "user", "content": "Another one?"}, {"role": "assistant", "content": "Blue, like the sea."}],
]
WORDS = [m["content"] for c in CHATS for m in c] + [SMOL_DEFAULT, "system user assistant"]


def _folder(root, name):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    template, specials, names, _ = TEMPLATES[name]
    path = root / name
    os.makedirs(path, exist_ok=True)
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(WORDS * 3, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({**names, "chat_template": template}))
    return str(path)


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def tokenizers(request, tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = _folder(tmp_path_factory.mktemp("chat"), request.param)
    return request.param, Tokenizer.from_folder(path), transformers.AutoTokenizer.from_pretrained(path)


def _config(max_length=256, train_on="assistant", system_prompt=""):
    return FinetuneConfig(data=DataConfig(path="x.jsonl", messages_field="messages", max_length=max_length,
                                          train_on=train_on, system_prompt=system_prompt))


def _hf_ids(hf, messages):
    out = hf.apply_chat_template(messages, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _record(tok, messages, config):
    spans = [] if config.data.train_on == "assistant" else None
    text, found = render_chat(tok, messages, system_prompt=config.data.system_prompt, spans=spans is not None)
    records, counts = _encode([text], None if spans is None else [found], tok, config)
    return records[0], counts


def test_ids_are_the_templates_once_with_no_default_system_prompt(tokenizers):
    """Ids equal transformers' apply_chat_template of the conversation (with an empty system message where the
    template would insert its default); no doubled start token; the default system prompt's text is absent."""
    name, tok, hf = tokenizers
    for messages in CHATS:
        record, counts = _record(tok, messages, _config())
        ids = [t if t >= 0 else -1 - t for t in record]
        expected = messages
        if name == "smollm2" and messages[0]["role"] != "system":
            expected = [{"role": "system", "content": ""}] + messages
        assert ids == _hf_ids(hf, expected) and counts["truncated"] == 0
        assert ids[0] != ids[1]  # the start token once
        assert SMOL_DEFAULT not in tok.decode(ids, skip_special_tokens=False)
    if name == "smollm2":  # power: the template itself inserts its default
        assert SMOL_DEFAULT in tok.apply_chat_template(CHATS[1], add_generation_prompt=False)
    # a configured system prompt stands in for a missing one
    record, _ = _record(tok, CHATS[1], _config(system_prompt="Be kind."))
    with_system = [{"role": "system", "content": "Be kind."}] + CHATS[1]
    assert [t if t >= 0 else -1 - t for t in record] == _hf_ids(hf, with_system)


def test_targets_are_exactly_the_answers_and_their_end_of_turn(tokenizers):
    """Decoded target tokens are each answer's content plus the template's end of turn, in order; the rest is
    context; train_on = "all" makes every token a target (a bool mask)."""
    name, tok, _ = tokenizers
    end = TEMPLATES[name][3]
    for messages in CHATS:
        record, _ = _record(tok, messages, _config())
        tokens, mask = pack_records([record])
        assert mask.dtype == np.int8 and set(np.unique(mask).tolist()) == {CONTEXT, TARGET}
        runs, current = [], []
        for t, m in zip(tokens[0], mask[0]):
            if m == TARGET:
                current.append(int(t))
            elif current:
                runs.append(current)
                current = []
        if current:
            runs.append(current)
        answers = [m["content"].strip() + end for m in messages if m["role"] == "assistant"]
        assert [tok.decode(r, skip_special_tokens=False) for r in runs] == answers
        record, _ = _record(tok, messages, _config(train_on="all"))
        assert min(record) >= 0 and pack_records([record])[1].dtype == np.bool_


def test_answers_are_never_cut(tokenizers):
    """A record is cut after its last answer that fits whole; with none that fits, or no answer, it is unusable
    and counted."""
    _, tok, _ = tokenizers
    two = CHATS[1]
    whole, _ = _record(tok, two, _config())
    targets = {i for i, t in enumerate(whole) if t >= 0}
    first_end = min(i for i in targets if i + 1 not in targets)  # the first answer's last token
    assert first_end + 1 < len(whole)
    record, counts = _record(tok, two, _config(max_length=len(whole) - 1))
    assert record == whole[:first_end + 1] and counts["truncated"] == 1
    record, counts = _record(tok, two, _config(max_length=first_end))
    assert record is None and counts["answer_cut"] == 1
    record, counts = _record(tok, [{"role": "user", "content": "Hello?"}], _config())
    assert record is None and counts["without_answer"] == 1


def test_a_template_whose_beginning_is_not_a_prefix_is_refused(tmp_path):
    path = _folder(tmp_path, "chatml")
    config = json.loads(open(os.path.join(path, "tokenizer_config.json")).read())
    config["chat_template"] = "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with open(os.path.join(path, "tokenizer_config.json"), "w") as fh:
        json.dump(config, fh)
    tok = Tokenizer.from_folder(path)
    with pytest.raises(InputError, match=r"answers cannot be located; set data.train_on = \"all\""):
        render_chat(tok, CHATS[0])
    assert render_chat(tok, CHATS[0], spans=False)[1] == ()


@pytest.mark.slow
def test_smollm2_chat_records_equal_transformers_gguf_ids():
    """The embedded SmolLM2: our chat records' ids equal transformers' apply_chat_template on the GGUF tokenizer
    (an empty system message in place of SmolLM2's default), and the targets decode to the answers."""
    pytest.importorskip("gguf")
    transformers = pytest.importorskip("transformers")
    from snapaudit_jax.models import default_model_path, load_tokenizer

    try:
        path = default_model_path("smollm2")
    except InputError as err:
        pytest.skip(str(err))
    hf = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    tok = load_tokenizer("smollm2")
    for messages in CHATS:  # no digits: see test_smollm2_tokenizer_splits_digits_like_llama_cpp
        record, _ = _record(tok, messages, _config())
        expected = messages if messages[0]["role"] == "system" else [{"role": "system", "content": ""}] + messages
        assert [t if t >= 0 else -1 - t for t in record] == _hf_ids(hf, expected)
        targets = [t for t in record if t >= 0]
        answers = "".join(m["content"] + "<|im_end|>\n" for m in messages if m["role"] == "assistant")
        assert tok.decode(targets, skip_special_tokens=False) == answers


@pytest.mark.slow
def test_a_chat_dataset_trains_on_its_answers_end_to_end(tmp_path, capsys):
    """snapaudit finetune on chat records: the plan and the card count the records left out (one without an
    answer, one whose answer does not fit), the held-out loss counts answer tokens only (its target count is the
    hand count of the held-out answers' tokens), and the private model trains."""
    from snapaudit_jax.cli import main
    from snapaudit_jax.finetune.config import load_finetune_config
    from snapaudit_jax.finetune.run import prepare
    from tests.helpers.tiny_llm import make_tiny_llm_folder

    rows = [{"messages": [{"role": "user", "content": f"What does note {i} say?"},
                          {"role": "assistant", "content": f"Note {i} says the clinic opens early."}]}
            for i in range(40)]
    rows.append({"messages": [{"role": "user", "content": "No answer here."}]})
    rows.append({"messages": [{"role": "user", "content": "Long?"},
                              {"role": "assistant", "content": " ".join(["very long answer"] * 40)}]})
    model = make_tiny_llm_folder(str(tmp_path / "model"), [m["content"] for r in rows for m in r["messages"]],
                                 vocab_size=300)
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[run]\nseed = 1\nbaseline = false\neval_batch_size = 8\n[data]\npath = "{data}"\n'
        'messages_field = "messages"\nmax_length = 80\nheld_out_fraction = 0.2\n'
        f'[model]\nbase = "{model}"\n[finetune]\nmethod = "lora"\nrank = 2\nsteps = 2\nbatch_size = 4\n'
        '[privacy]\nnoise_multiplier = 1.0\ntarget_epsilon = 0.0\n[canaries]\nn_canaries = 0\n[export]\nhf = false\n')
    prep = prepare(load_finetune_config(str(cfg)))
    stats = prep.data.stats
    assert stats["records_without_answer"] == 1 and stats["records_answer_cut"] == 1
    assert stats["train_records"] + stats["held_out_records"] == 40 and stats["train_on"] == "assistant turns"
    tokens, mask = prep.held_out
    assert mask.dtype == np.int8
    hand = sum(len([t for t in r if t >= 0]) for r in prep.data.held_out)  # every answer token is a target
    assert int((mask == TARGET).sum()) == hand
    assert main(["finetune", str(cfg), "--plan"]) == 0
    assert "1 without an answer, 1 whose first answer does not fit 80 tokens" in capsys.readouterr().out
    out = tmp_path / "run"
    assert main(["finetune", str(cfg), "--out", str(out), "--quiet"]) == 0
    card = json.loads((out / "report.json").read_text())
    assert card["data"]["records_answer_cut"] == 1 and card["claim"]["dp"]
    assert card["models"]["private"]["held_out_loss"] is not None
    ev = json.loads((out / "evaluations" / "private.json").read_text())
    assert ev["held_out"]["num_targets"] == hand  # answer tokens only: the first token of each is predicted too
    assert "| tokens trained on | assistant turns |" in (out / "report.md").read_text()
