"""The host's memory as Linux reports it (`lab.base.host_memory`): read from a /proc laid out by hand, and from this
machine's own."""

import sys

import pytest

from lab.base import host_memory


def test_the_figures_come_from_meminfo_and_the_process_status(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "meminfo").write_text("MemTotal:       131072000 kB\nMemFree:         1000 kB\n")
    (tmp_path / "self" / "status").write_text("Name:\tpython\nVmPeak:\t  900 kB\nVmHWM:\t  2000000 kB\nVmRSS:\t 10 kB\n")
    (tmp_path / "self" / "clear_refs").write_text("")
    assert host_memory.total_gb(tmp_path) == pytest.approx(131072000 * 1024 / 1e9)
    assert host_memory.peak_gb(tmp_path) == pytest.approx(2000000 * 1024 / 1e9)
    assert host_memory.reset_peak(tmp_path) and (tmp_path / "self" / "clear_refs").read_text() == "5"


def test_what_cannot_be_read_is_none_not_a_guess(tmp_path):
    assert host_memory.total_gb(tmp_path) is None and host_memory.peak_gb(tmp_path) is None
    assert not host_memory.reset_peak(tmp_path / "absent")
    (tmp_path / "meminfo").write_text("MemTotal: lots\n")
    assert host_memory.total_gb(tmp_path) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the peak is reset through Linux's /proc/self/clear_refs; elsewhere every figure is None, as the "
                    "test above checks")
def test_the_peak_is_reset_to_what_the_process_holds_now():
    held = bytearray(256 * 2**20)  # touched: 256 MiB resident
    held[::4096] = b"x" * len(held[::4096])
    before = host_memory.peak_gb()
    del held
    assert host_memory.reset_peak()
    after = host_memory.peak_gb()
    assert before - after > 0.2  # the 256 MiB given back no longer counts
    assert host_memory.total_gb() > after
