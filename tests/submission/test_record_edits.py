"""Edits of a real bundle's records that once turned a check off instead of failing it, each
made as a forger would (result.json recomputed by the project's own recomputation, the
manifest written again) and each refused, naming what differs. The bundle is the
official-shape run's (tests/submission/conftest.py): every test edits a copy of it."""

import json

import pytest

from automlperf import rules
from automlperf.config import Config
from automlperf.measure.result import build_result, write_result
from automlperf.report.listing import rank_class
from automlperf.store.records import ExportedRecords
from automlperf.submission.bundle import write_manifest
from automlperf.submission.check import check_run, official_refusal
from automlperf.submission.ruleset_check import BEFORE_STORED_RULESET
from helpers import copy_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # the shared official-shape run


def read(path):
    return json.loads(path.read_text())


def write(path, value):
    path.write_text(json.dumps(value, indent=1) + "\n")


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_lines(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def edit_system(bundle, change):
    """The run's recorded system changed alike in the store's record and system.json."""
    run = read(bundle / "records" / "run.json")
    change(run["system"])
    write(bundle / "records" / "run.json", run)
    system = read(bundle / "system.json")
    change(system)
    write(bundle / "system.json", system)


def recomputed(bundle):
    """result.json as the project's own recomputation makes it from the (edited) records."""
    run_id = read(bundle / "run.json")["run_id"]
    records = ExportedRecords(bundle)
    return build_result(records, run_id, Config.load(bundle / "config.toml"),
                        records.run(run_id)["system"])


def forged(bundle, result=None):
    """What a forger sends: result.json recomputed (or as given), the manifest again."""
    write_result(bundle / "result.json", recomputed(bundle) if result is None else result)
    write_manifest(bundle)
    return check_run(bundle)


def named(report, *fragments):
    for fragment in fragments:
        assert any(fragment in m for m in report.mismatches), (fragment, report.mismatches)


def test_the_bundle_verifies_as_it_was_made(official_bundle):
    report = check_run(official_bundle)
    assert report.ok, report.mismatches
    assert report.result["ruleset"] == rules.CURRENT.id
    assert not any(v["rule"] in ("ceiling", "implausible") for v in report.result["violations"])


def test_a_deleted_ruleset_is_named(official_bundle, tmp_path):
    """The ruleset deleted from the store's record, system.json and result.json, the result
    recomputed and then claimed for 64 nodes and 512 devices: once judged as aiperf-2021.1
    and passed; now the deletion is named, and so is every figure the list shows."""
    copy = copy_of(official_bundle, tmp_path)
    edit_system(copy, lambda s: s.pop("ruleset"))
    result = recomputed(copy)
    result.pop("ruleset")
    result.update(devices=512, nodes=64, ops_per_s_per_device=result["score"] / 512)
    report = forged(copy, result)
    named(report, "names no ruleset, but it holds its provenance; its data's identity; "
                  "1 node description(s); the seed the run used",
          "its 'ruleset' key was deleted", "result.json: devices is 512, recomputed 1",
          "result.json: nodes is 64, recomputed 1")
    # Everything recorded beside the ruleset deleted too: result.json still shows when it
    # was written.
    edit_system(copy, lambda s: [s.pop(k) for k in ("provenance", "dataset_identity", "seed")])
    write_lines(copy / "records" / "nodes.jsonl", [])
    report = forged(copy)
    named(report, "names no ruleset, but it holds a result.json with ceiling_ops")
    # And a result.json cut to what the oldest versions wrote: judged as aiperf-2021.1, the
    # records are the oldest's, and the list's figures are still recomputed.
    old = {k: v for k, v in recomputed(copy).items() if k in BEFORE_STORED_RULESET}
    old.pop("ruleset")
    report = forged(copy, {**old, "devices": 512})
    assert report.result["ruleset"] == rules.LEGACY_ID
    named(report, "result.json: devices is 512, recomputed 1")
    assert not any("ruleset" in m for m in report.mismatches), report.mismatches
    # Such a result cannot claim the current ruleset either (a list shows result.json's).
    report = forged(copy, {**old, "ruleset": rules.CURRENT.id})
    named(report, f"result.json: ruleset is '{rules.CURRENT.id}', but the run was started "
                  f"under '{rules.LEGACY_ID}'")


def test_a_ruleset_changed_to_an_earlier_one_is_named(official_bundle, tmp_path):
    copy = copy_of(official_bundle, tmp_path)
    edit_system(copy, lambda s: s.update(ruleset="aiperf-2021.3"))
    report = forged(copy)
    assert report.result["ruleset"] == "aiperf-2021.3"
    named(report, "names ruleset 'aiperf-2021.3', but it holds the seed the run used, which "
                  "only runs of aiperf-2021.4 or later record: its ruleset was changed")


def test_a_node_without_a_ceiling_is_not_valid(official_bundle, tmp_path):
    """A node's ceiling removed from its description: the bound is not switched off, the
    result is not valid, naming the node."""
    copy = copy_of(official_bundle, tmp_path)
    path = copy / "records" / "nodes.jsonl"
    nodes = lines(path)
    host = nodes[-1]["host"]
    nodes[-1].update(ceiling_ops=None, error="the measurement took over 300 s")
    del nodes[-1]["ceiling"]
    write_lines(path, nodes)
    report = forged(copy)
    assert report.ok, report.mismatches  # a consistent record: judged, not mismatched
    (missing,) = [v for v in report.result["violations"] if v["rule"] == "ceiling"]
    assert f"replica 0 on {host} (the measurement took over 300 s)" in missing["detail"]
    assert not report.result["valid"] and "ceiling" in official_refusal(report.result)
    # The rate alone nulled, its measurement kept: the two are named as disagreeing.
    copy = copy_of(official_bundle, tmp_path / "rate")
    nodes = lines(copy / "records" / "nodes.jsonl")
    nodes[-1]["ceiling_ops"] = None
    write_lines(copy / "records" / "nodes.jsonl", nodes)
    named(forged(copy), f"replica 0 on {host}: its ceiling_ops is None, but its devices' "
                        "measured rates add up to")
    # The node's description deleted altogether: its replica trained, and has no ceiling.
    copy = copy_of(official_bundle, tmp_path / "gone")
    write_lines(copy / "records" / "nodes.jsonl", [])
    report = forged(copy)
    (missing,) = [v for v in report.result["violations"] if v["rule"] == "ceiling"]
    assert f"replica 0 on {host} (it recorded no node description)" in missing["detail"]


def test_a_ceiling_scaled_down_makes_the_score_implausible(official_bundle, tmp_path):
    copy = copy_of(official_bundle, tmp_path)
    score = read(copy / "result.json")["score"]
    nodes = lines(copy / "records" / "nodes.jsonl")
    for node in nodes:
        node["ceiling_ops"] = score / 10
        node["ceiling"] = [{**node["ceiling"][0], "ops_per_s": score / 10}]
    write_lines(copy / "records" / "nodes.jsonl", nodes)
    report = forged(copy)
    (wrong,) = [v for v in report.result["violations"] if v["rule"] == "implausible"]
    assert "10.00 times the ceiling its nodes measured" in wrong["detail"]


def test_devices_dropped_while_the_ceiling_keeps_them_are_named(official_bundle, tmp_path):
    """The records claim fewer devices than trained (OPS per device up), the ceiling kept:
    the ceiling's entries and the epochs' ranks name the devices the records lost."""
    copy = copy_of(official_bundle, tmp_path)
    for name in ("replicas.jsonl", "nodes.jsonl"):
        rows = lines(copy / "records" / name)
        for row in rows:
            row["devices"] = []
        write_lines(copy / "records" / name, rows)
    report = forged(copy)
    named(report, "its ceiling was measured on cpu, but its node records devices none",
          "ranks, but replica 0 records 0 device(s)")


def test_a_duration_between_whole_hours_is_not_valid_and_ranks_alone(official_bundle, tmp_path):
    """7,199 s: twice the time of a 1-hour run to grow its models, once ranked with them."""
    copy = copy_of(official_bundle, tmp_path)
    run = read(copy / "records" / "run.json")
    run["duration_s"] = run["config"]["run"]["duration_s"] = 7199.0
    write(copy / "records" / "run.json", run)
    config = (copy / "config.toml").read_text()
    assert "duration_s = 3600.0" in config
    (copy / "config.toml").write_text(config.replace("duration_s = 3600.0", "duration_s = 7199.0"))
    report = forged(copy)
    assert report.ok, report.mismatches
    assert any(v["rule"] == "duration" and "7,199 s is not a whole number of hours" in v["detail"]
               for v in report.result["violations"])
    assert rank_class(report.result) == f"{rules.CURRENT.id}, 7,199 s" != \
        rank_class({**report.result, "duration_s": 3600.0})


def test_an_edited_name_or_date_is_named(official_bundle, tmp_path):
    """The list's name and date columns come from result.json: held to the records."""
    copy = copy_of(official_bundle, tmp_path)
    result = read(copy / "result.json")
    started = result["started_at"]
    result.update(name="Fastest Cluster", started_at=started - 365 * 86400)
    report = forged(copy, result)
    named(report, "result.json: name is 'Fastest Cluster', recomputed",
          f"result.json: started_at is {started - 365 * 86400!r}, recomputed {started!r}")
    meta = read(copy / "run.json")
    write(copy / "run.json", {**meta, "name": "Fastest Cluster"})
    named(forged(copy), "run.json: name is 'Fastest Cluster', but the run's record has")


def test_label_smoothing_is_the_sites_own_and_held_to_the_run(official_bundle, tmp_path):
    """Label smoothing belongs to the loss, which the paper leaves to the site (Table 4's
    "default"): an official run may change it, moving neither a fixed rule (early stopping
    watches the loss without it) nor officialness; a bundle whose configuration says
    otherwise than the run was started with is named."""
    assert Config.parse({"run": {"official": True},
                         "train": {"label_smoothing": 0.3}}).fixed_changes() == []
    copy = copy_of(official_bundle, tmp_path)
    config = (copy / "config.toml").read_text()
    assert "label_smoothing = 0.1" in config
    (copy / "config.toml").write_text(config.replace("label_smoothing = 0.1",
                                                     "label_smoothing = 0.3"))
    write_manifest(copy)
    named(check_run(copy), "config.toml differs from the configuration the run was started with")
