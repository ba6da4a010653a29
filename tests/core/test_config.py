from pathlib import Path

import pytest

from automlperf.config import Config, ConfigError, parse_duration
from automlperf.errors import UserError


def write(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_defaults_are_the_official_rules():
    c = Config()
    assert c.data.dataset == "imagenet" and c.data.image_size == 224
    assert c.model.seed_model == "resnet50" and c.train.max_epochs == 60
    assert c.train.momentum == 0.9 and c.train.label_smoothing == 0.1
    assert [c.train.round_epochs(r) for r in range(5)] == [15, 30, 45, 60, 60]
    assert [c.train.patience(r) for r in (0, 1, 7, 50)] == [6, 8, 20, 20]
    assert c.fixed_changes() == []


def test_load_toml_with_preset(tmp_path):
    path = write(tmp_path, '[run]\nduration_s = "2m"\n[data]\ndataset = "builtin"\n'
                           '[train]\nmax_epochs = 4\n')
    c = Config.load(path)
    assert c.run.duration_s == 120 and c.train.max_epochs == 4
    assert c.model.seed_model == "resnet_small"  # from the builtin preset
    assert "data.dataset = 'builtin' (official: 'imagenet')" in c.fixed_changes()


def test_round_trip_through_toml(tmp_path):
    c = Config.for_dataset("builtin", {"train": {"batch_size": 32}})
    again = Config.load(write(tmp_path, c.to_toml()))
    assert again == c


@pytest.mark.parametrize("text,message", [
    ("[train]\nbatch_size = 0\n", "train.batch_size: Input should be greater than or equal to 1 (got 0)"),
    ('[train]\nprecision = "fp8"\n', "train.precision: 'fp8' is below the 16-bit floating point minimum"),
    ('[train]\nprecision = "int8"\n', "train.precision: 'int8' is below the 16-bit"),
    ("[train]\nbatchsize = 4\n", "unknown setting 'train.batchsize'; valid keys in [train]: batch_size"),
    ("[trian]\nx = 1\n", "unknown setting 'trian'; valid keys: run, data"),
    ('[train]\nmax_epochs = "many"\n', "train.max_epochs: Input should be a valid integer"),
    ('[run]\nduration_s = "soon"\n', "run.duration_s: 'soon' is not a duration"),
    ('[data]\ndataset = "mnist"\n',
     "data.dataset: Input should be 'imagenet', 'cifar10', 'builtin', 'digits' or 'synthetic'"),
    ("[train\n", "not valid TOML"),
])
def test_errors_are_one_clear_line(tmp_path, text, message):
    with pytest.raises(ConfigError) as info:
        Config.load(write(tmp_path, text))
    text_err = str(info.value)
    assert message in text_err and "\n" not in text_err and str(tmp_path) in text_err


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        Config.load(tmp_path / "absent.toml")


def test_official_run_names_each_changed_fixed_setting():
    c = Config.parse({"run": {"official": True}, "data": {"image_size": 160},
                      "search": {"hpo_start_round": 1}})
    with pytest.raises(ConfigError) as info:
        c.check_official()
    assert "data.image_size = 160 (official: 224)" in str(info.value)
    assert "search.hpo_start_round = 1 (official: 3)" in str(info.value)
    Config.parse({"run": {"official": True}, "train": {"batch_size": 256}}).check_official()


def test_customised_settings_are_listed():
    c = Config.parse({"train": {"lr_per_256": 0.2}})
    assert c.customised() == {"train.lr_per_256": 0.2}


@pytest.mark.parametrize("text,seconds", [("90", 90), ("10m", 600), ("2h", 7200),
                                          ("1h30m", 5400), (45, 45), ("1.5h", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_the_official_configuration_ships_and_holds_every_rule(tmp_path):
    from automlperf.config import config_file

    official = Config.load("official")
    assert config_file("official").name == "official.toml"
    assert official.run.official is True and official.strict() and not official.fixed_changes()
    assert official.data.dataset == "imagenet" and official.run.duration_s == 3600
    assert official.run.require_accelerators
    # A file of that name in the working folder is what --config names.
    (tmp_path / "official").write_text("[run]\nduration_s = 60\n")
    assert config_file(tmp_path / "official") == tmp_path / "official"
    with pytest.raises(ConfigError, match="no such file.*shipped with automlperf \\(official\\)"):
        Config.load(tmp_path / "nothing.toml")


def test_official_settings_hold_a_run_to_the_data_rule_unless_declared_unofficial():
    assert Config().strict()  # every fixed setting official: the data must be ImageNet-1k
    assert not Config.parse({"run": {"official": False}}).strict()
    assert not Config.for_dataset("digits").strict()  # its settings already make it unofficial
    assert not Config.parse({"run": {"accelerator": "simulated"}}).strict()
    assert Config.parse({"run": {"official": True}, "data": {"image_size": 160}}).strict()


def test_a_cluster_run_of_a_built_in_task_must_be_asked_for():
    from automlperf.settings import check_cluster_task

    digits = Config.for_dataset("digits")
    with pytest.raises(UserError, match="a 4-node run of the digits task .*--small-task"):
        check_cluster_task(digits, 4, asked=False)
    check_cluster_task(digits, 4, asked=True)
    check_cluster_task(digits, 1, asked=False)
    check_cluster_task(Config.parse({"run": {"accelerator": "simulated"},
                                     "data": {"dataset": "digits"}}), 4, asked=False)


def test_the_options_of_run_slurm_and_train_make_one_configuration(tmp_path, monkeypatch):
    from automlperf.settings import settings_from_options

    monkeypatch.chdir(tmp_path)
    cfg = settings_from_options(None, "imagenet", duration="1h30m", data_dir=Path("d"),
                                unofficial=True, options={"run.replicas": 3,
                                                          "train.precision": None})
    assert cfg.run.duration_s == 5400 and cfg.run.replicas == 3 and cfg.run.official is False
    assert cfg.data.data_dir == tmp_path.resolve() / "d"  # read again from other folders
    assert cfg.train.precision == "auto"  # None: not given
    with pytest.raises(ConfigError, match="^--duration: 'soon' is not a duration"):
        settings_from_options(None, "digits", duration="soon")
    with pytest.raises(UserError, match=r"^cifar10 needs --data-dir \(or data.data_dir"):
        settings_from_options(None, "cifar10")
    settings_from_options(None, "cifar10", data_required=False)  # the loader says it then
    # A folder given to a dataset that ships with automlperf would be ignored without a word.
    with pytest.raises(UserError, match=r"^--data-dir is read only by a dataset of image "
                                        r"folders \(imagenet, cifar10\), and this run's is builtin: "
                                        r"add --dataset imagenet"):
        settings_from_options(None, None, data_dir=Path("d"))
    simulated = settings_from_options(None, "imagenet", options={"run.accelerator": "simulated"})
    assert simulated.data.data_dir is None  # a simulated run reads no images
