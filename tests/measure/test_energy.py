"""Energy from counters: a faked NVML (no GPU here) and a fake powercap tree stand in for
the hardware; the differencing, the wrap-around and the figures in result.json are real."""

import types

import pytest

from automlperf.config import Config
from automlperf.graph import seeds
from automlperf.measure.energy import RaplReader, counter_delta, energy_summary
from automlperf.measure.monitor import GPUSampler, sample
from automlperf.measure.result import build_result
from automlperf.store import EpochRecord, TrialStatus, open_store
from helpers import new_claim


def powercap(root, domains):
    """domains: {dirname: (name, energy_uj, max_energy_range_uj)}"""
    for dirname, (name, energy, wrap) in domains.items():
        d = root / dirname
        d.mkdir(parents=True)
        (d / "name").write_text(name + "\n")
        (d / "energy_uj").write_text(f"{energy}\n")
        (d / "max_energy_range_uj").write_text(f"{wrap}\n")
    return root


def set_energy(root, dirname, value):
    (root / dirname / "energy_uj").write_text(f"{value}\n")


class FakeNVML(types.ModuleType):
    """The calls GPUSampler makes, for two GPUs whose energy counters the test advances."""

    class NVMLError(Exception):
        pass

    def __init__(self):
        super().__init__("pynvml")
        self.energy = {"GPU-a": 1_000_000, "GPU-b": 5_000_000}  # millijoules

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return ["GPU-b", "GPU-a"][i]  # NVML's order differs from torch's

    def nvmlDeviceGetUUID(self, handle):
        return handle.encode()

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=90)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=2**30, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle):
        return 300_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self.energy[handle]


def test_counter_delta_follows_a_wrap():
    assert counter_delta(100, 250, 1000) == 150
    assert counter_delta(900, 50, 1000) == 150
    assert counter_delta(900, 50, None) == 0  # a reset, not a wrap


def test_rapl_reads_package_domains_only(tmp_path):
    root = powercap(tmp_path, {"intel-rapl:0": ("package-0", 10, 2**32),
                               "intel-rapl:0:0": ("core", 5, 2**32),
                               "intel-rapl:1": ("package-1", 20, 2**32)})
    reader = RaplReader(root)
    assert reader.read() == {"intel-rapl:0/package-0": [10, 2**32],
                             "intel-rapl:1/package-1": [20, 2**32]}
    assert RaplReader(tmp_path / "none").error.startswith("no RAPL package domains")


def test_samples_difference_into_joules_and_ops_per_watt(tmp_path, monkeypatch):
    nvml = FakeNVML()
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nvml)
    root = powercap(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 999_000_000,
                                                             1_000_000_000)})
    gpus, rapl = GPUSampler(["GPU-a", "GPU-b"]), RaplReader(root)
    assert gpus.error is None and [h[1] for h in gpus.handles] == ["GPU-a", "GPU-b"]

    store = open_store(f"sqlite:///{tmp_path / 'history.db'}", create=True)
    config = Config.for_dataset("builtin", {}, "test")
    t0 = 1_700_000_000.0
    run_id = store.create_run("r", config.model_dump(mode="json"), {}, 100, t0)
    segment = store.start_segment(run_id, t0, t0 + 100)
    samples = []
    for step in range(3):
        record = sample(gpus, rapl)
        record["t"] = t0 + 10 + 30 * step  # sampled every 30 s
        samples.append(record)
        nvml.energy["GPU-a"] += 9_000_000   # 9 kJ per interval: 300 W
        nvml.energy["GPU-b"] += 6_000_000   # 200 W
        # 60 J per interval, across the RAPL counter's wrap at 1000 J.
        set_energy(root, "intel-rapl:0", (999_000_000 + 60_000_000 * (step + 1)) % 1_000_000_000)
    store.add_samples(run_id, "node1", samples)
    # A sample outside the session is not counted.
    late = sample(gpus, rapl)
    late["t"] = t0 + 500
    store.add_samples(run_id, "node1", [late])

    rep = store.register_replica(run_id, 0, segment, "node1", 1, ["cuda:0", "cuda:1"], t0)
    graph = seeds.seed("resnet_small", 10, 8, 1).to_json(None)
    trial = store.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=0,
                                        graph_hash="h", graph_json=graph, now=t0))
    store.record_epoch(EpochRecord(
        trial_id=trial, epoch=0, started_at=t0, ended_at=t0 + 50, train_images=1000,
        val_images=100, steps=8, ops=10**15, train_loss=1.0, val_accuracy=0.9,
        precision="bf16", batch_size=128, world_size=2, data_share=0.1, images_per_s=20.0,
        run_id=run_id))
    store.finish_trial(trial, TrialStatus.COMPLETED, t0 + 50, best_accuracy=0.9)
    store.end_segment(run_id, segment, t0 + 100)

    summary = energy_summary(store.samples(run_id), store.segments(run_id))
    assert summary["gpu_energy_j"] == pytest.approx(2 * 15_000)
    assert summary["cpu_energy_j"] == pytest.approx(2 * 60)
    assert summary["energy_window_s"] == pytest.approx(60)
    assert summary["mean_power_w"] == pytest.approx(500 + 2)

    result = build_result(store, run_id, config, {})
    assert result["energy_j"] == pytest.approx(30_120)
    assert result["ops_per_watt"] == pytest.approx(result["score"] / 502)


def test_no_counters_no_energy_figures(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'history.db'}", create=True)
    config = Config.for_dataset("builtin", {}, "test")
    run_id = store.create_run("r", config.model_dump(mode="json"), {}, 100, 0.0)
    segment = store.start_segment(run_id, 0.0, 100.0)
    store.add_samples(run_id, "n", [{"t": 10.0, "gpus": [], "cpu_percent": 5},
                                    {"t": 40.0, "gpus": [], "cpu_percent": 5}])
    store.end_segment(run_id, segment, 100.0)
    result = build_result(store, run_id, config, {})
    assert result["energy_j"] is None and result["ops_per_watt"] is None


def test_amd_gpus_are_sampled_through_amdsmi_when_nvml_finds_none(monkeypatch):
    import sys

    from automlperf.measure.monitor import open_gpu_sampler

    nvml = FakeNVML()
    nvml.nvmlDeviceGetCount = lambda: 0
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    energy = {"h0": 1_000}
    amdsmi = types.ModuleType("amdsmi")
    amdsmi.amdsmi_init = lambda *a: None
    amdsmi.amdsmi_get_processor_handles = lambda: ["h0"]
    amdsmi.amdsmi_get_gpu_device_uuid = lambda h: "ab-cd"
    amdsmi.amdsmi_get_gpu_vram_usage = lambda h: {"vram_used": 2048, "vram_total": 196608}
    amdsmi.amdsmi_get_power_info = lambda h: {"current_socket_power": 650}
    amdsmi.amdsmi_get_gpu_activity = lambda h: {"gfx_activity": 97}
    amdsmi.amdsmi_get_energy_count = lambda h: {"energy_accumulator": energy[h],
                                                "counter_resolution": 15.3}
    monkeypatch.setitem(sys.modules, "amdsmi", amdsmi)
    sampler = open_gpu_sampler(["GPU-ab-cd"])
    (entry,) = sampler.sample()
    assert entry["uuid"] == "ab-cd" and entry["util"] == 97.0 and entry["power_w"] == 650.0
    assert entry["mem_total_gib"] == 192.0 and entry["energy_mj"] == int(1_000 * 15.3 / 1000)


def test_a_simulated_run_samples_neither_the_machines_gpus_nor_its_cpu_energy(tmp_path, monkeypatch):
    """Its devices are a model's: the watts of this machine's GPUs and CPU are not theirs."""
    import json
    import threading

    from automlperf.measure.monitor import run_sampler
    from automlperf.store.rundir import RUN_FILE, SCHEMA_VERSION, RunDir

    monkeypatch.setitem(__import__("sys").modules, "pynvml", FakeNVML())
    root = powercap(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 10, 2**32)})
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    (rd.path / RUN_FILE).write_text(json.dumps({"run_id": 1, "schema_version": SCHEMA_VERSION}))
    for host_only in (False, True):
        stop = threading.Event()
        stop.set()  # one final sample, then return
        out = tmp_path / f"out-{host_only}.jsonl"
        with open(out, "w") as stream:
            run_sampler(rd.path, None, 30.0, [], f"node-{host_only}", stop=stop, powercap=root,
                        to=stream, host_only=host_only)
        (record,) = [json.loads(line) for line in out.read_text().splitlines()]
        if host_only:
            assert record["gpus"] == [] and "cpu_energy_uj" not in record
            assert "cpu_percent" in record
        else:  # the same call without the flag reads both, so the test can tell
            assert len(record["gpus"]) == 2 and "cpu_energy_uj" in record
