"""The fix catalog: one module per fix, each defining `FIX = Fix(...)` with its examples (`lab/apply/fix.py`; adding one
is `docs/adding-a-fix.md`). A module whose name starts with `_` holds what several fixes share, and is not a fix."""
