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
    """`git apply --check` of a diff in a diffusers-shaped repository made from `site` (the folder holding diffusers/)."""
    for path in re.findall(r"^diff --git a/(\S+)", text, flags=re.M):
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
#: the fixes whose change is not (all) upstream in the newest release
NOT_UPSTREAM = ["auraflow_timestep_device", "begin_index", "chroma_guidance_device", "cogvideox_host_timestep",
                "faster_cache_freq_mask_device", "faster_cache_timestep_once", "first_block_cache_lagged", "flux2_unpack_hw",
                "group_offload_keep_host",
                "group_offload_top_level", "lumina2_caption_lengths_once",
                "lumina2_rope_device", "mochi_prompt_tokens_once",
                "pab_timestep_once", "qwen_modulate_index", "transformer_dtype", "unipc_host_coeffs", "wan_boundary_once"]


def test_pr_dir_has_a_diff_and_a_description_for_each_fix_not_upstream():
    assert sorted(p.stem for p in PR.glob("*.diff")) == NOT_UPSTREAM
    assert sorted(p.stem for p in PR.glob("*.md")) == NOT_UPSTREAM


@pytest.mark.parametrize("name", NOT_UPSTREAM)
def test_committed_pr_is_current(name):
    from lab.apply.releases import NEWEST
    from lab.pages.pr import pr_files

    diff, text = pr_files(catalog()[name], NEWEST, ROOT / "results", PR)
    assert (PR / f"{name}.diff").read_text() == diff, f"patches/pr/{name}.diff is stale: run `lab diff --all --pr --out patches/pr`"
    assert (PR / f"{name}.md").read_text() == text, f"patches/pr/{name}.md is stale: run `lab diff --all --pr --out patches/pr`"


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
