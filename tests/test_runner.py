"""Compiling the transformer and timing a call under the lab's instrumentation (CPU, tiny scenarios)."""

import pytest
import torch
from torch._dynamo.utils import counters

from lab.run.runner import CompileSpec, _cloning_outputs, apply_compile, timed_call
from lab.run.scenario import build, get_scenario


@pytest.mark.slow
def test_whole_transformer_compile_keeps_the_instrumentation_outside():
    # nn.Module.compile would trace the per-call instrumentation wrapped around forward: a new wrapper each call
    # means a recompile each call, and CUDA events created while tracing are never recorded (part 28 on the H200)
    built = build(get_scenario("flux2"), size="tiny", device="cpu")
    apply_compile(built, CompileSpec(mode="compile", regional=False))
    compiled = built.pipe.transformer.forward
    torch._dynamo.reset()
    counters.clear()
    compiling = []

    def watch(inst):  # the step-begin hook runs inside the transformer-forward wrapper
        inst.on_step_begin = lambda step: compiling.append(torch.compiler.is_compiling())

    first = timed_call(built, extra_patch=watch)
    frames = counters["frames"]["ok"]
    second = timed_call(built, extra_patch=watch)
    assert frames >= 1, "the compiled forward was not called"
    assert counters["frames"]["ok"] == frames, "the second call compiled again"
    assert compiling == [False] * (2 * built.steps), "the instrumentation was traced into the graph"
    assert len(first.steps_ms) == len(second.steps_ms) == built.steps
    assert built.pipe.transformer.forward is compiled  # the instrumentation is removed after the call
    torch.testing.assert_close(first.output, second.output)


def test_cuda_graph_outputs_are_cloned_with_whole_transformer_compile():
    assert CompileSpec(mode="compile", regional=False, compile_mode="reduce-overhead").clones_outputs
    assert "outputs cloned" in CompileSpec(mode="compile", regional=False, compile_mode="reduce-overhead").describe()
    assert not CompileSpec(mode="compile", compile_mode="reduce-overhead").clones_outputs  # regional: inside the model
    assert not CompileSpec(mode="compile", regional=False).clones_outputs
    buffer = torch.ones(3)  # a graph's static output, overwritten by the next replay
    forward = _cloning_outputs(lambda return_dict=False: (buffer, "tag"))
    sample, tag = forward()
    buffer.add_(1)
    assert tag == "tag" and sample.tolist() == [1.0, 1.0, 1.0]
