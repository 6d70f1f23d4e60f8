"""Results: where the two streams (timing and traces) meet. `schema` types them, `store` reads and writes result
files with the format check, `restat` re-judges stored results."""

from lab.base.errors import LabError
from lab.results.schema import ABResult, HistoryResult, HuntResult, Result, SweepResult
from lab.results.store import (CHECKED, FORMAT_VERSION, all_results, build_of, check_compatible, environment,
                               lab_commit, layers, now, on_gpu, read, write)

__all__ = ["ABResult", "CHECKED", "FORMAT_VERSION", "HistoryResult", "HuntResult", "LabError", "Result",
           "SweepResult", "all_results", "build_of", "check_compatible", "environment", "lab_commit", "layers", "now",
           "on_gpu", "read", "write"]
