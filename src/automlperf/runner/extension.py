"""A run given a longer duration once it has run: ``automlperf run --resume --duration`` (or
``automlperf slurm --resume --duration``). A pilot that answers "not yet" goes on as the
same run rather than start again.

The run becomes a run of the new length: its configuration, its store record and
``system.json`` carry the new duration, so its deadline, its grace for the epochs in flight
and its score are those of a run of that length, and ``check`` verifies it as such. What the
run did before is kept as it was (its sessions, and the grace its last deadline gave), and
``system.json`` lists every extension under ``extensions``: from what, to what, when, and
how much of the run had been done.
"""

from __future__ import annotations

import json
from typing import Any

from automlperf.config import Config
from automlperf.errors import UserError
from automlperf.report.console import fmt_duration
from automlperf.store import Store
from automlperf.store.rundir import RunDir, write_atomic


def run_time_done(store: Store, run_id: int) -> float:
    """Seconds of the run's duration its sessions have used."""
    return sum(min(s.end, s.deadline_at) - s.started_at for s in store.segments(run_id))


def check_longer(old_s: float, duration_s: float) -> None:
    """Refuse a ``duration_s`` that does not extend a run of ``old_s``."""
    if duration_s <= old_s:
        raise UserError(f"--duration {fmt_duration(duration_s)} does not extend this run, "
                        f"which lasts {fmt_duration(old_s)}: give a longer one, or leave "
                        "--duration out to continue it")


def extend(store: Store, rd: RunDir, run_id: int, duration_s: float,
           now: float) -> tuple[Config, dict[str, Any]]:
    """Make the run in ``rd`` a run of ``duration_s`` (longer than its own): its new
    configuration, and the extension as recorded."""
    run = store.run(run_id)
    old = float(run["duration_s"])
    check_longer(old, duration_s)
    config = Config.load(rd.config)
    config = config.model_copy(update={"run": config.run.model_copy(
        update={"duration_s": duration_s})})
    record = {"from_s": old, "to_s": duration_s, "at": now,
              "done_s": round(run_time_done(store, run_id), 3)}
    system = dict(run["system"])
    system["extensions"] = [*system.get("extensions", []), record]
    # The store first: it is what check verifies the files against.
    store.extend_run(run_id, duration_s, config.model_dump(mode="json"), system)
    write_atomic(rd.config, config.to_toml())
    write_atomic(rd.system, json.dumps(system, indent=1) + "\n")
    return config, record
