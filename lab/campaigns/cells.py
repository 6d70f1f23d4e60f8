"""The campaign file: a TOML file names the matrix to measure; this module reads it and expands it into cells (one
result each) and jobs (one `lab` process each). Which cells have a result is `lab.campaigns.status`'s, what the rest
will take `lab.campaigns.estimates`'.

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

Every other key is an option of the cell's subcommand (`kind`: ab, the default; sweep; hunt; calibrate; census),
written as in the command line with `_` for `-`: `max_blocks = 30` is `--max-blocks 30`, `profile = false` is
`--no-profile`. Cells of `lab ab` that share a pipeline, a build and their options run as one job, on one build. A
cell of kind `script` runs a benchmark script instead (`command = "python benchmarks/x.py ..."`) and counts as
measured when the file it `writes` exists.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from lab.base import files, naming
from lab.base.errors import UsageError, unknown_name

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
    scenarios = catalog()
    cells = [cell for group, table in enumerate(data["cell"], start=1)
             for cell in _cells_of(path, group, table, defaults, scenarios)]
    if not cells:
        raise UsageError(f"{path}: its [[cell]] tables select no cell (no fix of a `fix` value applies to its "
                         "pipeline on the installed diffusers): nothing to measure.")
    return Campaign(path, head.get("description", ""), device, tuple(cells), data.get("slurm", {}))


def _cells_of(path: Path, group: int, table: dict, defaults: dict, scenarios) -> list[Cell]:
    """The cells one [[cell]] table (number `group`) stands for, over the file's [defaults]: its axes multiplied out,
    each `fix` value resolved to its fix sets, a set named twice once."""
    spec = {**defaults, **table}
    kind = spec.pop("kind", "ab")
    if kind not in KINDS:
        raise unknown_name("cell kind", kind, KINDS)
    if kind == "script":
        if "command" not in table or "writes" not in table:
            raise UsageError(f"{path}: [[cell]] number {group} is a script: it needs `command` and `writes`.")
        return [Cell("script", table.get("pipeline", "-"), (), tuple(sorted(
            (k, v) for k, v in table.items() if k != "kind")), group)]
    if "pipeline" not in spec:
        raise UsageError(f"{path}: [[cell]] number {group} names no `pipeline`.")
    axes = {k: _as_list(spec.pop(k)) for k in AXES if k in spec}
    fix_values = axes.pop("fix", [""])
    if kind == "ab" and "diffusers" in spec and {"each", "all"} & set(fix_values):
        raise UsageError(f"{path}: [[cell]] number {group} is an A/B on diffusers {spec['diffusers']}: name its "
                         "fixes (`each` and `all` are resolved on the installed diffusers, whose catalog may "
                         "differ from that release's).")
    cells = []
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
                if fixes not in seen:
                    seen.add(fixes)
                    cells.append(Cell(kind, pipeline, fixes, options, group))
    return cells


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
    # among the set makes its test arm's calls several times shorter, so a job led by its set starts in a time limit
    # that one led by a cell of one fix, both arms at the control's calls, does not)
    return [Job(tuple(sorted(c, key=lambda cell: len(cell.fixes) < 2))) for c in grouped.values()]


def check_settings(plan: Campaign) -> None:
    """Every cell's setting against its pipeline, as `lab` checks it before a build (the device aside: the file may be
    planned on another machine): a cell the lab would refuse is one error naming the file, the cell and the reason,
    before anything runs rather than in its job."""
    from lab.run import settings
    from lab.run.scenario import get_scenario, setting_target

    asked: set[tuple[str, str]] = set()
    for cell in plan.cells:
        text = cell.option("setting")
        if not text or (cell.pipeline, text) in asked:
            continue
        asked.add((cell.pipeline, text))
        for setting in settings.parse_all([text]):
            why = settings.refusal(setting, setting_target(get_scenario(cell.pipeline)), None)
            if why:
                raise UsageError(f"{plan.path}: [[cell]] number {cell.group} ({cell.label}): `--setting "
                                 f"{setting.name}` cannot run on `{cell.pipeline}`: {why}. Take it out of the cell.")
