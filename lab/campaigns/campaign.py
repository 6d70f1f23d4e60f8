"""Campaigns as data: a TOML file names the matrix to measure; this module expands it into cells (one result each)
and jobs (one `lab` process each), finds which cells already have a result, and estimates what the rest will take.

A campaign file (see `campaigns/*.toml`)::

    [campaign]
    description = "every fix set per pipeline, eager and regional compile"
    device = "cuda"              # where its results count: "cuda" (any GPU) or "cpu"

    [defaults]                   # options every cell takes unless it says otherwise
    size = "full"
    budget = "4m"

    [[cell]]
    pipeline = ["ltx2", "ltx2_i2v"]   # a list multiplies out, as do fix, mode, layers, steps and size
    fix = "each"                 # every applicable fix alone, then all together; or "all", or "a,b", or a list
    mode = ["eager", "compile"]
    layers = 8
    gpu_memory_gib = 60

Every other key is an option of the cell's subcommand (`kind`: ab, the default; sweep; hunt; calibrate; census), written as
in the command line with `_` for `-`: `max_blocks = 30` is `--max-blocks 30`, `profile = false` is `--no-profile`.
Cells of `lab ab` that share a pipeline, a build and their options run as one job, on one build. A cell of kind
`script` runs a benchmark script instead (`command = "python benchmarks/x.py ..."`) and counts as measured when the
file it `writes` exists.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import math
import re
import shlex
import sys
from pathlib import Path
from typing import Any, NamedTuple

from lab.base import files, naming
from lab.base.errors import LabError, UsageError, unknown_name
from lab.base.units import parse_duration
from lab.results import store
from lab.results.going_on import kept_verification
from lab.results.states import NEW_FIXES, NO_BLOCKS_YET, OLD_BUILD, ONE_PAIR, RESUMABLE
from lab.verdicts import stats
from lab.verdicts.verdict import Verdict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KINDS = ("ab", "sweep", "hunt", "calibrate", "census", "history", "script")
AXES = ("pipeline", "fix", "mode", "layers", "steps", "size", "setting")
#: options that decide what is built and compiled: cells that agree on them can share one build
BUILD_KEYS = ("pipeline", "mode", "size", "layers", "steps", "dtype", "device", "call", "checkpoint", "seed",
              "full_decode", "compile_regional", "compile_fullgraph", "compile_mode", "setting")
#: options every cell of one `lab ab` job must agree on (they are the job's, not the cell's)
JOB_KEYS = BUILD_KEYS + ("blocks", "max_blocks", "min_blocks", "budget", "lead_in", "warmup", "repeat", "alpha",
                         "margin", "profile", "with_stack", "profile_calls", "isolate", "control", "base")
#: keys of a cell that are about the campaign, not options of the command
NOT_OPTIONS = ("gpu_memory_gib", "pipeline", "minutes")
#: what a cell costs beyond its timing blocks when nothing measured says better (seconds)
GUESS = {"build": {"full": 60.0, "tiny": 5.0, "pretrained": 120.0}, "compile": 90.0, "block": 60.0,
         "cell": {"full": 300.0, "tiny": 30.0, "pretrained": 300.0}}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One result to measure: a subcommand, a pipeline, one fix set, and the options of the command."""

    kind: str
    pipeline: str
    fixes: tuple[str, ...]  # the fix names of the set, resolved on the installed diffusers ("each" / "all" expanded)
    options: tuple[tuple[str, Any], ...]  # every other option, sorted
    group: int  # which [[cell]] table it came from

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)

    @property
    def mode(self) -> str:
        return self.option("mode", "eager")

    @property
    def size(self) -> str:
        return self.option("size", "full")

    @property
    def label(self) -> str:
        if self.kind == "script":
            return f"script writing {self.option('writes')}"
        depth = f", {self.option('layers')} transformer blocks" if self.option("layers") else ""
        extra = f", vary {self.option('vary')}" if self.kind == "sweep" else ""
        extra += f", setting {self.option('setting')}" if self.option("setting") else ""
        extra += ", decoding" if self.option("full_decode") else ""
        # a census runs every fix; a history compares releases (`--diffusers`)
        fixes = ("" if self.kind == "census" else f" [{self.option('diffusers')}]" if self.kind == "history" else
                 f" [{naming.fix_tag(self._what() or list(self.fixes), self.base)}]")
        return f"{self.kind} {self.pipeline}{fixes} {self.mode}{depth}{extra}"

    def size_tag(self) -> str:
        """The size part of its result's name, with its setting (`setting = "first_block_cache"`) if it has one, and
        for a census or an A/B on another diffusers (`diffusers = "0.42.1"`) its version."""
        from lab.run import settings

        setting = self.option("setting")
        other = self.option("diffusers") if self.kind in ("census", "ab") else None  # a history's are its releases
        return naming.size_tag(self.size, self.option("layers"), self.option("call"), self.option("steps"),
                               settings.tags(settings.parse_all([setting] if setting else [])),
                               _version_of(str(other)) if other else None, bool(self.option("full_decode")))

    def stem(self, device: str) -> str:
        """The result's file name without `.json` (`device`: `h200`, `cpu`, ... or `*` for any)."""
        if self.kind == "script":
            return Path(self.option("writes")).stem
        if self.option("name"):
            return self.option("name")
        size = self.size_tag()
        fixes = list(self.fixes)
        if self.kind == "ab":
            return naming.ab_name(self._what() or fixes, self.mode, size, device, self.base)
        if self.kind == "sweep":
            key = str(self.option("vary")).partition("=")[0]
            return naming.sweep_name(fixes, key, self.mode, size, device)
        if self.kind == "hunt":
            return naming.hunt_name(self.pipeline, fixes, self.mode, size, device)
        if self.kind == "census":
            return naming.census_name(self.pipeline, self.mode, size, device)
        if self.kind == "history":
            return naming.history_name(self.pipeline, self.mode, size, device)
        # as `lab calibrate` names it: the cross-process designs end in `__processes` or `__one-pair`
        processes = ("__one-pair" if self.option("one_pair") else "__processes") if self.option("isolate") else ""
        return naming.calibration_name(self.pipeline, self.mode, size, device) + processes

    def folder(self, results: Path) -> Path:
        return {"ab": results / "ab" / self.pipeline, "sweep": results / "sweep" / self.pipeline,
                "hunt": results / "hunt", "calibrate": results / "calibration", "census": results / "census",
                "history": results / "history"}[self.kind]

    @property
    def base(self) -> list[str]:
        """The fixes on in both arms of an A/B cell (`base = "model_offload_keep_host"`: `lab ab --base`)."""
        return [n.strip() for n in str(self.option("base") or "").split(",") if n.strip()]

    def _what(self) -> list[str]:
        """What an A/B cell compares when it is not a fix set, as `lab ab` names it: two diffusers
        (`diffusers-0.37.1-to-0.38.0`) or a change given as diffs (`patch-wan_contiguous`); empty for fixes."""
        if self.option("control_diffusers") or self.option("test_diffusers"):
            return [naming.diffusers_tag(*(_version_of(self.option(k)) for k in ("control_diffusers",
                                                                                  "test_diffusers")))]
        if self.option("patch"):
            from lab.apply.change import patch_name

            return [patch_name([str(self.option("patch"))])]  # one diff per cell (`--patch DIFF`)
        return []

    def results_found(self, results: Path, device: str) -> list[Path]:
        """The result files of this cell that exist, from a device of the campaign's kind (newest last)."""
        if self.kind == "script":
            written = results.parent / self.option("writes")
            return [written] if written.exists() else []
        found = files.newest_last(files.written(self.folder(results).glob(f"{self.stem('*')}.json")))
        return [p for p in found if (device_of(p.stem) == "cpu") == (device == "cpu")]

    def argv(self, results: Path, fix_specs: list[str] | None = None) -> list[str]:
        """The command line that measures this cell into `results` (or, with `fix_specs`, several cells of one
        build); for a script, its own command line."""
        if self.kind == "script":
            words = shlex.split(self.option("command"))
            return [sys.executable if words[0] in ("python", "python3") else words[0], *words[1:]]
        argv = [sys.executable, "-m", "lab.cli", self.kind, "--pipeline", self.pipeline, "--out",
                str(self.folder(Path(results)).parent if self.kind in ("ab", "sweep") else self.folder(Path(results)))]
        if self.kind == "history":  # each pair's own A/B result and page, beside the campaign's other A/Bs
            argv += ["--ab-out", str(Path(results) / "ab")]
        for spec in fix_specs if fix_specs is not None else ([",".join(self.fixes)] if self.fixes else []):
            argv += ["--fix", spec]
        for key, value in self.options:
            flag = "--" + key.replace("_", "-")
            if key in NOT_OPTIONS:
                continue
            if value is True:
                argv.append(flag)
            elif value is False:
                argv.append("--no-" + key.replace("_", "-"))
            else:
                argv += [flag, str(value)]
        return argv


def _version_of(spec: str | None) -> str:
    """The diffusers version a `control_diffusers`/`test_diffusers` SPEC names, as `lab ab` names its result: a
    release is its own version, anything else (a wheel, a checkout; none: the installed one) is resolved here."""
    if spec and re.fullmatch(r"\d+(\.\d+)*([.-]?(a|b|rc|dev|post)\d*)?", str(spec)):
        return str(spec)
    from lab.apply import releases

    return (releases.resolve(str(spec)) if spec else releases.installed()).version


def device_of(stem: str) -> str:
    """The device part of a result's name (`h200`, `cpu`, ...), before a calibration's design suffix."""
    return stem.removesuffix("__processes").removesuffix("__one-pair").rsplit("__", 1)[-1]


@dataclasses.dataclass(frozen=True)
class Job:
    """One `lab` process: one cell, or several `lab ab` cells on one build."""

    cells: tuple[Cell, ...]

    def argv(self, results: Path) -> list[str]:
        first = self.cells[0]
        if len(self.cells) == 1:
            return first.argv(results)
        return first.argv(results, [",".join(c.fixes) for c in self.cells])

    @property
    def gpu_memory_gib(self) -> float | None:
        return max((c.option("gpu_memory_gib") or 0 for c in self.cells), default=0) or None

    @property
    def id(self) -> str:
        first = self.cells[0]
        what = ("releases" if first.kind == "history" else
                naming.fix_tag(first._what() or list(first.fixes), first.base) if len(self.cells) == 1 else
                f"{len(self.cells)}sets-g{first.group}" + (f"-over-{'+'.join(first.base)}" if first.base else ""))
        if first.kind == "script":
            return f"script-{first.stem('')}"
        # the size tag carries the depth, the call, the steps and the setting: jobs that differ in them differ here
        return f"{first.kind}-{first.pipeline}-{first.mode}-{first.size_tag()}-{what}"


@dataclasses.dataclass(frozen=True)
class Campaign:
    path: Path
    description: str
    device: str  # "cuda" or "cpu"
    cells: tuple[Cell, ...]
    slurm: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.stem


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, list) else [value]


def _fix_sets(pipeline: str, spec: str, setting: str | None = None) -> list[tuple[str, ...]]:
    """The fix sets a `fix` value stands for on `pipeline` (in `setting`), resolved on the installed diffusers."""
    from lab.apply.fix import check_fixes_for, each_sets, parse_fix_list
    from lab.run import settings as setting_kinds

    settings = (setting_kinds.parse(setting).describe(),) if setting else ()
    if spec == "each":
        return [tuple(f.name for f in fixes) for fixes, _ in each_sets(pipeline, settings)]
    if spec == "":
        return [()]
    fixes, _ = check_fixes_for(pipeline, parse_fix_list(spec), skip_inapplicable=spec == "all", settings=settings)
    return [tuple(f.name for f in fixes)] if fixes else []


def load(path: Path) -> Campaign:
    """Read and expand a campaign file. Bad input is one `UsageError` naming the file and the table."""
    from lab.run.scenario import catalog

    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as e:
        raise UsageError(f"{path}: no such campaign file.") from e
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML ({e}).") from e
    _check_shapes(path, data)
    head = data["campaign"]
    device = head.get("device", "cuda")
    if device not in ("cuda", "cpu"):
        raise UsageError(f"{path}: `device` must be \"cuda\" or \"cpu\", not {device!r}.")
    defaults = data.get("defaults", {})
    tables = data["cell"]
    cells: list[Cell] = []
    scenarios = catalog()
    for group, table in enumerate(tables, start=1):
        spec = {**defaults, **table}
        kind = spec.pop("kind", "ab")
        if kind not in KINDS:
            raise unknown_name("cell kind", kind, KINDS)
        if kind == "script":
            if "command" not in table or "writes" not in table:
                raise UsageError(f"{path}: [[cell]] number {group} is a script: it needs `command` and `writes`.")
            cells.append(Cell("script", table.get("pipeline", "-"), (), tuple(sorted(
                (k, v) for k, v in table.items() if k != "kind")), group))
            continue
        if "pipeline" not in spec:
            raise UsageError(f"{path}: [[cell]] number {group} names no `pipeline`.")
        axes = {k: _as_list(spec.pop(k)) for k in AXES if k in spec}
        fix_values = axes.pop("fix", [""])
        if kind == "ab" and "diffusers" in spec and {"each", "all"} & set(fix_values):
            raise UsageError(f"{path}: [[cell]] number {group} is an A/B on diffusers {spec['diffusers']}: name its "
                             "fixes (`each` and `all` are resolved on the installed diffusers, whose catalog may "
                             "differ from that release's).")
        for combo in itertools.product(*axes.values()):
            point = dict(zip(axes, combo))
            pipeline = point.pop("pipeline")
            if pipeline not in scenarios:
                raise unknown_name("scenario", pipeline, scenarios)
            options = tuple(sorted({**spec, **point}.items()))
            if "setting" in point:
                from lab.run import settings

                try:
                    settings.parse_all([point["setting"]])
                except UsageError as e:
                    raise UsageError(f"{path}: [[cell]] number {group}: {e}") from None
            seen = set()
            for value in fix_values:
                for fixes in _fix_sets(pipeline, value, point.get("setting")):
                    if fixes in seen:
                        continue
                    seen.add(fixes)
                    cells.append(Cell(kind, pipeline, fixes, options, group))
    if not cells:
        raise UsageError(f"{path}: its [[cell]] tables select no cell (no fix of a `fix` value applies to its "
                         "pipeline on the installed diffusers): nothing to measure.")
    return Campaign(path, head.get("description", ""), device, tuple(cells), data.get("slurm", {}))


#: the type each key of a [[cell]] (or [defaults]) must have; a list of them multiplies out for the AXES
CELL_TYPES: dict[str, tuple[type, ...]] = {"pipeline": (str,), "fix": (str,), "mode": (str,), "size": (str,),
                                           "layers": (int,), "steps": (int,), "kind": (str,), "command": (str,),
                                           "writes": (str,), "gpu_memory_gib": (int, float), "minutes": (int, float),
                                           "setting": (str,)}


def _check_shapes(path: Path, data: dict) -> None:
    """Every table is where a table belongs and every value has its type, named with its place in the file."""
    if "campaign" not in data:
        raise UsageError(f"{path}: no [campaign] table: a campaign file starts with [campaign] (its `description`, "
                         "and `device = \"cuda\"` or \"cpu\": where its results count).")
    unknown = set(data) - {"campaign", "defaults", "cell", "slurm"}
    if unknown:
        raise UsageError(f"{path}: unknown table(s) {sorted(unknown)}; a campaign has [campaign], [defaults], "
                         "[[cell]] and [slurm].")
    for name in ("campaign", "defaults", "slurm"):
        if name in data and not isinstance(data[name], dict):
            raise UsageError(f"{path}: `{name}` must be a table ([{name}]), not {type(data[name]).__name__} "
                             f"{data[name]!r}.")
    unknown_head = set(data["campaign"]) - {"description", "device"}
    if unknown_head:
        raise UsageError(f"{path}: [campaign] has unknown key(s) {sorted(unknown_head)}; it takes `description` "
                         "and `device`.")
    if not isinstance(data["campaign"].get("description", ""), str):
        raise UsageError(f"{path}: [campaign] `description` must be text.")
    cells = data.get("cell", [])
    if isinstance(cells, dict):
        raise UsageError(f"{path}: `cell` is one table ([cell]); cells are an array of tables: write [[cell]].")
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise UsageError(f"{path}: `cell` must be an array of tables ([[cell]] ...).")
    if not cells:
        raise UsageError(f"{path}: no [[cell]] tables: nothing to measure.")
    for where, table in [("[defaults]", data.get("defaults", {}))] + [
            (f"[[cell]] number {i}", c) for i, c in enumerate(cells, start=1)]:
        for key, value in table.items():
            types = CELL_TYPES.get(key)
            if isinstance(value, (dict, list)) and not (isinstance(value, list) and key in AXES):
                raise UsageError(f"{path}: {where}: `{key}` = {value!r} is a {type(value).__name__}; "
                                 + ("it takes one value or a list of values." if key in AXES else
                                    "it takes one value."))
            values = value if isinstance(value, list) else [value]
            if types and any(isinstance(v, bool) or not isinstance(v, types) for v in values):
                wanted = " or ".join({str: "text", int: "a whole number", float: "a number"}[t] for t in types)
                raise UsageError(f"{path}: {where}: `{key}` = {value!r} must be {wanted}.")
            if key in ("command", "writes") and not value.strip():
                raise UsageError(f"{path}: {where}: `{key}` is empty.")


def jobs(cells: list[Cell]) -> list[Job]:
    """Group cells into jobs: `lab ab` cells that agree on every job option share one process and one build."""
    grouped: dict[tuple, list[Cell]] = {}
    for cell in cells:
        if cell.kind == "ab" and not cell.option("name") and not cell._what():  # a fix set: builds are shared
            key = ("ab", cell.pipeline, tuple((k, v) for k, v in cell.options if k in JOB_KEYS), cell.group)
        else:
            key = ("single", id(cell))
        grouped.setdefault(key, []).append(cell)
    # in a job, the sets of several fixes first (each kind in the file's order): where a time limit ends a job, what it
    # measured is the cell that decides soonest and says the most, and its first run is the shortest (an offload fix
    # among the set makes its test arm's calls several times shorter: Flux2 Klein's compiled group-offload job, led by
    # a one-fix cell whose arms both make 43 s calls, could not start in a 505 s device call; led by its set, it can)
    return [Job(tuple(sorted(c, key=lambda cell: len(cell.fixes) < 2))) for c in grouped.values()]


# --- what exists, and what the rest will take --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Status:
    cell: Cell
    state: str  # "planned" | "measured" | "undecided" | "old build" | "failed"
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


#: verdicts that settle a cell although the timing decided nothing about the speed
SETTLED = (Verdict.NOT_EXERCISED, Verdict.OUTPUTS_DIFFER)


def _verdict_of(path: Path) -> tuple[str, bool, str, int]:
    """What the result at `path` concluded, in words, whether that settles its cell (else it is undecided), how its
    pipeline was built (`store.build_of`), and how many blocks an A/B that its sequential design stopped undecided at
    its most blocks ran (0 for any other result)."""
    try:
        result = store.read(path)
    except LabError as e:  # a damaged result is the user's to restore or measure again
        raise UsageError(str(e)) from None
    kind = result["kind"] if isinstance(result, dict) else result.kind
    build = store.build_of(result)
    if kind == "sweep":
        settled = all(p.verdict.decided or p.verdict in SETTLED for p in result.points)
        return ("decided" if settled else "undecided"), settled, build, 0
    if kind == "ab" and result.process_design == "one pair" and not result.config.one_pair:
        return ONE_PAIR, False, build, 0  # the design before fresh pairs (`--one-pair` asks for it on purpose)
    if kind == "ab" and result.profiles_only:
        return NO_BLOCKS_YET, False, build, 0
    if kind == "ab":
        at_limit = len(result.order or []) if result.stopped == "max blocks" else 0
        return result.verdict_text, result.verdict.decided or result.verdict in SETTLED, build, at_limit
    if kind == "history":
        left = [r for r in result.releases if r.status == "not reached" or r.interrupted]
        if left:
            return f"interrupted, {len(left)} of {len(result.releases) - 1} releases to go", False, build, 0
        if any(r.pairing == "one pair" for r in result.releases) and not result.config.one_pair:
            return ONE_PAIR, False, build, 0
    if kind == "census" and result.interrupted:
        return "interrupted", False, build, 0
    if kind == "calibration" and result.interrupted:  # stopped before all its trials: owed, gone on from
        return f"interrupted after {result.aa.trials} of {result.config['trials']} trials", False, build, 0
    if kind == "census" and result.error:
        return f"failed: {result.error}", False, build, 0
    if kind == "census" and (missing := _census_lacks(result)):
        return f"{NEW_FIXES}: {', '.join(missing)}", False, build, 0
    return "measured", True, build, 0  # a hunt, a census or a calibration is done once it exists


def _blocks_to_go_on_from(result) -> int:
    """How many timing blocks an A/B result holds that a run on its GPU can go on from (its sequential design stopped
    undecided: `lab ab --resume`); 0 for any other result."""
    if result is None or isinstance(result, dict) or result.kind != "ab" or result.stopped not in RESUMABLE:
        return 0
    return len(result.order or [])


def _resumable_blocks(path: Path) -> int:
    """`_blocks_to_go_on_from` the result at `path`; 0 where there is none or it cannot be read."""
    try:
        return _blocks_to_go_on_from(store.read(path)) if path.exists() else 0
    except LabError:
        return 0


def _blocks_by_device(found: list[Path]) -> tuple[str, bool]:
    """Where an undecided A/B's blocks are (`4 blocks on h200, 3 on h100`, newest first): a run goes on only from
    those measured on its own GPU (`lab ab --resume`), so the plan says which machine continues which cell. Then,
    from the newest result's estimate and interval, about how many blocks would decide it, and whether that lies past
    its design's most blocks (the second value): a cell whose effect is small against its calls' spread (a fix of
    milliseconds in a call of seconds) is better left than given device time it cannot use."""
    parts = []
    for path in reversed(found):
        if n := _resumable_blocks(path):
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
    r = _own_result(cell, results, device)
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
    failed: dict[str, str] = {}
    for entry in log or []:
        for stem in entry.get("cells", []):
            if entry.get("interrupted"):  # an interrupt is not a failure of the job it interrupted
                failed.pop(stem, None)
            elif entry.get("exit") != 0:
                failed[stem] = entry.get("error") or f"exit code {entry.get('exit')} (log: {entry.get('log')})"
            else:
                failed.pop(stem, None)
    out = []
    held = old_build_held(results)
    spreads: dict = {}  # the call spread at each setting, read once
    for cell in campaign.cells:
        # (a result `lab table` refused and named is left out: the cell is as if it were not measured)
        found = [p for p in cell.results_found(results, campaign.device) if not store.left_out(p)]
        if found and cell.kind == "script":
            out.append(Status(cell, "measured", "written", found[-1]))
        elif found:
            verdict, settled, build, at_limit = _verdict_of(found[-1])
            if build == "old" and cell.pipeline not in held:
                out.append(Status(cell, OLD_BUILD, verdict, found[-1], detail="measured on the old build, which "
                                  f"profiles {cell.pipeline} differently from the faithful one (results/faithful/)"))
            elif verdict == ONE_PAIR:
                out.append(Status(cell, ONE_PAIR, verdict, found[-1], detail="measured with one pair of worker "
                                  "processes for all its blocks, the design before fresh pairs (uncalibrated)"))
            elif verdict.startswith("interrupted, "):  # a history stopped before its releases: owed, gone on from
                out.append(Status(cell, "planned", verdict, found[-1], detail=f"{verdict}; `run` goes on from them"))
            elif verdict == "interrupted":  # a census stopped before its arms completed: owed, not failed
                out.append(Status(cell, "planned", verdict, found[-1], detail="interrupted before every arm ran; "
                                  "`run` measures it again"))
            elif verdict == NO_BLOCKS_YET:  # an A/B stopped in or after its profiles: owed, gone on from them
                out.append(Status(cell, "planned", verdict, found[-1], detail="stopped before its first block; "
                                  "`run` goes on from its profiles"))
            elif verdict.startswith("interrupted after "):  # a calibration stopped before all its trials
                out.append(Status(cell, "planned", verdict, found[-1], detail=f"{verdict}; `run` goes on from them"))
            elif verdict.startswith("failed: "):  # a census that recorded its pipeline's failure
                out.append(Status(cell, "failed", result=found[-1], detail=verdict.removeprefix("failed: ")))
            elif verdict.startswith(f"{NEW_FIXES}: "):
                out.append(Status(cell, NEW_FIXES, result=found[-1], detail="measured before the catalog had "
                                  + verdict.removeprefix(f"{NEW_FIXES}: ")))
            elif settled:
                out.append(Status(cell, "measured", verdict, found[-1]))
            elif at_limit:
                out.append(Status(cell, "undecided", verdict, found[-1], at_limit=True,
                                  detail=f"undecided at its design's most blocks ({at_limit}); `run --again --only` "
                                  "measures it afresh"))
            else:
                detail, past = _blocks_by_device(found)
                out.append(Status(cell, "undecided", verdict, found[-1], detail=detail, past_design=past))
        elif cell.stem("*") in failed:
            out.append(Status(cell, "failed", detail=failed[cell.stem("*")]))
        elif (found_no_effect := no_effect_blocks(cell, results, spreads)) is not None:
            blocks, detail, call_s = found_no_effect
            past = blocks > cell.option("max_blocks", 40)
            if past and (changed := changed_in_the_other_mode(cell, results, campaign.device)):
                past, detail = False, f"{detail}; but {changed}: a change decides sooner"
            elif unrun := never_ran(cell, results):
                past, detail = False, f"{detail}; but {unrun}: it settles as not exercised at its first block at most"
            elif not past and cell.option("budget"):
                # within its design but past its budget, which counts one run's blocks: it ends undecided at its
                # budget, and `run --redo-undecided` goes on from its blocks, a budget a run (Qwen-Image's
                # group-offload cells of one fix: 26 to 28 blocks by their spread, 9 of 190 s in 30 minutes)
                detail += _budget_short(cell, blocks, call_s)
            out.append(Status(cell, "planned", detail=detail, past_design=past))
        else:
            out.append(Status(cell, "planned"))
    return out


def setting_spread(cell: Cell, results: Path) -> tuple[float, int, int, float] | None:
    """The call-to-call spread (`stats.call_spread`) of the control arms measured at `cell`'s pipeline, mode, depth
    and setting, over the same base (a control over `model_offload_keep_host` makes other calls), pooled over every
    such result and host: the spread, how many call ratios and results it rests on, and the median control call in
    seconds. None where too few were measured."""
    alike = [r for r in _similar(cell, results) if _base(r.name) == _base(cell.stem("*"))]
    timed = [r for r in alike if r.timed and r.samples.control.raw_wall_ms]
    calls = [b for r in timed for b in r.samples.control.raw_wall_ms]
    spread = stats.call_spread(calls)
    return (spread[0], spread[1], len(timed), stats.median([x for b in calls for x in b]) / 1e3) if spread else None


def no_effect_blocks(cell: Cell, results: Path, cache: dict | None = None) -> tuple[int, str, float] | None:
    """About how many blocks `cell`, an A/B not yet run with a sequential design, would need to find its fixes within
    its margin if they change nothing, at the call spread measured at its setting (`stats.blocks_to_find_equivalent`,
    checked against the committed results by `benchmarks/call_spread.py`: a rough guide), and the plan's words for
    it, and the setting's median control call in seconds; None for another cell, or where nothing was measured at its
    setting. A fix that changes the call decides sooner, as one that removes the offload copies did at 8 blocks.
    `cache` holds the spreads already read."""
    if cell.kind != "ab" or cell.option("blocks"):
        return None
    cache = {} if cache is None else cache
    key = (cell.pipeline, cell.mode, cell.size_tag(), _base(cell.stem("*")))
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


def _budget_short(cell: Cell, blocks: int, call_s: float) -> str:
    """The plan's words where the `blocks` that a cell of no effect needs are more than its budget buys at its
    setting's control calls of `call_s` seconds (a block of a fix of no effect: both arms take the control's time),
    else ""."""
    block_s = _calls_per_block(cell) * call_s
    buys = int(parse_duration(cell.option("budget")) // block_s)
    if blocks <= buys:
        return ""
    runs = math.ceil(blocks / buys) if buys else None
    return (f"; its budget of {cell.option('budget')} buys about {buys} such blocks of {block_s:,.0f} s, so it ends "
            "undecided at its budget and `run --redo-undecided` goes on from its blocks"
            + (f", about {runs} runs in all" if runs else ": raise its budget"))


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
        if (where := _unrun_in(cell, _similar(cell, results, mode=mode))) is not None:
            return f"{', '.join(cell.fixes)} never ran in {where.name}.json"
    return None


def _unrun_in(cell: Cell, seen: list):
    """The newest of the A/B results `seen` whose verifying call ran none of `cell`'s fixes, all of which it holds."""
    for result in reversed(seen):
        ran = result.verify.exercised if result.verify else {}
        if ran and all(ran.get(fix, 1) == 0 for fix in cell.fixes):
            return result
    return None


def changed_in_the_other_mode(cell: Cell, results: Path, device: str) -> str | None:
    """Where the same fixes at `cell`'s pipeline, depth and setting, in the other mode (eager for a compiled cell,
    compiled for an eager one), changed the call by more than `cell`'s margin (an interval wholly outside it), the
    plan's words for it (`in eager they ran 0.2345x the control's time (NAME.json)`); else None. Such fixes are
    unlikely to change nothing in this mode, and a change larger than the margin decides in fewer blocks than
    finding no change within it: `no_effect_blocks` does not apply (Qwen-Image's `model_offload_keep_host` in
    model CPU offload, compiled, beside its eager 0.2345x)."""
    if cell.kind != "ab":
        return None
    other = "compile" if cell.mode == "eager" else "eager"
    twin = dataclasses.replace(cell, options=tuple(sorted({**dict(cell.options), "mode": other}.items())))
    found = twin.results_found(results, device)
    try:
        result = store.read(found[-1]) if found else None
    except LabError:
        return None
    if result is None or isinstance(result, dict) or result.stats is None or not result.verdict.changed_speed:
        return None
    margin = cell.option("margin", 0.01)
    low, high = result.stats.ci
    if 1 - margin <= high and low <= 1 + margin:  # "faster, within ±1%": no larger than the margin
        return None
    return f"in {other} they ran {result.stats.ratio:.4g}x the control's time ({found[-1].name})"


def states(campaigns_dir: Path, results: Path) -> list[tuple[Path, Campaign, list[Status]]]:
    """Every campaign file in `campaigns_dir` with the state of its cells in `results` (and its run log there)."""
    out = []
    for path in sorted(Path(campaigns_dir).glob("*.toml")):
        plan = load(path)
        out.append((path, plan, status(plan, results, read_log(results / "campaigns" / f"{plan.name}.jsonl"))))
    return out


def read_log(path: Path) -> list[dict]:
    """The run log of a campaign (one JSON object per finished job); a line cut off by a kill is skipped."""
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


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


def _similar(cell: Cell, results: Path, *, setting: bool = True, mode: str | None = None) -> list:
    """Measured A/B results of the same pipeline, mode (or `mode`) and size (any fix set), newest last (a file that
    cannot be read tells nothing about the time: `lab campaign plan` names it where it is a cell's result); with
    `setting` False, those without the cell's setting."""
    folder = results / "ab" / cell.pipeline
    size = cell.size_tag() if setting else naming.size_tag(cell.size, cell.option("layers"), cell.option("call"),
                                                          cell.option("steps"), decode=bool(cell.option("full_decode")))
    found = []
    for path in files.newest_last(files.written(folder.glob(f"*__{mode or cell.mode}__{size}__*.json"))):
        try:
            result = store.read(path)
        except LabError:
            continue
        if not isinstance(result, dict) and result.kind == "ab" and (
                (result.timed and result.samples.control.raw_wall_ms) or (result.phase_s or {}).get("call")):
            found.append(result)
    return found


def _compile_s(pipeline: str, results: Path) -> float:
    """Seconds compiling adds to a compiled job's first calls, where nothing compiled at its setting says (it is
    planned from eager results, or guessed): the most that any compiled A/B of `pipeline` under `results` recorded
    (both arms' first calls, `compilation`), else a guess.
    Regional compile is quick: a recorded compile time beats the guess, which is long enough to keep a compiled job
    from starting in a lent call it would fit."""
    seconds = []
    for path in files.written((results / "ab" / pipeline).glob("*__compile__*.json")):
        try:
            compiled = getattr(store.read(path), "compilation", None)
        except LabError:
            continue
        if compiled and compiled.get("control"):
            seconds.append(sum((compiled.get(arm) or {}).get("compile_s") or 0.0 for arm in ("control", "test")))
    return max(seconds, default=GUESS["compile"])


def _logged_seconds(job: Job, results: Path) -> tuple[list[float], list[float], list[float]]:
    """How long this job took where it finished before (any campaign's run log in `results/campaigns/`), how long the
    jobs of the same kind, pipeline and mode took in the same setting with other options (group offloading with and
    without `record_stream`, say), and how long they took in any other setting, depth or fix set."""
    from lab.run import settings

    first = job.cells[0]
    prefix = f"{first.kind}-{first.pipeline}-{first.mode}-"
    setting = first.option("setting")
    named = f"-{settings.parse(setting).name}-" if setting else None  # as the job ids tag it
    same, same_setting, alike = [], [], []
    for path in sorted((results / "campaigns").glob("*.jsonl")):
        for entry in read_log(path):
            name, seconds = str(entry.get("job", "")), entry.get("seconds")
            if entry.get("exit") != 0 or not isinstance(seconds, (int, float)):
                continue
            if name == job.id:
                same.append(float(seconds))
            elif name.startswith(prefix):
                (same_setting if named and named in name else alike).append(float(seconds))
    return same, same_setting, same_setting + alike


def blocks_on(cell: Cell, results: Path, device: str) -> int:
    """How many timing blocks the A/B result of `cell` measured on `device` (`h100`) holds that a run there can go on
    from (its sequential design stopped undecided); 0 where it has none."""
    return _resumable_blocks(cell.folder(results) / f"{cell.stem(device)}.json") if cell.kind == "ab" else 0


def _own_result(cell: Cell, results: Path, device: str | None):
    """The newest result of `cell` measured on `device` (any device where None); None where there is none or it
    cannot be read."""
    found = [p for p in cell.results_found(results, device or "*")
             if device is None or device_of(p.stem) == device]
    try:
        return store.read(found[-1]) if found else None
    except LabError:
        return None


def _one_trial(cell: Cell, results: Path, device: str | None) -> float | None:
    """Seconds of a calibration's shortest useful run: its build and its longest trial so far, from its own file (on
    `device`, if given; `lab calibrate` keeps each trial as it ends and starts none that would end past a time
    limit); None where no trial was measured, and it must fit whole."""
    calibration = _own_result(cell, results, device)
    trials = calibration.trials if calibration is not None else None
    seconds = [t.seconds for t in (trials.aa + trials.positive if trials else []) if t.seconds]
    if not seconds:
        return None
    return GUESS["build"].get(cell.size, 60.0) + max(seconds)


def _one_release(cell: Cell, results: Path, device: str | None) -> float | None:
    """Seconds of a history's shortest useful run: its build and one release's pair, the mean of its file's (on
    `device`, if given; `lab history` keeps each pair as it ends and starts none that would end past a time limit);
    None where no pair was measured, and it must fit whole."""
    history = _own_result(cell, results, device)
    pairs = [r for r in (history.releases if history else []) if r.status == "measured"]
    if not pairs or not history.seconds:
        return None
    return GUESS["build"].get(cell.size, 60.0) + history.seconds / len(pairs)


def _call_s(result, arm: str = "control") -> float:
    """Seconds of one timed call of an A/B result's control arm (or `arm`; the median of its calls), or of one plain
    call as its verification took them (`phase_s["call"]`) where it timed no block. The control arm runs what another
    cell of the same setting and base runs without its fix; the test arm may be several times faster (FLUX.1 in model
    CPU offload: 20.1 s calls, 4.2 s with `model_offload_keep_host`), and the median of both arms' calls fell between
    the two, a call time no arm had."""
    calls = getattr(result.samples, arm).raw_wall_ms if result.timed else None
    if calls:
        return stats.median([x for b in calls for x in b]) / 1e3
    return result.phase_s["call"]


def _base(stem: str) -> str:
    """The fixes both arms of an A/B run (`a+b-over-c`: `c`), from its result's or cell's stem; "" for none."""
    return stem.split("__")[0].partition("-over-")[2]


def _of_cell(result, cell: Cell) -> bool:
    """Whether `result` is one of `cell` (its name but the GPU's): not one of the same fixes in the other mode, say."""
    return result.name.rpartition("__")[0] == cell.stem("*").rpartition("__")[0]


def _part_of(cell: Cell, results: list, device: str | None):
    """The newest of `results` (same pipeline, mode, size and setting) that timed blocks over the same base with
    some of `cell`'s fixes and no other (on `device` first): its control arm is the cell's, and its test arm runs
    the cell's less some fixes, which mostly shorten a call or leave it as it was where they were measured, so its
    set-up and block times estimate the cell's far better than its control's calls do where a fix takes most of the
    call (Qwen-Image's set in group offloading: its control's 37.4 s calls planned 187 s blocks;
    `group_offload_keep_host` alone took 49 to 61 s on an H100 host, and the set 91 to 133 s on another, whose
    control calls took twice as long: `_cell_times` scales a part's times to the control's calls). Of several, the
    one whose blocks are shortest for its control's calls: it holds the most of the cell's change (Flux2 Klein's
    compiled set in group offloading, whose two parts are `group_offload_keep_host`, 130 s blocks at 45.4 s control
    calls, and `flux2_unpack_hw`, 226 s: planned from the newer, it could or could not start in an 8-minute call as
    one or the other was measured last). An estimate, not a bound. None for a cell of a change, or without such a
    result."""
    if cell._what():
        return None
    parts = [r for r in results if r.timed and r.block_s and set(r.base) == set(cell.base)
             and set(r.fixes) < set(cell.fixes)]
    # first, the cell itself on another GPU (a run cannot go on from its blocks there): its test arm is the cell's,
    # whole. Flux2 Klein's compiled set in model CPU offload on an H200 host: its H100 blocks said 78 s, the set
    # without `model_offload_keep_host` there 113 s (both scaled to the newest control calls); it took 37 to 54 s
    # (its own name but the GPU's: a compiled cell planned from eager results has none of its own among them)
    elsewhere = [r for r in results if r.timed and r.block_s and _of_cell(r, cell)
                 and device is not None and device_of(r.name) != device]
    if elsewhere:
        return elsewhere[-1]
    here = [r for r in parts if device is None or device_of(r.name) == device] or parts
    # the shortest blocks per control call; of equal ones, the newest
    return min(reversed(here), key=lambda r: stats.median(r.block_s) / _call_s(r), default=None)


def _calls_per_block(cell: Cell) -> int:
    """Calls one timing block of `cell` makes: its lead-in, then `repeat` timed calls per arm, each after its
    warm-up calls."""
    lead_in, repeat, warmup = (cell.option(k, d) for k, d in (("lead_in", 1), ("repeat", 2), ("warmup", 0)))
    return lead_in + 2 * repeat * (1 + warmup)


def estimate(job: Job, results: Path, resume: bool = False, device: str | None = None) -> Estimate:
    """Seconds one job will take: an A/B job from A/B results already measured at the same setting (their phase times
    and their control arms' call times, the newest of the same base first; the cell's own result, where there is one,
    gives its setup and block times, else a result over some of its fixes, `_part_of`, for each cell), any other job
    from the campaigns' run logs, else a stated guess. A cell's own `minutes` is its whole; an A/B measured before still
    says what its shortest useful run takes (`Estimate.least`). With `resume` (`lab ab --resume`), an A/B that stopped
    undecided goes on from its blocks and keeps its profiles: only the blocks it has left and its set-up count. With
    the `device` it will run on (`h100`), its own result is the one measured there, the only one a run can go on
    from; without, the newest of any device."""
    first = job.cells[0]
    own = (Estimate(60.0 * first.option("minutes") * len(job.cells), "the campaign file's own estimate")
           if first.option("minutes") else None)
    again = GUESS["build"].get(first.size, 60.0)
    if first.kind == "calibrate" and own:
        return dataclasses.replace(own, least=_one_trial(first, results, device), unit="trial", again=again)
    if first.kind == "history" and own:
        return dataclasses.replace(own, least=_one_release(first, results, device), unit="release", again=again)
    if first.kind != "ab":
        if own:
            return own
        same, same_setting, alike = _logged_seconds(job, results)
        if same or alike:
            kind = f"other {first.kind} jobs of {first.pipeline} {first.mode}"
            seconds, basis = ((same, "this job") if same else
                              (same_setting, f"{kind} in {first.option('setting').partition(':')[0]}") if same_setting
                              else (alike, kind))
            return Estimate(stats.median(seconds),
                            f"{basis} took {stats.median(seconds):,.0f} s (median of {len(seconds)} in the run logs)")
        return Estimate(GUESS["cell"][first.size] * len(job.cells), "guess (no estimate for this kind yet)")
    seen = _similar(first, results)
    build = GUESS["build"].get(first.size, 60.0) + (_compile_s(first.pipeline, results) if first.mode == "compile"
                                                    else 0.0)
    # a compiled job with nothing compiled measured at its setting: the eager calls of that setting, an upper bound
    # where compiling shortens the forwards and, in the offload settings, about the call (the copies, not the
    # forwards, set it: Flux2 Klein's set in model CPU offload, 16.5 s eager and 16.6 s compiled on the H200 host)
    eager = not seen and first.mode == "compile" and bool(seen := _similar(first, results, mode="eager"))
    if own and not seen:
        return own
    if not seen:
        guess = Estimate(build + GUESS["cell"][first.size] * len(job.cells), "guess: nothing measured at this setting")
        plain = _similar(first, results, setting=False) if first.option("setting") else []
        if not plain:  # a guessed minute for its set-up and one block: a time limit ends it as by a Ctrl-C
            return dataclasses.replace(guess, least=min(build + GUESS["block"], guess.seconds), again=build)
        # its shortest useful run (a time limit takes the blocks that fit) from the calls of the same pipeline without
        # the setting: the setting may make them slower, which the A/B's own stopping rule then meets
        call_s = _call_s(plain[-1])  # set-up (4 calls), then one profiled pair (the profiler slows ~3x), else a block
        profiled = first.option("profile", True) and first.option("profile_calls", 3)
        least = build + 4 * call_s + (2 * 3 if profiled else _calls_per_block(first)) * call_s
        return dataclasses.replace(guess, least=min(least, guess.seconds), again=build + 4 * call_s)
    # the newest of those whose control arm runs the same fixes as this job's (its base): a control over
    # `model_offload_keep_host` takes a quarter of the time of one without
    # and of those, one that timed blocks first: a run cut off before its first block keeps only a verification
    # call's time, of which arm it does not say (Flux2 Klein's set in group offloading: 26.4 s, its control 46.5 s)
    alike = [r for r in seen if _base(r.name) == _base(first.stem("*"))] or seen
    last = ([r for r in alike if r.timed and r.samples.control.raw_wall_ms] or alike)[-1]
    call_s = _call_s(last)
    if last.build_s:  # (an eager result's build, and a compile's time)
        build = last.build_s + (_compile_s(first.pipeline, results) if eager else 0.0)
    # a cell without a result of its own or of a part is planned as a fix of no effect, both arms at the control's
    # calls: its set-up from a result whose arms ran alike, where there is one (Qwen-Image's compiled group-offload
    # cells of one fix were planned at 184 s of set-up from `group_offload_keep_host`'s, whose test arm took 6 s
    # calls against 40 s, where `qwen_modulate_index`'s, which never ran, took 318 s)
    even = [r for r in alike if _arms_alike(r) and None not in _setup_phases(r)]
    cells = [_cell_plan(cell, seen, device, call_s, resume, (even or [last])[-1])
             for cell in job.cells]  # on the job's one build
    lead = cells[0]
    # the shortest useful run: with profiles to take, its first profiled pair (a time limit takes no more pairs than
    # fit, and a run cut off after them keeps them for the next, `lab ab --resume`: Flux2 Klein's cells in group
    # offloading, 43 s calls, took 11 minutes to a first block, out of reach of a 10-minute device call); else one
    # block, which a cell whose fixes never ran does without (its check of the outputs settles it)
    least = build + lead.setup + (min(lead.profiles, lead.pair_s) if lead.profiles else 0.0 if lead.unrun else
                                  lead.block_s)
    # a reason that several cells share is said once, with how many (the cells of one fix in one setting often share
    # one of a few hundred characters)
    short = collections.Counter(c.warning for c in cells if c.warning)
    warning = "; ".join(w if n == 1 else f"{n} cells: {w}" for w, n in short.items()) or None
    again = build + lead.setup_again
    if own:
        return dataclasses.replace(own, least=min(least, own.seconds), again=again, step=lead.block_s)
    borrowed = " (eager: nothing compiled measured at this setting)" if eager else ""
    mine, part, done, block_s, blocks = lead.own, lead.part, lead.done, lead.block_s, lead.blocks
    whose = "this cell on another GPU" if part is not None and _of_cell(part, first) else "over some of its fixes"
    basis = (f"this cell's {done} blocks so far, {block_s:,.0f} s each; at most {blocks} more" if done else
             f"{block_s:,.0f} s blocks measured in {mine.name}; at most {blocks} blocks" if mine and mine.block_s else
             f"{block_s:,.0f} s blocks from {part.name}, {whose}, at {call_s * 1e3:,.0f} ms control "
             f"calls (its own: {_call_s(part) * 1e3:,.0f} ms); at most {blocks} blocks" if part else
             f"{block_s:,.0f} s blocks measured in {mine.name}; at most {blocks} blocks" if mine else
             f"{call_s * 1e3:,.0f} ms calls measured in {last.name}{borrowed}; at most {blocks} blocks per cell")
    seconds = build + sum(c.setup + c.profiles + c.blocks * c.block_s for c in cells)
    return Estimate(seconds, basis, warning and f"{job.id}: {warning}", least, again=again, step=lead.block_s)


def _arms_alike(result) -> bool:
    """Whether an A/B result's two arms took about the same time (its test arm's calls within 10 % of its control's),
    or, with no block timed, none of its fixes ran."""
    if result.timed and result.samples.test.raw_wall_ms:
        return abs(_call_s(result, arm="test") / _call_s(result) - 1) <= 0.1
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


def _cell_plan(cell: Cell, seen: list, device: str | None, call_s: float, resume: bool, alike=None) -> _CellPlan:
    """What one A/B cell of a job will take (`_cell_times`, `_blocks_and_warning`): from its own result, where it has
    one, on `device` (a run goes on only from blocks measured there), each cell of a job from its own. Before, only
    the job of one cell read its own: FLUX.1's two model-offload cells that decode, undecided at 4 blocks each, were
    planned afresh and warned that their 8-minute budget could not reach the 8 blocks their design needs. `alike`:
    the result at the same setting that `call_s` comes from, whose set-up and profiles say what a cell with no result
    of its own or of some of its fixes takes for them."""
    own = ([r for r in seen if _of_cell(r, cell) and (device is None or device_of(r.name) == device)] or [None])[-1]
    part = _part_of(cell, seen, device) if not (own and own.block_s) else None
    done = _blocks_to_go_on_from(own) if resume else 0
    profiled = ([r for r in seen if _pair_s(r) is not None] or [None])[-1]
    setup, setup_again, pair_s, profiles, block_s = _cell_times(cell, own, part, call_s, resume, alike, profiled)
    blocks, warning = _blocks_and_warning(cell, block_s, done)
    unrun = own is None and not cell.base and _unrun_in(cell, seen) is not None
    if unrun:  # it settles as not exercised (`never_ran`): one block and no profiles (`lab.measure.ab.run`)
        blocks, warning, profiles = min(blocks, 1), None, 0.0
    return _CellPlan(own, part, done, setup, setup_again, pair_s, profiles, block_s, blocks, warning, unrun)


def _pair_s(result) -> float | None:
    """Seconds one profiled pair of an A/B result took, with its share of the traces' analysis: the profiles' own time
    (kept with them), else the phase of the run that took them; None where neither was recorded (a run going on
    from another's profiles before they kept their time)."""
    profile = result.profile or {}
    took = profile.get("seconds", (result.phase_s or {}).get("profile"))
    return took / profile["calls"] if took is not None and profile.get("calls") else None


def _cell_times(cell: Cell, mine, part, call_s: float, resume: bool, alike=None,
                profiled=None) -> tuple[float, float, float, float, float]:
    """Seconds of an A/B cell's set-up (warm-up and verification) in this run and in a later one going on from its
    blocks, of one profiled pair, of all its profiles and of one block: from its own result (`mine`), else from its
    result on another GPU or one over some of its fixes (`part`), else, for the set-up and the profiles, from
    `alike` (another fix at the same setting: what the profiler adds to a call is the setting's, little in group
    offloading and several times the call in the cache and LoRA settings),
    else from `call_s`, one control call, which the profiler slows about 3x. Where the result the times come from
    kept no profiles' time, the pair's is `profiled`'s (the newest at the same setting that kept one; Qwen-Image's
    compiled group-offload set was planned at a guessed 240 s pair from its part, which kept none, and could not
    start in a lent call: the pairs there took 1.2 to 2.4 control calls). A part may have run its control's calls at
    another speed than this cell's will (another host's copies, a drift): its times, `alike`'s and `profiled`'s,
    scale by `call_s` over its control's calls. A run going on from an undecided result keeps its profiles (it may
    have stopped in or after them, before any block), and compiled, where the result the times come from shows that
    the warm-up alone compiled what the blocks run, its verification (`kept_verification`: Qwen-Image's compiled
    group-offload cells of one fix, whose 127 s of verifying again with a 200 s block did not fit a lent call)."""
    scale = call_s / _call_s(part) if part is not None else 1.0
    if mine:
        timed_by, by = mine, 1.0
    elif part is not None:
        timed_by, by = part, scale
    else:
        timed_by, by = alike, call_s / _call_s(alike) if alike is not None else 1.0
    warmup, verify = _setup_phases(timed_by) if timed_by is not None else (None, None)
    setup = by * (warmup + verify) if warmup is not None and verify is not None else 4 * call_s
    if warmup is not None and cell.mode == "compile" and not timed_by.mode.startswith("compile"):
        # planned from an eager result: compiled, each arm warms up with one more call, and the verification makes
        # one more, counting, call of the test arm (`lab.measure.ab.run`); the compile's own time is in the build's
        # estimate (`_compile_s`). The test arm's calls: the cell's own or its part's test arm's (a set holding
        # `group_offload_keep_host`: 4 to 7 s against 22 to 46 s), else, from another fix's result, the control's
        test_s = by * _call_s(timed_by, arm="test") if mine is not None or part is not None else call_s
        setup += call_s + 2 * test_s
    again = by * warmup if warmup is not None and cell.mode == "compile" and kept_verification(timed_by) else setup
    if mine is not None and resume and mine.stopped in RESUMABLE:  # this run goes on from its own blocks
        setup = again
    # the profiles' own time (kept with them), else the phase of the run that took them, else another result's at the
    # setting, else a guess
    pair = _pair_s(timed_by) if timed_by is not None else None
    if pair is not None:
        pair_s = by * pair
    elif profiled is not None:
        pair_s = call_s / _call_s(profiled) * _pair_s(profiled)
    else:
        pair_s = 2 * 3 * call_s
    kept = resume and mine is not None and mine.stopped in RESUMABLE and mine.profile is not None
    profile_calls = cell.option("profile_calls", 3) if cell.option("profile", True) else 0
    profiles = 0.0 if kept else pair_s * profile_calls
    block_s = (stats.median(mine.block_s) if mine and mine.block_s else scale * stats.median(part.block_s) if part
               else _calls_per_block(cell) * call_s)
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
