"""The replicas' nodes held to each other and to what the replicas recorded (a consistency
check, as the rest of the store is: what a node says of itself is its own word):

* each replica trained on devices its node's description has, and the store's record of
  the replica names the devices its node description does;
* each node's measured ceiling is of the devices it records, one entry per device, and
  adds up to the ceiling it records, so that devices dropped from the records while the
  ceiling keeps them, or a ceiling made up of other devices, are named;
* no epoch trained on more ranks than its replica records devices;
* every replica trained with the automlperf the run records.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from automlperf.measure.result import latest_nodes
from automlperf.store.base import EpochRecord, ReplicaRecord, TrialRecord


def check_devices(nodes: list[dict[str, Any]], replicas: list[ReplicaRecord],
                  bad: list[str]) -> None:
    """Each replica trained on devices its node's description has, and the store's record
    of the replica names the devices its node description does."""
    latest = {(r.index, r.segment): r for r in replicas}
    for node in latest_nodes(nodes):
        index = node.get("replica_index")
        accelerators = {f"{a.get('type', 'cuda')}:{a.get('index')}"
                        for a in (node.get("system") or {}).get("accelerators", [])}
        devices = node.get("devices") or []
        unknown = [d for d in devices if d != "cpu" and d not in accelerators]
        if unknown:
            bad.append(f"replica {index}: trained on {', '.join(unknown)}, which its node's "
                       f"description does not have ({', '.join(sorted(accelerators)) or 'none'})")
        rep = latest.get((int(index or 0), int(node.get("segment") or 0)))
        if rep is not None and sorted(rep.devices) != sorted(devices):
            bad.append(f"replica {index}: the store records devices {sorted(rep.devices)}, its "
                       f"node description {sorted(devices)}")


def check_software(nodes: list[dict[str, Any]], provenance: dict[str, Any],
                   bad: list[str]) -> None:
    """Every replica trained with the automlperf the run records (its source's hash): one in
    a container, or on a node with another installation, that ran other code did not run
    the official workload. The record is the replica's own word (a consistency check, as
    the rest of the store is); records from before replicas kept it are not held to it."""
    want = provenance.get("source_hash")
    for node in nodes:  # every session's: a resumed one may have run other code
        found = node.get("software")
        if not found or not want or found.get("source_hash") == want:
            continue
        image = (found.get("container") or {}).get("image")
        bad.append(f"replica {node.get('replica_index')} on {node.get('host')} trained with "
                   f"automlperf {found.get('automlperf_version')} (source "
                   f"{str(found.get('source_hash'))[:19]}){f' in {image}' if image else ''}, "
                   f"not the run's ({provenance.get('automlperf_version')}, {want[:19]}): "
                   "install the same automlperf on every node and in the image")


def check_ceilings(nodes: list[dict[str, Any]], bad: list[str]) -> None:
    """Each node's ceiling entries are its devices' (a CPU's ranks share one entry), and
    their rates add up to the ceiling it records."""
    for node in latest_nodes(nodes):
        entries = node.get("ceiling")
        if not isinstance(entries, list):
            continue  # no ceiling measured (an error, a simulated run, an old record)
        where = f"replica {node.get('replica_index')} on {node.get('host')}"
        measured = sorted(str(e.get("device")) for e in entries)
        devices = sorted(dict.fromkeys(str(d) for d in node.get("devices") or []))
        if measured != devices:
            bad.append(f"{where}: its ceiling was measured on {', '.join(measured) or 'nothing'}, "
                       f"but its node records devices {', '.join(devices) or 'none'}")
        total = sum(float(e.get("ops_per_s") or 0) for e in entries)
        ceiling = node.get("ceiling_ops")
        if ceiling is None or not math.isclose(float(ceiling), total, rel_tol=1e-9):
            bad.append(f"{where}: its ceiling_ops is {ceiling!r}, but its devices' measured "
                       f"rates add up to {total!r}")


def check_ranks(epochs: Sequence[EpochRecord], trials: Sequence[TrialRecord],
                replicas: Sequence[ReplicaRecord], bad: list[str]) -> None:
    """No epoch trained on more ranks (one a device) than its replica records devices in
    any session: devices dropped from the records show in the epochs that used them."""
    most: dict[int, int] = {}
    for rep in replicas:
        most[rep.index] = max(most.get(rep.index, 0), len(rep.devices))
    replica_of = {t.id: t.replica_index for t in trials}
    named: set[int] = set()
    for e in epochs:
        index = replica_of.get(e.trial_id)
        if index is None or index not in most or index in named:
            continue
        if e.world_size > most[index]:
            named.add(index)
            bad.append(f"trial {e.trial_id} epoch {e.epoch} trained on {e.world_size} ranks, "
                       f"but replica {index} records {most[index]} device(s)")
