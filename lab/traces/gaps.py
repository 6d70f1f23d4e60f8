"""What the host did in the gaps: the Python functions that ran between transformer calls and while the GPU sat
idle, from the trace's Python function events (`with_stack`).

Two kinds of window:

- **CPU gaps**: from the end of one `transformer_forward` span to the start of the next (the guide's "CPU gaps").
  Each is *within a step* (both calls in one `denoise_step_<i>`) or *between steps*.
- **GPU idle gaps** longer than a threshold: the time no kernel, copy or memset ran. Each lies *before the loop*,
  *in a step*, *between steps* or *after the loop* (by the `denoise_step_<i>` spans; *in the call* without them).

For every kind the host time inside its windows is broken down by function: **inclusive** (the function and what
it called) and **self** (the function alone), summed over the windows of that kind and ranked by self time, and
again by inclusive time (the callers, without the frames that span every gap whole, such as the pipeline's
`__call__`); the call chain with the most self time is the hottest; the folded stacks (`a;b;c self_us`) feed a flame graph. A trace without Python
stacks, or without the spans a kind needs, says so instead.
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from lab.traces.timeline import lab_wrapper_pattern, normalize_name, short_frame, steps, union_length, us
from lab.traces.trace import Trace

TRANSFORMER = "transformer_forward"
_LAB_FIX = re.compile(r" \[lab fix: [^\]]+\]")
# the lab's own instrumentation and torch's wrappers: kept in the chains, left out of the ranking
_PLUMBING = re.compile(r"^nn\.Module:|^<built-in method __exit__|torch/autograd/profiler\.py|torch/_ops\.py"
                       r"|(^|/)contextlib\.py|^<built-in function next>|^<built-in method _record_function_"
                       r"|" + lab_wrapper_pattern())


def parent_index(ids: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """Each event's parent's index: the last event whose Python id is its parent id, or -1 (a sorted search)."""
    if len(ids) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    at = np.clip(np.searchsorted(ordered, parents, side="right") - 1, 0, None)
    return np.where((parents >= 0) & (ordered[at] == parents), order[at], -1)


class PythonCalls:
    """The main thread's Python function events as arrays, with each event's parent's index (-1 at the root)."""

    def __init__(self, trace: Trace) -> None:
        py = trace.cat("python_function")
        tids, counts = np.unique(py.tid, return_counts=True)
        thread = trace.main_tid if trace.main_tid in tids or not len(tids) else int(tids[np.argmax(counts)])
        main = np.flatnonzero(py.tid == thread)
        # one name per function across traces: no object addresses, no lab-fix marker on a rewritten function
        # (worked out once per distinct name: a trace repeats a few thousand names hundreds of thousands of times)
        raw = [py.names[i] for i in main.tolist()] if len(main) != len(py.names) else list(py.names)
        clean = {name: _LAB_FIX.sub("", normalize_name(short_frame(name))) for name in set(raw)}
        self.names = list(map(clean.__getitem__, raw))
        self.ts, self.end = py.ts[main], py.end[main]
        ids = py.extra["pyid"][main] if "pyid" in py.extra else np.full(len(main), -1)
        parents = py.extra["pyparent"][main] if "pyparent" in py.extra else np.full(len(main), -1)
        self._parents = parent_index(ids, parents).tolist()
        self._chains: dict[int, tuple[str, int]] = {}  # event -> (its chain, how many frames it holds)

    def __bool__(self) -> bool:
        return len(self.names) > 0

    def chain(self, i: int) -> str:
        """`root;...;function` of event i, at most the innermost 200 frames (each event's chain is its parent's and
        its own name, so a trace's chains cost one join per event)."""
        known = self._chains.get(i)
        if known is not None:
            return known[0]
        todo, k = [], i
        while k >= 0 and k not in self._chains and len(todo) < 200:
            todo.append(k)
            k = self._parents[k]
        if k >= 0 and k not in self._chains:  # 200 frames up and not at the root: the innermost 200, unshared
            return self._walk(i)
        prefix, depth = self._chains[k] if k >= 0 else ("", 0)
        for j in reversed(todo):
            if depth >= 200:  # deeper than 200 frames: the innermost 200, as the walk from the event gives them
                return self._walk(i)
            prefix, depth = (f"{prefix};{self.names[j]}" if prefix else self.names[j]), depth + 1
            self._chains[j] = (prefix, depth)
        return self._chains[i][0]

    def _walk(self, i: int) -> str:
        path, k = [], i
        while k >= 0 and len(path) < 200:
            path.append(self.names[k])
            k = self._parents[k]
        return ";".join(reversed(path))

    def outermost(self, i: int) -> bool:
        """Whether no caller of event i is the same function (recursion)."""
        name, k = self.names[i], self._parents[i]
        while k >= 0:
            if self.names[k] == name:
                return False
            k = self._parents[k]
        return True

    def inside(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Events overlapping [a, b): their indices, inclusive ns inside the window, and self ns inside it."""
        hit = np.flatnonzero((self.ts < b) & (self.end > a))
        overlap = np.minimum(self.end[hit], b) - np.maximum(self.ts[hit], a)
        position = {int(i): k for k, i in enumerate(hit.tolist())}
        own = overlap.astype(np.int64).copy()
        for k, i in enumerate(hit.tolist()):
            p = position.get(self._parents[i])
            if p is not None:
                own[p] -= overlap[k]
        return hit, overlap, np.maximum(own, 0)


def _kind_of_cpu_gap(a: int, b: int, spans: list[tuple[int, int, int]]) -> str:
    for _, s, e in spans:
        if s <= a and b <= e:
            return "within a step"
    return "between steps" if spans else "between transformer calls"


def _kind_of_idle_gap(a: int, b: int, spans: list[tuple[int, int, int]]) -> str:
    if not spans:
        return "in the call"
    if b <= spans[0][1]:
        return "before the loop"
    if a >= spans[-1][2]:
        return "after the loop"
    for _, s, e in spans:
        if s <= a and b <= e:
            return "in a step"
    return "between steps"


SOURCES = ("cpu gap", "gpu idle")


def windows(trace: Trace, idle_threshold_us: float = 100.0,
            sources: tuple[str, ...] = SOURCES) -> tuple[list[dict], list[str]]:
    """The CPU gaps and GPU idle gaps of a trace (those of `sources`), each `{"kind", "source", "start", "end"}`
    (ns), and notes on what could not be found."""
    notes, out = [], []
    spans = steps(trace)
    ann = trace.annotations
    calls = sorted((int(t), int(t + d)) for n, t, d in zip(ann.names, ann.ts, ann.dur) if n == TRANSFORMER)
    if "cpu gap" in sources:
        if len(calls) > 1:
            ended = calls[0][1]  # the end of every span so far: a nested or concurrent span leaves no gap
            for s1, e1 in calls[1:]:
                if s1 > ended:
                    out.append({"source": "cpu gap", "kind": _kind_of_cpu_gap(ended, s1, spans), "start": ended,
                                "end": s1})
                ended = max(ended, e1)
        else:
            notes.append(f"no `{TRANSFORMER}` spans: CPU gaps need the lab's or the upstream harness's labels "
                         "(`lab profile`); the GPU idle gaps below need only GPU activity")
    if "gpu idle" in sources:
        if trace.has_gpu:
            gpu = trace.gpu
            _, ms, me = union_length(gpu.ts, gpu.end)
            for a, b in zip(me[:-1].tolist(), ms[1:].tolist()):
                if b - a > idle_threshold_us * 1000:
                    out.append({"source": "gpu idle", "kind": _kind_of_idle_gap(a, b, spans), "start": a, "end": b})
        else:
            notes.append("no GPU activity: no GPU idle gaps (a CPU-only trace)")
    if not spans:
        notes.append("no denoise_step spans: gaps are not split into within and between steps")
    return out, notes


def attribute(trace: Trace, idle_threshold_us: float = 100.0, top: int = 12,
              sources: tuple[str, ...] = SOURCES) -> dict:
    """Host time in each kind of gap (of `sources`: both, or the CPU gaps alone, say), by function (see the module
    docstring)."""
    found, notes = windows(trace, idle_threshold_us, sources)
    calls = PythonCalls(trace)
    kinds: dict[tuple[str, str], dict] = {}
    for w in found:
        k = kinds.setdefault((w["source"], w["kind"]), {"source": w["source"], "kind": w["kind"], "gaps": 0,
                                                          "gap_us": [], "functions": defaultdict(lambda: [0, 0]),
                                                          "folded": defaultdict(int)})
        k["gaps"] += 1
        k["gap_us"].append(us(w["end"] - w["start"]))
        if not calls:
            continue
        hit, inclusive, own = calls.inside(w["start"], w["end"])
        for i, inc, s in zip(hit.tolist(), inclusive.tolist(), own.tolist()):
            name = calls.names[i]
            if calls.outermost(i):  # a recursive call's time is already in its caller's inclusive time
                k["functions"][name][0] += inc
            k["functions"][name][1] += s
            if s > 0:
                k["folded"][calls.chain(i)] += s
    if not calls:
        notes.append("no Python function events: profile with with_stack=True (`lab profile` does by default) to "
                     "see which functions ran in the gaps; only the gaps' sizes are given")
    out = []
    for k in kinds.values():
        ranked = sorted(((n, v) for n, v in k["functions"].items() if not _PLUMBING.search(n)),
                        key=lambda nv: -nv[1][1])[:top]
        hottest = max(k["folded"].items(), key=lambda kv: kv[1], default=None)
        gaps = np.asarray(k["gap_us"])
        whole = gaps.sum() * 1000
        # what called the expensive leaves: by inclusive time, leaving out the frames that span every gap whole
        callers = sorted(((n, v) for n, v in k["functions"].items() if not _PLUMBING.search(n) and v[0] < 0.95 * whole
                          and not n.startswith("<built-in")), key=lambda nv: -nv[1][0])[:top]
        out.append({
            "source": k["source"], "kind": k["kind"], "gaps": k["gaps"], "total_us": float(gaps.sum()),
            "median_us": float(np.median(gaps)), "max_us": float(gaps.max()),
            "functions": [{"function": n, "inclusive_us": us(v[0]), "self_us": us(v[1])} for n, v in ranked],
            "callers": [{"function": n, "inclusive_us": us(v[0]), "self_us": us(v[1])} for n, v in callers],
            "hottest_chain": {"chain": hottest[0], "self_us": us(hottest[1])} if hottest else None,
            "folded": {chain: us(v) for chain, v in sorted(k["folded"].items(), key=lambda kv: -kv[1])},
        })
    out.sort(key=lambda k: (k["source"], -k["total_us"]))
    totals: dict[str, dict] = {}
    for k in kinds.values():  # every function's time over every gap of one source, for comparing two traces
        t = totals.setdefault(k["source"], {"gap_us": 0.0, "functions": defaultdict(lambda: [0.0, 0.0])})
        t["gap_us"] += float(sum(k["gap_us"]))
        for name, (inc, own) in k["functions"].items():
            t["functions"][name][0] += us(inc)
            t["functions"][name][1] += us(own)
    return {"kinds": out, "notes": notes, "idle_threshold_us": idle_threshold_us, "with_stack": bool(calls),
            "totals": {src: {"gap_us": t["gap_us"], "functions": dict(t["functions"])} for src, t in totals.items()}}


def top_functions(attributed: dict, source: str, top: int = 3) -> list[dict]:
    """The `top` functions with the most self time over every gap of one source (`"cpu gap"`, `"gpu idle"`) of an
    `attribute` result, the lab's and torch's plumbing left out: `{function, self_ms}`, most first."""
    functions = attributed.get("totals", {}).get(source, {}).get("functions", {})
    ranked = sorted(((name, own) for name, (_, own) in functions.items() if own > 0 and not _PLUMBING.search(name)),
                    key=lambda nv: -nv[1])[:top]
    return [{"function": name, "self_ms": own / 1000} for name, own in ranked]


def top_callers(attributed: dict, source: str, top: int = 3) -> list[dict]:
    """The `top` functions with the most inclusive time over every gap of one source of an `attribute` result, the
    plumbing and the frames that span nearly every gap whole (the pipeline's `__call__`) left out: what called the
    expensive leaves, `{function, inclusive_ms}`, most first."""
    total = attributed.get("totals", {}).get(source, {})
    whole = total.get("gap_us", 0.0)
    ranked = sorted(((name, inc) for name, (inc, _) in total.get("functions", {}).items()
                     if 0 < inc < 0.95 * whole and not _PLUMBING.search(name) and not name.startswith("<built-in")),
                    key=lambda nv: -nv[1])[:top]
    return [{"function": name, "inclusive_ms": inc / 1000} for name, inc in ranked]


def moved(control: dict, test: dict, top: int = 10) -> list[dict]:
    """Which functions' host time in the gaps changed between two attributions, by the change of their inclusive
    time summed over every gap of one source (leaving out the frames that span the gaps whole, such as the pipeline's
    `__call__`): where a fix's saving came from."""
    rows = []
    for source in set(control.get("totals", {})) | set(test.get("totals", {})):
        c = control.get("totals", {}).get(source, {"gap_us": 0.0, "functions": {}})
        t = test.get("totals", {}).get(source, {"gap_us": 0.0, "functions": {}})
        for fn in set(c["functions"]) | set(t["functions"]):
            if _PLUMBING.search(fn):
                continue
            ci, cs = c["functions"].get(fn, (0.0, 0.0))
            ti, ts = t["functions"].get(fn, (0.0, 0.0))
            if ci >= 0.95 * c["gap_us"] > 0 or ti >= 0.95 * t["gap_us"] > 0:
                continue
            rows.append({"source": source, "function": fn, "control_us": ci, "test_us": ti, "delta_us": ti - ci,
                         "control_self_us": cs, "test_self_us": ts})
    rows.sort(key=lambda r: -abs(r["delta_us"]))
    return rows[:top]


def folded_text(kind: dict) -> str:
    """A kind's folded stacks in the format flame graph tools read (`chain value`, value in whole µs)."""
    return "".join(f"{chain} {round(v)}\n" for chain, v in kind["folded"].items() if round(v) > 0)
