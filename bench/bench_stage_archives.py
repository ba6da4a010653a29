"""Staging the official archives on every node of a job: a copy per node (`automlperf stage`,
each node reading the shared copy) against a tree broadcast (SLURM's `sbcast`, which reads the
shared copy once and fans it out over the nodes' daemons, each node then proving its copy with
`automlperf stage`, which reads a copy it finds in place again rather than copying it), on the
local SLURM cluster at 2, 8 and 32 nodes.

Every node of the local cluster is a slurmd of this 2-core machine with a folder of its own as
its local disk (testing/slurm.py ``node_local``); the "shared file system" is this machine's
disk, served from the page cache. So the seconds here are this machine's cores and disk shared
by every node (MD5s and writes of all the nodes on 2 cores), not a cluster's: what carries over
is what each method asks of the shared copy (bytes and opens, measured: each node's staging
record, and the I/O counters of the broadcast's reader) and the per-node work (an MD5 pass per
node either way). RESULTS.md extrapolates to 16, 64 and 512 nodes with the assumptions named.

Each method runs as a batch job of N nodes: the per-node copy is the job step `automlperf
slurm --stage-to` writes; the broadcast is `sbcast` of each archive, then a step that moves it
to the node's staging folder and runs the same `automlperf stage`.

Run: python bench/bench_stage_archives.py [--dir DIR] [--nodes 2 8 32] [--mb 200]
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
from typing import Any

from automlperf.dataset.archive import NAMES
from automlperf.testing.archives import write_archives, write_table
from automlperf.testing.slurm import start_slurm, stop_slurm

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from textured_folder import write_textured_folder  # noqa: E402

SCRIPT = """#!/bin/bash
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --output={out}
set -e
export AUTOMLPERF_TEST_ARCHIVE_MD5S={table}
began=$(date +%s%N)
{body}
ended=$(date +%s%N)
echo "seconds $(( (ended - began) / 1000000 ))"
echo DONE
"""
PER_NODE = ("srun --kill-on-bad-exit=0 {python} -m automlperf.cli stage --run-dir {run} "
            "--to {local}")
BROADCAST = """for name in {names}; do
    sync {data}/$name && dd if={data}/$name iflag=nocache count=0 status=none  # read_bytes counts
    bash -c "sbcast -f --fanout=8 {data}/$name {local}/bcast-$name; \\
        grep -E '^(rchar|read_bytes)' /proc/\\$\\$/io" | sed "s/^/sbcast $name /"
done
srun --kill-on-bad-exit=0 bash -c 'own={local}/automlperf-{runname}-$SLURMD_NODENAME; \\
    mkdir -p $own && for name in {names}; do mv {local}/bcast-$name $own/$name; done'
srun --kill-on-bad-exit=0 {python} -m automlperf.cli stage --run-dir {run} --to {local}"""


def make_data(work: Path, mb: int) -> tuple[Path, dict[str, str]]:
    """Archives of about ``mb`` MB, of 500x375 textured JPEGs (ImageNet's weight)."""
    folder = work / "folder"
    per_class = max(1, round(mb * 1e6 / 110e3 / 10 / 1.1))
    write_textured_folder(folder, 10, per_class, max(1, per_class // 10), size=(500, 375))
    table = write_archives(folder, work / "shared")
    shutil.rmtree(folder)
    return work / "shared", table


def run_job(env: dict[str, str], work: Path, nodes: int, method: str, data: Path,
            table: Path, local: Path) -> dict[str, Any]:
    run = work / f"run-{'copy' if method == 'per-node copy' else 'bcast'}-{nodes}"
    run.mkdir()
    (run / "submitted-config.toml").write_text(f'[data]\ndataset = "imagenet"\ndata_dir = "{data}"\n')
    out = run / "job.out"
    python = sys.executable
    names = " ".join(NAMES.values())
    body = (PER_NODE if method == "per-node copy" else BROADCAST).format(
        python=python, run=run, local=local, data=data, names=names, runname=run.name)
    script = run / "job.sh"
    script.write_text(SCRIPT.format(nodes=nodes, out=out, table=table, body=body))
    done = subprocess.run(["sbatch", "--parsable", str(script)], env=env, capture_output=True,
                          text=True, check=True)
    job = done.stdout.strip()
    deadline = time.monotonic() + 3600  # a guard against a hung job only
    while not (out.exists() and "DONE" in out.read_text()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job} did not finish: {out.read_text() if out.exists() else ''}")
        if subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True,
                          text=True).stdout.strip() == "" and out.exists():
            break  # ended without DONE: failed
        time.sleep(1)
    text = out.read_text()
    if "DONE" not in text:
        raise RuntimeError(f"job {job} ({method}, {nodes} nodes) failed:\n{text[-2000:]}")
    records = [json.loads(p.read_text()) for p in sorted((run / "staging").glob("n*.json"))]
    if len(records) != nodes or any(
            {p: a["md5"] for p, a in r["archives"].items()} != json.loads(table.read_text())
            for r in records):
        raise RuntimeError(f"{method}, {nodes} nodes: not every node staged the archives")
    shared_reads = sum(r["copied_bytes"] for r in records)
    if method != "per-node copy":
        # sbcast maps the file rather than reading it: the bytes it brought in from the disk,
        # its pages dropped first.
        shared_reads = sum(int(m.group(1)) for m in re.finditer(r"sbcast \S+ read_bytes: (\d+)", text))
    return {"method": method, "nodes": nodes, "seconds": int(re.search(r"seconds (\d+)", text).group(1)) / 1e3,
            "shared_bytes_read": shared_reads, "shared_opens": len(NAMES) * (nodes if method == "per-node copy" else 1),
            "node_copy_s": max(r["copy_s"] for r in records),
            "node_verify_s": max(r["verify_s"] for r in records),
            "node_hash_kept_s": max(r["hash_kept_s"] for r in records),
            "bytes": records[0]["bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.dir, prefix="stage-archives-"))
    try:
        data, table = make_data(work, args.mb)
        table_file = write_table(work / "md5s.json", table)
        size = sum((data / n).stat().st_size for n in NAMES.values())
        parts = ", ".join(f"{n} {(data / n).stat().st_size / 1e6:.1f} MB" for n in NAMES.values())
        print(f"archives: {size / 1e6:.0f} MB ({parts})")
        rows = []
        for nodes in args.nodes:
            local = work / "local"
            local.mkdir(exist_ok=True)
            env = start_slurm(work / f"slurm-{nodes}", nodes, f"stage{nodes}", node_local=local)
            try:
                for method in ("per-node copy", "broadcast"):
                    row = run_job(env, work, nodes, method, data, table_file, local)
                    rows.append(row)
                    # Each node's disk emptied (not replaced: its mount holds the folder).
                    for copy in (work / f"slurm-{nodes}" / "local").glob("*/*"):
                        shutil.rmtree(copy) if copy.is_dir() else copy.unlink()
                    print(f"{nodes:>3} nodes, {method:<13}: {row['seconds']:7.1f} s; the shared copy "
                          f"read {row['shared_bytes_read'] / 1e6:8.1f} MB ({row['shared_bytes_read'] / size:.2f}"
                          f" x the archives) in {row['shared_opens']} opens; slowest node: copy "
                          f"{row['node_copy_s']:.1f} s, read back {row['node_verify_s']:.1f} s, "
                          f"MD5 of a copy in place {row['node_hash_kept_s']:.1f} s", flush=True)
            finally:
                stop_slurm(env)
                shutil.rmtree(work / f"slurm-{nodes}", ignore_errors=True)
        (work.parent / "stage-archives.json").write_text(json.dumps(rows, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
