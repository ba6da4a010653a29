import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automlperf.config import SearchConfig
from automlperf.graph import seeds
from automlperf.search import Model, Searcher, morph, next_candidate
from automlperf.search.distance import describe, distances, layer_distances, pack
from automlperf.search.gp import DistanceGP

SMALL = seeds.resnet_small(num_classes=10, image_size=16)


def family(n, seed=0, base=SMALL):
    rng = random.Random(seed)
    graphs = [base]
    while len(graphs) < n:
        graphs.append(morph(rng.choice(graphs), "random", rng, kernel_size=rng.choice((3, 5, 7)))[0])
    return graphs


FAMILY = [describe(g) for g in family(40)]


def distance(a, b):
    return float(distances(a, pack([b]))[0])


def brute_chain(a, b):
    n, m = len(a), len(b)
    d = [[float(i + j) if i * j == 0 else 0.0 for j in range(m + 1)] for i in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            ta, wa, tb, wb = a.types[i - 1], a.widths[i - 1], b.types[j - 1], b.widths[j - 1]
            cost = abs(wa - wb) / max(wa, wb) if ta == tb else 1.0
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
    return d[n][m]


def test_descriptor_of_resnet50():
    d = describe(seeds.resnet50())
    # stem conv, max-pool, 16 blocks x 3 convolutions, dense
    assert len(d) == 1 + 1 + 48 + 1
    assert len(d.skips) == 16
    assert sum(t for *_, t in d.skips) == 4  # four projection shortcuts, the rest identity


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 39), st.integers(0, 39), st.integers(0, 39))
def test_edit_distance_is_a_metric(i, j, k):
    a, b, c = FAMILY[i], FAMILY[j], FAMILY[k]
    assert distance(a, a) == 0.0
    assert distance(a, b) == pytest.approx(distance(b, a))
    assert distance(a, c) <= distance(a, b) + distance(b, c) + 1e-9
    if i != j and describe_equal(a, b) is False:
        assert distance(a, b) > 0


def describe_equal(a, b):
    return (a.types.tolist() == b.types.tolist() and a.widths.tolist() == b.widths.tolist()
            and a.skips == b.skips)


def test_fast_paths_agree_with_the_textbook_dynamic_programme():
    packed = pack(FAMILY)
    for a in FAMILY[:8]:
        assert np.allclose(layer_distances(a, packed), [brute_chain(a, b) for b in FAMILY])
        # A batch gives each descriptor the distance it has alone.
        assert np.allclose(distances(a, packed), [distance(a, b) for b in FAMILY])


def test_one_morph_is_a_small_distance():
    base = describe(SMALL)
    deeper = describe(morph(SMALL, "deepen", 1)[0])
    # One inserted convolution, plus the skips after it shifting by one position.
    assert 1.0 <= distance(base, deeper) < 2.0
    far = describe(family(12, seed=4)[-1])
    assert distance(base, far) > distance(base, deeper)


def test_gp_interpolates_and_keeps_all_data_when_cholesky_fails():
    d = np.array([[0, 1, 2], [1, 0, 1], [2, 1, 0]], dtype=float)
    gp = DistanceGP(noise=1e-6).fit(d, np.array([0.2, 0.5, 0.9]))
    mean, std = gp.predict(d)
    assert np.allclose(mean, [0.2, 0.5, 0.9], atol=1e-3) and (std < 0.05).all()
    # Distances that violate the triangle inequality make exp(-d) indefinite.
    bad = np.full((4, 4), 10.0)
    np.fill_diagonal(bad, 0.0)
    bad[0, 1] = bad[1, 0] = bad[1, 2] = bad[2, 1] = 1e-3
    assert np.linalg.eigvalsh(np.exp(-bad / 10.0)).min() < 0  # indefinite
    y = np.array([0.1, 0.5, 0.9, 0.3])
    gp = DistanceGP(noise=1e-9, max_retries=1).fit(bad, y)
    assert gp.stats.retries >= 1 and gp.stats.projected
    mean, _ = gp.predict(bad)
    assert mean.shape == (4,) and np.isfinite(mean).all()
    gp = DistanceGP(noise=1e-9, max_retries=12).fit(bad, y)
    assert 1 <= gp.stats.retries <= 12 and not gp.stats.projected and gp.stats.jitter > 1e-9


def test_a_few_barely_trained_models_do_not_set_the_gps_scale():
    """The seed after one short round sits far below the rest: the process's scale is the
    spread of the many (median absolute deviation), so its uncertainty far from the data
    stays of that order, and the outlier is held at three of those deviations."""
    from automlperf.search.gp import robust_location_scale

    y = np.array([0.30, 0.62, 0.90, 0.91, 0.92, 0.93, 0.935, 0.94, 0.945])
    centre, scale = robust_location_scale(y)
    assert centre == 0.92 and scale == pytest.approx(1.4826 * 0.02)
    n = len(y)
    d = np.abs(np.subtract.outer(np.arange(n), np.arange(n))).astype(float)
    gp = DistanceGP().fit(d, y)
    far_mean, far_std = gp.predict(np.full((1, n), 50.0))
    assert far_std[0] == pytest.approx(scale, rel=1e-3) and far_std[0] < y.std() / 5
    assert far_mean[0] == pytest.approx(centre, abs=1e-3)
    near_mean, _ = gp.predict(d[-3:])
    assert np.allclose(near_mean, y[-3:], atol=2e-3)  # the many are fitted as they are
    assert robust_location_scale(np.array([0.5, 0.5, 0.5, 0.7])) == (0.5, pytest.approx(0.0866, abs=1e-4))
    assert robust_location_scale(np.array([0.5, 0.5])) == (0.5, 1.0)


def history_of(graphs, rng):
    return [Model(i, g, 0.3 + 0.5 * rng.random()) for i, g in enumerate(graphs)]


def test_same_seed_gives_the_same_candidate():
    hist = history_of(family(25, seed=3), random.Random(1))
    a = next_candidate(hist, random.Random(42), seed_graph=SMALL)
    b = next_candidate(hist, random.Random(42), seed_graph=SMALL)
    assert a.graph.content_hash() == b.graph.content_hash() and a.parent_id == b.parent_id
    assert a.morphs == b.morphs


def test_candidates_are_new_children_of_trained_models():
    rng = random.Random(5)
    hist = history_of(family(20, seed=5), rng)
    hist.append(Model("other-replica", morph(SMALL, "deepen", 9)[0], None, "running"))
    searcher = Searcher()
    taken = {m.graph.content_hash() for m in hist}
    for r in range(5):
        cand = searcher.next_candidate(hist, SMALL, random.Random(r), kernel_size=5)
        assert cand.graph.content_hash() not in taken
        parent = next(m for m in hist if m.id == cand.parent_id)
        assert parent.status == "completed" and 1 <= len(cand.morphs) <= 3
        assert cand.acquisition is not None and cand.stats["evaluated"] > 0
        taken.add(cand.graph.content_hash())
        hist.append(Model(f"new{r}", cand.graph, None, "running"))


def test_a_model_whose_accuracy_is_not_a_number_is_not_trained():
    """A NaN or infinite accuracy (kept by a store before the service refused them) is left
    out of the fit, which would otherwise fail for every replica at every candidate."""
    hist = history_of(family(10, seed=7), random.Random(7))
    poisoned = hist + [Model("nan", morph(SMALL, "deepen", 4)[0], float("nan")),
                       Model("inf", morph(SMALL, "deepen", 5)[0], float("inf"))]
    cand = next_candidate(poisoned, random.Random(3), seed_graph=SMALL)
    assert cand.parent_id not in ("nan", "inf")
    assert cand.graph.content_hash() == next_candidate(
        hist + [Model(m.id, m.graph, None, "running") for m in poisoned[-2:]],
        random.Random(3), seed_graph=SMALL).graph.content_hash()


def test_deepen_blocks_use_the_kernel_size_given():
    hist = [Model(0, SMALL, 0.5)]
    seen = set()
    for r in range(6):
        cand = next_candidate(hist, random.Random(r), seed_graph=SMALL, kernel_size=7)
        seen.update(m["kernel"] for m in cand.morphs if m["op"] == "deepen")
    assert seen <= {7}


def test_cold_start_trains_the_seed_once_then_its_morphs():
    first = next_candidate([], random.Random(0), seed_graph=SMALL)
    assert first.graph == SMALL and first.parent_id is None and first.morphs == []
    taken = [Model(0, SMALL, None, "running")]
    second = next_candidate(taken, random.Random(0), seed_graph=SMALL)
    assert second.graph != SMALL and second.parent_id is None and second.morphs


def test_fit_set_is_bounded_and_mixes_best_recent_and_others():
    rng = random.Random(0)
    hist = history_of(family(60, seed=8), rng)
    searcher = Searcher(SearchConfig(gp_max_models=16))
    fit = searcher.fit_set(hist)
    assert len(fit) == 16 and len({m.id for m in fit}) == 16
    best = sorted(hist, key=lambda m: -m.accuracy)[:8]
    assert {m.id for m in best} <= {m.id for m in fit}
    assert hist[-1].id in {m.id for m in fit}  # the most recent model
    cand = searcher.next_candidate(hist, SMALL, random.Random(0))
    assert cand.stats["fit_models"] == 16


class SlowClock:
    """A clock on which every reading comes ``step`` seconds after the previous one: the
    search sees a machine that many times slower than this one."""

    def __init__(self, step):
        self.now, self.step = 0.0, step

    def __call__(self):
        self.now += self.step
        return self.now


def fingerprint(cand):
    return cand.graph.content_hash(), cand.parent_id, cand.morphs, cand.stats["evaluated"]


def test_the_candidate_does_not_depend_on_the_machine_speed():
    hist = history_of(family(25, seed=3), random.Random(1))
    config = SearchConfig()
    fast = Searcher(config, clock=lambda: 0.0).next_candidate(hist, SMALL, random.Random(7))
    # Each clock reading a quarter second after the last: the ~50 readings of this
    # generation look like 12 s, where a 1.5 s time budget would stop after 6 steps.
    slow = Searcher(config, clock=SlowClock(0.25)).next_candidate(hist, SMALL, random.Random(7))
    assert fast.stats["evaluated"] == config.candidates_per_generation
    assert slow.stats["seconds"] > 5 and not slow.stats["capped"]
    assert fingerprint(slow) == fingerprint(fast)


def test_the_safety_cap_is_logged_when_it_fires(caplog):
    hist = history_of(family(25, seed=3), random.Random(1))
    config = SearchConfig(generation_budget_s=5.0)
    with caplog.at_level("WARNING", logger="automlperf.search"):
        cand = Searcher(config, clock=SlowClock(1.0)).next_candidate(hist, SMALL, random.Random(7))
    assert cand.stats["capped"] and cand.stats["evaluated"] < config.candidates_per_generation
    assert "safety cap" in caplog.text and "depends on the machine's speed" in caplog.text


GENERATE = """
import json, random, sys
sys.path.insert(0, {tests!r})
from test_search import SMALL, family, history_of, fingerprint
from automlperf.search import Searcher
hist = history_of(family(40, seed=11), random.Random(2))
# The clock held still: the safety cap (30 s of real time) is not what is compared here, and
# beside burners on a loaded machine it could fire.
searcher = Searcher(clock=lambda: 0.0)
out = []
for r in range(3):
    cand = searcher.next_candidate(hist, SMALL, random.Random(r), kernel_size=5)
    out.append(list(fingerprint(cand)) + [cand.stats["seconds"]])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_same_candidates_beside_cpu_burning_processes():
    """Generation in a fresh interpreter, once alone and once with four processes burning
    every core beside it (and a single BLAS thread): the same candidates."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    code = GENERATE.format(tests=str(pathlib.Path(__file__).resolve().parent))

    def generate(env_extra):
        env = {**os.environ, **env_extra}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, timeout=600)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    alone = generate({})
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    try:
        loaded = generate({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    finally:
        for p in burners:
            p.kill()
            p.wait(timeout=30)
    assert [row[:4] for row in loaded] == [row[:4] for row in alone]
    assert all(row[3] == SearchConfig().candidates_per_generation for row in alone)


@pytest.mark.parametrize("strategy", ["random", "greedy"])
def test_baseline_searches_morph_trained_models_and_repeat_with_the_seed(strategy):
    from automlperf.search import NoCandidate, searcher_for

    rng = random.Random(4)
    hist = history_of(family(12, seed=4), rng)
    hist.append(Model("running", morph(SMALL, "deepen", 3)[0], None, "running"))
    searcher = searcher_for(SearchConfig(strategy=strategy))
    assert searcher.strategy == strategy
    taken = {m.content_hash for m in hist}
    parents = []
    for r in range(6):
        cand = searcher.next_candidate(hist, SMALL, random.Random(r), kernel_size=5)
        again = searcher_for(SearchConfig(strategy=strategy)).next_candidate(
            hist, SMALL, random.Random(r), kernel_size=5)
        assert (cand.graph, cand.parent_id, cand.morphs) == (again.graph, again.parent_id,
                                                             again.morphs)
        parent = next(m for m in hist if m.id == cand.parent_id)
        assert parent.status == "completed" and cand.parent_accuracy == parent.accuracy
        assert 1 <= len(cand.morphs) <= 3 and cand.graph.content_hash() not in taken
        assert all(m["kernel"] == 5 for m in cand.morphs if m["op"] == "deepen")
        assert cand.predicted_accuracy is None
        parents.append(parent.id)
    best = max(hist[:-1], key=lambda m: m.accuracy)
    if strategy == "greedy":
        assert set(parents) == {best.id}
    else:
        assert len(set(parents)) > 1
    # Nothing trained yet: the seed, as the optimiser starts.
    assert searcher.next_candidate([], SMALL, random.Random(0)).graph == SMALL
    with pytest.raises(NoCandidate):
        tiny = SearchConfig(strategy=strategy, max_layers=len(SMALL), max_params=1000)
        searcher_for(tiny).next_candidate([Model(0, SMALL, 0.5)], SMALL, random.Random(0))


def test_the_descriptor_cache_stays_bounded_over_many_generations():
    config = SearchConfig(gp_max_models=4, candidates_per_generation=8, neighbours=4)
    searcher = Searcher(config)
    hist = history_of(family(6, seed=2), random.Random(3))
    sizes = []
    for r in range(40):  # 320 candidates scored, more than the cache keeps
        cand = searcher.next_candidate(hist, SMALL, random.Random(r))
        hist.append(Model(len(hist), cand.graph, 0.3 + 0.01 * (r % 7)))
        sizes.append(len(searcher._descriptors))
    assert max(sizes) <= searcher.descriptor_cache_size == 20 * (4 + 8)
    assert len(searcher._pairs) <= 50 * config.gp_max_models ** 2


def grown_history(n, seed=0, max_depth=8):
    """``n`` models, each a random morph of an earlier one at most ``max_depth`` morphs from
    the small seed (so sizes stay alike however long the history), given to the search as a
    replica reads them from the store: graph JSON and content hash, parsed only if needed."""
    rng = random.Random(seed)
    hist = [Model(0, graph_json=SMALL.to_json(None), content_hash=SMALL.content_hash(),
                  accuracy=0.3)]
    depth = [0]
    growable = [0]
    while len(hist) < n:
        parent = hist[rng.choice(growable)]
        child, _ = morph(parent.graph, "random", rng, kernel_size=rng.choice((3, 5, 7)))
        hist.append(Model(len(hist), graph_json=child.to_json(None),
                          content_hash=child.content_hash(),
                          accuracy=min(0.99, max(0.05, parent.accuracy + rng.gauss(0.005, 0.02)))))
        depth.append(depth[parent.id] + 1)
        if depth[-1] < max_depth:
            growable.append(len(hist) - 1)
    # As read from a store: nothing parsed yet.
    return [Model(m.id, graph_json=m._json, content_hash=m.content_hash, accuracy=m.accuracy)
            for m in hist]


@pytest.fixture(scope="module")
def ten_thousand():
    return grown_history(10_000, seed=21)


class Counted:
    """Counts the edit-distance rows the search computes."""

    def __init__(self, fn):
        self.fn, self.rows = fn, 0

    def __call__(self, *args):
        self.rows += 1
        return self.fn(*args)


def fresh(history):
    return [Model(m.id, graph_json=m._json, content_hash=m.content_hash, accuracy=m.accuracy)
            for m in history]


@pytest.mark.slow
def test_generation_work_on_ten_thousand_models_is_that_on_a_hundred(ten_thousand, monkeypatch):
    """The work of a generation, counted (not timed): models parsed, edit-distance rows,
    models fitted, architectures scored. With 10,000 models it is bounded by the settings,
    as with 100: the history's length costs only its hashes."""
    from automlperf.search import bo

    rows = Counted(bo.distances)
    monkeypatch.setattr(bo, "distances", rows)
    config = SearchConfig()
    bound = config.candidates_per_generation + config.gp_max_models
    work = {}
    for size in (100, 10_000):
        hist = fresh(ten_thousand[:size])
        # Time stands still: the 30 s safety cap never fires, however slow the machine.
        searcher = Searcher(config, clock=lambda: 0.0)
        for r in range(3):
            rows.rows = 0
            cand = searcher.next_candidate(hist, SMALL, random.Random(r))
            assert cand.stats["evaluated"] == config.candidates_per_generation
            assert cand.stats["fit_models"] == min(size, config.gp_max_models)
            assert not cand.stats["capped"] and rows.rows <= bound
            hist.append(Model(len(hist), cand.graph, 0.5))
        parsed = sum(m._graph is not None for m in hist[:size])
        # The fit set (best, recent and a stable sample: it barely moves) and the roots.
        assert parsed <= config.gp_max_models + 2 * config.neighbours + 3
        work[size] = (rows.rows, parsed)
    assert work[10_000][0] <= bound and work[100][0] <= bound


@pytest.mark.slow
def test_ten_thousand_models_give_the_same_candidates_beside_cpu_burners(ten_thousand):
    """The same history, seeds and settings, once on an idle machine and once with two
    processes burning both cores: the same candidates. Nothing in the choice reads a clock
    but the 30 s safety cap, held still here so that only the load differs."""
    import subprocess
    import sys

    def candidates():
        searcher = Searcher(clock=lambda: 0.0)
        hist = fresh(ten_thousand)
        out = []
        for r in range(3):
            cand = searcher.next_candidate(hist, SMALL, random.Random(r), kernel_size=5)
            out.append((*fingerprint(cand), cand.stats["capped"]))
            hist.append(Model(len(hist), cand.graph, 0.5))
        return out

    idle = candidates()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        loaded = candidates()
    finally:
        for p in burners:
            p.kill()
            p.wait(timeout=30)
    assert loaded == idle
    assert not any(row[-1] for row in idle)
    assert all(row[3] == SearchConfig().candidates_per_generation for row in idle)
