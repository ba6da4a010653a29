import json
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from automlperf.cli import app
from automlperf.graph import seeds

runner = CliRunner()


def test_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in ("run", "worker", "slurm", "ops", "report", "check", "compare", "info"):
        assert name in result.output


def test_ops_table_matches_paper_totals():
    result = runner.invoke(app, ["ops", "--model", "resnet50", "--image-size", "224",
                                 "--num-classes", "1000"])
    assert result.exit_code == 0, result.output
    assert "7.807e+09" in result.output and "1.525e+10" in result.output
    assert "2.305e+10" in result.output and "25,557,032 parameters" in result.output


def test_ops_json_and_batch_size():
    one = json.loads(runner.invoke(app, ["ops", "--json"]).output)
    assert set(one) >= {"forward", "backward", "total", "params", "by_kind"}
    assert one["by_kind"]["conv2d"]["forward"] == pytest.approx(7.712e9, rel=1e-3)
    big = json.loads(runner.invoke(app, ["ops", "--json", "--batch-size", "256"]).output)
    assert big["forward"] == one["forward"] and big["backward"] < one["backward"]


def test_ops_counts_a_saved_graph(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(seeds.resnet_small(10, 32).to_json())
    result = runner.invoke(app, ["ops", "--graph", str(path), "--json"])
    assert json.loads(result.output)["params"] == 129_386


def test_ops_rejects_a_broken_graph_in_one_line(tmp_path):
    path = tmp_path / "g.json"
    data = json.loads(seeds.resnet_small().to_json())
    data["layers"][2]["inputs"] = ["ghost"]
    path.write_text(json.dumps(data))
    result = runner.invoke(app, ["ops", "--graph", str(path)])
    assert result.exit_code == 2
    assert "input 'ghost' does not exist" in result.output
    missing = runner.invoke(app, ["ops", "--graph", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "cannot read graph file" in missing.output


def test_unknown_model_is_a_usage_error():
    result = runner.invoke(app, ["ops", "--model", "vgg"])
    assert result.exit_code == 2 and "unknown model 'vgg'" in result.output


@pytest.mark.parametrize("command", [["run"], ["slurm", "--nodes", "2"]])
def test_run_and_slurm_refuse_bad_options_alike_before_writing_anything(tmp_path, command):
    run_dir = tmp_path / "r"
    for options, message in ((["--duration", "soon"], "--duration: 'soon' is not a duration"),
                             (["--dataset", "imagenet"], "imagenet needs --data-dir")):
        result = runner.invoke(app, [*command, "--run-dir", str(run_dir), *options])
        assert result.exit_code == 2 and message in result.output, result.output
    assert not run_dir.exists()


def test_console_script_is_installed():
    exe = shutil.which("automlperf") or str(__import__("pathlib").Path(sys.executable).parent / "automlperf")
    result = subprocess.run([exe, "ops", "--model", "resnet_small", "--image-size", "32",
                             "--num-classes", "10", "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["params"] == 129_386
