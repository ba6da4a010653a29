"""Ranks placed on the cores nearest their device: the plan on given topologies, the kernel's
files read, and real rank processes bound on this machine."""

import os

import psutil
import pytest

from automlperf.train import binding
from automlperf.train.binding import Binding, plan
from automlperf.train.pool import DevicePool
from helpers import data_section

TWO_SOCKETS = {0: set(range(0, 8)), 1: set(range(8, 16))}
ALL = set(range(16))


def cpus(bindings):
    return [b.cpus for b in bindings]


def test_each_gpu_gets_a_share_of_its_numa_nodes_cores():
    # Four GPUs, two on each socket.
    assert cpus(plan([0, 0, 1, 1], TWO_SOCKETS, ALL, "auto")) == [
        (0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    # Three on socket 0 (8 cores: 3, 3, 2), one alone on socket 1.
    bound = plan([0, 1, 0, 0], TWO_SOCKETS, ALL, "auto")
    assert cpus(bound) == [(0, 1, 2), tuple(range(8, 16)), (3, 4, 5), (6, 7)]
    assert [b.numa for b in bound] == [0, 1, 0, 0]
    assert bound[1].why == "NUMA node 1, nearest its device"
    # More GPUs than cores on a node: they share, none is left without one.
    assert cpus(plan([0, 0, 0], {0: {0, 1}, 1: {2, 3}}, {0, 1, 2, 3}, "auto")) == [(0,), (1,), (0,)]


def test_auto_binds_only_where_it_helps_and_the_override_decides():
    one_node = {0: ALL}
    assert plan([0, 0], one_node, ALL, "auto") == [Binding((), None, "not bound: one NUMA node")] * 2
    unknown = plan([0, None], TWO_SOCKETS, ALL, "auto")
    assert unknown[0].why == "not bound: the devices' NUMA nodes are not known"
    # A process the batch system placed on part of the node keeps its placement.
    placed = plan([0, 1], TWO_SOCKETS, {0, 1, 8, 9}, "auto")
    assert placed[0].why == "not bound: the batch system placed this process on 4 of the node's 16 CPUs"
    assert plan([0, 1], TWO_SOCKETS, ALL, "off")[1] == Binding((), None, "off (train.cpu_binding)")
    # spread binds anyway: by NUMA node within what is allowed, else in device order.
    assert cpus(plan([0, 1], TWO_SOCKETS, {0, 1, 8, 9}, "spread")) == [(0, 1), (8, 9)]
    assert cpus(plan([None, None, None], one_node, ALL, "spread")) == [
        tuple(range(0, 6)), tuple(range(6, 11)), tuple(range(11, 16))]


def test_the_kernels_lists_are_read_as_it_writes_them(tmp_path):
    node = tmp_path / "devices/system/node"
    for n, text in ((0, "0-3,8-11\n"), (1, "4-7,12-15\n")):
        (node / f"node{n}").mkdir(parents=True)
        (node / f"node{n}" / "cpulist").write_text(text)
    (node / "possible").write_text("0-1\n")  # not a node
    nodes = binding.numa_cpus(tmp_path)
    assert nodes == {0: {0, 1, 2, 3, 8, 9, 10, 11}, 1: {4, 5, 6, 7, 12, 13, 14, 15}}
    assert binding.cpu_list(nodes[0]) == "0-3,8-11" and binding.cpu_list({5}) == "5"
    gpu = tmp_path / "bus/pci/devices/0000:3b:00.0"
    gpu.mkdir(parents=True)
    (gpu / "numa_node").write_text("1\n")
    assert binding.pci_numa("0000:3B:00.0", tmp_path) == 1
    (gpu / "numa_node").write_text("-1\n")  # the firmware did not say
    assert binding.pci_numa("0000:3b:00.0", tmp_path) is None
    assert binding.pci_numa("0000:00:01.0", tmp_path) is None
    # This machine's own lists: every CPU this process may use is on some node.
    assert os.sched_getaffinity(0) <= set().union(*binding.numa_cpus().values())


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to spread over")
def test_rank_processes_are_bound_as_asked_and_say_so():
    allowed = sorted(os.sched_getaffinity(0))
    halves = binding._split(allowed, 2)
    with DevicePool(["cpu"] * 2, data_section("digits"), cpu_binding="spread") as pool:
        told = pool.description["binding"]
        assert [t["cpus"] for t in told] == [binding.cpu_list(set(h)) for h in halves]
        for rank, half in zip(pool._ranks, halves):
            assert sorted(psutil.Process(rank.process.pid).cpu_affinity()) == half
    with DevicePool(["cpu"], data_section("digits")) as pool:  # auto: CPU ranks stay free
        assert pool.description["binding"] == [
            {"cpus": "", "numa": None, "why": "not bound: CPU ranks"}]
        assert sorted(psutil.Process(pool._ranks[0].process.pid).cpu_affinity()) == allowed
