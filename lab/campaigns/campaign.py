"""Campaigns as data, the one door to them: a TOML file names the matrix to measure (`lab.campaigns.cells`: its
format, its cells and jobs), the results say which cells are done (`lab.campaigns.status`), and what the rest will
take is estimated from what was measured (`lab.campaigns.estimates`, pure, given what `lab.campaigns.measured`
reads). The commands take these names from here."""

from __future__ import annotations

from pathlib import Path

from lab.campaigns import estimates, measured
from lab.campaigns.cells import (AXES, BUILD_KEYS, CELL_TYPES, JOB_KEYS, KINDS, NOT_OPTIONS, Campaign, Cell, Job,
                                 check_settings, device_of, jobs, load)
from lab.campaigns.estimates import GUESS, Estimate
from lab.campaigns.measured import Measured, read_log
from lab.campaigns.status import (SETTLED, Status, blocks_on, changed_in_the_other_mode, never_ran,
                                  no_effect_blocks, old_build_held, past_its_design, setting_spread, states, status)

__all__ = ["AXES", "BUILD_KEYS", "CELL_TYPES", "JOB_KEYS", "KINDS", "NOT_OPTIONS", "Campaign", "Cell", "Job",
           "check_settings", "device_of", "jobs", "load", "GUESS", "Estimate", "Measured", "read_log", "SETTLED",
           "Status", "blocks_on", "changed_in_the_other_mode", "never_ran", "no_effect_blocks", "old_build_held",
           "past_its_design", "setting_spread", "states", "status", "estimate"]


def estimate(job: Job, results: Path, resume: bool = False, device: str | None = None) -> Estimate:
    """`estimates.estimate` of `job` from what `results` holds for it (`measured.read`), as a run on `device` plans
    it."""
    return estimates.estimate(job, measured.read(job, results, device), resume, device)
