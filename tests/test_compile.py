"""Compile health: the compile section of `lab analyze` on the real shared trace and on a synthetic trace of known
contents, the guide's checklist, and graph breaks and recompiles at run time from the compiler's structured log
(tiny scenarios compiled with the `eager` backend: no C compiler needed)."""

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
import torch

from lab.apply.fix import EVERY, Fix, Upstream
from lab.measure import ab
from lab.pages import report
from lab.results.schema import ABResult
from lab.run.runner import CompileSpec, apply_compile
from lab.run.scenario import build, get_scenario
from lab.traces.analysis import DRIVER_LAUNCHES, RUNTIME_LAUNCHES, analyze, compare
from lab.traces.compile_log import StructuredLog, compare_arms, records, summarize, tlparse
from lab.traces.compiled import compile_analysis
from lab.traces.trace import load
from lab.verdicts.verdict import Verdict

# seconds per test (pipelines built, whole runs, compiles or every committed result): left out of `make test-fast`
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shared(real_trace):
    return analyze(load(real_trace))


def test_the_real_trace_has_one_compiled_frame_and_its_guards(shared, real_trace):
    c = shared["compile"]
    # regional compile of Wan's 30 blocks, 4 steps x 2 guidance calls: 240 compiled calls of one frame, compile id 0
    assert c["compiled"] and c["frames"] == {"0": {"calls": 240, "calls_per_pipeline_call": 240.0, "calls_per_step": None,
                                                   "compile_ids": {"0": 240}}}
    assert c["recompiled"] == [] and c["graphs"] == {"distinct": 1, "calls": 240}
    # independently: the raw events of the trace
    import gzip
    with gzip.open(real_trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    lookups = [e["dur"] for e in events if e.get("name") == "TorchDynamo Cache Lookup"]
    assert c["guards"]["lookups"] == len(lookups) == 240
    assert c["guards"]["total_us"] == pytest.approx(sum(lookups), abs=0.01)  # 24.7 ms of host time per call
    assert 24_000 < c["guards"]["total_us"] < 25_500 and 70 < c["guards"]["median_us"] < 95
    launches = [e for e in events if e.get("name") in RUNTIME_LAUNCHES + DRIVER_LAUNCHES]
    assert c["launches"]["inside"] + c["launches"]["outside"] == len(launches)
    assert c["launches"]["inside"] == 7200 and c["launches"]["outside"] == 466
    # the eager islands: Wan's transformer outside its blocks (patch embedding, output norm), the scheduler
    sites = list(c["outside_sites"])
    assert sites[0] == "diffusers/models/transformers/transformer_wan.py:628 forward"
    assert any("scheduling_unipc_multistep.py" in s for s in sites)


def test_the_checklist_says_what_the_real_trace_cannot_answer(shared):
    items = {i["question"]: i for i in shared["checklist"]}
    assert list(items) == ["GPU staying busy", "CPU blocking on GPU", "Scheduler overhead", "Compile effective",
                           "Kernel launch latency", "Memory stable"]
    assert items["Scheduler overhead"]["verdict"] == "cannot tell" and "denoise_step" in items["Scheduler overhead"]["note"]
    assert items["Memory stable"]["note"] == "no memory events: profile with --profile-memory"
    assert "queueing" in items["Kernel launch latency"]["value"]  # the CPU runs 808 launches ahead
    assert items["Compile effective"]["verdict"] == "borderline" and "6.1%" not in items["Compile effective"]["value"]


def _synthetic(tmp_path: Path) -> Path:
    """Two compiled calls of frame 0 (the second after a recompile, compile id 1), each after a guard lookup of
    10 µs; 3 launches inside compiled regions and 2 eager ones (one from `sched.py`), with their kernels."""
    ev = []

    def x(cat, name, ts, dur, tid=1, **args):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args})

    x("user_annotation", "denoise_step_0", 0, 1000)
    x("user_annotation", "transformer_forward", 0, 400)
    x("cpu_op", "TorchDynamo Cache Lookup", 10, 10)
    x("cpu_op", "Torch-Compiled Region: 0/0", 30, 100)
    x("cpu_op", "## Call CompiledFxGraph abc ##", 40, 50)
    x("user_annotation", "transformer_forward", 500, 400)
    x("cpu_op", "TorchDynamo Cache Lookup", 510, 10)
    x("cpu_op", "Torch-Compiled Region: 0/1", 530, 100)
    x("cpu_op", "## Call CompiledFxGraph def ##", 540, 50)
    x("python_function", "sched.py(7): step", 910, 50, **{"Python id": 1, "Python parent id": 0})
    for i, (ts, corr) in enumerate([(50, 1), (60, 2), (550, 3), (930, 4), (980, 5)]):
        x("cuda_runtime", "cudaLaunchKernel", ts, 5, correlation=corr)
        x("kernel", f"k{i}", 2000 + 100 * i, 20 + i, tid=7, correlation=corr, stream=7)
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    return path


def test_a_synthetic_trace_of_known_contents(tmp_path):
    c = compile_analysis(load(_synthetic(tmp_path)))
    assert c["frames"]["0"]["compile_ids"] == {"0": 1, "1": 1} and c["frames"]["0"]["calls_per_step"] == 2
    assert c["recompiled"] == [{"frame": 0, "compile_id": 1, "calls": 1}]
    assert c["graphs"] == {"distinct": 2, "calls": 2}
    assert c["guards"]["lookups"] == 2 and c["guards"]["total_us"] == 20.0 and c["guards"]["per_step_us"] == 20.0
    assert c["launches"]["inside"] == 3 and c["launches"]["outside"] == 2
    assert c["launches"]["gpu_us_inside"] == 20 + 21 + 22 and c["launches"]["gpu_us_outside"] == 23 + 24
    assert c["outside_sites"]["sched.py:7 step"] == {"launches": 1, "gpu_us": 23.0}
    assert c["kernels_per_transformer_call"] == 1.5 and c["kernels_per_step"] == 5


def test_compiled_against_eager_gives_the_fusion_ratio(tmp_path):
    compiled = _synthetic(tmp_path)
    data = json.loads(compiled.read_text())
    eager_events = [e for e in data["traceEvents"] if "Compiled" not in e["name"] and e["name"] != "TorchDynamo Cache Lookup"]
    extra = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 100 + i, "dur": 1,
              "args": {"correlation": 100 + i}} for i in range(5)]
    extra += [{"ph": "X", "cat": "kernel", "name": "e", "pid": 1, "tid": 7, "ts": 3000 + 50 * i, "dur": 10,
               "args": {"correlation": 100 + i, "stream": 7}} for i in range(5)]
    eager = tmp_path / "eager.json"
    eager.write_text(json.dumps({"traceEvents": eager_events + extra}))
    out = compare(load(eager), load(compiled))
    assert out["fusion"]["kernels_per_step"] == {"eager": 10, "compiled": 5, "ratio": 2.0}
    assert not out["control"]["compile"]["compiled"] and "ran eagerly" in out["control"]["compile"]["note"]


# --- run time: the compiler's structured log ----------------------------------------------------------------


def test_the_structured_log_is_read_into_breaks_and_recompiles():
    text = ('V1122 21:36:10.232000 8579 torch/_dynamo/symbolic_convert.py:5098] {"artifact": {"name": '
            '"dynamo_graph_break_reason", "encoding": "string"}, "frame_id": 0, "frame_compile_id": 0, "has_payload": "x"}\n'
            "\tGraph break in user code at /x/site-packages/diffusers/models/a.py:12\n"
            "\tGraph Break Reason: Encountered graph break when attempting to trace CALL\n"
            "\t  Explanation: Dynamo does not know how to trace builtin operator `print`\n"
            'V1122 21:36:10.271000 8579 torch/_dynamo/utils.py:2009] {"compilation_metrics": {"compile_id": "0/1", '
            '"co_name": "forward", "co_filename": "/x/site-packages/diffusers/models/a.py", "co_firstlineno": 10, '
            '"guard_count": 9, "guard_latency_us": 57, "entire_frame_compile_time_s": 0.1, "recompile_reason": "0/0: n == 1"}}\n')
    s = summarize(records(text))
    assert s["graph_breaks"] == 1 and s["graph_break_sites"] == [
        {"where": "diffusers/models/a.py:12", "reason": "Dynamo does not know how to trace builtin operator `print`",
         "count": 1, "frames": ["diffusers/models/a.py:forward"]}]  # frame 0's compiling met it (its `frame_id`)
    assert s["compilations"] == 1 and s["recompiles"] == 1 and s["guards"] == 9
    assert s["frames"][0]["where"] == "diffusers/models/a.py:10"


def test_a_break_is_kept_with_the_frame_whose_compiling_met_it():
    text = ('V1122 21:36:10.232000 8579 torch/_dynamo/symbolic_convert.py:5098] {"artifact": {"name": '
            '"dynamo_graph_break_reason", "encoding": "string"}, "frame_id": 3, "frame_compile_id": 0, "has_payload": "x"}\n'
            "\tGraph break in user code at /x/site-packages/diffusers/hooks/h.py:40\n"
            "\tGraph Break Reason: Skip inlining function offload_\n"
            'V1122 21:36:10.271000 8579 torch/_dynamo/utils.py:2009] {"compilation_metrics": {"compile_id": "3/0", '
            '"co_name": "torch_dynamo_resume_in_post_forward_at_38", "co_filename": "/x/site-packages/diffusers/hooks/h.py", '
            '"co_firstlineno": 38, "guard_count": 2}}\n')
    (site,) = summarize(records(text))["graph_break_sites"]
    assert site["where"] == "diffusers/hooks/h.py:40" and site["frames"] == ["diffusers/hooks/h.py:post_forward"]


def _runtime_fix(name, forward_of):
    """A fix for the test arm that replaces the blocks' forward (what a rewrite of a compiled module does)."""
    def runtime(pipe, patcher):
        block = pipe.transformer.blocks[0]
        patcher.setattr(type(block), "forward", forward_of(type(block).forward))
    return Fix(name=name, description="test", upstream=Upstream(()), pipelines=EVERY, runtime=runtime)


def _compiled_ab(tmp_path, fix):
    torch._dynamo.reset()  # no compiled code or recompile history from earlier tests
    built = build(get_scenario("wan"), size="tiny", device="cpu")
    spec = CompileSpec(mode="compile", backend="eager")
    apply_compile(built, spec)
    config = ab.ABConfig(blocks=2, repeat=1, lead_in=0, profile=False)
    with StructuredLog(tmp_path / "torch_trace") as log:
        return ab.run(built, spec, ab.Arm("control", []), ab.Arm("test", [fix] if fix else []), config, tmp_path, "x",
                      lambda _: None, compile_log=log)


def test_a_clean_compile_reports_no_break_and_no_recompile(tmp_path):
    r = _compiled_ab(tmp_path, None)
    c = r["compilation"]
    assert c["control"]["compilations"] >= 1 and c["control"]["graph_breaks"] == 0
    assert c["test"]["compilations"] == 0 and c["steady"]["compilations"] == 0 and c["notes"] == []
    assert c["control"]["frames"][0]["where"].startswith("diffusers/models/transformers/transformer_wan.py:")
    # and tlparse (a test dependency) renders the same log
    html = tlparse(Path(c["log"]), tmp_path / "tlparse")
    assert html is not None and "compile" in (html / "index.html").read_text().lower()


ARMS = json.loads((Path(__file__).parent / "data" / "compile" / "arms.json").read_text())


def test_a_break_the_test_arm_did_not_trace_again_is_not_said_to_be_removed():
    """Flux2 Klein's compiled group offloading with every fix (an H200, 2026-11-28; the arms' summaries as its result
    stored them): the control's first calls broke at the onload hook's `onload_` (in `pre_forward`) and the offload
    hook's `offload_` (in `post_forward`), both `torch.compiler.disable`d upstream. The test arm, run after it in the
    same process, compiled `post_forward` again only, and broke in `group_offload_keep_host`'s counting wrapper around
    the same `offload_`. The page said the fix removed both breaks; it moved one and never traced the other."""
    arms = ARMS["flux2_group_offload_keep_host_set_h200"]
    notes = compare_arms(arms["control"], arms["test"], arms["steady"])
    assert not [n for n in notes if "removes" in n or "adds" in n or "group_offloading.py:309" in n]
    (moved,) = notes
    assert moved.startswith("the fix moves the graph break(s) in /tmp/site/diffusers/hooks/group_offloading.py:"
                            "post_forward: /tmp/site/diffusers/hooks/group_offloading.py:358 (Skip inlining function")
    assert " -> /work/main/fixes/group_offload_keep_host.py:115 (Skip calling function" in moved


def test_breaks_a_fix_rewrites_are_moved_within_the_frame_it_rewrote():
    """FasterCache on FLUX.1 with `faster_cache_timestep_once` (an H100, 2026-11-26): the rewritten hook's `new_forward`
    (its module tagged `[lab fix: ...]`) breaks at its disabled timestep check and its two log calls, where the
    upstream one broke at two data-dependent branches and two log calls: one note, within that function."""
    arms = ARMS["flux_faster_cache_timestep_once_h100"]
    (moved,) = compare_arms(arms["control"], arms["test"], arms["steady"])
    assert moved.startswith("the fix moves the graph break(s) in /tmp/site/diffusers/hooks/faster_cache.py:new_forward: ")
    before, after = moved.split(" -> ")
    assert [f"faster_cache.py:{n} (" in before for n in (423, 425, 434, 453)] == [True] * 4
    assert after.count("[lab fix: faster_cache_timestep_once]:") == 3


def test_a_break_is_removed_where_the_test_arm_traced_its_frame_again_without_it():
    site = {"where": "diffusers/hooks/h.py:40", "reason": "data-dependent", "count": 2,
            "frames": ["diffusers/hooks/h.py:pre_forward"]}
    frame = {"function": "pre_forward", "where": "diffusers/hooks/h.py:30"}
    arm = {"graph_break_sites": [], "frames": [], "compilations": 0, "recompiles": 0, "recompile_reasons": []}
    control = {**arm, "graph_break_sites": [site], "frames": [frame], "compilations": 1}
    steady = dict(arm)
    assert compare_arms(control, {**arm, "frames": [frame], "compilations": 1}, steady) == [
        "finding: the fix removes the graph break at diffusers/hooks/h.py:40 (data-dependent)"]
    assert compare_arms(control, arm, steady) == []  # not traced again: it reused the control's compiled code
    other = {"function": "torch_dynamo_resume_in_post_forward_at_52", "where": "diffusers/hooks/h.py:52"}
    assert compare_arms(control, {**arm, "frames": [other], "compilations": 1}, steady) == []


def test_a_graph_break_the_fix_adds_is_flagged_with_its_line(tmp_path):
    def with_break(forward):
        def forward_with_break(self, *args, **kwargs):
            torch._dynamo.graph_break()  # the deliberate graph break
            return forward(self, *args, **kwargs)
        return forward_with_break

    r = _compiled_ab(tmp_path, _runtime_fix("adds_break", with_break))
    c = r["compilation"]
    site = c["test"]["graph_break_sites"][0]
    assert site["where"].endswith("test_compile.py:" + str(with_break.__code__.co_firstlineno + 2))
    assert site["frames"] and site["frames"][0].endswith("test_compile.py:forward_with_break")
    assert site["reason"].startswith("User-inserted graph break")
    assert any(n.startswith("the test arm adds a graph break at") for n in c["notes"])
    assert any("adds a graph break" in w for w in r["warnings"])


def test_outputs_that_differ_under_compile_keep_what_each_arm_compiled(tmp_path):
    from lab.pages.report import markdown

    def scaled(forward):
        def forward_scaled(self, *args, **kwargs):
            return forward(self, *args, **kwargs) * 1.5  # new code in the test arm: compiled anew, other results
        return forward_scaled

    r = _compiled_ab(tmp_path, _runtime_fix("scales", scaled))
    assert r["verdict"] is Verdict.OUTPUTS_DIFFER and "samples" not in r  # not timed
    c = r["compilation"]
    assert c["control"]["compilations"] >= 1 and c["test"]["compilations"] >= 1
    page = markdown(msgspec.convert({**r, "name": "x", "created": "", "scenario": "wan", "fixes": ["scales"],
                                     "environment": {"torch": "t", "diffusers": "d", "lab_commit": "c"}, "config": {},
                                     "command": "lab ab", "size": "tiny", "mode": "compile", "steps": 4}, ABResult))
    assert "Compilation (the compiler's structured log" in page


CALLS = Counter()  # module state that a compiled forward reads: dynamo guards on its value


def test_a_module_that_recompiles_every_call_is_flagged(tmp_path):
    def recompiling(forward):
        def forward_counting(self, *args, **kwargs):
            CALLS["n"] += 1
            out = forward(self, *args, **kwargs)
            return out * 1.0 if CALLS["n"] % 2 else out  # a Python int the compiled code guards on: new each call
        return forward_counting

    r = _compiled_ab(tmp_path, _runtime_fix("recompiles", recompiling))
    c = r["compilation"]
    # every block call sees a new count, so the first test call already recompiles up to torch's limit
    assert c["test"]["recompiles"] >= 8 and c["control"]["recompiles"] == 0
    note = next(n for n in c["notes"] if n.startswith("the test arm recompiles"))
    assert "G['CALLS']" in note and "reached torch's limit of 8 recompiles" in note
    assert note in r["warnings"]


def test_a_second_run_into_the_same_log_directory_counts_only_its_own_compiles(tmp_path):
    def run():
        torch._dynamo.reset()
        f = torch.compile(lambda x: x * 2 + 1, backend="eager")
        with StructuredLog(tmp_path / "torch_trace") as log:
            log.mark("first call")
            f(torch.ones(3))
            log.mark("later calls")
            f(torch.ones(3))
            return log.by_phase()

    first = run()
    again = run()  # the first run's log is still in the folder
    assert first["first call"]["compilations"] == again["first call"]["compilations"] == 1
    assert first["start"]["compilations"] == again["start"]["compilations"] == 0
    assert again["later calls"]["compilations"] == 0


class _Helpers:
    """Where a fix's helper lives, read at every call (as a hook module's function is): the counter wraps it here."""

    @staticmethod
    @torch.compiler.disable
    def read_once(x):  # a helper kept out of the graph, as `faster_cache_timestep_once`'s is
        return x


def test_the_counting_call_of_a_compiled_arm_is_not_one_of_its_timed_calls(tmp_path):
    """The counting wrappers that prove the fixed code ran are code the compiler traces: under compile the outputs
    come from plain calls and the counts from a call of its own, whose compilations are not the timed calls'. Before,
    the counted call ran after the warm-up mark, so its compilations read as a recompile at steady state (FLUX.1 with
    FasterCache on an H100: 9 compilations after the warm-up, and outputs 0.047 apart)."""
    def forward_with_helper(forward):
        def forward_helped(self, hidden_states, *args, **kwargs):
            return forward(self, _Helpers.read_once(hidden_states), *args, **kwargs)
        return forward_helped

    def runtime(pipe, patcher):
        block = pipe.transformer.blocks[0]
        patcher.setattr(type(block), "forward", forward_with_helper(type(block).forward))
        patcher.count(_Helpers, "read_once", "read_once")

    fix = Fix(name="helper", description="test", upstream=Upstream(()), pipelines=EVERY, runtime=runtime,
              exercised_by=("read_once",))
    r = _compiled_ab(tmp_path, fix)
    assert r["verify"]["exercised"] == {"helper": 16} and r["verify"]["identical"]  # 2 blocks, 4 steps, CFG
    c = r["compilation"]
    assert c["steady"]["compilations"] == 0 and not any("steady state" in w for w in r["warnings"])
    # what the verifying calls compiled is kept apart (the counting call's own compilations are not theirs): here
    # nothing, the warm-up having compiled all that the arms' plain calls run
    assert c["verify"]["compilations"] == 0 and c["verify"]["recompiles"] == 0, c["verify"]
    page = "\n".join(report.compilation_lines(SimpleNamespace(compilation=c)))  # (it reads only that)
    assert "| | control, first calls | test, first calls | verification | every later call |" in page, page
