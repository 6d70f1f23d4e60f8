"""Every committed verdict agrees with the interval it prints, and is what the current rule decides from its blocks."""

import copy
import json
import re

import msgspec
import pytest

from lab import results
from lab.base.errors import LabError
from lab.results import restat, schema
from lab.verdicts import stats
from lab.verdicts.judge import judge
from lab.verdicts.verdict import Verdict
from tests.conftest import ROOT

# seconds per test (pipelines built, whole runs, compiles or every committed result): left out of `make test-fast`
pytestmark = pytest.mark.slow


def _outcomes():
    """(label, outcome, config, fixes) for every A/B result and sweep point committed under results/ (typed)."""
    for path in sorted((ROOT / "results").glob("**/*.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("kind") not in ("ab", "sweep"):
            continue
        r, label = results.read(path), path.relative_to(ROOT).as_posix()
        if r.kind == "ab":
            yield label, r, r.config, r.fixes
        else:
            for point in r.points:
                yield f"{label} at {point.value}", point, r.config, r.fixes


def test_every_committed_result_is_in_the_current_format():
    files = [p for p in (ROOT / "results").glob("**/*.json")
             if json.loads(p.read_text()).get("kind") in ("ab", "sweep", "hunt", "history")]
    assert files and all(json.loads(p.read_text())["format"] == results.FORMAT_VERSION for p in files)


def test_no_committed_verdict_contradicts_its_interval():
    checked = 0
    for label, outcome, config, _ in _outcomes():
        s = outcome.stats
        if not s:
            continue
        checked += 1
        margin = s.margin
        lo, hi = s.ci
        elo, ehi = s.ci_equivalence
        timing = outcome.verdict if outcome.verdict is not Verdict.NOT_EXERCISED else Verdict.from_text(s.verdict)
        within = 1 - margin <= elo and ehi <= 1 + margin
        assert (timing is Verdict.FASTER) == (hi < 1), label
        assert (timing is Verdict.SLOWER) == (lo > 1), label
        assert (timing is Verdict.EQUIVALENT) == (within and lo <= 1 <= hi), label
        assert s.equivalent == within, label
        finite = hi < float("inf") or ehi < float("inf")  # with neither interval finite: insufficient samples
        assert (timing is Verdict.UNDECIDED) == (lo <= 1 <= hi and not within and finite), label
        assert (timing is Verdict.INSUFFICIENT) == (not finite), label
    assert checked > 100


def test_every_committed_verdict_is_what_the_rule_decides_from_its_blocks():
    for label, outcome, config, fixes in _outcomes():
        again = restat.redecide(outcome, config, fixes)
        if again is None:
            continue
        assert again["verdict"] is outcome.verdict, f"{label}: run `lab table --restat`"
        if outcome.timed:  # (else a fix whose code never ran, settled without a block)
            assert again["stats"]["ci"] == pytest.approx(outcome.stats.ci), label
        else:
            assert again["verdict"] is Verdict.NOT_EXERCISED and "stats" not in again, label


def test_deciding_a_committed_result_again_keeps_every_warning_of_its_run():
    """`lab table --restat` replaces a verdict's warnings and keeps those the run added beside them: each committed
    result decided again by the same rule has every warning it had (the outputs differ as meant, a run gone on from
    other blocks, the compiler's notes among them), in the same order."""
    kept = 0
    for label, outcome, config, fixes in _outcomes():
        again = restat.redecide(outcome, config, fixes)
        if again is None:
            continue
        assert restat.warnings_again(outcome, again["warnings"]) == outcome.warnings, label
        kept += len([w for w in outcome.warnings if w not in again["warnings"]])
    assert kept > 30  # warnings the verdict does not make, which `--restat` dropped before


def _format1(path):
    """A committed result as format 1 wrote it: the old stats, the old verdict, no design."""
    data = json.loads(path.read_text())
    old = data.pop("previous_verdict")
    data.update(format=1, verdict=old["verdict"], summary=old["summary"],
                stats={"ratio_median": 1.0, "ratio_ci": old["ratio_ci"], "p_wilcoxon": old["p"]})
    return data


def test_restat_decides_a_format_1_result_again_and_keeps_what_it_said(tmp_path):
    # LTX2 all fixes, regional compile, 6 blocks: "no significant change" printed with a CI below 1 (discordant)
    source = ROOT / "results/ab/ltx2/begin_index+hook_registry_cache+no_progress_bar__compile__full__h200.json"
    target = tmp_path / "ab" / "ltx2" / source.name
    target.parent.mkdir(parents=True)
    old = _format1(source)
    assert old["verdict"] == "no significant change" and old["stats"]["ratio_ci"][1] < 1
    target.write_text(json.dumps(old))
    with pytest.raises(LabError, match="lab table --restat"):
        results.read(target)
    changes = restat.restat(tmp_path)
    assert changes == [{"path": target, "name": old["name"], "from": "no significant change", "to": "undecided"}]
    new = results.read(target)
    assert new.previous_verdict["verdict"] == "no significant change" and new.previous_verdict["rule"] == restat.OLD_RULE
    assert new.stats.ci[0] < 1 < new.stats.ci[1]  # the interval it decided on includes 1
    assert new.verdict is Verdict.UNDECIDED and json.loads(target.read_text())["verdict"] == "undecided"
    # the measurement is untouched
    assert msgspec.to_builtins(new.samples) == old["samples"] and new.profile == old["profile"]
    assert restat.restat(tmp_path)[0]["from"] == "undecided"  # a second pass changes nothing and keeps the record
    assert results.read(target).previous_verdict["verdict"] == "no significant change"


def _keys(value, at=""):
    """Every key path in a JSON value (list items by their index)."""
    if isinstance(value, dict):
        return {f"{at}.{key}" for key in value} | {p for key, v in value.items() for p in _keys(v, f"{at}.{key}")}
    if isinstance(value, list):
        return {p for i, v in enumerate(value) for p in _keys(v, f"{at}[{i}]")}
    return set()


def test_restat_writes_a_file_in_its_own_form(tmp_path):
    """`--restat` replaces what a result derives from its blocks and adds none of the fields a newer schema has: this
    H200 result of FLUX.1 was written before `config.pairs_at_once`, `verify.decisions` and others existed, and
    reading it gives them their defaults."""
    source = ROOT / "results/ab/flux/hook_registry_cache__compile__full__h200.json"
    before = json.loads(source.read_text())
    assert "pairs_at_once" not in before["config"]
    assert "pairs_at_once" in schema.dump(results.read(source))["config"]  # what writing the typed result would add
    target = tmp_path / "ab" / "flux" / source.name
    target.parent.mkdir(parents=True)
    # a stale summary (the words of an older rule) is what a restat replaces
    target.write_text(json.dumps({**before, "summary": "an older rule's words"}))
    assert [(c["from"], c["to"]) for c in restat.restat(tmp_path)] == [("equivalent within ±1%",) * 2]
    after = json.loads(target.read_text())
    assert _keys(after) == _keys(before)
    assert after["summary"] == before["summary"] and after["samples"] == before["samples"]
    assert schema.dump(results.read(target)) == schema.dump(results.read(source))


def test_restat_writes_the_whole_result_where_its_form_would_lose_something(tmp_path):
    """A format-1 file has no statistics of the current rule: the file written holds them (and all fields)."""
    source = ROOT / "results/ab/ltx2/begin_index+hook_registry_cache+no_progress_bar__compile__full__h200.json"
    target = tmp_path / "ab" / "ltx2" / source.name
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(_format1(source)))
    restat.restat(tmp_path)
    written = json.loads(target.read_text())
    assert written["stats"]["ci"] and written == json.loads(json.dumps(schema.dump(results.read(target))))


def test_a_format_2_result_reads_as_format_3():
    # the words of a format-2 verdict become its value; "faster, within ±1%" keeps its equivalence in the stats
    data = json.loads((ROOT / "results/ab/wan/unipc_host_coeffs__compile__full-4l__h200.json").read_text())
    data["format"] = 2
    data["verdict"] = "faster, within ±1%"
    data["stats"]["equivalent"] = True
    r = schema.load(data)
    assert r.format == 3 and r.verdict is Verdict.FASTER and r.verdict_text == "faster, within ±1%"
    for words, value in (("equivalent within ±2%", Verdict.EQUIVALENT), ("no significant change", Verdict.UNDECIDED),
                         ("not exercised", Verdict.NOT_EXERCISED), ("outputs differ", Verdict.OUTPUTS_DIFFER)):
        assert Verdict.from_text(words) is value
    with pytest.raises(ValueError, match="unknown verdict"):
        Verdict.from_text("much faster")


def test_a_result_round_trips_through_its_struct_without_losing_a_field():
    for path in sorted((ROOT / "results").glob("**/*.json")):
        data = json.loads(path.read_text())
        if data.get("kind") not in schema.TYPES:
            continue
        again = schema.dump(schema.load(json.loads(path.read_text())))
        lost = [k for k, v in data.items() if k not in again and v not in (None, [], {}, False)]
        assert not lost, f"{path}: {lost}"


def test_a_field_of_the_wrong_type_is_named_with_the_file(tmp_path):
    data = json.loads((ROOT / "results/ab/wan/unipc_host_coeffs__compile__full-4l__h200.json").read_text())
    data["stats"]["ci"] = "narrow"
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(LabError, match=re.escape(f"{bad}: not a valid result of kind `ab`") + ".*stats.ci"):
        results.read(bad)


def test_judge_on_literal_blocks():
    samples = {"control": {"wall_ms": [100.0, 101.0, 99.5, 100.4, 100.9, 99.8],
                           "raw_wall_ms": [[100.0], [101.0], [99.5], [100.4], [100.9], [99.8]]},
               "test": {"wall_ms": [95.1, 95.9, 94.6, 95.4, 96.0, 94.9],
                        "raw_wall_ms": [[95.1], [95.9], [94.6], [95.4], [96.0], [94.9]]}}
    order = [["control", "test"], ["test", "control"]] * 3
    out = judge(samples, order, design=stats.fixed_design(6), margin=0.01)
    assert out["verdict"] is Verdict.FASTER and out["stats"]["ci"][1] < 1 and out["summary"].startswith("1.05")
    unrun = judge(samples, order, design=stats.fixed_design(6), margin=0.01, not_run=["x"], fixes=["x"])
    assert unrun["verdict"] is Verdict.NOT_EXERCISED and "(timing: faster:" in unrun["summary"]
    # no block timed (a time limit came first): a fix whose code never ran is settled all the same, since that rests
    # on the check of the outputs; any other fix has no data
    none = {arm: {"wall_ms": [], "raw_wall_ms": []} for arm in ("control", "test")}
    unrun = judge(none, [], design=stats.fixed_design(6), margin=0.01, not_run=["x"], fixes=["x"], stopped="time limit")
    assert unrun["verdict"] is Verdict.NOT_EXERCISED and "no block timed: the time limit came" in unrun["summary"]
    ran = judge(none, [], design=stats.fixed_design(6), margin=0.01, not_run=["x"], fixes=["x", "y"],
                stopped="time limit")
    assert ran["verdict"] is Verdict.NO_DATA, ran
    few = copy.deepcopy(samples)
    for arm in few.values():
        arm["wall_ms"] = arm["wall_ms"][:3]
    assert judge(few, order[:3], design=stats.fixed_design(3), margin=0.01)["verdict"] is Verdict.INSUFFICIENT
    noisy = {"control": {"wall_ms": [100.0] * 10}, "test": {"wall_ms": [90.0, 110.0, 92.0, 108.0, 95.0, 104.0, 97.0,
                                                                          101.0, 99.0, 103.0]}}
    out = judge(noisy, order * 2, design=stats.sequential_design(6, 40), margin=0.01, stopped="budget spent",
                block_s=[2.0] * 10)
    assert out["verdict"] is Verdict.UNDECIDED and "undecided after 10 blocks (when the time budget was spent)" in out["summary"]
    assert "blocks would decide it" in out["summary"] and "s per block" in out["summary"]


@pytest.mark.parametrize("text, message", [
    ('{"kind": "ab", "format": 2, "name": "x"', "not a readable result file"),  # truncated
    ("", "not a readable result file"),
    ('{"format": 2}', "not a result file (no `kind`)"),
    ('{"kind": "ab", "format": 2, "name": "x", "scenario": "wan"}', "not a valid result of kind `ab` (Object missing "
                                                                   "required field `created`)"),
])
def test_a_bad_result_file_is_named_never_left_out(tmp_path, text, message):
    from lab.pages import table

    bad = tmp_path / "ab" / "wan" / "x__eager__tiny__cpu.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(text)
    with pytest.raises(LabError, match=re.escape(message)) as e:
        table.generate(tmp_path)
    assert str(bad) in str(e.value)


def test_a_bad_result_in_a_campaign_is_named(tmp_path):
    from lab.base.errors import UsageError
    from lab.campaigns import campaign

    path = tmp_path / "c.toml"
    path.write_text("[campaign]\ndevice = 'cpu'\n[[cell]]\npipeline = 'wan'\nfix = 'unipc_stack'\nsize = 'tiny'\n")
    bad = tmp_path / "results" / "ab" / "wan" / "unipc_stack__eager__tiny__cpu.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"kind": "ab", "verdict": "fas')
    with pytest.raises(UsageError, match="not a readable result file"):
        campaign.status(campaign.load(path), tmp_path / "results")
