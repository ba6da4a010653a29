"""How long a SLURM job takes to start one replica on each of N nodes, and what that costs
the batch host and the controller, on a real SLURM cluster of N slurmd daemons on this host
(automlperf.testing.slurm). Two ways side by side, in one job each:

- ``steps``: one ``srun --nodes=1 --relative=i`` per node, every one of them a child of one
  Python process for the whole run (the launcher up to 4b198b7);
- ``one``: the launcher's own srun command now (runner/slurm.py, SlurmLauncher): one step
  whose tasks, one per node, slurmstepd fans out in a tree.

Each task runs a payload in place of the replica: it writes the time it started (ns) to a
file named after its node, then sleeps; once every node has written, the driver measures the
batch host's srun processes (count, threads, resident memory) and stops the launch with
SIGTERM, as the primary does at the deadline. The controller's CPU time over the job is read
from its /proc entry. Every slurmd, slurmstepd and payload shares this machine's cores, so
the figures are upper bounds on a launch's own cost: a site's nodes each start their task on
their own cores.

    python bench/bench_launch.py --nodes 64,256,512 [--json out.json] [--work DIR]
    python bench/bench_launch.py --imports    # each process's imports: calls and seconds
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DRIVER = r'''
import json, os, signal, subprocess, sys, time
from pathlib import Path
import psutil

mode, out = sys.argv[1], Path(sys.argv[2])
nodes = int(os.environ["SLURM_JOB_NUM_NODES"])
started = out / "started"
started.mkdir()
payload = ["sh", "-c", f'date +%s%N > {started}/$SLURMD_NODENAME; exec sleep 100000']
logs = out / "logs"
logs.mkdir()
if mode == "steps":
    # The per-node launch of 4b198b7 (runner/slurm.py SlurmLauncher.commands there).
    cmds = [["srun", "--nodes=1", "--ntasks=1", f"--relative={i}", "--kill-on-bad-exit=0",
             f"--job-name=automlperf-replica-{i}", f"--output={logs}/replica-{i}.log",
             "--open-mode=append", "--mem=0", "--cpus-per-task=1", *payload]
            for i in range(nodes)]
ctld = psutil.Process(int(Path(os.environ["CTLD_PID"]).read_text().split()[0]))
ctld_cpu = sum(ctld.cpu_times()[:2])
t0 = time.time_ns()
if mode == "steps":
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL,
                              stderr=open(logs / "srun.log", "ab")) for c in cmds]
else:
    from automlperf.runner.slurm import SlurmLauncher
    launcher = SlurmLauncher(out, None, worker=payload)
    launcher.start()
    procs = [launcher.srun]
spawned = time.time_ns()
limit = time.monotonic() + 300 + nodes  # a guard: every node starts in seconds when idle
while len(os.listdir(started)) < nodes:
    if all(p.poll() is not None for p in procs) or time.monotonic() > limit:
        for p in procs:
            p.kill()
        sys.exit(f"{len(os.listdir(started))} of {nodes} nodes started; see {logs}/srun.log")
    time.sleep(0.05)
all_up = time.time_ns()
sruns = [psutil.Process(p.pid) for p in procs if p.poll() is None]
sruns += [c for p in sruns for c in p.children(recursive=True)]
rss = sum(p.memory_info().rss for p in sruns)
threads = sum(p.num_threads() for p in sruns)
fds = sum(p.num_fds() for p in sruns)
ctld_launch = sum(ctld.cpu_times()[:2]) - ctld_cpu
starts = sorted(int((started / n).read_text()) for n in os.listdir(started))
stop = time.time_ns()
for p in procs:
    p.send_signal(signal.SIGTERM)
for p in procs:
    p.wait()
down = time.time_ns()
json.dump({"mode": mode, "nodes": nodes, "srun_processes": len(sruns),
           "spawn_s": (spawned - t0) / 1e9, "all_started_s": (all_up - t0) / 1e9,
           "first_start_s": (starts[0] - t0) / 1e9,
           "median_start_s": (starts[len(starts) // 2] - t0) / 1e9,
           "srun_rss_mib": rss / 2**20, "srun_threads": threads, "srun_fds": fds,
           "ctld_cpu_launch_s": ctld_launch, "stop_s": (down - stop) / 1e9,
           "ctld_cpu_total_s": sum(ctld.cpu_times()[:2]) - ctld_cpu},
          open(out / "figures.json", "w"))
'''


STARTUP = re.compile(r"start-up: (?:launch ([\d.]+) s, )?imports ([\d.]+) s, opening ([\d.]+) s")


def startup_parts(run_dir: Path) -> dict[str, float]:
    """Median and largest of each start-up part the replicas of a run logged (runner/worker.py
    startup_line): from the launch to the process, the imports, opening the replica."""
    found = [m.groups() for log in (run_dir / "logs").glob("replica-*.log")
             for m in STARTUP.finditer(log.read_text(errors="replace"))]
    parts: dict[str, float] = {"replicas_logged": len(found)}
    for i, name in enumerate(("launch", "imports", "opening")):
        values = sorted(float(f[i]) for f in found if f[i] is not None)
        if values:
            parts[f"{name}_median_s"] = values[len(values) // 2]
            parts[f"{name}_max_s"] = values[-1]
    return parts


def one_job(env: dict[str, str], mode: str, nodes: int, work: Path) -> dict[str, float]:
    out = work / f"{mode}-{nodes}"
    out.mkdir(parents=True)
    (out / "driver.py").write_text(DRIVER)
    done = subprocess.run(["sbatch", "--parsable", "--wait", f"--nodes={nodes}",
                           "--ntasks-per-node=1", "--exclusive", "--no-kill",
                           f"--output={out}/job.out",
                           f"--wrap={sys.executable} {out}/driver.py {mode} {out}"],
                          env=env, capture_output=True, text=True)
    figures = out / "figures.json"
    if not figures.exists():
        raise SystemExit(f"{mode} at {nodes} nodes left no figures (sbatch {done.returncode}: "
                         f"{done.stderr.strip()}); see {out}/job.out")
    return json.loads(figures.read_text())


# What each process of a node imports before it works: the replica (the CLI, then its
# runner), each training rank (spawned: the CLI's main module again, then the rank), and
# torch, which both import only once they train or describe the node.
IMPORTS = {"replica": "import automlperf.cli, automlperf.runner.worker",
           "rank": "import automlperf.cli, automlperf.train.rank",
           "torch": "import torch"}
FILE_CALLS = ("openat", "newfstatat", "stat", "lstat", "statx", "access", "readlink",
              "getdents64")


def imports() -> list[dict[str, float | int | str]]:
    """Each process's imports: file-system calls counted (strace -f -c: what a shared file
    system's metadata server answers when the environment lives there), and seconds,
    from the page cache (median of 5) and, as root, once with the caches dropped."""
    import os
    import statistics

    rows: list[dict[str, float | int | str]] = []
    for name, code in IMPORTS.items():
        cmd = [sys.executable, "-c", code]
        row: dict[str, float | int | str] = {"process": name}
        if shutil.which("strace"):
            with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
                subprocess.run(["strace", "-f", "-c", "-e", "trace=" + ",".join(FILE_CALLS)
                                + ",read", "-o", out.name, *cmd], check=True)
                calls = {f[-1]: int(f[3]) for f in (line.split() for line in out)
                         if len(f) >= 5 and f[3].isdigit()}
            row["metadata_calls"] = sum(calls.get(c, 0) for c in FILE_CALLS)
            row["opens"] = calls.get("openat", 0)
            row["reads"] = calls.get("read", 0)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run(cmd, check=True)
            times.append(time.perf_counter() - t)
        row["warm_s"] = statistics.median(times)
        if os.geteuid() == 0:
            subprocess.run(["sync"], check=True)
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            t = time.perf_counter()
            subprocess.run(cmd, check=True)
            row["cold_s"] = time.perf_counter() - t
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="64,256,512", help="cluster sizes, comma-separated")
    ap.add_argument("--modes", default="steps,one")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=None, help="keep everything here")
    ap.add_argument("--imports", action="store_true",
                    help="time and count each process's imports instead")
    args = ap.parse_args()
    if args.imports:
        found = imports()
        for row in found:
            print(json.dumps(row))
        if args.json:
            args.json.write_text(json.dumps(found, indent=1))
        return
    from automlperf.testing.slurm import start_slurm, stop_slurm

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-launch-"))
    rows = []
    for n in (int(x) for x in args.nodes.split(",")):
        up = time.perf_counter()
        env = start_slurm(work / f"cluster-{n}", n, f"bl{n}", memory_mb=1000,
                          timeout_s=600 + n)
        print(f"{n} slurmd nodes up in {time.perf_counter() - up:.1f} s", flush=True)
        env["CTLD_PID"] = str(work / f"cluster-{n}" / "slurmctld.pid")
        try:
            for mode in args.modes.split(","):
                row = one_job(env, mode, n, work)
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            stop_slurm(env)
            time.sleep(5)  # the daemons' own shutdown
    print("\n| nodes | launch | sruns on the batch host | their memory | threads | fds | all "
          "started | median | controller CPU to start | stop |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['nodes']} | {r['mode']} | {r['srun_processes']} | {r['srun_rss_mib']:.0f} MiB"
              f" | {r['srun_threads']} | {r['srun_fds']} | {r['all_started_s']:.1f} s | "
              f"{r['median_start_s']:.1f} s | {r['ctld_cpu_launch_s']:.1f} s | "
              f"{r['stop_s']:.1f} s |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
