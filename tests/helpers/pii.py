"""The tiny ``snapaudit pii`` configuration shared by the PII experiment tests and the bad-input table.

Sized to train the five models (four variants and the public baseline) in seconds on a CPU: 80 records of
20 people, a 1-layer GPT-2 of width 32, 6 steps, a handful of samples per attack.
"""

from __future__ import annotations

_TINY_PII = """
[run]
seed = 1
n_test = 16
public_records = 60
{variants}
[corpus]
n_records = 80
n_people = 20

[canaries]
n_canaries = 16

[model]
base = "scratch"
method = "full"
n_layer = 1
n_embd = 32
n_head = 2
max_length = 192
vocab_size = 400

[training]
steps = 6
batch_size = 8
learning_rate = 1e-2

[extraction]
n_samples = 8
max_new_tokens = 16

[reconstruction]
n_samples = 4
max_queries = 4

[inference]
n_candidates = 5
max_queries = 4
"""


def tiny_pii_toml(variants: str = "") -> str:
    """The tiny PII experiment as TOML text.

    Args:
      variants: a line for the ``[run]`` table (e.g. ``'variants = ["dp"]'``, or ``"{variants}"`` for a
        template to ``str.format`` later); empty: every variant.

    Returns:
      The TOML text.
    """
    return _TINY_PII.format(variants=variants + "\n" if variants else "")


def tiny_pretrained_pii_toml(base: str, *, method: str = "lora", variants: str = "", run: str = "") -> str:
    """The tiny PII experiment fine-tuning a pretrained ``base`` (no public corpus: the base is the baseline).

    Args:
      base: the base (a model folder, a ``.gguf`` file or ``"smollm2"``).
      method: ``"lora"`` (rank 2 on the family's default projections) or ``"full"``.
      variants: a line for the ``[run]`` table (as :func:`tiny_pii_toml`).
      run: more lines for the ``[run]`` table (e.g. ``"noise_seed = 3"``).

    Returns:
      The TOML text.
    """
    model = f'[model]\nbase = "{base}"\nmethod = "{method}"\n' + ("rank = 2\n" if method == "lora" else "")
    text = tiny_pii_toml(variants).replace("public_records = 60\n", run + "\n" if run else "")
    start, end = text.index("[model]"), text.index("max_length = 192")
    return text[:start] + model + text[end:].replace("vocab_size = 400\n", "")


def write_toml(folder, text: str, name: str = "pii.toml") -> str:
    """Writes ``text`` to ``folder / name``.

    Args:
      folder: a :class:`pathlib.Path` folder (``tmp_path``).
      text: the TOML text.
      name: the file name.

    Returns:
      The file's path as a string.
    """
    path = folder / name
    path.write_text(text)
    return str(path)
