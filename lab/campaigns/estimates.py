"""What a campaign's job will take: its seconds, what the figure rests on, and what a run under a time limit keeps.

Pure: `estimate` reads no file. It is given what was measured before (`lab.campaigns.measured.Measured`: the A/B
results at the job's setting, the run logs, a calibration's or a history's own result), which the caller reads
(`measured.read`) and a test writes out by hand. An A/B job is planned from the A/B results at its setting (their
phase times and their control arms' calls), each cell from its own result where it has one, else from one over some
of its fixes; any other job from the run logs; else from a stated guess (`GUESS`)."""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, NamedTuple

from lab.base.units import parse_duration
from lab.campaigns.cells import Cell, Job, device_of
from lab.campaigns.measured import (Measured, base_of, blocks_to_go_on_from, call_s, calls_per_block, changed_beyond,
                                    of_cell, part_of, unrun_in)
from lab.results.going_on import kept_verification
from lab.results.states import RESUMABLE
from lab.verdicts import stats

#: what a cell costs beyond its timing blocks when nothing measured says better (seconds)
GUESS = {"build": {"full": 60.0, "tiny": 5.0, "pretrained": 120.0}, "compile": 90.0, "block": 60.0,
         "cell": {"full": 300.0, "tiny": 30.0, "pretrained": 300.0}}
#: plain calls one profiled call is planned at where no profile's time was measured: the profiler slows a call
PROFILER_SLOWDOWN = 3
#: calls a run makes before its first profile or block (warm-up and verification) where none was measured
SETUP_CALLS = 4
#: a test arm whose calls are within this share of its control's: the two arms run alike (`_arms_alike`)
ALIKE = 0.1


@dataclasses.dataclass(frozen=True)
class Estimate:
    seconds: float
    basis: str  # what the figure rests on
    warning: str | None = None  # why the job cannot decide as planned (a budget that buys too few blocks)
    #: seconds of the shortest run that keeps something under a time limit (an A/B's build, checks, profiles and one
    #: block: it stops its blocks before the limit and the next run goes on from them); None: it must fit whole
    least: float | None = None
    unit: str = "block"  # what such a run stops before the limit and keeps: an A/B's blocks, a calibration's trials
    #: seconds a run that goes on from one stopped at a limit spends again before it gets further: its build, and an
    #: A/B's set-up (its profiles and blocks are kept), `lab.campaigns.windows`
    again: float = 0.0
    #: seconds of what such a run keeps whole or not at all: an A/B's block (its first cell's); 0: any time counts
    step: float = 0.0
    #: seconds where each cell planned from a result that decided a change (`_expected_blocks`) stops at that
    #: result's blocks rather than at its design's most; None where no cell of the job is
    expected: float | None = None


def estimate(job: Job, measured: Measured, resume: bool = False, device: str | None = None) -> Estimate:
    """Seconds `job` will take, from what was `measured` before (the module's docstring). A cell's own `minutes` is
    its whole; an A/B measured before still says what its shortest useful run takes (`Estimate.least`). With `resume`
    (`lab ab --resume`), an A/B that stopped undecided goes on from its blocks and keeps its profiles: only the
    blocks it has left and its set-up count. With the `device` it will run on (`h100`), a cell's own result is the
    one measured there, the only one a run can go on from; without, the newest of any device."""
    first = job.cells[0]
    own = (Estimate(60.0 * first.option("minutes") * len(job.cells), "the campaign file's own estimate")
           if first.option("minutes") else None)
    if first.kind != "ab":
        return _other_kind(job, measured, own)
    seen = list(measured.at_setting)
    build = GUESS["build"].get(first.size, 60.0) + (_compile_s(measured) if first.mode == "compile" else 0.0)
    # a compiled job with nothing compiled measured at its setting: the eager calls of that setting, an upper bound
    # where compiling shortens the forwards and, in the offload settings, about the call (the copies, not the
    # forwards, set it)
    eager = not seen and first.mode == "compile" and bool(seen := list(measured.eager))
    if own and not seen:
        return own
    if not seen:
        return _unmeasured(job, measured, build)
    return _from_results(job, seen, build, eager, own, measured, resume, device)


def _other_kind(job: Job, measured: Measured, own: Estimate | None) -> Estimate:
    """A job of another kind than `lab ab`: the file's own `minutes` (with a calibration's or a history's shortest
    useful run from its own result), else the run logs, else a guess."""
    first = job.cells[0]
    again = GUESS["build"].get(first.size, 60.0)
    if first.kind == "calibrate" and own:
        return dataclasses.replace(own, least=_one_trial(first, measured.own), unit="trial", again=again)
    if first.kind == "history" and own:
        return dataclasses.replace(own, least=_one_release(first, measured.own), unit="release", again=again)
    if own:
        return own
    same, same_setting, alike = _logged_seconds(job, measured.log)
    if same or alike:
        kind = f"other {first.kind} jobs of {first.pipeline} {first.mode}"
        seconds, basis = ((same, "this job") if same else
                          (same_setting, f"{kind} in {first.option('setting').partition(':')[0]}") if same_setting
                          else (alike, kind))
        return Estimate(stats.median(seconds),
                        f"{basis} took {stats.median(seconds):,.0f} s (median of {len(seconds)} in the run logs)")
    return Estimate(GUESS["cell"][first.size] * len(job.cells), "guess (no estimate for this kind yet)")


def _unmeasured(job: Job, measured: Measured, build: float) -> Estimate:
    """An A/B job with nothing measured at its setting: a guess, whose shortest useful run comes from the calls of
    the same pipeline without the setting where there are some, else from a guessed block."""
    first = job.cells[0]
    guess = Estimate(build + GUESS["cell"][first.size] * len(job.cells), "guess: nothing measured at this setting")
    plain = list(measured.without_setting) if first.option("setting") else []
    if not plain:  # a guessed minute for its set-up and one block: a time limit ends it as by a Ctrl-C
        return dataclasses.replace(guess, least=min(build + GUESS["block"], guess.seconds), again=build)
    # its shortest useful run (a time limit takes the blocks that fit) from the calls of the same pipeline without
    # the setting: the setting may make them slower, which the A/B's own stopping rule then meets. Its set-up, then
    # one profiled pair (each call PROFILER_SLOWDOWN plain ones), else a block
    call = call_s(plain[-1])
    profiled = first.option("profile", True) and first.option("profile_calls", 3)
    least = build + SETUP_CALLS * call + (2 * PROFILER_SLOWDOWN if profiled else calls_per_block(first)) * call
    return dataclasses.replace(guess, least=min(least, guess.seconds), again=build + SETUP_CALLS * call)


def _from_results(job: Job, seen: list, build: float, eager: bool, own: Estimate | None, measured: Measured,
                  resume: bool, device: str | None) -> Estimate:
    """An A/B job from the A/B results `seen` at its setting (`eager`: those of the eager mode, for a compiled job),
    each cell planned on the job's one build (`_cell_plan`)."""
    first = job.cells[0]
    # the newest of those whose control arm runs the same fixes as this job's (its base: a control over an offload
    # fix makes other calls than one without), and of those, one that timed blocks first: a run cut off before its
    # first block keeps only a verification call's time, of which arm it does not say
    alike = [r for r in seen if base_of(r.name) == base_of(first.stem("*"))] or seen
    last = ([r for r in alike if r.timed and r.samples.control.raw_wall_ms] or alike)[-1]
    call = call_s(last)
    if last.build_s:  # (an eager result's build, and a compile's time)
        build = last.build_s + (_compile_s(measured) if eager else 0.0)
    # a cell without a result of its own or of a part is planned as a fix of no effect, both arms at the control's
    # calls, its set-up from a result whose arms ran alike where there is one: the set-up of a result whose test arm
    # ran much faster (or never ran its fix) says little of another fix's
    even = [r for r in alike if _arms_alike(r) and None not in _setup_phases(r)]
    cells = [_cell_plan(cell, seen, device, call, resume, (even or [last])[-1]) for cell in job.cells]
    lead = cells[0]
    # the shortest useful run: with profiles to take, its first profiled pair (a time limit takes no more pairs than
    # fit, and a run cut off after them keeps them for the next, `lab ab --resume`); else one block, which a cell
    # whose fixes never ran does without (its check of the outputs settles it)
    least = build + lead.setup + (min(lead.profiles, lead.pair_s) if lead.profiles else 0.0 if lead.unrun else
                                  lead.block_s)
    # a reason that several cells share is said once, with how many (the cells of one fix in one setting often share
    # one)
    short = collections.Counter(c.warning for c in cells if c.warning)
    warning = "; ".join(w if n == 1 else f"{n} cells: {w}" for w, n in short.items()) or None
    again = build + lead.setup_again
    if own:
        return dataclasses.replace(own, least=min(least, own.seconds), again=again, step=lead.block_s)
    seconds = build + sum(c.setup + c.profiles + c.blocks * c.block_s for c in cells)
    expected = (build + sum(c.setup + c.profiles + (c.blocks if c.expected is None else c.expected) * c.block_s
                            for c in cells) if any(c.expected is not None for c in cells) else None)
    return Estimate(seconds, _basis(first, lead, last, call, eager), warning and f"{job.id}: {warning}", least,
                    again=again, step=lead.block_s, expected=expected)


def _basis(first: Cell, lead: _CellPlan, last, call: float, eager: bool) -> str:
    """What the estimate of a job led by `first` rests on, in words."""
    borrowed = " (eager: nothing compiled measured at this setting)" if eager else ""
    mine, part, done, block_s, blocks = lead.own, lead.part, lead.done, lead.block_s, lead.blocks
    whose = "this cell on another GPU" if part is not None and of_cell(part, first) else "over some of its fixes"
    return (f"this cell's {done} blocks so far, {block_s:,.0f} s each; at most {blocks} more" if done else
            f"{block_s:,.0f} s blocks measured in {mine.name}; at most {blocks} blocks" if mine and mine.block_s else
            f"{block_s:,.0f} s blocks from {part.name}, {whose}, at {call * 1e3:,.0f} ms control "
            f"calls (its own: {call_s(part) * 1e3:,.0f} ms); at most {blocks} blocks" if part else
            f"{block_s:,.0f} s blocks measured in {mine.name}; at most {blocks} blocks" if mine else
            f"{call * 1e3:,.0f} ms calls measured in {last.name}{borrowed}; at most {blocks} blocks per cell")


def _compile_s(measured: Measured) -> float:
    """Seconds compiling adds to a compiled job's first calls, where nothing compiled at its setting says (it is
    planned from eager results, or guessed): the most that any compiled A/B of its pipeline recorded, else a guess.
    Regional compile is quick: a recorded compile time beats the guess, which is long enough to keep a compiled job
    from starting in a lent call it would fit."""
    return max(measured.compile_s, default=GUESS["compile"])


def _logged_seconds(job: Job, log) -> tuple[list[float], list[float], list[float]]:
    """How long this job took where it finished before (the run-log entries `log`), how long the jobs of the same
    kind, pipeline and mode took in the same setting with other options (group offloading with and without
    `record_stream`, say), and how long they took in any other setting, depth or fix set."""
    from lab.run import settings

    first = job.cells[0]
    prefix = f"{first.kind}-{first.pipeline}-{first.mode}-"
    setting = first.option("setting")
    named = f"-{settings.parse(setting).name}-" if setting else None  # as the job ids tag it
    same, same_setting, alike = [], [], []
    for entry in log:
        name, seconds = str(entry.get("job", "")), entry.get("seconds")
        if entry.get("exit") != 0 or not isinstance(seconds, (int, float)):
            continue
        if name == job.id:
            same.append(float(seconds))
        elif name.startswith(prefix):
            (same_setting if named and named in name else alike).append(float(seconds))
    return same, same_setting, same_setting + alike


def _one_trial(cell: Cell, calibration) -> float | None:
    """Seconds of a calibration's shortest useful run: its build and its longest trial so far, from its own result
    (`lab calibrate` keeps each trial as it ends and starts none that would end past a time limit); None where no
    trial was measured, and it must fit whole."""
    trials = calibration.trials if calibration is not None else None
    seconds = [t.seconds for t in (trials.aa + trials.positive if trials else []) if t.seconds]
    if not seconds:
        return None
    return GUESS["build"].get(cell.size, 60.0) + max(seconds)


def _one_release(cell: Cell, history) -> float | None:
    """Seconds of a history's shortest useful run: its build and one release's pair, the mean of its own result's
    (`lab history` keeps each pair as it ends and starts none that would end past a time limit); None where no pair
    was measured, and it must fit whole."""
    pairs = [r for r in (history.releases if history else []) if r.status == "measured"]
    if not pairs or not history.seconds:
        return None
    return GUESS["build"].get(cell.size, 60.0) + history.seconds / len(pairs)


def _part_of(cell: Cell, results: list, device: str | None):
    """The newest of `results` (same pipeline, mode, size and setting) that timed blocks over the same base with
    some of `cell`'s fixes and no other (on `device` first): its control arm is the cell's, and its test arm runs
    the cell's less some fixes, which mostly shorten a call or leave it as it was where they were measured, so its
    set-up and block times estimate the cell's far better than its control's calls do where a fix takes most of the
    call. A part may have run on another host, whose control calls took another time: `_cell_times` scales a part's
    times to the control's calls. Of several, the one whose blocks are shortest for its control's calls: it holds
    the most of the cell's change, and the plan does not change with which part was measured last. An estimate, not
    a bound. None for a cell of a change, or without such a result."""
    if cell._what():
        return None
    parts = [r for r in results if r.timed and r.block_s and part_of(r, cell)]
    # first, the cell itself on another GPU (a run cannot go on from its blocks there): its test arm is the cell's,
    # whole, where a part lacks the fixes that change the call the most (its own name but the GPU's: a compiled cell
    # planned from eager results has none of its own among them)
    elsewhere = [r for r in results if r.timed and r.block_s and of_cell(r, cell)
                 and device is not None and device_of(r.name) != device]
    if elsewhere:
        return elsewhere[-1]
    here = [r for r in parts if device is None or device_of(r.name) == device] or parts
    # the shortest blocks per control call; of equal ones, the newest
    return min(reversed(here), key=lambda r: stats.median(r.block_s) / call_s(r), default=None)


def _arms_alike(result) -> bool:
    """Whether an A/B result's two arms took about the same time (its test arm's calls within `ALIKE` of its
    control's), or, with no block timed, none of its fixes ran."""
    if result.timed and result.samples.test.raw_wall_ms:
        return abs(call_s(result, arm="test") / call_s(result) - 1) <= ALIKE
    ran = result.verify.exercised if result.verify else {}
    return bool(ran) and not any(ran.values())


class _CellPlan(NamedTuple):
    own: Any  # the cell's own result (on the job's GPU, where given), None without one
    part: Any  # without blocks of its own: its result on another GPU, or one over some of its fixes (`_part_of`)
    done: int  # blocks a run with `--resume` goes on from
    setup: float  # this run's warm-up and verification
    setup_again: float  # a later run's, going on from this one's blocks: compiled, it may keep the verification
    pair_s: float
    profiles: float
    block_s: float
    blocks: int  # blocks this run times, within its design and budget
    warning: str | None
    unrun: bool = False  # no fix of the cell ran at its setting: it settles as not exercised, at one block at most
    expected: int | None = None  # the blocks it is expected to stop at (`_expected_blocks`), None where not known


def _cell_plan(cell: Cell, seen: list, device: str | None, call: float, resume: bool, alike=None) -> _CellPlan:
    """What one A/B cell of a job will take (`_cell_times`, `_blocks_and_warning`): from its own result, where it has
    one, on `device` (a run goes on only from blocks measured there), each cell of a job from its own (a cell planned
    afresh beside its own undecided blocks would be warned of a budget its blocks so far already answer). `alike`:
    the result at the same setting that `call` comes from, whose set-up and profiles say what a cell with no result
    of its own or of some of its fixes takes for them."""
    own = ([r for r in seen if of_cell(r, cell) and (device is None or device_of(r.name) == device)] or [None])[-1]
    part = _part_of(cell, seen, device) if not (own and own.block_s) else None
    done = blocks_to_go_on_from(own) if resume else 0
    profiled = ([r for r in seen if _pair_s(r) is not None] or [None])[-1]
    setup, setup_again, pair_s, profiles, block_s = _cell_times(cell, own, part, call, resume, alike, profiled)
    blocks, warning = _blocks_and_warning(cell, block_s, done)
    unrun = own is None and not cell.base and unrun_in(cell, seen) is not None
    if unrun:  # it settles as not exercised (`never_ran`): one block and no profiles (`lab.measure.ab.run`)
        blocks, warning, profiles = min(blocks, 1), None, 0.0
    expected = None if unrun or own is not None else _expected_blocks(cell, part, blocks)
    return _CellPlan(own, part, done, setup, setup_again, pair_s, profiles, block_s, blocks, warning, unrun, expected)


def _expected_blocks(cell: Cell, part, blocks: int) -> int | None:
    """The blocks a cell without a result of its own is expected to stop at where the result it is planned from
    (`_part_of`: the cell on another GPU, or some of its fixes and no other at its setting) decided a change larger
    than the cell's margin: as many as that result took (at least the cell's first look, at most `blocks`). Its fixes
    hold that change, so its sequential design is unlikely to need more blocks to find it than the part did (its
    other fixes would have to undo it); the plan counts sequential cells at their design's most all the same, and says
    this beside it. None for a cell of a fixed number of blocks, or where no such result is known."""
    if part is None or cell.option("blocks") or not changed_beyond(part, cell.option("margin", 0.01)):
        return None
    return min(blocks, max(part.stats.n, cell.option("min_blocks", 6)))


def _pair_s(result) -> float | None:
    """Seconds one profiled pair of an A/B result took, with its share of the traces' analysis: the profiles' own time
    (kept with them), else the phase of the run that took them; None where neither was recorded (a run going on
    from another's profiles before they kept their time)."""
    profile = result.profile or {}
    took = profile.get("seconds", (result.phase_s or {}).get("profile"))
    return took / profile["calls"] if took is not None and profile.get("calls") else None


def _cell_times(cell: Cell, mine, part, call: float, resume: bool, alike=None,
                profiled=None) -> tuple[float, float, float, float, float]:
    """Seconds of an A/B cell's set-up (warm-up and verification) in this run and in a later one going on from its
    blocks, of one profiled pair, of all its profiles and of one block: from its own result (`mine`), else from its
    result on another GPU or one over some of its fixes (`part`), else, for the set-up and the profiles, from
    `alike` (another fix at the same setting: what the profiler adds to a call is the setting's, little in group
    offloading and several times the call in the cache and LoRA settings), else from `call`, one control call,
    which the profiler slows `PROFILER_SLOWDOWN` times. Where the result the times come from kept no profiles'
    time, the pair's is `profiled`'s (the newest at the same setting that kept one: a guessed pair can keep a cell
    from starting in a lent call its measured pairs fit). A part may have run its control's calls at another speed
    than this cell's will (another host's copies, a drift): its times, `alike`'s and `profiled`'s, scale by `call`
    over its control's calls. A run going on from an undecided result keeps its profiles (it may have stopped in or
    after them, before any block), and compiled, where the result the times come from shows that the warm-up alone
    compiled what the blocks run, its verification (`kept_verification`: verifying again can take as long as a
    block)."""
    scale = call / call_s(part) if part is not None else 1.0
    if mine:
        timed_by, by = mine, 1.0
    elif part is not None:
        timed_by, by = part, scale
    else:
        timed_by, by = alike, call / call_s(alike) if alike is not None else 1.0
    warmup, verify = _setup_phases(timed_by) if timed_by is not None else (None, None)
    setup = by * (warmup + verify) if warmup is not None and verify is not None else SETUP_CALLS * call
    if warmup is not None and cell.mode == "compile" and not timed_by.mode.startswith("compile"):
        # planned from an eager result: compiled, each arm warms up with one more call, and the verification makes
        # one more, counting, call of the test arm (`lab.measure.ab.run`); the compile's own time is in the build's
        # estimate (`_compile_s`). The test arm's calls: the cell's own or its part's test arm's (an offload fix's
        # are several times shorter than its control's), else, from another fix's result, the control's
        test_s = by * call_s(timed_by, arm="test") if mine is not None or part is not None else call
        setup += call + 2 * test_s
    again = by * warmup if warmup is not None and cell.mode == "compile" and kept_verification(timed_by) else setup
    if mine is not None and resume and mine.stopped in RESUMABLE:  # this run goes on from its own blocks
        setup = again
    # the profiles' own time (kept with them), else the phase of the run that took them, else another result's at the
    # setting, else a guess
    pair = _pair_s(timed_by) if timed_by is not None else None
    if pair is not None:
        pair_s = by * pair
    elif profiled is not None:
        pair_s = call / call_s(profiled) * _pair_s(profiled)
    else:
        pair_s = 2 * PROFILER_SLOWDOWN * call
    kept = resume and mine is not None and mine.stopped in RESUMABLE and mine.profile is not None
    profile_calls = cell.option("profile_calls", 3) if cell.option("profile", True) else 0
    profiles = 0.0 if kept else pair_s * profile_calls
    block_s = (stats.median(mine.block_s) if mine and mine.block_s else scale * stats.median(part.block_s) if part
               else calls_per_block(cell) * call)
    return setup, again, pair_s, profiles, block_s


def _setup_phases(result) -> tuple[float | None, float | None]:
    """Seconds an A/B result's warm-up and verification took (None where it did not record them): a run that kept
    its verification from the run before has the verification's time with it, not among its own phases."""
    phases = result.phase_s or {}
    return phases.get("warmup"), phases.get("verify", result.verify.seconds if result.verify else None)


def _blocks_and_warning(cell: Cell, block_s: float, done: int) -> tuple[int, str | None]:
    """How many blocks `cell` times in this run at `block_s` seconds each, having `done` already (its `blocks`, else
    its design's most, within its `budget`), and why that cannot decide as planned, if it cannot."""
    if cell.option("blocks"):
        return cell.option("blocks"), None
    blocks = cell.option("max_blocks", 40) - done
    if not cell.option("budget"):
        return blocks, None
    budget_s = parse_duration(cell.option("budget"))  # it counts the blocks of this run only
    design = stats.sequential_design(cell.option("min_blocks", 6), cell.option("max_blocks", 40),
                                     cell.option("alpha", 0.05))
    return min(blocks, math.ceil(budget_s / block_s)), stats.budget_too_short(budget_s, block_s, design, done)
