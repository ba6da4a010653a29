"""A replica killed outright on one of three nodes, under each launcher automlperf ships a
job for: the run's exit, the trials the kill cost, and how long the primary took to notice.

"Killed outright" is what a node's death or the kernel's OOM killer does: SIGKILL to the
replica's whole process group (the replica, its training processes, its sampler), with no
word to anyone, in a trial (held with SIGSTOP while one is picked, tests/helpers.py
`hold_mid_trial`). Each run: three nodes, simulated accelerators (`SimulatedTrainer`) on an
ImageNet-layout folder, the run's own private PostgreSQL and store service.

- SLURM: `automlperf slurm --nodes 3` on a local cluster of three slurmd nodes
  (automlperf/testing/slurm.py); the replica's task (its shell included) is killed.
- PBS Pro, Flux, LSF: each example script as written, its scheduler's environment set and
  its launcher a stand-in (tests/standins/: PALS's mpiexec per node, `flux submit --cc`,
  `blaunch` per host), as tests/e2e/test_examples.py runs them.
- Kubernetes: the manifest's two Jobs' commands (examples/kubernetes/automlperf.yaml), the
  pods local processes each in a session of its own, PostgreSQL a local server.

Time to notice, from the kill: to the primary's line naming the replica gone (two figures,
the line's clock having whole seconds), and to its trial failed (its lease lapsed; a trial
still held at the session's end is failed then). Under SLURM the primary knows at once, from
srun's word that the task was killed; elsewhere from the replica's silence past its lease
(`run.lease_timeout_s`: 10 s here, 60 s by default), counted from its last heartbeat, which
precedes the kill by the time the replica was held: so under the lease. Figures are this
machine's (2-core AMD EPYC, no GPU); the devices are simulated.

    python bench/bench_replica_kill.py [--only slurm,pbs,flux,lsf,kubernetes] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "e2e")]
LEASE_S = 10


def _charged(run_dir: Path, replica: int, killed_at: float, log: str,
             store_url: str | None = None) -> dict[str, Any]:
    """The trials replica ``replica`` lost; how long after the kill the primary's log named
    it gone, and its trial failed (None: failed only at the session's end)."""
    import datetime
    import math

    from automlperf.store.opening import run_store

    with run_store(run_dir, store_url) as store:
        lost = [t for t in store.trials(1) if t.replica_index == replica and t.status == "failed"]
    failed = min((t.finished_at for t in lost), default=math.inf)
    said = re.search(rf"^(\d\d):(\d\d):(\d\d) replica {replica}: (.*?);", log, re.M)
    seen = None
    if said:
        day = datetime.datetime.fromtimestamp(killed_at)
        at = day.replace(hour=int(said[1]), minute=int(said[2]), second=int(said[3]),
                         microsecond=0).timestamp()
        # The line's clock has whole seconds: the primary knew within this second.
        seen = (round(max(0.0, at - killed_at), 1), round(at + 1 - killed_at, 1))
    return {"charged": len(lost), "seen_gone_s": seen, "why": said[4] if said else None,
            "trial_failed_s": round(failed - killed_at, 2) if math.isfinite(failed) else None}


def _verified(run_dir: Path, env: dict[str, str] | None = None) -> bool:
    done = subprocess.run([sys.executable, "-m", "automlperf.cli", "check", str(run_dir)],
                          capture_output=True, text=True, env=env)
    return done.returncode == 0 and "verified" in done.stdout


def slurm(work: Path) -> dict[str, Any]:
    from helpers import hold_mid_trial, kill_outright, opened, sim_config
    from trees import WNIDS, make_tree

    from automlperf.testing.slurm import start_slurm, stop_slurm

    data = make_tree(work / "imagenet", per_class=(4, 2), classes=WNIDS[:10])
    env = start_slurm(work / "cluster", 3, "ampkill", memory_mb=1000)
    try:
        (work / "sim.toml").write_text(sim_config(
            sustained_ops=2e14, time_compression=5.0, max_rounds=2, stop_grace_s=10,
            lease_timeout_s=LEASE_S, image_folders=True))
        run_dir = work / "run"
        done = subprocess.run([sys.executable, "-m", "automlperf.cli", "slurm", "--nodes", "3",
                               "--duration", "10m", "--dataset", "imagenet", "--data-dir",
                               str(data), "--config", str(work / "sim.toml"), "--run-dir",
                               str(run_dir), "--submit"], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        job = re.search(r"submitted job (\d+)", done.stdout).group(1)
        store = opened(run_dir)
        pid, _ = hold_mid_trial(store, run_dir, 2, epochs=0)
        store.close()
        killed_at = kill_outright(pid)
        while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True,
                             text=True).stdout.strip():
            time.sleep(1)
        state = re.search(r"JobState=(\S+)", subprocess.run(
            ["scontrol", "show", "job", job, "--oneliner"], env=env, capture_output=True,
            text=True).stdout).group(1)
        out = (run_dir / "logs" / f"slurm-{job}.out").read_text()
        status = re.search(r"automlperf primary finished with status (\d+)", out).group(1)
    finally:
        stop_slurm(env)
    result = json.loads((run_dir / "result.json").read_text())
    return {"exit": f"job {state}, primary {status}", "replicas": result["replicas"],
            **_charged(run_dir, 2, killed_at, out), "verified": _verified(run_dir)}


def example(work: Path, script: str, **env: str) -> dict[str, Any]:
    from test_examples import run_script
    from trees import WNIDS, make_tree

    data = make_tree(work / "imagenet", per_class=(4, 2), classes=WNIDS[:10])
    ran = run_script(script, work, data, kill=2, **env)  # it checks the run verifies
    killed = (ran.killed or {})["killed_at"]
    return {"exit": f"script {ran.status}", "replicas": ran.result["replicas"],
            **_charged(ran.run_dir, 2, killed, (ran.run_dir / "logs" / "primary.log").read_text()),
            "verified": True}


def kubernetes(work: Path) -> dict[str, Any]:
    import yaml
    from helpers import hold_mid_trial, kill_outright, sim_config
    from trees import WNIDS, make_tree

    from automlperf.store import open_store
    from automlperf.store.pgserver import PostgresServer

    manifest = TESTS.parent / "examples" / "kubernetes" / "automlperf.yaml"
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    jobs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Job"}
    data = make_tree(work / "imagenet", per_class=(4, 2), classes=WNIDS[:10])
    (work / "sim.toml").write_text(sim_config(sustained_ops=2e14, time_compression=5.0,
                                              max_rounds=2, stop_grace_s=10,
                                              lease_timeout_s=LEASE_S, image_folders=True))
    pg_dir = Path(tempfile.mkdtemp(prefix="amp-kill-pg-"))
    server = PostgresServer(pg_dir / "pg")
    url = server.start()
    local = url.split("@")[1]
    runs = work / "runs"

    def site(text: str) -> str:
        return (text.replace("/runs", str(runs)).replace("/data/imagenet", str(data))
                .replace("automlperf-postgres:5432/automlperf", local)
                .replace("--config official", f"--config {work / 'sim.toml'}")
                .replace("--duration 1h", "--duration 10m").replace("--replicas 4", "--replicas 3")
                .replace("automlperf ", f"{sys.executable} -m automlperf.cli "))

    def pod(job: str, index: int | None = None) -> subprocess.Popen[bytes]:
        container = jobs[job]["spec"]["template"]["spec"]["containers"][0]
        env = dict(os.environ, AUTOMLPERF_STORE_PASSWORD=server.password,
                   AUTOMLPERF_SERVICE_ADDRESS="127.0.0.1")
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = site(var["value"])
        if index is not None:
            env["JOB_COMPLETION_INDEX"] = str(index)
        argv = [site(a) for a in container["command"]]
        if argv[0] == "automlperf":
            argv[:1] = [sys.executable, "-m", "automlperf.cli"]
        log = open(work / f"{job}-{index}.log", "w")
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    try:
        primary = pod("automlperf-primary")
        replicas = [pod("automlperf-replicas", i) for i in range(3)]
        store = None
        while store is None:
            try:
                store = open_store(url)
                store.trials(1)
            except Exception:  # noqa: BLE001 - not created yet
                store = None
                time.sleep(1)
        pid, _ = hold_mid_trial(store, runs / "run1", 2, epochs=0)
        store.close()
        killed_at = kill_outright(pid)
        codes = [p.wait(timeout=900) for p in replicas]
        status = primary.wait(timeout=300)
        result = json.loads((runs / "run1" / "result.json").read_text())
        found = {"exit": f"primary {status}, replica pods {codes}",
                 "replicas": result["replicas"],
                 **_charged(runs / "run1", 2, killed_at,
                            (work / "automlperf-primary-None.log").read_text(), url),
                 "verified": _verified(runs / "run1", dict(
                     os.environ, AUTOMLPERF_STORE_PASSWORD=server.password))}
    finally:
        server.stop()
        shutil.rmtree(pg_dir, ignore_errors=True)
    return found


CASES = {
    "slurm": slurm,
    "pbs": lambda work: example(work, "pbs/automlperf.pbs", PBS_NODEFILE=_nodefile(work),
                                PBS_JOBID="42.pbs", PBS_STANDIN_WALLTIME="01:00:00"),
    "flux": lambda work: example(work, "flux/automlperf.flux", FLUX_STANDIN_NODES="3",
                                 FLUX_URI="local:///tmp/flux-standin", FLUX_STANDIN_JOBID="f2",
                                 FLUX_STANDIN_TIMELEFT="3600"),
    "lsf": lambda work: example(work, "lsf/automlperf.lsf", LSB_HOSTS="hA hA hB hB hC hC",
                                LSB_JOBID="42", LSF_STANDIN_RUNLIMIT="01:00:00"),
    "kubernetes": kubernetes,
}


def _nodefile(work: Path) -> str:
    path = work / "nodefile"
    path.write_text("x1\nx1\nx2\nx3\n")
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=",".join(CASES))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for name in args.only.split(","):
        with tempfile.TemporaryDirectory(prefix=f"amp-kill-{name}-", dir="/tmp") as tmp:
            started = time.monotonic()
            row = {"launcher": name, **CASES[name](Path(tmp))}
            row["seconds"] = round(time.monotonic() - started, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| launcher | the run's exit | replicas | trials charged | seen gone | its trial "
          "failed | verified |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        failed = (f"{r['trial_failed_s']} s" if r["trial_failed_s"] is not None
                  else "at the session's end")
        seen = ("never" if r["seen_gone_s"] is None
                else "{} to {} s".format(*r["seen_gone_s"]))
        print(f"| {r['launcher']} | {r['exit']} | {r['replicas']} | {r['charged']} | "
              f"{seen} ({r['why']}) | {failed} | "
              f"{'yes' if r['verified'] else 'no'} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    main()
