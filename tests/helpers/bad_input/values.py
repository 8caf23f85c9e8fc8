"""Bad-input cases: values out of range, sizes that cannot fit, silent coercions, odd files
(see :mod:`tests.helpers.bad_input`).

Every case is refused before any work: no model is loaded, nothing is simulated or trained, and the refusal names
the flag or ``section.key``, the rule and the value. Sizes are far beyond any machine (``1e10`` snapshots, a
16 TiB array claimed by a 1 KB ``.npz``), so the memory planner refuses them wherever the suite runs. FIFOs and
symlink loops live in a folder outside ``tmp_path`` (the harness reads every file of ``tmp_path`` to compare the
tree, and would block on a FIFO); a ``with_stack`` case removes it when it ends.
"""

from __future__ import annotations

import io
import json
import os
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np

from tests.helpers.bad_input.common import (
    _LLAMA,
    AUDIT_OK,
    CPA_OK,
    NO_LLM,
    PII_OK,
    Case,
    _config_cmd,
    _cpa,
    _emb,
    _gen,
    _hf_folder,
    _npz,
    _pii,
    _sim,
    _write,
)

HUGE = 2**40  # rows of a claimed array: with 2 float64 columns, 16 TiB


def npy_header(shape: tuple[int, ...], dtype: str = "<f8") -> bytes:
    """The ``.npy`` magic and version-1.0 header of an array of ``shape`` and ``dtype`` (no data)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue()  # the magic string is written with the header


def claiming_npz(path: Path, members: dict[str, tuple[bytes, int]]) -> str:
    """A zip whose members' directory entries claim ``file_size`` bytes but hold only ``data`` (deflated).

    ``members``: ``{key: (data, file_size)}``; ``data`` is what the member decompresses to (an ``.npy`` header and
    perhaps a few bytes of the array), ``file_size`` the uncompressed size the zip directory states (zip64 when it
    exceeds 32 bits). A reader that trusts the directory sees a huge array without decompressing it; one that
    decompressed it would find the stream ending early.
    """
    local, central = b"", b""
    for key, (data, file_size) in members.items():
        packer = zlib.compressobj(9, zlib.DEFLATED, -15)
        body = packer.compress(data) + packer.flush()
        name = f"{key}.npy".encode()
        big = file_size >= 0xFFFFFFFF
        extra = struct.pack("<HHQ", 1, 8, file_size) if big else b""
        size_field = 0xFFFFFFFF if big else file_size
        crc = zlib.crc32(data)
        offset = len(local)
        local += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 8, 0, 0x21, crc, len(body), size_field, len(name),
                             len(extra)) + name + extra + body
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 8, 0, 0x21, crc, len(body), size_field,
                               len(name), len(extra), 0, 0, 0, 0, offset) + name + extra
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), len(local), 0)
    return _write(path, local + central + end)


def _claimed(path: Path, key: str, shape: tuple[int, ...], file_size: int | None = None, dtype: str = "<f8") -> str:
    """A snapshot file with a real small ``without`` and a ``key`` member whose header claims ``shape``."""
    header = npy_header(shape, dtype)
    size = len(header) + int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize if file_size is None \
        else file_size
    small = np.zeros((3, 2))
    return claiming_npz(path, {key: (header + bytes(64), size),
                               "without": (npy_header((3, 2)) + small.tobytes(), len(npy_header((3, 2))) + 48)})


def _raw_npy(path: Path) -> str:
    with open(path, "wb") as fh:  # np.save(path) would append ".npy" to the name
        np.save(fh, np.ones((3, 2)))
    return str(path)


def _outside(stack, make) -> str:
    """``make(folder)`` in a temporary folder outside ``tmp_path``, removed when the case ends."""
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="snapaudit-odd-")))
    return make(folder)


def _fifo(folder: Path, name: str) -> str:
    os.mkfifo(folder / name)
    return str(folder / name)


def _loop(folder: Path, name: str) -> str:
    os.symlink(folder / (name + ".other"), folder / name)
    os.symlink(folder / name, folder / (name + ".other"))
    return str(folder / name)


def _utf16(tmp: Path, command: str, toml: str) -> list[str]:
    path = _write(tmp / "c.toml", toml.encode("utf-16"))
    return [command, path, "--quiet", "--out", str(tmp / "out")]


def _odd_config(command: str, make):
    def build(tmp: Path, stack) -> list[str]:
        return [command, _outside(stack, make), "--quiet", "--out", str(tmp / "out")]

    return build


def _index_folder(tmp: Path, shard: str) -> str:
    """A tiny Llama folder whose weights are sharded, the index naming ``shard`` (a path out of the folder)."""
    folder = Path(_hf_folder(tmp / "hf", _LLAMA))
    (folder / "model.safetensors").rename(tmp / "outside.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"model.embed_tokens.weight": shard, "model.norm.weight": shard}}))
    return str(folder)


def _symlinked_shard(tmp: Path) -> str:
    folder = _index_folder(tmp, "model-00001-of-00001.safetensors")
    os.symlink(tmp / "outside.safetensors", Path(folder) / "model-00001-of-00001.safetensors")
    return folder


LONG_NAME = "r" * 300  # beyond NAME_MAX (255 bytes) of every common file system
SEED_2_64 = str(2**64)

SIMULATE = [
    Case("simulate-epsilon-beyond-analytic-calibration", lambda t: _sim("--mechanism", "pv", "--epsilon", "1e50"),
         ("--epsilon", "1e+50", "no analytic Gaussian calibration", "up to about 1e11")),
    Case("simulate-epsilon-sigma-underflows-float32",
         lambda t: _sim("--mechanism", "pv", "--calibration", "classical", "--epsilon", "1e50"),
         ("--epsilon", "1e+50", "sigma = 6.85", "below float32's smallest normal")),
    Case("simulate-sensitivity-sigma-underflows-float32", lambda t: _sim("--mechanism", "pv", "--sensitivity", "1e-50"),
         ("--sensitivity", "1e-50", "sigma = 3.73", "below float32's smallest normal")),
    Case("simulate-ksa-scale-overflows-float32", lambda t: _sim("--mechanism", "ksa", "--epsilon", "1e300"),
         ("--epsilon", "1e+300", "scale = 2.5e+299", "beyond float32's largest")),
    Case("simulate-poe-scale-underflows-float32", lambda t: _sim("--mechanism", "poe", "--epsilon", "1e-300"),
         ("--epsilon", "1e-300", "scale = 1e-301", "below float32's smallest normal")),
    Case("simulate-clip-scale-overflows-float32", lambda t: _sim("--mechanism", "poe", "--clip", "1e-300"),
         ("--clip", "1e-300", "scale = 5e+299", "beyond float32's largest")),
    Case("simulate-seed-2-63", lambda t: _sim("--mechanism", "pv", "--seed", str(2**63)),
         ("--seed", "[0, 2**63 - 1]", str(2**63))),
    Case("simulate-seed-below-int64", lambda t: _sim("--mechanism", "pv", "--seed", str(-2**63 - 1)),
         ("--seed", "[0, 2**63 - 1]", str(-2**63 - 1))),
    Case("simulate-trials-beyond-int32-indices", lambda t: _sim("--mechanism", "pv", "--trials", "3000000000"),
         ("--trials", "<= 2000000000", "int32", "3000000000")),
    Case("simulate-curve-points-1e9",
         lambda t: _sim("--mechanism", "pv", "--threat", "white", "--curve-points", "1000000000"),
         ("--curve-points", "<= 4001", "1000000000")),
    Case("simulate-snapshots-1e10", lambda t: _sim("--mechanism", "pv", "--snapshots", "10000000000"),
         ("--snapshots", "10000000000 snapshots", "would need at least", "available")),
    Case("simulate-dim-1e10", lambda t: _sim("--mechanism", "esa", "--dim", "10000000000"),
         ("--dim", "dimension 10000000000", "would need at least", "available")),
    Case("simulate-clean-beyond-float32",
         lambda t: _sim("--mechanism", "pv", "--clean-with=1e308,-1e308", "--clean-without=-1e308,1e308"),
         ("--clean-with", "float32's range", "1e+308")),
    Case("simulate-clean-below-float32-resolution",
         lambda t: _sim("--mechanism", "pv", "--clean-with=1e30,1e30", "--clean-without=1e30,1e30"),
         ("--clean-with", "float32 spaces values of magnitude 1e+30", "noise unit", "vanish in rounding")),
    Case("simulate-strict-neighbours",
         lambda t: _sim("--mechanism", "pv", "--clean-with=3,0", "--clean-without=0,3", "--strict-neighbours"),
         ("--clean-with", "4.24264 apart", "sensitivity is 1.41421", "not neighbouring", "strict_neighbours")),
    Case("simulate-snapshot-raw-npy", lambda t: _sim("--mechanism", "pv", "--snapshot", _raw_npy(t / "s.npz")),
         ("--snapshot", "s.npz", "not a readable .npz archive", "raw .npy array")),
    Case("simulate-snapshot-complex",
         lambda t: _sim("--mechanism", "pv", "--snapshot",
                        _npz(t / "s.npz", **{"with": np.ones((3, 2)) * (1 + 2j), "without": np.ones((3, 2))})),
         ("--snapshot", "s.npz:with", "complex128", "imaginary part")),
    Case("simulate-snapshot-strings",
         lambda t: _sim("--mechanism", "pv", "--snapshot",
                        _npz(t / "s.npz", **{"with": np.full((3, 2), "1.5"), "without": np.ones((3, 2))})),
         ("--snapshot", "s.npz:with", "<U3", "non-numeric")),
    Case("simulate-snapshot-claims-16-tib",
         lambda t: _sim("--mechanism", "pv", "--snapshot", _claimed(t / "s.npz", "with", (HUGE, 2))),
         ("--snapshot", "s.npz", f"({HUGE}, 2)", "would need at least 16.0 TiB", "available")),
    Case("simulate-snapshot-claims-4-gb-of-the-wrong-shape",
         lambda t: _sim("--mechanism", "pv", "--snapshot", _claimed(t / "s.npz", "with", (500_000_000,))),
         ("--snapshot", "s.npz:with", "at least 2 dimension", "(500000000,)")),
    Case("simulate-snapshot-header-beyond-its-entry",
         lambda t: _sim("--mechanism", "pv", "--snapshot", _claimed(t / "s.npz", "with", (HUGE, 2), file_size=200)),
         ("--snapshot", "not a readable .npz archive", f"claims shape ({HUGE}, 2)", "zip entry holds 200 bytes")),
    Case("simulate-snapshot-fifo",
         lambda t, stack: _sim("--mechanism", "pv", "--snapshot", _outside(stack, lambda f: _fifo(f, "s.npz"))),
         ("--snapshot", "s.npz", "must be a regular file", "FIFO", "not opened"), with_stack=True),
    Case("simulate-snapshot-symlink-loop",
         lambda t, stack: _sim("--mechanism", "pv", "--snapshot", _outside(stack, lambda f: _loop(f, "s.npz"))),
         ("--snapshot", "s.npz", "symlink loop"), with_stack=True),
    Case("simulate-out-name-too-long",
         lambda t: _sim("--mechanism", "pv", "--out", t / f"{LONG_NAME}.json"),
         ("--out", "at most 255 bytes", "NAME_MAX", "305 bytes")),
]

AUDIT = [
    Case("audit-trials-3e9", _config_cmd("audit", NO_LLM + "[audit]\ntrials = 3000000000\n[pipelines.pv]\n"),
         ("audit.trials", "<= 2000000000", "3000000000")),
    Case("audit-epsilon-1e308", _config_cmd("audit", NO_LLM + "[audit]\nepsilons = [1, 1e308]\n[pipelines.pv]\n"),
         ("audit.epsilons", "32-bit PRNG key", "1e+308")),
    Case("audit-epsilon-beyond-analytic-calibration",
         _config_cmd("audit", NO_LLM + "[audit]\nepsilons = [1e-10]\ndelta = 1e-300\n[pipelines.pv]\n"),
         ("audit.epsilons", "1e-10", "no analytic Gaussian calibration", "pipelines.pv")),
    Case("audit-poe-clip-scale-overflows-float32",
         _config_cmd("audit", NO_LLM + "[pipelines.poe]\nclip = 1e-300\n"),
         ("pipelines.poe.clip", "sensitivity 1e-300", "beyond float32's largest")),
    Case("audit-snapshots-1e12", _config_cmd("audit", NO_LLM + "[audit]\nsnapshots = 1e12\n[pipelines.pv]\n"),
         ("audit.snapshots", "1000000000000 clean outputs", "would need at least", "available")),
    Case("audit-seed-2-64", _config_cmd("audit", NO_LLM + f"[audit]\nseed = {SEED_2_64}\n[pipelines.pv]\n"),
         ("audit.seed", "[0, 2**63 - 1]", SEED_2_64)),
    Case("audit-one-run-seed-2-64", _config_cmd("audit", AUDIT_OK + f"[one_run]\nseed = {SEED_2_64}\n"),
         ("one_run.seed", "[0, 2**63 - 1]", SEED_2_64)),
    Case("audit-num-exemplars-1e9", _config_cmd("audit", NO_LLM + "[pipelines.pv]\nnum_exemplars = 1e9\n"),
         ("pipelines.pv.num_exemplars", "num_exemplars + 1 = 1000000001", "distinct examples")),
    Case("audit-one-run-canaries-beyond-the-codes", _config_cmd("audit", AUDIT_OK + "[one_run]\ncanaries = 5000\n"),
         ("one_run.canaries", "must be <= 4500", "9000 4-digit numbers", "got 5000")),
    Case("audit-one-run-canaries-beyond-the-dataset", _config_cmd("audit", AUDIT_OK + "[one_run]\ncanaries = 4000\n"),
         ("one_run.canaries", "canaries + base_exemplars = 4000 distinct examples are needed")),
    Case("audit-config-utf16", lambda t: _utf16(t, "audit", AUDIT_OK),
         ("c.toml", "must be UTF-8 text", "UTF-16 (little-endian)")),
    Case("audit-config-fifo", _odd_config("audit", lambda f: _fifo(f, "c.toml")),
         ("c.toml", "must be a regular file", "FIFO", "not opened"), with_stack=True),
    Case("audit-config-symlink-loop", _odd_config("audit", lambda f: _loop(f, "c.toml")),
         ("c.toml", "symlink loop"), with_stack=True),
    Case("audit-out-name-too-long", _config_cmd("audit", AUDIT_OK, out=lambda t: str(t / LONG_NAME / "run")),
         ("--out", "at most 255 bytes", "NAME_MAX", "300 bytes")),
]

CPA = [
    Case("cpa-n-people-1e12", _config_cmd("cpa", _cpa("n_people = 50", "n_people = 1e12")),
         ("data.synthetic.n_people", "1000000000000 people", "would need at least", "available")),
    Case("cpa-temperature-1e-308", _config_cmd("cpa", CPA_OK + "temperature = 1e-308\n"),
         ("attackers.r.temperature", "normal float32", "1e-308")),
    Case("cpa-attacker-name-360-characters",
         _config_cmd("cpa", _cpa('[attackers.r]', f'[attackers.{"a" * 360}]')),
         ("attackers.aaaa", "attacker name must be 1 to 64 letters", "(360 chars)")),
    Case("cpa-attacker-name-dot-dot", _config_cmd("cpa", _cpa('[attackers.r]', '[attackers.".."]')),
         ("attackers...", "attacker name must be 1 to 64 letters", "'..'")),
    Case("cpa-seed-2-64", _config_cmd("cpa", _cpa("n_test = 10", f"n_test = 10\nseed = {SEED_2_64}")),
         ("run.seed", "[0, 2**63 - 1]", SEED_2_64)),
    Case("cpa-config-utf16", lambda t: _utf16(t, "cpa", CPA_OK), ("c.toml", "must be UTF-8 text", "UTF-16")),
]

PII = [
    Case("pii-vocab-size-1e12", _config_cmd("pii", _pii("vocab_size = 400", "vocab_size = 1000000000000")),
         ("model", "vocab_size must be <= 2147483647", "int32 token ids", "1000000000000")),
    Case("pii-vocab-size-beyond-memory", _config_cmd("pii", _pii("vocab_size = 400", "vocab_size = 2000000000")),
         ("model.vocab_size", "would need at least", "available")),
    Case("pii-n-records-1e12", _config_cmd("pii", _pii("n_records = 80", "n_records = 1000000000000")),
         ("corpus.n_records", "1000000000000 records", "would need at least", "available")),
    Case("pii-n-layer-1e8", _config_cmd("pii", _pii("n_layer = 1", "n_layer = 100000000")),
         ("model.n_layer", "n_layer 100000000", "would need at least", "available")),
    Case("pii-seed-2-64", _config_cmd("pii", _pii("seed = 1", f"seed = {SEED_2_64}")),
         ("run.seed", "[0, 2**63 - 1]", SEED_2_64)),
    Case("pii-init-seed-2-64",
         _config_cmd("pii", _pii("vocab_size = 400", f"vocab_size = 400\ninit_seed = {SEED_2_64}")),
         ("model", "init_seed", "[0, 2**63 - 1]", SEED_2_64)),
    Case("pii-config-utf16", lambda t: _utf16(t, "pii", PII_OK), ("c.toml", "must be UTF-8 text", "UTF-16")),
]

GENERATE = [
    Case("generate-seed-2-64", lambda t: _gen("/no/such/model", "--temperature", "1", "--seed", SEED_2_64),
         ("--seed", "[0, 2**63 - 1]", SEED_2_64)),
    Case("generate-prompt-invalid-utf8",
         lambda t: ["generate", "--model", "/no/such/model", "--prompt", "caf\udce9 au lait"],
         ("--prompt", "must be valid UTF-8", "byte 0xe9")),
    Case("generate-index-shard-parent-folder", lambda t: _gen(_index_folder(t, "../outside.safetensors")),
         ("--model", "model.safetensors.index.json", "'../outside.safetensors'", "inside the model folder")),
    Case("generate-index-shard-absolute", lambda t: _gen(_index_folder(t, str(t / "outside.safetensors"))),
         ("--model", "model.safetensors.index.json", "outside.safetensors", "no absolute path")),
    Case("generate-index-shard-symlink-out", lambda t: _gen(_symlinked_shard(t)),
         ("--model", "model.safetensors.index.json", "leads outside the model folder", "a symlink")),
]

EMBED = [
    Case("embed-text-invalid-utf8", lambda t: _emb("/no/such/folder", "--text", "ok", "--text", "\udcff\udcfe"),
         ("--text (text 3)", "must be valid UTF-8", "byte 0xff")),
]

CASES: list[Case] = SIMULATE + AUDIT + CPA + PII + GENERATE + EMBED
