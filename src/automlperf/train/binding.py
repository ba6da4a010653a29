"""Each rank, and the decoding workers it forks, placed on the node's cores nearest its device.

On a node of several NUMA nodes (sockets, or an AMD socket's quadrants), a GPU hangs off one
of them: a rank whose decoding workers run on the other socket copies every decoded batch
across the interconnect, and the scheduler moves them between sockets as load changes. With
``train.cpu_binding = "auto"`` a rank on such a node takes a share of the cores of its GPU's
NUMA node (the node's cores split evenly between the GPUs attached to it, in device order)
and its workers inherit it when they fork. Where it would not help, nothing is bound: one
NUMA node, devices whose NUMA node the kernel does not report, CPU ranks, or a process that
the batch system already placed on part of the node (``srun --cpu-bind``, a cgroup's cpuset:
its placement stands). ``"spread"`` binds anyway, splitting the allowed cores between the
ranks in device order where NUMA does not decide (CPU ranks too); ``"off"`` never binds.

Reads Linux's ``/sys`` only; the plan itself (:func:`plan`) is plain data.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SYS = Path("/sys")
MODES = ("auto", "spread", "off")


@dataclass(frozen=True)
class Binding:
    """Where one rank runs: ``cpus`` (empty: where the scheduler puts it) and why."""

    cpus: tuple[int, ...]
    numa: int | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cpus"] = cpu_list(self.cpus)
        return out


def parse_cpu_list(text: str) -> set[int]:
    """The kernel's list format: ``0-3,8,10-11``."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def cpu_list(cpus: tuple[int, ...] | set[int]) -> str:
    """``cpus`` in the kernel's list format."""
    out: list[str] = []
    ordered = sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def numa_cpus(sys_root: Path = SYS) -> dict[int, set[int]]:
    """Each NUMA node's CPUs, as the kernel lists them (one node 0 of every online CPU where
    it lists none)."""
    nodes: dict[int, set[int]] = {}
    for path in sorted((sys_root / "devices/system/node").glob("node[0-9]*")):
        try:
            cpus = parse_cpu_list((path / "cpulist").read_text())
        except (OSError, ValueError):
            continue
        if cpus:
            nodes[int(path.name[4:])] = cpus
    if not nodes:
        try:
            nodes[0] = parse_cpu_list((sys_root / "devices/system/cpu/online").read_text())
        except (OSError, ValueError):
            nodes[0] = set(range(os.cpu_count() or 1))
    return nodes


def pci_numa(bus_id: str, sys_root: Path = SYS) -> int | None:
    """The NUMA node of a PCI device (``0000:3b:00.0``); None where the kernel says none."""
    try:
        node = int((sys_root / "bus/pci/devices" / bus_id.lower() / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def plan(numas: list[int | None], nodes: dict[int, set[int]], allowed: set[int],
         mode: str) -> list[Binding]:
    """The binding of each of a node's devices (``numas``: each one's NUMA node, None where
    unknown; ``nodes``: each NUMA node's CPUs; ``allowed``: the CPUs this process may use)."""
    n = len(numas)
    if mode == "off":
        return [Binding((), None, "off (train.cpu_binding)")] * n
    everything = set().union(*nodes.values()) if nodes else set(allowed)
    placed = {node: sorted(cpus & allowed) for node, cpus in nodes.items() if cpus & allowed}
    known = all(m is not None and m in placed for m in numas)
    if mode == "auto":
        why = ("one NUMA node" if len(placed) < 2 else
               "the devices' NUMA nodes are not known" if not known else
               f"the batch system placed this process on {len(allowed)} of the node's "
               f"{len(everything)} CPUs" if allowed < everything else "")
        if why:
            return [Binding((), None, f"not bound: {why}")] * n
    if len(placed) >= 2 and known:
        out = []
        for i, numa in enumerate(numas):
            sharing = [j for j, m in enumerate(numas) if m == numa]
            share = _split(placed[numa], len(sharing))[sharing.index(i)]  # type: ignore[index]
            out.append(Binding(tuple(share), numa, f"NUMA node {numa}, nearest its device"))
        return out
    shares = _split(sorted(allowed), n)
    return [Binding(tuple(s), None, "spread over the allowed CPUs") for s in shares]


def _split(cpus: list[int], parts: int) -> list[list[int]]:
    """``cpus`` in ``parts`` contiguous runs as even as can be (never an empty one while
    there are CPUs: parts beyond them take them again in turn)."""
    if parts <= len(cpus):
        size, extra = divmod(len(cpus), parts)
        out, start = [], 0
        for p in range(parts):
            end = start + size + (1 if p < extra else 0)
            out.append(cpus[start:end])
            start = end
        return out
    return [[cpus[p % len(cpus)]] for p in range(parts)]


def device_bus_ids(torch: Any) -> list[str | None]:
    """The PCI address of each CUDA device this process sees, in device order (None where
    torch does not tell it)."""
    out: list[str | None] = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        bus = getattr(props, "pci_bus_id", None)
        if bus is None:
            out.append(None)
            continue
        domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
        out.append(f"{domain:04x}:{bus:02x}:{device:02x}.0")
    return out


def bind_rank(device: Any, mode: str, index: int, ranks: int, sys_root: Path = SYS) -> Binding:
    """Place this process, rank ``index`` of the node's ``ranks`` on the torch ``device``, as
    :func:`plan` says, before it forks its decoding workers; its binding. CPU ranks train
    on many cores each and are bound only when asked (``spread``)."""
    allowed = os.sched_getaffinity(0)
    nodes = numa_cpus(sys_root)
    if device.type == "cuda":
        import torch

        numas = [pci_numa(b, sys_root) if b else None for b in device_bus_ids(torch)]
        mine = device.index if device.index is not None else torch.cuda.current_device()
    elif mode == "auto":
        return Binding((), None, "not bound: CPU ranks")
    else:
        numas, mine = [None] * ranks, index
    binding = plan(numas, nodes, allowed, mode)[mine]
    if binding.cpus:
        os.sched_setaffinity(0, binding.cpus)
    return binding
