"""One versioned ruleset: every module reads it, every fixed setting is enforced."""

import pytest
from pydantic import ValidationError

from automlperf import rules
from automlperf.config import Config, ConfigError, Precision
from automlperf.measure.score import violations

FIXED = rules.CURRENT.fixed


def other_value(name, official):
    """A valid value different from the official one."""
    alternatives = {"data.dataset": "cifar10", "model.seed_model": "resnet_small",
                    "search.nas": "random_search", "search.hpo": "none",
                    "search.strategy": "random", "search.hpo_order": "after_nas",
                    "train.early_stop_metric": "val_accuracy",
                    # The ruleset's own quarter of the hour, written out, is still a change.
                    "run.deadline_grace_s": 900.0,
                    # Any seed chosen, 0 included, is a change: an official run draws its own.
                    "run.seed": 0}
    if name in alternatives:
        return alternatives[name]
    if isinstance(official, bool):
        return not official
    if isinstance(official, int):
        return official + 1
    if isinstance(official, float):
        return official * 0.9
    if isinstance(official, list) and name.endswith("factors"):
        return [official[0], official[1] * 0.75]
    if isinstance(official, list):
        return official[:-1]
    raise AssertionError(f"no alternative for {name}")


def test_every_fixed_setting_exists_and_defaults_to_its_official_value():
    settings = Config().settings()
    for name in FIXED:
        assert name in settings, f"{name} is fixed by the ruleset but not a setting"
    assert Config().fixed_changes() == []


@pytest.mark.parametrize("name", sorted(FIXED))
def test_changing_any_fixed_setting_is_refused_for_an_official_run(name):
    section, key = name.split(".")
    value = other_value(name, FIXED[name])
    tree = {"run": {"official": True}}
    tree.setdefault(section, {})[key] = value
    try:
        config = Config.parse(tree)
    except ConfigError as exc:
        # A setting with one allowed value is enforced by its type already.
        assert name in str(exc)
        return
    assert any(change.startswith(f"{name} = ") for change in config.fixed_changes())
    with pytest.raises(ConfigError, match=f"official run refused: .*{name}"):
        config.check_official()
    official, valid, found = violations(
        dataset=config.data.dataset, dataset_official=True, elapsed_s=7200,
        fixed_changes=config.fixed_changes(), precisions=["bf16"], error=0.1)
    assert not official and not valid and found


def test_precisions_are_the_rulesets():
    assert Precision.__args__ == ("auto", *rules.CURRENT.allowed_precisions)
    from automlperf.train.device import ALLOWED_PRECISIONS

    assert ALLOWED_PRECISIONS == rules.CURRENT.allowed_precisions


def test_rulesets_are_found_by_id_and_unknown_ones_refused():
    assert rules.get("aiperf-2021.4") is rules.CURRENT
    assert rules.get("aiperf-2021.3") is rules.AIPERF_2021_3
    assert rules.get("aiperf-2021.2") is rules.AIPERF_2021_2
    assert rules.get("aiperf-2021.1") is rules.AIPERF_2021_1
    assert rules.get(None) is rules.RULESETS[rules.LEGACY_ID] is rules.AIPERF_2021_1
    # Results scored before 2021.2 keep their rule: the time to the last counted epoch.
    assert (rules.AIPERF_2021_1.charge, rules.CURRENT.charge) == ("last_epoch", "per_replica")
    # The grace is the ruleset's: a quarter of the duration, unless an unofficial run sets it.
    assert rules.CURRENT.grace_s(3600.0) == 900.0 and rules.CURRENT.grace_s(3600.0, 60) == 60
    assert rules.AIPERF_2021_1.grace_s(3600.0, 60) == 0.0
    assert Config.parse({"run": {"duration_s": 7200}}).deadline_grace() == 1800.0
    with pytest.raises(rules.UnknownRuleset, match="unknown ruleset 'aiperf-2099.9'"):
        rules.get("aiperf-2099.9")


def test_the_dataset_rules_ship_the_1000_wordnet_ids():
    classes = rules.IMAGENET_1K.classes
    assert len(classes) == len(set(classes)) == 1000 and list(classes) == sorted(classes)
    assert classes[0] == "n01440764" and all(c[0] == "n" and len(c) == 9 for c in classes)
    assert (rules.IMAGENET_1K.train_images, rules.IMAGENET_1K.val_images) == (1_281_167, 50_000)


def test_a_fixed_setting_the_configuration_lacks_is_named():
    bad = rules.Ruleset(id="x", fixed={"search.nope": 1}, allowed_precisions=("fp32",),
                        min_duration_s=1, max_error=0.5, dataset=rules.IMAGENET_1K)
    with pytest.raises(KeyError, match="search.nope"):
        Config().fixed_changes(bad)


def test_literal_settings_reject_other_values():
    with pytest.raises(ValidationError):
        Config.model_validate({"search": {"nas": "random_search"}})


def test_a_ruleset_keeps_what_it_fixed_and_later_ones_add_to_it():
    """Earlier results keep their ruleset's rules: each later ruleset only adds."""
    order = list(rules.RULESETS.values())
    for older, newer in zip(order, order[1:]):
        assert newer.newer_than(older) and not older.newer_than(newer)
        assert set(older.fixed) <= set(newer.fixed)
    assert "run.seed" in rules.CURRENT.fixed and "run.seed" not in rules.AIPERF_2021_3.fixed
    assert rules.AIPERF_2021_3.duration_step_s is None and not rules.AIPERF_2021_3.ceiling_required


@pytest.mark.parametrize("duration,problem", [
    (3600, None), (7200, None), (36000, None),
    (7199, "a duration of 7,199 s is not a whole number of hours"),
    (5400, "a duration of 5,400 s is not a whole number of hours"),
    (1800, "a duration of 30 min is below the minimum of 1 h")])
def test_a_duration_class_cannot_be_stretched(duration, problem):
    """aiperf-2021.4: only whole hours, so a 7,199-s run never ranks with 1-hour ones."""
    found = rules.CURRENT.duration_problem(duration)
    assert found is None if problem is None else found.startswith(problem)
    assert rules.AIPERF_2021_3.duration_problem(7199) is None
    tree = {"run": {"official": True, "duration_s": duration}}
    if problem is None:
        Config.parse(tree).check_official()
    else:
        with pytest.raises(ConfigError, match="official run refused: run.duration_s: "):
            Config.parse(tree).check_official()
    # Run to its end: a round limit that stops it early leaves a result of another length.
    base = dict(dataset="imagenet", dataset_official=True, fixed_changes=[],
                precisions=["bf16"], error=0.2)
    _, valid, found = violations(**base, elapsed_s=duration, duration_s=duration)
    assert valid == (problem is None), found
    _, valid, found = violations(**base, elapsed_s=7200 - 61, duration_s=7200)
    assert not valid and "ran 7,139 s of its 7,200" in found[0]["detail"]
    assert violations(**base, elapsed_s=7200 - 59, duration_s=7200)[1]
    assert violations(**base, elapsed_s=7199, duration_s=7199,
                      ruleset=rules.AIPERF_2021_3)[1]  # 2021.3 keeps its rule


def test_a_seed_is_drawn_by_an_official_run_and_recorded():
    """A site cannot keep the best of several chosen seeds: an official configuration names
    none, the run draws one, and its replicas read the one it recorded."""
    official = Config.parse({"run": {"official": True}})
    assert official.run.seed is None and official.fixed_changes() == []
    drawn = {official.new_seed() for _ in range(8)}
    assert len(drawn) > 1 and all(0 <= s < 2**31 for s in drawn)
    assert Config.for_dataset("builtin").new_seed() == 0  # other runs repeat
    assert Config.parse({"run": {"seed": 7, "official": False}}).new_seed() == 7
    assert official.seed_used({"seed": 1234}) == 1234 and official.seed_used() == 0
    chosen = Config.parse({"run": {"official": True, "seed": 7}})
    assert chosen.fixed_changes() == ["run.seed = 7 (official: unset: the run draws its own)"]
    with pytest.raises(ConfigError, match="run.seed = 7"):
        chosen.check_official()


def test_the_configuration_page_says_exactly_what_the_ruleset_fixes():
    """docs/configuration.md's table names every setting the current ruleset fixes as fixed,
    and none that it leaves to the site."""
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
    settings = Config().settings()
    fixed_rows, open_rows = set(), set()
    for line in page.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`["):
            continue
        section = cells[0].strip("`[]")
        names = set()
        for key in re.findall(r"`([a-z_*]+)`", cells[1]):
            names |= {n for n in settings if re.fullmatch(
                re.escape(f"{section}.{key}").replace(r"\*", ".*"), n)}
        assert names, f"no setting in {line!r}"
        if cells[3].startswith("fixed"):
            fixed_rows |= names
        elif cells[3].startswith("customisable"):
            open_rows |= names
    assert fixed_rows <= set(FIXED), fixed_rows - set(FIXED)
    assert not open_rows & set(FIXED), open_rows & set(FIXED)
    assert set(FIXED) <= fixed_rows, set(FIXED) - fixed_rows
