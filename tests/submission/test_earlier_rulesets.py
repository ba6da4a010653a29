"""Bundles written by the automlperf of each earlier ruleset still verify, each judged by its
own ruleset's rules, and the ruleset deleted from one of them is named.

tests/data/bundles/aiperf-2021.N.tar.gz were written by `automlperf run` and `automlperf
submit` of the commit whose ruleset was current (aiperf-2021.1: 076854e, aiperf-2021.2:
1e7bba7, aiperf-2021.3: e64de17), on a 2-core CPU: the synthetic dataset at 16 px, the small
seed, two 2-epoch trials (no weights, so each bundle is about 25 kB)."""

import json
import tarfile
from pathlib import Path

import pytest

from automlperf.submission.bundle import write_manifest
from automlperf.submission.check import check_run

BUNDLES = Path(__file__).resolve().parents[1] / "data" / "bundles"
EARLIER = ("aiperf-2021.1", "aiperf-2021.2", "aiperf-2021.3")


@pytest.mark.parametrize("ruleset", EARLIER)
def test_a_bundle_of_an_earlier_ruleset_verifies_by_its_own_rules(ruleset):
    report = check_run(BUNDLES / f"{ruleset}.tar.gz")
    assert report.ok, report.mismatches
    assert report.result["ruleset"] == ruleset and report.checked["epochs"] == 2
    charge = "last_epoch" if ruleset == "aiperf-2021.1" else "per_replica"
    assert report.result["charging"]["rule"] == charge


def test_the_ruleset_deleted_from_an_earlier_bundle_is_named(tmp_path):
    with tarfile.open(BUNDLES / "aiperf-2021.3.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    bundle = tmp_path / "aiperf-2021.3"
    for name in ("records/run.json", "system.json", "result.json"):
        data = json.loads((bundle / name).read_text())
        (data["system"] if name == "records/run.json" else data).pop("ruleset")
        (bundle / name).write_text(json.dumps(data))
    write_manifest(bundle)
    report = check_run(bundle)
    assert any("names no ruleset, but it holds its provenance" in m and
               "its 'ruleset' key was deleted" in m for m in report.mismatches), report.mismatches
