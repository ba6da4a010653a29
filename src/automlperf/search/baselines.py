"""Baselines that measure the Bayesian optimiser (``search.strategy``; never official): the
same morphs, the same cold start and the same history, with a simpler choice of what to
morph. ``greedy`` morphs the most accurate model so far; ``random`` morphs a trained model
drawn at random. Each child carries 1 to ``max_morphs_per_child`` random morphs, as the
optimiser's may."""

from __future__ import annotations

import random
from collections.abc import Sequence

from automlperf.search.bo import Candidate, Model, NoCandidate, Searcher

# Children tried per parent before the next parent is taken.
TRIES_PER_PARENT = 20


class RandomSearcher(Searcher):
    """Random morphs of a trained model drawn at random."""

    strategy = "random"

    def parents(self, trained: list[Model], rng: random.Random) -> list[Model]:
        """The trained models in the order their children are tried."""
        order = list(trained)
        rng.shuffle(order)
        return order

    def _choose(self, history: Sequence[Model], trained: list[Model], taken: set[str],
                rng: random.Random, kernel_size: int, started: float) -> Candidate:
        tries = 0
        for parent in self.parents(trained, rng):
            for _ in range(TRIES_PER_PARENT):
                tries += 1
                graph, records = self.random_morphs(parent.graph, rng, kernel_size)
                if records and graph.content_hash() not in taken:
                    stats = {"seconds": self.clock() - started, "strategy": self.strategy,
                             "tries": tries, "history": len(history)}
                    return Candidate(graph, parent.id, records, stats=stats,
                                     parent_accuracy=parent.accuracy)
        raise NoCandidate("every morph of the trained models is taken or over the limits")


class GreedySearcher(RandomSearcher):
    """Random morphs of the most accurate model so far (the next best when all of its
    children within reach are taken)."""

    strategy = "greedy"

    def parents(self, trained: list[Model], rng: random.Random) -> list[Model]:
        # Stable: the earliest of equally accurate models first.
        return sorted(trained, key=lambda m: -(m.accuracy or 0.0))

