"""The settings a command's options ask for, and the checks of them that a launch makes.

``automlperf run``, ``automlperf slurm`` and ``automlperf train`` each take a configuration
file (or a dataset's preset) and some settings as options (--duration, --data-dir,
--unofficial, ...): :func:`settings_from_options` turns them into one :class:`Config`, the
same way for all three. Its checks, and :func:`check_cluster_task`, are phrased in those
options; the checks phrased in settings are :class:`Config`'s own (``check_official``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from automlperf.config import Config, ConfigError, load_config, parse_duration, set_option
from automlperf.errors import UserError

# Datasets read from a folder: a run on one needs --data-dir.
FOLDER_DATASETS = ("imagenet", "cifar10")
# The built-in tasks: a few thousand small images, for one machine.
SMALL_TASKS = ("builtin", "digits")


def settings_from_options(config: Path | None = None, dataset: str | None = None, *,
                          duration: str | None = None, data_dir: Path | None = None,
                          unofficial: bool = False, options: Mapping[str, Any] | None = None,
                          data_required: bool = True) -> Config:
    """The configuration file ``config`` (or a shipped one, by name), else the preset of
    ``dataset`` (``builtin`` unless named), with the options on top: ``duration`` as written
    (``2h``), ``data_dir`` made absolute (the run's configuration is read again from other
    folders and nodes), ``unofficial`` declaring the run unofficial, and ``options`` mapping
    further dotted settings to a command's values (None: not given).

    A dataset read from a folder needs one, unless the run is simulated (it reads no
    images); ``data_required=False`` leaves that to the data loader, whose message names
    what the folder must hold (``automlperf train``)."""
    tree: dict[str, Any] = {}
    if duration is not None:
        try:
            set_option(tree, "run.duration_s", parse_duration(duration))
        except ConfigError as exc:
            raise ConfigError(f"--duration: {exc}") from None
    set_option(tree, "data.data_dir", str(data_dir.resolve()) if data_dir else None)
    set_option(tree, "run.official", False if unofficial else None)
    for dotted, value in (options or {}).items():
        set_option(tree, dotted, value)
    settings = load_config(config, dataset, tree)
    if data_dir is not None and settings.data.dataset not in FOLDER_DATASETS:
        # Otherwise the run trains on what ships with automlperf and says nothing of the folder.
        raise UserError(f"--data-dir is read only by a dataset of image folders "
                        f"({', '.join(FOLDER_DATASETS)}), and this run's is "
                        f"{settings.data.dataset}: add --dataset imagenet (or cifar10), or "
                        "drop --data-dir")
    if data_required:
        check_data_given(settings)
    return settings


def check_data_given(settings: Config) -> None:
    """A dataset read from a folder needs the folder, unless the run is simulated: it then
    needs only the dataset's shape and image counts."""
    data = settings.data
    if data.dataset in FOLDER_DATASETS and data.data_dir is None and not settings.simulated:
        raise UserError(f"{data.dataset} needs --data-dir (or data.data_dir in the "
                        "configuration)")


def check_cluster_task(cfg: Config, nodes: int, asked: bool) -> None:
    """A run on several nodes benchmarks a cluster: the built-in tasks (a few thousand
    small images, for one machine) are refused there unless asked for, so that no cluster
    is measured on MNIST by a forgotten --dataset. Simulated runs model the devices and
    read no images: they are exempt."""
    if nodes > 1 and cfg.data.dataset in SMALL_TASKS and not cfg.simulated and not asked:
        raise UserError(f"a {nodes}-node run of the {cfg.data.dataset} task measures a cluster on "
                        "a few thousand small images: give --dataset imagenet --data-dir DIR (or "
                        "--config official --data-dir DIR), or pass --small-task to run it anyway")
