"""Where else does `begin_index`'s pattern occur? Scans every pipeline module of a diffusers release for a
`__call__` that steps `self.scheduler` without ever calling `set_begin_index` (its first `step` then finds the index
with `nonzero().item()`: a host-device sync), and says for each what the `begin_index` rewrite does to it.

    python benchmarks/begin_index_scan.py                  # diffusers 0.42.1, the flow-matching pipelines
    python benchmarks/begin_index_scan.py --version 0.37.1 --scheduler all

Columns: the pipeline module and class, the scheduler its `__init__` annotates, and the rewrite's answer: `rewrites`
(it inserts the call: the loop walks the whole schedule from its first timestep, or skips a `strength` share through
`get_timesteps`) where the fix does not list it yet, `in the fix` (the fix lists this site), or `left alone` with the
reason (no `self._num_timesteps = ...` in the body of `__call__`, where the rewrite puts the call after, or a schedule
that may start later than its first timestep). Deprecated pipelines are left out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def scan(version: str, scheduler: str) -> list[tuple[str, str, str, str]]:
    import libcst as cst
    import libcst.matchers as m

    from fixes.begin_index import FIX, NUM_TIMESTEPS, SetBeginIndex
    from lab.apply import releases
    from lab.apply.rewrite import rewrite_source

    root = releases.unpack(releases.find_wheel(version)) / "diffusers" / "pipelines"
    listed = {r.module for r in FIX.rewrites}
    step = m.Call(func=m.Attribute(value=m.Attribute(m.Name("self"), m.Name("scheduler")), attr=m.Name("step")))
    rows = []
    for path in sorted(root.rglob("pipeline_*.py")):
        source = path.read_text()
        if "deprecated" in path.parts or "scheduler.step(" not in source or "set_begin_index" in source:
            continue
        module = "diffusers.pipelines." + ".".join(path.relative_to(root).with_suffix("").parts)
        tree = cst.parse_module(source)
        for cls in m.findall(tree, m.ClassDef()):
            methods = {f.name.value: f for f in cls.body.body if isinstance(f, cst.FunctionDef)}
            if "__init__" not in methods or "__call__" not in methods or not m.findall(methods["__call__"], step):
                continue
            annotated = [p.annotation for p in methods["__init__"].params.params if p.name.value == "scheduler"]
            kind = " ".join(tree.code_for_node(annotated[0].annotation).split()) if annotated and annotated[0] else "?"
            if scheduler != "all" and kind != scheduler:
                continue
            if module in listed:
                answer = "in the fix"
            else:
                result = rewrite_source(source, [SetBeginIndex], filename=str(path))
                anchored = any(m.matches(line, NUM_TIMESTEPS) for line in methods["__call__"].body.body)
                answer = "rewrites" if result.changed else (
                    "left alone: its schedule may start later than the first timestep" if anchored
                    else "left alone: no `self._num_timesteps = ...` in the body of `__call__` before the loop")
            rows.append((module.removeprefix("diffusers.pipelines."), cls.name.value, kind, answer))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="0.42.1", help="the diffusers release to scan (default 0.42.1)")
    parser.add_argument("--scheduler", default="FlowMatchEulerDiscreteScheduler",
                        help="only pipelines whose `__init__` annotates this scheduler, or `all`")
    args = parser.parse_args()
    rows = scan(args.version, args.scheduler)
    width = max((len(r[0]) for r in rows), default=10)
    for module, cls, kind, answer in rows:
        print(f"{module:<{width}}  {cls:<45}  {kind if args.scheduler == 'all' else '':<10}  {answer}".rstrip())
    counts: dict[str, int] = {}
    for *_, answer in rows:
        counts[answer] = counts.get(answer, 0) + 1
    print(f"\n{len(rows)} pipeline classes of diffusers {args.version} step their scheduler without a begin index: "
          + "; ".join(f"{n} {answer}" for answer, n in sorted(counts.items())), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
