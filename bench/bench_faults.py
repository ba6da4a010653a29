"""The fault campaign: every fault a cluster throws at a run, each through `automlperf run`,
and what the run made of it.

Data faults train for real on JPEG folders (fault_cases_data.py); store faults stop and
fill the run's store (fault_cases_store.py); node and resource faults cancel, freeze and
starve replicas on a local SLURM cluster or the local launcher (fault_cases_node.py). The
control-plane faults use the simulated accelerator, so minutes of run are seconds of machine.

One table: fault, expected behaviour, what happened (the run's one line, or what it
trained), exit status, records (trials + epochs) in the store before the fault and at the
end, epochs in the trial logs and in the store at the end, records lost and duplicated
counted from both sides (fault_common.account: an epoch, a trial's outcome or a trial on one
side only, a record held at the fault and gone at the end; anything held twice), `check`'s
verdict where the run finished, and seconds from the fault to its detection (or to the
run's exit). Cases needing root or a system program this machine lacks say so in their row.

Run: python bench/bench_faults.py [--only SUBSTRING] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODULES = ("fault_cases_data", "fault_cases_store", "fault_cases_node")
COLUMNS = ("fault", "expected", "happened", "exit", "records_before", "records_after",
           "epochs_logged", "epochs_stored", "lost", "duplicated", "check", "detect_s", "seconds")


def campaign(only: str | None) -> list[dict[str, Any]]:
    rows = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            rows.append({"fault": name, "expected": "-", "happened": f"not run: {exc}"})
            continue
        for fault, expected, case in module.cases():
            if only and only not in fault:
                continue
            # A daemon a case stopped may still write its state for a moment: what is left
            # then is not the case's result.
            with tempfile.TemporaryDirectory(prefix="automlperf-fault-",
                                             ignore_cleanup_errors=True) as work:
                started = time.monotonic()
                try:
                    row = case(Path(work))
                except Exception as exc:  # noqa: BLE001 - one broken case is a row, not the end
                    traceback.print_exc()
                    row = {"happened": f"CASE FAILED: {type(exc).__name__}: {exc}"}
                row = {"fault": fault, "expected": expected, **row,
                       "seconds": round(time.monotonic() - started, 1)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [str(row.get(c, "")).replace("|", "/") for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run only the faults whose name contains this")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    rows = campaign(args.only)
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
