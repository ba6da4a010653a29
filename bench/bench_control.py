"""The control plane at full size: N protocol-faithful simulated replicas (bench/control_load.py)
against the real primary and one real PostgreSQL server on this machine.

``--via service`` (the design): the primary is ``automlperf run --launcher external``, which
starts the run's store service; the replicas, threads in ``--processes`` processes, find it
through the run directory, as ``automlperf worker`` does. ``--via pgbouncer`` (the other
candidate): every replica opens the store through PgBouncer in transaction mode (Debian's
1.18: psycopg's prepared statements off), and the primary's session (the same ``supervise``,
live view and external launcher) does too.

Rates: a heartbeat every 5 s (``--heartbeat-s``, the run's ``heartbeat_s``), an epoch every
~32 s (each node's own, +-5 %), a sample every 30 s stored 5 minutes at a time, a trial every
~``--trial-epochs`` epochs (+-20 %), all replicas started together on a new run.
Measured: records lost or duplicated (epochs, samples, claims: what the replicas were told is
stored against what the store holds),
trials failed by lease while their replica was alive, database connections held (sampled
every second), commits and WAL bytes, latency of each call, bytes read per claim, CPU of
the primary, the service (or PgBouncer), PostgreSQL and the replicas' processes, the
service's memory, the time until every replica had registered, and the load average.

Run: python bench/bench_control.py --replicas 10000 --window 900 [--trial-epochs 50] [--heartbeat-s 5]
     [--via service|pgbouncer] [--processes 4] [--shared-reads] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import psutil
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from control_load import OPS, Rates, Tally, run_replicas  # noqa: E402

CONFIG = """\
[run]
accelerator = "simulated"
heartbeat_s = 5
lease_timeout_s = 60
stop_grace_s = 120
[data]
dataset = "digits"
"""


def pct(values: Any, q: float) -> float | None:
    if not len(values):
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- the replicas' processes ---------------------------------------------------------------------
def pooled_engine_kwargs() -> dict[str, Any]:
    """A store through PgBouncer in transaction mode: no server-side prepared statements
    (PgBouncer 1.18 cannot route them), nothing else changed."""
    kwargs = _ENGINE_KWARGS()
    kwargs["connect_args"] = {**kwargs["connect_args"], "prepare_threshold": None}
    return kwargs


def _pooled() -> None:
    global _ENGINE_KWARGS
    from automlperf.store import connections

    if connections.engine_kwargs is not pooled_engine_kwargs:
        _ENGINE_KWARGS = connections.engine_kwargs
        connections.engine_kwargs = pooled_engine_kwargs  # type: ignore[assignment]


_ENGINE_KWARGS: Any = None


def worker(args: argparse.Namespace) -> None:
    from automlperf.graph import seeds
    from automlperf.store.service.client import RemoteStore, service_file

    run_dir = Path(args.run_dir)
    rates = Rates(trial_epochs=args.trial_epochs, epoch_s=args.epoch_s,
                  heartbeat_s=getattr(args, "heartbeat_s", Rates.heartbeat_s))
    graph_json = seeds.seed("resnet50", 1000, 224, 3).to_json(None)
    if args.via == "service" and args.transport != "socket":
        from grpc_store import GrpcStore

        def opened() -> Any:
            return GrpcStore(service_file(run_dir))
    elif args.via == "service":
        def opened() -> Any:
            return RemoteStore(service_file(run_dir))
    else:
        from automlperf.store.sql import SQLStore

        _pooled()
        url = os.environ["BENCH_POOLED_URL"]

        def opened() -> Any:
            return SQLStore(url)
    tally = run_replicas(opened, 1, list(range(args.first, args.last)), rates, graph_json,
                         shared_reads=args.shared_reads, threads=args.threads)
    tally.lock = None  # type: ignore[assignment]
    with open(args.out, "wb") as f:
        pickle.dump(tally, f)


def start_replicas(args: argparse.Namespace, run_dir: Path, env: dict[str, str], stem: Path,
                   via: str = "service", transport: str = "socket"
                   ) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    """``args.replicas`` simulated replicas in ``args.processes`` processes of this bench's
    ``--worker``, and the files where each process writes what its replicas saw."""
    n = args.replicas
    procs, outs = [], []
    bounds = [round(i * n / args.processes) for i in range(args.processes + 1)]
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        out = stem.with_name(f"{stem.name}-{k}.pickle")
        outs.append(out)
        procs.append(subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", "--run-dir", str(run_dir),
             "--first", str(a), "--last", str(b), "--trial-epochs", str(args.trial_epochs),
             "--epoch-s", str(args.epoch_s),
             "--heartbeat-s", str(getattr(args, "heartbeat_s", Rates.heartbeat_s)),
             "--via", via, "--threads", str(args.threads),
             "--transport", transport, "--out", str(out)]
            + (["--shared-reads"] if getattr(args, "shared_reads", False) else []), env=env))
    return procs, outs


def seen(outs: list[Path]) -> list[Tally]:
    """What the replicas' processes wrote (start_replicas)."""
    tallies: list[Tally] = []
    for out in outs:
        with open(out, "rb") as f:
            tallies.append(pickle.load(f))
    return tallies


# --- PgBouncer, and the primary's session through it ---------------------------------------------
def start_pgbouncer(work: Path, server: Any, clients: int) -> tuple[subprocess.Popen[bytes], str]:
    port = server.port + 1
    folder = work / "pgbouncer"
    folder.mkdir(exist_ok=True)
    (folder / "users.txt").write_text(f'"automlperf" "{server.password}"\n')
    (folder / "pgbouncer.ini").write_text(f"""[databases]
* = host=127.0.0.1 port={server.port}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
auth_type = scram-sha-256
auth_file = {folder / 'users.txt'}
pool_mode = transaction
max_client_conn = {clients + 100}
default_pool_size = 16
max_db_connections = 16
logfile = {folder / 'pgbouncer.log'}
unix_socket_dir =
ignore_startup_parameters = extra_float_digits,options
""")
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, clients + 1000)), hard))
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    cmd = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
        for f in folder.iterdir():
            shutil.chown(f, "postgres")
        # runuser's login session puts the open-file limit back to 1,024 (PgBouncer logs
        # it at start): without prlimit it would take at most about a thousand replicas.
        cmd = ["runuser", "-u", "postgres", "--", "prlimit", f"--nofile={hard}:{hard}", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    time.sleep(1.0)
    url = f"postgresql+psycopg://automlperf:{server.password}@127.0.0.1:{port}/automlperf"
    return proc, url


def primary_sql(args: argparse.Namespace) -> None:
    """The primary's session with every store call through PgBouncer: supervise (its live
    view, lease expiry, the external launcher's watch) until the deadline."""
    import io

    from rich.console import Console

    from automlperf.config import Config
    from automlperf.runner import session as steps
    from automlperf.runner.launch import ExternalLauncher
    from automlperf.store import open_store
    from automlperf.store.feed import ReplicaFeed
    from automlperf.store.rundir import RunDir, write_atomic
    from automlperf.store.sql import SQLStore

    _pooled()
    url = os.environ["BENCH_POOLED_URL"]
    rd = RunDir(Path(args.run_dir))
    rd.path.mkdir(parents=True, exist_ok=True)
    config = Config.load(Path(args.config))
    write_atomic(rd.config, config.to_toml())
    open_store(os.environ["BENCH_STORE_URL"], create=True).close()
    store = SQLStore(url)
    now = time.time()
    run_id = store.create_run("bench", config.model_dump(mode="json"), {}, config.run.duration_s, now)
    seg = store.start_segment(run_id, now, now + config.run.duration_s)
    rd.write_meta(run_id, None, "bench")

    class Launcher(ExternalLauncher):
        def start(self) -> None:
            self.run_id, self.store = run_id, store
            self.segment = store.segments(run_id)[-1]
            self.feed = ReplicaFeed(store, run_id)
            self.latest = {}

    launcher = Launcher(rd.path, args.replicas, None, lease_timeout_s=60.0)
    launcher.start()
    session = steps.Session(rd, store, run_id, config, seg, now, now + config.run.duration_s, 0.0)
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    watch = steps.supervise(session, launcher, console)
    store.end_segment(run_id, seg, min(time.time(), session.deadline_at))
    deadline = time.monotonic() + 300
    while "up" in launcher.states() and time.monotonic() < deadline:
        time.sleep(1.0)
    print(watch.state)


# --- measuring -----------------------------------------------------------------------------------
class Watch(threading.Thread):
    """Every second: connections held, commits, WAL bytes, the processes' CPU and memory."""

    def __init__(self, url: str, server_dir: Path) -> None:
        super().__init__(daemon=True)
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.postmaster = int((server_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
        self.stop = threading.Event()
        self.held: list[int] = []
        self.samples: list[dict[str, Any]] = []
        self.pids: dict[str, set[int]] = {}
        # The service's calls' times as it wrote them every minute, by when it wrote them.
        self.times: dict[float, dict[str, Any]] = {}

    def run(self) -> None:
        with self.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            while not self.stop.wait(1.0):
                self.held.append(int(conn.execute(sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                    " AND pid <> pg_backend_pid()")).scalar()))
                commits = conn.execute(sa.text(
                    "SELECT sum(xact_commit) FROM pg_stat_database")).scalar()
                wal = conn.execute(sa.text("SELECT wal_bytes FROM pg_stat_wal")).scalar()
                self.samples.append({"t": time.time(), "commits": int(commits), "wal": int(wal),
                                     "load": os.getloadavg()[0], "cpu": self.cpu()})

    def cpu(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for group, pids in self.pids.items():
            total = system = 0.0
            for pid in list(pids):
                try:
                    t = psutil.Process(pid).cpu_times()
                    total += t.user + t.system
                    system += t.system
                except psutil.Error:
                    pass
            out[group] = total
            # The kernel's part: on loopback a socket write also runs the receiving side's TCP.
            out[f"{group}_system"] = system
        try:
            pm = psutil.Process(self.postmaster)
            out["postgresql"] = sum(p.cpu_times().user + p.cpu_times().system
                                    for p in [pm, *pm.children()] if p.is_running())
        except psutil.Error:
            pass
        return out


def rss_mib(pid: int | None) -> float | None:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20 if pid else None
    except psutil.Error:
        return None


def options(**given: Any) -> argparse.Namespace:
    """The bench's options, as the command line's defaults with ``given`` changed."""
    return argparse.Namespace(**{**vars(parser().parse_args([])), **given})


def run(args: argparse.Namespace,
        hook: Callable[[Path, int | None, str], None] | None = None) -> dict[str, Any]:
    """The bench. ``hook`` is called every second with the run directory, the service's pid
    and the database's URL (a test's faults)."""
    from automlperf.store.pgserver import PostgresServer
    from automlperf.store.service.client import service_file

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-control-"))
    work.mkdir(parents=True, exist_ok=True)
    n = args.replicas
    run_dir = work / f"run{n}"
    shutil.rmtree(run_dir, ignore_errors=True)
    # PgBouncer reaches the server over TCP; the service, as a run's, through its socket.
    server = PostgresServer(work / "postgres", host="127.0.0.1" if args.via == "pgbouncer" else None)
    url = server.start()
    config = work / "control.toml"
    config.write_text(CONFIG.replace("[run]\n", f"[run]\nduration_s = {int(args.window)}\n")
                      .replace("heartbeat_s = 5", f"heartbeat_s = {args.heartbeat_s:g}"))
    env = dict(os.environ, BENCH_STORE_URL=url)
    bouncer = None
    duration = int(args.window)
    me = [sys.executable, str(Path(__file__).resolve())]
    t0 = time.time()
    watch = Watch(url, work / "postgres")
    try:
        if args.via == "service":
            primary = subprocess.Popen(
                [sys.executable, "-m", "automlperf.cli", "run", "--launcher", "external",
                 "--replicas", str(n), "--duration", f"{duration}s", "--config", str(config),
                 "--run-dir", str(run_dir), "--store", url], env=env,
                stdout=open(work / f"primary{n}.log", "w"), stderr=subprocess.STDOUT)
            ready = lambda: service_file(run_dir).exists() and (run_dir / "run.json").exists()  # noqa: E731
        else:
            bouncer, pooled = start_pgbouncer(work, server, n)
            env["BENCH_POOLED_URL"] = pooled
            primary = subprocess.Popen(me + ["--primary-sql", "--run-dir", str(run_dir),
                                             "--config", str(config), "--replicas", str(n)],
                                       env=env,
                                       stdout=open(work / f"primary{n}.log", "w"),
                                       stderr=subprocess.STDOUT)
            ready = lambda: (run_dir / "run.json").exists()  # noqa: E731
        while not ready():
            if primary.poll() is not None:
                raise SystemExit(f"the primary exited: {(work / f'primary{n}.log').read_text()[-3000:]}")
            time.sleep(0.05)
        procs, outs = start_replicas(args, run_dir, env, work / f"tally{n}", args.via,
                                     getattr(args, "transport", "socket"))
        watch.pids = {"primary": {primary.pid}, "replicas": {p.pid for p in procs}}
        if bouncer is not None:
            watch.pids["pgbouncer"] = {bouncer.pid, *(c.pid for c in psutil.Process(bouncer.pid).children())}
        watch.start()
        service_pid = None
        service_rss: list[float] = []
        while primary.poll() is None:
            if args.via == "service" and service_file(run_dir).exists():
                try:
                    service_pid = json.loads(service_file(run_dir).read_text())["pid"]
                    watch.pids["service"] = {service_pid}
                    found = rss_mib(service_pid)
                    if found:
                        service_rss.append(found)
                except (OSError, ValueError):
                    pass
            if hook is not None:
                hook(run_dir, service_pid, url)
            snapshot(run_dir, watch.times)
            time.sleep(1.0)
        for p in procs:
            p.wait()
        watch.stop.set()
        watch.join()
        return figures(args, url, seen(outs), watch, t0, service_rss, work, run_dir)
    finally:
        if bouncer is not None:
            bouncer.terminate()
            bouncer.wait()
        server.stop()


def figures(args: argparse.Namespace, url: str, tallies: list[Tally], watch: Watch, t0: float,
            service_rss: list[float], work: Path, run_dir: Path) -> dict[str, Any]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        (seg_start, deadline, ended) = conn.execute(sa.text(
            "SELECT started_at, deadline_at, ended_at FROM amp_segments WHERE run_id = 1")).one()
        stored_epochs = {(int(a), int(b)) for a, b in conn.execute(sa.text(
            "SELECT trial_id, epoch FROM amp_epochs WHERE run_id = 1"))}
        sample_rows = conn.execute(sa.text(
            "SELECT node, t, count(*) FROM amp_samples WHERE run_id = 1 GROUP BY node, t")).all()
        trials = {int(i): (s, r) for i, s, r in conn.execute(sa.text(
            "SELECT id, status, reason FROM amp_trials WHERE run_id = 1"))}
        replicas = int(conn.execute(sa.text(
            "SELECT count(*) FROM amp_replicas WHERE run_id = 1")).scalar())
    engine.dispose()
    acked_epochs = [e for t in tallies for e in t.epochs]
    acked_samples = [s for t in tallies for s in t.samples]
    acked_claims = [c for t in tallies for c in t.claims]
    stored_samples = {(node, float(t)): int(c) for node, t, c in sample_rows}
    expired = [i for i, (s, r) in trials.items() if "heart-beating" in (r or "")]
    latency = {op: [x for t in tallies for x in t.latency[op]] for op in OPS}
    registered = sorted(x for t in tallies for x in t.registered)
    cycles = sorted(c for t in tallies for c in t.cycles)
    third = max(1, len(cycles) // 3)

    def mean(xs: list[float]) -> float | None:
        return statistics.fmean(xs) if xs else None

    window = [s for s in watch.samples if seg_start <= s["t"] <= deadline]
    span = window[-1]["t"] - window[0]["t"] if len(window) > 1 else 0.0

    def share(group: str) -> float | None:
        if span <= 0 or group not in window[0]["cpu"] or group not in window[-1]["cpu"]:
            return None
        return (window[-1]["cpu"][group] - window[0]["cpu"][group]) / span

    return {
        "replicas": args.replicas, "via": args.via, "window_s": args.window,
        "trial_epochs": args.trial_epochs, "processes": args.processes,
        "threads": args.threads,
        "shared_reads": args.shared_reads, "registered": len(registered),
        "replica_rows": replicas,
        "all_registered_s": registered[-1] - seg_start if registered else None,
        "registered_median_s": registered[len(registered) // 2] - seg_start if registered else None,
        "epochs": len(acked_epochs), "epochs_per_s": len(acked_epochs) / max(1.0, deadline - seg_start),
        "lost": {"epochs": len(set(acked_epochs) - stored_epochs),
                 "samples": len(set(acked_samples) - set(stored_samples)),
                 "claims": len(set(acked_claims) - set(trials))},
        "duplicated": {"epochs": len(acked_epochs) - len(set(acked_epochs)),
                       "samples": sum(c - 1 for c in stored_samples.values() if c > 1)
                       + len(acked_samples) - len(set(acked_samples)),
                       "claims": len(acked_claims) - len(set(acked_claims))},
        "unacknowledged_in_store": {"epochs": len(stored_epochs - set(acked_epochs)),
                                    "samples": len(set(stored_samples) - set(acked_samples)),
                                    "claims": len(set(trials) - set(acked_claims))},
        "expired_by_lease": len(expired),
        "charged_while_alive": sum(len(t.charged) for t in tallies),
        "claim_conflicts": sum(t.conflicts for t in tallies),
        "errors": dict(sum((t.errors for t in tallies), start=__import__("collections").Counter())),
        "connections_max": max(watch.held, default=None),
        "connections_median": statistics.median(watch.held) if watch.held else None,
        "commits_per_s": (window[-1]["commits"] - window[0]["commits"]) / span if span else None,
        "wal_mb_per_s": (window[-1]["wal"] - window[0]["wal"]) / span / 1e6 if span else None,
        "latency_ms": {op: {"n": len(v), "p50": _ms(pct(v, 0.5)), "p99": _ms(pct(v, 0.99)),
                            "max": _ms(max(v, default=None))} for op, v in latency.items()},
        # How late the simulated replicas' events ran behind their schedule: the hosting's own
        # cost. Large lags would mean heartbeats and epochs slower than a node's, which the
        # latencies alone would not show.
        "schedule_lag_ms": {kind: {"n": len(v), "p50": _ms(pct(v, 0.5)), "p99": _ms(pct(v, 0.99)),
                                   "max": _ms(max(v, default=None))}
                            for kind, v in ((k, [x for t in tallies for x in t.lag[k]])
                                            for k in ("start", "trial", "epoch", "beat", "sample"))},
        "bytes_per_claim": {"claims": len(cycles),
                            "mean": mean([c[3] for c in cycles]),
                            "history_mean": mean([c[1] for c in cycles]),
                            "graphs_mean": mean([c[2] for c in cycles]),
                            "first_third": mean([c[3] for c in cycles[:third]]),
                            "last_third": mean([c[3] for c in cycles[-third:]]),
                            "max": max((c[3] for c in cycles), default=None)},
        "cpu_share": {g: share(g) for g in ("primary", "service", "service_system", "pgbouncer",
                                            "postgresql", "replicas")},
        "service_rss_mib_max": max(service_rss, default=None),
        "load_average": {"min": min((s["load"] for s in window), default=None),
                         "max": max((s["load"] for s in window), default=None),
                         "mean": mean([s["load"] for s in window])},
        "segment_ended": ended is not None, "trials": len(trials), "run_dir": str(run_dir),
        **service_side(run_dir, watch, (seg_start + (deadline - seg_start) / 3, deadline)),
    }


def snapshot(run_dir: Path, kept: dict[float, dict[str, Any]]) -> None:
    """Keep the service's calls' times each time it writes them anew."""
    try:
        found = json.loads((run_dir / "logs" / "store-service-calls.json").read_text())
        kept.setdefault(float(found["written"]), found)
    except (OSError, ValueError, KeyError):
        pass


def service_side(run_dir: Path, watch: Watch, steady: tuple[float, float] = (0.0, 0.0)
                 ) -> dict[str, Any]:
    """The service's own time per call by kind (store/service/latency.py): over its whole
    life (what it wrote as it stopped), and in the steady state, between the first of its
    minutely writes after ``steady[0]`` and the last before ``steady[1]`` (the start's burst
    of registrations and first claims, and the end's, left out), with its CPU in each."""
    from automlperf.store.service.latency import CallTimes

    snapshot(run_dir, watch.times)
    try:
        last = json.loads((run_dir / "logs" / "store-service-calls.json").read_text())
    except (OSError, ValueError):
        return {"service_ms": None, "service_cpu_s_per_1000_calls": None}
    calls = last["calls"]
    cpu = max((s["cpu"].get("service", 0.0) for s in watch.samples), default=0.0)
    n = sum(row["n"] for row in calls.values())
    out: dict[str, Any] = {"service_ms": calls, "service_calls": n,
                           "service_cpu_s_per_1000_calls": round(1000 * cpu / n, 3) if n else None}
    inside = sorted(t for t in watch.times if steady[0] <= t <= steady[1])
    if len(inside) >= 2:
        a, b = watch.times[inside[0]], watch.times[inside[-1]]
        between = CallTimes.between(a["state"], b["state"])
        span = inside[-1] - inside[0]

        def service_cpu(t: float, part: str = "service") -> float:
            near = min(watch.samples, key=lambda s: abs(s["t"] - t))
            return float(near["cpu"].get(part, 0.0))

        used = service_cpu(inside[-1]) - service_cpu(inside[0])
        kernel = service_cpu(inside[-1], "service_system") - service_cpu(inside[0], "service_system")
        calls_in = sum(between.count.values())
        out["steady"] = {"from": inside[0], "to": inside[-1], "span_s": round(span, 1),
                         "calls": calls_in, "calls_per_s": round(calls_in / span, 1),
                         "service_cpu_share": round(used / span, 4),
                         "service_system_share": round(kernel / span, 4),
                         "cpu_s_per_1000_calls": round(1000 * used / calls_in, 3)
                         if calls_in else None,
                         "service_ms": between.summary()}
    return out


def _ms(value: float | None) -> float | None:
    return None if value is None else round(1000 * value, 2)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=10_000)
    ap.add_argument("--window", type=float, default=900.0, help="the session's length, s")
    ap.add_argument("--trial-epochs", type=int, default=50)
    ap.add_argument("--epoch-s", type=float, default=32.0)
    ap.add_argument("--heartbeat-s", type=float, default=Rates.heartbeat_s,
                    help="each replica's heartbeat period (run.heartbeat_s), s")
    ap.add_argument("--via", choices=("service", "pgbouncer"), default="service")
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--threads", type=int, default=48,
                    help="threads per host process making the replicas' blocking calls (the "
                         "load generator's capacity: too few show up as schedule lag)")
    ap.add_argument("--shared-reads", action="store_true",
                    help="the replicas of a process read the history's changes once between "
                         "them (as hosted replicas do), not each its own")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--transport", default="socket", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--primary-sql", action="store_true", help=argparse.SUPPRESS)
    for name, kind in (("--first", int), ("--last", int), ("--run-dir", str), ("--out", str),
                       ("--config", str)):
        ap.add_argument(name, type=kind, help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.worker:
        return worker(args)
    if args.primary_sql:
        return primary_sql(args)
    found = run(args)
    print(json.dumps({"bench": "control", **found}))
    return None


if __name__ == "__main__":
    main()
