"""Running a campaign's jobs: one after another on this machine, or in parallel on a Dask cluster.

- one after another (default): each job is one `lab` process, started here;
- `workers=N`: a local Dask cluster of N worker processes (`distributed.LocalCluster`), one job per worker;
- `gpus=[...]`: one worker per GPU of this host (a `distributed.LocalCluster` of that many workers; each job sees
  only its worker's GPU through `CUDA_VISIBLE_DEVICES`, so nothing beyond `distributed` is needed);
- `scheduler=ADDRESS`: an existing Dask cluster (`dask scheduler` plus `dask cuda worker ADDRESS` on each host);
- `slurm=N`: N Slurm jobs of workers (`dask_jobqueue.SLURMCluster`, configured by the campaign's `[slurm]` table).

Every job runs as its own `lab` process in the repository root (the same path on every worker: a shared
filesystem on a cluster), pinned to its worker's share of the host's cores, with its output in a log file. A job
writes each result atomically, so killing a campaign loses at most the cells in progress.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lab.base.errors import INTERRUPTIONS, Terminated, UsageError
from lab.base.naming import device_tag_of
from lab.base.paths import child_pythonpath, package_parent

#: how long an interrupted job may take to keep what it completed before it is killed
JOB_GRACE_S = 120


def worker_cores(rank: int, workers: int, available: set[int] | None = None) -> set[int]:
    """The cores of worker `rank` of `workers` on one host: an equal, contiguous share of the cores this process
    may use (so that two workers never compete for a core)."""
    cores = sorted(available if available is not None else os.sched_getaffinity(0))
    if workers <= 1 or len(cores) < workers:
        return set(cores)
    share = len(cores) // workers
    return set(cores[rank * share:(rank + 1) * share])


def job_cores(rank: int, workers: int, gpu: str | None = None, host_gpus: int | None = None,
              available: set[int] | None = None) -> set[int]:
    """The cores a job is pinned to: with its GPU one of the host's `host_gpus` (`--gpus`), that GPU's share of the
    host's cores, so that two campaigns on other GPUs of one host (`--gpus 0,1` and `--gpus 2,3`) never share a
    core; else its worker's share."""
    if gpu is not None and gpu.isdigit() and host_gpus and int(gpu) < host_gpus:
        return worker_cores(int(gpu), host_gpus, available)
    return worker_cores(rank, workers, available)


def host_gpus() -> int | None:
    """How many GPUs this host has (`nvidia-smi -L`), or None where that cannot be said: no `nvidia-smi`, or a
    `CUDA_VISIBLE_DEVICES` that renumbers them."""
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        return None
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(line.startswith("GPU ") for line in listed.splitlines()) or None


def gpu_tag(device: str) -> str | None:
    """This host's GPU tag (`h100`, `h200`) for a campaign on `cuda`, None without one (planning on a CPU host).
    Asked of `nvidia-smi`, not torch: the campaign's own process must not hold a CUDA context beside its jobs."""
    if not device.startswith("cuda"):
        return None
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return None
    return device_tag_of(names[0].strip()) if names and names[0].strip() else None


def _rank(local: bool = False) -> tuple[int, int]:
    """This worker's place among the workers of its host: from dask-cuda's `CUDA_VISIBLE_DEVICES` (`dask cuda worker`
    on a cluster: the worker's own GPU first, the host's GPUs after it), else (or `local`: a worker of this host's
    own cluster, whatever the host's `CUDA_VISIBLE_DEVICES` says) from a local worker's name; (0, 1) outside a
    cluster."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if "," in visible and not local:
        gpus = visible.split(",")
        return sorted(gpus).index(gpus[0]), len(gpus)
    try:
        from distributed import get_worker

        worker = get_worker()
        return int(worker.name), int(os.environ.get("LAB_WORKERS", "1"))
    except (ImportError, ValueError, TypeError):
        return 0, 1


def run_job(argv: list[str], log: str, pin: bool = True, cwd: str | None = None,
            lab_path: str | None = None, deadline: float | None = None,
            gpus: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Run one command (`python -m lab.cli ...`, or a benchmark script) in `cwd` (the folder the campaign was started
    from: its paths are relative to it), its output appended to `log`; what happened, for the run log. `lab_path`
    (the folder holding the `lab` package) goes first on its `PYTHONPATH`, so that it runs this same lab. At
    `deadline` (a `time.time()`) a job still running gets a SIGTERM, and keeps what it completed as after a Ctrl-C.

    Runs on a Dask worker (or here): its cores come from its rank, its GPU from `gpus` (the host's GPUs, one per
    worker: the job sees only the one of its rank) or else from the worker's environment."""
    rank, workers = _rank(local=bool(gpus))
    gpu = gpus[rank % len(gpus)] if gpus else None
    on_host = int(os.environ.get("LAB_HOST_GPUS") or 0) or None
    cores = job_cores(rank, workers, gpu, on_host) if pin else None
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    if deadline is not None:  # a sequential A/B stops its blocks cleanly before it (`lab.measure.blocks.time_limit`)
        env["LAB_DEADLINE"] = f"{deadline:.3f}"
    env["PYTHONPATH"] = child_pythonpath(*([lab_path] if lab_path else []))
    # how many jobs this host measures at once: this campaign's workers, times the campaigns side by side
    # (`LAB_HOST_CAMPAIGNS`, from `campaigns/device.sh`); each result records it (`store.host_jobs`)
    try:
        side_by_side = max(1, int(os.environ.get("LAB_HOST_CAMPAIGNS") or 1))
    except ValueError:
        side_by_side = 1
    env["LAB_HOST_JOBS"] = str(workers * side_by_side)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    interrupted = timed_out = False
    with open(log, "a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=functools.partial(_job_process_starts, cores))
        try:
            proc.wait(timeout=None if deadline is None else max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:  # the campaign's time limit: the job keeps its blocks, like a Ctrl-C
            interrupted = timed_out = True
            _let_it_keep_what_it_completed(proc, terminate=True)
        except KeyboardInterrupt as e:
            # A Ctrl-C reaches the job too (one process group). A SIGTERM may have reached this process alone (a
            # scheduler's time limit), so it is passed on: the job takes a second one as nothing.
            interrupted = True
            _let_it_keep_what_it_completed(proc, terminate=isinstance(e, Terminated))
    if proc.returncode == 130 and not interrupted:
        # the job stopped by itself with what it completed kept (a calibration that would have run past the limit)
        interrupted, timed_out = True, deadline is not None
    text = Path(log).read_text(errors="replace").splitlines()
    # the job's own error line: the lab's `ERROR: ...`, or argparse's `lab ab: error: ...`
    errors = [line for line in text if line.startswith("ERROR:") or (line.startswith("lab ") and ": error: " in line)]
    outcome = {"exit": proc.returncode, "seconds": time.time() - started, "started": started,
               "host": socket.gethostname(), "gpu": env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0] or None,
               "cores": f"{min(cores)}-{max(cores)}" if cores else None, "log": log,
               "error": errors[-1] if errors else None}
    if interrupted:
        outcome["interrupted"] = True
    if timed_out:
        outcome["time_limit"] = True
    return outcome


def _job_process_starts(cores: set[int] | None) -> None:
    """In a job's process, before its command runs: pinned to `cores`, and a Ctrl-C or a SIGTERM ends it as it ends
    any command. (A local cluster's worker, which starts it, takes no notice of them (`_deaf_to_interruptions`), and
    a command would inherit that.)"""
    for signum in INTERRUPTIONS:
        signal.signal(signum, signal.SIG_DFL)
    if cores:
        os.sched_setaffinity(0, cores)


def _let_it_keep_what_it_completed(proc: subprocess.Popen, terminate: bool) -> None:
    """An interrupted job (sent a SIGTERM first when `terminate`) gets the time to keep what it completed (its result,
    page and plot) and exit; a second Ctrl-C, or JOB_GRACE_S, ends it at once. (A second SIGINT sent here, after the
    one a Ctrl-C gave the whole process group, could cut its writing short.)"""
    if terminate:
        proc.terminate()
    try:
        proc.wait(timeout=JOB_GRACE_S)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()


@dataclasses.dataclass(frozen=True)
class Where:
    """Where the jobs run (at most one of the fields set; none: one after another here)."""

    workers: int | None = None
    gpus: tuple[str, ...] | None = None
    scheduler: str | None = None
    slurm: int | None = None

    def describe(self) -> str:
        if self.workers:
            return f"a local Dask cluster of {self.workers} workers"
        if self.gpus:
            return f"one Dask worker per GPU of this host ({', '.join(self.gpus)})"
        if self.scheduler:
            return f"the Dask cluster at {self.scheduler}"
        if self.slurm:
            return f"{self.slurm} Slurm job(s) of Dask workers (dask-jobqueue)"
        return "one after another on this machine"

    @property
    def parallel(self) -> int:
        return self.workers or len(self.gpus or ()) or self.slurm or 0


@contextlib.contextmanager
def client(where: Where, slurm_options: dict[str, Any]) -> Iterator[Any]:
    """A Dask client for `where` (None when the jobs run one after another here); the cluster it started, if any,
    is closed on exit."""
    if not where.parallel and not where.scheduler:
        yield None
        return
    try:
        from distributed import Client
    except ImportError:
        raise UsageError(f"running on {where.describe()} needs Dask's `distributed`, which the lab's own install "
                         "brings (`pip install .`) and this Python lacks: install it (or carry its wheels), or run "
                         "the jobs one after another (without --workers/--gpus).") from None

    if where.scheduler:
        with Client(where.scheduler) as c:
            yield c
        return
    before = {name: os.environ.get(name) for name in ("LAB_WORKERS", "LAB_HOST_GPUS")}
    try:
        if where.workers or where.gpus:
            from distributed import LocalCluster

            n = where.workers or len(where.gpus)
            os.environ["LAB_WORKERS"] = str(n)  # the workers inherit it: each pins its share of the cores
            if where.gpus:  # a job on a GPU pins that GPU's share of the host's cores (`job_cores`)
                os.environ["LAB_HOST_GPUS"] = str(host_gpus() or "")
            with _deaf_to_interruptions():  # its workers are started now, and inherit that
                cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
        else:
            cluster = slurm_cluster(slurm_options)
            cluster.scale(jobs=where.slurm)
        with cluster, Client(cluster) as c:
            try:
                yield c
            finally:
                _quiet_the_closing(c)
    finally:  # the process that started the cluster is left as it was (a campaign run from Python, a test)
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


#: what a Dask worker logs, with a traceback, when its heartbeat meets a scheduler that is closing
HEARTBEAT_FAILED = "Failed to communicate with scheduler during heartbeat."


class _ClosingHeartbeat(logging.Filter):
    """Drops a worker's heartbeat failure. Closing a cluster it started, the lab closes the scheduler while each
    worker still beats (distributed's own race, logged as an error with its traceback at the end of a campaign, an
    interrupted one most often); at that point the message reports nothing. Everything else the worker logs
    passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != HEARTBEAT_FAILED


def _quiet_heartbeat() -> None:
    """In a worker: its heartbeat failures are not logged from now on (the cluster is closing)."""
    worker_log = logging.getLogger("distributed.worker")
    if not any(isinstance(f, _ClosingHeartbeat) for f in worker_log.filters):
        worker_log.addFilter(_ClosingHeartbeat())


def _quiet_the_closing(c: Any) -> None:
    """Before a cluster the lab started closes: its workers stop logging heartbeats that fail (`_ClosingHeartbeat`).
    A worker that cannot be asked (it died) is closed as it is, and so is the cluster where asking fails."""
    with contextlib.suppress(Exception):
        c.run(_quiet_heartbeat, on_error="ignore")


@contextlib.contextmanager
def _deaf_to_interruptions() -> Iterator[None]:
    """A Ctrl-C and a SIGTERM ignored within (in the main thread; elsewhere nothing changes): the processes started
    within inherit that. A Ctrl-C reaches every process of the terminal's group (and `timeout`'s SIGTERM every
    process of its group), and a local cluster's workers would die of it, each printing a traceback, while their
    jobs are still keeping what they completed (and Dask's scheduler would log that it runs such a job again
    elsewhere: "will be recomputed elsewhere").
    Deaf to them, the workers live on to report their jobs' ends (`_keep_what_the_running_complete`), and their jobs
    take them as usual (`_job_process_starts`). The cluster still ends its workers (a SIGKILL where they do not
    stop when asked). A Ctrl-C in the seconds the cluster takes to start is lost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.signal(signum, signal.SIG_IGN) for signum in INTERRUPTIONS}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def slurm_cluster(options: dict[str, Any]):
    """A `dask_jobqueue.SLURMCluster` from a campaign's `[slurm]` table (queue, account, walltime, cores, memory,
    job_extra_directives such as `["--gres=gpu:1"]`, ...): each Slurm job is one worker with one GPU."""
    from dask_jobqueue import SLURMCluster

    settings = {"cores": 16, "memory": "120GB", "processes": 1, "walltime": "04:00:00",
                "job_extra_directives": ["--gres=gpu:1"], **options}
    return SLURMCluster(**settings)


def run(jobs: list[tuple[str, list[str], str]], where: Where, slurm_options: dict[str, Any],
        done: Callable[[str, dict], None], pin: bool = True, deadline: float | None = None,
        fits: Callable[[str, float], bool] | None = None,
        progress: Callable[[str], None] | None = None) -> None:
    """Run `jobs` (id, argv, log) where `where` says, each in the folder this is called from; `done(id, outcome)` is
    called as each one finishes. With a `deadline` (jobs here, one after another or on a local cluster), a job starts
    only if `fits(id, seconds left)`, and those running at the deadline are ended as by a Ctrl-C, the last to run.
    After a Ctrl-C here (one after another, or on a local cluster: the jobs get it too), the jobs running keep what
    they completed, each is reported done as interrupted, and KeyboardInterrupt is raised again; `progress` says
    what is awaited."""
    cwd, lab_path = os.getcwd(), str(package_parent())
    with client(where, slurm_options) as c:
        if c is None:
            for job_id, argv, log in jobs:
                if deadline is not None and not fits(job_id, deadline - time.time()):
                    continue
                outcome = run_job(argv, log, pin=False, cwd=cwd, lab_path=lab_path, deadline=deadline)
                done(job_id, outcome)
                if outcome.get("time_limit"):
                    return
                if outcome.get("interrupted"):
                    raise KeyboardInterrupt  # after the job's entry is in the run log
            return
        if deadline is not None and not (where.workers or where.gpus):
            raise ValueError("a deadline needs the jobs run here: one after another or on a local cluster")
        from distributed import as_completed

        # On a local cluster a job is submitted only when a worker is free: with a deadline, `fits` sees the time
        # that is really left, and after a Ctrl-C none is queued to start. Elsewhere the cluster queues them all.
        local = bool(where.workers or where.gpus)
        waiting = list(jobs)
        futures: dict[Any, str] = {}
        running = as_completed()
        reported: set[Any] = set()

        def submit_next() -> None:
            """The next job (that fits, with a deadline)."""
            while waiting:
                job_id, argv, log = waiting.pop(0)
                if deadline is not None and not fits(job_id, deadline - time.time()):
                    continue
                future = c.submit(run_job, argv, log, pin, cwd, lab_path, deadline, where.gpus, key=f"lab-{job_id}",
                                  pure=False)
                futures[future] = job_id
                running.add(future)
                return

        for _ in range(where.parallel if local else len(jobs)):
            submit_next()
        try:
            for future in running:
                reported.add(future)
                outcome = _outcome(future)
                done(futures[future], outcome)
                if local and not outcome.get("time_limit"):
                    submit_next()
        except KeyboardInterrupt as e:
            if local:
                still = {f: job for f, job in futures.items() if f not in reported}
                if isinstance(e, Terminated):  # a SIGTERM may have reached this process alone (a scheduler's limit)
                    argvs = {job_id: argv for job_id, argv, _ in jobs}
                    _pass_on(signal.SIGTERM, [argvs[job_id] for job_id in still.values()])
                _keep_what_the_running_complete(still, done, progress)
            raise


def _outcome(future) -> dict[str, Any]:
    """What a finished job's future says happened."""
    try:
        return future.result()
    except Exception as e:  # a worker that died with the job: recorded as a failure, the others go on
        return {"exit": -1, "seconds": None, "error": f"{type(e).__name__}: {e}"}


def _pass_on(signum: int, argvs: list[list[str]]) -> None:
    """Send `signum` to the jobs running `argvs` on this process's local cluster: its workers' processes that run
    them. (A job that had it already, from its process group, takes a second SIGTERM as nothing.)"""
    import psutil  # distributed's own dependency

    wanted = {tuple(argv) for argv in argvs}
    for worker in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            for job in worker.children():
                with contextlib.suppress(psutil.Error):
                    if tuple(job.cmdline()) in wanted:
                        job.send_signal(signum)


def _keep_what_the_running_complete(running: dict[Any, str], done: Callable[[str, dict], None],
                                    progress: Callable[[str], None] | None) -> None:
    """After a Ctrl-C, the jobs still `running` on a local cluster's workers (futures and their ids), which the
    Ctrl-C reached too, keep what they completed: each is reported done as it ends, as interrupted, within
    JOB_GRACE_S; a second Ctrl-C stops the waiting (and ends the jobs at once, as it reaches them too)."""
    if not running:
        return
    if progress:
        progress(f"\nWaiting for the {len(running)} running job(s) to keep what they completed (at most "
                 f"{JOB_GRACE_S} s; Ctrl-C again ends them at once).")
    end = time.time() + JOB_GRACE_S
    try:
        while running and time.time() < end:
            for future in [f for f in running if f.done()]:
                outcome = _outcome(future)
                if outcome.get("exit") != 0:  # not one that ended of itself: interrupted, whatever else it says
                    outcome = {**{k: v for k, v in outcome.items() if k != "time_limit"}, "interrupted": True}
                done(running.pop(future), outcome)
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
