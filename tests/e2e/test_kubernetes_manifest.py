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
# A Kubernetes still common on clusters (the Indexed Job the replicas are has been stable
# since 1.24), and the newest these schemas describe.
VERSIONS = ["1.27", kubernetes_validate.latest_version()]


def documents():
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_of_the_manifest_is_valid_for_the_api_server(version):
    docs = documents()
    assert {d["kind"] for d in docs} >= {"Job", "Service", "PersistentVolumeClaim", "Deployment"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_a_field_the_api_server_does_not_know_is_caught():
    job = copy.deepcopy(next(d for d in documents() if d["kind"] == "Job"))
    job["spec"]["template"]["spec"]["containers"][0]["enviroment"] = []  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError, match="enviroment"):
        kubernetes_validate.validate(job, VERSIONS[0], strict=True)
