"""Whether the kernel's out-of-memory killer ended a training process.

A rank the OOM killer ends dies of SIGKILL, exactly like one killed by hand or by a batch
system; what tells them apart is the kernel's own account. Each rank's memory cgroup is
found when it starts (``/proc/PID/cgroup``: cgroup v2's unified group, whose
``memory.events`` counts ``oom_kill``, or cgroup v1's memory controller, whose
``memory.oom_control`` does), its count read before every trial and again when the rank
died of signal 9: a count that rose means the kernel killed for memory in that group, as a
SLURM job's memory limit or a container's does. Where no memory cgroup can be read, the
kernel log (``/dev/kmsg``, readable by root or where ``kernel.dmesg_restrict`` is 0) is
searched for the rank's "Killed process PID" line. Neither found: the death stays a crash.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
# How much likelier than its replica and the primary a training process is to be the OOM
# killer's choice (-1000 to 1000, added to its share of memory in thousandths).
OOM_SCORE_ADJ = 300


def volunteer_for_oom_kill(adj: int = OOM_SCORE_ADJ) -> None:
    """Make this process (a rank, and the data-loading workers it starts) the kernel's first
    choice when memory runs out: a rank killed is a failed trial the replica records and
    retries smaller; a replica or primary killed is a run cut short. Raising one's own score
    needs no privilege; where it cannot be written, nothing changes."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(adj))
    except OSError:
        pass


@dataclass(frozen=True)
class MemoryGroup:
    """A memory cgroup: where its kill count is read, its path, and its limit in bytes."""

    counter: Path
    path: str
    limit: int | None

    def kills(self) -> int | None:
        """How many processes of this group the OOM killer has ended (None: unreadable)."""
        try:
            text = self.counter.read_text()
        except OSError:
            return None
        found = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
        return int(found.group(1)) if found else None

    def describe(self) -> str:
        limit = f", limit {self.limit / 2**30:.1f} GiB" if self.limit else ""
        return f"memory cgroup {self.path}{limit}"


def _mounts(mountinfo: Path) -> list[tuple[str, str, set[str]]]:
    """(file system type, mount point, super options) of every cgroup mount."""
    out: list[tuple[str, str, set[str]]] = []
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            out.append((tail[0], fields[4], set(tail[2].split(","))))
    return out


def _limit(text: str) -> int | None:
    text = text.strip()
    if not text.isdigit():
        return None  # "max"
    value = int(text)
    return value if value < 1 << 60 else None  # cgroup v1's "unlimited"


def memory_group(pid: int, proc: Path = Path("/proc"),
                 mountinfo: Path = MOUNTINFO) -> MemoryGroup | None:
    """The memory cgroup of process ``pid`` whose OOM kills can be counted, if any."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    mounts = _mounts(mountinfo)
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2's unified hierarchy
            for kind, point, _ in mounts:
                group = Path(point) / rel
                if kind == "cgroup2" and (group / "memory.events").exists():
                    limit = _read(group / "memory.max")
                    return MemoryGroup(group / "memory.events", path, _limit(limit or ""))
        elif "memory" in controllers.split(","):
            for kind, point, options in mounts:
                group = Path(point) / rel
                if kind == "cgroup" and "memory" in options and \
                        (group / "memory.oom_control").exists():
                    limit = _read(group / "memory.limit_in_bytes")
                    return MemoryGroup(group / "memory.oom_control", path, _limit(limit or ""))
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


KMSG = "/dev/kmsg"


def kernel_log_kill(pid: int, kmsg: str = KMSG, fd: int | None = None) -> bool | None:
    """Whether the kernel log says the OOM killer ended ``pid``; None when it cannot be
    read. With ``fd`` (a reader of the log opened earlier), only the records after where
    that reader stands: the log also holds kills of earlier processes whose pid this one
    may have been given again."""
    if fd is not None:
        return _search_log(fd, pid)
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return _search_log(fd, pid)
    finally:
        os.close(fd)


def log_reader_at_end(kmsg: str = KMSG) -> int | None:
    """A reader of the kernel log placed after its last record; None where it cannot be
    read."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        os.close(fd)
        return None
    return fd


def _search_log(fd: int, pid: int) -> bool | None:
    wanted = re.compile(rf"(Killed process {pid} |oom-kill:.*,pid={pid},)")
    while True:
        try:
            record = os.read(fd, 8192)
        except BlockingIOError:
            return False  # read to the end
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                continue  # records overwritten while reading: go on with the next
            return None
        if not record:
            return False
        if wanted.search(record.decode("utf-8", "replace")):
            return True


@dataclass
class OomWatch:
    """One rank's memory cgroup and its kill count when the current trial started."""

    pid: int
    group: MemoryGroup | None
    before: int | None = None
    kmsg: str = KMSG
    # A reader of the kernel log from where it stood when armed, and whether it named the
    # process since.
    _log: int | None = field(default=None, repr=False, compare=False)
    _named: bool = field(default=False, repr=False, compare=False)

    @classmethod
    def of(cls, pid: int) -> OomWatch:
        return cls(pid, memory_group(pid))

    def arm(self) -> None:
        """Take the count a death is judged against (before each trial), and the kernel
        log's end."""
        self.before = self.group.kills() if self.group is not None else None
        self.close()
        self._log, self._named = log_reader_at_end(self.kmsg), False

    def close(self) -> None:
        """Let go of the kernel log's reader."""
        if self._log is not None:
            os.close(self._log)
            self._log = None

    def _logged(self) -> bool | None:
        """Whether the kernel log names this process as killed for memory: since it was
        armed, where it was (a pid may be given again, and the log keeps earlier kills)."""
        if self._named:
            return True
        if self._log is None:
            return kernel_log_kill(self.pid, self.kmsg)
        found = kernel_log_kill(self.pid, fd=self._log)
        self._named = bool(found)
        return found

    def killed(self, exitcode: int | None, log_first: bool = False) -> str | None:
        """Why the process died, when the OOM killer ended it (exit by signal 9); else None.
        ``log_first``: ask the kernel log (which names the process) before the group's
        count, for a process whose group also holds processes the killer may have taken
        since it was armed."""
        if exitcode != -9:
            return None
        by_log = "the kernel's out-of-memory killer ended it (kernel log)"
        if log_first:
            logged = self._logged()
            if logged is not None:
                return by_log if logged else None
        if self.group is not None and self.before is not None:
            now = self.group.kills()
            if now is not None and now > self.before:
                return (f"the kernel's out-of-memory killer ended it ({self.group.describe()}: "
                        f"{now - self.before} process(es) killed for memory)")
        # Asked already where it was asked first (and could not be read).
        if not log_first and self._logged():
            return by_log
        return None
