"""What a replica records of its node, beside its trials: the node's description and ceiling
as training starts, the ceiling again once the session's time is over (measure/
interference.py compares the two), and the MD5s of a staged copy of the data that the
replica hashed during its session (runner/stagecheck.py). Each is a record of the node in
the store, the latest of which the result reads."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Any, Protocol

from automlperf.runner.stagecheck import StagedCheck
from automlperf.store import SegmentRecord, Store

log = logging.getLogger("automlperf.replica")

Probe = Callable[[dict[str, Any] | None], dict[str, Any] | None]


class Remeasurable(Protocol):
    """A trainer whose training processes measured the node as they started and can do so
    again (train/pooltrainer.py ``PoolTrainer``)."""

    def measure_again(self) -> dict[str, Any] | None: ...


class RankEnd:
    """The end's measurement of a CPU node by the training process that measured its start,
    torch loaded and idle between trials (no process of its own to start); where that rank is
    gone (a trial stopped past the grace kills the ranks), ``fallback``'s. Called before the
    ranks stop (``by_ranks``)."""

    by_ranks = True

    def __init__(self, trainer: Remeasurable, fallback: Callable[[], dict[str, Any]]) -> None:
        self.trainer = trainer
        self.fallback = fallback

    def __call__(self) -> dict[str, Any]:
        found = self.trainer.measure_again()
        return found if found is not None else self.fallback()


class NodeRecords:
    """The records of one replica's node. ``probe`` describes the node (and measures its
    ceiling) before training starts, or, when it answers None, once the trainer has started,
    from the trainer's description; ``measure_end`` measures the ceiling again once the run's
    time is over (where it has ``prepare`` and ``close``, as measure/ceiling.py's
    ``EndMeasurement``, it is prepared as the deadline passes and closed at the end);
    ``data_check`` is the staged copy being hashed."""

    def __init__(self, store: Store, run_id: int, index: int, segment: SegmentRecord,
                 clock: Callable[[], float], stop: threading.Event, *,
                 probe: Probe | None = None,
                 measure_end: Callable[[], dict[str, Any]] | None = None,
                 data_check: StagedCheck | None = None) -> None:
        self.run_id = run_id
        self.index = index
        self.segment = segment
        self.store = store
        self.clock = clock
        self.stop = stop  # set when the replica ends
        self.probe = probe
        self.measure_end = measure_end
        self.data_check = data_check
        self.node: dict[str, Any] | None = None  # the description, once recorded

    def _record(self, node: dict[str, Any]) -> None:
        self.node = node
        self.store.record_node(self.run_id, self.index, self.segment.index,
                               socket.gethostname(), node, self.clock())

    def describe(self, started: dict[str, Any] | None) -> bool:
        """Describe this node, before training starts so that a measurement has the devices
        to itself, or, where the probe needs them (a CPU's ceiling is measured by the first
        training process, which loads torch anyway), once the training processes have
        ``started``. Whether the node is described."""
        if self.probe is None:
            return True
        if started is not None and self.node is not None:
            # Described before the ranks started: the description again, with where they
            # run (a node's latest record is the one results read).
            found = self.node
        else:
            probed = self.probe(started)
            if probed is None:
                return False
            found = probed
            ceiling = found.get("ceiling_ops")
            log.info("replica %d: measured ceiling %s", self.index,
                     f"{ceiling:.4e} ops/s" if ceiling else found.get("error"))
        if started is not None and started.get("binding"):
            found = {**found, "binding": started["binding"]}
        self._record(found)
        return True

    def prepare_end(self) -> None:
        """Where the end's measurement can be prepared, prepare it as the deadline passes
        (in a thread of its own), so that its imports (about 1.5 CPU-s) overlap the epoch in
        flight rather than follow it; it measures only once the ranks have stopped."""
        prepare = getattr(self.measure_end, "prepare", None)
        if prepare is not None:
            threading.Thread(target=self._prepare_at_deadline, args=(prepare,),
                             name="end-ceiling", daemon=True).start()

    def _prepare_at_deadline(self, prepare: Callable[[], None]) -> None:
        while not self.stop.wait(min(1.0, max(0.0, self.segment.deadline_at - self.clock()))):
            if self.clock() >= self.segment.deadline_at:
                prepare()
                return

    def record_end_ceiling(self) -> None:
        """The node's ceiling measured again once the session's time is over, recorded
        beside the start's. Not for a replica that ends before its deadline (its rounds
        done): the seconds would be the run's."""
        if self.measure_end is None or self.node is None:
            return
        if self.clock() < self.segment.deadline_at:
            return
        try:
            found = self.measure_end()
        except Exception as exc:  # noqa: BLE001 - the run's result stands without it
            found = {"error": f"{type(exc).__name__}: {exc}"}
        ceiling = found.get("ceiling_ops")
        log.info("replica %d: ceiling at the end %s", self.index,
                 f"{ceiling:.4e} ops/s" if ceiling else found.get("error"))
        try:
            self._record({**self.node, "ceiling_end": found.get("ceiling"),
                          "ceiling_end_ops": ceiling, "ceiling_end_error": found.get("error"),
                          "ceiling_end_at": self.clock()})
        except Exception:  # noqa: BLE001 - the run's result stands without it
            log.warning("replica %d: the end's ceiling was not recorded", self.index,
                        exc_info=True)

    def record_data_check(self, wait_s: float) -> None:
        """The MD5s this replica computed of the archives staged on its node, recorded in
        its node description once its ranks have stopped (waiting up to ``wait_s`` for the
        hashing to finish): the result holds them to the MD5s the run proved."""
        if self.data_check is None or self.node is None or "data" not in self.node:
            return
        computed = self.data_check.record(wait_s)
        if computed["computed"] is None:
            log.warning("replica %d: the archives staged on this node were not hashed by the "
                        "session's end (%s)", self.index, computed.get("computed_error", "not "
                        "finished"))
        try:
            self._record({**self.node, "data": {**self.node["data"], **computed}})
        except Exception:  # noqa: BLE001 - the result then names the copy as not hashed
            log.warning("replica %d: the staged archives' MD5s were not recorded", self.index,
                        exc_info=True)

    def close(self) -> None:
        """Close the end's measurement if it was prepared and never told (a replica that
        failed, or ended before its deadline)."""
        close = getattr(self.measure_end, "close", None)
        if close is not None:
            close()
