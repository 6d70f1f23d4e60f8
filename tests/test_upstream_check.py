"""`lab upstream check`: a PR diff against diffusers' own tests, released and with the diff.

Most tests use a fake release (a wheel of a few lines) and a fake diffusers test suite (a git repository made here),
so that each pytest run they start takes a second; the slow one runs the real 0.42.1 release (through
`lab.apply.releases`, as `diffusers_release` gets it) with a real PR diff of `patches/pr/`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import zipfile
from pathlib import Path

import pytest

from lab.apply import suites, test_run, upstream
from lab.apply.diff import unified_diff
from lab.pages.check_report import markdown
from lab.base.errors import UsageError
from tests.conftest import ROOT, lab_here

VERSION = "9.9.9"
MODULE = "diffusers/hooks/offload.py"
SOURCE = textwrap.dedent('''\
    """A module of the fake release."""


    class Offloader:
        def answer(self):
            return 42


    class _Private:
        pass
''')


def _header(version: str = VERSION) -> str:
    return f"# lab fix: fake - a fake fix\n# made from diffusers {version}: `git apply` it in a checkout\n"


def _diff(new_source: str, old_source: str = SOURCE, path: str = MODULE) -> str:
    return _header() + unified_diff(old_source, new_source, f"src/{path}")


CLEAN = _diff(SOURCE.replace("return 42", "return 40 + 2"))
WRONG = _diff(SOURCE.replace("return 42", "return 41"))
STALE = _header() + unified_diff(SOURCE.replace("return 42", "return 43"), SOURCE, f"src/{MODULE}")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                                   GIT_COMMITTER_EMAIL="t@t")).stdout


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))


#: diffusers' own conftest puts the checkout's src/ first; the fake suite's does the same
CONFTEST = """\
    import sys
    from os.path import abspath, dirname, join

    sys.path.insert(1, abspath(join(dirname(dirname(__file__)), "src")))
"""

SUITE = {
    "tests/__init__.py": "",
    "tests/conftest.py": CONFTEST,
    "tests/hooks/__init__.py": "",
    "tests/hooks/test_offload.py": """\
        import pytest

        from diffusers.hooks.offload import Offloader


        def test_answer():
            assert Offloader().answer() == 42


        def test_skipped():
            pytest.skip("needs an accelerator")
    """,
    "tests/hooks/test_broken.py": """\
        import lab_no_such_module_here  # a package the suite needs and this machine lacks

        from diffusers.hooks.offload import Offloader


        def test_never():
            assert Offloader
    """,
    "tests/other/__init__.py": "",
    "tests/other/test_unrelated.py": """\
        def test_unrelated():
            assert True
    """,
}


@pytest.fixture
def fake_release(tmp_path, monkeypatch) -> Path:
    """A wheel of diffusers 9.9.9 (a package of three files) in a wheel folder of its own, and a cache of its own."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / f"diffusers-{VERSION}-py3-none-any.whl", "w") as z:
        z.writestr("diffusers/__init__.py", f'__version__ = "{VERSION}"\n')
        z.writestr("diffusers/hooks/__init__.py", "")
        z.writestr(MODULE, SOURCE)
    monkeypatch.setenv("LAB_WHEELS", str(wheels))
    monkeypatch.setenv("LAB_CACHE", str(tmp_path / "cache"))
    return wheels


@pytest.fixture
def suite_repo(tmp_path) -> Path:
    """A git repository shaped as diffusers: the suite at tags v9.8.0, v9.9.0 and v10.0.0 (not tag v9.9.9), the
    test of the module added at v9.9.0."""
    repo = tmp_path / "diffusers-repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    stages = [("v9.8.0", {k: v for k, v in SUITE.items() if "test_offload" not in k}),
              ("v9.9.0", SUITE),
              ("v10.0.0", {"tests/hooks/test_later.py": "def test_later():\n    assert True\n"})]
    for tag, files in stages:
        _write(repo, files)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", tag)
        _git(repo, "tag", tag)
    return repo


def _diffs(tmp_path: Path, **texts: str) -> Path:
    folder = tmp_path / "diffs"
    folder.mkdir(exist_ok=True)
    for name, text in texts.items():
        (folder / f"{name}.diff").write_text(text)
    return folder


def _report(out: Path, name: str) -> upstream.Check:
    return upstream.decode((out / f"{name}.json").read_bytes())


# --- the rules, pure -----------------------------------------------------------------------------------------------


def test_the_tag_is_the_release_s_own_else_the_newest_release_not_newer():
    tags = ["v0.39.0", "v0.40.0", "v0.42.1rc1", "v0.43.0", "v0.41.0.dev0", "nightly", "v0.38.0"]
    assert suites.choose_tag(tags, "0.42.1") == "v0.40.0"  # no v0.42.1: pre-releases and newer ones do not count
    assert suites.choose_tag([*tags, "v0.42.1"], "0.42.1") == "v0.42.1"
    assert suites.choose_tag(tags, "0.40.0") == "v0.40.0"
    assert suites.choose_tag(tags, "0.30.0") is None


def test_a_diff_names_its_release_and_its_modules():
    text = (ROOT / "patches" / "pr" / "group_offload_keep_host.diff").read_text()
    assert upstream.release_of(text, "x") == "0.42.1"
    assert suites.touched_paths(text) == ["diffusers/hooks/group_offloading.py"]
    with pytest.raises(UsageError, match="made from diffusers"):
        upstream.release_of("diff --git a/x b/x\n", "x.diff")


def test_the_test_files_are_those_that_name_the_module_the_module_s_own_first(tmp_path):
    module = suites.module(MODULE, SOURCE)
    assert module.names == ("diffusers.hooks.offload", "offload", "Offloader")  # private classes do not name it
    test = "\ndef test_it():\n    pass\n"
    _write(tmp_path, {
        "tests/a/test_offload.py": "from diffusers.hooks.offload import x\n" + test,  # its own test file, one mention
        "tests/b/test_many.py": "import unittest\nclass Many(unittest.TestCase):\n    a = Offloader(), Offloader()\n"
                                "    b = hooks.offload\n",  # three mentions (`.offload` counts), a TestCase
        "tests/b/test_other.py": "apply_offload(); Offloaders; my.offloading\n" + test,  # no whole identifier
        "tests/b/helpers.py": "Offloader\n" + test,  # not a test file
        "tests/b/test_pipeline_offload.py": "nothing here\n" + test,  # its name ends so, but it names nothing
        "tests/b/test_mixins.py": "class OffloadTesterMixin:\n    def test_offload(self):\n        Offloader()\n",
    })
    found = suites.select(tmp_path, [module])
    assert [m.file for m in found] == ["tests/a/test_offload.py", "tests/b/test_many.py"]
    assert found[0].by_name and found[0].names == ("diffusers.hooks.offload",)
    assert found[1].mentions == 3 and found[1].names == ("Offloader", "offload")
    assert suites.module("diffusers/hooks/__init__.py", "").names == ("diffusers.hooks",)
    assert suites.defines_tests("class TestX:\n    pass\n") and not suites.defines_tests("class XMixin:\n    pass\n")


def test_a_test_file_that_reaches_the_module_through_a_mixin_of_the_suite_is_selected(tmp_path):
    """diffusers tests a hook through mixins (`testing_utils/cache.py`'s `FirstBlockCacheTesterMixin`, used by
    `TestFluxTransformerFBCCache`): a helper class whose body names the module carries it to the files that use it."""
    _write(tmp_path, {
        "tests/testing_utils/cache.py": "class OffloadTesterMixin:\n    def test_offload(self):\n        Offloader()\n"
                                        "class OtherMixin:\n    pass\n",
        "tests/models/test_model.py": "class TestModelOffload(Config, OffloadTesterMixin):\n    pass\n",
        "tests/models/test_other.py": "class TestOther(OtherMixin):\n    pass\n",  # a mixin that names nothing
    })
    found = suites.select(tmp_path, [suites.module(MODULE, SOURCE)])
    assert [(m.file, m.names) for m in found] == [("tests/models/test_model.py", ("OffloadTesterMixin",))]


def test_outcomes_compare_by_test_id():
    def o(outcome, message=""):
        return {"outcome": outcome, "message": message}

    before = {"a": o("passed"), "b": o("failed", "was"), "c": o("failed"), "d": o("passed"), "e": o("skipped"),
              "g": o("passed")}
    after = {"a": o("failed", "broke"), "b": o("passed"), "c": o("error"), "e": o("passed"), "f": o("error", "import"),
             "g": o("passed")}
    found = upstream.compare(before, after)
    assert [(x.id, x.before, x.after) for x in found["regressions"]] == [
        ("a", "passed", "failed"), ("d", "passed", "not run"), ("f", "not run", "error")]
    assert found["regressions"][0].message == "broke"
    assert [x.id for x in found["fixed"]] == ["b"]
    assert [x.id for x in found["failing_both"]] == ["c"]
    assert [(x.id, x.before, x.after) for x in found["changed"]] == [("e", "skipped", "passed")]


# --- the suite from a repository -----------------------------------------------------------------------------------


def test_the_suite_comes_from_the_newest_tag_not_newer_extracted_once(fake_release, suite_repo):
    suite = suites.from_repo(suite_repo, VERSION)
    assert suite.ref == "v9.9.0" and "no tag v9.9.9" in suite.note and "v9.9.0" in suite.note
    assert suite.commit == _git(suite_repo, "rev-parse", "v9.9.0").strip()
    assert suite.root.name == suite.commit and (suite.root / "tests" / "hooks" / "test_offload.py").is_file()
    assert not (suite.root / "tests" / "hooks" / "test_later.py").exists()
    (suite.root / "tests" / "marker").write_text("")
    assert suites.from_repo(suite_repo, VERSION) == suite and (suite.root / "tests" / "marker").exists()  # once
    pinned = suites.from_repo(suite_repo, VERSION, "v9.8.0")
    assert pinned.ref == "v9.8.0" and not pinned.note and not (pinned.root / "tests/hooks/test_offload.py").exists()
    with pytest.raises(UsageError, match="no-such-rev"):
        suites.from_repo(suite_repo, VERSION, "no-such-rev")
    with pytest.raises(UsageError, match="no release tag"):
        suites.from_repo(suite_repo, "1.0.0")


def test_an_extracted_suite_carried_as_a_folder_is_still_its_tag_and_commit(fake_release, suite_repo, tmp_path):
    suite = suites.from_repo(suite_repo, VERSION)
    carried = tmp_path / "carried"
    shutil.copytree(suite.root, carried)
    assert suites.from_folder(carried) == suites.Suite(carried.resolve(), suite.commit, "v9.9.0", suite.note)
    (carried / suites.ORIGIN).unlink()
    assert suites.from_folder(carried) == suites.Suite(carried.resolve(), None, str(carried))
    (carried / suites.ORIGIN).write_text("{not json")
    with pytest.raises(UsageError, match="origin.json cannot be read"):
        suites.from_folder(carried)


# --- whole checks (pytest runs in processes of their own) ----------------------------------------------------------


def test_a_clean_diff_is_clean_and_a_collection_error_is_reported(fake_release, suite_repo, tmp_path):
    diffs = _diffs(tmp_path, good=CLEAN)
    out = tmp_path / "checks"
    done = lab_here("upstream", "check", "--fix", "good", "--repo", str(suite_repo), "--diffs", str(diffs),
                    "--out", str(out))
    assert done.returncode == 0, done.stderr
    report = _report(out, "good")
    assert report.status == "clean" and report.release == VERSION and report.suite_ref == "v9.9.0"
    assert [f.file for f in report.test_files] == ["tests/hooks/test_offload.py", "tests/hooks/test_broken.py"]
    assert not report.regressions and not report.fixed and not report.changed
    for run in report.runs:
        assert run.counts["passed"] == 1 and run.counts["skipped"] == 1 and run.could_not_run is None
        assert run.skipped_because == {"needs an accelerator": 1}
        assert [e.file for e in run.collection_errors] == ["tests/hooks/test_broken.py"]
        assert "lab_no_such_module_here" in run.collection_errors[0].message
        assert run.diffusers.endswith("src/diffusers/__init__.py") and "lab-check-good-" in run.diffusers
    assert [o.id for o in report.failing_both] == ["tests/hooks/test_broken.py"]
    assert report.missing_packages == ["lab_no_such_module_here"]
    assert "wrote" in done.stderr and "released" in done.stderr  # progress lines
    page = (out / "good.md").read_text()
    assert "**clean**" in page and "lab_no_such_module_here" in page and "1 skipped: needs an accelerator" in page
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".lock")) == ["good.json", "good.md"]


def test_a_diff_that_breaks_a_test_is_a_regression_and_one_that_does_not_apply_says_so(fake_release, suite_repo,
                                                                                       tmp_path):
    diffs = _diffs(tmp_path, wrong=WRONG, stale=STALE)
    out = tmp_path / "checks"
    done = lab_here("upstream", "check", "--all", "--repo", str(suite_repo), "--diffs", str(diffs), "--out", str(out),
                    "--max-files", "1")
    assert done.returncode == 1, done.stderr  # a diff that breaks a test, or does not apply, fails the check
    wrong = _report(out, "wrong")
    assert wrong.status == "regressions" and [f.file for f in wrong.test_files] == ["tests/hooks/test_offload.py"]
    assert [(o.id, o.before, o.after) for o in wrong.regressions] == [
        ("tests/hooks/test_offload.py::test_answer", "passed", "failed")]
    assert "41 == 42" in wrong.regressions[0].message
    stale = _report(out, "stale")
    assert stale.status == "does not apply" and "patch does not apply" in stale.apply_error and not stale.runs
    assert "does not apply" in (out / "stale.md").read_text()
    assert "Traceback" not in done.stderr


def test_the_run_imports_the_copy_or_says_it_could_not_run(fake_release, tmp_path):
    """A conftest that puts another diffusers first: the probe refuses the run instead of testing the wrong code; a
    conftest that fails to import: the run says so, with the module it lacks."""
    other = tmp_path / "other"
    _write(other, {"diffusers/__init__.py": "__version__ = 'other'\n"})
    checkout = tmp_path / "checkout"
    _write(checkout, {"src/diffusers/__init__.py": "__version__ = 'copy'\n", "tests/__init__.py": "",
                      "tests/conftest.py": f"import sys\nsys.path.insert(0, {str(other)!r})\n",
                      "tests/test_x.py": "def test_x():\n    pass\n"})
    run, tests = test_run.run_tests(checkout, ["tests/test_x.py"], 120, "released", tmp_path / "run.log")
    assert tests == {} and "not the copy under test" in run.could_not_run and str(other) in run.could_not_run
    (checkout / "tests/conftest.py").write_text("import lab_no_such_conftest_dependency\n")  # a conftest that fails
    run, tests = test_run.run_tests(checkout, ["tests/test_x.py"], 120, "released", tmp_path / "again.log")
    assert tests == {} and run.could_not_run.startswith("pytest stopped before its first test")
    assert run.missing_modules == ["lab_no_such_conftest_dependency"] and "conftest" in run.log_tail


def test_a_test_that_leaves_torch_cuda_replaced_does_not_fail_the_tests_after_it(tmp_path):
    """diffusers' `test_error_raised_if_streams_used_and_no_accelerator_device` assigns `torch.cuda.is_available` and
    puts it back only when it passes: failing, it left every later test's tear-down on a CUDA that reports itself
    absent. The probe puts torch's device functions back after each test's call and the run names the test."""
    checkout = tmp_path / "checkout"
    _write(checkout, {"src/diffusers/__init__.py": "", "tests/__init__.py": "", "tests/test_x.py": """\
        import torch


        class TestLeak:
            def teardown_method(self):
                assert torch.cuda.is_available.__name__ == "is_available", "a later tear-down sees the leak"

            def test_a_leaks_and_fails(self):
                torch.cuda.is_available = lambda: False
                raise ValueError("failed before its restore")

            def test_b_after_it(self):
                assert torch.cuda.is_available.__name__ == "is_available"
    """})
    run, tests = test_run.run_tests(checkout, ["tests/test_x.py"], 120, "released", tmp_path / "run.log")
    assert {k.split("::")[-1]: v["outcome"] for k, v in tests.items()} == {"test_a_leaks_and_fails": "failed",
                                                                           "test_b_after_it": "passed"}
    assert run.restored == {"tests/test_x.py::TestLeak::test_a_leaks_and_fails": ["torch.cuda.is_available"]}
    assert "left `torch.cuda.is_available` replaced" in markdown(upstream.Check(
        fix="x", diff="x.diff", status="clean", release="9.9.9", suite="s", suite_commit=None, suite_ref="s",
        runs=[run]))


def test_the_copy_under_test_has_its_package_metadata(tmp_path):
    """diffusers' tests read the version through `importlib.metadata` (`PackageNotFoundError` on the H200 without it):
    each copy gets the metadata an editable install of a checkout has."""
    import importlib.metadata

    upstream.metadata(tmp_path / "src", "diffusers", VERSION)
    found = [d for d in importlib.metadata.distributions(path=[str(tmp_path / "src")])]
    assert [(d.metadata["Name"], d.version) for d in found] == [("diffusers", VERSION)]


@pytest.mark.slow
def test_a_run_its_time_limit_ends_keeps_the_tests_it_finished(tmp_path):
    checkout = tmp_path / "checkout"
    _write(checkout, {"src/diffusers/__init__.py": "", "tests/__init__.py": "", "tests/test_x.py": """\
        import time


        def test_a_quick_one():
            pass


        def test_z_one_that_hangs():
            time.sleep(600)
    """})
    run, tests = test_run.run_tests(checkout, ["tests/test_x.py"], 8, "released", tmp_path / "run.log")
    assert tests == {"tests/test_x.py::test_a_quick_one": {"outcome": "passed", "message": ""}}
    assert run.returncode is None and "time limit, 8 s" in run.could_not_run and run.seconds < 60


def test_ctrl_c_keeps_the_reports_written_and_says_what_was_not_checked(fake_release, suite_repo, tmp_path,
                                                                        monkeypatch):
    diffs = _diffs(tmp_path, a_stale=STALE, b_good=CLEAN, c_wrong=WRONG)
    out = tmp_path / "checks"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(upstream, "run_tests", interrupted)  # b_good's first run: a Ctrl-C
    done = lab_here("upstream", "check", "--all", "--repo", str(suite_repo), "--diffs", str(diffs), "--out", str(out))
    assert done.returncode == 130
    assert "kept the reports of a_stale" in done.stderr and "not checked: b_good, c_wrong" in done.stderr
    assert _report(out, "a_stale").status == "does not apply"
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["a_stale.json", "a_stale.md"]


DOCUMENTED = SOURCE.replace("    def answer(self):\n", '    def answer(self):\n        """The answer."""\n')
#: the diff's own tests: one that fails released and passes with the diff, one that passes either way
OWN_TEST = """\
from diffusers.hooks.offload import Offloader


def test_the_answer_is_documented():
    assert Offloader.answer.__doc__ == "The answer."


def test_the_answer_is_kept():
    assert Offloader().answer() == 42
"""


def test_the_diff_s_own_test_runs_both_ways_and_must_fail_released(fake_release, suite_repo, tmp_path):
    from lab.apply.regression import added_files, new_file_diff

    proving = _diff(DOCUMENTED) + new_file_diff("tests/hooks/test_documented.py", OWN_TEST)
    assert added_files(proving) == {"tests/hooks/test_documented.py": OWN_TEST}
    idle = CLEAN + new_file_diff("tests/hooks/test_documented.py", OWN_TEST.replace('"The answer."', "None"))
    diffs = _diffs(tmp_path, proving=proving, idle=idle)
    out = tmp_path / "checks"
    done = lab_here("upstream", "check", "--all", "--repo", str(suite_repo), "--diffs", str(diffs), "--out", str(out),
                    "--max-files", "1")
    assert done.returncode == 1, done.stderr  # a test of its own that fails either way proves nothing: a failure
    good = _report(out, "proving")
    assert good.status == "clean" and good.proof == "proven", good.proof_reason
    assert good.regression_files == ["tests/hooks/test_documented.py"]
    assert [(o.id.split("::")[1], o.before, o.after) for o in good.proof_tests] == [
        ("test_the_answer_is_documented", "failed", "passed"), ("test_the_answer_is_kept", "passed", "passed")]
    assert "1 of its 2 tests fail released" in good.proof_reason
    assert not good.fixed and [f.file for f in good.test_files] == ["tests/hooks/test_offload.py"]  # kept apart
    assert "**proven**" in (out / "proving.md").read_text()
    bad = _report(out, "idle")
    assert bad.status == "clean" and bad.proof == "not proven" and "pass released too" in bad.proof_reason
    assert "idle" in done.stderr.splitlines()[-1]
    assert upstream.proof({}, {}, []) == ("none", "the diff carries no test of its own")
    skipped = {"t::a": {"outcome": "skipped", "message": "needs an accelerator"}}
    assert upstream.proof(skipped, skipped, ["t"])[0] == "not run here"


def test_bad_input_is_one_line_before_any_work(fake_release, suite_repo, tmp_path):
    diffs = _diffs(tmp_path, good=CLEAN)
    for args, words in [(["--fix", "goood"], "Did you mean `good`"),
                        (["--fix", "good", "--tests", str(tmp_path)], "no tests/ folder"),
                        (["--fix", "good", "--tests", str(tmp_path), "--commit", "v1"], "--commit"),
                        (["--fix", "good", "--max-files", "0"], "--max-files")]:
        if "--tests" not in args:
            args = [*args, "--repo", str(suite_repo)]
        done = lab_here("upstream", "check", *args, "--diffs", str(diffs), "--out", str(tmp_path / "out"))
        assert done.returncode == 2 and done.stderr.startswith("ERROR: ") and words in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1


# --- the real release and a real PR diff ---------------------------------------------------------------------------

REAL_TEST = """\
    import torch

    from diffusers.hooks.group_offloading import apply_group_offloading
    from diffusers.models import ModelMixin


    class Blocks(ModelMixin):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x


    def test_group_offloading_keeps_the_outputs():
        torch.manual_seed(0)
        model, x = Blocks(), torch.randn(2, 4)
        expected = model(x)
        apply_group_offloading(model, onload_device=torch.device("cpu"), offload_type="block_level",
                               num_blocks_per_group=1)
        assert torch.equal(model(x), expected) and torch.equal(model(x), expected)
"""


@pytest.mark.slow
def test_a_real_pr_diff_against_the_real_release(tmp_path):
    """patches/pr/group_offload_keep_host.diff on diffusers 0.42.1 breaks nothing (a deliberately wrong diff is a
    regression on the fake release above: each run here imports the real torch and diffusers)."""
    text = (ROOT / "patches/pr/group_offload_keep_host.diff").read_text()
    source_only = text.split("diff --git a/tests/", 1)[0]  # its own test needs diffusers' testing_utils, not here
    diffs = _diffs(tmp_path, group_offload_keep_host=source_only)
    suite = tmp_path / "suite"
    _write(suite, {"tests/__init__.py": "", "tests/conftest.py": CONFTEST, "tests/hooks/__init__.py": "",
                   "tests/hooks/test_group_offloading.py": REAL_TEST})
    out = tmp_path / "checks"
    done = lab_here("upstream", "check", "--all", "--tests", str(suite), "--diffs", str(diffs), "--out", str(out))
    assert done.returncode == 0, done.stderr
    real = _report(out, "group_offload_keep_host")
    assert real.status == "clean", real
    assert [r.counts["passed"] for r in real.runs] == [1, 1] and real.torch and real.device
    assert real.suite_commit is None and real.suite_ref == str(suite)


# --- the project under test: accelerate's diffs through the same check ---------------------------------------------

ACCELERATE_VERSION = "8.8.8"
HOOKS = "accelerate/hooks.py"
HOOKS_SOURCE = "def offload(weights):\n    return list(weights)\n"
KEPT = HOOKS_SOURCE.replace("return list(weights)", "return weights")
PINNED = KEPT + "\n\ndef pin(weights):\n    return weights\n"
ACCELERATE_TEST = """\
from accelerate.hooks import offload


def test_offload_keeps_the_weights():
    weights = [1, 2]
    assert offload(weights) is weights
"""
PIN_TEST = ACCELERATE_TEST.replace("offload", "pin")


def _accelerate_diff(new: str, old: str, test: str, path: str, after: str = "") -> str:
    from lab.apply.regression import new_file_diff

    header = (f"# lab fix: fake - a fake accelerate fix\n"
              f"# made from accelerate {ACCELERATE_VERSION}{after}: `git apply` it\n")
    return header + unified_diff(old, new, f"src/{HOOKS}") + new_file_diff(path, test)


@pytest.fixture
def fake_accelerate(fake_release, tmp_path) -> Path:
    """A wheel of accelerate 8.8.8 beside the fake diffusers one, and a repository shaped as accelerate's (its HEAD
    holds `src/accelerate/`, which names its project) with the suite at tag v8.8.0."""
    with zipfile.ZipFile(fake_release / f"accelerate-{ACCELERATE_VERSION}-py3-none-any.whl", "w") as z:
        z.writestr("accelerate/__init__.py", f'__version__ = "{ACCELERATE_VERSION}"\n')
        z.writestr(HOOKS, HOOKS_SOURCE)
    repo = tmp_path / "accelerate-repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _write(repo, {"src/accelerate/__init__.py": "", "pyproject.toml": "[tool.ruff]\nline-length = 119\n",
                  "tests/__init__.py": "",
                  "tests/test_hooks.py": "from accelerate.hooks import offload\n\n\ndef test_offload():\n"
                                         "    assert offload([1]) == [1]\n"})
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "v8.8.0")
    _git(repo, "tag", "v8.8.0")
    return repo


def test_a_diff_names_its_project_its_release_and_the_diffs_it_comes_after():
    made = upstream.made_from("# made from accelerate 1.15.0 after a.diff, b.diff: `git apply` it after them\n", "x")
    assert made == upstream.MadeFrom("accelerate", "1.15.0", ("a.diff", "b.diff"))
    assert upstream.made_from(_header(), "x") == upstream.MadeFrom("diffusers", VERSION, ())
    with pytest.raises(UsageError, match="Unknown project `transformers`"):
        upstream.made_from("# made from transformers 5.0.0: `git apply` it\n", "x.diff")


def test_an_accelerate_series_is_checked_in_its_own_project_with_the_diffs_before_it(fake_release, fake_accelerate,
                                                                                  suite_repo, tmp_path):
    """The second diff of a series comes after the first: both copies get the first, the diff goes to one; the suite
    is accelerate's (its repository found by what its src/ holds, beside diffusers' repository), its own test is run
    both ways and ruff reads the suite's pyproject.toml."""
    diffs = tmp_path / "accelerate-diffs"
    diffs.mkdir()
    (diffs / "keep.diff").write_text(_accelerate_diff(KEPT, HOOKS_SOURCE, ACCELERATE_TEST, "tests/test_keep.py"))
    (diffs / "pin.diff").write_text(_accelerate_diff(PINNED, KEPT, PIN_TEST, "tests/test_pin.py", " after keep.diff"))
    out = tmp_path / "checks"
    done = lab_here("upstream", "check", "--fix", "pin", "--repo", str(suite_repo), "--repo", str(fake_accelerate),
                    "--diffs", str(diffs), "--out", str(out))
    assert done.returncode == 0, done.stderr
    report = _report(out, "pin")
    assert (report.project, report.release, report.after, report.suite_ref) == ("accelerate", "8.8.8", ["keep.diff"],
                                                                                "v8.8.0")
    assert report.status == "clean" and [f.file for f in report.test_files] == ["tests/test_hooks.py"]
    # released, its own test cannot import what the diff adds: the file is the error, its test passes with the diff
    assert report.proof == "proven" and [(o.id, o.before, o.after) for o in report.proof_tests] == [
        ("tests/test_pin.py", "error", "not run"),
        ("tests/test_pin.py::test_pin_keeps_the_weights", "not run", "passed")]
    assert report.runs[0].counts["passed"] == 1  # tests/test_hooks.py passes released: the first diff is there
    assert report.style.status == "clean" and "accelerate's pyproject.toml at v8.8.0" in report.style.config
    page = (out / "pin.md").read_text()
    assert "made from accelerate 8.8.8 after `keep.diff`" in page and "accelerate's tests: v8.8.0" in page
    (diffs / "keep.diff").unlink()
    done = lab_here("upstream", "check", "--fix", "pin", "--repo", str(fake_accelerate), "--diffs", str(diffs),
                    "--out", str(out))
    assert done.returncode == 2 and "comes after keep.diff, which is not in" in done.stderr
    done = lab_here("upstream", "check", "--fix", "good", "--repo", str(fake_accelerate), "--diffs",
                    str(_diffs(tmp_path, good=CLEAN)), "--out", str(out))
    assert done.returncode == 2 and "no test suite of diffusers given" in done.stderr


def test_its_own_test_proves_the_change_even_where_some_of_it_skips():
    def o(outcome, message=""):
        return {"outcome": outcome, "message": message}

    files = ["t"]
    released = {"t::cpu": o("failed", "TypeError"), "t::gpu": o("skipped", "needs an accelerator")}
    changed = {"t::cpu": o("passed"), "t::gpu": o("skipped", "needs an accelerator")}
    status, reason = upstream.proof(released, changed, files)
    assert status == "proven" and "1 skip here (needs an accelerator)" in reason
    only_skips = {"t::gpu": o("skipped", "needs an accelerator"), "t::cpu": o("passed")}
    status, reason = upstream.proof(only_skips, only_skips, files)
    assert status == "not run here" and "the others pass released too" in reason
    assert upstream.proof(released, {"t::cpu": o("failed")}, files)[0] == "not proven"


# --- ruff: the diff in the project's style ------------------------------------------------------------------------

RUFF = "[tool.ruff]\nline-length = 119\n\n[tool.ruff.lint]\nselect = [\"E\", \"F\", \"I\", \"W\"]\n"


def test_only_the_lines_a_rewrite_adds_are_formatted():
    from lab.apply import style

    old = "x = [\n    1,\n]\ny = call(\n    a, b\n)\n"  # neither statement as ruff would write it
    new = old.replace("y = call(\n    a, b\n)\n", "y = call(\n    a, b,\n    c\n)\n")
    formatted, note = style.format_added(old, new, "src/diffusers/m.py", RUFF)
    assert note == "" and formatted == "x = [\n    1,\n]\ny = call(a, b, c)\n"  # the rewritten statement, whole
    joined = old.replace("x = [\n    1,\n]\n", "x = [\n    1,\n]\nz = (\n  2\n)\n")
    formatted, note = style.format_added(joined, joined.replace("z = (\n  2\n)\n", "z = (\n  3\n)\n"),
                                         "src/diffusers/m.py", RUFF)
    assert formatted.endswith("z = 3\ny = call(\n    a, b\n)\n") and not note
    body = unified_diff(old, new, "src/diffusers/m.py")
    styled, notes = style.style_diff(body, lambda path: old if path == "diffusers/m.py" else None, RUFF)
    assert "+y = call(a, b, c)\n" in styled and not notes


def test_ruff_reports_what_the_diff_brings_not_what_the_release_has(tmp_path):
    from lab.apply import style

    released, changed = tmp_path / "released", tmp_path / "changed"
    _write(released, {"src/diffusers/m.py": "import os\n\nx = 1\n"})  # an unused import, as released
    _write(changed, {"src/diffusers/m.py": "import os\n\nx = 2\n", "tests/test_m.py": "import sys\n"})
    report = style.check_files(released, changed, ["src/diffusers/m.py", "tests/test_m.py"], RUFF, "here",
                               new=["tests/test_m.py"])
    assert report.status == "findings" and "1 finding the released files do not have" in report.reason
    by_file = {f.file: f for f in report.files}
    assert [x.code for x in by_file["tests/test_m.py"].findings] == ["F401"]
    assert by_file["tests/test_m.py"].released_findings is None
    assert by_file["src/diffusers/m.py"].released_findings == 1
    (changed / "tests/test_m.py").write_text("import sys\n\nprint(sys)\n")
    report = style.check_files(released, changed, ["src/diffusers/m.py", "tests/test_m.py"], RUFF, "here",
                               new=["tests/test_m.py"])
    assert report.status == "clean" and "as released: src/diffusers/m.py" in report.reason


# --- the test pipelines: the second stage ---------------------------------------------------------------------------


def test_outputs_compare_bit_for_bit_else_by_their_largest_differences():
    import numpy as np

    from lab.apply import test_pipelines

    a = np.array([[1.0, 2.0], [0.0, 4.0]], dtype=np.float32)
    assert test_pipelines.compare(a, a.copy()) == ("bit-identical", 0.0, 0.0)
    b = a.copy()
    b[0, 1] = 2.5
    b[1, 0] = 1e-3  # the released value is 0: an absolute difference, no relative one
    status, max_abs, max_rel = test_pipelines.compare(a, b)
    assert status == "differs" and max_abs == pytest.approx(0.5) and max_rel == pytest.approx(0.25)
    assert test_pipelines.compare(a, a[:1]) == ("differs", None, None)
    assert test_pipelines.compare(a, a.astype(np.float64)) == ("differs", None, None)


PIPELINE_MODULE = "diffusers/pipelines/fake.py"
PIPELINE_SOURCE = textwrap.dedent('''\
    import numpy as np


    class FakePipeline:
        def __init__(self, scale):
            self.scale = scale

        def to(self, device):
            return self

        def set_progress_bar_config(self, **kwargs):
            pass

        def __call__(self, x):
            return (np.asarray(x, dtype=np.float32) * self.scale / 3,)
''')
PIPELINE_TEST = """\
    from diffusers.pipelines.fake import FakePipeline


    class FakePipelineFastTests:
        pipeline_class = FakePipeline

        def get_dummy_components(self):
            return {"scale": 1.0}

        def get_dummy_inputs(self, device, seed=0):
            return {"x": [1.0, 2.0, 3.0]}
"""


@pytest.mark.slow
def test_the_test_pipelines_run_in_both_copies_and_their_outputs_compare(fake_release, suite_repo, tmp_path):
    """A diff that changes a test pipeline's output by a rounding is `differs` with its largest difference; the
    released output is built in the released copy, the other with the diff (each in a process of its own)."""
    from lab.apply import suites, test_pipelines

    suite = tmp_path / "suite"
    _write(suite, {"tests/__init__.py": "", "tests/pipelines/__init__.py": "",
                   "tests/pipelines/test_fake.py": PIPELINE_TEST})
    module = suites.module(PIPELINE_MODULE, PIPELINE_SOURCE)
    (chosen,) = test_pipelines.select(suite, [module])
    assert (chosen.cls, chosen.pipeline, chosen.own) == ("FakePipelineFastTests", "FakePipeline", True)
    copies = {}
    rounded = PIPELINE_SOURCE.replace("/ 3", "* np.float32(1 + 2**-23) / 3")  # one float32 rounding apart
    for arm, source in (("released", PIPELINE_SOURCE), ("changed", rounded)):
        copies[arm] = tmp_path / arm
        _write(copies[arm], {"src/diffusers/__init__.py": "", "src/diffusers/pipelines/__init__.py": "",
                             f"src/{PIPELINE_MODULE}": source})
        shutil.copytree(suite / "tests", copies[arm] / "tests")
    (found,) = test_pipelines.compare_runs([chosen], copies["released"], copies["changed"], tmp_path / "runs", 120,
                                           True, "diffusers")
    assert found.status == "differs" and found.device == "cpu" and found.shape == [3], found
    assert 0 < found.max_abs < 1e-6 and test_pipelines.words(found).startswith("not bit-identical: max abs")
    # (the same outputs compare bit-identical: `test_outputs_compare_bit_for_bit_else_by_their_largest_differences`,
    # on arrays, rather than two more processes)
