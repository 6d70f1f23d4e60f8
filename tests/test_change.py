"""`lab ab --patch`: unified diffs parsed, applied in memory, installed reversibly, and their lines covered."""

import json
import shutil

import pytest

from lab.apply import change, releases
from lab.apply.coverage import LineCoverage
from lab.apply.diff import unified_diff
from lab.apply.fix import applied, get_fix, rewritten_sources
from tests.conftest import ROOT, lab_here

# seconds per test (pipelines built, whole runs, compiles or every committed result): left out of `make test-fast`
pytestmark = pytest.mark.slow

UNIPC = "diffusers.schedulers.scheduling_unipc_multistep"
UNIPC_PATH = "src/diffusers/schedulers/scheduling_unipc_multistep.py"



def installed_source(module: str = UNIPC) -> str:
    import importlib

    return open(importlib.import_module(module).__file__, encoding="utf-8").read()


def write_diff(tmp_path, old: str, new: str, path: str = UNIPC_PATH, name: str = "change.diff"):
    diff = tmp_path / name
    diff.write_text("a commit message that git apply skips\n\n" + unified_diff(old, new, path))
    return diff


# --- parsing and applying -----------------------------------------------------------------------------------


def test_a_lab_diff_applies_to_exactly_the_source_its_rewrite_makes():
    patches = change.read([ROOT / "patches" / "unipc_stack.diff"])
    assert list(patches.modules) == [UNIPC] and patches.name == "patch-unipc_stack"
    assert patches.modules[UNIPC].source == rewritten_sources([get_fix("unipc_stack")])[UNIPC].new_source


def test_changed_lines_are_the_added_lines_and_the_line_after_a_cut():
    source = "a\nb\nc\nd\ne\nf\n"
    text = "--- a/x.py\n+++ b/x.py\n@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n@@ -5,2 +5,1 @@\n-e\n f\n"
    (diff,) = change.parse(text)
    out = change.apply(change.Applied(source, set()), diff, "here")
    assert out.source == "a\nb\nC\nd\nf\n"
    assert out.changed == {3, 5}  # the added `C`, and `f`, which now stands where `e` was cut


def test_hunks_apply_at_an_offset_and_stacked_diffs_keep_earlier_changes():
    first = change.parse("--- a/x.py\n+++ b/x.py\n@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n")[0]
    second = change.parse("--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,4 @@\n+one\n+two\n a\n b\n")[0]
    shifted = change.apply(change.Applied("0\n0\n0\na\nb\nc\nd\n", set()), first, "here")  # 3 lines more on top
    assert shifted.source == "0\n0\n0\na\nb\nC\nd\n" and shifted.changed == {6}
    stacked = change.apply(change.apply(change.Applied("a\nb\nc\nd\n", set()), first, "here"), second, "here")
    assert stacked.source == "one\ntwo\na\nb\nC\nd\n" and stacked.changed == {1, 2, 5}


def test_no_newline_at_end_of_file_markers():
    text = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+B\n\\ No newline at end of file\n"
    (diff,) = change.parse(text)
    assert change.apply(change.Applied("a\nb", set()), diff, "here").source == "a\nB"


def test_a_hunk_that_does_not_apply_names_the_file_the_hunk_the_release_and_the_line(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_WHEELS", str(tmp_path / "none"))
    monkeypatch.setenv("LAB_CACHE", str(tmp_path / "cache"))
    text = (ROOT / "patches" / "unipc_stack.diff").read_text()
    broken = tmp_path / "broken.diff"
    broken.write_text(text.replace("         alpha_t, sigma_t = self._sigma_to_alpha_sigma_t(sigma_t)\n",
                                   "         alpha_t, sigma_t = self.something_else(sigma_t)\n", 1))
    with pytest.raises(change.PatchError) as e:
        change.read([broken])
    message = str(e.value)
    assert message.startswith(f"{broken}: hunk 1 of 6 for {UNIPC_PATH} (@@ -882,7 +882,8 @@)")
    assert "does not apply to the installed diffusers 0.37.1" in message
    assert "At line 886 the diff expects `alpha_t, sigma_t = self.something_else(sigma_t)`" in message
    assert "No release wheels to check it against" in message


def test_the_nearest_release_a_diff_applies_to_is_named(tmp_path, monkeypatch):
    # The PR diff of unipc_host_coeffs is made against 0.42.1, whose UniPC file 0.38.0 already had.
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("0.38.0", "0.42.1"):
        shutil.copy(releases.find_wheel(version), wheels)
    monkeypatch.setenv("LAB_WHEELS", str(wheels))
    monkeypatch.setenv("LAB_CACHE", str(tmp_path / "cache"))  # only the two wheels above are at hand
    with pytest.raises(change.PatchError) as e:
        change.read([ROOT / "patches" / "pr" / "unipc_host_coeffs.diff"])
    assert "does not apply to the installed diffusers 0.37.1" in str(e.value)
    assert ("It applies to diffusers 0.38.0 (and 0.42.1), of the 2 release wheels at hand (0.38.0, 0.42.1): run with "
            "`--test-diffusers 0.38.0`, or rebase it.") in str(e.value)


def test_a_file_diffusers_does_not_have(tmp_path):
    diff = write_diff(tmp_path, "x = 1\n", "x = 2\n", path="src/diffusers/pipelines/nope/pipeline_nope.py")
    with pytest.raises(change.PatchError, match=r"diffusers 0.37.1 has no src/diffusers/pipelines/nope/pipeline_nope.py"):
        change.read([diff])


def test_files_outside_the_package_are_skipped_and_a_diff_of_only_those_is_an_error(tmp_path):
    docs = write_diff(tmp_path, "old\n", "new\n", path="docs/source/en/index.md", name="docs.diff")
    with pytest.raises(change.PatchError, match=r"change\(s\) no diffusers source \(skipped: docs/source/en/index.md"):
        change.read([docs])
    both = tmp_path / "both.diff"
    both.write_text(docs.read_text() + (ROOT / "patches" / "unipc_stack.diff").read_text())
    patches = change.read([both])
    assert patches.skipped == ("docs/source/en/index.md (outside the diffusers package)",) and UNIPC in patches.modules


@pytest.mark.parametrize("text,message", [
    ("just some text\n", "holds no file changes: is it a unified diff"),
    ("--- /dev/null\n+++ b/src/diffusers/new_module.py\n@@ -0,0 +1 @@\n+x = 1\n", "creates src/diffusers/new_module.py"),
    ("--- a/src/diffusers/x.py\n+++ b/src/diffusers/x.py\n@@ -1,3 +1,3 @@\n a\n", "is cut off at the end of the file"),
])
def test_bad_diffs_are_one_clear_error(tmp_path, text, message):
    diff = tmp_path / "bad.diff"
    diff.write_text(text)
    with pytest.raises(change.PatchError, match=message):
        change.read([diff])


def test_cli_errors_are_one_line_without_a_traceback(tmp_path):
    missing = lab_here("ab", "--patch", str(tmp_path / "nope.diff"), "--pipeline", "wan")
    assert missing.returncode == 2 and missing.stderr.startswith("ERROR: Cannot read the diff")
    assert "Traceback" not in missing.stderr


# --- installing: reversible, imports, coverage --------------------------------------------------------------


def _len_change(tmp_path):
    """A diff that adds an import and uses it in `UniPCMultistepScheduler.__len__`."""
    old = installed_source()
    assert "\nimport math\n" in old and "        return self.config.num_train_timesteps\n" in old
    new = old.replace("\nimport math\n", "\nimport fractions\nimport math\n", 1).replace(
        "        return self.config.num_train_timesteps\n",
        "        length = fractions.Fraction(self.config.num_train_timesteps)\n        return int(length)\n", 1)
    return write_diff(tmp_path, old, new)


def test_a_diff_is_installed_reversibly_with_its_imports_even_on_error(tmp_path):
    import diffusers.schedulers.scheduling_unipc_multistep as module

    fix, patches = change.load([_len_change(tmp_path)])
    original = module.UniPCMultistepScheduler.__dict__["__len__"]
    scheduler = module.UniPCMultistepScheduler()
    with pytest.raises(RuntimeError):
        with applied([fix]):
            assert module.UniPCMultistepScheduler.__dict__["__len__"] is not original
            assert module.fractions.Fraction(1) == 1  # the added import is in the module while the change is on
            assert len(scheduler) == 1000
            raise RuntimeError("a failing call")
    assert module.UniPCMultistepScheduler.__dict__["__len__"] is original and not hasattr(module, "fractions")
    assert sorted(fix.targets) == [f"{UNIPC}:UniPCMultistepScheduler.__len__", f"{UNIPC}:fractions"]


def test_line_coverage_sees_the_changed_lines_that_ran(tmp_path):
    import diffusers.schedulers.scheduling_unipc_multistep as module

    fix, _ = change.load([_len_change(tmp_path)])
    ((pseudo, lines),) = fix.lines
    assert pseudo.endswith("[lab patch: patch-change]") and len(lines) == 2
    scheduler = module.UniPCMultistepScheduler()
    with applied([fix]), LineCoverage([pseudo]) as idle:
        scheduler.set_timesteps(4)  # never calls __len__
    with applied([fix]), LineCoverage([pseudo]) as used:
        len(scheduler)
    assert not set(lines) & idle.hits[pseudo] and set(lines) <= used.hits[pseudo]


def test_a_change_inside_a_decorated_method_is_seen_when_it_runs():
    # WanTransformer3DModel.forward is wrapped by `@apply_lora_scale`: the changed line is in the function inside
    import torch
    from diffusers import WanTransformer3DModel

    fix, _ = change.load([ROOT / "patches" / "changes" / "wan_contiguous.diff"])
    ((pseudo, lines),) = fix.lines
    assert pseudo.endswith("[lab patch: patch-wan_contiguous]") and len(lines) == 1
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                  out_channels=4, text_dim=8, freq_dim=8, ffn_dim=16, num_layers=1,
                                  rope_max_seq_len=32).eval()
    inputs = {"hidden_states": torch.randn(1, 4, 1, 4, 4), "timestep": torch.tensor([10]),
              "encoder_hidden_states": torch.randn(1, 3, 8)}
    with torch.no_grad():
        before = model(**inputs).sample
        with applied([fix]), LineCoverage([pseudo]) as cov:
            after = model(**inputs).sample
    assert set(lines) <= cov.hits[pseudo] and torch.equal(before, after)


# --- end to end ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fix_and_patch(tmp_path_factory):
    out = tmp_path_factory.mktemp("ab")
    common = ["--pipeline", "wan", "--blocks", "6", "--repeat", "1", "--profile-calls", "1", "--out", str(out),
              "--trace-dir", str(out / "traces")]
    by_fix = lab_here("ab", "--fix", "unipc_stack", *common)
    by_patch = lab_here("ab", "--patch", str(ROOT / "patches" / "unipc_stack.diff"), *common)
    assert by_fix.returncode == 0, by_fix.stderr[-3000:]
    assert by_patch.returncode == 0, by_patch.stderr[-3000:]
    return (json.loads((out / "wan" / "unipc_stack__eager__tiny__cpu.json").read_text()),
            json.loads((out / "wan" / "patch-unipc_stack__eager__tiny__cpu.json").read_text()), out)


def test_patch_gives_the_same_trace_deltas_as_the_fix(fix_and_patch):
    by_fix, by_patch, _ = fix_and_patch
    for metric in ("syncs", "host_scalar_reads", "memcpy_HtoD"):
        a, b = by_fix["profile"]["metrics"][metric], by_patch["profile"]["metrics"][metric]
        assert (a["control"], a["test"]) == (b["control"], b["test"]), metric
    assert by_fix["profile"]["metrics"]["host_scalar_reads"]["test"] < by_fix["profile"]["metrics"]["host_scalar_reads"]["control"]
    assert by_patch["verify"]["identical"] and by_patch["verify"]["lines"]["patch-unipc_stack"] == {
        "changed": 12, "ran": 12, "not_run": []}
    assert by_patch["patches"]["paths"] == [str(ROOT / "patches" / "unipc_stack.diff")]
    assert by_patch["fixes"] == ["patch-unipc_stack"]


def test_patch_page_says_where_the_change_came_from(fix_and_patch):
    _, _, out = fix_and_patch
    page = (out / "wan" / "patch-unipc_stack__eager__tiny__cpu.md").read_text()
    assert "Change: `" in page and "applied in memory to `diffusers.schedulers.scheduling_unipc_multistep`" in page
    assert "`patch-unipc_stack`: 12 of its 12 changed line(s) ran" in page


def test_a_diff_that_never_runs_in_the_pipeline_is_not_exercised(tmp_path):
    module = "diffusers.schedulers.scheduling_ddim"
    old = installed_source(module)
    marker = "        # 1. get previous step value (=t-1)\n"
    assert marker in old
    diff = write_diff(tmp_path, old, old.replace(marker, marker + "        unused = 0\n", 1),
                      path="src/diffusers/schedulers/scheduling_ddim.py")
    proc = lab_here("ab", "--patch", str(diff), "--fix", "no_progress_bar", "--pipeline", "wan", "--blocks", "6",
               "--repeat", "1", "--no-profile", "--out", str(tmp_path / "out"), "--trace-dir", str(tmp_path / "tr"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "wan" / "no_progress_bar+patch-change__eager__tiny__cpu.json").read_text())
    assert result["verify"]["lines"]["patch-change"]["ran"] == 0
    assert result["verify"]["lines"]["patch-change"]["not_run"] == ["scheduling_ddim.py:" +
                                                                     str(result["patches"]["modules"][module][0]) +
                                                                     ": unused = 0"]
    assert "not exercised in this scenario: patch-change" in result["warnings"]  # no_progress_bar did run


# --- mistakes in a diff are named with the diff, before anything runs ------------------------------------------


def test_definitions_that_fail_when_made_name_the_diff_and_the_line(tmp_path):
    old = installed_source()
    new = old.replace("    def set_begin_index(", "    @undefined_decorator\n    def set_begin_index(", 1)
    diff = write_diff(tmp_path, old, new)
    with pytest.raises(change.PatchError, match=r"change\.diff: .*fails when the definitions the diff changes are made: "
                                                 r"NameError: name 'undefined_decorator' is not defined \(line \d+"):
        change.load([diff])


def test_the_same_diff_twice_is_refused(tmp_path):
    old = installed_source()
    diff = write_diff(tmp_path, old, old.replace("rks = torch.stack(rks)", "rks = torch.stack(rks)  # again", 1))
    with pytest.raises(change.PatchError, match="is given twice: each diff is applied once"):
        change.read([diff, tmp_path / "." / diff.name])


def test_a_rename_is_refused_before_anything_runs(tmp_path):
    diff = tmp_path / "rename.diff"
    diff.write_text(f"diff --git a/{UNIPC_PATH} b/src/diffusers/schedulers/scheduling_unipc_renamed.py\n"
                    "similarity index 100%\n"
                    f"rename from {UNIPC_PATH}\nrename to src/diffusers/schedulers/scheduling_unipc_renamed.py\n")
    with pytest.raises(change.PatchError, match="renames .* a module cannot be renamed"):
        change.read([diff])


def test_a_failure_through_the_lab_wrapper_names_the_caller():
    from lab.apply.patching import CallCounter, Patcher
    from lab.base.errors import describe_failure

    class Scheduler:
        def step(self, a, b):
            return a + b

    def pipeline(s):
        return s.step(1, 2, 3)  # a call the changed signature no longer fits

    s = Scheduler()
    patcher = Patcher(CallCounter())
    patcher.count(s, "step", "step")
    try:
        pipeline(s)
    except TypeError as e:
        line = describe_failure(e)
    finally:
        patcher.restore()
    assert "test_change.py" in line and "pipeline" in line and "through the lab's patching wrapper" in line, line
