"""Which cells of a campaign have a result, and in what state (`lab.results.states.State`): measured, undecided
(going on from its blocks, or at its design's most), owed again (an old build, one pair of processes, a census
without a new fix), failed, or planned (and then, for an A/B, whether its design's blocks can likely decide it)."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from pathlib import Path
from typing import NamedTuple

from lab.base.errors import LabError, UsageError
from lab.base.units import parse_duration
from lab.campaigns.cells import Campaign, Cell, device_of, load
from lab.campaigns.measured import (base_of, calls_per_block, changed_beyond, own_result, part_of, read_log,
                                    resumable_blocks, similar, unrun_in)
from lab.results import store
from lab.results.states import NO_BLOCKS_YET, State
from lab.verdicts import stats
from lab.verdicts.verdict import Verdict


@dataclasses.dataclass(frozen=True)
class Status:
    cell: Cell
    state: State
    verdict: str | None = None
    result: Path | None = None
    detail: str = ""
    #: an undecided A/B whose sequential design ran its most blocks: an answer ("undecided at N blocks") that
    #: `run --redo-undecided` leaves alone (measuring it afresh takes `--again --only`)
    at_limit: bool = False
    #: a planned A/B that would need more blocks than its design's most to find its fixes of no effect, at the call
    #: spread measured at its setting (`no_effect_blocks`): likely to end undecided unless its fixes change the call;
    #: an undecided one whose newest result's estimate and interval need more than that to decide
    past_design: bool = False
    #: a planned A/B that stopped in or after its profiles, before its first block: a run goes on from its profiles
    #: (`lab ab --resume`), as from an undecided one's blocks
    going_on: bool = False
    #: a planned A/B within its design but past its budget if its fixes change nothing: the GPU seconds its further
    #: runs take to find that (the blocks its budget does not buy, at its setting's control calls), which a plan that
    #: counts one budget a cell leaves out
    beyond_budget_s: float = 0.0


#: verdicts that settle a cell although the timing decided nothing about the speed
SETTLED = (Verdict.NOT_EXERCISED, Verdict.OUTPUTS_DIFFER)


class Said(enum.Enum):
    """What a cell's newest result says of the cell (`_read`), which `status` turns into the cell's state."""

    SETTLED = "settled"  # measured: a decision, or an outcome that settles the cell
    UNDECIDED = "undecided"
    ONE_PAIR = "one pair"  # a cross-process design before fresh pairs
    NO_BLOCKS_YET = "no blocks yet"  # an A/B stopped in or after its profiles
    RELEASES_LEFT = "releases left"  # a history stopped before its releases
    ARMS_LEFT = "arms left"  # a census stopped before every arm ran
    TRIALS_LEFT = "trials left"  # a calibration stopped before all its trials
    FAILED = "failed"  # a census that recorded its pipeline's failure
    NEW_FIXES = "new fixes"  # a census without a fix the catalog now applies to its pipeline


class _Read(NamedTuple):
    said: Said
    words: str  # the result's conclusion in words, as the plan shows it
    build: str  # how its pipeline was built (`store.build_of`)
    at_limit: int = 0  # blocks an A/B ran that its sequential design stopped undecided at its most
    detail: str = ""  # a census's error, or the fixes it lacks


def _read(path: Path) -> _Read:
    """What the result at `path` says of its cell."""
    try:
        result = store.read(path)
    except LabError as e:  # a damaged result is the user's to restore or measure again
        raise UsageError(str(e)) from None
    kind = result["kind"] if isinstance(result, dict) else result.kind
    build = store.build_of(result)
    if kind == "sweep":
        settled = all(p.verdict.decided or p.verdict in SETTLED for p in result.points)
        return _Read(Said.SETTLED if settled else Said.UNDECIDED, "decided" if settled else "undecided", build)
    if kind == "ab" and result.process_design == "one pair" and not result.config.one_pair:
        return _Read(Said.ONE_PAIR, State.ONE_PAIR.value, build)  # (`--one-pair` asks for it on purpose)
    if kind == "ab" and result.profiles_only:
        return _Read(Said.NO_BLOCKS_YET, NO_BLOCKS_YET, build)
    if kind == "ab":
        at_limit = len(result.order or []) if result.stopped == "max blocks" else 0
        settled = result.verdict.decided or result.verdict in SETTLED
        return _Read(Said.SETTLED if settled else Said.UNDECIDED, result.verdict_text, build, at_limit)
    if kind == "history":
        left = [r for r in result.releases if r.status == "not reached" or r.interrupted]
        if left:
            return _Read(Said.RELEASES_LEFT,
                         f"interrupted, {len(left)} of {len(result.releases) - 1} releases to go", build)
        if any(r.pairing == "one pair" for r in result.releases) and not result.config.one_pair:
            return _Read(Said.ONE_PAIR, State.ONE_PAIR.value, build)
    if kind == "census" and result.interrupted:
        return _Read(Said.ARMS_LEFT, "interrupted", build)
    if kind == "calibration" and result.interrupted:
        return _Read(Said.TRIALS_LEFT,
                     f"interrupted after {result.aa.trials} of {result.config['trials']} trials", build)
    if kind == "census" and result.error:
        return _Read(Said.FAILED, f"failed: {result.error}", build, detail=result.error)
    if kind == "census" and (missing := _census_lacks(result)):
        return _Read(Said.NEW_FIXES, f"{State.NEW_FIXES}: {', '.join(missing)}", build, detail=", ".join(missing))
    return _Read(Said.SETTLED, "measured", build)  # a hunt, a census or a calibration is done once it exists


def _blocks_by_device(found: list[Path]) -> tuple[str, bool]:
    """Where an undecided A/B's blocks are (`4 blocks on h200, 3 on h100`, newest first): a run goes on only from
    those measured on its own GPU (`lab ab --resume`), so the plan says which machine continues which cell. Then,
    from the newest result's estimate and interval, about how many blocks would decide it, and whether that lies past
    its design's most blocks (the second value): a cell whose effect is small against its calls' spread (a fix of
    milliseconds in a call of seconds) is better left than given device time it cannot use."""
    parts = []
    for path in reversed(found):
        if n := resumable_blocks(path):
            parts.append(f"{n} {'blocks on' if not parts else 'on'} {device_of(path.stem)}")
    to_decide, past = _blocks_to_decide(found[-1])
    return ", ".join(parts) + to_decide, past


def _blocks_to_decide(path: Path) -> tuple[str, bool]:
    """`; about 150 blocks would decide it, past its design's 40`, from the A/B result at `path` (its statistics'
    `blocks_to_decide`: the fixed design that would decide it if its estimate held), and whether that is past its
    design's most; "" where it says none (a sweep's points each have their own)."""
    try:
        s = getattr(store.read(path), "stats", None)
    except LabError:
        return "", False
    if s is None or not s.blocks_to_decide or s.blocks_to_decide <= s.n:
        return "", False
    past = _past_its_design(s)
    where = f", past its design's {s.design['max_blocks']}" if past else ""
    return f"; about {s.blocks_to_decide} blocks would decide it if its estimate held{where}", past


def _past_its_design(s) -> bool:
    """Whether statistics `s` (a sequential design's, undecided) need more blocks to decide than the design allows."""
    most = s.design.get("max_blocks")
    return bool(s.sequential and most and s.blocks_to_decide and s.blocks_to_decide > most)


def past_its_design(cell: Cell, results: Path, device: str | None) -> bool:
    """Whether the undecided A/B result of `cell` on `device` would need more blocks than its design's most to decide,
    if its estimate held: going on from its blocks is likely to end undecided at that limit."""
    if cell.kind != "ab":
        return False
    r = own_result(cell, results, device)
    return r is not None and r.stats is not None and not r.verdict.decided and _past_its_design(r.stats)


def _census_lacks(census) -> list[str]:
    from lab.apply.fix import census_lacks  # reads the installed diffusers: only where a census result is read

    return census_lacks(census)


def old_build_held(results: Path) -> frozenset[str]:
    """The pipelines whose old build (before the lab built as `from_pretrained` + `.to` does) profiled the same as
    the faithful one, by the committed comparison (`benchmarks/faithful_build.py`, `<results>/faithful/
    *__old-build.json`: syncs by site, copies, host reads and launches per step all equal). Their old results still
    count; any other pipeline's old results are to be measured again, including every pipeline never compared."""
    held: set[str] = set()
    for path in sorted((results / "faithful").glob("*__old-build.json")):
        try:
            rows = json.loads(path.read_text())["rows"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a comparison that cannot be read vouches for nothing
        held |= {r["scenario"] for r in rows if isinstance(r, dict) and r.get("differ") == []}
    return frozenset(held)



def status(campaign: Campaign, results: Path, log: list[dict] | None = None) -> list[Status]:
    """Each cell's state from the results that exist and from the campaign's run log (failed jobs)."""
    failed = _failed_jobs(log or [])
    held = old_build_held(results)
    spreads: dict = {}  # the call spread at each setting, read once
    out = []
    for cell in campaign.cells:
        # (a result `lab table` refused and named is left out: the cell is as if it were not measured)
        found = [p for p in cell.results_found(results, campaign.device) if not store.left_out(p)]
        if found and cell.kind == "script":
            out.append(Status(cell, State.MEASURED, "written", found[-1]))
        elif found:
            out.append(_of_result(cell, found, held))
        elif cell.stem("*") in failed:
            out.append(Status(cell, State.FAILED, detail=failed[cell.stem("*")]))
        else:
            out.append(_planned(cell, results, campaign.device, spreads))
    return out


def _failed_jobs(log: list[dict]) -> dict[str, str]:
    """The cells (by `stem("*")`) whose newest job in the run log failed, with why."""
    failed: dict[str, str] = {}
    for entry in log:
        for stem in entry.get("cells", []):
            if entry.get("interrupted"):  # an interrupt is not a failure of the job it interrupted
                failed.pop(stem, None)
            elif entry.get("exit") != 0:
                failed[stem] = entry.get("error") or f"exit code {entry.get('exit')} (log: {entry.get('log')})"
            else:
                failed.pop(stem, None)
    return failed


def _of_result(cell: Cell, found: list[Path], held: frozenset[str]) -> Status:
    """The state of a cell with results (`found`, newest last), from what the newest says (`_read`)."""
    path = found[-1]
    read = _read(path)
    said, words = read.said, read.words
    if read.build == "old" and cell.pipeline not in held:
        return Status(cell, State.OLD_BUILD, words, path, detail="measured on the old build, which profiles "
                      f"{cell.pipeline} differently from the faithful one (results/faithful/)")
    if said is Said.ONE_PAIR:
        return Status(cell, State.ONE_PAIR, words, path, detail="measured with one pair of worker processes for all "
                      "its blocks, the design before fresh pairs (uncalibrated)")
    if said in (Said.RELEASES_LEFT, Said.TRIALS_LEFT):  # owed, gone on from the releases or trials it has
        return Status(cell, State.PLANNED, words, path, detail=f"{words}; `run` goes on from them")
    if said is Said.ARMS_LEFT:  # owed, not failed
        return Status(cell, State.PLANNED, words, path, detail="interrupted before every arm ran; `run` measures it "
                      "again")
    if said is Said.NO_BLOCKS_YET:  # owed, gone on from its profiles
        return Status(cell, State.PLANNED, words, path, detail="stopped before its first block; `run` goes on from "
                      "its profiles", going_on=True)
    if said is Said.FAILED:
        return Status(cell, State.FAILED, result=path, detail=read.detail)
    if said is Said.NEW_FIXES:
        return Status(cell, State.NEW_FIXES, result=path, detail=f"measured before the catalog had {read.detail}")
    if said is Said.SETTLED:
        return Status(cell, State.MEASURED, words, path)
    if read.at_limit:
        return Status(cell, State.UNDECIDED, words, path, at_limit=True, detail="undecided at its design's most "
                      f"blocks ({read.at_limit}); `run --again --only` measures it afresh")
    detail, past = _blocks_by_device(found)
    return Status(cell, State.UNDECIDED, words, path, detail=detail, past_design=past)


def _planned(cell: Cell, results: Path, device: str, spreads: dict) -> Status:
    """The state of a cell without a result: planned, and for an A/B, whether the call spread at its setting puts it
    past its design's most blocks if its fixes change nothing."""
    if (found_no_effect := no_effect_blocks(cell, results, spreads)) is None:
        return Status(cell, State.PLANNED)
    blocks, detail, call = found_no_effect
    past = blocks > cell.option("max_blocks", 40)
    beyond = 0.0
    if past and (changed := changed_in_the_other_mode(cell, results, device) or changed_by_a_part(cell, results)):
        past, detail = False, f"{detail}; but {changed}: a change decides sooner"
    elif unrun := never_ran(cell, results):
        past, detail = False, f"{detail}; but {unrun}: it settles as not exercised at its first block at most"
    elif not past and cell.option("budget"):
        # within its design but past its budget, which counts one run's blocks: it ends undecided at its budget, and
        # `run --redo-undecided` goes on from its blocks, a budget a run; unless a change is known to decide it sooner
        short, beyond = _budget_short(cell, blocks, call)
        if short and (changed := changed_in_the_other_mode(cell, results, device) or
                      changed_by_a_part(cell, results)):
            short, beyond = f"; past its budget if its fixes change nothing, but {changed}: a change decides sooner", 0.0
        detail += short
    return Status(cell, State.PLANNED, detail=detail, past_design=past, beyond_budget_s=beyond)


def setting_spread(cell: Cell, results: Path) -> tuple[float, int, int, float] | None:
    """The call-to-call spread (`stats.call_spread`) of the control arms measured at `cell`'s pipeline, mode, depth
    and setting, over the same base (a control over `model_offload_keep_host` makes other calls), pooled over every
    such result and host: the spread, how many call ratios and results it rests on, and the median control call in
    seconds. None where too few were measured."""
    alike = [r for r in similar(cell, results) if base_of(r.name) == base_of(cell.stem("*"))]
    timed = [r for r in alike if r.timed and r.samples.control.raw_wall_ms]
    calls = [b for r in timed for b in r.samples.control.raw_wall_ms]
    spread = stats.call_spread(calls)
    return (spread[0], spread[1], len(timed), stats.median([x for b in calls for x in b]) / 1e3) if spread else None


def no_effect_blocks(cell: Cell, results: Path, cache: dict | None = None) -> tuple[int, str, float] | None:
    """About how many blocks `cell`, an A/B not yet run with a sequential design, would need to find its fixes within
    its margin if they change nothing, at the call spread measured at its setting (`stats.blocks_to_find_equivalent`,
    checked against the committed results by `benchmarks/call_spread.py`: a rough guide), and the plan's words for
    it, and the setting's median control call in seconds; None for another cell, or where nothing was measured at its
    setting. A fix that changes the call decides sooner: a change larger than the margin takes fewer blocks to find
    than no change within it. `cache` holds the spreads already read."""
    if cell.kind != "ab" or cell.option("blocks"):
        return None
    cache = {} if cache is None else cache
    key = (cell.pipeline, cell.mode, cell.size_tag(), base_of(cell.stem("*")))
    if key not in cache:
        cache[key] = setting_spread(cell, results)
    if (found := cache[key]) is None:
        return None
    spread, ratios, measured, call_s = found
    most, margin = cell.option("max_blocks", 40), cell.option("margin", 0.01)
    design = stats.sequential_design(cell.option("min_blocks", 6), most, cell.option("alpha", 0.05))
    blocks = stats.blocks_to_find_equivalent(spread, cell.option("repeat", 2), margin, design)
    if blocks is None:
        return None
    past = f", past its design's {most}" if blocks > most else ""
    return blocks, (f"if its fixes change nothing, about {blocks} blocks would find that within ±{margin * 100:g}%"
                    f"{past} (calls spread {spread * 100:.1f}% at this setting, {measured} result"
                    f"{'s' if measured != 1 else ''})"), call_s


def _budget_short(cell: Cell, blocks: int, call_s: float) -> tuple[str, float]:
    """The plan's words where the `blocks` that a cell of no effect needs are more than its budget buys at its
    setting's control calls of `call_s` seconds (a block of a fix of no effect: both arms take the control's time),
    else "", and the seconds of the blocks its budget does not buy (0 where it buys them all, or none: a budget too
    small for one block decides nothing however often it runs)."""
    block_s = calls_per_block(cell) * call_s
    buys = int(parse_duration(cell.option("budget")) // block_s)
    if blocks <= buys:
        return "", 0.0
    runs = math.ceil(blocks / buys) if buys else None
    return (f"; its budget of {cell.option('budget')} buys about {buys} such blocks of {block_s:,.0f} s, so it ends "
            "undecided at its budget and `run --redo-undecided` goes on from its blocks"
            + (f", about {runs} runs in all" if runs else ": raise its budget"),
            (blocks - buys) * block_s if buys else 0.0)


def never_ran(cell: Cell, results: Path) -> str | None:
    """Where no fix of `cell`, an A/B of its own fixes, ran in the verifying call of an A/B at its pipeline, depth and
    setting (either mode, any fix set that holds them), the plan's words for it (`qwen_modulate_index never ran in
    NAME.json`); else None. Whether a fix's code runs is its scenario's, not its timing's (Qwen-Image's text-to-image
    calls never reach `qwen_modulate_index`, which needs `zero_cond_t`), and an A/B whose fixes never ran settles as
    not exercised at its first block, or with none where a time limit leaves no room for one (`lab.verdicts.judge`),
    however much its calls spread: its cell is not likely past its design's most blocks."""
    if cell.kind != "ab" or cell.base:
        return None
    for mode in (cell.mode, "eager" if cell.mode == "compile" else "compile"):
        if (where := unrun_in(cell, similar(cell, results, mode=mode))) is not None:
            return f"{', '.join(cell.fixes)} never ran in {where.name}.json"
    return None


def changed_in_the_other_mode(cell: Cell, results: Path, device: str) -> str | None:
    """Where the same fixes at `cell`'s pipeline, depth and setting, in the other mode (eager for a compiled cell,
    compiled for an eager one), changed the call by more than `cell`'s margin (an interval wholly outside it), the
    plan's words for it (`in eager they ran 0.2345x the control's time (NAME.json)`); else None. Such fixes are
    unlikely to change nothing in this mode, and a change larger than the margin decides in fewer blocks than
    finding no change within it: `no_effect_blocks` does not apply."""
    if cell.kind != "ab":
        return None
    other = "compile" if cell.mode == "eager" else "eager"
    twin = dataclasses.replace(cell, options=tuple(sorted({**dict(cell.options), "mode": other}.items())))
    found = twin.results_found(results, device)
    try:
        result = store.read(found[-1]) if found else None
    except LabError:
        return None
    if result is None or isinstance(result, dict) or not changed_beyond(result, cell.option("margin", 0.01)):
        return None
    return f"in {other} they ran {result.stats.ratio:.4g}x the control's time ({found[-1].name})"


def changed_by_a_part(cell: Cell, results: Path) -> str | None:
    """Where some of `cell`'s fixes and no other, at its pipeline, mode, depth and setting over the same base, changed
    the call by more than `cell`'s margin (an interval wholly outside it), the plan's words for it (`with
    FIXES alone they ran RATIOx the control's time (NAME.json)`); else None. A set that holds fixes
    which change the call is unlikely to change nothing (its other fixes would have to undo the change), and a change
    larger than the margin decides in fewer blocks than finding no change within it: `no_effect_blocks` does not
    apply. A fix that includes another (`Fix.includes`: `group_offload_pinned` makes `group_offload_keep_host`'s change
    and more) holds it as a part. Of several such parts, the one that changed the call most."""
    if cell.kind != "ab":
        return None
    changed = [r for r in similar(cell, results) if part_of(r, cell) and changed_beyond(r, cell.option("margin", 0.01))]
    if not changed:
        return None
    most = min(changed, key=lambda r: r.stats.ratio)
    return f"with {', '.join(sorted(most.fixes))} alone they ran {most.stats.ratio:.4g}x the control's time ({most.name}.json)"


def states(campaigns_dir: Path, results: Path) -> list[tuple[Path, Campaign, list[Status]]]:
    """Every campaign file in `campaigns_dir` with the state of its cells in `results` (and its run log there)."""
    out = []
    for path in sorted(Path(campaigns_dir).glob("*.toml")):
        plan = load(path)
        out.append((path, plan, status(plan, results, read_log(results / "campaigns" / f"{plan.name}.jsonl"))))
    return out


def blocks_on(cell: Cell, results: Path, device: str) -> int:
    """How many timing blocks the A/B result of `cell` measured on `device` (`h100`) holds that a run there can go on
    from (its sequential design stopped undecided); 0 where it has none."""
    return resumable_blocks(cell.folder(results) / f"{cell.stem(device)}.json") if cell.kind == "ab" else 0
