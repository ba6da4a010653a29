"""Results a list can trust: a real run made into a submission bundle, verified from the
bundle alone (every file's digest, every figure recomputed, the best accuracy re-measured
from the weights), and three real runs on the ranked list, read in a real browser."""

import json
import math
import re
import shutil
import subprocess
import tarfile

import pytest

from automlperf.submission.check import check_run
from automlperf.store import open_store
from helpers import cli, sim_config
from browser import browser

pytestmark = pytest.mark.slow

BUILTIN = """
[run]
duration_s = 900
replicas = 1
max_rounds = 3
heartbeat_s = 1
[data]
dataset = "builtin"
[train]
max_epochs = 2
[search]
tpe_startup_trials = 1
[monitor]
interval_s = 1
ceiling_s = 0.3
"""


@pytest.fixture(scope="module")
def builtin_run(tmp_path_factory):
    """A real run on the built-in dataset: three trials (the seed and two children)."""
    base = tmp_path_factory.mktemp("builtin")
    (base / "c.toml").write_text(BUILTIN)
    done = cli("run", "--config", base / "c.toml", "--run-dir", base / "run")
    assert done.returncode == 0, done.stdout + done.stderr
    return base / "run"


@pytest.fixture(scope="module")
def bundle_dir(builtin_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundles") / "builtin"
    done = cli("submit", builtin_run, "--dir", "--out", out, "--org", "Test Site",
               "--system", "Test Laptop")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bundle:" in done.stdout and "verify it with: automlperf check" in done.stdout
    return out


@pytest.fixture(scope="module")
def bundle_tgz(builtin_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("archives") / "builtin.tar.gz"
    done = cli("submit", builtin_run, "--out", out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def copy_of(bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    return copy


def best_trial(run):
    return json.loads((run / "result.json").read_text())["best_trial"]


def test_a_bundle_round_trips(builtin_run, bundle_dir, bundle_tgz, tmp_path):
    for bundle in (bundle_tgz, bundle_dir):
        done = cli("check", bundle)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "verified bundle: 3 trials" in done.stdout
    # What a site sends: no password file, no private database, no replica logs; the best
    # trial's weights only; run.json's store URL without a password.
    names = {p.relative_to(bundle_dir).as_posix() for p in bundle_dir.rglob("*") if p.is_file()}
    for name in ("bundle.json", "MANIFEST.sha256", "result.json", "config.toml", "system.json",
                 "run.json", "system_desc.json", "report.html", "records/run.json",
                 "records/trials.jsonl", "records/segments.jsonl", "records/replicas.jsonl",
                 "records/nodes.jsonl", "records/samples.jsonl"):
        assert name in names
    best = best_trial(builtin_run)
    assert {n for n in names if n.endswith(".safetensors")} == {f"trials/{best}/weights.safetensors"}
    assert not any(n.startswith(("logs/", "postgres/", "monitor/")) or "password" in n
                   or n == "history.db" for n in names)
    described = json.loads((bundle_dir / "bundle.json").read_text())
    assert described["submitter"] == "Test Site" and described["system_name"] == "Test Laptop"
    assert described["weights"] == [best] and described["trials"] == 3
    # The manifest is sha256sum's format: the bundle verifies with coreutils alone.
    done = subprocess.run(["sha256sum", "--strict", "-c", "MANIFEST.sha256"], cwd=bundle_dir,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # The records need no database and no automlperf to read: plain JSON Lines that hold
    # what the store holds.
    store = open_store(run_dir=builtin_run)
    epochs = sorted((json.loads(line) for f in (bundle_dir / "records" / "epochs").glob("*.jsonl")
                     for line in f.read_text().splitlines()),
                    key=lambda e: (e["trial_id"], e["epoch"]))
    stored = sorted(store.epochs(1), key=lambda e: (e.trial_id, e.epoch))
    assert [(e["trial_id"], e["epoch"], e["ops"], e["val_accuracy"]) for e in epochs] == \
        [(e.trial_id, e.epoch, e.ops, e.val_accuracy) for e in stored]
    trials = [json.loads(line) for line in
              (bundle_dir / "records" / "trials.jsonl").read_text().splitlines()]
    assert [t["graph_hash"] for t in trials] == [t.graph_hash for t in store.trials(1)]
    samples = (bundle_dir / "records" / "samples.jsonl").read_text().splitlines()
    assert len(samples) == len(store.samples(1)) == described["samples"]["included"]
    # The archive holds the same kinds of files under one folder.
    with tarfile.open(bundle_tgz) as tar:
        inside = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
    assert {n for n in inside if "/" not in n} == {n for n in names if "/" not in n}
    assert len(inside) == len(names)


def test_submit_refuses_what_it_cannot_bundle(builtin_run, bundle_dir, tmp_path):
    done = cli("submit", builtin_run, "--out", bundle_dir, "--dir")
    assert done.returncode == 2 and "already exists" in done.stderr
    done = cli("submit", bundle_dir, "--out", tmp_path / "again.tar.gz")
    assert done.returncode == 2 and "already a bundle" in done.stderr
    # A run that does not verify is not bundled.
    copy = tmp_path / "run"
    shutil.copytree(builtin_run, copy)
    result = json.loads((copy / "result.json").read_text())
    result["score"] *= 2
    (copy / "result.json").write_text(json.dumps(result))
    done = cli("submit", copy, "--out", tmp_path / "x.tar.gz")
    assert done.returncode == 2 and "does not verify" in done.stderr
    assert "result.json: score is" in done.stderr and not (tmp_path / "x.tar.gz").exists()


def _edit_text(path):
    """Change one character in the middle of a text file into another of its kind (a digit
    into another digit, a letter into another letter), as a forger would."""
    text = path.read_text()
    for i in range(len(text) // 2, len(text)):
        c = text[i]
        if c.isdigit() or c.isalpha():
            new = str((int(c) + 1) % 10) if c.isdigit() else ("b" if c != "b" else "c")
            path.write_text(text[:i] + new + text[i + 1:])
            return
    raise AssertionError(f"nothing to edit in {path}")


def _edit_bytes(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


KINDS = ["bundle.json", "MANIFEST.sha256", "result.json", "config.toml", "system.json",
         "run.json", "system_desc.json", "mllog.txt", "report.html", "records/run.json",
         "records/segments.jsonl", "records/replicas.jsonl", "records/nodes.jsonl",
         "records/trials.jsonl", "records/epochs/BEST.jsonl", "records/samples.jsonl",
         "trials/1/graph.json", "trials/BEST/log.jsonl", "trials/BEST/weights.safetensors"]


@pytest.mark.parametrize("kind", KINDS)
def test_editing_any_file_of_a_bundle_is_named(builtin_run, bundle_dir, tmp_path, kind):
    copy = copy_of(bundle_dir, tmp_path)
    name = kind.replace("BEST", str(best_trial(builtin_run)))
    target = copy / name
    assert target.exists(), f"the bundle has no {name}"
    (_edit_bytes if name.endswith(".safetensors") else _edit_text)(target)
    report = check_run(copy)
    assert not report.ok
    named = [m for m in report.mismatches if name in m]
    if kind == "MANIFEST.sha256":
        # The line edited names the file it lists and says the manifest may be what changed.
        named = [m for m in report.mismatches if "MANIFEST.sha256" in m]
    assert named, report.mismatches


def test_an_edited_file_inside_the_archive_is_named(bundle_tgz, tmp_path):
    with tarfile.open(bundle_tgz) as tar:
        tar.extractall(tmp_path, filter="data")
    (top,) = tmp_path.iterdir()
    result = json.loads((top / "result.json").read_text())
    result["best_accuracy"] = 0.99
    (top / "result.json").write_text(json.dumps(result))
    edited = tmp_path / "edited.tar.gz"
    with tarfile.open(edited, "w:gz") as tar:
        tar.add(top, arcname=top.name)
    done = cli("check", edited)
    assert done.returncode == 1
    assert "mismatch: result.json: its SHA-256 differs" in done.stdout.replace("\n", "")
    assert "result.json: best_accuracy is 0.99, recomputed" in done.stdout.replace("\n", "")


def test_a_forged_manifest_does_not_hide_an_edit(bundle_dir, tmp_path):
    """Digests show what changed after the bundle was made; a submitter who edits a figure
    and writes the manifest again is caught by the figures recomputed from the records."""
    from automlperf.submission.bundle import write_manifest

    copy = copy_of(bundle_dir, tmp_path)
    result = json.loads((copy / "result.json").read_text())
    result["score"] *= 1.5
    (copy / "result.json").write_text(json.dumps(result))
    epochs = copy / "records" / "epochs" / "1.jsonl"
    rows = [json.loads(line) for line in epochs.read_text().splitlines()]
    rows[0]["ops"] *= 2
    epochs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_manifest(copy)
    report = check_run(copy)
    assert not any("SHA-256" in m for m in report.mismatches)
    assert any(m.startswith("result.json: score is") for m in report.mismatches)
    assert any(m.startswith("trial 1 epoch 0: recorded") for m in report.mismatches)


def test_a_bundle_whose_records_lost_an_epoch_its_log_holds_is_named(bundle_dir, tmp_path):
    """An epoch taken out of the exported records (the manifest written again, as a forger
    would) is still in its trial's log: named, as the other way round."""
    from automlperf.submission.bundle import write_manifest

    copy = copy_of(bundle_dir, tmp_path)
    epochs = copy / "records" / "epochs" / "2.jsonl"
    rows = epochs.read_text().splitlines(keepends=True)
    epochs.write_text("".join(rows[1:]))
    log = copy / "trials" / "1" / "log.jsonl"
    log.write_text("".join(line for line in log.read_text().splitlines(keepends=True)
                           if json.loads(line).get("type") != "epoch"
                           or json.loads(line)["epoch"] != 0))
    write_manifest(copy)
    report = check_run(copy)
    assert "trial 2 epoch 0 is in its trial's log but not in the store (lost on its way to " \
           "the store)" in report.mismatches
    assert "trial 1 epoch 0 is in the store but not in its trial's log" in report.mismatches


def _swap_weights(bundle, trial, state):
    from safetensors.torch import save_file

    from automlperf.submission.bundle import write_manifest

    save_file({k: v.contiguous() for k, v in state.items()},
              str(bundle / "trials" / str(trial) / "weights.safetensors"))
    write_manifest(bundle)  # as a forger would: only the re-measured accuracy can tell


def test_revalidate_re_measures_the_best_accuracy(builtin_run, bundle_tgz, bundle_dir, tmp_path):
    from safetensors.torch import load_file

    from automlperf.graph import Graph
    from automlperf.submission.remeasure import tolerance
    from automlperf.train.inherit import inherit

    for where in (bundle_tgz, builtin_run):
        done = cli("check", "--revalidate", where)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "accuracy re-measured: trial" in done.stdout
    report = json.loads(cli("check", "--revalidate", "--json", bundle_tgz).stdout)
    again = report["revalidation"]
    assert report["ok"] and again["ok"] and again["images"] == again["recorded_images"] == 1000
    assert abs(again["measured"] - again["recorded"]) <= again["tolerance"]

    store = open_store(run_dir=builtin_run)
    trials = {t.id: t for t in store.trials(1)}
    best = best_trial(builtin_run)
    # Another trial's weights file in place of the best one's: not this architecture's.
    other = min(t for t in trials if t != best)
    copy = copy_of(bundle_dir, tmp_path)
    _swap_weights(copy, best, load_file(builtin_run / "trials" / str(other) / "weights.safetensors"))
    done = cli("check", "--revalidate", copy)
    assert done.returncode == 1 and "does not hold the weights of this architecture" in done.stdout
    # Another trial's model carried into the best architecture by weight inheritance (a
    # morph preserves the function): it loads, and scores as that trial did. The ancestor
    # is the one of the best model's lineage whose accuracy is furthest from the best.
    lineage, t = [], trials[best]
    while t.parent_id is not None:
        t = trials[t.parent_id]
        lineage.append(t)
    assert lineage, "the best trial is the seed itself: no other model to swap in"
    donor = max(lineage, key=lambda t: (abs(t.best_accuracy - trials[best].best_accuracy), -t.id))
    assert abs(donor.best_accuracy - trials[best].best_accuracy) > tolerance("fp32", 1000)
    copy = copy_of(bundle_dir, tmp_path / "inherited")
    state = inherit(Graph.from_json(donor.graph_json),
                    load_file(builtin_run / "trials" / str(donor.id) / "weights.safetensors"),
                    Graph.from_json(trials[best].graph_json), seed=0)
    _swap_weights(copy, best, state)
    report = json.loads(cli("check", "--revalidate", "--json", copy).stdout)
    again = report["revalidation"]
    assert not report["ok"] and not again["ok"]
    assert any(m.startswith("revalidation: trial") and "weights score" in m for m in report["mismatches"])
    assert math.isclose(again["measured"], donor.best_accuracy, abs_tol=0.01)
    assert cli("check", "--revalidate", copy).returncode == 1


@pytest.mark.timeout(3600)  # the shared official-shape run: minutes on an idle 2-core machine
def test_revalidate_reads_an_image_folder(official_shape_run, tmp_path):
    import tomllib

    data = tomllib.loads((official_shape_run / "config.toml").read_text())["data"]["data_dir"]
    done = cli("check", "--revalidate", "--data-dir", data, "--json", official_shape_run)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"], done.stdout + done.stderr
    again = report["revalidation"]
    assert again["ok"] and again["images"] == again["recorded_images"] == 50
    (tmp_path / "empty").mkdir()
    done = cli("check", "--revalidate", "--data-dir", tmp_path / "empty", official_shape_run)
    assert done.returncode == 2 and "error:" in done.stderr and "empty" in done.stderr


def test_revalidate_refuses_a_simulated_run(simulated_bundle):
    done = cli("check", "--revalidate", simulated_bundle)
    assert done.returncode == 2 and "simulated run trained no model" in done.stderr


@pytest.fixture(scope="module")
def simulated_bundle(tmp_path_factory):
    base = tmp_path_factory.mktemp("simulated")
    (base / "sim.toml").write_text(sim_config(sustained_ops=2e11, lease_timeout_s=600,
                                              max_rounds=2, replicas=1, duration_s=900))
    done = cli("run", "--config", base / "sim.toml", "--run-dir", base / "run")
    assert done.returncode == 0, done.stdout + done.stderr
    done = cli("submit", base / "run", "--dir", "--out", base / "bundle")
    assert done.returncode == 0, done.stdout + done.stderr
    return base / "bundle"


@pytest.fixture(scope="module")
def recorded_bundle(official_shape_run, tmp_path_factory):
    """The official-shape run's bundle, its accuracy re-measured where its data is and kept
    in it (`check --revalidate --record`), as a list-keeper with the data would."""
    import tomllib

    out = tmp_path_factory.mktemp("recorded") / "official-shape"
    done = cli("submit", official_shape_run, "--dir", "--out", out, "--system", "Shape [x1]")
    assert done.returncode == 0, done.stdout + done.stderr
    data = tomllib.loads((official_shape_run / "config.toml").read_text())["data"]["data_dir"]
    done = cli("check", "--revalidate", "--record", "--data-dir", data, out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recorded in" in done.stdout and (out / "revalidation.json").exists()
    return out


@pytest.fixture(scope="module")
def listed(official_shape_run, builtin_run, bundle_tgz, recorded_bundle, simulated_bundle,
           tmp_path_factory):
    """The list of real runs: a built-in run's bundle and its run directory (one run, given
    twice), the official-shape run directory and its bundle carrying a recorded
    re-measurement (one run again), a simulated run's bundle, and one bundle edited after
    it was made."""
    base = tmp_path_factory.mktemp("list")
    forged = base / "forged"
    shutil.copytree(simulated_bundle, forged)
    result = json.loads((forged / "result.json").read_text())
    result["simulated"] = False
    (forged / "result.json").write_text(json.dumps(result))
    page = base / "list.html"
    done = cli("list", bundle_tgz, builtin_run, official_shape_run, recorded_bundle,
               simulated_bundle, forged, "--html", page, "--json", base / "list.json",
               "--csv", base / "list.csv")
    assert done.returncode == 0, done.stdout + done.stderr
    return page, json.loads((base / "list.json").read_text())["entries"], done.stdout


@pytest.mark.timeout(3600)  # the shared official-shape run: minutes on an idle 2-core machine
def test_list_ranks_real_runs_with_their_labels(listed, official_shape_run, builtin_run,
                                                bundle_tgz, recorded_bundle, simulated_bundle):
    page, entries, _ = listed
    by_source = {e["source"]: e for e in entries}
    official_shape = by_source[str(recorded_bundle)]
    builtin = by_source[str(bundle_tgz)]
    simulated = by_source[str(simulated_bundle)]
    forged = next(e for e in entries if e["source"].endswith("forged"))
    # None of them is an official, valid result (no test machine has ImageNet and an hour):
    # nothing is ranked, and every entry says why.
    assert [e["section"] for e in entries] == ["unranked", "unranked", "simulated", "failed"]
    assert all(e["rank"] is None for e in entries)
    unranked = [e for e in entries if e["section"] == "unranked"]
    assert [e["score"] for e in unranked] == sorted((e["score"] for e in unranked), reverse=True)
    measured = ["unofficial", "not valid", "verified", "accuracy re-measured"]
    assert official_shape["labels"] == measured and builtin["labels"] == measured
    assert simulated["labels"] == ["unofficial", "not valid", "simulated", "verified"]
    assert forged["labels"][0:3] == ["unofficial", "not valid", "simulated"]
    assert "failed verification" in forged["labels"]
    assert any("result.json" in p for p in forged["problems"])
    # One entry per run: the run directory given beside its bundle is named, not listed.
    assert builtin["duplicates"] == [str(builtin_run)]
    assert official_shape["duplicates"] == [str(official_shape_run)]
    assert str(builtin_run) not in by_source and str(official_shape_run) not in by_source
    # The edited copy is another version of the simulated run: apart, saying so.
    assert any("another version of run" in p for p in forged["problems"])
    # The accuracy re-measured beside the claimed one: by this list on the built-in data,
    # by the bundle's verified record for the ImageNet-layout run (no --data-dir here).
    assert builtin["remeasured_by"] == "list" and official_shape["remeasured_by"] == "record"
    for e in (builtin, official_shape):
        assert abs(e["remeasured_accuracy"] - e["best_accuracy"]) <= 0.02
    assert simulated["remeasured_accuracy"] is None
    desc = json.loads((builtin_run / "system_desc.json").read_text())
    assert builtin["system"] == desc["system_name"]  # named as system_desc.json names it
    assert official_shape["system"] == "Shape [x1]"
    assert official_shape["accelerators"] and official_shape["devices"] >= 1
    assert builtin["fraction_of_ceiling"] > 0 and builtin["best_accuracy"] > 0.5
    assert builtin["date"] and builtin["ruleset"] == official_shape["ruleset"]
    assert simulated["ops_per_watt"] is None  # no energy is measured for modelled devices
    # Each listed entry links to a report drawn from its records, beside the page; a
    # duplicate's is not kept.
    for e in (official_shape, builtin, simulated):
        assert (page.parent / e["report"]).exists()
    assert len(list((page.parent / "list-reports").iterdir())) == 3
    assert forged["report"] is None
    csv_lines = (page.parent / "list.csv").read_text().splitlines()
    assert csv_lines[0].startswith("section,rank,system") and len(csv_lines) == 5
    assert "remeasured_accuracy,remeasured_by" in csv_lines[0]


@pytest.mark.timeout(3600)
def test_a_recorded_re_measurement_is_verified_wherever_the_bundle_goes(
        recorded_bundle, official_shape_run, bundle_dir, tmp_path):
    """The record is checked like every figure: an edited one, or one moved from another
    bundle, is named; an ImageNet-layout bundle without one is listed unranked, saying so."""
    from automlperf.submission.bundle import write_manifest
    from automlperf.report.listing import entry

    done = cli("check", recorded_bundle)
    assert done.returncode == 0 and "carries a re-measurement that verifies" in done.stdout
    edited = copy_of(recorded_bundle, tmp_path / "edited")
    record = json.loads((edited / "revalidation.json").read_text())
    record.update(measured=record["measured"] + 0.05, correct=record["correct"])
    (edited / "revalidation.json").write_text(json.dumps(record))
    write_manifest(edited)  # as a forger would
    report = check_run(edited)
    assert any(m.startswith("revalidation.json: measured") for m in report.mismatches)
    moved = copy_of(bundle_dir, tmp_path / "moved")
    shutil.copy(recorded_bundle / "revalidation.json", moved / "revalidation.json")
    write_manifest(moved)
    report = check_run(moved)
    assert "revalidation.json: it was made on another bundle, or a file changed since it " \
           "was recorded" in report.mismatches
    # Given the data, the list re-measures by itself.
    data = json.loads((recorded_bundle / "revalidation.json").read_text())["data_dir"]
    done = cli("list", official_shape_run, "--data-dir", data, "--json", "-")
    (mine,) = json.loads(done.stdout)["entries"]
    assert mine["remeasured_by"] == "list" and mine["labels"][-1] == "accuracy re-measured"
    bare = copy_of(recorded_bundle, tmp_path / "bare")
    (bare / "revalidation.json").unlink()
    write_manifest(bare)
    e = entry(bare)
    assert e["verified"] and e["remeasured_by"] is None
    assert e["labels"][-1] == "accuracy not re-measured"
    assert e["remeasured_how"].startswith("the accuracy was not re-measured from the weights: "
                                          "the imagenet validation set was not given")


def test_a_re_measurement_is_kept_in_an_archive(bundle_tgz, builtin_run, tmp_path):
    copy = tmp_path / "kept.tar.gz"
    shutil.copy(bundle_tgz, copy)
    done = cli("check", "--revalidate", "--record", copy)
    assert done.returncode == 0 and "recorded in" in done.stdout, done.stdout + done.stderr
    with tarfile.open(copy) as tar:
        assert any(n.endswith("/revalidation.json") for n in tar.getnames())
    done = cli("check", copy)
    assert done.returncode == 0 and "carries a re-measurement that verifies" in done.stdout
    done = cli("check", "--revalidate", "--record", builtin_run)
    assert done.returncode == 2 and "--record keeps a re-measurement in a bundle" in done.stderr


def test_the_order_of_a_list():
    """Official, valid, verified results whose accuracy was re-measured are ranked by score;
    the rest never among them; a run given twice is listed once."""
    from automlperf.report.listing import once_per_run, ranked

    def e(source, score, official=True, valid=True, simulated=False, verified=True,
          remeasured="list"):
        return {"source": source, "score": score, "official": official, "valid": valid,
                "simulated": simulated, "verified": verified, "remeasured_by": remeasured}

    order = ranked([e("slow", 1e15), e("sim", 9e18, official=False, valid=False, simulated=True),
                    e("fast", 3e15, remeasured="record"), e("open", 5e15, official=False, valid=False),
                    e("edited", 8e15, verified=False), e("short", 7e15, valid=False),
                    e("unmeasured", 6e15, remeasured=None)])
    assert [(x["source"], x["rank"], x["section"]) for x in order] == [
        ("fast", 1, "ranked"), ("slow", 2, "ranked"), ("unmeasured", None, "unmeasured"),
        ("short", None, "unranked"), ("open", None, "unranked"), ("sim", None, "simulated"),
        ("edited", None, "failed")]

    def run(source, key, content, **kw):
        return {**e(source, 1e15, **kw), "run_key": key, "content": content, "problems": [],
                "bundle": source.endswith(".tar.gz")}

    given = [run("dir", [1, "a", 5.0], "x", remeasured=None), run("a.tar.gz", [1, "a", 5.0], "x"),
             run("b.tar.gz", [1, "b", 6.0], "y"), run("a2.tar.gz", [1, "a", 5.0], "z")]
    once = once_per_run(given)
    assert [x["source"] for x in once] == ["a.tar.gz", "a2.tar.gz", "b.tar.gz"]
    assert once[0]["duplicates"] == ["dir"] and once[1]["version_of"] == "a.tar.gz"
    assert [x["section"] for x in ranked(once)] == ["ranked", "ranked", "failed"]


@pytest.mark.browser
@pytest.mark.timeout(3600)
def test_the_list_page_renders_in_a_real_browser(listed, tmp_path):
    page, entries, _ = listed
    html = page.read_text()
    # Self-contained: nothing is loaded from elsewhere (links to the reports are relative).
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)|url\(\s*["']?https?:|@import""", html)
    dom = browser("--virtual-time-budget=3000", "--dump-dom", page.as_uri(), tmp_path=tmp_path).stdout
    for key in ("ranked", "unranked", "simulated", "failed"):
        assert f'id="section-{key}"' in dom
    assert "No official, valid and verified result yet." in dom
    assert dom.count("<tr data-source=") == len(entries)
    assert "failed verification" in dom and "simulated" in dom
    # Sort the not-ranked table by score (ascending), filter, then read the page back.
    probe = """<script>
      var th = document.querySelectorAll('#list-unranked th')[5]; th.click();
      var sorted = Array.from(document.querySelectorAll('#list-unranked tbody tr'))
        .map(function (r) { return r.cells[5].getAttribute('data-v'); }).join(',');
      var box = document.getElementById('filter'); box.value = 'simulated';
      box.dispatchEvent(new Event('input'));
      var shown = Array.from(document.querySelectorAll('tbody tr'))
        .filter(function (r) { return !r.classList.contains('hidden'); }).length;
      document.title = sorted + '|' + shown;
    </script></body>"""
    (tmp_path / "probe.html").write_text(html.replace("</body>", probe))
    dom = browser("--dump-dom", (tmp_path / "probe.html").as_uri(), tmp_path=tmp_path).stdout
    sorted_scores, shown = re.search(r"<title>([^<]*)</title>", dom).group(1).split("|")
    scores = [float(v) for v in sorted_scores.split(",")]
    assert scores == sorted(scores) and len(scores) == 2
    assert int(shown) == 2  # the simulated run and its forged copy
    # A phone: the table becomes one card per entry (no header row, each value labelled).
    phone = """<script>
      document.title = getComputedStyle(document.querySelector('thead')).display + '|' +
        getComputedStyle(document.querySelector('tbody td'), '::before').content;
    </script></body>"""
    (tmp_path / "phone.html").write_text(html.replace("</body>", phone))
    dom = browser("--window-size=390,844", "--dump-dom", (tmp_path / "phone.html").as_uri(),
                  tmp_path=tmp_path).stdout
    assert re.search(r"<title>none\|\"rank\"</title>", dom), dom[:300]
    # At 1,300 px wide (the reports link the list there), every table fits its page: no
    # scrolling sideways, within its section or the page.
    fits = """<script>
      var worst = 0;
      document.querySelectorAll('table.list').forEach(function (t) {
        worst = Math.max(worst, t.scrollWidth - t.parentElement.clientWidth); });
      document.title = worst + '|' + (document.documentElement.scrollWidth - window.innerWidth)
        + '|' + window.innerWidth;
    </script></body>"""
    (tmp_path / "fits.html").write_text(html.replace("</body>", fits))
    dom = browser("--window-size=1300,1000", "--dump-dom", (tmp_path / "fits.html").as_uri(),
                  tmp_path=tmp_path).stdout
    over_table, over_page, width = map(int, re.search(r"<title>([^<]*)</title>", dom)
                                       .group(1).split("|"))
    assert width == 1300 and over_table <= 0 and over_page <= 0, (over_table, over_page)
    assert "re-measured" in dom and "claimed acc." in dom
    for size, name in (("1400,1000", "list.png"), ("390,1600", "list-phone.png")):
        shot = tmp_path / name
        browser(f"--window-size={size}", f"--screenshot={shot}", page.as_uri(), tmp_path=tmp_path)
        assert shot.stat().st_size > 20_000
