"""`python -m lab ...` is the `lab` command."""

from lab.cli import main

raise SystemExit(main())
