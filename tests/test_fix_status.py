"""Which fixes apply, and what a rewrite makes of a module, are cheap to ask and never stale: each rewrite of a module
source by a list of codemods is worked out once, in memory and on disk, with keys that hold everything the answer
depends on."""

import json

import pytest

from lab.apply import fix
from lab.apply.fix import get_fix, rewritten_sources

# seconds per test (pipelines built, whole runs, compiles or every committed result): left out of `make test-fast`
pytestmark = pytest.mark.slow


def forget():
    fix._rewrite_status.cache_clear()
    fix.rewrite.cache_clear()


def test_a_changed_source_or_fix_is_another_key(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CACHE", str(tmp_path))
    forget()
    (site,) = get_fix("unipc_device_const").rewrites
    source = fix._module_source(site.module)
    assert fix._rewrite_status(site.codemod, source, site.path)[0] == "applies"
    (stored,) = (tmp_path / "rewrites").glob("*.json")
    fixed = json.loads(stored.read_text())["new_source"]
    forget()
    assert rewritten_sources([get_fix("unipc_device_const")])[site.module].new_source == fixed
    assert len(list((tmp_path / "rewrites").glob("*.json"))) == 1  # the same rewrite: read back, not stored again
    forget()  # the disk alone must not answer for another source
    assert fix._rewrite_status(site.codemod, fixed, site.path)[0] == "upstream"
    assert len(list((tmp_path / "rewrites").glob("*.json"))) == 2
    # the stored answer is what is read back (a planted answer shows it is used), but only for its own key
    stored.write_text(json.dumps({"new_source": source, "warnings": ["planted"]}))
    forget()
    assert fix._rewrite_status(site.codemod, source, site.path) == ("shape", "site not in the expected shape: planted")
    assert fix.rewrite(source, (site.codemod,), "another/path.py").warnings == ()
    from lab.apply import rewrite_cache

    rewrite_cache._rewriting_code.cache_clear()
    monkeypatch.setattr(rewrite_cache, "_rewriting_code", lambda: "another fix catalog")
    forget()
    assert fix._rewrite_status(site.codemod, source, site.path)[0] == "applies"
    forget()


def test_a_damaged_stored_rewrite_is_worked_out_again(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CACHE", str(tmp_path))
    forget()
    (site,) = get_fix("unipc_device_const").rewrites
    source = fix._module_source(site.module)
    first = fix.rewrite(source, (site.codemod,), site.path)
    (stored,) = (tmp_path / "rewrites").glob("*.json")
    for damaged in ("", "{not json", json.dumps(["applies", "applies"]), json.dumps({"new_source": 1}),
                    json.dumps({"new_source": 1, "warnings": []})):
        stored.write_text(damaged)
        forget()
        assert fix.rewrite(source, (site.codemod,), site.path) == first
    forget()


def test_an_unreadable_cache_costs_time_not_correctness(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("LAB_CACHE", str(blocked))
    forget()
    (site,) = get_fix("unipc_device_const").rewrites
    source = fix._module_source(site.module)
    assert fix._rewrite_status(site.codemod, source, site.path)[0] == "applies"
    forget()


def test_a_run_compiles_only_the_rewrites_its_pipeline_can_run():
    """`begin_index` rewrites 47 pipelines' `__call__`; a run of one pipeline compiles the rewrite of its own class
    only, while a rewrite outside the pipelines (a scheduler's) is compiled for any pipeline."""
    sd3 = frozenset({"StableDiffusion3Pipeline", "DiffusionPipeline", "object"})
    assert {(owner, name) for _, owner, name, _ in fix._compiled(("begin_index",), sd3)} == {
        ("StableDiffusion3Pipeline", "__call__")}
    def names(compiled):
        return sorted((module.__name__, owner, name) for module, owner, name, _ in compiled)

    assert names(fix._compiled(("unipc_device_const",), sd3)) == names(fix._compiled(("unipc_device_const",))) != []
