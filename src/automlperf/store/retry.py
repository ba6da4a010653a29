"""How a store rides out an outage (a server restarting, a network hiccup, a database locked):
the limit every process of a run waits (``RETRY_ENV``), the one notice a long outage gets,
which failures are worth waiting out and which are said at once (a full disk, a read-only
file system), and :func:`retrying`, which wraps a store's calls with all of it. The store
service's client (store/service/client.py) waits out the service the same way."""

from __future__ import annotations

import errno
import functools
import logging
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from automlperf.store.base import BACKOFF_MAX_S, StoreError
from automlperf.store.urls import redact

R = TypeVar("R")

# How long a store rides out a server restart or a network hiccup before giving up; the
# environment variable overrides it for every process of a run (replicas inherit it).
RETRY_S = 120.0
RETRY_ENV = "AUTOMLPERF_STORE_RETRY_S"
# A call still failing after this long says so once, rather than waiting out retry_s in
# silence; shorter hiccups (a lock, a reconnect) pass unremarked.
OUTAGE_NOTICE_S = 5.0
# Less room than this beside a SQLite store whose write failed: its file system is full.
FULL_BELOW_BYTES = 1 << 20
log = logging.getLogger("automlperf.store")


def configured_retry_s() -> float:
    """How long a store waits out an outage: ``RETRY_ENV``'s seconds, or ``RETRY_S``."""
    value = os.environ.get(RETRY_ENV)
    if not value:
        return RETRY_S
    try:
        seconds = float(value)
    except ValueError:
        raise StoreError(f"{RETRY_ENV}={value!r} is not a number of seconds: unset it or give "
                         "one such as 120") from None
    if not seconds > 0:
        raise StoreError(f"{RETRY_ENV}={value!r} must be more than 0 seconds")
    return seconds


def one_line(error: BaseException | None) -> str:
    """An error as one line: a driver's message may run over lines (psycopg adds a hint)."""
    return " ".join(str(error).split())[:200]


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, IntegrityError):
        return False
    if isinstance(exc, OperationalError):
        # psycopg says a statement has too many parameters (over 65,535) as an operational
        # error, and SQLite one past its variables (32,766) too: no wait makes either pass.
        said = str(exc.orig)
        return "number of parameters" not in said and "too many SQL variables" not in said
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def _sqlite_folder(url: str) -> str | None:
    """The folder of a SQLite store's file; None for other stores."""
    if not url.startswith("sqlite:///"):
        return None
    return os.path.dirname(url[len("sqlite:///"):]) or "."


def _read_only_file(url: str) -> str | None:
    """The folder of a SQLite store's file, when its file system has turned read-only."""
    folder = _sqlite_folder(url)
    if folder is None:
        return None
    # A probe write: a file system turned read-only by an error (ext4's errors=remount-ro)
    # may still call itself read-write to statvfs() and access().
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe-")
    except OSError as exc:
        return folder if exc.errno == errno.EROFS else None
    os.close(fd)
    os.unlink(probe)
    return None


def full_file_system(url: str) -> str | None:
    """The folder of a SQLite store's file, when its file system has (almost) no room left.
    SQLite reports a write into a full file system as "disk I/O error" as often as
    "database or disk is full" (its WAL and shared-memory files), and waiting frees nothing."""
    folder = _sqlite_folder(url)
    if folder is None:
        return None
    try:
        found = os.statvfs(folder)
    except OSError:
        return None
    return folder if found.f_bavail * found.f_frsize < FULL_BELOW_BYTES else None


def _disk_full(exc: DBAPIError) -> bool:
    """SQLite's SQLITE_FULL, PostgreSQL's disk_full (53100): waiting would not free space."""
    return getattr(exc.orig, "sqlstate", None) == "53100" or any(
        words in str(exc.orig) for words in ("database or disk is full",
                                             "No space left on device"))


def _waiting_advice(url: str) -> str:
    if url.startswith("sqlite"):
        return "check that no other program holds its file locked and that its folder is reachable"
    return "check that its server is running and the URL is right"


class Retried(Protocol):
    """What :func:`retrying` reads and sets on the store whose method it wraps."""

    url: str
    retry_s: float
    # When a call last succeeded after the store had failed (time.time(); 0: never).
    restored_at: float
    # Whether the current outage has been announced.
    outage_said: bool


# One notice per store and outage, whichever of a process's threads waits first.
_notice_lock = threading.Lock()
# Per thread: whether the call under way is a second try (see ``retried``).
_attempt = threading.local()


def retrying(method: Callable[..., R]) -> Callable[..., R]:
    """Retry a store method on transient failures (server restarting, network hiccup,
    database locked) with exponential back-off, for up to the store's ``retry_s``. A call
    that succeeds after failing sets the store's ``restored_at``."""

    @functools.wraps(method)
    def wrapper(self: Retried, *args: Any, **kwargs: Any) -> R:
        started = time.monotonic()
        delay, deadline = 0.1, started + self.retry_s
        failed = False
        outer = getattr(_attempt, "retried", None)
        while True:
            _attempt.retried = failed or bool(outer)
            try:
                result = method(self, *args, **kwargs)
            except DBAPIError as exc:
                if _disk_full(exc) or full_file_system(self.url) is not None:
                    raise StoreError(f"the disk of store {redact(self.url)} is full "
                                     f"({one_line(exc.orig)}): free space "
                                     "there") from None
                read_only = _read_only_file(self.url)
                if read_only is not None:
                    # Waiting does not make a file system writable again: fail now, in one
                    # line, rather than after retry_s.
                    raise StoreError(f"store {redact(self.url)} cannot be written: {read_only} "
                                     f"is on a read-only file system ({one_line(exc.orig)[:100]}); "
                                     "make it writable again") from None
                if not _transient(exc):
                    raise
                failed = True
                if time.monotonic() - started >= OUTAGE_NOTICE_S:
                    with _notice_lock:
                        first, self.outage_said = not self.outage_said, True
                    if first:
                        log.warning("store %s unavailable (%s); retrying for up to %.0f s "
                                    "(%s sets how long)", redact(self.url),
                                    one_line(exc.orig), self.retry_s, RETRY_ENV)
                if time.monotonic() + delay > deadline:
                    raise StoreError(f"store {redact(self.url)} unreachable for "
                                     f"{self.retry_s:.0f} s: {one_line(exc.orig)}; "
                                     f"{_waiting_advice(self.url)} ({RETRY_ENV} sets how "
                                     "long to wait)") from None
                # Jittered: the replicas of a run that lost the store together do not all
                # come back at the same instant.
                time.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, BACKOFF_MAX_S)
            else:
                if failed:
                    self.restored_at = time.time()
                    with _notice_lock:
                        self.outage_said = False
                return result
            finally:
                _attempt.retried = outer

    return wrapper


def retried() -> bool:
    """Whether the store call under way is a second try, whose first may have committed
    unseen (a write then checks before it writes again)."""
    return bool(getattr(_attempt, "retried", False))
