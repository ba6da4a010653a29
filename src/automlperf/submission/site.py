"""What a bundle says about the site that ran it, and how ``submit --no-site-details`` leaves
it out: host names (each replica's, node description's and sample's, the store's URL), the
scheduler's user, account, partition, cluster and node lists (recorded with the job's
``SLURM_*`` variables in the provenance), and the paths of the run directory, the data, the replicas' image and
the submission folder; the accelerators' UUIDs, the kernel's release, and the
network interfaces NCCL was told to use. Each such value becomes a neutral name (``node-1``, ``user``,
``RUN_DIR``, ``IMAGE``, ...) in every file that can hold it, the same name everywhere, so that the
bundle still verifies: hosts map one to one (the node count stays), and the records, the
result and the system description change alike."""

from __future__ import annotations

import getpass
import json
import re
import tomllib
from pathlib import Path
from typing import Any

# Scheduler variables that name people or places, and what stands for their values.
IDENTIFYING = {"SLURM_JOB_USER": "user", "SLURM_JOB_ACCOUNT": "account",
               "SLURM_JOB_PARTITION": "partition", "SLURM_CLUSTER_NAME": "cluster",
               "SLURM_JOB_NODELIST": "nodes", "SLURM_NODELIST": "nodes",
               "SLURM_STEP_NODELIST": "nodes", "SLURM_SUBMIT_DIR": "SUBMIT_DIR",
               "SLURM_WORKING_DIR": "SUBMIT_DIR", "SLURM_TOPOLOGY_ADDR": "nodes",
               "SLURM_JOB_UID": "uid", "SLURM_JOB_GID": "gid", "SLURM_JOB_QOS": "qos",
               "SLURM_JOB_RESERVATION": "reservation", "SLURM_CONF": "SLURM_CONF",
               "SLURM_JOB_NAME": "job", "NCCL_SOCKET_IFNAME": "ifname",
               "NCCL_IB_HCA": "hca"}
HOST_VARIABLES = ("SLURM_SUBMIT_HOST", "SLURMD_NODENAME", "SLURM_LAUNCH_NODE_IPADDR")
# The files a site's names can be in (patterns under the bundle); graphs and weights hold none.
SCRUBBED = ("result.json", "system.json", "system_desc.json", "mllog.txt", "config.toml",
            "run.json", "report.html", "trials.csv", "replicas.csv", "bundle.json", "records/*.json",
            "records/*.jsonl", "trials/*/log.jsonl")
# An accelerator's UUID as NVML (``GPU-``), torch (bare) or amdsmi write it.
UUID = re.compile(r"(?:GPU-)?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                  r"[0-9a-fA-F]{12}")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def site_names(bundle: Path, run_dir: Path) -> dict[str, str]:
    """Every site detail found in a bundle being written, and the neutral name for it."""
    system = json.loads((bundle / "system.json").read_text())
    env = (system.get("provenance") or {}).get("environment") or {}
    hosts: list[str] = []

    def host(name: Any) -> None:
        if isinstance(name, str) and name and name not in hosts:
            hosts.append(name)

    host(system.get("host"))
    for rep in _jsonl(bundle / "records" / "replicas.jsonl"):
        host(rep.get("host"))
    for node in _jsonl(bundle / "records" / "nodes.jsonl"):
        host(node.get("host"))
        host((node.get("system") or {}).get("host"))
    for sample in _jsonl(bundle / "records" / "samples.jsonl"):
        host(sample.get("node"))
    names = {h: f"node-{i}" for i, h in enumerate(hosts, start=1)}
    for var in HOST_VARIABLES:
        if env.get(var) and env[var] not in names:
            names[env[var]] = f"host-{len(names) + 1}"
    slurm = {**(system.get("slurm") or {}), **env}
    for var, neutral in IDENTIFYING.items():
        value = slurm.get(var)
        if value and value not in names and value != "***":
            names[value] = neutral
    names.setdefault(getpass.getuser(), "user")
    names[str(run_dir.resolve())] = "RUN_DIR"
    config = tomllib.loads((bundle / "config.toml").read_text())
    data_dir = (config.get("data") or {}).get("data_dir")
    if data_dir:
        names[str(data_dir)] = "DATA_DIR"
    # The replicas' image file, by its path (its digest, which names no place, stays).
    images = [(system.get("replica_image") or {}).get("image")] + [
        ((node.get("software") or {}).get("container") or {}).get("image")
        for node in _jsonl(bundle / "records" / "nodes.jsonl")]
    for image in images:
        if isinstance(image, str) and image.startswith("/"):
            names.setdefault(image, "IMAGE")
        elif isinstance(image, str):
            for name, neutral in registry_names(image).items():
                names.setdefault(name, neutral)
    home = str(Path.home())
    if home not in ("/", ""):
        names.setdefault(home, "HOME")
    release = str(system.get("os", "")).partition(" ")[2]
    if release:
        names.setdefault(release, "kernel")
    for i, uuid in enumerate(_uuids(bundle), start=1):
        names.setdefault(uuid, f"GPU-{i}")
    # Job ids and the like are numbers: nothing to hide, and too easily met elsewhere.
    return {k: v for k, v in names.items() if len(k) >= 2 and not k.isdigit()}


# Registries anyone pulls from: naming one says nothing about the site.
PUBLIC_REGISTRIES = {"docker.io", "index.docker.io", "registry-1.docker.io", "nvcr.io",
                     "ghcr.io", "quay.io", "gcr.io", "public.ecr.aws", "registry.k8s.io",
                     "mcr.microsoft.com"}


def registry_names(image: str) -> dict[str, str]:
    """What an image reference names of the site: a registry of its own (pyxis's
    ``[USER@][REGISTRY#]IMAGE``, or a ``[docker://]HOST[:PORT]/PATH`` reference) and the user
    it logs in as. A public registry, and the image's own name and digest, stay."""
    found: dict[str, str] = {}
    ref = image.split("://", 1)[1] if "://" in image else image
    ref = ref.split("@sha256:", 1)[0]
    if "#" in ref:  # enroot's form
        head = ref.split("#", 1)[0]
        user, _, registry = head.rpartition("@")
        if user:
            found[user] = "user"
    else:
        first = ref.split("/", 1)[0] if "/" in ref else ""
        registry = first if ("." in first or ":" in first or first == "localhost") else ""
    host = registry.split(":", 1)[0]
    if host and host not in PUBLIC_REGISTRIES:
        found[host] = "REGISTRY"
    return found


def _files(bundle: Path) -> list[Path]:
    return sorted({path for rel in SCRUBBED for path in bundle.glob(rel) if path.is_file()})


def _uuids(bundle: Path) -> list[str]:
    """The accelerators' UUIDs anywhere in the bundle's files, in the order met."""
    found: list[str] = []
    for path in _files(bundle):
        for uuid in UUID.findall(path.read_text(encoding="utf-8")):
            if uuid not in found:
                found.append(uuid)
    return found


def leave_out(bundle: Path, names: dict[str, str]) -> list[str]:
    """Replace every site name in the bundle's files that can hold one; the files changed.
    A name is replaced where it stands as a word (a host in a URL or a path, a path's
    prefix), never inside another word."""
    if not names:
        return []
    pattern = re.compile("|".join(
        rf"(?<![\w.-]){re.escape(k)}(?![\w-])" if not k.startswith("/") else re.escape(k)
        for k in sorted(names, key=len, reverse=True)))
    changed = []
    for path in _files(bundle):
        text = path.read_text(encoding="utf-8")
        new = pattern.sub(lambda m: names[m.group(0)], text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path.relative_to(bundle).as_posix())
    return changed
