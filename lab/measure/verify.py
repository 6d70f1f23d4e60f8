"""Verifying an A/B before it is timed: the same seed in both arms, the outputs compared, and the fixes' own code
counted (or, for a change given as a diff, its changed lines that ran).

Outputs compare bit for bit, or within the fixes' own tolerance. Where they differ beyond it, two checks say whether
the difference is only rounding: compiled, both arms run eagerly once more (`compiler_rounding`: a fix that moves a
graph break makes graphs that round differently); and both arms against a reference of higher precision
(`numerics_check`, the rule in `lab.verdicts.numerics`: another kernel or reduction order rounds differently).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from lab.apply.fix import exercised
from lab.apply.patching import CallCounter
from lab.run.settings import DECIDED
from lab.verdicts import numerics

if TYPE_CHECKING:
    from lab.run.profile import ProfileOptions
    from lab.run.scenario import Built


class ArmLike(Protocol):
    """What the A/B engine asks of an arm: `Arm` answers in this process, `lab.run.worker.IsolatedArm` from a
    worker process of its own (`built` is then None: the worker holds the pipeline)."""

    name: str
    fixes: list

    def call(self, built: Built | None, warmup: int, seed: int, marks: bool = True) -> Any: ...

    def verify_call(self, built: Built | None, seed: int, count: bool = True) -> tuple[torch.Tensor, dict[str, int]]: ...

    def coverage_call(self, built: Built | None, seed: int) -> dict[str, list[int]]: ...

    def profile(self, built: Built | None, trace_dir: Path, stem: str, options: ProfileOptions, seed: int) -> Path: ...


def verify(built: Built | None, control: ArmLike, test: ArmLike, seed: int, tolerance: float | None = None, *,
           compiled: bool = False, mark: Callable[[str], None] | None = None,
           against_setting: bool = False, reference: bool = True) -> dict[str, Any]:
    """Same seed in both arms: compare outputs (within `tolerance`, default the fixes' own), and count calls of the
    fixes' own code, or for a change given as a diff, the changed lines that ran. When `compiled`, the outputs come
    from plain calls and the counts from one more call of the test arm: the compiler traces the counting wrappers
    and compiles frames of their own around a disabled helper, so the counted call's graphs are not the timed calls'
    (FINDINGS: how far that moved compiled outputs). `mark` (the compiler log's) keeps that call's compilations apart from the
    timed calls'. Compiled outputs that differ beyond the tolerance are checked against the compiler's own rounding
    (`compiler_rounding`), in this process's arms. With `against_setting` (a fix that changes the outputs on
    purpose), how far the settings themselves move the control's output (`setting_moves`). With `reference`, outputs
    still apart are held against a reference of higher precision (`numerics_check`), in this process's arms."""
    from lab.run.reference import recorded_noise
    from lab.run.scenario import Built

    in_process = isinstance(built, Built)
    tape: list[torch.Tensor] = []
    with recorded_noise(tape) if in_process else contextlib.nullcontext():
        out_c, counts_c = control.verify_call(built, seed, count=not compiled)
    out_t, counts = test.verify_call(built, seed, count=not compiled)
    if compiled:
        if mark is not None:
            mark("counting")
        _, counts = test.verify_call(built, seed)
    decided = {arm: {k.removeprefix(DECIDED): n for k, n in arm_counts.items() if k.startswith(DECIDED)}
               for arm, arm_counts in (("control", counts_c), ("test", counts))}
    counter = CallCounter()
    counter.counts.update({k: n for k, n in counts.items() if not k.startswith(DECIDED)})
    if out_c.shape != out_t.shape:
        return {"identical": False, "max_abs_diff": None, "within_tolerance": False, "exercised": {},
                "detail": f"output shapes differ: {tuple(out_c.shape)} vs {tuple(out_t.shape)}"}
    diff = float((out_t.float() - out_c.float()).abs().max()) if out_c.numel() else 0.0
    tolerance = max([f.tolerance for f in test.fixes], default=0.0) if tolerance is None else tolerance
    checked = {
        "identical": bool(torch.equal(out_c, out_t)),
        "max_abs_diff": diff,
        "tolerance": tolerance,
        "within_tolerance": diff <= tolerance,
        "exercised": {f.name: exercised(f, counter) for f in test.fixes},
        "calls_counted": dict(counter.counts),
        "output_shape": list(out_c.shape),
    }
    if any(decided.values()):  # what a cache decided from the data in each arm's verifying call
        checked["decisions"] = {arm: d for arm, d in decided.items() if d}
    if against_setting and built is not None:
        checked["setting_moves"] = setting_moves(built, control, seed, out_c)
    if compiled and not checked["within_tolerance"] and built is not None:
        checked["compiler_rounding"] = compiler_rounding(built, control, test, seed, out_c, out_t, tolerance, mark)
        checked["within_tolerance"] = checked["compiler_rounding"]["accepted"]
    if reference and in_process and not checked["within_tolerance"]:
        checked["numerics"] = numerics_check(built, control, seed, tape, out_c, out_t, mark)
        checked["within_tolerance"] = checked["numerics"]["label"] == numerics.EQUIVALENT
    diffs = [f for f in test.fixes if f.lines]
    if diffs:  # a change given as a diff is exercised when a line it changed runs
        hits = test.coverage_call(built, seed)
        checked["lines"] = {}
        for fix in diffs:
            changed = [(file, n) for file, numbers in fix.lines for n in numbers]
            ran = [(file, n) for file, n in changed if n in hits.get(file, ())]
            checked["lines"][fix.name] = {"changed": len(changed), "ran": len(ran),
                                          "not_run": [line_label(f, n) for f, n in changed if (f, n) not in ran][:20]}
            checked["exercised"][fix.name] = len(ran)
    return checked


def numerics_check(built: Built, control: ArmLike, seed: int, tape: list[torch.Tensor], out_c: torch.Tensor,
                   out_t: torch.Tensor, mark: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Both arms' outputs against the control's code run once more in higher precision on the same weights and noise
    (`lab.run.reference`), judged by `lab.verdicts.numerics`. A run in settings is not checked (offloading and
    quantized storage keep their own copies of the weights, which upcasting in place would not reach): the outputs
    then stay "differ"."""
    from lab.apply.coverage import eager
    from lab.run.reference import reference_dtype, relative_error, replayed_noise, upcast

    dtype = reference_dtype(built)
    name = str(dtype).removeprefix("torch.")
    where = "cuda" if built.device.startswith("cuda") else "cpu"
    if built.chosen_settings:
        return {"label": numerics.DIFFER, "reference": f"{name} on {where}", "control_error": None,
                "test_error": None, "bound": None,
                "reason": "not checked in a setting: offloading and quantized storage keep their own weights"}
    if mark is not None:
        mark("reference")  # the reference runs eagerly: any compilation would show apart from the timed calls'
    used = [0]
    with upcast(built, dtype) as upcast_built, replayed_noise(tape, used), eager():
        ref, _ = control.verify_call(upcast_built, seed, count=False)
    found = numerics.judge(relative_error(out_c, ref), relative_error(out_t, ref), name, where)
    return {"label": found.label, "reference": found.reference, "control_error": found.control_error,
            "test_error": found.test_error, "bound": found.bound, "reason": found.reason,
            "noise_replayed": f"{used[0]} of {len(tape)}"}


def within_compiler_rounding(compiled_diff: float, eager_diff: float, control_moved: float, test_moved: float,
                             tolerance: float) -> bool:
    """Whether compiled outputs that differ by `compiled_diff` still count as equal: the arms run eagerly differ by
    no more than `tolerance` (the fix computes the same), and compiled they differ by no more than compiling moves
    either arm's output from its eager one (`control_moved`, `test_moved`: the compiler's own rounding, which
    depends on the graphs it makes, and a fix that moves a graph break makes other graphs)."""
    return eager_diff <= tolerance and compiled_diff <= max(control_moved, test_moved)


def compiler_rounding(built: Built, control: ArmLike, test: ArmLike, seed: int, out_c: torch.Tensor,
                      out_t: torch.Tensor, tolerance: float, mark: Callable[[str], None] | None = None) -> dict:
    """Both arms once more with the compiled code run eagerly (`torch.compiler.set_stance("force_eager")`), to tell
    a fix that changes the computation from one that changes only what the compiler rounds (a compiled difference of
    one bfloat16 step where eager it is bit-identical). Only for arms that share the build in this process: a worker process's compiler stance is its own."""
    from lab.apply.coverage import eager

    if mark is not None:
        mark("eager check")  # no compilation is expected here; any would show apart from the timed calls'
    with eager():
        eager_c, _ = control.verify_call(built, seed, count=False)
        eager_t, _ = test.verify_call(built, seed, count=False)

    def apart(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0

    found = {"eager_diff": apart(eager_t, eager_c), "control_compiled_vs_eager": apart(out_c, eager_c),
             "test_compiled_vs_eager": apart(out_t, eager_t)}
    return {**found, "accepted": within_compiler_rounding(apart(out_t, out_c), found["eager_diff"],
                                                          found["control_compiled_vs_eager"],
                                                          found["test_compiled_vs_eager"], tolerance)}


def setting_moves(built: Built, control: ArmLike, seed: int, reference: torch.Tensor) -> float | None:
    """How far the settings themselves move the control arm's output `reference` (one more call with them turned
    off and on again, `lab.run.settings.without`): the scale that a fix changing the outputs on purpose reads
    against (the lagged first-block cache against the cache's own skipping). None where the settings cannot be made
    again exactly, or there are none."""
    from lab.run.settings import without

    plain = without(built.chosen_settings, built, lambda: control.verify_call(built, seed, count=False)[0])
    if plain is None:
        return None
    return float((reference.float() - plain.float()).abs().max()) if reference.numel() else 0.0


def line_label(pseudo_file: str, line: int) -> str:
    """`scheduling_unipc_multistep.py:812: rks = torch.stack(rks)` for a line of a change's compiled file."""
    import linecache

    text = linecache.getline(pseudo_file, line).strip()
    return f"{Path(pseudo_file.split(' [lab ')[0]).name}:{line}: {text}"
