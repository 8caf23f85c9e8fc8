"""Tokenizers (Hugging Face ``tokenizers``) and chat templates (jinja2).

* From a checkpoint folder: ``tokenizer.json`` and, if present,
  ``tokenizer_config.json`` (special tokens, ``chat_template``).
* From GGUF metadata: a byte-level BPE rebuilt from ``tokenizer.ggml.tokens``
  and ``merges``, with the pre-tokenizer llama.cpp uses for the file's
  ``tokenizer.ggml.pre`` (``smollm``: digits one by one, then the GPT-2 split),
  control tokens kept whole, and the chat template from
  ``tokenizer.chat_template``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Sequence

from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.files import JSON_MAX_BYTES, read_regular_text

__all__ = ["Tokenizer", "TokenizerError"]


class TokenizerError(InputError):
    """A tokenizer that cannot be built or used."""


# llama.cpp pre-tokenizer families that isolate every digit before the GPT-2 split.
_DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
_GPT2_PRE = ("gpt2", "default", None, "mpt", "olmo", "jais")


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map (Radford et al. 2019)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def _raise_exception(message):
    raise TokenizerError(f"chat template error: {message}")


@functools.lru_cache(maxsize=16)
def _compiled_template(template: str):
    """The compiled jinja2 template of a chat-template source (compiling costs far more than rendering)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(template)
    except jinja2.TemplateError as err:
        raise TokenizerError(f"chat template error: {err}") from None


def _render_template(template: str, messages, add_generation_prompt: bool, **special) -> str:
    import jinja2

    compiled = _compiled_template(template)
    try:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **special)
    except jinja2.TemplateError as err:
        raise TokenizerError(f"chat template error: {err}") from None


@dataclasses.dataclass
class Tokenizer:
    """Text <-> token ids, plus the model's chat template.

    Attributes:
      backend: a ``tokenizers.Tokenizer``.
      bos_id: beginning-of-sequence id, or ``None``.
      eos_ids: end-of-sequence ids (may hold several, or none).
      pad_id: padding id.
      add_bos: prepend BOS when encoding a prompt.
      chat_template: jinja2 source, or ``None``.
      special_tokens: names of special tokens available to the template (``bos_token`` ...), or ``None``.
    """

    backend: object
    bos_id: int | None
    eos_ids: tuple[int, ...]
    pad_id: int
    add_bos: bool = False
    chat_template: str | None = None
    special_tokens: dict | None = None

    # --- construction ---------------------------------------------------
    @classmethod
    def from_folder(cls, folder: str | os.PathLike, *, eos_token_id=None) -> "Tokenizer":
        """The tokenizer of a Hugging Face checkpoint folder.

        Reads ``tokenizer.json`` and, if present, ``tokenizer_config.json`` (special tokens, ``add_bos_token``,
        ``chat_template``; of a list of named templates, the ``default`` one). The pad id is the pad token's, else
        the first end-of-sequence id, else 0.

        Args:
          folder: the checkpoint folder.
          eos_token_id: end-of-sequence id(s) from ``config.json`` (an int or a sequence); ``None``: the
            ``eos_token`` of ``tokenizer_config.json``.

        Returns:
          The :class:`Tokenizer`.

        Raises:
          TokenizerError: ``tokenizer.json`` is missing or unreadable, or ``tokenizer_config.json`` is not valid JSON.
        """
        from tokenizers import Tokenizer as Backend

        folder = os.fspath(folder)
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.lexists(path):
            raise TokenizerError(f"{folder}: no tokenizer.json")
        text = read_regular_text(path, "tokenizer file", TokenizerError, max_bytes=JSON_MAX_BYTES)
        try:
            backend = Backend.from_str(text)
        except Exception as err:
            raise TokenizerError(f"{path}: not a readable tokenizers file ({err})") from None
        config = {}
        config_path = os.path.join(folder, "tokenizer_config.json")
        if os.path.lexists(config_path):
            raw = read_regular_text(config_path, "tokenizer configuration", TokenizerError, max_bytes=JSON_MAX_BYTES)
            try:
                config = json.loads(raw)
            except ValueError as err:
                raise TokenizerError(f"{config_path}: not valid JSON ({err})") from None

        def token(name):
            value = config.get(name)
            if isinstance(value, dict):
                value = value.get("content")
            return value

        def token_id(name):
            text = token(name)
            return None if text is None else backend.token_to_id(text)

        eos = eos_token_id if eos_token_id is not None else token_id("eos_token")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
        pad = token_id("pad_token")
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        special = {name: token(name) for name in ("bos_token", "eos_token", "unk_token", "pad_token") if token(name)}
        return cls(
            backend=backend,
            bos_id=token_id("bos_token"),
            eos_ids=eos_ids,
            pad_id=pad if pad is not None else (eos_ids[0] if eos_ids else 0),
            add_bos=bool(config.get("add_bos_token", False)),
            chat_template=template,
            special_tokens=special,
        )

    @classmethod
    def from_gguf(cls, reader, path: str = "<gguf>") -> "Tokenizer":
        """The tokenizer stored in a GGUF file's metadata (byte-level BPE, see the module docstring).

        Args:
          reader: a ``gguf.GGUFReader`` of the file.
          path: the file name used in error messages.

        Returns:
          The :class:`Tokenizer` (special ids, ``add_bos`` and chat template from ``tokenizer.ggml.*`` and
          ``tokenizer.chat_template``; pad id: the padding token's, else the end-of-sequence id, else 0).

        Raises:
          TokenizerError: a tokenizer model other than ``gpt2``, no tokens or merges, or an unsupported
            pre-tokenizer.
        """
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as Backend

        from snapaudit_jax.models.weights import gguf_field

        kind = gguf_field(reader, "tokenizer.ggml.model")
        if kind != "gpt2":
            raise TokenizerError(f"{path}: GGUF tokenizer model {kind!r} is not supported (gpt2 byte-level BPE)")
        tokens = list(gguf_field(reader, "tokenizer.ggml.tokens", []))
        merges = [tuple(m.split(" ", 1)) for m in gguf_field(reader, "tokenizer.ggml.merges", [])]
        types = list(gguf_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
        if not tokens or not merges:
            raise TokenizerError(f"{path}: GGUF metadata has no tokenizer.ggml.tokens/merges")
        alphabet = set(_byte_alphabet().values())
        vocab = {tok: i for i, tok in enumerate(tokens)}
        backend = Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        pre = gguf_field(reader, "tokenizer.ggml.pre")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre in _DIGIT_SPLIT_PRE:
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"), byte_level]
            )
        elif pre in _GPT2_PRE:
            backend.pre_tokenizer = byte_level
        else:
            raise TokenizerError(
                f"{path}: GGUF pre-tokenizer {pre!r} is not supported ({', '.join(_DIGIT_SPLIT_PRE)}, gpt2)")
        backend.decoder = decoders.ByteLevel()
        # Control tokens (type 3) stay whole; they are written in the byte alphabet.
        control = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types)
                   if ty == 3 and set(t) <= alphabet]
        backend.add_special_tokens(control)
        user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == 4]
        if user:
            backend.add_tokens(user)

        def tid(key):
            value = gguf_field(reader, key)
            return None if value is None else int(value)

        eos, bos = tid("tokenizer.ggml.eos_token_id"), tid("tokenizer.ggml.bos_token_id")
        special = {}
        if bos is not None:
            special["bos_token"] = tokens[bos]
        if eos is not None:
            special["eos_token"] = tokens[eos]
        pad = tid("tokenizer.ggml.padding_token_id")
        return cls(
            backend=backend,
            bos_id=bos,
            eos_ids=() if eos is None else (eos,),
            pad_id=pad if pad is not None else (eos if eos is not None else 0),
            add_bos=bool(gguf_field(reader, "tokenizer.ggml.add_bos_token", False)),
            chat_template=gguf_field(reader, "tokenizer.chat_template"),
            special_tokens=special,
        )

    # --- use ------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Ids of a prompt text, with BOS prepended when ``add_bos`` (no other special tokens added).

        Args:
          text: the text.

        Returns:
          The token ids.
        """
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def encode_continuation(self, text: str) -> list[int]:
        """Ids of ``text`` as a continuation of a prompt (never a BOS).

        Args:
          text: the text.

        Returns:
          The token ids.
        """
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of several prompt texts, as :meth:`encode` for each.

        Args:
          texts: the texts.

        Returns:
          One id list per text.
        """
        out = [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]
        if self.add_bos and self.bos_id is not None:
            out = [[self.bos_id] + ids for ids in out]
        return out

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids.

        Args:
          ids: the token ids.
          skip_special_tokens: leave special tokens (BOS, EOS, control tokens) out of the text.

        Returns:
          The decoded text.
        """
        return self.backend.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """Renders ``messages`` with the model's chat template.

        Args:
          messages: ``{"role", "content"}`` dicts.
          add_generation_prompt: end with the template's opening of an assistant turn.

        Returns:
          The rendered prompt text.

        Raises:
          TokenizerError: no chat template, a malformed message, or a template error (including the template's
            own ``raise_exception``).
        """
        if not self.chat_template:
            raise TokenizerError("this tokenizer has no chat template")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise TokenizerError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r}")
        return _render_template(
            self.chat_template, list(messages), add_generation_prompt, **(self.special_tokens or {}))

    @property
    def vocab_size(self) -> int:
        """Vocabulary size, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)
