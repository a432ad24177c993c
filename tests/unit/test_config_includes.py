"""``include:`` (shared bases merged under a config's own keys) and ``${env:NAME}`` values."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.config import dump_config, load_config, parse_config
from mxtrain.config.includes import MAX_INCLUDED_FILES
from mxtrain.errors import ConfigError

BASE = """\
model:
  name: lstm_lm
  num_hidden: 64
  num_layers: 2
data:
  train:
    iterator: bucket_sentence
    source: train.txt
    batch_size: 8
    buckets: [5, 10]
optimizer:
  name: sgd
  learning_rate: 0.1
  lr_scheduler: {type: factor, step: 100, factor: 0.5}
fit:
  num_epoch: 3
  metrics: [perplexity, accuracy]
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def fails(path: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


def test_an_included_base_is_merged_under_the_files_own_keys(tmp_path: Path) -> None:
    write(tmp_path, "base.yaml", BASE)
    path = write(
        tmp_path,
        "exp.yaml",
        """\
        include: base.yaml
        model: {num_hidden: 128}          # merged: num_layers and name stay the base's
        data: {train: {buckets: [20]}}    # a list replaces the base's list
        optimizer: {lr_scheduler: null}   # null replaces the base's mapping
        """,
    )
    config = load_config(path)
    assert config.model.name == "lstm_lm"
    assert (config.model.options.num_hidden, config.model.options.num_layers) == (128, 2)
    assert config.data.train.options.buckets == [20]
    assert config.data.train.options.batch_size == 8
    assert config.optimizer.lr_scheduler is None and config.fit.num_epoch == 3
    # the file's name names the experiment, not the base's; paths stay relative to the file run
    assert config.experiment.name == "exp"
    assert config.resolve_path("train.txt") == tmp_path / "train.txt"
    # the run folder keeps the resolved config: no include, equal when read back elsewhere
    dumped = dump_config(config)
    assert "\ninclude:" not in dumped
    again = parse_config(dumped, source="<dump>", base_dir=tmp_path)
    assert again == config


def test_includes_are_relative_to_the_including_file_and_merge_in_order(tmp_path: Path) -> None:
    write(tmp_path, "bases/model.yaml", "include: ../core/base.yaml\nmodel: {num_layers: 3}\n")
    write(tmp_path, "core/base.yaml", BASE)
    write(tmp_path, "bases/sgd.yaml", "optimizer: {learning_rate: 0.5}\nmodel: {num_layers: 4}\n")
    path = write(tmp_path, "exp.yaml", "include: [bases/model.yaml, bases/sgd.yaml]\n")
    config = load_config(path)
    assert config.model.options.num_layers == 4  # the later include wins
    assert config.optimizer.learning_rate == 0.5
    assert config.model.options.num_hidden == 64  # from the base of a base


def test_an_error_in_an_included_value_names_the_included_file_and_line(tmp_path: Path) -> None:
    base = write(tmp_path, "base.yaml", BASE.replace("num_hidden: 64", "num_hidden: -3"))
    path = write(tmp_path, "exp.yaml", "include: base.yaml\nfit: {num_epoch: 2}\n")
    message = fails(path)
    assert message.startswith(f"{base.resolve()}:3:") and "num_hidden" in message
    # the including file's own value is reported at its own line
    bad = write(tmp_path, "bad.yaml", "include: base.yaml\nmodel: {num_hidden: -4}\n")
    assert fails(bad).startswith(f"{bad}:2:")
    # an override names the --set
    good = write(tmp_path, "good.yaml", "include: base.yaml\nmodel: {num_hidden: 8}\n")
    assert fails(good, "model.num_layers=0").startswith("--set model.num_layers=0")


@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({"exp.yaml": "include: exp.yaml\n"}, "exp.yaml -> exp.yaml"),
        (
            {"exp.yaml": "include: a.yaml\n", "a.yaml": "include: b.yaml\n",
             "b.yaml": "include: a.yaml\n"},
            "a.yaml -> b.yaml -> a.yaml",
        ),
        ({"exp.yaml": "include: [base.yaml, missing.yaml]\n"}, "missing.yaml is not a file"),
        ({"exp.yaml": "include: {file: base.yaml}\n"}, "expected a file path or a list"),
        ({"exp.yaml": "include: [base.yaml, 3]\n"}, "got 3 (int)"),
    ],
)  # fmt: skip
def test_loops_missing_files_and_bad_entries_are_refused_at_the_include(
    tmp_path: Path, files: dict[str, str], says: str
) -> None:
    write(tmp_path, "base.yaml", BASE)
    for name, text in files.items():
        write(tmp_path, name, text)
    message = fails(tmp_path / "exp.yaml")
    assert says in message
    assert "exp.yaml:1" in message or "a.yaml:1" in message or "b.yaml:1" in message


def test_too_many_included_files_are_refused(tmp_path: Path) -> None:
    for i in range(MAX_INCLUDED_FILES + 1):
        write(
            tmp_path, f"b{i}.yaml", f"include: b{i + 1}.yaml\n" if i < MAX_INCLUDED_FILES else BASE
        )
    path = write(tmp_path, "exp.yaml", "include: b0.yaml\n")
    assert f"more than {MAX_INCLUDED_FILES} included files" in fails(path)


def test_an_included_file_must_hold_a_mapping(tmp_path: Path) -> None:
    listed = write(tmp_path, "list.yaml", "- a\n- b\n")
    write(tmp_path, "empty.yaml", "")
    path = write(tmp_path, "exp.yaml", "include: [empty.yaml, list.yaml]\n")
    assert fails(path).startswith(f"{listed.resolve()}:1: the top level must be a mapping")


def test_env_references_are_read_typed_when_they_are_the_whole_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MXT_DATA", "corpus")
    monkeypatch.setenv("MXT_LR", "0.25")
    monkeypatch.delenv("MXT_UNSET", raising=False)
    write(tmp_path, "base.yaml", BASE)
    path = write(
        tmp_path,
        "exp.yaml",
        """\
        include: base.yaml
        data: {train: {source: "${env:MXT_DATA}/train.txt"}}
        optimizer:
          learning_rate: ${env:MXT_LR}
        fit:
          num_epoch: ${env:MXT_UNSET,7}
        experiment: {name: '${env:MXT_LR}', runs_dir: "runs-$${env:MXT_LR}"}
        """,
    )
    config = load_config(path)
    assert config.data.train.options.source == "corpus/train.txt"
    assert config.optimizer.learning_rate == 0.25 and config.fit.num_epoch == 7
    assert config.experiment.name == "0.25"  # quoted: stays text
    assert str(config.experiment.runs_dir).endswith("runs-${env:MXT_LR}")  # $${ is a literal ${
    # a run folder's config.yaml reads back as it was, the literal kept literal
    monkeypatch.setenv("MXT_LR", "9")
    assert parse_config(dump_config(config), source="<dump>", base_dir=tmp_path) == config


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("${env:MXT_UNSET}", "the environment variable MXT_UNSET is not set"),
        ("${model.num_hidden}", "is not a reference mxtrain knows"),
        ("${env:2BAD}", "is not a reference mxtrain knows"),
    ],
)
def test_unset_variables_and_other_references_fail_at_their_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, says: str
) -> None:
    monkeypatch.delenv("MXT_UNSET", raising=False)
    write(tmp_path, "base.yaml", BASE)
    path = write(tmp_path, "exp.yaml", f"include: base.yaml\nfit:\n  num_epoch: {value}\n")
    message = fails(path)
    assert message.startswith(f"{path}:3:") and says in message
    assert fails(path.with_name("base.yaml"), f"fit.num_epoch={value}").startswith("--set")


def test_check_prints_the_resolved_config_and_explain_says_where_each_value_came_from(
    tmp_path: Path,
) -> None:
    base = write(tmp_path, "base.yaml", BASE).resolve()
    path = write(tmp_path, "exp.yaml", "include: base.yaml\nmodel: {num_hidden: 32}\n")
    runner = CliRunner()
    shown = runner.invoke(cli, ["check", str(path)])
    assert shown.exit_code == 0, shown.output
    assert "\ninclude:" not in shown.output and "num_hidden: 32" in shown.output
    explained = runner.invoke(cli, ["check", str(path), "--explain", "--set", "fit.num_epoch=5"])
    assert explained.exit_code == 0, explained.output
    lines = explained.output.splitlines()

    def origin(key: str) -> str:
        return next(line for line in lines if line.startswith(key + " ")).rsplit("from ", 1)[1]

    assert origin("model.num_hidden") == f"{path}:2"
    assert origin("model.num_layers") == f"{base}:4"
    assert origin("fit.num_epoch") == "--set fit.num_epoch=5"
    assert origin("fit.log_interval") == "default"


# --------------------------------------------------------------------------------------------
# A schedule's horizon follows the run (issue 31, must 4)
# --------------------------------------------------------------------------------------------

COSINE = BASE.replace(
    "lr_scheduler: {type: factor, step: 100, factor: 0.5}",
    "lr_scheduler:\n    type: cosine\n    unit: epochs\n    max_update: null\n    final_lr: 0.0",
)


def test_a_cosine_without_max_update_ends_with_the_run(tmp_path: Path) -> None:
    path = write(tmp_path, "cosine.yaml", COSINE)
    assert load_config(path).optimizer.lr_scheduler.max_update == 3  # fit.num_epoch
    shorter = load_config(path, ["fit.num_epoch=2"])
    assert shorter.optimizer.lr_scheduler.max_update == 2 and not shorter.notes
    assert "max_update: 2" in dump_config(shorter)  # the run folder keeps the horizon it ran


def test_a_horizon_of_updates_cannot_follow_the_run_and_says_so(tmp_path: Path) -> None:
    path = write(tmp_path, "cosine.yaml", COSINE.replace("    unit: epochs\n", ""))
    message = fails(path)
    assert message.startswith(f"{path}:16:") and "add unit: epochs" in message.lower()


def test_a_horizon_other_than_the_runs_length_is_noted_by_check(tmp_path: Path) -> None:
    path = write(tmp_path, "cosine.yaml", COSINE.replace("max_update: null", "max_update: 12"))
    config = load_config(path, ["fit.num_epoch=2"])
    assert config.optimizer.lr_scheduler.max_update == 12
    (note,) = config.notes
    assert note.startswith(f"{path}:17:") and "epoch 12, after the run's last" in note
    result = CliRunner().invoke(cli, ["check", str(path), "--set", "fit.num_epoch=2"])
    assert result.exit_code == 0 and "note: " in result.output  # CliRunner mixes stderr in
    assert load_config(path, ["fit.num_epoch=12"]).notes == ()


# --------------------------------------------------------------------------------------------
# lr_scheduler type plateau: what check refuses (the schedule itself: test_plateau_schedule)
# --------------------------------------------------------------------------------------------

WITH_EVAL = BASE.replace(
    "    buckets: [5, 10]\n",
    "    buckets: [5, 10]\n  eval:\n    iterator: bucket_sentence\n    source: valid.txt\n",
)


@pytest.mark.parametrize(
    ("scheduler", "text", "says"),
    [
        ("{type: plateau}", WITH_EVAL, "'plateau' needs lr_scheduler.metric"),
        ("{type: plateau, metric: bleu}", WITH_EVAL, "'bleu' is not one of fit.metrics"),
        ("{type: plateau, metric: perplexity}", BASE, "needs evaluation data"),
        ("{type: plateau, metric: perplexity, factor: 1}", WITH_EVAL, "must be in (0, 1)"),
        ("{type: plateau, metric: perplexity, patience: -1}", WITH_EVAL, "patience must be"),
        ("{type: factor, step: 10, patience: 3}", WITH_EVAL, "does not apply to type 'factor'"),
    ],
)
def test_plateau_schedules_are_checked(
    tmp_path: Path, scheduler: str, text: str, says: str
) -> None:
    path = write(tmp_path, "plateau.yaml", text)
    assert says in fails(path, f"optimizer.lr_scheduler={scheduler}")


def test_a_plateau_schedule_with_its_options_passes_check(tmp_path: Path) -> None:
    path = write(tmp_path, "plateau.yaml", WITH_EVAL)
    scheduler = "{type: plateau, metric: perplexity, factor: 0.3, patience: 1, cooldown: 2}"
    sched = load_config(path, [f"optimizer.lr_scheduler={scheduler}"]).optimizer.lr_scheduler
    assert (sched.metric, sched.factor, sched.patience, sched.cooldown) == (
        "perplexity",
        0.3,
        1,
        2,
    )
