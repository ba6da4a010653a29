"""What a cluster job spends before the run's clock, part by part, on this machine: the
private PostgreSQL server's start, the primary's imports, the node's description, and the
dataset: walked (one stat per file) and its index saved, against the index loaded by a later
step and the check a replica makes that the data is on its node. The dataset is ImageNet's
file count, 1,281,167 + 50,000 hard links to one small JPEG (tests/trees.py's tree),
in the page cache: a parallel file system answers each stat far slower (the suite's slow
file system, 300 reads/s, took ~30 s for 104,000 files).

    python bench/bench_startup.py [--files N]
    python bench/bench_startup.py --sizes    # what a run keeps: sizes, counted, not timed
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - started


SIZES_CONFIG = """[run]
accelerator = "simulated"
duration_s = 60
heartbeat_s = 1
[data]
dataset = "digits"
[train]
max_epochs = 2
batch_size = 64
[search]
tpe_startup_trials = 1
candidates_per_generation = 16
[monitor]
interval_s = 1
ceiling_s = 0.3
[simulation]
sustained_ops = 2e11
"""


def sizes() -> dict[str, int]:
    """A ResNet-50 trial's graph and weights; the private server before a run, and its
    tables after a simulated 60 s run of the small seed on the digits."""
    import os

    import psycopg
    from safetensors.torch import save_file

    from automlperf.graph import seeds
    from automlperf.store.pgserver import PostgresServer
    from automlperf.train import build_module

    graph = seeds.resnet50()
    out = {"resnet50_graph_bytes": len(graph.to_json() + "\n")}
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        base = Path(tmp)
        module = build_module(graph)
        save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(base / "w"))
        out["resnet50_weights_bytes"] = (base / "w").stat().st_size
        server = PostgresServer(base / "pg")
        url = server.start()
        out["server_bytes"] = sum(p.stat().st_size for p in (base / "pg").rglob("*") if p.is_file())
        (base / "sim.toml").write_text(SIZES_CONFIG)
        env = dict(os.environ, AUTOMLPERF_STORE_PASSWORD=server.password)
        subprocess.run([sys.executable, "-m", "automlperf.cli", "run", "--config",
                        str(base / "sim.toml"), "--store", url.replace(f":{server.password}@", "@"),
                        "--run-dir", str(base / "run")], env=env, check=True, capture_output=True)
        with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as c:
            for name, sql in (("database_bytes", "select pg_database_size('automlperf')"),
                              ("table_bytes", "select sum(pg_total_relation_size(c.oid)) from "
                               "pg_class c join pg_namespace n on n.oid = c.relnamespace where "
                               "n.nspname = 'public' and c.relkind = 'r'"),
                              ("epochs", "select count(*) from amp_epochs"),
                              ("trials", "select count(*) from amp_trials"),
                              ("samples", "select count(*) from amp_samples")):
                out[name] = int(c.execute(sql).fetchone()[0])
        server.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1_281_167)
    ap.add_argument("--sizes", action="store_true")
    args = ap.parse_args()
    if args.sizes:
        print(json.dumps(sizes(), indent=1))
        return
    from automlperf.dataset.shared import build_shared_index, check_data_here, load_shared_index
    from automlperf.store.pgserver import PostgresServer
    from trees import make_tree

    py = sys.executable
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        base = Path(tmp)
        server = PostgresServer(base / "pg")
        started = time.perf_counter()
        server.start()
        figures["server_start_s"] = time.perf_counter() - started
        server.stop()
        figures["python_start_s"] = timed([py, "-c", "pass"])
        figures["primary_imports_s"] = timed([py, "-c", "import automlperf.cli.running, "
                                              "automlperf.runner.primary, automlperf.runner.session"])
        figures["describe_s"] = timed([py, "-c", "from automlperf.measure.system import describe; "
                                       "describe()"]) - figures["python_start_s"]
        val = max(1, args.files * 50_000 // 1_281_167)
        root = make_tree(base / "imagenet", counts=(args.files, val))
        started = time.perf_counter()
        shared = build_shared_index(root, base / "run")
        figures["files"] = shared.identity["files"]
        figures["walk_and_save_s"] = time.perf_counter() - started
        figures["walk_s"] = shared.scan_s
        started = time.perf_counter()
        loaded = load_shared_index(base / "run", root)
        figures["load_current_s"] = time.perf_counter() - started
        assert loaded is not None and len(loaded.index) == len(shared.index)
        started = time.perf_counter()
        check_data_here(base / "run" / "dataset-index", root)
        figures["replica_check_s"] = time.perf_counter() - started
        figures["index_bytes"] = sum(p.stat().st_size for p in (base / "run" / "dataset-index").iterdir())
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()},
                     indent=1))


if __name__ == "__main__":
    main()
