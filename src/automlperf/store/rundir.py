"""The run directory: what is where, and its identity file run.json."""

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from automlperf.store.base import SCHEMA_VERSION
from automlperf.store.urls import resolve_store_url, strip_password
from automlperf.errors import UserError

RUN_FILE = "run.json"
# Errors of a run directory that takes no more writes (its file system turned read-only,
# filled up or failed): waiting inside the run does not help, resuming once it is fixed does.
UNWRITABLE = (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EIO)


class RunDirError(UserError, ValueError):
    """Not a usable run directory; the message says what to do."""


def write_atomic(path: Path, text: str, mode: int = 0o666) -> None:
    """Write a file so that a reader never sees half of it, and it is on disk when this
    returns: a file system that fails later (a disk error turning it read-only) would
    otherwise keep the rename but not the text, an empty run.json for instance. ``mode``
    (less the umask) from its creation: a secret is never readable by others, even
    half-written. What stood at ``path`` (a link, a file of another mode) is replaced, not
    written through."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)  # a crashed writer's, or something planted there
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
        raise
    _fsync(path.parent)  # the rename itself


def make_durable(path: Path | str) -> None:
    """Put a file another process wrote (and renamed into place) on disk, before the store
    records it: fsync applies to the file, whoever wrote it."""
    _fsync(path)
    _fsync(Path(path).parent)


def _fsync(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def config(self) -> Path:
        return self.path / "config.toml"

    @property
    def system(self) -> Path:
        return self.path / "system.json"

    @property
    def result(self) -> Path:
        return self.path / "result.json"

    @property
    def report(self) -> Path:
        return self.path / "report.html"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def monitor(self) -> Path:
        return self.path / "monitor"

    def trial(self, trial_id: int) -> Path:
        return self.path / "trials" / str(trial_id)

    def meta(self) -> dict[str, Any]:
        try:
            data = json.loads((self.path / RUN_FILE).read_text())
        except FileNotFoundError:
            raise RunDirError(f"{self.path} is not a run directory ({RUN_FILE} is missing); "
                              "start a run with `automlperf run --run-dir DIR`") from None
        except json.JSONDecodeError as exc:
            raise RunDirError(f"{self.path / RUN_FILE} is damaged ({exc})") from None
        if data.get("schema_version") != SCHEMA_VERSION:
            raise RunDirError(f"{self.path} was written with run schema version "
                              f"{data.get('schema_version')}; this automlperf reads version "
                              f"{SCHEMA_VERSION}. Use the version that wrote it")
        return data

    def write_meta(self, run_id: int, store_url: str | None, name: str) -> None:
        data = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "name": name,
                "created_at": time.time(),
                "store": strip_password(store_url) if store_url else None}
        write_atomic(self.path / RUN_FILE, json.dumps(data, indent=1) + "\n")

    def store_url(self, explicit: str | None = None) -> str | None:
        """The store to open: the one given, else the one the run was started with (its
        password from the environment), else the directory's own SQLite file."""
        url = resolve_store_url(explicit)
        if url:
            return url
        recorded = self.meta().get("store")
        return resolve_store_url(recorded) if recorded else None
