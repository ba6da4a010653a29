"""The ranked list of real runs (a built-in run, the official-shape run with a recorded
re-measurement, a simulated run, a forged bundle), its order, and its page read in a real
browser. The runs and bundles are tests/submission/conftest.py's."""

import json
import re
import shutil
import tarfile

import pytest

from automlperf.submission.check import check_run
from browser import browser
from helpers import cli, copy_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recorded_bundle(official_shape_run, official_bundle, tmp_path_factory):
    """The official-shape run's bundle, its accuracy re-measured where its data is and kept
    in it (`check --remeasure --record`), as a list-keeper with the data would."""
    import tomllib

    out = tmp_path_factory.mktemp("recorded") / "official-shape"
    shutil.copytree(official_bundle, out)
    data = tomllib.loads((official_shape_run / "config.toml").read_text())["data"]["data_dir"]
    done = cli("check", "--remeasure", "--record", "--data-dir", data, out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recorded in" in done.stdout and (out / "remeasurement.json").exists()
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
    assert builtin["labels"] == measured
    assert official_shape["labels"] == [*measured[:3], "accuracy re-measured by its submitter"]
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
    assert csv_lines[0].startswith("section,class,rank,system") and len(csv_lines) == 5
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
    record = json.loads((edited / "remeasurement.json").read_text())
    record.update(measured=record["measured"] + 0.05, correct=record["correct"])
    (edited / "remeasurement.json").write_text(json.dumps(record))
    write_manifest(edited)  # as a forger would
    report = check_run(edited)
    assert any(m.startswith("remeasurement.json: measured") for m in report.mismatches)
    moved = copy_of(bundle_dir, tmp_path / "moved")
    shutil.copy(recorded_bundle / "remeasurement.json", moved / "remeasurement.json")
    write_manifest(moved)
    report = check_run(moved)
    assert "remeasurement.json: it was made on another bundle, or a file changed since it " \
           "was recorded" in report.mismatches
    # Given the data, the list re-measures by itself.
    data = json.loads((recorded_bundle / "remeasurement.json").read_text())["data_dir"]
    done = cli("list", official_shape_run, "--data-dir", data, "--json", "-")
    (mine,) = json.loads(done.stdout)["entries"]
    assert mine["remeasured_by"] == "list" and mine["labels"][-1] == "accuracy re-measured"
    bare = copy_of(recorded_bundle, tmp_path / "bare")
    (bare / "remeasurement.json").unlink()
    write_manifest(bare)
    e = entry(bare)
    assert e["verified"] and e["remeasured_by"] is None
    assert e["labels"][-1] == "accuracy not re-measured"
    assert e["remeasured_how"].startswith("the accuracy was not re-measured from the weights: "
                                          "the imagenet validation set was not given")


@pytest.mark.timeout(3600)
def test_a_record_under_its_earlier_name_is_still_honoured(recorded_bundle, official_shape_run,
                                                           tmp_path):
    """A bundle recorded before the record was named remeasurement.json carries it as
    revalidation.json: it is verified and shown the same, and a new record replaces it."""
    from automlperf.report.listing import entry
    from automlperf.submission.bundle import verify_manifest, write_manifest

    old = copy_of(recorded_bundle, tmp_path / "old")
    record = json.loads((old / "remeasurement.json").read_text())
    (old / "remeasurement.json").unlink()
    # As the earlier automlperf wrote it: its name and format, the manifest written after.
    (old / "revalidation.json").write_text(
        json.dumps({**record, "format": "automlperf-revalidation"}, indent=1) + "\n")
    write_manifest(old)
    done = cli("check", old)
    assert done.returncode == 0 and "carries a re-measurement that verifies" in done.stdout
    e = entry(old)
    assert e["verified"] and e["remeasured_by"] == "record"
    assert e["remeasured_accuracy"] == record["measured"]
    edited = copy_of(old, tmp_path / "edited")
    (edited / "revalidation.json").write_text(
        json.dumps({**record, "format": "automlperf-revalidation", "trial": -1}))
    write_manifest(edited)  # as a forger would
    report = check_run(edited)
    assert "revalidation.json: it re-measured trial -1, but the best trial is " \
           f"{record['trial']}" in report.mismatches
    # Recorded again: under the current name only, the manifest listing just that.
    data = json.loads((old / "revalidation.json").read_text())["data_dir"]
    done = cli("check", "--remeasure", "--record", "--data-dir", data, old)
    assert done.returncode == 0 and "recorded in" in done.stdout, done.stdout + done.stderr
    assert (old / "remeasurement.json").exists() and not (old / "revalidation.json").exists()
    assert verify_manifest(old) == [] and check_run(old).recorded is not None


def test_a_re_measurement_is_kept_in_an_archive(bundle_tgz, builtin_run, tmp_path):
    copy = tmp_path / "kept.tar.gz"
    shutil.copy(bundle_tgz, copy)
    done = cli("check", "--remeasure", "--record", copy)
    assert done.returncode == 0 and "recorded in" in done.stdout, done.stdout + done.stderr
    with tarfile.open(copy) as tar:
        assert any(n.endswith("/remeasurement.json") for n in tar.getnames())
    done = cli("check", copy)
    assert done.returncode == 0 and "carries a re-measurement that verifies" in done.stdout
    done = cli("check", "--remeasure", "--record", builtin_run)
    assert done.returncode == 2 and "--record keeps a re-measurement in a bundle" in done.stderr


def test_the_order_of_a_list():
    """Official, valid, verified results whose accuracy was re-measured are ranked by score,
    like with like: within the rulesets the list ranks, a ruleset and a duration exactly,
    results within the score's spread shown as equal; the rest never among them."""
    from automlperf import rules
    from automlperf.report.listing import once_per_run, ranked

    current = rules.CURRENT.id

    def e(source, score, official=True, valid=True, simulated=False, verified=True,
          remeasured="list", hours=1, ruleset=current):
        return {"source": source, "system": source.upper(), "score": score,
                "official": official, "valid": valid, "simulated": simulated,
                "verified": verified, "remeasured_by": remeasured,
                "duration_s": hours * 3600.0, "ruleset": ruleset, "problems": []}

    # A submitter's own re-measurement is shown, never ranked; like is ranked with like: a
    # longer run, or one of 7,199 s, is ranked in its own class, and one under another
    # ruleset only when the list ranks that ruleset.
    given = [e("slow", 1e15), e("sim", 9e18, official=False, valid=False, simulated=True),
             e("fast", 3e15), e("near", 2.8e15), e("open", 5e15, official=False, valid=False),
             e("edited", 8e15, verified=False), e("short", 7e15, valid=False),
             e("unmeasured", 6e15, remeasured=None), e("self", 9e15, remeasured="record"),
             e("long", 4e15, hours=10), e("stretched", 4.5e15, hours=7199 / 3600),
             e("old", 5e15, ruleset="aiperf-2021.2")]
    order = ranked([dict(x) for x in given])
    assert [(x["source"], x["class"], x["rank"], x["section"]) for x in order] == [
        ("fast", f"{current}, 1 h", 1, "ranked"), ("near", f"{current}, 1 h", 1, "ranked"),
        ("slow", f"{current}, 1 h", 3, "ranked"), ("long", f"{current}, 10 h", 1, "ranked"),
        ("stretched", f"{current}, 7,199 s", 1, "ranked"),
        ("self", None, None, "unmeasured"), ("unmeasured", None, None, "unmeasured"),
        ("old", None, None, "other_ruleset"),
        ("short", None, None, "unranked"), ("open", None, None, "unranked"),
        ("sim", None, None, "simulated"), ("edited", None, None, "failed")]
    by = {x["source"]: x for x in order}
    # 3.0 and 2.8 are 6.7 % apart, within the score's spread: equal, not ordered.
    assert by["fast"]["equal_to"] == ["NEAR (near)"] and by["near"]["equal_to"] == ["FAST (fast)"]
    assert by["slow"]["equal_to"] == [] and by["long"]["equal_to"] == []
    assert "not ranked: ruleset aiperf-2021.2; this list ranks " + current in \
        by["old"]["problems"][0]
    # Asked to, the list ranks an earlier ruleset too, in its own classes.
    again = {x["source"]: x for x in ranked([dict(x) for x in given],
                                             (current, "aiperf-2021.2"))}
    assert (again["old"]["class"], again["old"]["rank"]) == ("aiperf-2021.2, 1 h", 1)

    def run(source, key, content, **kw):
        return {**e(source, 1e15, **kw), "run_key": key, "content": content, "problems": [],
                "bundle": source.endswith(".tar.gz")}

    given = [run("dir", [1, "a", 5.0], "x", remeasured=None), run("a.tar.gz", [1, "a", 5.0], "x"),
             run("b.tar.gz", [1, "b", 6.0], "y"), run("a2.tar.gz", [1, "a", 5.0], "z")]
    once = once_per_run(given)
    assert [x["source"] for x in once] == ["a.tar.gz", "a2.tar.gz", "b.tar.gz"]
    assert once[0]["duplicates"] == ["dir"] and once[1]["version_of"] == "a.tar.gz"
    assert [x["section"] for x in ranked(once)] == ["ranked", "ranked", "failed"]
    assert [x["rank"] for x in ranked(once)][:2] == [1, 1]  # equal scores share a rank


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
