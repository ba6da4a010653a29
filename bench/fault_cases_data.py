"""Data faults of bench/bench_faults.py, each through a real `automlperf run` that trains on
an ImageNet-layout folder of JPEG photos (tests/imagefolder.py): unreadable files of every
kind, too many of them, a class or a split without images, files vanishing mid-run."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fault_common import (ROOT, Case, account, error_line, folder_config, held, records, run,
                          start, tracebacks, verdict, wait_for)

sys.path.insert(0, str(ROOT / "tests"))
from imagefolder import make_image_folder, photo  # noqa: E402


def _garbage(path: Path, seed: int) -> None:
    path.write_bytes(np.random.default_rng(seed).integers(0, 256, 2000, dtype=np.uint8).tobytes())


def _outcome(done: Any, run_dir: Path, started: float,
             before: set[tuple[Any, ...]] | None = None) -> dict[str, Any]:
    text = done.stdout + done.stderr
    result = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").exists() else {}
    skipped = result.get("unreadable_images") or {}
    happened = error_line(text) if done.returncode else (
        f"trained {result.get('epochs')} epochs; skipped {skipped.get('train', 0)} training + "
        f"{skipped.get('val', 0)} validation images")
    if tracebacks(text):
        happened = "TRACEBACK: " + happened
    return {"happened": happened, "exit": done.returncode, **account(run_dir, before=before),
            "check": verdict(run_dir),
            "detect_s": round(time.monotonic() - started, 1) if done.returncode else None}


def every_file_corrupt(work: Path) -> dict[str, Any]:
    """The issue's case word for word: the default (official-shape) run on a folder of
    random bytes named .JPEG."""
    data = work / "data"
    for split, n in (("train", 30), ("val", 10)):
        for c in range(10):
            folder = data / split / f"n{c:08d}"
            folder.mkdir(parents=True)
            for i in range(n):
                _garbage(folder / f"{split}_{c}_{i}.JPEG", c * 1000 + i)
    started = time.monotonic()
    done = run("run", "--dataset", "imagenet", "--data-dir", data, "--duration", "5m",
               "--run-dir", work / "run", "--unofficial")
    return _outcome(done, work / "run", started)


def _small(work: Path, corrupt_train: int, train_per_class: int = 25, **data: Any) -> tuple[Path, Path]:
    root = work / "data"
    make_image_folder(root, classes=2, train_per_class=train_per_class, val_per_class=4,
                      corrupt=0)
    for k in range(corrupt_train):
        _garbage(root / "train" / f"n{k % 2:08d}" / f"bad_{k}.JPEG", k)
    config = work / "run.toml"
    config.write_text(folder_config(root, max_rounds=1, **data))
    return root, config


def two_percent_corrupt(work: Path) -> dict[str, Any]:
    _, config = _small(work, corrupt_train=1, train_per_class=25)  # 1 of 51
    started = time.monotonic()
    return _outcome(run("run", "--config", config, "--run-dir", work / "run"), work / "run", started)


def every_kind_of_odd_file(work: Path) -> dict[str, Any]:
    """Zero bytes, a truncated JPEG (unreadable, counted) beside a PNG, greyscale, CMYK and
    16-bit image named .JPEG (read as what they are), among 100 good images."""
    root, config = _small(work, corrupt_train=0, train_per_class=50)
    folder = root / "train" / "n00000000"
    (folder / "zero.JPEG").write_bytes(b"")
    good = photo().resize((48, 36))
    good.save(folder / "cut.JPEG", format="JPEG")
    (folder / "cut.JPEG").write_bytes((folder / "cut.JPEG").read_bytes()[:300])
    good.save(folder / "png.JPEG", format="PNG")
    good.convert("L").save(folder / "grey.JPEG", format="JPEG")
    good.convert("CMYK").save(folder / "cmyk.JPEG", format="JPEG")
    Image.fromarray(np.asarray(good.convert("L"), dtype=np.uint16) * 257).save(
        folder / "deep.JPEG", format="PNG")
    started = time.monotonic()
    return _outcome(run("run", "--config", config, "--run-dir", work / "run"), work / "run", started)


def too_many_corrupt(work: Path) -> dict[str, Any]:
    _, config = _small(work, corrupt_train=6, train_per_class=25)  # 6 of 56: 11 % > 5 %
    # No round limit: three failed trials in a row end the run.
    config.write_text(config.read_text().replace("max_rounds = 1\n", ""))
    started = time.monotonic()
    return _outcome(run("run", "--config", config, "--run-dir", work / "run"), work / "run", started)


def empty_class_folder(work: Path) -> dict[str, Any]:
    root, config = _small(work, corrupt_train=0, train_per_class=10)
    (root / "train" / "n00000002").mkdir()
    started = time.monotonic()
    return _outcome(run("run", "--config", config, "--run-dir", work / "run"), work / "run", started)


def val_folder_missing(work: Path) -> dict[str, Any]:
    root, config = _small(work, corrupt_train=0, train_per_class=10)
    shutil.rmtree(root / "val")
    started = time.monotonic()
    return _outcome(run("run", "--config", config, "--run-dir", work / "run"), work / "run", started)


def files_vanish_mid_run(work: Path) -> dict[str, Any]:
    """After the first recorded epoch, 2 of the 200 training files are deleted: the run goes
    on and counts them."""
    root, config = _small(work, corrupt_train=0, train_per_class=100)
    config.write_text(config.read_text().replace("max_rounds = 1", "max_rounds = 2"))
    run_dir = work / "run"
    proc = start("run", "--config", config, "--run-dir", run_dir, log=work / "run.log")
    wait_for(lambda: records(run_dir) >= 2, 900, "a first epoch")
    before = held(run_dir)
    struck = time.monotonic()
    aside = work / "aside"
    aside.mkdir()
    vanished = sorted((root / "train" / "n00000001").glob("*.JPEG"))[:2]
    for path in vanished:
        shutil.move(path, aside / path.name)
    code = proc.wait(timeout=1800)
    text = (work / "run.log").read_text()
    done = type("Done", (), {"returncode": code, "stdout": text, "stderr": ""})()
    changed = verdict(run_dir)  # the data is not the data the run started on
    for path in vanished:
        shutil.move(aside / path.name, path)
    out = _outcome(done, run_dir, struck, before)
    out["check"] = (f"{out['check']} once the files are back; before: "
                    + ("names the changed data" if "fingerprint" in changed else changed))
    return out


def _archived(work: Path, corrupt_train: int = 0, train_per_class: int = 25,
              max_rounds: int = 1) -> tuple[Path, Path]:
    """The small folder written as the official archives are laid out (and then removed: the
    run reads the archives alone), and its configuration."""
    from automlperf.testing.archives import write_archives

    root, _ = _small(work, corrupt_train=corrupt_train, train_per_class=train_per_class)
    archives = work / "ilsvrc2012"
    write_archives(root, archives)
    shutil.rmtree(root)
    config = work / "run.toml"
    config.write_text(folder_config(archives, max_rounds=max_rounds))
    return archives, config


def archive_member_corrupt(work: Path) -> dict[str, Any]:
    """One training image of the training archive is garbage: read from the archive, it is
    counted like an unreadable file."""
    _, config = _archived(work, corrupt_train=1)
    started = time.monotonic()
    return _outcome(run("run", "--config", config, "--run-dir", work / "run"), work / "run", started)


def archive_cut_short(work: Path) -> dict[str, Any]:
    """The training archive truncated inside a member (a partial download)."""
    archives, config = _archived(work)
    train = archives / "ILSVRC2012_img_train.tar"
    with open(train, "r+b") as f:
        f.truncate(train.stat().st_size // 2)
    started = time.monotonic()
    return _outcome(run("run", "--config", config, "--run-dir", work / "run"), work / "run", started)


def archive_replaced_mid_run(work: Path) -> dict[str, Any]:
    """After the first recorded epoch the validation archive is replaced by a copy of itself
    (the same bytes, another file): the run goes on, and its end names the file."""
    archives, config = _archived(work, train_per_class=60, max_rounds=2)
    run_dir = work / "run"
    proc = start("run", "--config", config, "--run-dir", run_dir, log=work / "run.log")
    wait_for(lambda: records(run_dir) >= 2, 900, "a first epoch")
    before = held(run_dir)
    struck = time.monotonic()
    val = archives / "ILSVRC2012_img_val.tar"
    shutil.copyfile(val, work / "copy.tar")
    shutil.move(work / "copy.tar", val)
    code = proc.wait(timeout=1800)
    text = (work / "run.log").read_text()
    done = type("Done", (), {"returncode": code, "stdout": text, "stderr": ""})()
    out = _outcome(done, run_dir, struck, before)
    result = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").exists() else {}
    changed = [v["detail"] for v in result.get("violations", []) if v["rule"] == "data_changed"]
    out["happened"] += ("; not valid: " + changed[0][:160]) if changed else "; NOT NAMED"
    return out


def cases() -> list[Case]:
    return [
        ("data: every file corrupt", "exit 1 in one line naming the data", every_file_corrupt),
        ("data: 2 % corrupt", "trains; skipped count in result", two_percent_corrupt),
        ("data: empty, cut, PNG/grey/CMYK/16-bit as .JPEG", "trains; 2 counted, 4 read",
         every_kind_of_odd_file),
        ("data: 11 % corrupt (limit 5 %)", "exit 1 in one line naming the data", too_many_corrupt),
        ("data: a class folder with no images", "trains", empty_class_folder),
        ("data: val/ missing", "exit 1 in one line naming val/", val_folder_missing),
        ("data: files vanish mid-run", "trains on; counted", files_vanish_mid_run),
        ("data: an archive member corrupt", "trains; skipped count in result",
         archive_member_corrupt),
        ("data: the training archive cut short", "exit 1 in one line naming the archive",
         archive_cut_short),
        ("data: an archive replaced mid-run", "trains on; not valid, naming the archive",
         archive_replaced_mid_run),
    ]
