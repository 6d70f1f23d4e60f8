"""`lab ab --isolate`: each arm in its own process, so no state of one arm (patched code, compiled graphs, caches,
allocator) can reach the other. The parent keeps the interleaved, counterbalanced schedule and asks each worker
for calls over a pipe (JSON lines), as pyperf's manager does with its workers.

    python -m lab.worker   # started by IsolatedArm; reads its configuration as the first line of stdin
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

from lab.errors import LabError
from lab.runner import CallResult

ROOT = Path(__file__).resolve().parents[1]


class IsolatedArm:
    """An arm of the A/B run by a worker process that built its own pipeline with its own fixes applied."""

    def __init__(self, name: str, fixes: list, build: dict[str, Any], compile_spec: dict[str, Any]) -> None:
        self.name = name
        self.fixes = fixes
        self.hook = None
        config = {"fixes": [f.name for f in fixes], "build": build, "compile": compile_spec}
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen([sys.executable, "-m", "lab.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=ROOT, env=env)
        self._ask(config)  # the worker answers once it has built and warmed nothing yet

    def _ask(self, message: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise LabError(f"the `{self.name}` worker process ended unexpectedly (exit code {self.proc.poll()}); "
                           "its error is printed above.")
        reply = json.loads(line)
        if "error" in reply:
            raise LabError(f"`{self.name}` worker: {reply['error']}")
        return reply

    def call(self, built, warmup: int, seed: int, marks: bool = True) -> CallResult:
        r = self._ask({"op": "call", "warmup": warmup, "seed": seed, "marks": marks})
        return CallResult(torch.empty(0), r["wall_ms"], r["steps_ms"], r["stages_ms"])

    def verify_call(self, built, seed: int) -> tuple[torch.Tensor, dict[str, int]]:
        r = self._ask({"op": "verify", "seed": seed})
        out = torch.load(r["path"])
        os.unlink(r["path"])
        return out, r["counts"]

    def profile(self, built, trace_dir: Path, stem: str, options, seed: int) -> Path:
        r = self._ask({"op": "profile", "dir": str(trace_dir), "stem": stem, "with_stack": options.with_stack,
                       "seed": seed})
        return Path(r["trace"])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._ask({"op": "exit"})
            except LabError:
                pass
            self.proc.wait(timeout=60)


def _serve() -> int:
    """The worker side: build, apply this arm's fixes for good, then answer requests until told to exit."""
    from lab.fix import applied, get_fix
    from lab.patching import CallCounter
    from lab.profile import ProfileOptions, profile_call
    from lab.runner import CompileSpec, apply_compile, timed_call
    from lab.scenario import DTYPES, build, get_scenario

    protocol = sys.stdout
    sys.stdout = sys.stderr  # anything the pipeline prints must not corrupt the protocol
    config = json.loads(sys.stdin.readline())
    b = config["build"]
    built = build(get_scenario(b["scenario"]), size=b["size"], device=b["device"], dtype=DTYPES.get(b["dtype"]),
                  layers=b["layers"], steps=b["steps"], full_decode=b["full_decode"], checkpoint=b["checkpoint"],
                  seed=b["seed"], call=b["call"])
    apply_compile(built, CompileSpec(**config["compile"]))
    fixes = [get_fix(n) for n in config["fixes"]]

    def reply(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    with contextlib.ExitStack() as stack:
        stack.enter_context(applied(fixes, built.pipe))  # this arm's fixes, for the worker's life
        reply({"ready": True})
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
