"""Tests for the ``.npz`` header reader of snapaudit_jax.simulation.snapshots: every refusal comes from the zip
directory and the ``.npy`` headers, before any array is decompressed; a legitimate file is read unchanged."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from snapaudit_jax.simulation import snapshots as S
from snapaudit_jax.utils import memory
from snapaudit_jax.utils.errors import InputError
from tests.helpers.bad_input.values import HUGE, claiming_npz, npy_header


@pytest.fixture
def bytes_read(monkeypatch):
    """Counts the decompressed bytes every zip member hands out."""
    count = [0]
    real = zipfile.ZipExtFile.read

    def read(self, n=-1):
        out = real(self, n)
        count[0] += len(out)
        return out

    monkeypatch.setattr(zipfile.ZipExtFile, "read", read)
    return count


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_a_legitimate_file_passes_unchanged(tmp_path, save):
    rng = np.random.default_rng(0)
    arrays = {"with": rng.normal(size=(5, 3)).astype(np.float32), "without": rng.integers(0, 9, (7, 3)),
              "candidates": rng.normal(size=(2, 3)), "target": np.asarray(1), "notes": np.arange(4)}
    save(tmp_path / "s.npz", **arrays)
    headers = S.read_npz_headers(tmp_path / "s.npz")
    assert headers == {k: (v.shape, v.dtype) for k, v in arrays.items()}
    snaps = S.load_snapshots(tmp_path / "s.npz")
    assert np.array_equal(snaps.with_canary, arrays["with"].astype(np.float64))
    assert np.array_equal(snaps.without_canary, arrays["without"]) and snaps.target == 1
    assert snaps.with_canary.dtype == np.float64 and np.array_equal(snaps.candidates, arrays["candidates"])


def test_a_member_claiming_16_tib_is_refused_from_its_header_without_decompressing(tmp_path, bytes_read):
    header = npy_header((HUGE, 2))
    claiming_npz(tmp_path / "s.npz", {"with": (header + bytes(64), len(header) + HUGE * 16),
                                      "without": (npy_header((3, 2)) + bytes(48), len(npy_header((3, 2))) + 48)})
    assert S.read_npz_headers(tmp_path / "s.npz")["with"] == ((HUGE, 2), np.dtype("<f8"))
    bytes_read[0] = 0
    with pytest.raises(InputError) as err:
        S.load_snapshots(tmp_path / "s.npz")
    message = str(err.value)
    assert f"with ({HUGE}, 2) float64" in message and "would need at least 16.0 TiB" in message
    assert "available" in message
    assert bytes_read[0] <= 2 * len(header)  # the two headers, not the data


def test_the_limit_is_the_decompressed_float64_size(tmp_path, monkeypatch):
    """A real 30 x 100 float32 pair (24,000 bytes; with the float64 copies 72,000) is refused by a 71,999-byte
    machine and read by a 72,000-byte one: the header gives the size of what loading allocates."""
    np.savez_compressed(tmp_path / "s.npz", **{"with": np.zeros((30, 100), np.float32),
                                              "without": np.zeros((30, 100), np.float32)})
    monkeypatch.setattr(memory, "available_bytes", lambda: 2 * 30 * 100 * (4 + 8) - 1)
    with pytest.raises(InputError, match="would need at least 70.3 KiB"):
        S.load_snapshots(tmp_path / "s.npz")
    monkeypatch.setattr(memory, "available_bytes", lambda: 2 * 30 * 100 * (4 + 8))
    assert S.load_snapshots(tmp_path / "s.npz").with_canary.shape == (30, 100)


def test_a_header_claiming_more_than_its_entry_holds_is_corrupted(tmp_path, bytes_read):
    header = npy_header((HUGE, 2))
    claiming_npz(tmp_path / "s.npz", {"with": (header + bytes(64), 300), "without": (header, len(header))})
    with pytest.raises(InputError, match=rf"array 'with' claims shape \({HUGE}, 2\) of float64 .* but its zip entry "
                                         "holds 300 bytes"):
        S.read_npz_headers(tmp_path / "s.npz")
    assert bytes_read[0] <= len(header)


@pytest.mark.parametrize("array,needle", [
    (np.ones((3, 2)) * (1 + 1j), "dtype complex128 (complex numbers (the imaginary part would be lost))"),
    (np.full((3, 2), "ab"), "dtype <U2 (non-numeric data)"),
    (np.zeros((3, 2), "datetime64[s]"), "non-numeric data"),
    (np.zeros((3,)), "at least 2 dimension(s), got shape (3,)"),
])
def test_coercions_and_shapes_are_refused_from_the_header(tmp_path, array, needle, bytes_read):
    np.savez(tmp_path / "s.npz", **{"with": array, "without": np.ones((3, 2))})
    bytes_read[0] = 0
    with pytest.raises(InputError) as err:
        S.load_snapshots(tmp_path / "s.npz")
    assert needle in str(err.value) and "s.npz:with" in str(err.value)
    assert bytes_read[0] <= 2 * 128  # the two 128-byte headers only


def test_object_arrays_and_raw_npy_files_are_named(tmp_path):
    np.savez(tmp_path / "o.npz", **{"with": np.array([[1, "a"]], dtype=object), "without": np.ones((1, 2))})
    with pytest.raises(InputError, match="has dtype object: Object arrays cannot be loaded without pickle"):
        S.load_snapshots(tmp_path / "o.npz")
    with open(tmp_path / "raw.npz", "wb") as fh:
        np.save(fh, np.ones((3, 2)))
    with pytest.raises(InputError, match="is not a readable .npz archive: it is a raw .npy array"):
        S.read_npz_headers(tmp_path / "raw.npz")


def test_clean_outputs_beyond_float32_are_refused_by_check_clean():
    S.check_clean("clean_with", [[S.FLOAT32_MAX, 0.0]], mechanism="pv")  # the largest float32 is fine
    with pytest.raises(InputError, match=r"clean_with must be within float32's range .* at index \(0, 1\)"):
        S.check_clean("clean_with", [[0.0, -1e39]], mechanism="pv")
