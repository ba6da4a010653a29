"""Official runs and the data they name: near-misses refused before the run starts, the
identity recorded, and `check` rescanning a folder's data when it is reachable."""

import dataclasses
import json

import pytest

from automlperf import rules
from automlperf.config import Config, ConfigError
from automlperf.runner.session import record_origin
from helpers import cli
from trees import SMALL, WNIDS, make_tree, near_miss, official_archives

SMALL_RULES = dataclasses.replace(rules.CURRENT, dataset=SMALL)


def official(data_dir):
    return Config.parse({"run": {"official": True}, "data": {"data_dir": str(data_dir)}})


def test_the_right_data_is_recorded_for_an_official_run(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "imagenet", per_class=(1, 1))
    official_archives(root, tmp_path / "archives", monkeypatch)
    origin = record_origin(official(tmp_path / "archives"), SMALL_RULES)
    assert origin["ruleset"] == rules.CURRENT.id == "aiperf-2021.4"
    assert 0 <= origin["seed"] < 2**31  # drawn by the run, recorded beside its ruleset
    assert origin["dataset_identity"]["problems"] == []
    assert origin["dataset_identity"]["fingerprint"].startswith("sha256:")
    assert origin["dataset_identity"]["classes"] == 1000
    assert origin["provenance"]["source_hash"].startswith("sha256:")


@pytest.mark.parametrize("kind,named", [
    ("999 classes", "999 classes instead of 1,000"),
    ("one image missing", "1,999 images instead of 2,000 (1 missing)"),
    ("renamed class", "class(es) not in ImageNet-1k: n99999999"),
    ("extra file", "notes.txt"),
])
def test_an_official_run_on_a_near_miss_is_refused(tmp_path, kind, named):
    root = make_tree(tmp_path / "imagenet")
    near_miss(root, kind)
    with pytest.raises(ConfigError, match="official run refused") as info:
        record_origin(official(root), SMALL_RULES)
    # A folder is never official; what else differs is named after that.
    assert "is a folder of images" in str(info.value)
    assert named in str(info.value) and "\n" not in str(info.value)


def test_an_unreadable_layout_is_refused_in_one_line(tmp_path):
    root = make_tree(tmp_path / "imagenet")
    (root / "val").rename(root / "validation")
    with pytest.raises(ConfigError, match="official run refused: .*val not found"):
        record_origin(official(root), SMALL_RULES)
    # Official settings alone hold a run to the data rule; declared unofficial, it goes on.
    with pytest.raises(ConfigError, match="official run refused: .*val not found.*--unofficial"):
        record_origin(Config.parse({"data": {"data_dir": str(root)}}), SMALL_RULES)
    unofficial = Config.parse({"run": {"official": False}, "data": {"data_dir": str(root)}})
    assert "val not found" in record_origin(unofficial, SMALL_RULES)["dataset_identity"][
        "problems"][0]


@pytest.mark.slow
def test_check_rescans_the_data_and_catches_an_edited_fingerprint(tmp_path):
    classes = WNIDS[:4]
    root = make_tree(tmp_path / "imagenet", per_class=(8, 2), classes=classes)
    (tmp_path / "c.toml").write_text(f"""
[run]
duration_s = 900
max_rounds = 1
heartbeat_s = 1
lease_timeout_s = 6
[data]
dataset = "imagenet"
data_dir = "{root}"
image_size = 16
workers = 0
[model]
seed_model = "resnet_small"
[train]
max_epochs = 1
batch_size = 8
""")
    run = tmp_path / "run"
    done = cli("run", "--config", tmp_path / "c.toml", "--run-dir", run, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((run / "result.json").read_text())
    identity = result["dataset_identity"]
    assert identity["classes"] == 4 and identity["train_images"] == 32
    assert any("4 classes instead of 1,000" in p for p in identity["problems"])
    dataset = next(v for v in result["violations"] if v["rule"] == "dataset")
    assert "4 classes instead of 1,000" in dataset["detail"]
    assert cli("check", run).returncode == 0

    result["dataset_identity"] = {**identity, "fingerprint": "sha256:" + "0" * 64}
    (run / "result.json").write_text(json.dumps(result))
    done = cli("check", run)
    assert done.returncode == 1 and "dataset_identity differs" in done.stdout

    result["dataset_identity"] = identity
    (run / "result.json").write_text(json.dumps(result))
    assert cli("check", run).returncode == 0
    near_miss(root, "extra file")  # the data changed after the run
    done = cli("check", run)
    assert done.returncode == 1 and "the data's fingerprint is now" in done.stdout
