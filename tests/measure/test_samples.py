"""The one pass over the samples gives the figures of their definitions (energy_summary,
utilisation, the resource chart's readings), read in this process or in shares by workers."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from automlperf.config import Config
from automlperf.measure import sample_reader
from automlperf.measure.breakdown import utilisation
from automlperf.measure.energy import energy_summary
from automlperf.measure.result import build_result
from automlperf.measure.samples import SampleDigest, energy_preserving, sample_digest
from automlperf.measure.score import segment_bounds
from automlperf.report import charts
from automlperf.store import open_store


def _samples(rng: random.Random, node: int, t0: float, n: int) -> list[dict]:
    """A node's samples as the monitor writes them, with what real ones hold: a counter
    that resets (driver reload), a GPU that failed to answer, a GPU without an energy
    counter, RAPL packages that wrap."""
    energy = [rng.randrange(10**9) for _ in range(3)]
    rapl = [rng.randrange(10**9), rng.randrange(10**9)]
    out = []
    for k in range(n):
        gpus = []
        for i in range(3):
            energy[i] += rng.randrange(10**7)
            if rng.random() < 0.02:
                energy[i] = rng.randrange(10**6)  # reset
            g = {"index": i, "uuid": f"GPU-{node}-{i}"}
            if rng.random() < 0.05:
                g["error"] = "Unknown Error"
            else:
                g.update(util=100 * rng.random(), mem_used_gib=80 * rng.random(),
                         mem_total_gib=79.1, power_w=600 * rng.random())
            if i != 2:
                g["energy_mj"] = energy[i]
            gpus.append(g)
        rapl = [(r + rng.randrange(10**8)) % 10**9 for r in rapl]
        sample = {"t": t0 + 30 * k + rng.random(), "cpu_percent": 100 * rng.random(),
                  "mem_used_gib": 100 * rng.random(), "mem_total_gib": 256.0, "gpus": gpus}
        if node % 2:
            sample["cpu_energy_uj"] = {"intel-rapl:0/package-0": [rapl[0], 10**9],
                                       "intel-rapl:1/package-1": [rapl[1], 10**9]}
        out.append(sample)
    return out


@pytest.fixture
def sampled_run(store_url):
    """A run of two sessions, 6 nodes sampled every 30 s, some samples between sessions."""
    rng = random.Random(7)
    store = open_store(store_url, create=True)
    config = Config.for_dataset("builtin", {}, "test")
    t0 = 1_800_000_000.0
    run_id = store.create_run("r", config.model_dump(mode="json"), {}, 3600, t0)
    first = store.start_segment(run_id, t0, t0 + 3000)
    store.end_segment(run_id, first, t0 + 1500)
    second = store.start_segment(run_id, t0 + 2000, t0 + 5000)
    store.end_segment(run_id, second, t0 + 4000)
    for node in range(6):
        store.add_samples(run_id, f"node{node}", _samples(rng, node, t0 - 60, 140))
    yield store, run_id
    store.close()


def _close(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12)
    return a == b


def _by_key(columns) -> dict:
    out: dict = {}
    for t, u, m, k in zip(columns.t, columns.util, columns.mem, columns.key):
        out.setdefault(columns.keys[k], []).append((t, u, m))
    return out


def _expected_chart(samples: list[dict]) -> dict:
    """The resource chart's readings, as the chart read them from the samples."""
    out: dict = {}
    for s in samples:
        if "t" in s and "cpu_percent" in s:
            for g in s.get("gpus", []):
                if "util" in g:
                    out.setdefault((s["node"], g["index"]), []).append(
                        (s["t"], g["util"], g["mem_used_gib"]))
    return out


def test_one_pass_equals_the_definitions(sampled_run):
    store, run_id = sampled_run
    segments = store.segments(run_id)
    samples = store.samples(run_id)
    sampled = sample_digest(store.sample_figure_chunks(run_id), segments, chart=True)
    expected = energy_summary(samples, segments)
    assert expected is not None and expected["cpu_energy_j"] > 0
    assert _close(sampled.energy(), expected)
    used = utilisation(samples, segment_bounds(segments))
    assert used["samples"] < len(samples)  # some fell between the sessions
    assert sampled.utilisation() == used  # same readings added in the same order
    columns = sampled.columns()
    assert columns.gpu and columns.nodes == 6 and columns.per_node == 3
    assert _by_key(columns) == _expected_chart(samples)
    assert sampled.count == len(samples)


@pytest.mark.slow
def test_worker_processes_give_the_same_figures(sampled_run, monkeypatch):
    store, run_id = sampled_run
    segments = store.segments(run_id)
    alone = sample_digest(store.sample_figure_chunks(run_id), segments, chart=True)
    monkeypatch.setattr(sample_reader, "PARALLEL_FROM", 0)
    monkeypatch.setattr(sample_reader, "cores_available", lambda: 3)
    pending = sample_reader.PendingDigest(store, run_id, segments, chart=True)
    assert pending._pool is not None  # read by three worker processes
    shared = pending.result()
    assert _close(shared.energy(), alone.energy())
    assert _close(shared.utilisation(), alone.utilisation())
    assert _by_key(shared.columns()) == _by_key(alone.columns())
    assert shared.count == alone.count
    # and the result written from them is the one written in one process
    config = Config.for_dataset("builtin", {}, "test")
    here = build_result(store, run_id, config, {}, sampled=alone)
    there = build_result(store, run_id, config, {}, sampled=shared)
    for name in ("energy_j", "gpu_energy_j", "cpu_energy_j", "mean_power_w"):
        assert math.isclose(here[name], there[name], rel_tol=1e-12)
    assert _close(here["time_breakdown"]["utilisation"], there["time_breakdown"]["utilisation"])


def test_the_chart_draws_the_digest(sampled_run):
    store, run_id = sampled_run
    segments = store.segments(run_id)
    columns = sample_digest(store.sample_figure_chunks(run_id), segments, chart=True).columns()
    svg, note = charts.resource_chart(columns, segments[0].started_at)
    assert "range of 18" in svg and "GPU" in note  # 6 nodes x 3 GPUs: mean and range
    few = SampleDigest(segments, chart=True)
    few.feed(r for chunk in store.sample_figure_chunks(run_id, ["node0", "node1"]) for r in chunk)
    svg, _ = charts.resource_chart(few.columns(), segments[0].started_at)
    assert "node1 gpu2" in svg and "range of" not in svg  # six GPUs: a line each
    empty = SampleDigest(segments, chart=True).columns()
    svg, note = charts.resource_chart(empty, 0.0)
    assert "no samples recorded" in svg and not len(empty.t) and isinstance(empty.t, np.ndarray)


def test_a_store_made_before_the_figures_column_gives_the_same_figures(sampled_run):
    """Rows stored before the figures were kept beside each sample are read from the whole
    sample; the store gets the column when opened, and rows added after use it."""
    store, run_id = sampled_run
    segments = store.segments(run_id)
    before = sample_digest(store.sample_figure_chunks(run_id), segments, chart=True)
    url = store.url
    with store.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE amp_samples DROP COLUMN figures")
        conn.exec_driver_sql("ALTER TABLE amp_samples DROP COLUMN figure_keys")
        conn.exec_driver_sql("DELETE FROM amp_meta WHERE key = 'layout'")  # none was kept then
    store.close()
    reopened = open_store(url)
    try:
        with reopened.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM amp_samples "
                                        "WHERE figures IS NULL").scalar() == 6 * 140
        old = sample_digest(reopened.sample_figure_chunks(run_id), segments, chart=True)
        assert _close(old.energy(), before.energy())
        assert old.utilisation() == before.utilisation()
        assert _by_key(old.columns()) == _by_key(before.columns()) and old.count == before.count
        # a node sampled again after the store was opened: old and new rows in one chunk
        later = _samples(random.Random(8), 6, 1_800_000_000.0 + 4000, 20)
        reopened.add_samples(run_id, "node6", later)
        samples = reopened.samples(run_id)
        mixed = sample_digest(reopened.sample_figure_chunks(run_id), segments, chart=True)
        assert mixed.count == len(samples) == 6 * 140 + 20
        assert _close(mixed.energy(), energy_summary(samples, segments))
        assert mixed.utilisation() == utilisation(samples, segment_bounds(segments))
        assert _by_key(mixed.columns()) == _expected_chart(samples)
    finally:
        reopened.close()


def test_numbers_a_float64_cannot_hold_are_read_from_the_whole_sample(store_url):
    """A counter beyond 2**53 would not come back exactly from the packed numbers: such a
    sample is stored without them and read whole, and the figures stay exact."""
    store = open_store(store_url, create=True)
    try:
        config = Config.for_dataset("builtin", {}, "test")
        t0 = 1_800_000_000.0
        run_id = store.create_run("r", config.model_dump(mode="json"), {}, 3600, t0)
        seg = store.start_segment(run_id, t0, t0 + 3600)
        store.end_segment(run_id, seg, t0 + 3600)
        big = 2**60
        samples = [{"t": t0 + 30 * k, "cpu_percent": 50.0, "mem_used_gib": 1.0,
                    "gpus": [{"index": 0, "uuid": "GPU-a", "util": 90.0, "mem_used_gib": 2.0,
                              "energy_mj": big + 7 * k}]}
                   for k in range(4)]
        assert float(big + 21) - float(big) != 21  # what a float64 would have made of it
        store.add_samples(run_id, "node0", samples)
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM amp_samples "
                                        "WHERE figures IS NULL").scalar() == 4
        segments = store.segments(run_id)
        sampled = sample_digest(store.sample_figure_chunks(run_id), segments)
        expected = energy_summary(store.samples(run_id), segments)
        assert sampled.energy() == expected and expected["gpu_energy_j"] == 21 / 1e3
    finally:
        store.close()


def test_the_samples_a_bundle_keeps_give_the_energy_of_all(sampled_run):
    """Resets, wraps, GPUs that failed to answer or have no counter, two sessions and samples
    between them: the samples kept give the same joules and seconds as all of them."""
    store, run_id = sampled_run
    segments = store.segments(run_id)
    every = [f for chunk in store.sample_figure_chunks(run_id) for f in chunk]
    keep = energy_preserving([every], segments, len(every), 100)
    kept = [f for f, k in zip(every, keep) if k]
    assert 100 <= len(kept) < len(every) / 2
    assert _close(sample_digest([kept], segments).energy(),
                  sample_digest([every], segments).energy())
    assert all(energy_preserving([every], segments, len(every), len(every)))
