"""What a cluster job spends before the run's clock, part by part, on this machine: the
private PostgreSQL server's start, the primary's imports, the node's description, and the
dataset: walked (one stat per file) and its index saved, against the index loaded by a later
step and the check a replica makes that the data is on its node. The dataset is ImageNet's
file count, 1,281,167 + 50,000 hard links to one small JPEG (tests/test_identity.py's tree),
in the page cache: a parallel file system answers each stat far slower (the suite's slow
file system, 300 reads/s, took ~30 s for 104,000 files).

    python bench/bench_startup.py [--files N]
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1_281_167)
    args = ap.parse_args()
    from automlperf.dataset_identity import build_shared_index, check_data_here, load_shared_index
    from automlperf.store.pgserver import PostgresServer
    from test_identity import make_tree

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
        figures["files"] = shared.found.files
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
