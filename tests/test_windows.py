"""How a campaign's jobs fill runs of a fixed length (`lab.campaigns.windows`): pure functions on literal
estimates."""

from dataclasses import dataclass

from lab.campaigns import windows
from lab.measure import blocks


@dataclass
class E:
    seconds: float
    least: float | None = None
    again: float = 0.0
    step: float = 0.0


def test_jobs_that_fit_whole_go_first_each_group_in_its_order():
    estimates = {"long": E(900, 100), "short": E(60), "other": E(700, 100), "mid": E(300)}
    assert windows.first_whole(["long", "short", "other", "mid"], estimates, 480) == ["short", "mid", "long", "other"]
    # those past their design's most go last, whatever they take
    assert windows.first_whole(["long", "short", "other", "mid"], estimates, 480, last={"short"}) == [
        "mid", "long", "other", "short"]


def test_one_run_starts_each_job_on_the_worker_free_first():
    estimates = {"a": E(70), "b": E(50), "c": E(200, least=30), "d": E(40), "e": E(500, least=10)}
    starts = windows.one_run(["a", "b", "c", "d", "e"], estimates, 100, workers=2)
    assert [(s.job, s.how, s.worker, s.at) for s in starts] == [
        ("a", "whole", 0, 0.0),  # 0-70 on the first worker
        ("b", "whole", 1, 0.0),  # 0-50 on the second
        ("c", "not", -1, 50.0),  # 50 s left there: its 30 s and the 60 s spare do not fit
        ("d", "whole", 1, 50.0),  # 50-90
        ("e", "not", -1, 70.0),  # 30 s left on the first worker
    ]
    starts = windows.one_run(["c", "a"], estimates, 100)  # alone, it starts, stops at the limit, and takes the run
    assert [(s.job, s.how) for s in starts] == [("c", "part"), ("a", "not")]


def test_runs_needed_counts_each_run_going_on_with_its_set_up_again():
    """A job of 250 s whose shortest useful run is 40 s and whose set-up, 20 s, each run going on repeats; a job of
    50 s that must fit whole; in runs of 100 s on one worker. Run 1: the short job (it fits whole, so it goes first),
    then 50 s left, too few for the long one's 40 s and the 60 s spare. Then the long one: 70 s of work a run (it
    stops 30 s before the limit), 50 net of its set-up again."""
    estimates = {"long": E(250, least=40, again=20), "short": E(50)}
    runs = windows.runs_needed(["long", "short"], estimates, 100)
    # long: 250 -> 200 -> 150 -> 100 (three runs stopped at the limit, each 70 s done and 20 s again), then whole
    assert (runs.runs, runs.stopped, runs.again_s, runs.never, runs.capped) == (5, 3, 60.0, [], False)
    assert windows.STOP_S == blocks.DEADLINE_MARGIN_S  # where `lab ab` ends its blocks before the limit


def test_a_job_that_cannot_start_in_such_a_run_is_counted_apart():
    estimates = {"big": E(1000, least=90, again=30), "whole": E(120), "ok": E(80)}
    runs = windows.runs_needed(["big", "whole", "ok"], estimates, 100)
    # `big`: 90 s and the 60 s spare pass 100; `whole`: 120 s and nothing kept at a limit
    assert runs.never == ["big", "whole"] and runs.runs == 1 and runs.stopped == 0


def test_a_run_that_would_only_repeat_its_set_up_never_gets_further():
    """A job whose shortest useful run fits, but whose set-up again takes all a run gives it, would go on forever:
    it is counted apart, as one that starts but gets no further in such a run."""
    runs = windows.runs_needed(["stuck"], {"stuck": E(1000, least=10, again=80)}, 100)
    assert runs.stuck == ["stuck"] and runs.never == [] and runs.stopped == 0 and not runs.capped


def test_a_run_keeps_whole_blocks_only():
    """An A/B stops before a block that would end past the limit, and a run going on starts only where its set-up
    again and a block fit with the spare. In runs of 200 s a job keeps 170 s of work (it stops 30 s before), 150 s
    after its set-up of 20 s again: its first run all of it (its profiles), each later one as many 80 s blocks as
    fit, one; with 130 s blocks, set-up, block and spare pass 200 s, and it gets no further than its first run
    (Qwen-Image's compiled group-offload cells of one fix: 5 minutes of set-up, then 200 s blocks, in 8-minute runs)."""
    runs = windows.runs_needed(["a"], {"a": E(560, least=40, again=20)}, 200)
    assert (runs.runs, runs.stopped, runs.stuck) == (4, 3, [])  # 560 -> 410 -> 260 -> 110, then whole
    runs = windows.runs_needed(["a"], {"a": E(560, least=40, again=20, step=80)}, 200)
    assert (runs.runs, runs.stopped, runs.stuck) == (5, 4, [])  # 560 -> 410 -> 330 -> 250 -> 170, then whole
    runs = windows.runs_needed(["a"], {"a": E(560, least=40, again=20, step=130)}, 200)
    assert runs.stuck == ["a"] and runs.stopped == 0 and runs.runs == 1, runs
