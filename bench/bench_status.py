"""`automlperf status` on a running 16-node run, read from the login node's side through the
run's store service: its output, and what each call costs the service.

A local SLURM cluster of 16 slurmd nodes on this host (automlperf/testing/slurm.py) runs
`automlperf slurm --nodes 16` with simulated accelerators (`SimulatedTrainer`: the rest of
the run is real, primary, store service, PostgreSQL, replicas, search). Once every replica
has finished an epoch, `automlperf status RUN_DIR` runs CALLS times as a user would (a new
process each), then once in this process through `run_status`, which counts the calls it
sent and the bytes it read (`RemoteStore.calls`, `bytes_in`). The service's own time per call,
by kind, is what it writes to `logs/store-service-calls.json` at its stop (the calls only
`status` makes: `epochs` and `tally`; the others it shares with the run: their counts before
and after). Figures are this machine's (2-core AMD EPYC, no GPU), the run's devices
simulated: no figure of it is a measurement of an accelerator.

    python bench/bench_status.py [--nodes 16] [--calls 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from helpers import opened, sim_config, wait_for

    from automlperf.runner.status import run_status
    from automlperf.testing.slurm import start_slurm, stop_slurm

    with tempfile.TemporaryDirectory(prefix="amp-status-", dir="/tmp") as tmp:
        work = Path(tmp)
        env = start_slurm(work / "cluster", args.nodes, "ampstat", memory_mb=1000)
        try:
            (work / "sim.toml").write_text(sim_config(sustained_ops=2e11, lease_timeout_s=600,
                                                      deadline_grace_s=2, stop_grace_s=20))
            run_dir = work / "run"
            done = subprocess.run([sys.executable, "-m", "automlperf.cli", "slurm", "--nodes",
                                   str(args.nodes), "--duration", "10m", "--config",
                                   str(work / "sim.toml"), "--run-dir", str(run_dir),
                                   "--submit"], env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stdout + done.stderr
            job = re.search(r"submitted job (\d+)", done.stdout).group(1)
            store = opened(run_dir)
            wait_for(lambda: len({t.replica_index for t in store.trials(1) if t.epochs_done})
                     >= args.nodes, 1800, "every replica's first epoch")
            store.close()
            walls = []
            for _ in range(args.calls):
                started = time.perf_counter()
                shown = subprocess.run([sys.executable, "-m", "automlperf.cli", "status",
                                        str(run_dir)], env=env, capture_output=True, text=True)
                walls.append(time.perf_counter() - started)
                assert shown.returncode == 0, shown.stdout + shown.stderr
            started = time.perf_counter()
            status = run_status(run_dir)
            in_process = time.perf_counter() - started
            before = _service_times(run_dir)
            subprocess.run(["scancel", "--batch", "--signal=TERM", job], env=env, check=True)
            _wait_job(job, env)
            after = _service_times(run_dir)
        finally:
            stop_slurm(env)
        found = {"nodes": args.nodes, "output": shown.stdout, "calls": args.calls,
                 "wall_s": walls, "wall_median_s": sorted(walls)[len(walls) // 2],
                 "in_process_s": in_process, "store_calls_per_status": status.calls,
                 "bytes_read_per_status": status.bytes_in, "epochs": status.epochs,
                 "service_before_stop": before, "service_at_stop": after}
    print(found["output"])
    print(f"{args.calls} calls of `automlperf status` on a running {args.nodes}-node run "
          f"({found['epochs']} epochs so far): {found['wall_median_s']:.2f} s each (median, a "
          f"process each; {in_process:.2f} s in this process); "
          f"{status.calls} store service calls and {status.bytes_in:,} bytes read per status")
    for kind in ("epochs", "tally", "replicas", "segments", "run", "open"):
        row = (after or {}).get(kind)
        if row:
            print(f"  service: {kind:<9} {row['n']:>6} calls, mean {row['mean_ms']:.2f} ms, "
                  f"p99 {row['p99_ms']:.2f} ms")
    if args.json:
        args.json.write_text(json.dumps(found, indent=1) + "\n")


def _service_times(run_dir: Path) -> dict | None:
    path = run_dir / "logs" / "store-service-calls.json"
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found.get("calls", found)


def _wait_job(job: str, env: dict[str, str]) -> None:
    for _ in range(1800):
        if not subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True,
                              text=True).stdout.strip():
            return
        time.sleep(1)


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    main()
