"""Where the device time goes (`lab.traces.work`), checked on real traces kept in the repository against independent
computations over their raw JSON: the shared H200 Wan trace (compiled, no shapes), an H200 SD3.5 census trace with
shapes (diffusers 0.42.1, 2 blocks), and a tiny SD3.5 call on the CPU (diffusers 0.37.1, with shapes)."""

import gzip
import json
from collections import Counter

import pytest

from lab.traces.peaks import peak_for
from lab.traces.trace import load
from lab.traces.work import classify, needs_copy, op_flops, summary, work_analysis
from tests.conftest import ROOT

TRACES = ROOT / "tests" / "data" / "traces"
SD35_H200 = TRACES / "sd35_h200_shapes.json.gz"
SD35_CPU = TRACES / "sd35_tiny_cpu.json.gz"


def raw(path):
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


# --- the rules, on literal names and layouts -------------------------------------------------------------------------


def test_kernels_are_classed_by_their_names_and_the_operators_that_launched_them():
    assert classify("nvjet_sm90_tst_256x152_64x4_1x2_h_bz_coopA_bias_TNT", ["aten::addmm", "aten::linear"]) == ("gemm", None)
    assert classify("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", ["aten::_cudnn_attention_forward",
                    "aten::_scaled_dot_product_cudnn_attention"]) == ("attention", "cudnn")
    assert classify("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", ["aten::_efficient_attention_forward"]) == ("attention", "efficient")
    assert classify("void at::native::elementwise_kernel<128, 4, ...>", ["aten::bmm", "aten::_scaled_dot_product_attention_math"]) \
        == ("attention", "math")
    # a copy that lays a tensor out again, and one that casts it
    copy = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(...)>"
    assert classify(copy, ["aten::copy_", "aten::clone", "aten::contiguous"]) == ("layout copy", None)
    assert classify(copy, ["aten::copy_", "aten::_to_copy", "aten::to"]) == ("elementwise", None)
    assert classify("void cudnn::engines_precompiled::nchwToNhwcKernel<...>", ["aten::cudnn_convolution"]) == ("layout copy", None)
    assert classify("sm90_xmma_fprop_implicit_gemm_bf16bf16", ["aten::cudnn_convolution", "aten::convolution"]) == ("conv", None)
    # inductor's kernels by the operators their names list
    assert classify("triton_red_fused__fused_rms_norm__scaled_dot_product_cudnn_attention_permute_view_3", []) == ("norm", None)
    assert classify("triton_poi_fused_clone_permute_view_2", []) == ("layout copy", None)
    assert classify("triton_poi_fused_gelu_view_6", []) == ("elementwise", None)
    assert classify("triton_tem_fused_addmm_4", []) == ("gemm", None)
    # a CPU-only trace: the operators themselves
    assert classify(None, ["aten::_scaled_dot_product_flash_attention_for_cpu"]) == ("attention", "flash (cpu)")
    assert classify(None, ["aten::native_layer_norm", "aten::layer_norm"]) == ("norm", None)


def test_which_layouts_cost_a_copy():
    assert needs_copy("aten::linear", 0, [2, 256, 32], [8192, 1, 256])  # a patch embedding's transpose
    assert needs_copy("aten::linear", 0, [2, 16, 32], [8704, 32, 1])  # a slice of a longer sequence
    assert not needs_copy("aten::linear", 0, [2, 256, 32], [8192, 32, 1])
    assert not needs_copy("aten::linear", 1, [32, 256], [1, 32])  # the weight is the model's layout
    assert not needs_copy("aten::mm", 1, [256, 32], [1, 256])  # a transposed matrix is read as it is
    assert needs_copy("aten::layer_norm", 0, [2, 256, 32], [8192, 1, 256])
    assert not needs_copy("aten::scaled_dot_product_attention", 0, [2, 4, 272, 8], [8704, 8, 32, 1])  # heads strided
    assert needs_copy("aten::scaled_dot_product_attention", 1, [2, 4, 272, 8], [8704, 2176, 1, 272])


def test_flops_of_matmuls_convolutions_and_attention():
    assert op_flops("aten::addmm", [[32], [2, 256], [256, 32], [], []], None) == 2 * 2 * 256 * 32
    assert op_flops("aten::bmm", [[4, 8, 16], [4, 16, 2]], None) == 2 * 4 * 8 * 16 * 2
    assert op_flops("aten::_scaled_dot_product_flash_attention_for_cpu", [[2, 4, 272, 8]] * 3, None) \
        == 2 * (2 * 2 * 4 * 272 * 272 * 8)
    conv = op_flops("aten::convolution", [[2, 4, 16, 16], [32, 4, 2, 2], [32]],
                    ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"])
    assert conv == 2 * 2 * 32 * 8 * 8 * (4 * 2 * 2)


def test_peaks_are_found_by_the_name_a_trace_gives():
    assert peak_for("NVIDIA H200").model == "H200 SXM"
    assert peak_for("NVIDIA H100 80GB HBM3").model == "H100 SXM"
    assert peak_for("NVIDIA H100 PCIe").model == "H100 PCIe"
    assert peak_for("NVIDIA A100-SXM4-80GB").model == "A100 SXM 80GB"
    assert peak_for("Some CPU") is None


# --- real traces -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wan(real_trace):
    return raw(real_trace), work_analysis(load(real_trace))


def test_every_piece_of_gpu_work_lands_in_one_class(wan):
    events, work = wan
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert work["count"] == len(gpu) == sum(c["count"] for c in work["by_class"].values())
    total_us = sum(round(e["dur"] * 1000) for e in gpu) / 1000
    assert work["total_us"] == pytest.approx(total_us, abs=0.01)
    assert sum(c["us"] for c in work["by_class"].values()) == pytest.approx(total_us, abs=0.01)


def test_the_attention_backend_and_the_strided_kernels(wan):
    events, work = wan
    kernels = [e["name"] for e in events if e.get("cat") == "kernel"]
    assert work["attention_backends"]["cudnn"]["count"] == sum("sdpa" in k for k in kernels) == 480
    assert work["strided_elementwise"]["count"] == sum(k.startswith("void at::native::elementwise_kernel<") for k in kernels)
    assert work["by_class"]["attention"]["share_pct"] > 60  # compiled Wan at 480x832x81: the attention dominates
    assert "missing" in work["flops"]  # captured without shapes


@pytest.fixture(scope="module")
def sd35_h200():
    return raw(SD35_H200), work_analysis(load(SD35_H200))


def _counted_flops(events) -> float:
    """The FLOPs of every addmm/mm/convolution/attention operator of the raw trace that no other such operator
    encloses, written apart from the analyzer."""
    wanted = ("aten::addmm", "aten::mm", "aten::convolution", "aten::_scaled_dot_product_cudnn_attention",
              "aten::_cudnn_attention_forward")
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e["name"] in wanted), key=lambda e: e["ts"])
    total, open_until = 0.0, -1.0
    for e in ops:
        if e["ts"] < open_until:  # inside the previous counted operator (cudnn's forward inside its SDPA)
            continue
        open_until = e["ts"] + e["dur"]
        total += op_flops(e["name"], e["args"]["Input Dims"], e["args"].get("Concrete Inputs"))
    return total


def test_flops_and_roofline_from_a_gpu_trace_with_shapes(sd35_h200):
    events, work = sd35_h200
    assert work["flops"]["total"] == pytest.approx(_counted_flops(events), rel=1e-9)
    assert work["flops"]["dtype"] == "bf16" and work["steps"] == 4
    roof = work["roofline"]
    assert roof["gpu"] == "H200 SXM" and roof["peak_tflops"] == 989.5 and 0 < roof["mfu_pct"] < 100
    # the GEMMs run closest to their ceiling, the layout copies farthest from theirs (they move bytes twice)
    assert roof["by_class"]["gemm"]["over_floor"] < roof["by_class"]["layout copy"]["over_floor"]
    brief = summary(work)
    assert brief["per"] == "step" and brief["roofline"]["mfu_pct"] == roof["mfu_pct"]
    assert brief["layout_copy_sites"][0]["site"].startswith("diffusers/models/attention_processor.py")


def test_strided_inputs_name_the_operator_and_the_line(sd35_h200):
    _, work = sd35_h200
    strided = work["strided_inputs"]
    # diffusers 0.42.1 made SD3's blocks contiguous (#14186): what is left is the joint attention's slice of the
    # sequence fed to a linear, once per block and step
    assert {s["op"] for s in strided["sites"]} == {"aten::linear"}
    assert strided["per_step"] == 3.0 and all(s["site"].startswith("diffusers/models/attention_processor.py")
                                              for s in strided["sites"])


def test_a_cpu_trace_is_classed_by_its_operators_own_time():
    work = work_analysis(load(SD35_CPU))
    events = raw(SD35_CPU)
    assert work["device"] == "cpu" and "missing" in work["roofline"]
    assert set(work["attention_backends"]) == {"flash (cpu)"}
    # diffusers 0.37.1: the patch embedding's transpose reaches the blocks' norms
    norms = [s for s in work["strided_inputs"]["sites"] if s["op"] == "aten::layer_norm"]
    assert norms and all(s["strides"][1] == 1 for s in norms)
    assert work["flops"]["total"] == pytest.approx(_counted_flops_cpu(events), rel=1e-9)
    counts = Counter(s["op"] for s in work["strided_inputs"]["sites"])
    assert counts["aten::layer_norm"] == 3  # three norms per block see it: norm1, norm1_context's twin and ff's


def _counted_flops_cpu(events) -> float:
    wanted = ("aten::addmm", "aten::mm", "aten::convolution", "aten::_scaled_dot_product_flash_attention_for_cpu")
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and e["name"] in wanted), key=lambda e: e["ts"])
    total, open_until = 0.0, -1.0
    for e in ops:
        if e["ts"] < open_until:
            continue
        open_until = e["ts"] + e["dur"]
        total += op_flops(e["name"], e["args"]["Input Dims"], e["args"].get("Concrete Inputs"))
    return total
