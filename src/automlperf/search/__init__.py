"""Architecture search (pure; no torch here): morphs, edit distance, Bayesian optimisation."""

from automlperf.search.baselines import GreedySearcher, RandomSearcher
from automlperf.search.bo import Candidate, Model, NoCandidate, Searcher, next_candidate
from automlperf.search.morph import Limits, MorphError, MorphRecord, MorphResult, morph
from automlperf.search.strategy import searcher_for

__all__ = ["Candidate", "GreedySearcher", "Limits", "Model", "MorphError", "MorphRecord",
           "MorphResult", "NoCandidate", "RandomSearcher", "Searcher", "morph", "next_candidate",
           "searcher_for"]
