"""examples/kubernetes/automlperf.yaml runs as written, as far as a machine without a
Kubernetes cluster allows (Debian's kubernetes-client has none to talk to): its two Jobs'
commands and environment, with the site's values put in (the run volume, the ImageNet volume,
the PostgreSQL Service: a local server), the replicas' pods in a network namespace of their
own, which reaches the primary's pod only at its IP, as pods do. Applied again after the
primary's pod is lost, the manifest resumes the run; then a replica's pod is killed outright
(its node lost, an out-of-memory kill: SIGKILL to all it runs), and the run goes on with the
other three, finishes and verifies. (What the Job then does with the failed pod, nothing to
the others, is its per-index backoff: tests/e2e/test_kubernetes_manifest.py.)

Simulated accelerators on a small ImageNet-layout folder: the manifest's plumbing is the
point, and each replica trains two rounds, so the run ends early."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from helpers import cli, hold_mid_trial, kill_outright, sim_config, wait_for
from trees import WNIDS, make_tree

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

MANIFEST = Path(__file__).resolve().parents[2] / "examples" / "kubernetes" / "automlperf.yaml"
# The two pods' addresses: the primary's (the host's end of the link) and the replicas'.
PRIMARY_IP, REPLICAS_IP = "10.231.7.1", "10.231.7.2"
LEASE_S = 10  # a replica killed outright is noticed once its lease lapses


@pytest.fixture
def pod_network():
    """A network namespace for the replicas' pods, linked to this host's by a veth pair: the
    primary's pod (this host) is 10.231.7.1 there, the replicas' 10.231.7.2; this host's
    name resolves, as in /etc/hosts, to a loopback address the namespace cannot reach."""
    if os.geteuid() != 0:
        pytest.fail("network namespaces need root (CI and this project's machines run as root)")
    name = f"amp-pod-{uuid.uuid4().hex[:8]}"
    ends = (f"vh{name[-8:]}", f"vp{name[-8:]}")
    steps = [["ip", "netns", "add", name],
             ["ip", "link", "add", ends[0], "type", "veth", "peer", "name", ends[1]],
             ["ip", "link", "set", ends[1], "netns", name],
             ["ip", "addr", "add", f"{PRIMARY_IP}/30", "dev", ends[0]],
             ["ip", "link", "set", ends[0], "up"],
             ["ip", "-n", name, "addr", "add", f"{REPLICAS_IP}/30", "dev", ends[1]],
             ["ip", "-n", name, "link", "set", ends[1], "up"],
             ["ip", "-n", name, "link", "set", "lo", "up"]]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, text=True)
        yield name
    finally:
        subprocess.run(["ip", "link", "delete", ends[0]], capture_output=True)
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def _pods(tmp_path, imagenet, pg_server, pg_url):
    """The manifest's primary and replica containers as local commands: (argv, env) each."""
    import yaml

    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    jobs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Job"}
    service = next(d for d in docs if d["kind"] == "Service")
    service_at = f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/automlperf"
    local = pg_url.split("@")[1]  # host:port/database
    config = tmp_path / "sim.toml"
    # Epochs of a few seconds and two rounds: the primary is lost while the replicas train
    # (at 100x, a replica on a busy machine trained its only round before the test's SIGTERM
    # reached the primary, and the resumed run had nothing left to train), and the second
    # session trains what the first left.
    config.write_text(sim_config(sustained_ops=1e14, time_compression=1.0, max_rounds=2,
                                 stop_grace_s=10, lease_timeout_s=LEASE_S, image_folders=True))
    runs = tmp_path / "runs"

    def site(text):
        return (text.replace("/runs", str(runs)).replace("/data/imagenet", str(imagenet))
                .replace(service_at, local).replace("--config official", f"--config {config}")
                .replace("--duration 1h", "--duration 10m")
                .replace("automlperf ", f"{sys.executable} -m automlperf.cli "))

    def pod(job, ip):
        container = jobs[job]["spec"]["template"]["spec"]["containers"][0]
        env = dict(os.environ)
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = site(var["value"])
            elif "secretKeyRef" in var["valueFrom"]:
                secret = var["valueFrom"]["secretKeyRef"]
                assert (secret["name"], secret["key"]) == ("automlperf-store", "password")
                env[var["name"]] = pg_server.password
            else:
                assert var["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
                env[var["name"]] = ip
        argv = [site(arg) for arg in container["command"]]
        if argv[0] == "automlperf":
            argv[:1] = [sys.executable, "-m", "automlperf.cli"]
        return argv, env

    replicas = jobs["automlperf-replicas"]["spec"]
    assert replicas["completionMode"] == "Indexed" and replicas["completions"] == 4
    return pod("automlperf-primary", PRIMARY_IP), pod("automlperf-replicas", REPLICAS_IP), runs


def _start(primary, replica, namespace, logs, session):
    """The primary's pod, and the four replica pods in ``namespace``: each logs to a file."""
    started = []
    for name, (argv, env) in [("primary", primary)] + [
            (f"replica-{i}", (replica[0], dict(replica[1], JOB_COMPLETION_INDEX=str(i))))
            for i in range(4)]:
        if name != "primary":
            argv = ["ip", "netns", "exec", namespace, *argv]
        log = (logs / f"{name}-{session}.log").open("w")
        # Each pod in a session of its own: what kills one kills nothing of another.
        started.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True))
    return started[0], started[1:]


def test_the_kubernetes_manifest_runs_as_written_and_resumes_when_applied_again(
        tmp_path, pg_server, pg_url, pod_network):
    from automlperf.store import open_store

    imagenet = make_tree(tmp_path / "imagenet", per_class=(4, 2), classes=WNIDS[:10])
    primary, replica, runs = _pods(tmp_path, imagenet, pg_server, pg_url)
    logs = tmp_path / "logs"
    logs.mkdir()
    # The replicas' pod cannot reach this host's own name: only the primary's pod IP.
    assert primary[0][:2] == ["sh", "-c"] and primary[1]["AUTOMLPERF_SERVICE_ADDRESS"] == PRIMARY_IP

    lead, pods = _start(primary, replica, pod_network, logs, 1)
    wait_for(lambda: (runs / "run1" / "run.json").exists(), 600, "the run to start")
    store = open_store(pg_url)
    try:
        wait_for(lambda: len(store.replicas(1)) == 4, 600, "the four replicas to join")
        service = json.loads((runs / "run1" / "store-service.json").read_text())
        assert service["host"] == PRIMARY_IP
        # The primary's pod is lost (deleted, evicted: SIGTERM).
        lead.terminate()
        assert lead.wait(timeout=300) == 130
        for p in pods:
            p.wait(timeout=300)
        first = json.loads((runs / "run1" / "result.json").read_text())
        assert first["interrupted"]

        # kubectl delete job ...; kubectl apply -f automlperf.yaml: the same commands again.
        lead, pods = _start(primary, replica, pod_network, logs, 2)
        # Replica 3's pod dies in a trial of this session, without a word.
        pid, charged = hold_mid_trial(store, runs / "run1", 3, epochs=0)
        killed_at = kill_outright(pid)
        said = [p.wait(timeout=900) for p in pods]
        assert lead.wait(timeout=300) == 0, (logs / "primary-2.log").read_text()
        assert said == [0, 0, 0, -9], "\n".join(p.read_text() for p in logs.glob("replica-*-2.log"))
        trial = store.trial(charged.id)
        assert trial.status == "failed" and "heart-beating" in trial.reason
        assert trial.finished_at > killed_at
    finally:
        store.close()
    assert "automlperf resuming" in (logs / "primary-2.log").read_text()
    result = json.loads((runs / "run1" / "result.json").read_text())
    assert result["replicas"] == 4 and result["score"] > 0 and not result["interrupted"]
    assert len(result["segments"]) == 2 and not result["failures"]
    assert "replica 3 (from JOB_COMPLETION_INDEX)" in (logs / "replica-3-2.log").read_text()
    done = cli("check", runs / "run1", env=dict(os.environ,
                                                AUTOMLPERF_STORE_PASSWORD=pg_server.password),
               timeout=300)
    assert done.returncode == 0 and "verified" in done.stdout, done.stdout + done.stderr
