"""Applying fixes to the installed diffusers: the catalog (`fix`), libcst rewrites (`rewrite`), exactly reversible
patches (`patching`), diffusers versions and releases, unified diffs in and out (`change`, `diff`), which changed
lines ran (`coverage`), and a PR diff against diffusers' own tests (`suites`, `upstream`, `check_probe`).

What a fix file needs comes from here: `from lab.apply import EVERY, Example, Fix, FunctionRewrite, Overlap, Rewrite,
Upstream` (`as_method` for an example whose result holds a helper method; for a runtime patch of the hooks a setting
registered, `registered_hooks`, `offloading_groups` and `rebind_new_forward`).
The names load on first use, so that importing one module of this package does not import libcst.
"""

from __future__ import annotations

import importlib

#: what a fix author needs, and the module that defines it
FOR_FIX_AUTHORS = {"EVERY": "fix", "Fix": "fix", "Rewrite": "fix", "Upstream": "fix", "Overlap": "fix",
                   "Example": "examples", "as_method": "examples",
                   "BLANK_LINE": "rewrite",
                   "FunctionRewrite": "rewrite", "parse_method": "rewrite", "with_method_before": "rewrite",
                   "call_on_own_line": "rewrite", "around_statement": "rewrite",
                   "with_attribute_first": "rewrite", "registered_hooks": "patching", "offloading_groups": "patching",
                   "rebind_new_forward": "patching"}
__all__ = sorted(FOR_FIX_AUTHORS)


def __getattr__(name: str):
    if name in FOR_FIX_AUTHORS:
        return getattr(importlib.import_module(f"lab.apply.{FOR_FIX_AUTHORS[name]}"), name)
    raise AttributeError(f"module 'lab.apply' has no attribute {name!r}")
