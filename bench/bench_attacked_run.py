"""A run attacked while it trains, as docs/cluster.md's "Who can reach what" says it may be: a
real `automlperf run` (4 simulated replicas, its store service on a private PostgreSQL
server) and, once its search has trained models, each attack in turn from this process, as a
user on the batch host (no token) or a broken replica (the run's token) would make it.

Measured for each: what the attack got (its answer, how long the service stopped answering),
the run's exit status, the trials charged to live replicas (failed by lease before the
deadline), trials kept with an accuracy that is not a number, the replicas' ends, the
service's peak resident memory (the kernel's high-water mark, every process the primary
started), and whether `automlperf check` verifies the run. To measure the code before a
change, run this file with that code first on the path (``PYTHONPATH=OLD/src``): it uses only
what both have.

Run: python bench/bench_attacked_run.py [--attacks door,nan,...|all] [--work DIR] [--duration S]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from automlperf.store import open_store, schema
from automlperf.store.pgserver import PostgresServer
from automlperf.store.service import wire
from automlperf.store.service.client import RemoteStore

CONFIG = """\
[run]
accelerator = "simulated"
heartbeat_s = 2
lease_timeout_s = 20
[data]
dataset = "digits"
[train]
max_epochs = 2
batch_size = 64
[search]
tpe_startup_trials = 1
candidates_per_generation = 16
[monitor]
interval_s = 5
ceiling_s = 0.3
[simulation]
sustained_ops = 2e10
"""
RETRY_S = 30  # the store's retry time in every process of the run: an outage's end is seen
ATTACKS = ("door", "nan", "int-time", "expire", "squat", "also", "ids", "pg-slots", "token")


class Run:
    """The run under attack, and what is watched while it goes."""

    def __init__(self, work: Path, duration: int, nofile: int | None) -> None:
        self.work = work
        self.dir = work / "run"
        self.pg = PostgresServer(work / "pg")
        self.url = self.pg.start()
        (work / "config.toml").write_text(CONFIG)
        self.env = dict(os.environ, AUTOMLPERF_STORE_RETRY_S=str(RETRY_S))
        cmd = [sys.executable, "-m", "automlperf.cli", "run", "--replicas", "4", "--duration",
               f"{duration}s", "--config", str(work / "config.toml"), "--run-dir",
               str(self.dir), "--store", self.url, "--unofficial"]
        if nofile is not None:  # a site's open-file limit, which the service inherits
            cmd = ["prlimit", f"--nofile={nofile}:{nofile}", *cmd]
        self.log = open(work / "primary.log", "w")
        self.primary = subprocess.Popen(cmd, env=self.env, stdout=self.log,
                                        stderr=subprocess.STDOUT)
        self.nofile = nofile
        self.direct = None
        self.attacked_at = math.inf
        self.peak_kib = 0
        self.services: set[int] = set()
        self._watching = True
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while self._watching:
            pid = self.service_pid()
            if pid:
                self.services.add(pid)
                try:
                    with open(f"/proc/{pid}/status") as f:
                        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
                    self.peak_kib = max(self.peak_kib, hwm)
                except (OSError, StopIteration):
                    pass
            time.sleep(0.2)

    def resume(self) -> None:
        """The primary again, continuing the run (its store's password from the environment,
        as a resubmitted job's)."""
        cmd = [sys.executable, "-m", "automlperf.cli", "run", "--resume", "--run-dir",
               str(self.dir)]
        if self.nofile is not None:
            cmd = ["prlimit", f"--nofile={self.nofile}:{self.nofile}", *cmd]
        self.primary = subprocess.Popen(cmd, env=dict(self.env,
                                                      AUTOMLPERF_STORE_PASSWORD=self.pg.password),
                                        stdout=self.log, stderr=subprocess.STDOUT)

    def service(self) -> dict[str, Any]:
        return json.loads((self.dir / "store-service.json").read_text())

    def service_pid(self) -> int | None:
        try:
            return int(self.service()["pid"])
        except (OSError, ValueError, KeyError):
            return None

    def token(self) -> str:
        return (self.dir / ".store-service.token").read_text().strip()

    def remote(self) -> RemoteStore:
        """The store as a replica reaches it: the run's token, not the primary's."""
        return RemoteStore(self.dir / "store-service.json", retry_s=RETRY_S)

    def trials(self) -> list[Any]:
        if self.direct is None:
            self.direct = open_store(self.url)
        return self.direct.trials(1)

    def wait_trained(self, count: int, limit: float = 900.0) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and self.primary.poll() is None:
            try:
                if sum(t.status == "completed" for t in self.trials()) >= count:
                    return
            except Exception:  # noqa: BLE001 - the run has not made its tables yet
                pass
            time.sleep(1.0)
        raise SystemExit(f"the run trained fewer than {count} trials: see {self.work}")

    def finish(self, limit: float) -> dict[str, Any]:
        try:
            code = self.primary.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.primary.send_signal(signal.SIGTERM)
            code = self.primary.wait(timeout=900)
        self._watching = False
        out: dict[str, Any] = {"exit": code, "service_peak_mib": round(self.peak_kib / 1024, 1),
                               "service_processes": len(self.services)}
        engine = sa.create_engine(self.url)
        with engine.connect() as conn:
            t, r, s = schema.T_TRIALS, schema.T_REPLICAS, schema.T_SEGMENTS
            deadline = conn.execute(sa.select(sa.func.min(s.c.deadline_at))).scalar()
            rows = conn.execute(sa.select(t.c.status, t.c.reason, t.c.best_accuracy,
                                          t.c.finished_at)).all()
            out["trials"] = {st: sum(row.status == st for row in rows)
                             for st in sorted({row.status for row in rows})}
            out["charged"] = sum(row.status == "failed" and "lease" in (row.reason or "")
                                 and (row.finished_at or 0) < (deadline or 0) for row in rows)
            out["not_a_number"] = sum(row.best_accuracy is not None
                                      and not math.isfinite(row.best_accuracy) for row in rows)
            out["replicas"] = [f"{row.status}{': ' + row.reason[:90] if row.reason else ''}"
                               for row in conn.execute(sa.select(r.c.status, r.c.reason)
                                                       .order_by(r.c.id))]
            beats = conn.execute(sa.select(sa.func.max(r.c.last_heartbeat))).scalar()
            # The heartbeats' flush goes on after the attacks (its ticker is alive): how long
            # after the first one the newest heartbeat written is.
            out["heartbeats_written_s_after_attacks"] = None if beats is None else \
                round(beats - self.attacked_at, 1)
        engine.dispose()
        check = subprocess.run([sys.executable, "-m", "automlperf.cli", "check", str(self.dir)],
                               env=dict(self.env, AUTOMLPERF_STORE_PASSWORD=self.pg.password),
                               capture_output=True, text=True, timeout=1800)
        out["check"] = check.returncode
        said = (check.stdout + check.stderr).strip().splitlines()
        out["check_said"] = (said or [""])[-1][:200]
        if self.direct is not None:
            self.direct.close()
        self.pg.stop()
        return out


def timed(fn: Any) -> tuple[Any, float]:
    started = time.monotonic()
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - the attack's answer is what is measured
        value = f"{type(exc).__name__}: {str(exc)[:160]}"
    return value, time.monotonic() - started


class Probe:
    """A client of the run's made before an attack, as a replica's is: while the attack goes
    on, the longest one of its heartbeats (for a live replica) took to be answered, and the
    times of a database read (the service's reader threads)."""

    def __init__(self, run: Run) -> None:
        self.store = run.remote()
        self.replica = next(r.id for r in run.direct.replicas(1) if r.status == "running")
        self.trial = run.trials()[-1].id

    def watch(self, seconds: float) -> tuple[float, list[float]]:
        worst, reads = 0.0, []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            _, took = timed(lambda: self.store.heartbeat(self.replica, time.time(), 20.0))
            worst = max(worst, took)
            reads.append(timed(lambda: self.store.trial(self.trial))[1])
            time.sleep(0.2)
        self.store.close()
        return worst, reads


# --- the attacks: each returns what it got --------------------------------------------------
def door(run: Run, target: int = 1200) -> str:
    """A local user holds ``target`` connections that never greet, from 127.0.0.2 onwards,
    opening a new one for each the service closes; then the service restarts (an
    out-of-memory kill), and every client must connect again."""
    stop = threading.Event()
    opened = [0]

    def hold() -> None:
        held: list[socket.socket] = []
        while not stop.is_set():
            alive = []
            for sock in held:
                try:
                    if sock.recv(1) == b"":
                        sock.close()  # closed by the service: open another
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    sock.close()
                    continue
                alive.append(sock)
            held = alive
            try:
                found = run.service()
            except (OSError, ValueError):
                continue
            while len(held) < target and not stop.is_set():
                sock = socket.socket()
                sock.setblocking(False)
                sock.bind((f"127.0.{opened[0] // 250 % 250}.{2 + opened[0] % 250}", 0))
                sock.connect_ex((found["host"], found["port"]))
                held.append(sock)
                opened[0] += 1
            time.sleep(0.2)
        for sock in held:
            sock.close()

    probe = Probe(run)
    threading.Thread(target=hold, daemon=True).start()
    time.sleep(10)
    os.kill(run.service_pid(), signal.SIGKILL)
    worst, _ = probe.watch(45)
    stop.set()
    return (f"{opened[0]} connections opened to hold {target}, kill -9 of the service while "
            f"held; a replica's heartbeat took at most {worst:.1f} s")


def running_trial(run: Run, limit: float = 300.0) -> Any:
    """A trial running now (a replica may be between two)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = [t for t in run.trials() if t.status == "running"]
        if found:
            return found[-1]
        time.sleep(0.1)
    raise SystemExit("no trial ran for 5 minutes")


def nan(run: Run) -> str:
    running = running_trial(run)
    got, _ = timed(lambda: run.remote().finish_trial(running.id, "completed", time.time(),
                                                     best_accuracy=float("nan")))
    return f"finish_trial(best_accuracy=NaN): {got}"


def int_time(run: Run) -> str:
    rid = next(r.id for r in run.direct.replicas(1) if r.status == "running")
    got, _ = timed(lambda: run.remote().heartbeat(rid, int(time.time()), 20))
    time.sleep(15)
    log = (run.dir / "logs" / "store-service.log").read_text()
    said = "the ticker said so" if "could not be written" in log else "the log said nothing"
    return f"heartbeat(now={int(time.time())}): {'answered' if not isinstance(got, str) else got}; {said}"


def expire(run: Run) -> str:
    got, _ = timed(lambda: run.remote().expire_leases(1, math.inf))
    return f"expire_leases(inf) from a replica's connection: {got}"


def squat(run: Run) -> str:
    """The service dies and a local user takes its port at once, answering every greeting
    with a refusal."""
    probe = Probe(run)
    found = run.service()
    os.kill(int(found["pid"]), signal.SIGKILL)
    listener = None
    for _ in range(200):
        try:
            listener = socket.create_server((found["host"], found["port"]))
            break
        except OSError:
            time.sleep(0.005)
    if listener is None:
        return "could not take the port"
    stop = threading.Event()
    greeted = [0]

    def answer() -> None:
        listener.settimeout(0.5)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(4096)
                    greeted[0] += 1
                    conn.sendall(wire.encode({"e": "store", "m": "this run is over"}))
                except OSError:
                    pass

    threading.Thread(target=answer, daemon=True).start()
    worst, _ = probe.watch(45)
    stop.set()
    listener.close()
    moved = run.service()["port"] != found["port"]
    return (f"port {found['port']} taken; {greeted[0]} greetings answered by the squatter; the "
            f"service {'moved to port ' + str(run.service()['port']) if moved else 'stayed'}; "
            f"a replica's heartbeat took at most {worst:.1f} s")


def also(run: Run) -> str:
    """One call of ~24 MB: a history read asking again for 8 million change numbers."""
    asked = [-1] * 8_000_000 + list(range(1, 10_000))
    probe = Probe(run)
    result: list[Any] = []
    call = threading.Thread(target=lambda: result.append(timed(
        lambda: run.remote().changes(1, 10**12, asked))), daemon=True)
    call.start()
    worst, _ = probe.watch(20)
    call.join(600)
    got, took = result[0] if result else ("no answer in 600 s", 600.0)
    got = f"{len(got.rows)} changes" if hasattr(got, "rows") else got
    return f"answered in {took:.1f} s ({got}); a replica's heartbeat took at most {worst:.1f} s"


def ids(run: Run) -> str:
    """Three calls for 70,000 graphs at once, one per reader thread of the service."""
    probe = Probe(run)
    results: list[Any] = []
    calls = [threading.Thread(target=lambda: results.append(timed(
        lambda: run.remote().graphs(list(range(70_000))))), daemon=True) for _ in range(3)]
    for c in calls:
        c.start()
    _, reads = probe.watch(10)
    for c in calls:
        c.join(600)
    said = results[0][0] if results and isinstance(results[0][0], str) else \
        f"{len(results[0][0])} graphs" if results else "no answer"
    took = max((r[1] for r in results), default=600.0)
    return (f"answered in {took:.1f} s ({said}); meanwhile a trial's read took at most "
            f"{max(reads):.1f} s")


def pg_slots(run: Run) -> str:
    """A local user holds 600 connections to the private PostgreSQL's port that never log
    in, and the service then restarts: it must open its database connections again."""
    probe = Probe(run)
    held = []
    for _ in range(600):
        try:
            held.append(socket.create_connection(("127.0.0.1", run.pg.port), timeout=5))
        except OSError as exc:
            refused = f"{type(exc).__name__}: {exc}"
            break
    else:
        refused = ""
    os.kill(run.service_pid(), signal.SIGKILL)
    worst, _ = probe.watch(45)
    for sock in held:
        sock.close()
    return (f"{len(held)} connections held{' (then ' + refused + ')' if refused else ''}; "
            f"a replica's heartbeat took at most {worst:.1f} s after the service's restart")


def token(run: Run) -> str:
    """The run stops and its token file is left empty (a full disk, a crash before the data
    reached the disk); the run is resumed, and a stranger greets with the empty key."""
    from automlperf.store.base import SCHEMA_VERSION

    old_pid = run.service_pid()
    run.primary.send_signal(signal.SIGTERM)
    run.primary.wait(timeout=900)
    (run.dir / ".store-service.token").write_text("")
    run.resume()
    deadline = time.monotonic() + 600
    while run.service_pid() in (None, old_pid):
        if time.monotonic() > deadline or run.primary.poll() is not None:
            return "the resumed run's service did not start"
        time.sleep(0.2)
    found = run.service()
    sock = socket.create_connection((found["host"], found["port"]), timeout=60)
    ours = wire.nonce()
    sock.sendall(wire.encode({"hello": wire.PROTOCOL, "schema": SCHEMA_VERSION, "nonce": ours}))
    answer = wire.read_frame(sock, wire.MAX_GREETING)[0]
    sock.sendall(wire.encode({"proof": wire.proof("", "client", answer.get("nonce", ""), ours)}))
    last = wire.read_frame(sock, wire.MAX_GREETING)[0]
    if "v" in last:
        # Protocol 4 and later send a call's arguments by name, earlier ones in order.
        sock.sendall(wire.encode({"op": "last_epoch_number",
                                  "a": {} if wire.PROTOCOL >= 4 else []}))
        served = wire.read_frame(sock)[0]
        said = f"let in, and served a call ({served})"
    else:
        said = f"refused ({last.get('m')})"
    sock.close()
    length = len((run.dir / ".store-service.token").read_text().strip())
    return f"resumed over an empty token file (now {length} characters); a stranger with the empty key: {said}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attacks", default="all", help=f"{','.join(ATTACKS)} or all")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--duration", type=int, default=None, help="the run's, s")
    ap.add_argument("--nofile", type=int, default=1200,
                    help="the primary's (and so the service's) open-file limit")
    args = ap.parse_args()
    chosen = ATTACKS if args.attacks == "all" else tuple(args.attacks.split(","))
    work = args.work or Path(tempfile.mkdtemp(prefix="amp-attacked-"))
    work.mkdir(parents=True, exist_ok=True)
    duration = args.duration or 120 + 75 * len(chosen)
    run = Run(work, duration, args.nofile)
    started = time.monotonic()
    run.wait_trained(4)
    attacks = {"door": door, "nan": nan, "int-time": int_time, "expire": expire,
               "squat": squat, "also": also, "ids": ids, "pg-slots": pg_slots, "token": token}
    said = {}
    run.attacked_at = time.time()
    for name in chosen:
        if run.primary.poll() is not None:
            said[name] = "not made: the run had ended"
            continue
        said[name], took = timed(functools.partial(attacks[name], run))
        print(f"{name} ({took:.0f} s): {said[name]}", flush=True)
        time.sleep(5)
    found = run.finish(limit=duration + 900 - (time.monotonic() - started))
    print(json.dumps({"attacks": said, **found}, indent=1))


if __name__ == "__main__":
    main()
