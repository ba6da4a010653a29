"""Who owns a private PostgreSQL server's data folder, so that two hosts never run a
postmaster on it at once.

The folder usually lives on a shared file system, where PostgreSQL's own lock
(``postmaster.pid``) only protects one host: a second submission, or a job stuck completing
on another node, would start a second postmaster on the same files and corrupt the store.
So a start first claims the folder by creating ``owner.json`` exclusively: written beside it,
then hard-linked into place (``link`` fails where the name exists, on NFS, Lustre and GPFS
alike), so that a racing start reads it whole; ``O_EXCL`` where there are no hard links.
The record names the host, the SLURM node and job, and the process that started the
server. A later start takes the folder over only when that owner
is proven gone:

- on the same host (its name is the kernel's), the postmaster named by ``postmaster.pid`` is
  no longer a live PostgreSQL process; a stale ``postmaster.pid`` is then removed, so a hard
  kill leaves a store that starts again at once (PostgreSQL replays its log);
- on another host, the owner's SLURM job is no longer running (``squeue``), or it is this
  very job (a requeued job runs once). Without a job to ask about, nothing proves the other
  host gone: the start refuses, naming how to release the folder by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from automlperf.errors import UserError

OWNER_FILE = "owner.json"
# SLURM states in which a job's processes may still run.
LIVE_STATES = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT",
               "CONFIGURING", "RESIZING", "REQUEUED", "PENDING"}


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

    def where(self) -> str:
        parts = [f"host {self.host}"]
        if self.node and self.node != self.host:
            parts.append(f"node {self.node}")
        if self.job:
            parts.append(f"SLURM job {self.job}")
        return ", ".join(parts)


def here() -> Owner:
    """This process, as an owner."""
    return Owner(host=socket.gethostname(), node=os.environ.get("SLURMD_NODENAME"),
                 job=os.environ.get("SLURM_JOB_ID"), pid=os.getpid(), started_at=time.time())


def read_owner(directory: Path) -> Owner | None:
    """The recorded owner of ``directory`` (a private server's folder), or None."""
    try:
        data = json.loads((Path(directory) / OWNER_FILE).read_text())
        return Owner(**data)
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


def job_running(job: str) -> bool | None:
    """Whether SLURM still runs ``job``: None when SLURM cannot be asked."""
    squeue = shutil.which("squeue")
    if squeue is None:
        return None
    try:
        done = subprocess.run([squeue, "-h", "-j", job, "-o", "%T"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        # squeue forgets a finished job after MinJobAge and then calls its id invalid.
        return False if "Invalid job id" in done.stderr else None
    states = {line.strip() for line in done.stdout.splitlines() if line.strip()}
    return bool(states & LIVE_STATES)


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
    if owner.job and owner.job == me.job:
        return Verdict(False, False, owner, f"{owner.where()} is an earlier start of this job")
    if owner.job:
        running = job_running(owner.job)
        if running is False:
            return Verdict(False, False, owner, f"SLURM job {owner.job} has ended")
        if running:
            return Verdict(True, False, owner, f"SLURM job {owner.job} still runs")
        return Verdict(None, False, owner, f"SLURM cannot say whether job {owner.job} still runs")
    return Verdict(None, False, owner, "nothing here can tell whether it still runs")


def claim(directory: Path) -> Owner:
    """Make this process the owner of ``directory``'s server, taking it over from an owner
    proven gone (and removing that owner's stale ``postmaster.pid``); StoreInUse otherwise."""
    directory = Path(directory)
    me = here()
    record = directory / OWNER_FILE
    for _ in range(2):
        try:
            _create_whole(record, json.dumps(asdict(me)) + "\n")
        except FileExistsError:
            _take_over(directory, me)
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


def _take_over(directory: Path, me: Owner) -> None:
    verdict = assess(directory, me)
    owner = verdict.owner
    if verdict.live is False:
        _clear_stale(directory)
        # Keep the previous record beside the folder: what happened is part of the run.
        os.replace(directory / OWNER_FILE,
                   directory / f"{OWNER_FILE}.gone-{int(time.time())}")
        return
    where = owner.where() if owner else "this host"
    if verdict.live:
        stop = (f"scancel --batch --signal=TERM {owner.job}" if owner and owner.job else
                f"python -m automlperf.store.pgserver stop --dir {directory}, there")
        raise StoreInUse(f"the run's store is already served from {where} ({verdict.why}): "
                         "a second server on its files would corrupt it; wait for it to end, "
                         f"or stop it ({stop})")
    raise StoreInUse(f"the run's store was started from {where}, and {verdict.why}: once you "
                     "know that host no longer runs it, release it (python -m "
                     f"automlperf.store.pgserver release --force --dir {directory}) and "
                     "start again")


def _clear_stale(directory: Path) -> None:
    """Remove a ``postmaster.pid`` whose server is gone, so PostgreSQL starts (and replays
    its log) rather than wait for a lock nobody holds."""
    pid_file = directory / "pgdata" / "postmaster.pid"
    if pid_file.exists():
        pid_file.unlink(missing_ok=True)


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
