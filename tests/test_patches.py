"""The committed patches are what `lab diff` generates, and `git apply` takes them in a diffusers-shaped tree."""

import re
import shutil
import subprocess
from pathlib import Path

import diffusers
import pytest

from lab.apply.diff import fix_diff
from lab.apply.fix import catalog
from lab.base.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
PATCHES = ROOT / "patches"

WITH_DIFF = sorted(name for name, fix in catalog().items() if fix.rewrites)


def test_patches_dir_has_exactly_the_fixes_with_source_changes():
    assert sorted(p.stem for p in PATCHES.glob("*.diff")) == WITH_DIFF


@pytest.mark.parametrize("name", WITH_DIFF)
def test_committed_patch_is_current(name):
    assert (PATCHES / f"{name}.diff").read_text() == fix_diff(catalog()[name]), (
        f"patches/{name}.diff is stale: run `lab diff --all --out patches/`"
    )


@pytest.mark.parametrize("name", WITH_DIFF)
def test_git_apply_check_in_a_diffusers_layout(tmp_path, name):
    git_apply_check(tmp_path, (PATCHES / f"{name}.diff").read_text(), Path(diffusers.__file__).parent.parent)


def git_apply_check(tmp_path: Path, text: str, site: Path) -> None:
    """`git apply --check` of a diff in a diffusers-shaped repository made from `site` (the folder holding diffusers/);
    the files the diff creates (its regression test) are left for git to create."""
    for path in re.findall(r"^diff --git a/(\S+)", text, flags=re.M):
        if not path.startswith("src/"):
            continue
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(site / Path(path).relative_to("src"), target)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "fix.diff").write_text(text)
    result = subprocess.run(["git", "apply", "--check", "fix.diff"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_runtime_only_fix_has_no_diff():
    with pytest.raises(UsageError, match="no upstream diff"):
        fix_diff(catalog()["no_progress_bar"])


# --- patches/pr/: pull requests against the newest release ------------------------------------------------------

PR = PATCHES / "pr"


def _not_upstream() -> list[str]:
    """The fixes with a site that the newest release still lacks (each rewrite says from which release it is
    upstream): the ones `lab diff --all --pr` writes a pull request for."""
    from packaging.version import Version

    from lab.apply.releases import NEWEST

    return sorted(name for name, fix in catalog().items()
                  if any(r.upstream_since is None or Version(r.upstream_since) > Version(NEWEST) for r in fix.rewrites))


NOT_UPSTREAM = _not_upstream()


def test_pr_dir_has_a_diff_and_a_description_for_each_fix_not_upstream():
    assert sorted(p.stem for p in PR.glob("*.diff")) == NOT_UPSTREAM
    assert sorted(p.stem for p in PR.glob("*.md")) == NOT_UPSTREAM


@pytest.mark.parametrize("name", NOT_UPSTREAM)
def test_committed_pr_is_current(name):
    from lab.apply.releases import NEWEST
    from lab.pages.pr import pr_files

    diff, text, together = pr_files(catalog()[name], NEWEST, ROOT / "results", PR)
    assert (PR / f"{name}.diff").read_text() == diff, f"patches/pr/{name}.diff is stale: run `lab diff --all --pr --out patches/pr`"
    assert (PR / f"{name}.md").read_text() == text, f"patches/pr/{name}.md is stale: run `lab diff --all --pr --out patches/pr`"
    for file, joint in together.items():
        assert (PR / file).read_text() == joint, f"patches/pr/{file} is stale: run `lab diff --all --pr --out patches/pr`"


def git_apply_in_turn(tmp_path: Path, diffs: list[str], site: Path) -> list[int]:
    """`git apply` of each diff in turn in one diffusers-shaped repository made from `site`: each one's exit code.
    The files the diffs create (their regression tests) are left for git to create."""
    for path in {p for text in diffs for p in re.findall(r"^diff --git a/(\S+)", text, flags=re.M)}:
        if not path.startswith("src/"):
            continue
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(site / Path(path).relative_to("src"), target)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    codes = []
    for i, text in enumerate(diffs):
        (tmp_path / f"{i}.diff").write_text(text)
        codes.append(subprocess.run(["git", "apply", f"{i}.diff"], cwd=tmp_path, capture_output=True).returncode)
    return codes


def test_two_diffs_collide_where_one_changes_what_the_other_reads():
    from lab.apply.diff import collide

    first = "diff --git a/f.py b/f.py\n--- a/f.py\n+++ b/f.py\n@@ -10,3 +10,4 @@\n a\n b\n+new\n c\n"
    reads_b = "diff --git a/f.py b/f.py\n--- a/f.py\n+++ b/f.py\n@@ -11,3 +11,3 @@\n b\n-c\n+C\n d\n"
    after = "diff --git a/f.py b/f.py\n--- a/f.py\n+++ b/f.py\n@@ -12,3 +12,3 @@\n c\n-d\n+D\n e\n"
    other_file = reads_b.replace("f.py", "g.py")
    assert collide(first, reads_b) == collide(reads_b, first) == ["f.py"]  # an insertion between two lines it reads
    assert collide(first, after) == []  # an insertion just before another hunk's first line leaves it whole
    assert collide(first, other_file) == []


@pytest.mark.slow
def test_the_pr_diffs_that_collide_are_named_and_their_together_diff_applies(tmp_path):
    """Every pair of PR diffs of one file: where the lab says they collide, `git apply` of one after the other fails,
    both pages name the other and the diff of both applies (or, for two fixes that declare a conflict,
    both pages name the other as a conflict and no diff of both is made); elsewhere one applies after the other."""
    from lab.apply.diff import collide
    from lab.apply.releases import NEWEST
    from lab.pages.pr import together_name
    from tests.conftest import diffusers_release

    release = diffusers_release(NEWEST)
    texts = {name: (PR / f"{name}.diff").read_text() for name in NOT_UPSTREAM}
    files = {name: set(re.findall(r"^diff --git a/(\S+)", t, flags=re.M)) for name, t in texts.items()}
    names = sorted(texts)
    colliding = 0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if not files[a] & files[b]:
                continue
            codes = git_apply_in_turn(tmp_path / f"{a}--{b}", [texts[a], texts[b]], release)
            if collide(texts[a], texts[b]):
                colliding += 1
                assert codes[1] != 0, (a, b)
                joint = together_name(catalog()[a], catalog()[b])
                if a in catalog()[b].conflicts or b in catalog()[a].conflicts:
                    pages = {n: (PR / f"{n}.md").read_text() for n in (a, b)}
                    assert all("## Instead of another diff" in t and f"- `{o}` (" in t
                               for n, t in pages.items() for o in {a, b} - {n}), (a, b)
                    assert not (PR / joint).exists(), joint
                    continue
                assert f"`{joint}`" in (PR / f"{a}.md").read_text() and f"`{joint}`" in (PR / f"{b}.md").read_text()
                assert git_apply_in_turn(tmp_path / joint.replace("/", "_"), [(PR / joint).read_text()], release) == [0]
            else:
                assert codes == [0, 0], (a, b)
    assert colliding >= 2  # group offloading's two, and the Z-Image pipelines' begin_index and transformer_dtype


@pytest.mark.parametrize("name", NOT_UPSTREAM)
def test_pr_applies_to_the_newest_release_with_git_apply(tmp_path, name):
    from lab.apply.releases import NEWEST
    from tests.conftest import diffusers_release

    release = diffusers_release(NEWEST)
    text = (PR / f"{name}.diff").read_text()
    assert f"# made from diffusers {NEWEST}" in text
    git_apply_check(tmp_path, text, release)


def test_pr_page_quotes_the_committed_gpu_results():
    text = (PR / "unipc_host_coeffs.md").read_text()
    assert "## Measured by the fix lab" in text and "| wan | eager |" in text and "NVIDIA H200" in text
    assert "(../../results/ab/wan/unipc_host_coeffs__" in text
    # a fix of a setting users turn on: each row says the setting it was measured in
    rows = [line for line in (PR / "group_offload_keep_host.md").read_text().splitlines() if line.startswith("| flux |")]
    assert rows and all(", in group_offload (level=block_level, blocks=1, stream=False" in row for row in rows)


def test_every_pr_page_names_the_upstream_pull_requests_it_overlaps():
    """Each fix with a pull request (diffusers' or accelerate's) says which upstream pull requests its change
    overlaps, or that a search by its files and functions found none; the pages print it."""
    accelerate = sorted(p.stem for p in (PATCHES / "accelerate").glob("*.md"))
    for name in [*NOT_UPSTREAM, *accelerate]:
        overlaps = catalog()[name].upstream.overlaps
        assert overlaps is not None, f"{name}: Upstream(overlaps=...) not searched for"
        page = (PR if name in NOT_UPSTREAM else PATCHES / "accelerate") / f"{name}.md"
        text = page.read_text()
        assert "Overlapping upstream pull requests" in text, page
        assert all(o.ref in text for o in overlaps), page


# --- every upstream diff carries its regression test, and its committed check says what it showed ------------------

ACCELERATE = PATCHES / "accelerate"
CHECKS = PATCHES / "checks"
#: every upstream diff by name: the PR diffs to diffusers, and the hand-written ones of patches/accelerate/ (four to
#: accelerate, two diffusers follow-ups)
UPSTREAM = {p.stem: p for p in [*sorted(PR.glob("*.diff")), *sorted(ACCELERATE.glob("*.diff"))]}
@pytest.mark.parametrize("name", list(UPSTREAM))
def test_every_upstream_diff_carries_its_regression_test_and_its_check_proves_it(name):
    """Each diff adds `fixes/regressions/<name>.py` as the new test file its first line names, for the project its
    header names; its committed `lab upstream check` report ran that test both ways and says `proven`, or names why
    it could not run here (a test that needs an accelerator, on the CPU), and then the check on a GPU
    (`patches/checks/gpu/`) proves it; a GPU check is clean; ruff found nothing the diff brings."""
    from lab.apply.regression import added_files, regression_of
    from lab.apply.upstream import committed, decode, made_from, proving

    text = UPSTREAM[name].read_text()
    test = regression_of(name)
    assert test is not None, f"{name}: no fixes/regressions/{name}.py"
    assert made_from(text, name).project == test.project
    assert added_files(text).get(test.path) == test.source, (
        f"{UPSTREAM[name]} does not carry fixes/regressions/{name}.py: "
        + ("run `lab diff --all --pr --out patches/pr`" if UPSTREAM[name].parent == PR else
           "`lab.apply.regression.carrying` keeps a hand-written diff carrying it"))
    check = decode((CHECKS / f"{name}.json").read_bytes())
    assert check.regression_files == [test.path] and check.project == test.project
    assert check.proof == "proven" or (check.proof == "not run here" and "skip here" in check.proof_reason), (
        f"{name}: {check.proof}: {check.proof_reason}")
    assert check.style is not None and check.style.status == "clean", check.style
    reports = [c for _, c in committed(CHECKS, name)]
    assert proving(reports).proof == "proven", f"{name}: its own test proven by no committed report (CPU or GPU)"
    for gpu in reports[1:]:  # a check on a GPU: the tests that skip on the CPU ran, and broke nothing
        assert gpu.device.startswith("cuda") and gpu.status == "clean", (name, gpu.device, gpu.status, gpu.reason)


def test_the_diffusers_ruff_configuration_is_diffusers_own():
    """`lab diff --pr` formats with diffusers' ruff configuration as the lab holds it: the `[tool.ruff]` sections of
    diffusers' pyproject.toml at the release tag the lab's diffs are checked against (v0.40.0), kept in tests/data
    with the commit it is from."""
    from lab.apply.style import DIFFUSERS_RUFF

    text = (ROOT / "tests" / "data" / "diffusers_v0.40.0_pyproject.toml").read_text()
    assert "commit d035dcd7cc7c88e0a154609b62887d50bba9fdc2" in text.splitlines()[0]
    assert DIFFUSERS_RUFF.strip() in text


@pytest.mark.parametrize("name", sorted(p.stem for p in ACCELERATE.glob("*.md")))
def test_each_accelerate_page_quotes_what_its_check_showed(name):
    """The hand-written accelerate pages say what `lab upstream check` showed of their diff: its own test's proof,
    accelerate's own tests and ruff, as the committed report has them, with a link to it."""
    from lab.apply.upstream import committed, decode

    check = decode((CHECKS / f"{name}.json").read_bytes())
    text = (ACCELERATE / f"{name}.md").read_text()
    assert f"(../checks/{name}.md)" in text
    assert f"**{check.proof}**: {check.proof_reason}" in text
    assert f"**{check.status}**: {check.reason}" in text
    assert f"ruff: **{check.style.status}**" in text
    for path, gpu in committed(CHECKS, name)[1:]:  # and what the check on a GPU showed
        assert f"(../checks/gpu/{name}.md)" in text
        assert f"**{gpu.proof}**: {gpu.proof_reason}" in text and f"**{gpu.status}**: {gpu.reason}" in text
