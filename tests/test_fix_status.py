"""Which fixes apply is cheap to ask and never stale: the rewrite status of a site is worked out once per module
source and codemod, in memory and on disk, with keys that hold everything the answer depends on."""

import json

from lab.apply import fix
from lab.apply.fix import get_fix, rewritten_sources


def test_a_changed_source_or_fix_is_another_key(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_CACHE", str(tmp_path))
    fix._rewrite_status.cache_clear()
    (site,) = get_fix("unipc_device_const").rewrites
    module, source = fix._module_source(site.module)
    assert fix._rewrite_status(site.codemod, source, site.path)[0] == "applies"
    (stored,) = (tmp_path / "rewrite-status").glob("*.json")
    assert json.loads(stored.read_text())[0] == "applies"
    fixed = rewritten_sources([get_fix("unipc_device_const")])[site.module].new_source
    fix._rewrite_status.cache_clear()  # the disk alone must not answer for another source
    assert fix._rewrite_status(site.codemod, fixed, site.path)[0] == "upstream"
    assert len(list((tmp_path / "rewrite-status").glob("*.json"))) == 2
    # the stored answer is what is read back (a planted answer shows it is used), but only for its own key
    stored.write_text(json.dumps(["shape", "planted"]))
    fix._rewrite_status.cache_clear()
    assert fix._rewrite_status(site.codemod, source, site.path) == ("shape", "planted")
    fix._rewriting_code.cache_clear()
    monkeypatch.setattr(fix, "_rewriting_code", lambda: "another fix catalog")
    fix._rewrite_status.cache_clear()
    assert fix._rewrite_status(site.codemod, source, site.path)[0] == "applies"
    fix._rewrite_status.cache_clear()


def test_an_unreadable_cache_costs_time_not_correctness(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("LAB_CACHE", str(blocked))
    fix._rewrite_status.cache_clear()
    (site,) = get_fix("unipc_device_const").rewrites
    _, source = fix._module_source(site.module)
    assert fix._rewrite_status(site.codemod, source, site.path)[0] == "applies"
    fix._rewrite_status.cache_clear()
