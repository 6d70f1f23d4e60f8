"""`lab calibrate` end to end on CPU (tiny Wan): both kinds of trial run, the report says what they found."""

import json

from lab.measure.calibrate import wilson
from tests.test_ab import lab


def test_calibrate_writes_false_positive_rate_and_power(tmp_path):
    args = ("calibrate", "--pipeline", "wan", "--trials", "2", "--blocks", "6", "--repeat", "1", "--warmup", "0",
            "--stall-ms", "5", "--out", str(tmp_path))
    proc = lab(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "wan__eager__tiny__cpu.json").read_text())
    assert r["kind"] == "calibration" and r["aa"]["trials"] == r["positive"]["trials"] == 2
    assert all(len(t["control_ms"]) == 6 for t in r["trials"]["aa"] + r["trials"]["positive"])
    # the positive control ran: a stall at every step of every control call (timed, and lead-in when control went
    # first), none in the A/A trials; checked by count, not by the clock
    steps = r["positive"]["steps"]
    assert all(t["stalls_ran"] >= 6 * steps and t["stalls_ran"] % steps == 0 for t in r["trials"]["positive"])
    assert all(t["stalls_ran"] == 0 for t in r["trials"]["aa"])
    assert "A/A false-positive rate" in (tmp_path / "wan__eager__tiny__cpu.md").read_text()
    again = lab(*args)  # refused before building anything
    assert again.returncode == 2 and "--replace" in again.stderr and "building" not in again.stderr


def test_wilson_interval_on_literal_counts():
    lo, hi = wilson(1, 40)
    assert round(lo, 3) == 0.004 and round(hi, 3) == 0.129  # the committed CPU calibration's row
    assert wilson(0, 0) == (0.0, 1.0)
