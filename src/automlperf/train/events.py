"""Where a trainer's per-epoch events and trial outcomes go: one small interface."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from automlperf.train.trainer import EpochEvent, TrialOutcome


class EventSink(Protocol):
    def epoch(self, event: EpochEvent) -> None: ...

    def trial(self, outcome: TrialOutcome) -> None: ...


class JsonlSink:
    """Appends one JSON object per line and flushes it to disk before returning, so an
    interrupted run keeps every event it reported."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def epoch(self, event: EpochEvent) -> None:
        self._write({"type": "epoch", **event.to_dict()})

    def trial(self, outcome: TrialOutcome) -> None:
        self._write({"type": "trial", **outcome.to_dict()})

    def close(self) -> None:
        self._file.close()


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """Records of a JSON-lines file; a torn last line (a kill mid-write) is ignored."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
