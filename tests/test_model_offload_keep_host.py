"""`model_offload_keep_host` on the CPU, where model CPU offload moves nothing between devices.

`enable_model_cpu_offload(device="cpu")` runs accelerate's hooks for real on a CPU, but there both moves stay on the
host (`cpu:0`, which the hook moves to in every forward, and back), so the copy back the fix removes cannot show. The
stand-in below makes the moves a device's, and nothing else: a move inside the hook's `pre_forward` of a host tensor
gives a new tensor (on a GPU, the copy to the device) and of a tensor already there the tensor itself, and a move back
of such a tensor (the hook's `init_hook`, or the pipeline's `.to("cpu")` at the end of the call) gives a new host
tensor (on a GPU, a blocking device-to-host copy), and of a host tensor the tensor itself. Upstream's hooks and the fix's runtime part run for real on a
tiny FLUX.1: outputs bit-identical, no weight copied back, the fixed path counted as run, and everything given back.
What it saves on a GPU is for `lab ab --setting model_cpu_offload` there.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from lab.apply.fix import applied, each_sets, exercised, get_fix
from lab.apply.patching import CallCounter
from lab.run.scenario import build, get_scenario

REPO = Path(__file__).resolve().parents[1]
ACCELERATE_DIFF = REPO / "patches" / "accelerate" / "model_offload_keep_host.diff"


def _phase() -> str | None:
    frame = sys._getframe(2)
    while frame is not None:
        name, file = frame.f_code.co_name, frame.f_code.co_filename
        if name == "send_to_device":  # the forward's inputs, which the hook moves with the model: not weights
            return None
        if (file.endswith("accelerate/hooks.py") and name == "pre_forward") or (
                "fixes/model_offload_" in file and name.endswith("pre_forward")):  # a fix's own move
            return "onload"
        if (file.endswith("accelerate/hooks.py") and name == "init_hook") or (
                file.endswith("pipelines/pipeline_utils.py") and name == "to"):
            return "offload"
        frame = frame.f_back
    return None


@contextlib.contextmanager
def two_devices(moves: collections.Counter):
    """Count the copies model offloading would make between a device and its host, making each one for real."""
    real_to = torch.Tensor.to
    on_device: set[int] = set()  # data pointers of the tensors "on the device"
    alive: list[torch.Tensor] = []  # so that no pointer is reused by a later host tensor

    def to(self, *args, **kwargs):
        where = _phase()
        if where is None:
            return real_to(self, *args, **kwargs)
        if (where == "onload") == (self.data_ptr() in on_device):
            return self  # already where it goes (on a CPU, `.to("cpu:0")` would copy: the hook moves it every call)
        out = self.clone()
        alive.append(out)
        if where == "onload":
            on_device.add(out.data_ptr())
            moves["to the device"] += 1
            # `Module.to` passes `non_blocking` third (`t.to(device, dtype, non_blocking)`)
            if kwargs.get("non_blocking") or (len(args) > 2 and args[2] is True):
                moves["to the device without a wait"] += 1
        else:
            moves["back to the host"] += 1
        return out

    with mock.patch.object(torch.Tensor, "to", to):
        yield


@pytest.fixture(scope="module")
def offloaded():
    """A tiny FLUX.1 with model CPU offload through its own API, and its output without offloading."""
    built = build(get_scenario("flux"), size="tiny", device="cpu")
    reference = built().images
    built.pipe.enable_model_cpu_offload(device="cpu")  # the hooks for real; on a CPU a move copies nothing
    return built, reference


def test_the_weights_are_never_copied_back_and_everything_is_given_back(offloaded):
    from accelerate.hooks import CpuOffload

    built, reference = offloaded
    fix = get_fix("model_offload_keep_host")
    params = list(built.pipe.transformer.parameters())
    from diffusers import DiffusionPipeline

    originals = {name: CpuOffload.__dict__.get(name) for name in ("pre_forward", "init_hook", "detach_hook")}
    assert originals["detach_hook"] is None  # inherited from `ModelHook`: the patch must leave none behind
    free = DiffusionPipeline.maybe_free_model_hooks

    unfixed: collections.Counter = collections.Counter()
    with two_devices(unfixed):
        assert torch.equal(built().images, reference)
    assert unfixed["to the device"] == len(params)  # the transformer went to the "device" (the VAE is not called)
    assert unfixed["back to the host"] == len(params)  # and every weight of it came back

    fixed: collections.Counter = collections.Counter()
    counter = CallCounter()
    with applied([fix], built.pipe, counter):
        with two_devices(fixed):
            host = [p.data_ptr() for p in params]
            outputs = [built().images for _ in range(2)]
            assert [p.data_ptr() for p in params] == host  # pointed back at the very tensors the moves copied from
    assert all(torch.equal(out, reference) for out in outputs)
    assert fixed["to the device"] == unfixed["to the device"] * 2  # the onloads are as before
    assert fixed["back to the host"] == 0  # nothing copied back (no buffers in FLUX.1's transformer)
    assert exercised(fix, counter) == 2  # each call's end pointed the transformer back

    assert {name: CpuOffload.__dict__.get(name) for name in originals} == originals  # given back
    assert DiffusionPipeline.maybe_free_model_hooks is free
    again: collections.Counter = collections.Counter()
    with two_devices(again):
        assert torch.equal(built().images, reference)
    assert again == unfixed  # upstream's copies, as before the fix


def test_the_next_model_in_the_sequence_offloads_the_previous_one_without_a_copy_back(offloaded):
    """`UserCpuOffloadHook.offload` (the VAE's hook offloads the transformer when a decoding call reaches it) takes
    the same path as the end of the call."""
    built, _ = offloaded
    fix = get_fix("model_offload_keep_host")
    transformer_hook = next(h for h in built.pipe._all_hooks if h.model is built.pipe.transformer)
    moves: collections.Counter = collections.Counter()
    counter = CallCounter()
    with applied([fix], built.pipe, counter), two_devices(moves):
        host = [p.data_ptr() for p in built.pipe.transformer.parameters()]
        transformer_hook.hook.pre_forward(built.pipe.transformer)
        assert [p.data_ptr() for p in built.pipe.transformer.parameters()] != host  # "on the device"
        transformer_hook.offload()
        assert [p.data_ptr() for p in built.pipe.transformer.parameters()] == host
    assert moves["to the device"] == len(host) and moves["back to the host"] == 0
    assert exercised(fix, counter) == 1


def test_removing_the_hook_leaves_the_model_where_it_is(offloaded):
    """accelerate's own `test_cpu_offload_hook_moves_model`: `remove_hook_from_module` after a forward leaves the model
    on the device, as upstream; the fix lets the kept host tensors go instead of pointing the parameters back at them
    (the end of a pipeline's call offloads each model through its hook first, which points them back)."""
    from accelerate import cpu_offload_with_hook
    from accelerate.hooks import remove_hook_from_module

    built, _ = offloaded
    fix = get_fix("model_offload_keep_host")
    torch.manual_seed(0)
    model, _hook = cpu_offload_with_hook(torch.nn.Linear(4, 4), execution_device="cpu")
    moves: collections.Counter = collections.Counter()
    with applied([fix], built.pipe, CallCounter()), two_devices(moves), torch.no_grad():
        host = [p.data_ptr() for p in model.parameters()]
        model(torch.randn(2, 4))
        on_device = [p.data_ptr() for p in model.parameters()]
        remove_hook_from_module(model)
        assert [p.data_ptr() for p in model.parameters()] == on_device != host
    assert moves == {"to the device": 2}


def test_a_parameter_changed_on_the_device_is_copied_back_as_upstream(offloaded):
    """Between the move and the offload, a write to a parameter (its version counter moves) or a parameter pointed
    elsewhere leaves that one to the copy back, so the host keeps the changed value; the others still point back."""
    built, _ = offloaded
    fix = get_fix("model_offload_keep_host")
    transformer = built.pipe.transformer
    transformer_hook = next(h for h in built.pipe._all_hooks if h.model is transformer)
    params = list(transformer.parameters())
    written, replaced = params[0], params[1]
    moves: collections.Counter = collections.Counter()
    counter = CallCounter()
    originals = (written.data, replaced.data)
    try:
        with applied([fix], built.pipe, counter), two_devices(moves):
            host = [p.data_ptr() for p in params]
            transformer_hook.hook.pre_forward(transformer)
            with torch.no_grad():
                written.mul_(2)  # in place on the "device": the parameter's own version counter moves
                expected_written = written.detach().clone()
            replacement = torch.full_like(replaced.data, 3.0)
            replaced.data = replacement  # pointed elsewhere (on a GPU, a device tensor; here one the stand-in keeps)
            transformer_hook.offload()
            after = [p.data_ptr() for p in params]
        assert after[2:] == host[2:]  # the unchanged ones pointed back at their host tensors
        assert after[0] != host[0]  # the written one copied back, as upstream
        assert after[1] == replacement.data_ptr()  # the replaced one left where it was pointed, as upstream
        assert moves["back to the host"] == 1 and moves["to the device"] == len(params)
        assert torch.equal(written.data, expected_written)
        assert exercised(fix, counter) == 1
        assert counter.counts["CpuOffload offload: parameters changed on the device, copied back"] == 2
    finally:
        written.data, replaced.data = originals  # the module-scoped pipeline as it was


def test_it_runs_only_in_model_cpu_offload():
    def each(setting: str) -> set[str]:
        return {f.name for fixes, _ in each_sets("flux", [setting]) for f in fixes}

    assert "model_offload_keep_host" in each("model_cpu_offload")
    assert "model_offload_keep_host" not in each("group_offload (level=block_level, blocks=1, stream=False, "
                                                 "record_stream=False)")
    assert "model_offload_keep_host" not in each("lora (rank=16)")


def model_offloaded():
    """The tiny FLUX.1 transformer under accelerate's model CPU offload hook (as `enable_model_cpu_offload` gives each
    model), its hook, and a pipeline that holds it, as the fixes' runtime parts find one."""
    from accelerate import cpu_offload_with_hook

    from tests.test_group_offload_keep_host import tiny_flux_transformer

    # `cpu:0`, as `enable_model_cpu_offload(device="cpu")` has it: the hook moves the model there and back
    model, hook = cpu_offload_with_hook(tiny_flux_transformer(), execution_device=torch.device("cpu", 0))
    return model, hook, SimpleNamespace(components={"transformer": model})


def cast_after_enabling(fixes: list, when: str, counter: CallCounter | None = None) -> list[torch.Tensor]:
    """`model.to(torch.bfloat16)` after model offloading was enabled and a forward ran, while the model is offloaded
    (`when="offloaded"`) or on the device (`"on the device"`, the hook's offload after the cast): the outputs of the
    forwards in bfloat16 after it, with `fixes` on (the stand-in device's copies real) and, after they are off, as
    upstream runs; each with all the model's parameters in bfloat16."""
    from tests.test_group_offload_keep_host import flux_inputs

    model, hook, pipe = model_offloaded()
    outputs = []
    with applied(fixes, pipe, counter), two_devices(collections.Counter()):
        model(**flux_inputs(torch.float32))
        if when == "offloaded":
            hook.offload()
        model.to(torch.bfloat16)
        hook.offload()
        for _ in range(2):
            outputs.append(model(**flux_inputs(torch.bfloat16))[0])
            assert all(p.dtype == torch.bfloat16 for p in model.parameters())
            hook.offload()
            assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    with two_devices(collections.Counter()):  # the fixes off: upstream's offload, on what they gave back
        outputs.append(model(**flux_inputs(torch.bfloat16))[0])
    return outputs


def cast_before_offloading() -> torch.Tensor:
    """The tiny transformer's output in bfloat16, cast before any offloading."""
    from tests.test_group_offload_keep_host import flux_inputs, tiny_flux_transformer

    return tiny_flux_transformer().to(torch.bfloat16)(**flux_inputs(torch.bfloat16))[0]


@pytest.mark.parametrize("when", ["offloaded", "on the device"])
def test_a_model_cast_after_offloading_was_enabled_runs_in_its_new_dtype(when):
    """A cast while the model is offloaded gives its parameters new host tensors, which the next move keeps; one while
    it is on the device points them at new device tensors, which the offload leaves to the copy back. Either way the
    forwards run in bfloat16 with upstream's outputs (a fix that pointed the parameters back at the float32 host
    tensors would fail them with a dtype mismatch)."""
    expected = cast_before_offloading()
    assert all(torch.equal(out, expected) for out in cast_after_enabling([], when))  # upstream's own
    fix, counter = get_fix("model_offload_keep_host"), CallCounter()
    assert all(torch.equal(out, expected) for out in cast_after_enabling([fix], when, counter))
    assert exercised(fix, counter) == 3  # each offload after a move took its path


UPSTREAM_RUN = """
import collections, json
import torch
from accelerate.hooks import CpuOffload
from lab.run.scenario import build, get_scenario
from tests.test_model_offload_keep_host import two_devices

built = build(get_scenario("flux"), size="tiny", device="cpu")
reference = built().images
built.pipe.enable_model_cpu_offload(device="cpu")
params = list(built.pipe.transformer.parameters())
moves = collections.Counter()
with two_devices(moves):
    host = [p.data_ptr() for p in params]
    outputs = [built().images for _ in range(2)]
    same = [p.data_ptr() for p in params] == host
print(json.dumps({"patched": "restore_cpu_tensors" in CpuOffload.__dict__, "params": len(params),
                  "to the device": moves["to the device"], "back to the host": moves["back to the host"],
                  "pointed back": same, "equal": all(torch.equal(o, reference) for o in outputs)}))
"""


@pytest.mark.slow
def test_the_accelerate_diff_and_its_diffusers_follow_up_apply_and_copy_nothing_back(tmp_path):
    """The upstream change, `patches/accelerate/model_offload_keep_host.diff`, is `git apply`-able to accelerate's
    `src/accelerate/hooks.py` of the release it names (1.15.0, the one pyproject pins); an accelerate patched with it
    runs the same tiny FLUX.1 under model CPU offload with the same outputs, without the lab's fix, and copies back
    only what the end of each call moves with `self.to("cpu")`: with the diffusers follow-up
    (`model_offload_keep_host_diffusers.diff`, which offloads each model through its hook there), nothing."""
    import accelerate
    import diffusers

    assert accelerate.__version__ == "1.15.0"  # the release the diff is against: pin and diff move together
    for package in (accelerate, diffusers):
        shutil.copytree(Path(package.__file__).parent, tmp_path / package.__name__,
                        ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}

    def run_and_see(diff: Path) -> dict:
        applied_diff = subprocess.run(["git", "apply", "-p2", "--exclude=test*", "--exclude=pipelines/test*",
                                       str(diff)], cwd=tmp_path, capture_output=True, text=True)
        assert applied_diff.returncode == 0, applied_diff.stderr
        run = subprocess.run([sys.executable, "-c", UPSTREAM_RUN], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1])

    seen = run_and_see(ACCELERATE_DIFF)
    n = seen["params"]
    assert seen == {"patched": True, "params": n, "to the device": 2 * n, "back to the host": 2 * n,
                    "pointed back": False, "equal": True}  # the end of each call copies the transformer back
    seen = run_and_see(ACCELERATE_DIFF.with_name("model_offload_keep_host_diffusers.diff"))
    assert seen == {"patched": True, "params": n, "to the device": 2 * n, "back to the host": 0,
                    "pointed back": True, "equal": True}


def markdown_tables(text: str, ratio_column: int = 3) -> list[dict[str, list[str]]]:
    """The tables of a hand-written page, in order: each maps a row's first cell (its label up to " (") to its cells,
    for the rows whose cell `ratio_column` is a ratio (it starts with "0")."""
    tables: list[dict[str, list[str]]] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| pipeline") or line.startswith("| result"):
            tables.append({})
        elif tables and len(cells) > ratio_column and cells[ratio_column][:1] == "0":
            tables[-1][cells[0].split(" (")[0]] = cells
    return tables


PIPELINES = {"FLUX.1": "flux", "Flux2 Klein": "flux2", "Qwen-Image": "qwenimage", "LTX2": "ltx2", "Wan 2.1": "wan"}
#: the depth part of a result's name, per setting's cells (campaigns/settings.toml)
DEPTH = {"model_cpu_offload": {"FLUX.1": "", "Flux2 Klein": "", "Qwen-Image": "8l-", "LTX2": "8l-", "Wan 2.1": "4l-"},
         "sequential_cpu_offload": {**dict.fromkeys(PIPELINES, "8l-"), "Wan 2.1": "4l-"}}
ALL_FIVE = set(PIPELINES)


@pytest.mark.parametrize("page, setting, tables", [
    ("model_offload_keep_host", "model_cpu_offload", [("model_offload_keep_host", ALL_FIVE, "h100")]),
    ("model_offload_pinned", "model_cpu_offload",
     [("model_offload_pinned", ALL_FIVE - {"Wan 2.1"}, "h100"),
      ("model_offload_pinned-over-model_offload_keep_host", {"FLUX.1", "Flux2 Klein"}, "h100"),
      ("model_offload_pinned", {"Wan 2.1"}, "h200"),
      ("model_offload_pinned-over-model_offload_keep_host", {"Qwen-Image", "LTX2"}, "h200"),
      ("model_offload_pinned-over-model_offload_keep_host", {"Wan 2.1"}, "h100")]),
    ("sequential_offload_keep_cache", "sequential_cpu_offload",
     [("sequential_offload_keep_cache", ALL_FIVE, "h200"),
      ("sequential_offload_keep_cache-over-sequential_offload_pinned", ALL_FIVE, "h200")]),
    ("sequential_offload_pinned", "sequential_cpu_offload",
     [("sequential_offload_pinned", ALL_FIVE, "h200"),
      ("*+sequential_offload_keep_cache+sequential_offload_pinned*", ALL_FIVE, "h200")]),
])
def test_the_accelerate_descriptions_numbers_are_the_committed_results(page, setting, tables):
    """The tables of `patches/accelerate/*.md` are written by hand: each row must be what the committed result says
    (ratio and interval, call medians, blocks). Each table is one kind of A/B on one kind of GPU: the fix alone against
    upstream, over a base (`lab ab --base`), or a set of every fix (a name pattern), so that a result measured again
    cannot leave the description behind."""
    from lab import results

    found = markdown_tables((ACCELERATE_DIFF.parent / f"{page}.md").read_text())
    assert len(found) == len(tables)
    for rows, (stem, labels, device) in zip(found, tables):
        assert set(rows) == labels
        for label in labels:
            folder = REPO / "results" / "ab" / PIPELINES[label]
            (path,) = folder.glob(f"{stem}__eager__full-{DEPTH[setting][label]}{setting}__{device}.json")
            stats = results.read(path).stats
            _, before, after, ratio, _, blocks = rows[label]
            lo, hi = stats.ci
            assert ratio.startswith(f"{stats.ratio:.4f} ({lo:.4f}–{hi:.4f}), {1 / stats.ratio:.2f}x"), label
            assert (before, after) == (f"{stats.control_median:,.1f} ms", f"{stats.test_median:,.1f} ms"), label
            assert blocks == str(stats.n), label


@pytest.mark.parametrize("page", ["model_offload_keep_host", "model_offload_pinned"])
def test_the_accelerate_descriptions_quoted_verdicts_are_the_linked_results(page):
    """Past their tables, the descriptions quote decided A/Bs in prose (`0.1840 (0.1723–0.2117), 5.43x, 22,575.7 ->
    4,043.0 ms`), each beside the links to its results: every such quote must be what one of the results linked in
    the same paragraph or list item says."""
    import re

    from lab import results

    text = (ACCELERATE_DIFF.parent / f"{page}.md").read_text()
    quote = re.compile(r"(\d\.\d{4}) \((\d\.\d{4})–(\d\.\d{4})\), (\d+\.\d{2})x, ([\d,]+\.\d) -> ([\d,]+\.\d) ms")
    checked = 0
    for part in re.split(r"\n\s*\n|\n(?=- )", text):
        quotes = quote.findall(part)
        if not quotes:
            continue
        linked = []
        for link in re.findall(r"\]\((\.\./\.\./results/ab/[^)]+)\.md\)", part):
            stats = results.read((ACCELERATE_DIFF.parent / link).with_suffix(".json").resolve()).stats
            lo, hi = stats.ci
            linked.append((f"{stats.ratio:.4f}", f"{lo:.4f}", f"{hi:.4f}", f"{1 / stats.ratio:.2f}",
                           f"{stats.control_median:,.1f}", f"{stats.test_median:,.1f}"))
        for q in quotes:
            assert q in linked, (page, q)
            checked += 1
    assert checked >= 2


def test_the_replicates_page_gives_both_runs_numbers():
    """`results/replicates/README.md` sets a result the tables use beside the same A/B run again: each row links both
    files, and both columns must be what the two committed files say."""
    from lab import results

    page = REPO / "results" / "replicates"
    rows = [line for line in (page / "README.md").read_text().splitlines() if line.startswith("| [")]
    assert rows
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        kept, replicate = cells[0].split("](")[1].rstrip(")"), cells[2].split("](")[1].rstrip(")")
        assert kept.startswith("../ab/") and replicate.endswith(kept.removeprefix(".."))
        for text, link in ((cells[1], kept), (cells[2].split("](")[0].lstrip("["), replicate)):
            stats = results.read((page / link).with_suffix(".json")).stats
            lo, hi = stats.ci
            assert text == f"{stats.ratio:.4f} ({lo:.4f}–{hi:.4f}), {stats.n} blocks", row
