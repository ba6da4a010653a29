"""The shared history of a benchmark run: the contract every store backend keeps."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

from automlperf.events import EpochEvent
from automlperf.errors import UserError
from automlperf.store.limits import (Accuracy, Devices, Hash, Host, Id, Ids, Name, Number,
                                     Samples, Seconds, Status, Text, Time, Until)

# 2: replicas record why they stopped (a run that cannot train says so).
SCHEMA_VERSION = 2

# A sample's node and time, then its figures (sample_figures): numbers, GPU uuids, CPU energy.
SampleFigures = tuple[str, float, list[float], list[Any], Any]

_ABSENT = float("nan")


def sample_figures(sample: Mapping[str, Any]) -> tuple[list[float], list[Any], Any]:
    """What energy, utilisation, interference and the resource chart read from a monitor
    sample: the numbers ``[cpu_percent, mem_used_gib]`` followed by ``[index, util,
    energy_mj, mem_used_gib]`` of each GPU the sample lists (one that answered with an error
    too), then ``cpu_steal`` and each GPU's ``throttled`` (1 or 0), NaN where a reading is
    absent (samples stored before these last ones end after the GPUs'); the GPUs' uuids, in
    the same order; and the CPU energy counters (``cpu_energy_uj``, or None)."""
    gpus = sample.get("gpus") or ()
    numbers = [_number(sample.get("cpu_percent")), _number(sample.get("mem_used_gib"))]
    for g in gpus:
        numbers += (_number(g.get("index")), _number(g.get("util")), _number(g.get("energy_mj")),
                    _number(g.get("mem_used_gib")))
    numbers.append(_number(sample.get("cpu_steal")))
    numbers += [_number(None if g.get("throttled") is None else float(g["throttled"]))
                for g in gpus]
    return numbers, [g.get("uuid") for g in gpus], sample.get("cpu_energy_uj")


def _number(value: Any) -> Any:
    return _ABSENT if value is None else value


# The longest wait between two tries of a failed store call: how late a client may find
# the store back after an outage.
BACKOFF_MAX_S = 5.0


# Why a trial whose replica stopped heart-beating was ended by another process.
LEASE_EXPIRED = "replica stopped heart-beating; completed epochs are kept"


class StoreError(UserError, RuntimeError):
    """The store cannot do what was asked; the message says why."""


class SchemaMismatch(StoreError):
    """The store was written by an incompatible version of automlperf."""


@dataclass(kw_only=True)
class TrialRecord:
    id: int
    run_id: int
    replica_index: int
    replica_id: int | None
    graph_hash: str
    graph_json: str
    parent_id: int | None
    morphs: list[dict[str, Any]]
    round: int
    hparams: dict[str, Any]
    status: str
    reason: str
    created_at: float
    finished_at: float | None
    lease_until: float | None
    best_accuracy: float | None
    predicted_accuracy: float | None
    epochs_done: int
    weights_path: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def search_accuracy(self) -> float | None:
        """What the architecture search ranks by: the predicted accuracy while a trial was
        trained short (warm-up rounds), the measured one otherwise."""
        return self.predicted_accuracy if self.predicted_accuracy is not None else self.best_accuracy


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A replica's claim on an architecture, as :meth:`Store.claim_trial` records it: the
    trial it makes, running under the claim's lease (``lease_s`` from ``now``) until its
    replica's heartbeats hold it."""

    run_id: Id
    replica_id: Id
    replica_index: Id
    graph_hash: Hash
    graph_json: Text
    parent_id: Id | None
    morphs: list[dict[str, Any]]
    round: Id
    hparams: dict[str, Any]
    now: Time
    lease_s: Seconds


@dataclass(kw_only=True)
class TrialSummary:
    id: int
    graph_hash: str
    status: str
    replica_index: int
    best_accuracy: float | None
    predicted_accuracy: float | None

    @property
    def search_accuracy(self) -> float | None:
        return self.predicted_accuracy if self.predicted_accuracy is not None else self.best_accuracy


@dataclass(kw_only=True)
class TrialChange(TrialSummary):
    """A trial as a history read since an earlier one finds it: claimed or ended at change
    number ``changed``. ``graph_hash`` is empty where the reader was sent it before (a trial
    ended that it saw claimed)."""

    changed: int


T = TypeVar("T")


@dataclass(kw_only=True)
class Changes(Generic[T]):
    """What changed since a reader's last read. ``through``: every change numbered up to it
    is in ``rows`` or an earlier read (None where the store cannot say: a number skipped is
    then asked for again, see store/feed.py)."""

    rows: list[T]
    through: int | None = None


@dataclass(kw_only=True)
class TrialTally:
    """How many of a replica's trials stand at ``status``, and the newest of them."""

    replica_index: int
    status: str
    count: int
    last_id: int


@dataclass(kw_only=True)
class EpochRecord(EpochEvent):
    """An epoch as stored: the trainer's event and the run it belongs to."""

    run_id: int


# EpochRecord's fields, in order, but its run: the trial log's order (events.EpochEvent), an
# exported epoch's line (store/records.py), and the columns a read takes (store/reads.py).
EPOCH_FIELDS = tuple(f.name for f in fields(EpochRecord) if f.name != "run_id")


@dataclass(kw_only=True)
class SegmentRecord:
    """One session of the primary: a run interrupted and resumed has several."""

    run_id: int
    index: int
    started_at: float
    deadline_at: float
    last_seen: float
    ended_at: float | None

    @property
    def end(self) -> float:
        return self.ended_at if self.ended_at is not None else self.last_seen


@dataclass(kw_only=True)
class ReplicaRecord:
    id: int
    run_id: int
    index: int
    segment: int
    host: str
    pid: int
    devices: list[str]
    started_at: float
    last_heartbeat: float
    status: str
    reason: str = ""


class RunRecords(ABC):
    """What a finished run recorded, read-only: the part of the store that ``check``, the
    result and the report read. A :class:`Store` is one; a submission bundle's exported
    records (:class:`automlperf.store.records.ExportedRecords`) are another, read without
    any database."""

    @abstractmethod
    def run(self, run_id: Id) -> dict[str, Any]:
        """The run: its id, name, created_at, duration_s, config and system (parsed);
        :class:`StoreError` when there is no such run."""

    @abstractmethod
    def segments(self, run_id: Id) -> list[SegmentRecord]:
        """The run's sessions of the primary, oldest first."""

    @abstractmethod
    def replicas(self, run_id: Id) -> list[ReplicaRecord]:
        """The run's replica processes, in the order they registered."""

    @abstractmethod
    def trials(self, run_id: Id, after_id: Number = 0) -> list[TrialRecord]:
        """The run's trials numbered above ``after_id``, by id, each with its graph and
        with ``best_accuracy`` so far for one still running."""

    @abstractmethod
    def epochs(self, run_id: Id) -> list[EpochRecord]:
        """Every epoch the run recorded, by when it ended."""

    @abstractmethod
    def samples(self, run_id: Id) -> list[dict[str, Any]]:
        """The monitor's samples as it recorded them, each with its ``node``, by time."""

    def sample_figure_chunks(self, run_id: int,
                             nodes: Sequence[str] | None = None) -> Iterator[list[SampleFigures]]:
        """The figures (:func:`sample_figures`) of the run's samples (of ``nodes``, or all)
        with their node and time, in :meth:`samples`' order and in chunks: a long run's
        million need not be held at once."""
        yield [(s.get("node", ""), s["t"], *sample_figures(s)) for s in self.samples(run_id)
               if nodes is None or s.get("node") in nodes]

    def sample_nodes(self, run_id: int) -> dict[str, int]:
        """How many samples each node stored."""
        counts: dict[str, int] = {}
        for s in self.samples(run_id):
            counts[s.get("node", "")] = counts.get(s.get("node", ""), 0) + 1
        return counts

    def sample_texts(self, run_id: int) -> Iterator[list[tuple[str, str]]]:
        """Each sample's node and the sample as the monitor recorded it (JSON text), in
        :meth:`samples`' order and in chunks, for copying them out unparsed."""
        yield [(s.get("node", ""), json.dumps({k: v for k, v in s.items() if k != "node"}))
               for s in self.samples(run_id)]

    @abstractmethod
    def nodes(self, run_id: Id) -> list[dict[str, Any]]:
        """Every node description, oldest first, each with ``replica_index``, ``segment``,
        ``host`` and ``recorded_at`` beside its own fields. Stores made before nodes were
        recorded have none."""


class Store(RunRecords):
    """The history of runs, replicas, trials, epochs and monitor samples.

    Contract (every backend, checked by one test class):

    * A run's schema version is checked on open; an incompatible store is refused with
      :class:`SchemaMismatch`, never migrated silently.
    * Nothing recorded is rewritten. Epochs are insert-only and an epoch recorded twice is an
      error, unless the record is the same (a retry whose first try committed unseen).
      A trial's status moves once, from ``running`` to ``completed``, ``failed`` or
      ``stopped``; a later attempt to finish it again returns False and changes nothing.
    * Each architecture is trained once per run: :meth:`claim_trial` returns None when the
      same graph hash is already claimed, by any replica.
    * A running trial holds a lease: its claim's, then its replica's, which each
      :meth:`heartbeat` extends; :meth:`expire_leases` fails trials whose lease has lapsed
      (their replica stopped heart-beating). Their recorded epochs stay and still count.
    * A write sent again because its answer was lost (its first try committed unseen)
      takes effect once: a claim, epoch, node, registration or batch of samples is recorded
      once, and finishing a trial again as it was finished returns True.
    * Methods are safe to call from several processes at once, and retry transient
      connection failures with back-off before giving up with :class:`StoreError`.
    """

    url: str
    # When a call last succeeded after the store had failed (time.time(); 0: never).
    restored_at: float = 0.0

    def silent_since(self, written_at: float) -> float:
        """Since when the writer of a heartbeat (or a segment's ``last_seen``) written at
        ``written_at`` has been silent: after an outage, not before every client of the store
        has had time (its longest back-off) to find it back, since nobody could write while
        it was out."""
        if not self.restored_at:
            return written_at
        return max(written_at, self.restored_at + BACKOFF_MAX_S)

    # runs and segments ---------------------------------------------------------------------
    @abstractmethod
    def create_run(self, name: Name, config: dict[str, Any], system: dict[str, Any],
                   duration_s: Seconds, now: Time) -> int:
        """The id of a new run of ``duration_s`` seconds, created at ``now``."""

    @abstractmethod
    def extend_run(self, run_id: Id, duration_s: Seconds, config: dict[str, Any],
                   system: dict[str, Any]) -> None:
        """Give the run a longer duration (its configuration and system record, which
        name the extension, with it)."""

    @abstractmethod
    def start_segment(self, run_id: Id, now: Time, deadline_at: Until) -> int:
        """The index of the primary's new session of the run (0 for its first), started
        at ``now`` and due to end at ``deadline_at``."""

    @abstractmethod
    def touch_segment(self, run_id: Id, index: Id, now: Time) -> None:
        """The primary of session ``index`` was alive at ``now`` (``last_seen``); an ended
        session is left as it is."""

    @abstractmethod
    def end_segment(self, run_id: Id, index: Id, ended_at: Time) -> None:
        """Session ``index`` ended at ``ended_at``; one that had ended is left as it is."""

    # replicas ------------------------------------------------------------------------------
    @abstractmethod
    def register_replica(self, run_id: Id, index: Id, segment: Id, host: Host, pid: Id,
                         devices: Devices, now: Time) -> int:
        """The id of replica ``index`` of session ``segment``, starting at ``now`` as process
        ``pid`` on ``host`` with ``devices``; running, with a heartbeat at ``now``."""

    @abstractmethod
    def heartbeat(self, replica_id: Id, now: Time, lease_s: Seconds) -> SegmentRecord | None:
        """Mark the replica alive until ``now + lease_s`` (the leases of its running trials
        follow), and return its session as the primary last wrote it (None: no such
        replica)."""

    @abstractmethod
    def end_replica(self, replica_id: Id, status: Status, now: Time, reason: Text = "") -> None:
        """Record how a running replica ended; ``reason`` says why one gave up."""

    @abstractmethod
    def replica_changes(self, run_id: Id, after: Number,
                        also: Ids = ()) -> Changes[tuple[int, ReplicaRecord]]:
        """(change number, replica) of the replicas registered or ended since change
        ``after`` (and those numbered in ``also``): what the primary reads every second."""

    @abstractmethod
    def silent_replicas(self, run_id: Id, before: Time) -> list[int]:
        """Ids of the running replicas whose last heartbeat is older than ``before``."""

    # trials --------------------------------------------------------------------------------
    @abstractmethod
    def claim_trial(self, claim: Claim) -> int | None:
        """The id of the trial ``claim`` makes; None when its architecture is claimed in the
        run already."""

    @abstractmethod
    def finish_trial(self, trial_id: Id, status: Status, now: Time, reason: Text = "",
                     best_accuracy: Accuracy | None = None,
                     predicted_accuracy: Accuracy | None = None, weights_path: Text | None = None,
                     extra: dict[str, Any] | None = None) -> bool:
        """End a running trial as ``status`` (``completed``, ``failed`` or ``stopped``) at
        ``now``, with its figures. True when it ended so: now, or by this very call sent
        again; False when it had ended otherwise before (nothing is changed)."""

    @abstractmethod
    def expire_leases(self, run_id: Id, now: Until) -> list[int]:
        """Fail the run's running trials whose lease has lapsed by ``now``
        (:data:`LEASE_EXPIRED`); the ids of those failed now."""

    @abstractmethod
    def trial(self, trial_id: Id) -> TrialRecord:
        """The trial, as :meth:`trials` gives it; :class:`StoreError` when there is none."""

    @abstractmethod
    def tally(self, run_id: Id) -> list[TrialTally]:
        """Trials counted by replica and status: a few rows, however long the history."""

    @abstractmethod
    def summaries(self, run_id: Id) -> list[TrialSummary]:
        """Every trial's id, hash, status and accuracies, without its graph."""

    @abstractmethod
    def changes(self, run_id: Id, after: Number, also: Ids = ()) -> Changes[TrialChange]:
        """The trials claimed or ended since change ``after`` (and those numbered in
        ``also``), by change number: a replica's history read costs what changed since its
        last one, however long the history."""

    @abstractmethod
    def graphs(self, trial_ids: Ids) -> dict[int, str]:
        """The graphs (JSON) of these trials, by id: fetched when the search needs them."""

    # epochs and samples --------------------------------------------------------------------
    @abstractmethod
    def record_epoch(self, epoch: EpochRecord) -> None:
        """Record a completed epoch once; :class:`StoreError` when its trial's epoch is
        recorded already, differently."""

    @abstractmethod
    def epochs_after(self, run_id: Id, after: Number,
                     also: Ids = ()) -> list[tuple[int, int, EpochRecord]]:
        """(number, replica index, epoch) of the run's epochs the store numbered above
        ``after``, and of the epochs of any run numbered in ``also``, by number. Numbers
        follow the order the store received epochs in; one may show up later than a higher
        one while the transaction that took it commits (:class:`~automlperf.store.feed.EpochFeed`
        reads them all, each once)."""

    @abstractmethod
    def last_epoch_number(self) -> int:
        """The highest number the store has given a committed epoch of any run; 0 if none."""

    @abstractmethod
    def add_samples(self, run_id: Id, node: Host, samples: Samples) -> None:
        """Keep the monitor's ``samples`` of ``node`` (each a JSON object with its time
        ``t``), once."""

    # nodes ---------------------------------------------------------------------------------
    @abstractmethod
    def record_node(self, run_id: Id, replica_index: Id, segment: Id, host: Host,
                    description: dict[str, Any], now: Time) -> None:
        """What a replica found on its node when it started (hardware, measured ceiling)."""

    @abstractmethod
    def close(self) -> None:
        """Let go of the store's connections; the store takes no more calls."""
