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
from lab.base.paths import package_parent
from lab.run.runner import CallResult


class IsolatedArm:
    """An arm of the A/B run by a worker process that built its own pipeline with its own fixes applied.

    `patches` are diff files the worker applies as one change (`lab.apply.change`); `diffusers` (a
    `lab.apply.releases.Diffusers`) is the diffusers the worker imports, first on its `PYTHONPATH` (None: the installed
    one). `self.ready` is the worker's first answer: the diffusers it imported, and where from.
    """

    def __init__(self, name: str, fixes: list, build: dict[str, Any], compile_spec: dict[str, Any],
                 patches: tuple[str, ...] = (), diffusers: Any = None) -> None:
        self.name = name
        self.fixes = fixes
        self.hook = None
        config = {"fixes": [f.name for f in fixes if not f.lines], "patches": [str(Path(p).resolve()) for p in patches],
                  "build": build, "compile": compile_spec}
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        first = [str(diffusers.site)] if diffusers is not None and diffusers.site is not None else []
        env["PYTHONPATH"] = os.pathsep.join([*first, str(package_parent()), env.get("PYTHONPATH", "")])
        # What the worker's pipeline prints (progress bars, warnings, a traceback) goes to a log of its own.
        fd, log = tempfile.mkstemp(prefix=f"lab-worker-{name}-", suffix=".log")
        self.log = Path(log)
        with os.fdopen(fd, "w") as sink:
            self.proc = subprocess.Popen([sys.executable, "-m", "lab.run.worker"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=sink, text=True, env=env)
        self.ready = self._ask(config)  # the worker answers once it has built and warmed nothing yet
        if diffusers is not None and self.ready.get("diffusers") != diffusers.version:
            self.close()
            raise LabError(f"the `{name}` worker imported diffusers {self.ready.get('diffusers')} from "
                           f"{self.ready.get('diffusers_file')}, not {diffusers.version} from {diffusers.origin}.")

    def _ask(self, message: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
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
        return CallResult(torch.empty(0), r["wall_ms"], r["steps_ms"], r["stages_ms"])

    def verify_call(self, built, seed: int) -> tuple[torch.Tensor, dict[str, int]]:
        r = self._ask({"op": "verify", "seed": seed})
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
        if self.proc.poll() is None:
            try:
                self._ask({"op": "exit"})
            except LabError:
                pass
            self.proc.wait(timeout=60)
        if self.proc.returncode == 0:
            self.log.unlink(missing_ok=True)


def _serve() -> int:
    """The worker side: build, apply this arm's fixes for good, then answer requests until told to exit."""
    import diffusers

    from lab.apply.fix import applied, get_fix
    from lab.apply.patching import CallCounter
    from lab.run.profile import ProfileOptions, profile_call
    from lab.run.runner import CompileSpec, apply_compile, timed_call
    from lab.run.scenario import DTYPES, MissingClass, build, get_scenario

    protocol = sys.stdout
    sys.stdout = sys.stderr  # anything the pipeline prints must not corrupt the protocol

    def reply(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    config = json.loads(sys.stdin.readline())
    b = config["build"]
    try:
        fixes = [get_fix(n) for n in config["fixes"]]
        if config.get("patches"):
            from lab.apply.change import load

            fixes.append(load(config["patches"])[0])
        built = build(get_scenario(b["scenario"]), size=b["size"], device=b["device"], dtype=DTYPES.get(b["dtype"]),
                      layers=b["layers"], steps=b["steps"], full_decode=b["full_decode"], checkpoint=b["checkpoint"],
                      seed=b["seed"], call=b["call"])
        apply_compile(built, CompileSpec(**config["compile"]))
    except LabError as e:  # told to the parent as one line (a pipeline this diffusers lacks, a diff that does not apply)
        reply({"error": str(e), "missing": isinstance(e, MissingClass)})
        return 1

    with contextlib.ExitStack() as stack:
        stack.enter_context(applied(fixes, built.pipe))  # this arm's fixes, for the worker's life
        reply({"ready": True, "diffusers": diffusers.__version__, "diffusers_file": diffusers.__file__})
        for line in sys.stdin:
            request = json.loads(line)
            try:
                if request["op"] == "exit":
                    reply({"bye": True})
                    break
                if request["op"] == "call":
                    for _ in range(request["warmup"]):
                        timed_call(built, seed=request["seed"], marks=False)
                    r = timed_call(built, seed=request["seed"], marks=request["marks"])
                    reply({"wall_ms": r.wall_ms, "steps_ms": r.steps_ms, "stages_ms": r.stages_ms})
                elif request["op"] == "verify":
                    # Counting wrappers only for this call: switch to a counted application and back.
                    stack.close()
                    counter = CallCounter()
                    with applied(fixes, built.pipe, counter):
                        out = timed_call(built, seed=request["seed"], marks=False).output
                    stack.enter_context(applied(fixes, built.pipe))
                    fd, path = tempfile.mkstemp(suffix=".pt")
                    os.close(fd)
                    torch.save(out.cpu(), path)
                    reply({"path": path, "counts": dict(counter.counts)})
                elif request["op"] == "coverage":
                    from lab.apply.coverage import LineCoverage, eager

                    with eager(), LineCoverage(f for fix in fixes for f, _ in fix.lines) as cov:
                        timed_call(built, seed=request["seed"], marks=False)
                    reply({"hits": {f: sorted(lines) for f, lines in cov.hits.items()}})
                elif request["op"] == "profile":
                    options = ProfileOptions(record_shapes=False, with_stack=request["with_stack"])
                    trace = profile_call(built, Path(request["dir"]), request["stem"], options, seed=request["seed"])
                    reply({"trace": str(trace["trace"])})
                else:
                    reply({"error": f"unknown request {request['op']!r}"})
            except Exception as e:  # reported to the parent, which stops with a one-line error
                reply({"error": f"{type(e).__name__}: {e}"})
    return 0


if __name__ == "__main__":
    sys.exit(_serve())
