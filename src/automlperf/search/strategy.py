"""The searcher a run uses: the one its ``search.strategy`` names, the Bayesian optimiser
(search/bo.py) or one of the baselines that measure it (search/baselines.py; never official)."""

from __future__ import annotations

from automlperf.config import SearchConfig
from automlperf.search.baselines import GreedySearcher, RandomSearcher
from automlperf.search.bo import Searcher


def searcher_for(config: SearchConfig) -> Searcher:
    """The searcher ``config.strategy`` names."""
    kind = {"bayesian": Searcher, "greedy": GreedySearcher, "random": RandomSearcher}
    return kind[config.strategy](config)
