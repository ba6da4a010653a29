"""NVML on shared nodes, through a faked pynvml (no GPU here): a device NVML refuses is
left out, never fatal, and the node's sampler covers every replica's GPUs."""

import sys

from automlperf.measure import system
from automlperf.measure.monitor import GPUSampler
from automlperf.runner.identity import local_size
from test_energy import FakeNVML


class SharedNodeNVML(FakeNVML):
    """Three GPUs; the third belongs to another job (NO_PERMISSION), and GPU-b refuses its
    utilisation query."""

    class NVMLError_NoPermission(FakeNVML.NVMLError):
        pass

    def __init__(self):
        super().__init__()
        self.energy["GPU-c"] = 0

    def nvmlDeviceGetCount(self):
        return 3

    def nvmlDeviceGetHandleByIndex(self, i):
        if i == 2:
            raise self.NVMLError_NoPermission("Insufficient Permissions")
        return super().nvmlDeviceGetHandleByIndex(i)

    def nvmlDeviceGetUtilizationRates(self, handle):
        if handle == "GPU-b":
            raise self.NVMLError_NoPermission("Insufficient Permissions")
        return super().nvmlDeviceGetUtilizationRates(handle)

    def nvmlSystemGetDriverVersion(self):
        raise self.NVMLError_NoPermission("Insufficient Permissions")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return 700_000

    def nvmlShutdown(self):
        pass


def test_a_refused_device_is_left_out_not_fatal(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", SharedNodeNVML())
    sampler = GPUSampler(["GPU-a"])
    assert [h[1] for h in sampler.handles] == ["GPU-a"]
    assert "device 2" in sampler.error and "Insufficient Permissions" in sampler.error
    every = GPUSampler(["GPU-b"], every_gpu=True)
    assert [(i, u) for i, u, _ in every.handles] == [(0, "GPU-b"), (1, "GPU-a")]
    records = {r["uuid"]: r for r in every.sample()}
    assert "Insufficient Permissions" in records["GPU-b"]["error"]
    assert records["GPU-b"]["energy_mj"] == 5_000_000  # what it does allow is still read
    assert records["GPU-a"]["util"] == 90.0
    details = system._nvml_by_uuid()
    assert set(details) == {b"GPU-a", b"GPU-b"} and details[b"GPU-a"]["driver"] is None


class UncountableNVML(SharedNodeNVML):
    """NVML that initialises but refuses to count the devices (a container without the
    device files, a node whose driver is being reloaded)."""

    def nvmlDeviceGetCount(self):
        raise self.NVMLError_NoPermission("Insufficient Permissions")


def test_nvml_that_cannot_count_its_devices_is_not_fatal(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", UncountableNVML())
    assert system._nvml_by_uuid() == {}
    sampler = GPUSampler(["GPU-a"])
    assert sampler.handles == [] and "cannot count the GPUs" in sampler.error


def test_the_node_sampler_knows_when_replicas_share_the_node():
    assert local_size({}) == 1
    assert local_size({"AUTOMLPERF_LOCAL_REPLICAS": "4"}) == 4
    assert local_size({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}) == 2
    assert local_size({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}) == 8
