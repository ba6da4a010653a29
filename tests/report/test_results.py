"""Results people can trust and read: check, report (in a real browser), monitor, compare."""

import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from browser import browser

from automlperf.measure.breakdown import OF_TRAINING
from automlperf.measure.result import RESULT_SCHEMA_VERSION, read_result
from helpers import cli, fast_config

pytestmark = pytest.mark.slow
DATA = Path(__file__).resolve().parents[1] / "data"

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("results")
    (base / "c.toml").write_text(fast_config(duration_s=900, replicas=1, max_rounds=3))
    done = cli("run", "--config", base / "c.toml", "--run-dir", base / "run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "report:" in done.stdout
    return base / "run"


def tampered(run_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    return copy


def test_the_committed_sample_result_still_reads():
    result = read_result(DATA / "run_v1" / "result.json")
    assert result["schema_version"] == 1 <= RESULT_SCHEMA_VERSION
    for key in ("score", "regulated_score", "best_accuracy", "error", "official", "valid",
                "violations", "total_ops", "elapsed_s", "trials", "best_trial", "timeline"):
        assert key in result
    assert set(result["timeline"][0]) == {"hours", "ops", "ops_per_s", "best_accuracy", "regulated"}


def test_check_verifies_a_genuine_run(run_dir):
    done = cli("check", run_dir)
    assert done.returncode == 0, done.stdout
    assert "verified" in done.stdout and "not valid, unofficial" in done.stdout
    report = json.loads(cli("check", run_dir, "--json").stdout)
    assert report["ok"] and report["checked"]["epochs"] == report["checked"]["logged_epochs"] > 0
    assert cli("check", run_dir, "--official").returncode == 3


def test_a_result_from_before_the_device_figure_reports_and_verifies(run_dir, tmp_path):
    """A result.json written before the time breakdown told the device's side apart (no
    device_wait_s): the report shows "-" there, and check does not call it edited."""
    copy = tampered(run_dir, tmp_path)
    result = json.loads((copy / "result.json").read_text())
    breakdown = result["time_breakdown"]
    assert breakdown["total"]["device_wait_s"] > 0
    for part in (breakdown["total"], breakdown["shares"], *breakdown["replicas"]):
        del part["device_wait_s"]
    (copy / "result.json").write_text(json.dumps(result))
    assert cli("check", copy).returncode == 0
    assert cli("report", copy).returncode == 0
    html = (copy / "report.html").read_text()
    assert "of which the device" in html


def earlier(system: str) -> dict:
    """A run's recorded system as a run of an earlier ruleset recorded it: without the seed
    that runs of aiperf-2021.4 draw and record (check names that record under an earlier
    ruleset as a changed one)."""
    recorded = json.loads(system)
    del recorded["seed"]
    return recorded


def test_a_result_of_the_earlier_ruleset_is_checked_by_its_own_rule(run_dir, tmp_path):
    """A run started under aiperf-2021.1 (whose results did not yet say how time was
    charged) is scored and verified by that ruleset's rule: time to the last counted epoch."""
    from automlperf.config import Config
    from automlperf.measure.result import build_result, write_result
    from automlperf.store import open_store

    copy = tampered(run_dir, tmp_path)
    with sqlite3.connect(copy / "history.db") as db:
        (system,) = db.execute("SELECT system FROM amp_runs").fetchone()
        system = json.dumps(earlier(system))
        db.execute("UPDATE amp_runs SET system = ?",
                   (json.dumps({**json.loads(system), "ruleset": "aiperf-2021.1"}),))
        epochs = db.execute("SELECT ended_at, ops FROM amp_epochs").fetchall()
        (start,) = db.execute("SELECT started_at FROM amp_segments").fetchone()
    # system.json is the same record, as such a run wrote it.
    (copy / "system.json").write_text(json.dumps({**json.loads(system), "ruleset": "aiperf-2021.1"}))
    store = open_store(run_dir=copy)
    try:
        old = build_result(store, 1, Config.load(copy / "config.toml"),
                           json.loads((copy / "system.json").read_text()))
    finally:
        store.close()
    assert old["ruleset"] == "aiperf-2021.1" and old["charging"]["rule"] == "last_epoch"
    last = max(t for t, _ in epochs) - start
    assert old["score"] == pytest.approx(sum(n for _, n in epochs) / last)
    del old["charging"]
    write_result(copy / "result.json", old)
    done = cli("check", copy)
    assert done.returncode == 0 and "verified" in done.stdout, done.stdout


def test_a_result_of_aiperf_2021_2_keeps_its_grace_and_verifies(run_dir, tmp_path):
    """A run started under aiperf-2021.2 keeps that ruleset's rules when it is checked: the
    grace its ruleset gave it (a quarter of the duration), and accuracy from the grace."""
    from automlperf.config import Config
    from automlperf.measure.result import build_result, write_result
    from automlperf.store import open_store

    copy = tampered(run_dir, tmp_path)
    with sqlite3.connect(copy / "history.db") as db:
        (system,) = db.execute("SELECT system FROM amp_runs").fetchone()
        system = json.dumps(earlier(system))
        db.execute("UPDATE amp_runs SET system = ?",
                   (json.dumps({**json.loads(system), "ruleset": "aiperf-2021.2"}),))
    config = Config.load(copy / "config.toml")
    # system.json is the same record, as such a run wrote it.
    (copy / "system.json").write_text(json.dumps({**json.loads(system), "ruleset": "aiperf-2021.2"}))
    store = open_store(run_dir=copy)
    try:
        old = build_result(store, 1, config, json.loads((copy / "system.json").read_text()))
    finally:
        store.close()
    assert old["ruleset"] == "aiperf-2021.2" and old["charging"]["rule"] == "per_replica"
    assert old["charging"]["grace_s"] == config.run.duration_s / 4
    write_result(copy / "result.json", old)
    done = cli("check", copy)
    assert done.returncode == 0 and "verified" in done.stdout, done.stdout


def test_check_catches_an_edited_result(run_dir, tmp_path):
    copy = tampered(run_dir, tmp_path)
    result = json.loads((copy / "result.json").read_text())
    result["score"] *= 1.1
    (copy / "result.json").write_text(json.dumps(result))
    done = cli("check", copy)
    assert done.returncode == 1 and "result.json: score is" in done.stdout


def test_check_catches_an_edited_image_count(run_dir, tmp_path):
    copy = tampered(run_dir, tmp_path)
    with sqlite3.connect(copy / "history.db") as db:
        db.execute("UPDATE amp_epochs SET train_images = train_images + 500 "
                   "WHERE trial_id = 1 AND epoch = 0")
    done = cli("check", copy)
    assert done.returncode == 1
    assert re.search(r"trial 1 epoch 0: recorded \d+ ops, but \d+ training", done.stdout)
    assert "but the trial log has" in done.stdout


def test_check_catches_an_edited_graph(run_dir, tmp_path):
    copy = tampered(run_dir, tmp_path)
    graph_file = copy / "trials" / "1" / "graph.json"
    graph = json.loads(graph_file.read_text())
    for layer in graph["layers"]:
        if layer["name"] == "s1b1_conv2":
            layer["kernel"], layer["padding"] = 5, 2  # a bigger kernel: more operations
    graph_file.write_text(json.dumps(graph))
    done = cli("check", copy)
    assert done.returncode == 1 and "trials/1/graph.json: architecture" in done.stdout
    # The same edit made in the store, with a matching hash, breaks the operation counts.
    from automlperf.graph import Graph

    g = Graph.from_dict(graph)
    with sqlite3.connect(copy / "history.db") as db:
        db.execute("UPDATE amp_trials SET graph_json = ?, graph_hash = ? WHERE id = 1",
                   (g.to_json(), g.content_hash()))
    shutil.copy(run_dir / "trials" / "1" / "graph.json", graph_file)
    done = cli("check", copy)
    assert done.returncode == 1 and "trial 1 epoch 0: recorded" in done.stdout


def test_the_hint_to_install_mlperf_logging_keeps_its_brackets(run_dir, tmp_path):
    """Without mlperf-logging the hint names the extra to install, brackets and all (the
    console once took `[mlperf]` for markup and printed `pip install 'automlperf'`)."""
    hidden = tmp_path / "hidden" / "mlperf_logging"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('not installed here')\n")
    path = os.pathsep.join(filter(None, [str(hidden.parent), os.environ.get("PYTHONPATH")]))
    done = cli("mlperf", tampered(run_dir, tmp_path), env={**os.environ, "PYTHONPATH": path})
    assert "pip install 'automlperf[mlperf]'" in done.stderr, done.stderr


def test_check_holds_the_logs_and_the_store_against_each_other(run_dir, tmp_path):
    """An epoch the store lost (its trial's log has it), one its log lost, and one a log
    holds twice: each named, both ways."""
    copy = tampered(run_dir, tmp_path)
    with sqlite3.connect(copy / "history.db") as db:
        db.execute("DELETE FROM amp_epochs WHERE trial_id = 1 AND epoch = 0")
    log = copy / "trials" / "2" / "log.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line).get("epoch") != 0]
    log.write_text("".join(kept))
    log3 = copy / "trials" / "3" / "log.jsonl"
    log3.write_text(log3.read_text() + log3.read_text().splitlines(keepends=True)[0])
    done = cli("check", copy)
    text = done.stdout.replace("\n", " ")
    assert done.returncode == 1
    assert "trial 1 epoch 0 is in its trial's log but not in the store" in text
    assert "trial 2 epoch 0 is in the store but not in its trial's log" in text
    assert "trial 3 epoch 0 appears more than once in its trial's log" in text


def test_check_holds_system_json_trial_folders_devices_and_outcomes_to_the_store(
        run_dir, tmp_path):
    """Accelerators renamed in system.json, a trial folder the store has no trial for, a
    replica's devices edited in the store, and a log whose outcome the store tells
    otherwise: each named."""
    copy = tampered(run_dir, tmp_path)
    system = json.loads((copy / "system.json").read_text())
    system["accelerators"] = [{"name": "NVIDIA H100 80GB HBM3", "index": 0, "type": "cuda"}]
    (copy / "system.json").write_text(json.dumps(system))
    shutil.copytree(copy / "trials" / "1", copy / "trials" / "99")
    log = copy / "trials" / "2" / "log.jsonl"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[-1]["type"] == "trial" and lines[-1]["status"] != "failed"
    lines[-1]["status"] = "failed"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with sqlite3.connect(copy / "history.db") as db:
        db.execute("UPDATE amp_replicas SET devices = ?", (json.dumps(["cuda:0", "cuda:1"]),))
    done = cli("check", copy)
    text = done.stdout.replace("\n", " ")
    assert done.returncode == 1, text
    assert "system.json differs from the system the run recorded in its store (accelerators)" \
        in text
    assert "trials/99 holds a trial the store does not have" in text
    assert "trial 2: its log ends failed, but the store says" in text
    assert "replica 0: the store records devices ['cuda:0', 'cuda:1'], its node description " \
        "['cpu']" in text


def test_check_names_a_replica_that_trained_with_other_code(run_dir, tmp_path):
    """A replica in an image (or on a node) whose automlperf is not the run's: its epochs are
    not the official workload's, and check says which replica and what it ran."""
    copy = tampered(run_dir, tmp_path)
    with sqlite3.connect(copy / "history.db") as db:
        (data,) = db.execute("SELECT data FROM amp_nodes").fetchone()
        node = json.loads(data)
        node["software"].update(source_hash="sha256:" + "0" * 64,
                                container={"runtime": "apptainer", "image": "/sw/other.sif"})
        db.execute("UPDATE amp_nodes SET data = ?", (json.dumps(node),))
    done = cli("check", copy)
    text = " ".join(done.stdout.split())
    assert done.returncode == 1, text
    assert "replica 0 on " in text and "(source sha256:000000000000) in /sw/other.sif, not the " \
        "run's" in text and "install the same automlperf on every node and in the image" in text


def test_what_the_store_lost_comes_back_from_the_logs(run_dir, tmp_path):
    """A store that lost an epoch and a trial's outcome (it went down between the log and
    the store): the primary gives them back from the logs, as the replica had them, and the
    run verifies again."""
    from automlperf.config import Config
    from automlperf.runner.recovery import recover
    from automlperf.store import open_store
    from automlperf.store.rundir import RunDir

    copy = tampered(run_dir, tmp_path)
    store = open_store(run_dir=run_dir)
    before = store.trial(3)
    store.close()
    with sqlite3.connect(copy / "history.db") as db:
        db.execute("DELETE FROM amp_epochs WHERE trial_id = 3 AND epoch = 1")
        db.execute("UPDATE amp_trials SET status = 'running', finished_at = NULL, "
                   "best_accuracy = NULL, extra = '{}' WHERE id = 3")
    assert "trial 3 epoch 1 is in its trial's log but not in the store" in cli("check", copy).stdout
    store = open_store(run_dir=copy)
    try:
        rd = RunDir(copy)
        found = recover(store, rd, 1, Config.load(rd.config))
        again = store.trial(3)
        assert (found.epochs, found.outcomes) == (1, 1)
        assert recover(store, rd, 1, Config.load(rd.config)).epochs == 0  # nothing twice
    finally:
        store.close()
    for name in ("status", "reason", "best_accuracy", "predicted_accuracy", "epochs_done",
                 "extra"):
        assert getattr(again, name) == getattr(before, name), name
    assert Path(again.weights_path).name == Path(before.weights_path).name
    done = cli("check", copy)
    assert done.returncode == 0, done.stdout


def test_the_monitor_samples_without_a_gpu(run_dir):
    samples = [json.loads(line) for f in (run_dir / "monitor").glob("*.jsonl")
               for line in f.read_text().splitlines()]
    readings = [s for s in samples if "cpu_percent" in s]
    assert readings  # at least the one taken as the sampler stops
    assert all(s["gpus"] == [] and 0 < s["mem_used_gib"] < s["mem_total_gib"] for s in readings)
    assert any("NVML" in s.get("note", "") or "nvidia-ml-py" in s.get("note", "") for s in samples)
    from automlperf.store import open_store

    assert len(open_store(run_dir=run_dir).samples(1)) == len(readings)


@pytest.mark.browser
def test_the_report_renders_in_a_real_browser(run_dir, tmp_path):
    report = run_dir / "report.html"
    html = report.read_text()
    # Self-contained: nothing is loaded from elsewhere.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)|url\(\s*["']?https?:|@import""", html)
    dom = browser("--virtual-time-budget=3000", "--dump-dom", report.as_uri(), tmp_path=tmp_path).stdout
    # score, error, trials, resources; the search's progress, lineage and ranking
    assert dom.count('class="chart"') == 7
    for label in ("score and regulated score over time", "best error over time",
                  "trial accuracy over time, with lineage",
                  "CPU utilisation and memory over time",
                  "best accuracy over time, whole run and per replica",
                  "lineage of the best model: accuracy at birth and reached",
                  "predicted against reached gain of each child over its parent"):
        assert f'aria-label="{label}"' in dom
    trials = json.loads((run_dir / "result.json").read_text())["trials"]
    body = dom[dom.index('<table id="trials">'):]
    body = body[: body.index("</table>")]
    assert body.count("<tr") == trials + 1  # header and one row per trial
    result = read_result(run_dir / "result.json")
    assert "not valid" in dom and "unofficial" in dom and "duration" in dom
    assert "resnet_small" in dom and "customised" in dom
    shot = tmp_path / "report.png"
    browser("--window-size=1280,2400", f"--screenshot={shot}", report.as_uri(), tmp_path=tmp_path)
    assert shot.stat().st_size > 50_000
    assert result["score"] > 0


@pytest.mark.browser
def test_the_report_traces_the_best_models_lineage(run_dir, tmp_path):
    from automlperf.store import open_store

    store = open_store(run_dir=run_dir)
    trials = {t.id: t for t in store.trials(1)}
    best = json.loads((run_dir / "result.json").read_text())["best_trial"]
    chain = [best]
    while trials[chain[-1]].parent_id is not None:
        chain.append(trials[chain[-1]].parent_id)
    chain.reverse()
    dom = browser("--dump-dom", (run_dir / "report.html").as_uri(), tmp_path=tmp_path).stdout
    table = dom[dom.index('<table id="lineage">'):]
    table = table[table.index("<tbody>"): table.index("</table>")]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in table.split("<tr")[1:]]
    # Every ancestor, first to last, each with its parent, the accuracy it inherited at
    # birth (its parent's best) and the accuracy the store holds for it.
    assert [int(r[0]) for r in rows] == chain
    for r in rows:
        t = trials[int(r[0])]
        assert r[1] == ("-" if t.parent_id is None else str(t.parent_id))
        birth = None if t.parent_id is None else trials[t.parent_id].best_accuracy
        assert r[5] == ("fresh" if birth is None else f"{birth:.4f}")
        assert r[6] == ("-" if t.best_accuracy is None else f"{t.best_accuracy:.4f}")
    assert "lineage of the best model" in dom and "parent → child" in dom


@pytest.mark.browser
def test_the_search_progress_charts_render(run_dir, tmp_path):
    """The search-progress section in a real browser: its three charts laid out with a size,
    the best model's trial on the lineage chart, and the ranking share as the store has it."""
    from automlperf.report.progress import gp_ranking
    from automlperf.store import open_store

    store = open_store(run_dir=run_dir)
    trials = store.trials(1)
    store.close()
    page = tmp_path / "progress.html"
    probe = """<script>
      document.title = Array.from(document.querySelectorAll('#search-progress svg.chart'))
        .map(function (s) { var b = s.getBoundingClientRect();
                            return s.getAttribute('aria-label') + '=' + Math.round(b.width)
                                   + 'x' + Math.round(b.height); }).join('|');
    </script></body>"""
    page.write_text((run_dir / "report.html").read_text().replace("</body>", probe))
    dom = browser("--window-size=1280,2400", "--dump-dom", page.as_uri(),
                  tmp_path=tmp_path).stdout
    sizes = dict(item.split("=") for item in
                 re.search(r"<title>([^<]*)</title>", dom).group(1).split("|"))
    assert list(sizes) == ["best accuracy over time, whole run and per replica",
                           "lineage of the best model: accuracy at birth and reached",
                           "predicted against reached gain of each child over its parent"]
    for size in sizes.values():
        width, height = map(int, size.split("x"))
        assert width > 300 and height > 150
    section = dom[dom.index('id="search-progress"'):dom.index('id="time"')]
    best = json.loads((run_dir / "result.json").read_text())["best_trial"]
    lineage_svg = section[section.index('id="lineage-chart"'):section.index('id="ranking-chart"')]
    assert f"#{best}" in lineage_svg
    ranking = gp_ranking(trials)
    assert ranking.ranked_above + ranking.others >= 1  # the children after the seed
    text = re.sub(r"<[^>]+>", "", section[section.index('id="gp-ranking"'):])
    if ranking.ranked_above:
        assert (f"Of {ranking.ranked_above} children the Gaussian process ranked above their "
                f"parent") in text
        assert f"{ranking.improved_when_above} (" in text
    else:
        assert f"predicted none of the {ranking.others} children it chose above" in text
        assert f"{ranking.improved_otherwise} (" in text
    shot = tmp_path / "progress.png"
    browser("--window-size=1280,2400", f"--screenshot={shot}", page.as_uri(), tmp_path=tmp_path)
    assert shot.stat().st_size > 50_000


@pytest.mark.browser
def test_the_trial_table_sorts_in_the_browser(run_dir, tmp_path):
    # Click the "best acc." header twice through a page script, then read the order back.
    page = tmp_path / "sorted.html"
    html = (run_dir / "report.html").read_text()
    probe = """<script>
      var th = document.querySelectorAll('#trials th')[11]; th.click(); th.click();
      document.title = Array.from(document.querySelectorAll('#trials tbody tr'))
        .map(function (r) { return r.cells[11].getAttribute('data-v'); }).join(',');
    </script></body>"""
    page.write_text(html.replace("</body>", probe))
    dom = browser("--dump-dom", page.as_uri(), tmp_path=tmp_path).stdout
    values = [float(v) for v in re.search(r"<title>([^<]*)</title>", dom).group(1).split(",")]
    assert values == sorted(values, reverse=True) and len(values) >= 2


def test_compare_ranks_runs(run_dir, tmp_path):
    done = cli("compare", run_dir, DATA / "run_v1")
    assert done.returncode == 0, done.stderr
    assert "automlperf ranking" in done.stdout and "GOPS" in done.stdout
    rows = json.loads(cli("compare", run_dir, DATA / "run_v1", "--json").stdout)
    assert [r["rank"] for r in rows] == [1, 2]
    assert rows[0]["score"] >= rows[1]["score"] or rows[0]["valid"]
    assert all(r["ops_per_device"] > 0 for r in rows)
    missing = cli("compare", tmp_path)
    assert missing.returncode == 2 and "result.json is missing" in missing.stderr


def test_info_describes_the_system():
    from typer.testing import CliRunner

    from automlperf.cli import app

    desc = json.loads(CliRunner().invoke(app, ["info", "--json"]).output)
    assert desc["cpu"]["logical_cores"] >= 1 and desc["memory_gib"] > 0
    assert desc["software"]["torch"] and "accelerators" in desc
    assert "CPU" in CliRunner().invoke(app, ["info"]).output


@pytest.mark.parametrize("edit,named", [
    (lambda r: r.update(ruleset="aiperf-2099.1"), "unknown ruleset 'aiperf-2099.1'"),
    (lambda r: r["provenance"]["packages"].update(torch="9.9.9"), "provenance differs"),
    (lambda r: r["provenance"].update(source_hash="sha256:0"), "provenance differs"),
    (lambda r: r["node_descriptions"][0].update(ceiling_ops=1.0), "node_descriptions differs"),
    (lambda r: r.update(fraction_of_ceiling=0.99), "fraction_of_ceiling is"),
    (lambda r: r["time_breakdown"]["total"].update(training_s=1e6), "time_breakdown total"),
    # Deleting the ruleset switches nothing off: the provenance is still held to the store.
    (lambda r: (r.pop("ruleset"), r["provenance"].update(source_hash="sha256:0")),
     "ruleset is missing, but the run was started under 'aiperf-2021.4'"),
    (lambda r: (r.pop("ruleset"), r["provenance"].update(source_hash="sha256:0")),
     "provenance differs"),
    # What a results list shows beside the score.
    (lambda r: r.update(devices=r["devices"] * 2,
                        ops_per_s_per_device=r["ops_per_s_per_device"] / 2), "devices is 2"),
    (lambda r: r.update(nodes=4), "nodes is 4"),
    (lambda r: r["system"].update(accelerators=["NVIDIA H100 80GB HBM3"]), "system is"),
    (lambda r: r.pop("devices"), "devices is missing"),
])
def test_check_catches_edited_records(run_dir, tmp_path, edit, named):
    copy = tampered(run_dir, tmp_path)
    result = json.loads((copy / "result.json").read_text())
    edit(result)
    (copy / "result.json").write_text(json.dumps(result))
    done = cli("check", copy)
    assert done.returncode == 1 and named in done.stdout, done.stdout


def test_a_run_records_its_ruleset_provenance_nodes_and_breakdown(run_dir):
    result = read_result(run_dir / "result.json")
    assert result["ruleset"] == "aiperf-2021.4"
    prov = result["provenance"]
    assert prov["source_hash"].startswith("sha256:") and "torch" in prov["packages"]
    assert (prov["git"] or {}).get("commit") or prov["git"] is None
    node = result["node_descriptions"][0]
    assert node["ceiling"][0]["precision"] == "fp32" and node["ceiling_ops"] > 0
    # What the replica trained with, beside what the primary recorded: the same code here.
    assert node["software"]["source_hash"] == prov["source_hash"]
    assert node["software"]["automlperf_version"] == prov["automlperf_version"]
    assert node["software"]["torch"] == prov["packages"]["torch"]
    assert result["fraction_of_ceiling"] == pytest.approx(result["score"] / result["ceiling_ops"])
    parts = result["time_breakdown"]["total"]
    # The replica is charged to the deadline, or to the end of an epoch that finished in the
    # grace after it: the breakdown accounts for that time.
    charged = result["charging"]["replica_s"]
    assert result["charging"]["rule"] == "per_replica" and list(charged) == ["0"]
    # Charged times are reported to the microsecond.
    assert result["elapsed_s"] - 1e-6 <= charged["0"] <= (
        result["elapsed_s"] + result["charging"]["grace_s"] + 1e-6)
    assert parts["session_s"] == pytest.approx(charged["0"])
    assert parts["data_wait_s"] + parts["device_wait_s"] <= parts["training_s"] + 1e-6
    assert sum(v for k, v in parts.items() if k not in ("session_s", *OF_TRAINING)) == \
        pytest.approx(parts["session_s"])
