"""Every mistake a user can make at the command line is one error line that says what to do, never the lab's
internal-error line (`ERROR: <Exception>: ... Full traceback: ...`), which the README reserves for failures inside
diffusers or torch. One case per known error path of each subcommand; each runs no pipeline."""

import pytest


BAD_TOML = "[campaign]\n[[cell]]\npipeline = 'wan'\nfix = 3\n"
CASES = {
    "fixes: an unknown option": ["fixes", "--colour"],
    "fixes: an unknown fix": ["fixes", "unipc_stack", "unipc_stak"],
    "diff: an unknown fix": ["diff", "--fix", "unipc_stak"],
    "upstream: no test suite": ["upstream", "check", "--fix", "unipc_host_coeffs"],
    "upstream: no PR diffs there": ["upstream", "check", "--fix", "unipc_host_coeffs", "--tests", "/nonexistent"],
    "scenarios: an unknown scenario": ["scenarios", "wna"],
    "run: an unknown pipeline": ["run", "--pipeline", "wna"],
    "run: a size that does not exist": ["run", "--pipeline", "wan", "--size", "huge"],
    "profile: an unknown pipeline": ["profile", "--pipeline", "flx"],
    "analyze: no such trace": ["analyze", "/nonexistent/trace.json.gz"],
    "analyze: three traces": ["analyze", "a.json", "b.json", "c.json"],
    "ab: an unknown fix": ["ab", "--pipeline", "wan", "--fix", "unipc_stak"],
    "ab: a fix of another pipeline": ["ab", "--pipeline", "flux", "--fix", "unipc_stack"],
    "ab: aa with a fix": ["ab", "--pipeline", "wan", "--control", "aa", "--fix", "unipc_stack"],
    "ab: a diff that does not exist": ["ab", "--pipeline", "wan", "--patch", "/nonexistent.diff"],
    "ab: a name for several sets": ["ab", "--pipeline", "wan", "--fix", "each", "--name", "x"],
    "ab: a negative block count": ["ab", "--pipeline", "wan", "--fix", "unipc_stack", "--blocks", "-3"],
    "ab: one other diffusers and two": ["ab", "--pipeline", "wan", "--fix", "unipc_stack", "--diffusers", "0.42.1",
                                         "--control-diffusers", "0.38.0"],
    "history: one release": ["history", "--pipeline", "wan", "--diffusers", "0.37.1"],
    "history: a release twice": ["history", "--pipeline", "wan", "--diffusers", "0.37.1,0.37.1"],
    "sweep: an unknown parameter": ["sweep", "--pipeline", "wan", "--fix", "unipc_stack", "--vary", "colour=1,2"],
    "sweep: no values": ["sweep", "--pipeline", "wan", "--fix", "unipc_stack", "--vary", "frames="],
    "calibrate: an unknown pipeline": ["calibrate", "--pipeline", "wna"],
    "scan: no such path": ["scan", "/nonexistent/file.py"],
    "hunt: an unknown pipeline": ["hunt", "--pipeline", "wna"],
    "table: no such results folder": ["table", "--results", "/nonexistent/results"],
    "campaign: no such file": ["campaign", "plan", "/nonexistent/c.toml"],
    "campaign: a number where a fix name belongs": ["campaign", "plan", "BAD_TOML"],
}


@pytest.mark.parametrize("args", CASES.values(), ids=CASES.keys())
def test_a_mistake_is_one_error_line_never_the_internal_error(args, tmp_path, monkeypatch, capsys):
    from lab import cli

    if "BAD_TOML" in args:
        bad = tmp_path / "bad.toml"
        bad.write_text(BAD_TOML)
        args = [str(bad) if a == "BAD_TOML" else a for a in args]
    monkeypatch.chdir(tmp_path)  # nothing may land in the repository
    try:
        code = cli.main(args)
    except SystemExit as e:  # argparse: a usage error
        code = e.code
    err = capsys.readouterr().err
    assert code in (1, 2), (code, err[-1500:])
    assert "Full traceback" not in err and "Traceback (most recent call last)" not in err, err
    assert err.strip(), "an error must say what went wrong"
