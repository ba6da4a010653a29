"""Bayesian optimisation over architectures (the Auto-Keras method), with bounded cost.

Given the history of models (graph, measured or predicted accuracy, status), propose the next
architecture to train: a child of a trained model, one or more morphs away, chosen by a
simulated-annealing tree search that maximises the upper confidence bound of a Gaussian
process on the edit-distance kernel.

Cost stays bounded as the history grows: the process is fitted on at most
``gp_max_models`` models (the best, the most recent and a random sample of the rest),
descriptors and pairwise distances are cached across calls, and the tree search scores a fixed
number of architectures (``candidates_per_generation``). Everything random flows from the
caller's ``rng`` and nothing depends on elapsed time, so the same history, seed and
configuration give the same candidate on a fast machine and on a slow or loaded one. A
wall-clock cap remains as a safety net only; when it fires, it is logged and recorded.
"""

from __future__ import annotations

import heapq
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from automlperf.config import SearchConfig
from automlperf.events import TrialStatus
from automlperf.graph.graph import Graph
from automlperf.search.distance import Descriptor, describe, distances, pack
from automlperf.search.gp import DistanceGP, ucb
from automlperf.search.morph import Limits, MorphError, morph

TRAINED = TrialStatus.COMPLETED
DESCRIPTOR_GENERATIONS = 20
log = logging.getLogger("automlperf.search")


class GraphSource(Protocol):
    """Where the graphs of a long history are kept (store/history.py): fetched when the
    search needs them, a bounded number held."""

    def graph(self, id: Any, content_hash: str | None = None) -> Graph: ...

    def prefetch(self, ids: Sequence[Any]) -> None: ...


class Model:
    """One entry of the history, oldest first. The graph may be given as JSON text with its
    known content hash, or left to a :class:`GraphSource` with that hash: it is then parsed
    (or fetched) only if the search needs it, so a long history costs little more than its
    hashes."""

    __slots__ = ("id", "accuracy", "status", "_graph", "_json", "_hash", "_source")

    def __init__(self, id: Any, graph: Graph | None = None, accuracy: float | None = None,
                 status: str = TRAINED, *, graph_json: str | None = None,
                 content_hash: str | None = None, source: GraphSource | None = None) -> None:
        if graph is None and graph_json is None and (source is None or content_hash is None):
            raise ValueError("a model needs a graph, its JSON, or a source and its hash")
        self.id, self.accuracy, self.status = id, accuracy, status
        self._graph, self._json, self._hash = graph, graph_json, content_hash
        self._source = source

    @property
    def graph(self) -> Graph:
        if self._graph is None:
            if self._json is None:
                assert self._source is not None
                return self._source.graph(self.id, self._hash)  # kept there, not here
            self._graph = Graph.from_json(self._json)
            if self._hash is not None:
                object.__setattr__(self._graph, "_hash", self._hash)
        return self._graph

    @property
    def source(self) -> GraphSource | None:
        return self._source if self._graph is None and self._json is None else None

    @property
    def content_hash(self) -> str:
        if self._hash is None:
            self._hash = self.graph.content_hash()
        return self._hash

    def __repr__(self) -> str:
        return f"Model({self.id!r}, accuracy={self.accuracy}, status={self.status!r})"


def _score(model: Model) -> float:
    """The accuracy the search ranks a trained model by (trained models always have one)."""
    assert model.accuracy is not None
    return model.accuracy


@dataclass
class Candidate:
    graph: Graph
    parent_id: Any
    morphs: list[dict[str, Any]]
    acquisition: float | None = None
    predicted_accuracy: float | None = None
    predicted_std: float | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    # The accuracy the search ranked the parent by when it chose this child: what the
    # prediction above is to be held against.
    parent_accuracy: float | None = None


class NoCandidate(RuntimeError):
    """Every architecture the search could reach is taken or over the limits."""


@dataclass
class _Node:
    graph: Graph
    father: Model
    morphs: list[dict[str, Any]]
    priority: float


class Searcher:
    """Candidate generation with caches that persist between calls."""

    def __init__(self, config: SearchConfig | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config or SearchConfig()
        self.clock = clock  # only the safety cap and the reported seconds read it
        self.limits = Limits(self.config.max_layers, self.config.max_params)
        self._descriptors: dict[str, Descriptor] = {}
        self._pairs: dict[tuple[str, str], float] = {}

    # --- caches -----------------------------------------------------------------------
    def descriptor(self, graph: Graph) -> Descriptor:
        key = graph.content_hash()
        d = self._descriptors.get(key)
        if d is None:
            # Every candidate scored is described once; in a long run they would pile up
            # without end, while only the fit set's are used again from call to call.
            if len(self._descriptors) >= self.descriptor_cache_size:
                self._descriptors.clear()
            d = self._descriptors[key] = describe(graph)
        return d

    def descriptor_of(self, model: Model) -> Descriptor:
        """A model's descriptor, by its hash: its graph is read only when not described yet."""
        d = self._descriptors.get(model.content_hash)
        return d if d is not None else self.descriptor(model.graph)

    def prefetch(self, described: Sequence[Model], morphed: Sequence[Model] = ()) -> None:
        """Fetch, in one read per source, the graphs the search will parse: of the models
        it describes (those not described yet) and of those it morphs."""
        by_source: dict[int, tuple[GraphSource, list[Any]]] = {}
        for m in [*described, *morphed]:
            source = m.source
            if source is not None and (m.content_hash not in self._descriptors
                                       or m in morphed):
                by_source.setdefault(id(source), (source, []))[1].append(m.id)
        for source, ids in by_source.values():
            source.prefetch(ids)

    @property
    def descriptor_cache_size(self) -> int:
        """Descriptors kept between calls at most: twenty generations' worth."""
        return DESCRIPTOR_GENERATIONS * (self.config.gp_max_models
                                         + self.config.candidates_per_generation)

    def _gram(self, models: list[Model]) -> np.ndarray:
        """Pairwise distances of ``models``, computing only rows with uncached pairs."""
        hashes = [m.content_hash for m in models]
        pairs = self._pairs
        packed = None
        for i, hi in enumerate(hashes):
            if all((min(hi, h), max(hi, h)) in pairs for h in hashes if h != hi):
                continue
            if packed is None:
                packed = pack([self.descriptor_of(m) for m in models])
            row = distances(self.descriptor_of(models[i]), packed)
            for j, h in enumerate(hashes):
                if h != hi:
                    pairs[(min(hi, h), max(hi, h))] = float(row[j])
        n = len(models)
        gram = np.zeros((n, n))
        for i in range(n):
            for j in range(i + 1, n):
                if hashes[i] != hashes[j]:
                    gram[i, j] = gram[j, i] = pairs[(min(hashes[i], hashes[j]),
                                                     max(hashes[i], hashes[j]))]
        # Only pairs among models that can be fitted again matter; keep the cache bounded.
        if len(pairs) > 50 * self.config.gp_max_models ** 2:
            pairs.clear()
        return gram

    # --- selection --------------------------------------------------------------------
    def fit_set(self, trained: list[Model]) -> list[Model]:
        """At most ``gp_max_models``: half the best, a quarter the most recent, the rest a
        sample of the others for diversity. The sample takes the smallest content hashes:
        as good as random, and stable from one call to the next, so cached distances serve."""
        cap = self.config.gp_max_models
        if len(trained) <= cap:
            return list(trained)
        best = sorted(range(len(trained)), key=lambda i: (-_score(trained[i]), i))[: cap // 2]
        chosen = set(best)
        recent = [i for i in range(len(trained) - 1, -1, -1) if i not in chosen][: cap // 4]
        chosen.update(recent)
        rest = sorted((i for i in range(len(trained)) if i not in chosen),
                      key=lambda i: trained[i].content_hash)
        chosen.update(rest[: cap - len(chosen)])
        return [trained[i] for i in sorted(chosen)]

    # --- the search -------------------------------------------------------------------
    def next_candidate(self, history: Sequence[Model], seed_graph: Graph, rng: random.Random,
                       kernel_size: int = 3, taken: set[str] | None = None) -> Candidate:
        """``taken``: the hashes of ``history``, where the caller keeps them already."""
        started = self.clock()
        if taken is None:
            taken = {m.content_hash for m in history}
        # A non-finite accuracy (a store that kept one before the service refused them) would
        # make the Gaussian process's fit fail for every replica: it is no trained model.
        trained = [m for m in history if m.status == TRAINED and m.accuracy is not None
                   and math.isfinite(m.accuracy)]
        if not trained:
            return self._cold_start(seed_graph, taken, rng, kernel_size, started)
        return self._choose(history, trained, taken, rng, kernel_size, started)

    def _choose(self, history: Sequence[Model], trained: list[Model], taken: set[str],
                rng: random.Random, kernel_size: int, started: float) -> Candidate:
        """A child of a trained model: the annealing's best by the upper confidence bound."""
        fit = self.fit_set(trained)
        cfg = self.config
        roots = sorted(trained, key=lambda m: -_score(m))[: 2 * cfg.neighbours]
        self.prefetch(fit, roots)
        gp = DistanceGP().fit(self._gram(fit), np.array([m.accuracy for m in fit]))
        packed = pack([self.descriptor_of(m) for m in fit])
        budget = cfg.candidates_per_generation
        searched = set(taken)
        heap: list[tuple[float, int, _Node]] = []
        tick = 0
        best: tuple[float, _Node, float, float] | None = None
        evaluated = expansions = steps = restarts = 0
        temperature = 1.0
        capped = False
        deadline = started + cfg.generation_budget_s
        scored_before = -1
        # Every pop either expands (scoring up to `neighbours` new architectures) or is
        # rejected and consumed. When the heap runs dry before the budget is spent, the
        # annealing restarts from the best models (their children seen so far are skipped);
        # a pass that scores nothing new ends the search.
        while evaluated < budget:
            if not heap:
                if evaluated == scored_before:
                    break
                scored_before = evaluated
                restarts += 1
                temperature = 1.0
                for m in roots:
                    heapq.heappush(heap, (-_score(m), tick, _Node(m.graph, m, [], _score(m))))
                    tick += 1
            if self.clock() >= deadline:
                capped = True
                break
            steps += 1
            _, _, node = heapq.heappop(heap)
            opt = best[0] if best else -math.inf
            accept = math.exp(min((node.priority - opt) / temperature, 1.0))
            if accept >= rng.random():
                expansions += 1
                children = self._children(node, searched, rng, kernel_size,
                                          min(cfg.neighbours, budget - evaluated))
                if children:
                    d = np.stack([distances(self.descriptor(g), packed) for g, _ in children])
                    mean, std = gp.predict(d)
                    acq = ucb(mean, std, cfg.beta)
                    evaluated += len(children)
                    for k, (g, record) in enumerate(children):
                        child = _Node(g, node.father, node.morphs + [record], float(acq[k]))
                        if len(child.morphs) < cfg.max_morphs_per_child:
                            heapq.heappush(heap, (-child.priority, tick, child))
                            tick += 1
                        if best is None or acq[k] > best[0]:
                            best = (float(acq[k]), child, float(mean[k]), float(std[k]))
            temperature = max(cfg.sa_t_min, temperature * cfg.sa_cooling)
        seconds = self.clock() - started
        if capped:
            log.warning("candidate generation hit its %.1f s safety cap after %d of %d "
                        "architectures; this choice depends on the machine's speed (raise "
                        "search.generation_budget_s or lower search.candidates_per_generation)",
                        cfg.generation_budget_s, evaluated, budget)
        stats = {"seconds": seconds, "evaluated": evaluated, "budget": budget,
                 "expansions": expansions, "steps": steps, "restarts": restarts - 1,
                 "capped": capped,
                 "fit_models": len(fit), "history": len(history),
                 "gp_retries": gp.stats.retries, "gp_projected": gp.stats.projected}
        if best is None:
            return self._fallback(trained, taken, rng, kernel_size, stats)
        top_acq, top, top_mean, top_std = best
        return Candidate(top.graph, top.father.id, top.morphs, top_acq, top_mean, top_std, stats,
                         top.father.accuracy)

    def _children(self, node: _Node, searched: set[str], rng: random.Random,
                  kernel_size: int, tries: int) -> list[tuple[Graph, dict[str, Any]]]:
        out = []
        for _ in range(tries):
            try:
                child, record = morph(node.graph, "random", rng, kernel_size, self.limits)
            except MorphError:
                continue
            h = child.content_hash()
            if h not in searched:
                searched.add(h)
                out.append((child, record.to_dict()))
        return out

    def _cold_start(self, seed_graph: Graph, taken: set[str], rng: random.Random,
                    kernel_size: int, started: float) -> Candidate:
        """Nothing trained yet: the seed itself, or (when another replica has it) random
        morphs of the seed trained from fresh weights."""
        stats: dict[str, Any] = {"cold_start": True}
        if seed_graph.content_hash() not in taken:
            stats["seconds"] = self.clock() - started
            return Candidate(seed_graph, None, [], stats=stats)
        for _ in range(100):
            graph, records = self.random_morphs(seed_graph, rng, kernel_size)
            if records and graph.content_hash() not in taken:
                stats["seconds"] = self.clock() - started
                return Candidate(graph, None, records, stats=stats)
        raise NoCandidate("no new architecture within reach of the seed")

    def random_morphs(self, graph: Graph, rng: random.Random,
                      kernel_size: int) -> tuple[Graph, list[dict[str, Any]]]:
        """1 to ``max_morphs_per_child`` random morphs of ``graph`` (fewer where one is
        refused), and their records."""
        records = []
        for _ in range(rng.randint(1, self.config.max_morphs_per_child)):
            try:
                graph, record = morph(graph, "random", rng, kernel_size, self.limits)
            except MorphError:
                break
            records.append(record.to_dict())
        return graph, records

    def _fallback(self, trained: list[Model], taken: set[str], rng: random.Random,
                  kernel_size: int, stats: dict[str, Any]) -> Candidate:
        stats["fallback"] = True
        fathers = sorted(trained, key=lambda m: -_score(m))[: 4 * self.config.neighbours]
        for _ in range(200):
            father = rng.choice(fathers)
            try:
                graph, record = morph(father.graph, "random", rng, kernel_size, self.limits)
            except MorphError:
                continue
            if graph.content_hash() not in taken:
                return Candidate(graph, father.id, [record.to_dict()], stats=stats,
                                 parent_accuracy=father.accuracy)
        raise NoCandidate("every morph of the best models is taken or over the limits")


def next_candidate(history: Sequence[Model], rng: random.Random, *, seed_graph: Graph,
                   kernel_size: int = 3, config: SearchConfig | None = None,
                   searcher: Searcher | None = None) -> Candidate:
    """The next architecture to train and its parent's id (``None``: train from scratch).
    Pass a long-lived ``searcher`` to keep its caches between calls."""
    return (searcher or Searcher(config)).next_candidate(history, seed_graph, rng, kernel_size)
