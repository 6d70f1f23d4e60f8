"""`lab ab --base`: fixes on in both arms, so that an A/B measures what the tested fixes add over them."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from lab.apply.fix import get_fix, over
from lab.base import naming

# seconds per test (pipelines built, whole runs, compiles or every committed result): left out of `make test-fast`
pytestmark = pytest.mark.slow


def names(fixes) -> list[str]:
    return [f.name for f in fixes]


def test_the_base_runs_in_both_arms_and_gives_way_to_a_tested_fix_it_conflicts_with():
    keep_host, pinned, registry = (get_fix(n) for n in ("model_offload_keep_host", "model_offload_pinned",
                                                        "hook_registry_cache"))
    control, test = over([keep_host], [pinned])
    assert (names(control), names(test)) == (["model_offload_keep_host"], ["model_offload_pinned"])
    control, test = over([keep_host], [registry])
    assert (names(control), names(test)) == (["model_offload_keep_host"],
                                             ["hook_registry_cache", "model_offload_keep_host"])
    control, test = over([keep_host], [registry, keep_host])  # a set that holds a base fix runs it once
    assert names(test) == ["hook_registry_cache", "model_offload_keep_host"]


def test_a_result_over_a_base_has_a_name_of_its_own():
    plain = naming.ab_name(["model_offload_pinned"], "eager", "full-model_cpu_offload", "h100")
    based = naming.ab_name(["model_offload_pinned"], "eager", "full-model_cpu_offload", "h100",
                           ["model_offload_keep_host"])
    assert plain == "model_offload_pinned__eager__full-model_cpu_offload__h100"
    assert based == "model_offload_pinned-over-model_offload_keep_host__eager__full-model_cpu_offload__h100"


@pytest.fixture(scope="module")
def based_result(tmp_path_factory):
    """`lab ab --fix hook_registry_cache --base no_progress_bar` on a tiny FLUX.1 (6 blocks, no profiles), with the
    fixes each arm ran."""
    from lab import cli
    from lab.measure import ab

    tmp = tmp_path_factory.mktemp("base")
    ran = {}
    real_run = ab.run

    def run(built, spec, control, test, *args, **kwargs):
        ran.update(control=names(control.fixes), test=names(test.fixes))
        return real_run(built, spec, control, test, *args, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(ab, "run", run)
        code = cli.main(["ab", "--fix", "hook_registry_cache", "--base", "no_progress_bar", "--pipeline", "flux",
                         "--blocks", "6", "--repeat", "1", "--no-profile", "--out", str(tmp / "ab"),
                         "--trace-dir", str(tmp / "traces")])
    path = tmp / "ab" / "flux" / "hook_registry_cache-over-no_progress_bar__eager__tiny__cpu.json"
    return code, path, ran


def test_lab_ab_over_a_base_runs_it_in_both_arms_and_records_it(based_result):
    code, path, ran = based_result
    assert code == 0 and path.exists()
    assert ran == {"control": ["no_progress_bar"], "test": ["hook_registry_cache", "no_progress_bar"]}
    result = json.loads(path.read_text())
    assert (result["fixes"], result["base"]) == (["hook_registry_cache"], ["no_progress_bar"])
    assert result["verify"]["exercised"]["hook_registry_cache"] > 0
    page = path.with_suffix(".md").read_text()
    assert page.startswith("# `hook_registry_cache over no_progress_bar` on `flux`")
    assert "Over a base: `no_progress_bar` on in both arms; the test arm adds `hook_registry_cache`" in page


def test_the_page_says_when_a_tested_fix_replaces_a_base_fix(based_result):
    from lab.pages.report import base_line
    from lab.results.schema import ABResult

    _, path, _ = based_result
    data = {**json.loads(path.read_text()), "fixes": ["model_offload_pinned"], "base": ["model_offload_keep_host"]}
    line = base_line(msgspec.convert(data, ABResult))
    assert line.endswith("(in the test arm they replace `model_offload_keep_host`, with which they conflict).")


def test_a_plain_run_cannot_go_on_from_a_result_over_a_base(based_result):
    from lab import results
    from lab.measure import cell
    from lab.measure.config import ABConfig

    _, path, _ = based_result
    previous = results.read(path)
    config = ABConfig(repeat=1)  # as if it had been a sequential run that spent its budget
    previous = msgspec.structs.replace(previous, stopped="budget spent", design=config.design().to_dict())
    identity = {**{k: getattr(previous, k) for k in cell.IDENTITY},
                "environment": msgspec.structs.asdict(previous.environment)}
    assert cell.resume_problems(previous, identity, config) == []
    assert cell.resume_problems(previous, {**identity, "base": []}, config) == ["base was ['no_progress_bar'], now []"]


@pytest.mark.parametrize("argv, message", [
    (["--base", "no_progress_bar"], "No fix given"),
    (["--fix", "no_progress_bar", "--base", "no_progress_bar"], "the arms would run the same code"),
    (["--fix", "hook_registry_cache", "--base", "all"], "takes fix names"),
    (["--control", "aa", "--base", "no_progress_bar"], "takes no `--control aa`"),
])
def test_bad_bases_are_refused_in_one_line(argv, message, tmp_path, capsys):
    from lab import cli

    code = cli.main(["ab", "--pipeline", "flux", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1] and err[-1].startswith("ERROR:")


def test_a_campaign_cell_over_a_base_passes_it_on_and_finds_its_result(tmp_path):
    from lab.campaigns.campaign import load

    toml = tmp_path / "c.toml"
    toml.write_text('[campaign]\ndescription = "t"\ndevice = "cuda"\n[defaults]\nsize = "full"\n[[cell]]\n'
                    'pipeline = "flux"\nfix = ["model_offload_pinned", "hook_registry_cache"]\n'
                    'setting = "model_cpu_offload"\nbase = "model_offload_keep_host"\n')
    cells = load(toml).cells
    assert [c.stem("h100") for c in cells] == [
        "model_offload_pinned-over-model_offload_keep_host__eager__full-model_cpu_offload__h100",
        "hook_registry_cache-over-model_offload_keep_host__eager__full-model_cpu_offload__h100"]
    argv = cells[0].argv(Path("results"))
    assert argv[argv.index("--base") + 1] == "model_offload_keep_host"
