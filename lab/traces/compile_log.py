"""The compiler's own account of a run: PyTorch's structured log (`TORCH_TRACE`, what `tlparse` reads), captured
while the lab runs and read back into graph breaks (reason and user line), compilations and recompiles (with the
guard that failed), guard counts and compile time.

:class:`StructuredLog` turns the log on for a directory, in this process, for as long as it is open (torch reads
`TORCH_TRACE` when it sets up its logging; the lab sets that up again with the variable set, and back afterwards).
:meth:`StructuredLog.mark` splits the records into phases (an arm's first calls, the timed calls), so that each
compilation is charged to the phase that caused it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

_LINE = re.compile(r"^[VIWEC]\d{4} [\d:.]+\s+\d+ [^\]]*\] (\{.*\})$")
_BREAK_AT = re.compile(r"Graph break in user code at (.+):(\d+)")
_REASON = re.compile(r"Graph Break Reason: (.*)")


def records(text: str) -> list[dict[str, Any]]:
    """The records of a structured log: each JSON envelope, with `payload` holding the tab-indented lines after it."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith("\t") and out:
            out[-1].setdefault("payload", []).append(line[1:])
            continue
        m = _LINE.match(line)
        if m:
            try:
                out.append(json.loads(m.group(1)))
            except json.JSONDecodeError:
                continue
    return out


def _text(record: dict) -> str:
    return "\n".join(record.get("payload", []))


def summarize(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Graph breaks (deduplicated by user line and reason, with how often, and the frames whose compiling broke
    there, `frame_key`), compilations, recompiles with the guard that failed, guards and compile time, from the
    records of one phase."""
    compilations, breaks, recompiles = [], {}, []
    named = {}  # frame id -> its key, from its compilations
    for r in recs:
        m = r.get("compilation_metrics")
        if m and m.get("compile_id"):
            named[str(m["compile_id"]).split("/")[0]] = frame_key(m.get("co_name"), _short(m.get("co_filename")))
    in_frames: dict[tuple, set] = {}
    for r in recs:
        if "compilation_metrics" in r:
            m = r["compilation_metrics"]
            compilations.append({
                "compile_id": m.get("compile_id"), "function": m.get("co_name"),
                "where": f"{_short(m.get('co_filename'))}:{m.get('co_firstlineno')}",
                "guards": m.get("guard_count"), "guard_latency_us": m.get("guard_latency_us"),
                "compile_s": m.get("entire_frame_compile_time_s"), "recompile_reason": m.get("recompile_reason"),
                "failed": m.get("fail_type") and f"{m.get('fail_type')}: {m.get('fail_reason')}"})
        artifact = r.get("artifact", {}).get("name")
        if artifact == "dynamo_graph_break_reason":
            text = _text(r)
            at, reason = _BREAK_AT.search(text), _REASON.search(text)
            where = f"{_short(at.group(1))}:{at.group(2)}" if at else "?"
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            explanation = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Explanation:")), None)
            key = (where, explanation or (reason.group(1) if reason else lines[1] if len(lines) > 1 else text[:200]))
            breaks[key] = breaks.get(key, 0) + 1
            if str(r.get("frame_id")) in named:
                in_frames.setdefault(key, set()).add(named[str(r.get("frame_id"))])
        elif artifact == "recompile_reasons":
            text = _text(r)
            try:
                reasons = json.loads(text)
            except json.JSONDecodeError:
                reasons = [text]
            reasons = reasons if isinstance(reasons, list) else [reasons]
            first = reasons[0].splitlines()[0] if reasons and reasons[0] else "?"
            recompiles.append({"frame": r.get("frame_id"), "compile_id": r.get("frame_compile_id"),
                               "guard": " ".join(first.split())})
    return {
        "compilations": len(compilations),
        "recompiles": len([c for c in compilations if c["compile_id"] and not str(c["compile_id"]).endswith("/0")]),
        "graph_breaks": sum(breaks.values()),
        "graph_break_sites": [{"where": w, "reason": why, "count": n,
                               **({"frames": sorted(in_frames[w, why])} if (w, why) in in_frames else {})}
                              for (w, why), n in breaks.items()],
        "recompile_reasons": recompiles,
        "guards": sum(c["guards"] or 0 for c in compilations),
        "compile_s": sum(c["compile_s"] or 0 for c in compilations),
        "frames": compilations,
    }


def merge(*parts: dict) -> dict:
    """One summary of several phases' summaries."""
    out = summarize([])
    sites: dict[tuple, int] = {}
    frames: dict[tuple, set] = {}
    for p in parts:
        for key in ("compilations", "recompiles", "graph_breaks", "guards", "compile_s"):
            out[key] += p[key]
        out["recompile_reasons"] += p["recompile_reasons"]
        out["frames"] += p["frames"]
        for site in p["graph_break_sites"]:
            sites[(site["where"], site["reason"])] = sites.get((site["where"], site["reason"]), 0) + site["count"]
            if "frames" in site:
                frames.setdefault((site["where"], site["reason"]), set()).update(site["frames"])
    out["graph_break_sites"] = [{"where": w, "reason": r, "count": n,
                                 **({"frames": sorted(frames[w, r])} if (w, r) in frames else {})}
                                for (w, r), n in sites.items()]
    return out


def frame_key(function: str | None, where: str | None) -> str:
    """One compiled frame, as `file:function`: the file without the line (a fix's rewrite of a module, `file [lab fix:
    name]`, is the same file) and the function without Dynamo's resume prefix (`torch_dynamo_resume_in_f_at_12` is
    the rest of `f` after a graph break), so that both arms' compilations of one function compare."""
    return _file_of(where) + ":" + re.sub(r"^torch_dynamo_resume_in_(.+)_at_\d+$", r"\1", function or "?")


def _file_of(where: str | None) -> str:
    """`file:line` without the line, and without the tag of a fix's rewrite (`file [lab fix: name]`)."""
    return re.sub(r":\d+$", "", re.sub(r" \[lab fix: [^\]]*\]", "", where or "?"))


def _frames_of(site: dict, arm: dict) -> set[str]:
    """The frames whose compiling broke the graph at `site`: recorded with it (the log's frame ids), or, in summaries
    written before it kept them, the arm's compiled function that starts closest above the break's line in its file;
    empty where no compiled frame of the arm lies in that file (a break inside a function called from another file)."""
    if "frames" in site:
        return set(site["frames"])
    file, line = _file_of(site["where"]), site["where"].rpartition(":")[2]
    above = []
    for f in arm["frames"]:
        start = f["where"].rpartition(":")[2]
        if _file_of(f["where"]) == file and start.isdigit() and line.isdigit() and int(start) <= int(line):
            above.append((int(start), frame_key(f["function"], f["where"])))
    return {max(above)[1]} if above else set()


def compare_arms(control: dict, test: dict, steady: dict) -> list[str]:
    """What compilation says about a fix: graph breaks it adds, moves or removes, recompiles after warm-up. `control`
    and `test` are each arm's first calls, `steady` every call after the verification (profiles, timing), or after
    the warm-up where a run going on kept the verification (`lab.results.going_on.kept_verification`).

    A break the control's first calls met and the test's did not is said to be removed only where the test arm
    compiled the same frame again and broke nowhere new in it: the test arm runs after the control in one process
    and reuses the control's compiled code wherever its guards still hold, so a break it did not meet there is one
    it never traced (a test arm that recompiles only the offload hook's `post_forward` would otherwise be said to
    remove the onload hook's break too). Where the test arm
    broke elsewhere in that frame (or in code of its own that no compiled frame of its file holds, a fix's wrapper),
    the fix moves the break."""
    notes = []
    c_sites = {(s["where"], s["reason"]): s for s in control["graph_break_sites"]}
    t_sites = {(s["where"], s["reason"]): s for s in test["graph_break_sites"]}
    retraced = {frame_key(f["function"], f["where"]) for f in test["frames"]}
    gone = {key: _frames_of(c_sites[key], control) & retraced for key in sorted(c_sites.keys() - t_sites.keys())}
    new = {key: _frames_of(t_sites[key], test) for key in sorted(t_sites.keys() - c_sites.keys())}
    by_frames: dict[frozenset, list] = {}
    for key, frames in gone.items():
        if frames:  # else not traced again by the test arm: nothing to say
            by_frames.setdefault(frozenset(frames), []).append(key)
    moved_to: set = set()
    for frames, keys in by_frames.items():
        to = [key for key, in_frames in new.items() if not in_frames or in_frames & frames]
        moved_to.update(to)
        if to:
            notes.append(f"the fix moves the graph break(s) in {', '.join(sorted(frames))}: "
                         + "; ".join(f"{w} ({r})" for w, r in keys) + " -> " + "; ".join(f"{w} ({r})" for w, r in to))
        else:
            notes += [f"finding: the fix removes the graph break at {w} ({r})" for w, r in keys]
    for where, reason in new:
        if (where, reason) not in moved_to:
            notes.append(f"the test arm adds a graph break at {where}: {reason}")
    if test["recompiles"] > control["recompiles"]:
        guards = test["recompile_reasons"][0]["guard"] if test["recompile_reasons"] else "no reason logged"
        limit = recompile_limit()
        hit = (f"; it reached torch's limit of {limit} recompiles, after which the frame runs uncompiled"
               if limit and test["recompiles"] >= limit else "")
        notes.append(f"the test arm recompiles {test['recompiles']} time(s) in its first calls (first failed guard: "
                     f"{guards}){hit}")
    if steady["compilations"]:
        guards = "; ".join(sorted({r["guard"] for r in steady["recompile_reasons"]})[:3]) or "no reason logged"
        notes.append(f"{steady['compilations']} compilation(s) after the warm-up calls, during the timed and profiled "
                     f"calls: it recompiles at steady state (failed guard: {guards})")
    return notes


def recompile_limit() -> int | None:
    """torch's recompile limit per frame (`torch._dynamo.config.recompile_limit`, 8 by default)."""
    try:
        import torch._dynamo.config as config
    except ImportError:  # pragma: no cover
        return None
    return getattr(config, "recompile_limit", None) or getattr(config, "cache_size_limit", None)


def _short(path: str | None) -> str:
    if not path:
        return "?"
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


class StructuredLog:
    """`TORCH_TRACE` into `directory` while open; `mark(phase)` closes the phase so far and starts `phase`."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.phases: list[tuple[str, int]] = []  # (phase, the number of records when it started)
        self._phase = "start"
        self._saved: tuple[Any, Any] | None = None
        self._earlier: set[str] = set()  # logs of an earlier run into the same directory: not this run's

    def __enter__(self) -> "StructuredLog":
        import torch._logging._internal as internal

        self.directory.mkdir(parents=True, exist_ok=True)
        self._earlier = {p.name for p in self.directory.glob("dedicated_log_torch_trace_*.log")}
        self._saved = (os.environ.get("TORCH_TRACE"), internal.LOG_TRACE_HANDLER)
        os.environ["TORCH_TRACE"] = str(self.directory)
        internal.LOG_TRACE_HANDLER = None
        internal._init_logs()
        self.phases = [("start", 0)]
        return self

    def __exit__(self, *exc) -> None:
        import torch._logging._internal as internal

        handler = internal.LOG_TRACE_HANDLER
        if handler is not None:
            handler.close()
        env, old = self._saved
        if env is None:
            os.environ.pop("TORCH_TRACE", None)
        else:
            os.environ["TORCH_TRACE"] = env
        internal.LOG_TRACE_HANDLER = old
        internal._init_logs()

    def _records(self) -> list[dict]:
        import torch._logging._internal as internal

        handler = internal.LOG_TRACE_HANDLER
        if handler is not None and handler.stream is not None:
            handler.flush()
        recs: list[dict] = []
        for path in sorted(self.directory.glob("dedicated_log_torch_trace_*.log")):
            if path.name not in self._earlier:
                recs += records(path.read_text(errors="replace"))
        return recs

    def mark(self, phase: str) -> None:
        self.phases.append((phase, len(self._records())))

    def by_phase(self) -> dict[str, dict]:
        """Each phase's summary (the records between its mark and the next)."""
        recs = self._records()
        bounds = self.phases + [("end", len(recs))]
        return {name: summarize(recs[start:stop]) for (name, start), (_, stop) in zip(bounds, bounds[1:])}


def tlparse(directory: Path, out: Path) -> Path | None:
    """The HTML report of `tlparse`, when it is installed (`pip install tlparse`); None otherwise or if it fails."""
    beside = Path(sys.executable).parent / "tlparse"  # installed into the lab's environment, not on PATH
    exe = shutil.which("tlparse") or (str(beside) if beside.exists() else None)
    logs = sorted(Path(directory).glob("dedicated_log_torch_trace_*.log"), key=lambda p: p.stat().st_mtime)
    if exe is None or not logs:
        return None
    proc = subprocess.run([exe, str(logs[-1]), "-o", str(out), "--overwrite", "--no-browser"], capture_output=True,
                          text=True)
    return out if proc.returncode == 0 and (out / "index.html").exists() else None
