"""A node's interference in the record: the host's steal read from /proc/stat, the GPU clocks
and the reasons NVML gives for holding them down (a faked pynvml: no GPU here), both carried
by the samples into the run's figures, and a run beyond the stated limits named not
comparable."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import pytest

from automlperf.measure import interference
from automlperf.measure.monitor import INTERFERENCE_REASONS, GPUSampler, StealReader
from automlperf.measure.samples import SampleDigest
from automlperf.store.base import sample_figures
from test_energy import FakeNVML

STAT = "cpu  {user} 0 {system} {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"


def test_the_hosts_steal_is_its_share_of_the_cpu_time_since_the_last_reading(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT.format(user=100, system=50, idle=800, steal=50))
    reader = StealReader(str(stat))
    stat.write_text(STAT.format(user=160, system=70, idle=860, steal=110))  # +60 of +200
    assert reader.read() == pytest.approx(0.3)
    assert reader.read() is None  # no time passed
    stat.write_text("intr 1 2 3\n")
    assert reader.read() is None
    assert StealReader(str(tmp_path / "absent")).read() is None


class ClockedNVML(FakeNVML):
    """GPU-a held down by heat (software thermal slowdown), GPU-b at its power limit only."""

    NVML_CLOCK_SM = 1

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return 1200 if handle == "GPU-a" else 1980

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return 0x20 if handle == "GPU-a" else 0x4


def test_gpu_clocks_and_the_reasons_that_hold_them_down_are_sampled(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", ClockedNVML())
    records = {r["uuid"]: r for r in GPUSampler(["GPU-a", "GPU-b"]).sample()}
    assert records["GPU-a"]["sm_clock_mhz"] == 1200 and records["GPU-a"]["throttled"] is True
    assert records["GPU-b"]["clock_reasons"] == 0x4 and records["GPU-b"]["throttled"] is False
    assert not 0x4 & INTERFERENCE_REASONS  # the power cap of a GPU at full load
    # Bindings without the calls (an older nvidia-ml-py): the sample goes on without them.
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    old = GPUSampler(["GPU-a"]).sample()[0]
    assert "throttled" not in old and old["energy_mj"] == 1_000_000


def _sample(t, steal, throttled):
    return {"t": t, "cpu_percent": 50.0, "mem_used_gib": 1.0, "cpu_steal": steal,
            "gpus": [{"index": 0, "uuid": "GPU-a", "util": 90.0, "energy_mj": 1000 * t,
                      "mem_used_gib": 2.0, "throttled": throttled}]}


def test_the_samples_carry_steal_and_throttling_into_the_runs_figures():
    numbers, uuids, _ = sample_figures(_sample(1.0, 0.02, True))
    assert numbers[2:6] == [0.0, 90.0, 1000.0, 2.0] and numbers[6:] == [0.02, 1.0]
    segment = SimpleNamespace(started_at=0.0, end=100.0, index=0, ended_at=100.0,
                              last_seen=100.0, deadline_at=100.0)
    digest = SampleDigest([segment])
    rows = [("n", t, *sample_figures(_sample(t, s, h)))
            for t, s, h in ((1.0, 0.02, False), (2.0, 0.10, True), (3.0, None, None))]
    # A sample stored before these readings: its numbers end with the GPU's.
    old, old_uuids, _ = sample_figures(_sample(4.0, 0.5, True))
    rows.append(("n", 4.0, old[:6], old_uuids, None))
    rows.append(("n", 500.0, *sample_figures(_sample(500.0, 0.9, True))))  # after the session
    digest.feed(rows)
    assert math.isnan(sample_figures(_sample(3.0, None, None))[0][6])
    used = digest.interference()
    assert used["cpu_steal"] == pytest.approx(0.06) and used["gpu_throttled"] == 0.5
    assert (used["steal_samples"], used["gpu_readings"]) == (2, 2)
    other = SampleDigest([segment])
    other.feed([("m", 1.0, *sample_figures(_sample(1.0, 0.0, False)))])
    digest.merge(other)
    assert digest.interference()["gpu_throttled"] == pytest.approx(1 / 3)


def test_a_run_beyond_a_stated_limit_is_named_not_comparable():
    clean = interference.judge({"cpu_steal": 0.01, "gpu_throttled": 0.0}, 5e11, 4.8e11)
    assert clean["comparable"] is True and clean["ceiling_end_over_start"] == pytest.approx(0.96)
    assert clean["why"].startswith("comparable: CPU steal 1.0%")
    # The Xeon's worst run: the host took the cores.
    stolen = interference.judge({"cpu_steal": 0.17}, 3.1e11, 2.2e11)
    assert stolen["comparable"] is False
    assert "the host stole 17.0% of the nodes' CPU time (limit 5%)" in stolen["why"]
    assert "the ceiling measured at the end is 0.71 of the start's" in stolen["why"]
    hot = interference.judge({"gpu_throttled": 0.2}, None, None)
    assert hot["comparable"] is False and "clocks held down" in hot["why"]
    unknown = interference.judge({}, 5e11, None)
    assert unknown["comparable"] is None and unknown["why"].startswith("unknown")
