"""examples/kubernetes/automlperf.yaml against Kubernetes's own API schemas (the OpenAPI
definitions the API server validates with, as kubernetes-validate ships them), strictly: a
field the API server does not know is an error. No API server runs here; a test of the
manifest's commands as pods run them is tests/e2e/test_kubernetes.py."""

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

MANIFEST = Path(__file__).resolve().parents[2] / "examples" / "kubernetes" / "automlperf.yaml"
# The oldest Kubernetes whose Jobs keep a failed index from ending the others by default
# (backoffLimitPerIndex, beta and on from 1.29), and the newest these schemas describe.
VERSIONS = ["1.29", kubernetes_validate.latest_version()]


def documents():
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_of_the_manifest_is_valid_for_the_api_server(version):
    docs = documents()
    assert {d["kind"] for d in docs} >= {"Job", "Service", "PersistentVolumeClaim", "Deployment",
                                         "NetworkPolicy"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_a_field_the_api_server_does_not_know_is_caught():
    job = copy.deepcopy(next(d for d in documents() if d["kind"] == "Job"))
    job["spec"]["template"]["spec"]["containers"][0]["enviroment"] = []  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError, match="enviroment"):
        kubernetes_validate.validate(job, VERSIONS[0], strict=True)


def _by_name():
    return {d["metadata"]["name"]: d for d in documents() if d["kind"] in ("Job", "Deployment")}


def test_a_failing_replica_pod_ends_no_other_and_a_retiring_one_is_no_failure():
    """backoffLimit: 0 failed the whole Job at the first replica lost (a node, an OOM kill),
    and Kubernetes then terminated every replica: each index now fails alone, and the Job
    goes on while any replica does."""
    spec = _by_name()["automlperf-replicas"]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["backoffLimitPerIndex"] == 0 and "backoffLimit" not in spec
    assert spec["maxFailedIndexes"] == spec["completions"] - 1 == spec["parallelism"] - 1
    command = spec["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--retired-status") + 1] == "0"


def test_the_primary_and_postgres_are_guaranteed_and_every_pod_is_restricted():
    for name, doc in _by_name().items():
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"]["drop"] == ["ALL"], name
            if name in ("automlperf-primary", "automlperf-postgres"):
                # Guaranteed QoS: every container's requests equal its limits, CPU and memory.
                resources = container["resources"]
                assert resources["requests"] == resources["limits"], name
                assert set(resources["limits"]) == {"cpu", "memory"}, name


def test_the_network_policies_let_in_only_the_runs_own_pods():
    policies = {d["metadata"]["name"]: d["spec"] for d in documents() if d["kind"] == "NetworkPolicy"}
    labels = {name: doc["spec"]["template"]["metadata"]["labels"]["app"]
              for name, doc in _by_name().items()}
    primary = policies["automlperf-primary"]
    assert primary["podSelector"]["matchLabels"]["app"] == labels["automlperf-primary"]
    assert [r["from"][0]["podSelector"]["matchLabels"]["app"] for r in primary["ingress"]] == \
        [labels["automlperf-replicas"]]
    store = policies["automlperf-postgres"]
    assert store["podSelector"]["matchLabels"]["app"] == labels["automlperf-postgres"]
    (rule,) = store["ingress"]
    assert rule["from"][0]["podSelector"]["matchLabels"]["app"] == labels["automlperf-primary"]
    assert rule["ports"] == [{"port": 5432, "protocol": "TCP"}]
