"""Tests for snapaudit_jax.utils.memory: where the limit comes from and where the refusal starts."""

from __future__ import annotations

import os

import pytest

from snapaudit_jax.utils import memory
from snapaudit_jax.utils.errors import InputError


def _files(tmp_path, meminfo: str | None, cgroup: tuple[str, str] | None):
    info = tmp_path / "meminfo"
    if meminfo is not None:
        info.write_text(meminfo)
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    if cgroup is not None:
        limit.write_text(cgroup[0])
        usage.write_text(cgroup[1])
    return str(info), ((str(limit), str(usage)),)


@pytest.mark.parametrize("meminfo,cgroup,expected", [
    ("MemTotal: 4000 kB\nMemAvailable:    1000 kB\n", None, 1000 * 1024),  # MemAvailable, in kB
    ("MemAvailable: 1000 kB\n", ("600000", "100000"), 500000),  # a smaller cgroup share wins
    ("MemAvailable: 1000 kB\n", ("max", "100000"), 1000 * 1024),  # "max": no cgroup limit
    ("MemAvailable: 1000 kB\n", ("99999999999", "0"), 1000 * 1024),  # a larger cgroup limit does not raise it
    ("MemAvailable: 1000 kB\n", ("100", "400"), 0),  # over its limit: nothing left
])
def test_available_bytes_reads_meminfo_and_the_cgroup(tmp_path, monkeypatch, meminfo, cgroup, expected):
    info, groups = _files(tmp_path, meminfo, cgroup)
    monkeypatch.setattr(memory, "_MEMINFO", info)
    monkeypatch.setattr(memory, "_CGROUP_FILES", groups)
    assert memory.available_bytes() == expected


def test_available_bytes_falls_back_to_physical_pages(tmp_path, monkeypatch):
    info, groups = _files(tmp_path, None, None)
    monkeypatch.setattr(memory, "_MEMINFO", info)
    monkeypatch.setattr(memory, "_CGROUP_FILES", groups)
    assert memory.available_bytes() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") > 0


def test_the_machine_reports_a_plausible_amount():
    assert 2**20 < memory.available_bytes() <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_check_fits_refuses_exactly_above_the_limit_with_the_estimate_and_the_limit(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 3 * 2**30)
    memory.check_fits("audit.snapshots", 3 * 2**30, "the snapshots")  # exactly the limit: fits
    with pytest.raises(InputError) as err:
        memory.check_fits("audit.snapshots", 3 * 2**30 + 1, "the snapshots")
    assert str(err.value) == ("audit.snapshots: the snapshots would need at least 3.0 GiB of memory, but this machine "
                              "has 3.0 GiB available; lower it")
    monkeypatch.setattr(memory, "available_bytes", lambda: None)  # the platform does not say: nothing is refused
    memory.check_fits("audit.snapshots", 10**30, "the snapshots")


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
                                    (5 * 2**40, "5.0 TiB"), (2**70, "1024.0 EiB")])
def test_format_bytes(n, text):
    assert memory.format_bytes(n) == text
