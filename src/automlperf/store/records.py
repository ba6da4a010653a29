"""A run's records as files anyone can read without a database, and the read-only store over
them.

:func:`export_records` writes what the store holds of one run (the store's own field names;
docs/bundle.md describes every field)::

    records/run.json            the run: id, name, created_at, duration_s, config, system
    records/segments.jsonl      the primary's sessions, one JSON object per line
    records/replicas.jsonl      the replica processes
    records/nodes.jsonl         what each replica found on its node when it started
    records/trials.jsonl        the trials, without their graphs: each trial's graph is
                                trials/<id>/graph.json beside the records
    records/epochs/<id>.jsonl   the epochs of trial <id>, in the trial log's field order
    records/samples.jsonl       the monitor's samples as it recorded them, each with its node

:class:`ExportedRecords` reads them back as a :class:`~automlperf.store.base.RunRecords`, so
``automlperf check`` verifies a submission bundle with the code that verifies a run
directory. Epochs are one file per trial so that a bundle can store each beside the trial's
log, which repeats its numbers: compressed together, the two cost little more than one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from automlperf.store.base import (EPOCH_FIELDS, EpochRecord, ReplicaRecord, RunRecords,
                                   SampleFigures, SegmentRecord, StoreError, TrialRecord,
                                   sample_figures)
from automlperf.store.hints import checker, field_hints, named
from automlperf.store.values import bulk

FORMAT = "automlperf-records"
VERSION = 1
RECORDS = "records"
EPOCHS = "epochs"
SAMPLES = "samples.jsonl"
TRIAL_FIELDS = tuple(f.name for f in dataclasses.fields(TrialRecord)
                     if f.name not in ("run_id", "graph_json"))
SEGMENT_FIELDS = ("index", "started_at", "deadline_at", "last_seen", "ended_at")
REPLICA_FIELDS = tuple(f.name for f in dataclasses.fields(ReplicaRecord) if f.name != "run_id")


class RecordsError(StoreError):
    """Exported records that cannot be read; the message names the file and line."""


@dataclasses.dataclass
class Exported:
    """What :func:`export_records` wrote: counts, and the files by kind."""

    trials: int
    epochs: int
    samples_stored: int
    samples_written: int


def read_versioned(path: Path, name: str, fmt: str, version: int,
                   error: type[Exception]) -> dict[str, Any]:
    """The JSON object at ``path`` (called ``name``) of format ``fmt``, in ``version`` or an
    earlier one; raises ``error`` saying what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{name} is missing") from None
    except (OSError, ValueError) as exc:
        raise error(f"{name} cannot be read ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise error(f"{name} is not {fmt}")
    if not isinstance(data.get("version"), int) or data["version"] > version:
        raise error(f"{name}: {fmt} version {data.get('version')!r} is newer than this "
                    f"automlperf reads ({version}); upgrade automlperf")
    return data


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record) + "\n"


def export_records(store: RunRecords, run_id: int, folder: Path,
                   keep_sample: Callable[[int], bool] | None = None) -> Exported:
    """Write the run's records under ``folder``/records. ``keep_sample(i)`` says whether the
    i-th sample (in the store's order) is written; all are, without it."""
    out = folder / RECORDS
    (out / EPOCHS).mkdir(parents=True, exist_ok=True)
    run = store.run(run_id)
    (out / "run.json").write_text(json.dumps(
        {"format": FORMAT, "version": VERSION, **{k: run[k] for k in
                                                   ("id", "name", "created_at", "duration_s",
                                                    "config", "system")}}, indent=1) + "\n")
    with open(out / "segments.jsonl", "w", encoding="utf-8") as f:
        for s in store.segments(run_id):
            f.write(_line({name: getattr(s, name) for name in SEGMENT_FIELDS}))
    with open(out / "replicas.jsonl", "w", encoding="utf-8") as f:
        for r in store.replicas(run_id):
            f.write(_line({name: getattr(r, name) for name in REPLICA_FIELDS}))
    with open(out / "nodes.jsonl", "w", encoding="utf-8") as f:
        for description in store.nodes(run_id):
            f.write(_line(description))
    trials = store.trials(run_id)
    with open(out / "trials.jsonl", "w", encoding="utf-8") as f:
        for t in trials:
            f.write(_line({name: getattr(t, name) for name in TRIAL_FIELDS}))
    epochs = store.epochs(run_id)
    by_trial: dict[int, list[EpochRecord]] = {}
    for e in epochs:
        by_trial.setdefault(e.trial_id, []).append(e)
    for trial_id, mine in by_trial.items():
        mine.sort(key=lambda e: e.epoch)
        (out / EPOCHS / f"{trial_id}.jsonl").write_text("".join(
            _line({name: getattr(e, name) for name in EPOCH_FIELDS}) for e in mine))
    stored = written = 0
    with open(out / SAMPLES, "w", encoding="utf-8") as f:
        for chunk in store.sample_texts(run_id):
            for node, text in chunk:
                if keep_sample is None or keep_sample(stored):
                    f.write(_with_node(node, text) + "\n")
                    written += 1
                stored += 1
    return Exported(len(trials), len(epochs), stored, written)


def _with_node(node: str, text: str) -> str:
    """The sample's JSON object with its node as the first key, its own text unchanged."""
    body = text.strip()
    if not body.startswith("{"):
        raise StoreError(f"a sample of node {node!r} is not a JSON object")
    rest = body[1:].lstrip()
    head = '{"node": ' + json.dumps(node)
    return head + "}" if rest.startswith("}") else head + ", " + rest


class ExportedRecords(RunRecords):
    """The records under ``root``/records (and the graphs under ``root``/trials), read-only.
    A damaged file raises :class:`RecordsError` naming it."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.folder = self.root / RECORDS
        self._run: dict[str, Any] | None = None
        self._epochs: list[EpochRecord] | None = None

    def _path(self, name: str) -> Path:
        return self.folder / name

    def _name(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def _json_lines(self, path: Path) -> list[dict[str, Any]]:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise RecordsError(f"{self._name(path)} is missing") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise RecordsError(f"{self._name(path)} cannot be read ({exc})") from None
        return self._parse(path, text.splitlines())

    def _parse(self, path: Path, lines: list[str], first: int = 1) -> list[dict[str, Any]]:
        """The JSON objects of ``lines`` (line ``first`` onwards of ``path``), in one parse."""
        try:
            with bulk():
                records = json.loads("[" + ",".join(line for line in lines if line.strip()) + "]")
        except json.JSONDecodeError:
            for number, line in enumerate(lines, start=first):
                try:
                    json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RecordsError(f"{self._name(path)} line {number} is not JSON "
                                       f"({exc})") from None
            raise RecordsError(f"{self._name(path)} is not JSON Lines") from None
        if not all(isinstance(r, dict) for r in records):
            raise RecordsError(f"{self._name(path)}: every line must be a JSON object")
        return records

    def _build(self, path: Path, make: Callable[..., Any], rows: list[dict[str, Any]],
               **extra: Any) -> list[Any]:
        out = []
        # Each field as its record's hint says (a field missing is the record's to refuse).
        hints = field_hints(make)
        checks = {name: checker(kind) for name, kind in hints.items()}
        for number, row in enumerate(rows, start=1):
            for name, value in row.items():
                check = checks.get(name)
                if check is not None and not check(value):
                    raise RecordsError(f"{self._name(path)} record {number}: {name} is "
                                       f"{str(value)[:40]!r}, not {named(hints[name])}")
            try:
                out.append(make(**row, **extra))
            except (TypeError, ValueError) as exc:
                raise RecordsError(f"{self._name(path)} record {number} does not fit the "
                                   f"format ({exc})") from None
        return out

    def run(self, run_id: int) -> dict[str, Any]:
        if self._run is None:
            path = self._path("run.json")
            self._run = read_versioned(path, self._name(path), FORMAT, VERSION, RecordsError)
        if self._run.get("id") != run_id:
            raise RecordsError(f"the records hold run {self._run.get('id')}, not run {run_id}")
        return self._run

    def segments(self, run_id: int) -> list[SegmentRecord]:
        path = self._path("segments.jsonl")
        return self._build(path, SegmentRecord, self._json_lines(path), run_id=run_id)

    def replicas(self, run_id: int) -> list[ReplicaRecord]:
        path = self._path("replicas.jsonl")
        return self._build(path, ReplicaRecord, self._json_lines(path), run_id=run_id)

    def nodes(self, run_id: int) -> list[dict[str, Any]]:
        return self._json_lines(self._path("nodes.jsonl"))

    def trials(self, run_id: int, after_id: int = 0) -> list[TrialRecord]:
        path = self._path("trials.jsonl")
        rows = [r for r in self._json_lines(path) if not isinstance(r.get("id"), int)
                or r["id"] > after_id]
        # Derived from the epochs, as the store derives it (the exported value is for readers).
        done: dict[int, int] = {}
        for e in self.epochs(run_id):
            done[e.trial_id] = done.get(e.trial_id, 0) + 1
        for row in rows:
            row["graph_json"] = self._graph_text(row.get("id"))
            row["epochs_done"] = done.get(row.get("id"), 0)  # type: ignore[arg-type]
        return self._build(path, TrialRecord, rows, run_id=run_id)

    def _graph_text(self, trial_id: Any) -> str:
        """The trial's graph file as text; empty where it is missing (``check`` then says the
        stored graph is invalid)."""
        try:
            return (self.root / "trials" / str(trial_id) / "graph.json").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return ""

    def epochs(self, run_id: int) -> list[EpochRecord]:
        if self._epochs is None:
            out: list[EpochRecord] = []
            folder = self._path(EPOCHS)
            for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
                out += self._build(path, EpochRecord, self._json_lines(path), run_id=run_id)
            out.sort(key=lambda e: (e.ended_at, e.trial_id, e.epoch))  # the store's order
            self._epochs = out
        return list(self._epochs)

    def samples(self, run_id: int) -> list[dict[str, Any]]:
        return [s for chunk in self._sample_chunks() for s in chunk]

    CHUNK = 20_000

    def _sample_chunks(self) -> Iterator[list[dict[str, Any]]]:
        path = self._path(SAMPLES)
        try:
            f = open(path, encoding="utf-8")
        except FileNotFoundError:
            raise RecordsError(f"{self._name(path)} is missing") from None
        with f:
            number = 0
            while True:
                lines = [line for _, line in zip(range(self.CHUNK), f)]
                if not lines:
                    return
                chunk = self._parse(path, lines, number + 1)
                number += len(lines)
                if not all(isinstance(s.get("t"), (int, float)) for s in chunk):
                    raise RecordsError(f"{self._name(path)}: every sample must have a time t")
                yield chunk

    def sample_figure_chunks(self, run_id: int,
                             nodes: Sequence[str] | None = None) -> Iterator[list[SampleFigures]]:
        for chunk in self._sample_chunks():
            yield [(s.get("node", ""), s["t"], *sample_figures(s)) for s in chunk
                   if nodes is None or s.get("node") in nodes]

    def sample_texts(self, run_id: int) -> Iterator[list[tuple[str, str]]]:
        for chunk in self._sample_chunks():
            yield [(s.pop("node", ""), json.dumps(s)) for s in chunk]
