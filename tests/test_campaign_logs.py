"""The GPU campaign's helpers: progress bars come out of a log, everything else stays; committed logs are clean."""

import importlib.util

from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("strip_progress", ROOT / "benchmarks" / "strip_progress.py")
strip_progress = importlib.util.module_from_spec(spec)
spec.loader.exec_module(strip_progress)


def test_bars_go_and_the_lines_around_them_stay():
    log = ("warming up both arms (eager) ...\n"
           "\r  0%|          | 0/4 [00:00<?, ?it/s]\r 25%|██▌       | 1/4 [00:00<00:00,  6.19it/s]"
           "\r100%|██████████| 4/4 [00:00<00:00,  7.20it/s]\n"
           "  block 4/8: control 656.78 ms, test 671.55 ms (ratio 1.0225)\n"
           "\r 33%|███▎      | 1/3 [00:15<00:30, 15.06s/it]/opt/x.py:1: UserWarning: kept\n"
           "\n"
           "done part 18")
    assert strip_progress.strip(log) == ("warming up both arms (eager) ...\n"
                                         "  block 4/8: control 656.78 ms, test 671.55 ms (ratio 1.0225)\n"
                                         "/opt/x.py:1: UserWarning: kept\n"
                                         "\n"
                                         "done part 18")


def test_committed_logs_have_no_progress_bars():
    for path in sorted((ROOT / "results" / "logs").glob("**/*.log")):
        text = path.read_text(encoding="utf-8", errors="replace")
        assert strip_progress.strip(text) == text, f"{path.name}: run benchmarks/strip_progress.py on it"
