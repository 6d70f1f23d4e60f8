"""The fix catalog: one module per fix, each defining `FIX = Fix(...)`. See `lab/apply/fix.py`."""
