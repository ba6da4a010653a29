"""Who owns a private PostgreSQL server's data folder, so that two hosts never run a
postmaster on it at once.

The folder usually lives on a shared file system, where PostgreSQL's own lock
(``postmaster.pid``) only protects one host: a second submission, or a job stuck completing
on another node, would start a second postmaster on the same files and corrupt the store.
So a start first claims the folder by creating ``owner.json`` exclusively: written beside it,
then hard-linked into place (``link`` fails where the name exists, on NFS, Lustre and GPFS
alike), so that a racing start reads it whole; ``O_EXCL`` where there are no hard links.
The record names the host, the node, the batch job (SLURM, PBS, LSF or Flux) and the
process that started the server. A later start takes the folder over only when that owner
is proven gone:

- on the same host (its name is the kernel's), the postmaster named by ``postmaster.pid`` is
  no longer a live PostgreSQL process; a stale ``postmaster.pid`` is then removed, so a hard
  kill leaves a store that starts again at once (PostgreSQL replays its log);
- on another host, the owner's batch job is no longer running (``squeue``, ``qstat``,
  ``bjobs`` or ``flux jobs`` says so), or it is this very job (a requeued job runs once).
  Without a job to ask about, nothing proves the other host gone: the start refuses, naming
  how to release the folder by hand.

Another host's ``postmaster.pid`` removed, the start waits before its server starts
(:data:`FENCE_S`): a postmaster cut off from its scheduler (a partitioned node) may still
write through the shared file system until it notices its lock file gone, which PostgreSQL
checks once a minute.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from automlperf.errors import UserError

OWNER_FILE = "owner.json"
# SLURM states in which a job's processes may still run.
LIVE_STATES = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT",
               "CONFIGURING", "RESIZING", "REQUEUED", "PENDING"}
# PBS (Pro, OpenPBS, Torque) job states of a job that has ended: F finished (qstat -x), C
# completed (Torque); any other (R, Q, H, E exiting, S, T, W, B, U) may still run.
PBS_ENDED = {"F", "C"}
# LSF: DONE and EXIT have ended; UNKWN and ZOMBI mean LSF lost touch with the host, whose
# processes may still run: not proven gone.
LSF_ENDED = {"DONE", "EXIT"}
LSF_UNSURE = {"UNKWN", "ZOMBI"}
# Flux (RFC 21): INACTIVE has ended; NEW, DEPEND, PRIORITY, SCHED, RUN and CLEANUP have not.
FLUX_ENDED = {"INACTIVE"}
SCHEDULER_NAMES = {"slurm": "SLURM", "pbs": "PBS", "lsf": "LSF", "flux": "Flux"}
# How long a start waits after removing another host's postmaster.pid, before its own server
# starts: longer than the minute after which a postmaster cut off from its job notices its
# lock file gone and shuts down (PostgreSQL re-checks it once a minute).
FENCE_S = 70.0
FENCE_ENV = "AUTOMLPERF_STORE_FENCE_S"
log = logging.getLogger("automlperf")


class StoreInUse(UserError, RuntimeError):
    """The data folder belongs to a server that may still run elsewhere."""


@dataclass(frozen=True)
class Owner:
    """Where a server was started from."""

    host: str
    node: str | None
    job: str | None
    pid: int
    started_at: float
    # The batch system of ``job``: slurm, pbs, lsf or flux (a record without one is SLURM's).
    scheduler: str | None = None

    @property
    def system(self) -> str:
        return self.scheduler or "slurm"

    def where(self) -> str:
        parts = [f"host {self.host}"]
        if self.node and self.node != self.host:
            parts.append(f"node {self.node}")
        if self.job:
            parts.append(f"{SCHEDULER_NAMES.get(self.system, self.system)} job {self.job}")
        return ", ".join(parts)


def batch_job(env: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """(batch system, job id) of the job this process runs in, or (None, None)."""
    env = os.environ if env is None else env
    for scheduler, variable in (("slurm", "SLURM_JOB_ID"), ("pbs", "PBS_JOBID"),
                                ("lsf", "LSB_JOBID"), ("flux", "FLUX_JOB_ID")):
        if env.get(variable, "").strip():
            return scheduler, env[variable].strip()
    if env.get("FLUX_URI"):
        # A `flux batch` script runs in an instance of its own, where FLUX_JOB_ID is unset:
        # the instance knows its job's id in the instance that runs it.
        jobid = _answer(["flux", "getattr", "jobid"], env)
        if jobid is not None and jobid.strip():
            return "flux", jobid.strip()
    return None, None


def here(env: Mapping[str, str] | None = None) -> Owner:
    """This process, as an owner."""
    env = os.environ if env is None else env
    scheduler, job = batch_job(env)
    node = env.get("SLURMD_NODENAME") if scheduler == "slurm" else None
    return Owner(host=socket.gethostname(), node=node, job=job, pid=os.getpid(),
                 started_at=time.time(), scheduler=scheduler)


def read_owner(directory: Path) -> Owner | None:
    """The recorded owner of ``directory`` (a private server's folder), or None."""
    try:
        data = json.loads((Path(directory) / OWNER_FILE).read_text())
        known = {f.name for f in fields(Owner)}
        return Owner(**{k: v for k, v in data.items() if k in known})
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        # A record cut short by a crash while writing proves nothing about its writer.
        raise StoreInUse(f"{Path(directory) / OWNER_FILE} is damaged ({exc}): if no job "
                         "serves this store any more, delete that file and start again") from None


def postmaster_pid(data: Path) -> int | None:
    """The pid ``postmaster.pid`` names, or None when there is none (a stopped server)."""
    try:
        first = (Path(data) / "postmaster.pid").read_text().split("\n", 1)[0]
        return int(first)
    except (FileNotFoundError, ValueError):
        return None


def _is_postgres(pid: int) -> bool:
    """Whether ``pid`` is a live PostgreSQL server process on this host: a pid reused by
    another program after a hard kill is not."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return _alive(pid)
    if not command:  # a zombie, already gone
        return False
    name = Path(command.split(b"\0", 1)[0].decode(errors="replace")).name
    return name.startswith(("postgres", "postmaster"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _run(command: list[str], env: Mapping[str, str] | None = None
         ) -> subprocess.CompletedProcess[str] | None:
    """``command``'s outcome, or None where it is not installed or did not answer."""
    if shutil.which(command[0], path=(env or os.environ).get("PATH")) is None:
        return None
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60,
                              env=None if env is None else dict(env))
    except (OSError, subprocess.TimeoutExpired):
        return None


def _answer(command: list[str], env: Mapping[str, str] | None = None) -> str | None:
    done = _run(command, env)
    return done.stdout if done is not None and done.returncode == 0 else None


def job_running(job: str, scheduler: str = "slurm") -> bool | None:
    """Whether the batch system still runs ``job``: None when it cannot be asked, or cannot
    say (a host it lost touch with)."""
    ask = {"slurm": _slurm_running, "pbs": _pbs_running, "lsf": _lsf_running,
           "flux": _flux_running}.get(scheduler)
    return None if ask is None else ask(job)


def _slurm_running(job: str) -> bool | None:
    done = _run(["squeue", "-h", "-j", job, "-o", "%T"])
    if done is None:
        return None
    if done.returncode != 0:
        # squeue forgets a finished job after MinJobAge and then calls its id invalid.
        return False if "Invalid job id" in done.stderr else None
    states = {line.strip() for line in done.stdout.splitlines() if line.strip()}
    return bool(states & LIVE_STATES)


def _pbs_running(job: str) -> bool | None:
    done = _run(["qstat", "-f", job])
    if done is None:
        return None
    if done.returncode != 0:
        # A job PBS has forgotten, or one it keeps only in its history (PBS Pro: "Job has
        # finished, use -x or -H").
        said = done.stderr + done.stdout
        return False if ("Unknown Job Id" in said or "has finished" in said) else None
    for line in done.stdout.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "job_state":
            return value.strip() not in PBS_ENDED
    return None


def _lsf_running(job: str) -> bool | None:
    done = _run(["bjobs", "-noheader", "-o", "stat", job])
    if done is None:
        return None
    said = done.stdout.strip()
    if "is not found" in done.stderr + said:
        return False  # LSF forgets a finished job after CLEAN_PERIOD
    if done.returncode != 0 or not said:
        return None
    state = said.split()[0]
    return None if state in LSF_UNSURE else state not in LSF_ENDED


def _flux_running(job: str) -> bool | None:
    # A job's id is its id in the instance that ran it: from inside a batch job's own
    # instance (this one has a jobid), that is the parent instance.
    inside = _answer(["flux", "getattr", "jobid"]) is not None
    done = _run(["flux", *(["--parent"] if inside else []), "jobs", "-n", "-o", "{state}", job])
    if done is None:
        return None
    if done.returncode != 0:
        return False if "unknown job id" in done.stderr.lower() else None
    state = done.stdout.strip()
    return None if not state else state not in FLUX_ENDED


@dataclass(frozen=True)
class Verdict:
    """What is known of a folder's recorded server."""

    live: bool | None  # True: it runs; False: proven gone; None: cannot tell from here
    here: bool  # it ran (or runs) on this host
    owner: Owner | None
    why: str


def assess(directory: Path, me: Owner | None = None) -> Verdict:
    """Whether the server recorded in ``directory`` may still run."""
    directory = Path(directory)
    me = me or here()
    owner = read_owner(directory)
    pid = postmaster_pid(directory / "pgdata")
    if owner is None or owner.host == me.host:
        # PostgreSQL's own lock speaks for this host (and for folders from before owners).
        if pid is not None:
            if _is_postgres(pid):
                return Verdict(True, True, owner, f"its postmaster (pid {pid}) runs on this host")
            return Verdict(False, True, owner, f"its postmaster (pid {pid}) is gone")
        if owner is not None and owner.pid != os.getpid() and _alive(owner.pid):
            return Verdict(True, True, owner, f"process {owner.pid} on this host is starting it")
        return Verdict(False, True, owner, "no postmaster.pid: the server is stopped")
    if owner.job and owner.job == me.job and owner.system == me.system:
        return Verdict(False, False, owner, f"{owner.where()} is an earlier start of this job")
    if owner.job:
        name = SCHEDULER_NAMES.get(owner.system, owner.system)
        running = job_running(owner.job, owner.system)
        if running is False:
            return Verdict(False, False, owner, f"{name} job {owner.job} has ended")
        if running:
            return Verdict(True, False, owner, f"{name} job {owner.job} still runs")
        return Verdict(None, False, owner, f"{name} cannot say whether job {owner.job} still runs")
    return Verdict(None, False, owner, "nothing here can tell whether it still runs")


def fence_s(env: Mapping[str, str] | None = None) -> float:
    """The pause after another host's ``postmaster.pid`` is removed (:data:`FENCE_S`, or
    ``AUTOMLPERF_STORE_FENCE_S``)."""
    text = (os.environ if env is None else env).get(FENCE_ENV, "").strip()
    if not text:
        return FENCE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 3600:
        raise UserError(f"{FENCE_ENV}={text!r} is not a number of seconds (0 to 3600): set it "
                        "so, or unset it")
    return value


def claim(directory: Path, sleep: Callable[[float], None] = time.sleep) -> Owner:
    """Make this process the owner of ``directory``'s server, taking it over from an owner
    proven gone (and removing that owner's stale ``postmaster.pid``; another host's, then
    waiting out :func:`fence_s` through ``sleep``); StoreInUse otherwise."""
    directory = Path(directory)
    me = here()
    record = directory / OWNER_FILE
    for _ in range(2):
        try:
            _create_whole(record, json.dumps(asdict(me)) + "\n")
        except FileExistsError:
            _take_over(directory, me, sleep)
            continue
        verdict = assess(directory, me)
        if verdict.live:  # a server without an owner record, still running here
            release(directory)
            raise StoreInUse(f"the store in {directory} is already served: {verdict.why}; "
                             "stop it first (python -m automlperf.store.pgserver stop --dir "
                             f"{directory})")
        _clear_stale(directory)
        return me
    raise StoreInUse(f"another process claimed {directory} at the same moment: start once")


# How to stop a job cleanly (the primary writes its result), by batch system.
STOP_JOB = {"slurm": "scancel --batch --signal=TERM {job}", "pbs": "qsig -s TERM {job}",
            "lsf": "bkill -s TERM {job}", "flux": "flux job kill --signal=TERM {job}"}


def _create_whole(record: Path, text: str) -> None:
    """Create ``record`` holding ``text``, or raise FileExistsError: written beside it, then
    linked into place, so that a claimant that finds it reads it whole (created empty and
    then written, it was found empty, "damaged", by a start racing this one). Where the file
    system has no hard links, it is created exclusively and then written."""
    part = record.with_name(f".{record.name}.{socket.gethostname()}.{os.getpid()}")
    with open(part, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(part, record)
        return
    except FileExistsError:
        raise
    except OSError:
        pass  # no hard links here
    finally:
        part.unlink(missing_ok=True)
    fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _take_over(directory: Path, me: Owner, sleep: Callable[[float], None]) -> None:
    verdict = assess(directory, me)
    owner = verdict.owner
    if verdict.live is False:
        pause = fence_s()
        removed = _clear_stale(directory)
        # Keep the previous record beside the folder: what happened is part of the run.
        os.replace(directory / OWNER_FILE,
                   directory / f"{OWNER_FILE}.gone-{int(time.time())}")
        if removed and not verdict.here and pause > 0:
            # Its job has ended, but a postmaster cut off from it (a partitioned node) may
            # still reach the files: it shuts down once it finds its lock file gone.
            log.warning("removed the postmaster.pid left by %s (%s): waiting %.0f s before "
                        "starting the server, for a postmaster still running there to notice "
                        "its lock file gone and stop (%s sets the pause)",
                        owner.where() if owner else "another host", verdict.why, pause,
                        FENCE_ENV)
            sleep(pause)
        return
    where = owner.where() if owner else "this host"
    if verdict.live:
        stop = (STOP_JOB[owner.system].format(job=owner.job) if owner and owner.job
                and owner.system in STOP_JOB else
                f"python -m automlperf.store.pgserver stop --dir {directory}, there")
        raise StoreInUse(f"the run's store is already served from {where} ({verdict.why}): "
                         "a second server on its files would corrupt it; wait for it to end, "
                         f"or stop it ({stop})")
    raise StoreInUse(f"the run's store was started from {where}, and {verdict.why}: once you "
                     "know that host no longer runs it, release it (python -m "
                     f"automlperf.store.pgserver release --force --dir {directory}) and "
                     "start again")


def _clear_stale(directory: Path) -> bool:
    """Remove a ``postmaster.pid`` whose server is gone, so PostgreSQL starts (and replays
    its log) rather than wait for a lock nobody holds; whether there was one."""
    pid_file = directory / "pgdata" / "postmaster.pid"
    try:
        pid_file.unlink()
    except FileNotFoundError:
        return False
    return True


def release(directory: Path, force: bool = False) -> Owner | None:
    """Give up ownership of ``directory``: the record, if it is this host's (or with
    ``force``, whoever's, for an owner known by the operator to be gone). A server still
    running on this host keeps it. The owner given up, or None."""
    directory = Path(directory)
    owner = read_owner(directory)
    if owner is None:
        return None
    me = here()
    verdict = assess(directory, me)
    if verdict.live and verdict.here:
        raise StoreInUse(f"the store in {directory} still runs here ({verdict.why}): stop it "
                         f"with python -m automlperf.store.pgserver stop --dir {directory}")
    if owner.host != me.host and not force:
        raise StoreInUse(f"the store in {directory} belongs to {owner.where()}: release it "
                         "there, or with --force once you know that host no longer runs it")
    if force:
        # The operator's word, not a clean stop: keep the record of whose it was.
        os.replace(directory / OWNER_FILE, directory / f"{OWNER_FILE}.gone-{int(time.time())}")
    else:
        (directory / OWNER_FILE).unlink(missing_ok=True)
    return owner
