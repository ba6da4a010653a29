"""A replica: generate a candidate on the CPU, train it on this node's accelerators, record
it, repeat until the run's deadline. One replica runs per node (or per local process).

The next candidate is generated in a thread while the current one trains, so accelerators
do not wait for the search. The replica stops on SIGTERM, at the deadline, or when the
primary stops heart-beating; a trial cut short keeps the epochs it completed. At the
deadline no trial and no epoch starts, but under a ruleset that charges each replica its own
time the epoch in flight finishes if it can within the run's grace (and counts).
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from automlperf import rules
from automlperf.config import Config
from automlperf.events import TrialOutcome
from automlperf.graph import Graph, seeds
from automlperf.runner.noderecords import NodeRecords
from automlperf.runner.stagecheck import StagedCheck
from automlperf.runner.trials import FailureStreak, TrialRecorder, conclusion, why_giving_up
from automlperf.search import Candidate, Model, NoCandidate, Searcher
from automlperf.search.hpo import HyperSearch
from automlperf.seeding import mix_seed
from automlperf.store import Claim, SegmentRecord, Store, TrialStatus
from automlperf.store.history import History
from automlperf.store.rundir import RunDir, make_durable, write_atomic
from automlperf.train.spec import Trainer, TrainerError, TrialSpec

log = logging.getLogger("automlperf.replica")


class Sampler(Protocol):
    """A node's resource sampler, running beside the replica (a process)."""

    def terminate(self) -> None: ...

    def wait(self, timeout: float | None = None) -> Any: ...


@dataclass
class Job:
    candidate: Candidate
    round: int
    batch_size: int
    kernel_size: int
    hpo_number: int | None
    waited_s: float = 0.0  # how long training waited for this candidate
    # Trained again with TPE's batch size once trained with its parent's (search.hpo_order
    # "after_nas", the paper's order).
    retrain: bool = False


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where a replica works: its run, its number, the session it joins and its node's
    resources."""

    dir: RunDir
    run_id: int
    config: Config
    index: int
    segment: SegmentRecord
    devices: list[str]
    threads: int  # per device


class Replica:
    """The loop of one replica, given its collaborators: the run's ``store``, a ``trainer``,
    the architecture ``searcher`` and the ``hpo`` study. ``default_batch`` is the global batch
    size of the rounds before HPO; ``clock`` tells the time that records and the deadline
    use; ``probe_node``, ``measure_end`` and ``data_check`` are what it records of its node
    (runner/noderecords.py);
    ``start_sampler`` starts the node's resource sampler once the trainer is up; ``history``
    is the run's trials as the search reads them (shared by the replicas of a process)."""

    def __init__(self, place: Placement, store: Store, trainer: Trainer, searcher: Searcher,
                 hpo: HyperSearch, default_batch: int, *,
                 clock: Callable[[], float] = time.time,
                 probe_node: Callable[[dict[str, Any] | None], dict[str, Any] | None] | None = None,
                 start_sampler: Callable[[dict[str, Any]], Sampler | None] | None = None,
                 history: History | None = None,
                 measure_end: Callable[[], dict[str, Any]] | None = None,
                 data_check: StagedCheck | None = None) -> None:
        self.place = place
        self.dir = place.dir
        self.run_id = place.run_id
        self.config = place.config
        self.index = place.index
        self.segment = place.segment
        self.store = store
        self.trainer = trainer
        self.searcher = searcher
        self.hpo = hpo
        self.default_batch = default_batch
        self.clock = clock
        self.start_sampler = start_sampler
        self.stop = threading.Event()
        self.node = NodeRecords(store, place.run_id, place.index, place.segment, clock,
                                self.stop, probe=probe_node, measure_end=measure_end,
                                data_check=data_check)
        self.rng = random.Random(mix_seed(self.config.seed_used(), place.index))
        self.history = history if history is not None else History(place.run_id)
        self.failures = FailureStreak(self.config.run.max_repeated_failures, self._log_name())
        self.replica_id: int | None = None
        self.seed_graph: Graph | None = None
        self.grace_s = 0.0  # after the deadline, for the epoch in flight (set by run())

    # --- lifecycle ----------------------------------------------------------------------
    def run(self) -> int:
        """Train until the deadline, the round limit or :attr:`stop`; 1 when the replica
        cannot train (recorded in the store, for the primary), 0 otherwise."""
        if self.segment.ended_at is not None:
            log.info("the run's current session has ended; nothing to do")
            return 0
        replica_id = self.replica_id = self.store.register_replica(
            self.run_id, self.index, self.segment.index, socket.gethostname(), os.getpid(),
            self.place.devices, self.clock())
        recorded = self.store.run(self.run_id)["system"].get("ruleset")
        self.grace_s = self.config.deadline_grace(rules.get(recorded))
        beat = threading.Thread(target=self._heartbeat, args=(replica_id,), name="heartbeat",
                                daemon=True)
        beat.start()
        self.node.prepare_end()
        status, reason = TrialStatus.FAILED, ""
        try:
            described = self.node.describe(None)
            description = self.trainer.start()
            if not described or description.get("binding"):
                self.node.describe(description)
            log.info("replica %d: %d x %s, %d threads each, %s", self.index,
                     len(self.place.devices), description["devices"][0], self.place.threads,
                     description["dataset"])
            sampler = self.start_sampler(description) if self.start_sampler else None
            try:
                self._loop(description["dataset"])
                status = TrialStatus.STOPPED
            finally:
                self._close_trainer(ended=status == TrialStatus.STOPPED)
                if sampler is not None:
                    sampler.terminate()
                    sampler.wait(timeout=30)
        except Exception as exc:
            given_up = why_giving_up(exc, self.dir.path)
            if given_up is None:
                reason = f"replica error: {type(exc).__name__}: {exc}; see {self._log_name()}"
                log.exception("replica %d failed", self.index)
                raise
            reason = given_up
            log.error("replica %d gives up: %s", self.index, reason)
            return 1
        finally:
            self.node.record_data_check(self.config.run.stop_grace_s / 2)
            self.stop.set()
            self.node.close()
            self.store.end_replica(replica_id, status, self.clock(), reason)
            beat.join(timeout=5)
        return 0

    def _close_trainer(self, ended: bool) -> None:
        """Stop the training processes. The ceiling at the end of a session that ran to its
        deadline is measured after they stop, or, where they measure it themselves (a CPU's
        rank, idle between trials), just before."""
        by_ranks = getattr(self.node.measure_end, "by_ranks", False)
        if ended and by_ranks:
            self.node.record_end_ceiling()
        self.trainer.close()
        if ended and not by_ranks:
            self.node.record_end_ceiling()

    def _log_name(self) -> str:
        return str(self.dir.logs / f"replica-{self.index}.log")

    def _heartbeat(self, replica_id: int) -> None:
        period = self.config.run.heartbeat_s
        failed = 0
        while not self.stop.wait(period):
            now = self.clock()
            lease = self.config.run.lease_timeout_s
            try:
                restored = self.store.restored_at
                seg = self.store.heartbeat(replica_id, now, lease)
                if self.store.restored_at != restored:
                    # The beat waited out a store outage: its time is stale, and so would
                    # the leases be that it extended.
                    now = self.clock()
                    seg = self.store.heartbeat(replica_id, now, lease)
            except Exception as exc:  # noqa: BLE001 - whatever it was, the next beat tries
                failed += 1
                if failed == 1:
                    log.warning("heartbeat failed (%s: %s); retrying every %g s, said again "
                                "once one passes", type(exc).__name__, exc, period,
                                exc_info=True)
                continue
            if failed:
                log.warning("heartbeats pass again after %d failed", failed)
                failed = 0
            if seg is None:
                log.warning("the store does not know this replica (id %d); stopping", replica_id)
                self.stop.set()
                continue
            # The primary could not write while the store was out either.
            silent = now - self.store.silent_since(seg.last_seen)
            if seg.ended_at is not None:
                log.info("the primary ended the session; stopping")
                self.stop.set()
            elif silent > lease:
                log.warning("the primary has been silent for %.0f s; stopping", silent)
                self.stop.set()

    def _should_stop(self) -> bool:
        return self.stop.is_set() or self.clock() >= self.segment.deadline_at

    def wait_stop(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds, less if the grace after the deadline ends first,
        for a reason to stop the epoch in flight (:meth:`_past_grace`); whether there is
        one."""
        left = self.segment.deadline_at + self.grace_s - self.clock()
        return self.stop.wait(max(0.0, min(timeout, left))) or self._past_grace()

    def _past_grace(self) -> bool:
        """Whether the epoch in flight must stop now: a stop, or its grace is over."""
        return self.stop.is_set() or self.clock() >= self.segment.deadline_at + self.grace_s

    def _rounds_left(self, round_index: int) -> bool:
        limit = self.config.run.max_rounds
        return limit is None or round_index < limit

    # --- the loop -----------------------------------------------------------------------
    def _loop(self, dataset: dict[str, Any]) -> None:
        model = self.config.model
        self.seed_graph = seeds.seed(model.seed_model, dataset["classes"], dataset["image_size"],
                                     dataset["channels"], model.seed_width)
        self.history.refresh(self.store)
        done = self.history.claimed[self.index]
        round_index = done  # a resumed replica goes on counting its rounds
        if not self._rounds_left(round_index):
            log.info("replica %d has trained its %d rounds", self.index, round_index)
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="search") as search:
            upcoming: Future[Job] = search.submit(self._next_job, round_index)
            try:
                while not self._should_stop() and self._rounds_left(round_index):
                    asked = time.monotonic()
                    try:
                        job = upcoming.result()
                        job.waited_s = time.monotonic() - asked
                    except NoCandidate as exc:
                        log.warning("no candidate: %s; waiting for other replicas", exc)
                        if self.stop.wait(10):
                            break
                        upcoming = search.submit(self._next_job, round_index)
                        continue
                    if self._should_stop():
                        # The search outlasted the session: a trial claimed now would land
                        # after the primary has counted the run's trials.
                        break
                    trial_id = self._claim(job)
                    if trial_id is None:  # another replica took this architecture meanwhile
                        upcoming = search.submit(self._next_job, round_index)
                        continue
                    # Generate the next candidate while this one trains, once anything has
                    # been trained: before that, the search could only morph the seed into a
                    # child trained from fresh weights, a trial wasted on a short run.
                    self.history.refresh(self.store)
                    overlap = self.history.completed > 0
                    if overlap:
                        upcoming = search.submit(self._next_job, round_index + 1)
                    self._trial(trial_id, job, upcoming)
                    if not overlap:
                        upcoming = search.submit(self._next_job, round_index + 1)
                    round_index += 1
            finally:
                upcoming.cancel()
        # A suggestion prepared but never trained must not stay pending in the TPE study.
        if upcoming.done() and not upcoming.cancelled() and upcoming.exception() is None:
            unused = upcoming.result()
            if unused.hpo_number is not None:
                self.hpo.tell(unused.hpo_number, None)

    def _refresh_history(self) -> tuple[list[Model], set[str]]:
        """The run's history (what changed since the last read), and its architectures."""
        self.history.refresh(self.store)
        return self.history.models(), self.history.taken()

    def _next_job(self, round_index: int) -> Job:
        """The candidate of a round and its hyperparameters (in the search thread)."""
        assert self.seed_graph is not None
        search = self.config.search
        tuned = search.hpo == "tpe" and round_index >= search.hpo_start_round
        after_nas = tuned and search.hpo_order == "after_nas"
        if tuned and not after_nas:
            s = self.hpo.ask()
            batch, kernel, number = s.batch_size, s.kernel_size, s.number
        else:
            batch, kernel, number = self.default_batch, min(search.kernel_sizes), None
        try:
            models, taken = self._refresh_history()
            cand = self.searcher.next_candidate(models, self.seed_graph, self.rng, kernel,
                                                taken=taken)
        except NoCandidate:
            if number is not None:
                self.hpo.tell(number, None)
            raise
        if after_nas:
            batch = self._inherited_batch(cand.parent_id)
        log.info("round %d: candidate from %s (%d morphs) in %.2f s, batch %d, kernel %d",
                 round_index, cand.parent_id, len(cand.morphs), cand.stats.get("seconds", 0.0),
                 batch, kernel)
        return Job(cand, round_index, batch, kernel, number, retrain=after_nas)

    def _inherited_batch(self, parent_id: int | None) -> int:
        """The batch size of the parent's better training (the default for the seed)."""
        if parent_id is None:
            return self.default_batch
        parent = self.store.trial(parent_id)
        return int(parent.extra.get("hpo_batch") or parent.hparams.get("batch_size")
                   or self.default_batch)

    def _claim(self, job: Job) -> int | None:
        assert self.replica_id is not None
        graph = job.candidate.graph
        hparams = {"batch_size": job.batch_size, "kernel_size": job.kernel_size,
                   "epochs": self.config.train.round_epochs(job.round),
                   "patience": self.config.train.patience(job.round),
                   "tpe_trial": job.hpo_number, "world_size": self.trainer.world,
                   "acquisition": job.candidate.acquisition,
                   # What the search expected of this child, beside the parent's accuracy it
                   # ranked by then: the report holds them against what the child reached.
                   "predicted_mean": job.candidate.predicted_accuracy,
                   "predicted_std": job.candidate.predicted_std,
                   "parent_accuracy": job.candidate.parent_accuracy,
                   "generation_s": job.candidate.stats.get("seconds"),
                   "candidate_wait_s": round(job.waited_s, 6)}
        trial_id = self.store.claim_trial(Claim(
            run_id=self.run_id, replica_id=self.replica_id, replica_index=self.index,
            graph_hash=graph.content_hash(), graph_json=graph.to_json(None),
            parent_id=job.candidate.parent_id, morphs=job.candidate.morphs, round=job.round,
            hparams=hparams, now=self.clock(), lease_s=self.config.run.lease_timeout_s))
        if trial_id is None and job.hpo_number is not None:
            self.hpo.tell(job.hpo_number, None)
        return trial_id

    def _trial(self, trial_id: int, job: Job, upcoming: Future[Job]) -> None:
        """One claimed trial: prepare it, train it, conclude it."""
        spec = self._prepare_trial(trial_id, job)
        recorder = TrialRecorder(self.store, self.run_id, trial_id, self.dir.trial(trial_id))
        log.info("trial %d: training %d epochs at batch %d (round %d)", trial_id, spec.epochs,
                 job.batch_size, job.round)
        try:
            outcome = self.trainer.train(spec, recorder, should_stop=self._past_grace)
            if job.retrain and outcome.status == TrialStatus.COMPLETED and recorder.accuracies \
                    and not self._should_stop():
                outcome = self._retrain(spec, outcome, recorder, job.kernel_size)
        except TrainerError as exc:
            # The replica gives up; the trial it held ends with it, not left running.
            self.store.finish_trial(trial_id, TrialStatus.FAILED, self.clock(), reason=str(exc))
            if job.hpo_number is not None:
                self.hpo.tell(job.hpo_number, None)
            raise
        recorder.trial(outcome)
        self._conclude_trial(spec, job, outcome, recorder.accuracies, upcoming)

    def _retrain(self, spec: TrialSpec, first: TrialOutcome, recorder: TrialRecorder,
                 kernel: int) -> TrialOutcome:
        """The paper's HPO after NAS: the architecture, trained at its parent's batch size,
        trains again from the same weights at the batch size TPE suggests, its epochs
        numbered on. The trial's outcome is the better training's; both are recorded."""
        best_first = max(recorder.accuracies)
        self.hpo.observe(spec.batch_size, best_first)
        s = self.hpo.ask(kernel=kernel)
        again = replace(spec, batch_size=s.batch_size, first_epoch=len(recorder.accuracies),
                        save_above=best_first)
        log.info("trial %s: training again at batch %d (TPE trial %d)", spec.trial_id,
                 s.batch_size, s.number)
        try:
            second = self.trainer.train(again, recorder, should_stop=self._past_grace)
        except TrainerError:
            self.hpo.tell(s.number, None)
            raise
        reached = recorder.accuracies[again.first_epoch:]
        best_second = max(reached) if reached else None
        self.hpo.tell(s.number, best_second if second.status == TrialStatus.COMPLETED else None)
        better = best_second is not None and best_second > best_first
        first.extra["trainings"] = [
            {"batch_size": spec.batch_size, "epochs": first.epochs, "best_accuracy": best_first,
             "early_stopped": first.early_stopped, "status": str(first.status)},
            {"batch_size": s.batch_size, "tpe_trial": s.number, "epochs": second.epochs,
             "best_accuracy": best_second, "early_stopped": second.early_stopped,
             "status": str(second.status), "reason": second.reason}]
        first.extra["hpo_batch"] = s.batch_size if better else spec.batch_size
        first.epochs += second.epochs
        if better:
            first.best_accuracy, first.best_epoch = second.best_accuracy, second.best_epoch
            first.weights = second.weights or first.weights
        return first

    def _prepare_trial(self, trial_id: int, job: Job) -> TrialSpec:
        """The trial's folder with its graph, and the spec it trains by (inheriting its
        parent's weights)."""
        folder = self.dir.trial(trial_id)
        folder.mkdir(parents=True, exist_ok=True)
        graph = job.candidate.graph
        write_atomic(folder / "graph.json", graph.to_json() + "\n")
        parent_graph = parent_weights = None
        if job.candidate.parent_id is not None and self.config.search.inherit_weights:
            parent = self.store.trial(job.candidate.parent_id)
            parent_graph = json.loads(parent.graph_json)
            parent_weights = parent.weights_path
        cfg = self.config
        return TrialSpec.from_config(
            cfg.train, cfg.model.initial_weights, trial_id=trial_id, graph=graph.to_dict(),
            epochs=cfg.train.round_epochs(job.round), batch_size=job.batch_size,
            patience=cfg.train.patience(job.round),
            seed=mix_seed(cfg.seed_used(), trial_id), parent_graph=parent_graph,
            parent_weights=parent_weights, weights_out=str(folder / "weights.safetensors"),
            round=job.round, horizon_epochs=cfg.train.max_epochs,
            finish_by=self.segment.deadline_at)

    def _conclude_trial(self, spec: TrialSpec, job: Job, outcome: TrialOutcome,
                        accuracies: list[float], upcoming: Future[Job]) -> None:
        """Record how the trial ended, tell the HPO study, and give up on a failure that
        repeats."""
        trial_id = int(spec.trial_id)
        ending = conclusion(outcome, accuracies, spec.weights_out, job.round, self.config)
        if ending["weights_path"] is not None:
            # Children inherit these weights by the path recorded below: it must not name a
            # file a later disk error leaves empty.
            make_durable(ending["weights_path"])
        status, best = ending["status"], ending["best_accuracy"]
        self.store.finish_trial(trial_id, now=self.clock(), **ending)
        log.info("trial %d %s: best %s%s", trial_id, status,
                 "-" if best is None else f"{best:.4f}",
                 f" ({outcome.reason})" if outcome.reason else "")
        if job.hpo_number is not None:
            # The TPE objective is the measured accuracy; wait for an overlapping ask first.
            if not upcoming.done():
                upcoming.exception()
            self.hpo.tell(job.hpo_number, best if status == TrialStatus.COMPLETED else None)
        self.failures.note(status, outcome.reason, outcome.extra.get("failure"))
