"""`lab ab --isolate`: each arm in its own process, so no state of one arm (patched code, compiled graphs, caches,
allocator) can reach the other. The parent keeps the interleaved, counterbalanced schedule and asks each worker
for calls over a pipe (JSON lines), as pyperf's manager does with its workers.

    python -m lab.run.worker   # started by IsolatedArm; reads its configuration as the first line of stdin
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from lab.base.errors import LabError
from lab.base.paths import child_pythonpath
from lab.run.description import Run
from lab.run.runner import CallResult


class IsolatedArm:
    """An arm of the A/B run by a worker process that built its own pipeline with its own fixes applied.

    `run` is what the worker builds (`lab.run.description.Run`, sent as its message); `patches` are diff files the
    worker applies as one change (`lab.apply.change`); `diffusers` (a
    `lab.apply.releases.Diffusers`) is the diffusers the worker imports, first on its `PYTHONPATH` (None: the installed
    one). `self.ready` is the worker's first answer: the diffusers it imported, and where from.
    """

    def __init__(self, name: str, fixes: list, run: Run, patches: tuple[str, ...] = (), diffusers: Any = None,
                 start: bool = True) -> None:
        self.name = name
        self.fixes = fixes
        self.hook = None
        self.diffusers = diffusers
        self.run = run
        self.config = {"fixes": [f.name for f in fixes if not f.lines], "patches": [str(Path(p).resolve()) for p in patches],
                       "run": run.message()}
        self.proc: subprocess.Popen | None = None
        self.started = 0  # worker processes started so far
        self.stalls_total = 0  # injected stalls run in this arm's processes (`WorkerPairs`)
        self._stalls_seen = 0
        if start:
            self.start()
            self.wait_ready()

    def start(self, stall_ms: float = 0.0) -> None:
        """Start a worker process (the one before must be closed); it builds while the caller goes on, and
        `wait_ready` waits for it. `stall_ms`: a host stall of that many ms per step in every call of this process
        only (a process-level slowdown, for calibration and tests; 0: none)."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        d = self.diffusers
        env["PYTHONPATH"] = child_pythonpath(*([d.site] if d is not None and d.site is not None else []))
        # What the worker's pipeline prints (progress bars, warnings, a traceback) goes to a log of its own.
        fd, log = tempfile.mkstemp(prefix=f"lab-worker-{self.name}-", suffix=".log")
        self.log = Path(log)
        with os.fdopen(fd, "w") as sink:
            self.proc = subprocess.Popen([sys.executable, "-m", "lab.run.worker"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=sink, text=True, env=env)
        self.started += 1
        self._stalls_seen = 0
        self._send({**self.config, "stall_ms": stall_ms})

    def spare(self) -> IsolatedArm:
        """An arm of the same configuration with no worker yet: one to start ahead of the block it serves
        (`WorkerPairs.at_once`), then `adopt`ed."""
        other = IsolatedArm.__new__(IsolatedArm)
        other.__dict__.update(self.__dict__, proc=None, started=0, stalls_total=0, _stalls_seen=0)
        return other

    def adopt(self, other: IsolatedArm) -> None:
        """Close this arm's worker and go on with `other`'s (started and ready)."""
        self.close()
        self.proc, self.log, self.ready, self._stalls_seen = other.proc, other.log, other.ready, other._stalls_seen
        self.started += other.started
        self.stalls_total += other.stalls_total
        other.proc = None

    def wait_ready(self) -> None:
        """The worker's first answer, once it has built (`self.ready`: the diffusers it imported, and where from)."""
        self.ready = self._receive()
        d = self.diffusers
        if d is not None and self.ready.get("diffusers") != d.version:
            self.close()
            raise LabError(f"the `{self.name}` worker imported diffusers {self.ready.get('diffusers')} from "
                           f"{self.ready.get('diffusers_file')}, not {d.version} from {d.origin}.")

    def _ask(self, message: dict) -> dict:
        self._send(message)
        return self._receive()

    def _send(self, message: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the worker has ended: `_receive` says why

    def _receive(self) -> dict:
        try:
            line = self.proc.stdout.readline()
        except (BrokenPipeError, ValueError):
            line = ""
        if not line:
            self.proc.wait(timeout=60)
            tail = [t for t in self.log.read_text(errors="replace").splitlines() if t.strip()][-1:]
            raise LabError(f"the `{self.name}` worker process ended unexpectedly (exit code {self.proc.poll()})"
                           + (f": {tail[0].strip()}" if tail else "") + f". Its output: {self.log}")
        reply = json.loads(line)
        if "error" in reply:
            from lab.run.scenario import MissingClass

            raise (MissingClass if reply.get("missing") else LabError)(f"`{self.name}` worker: {reply['error']}")
        return reply

    def call(self, built, warmup: int, seed: int, marks: bool = True) -> CallResult:
        r = self._ask({"op": "call", "warmup": warmup, "seed": seed, "marks": marks})
        self.stalls_total += r.get("stalls", 0) - self._stalls_seen  # the worker counts its own process's
        self._stalls_seen = r.get("stalls", 0)
        return CallResult(torch.empty(0), r["wall_ms"], r["steps_ms"], r["stages_ms"])

    def verify_call(self, built, seed: int, count: bool = True) -> tuple[torch.Tensor, dict[str, int]]:
        r = self._ask({"op": "verify", "seed": seed, "count": count})
        out = torch.load(r["path"])
        os.unlink(r["path"])
        return out, r["counts"]

    def coverage_call(self, built, seed: int) -> dict[str, list[int]]:
        return self._ask({"op": "coverage", "seed": seed})["hits"]

    def profile(self, built, trace_dir: Path, stem: str, options, seed: int) -> Path:
        r = self._ask({"op": "profile", "dir": str(trace_dir), "stem": stem, "with_stack": options.with_stack,
                       "seed": seed})
        return Path(r["trace"])

    def close(self) -> None:
        """Stop the worker; its log is removed when it ended cleanly and kept (and named by errors) otherwise."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self._ask({"op": "exit"})
            except LabError:
                pass
            self.proc.wait(timeout=60)
        if self.proc.returncode == 0:
            self.log.unlink(missing_ok=True)


class WorkerPairs:
    """The worker processes of a cross-process A/B, block by block (`lab.measure.ab.benchmark` calls it before each
    block). `fresh`: a new pair for every block, the two started in an order that alternates from block to block
    (control first in even blocks), each built and warmed up as at the start; a process effect (memory layout,
    allocator state, thread placement, what each process imported first) then falls on a random arm in each block,
    noise between blocks instead of a bias. Not `fresh`: the pair that is running measures every block, as pyperf
    would not (uncalibrated: a process effect moves with its arm).

    `at_once`: the fresh pairs of that many blocks start and build together, before the first of those blocks (their
    processes wait, idle, for their block; each pair is warmed up just before its block). Building is most of what a
    pair costs (nearly all of a block's time at true size), and pairs that build side by side share it; nothing
    builds while a block is timed. The pairs that a decision leaves unused are closed.

    `stall_first_ms` puts a host stall of that many ms per step into the process started first of each pair, and
    `stall_ms` into the named arm's processes: a process effect and a positive control of known cost (calibration
    and tests)."""

    def __init__(self, control: IsolatedArm, test: IsolatedArm, warmup_calls: int, seed: int, fresh: bool = True,
                 stall_first_ms: float = 0.0, stall_ms: dict[str, float] | None = None, at_once: int = 1) -> None:
        if at_once < 1:
            raise LabError(f"pairs started at once must be at least 1, not {at_once}.")
        self.arms = (control, test)
        self.warmup_calls, self.seed, self.fresh, self.at_once = warmup_calls, seed, fresh, at_once
        self.stall_first_ms, self.stall_ms = stall_first_ms, dict(stall_ms or {})
        self.start_s: list[float] = []  # seconds each block waited for its pair: started, built and warmed up
        self._waiting: dict[int, dict[str, IsolatedArm]] = {}  # block -> its pair, started ahead
        self.unused = 0  # processes started ahead for blocks that never ran (the run decided first)

    def alive(self) -> bool:
        return all(a.proc is not None and a.proc.poll() is None for a in self.arms)

    def _order(self, block: int) -> tuple[IsolatedArm, IsolatedArm]:
        return self.arms if block % 2 == 0 else self.arms[::-1]

    def _start(self, blocks: range) -> None:
        """Start the pairs of `blocks` side by side, each pair in its block's order, and wait until all have built."""
        for block in blocks:
            pair = self._waiting[block] = {}  # kept at once: Ctrl-C while it starts still closes what started
            for k, arm in enumerate(self._order(block)):
                pair[arm.name] = arm.spare()
                pair[arm.name].start(stall_ms=self.stall_ms.get(arm.name, 0.0) + (self.stall_first_ms if k == 0 else 0.0))
        for block in blocks:
            for arm in self._order(block):
                self._waiting[block][arm.name].wait_ready()

    def __call__(self, block: int) -> None:
        if not self.fresh and self.alive():
            return
        import time

        started = time.perf_counter()
        if block not in self._waiting:
            self.close()  # pairs started for other blocks (a resumed run begins elsewhere)
            self._start(range(block, block + (self.at_once if self.fresh else 1)))
        pair = self._waiting.pop(block)
        order = self._order(block)
        for arm in order:
            arm.adopt(pair[arm.name])
        for arm in order:
            arm.call(None, self.warmup_calls, self.seed, marks=False)
        self.start_s.append(time.perf_counter() - started)

    def close(self) -> None:
        """Close the pairs started ahead that no block used (the arms' own workers are closed by their owner)."""
        for pair in self._waiting.values():
            for arm in pair.values():
                self.unused += arm.proc is not None
                arm.close()
        self._waiting.clear()

    def summary(self) -> dict[str, Any]:
        """What the result keeps: the design, the pairs started and what starting one cost."""
        start = sorted(self.start_s)
        return {"design": "fresh pair per block" if self.fresh else "one pair", "pairs": len(self.start_s),
                "processes": sum(a.started for a in self.arms),
                "start_s_median": start[len(start) // 2] if start else None,
                **({"at_once": self.at_once, "unused": self.unused} if self.fresh and self.at_once > 1 else {}),
                **({"stall_first_ms": self.stall_first_ms} if self.stall_first_ms else {}),
                **({"stall_ms": self.stall_ms} if self.stall_ms else {})}


def _answer(request: dict, built: Any, fixes: list, stack: contextlib.ExitStack, stall: Any) -> dict:
    """One request of the parent, answered on the worker's build (`stack` holds this arm's fixes applied)."""
    from lab.apply.fix import applied
    from lab.apply.patching import CallCounter
    from lab.run.profile import ProfileOptions, profile_call
    from lab.run.runner import timed_call

    op, seed = request["op"], request.get("seed", 0)
    if op == "call":
        for _ in range(request["warmup"]):
            timed_call(built, seed=seed, marks=False, extra_patch=stall)
        r = timed_call(built, seed=seed, marks=request["marks"], extra_patch=stall)
        return {"wall_ms": r.wall_ms, "steps_ms": r.steps_ms, "stages_ms": r.stages_ms,
                "stalls": stall.ran if stall else 0}
    if op == "verify":
        counter = CallCounter()
        if request.get("count", True):  # counting wrappers only for this call: a counted application and back
            stack.close()
            with applied(fixes, built.pipe, counter):
                out = timed_call(built, seed=seed, marks=False).output
            stack.enter_context(applied(fixes, built.pipe))
        else:  # a compiled call's output, without wrappers for the compiler to trace
            out = timed_call(built, seed=seed, marks=False).output
        fd, path = tempfile.mkstemp(suffix=".pt")
        os.close(fd)
        torch.save(out.cpu(), path)
        return {"path": path, "counts": dict(counter.counts)}
    if op == "coverage":
        from lab.apply.coverage import LineCoverage, eager

        with eager(), LineCoverage(f for fix in fixes for f, _ in fix.lines) as cov:
            timed_call(built, seed=seed, marks=False)
        return {"hits": {f: sorted(lines) for f, lines in cov.hits.items()}}
    if op == "profile":
        options = ProfileOptions(record_shapes=False, with_stack=request["with_stack"])
        trace = profile_call(built, Path(request["dir"]), request["stem"], options, seed=seed)
        return {"trace": str(trace["trace"])}
    return {"error": f"unknown request {op!r}"}


def _serve() -> int:
    """The worker side: build the run it is sent (`lab.run.description.Run`), apply this arm's fixes for good, then
    answer requests until told to exit."""
    import signal

    import diffusers

    from lab.apply.fix import applied, get_fix
    from lab.run.description import Run
    from lab.run.instrument import InjectedStall
    from lab.run.scenario import MissingClass

    # Ctrl-C, and a time limit's SIGTERM (`timeout` signals its whole process group), reach the workers too: the
    # parent stops after its last complete block and closes its workers, which must live until then
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    protocol = sys.stdout
    sys.stdout = sys.stderr  # anything the pipeline prints must not corrupt the protocol

    def reply(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    config = json.loads(sys.stdin.readline())
    run = Run.from_message(config["run"])
    # a process-level stall of known cost in every call of this process (`WorkerPairs`), or none
    stall = InjectedStall(run.device, config["stall_ms"]) if config.get("stall_ms") else None
    try:
        fixes = [get_fix(n) for n in config["fixes"]]
        if config.get("patches"):
            from lab.apply.change import load

            fixes.append(load(config["patches"])[0])
        built = run.build()
    except LabError as e:  # told to the parent as one line (a pipeline this diffusers lacks, a diff that does not apply)
        reply({"error": str(e), "missing": isinstance(e, MissingClass)})
        return 1
    with contextlib.ExitStack() as stack:
        stack.enter_context(applied(fixes, built.pipe))  # this arm's fixes, for the worker's life
        reply({"ready": True, "diffusers": diffusers.__version__, "diffusers_file": diffusers.__file__,
               "steps": built.steps})
        for line in sys.stdin:
            request = json.loads(line)
            if request["op"] == "exit":
                reply({"bye": True})
                break
            try:
                reply(_answer(request, built, fixes, stack, stall))
            except Exception as e:  # reported to the parent, which stops with a one-line error
                reply({"error": f"{type(e).__name__}: {e}"})
    return 0


if __name__ == "__main__":
    sys.exit(_serve())
