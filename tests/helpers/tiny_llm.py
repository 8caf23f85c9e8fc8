"""A tiny random Llama checkpoint folder with a real byte-level BPE tokenizer and a ChatML template.

Built with transformers + tokenizers in the test process (no download): fast to
load and compile, so pipeline mechanics (partitions, caching, resume, reports)
can be tested without the 135M-parameter model.
"""

from __future__ import annotations

import json
import os

CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def make_tiny_llm_folder(path: str, texts: list[str], *, vocab_size: int = 400, seed: int = 0, layers: int = 2) -> str:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(path, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as fh:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML}, fh)
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, rope_theta=1e4,
        tie_word_embeddings=True, eos_token_id=tok.token_to_id("<|im_end|>"), initializer_range=0.2,
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    return path
