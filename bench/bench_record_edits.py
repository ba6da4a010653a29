"""Edits of a bundle's records that once turned a check off instead of failing it, each made
as a forger would, and what `check` says of each.

Each edit is made on a copy of BUNDLE (a folder, as `automlperf submit --dir` writes it):
result.json is recomputed by the project's own recomputation (`build_result` on the edited
records) unless the edit is of result.json itself, the manifest is written again, and
`check_run` verifies the copy. For each: whether `check` passes, and what refuses it: the
first mismatches it names or, where the records agree, the rule that makes the result not
valid. Three edits of an official configuration are tried on `Config` itself.

Run: python bench/bench_record_edits.py BUNDLE [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from automlperf.config import Config, ConfigError
from automlperf.measure.result import build_result, write_result
from automlperf.store.records import ExportedRecords
from automlperf.submission.bundle import write_manifest
from automlperf.submission.check import check_run

# Returns the result.json to write, or None: the one the edited records recompute to.
Edit = Callable[[Path], "dict[str, Any] | None"]


def _read(path: Path) -> Any:
    return json.loads(path.read_text())


def _write(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=1) + "\n")


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _system(bundle: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    run = _read(bundle / "records" / "run.json")
    change(run["system"])
    _write(bundle / "records" / "run.json", run)
    system = _read(bundle / "system.json")
    change(system)
    _write(bundle / "system.json", system)


def _recomputed(bundle: Path) -> dict[str, Any]:
    run_id = _read(bundle / "run.json")["run_id"]
    records = ExportedRecords(bundle)
    return build_result(records, run_id, Config.load(bundle / "config.toml"),
                        records.run(run_id)["system"])


def delete_ruleset(bundle: Path) -> dict[str, Any]:
    _system(bundle, lambda s: s.pop("ruleset", None))
    result = _recomputed(bundle)
    result.pop("ruleset", None)
    result.update(devices=512, nodes=64, ops_per_s_per_device=result["score"] / 512)
    return result


def earlier_ruleset(bundle: Path) -> None:
    """The ruleset before the one the bundle names, in all three places."""
    order = ["aiperf-2021.1", "aiperf-2021.2", "aiperf-2021.3", "aiperf-2021.4"]
    named = _read(bundle / "records" / "run.json")["system"].get("ruleset", order[1])
    _system(bundle, lambda s: s.update(ruleset=order[max(0, order.index(named) - 1)]))


def remove_ceiling(bundle: Path) -> None:
    nodes = _rows(bundle / "records" / "nodes.jsonl")
    nodes[-1].update(ceiling_ops=None, error="the measurement took over 300 s")
    nodes[-1].pop("ceiling", None)
    _write_rows(bundle / "records" / "nodes.jsonl", nodes)


def null_ceiling_rate(bundle: Path) -> None:
    nodes = _rows(bundle / "records" / "nodes.jsonl")
    nodes[-1]["ceiling_ops"] = None
    _write_rows(bundle / "records" / "nodes.jsonl", nodes)


def drop_devices(bundle: Path) -> None:
    for name in ("replicas.jsonl", "nodes.jsonl"):
        rows = _rows(bundle / "records" / name)
        for row in rows:
            row["devices"] = []
        _write_rows(bundle / "records" / name, rows)


def stretch_duration(bundle: Path) -> None:
    run = _read(bundle / "records" / "run.json")
    before = run["duration_s"]
    run["duration_s"] = run["config"]["run"]["duration_s"] = 7199.0
    _write(bundle / "records" / "run.json", run)
    config = bundle / "config.toml"
    config.write_text(config.read_text().replace(f"duration_s = {float(before)!r}",
                                                 "duration_s = 7199.0"))


def rename_and_backdate(bundle: Path) -> dict[str, Any]:
    result = _read(bundle / "result.json")
    result.update(name="Fastest Cluster", started_at=result["started_at"] - 365 * 86400)
    return result


def smooth_labels(bundle: Path) -> dict[str, Any]:
    config = bundle / "config.toml"
    config.write_text(config.read_text().replace("label_smoothing = 0.1", "label_smoothing = 0.3"))
    return _read(bundle / "result.json")


EDITS: list[tuple[str, Edit]] = [
    ("ruleset deleted (store, system.json, result.json), result recomputed, then 64 nodes "
     "and 512 devices", delete_ruleset),
    ("ruleset changed to the one before it, in all three", earlier_ruleset),
    ("a node's ceiling removed (rate null, its measurement gone)", remove_ceiling),
    ("a node's ceiling rate nulled, its measurement kept", null_ceiling_rate),
    ("devices removed from replicas.jsonl and nodes.jsonl, the ceiling kept", drop_devices),
    ("duration set to 7,199 s (store and config.toml)", stretch_duration),
    ("name and date edited in result.json", rename_and_backdate),
    ("label smoothing 0.1 -> 0.3 in config.toml", smooth_labels),
]

def refusal(report: Any, before: list[dict[str, str]]) -> str:
    """The first mismatches named, else the violations the edit added to the unedited
    bundle's (``before``)."""
    if report.mismatches:
        shown = "; ".join(m[:240] for m in report.mismatches[:2])
        more = len(report.mismatches) - 2
        return shown + (f" (+{more} more)" if more > 0 else "")
    broken = [v for v in report.result.get("violations", []) if v not in before]
    if broken:
        return "not valid: " + "; ".join(f"{v['rule']}: {v['detail'][:200]}" for v in broken)
    return "nothing"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="keep the edited copies here")
    args = parser.parse_args()
    work = args.out or Path(tempfile.mkdtemp(prefix="record-edits-"))
    work.mkdir(parents=True, exist_ok=True)
    before = check_run(args.bundle)
    print(f"unedited: {'passes' if before.ok else 'exit 1'}, violations "
          f"{sorted(v['rule'] for v in before.result.get('violations', []))}")
    print("| edit | check | what refuses it | check s |")
    print("|---|---|---|---|")
    for number, (name, edit) in enumerate(EDITS, start=1):
        copy = work / f"{number}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(args.bundle, copy)
        result = edit(copy)
        write_result(copy / "result.json", _recomputed(copy) if result is None else result)
        write_manifest(copy)
        started = time.perf_counter()
        report = check_run(copy)
        took = time.perf_counter() - started
        print(f"| {name} | {'passes' if report.ok else 'exit 1'} | "
              f"{refusal(report, before.result.get('violations', []))} | "
              f"{took:.1f} |")
    for name, tree in (
            ("official configuration: run.seed = 7", {"run": {"official": True, "seed": 7}}),
            ("official configuration: duration 7,199 s",
             {"run": {"official": True, "duration_s": 7199}}),
            ("official configuration: label_smoothing = 0.3",
             {"run": {"official": True}, "train": {"label_smoothing": 0.3}})):
        try:
            Config.parse(tree).check_official()
            said = "accepted"
        except ConfigError as exc:
            said = str(exc)[:200]
        print(f"| {name} | - | {said} | - |")
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
