"""The official shape end to end: the ResNet-50 seed at 224x224 on an ImageNet-layout tree
of 1,000 class folders, through `automlperf run` and `automlperf check`. The tree is tiny
(one small JPEG per class), so the run takes minutes on a CPU; its result carries the
official labels and is not valid for its duration and accuracy."""

import json

import pytest

from automlperf.store import open_store
from helpers import cli, marked_env, wait_no_strays
from imagefolder import photo

pytestmark = pytest.mark.slow


@pytest.mark.timeout(3600)  # minutes on an idle 2-core machine; a guard against a hang only
def test_resnet50_at_224_on_a_thousand_class_tree(tmp_path):
    src = photo().resize((64, 64))
    for split, classes in (("train", 1000), ("val", 50)):
        for c in range(classes):
            folder = tmp_path / "data" / split / f"n{c:08d}"
            folder.mkdir(parents=True)
            # Each class its own rotation of the photo: distinct files, same cost to decode.
            src.rotate(c * 360 / classes).save(folder / f"{split}_{c}.JPEG", quality=85)
    config = tmp_path / "official.toml"
    # Official settings; only what a CPU needs to finish one round of one epoch changes:
    # customisable settings, and a round limit that ends the run long before its hour.
    config.write_text(f"""
[run]
duration_s = 3600
max_rounds = 1
[data]
dataset = "imagenet"
data_dir = "{tmp_path / 'data'}"
workers = 1
[train]
max_epochs = 4
batch_size = 50
""")
    run_dir = tmp_path / "run"
    env, mark = marked_env()
    done = cli("run", "--config", config, "--run-dir", run_dir, env=env, timeout=3000)
    assert done.returncode == 0, done.stdout + done.stderr
    wait_no_strays(mark)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["official"] and not result["valid"]
    assert {v["rule"] for v in result["violations"]} == {"duration", "max_error"}
    assert result["epochs"] == 1 and result["train_images"] == 1000 and result["val_images"] == 50
    trial = open_store(run_dir=run_dir).trials(1)[0]
    assert trial.parent_id is None and trial.graph_hash  # the seed itself
    assert json.loads(trial.graph_json)["input_shape"] == [3, 224, 224]
    assert cli("check", run_dir, timeout=600).returncode == 0
    assert cli("check", run_dir, "--official", timeout=600).returncode == 3  # not valid
