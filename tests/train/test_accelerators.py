"""Accelerators other than NVIDIA's, discovered through torch.accelerator. No such device is
here: torch.accelerator, the backend modules and amdsmi are faked; the discovery, device
choice, peak lookup and visibility logic are the real ones."""

import json
import sys
import types

import pytest
import torch

from automlperf.measure import system
from automlperf.runner.launch import gpu_slices, visibility_variable
from automlperf import hardware
from automlperf.train import rank

GiB = 2**30


def fake_accelerator(monkeypatch, kind, count, memory=64 * GiB):
    monkeypatch.setattr(hardware, "accelerator_nodes_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    # torch_npu renames the privateuse1 device "npu"; stock torch cannot make that device.
    monkeypatch.setattr(torch.accelerator, "current_accelerator",
                        lambda check_available=False: types.SimpleNamespace(type=kind))
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: count)
    monkeypatch.setattr(torch.accelerator, "get_memory_info",
                        lambda i=None: (memory // 2, memory))


def test_intel_xpus_are_found_named_and_given_their_peak(monkeypatch):
    fake_accelerator(monkeypatch, "xpu", 2)
    monkeypatch.setattr(torch.xpu, "get_device_properties", lambda i: types.SimpleNamespace(
        name="Intel(R) Data Center GPU Max 1550", total_memory=64 * GiB))
    found = system.accelerators()
    assert [(a["index"], a["type"], a["vendor"], a["memory_gib"]) for a in found] == \
        [(0, "xpu", "Intel", 64.0), (1, "xpu", "Intel", 64.0)]
    assert found[0]["peak_ops"] == 419.4e12 and found[0]["peak_precision"] == "bf16"
    assert system.describe()["peak_ops_per_node"] == pytest.approx(2 * 419.4e12)

    assert hardware.visible_accelerators() == ["xpu:0", "xpu:1"]
    assert hardware.choose_devices(None) == ["xpu:0", "xpu:1"]
    assert hardware.choose_devices(1) == ["xpu:0"]
    with pytest.raises(hardware.DeviceError, match="3 devices requested but only 2 accelerators"):
        hardware.choose_devices(3)
    assert hardware.accelerator_memory_gib() == 64.0
    assert rank.process_group_backend("xpu") == "xccl"

    monkeypatch.delenv("ZE_AFFINITY_MASK", raising=False)
    assert visibility_variable() == "ZE_AFFINITY_MASK"
    assert gpu_slices(2, None) == ["0", "1"]


def test_ascend_npus_through_a_plugin_module(monkeypatch):
    fake_accelerator(monkeypatch, "npu", 8, memory=64 * GiB)
    npu = types.SimpleNamespace(get_device_name=lambda i: "Ascend910B3")
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    found = system.accelerators()
    assert len(found) == 8 and found[7]["name"] == "Ascend910B3"
    assert found[0]["vendor"] == "Huawei" and found[0]["memory_gib"] == 64.0
    assert (found[0]["peak_ops"], found[0]["peak_precision"]) == (313.0e12, "fp16")
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4,5,6,7")
    assert visibility_variable() == "ASCEND_RT_VISIBLE_DEVICES"
    assert gpu_slices(2, None) == ["4,5", "6,7"]


def test_rocm_gpus_keep_the_cuda_path_with_amdsmi_details(monkeypatch):
    monkeypatch.setattr(hardware, "accelerator_nodes_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(
        name="AMD Instinct MI300X", total_memory=192 * GiB, uuid="a1b2", major=9, minor=4))
    amdsmi = types.ModuleType("amdsmi")
    amdsmi.amdsmi_init = lambda *a: None
    amdsmi.amdsmi_shut_down = lambda: None
    amdsmi.amdsmi_get_processor_handles = lambda: ["h0"]
    amdsmi.amdsmi_get_gpu_device_uuid = lambda h: "a1b2"
    amdsmi.amdsmi_get_gpu_driver_info = lambda h: {"driver_version": "6.10.5"}
    amdsmi.amdsmi_get_power_cap_info = lambda h: {"power_cap": 750_000_000}
    monkeypatch.setitem(sys.modules, "amdsmi", amdsmi)
    (gpu,) = system.accelerators()
    assert (gpu["type"], gpu["vendor"], gpu["name"]) == ("cuda", "AMD", "AMD Instinct MI300X")
    assert gpu["peak_ops"] == 1307.4e12
    assert gpu["driver"] == "6.10.5" and gpu["power_limit_w"] == 750.0
    assert hardware.visible_accelerators() == ["cuda:0"]


def test_without_any_accelerator_training_runs_on_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert system.accelerators() == [] and hardware.choose_devices(None) == ["cpu"]
    assert hardware.accelerator_memory_gib() is None and gpu_slices(2, None) == []


@pytest.mark.parametrize("name,peak", [
    ("AMD Instinct MI250X", 191.5e12), ("AMD Instinct MI250X/MI250", 191.5e12),
    ("AMD Instinct MI250", 181.05e12), ("Ascend910", 256.0e12),
    ("NVIDIA H100 80GB HBM3", 989.4e12)])
def test_the_peak_table_matches_device_names(name, peak):
    assert system.peak_for(name)[0] == peak


def fake_torch(version, cuda=None, hip=None, warning=None):
    """A torch module as far as the diagnosis reads it: its build and what its CUDA
    initialisation says."""
    import warnings

    def is_available():
        if warning:
            warnings.warn(warning, stacklevel=2)
        return False

    return types.SimpleNamespace(__version__=version, version=types.SimpleNamespace(cuda=cuda, hip=hip),
                                 cuda=types.SimpleNamespace(is_available=is_available))


def test_a_replica_told_to_use_gpus_that_sees_none_says_why():
    # This machine's own torch is a CPU-only build: the real thing, end to end.
    with pytest.raises(hardware.DeviceError, match=r"this torch \(.*\) is a CPU-only build"):
        hardware.choose_devices(None, require=True)
    assert hardware.choose_devices(None) == ["cpu"]  # not asked for: CPU ranks, as before
    # The other causes, through the seam: a variable that hides every device ...
    cuda = fake_torch("2.8.0+cu128", cuda="12.8")
    said = hardware.missing_accelerators(cuda, {"CUDA_VISIBLE_DEVICES": ""}, ["/dev/nvidia0"])
    assert "CUDA_VISIBLE_DEVICES='' hides every device" in said
    # ... a step given no GPU (no device file in its cgroup) ...
    said = hardware.missing_accelerators(cuda, {}, [])
    assert "torch 2.8.0+cu128 (CUDA 12.8) sees none" in said and "no /dev/nvidia<N>" in said
    # ... and a driver torch cannot use, in torch's own words.
    broken = fake_torch("2.8.0+cu128", cuda="12.8", warning="Found no NVIDIA driver on your system.")
    said = hardware.missing_accelerators(broken, {}, ["/dev/nvidia0"])
    assert "(torch says: Found no NVIDIA driver on your system.)" in said and "nvidia-smi" in said
    assert all("\n" not in s for s in (said,))


@pytest.mark.parametrize("nodes, present", [
    ([], False), (["null", "kvm", "loop0", "dri/card0"], False),
    (["nvidiactl", "nvidia0"], True), (["dxg"], True), (["kfd"], True),
    (["dri/card1", "dri/renderD128"], True), (["davinci3"], True)])
def test_accelerators_are_looked_for_where_their_runtimes_reach_them(tmp_path, nodes, present):
    for node in nodes:
        (tmp_path / node).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / node).touch()
    assert hardware.accelerator_nodes_present(tmp_path, "linux") is present
    assert hardware.accelerator_nodes_present(tmp_path, "darwin") is True  # torch is asked


def test_a_primary_without_accelerators_does_not_load_torch():
    """The primary asks torch for accelerators to divide among local replicas only where a
    runtime's device file exists; without one, torch stays unloaded."""
    import subprocess

    if hardware.accelerator_nodes_present():
        pytest.skip("this machine has an accelerator's device files")
    code = ("import sys; from automlperf.runner.launch import gpu_slices; "
            "print(gpu_slices(2, None), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["[]", "False"]
    # Nor to describe the machine: torch's build as torch itself gives it.
    code = ("import json, sys; from automlperf.measure.system import describe; "
            "print(json.dumps([describe()['software'], 'torch' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    software, loaded = json.loads(done.stdout)
    assert not loaded
    assert (software["torch"], software["cuda"], software["hip"], software["cudnn"]) == \
        (str(torch.__version__), torch.version.cuda, torch.version.hip, None)
