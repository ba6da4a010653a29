"""check / report / result at the size of a long run, and the simulated benchmark end to end:
on a SLURM cluster of slurmd daemons, and hosted (thousands of replicas as threads).

Part 2 (size). bench/large_run.py generates a run of ``--nodes`` replicas (default: 512 nodes,
10,000 trials, 500,000 epochs; the 10,000-node hour: ``--nodes 10000 --trials 22500 --epochs
1100000``) through the store on a private PostgreSQL server. On it: writing result.json,
``check``, the report, and ``compare``, each timed once (wall, and CPU with its worker
processes) in a process of its own with its peak resident memory; the report's and the
result's sizes. Several ``--work`` directories are measured side by side with
``--also DIR``.

Part 3 (``--slurm``), part 4 (``--hosted``) and ``--real-run``: see their functions.

The control plane under load (thousands of replicas' calls at a node's rates) is
bench/bench_control.py.

Run: python bench/bench_scale.py [--trials 10000] [--epochs 500000] [--nodes 512] [--work DIR]
     python bench/bench_scale.py --nodes 10000 --duration 3600 --node-ops 1e15 (the timed shape)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_launch import startup_parts  # noqa: E402


def connections_held(url: str, database: str, stop: threading.Event, out: list[int]) -> None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    while not stop.wait(0.5):
        with engine.connect() as conn:
            out.append(int(conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = :d "
                "AND pid <> pg_backend_pid()"), {"d": database}).scalar()))
    engine.dispose()


def real_run(replicas: int, duration: str, work: Path) -> dict[str, Any]:
    """A real run of the built-in task (training, search, TPE, monitor) with ``replicas``
    local replicas on a private PostgreSQL server: the connections it holds, sampled every
    0.5 s. Runs whichever automlperf is importable (PYTHONPATH), to compare versions."""
    from automlperf.store.pgserver import PostgresServer

    server = PostgresServer(work / "postgres-real")
    url = server.start()
    held: list[int] = []
    stop = threading.Event()
    sampler = threading.Thread(target=connections_held,
                               args=(url, url.rsplit("/", 1)[1], stop, held))
    try:
        sampler.start()
        done = subprocess.run([sys.executable, "-m", "automlperf.cli", "run", "--replicas",
                               str(replicas), "--duration", duration, "--store", url,
                               "--run-dir", str(work / "real-run")],
                              capture_output=True, text=True)
        stop.set()
        sampler.join()
    finally:
        server.stop()
    if done.returncode != 0:
        raise SystemExit(f"the run failed: {done.stderr[-2000:]}")
    busy = [h for h in held if h > 0]
    return {"replicas": replicas, "duration": duration, "connections_max": max(held),
            "connections_median_while_running": statistics.median(busy) if busy else 0,
            "samples": len(held)}


def size_step(args: argparse.Namespace) -> None:
    """One step of part 2 in a process of its own (its CPU and peak memory measured alone)."""
    from automlperf.config import Config
    from automlperf.submission.check import check_run
    from automlperf.measure.result import build_result, write_result
    from automlperf.report.html import write_report
    from automlperf.store.opening import run_store
    from automlperf.store.rundir import RunDir

    run_dir, url = Path(args.run_dir), os.environ.get("BENCH_STORE_URL")
    rd = RunDir(run_dir)
    if args.size_step == "result":
        with run_store(run_dir, url) as store:
            result = build_result(store, int(rd.meta()["run_id"]), Config.load(rd.config),
                                  json.loads(rd.system.read_text()))
        write_result(rd.result, result)
        print(json.dumps({}))
    elif args.size_step == "check":
        checked = check_run(run_dir, url)
        print(json.dumps({"check_ok": checked.ok, "check_mismatches": checked.mismatches[:3]}))
    else:
        print(json.dumps({"report_mb": write_report(run_dir, url).stat().st_size / 1e6}))


def measured(cmd: list[str], env: dict[str, str]) -> tuple[dict[str, Any], float, float, float]:
    """Run ``cmd``; (its JSON output, wall seconds, CPU seconds of it and the workers it
    waited for, peak resident memory in GiB of it or any of them)."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t
        out.seek(0)
        text = out.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode})")
    return (json.loads(text.strip().splitlines()[-1]), wall, usage.ru_utime + usage.ru_stime,
            usage.ru_maxrss / 2**20)


def size(run_dir: Path, url: str | None) -> dict[str, Any]:
    """Writing result.json, check, the report and compare on the generated run, each timed
    (wall and CPU, workers included) with its peak memory, in a process of its own."""
    from automlperf.report.compare import ranking
    from automlperf.store.rundir import RunDir

    rd = RunDir(run_dir)
    out: dict[str, Any] = {"epochs": None}
    env = dict(os.environ, **({"BENCH_STORE_URL": url} if url else {}))
    me = [sys.executable, str(Path(__file__).resolve()), "--run-dir", str(run_dir)]
    for step in ("result", "check", "report"):
        found, wall, cpu, peak = measured(me + ["--size-step", step], env)
        out.update(found)
        out[f"{step}_s"], out[f"{step}_cpu_s"], out[f"{step}_peak_gib"] = wall, cpu, peak
    out.update(search_progress(run_dir, url))
    t = time.perf_counter()
    ranking([run_dir, run_dir])
    out["compare_s"] = time.perf_counter() - t
    out["result_mb"] = rd.result.stat().st_size / 1e6
    out["epochs"] = json.loads(rd.result.read_text()).get("epochs")
    return out


def search_progress(run_dir: Path, url: str | None) -> dict[str, Any]:
    """The report's search-progress part on its own (its figures, then its three charts),
    from the trials and counted epochs the report reads anyway."""
    from automlperf.measure.score import counted_epochs
    from automlperf.report import charts, progress
    from automlperf.report.html import _ancestry, _morph_text
    from automlperf.store.opening import run_store
    from automlperf.store.rundir import RunDir

    rd = RunDir(run_dir)
    run_id = int(rd.meta()["run_id"])
    with run_store(run_dir, url) as store:
        counted = counted_epochs(store.epochs(run_id), store.segments(run_id))
        trials = {t.id: t for t in store.trials(run_id)}
    best = json.loads(rd.result.read_text())["best_trial"]
    t = time.perf_counter()
    p = progress.progress(counted, trials, _ancestry(best, trials), True, _morph_text)
    figures_s = time.perf_counter() - t
    t = time.perf_counter()
    charts.progress_chart(p["whole"], p["per_replica"])
    charts.lineage_chart(p["lineage"], p["siblings"])
    charts.ranking_chart(p["ranking"].points)
    return {"progress_figures_s": figures_s, "progress_charts_s": time.perf_counter() - t,
            "progress_lineage": len(p["lineage"]),
            "progress_ranked": p["ranking"].ranked_above + p["ranking"].others}


# --- part 3: the simulated benchmark on a real SLURM cluster, and weak scaling -----------------
# Simulated devices, chosen so that a trial is long against the control plane's work: the
# digits and the small seed (a light search: candidates and their counts take milliseconds),
# 5e9 OPS per device (the seed's epoch lasts ~2.2 s, grown networks longer: short against the
# run, so the epoch each replica has in flight at the deadline costs little), 30 epochs per
# full trial without early stopping (a full trial lasts over a minute, warm-up rounds 8 to 23
# epochs). These are the simulator's settings, not a modelled machine's: the run measures
# what the control plane costs a device, which a simulated device shows as idle time.
SLURM_CONFIG = """\
[run]
accelerator = "simulated"
heartbeat_s = 5
lease_timeout_s = 120
[data]
dataset = "digits"
[train]
max_epochs = 30
patience_base = 100
patience_max = 100
[monitor]
interval_s = 30
[simulation]
sustained_ops = 5e9
"""


def _store_engine(run_dir: Path) -> Any:
    """An engine on the private server the job script started, once it is up."""
    from automlperf.store.urls import resolve_store_url

    url_file, password = run_dir / "postgres" / "url", run_dir / "postgres" / "pg.password"
    if not (url_file.exists() and password.exists() and url_file.read_text().strip()):
        return None
    url = resolve_store_url(url_file.read_text().strip(), password)
    return sa.create_engine(url, poolclass=sa.pool.NullPool)


def _device_time(run_dir: Path, url: str | None = None) -> dict[str, Any]:
    """Where each replica's simulated device spent the run, from the stored epochs (their
    start and end are the device's, scheduled by the simulator): busy over the whole session,
    over the steady window (from the moment every replica has started its first epoch to
    the first moment one has ended its last) and from that first moment to the session's end
    (gaps between trials and the epochs cut by the deadline included), start-up before the first epoch, idle gaps
    between epochs, and when the replicas registered (process started, store opened);
    records lost (in a trial's log.jsonl, not in the store) and duplicated."""
    from automlperf.store.opening import run_store
    from automlperf.store.rundir import RunDir

    with run_store(run_dir, url) as store:
        trials = {t.id: t for t in store.trials(1)}
        epochs = store.epochs(1)
        (seg,) = store.segments(1)
        registered = sorted(r.started_at - seg.started_at for r in store.replicas(1))
    keys = [(e.trial_id, e.epoch) for e in epochs]
    logged = set()
    for trial_id in trials:
        log = RunDir(run_dir).trial(trial_id) / "log.jsonl"
        if log.exists():
            for line in log.read_text().splitlines():
                rec = json.loads(line)
                if rec.get("type") == "epoch":
                    logged.add((trial_id, rec["epoch"]))
    by_replica: dict[int, list[Any]] = {}
    for e in epochs:
        by_replica.setdefault(trials[e.trial_id].replica_index, []).append(e)
    for es in by_replica.values():
        es.sort(key=lambda e: e.started_at)
    end = min(seg.end, seg.deadline_at)
    t0 = max(es[0].started_at for es in by_replica.values())
    t1 = min(es[-1].ended_at for es in by_replica.values())

    def busy(a: float, b: float) -> float:
        return sum(max(0.0, min(e.ended_at, b) - max(e.started_at, a))
                   for es in by_replica.values() for e in es)

    n = len(by_replica)
    starts = sorted(es[0].started_at - seg.started_at for es in by_replica.values())
    gaps = [b.started_at - a.ended_at for es in by_replica.values() for a, b in zip(es, es[1:])
            if b.started_at - a.ended_at > 1e-6]
    return {"replicas_with_epochs": n, "lost": len(logged - set(keys)),
            "duplicated": len(keys) - len(set(keys)), "epochs": len(keys),
            "busy_session": busy(seg.started_at, end) / (n * (end - seg.started_at)),
            "steady_window_s": t1 - t0,
            "busy_steady": busy(t0, t1) / (n * (t1 - t0)) if t1 > t0 else None,
            "busy_after_start": busy(t0, end) / (n * (end - t0)),
            "registered_s_median": statistics.median(registered),
            "registered_s_max": registered[-1],
            "startup_s_median": statistics.median(starts), "startup_s_max": starts[-1],
            "gaps": len(gaps), "gap_s_median": statistics.median(gaps) if gaps else 0.0,
            "gap_s_max": max(gaps, default=0.0)}


def job_memory_gib(*folders: Path) -> float:
    """Resident memory of the processes that name one of ``folders`` (the run directory:
    primary and replicas; the PostgreSQL server's) and their children (its backends), summed (shared pages count once
    per process, so this is an upper bound)."""
    import psutil

    pids: dict[int, Any] = {}
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or ())
        if any(str(folder) in line for folder in folders):
            try:
                for p in [proc, *proc.children(recursive=True)]:
                    pids[p.pid] = p
            except psutil.Error:
                pass
    total = 0
    for p in pids.values():
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**30


def job_state(env: dict[str, str], job: str) -> str:
    """The job's final state as slurmctld reports it (asked again while it is completing)."""
    for _ in range(60):
        shown = subprocess.run(["scontrol", "show", "job", job, "--oneliner"], env=env,
                               capture_output=True, text=True).stdout
        state = shown.split("JobState=")[1].split()[0] if "JobState=" in shown else "unknown"
        if state not in ("unknown", "COMPLETING"):
            return state
        time.sleep(1.0)
    return state


def slurm_run(env: dict[str, str], n: int, duration: str, work: Path) -> dict[str, Any]:
    """`automlperf slurm --nodes n --submit` of the simulated benchmark on the local cluster:
    connections held while it runs (pg_stat_activity, client backends, every second) and the
    machine's memory in use, then the job's state, `check`, records lost or duplicated, the
    score and where the simulated devices' time went."""
    run_dir = work / f"slurm{n}"
    config = work / "slurm-sim.toml"
    config.write_text(SLURM_CONFIG)
    cli = [sys.executable, "-m", "automlperf.cli"]
    t = time.time()
    done = subprocess.run(cli + ["slurm", "--nodes", str(n), "--duration", duration,
                                 "--run-dir", str(run_dir), "--config", str(config), "--submit"],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"automlperf slurm failed: {done.stdout}{done.stderr}")
    job = done.stdout.split("submitted job ")[1].split()[0]
    held: list[int] = []
    memory: list[float] = []
    engine = None
    while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True,
                         text=True).stdout.strip():
        if len(held) % 5 == 0:
            memory.append(job_memory_gib(run_dir))
        engine = engine or _store_engine(run_dir)
        if engine is not None:
            try:
                with engine.connect() as conn:
                    held.append(int(conn.execute(sa.text(
                        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                        "'client backend' AND pid <> pg_backend_pid()")).scalar()))
            except sa.exc.OperationalError:
                pass  # not yet accepting connections, or stopped at the end
        time.sleep(1.0)
    if engine is not None:
        engine.dispose()
    wall = time.time() - t
    state = job_state(env, job)
    log = next((run_dir / "logs").glob("slurm-*.out")).read_text()
    finished = "automlperf primary finished with status 0" in log
    checked = subprocess.run(cli + ["check", str(run_dir)], capture_output=True, text=True)
    result = json.loads((run_dir / "result.json").read_text())
    return {"nodes": n, "job_state": state, "primary_status_0": finished, "wall_s": wall,
            "connections_max": max(held, default=None), "connections_samples": len(held),
            "job_memory_gib_max": max(memory, default=None),
            "check_rc": checked.returncode,
            "check_verified": checked.returncode == 0 and "verified" in checked.stdout,
            "trials": result.get("trials"), "devices": result["devices"],
            "score": result["score"], "ops_per_s_per_device": result["ops_per_s_per_device"],
            **_device_time(run_dir), "startup": startup_parts(run_dir), "run_dir": str(run_dir)}


def slurm_series(sizes: list[int], duration: str, work: Path) -> dict[str, Any]:
    """The simulated benchmark at each N on one local cluster of max(N) slurmd nodes, then
    `automlperf compare --scaling` over the runs."""
    from automlperf.testing.slurm import start_slurm, stop_slurm

    t = time.perf_counter()
    env = start_slurm(work / "slurm", max(sizes), "ampbench")
    up = time.perf_counter() - t
    print(f"{max(sizes)} slurmd nodes idle after {up:.1f} s", flush=True)
    runs = []
    try:
        for n in sizes:
            runs.append(slurm_run(env, n, duration, work))
            print(json.dumps(runs[-1]), flush=True)
    finally:
        stop_slurm(env)
    return {"cluster_nodes": max(sizes), "cluster_up_s": up, "duration": duration, "runs": runs,
            **weak_scaling(runs, work / "scaling.html")}


def weak_scaling(runs: list[dict[str, Any]], page: Path) -> dict[str, Any]:
    """`automlperf compare --scaling` over the runs (efficiency from the results' OPS per
    device), and the same ratio over the steady window (device busy time, part 3)."""
    scaling = subprocess.run([sys.executable, "-m", "automlperf.cli", "compare", "--scaling",
                              *[r["run_dir"] for r in runs], "--json", "--html", str(page)],
                             capture_output=True, text=True)
    rows = json.loads(scaling.stdout)["runs"] if scaling.returncode == 0 else []
    base = runs[0]["busy_steady"]
    for r in runs:
        r["efficiency"] = next((row["efficiency"] for row in rows if row["devices"] == r["devices"]),
                               None)
        r["efficiency_steady"] = r["busy_steady"] / base if base else None
    return {"scaling_page": str(page),
            "scaling_error": scaling.stderr.strip() if scaling.returncode else None}


def hosted_series(sizes: list[int], processes: int, duration: str, work: Path) -> dict[str, Any]:
    runs = []
    for n in sizes:
        runs.append(hosted_run(n, processes, duration, work))
        print(json.dumps(runs[-1]), flush=True)
    return {"cluster_nodes": f"none (hosted in up to {processes} processes)", "duration": duration,
            "runs": runs, **weak_scaling(runs, work / "scaling-hosted.html")}


# --- part 4: many simulated replicas hosted in a few processes ---------------------------------
# Thousands of replica processes (~129 MiB each) do not fit in 24 GiB, so here each process
# hosts a slice of the replicas as threads: real Replica objects (open_replica: the run's
# store, reached through its store service, the search, its TPE study, the simulated devices)
# against a private PostgreSQL server and a real primary (`automlperf run --launcher
# external`, which starts the service). What differs from N replica processes: the replicas
# of a process share its interpreter (one GIL, one import) and its history of the run, and no
# node sampler runs (thousands of sampler processes would not fit either). The run's settings
# are a node's (heartbeat 5 s, lease 60 s) but for the simulated devices, whose epochs last
# >= 30 s (the seed's ~33 s, grown networks longer), and the search: random morphs of a trained
# model and no TPE (search.strategy = "random", search.hpo = "none"), since thousands of
# Bayesian searches would share 2 cores here where each node has its own (bench/bench_search.py
# measures the Bayesian search's CPU). Stated with the figures.
HOSTED_CONFIG = SLURM_CONFIG.replace("sustained_ops = 5e9", "sustained_ops = 3.3e8").replace(
    "lease_timeout_s = 120", "lease_timeout_s = 60") + """[search]
strategy = "random"
hpo = "none"
"""


def host_replicas(args: argparse.Namespace) -> None:
    """One host process: replicas args.first .. args.last - 1, each a thread."""
    from automlperf.runner.worker import open_replica, wait_for_session

    url = os.environ["BENCH_STORE_URL"]
    if not wait_for_session(Path(args.run_dir), url, 600):
        raise SystemExit("no open session")
    codes: dict[int, Any] = {}

    def one(index: int) -> None:
        try:
            codes[index] = open_replica(Path(args.run_dir), url, index, sample=False).run()
        except Exception as exc:  # reported, not hidden: the parent counts it
            codes[index] = repr(exc)

    # Modules a replica imports on first use, imported once here: 64 threads importing the
    # same module at once can see it half-initialised.
    import optuna  # noqa: F401
    import sqlalchemy.orm  # noqa: F401

    from automlperf.search import hpo  # noqa: F401

    threads = [threading.Thread(target=one, args=(i,), name=f"replica-{i}")
               for i in range(args.first, args.last)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    json.dump({"codes": codes}, sys.stdout)


def hosted_run(n: int, processes: int, duration: str, work: Path) -> dict[str, Any]:
    """A simulated run of ``n`` replicas hosted in ``processes`` processes."""
    from automlperf.store import connections
    from automlperf.store.pgserver import PostgresServer

    run_dir = work / f"hosted{n}"
    config = work / "hosted-sim.toml"
    config.write_text(HOSTED_CONFIG)
    pg_dir = work / f"postgres-hosted{n}"
    server = PostgresServer(pg_dir,
                            max_connections=connections.server_size(n))
    url = server.start()
    env = dict(os.environ, BENCH_STORE_URL=url)
    held: list[int] = []
    memory: list[float] = []
    t = time.time()
    try:
        prim = subprocess.Popen([sys.executable, "-m", "automlperf.cli", "run", "--launcher",
                                 "external", "--replicas", str(n), "--duration", duration,
                                 "--config", str(config), "--run-dir", str(run_dir),
                                 "--store", url], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        me = [sys.executable, str(Path(__file__).resolve()), "--host", "--run-dir", str(run_dir)]
        procs = []
        workers = min(n, processes)
        bounds = [round(i * n / workers) for i in range(workers + 1)]
        for a, b in zip(bounds, bounds[1:]):
            procs.append(subprocess.Popen(me + ["--first", str(a), "--last", str(b)], env=env,
                                          stdout=subprocess.PIPE, text=True))
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        while prim.poll() is None:
            if len(held) % 5 == 0:
                memory.append(job_memory_gib(run_dir, pg_dir))
            with engine.connect() as conn:
                held.append(int(conn.execute(sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                    "'client backend' AND pid <> pg_backend_pid()")).scalar()))
            time.sleep(1.0)
        engine.dispose()
        primary_out = prim.communicate()[0]
        codes: dict[str, Any] = {}
        for p in procs:
            out = p.communicate()[0]
            codes.update(json.loads(out)["codes"] if out.strip() else {"?": p.returncode})
        wall = time.time() - t
        checked = subprocess.run([sys.executable, "-m", "automlperf.cli", "check", str(run_dir),
                                  "--store", url], capture_output=True, text=True, env=env)
        device = _device_time(run_dir, url)
    finally:
        server.stop()
    if prim.returncode != 0:
        raise SystemExit(f"the hosted run failed: {primary_out[-3000:]}")
    result = json.loads((run_dir / "result.json").read_text())
    return {"nodes": n, "processes": min(n, processes), "job_state": "COMPLETED",
            "wall_s": wall, "replica_exit_codes": sorted({str(c) for c in codes.values()}),
            "connections_max": max(held, default=None),
            "job_memory_gib_max": max(memory, default=None),
            "check_rc": checked.returncode,
            "check_verified": checked.returncode == 0 and "verified" in checked.stdout,
            "trials": result.get("trials"), "devices": result["devices"],
            "score": result["score"], "ops_per_s_per_device": result["ops_per_s_per_device"],
            **device, "run_dir": str(run_dir)}


def print_series(series: dict[str, Any]) -> None:
    print(f"\nsimulated benchmark, cluster of slurmd nodes: {series['cluster_nodes']}, "
          f"{series['duration']} each")
    print(f"{'N':>4} {'job':>10} {'check':>8} {'conn max':>8} {'mem GiB':>8} {'epochs':>7} "
          f"{'lost':>4} {'dup':>4} {'OPS/device':>11} {'eff':>6} {'busy':>6} {'busy st.':>8} "
          f"{'eff st.':>7} {'start med/max s':>15} {'gap med/max s':>14}")
    for r in series["runs"]:
        eff = "-" if r["efficiency"] is None else f"{r['efficiency']:.3f}"
        steady = "-" if r["efficiency_steady"] is None else f"{r['efficiency_steady']:.3f}"
        print(f"{r['nodes']:>4} {r['job_state']:>10} "
              f"{'verified' if r['check_verified'] else 'FAILED':>8} {r['connections_max']!s:>8} "
              f"{r['job_memory_gib_max']:>8.1f} {r['epochs']:>7} {r['lost']:>4} "
              f"{r['duplicated']:>4} {r['ops_per_s_per_device']:>11.4g} {eff:>6} "
              f"{r['busy_session']:>6.3f} {r['busy_steady']:>8.4f} {steady:>7} "
              f"{r['startup_s_median']:>7.1f}/{r['startup_s_max']:<7.1f} "
              f"{r['gap_s_median']:>6.2f}/{r['gap_s_max']:<7.2f}")
    if series["scaling_error"]:
        print(f"compare --scaling: {series['scaling_error']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--epochs", type=int, default=500_000)
    ap.add_argument("--nodes", type=int, default=512, help="replicas of the generated run")
    ap.add_argument("--duration", type=float, default=None, metavar="S",
                    help="the timed shape (bench/large_run.py): every node trains until this "
                         "deadline; --trials and --epochs are then not used")
    ap.add_argument("--node-ops", type=float, default=None, help="operations/s of a node "
                    "(default: bench/large_run.py's NODE_OPS)")
    ap.add_argument("--work", type=Path, default=None, help="keep everything here")
    # internal: the processes the bench starts
    ap.add_argument("--host", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--size-step", choices=("result", "check", "report"), help=argparse.SUPPRESS)
    for name, kind in (("--first", int), ("--last", int), ("--run-dir", str)):
        ap.add_argument(name, type=kind, help=argparse.SUPPRESS)
    ap.add_argument("--skip-size", action="store_true",
                    help="generate the run only (measure it later with the same --work)")
    ap.add_argument("--real-run", type=int, default=0, metavar="REPLICAS",
                    help="only: a real run of this many replicas, its connections counted")
    ap.add_argument("--slurm", default="", metavar="N,N,...",
                    help="only: the simulated benchmark submitted to a local SLURM cluster of "
                         "slurmd daemons at each N, and its weak scaling")
    ap.add_argument("--slurm-duration", default="4m", help="run length of each SLURM run")
    ap.add_argument("--hosted", default="", metavar="N,N,...",
                    help="only: simulated runs of N replicas hosted as threads in a few "
                         "processes (--processes), and their weak scaling")
    ap.add_argument("--processes", type=int, default=8, help="host processes of --hosted")
    ap.add_argument("--hosted-duration", default="10m", help="run length of each hosted run")
    args = ap.parse_args()
    if args.size_step:
        return size_step(args)
    if args.host:
        return host_replicas(args)
    if args.hosted:
        work = args.work or Path(tempfile.mkdtemp(prefix="bench-scale-"))
        work.mkdir(parents=True, exist_ok=True)
        series = hosted_series([int(x) for x in args.hosted.split(",")], args.processes,
                               args.hosted_duration, work)
        print_series(series)
        print(json.dumps({"bench": "scale-hosted", **series}))
        return None
    if args.slurm:
        work = args.work or Path(tempfile.mkdtemp(prefix="bench-scale-"))
        work.mkdir(parents=True, exist_ok=True)
        series = slurm_series([int(x) for x in args.slurm.split(",")], args.slurm_duration, work)
        print_series(series)
        print(json.dumps({"bench": "scale-slurm", **series}))
        return None
    if args.real_run:
        work = args.work or Path(tempfile.mkdtemp(prefix="bench-scale-"))
        found = real_run(args.real_run, "2m", work)
        print(f"a real {args.real_run}-replica run of 2 minutes held at most "
              f"{found['connections_max']} connections (median "
              f"{found['connections_median_while_running']} while running)")
        print(json.dumps({"bench": "scale-real-run", **found}))
        return None

    import large_run

    from automlperf.store.pgserver import PostgresServer

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    server = PostgresServer(work / "postgres")
    reuse = (work / "run" / "result.json").exists()
    server.start()
    try:
        if reuse:  # the run generated by an earlier invocation with this --work
            base = server.url.rsplit("/", 1)[0] + "/generated"
            made = json.loads((work / "generated.json").read_text())
        else:
            base = server.create_database("generated")
            t = time.perf_counter()
            made = large_run.generate(work / "run", args.trials, args.epochs, args.nodes,
                                      store_url=base, progress=True, duration_s=args.duration,
                                      node_ops=args.node_ops or large_run.NODE_OPS)
            made["generate_s"] = time.perf_counter() - t
            (work / "generated.json").write_text(json.dumps(made))
        print(f"generated {made['trials']} trials, {made['epochs']} epochs, {made['samples']} "
              f"samples of {made['replicas']} nodes in {made['generate_s']:.0f} s", flush=True)
        if args.skip_size:
            return None
        sized = {"load_before": os.getloadavg()[0], **size(work / "run", base),
                 "load_after": os.getloadavg()[0]}
    finally:
        server.stop()
    per = 1e5 / made["epochs"]
    print(f"\n{made['replicas']} nodes, {made['trials']} trials, {made['epochs']} epochs, "
          f"{made['samples']} samples (PostgreSQL):")
    for step in ("result", "check", "report"):
        print(f"  {step}: {sized[f'{step}_s']:.1f} s, CPU {sized[f'{step}_cpu_s']:.1f} s "
              f"({per * sized[f'{step}_cpu_s']:.1f} s per 100,000 epochs), peak "
              f"{sized[f'{step}_peak_gib']:.2f} GiB")
    print(f"  {'verified' if sized['check_ok'] else 'MISMATCHES'}; report "
          f"{sized['report_mb']:.2f} MB, result.json {sized['result_mb']:.2f} MB, compare "
          f"{sized['compare_s']:.2f} s; load average {sized['load_before']:.2f} -> "
          f"{sized['load_after']:.2f}")
    print(json.dumps({"bench": "scale", "generated": made, "size": sized}))
    return None

if __name__ == "__main__":
    main()
