"""The run's store service as a process: the primary starts it before the replicas (with a new
token), starts it again at once if it dies (on the same port, or another where something
took it), and stops it after the run's last write; its clients find it through the run
directory (store/service/client.py). The process itself is store/service/__main__.py
(``python -m automlperf.store.service``)."""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from automlperf.store.base import StoreError
from automlperf.store.rundir import write_atomic
from automlperf.store.service.client import SERVICE_FILE, TOKEN_FILE
from automlperf.store.urls import STORE_ENV

log = logging.getLogger("automlperf.store")
# How long a starting service may take to listen (it opens the database first, which may be
# riding out an outage of its own).
START_S = 180.0
# Where, in the run's logs folder, the service writes its calls' times by kind.
CALLS_FILE = "store-service-calls.json"


def new_token(path: Path) -> str:
    """A new token for the run's service at ``path``, readable by its owner only from the
    moment it exists and never seen half-written; whatever was there (a previous session's
    token, an empty file a full disk left, a file someone else planted) is replaced."""
    token = secrets.token_urlsafe(24)
    write_atomic(path, token + "\n", mode=0o600)
    return token


# The address (or name) other nodes reach the batch host by, where its own name does not
# lead them there (several networks): the store service is advertised and listens there.
ADDRESS_ENV = "AUTOMLPERF_SERVICE_ADDRESS"


def advertised_host(listen_all: bool) -> str:
    if not listen_all:
        return "127.0.0.1"
    return os.environ.get(ADDRESS_ENV) or socket.getfqdn() or socket.gethostname()


class ServiceProcess:
    """The store service of the run in ``run_dir``, on the database at ``url``; reachable
    from other nodes with ``listen_all``."""

    def __init__(self, run_dir: Path, url: str, listen_all: bool = False,
                 replicas: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.url = url
        self.listen_all = listen_all
        self.replicas = replicas
        # The primary's own token, for the calls only it makes: given to the service through
        # a pipe, never written to a file or an environment the replicas could read.
        self.primary_token = secrets.token_urlsafe(24)
        self.file = self.run_dir / SERVICE_FILE
        self.token_file = self.run_dir / TOKEN_FILE
        self.logs = self.run_dir / "logs"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._stopping = threading.Event()
        self._watch: threading.Thread | None = None

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        new_token(self.token_file)  # each session its own: a token left behind proves nothing
        self.file.unlink(missing_ok=True)  # a previous session's
        self._launch()
        self._watch = threading.Thread(target=self._watcher, name="store-service-watch",
                                       daemon=True)
        self._watch.start()

    def _launch(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "automlperf.store.service", "--file", str(self.file),
               "--token-file", str(self.token_file), "--host", advertised_host(self.listen_all),
               "--port", str(self.port), "--calls-file", str(self.logs / CALLS_FILE),
               "--primary-token-stdin"]
        if self.listen_all:
            cmd.append("--listen-all")
        if self.restarts:
            cmd.append("--restarted")
        if self.replicas is not None:
            cmd += ["--replicas", str(self.replicas)]
        # The URL, password included, through the environment: not on a command line.
        env = dict(os.environ, **{STORE_ENV: self.url})
        with open(self.logs / "store-service.log", "ab") as out:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            assert proc.stdin is not None
            proc.stdin.write(self.primary_token.encode() + b"\n")
            proc.stdin.close()
        except OSError:
            pass  # it died at once: said below, with its log
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise StoreError(f"the store service did not start (exit status "
                                 f"{proc.returncode}): see {self.logs / 'store-service.log'}")
            try:
                found = json.loads(self.file.read_text())
                if found.get("pid") == proc.pid:
                    self.port = int(found["port"])
                    self.proc = proc
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        raise StoreError(f"the store service did not listen within {START_S:.0f} s: see "
                         f"{self.logs / 'store-service.log'}")

    def _watcher(self) -> None:
        """Start the service again whenever it dies before it is stopped: its clients wait
        for it (they retry), and lose nothing they were told is stored."""
        while not self._stopping.is_set():
            proc = self.proc
            if proc is None:
                return
            code = proc.wait()
            if self._stopping.is_set():
                return
            self.restarts += 1
            log.warning("the store service exited (status %s); starting it again", code)
            failed = 0
            while not self._stopping.is_set():
                try:
                    self._launch()
                    break
                except Exception as exc:  # noqa: BLE001 - the run needs it: keep trying
                    failed += 1
                    if failed % 60 == 1:
                        log.warning("%s: %s; trying again every second (%d tries)",
                                    type(exc).__name__, exc, failed)
                    time.sleep(1.0)

    def stop(self, timeout_s: float = 120.0) -> None:
        """Stop the service once it has written what it holds."""
        self._stopping.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._watch is not None:
            self._watch.join(timeout=10)
        self.file.unlink(missing_ok=True)
