"""`lab fixes`: the catalog and the status of each fix on the installed diffusers."""

from __future__ import annotations

import argparse
import json
import sys

from tabulate import tabulate

HELP = "list every fix and its status on the installed diffusers"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="only these fixes (default: every fix); a status is worked out only for the fixes asked about")
    p.add_argument("--json", action="store_true")


def _short(target: str) -> str:
    """`diffusers.pipelines.wan.pipeline_wan:WanPipeline.__call__` -> `pipeline_wan:WanPipeline.__call__`."""
    module, _, name = target.partition(":")
    return f"{module.rsplit('.', 1)[-1]}:{name}" if name else target


def run(args: argparse.Namespace) -> int:
    from lab.apply.fix import catalog, get_fix
    from lab.apply.versions import diffusers_version
    from lab.base.console import progress

    rows = []
    fixes = [get_fix(name) for name in dict.fromkeys(args.names)] if args.names else list(catalog().values())
    for i, fix in enumerate(fixes, 1):
        if sys.stderr.isatty():  # a cold cache rewrites every site once, then remembers: a minute, then seconds
            progress(f"\rworking out where each fix applies: {i}/{len(fixes)} {fix.name} ({len(fix.rewrites)} site(s))")
        upstream = ", ".join(fix.upstream.refs) + (f" (in {fix.upstream.since})" if fix.upstream.since else " (not upstream)")
        rows.append({
            "fix": fix.name, "kind": fix.kind, "description": fix.description, "targets": list(fix.targets),
            "pipelines": list(fix.pipelines), "setting": fix.setting, "upstream": upstream,
            "status": fix.summary_status(),
            "sites": [{"module": st.rewrite.module, "state": st.state, "detail": st.detail} for st in fix.site_statuses()],
        })
    if sys.stderr.isatty():
        progress("\r")
    if args.json:
        print(json.dumps({"diffusers": str(diffusers_version()), "fixes": rows}, indent=2))
        return 0
    print(f"Fixes on the installed diffusers {diffusers_version()}:\n")
    table = [[r["fix"], r["kind"], "\n".join(_short(t) for t in r["targets"]),
              ("every scenario" if r["pipelines"] == ["*"] else ", ".join(r["pipelines"]))
              + (f", with --setting {r['setting']}" if r["setting"] else ""), r["upstream"],
              r["status"]] for r in rows]
    print(tabulate(table, headers=["fix", "kind", "targets", "pipelines", "upstream", "status here"], tablefmt="simple_grid",
                   maxcolwidths=[None, None, 60, 22, 28, 50]))
    return 0
