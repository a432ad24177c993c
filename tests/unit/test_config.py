"""The config layer: YAML -> Config, every error with file:line, overrides, dump, explain."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

import mxtrain
from mxtrain.config import Config, Registries, load_config, parse_config
from mxtrain.config.loader import config_to_dict, dump_config, explain_config
from mxtrain.config.resume_policy import may_change
from mxtrain.config.schema import (
    INITIALIZERS,
    OPTIMIZERS,
    REQUIRED,
    ContextSection,
    LrSchedulerSection,
    OptimizerSection,
)
from mxtrain.errors import ConfigError, ExitCode, InvalidValue
from mxtrain.registry import Registry

# --------------------------------------------------------------------------------------------
# Test-local components: options dataclasses shaped like the real ones
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TinyModelOptions:
    num_hidden: int = field(default=200, metadata={"doc": "hidden units per layer"})
    num_layers: int = field(default=2, metadata={"doc": "stacked layers"})
    dropout: float = field(default=0.0, metadata={"doc": "dropout between layers"})
    cell: Literal["auto", "fused", "unfused"] = field(default="auto", metadata={"doc": "cell"})
    ignore_padding: bool = field(default=True, metadata={"doc": "skip padding in the loss"})

    def __post_init__(self) -> None:
        if not 0 <= self.dropout < 1:
            raise InvalidValue("dropout", f"must be in [0, 1), not {self.dropout}")
        if self.num_hidden == 13:  # a plain ValueError (a plugin's) names the section
            raise ValueError("thirteen hidden units are unlucky")


@dataclass(frozen=True)
class TinyIterOptions:
    source: str = field(metadata={"doc": "text file"})
    batch_size: int = field(default=32, metadata={"doc": "sentences per batch"})
    buckets: list[int] | Literal["auto"] = field(default="auto", metadata={"doc": "lengths"})
    shuffle: bool = field(default=True, metadata={"doc": "shuffle"})
    max_vocab: int | None = field(default=None, metadata={"doc": "largest vocabulary"})
    # like every built-in iterator that dist_* kvstores can shard (FULL uses dist_sync)
    num_parts: int = field(default=1, metadata={"doc": "parts the data is split into"})
    part_index: int = field(default=0, metadata={"doc": "which part this worker reads"})

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise InvalidValue("batch_size", f"must be a positive integer, not {self.batch_size}")


def tiny_model(**options: Any) -> None:  # factories are never called by the config layer
    raise AssertionError


def tiny_metric() -> None:
    raise AssertionError


def _registries() -> Registries:
    models = Registry("model")
    models.register("tiny", f"{__name__}:tiny_model", options=f"{__name__}:TinyModelOptions")
    iterators = Registry("iterator")
    iterators.register("tiny_iter", f"{__name__}:tiny_model", options=f"{__name__}:TinyIterOptions")
    metrics = Registry("metric")
    metrics.register("perplexity", f"{__name__}:tiny_metric")
    metrics.register("accuracy", f"{__name__}:tiny_metric")
    return Registries(models=models, iterators=iterators, metrics=metrics)


REG = _registries()

BASE = """\
experiment:
  seed: 3
model:
  name: tiny
  num_hidden: 300
data:
  train:
    iterator: tiny_iter
    source: train.txt
"""


def write(folder: Path, text: str, name: str = "ptb.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load(folder: Path, text: str, overrides: tuple[str, ...] = (), **kw: Any) -> Config:
    return load_config(write(folder, text), overrides, registries=REG, **kw)


def error(folder: Path, text: str, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(ConfigError) as info:
        load(folder, text, overrides)
    assert info.value.exit_code == ExitCode.CONFIG
    message = str(info.value)
    assert "\n" not in message  # one paragraph
    return message


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line of the nth line of ``text`` that contains ``needle``."""
    hits = [i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if needle in line]
    return hits[nth - 1]


# --------------------------------------------------------------------------------------------
# Resolution and defaults
# --------------------------------------------------------------------------------------------


def test_minimal_config_fills_every_default(tmp_path: Path) -> None:
    config = load(tmp_path, BASE)
    assert config.source == str(tmp_path / "ptb.yaml")
    assert config.base_dir == tmp_path
    assert config.experiment.name == "ptb"  # the file's stem
    assert config.experiment.seed == 3
    assert config.model.name == "tiny"
    assert config.model.options == TinyModelOptions(num_hidden=300)
    assert config.data.train.name == "tiny_iter"
    assert config.data.train.options == TinyIterOptions(source="train.txt")
    assert config.data.eval is None
    assert config.context == ContextSection()
    assert config.kvstore.type == "local"
    assert config.kvstore.update_on_kvstore == "auto"
    assert config.optimizer.name == "sgd"
    assert config.optimizer.learning_rate == 0.01
    assert dict(config.optimizer.params) == {
        "momentum": 0.0,
        "lazy_update": True,
        "multi_precision": False,
    }
    assert config.optimizer.lr_scheduler is None
    assert config.initializer.name == "xavier"
    assert dict(config.initializer.params) == {
        "rnd_type": "uniform",
        "factor_type": "avg",
        "magnitude": 3.0,
    }
    assert config.fit.metrics == ("perplexity",)
    assert config.fit.num_epoch == 10
    assert config.checkpoint.prefix == "model"
    assert config.resolve_path("train.txt") == tmp_path / "train.txt"


def test_config_is_frozen(tmp_path: Path) -> None:
    config = load(tmp_path, BASE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.fit = None  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.optimizer.params["momentum"] = 1.0  # type: ignore[index]


def test_learning_rate_defaults_to_the_optimizers_own(tmp_path: Path) -> None:
    assert load(tmp_path, BASE + "optimizer: {name: adam}\n").optimizer.learning_rate == 0.001
    assert load(tmp_path, BASE + "optimizer: {name: ftrl}\n").optimizer.learning_rate == 0.1
    config = load(tmp_path, BASE + "optimizer: {name: adam, learning_rate: 0.1, beta1: 0.8}\n")
    assert config.optimizer.learning_rate == 0.1
    assert config.optimizer.params["beta1"] == 0.8
    assert config.optimizer.params["beta2"] == 0.999


def test_yaml_12_scalars(tmp_path: Path) -> None:
    text = BASE + textwrap.dedent(
        """\
        optimizer: {learning_rate: 1e-3, wd: 0}
        checkpoint: {prefix: no}
        kvstore: {update_on_kvstore: false}
        """
    )
    config = load(tmp_path, text)
    assert config.optimizer.learning_rate == 0.001  # PyYAML's YAML 1.1 would give a string
    assert config.optimizer.wd == 0.0 and isinstance(config.optimizer.wd, float)
    assert config.checkpoint.prefix == "no"  # not False
    assert config.kvstore.update_on_kvstore is False


def test_integral_float_accepted_for_int(tmp_path: Path) -> None:
    assert load(tmp_path, BASE + "fit: {num_epoch: 3.0}\n").fit.num_epoch == 3


def test_anchors_and_merge_keys(tmp_path: Path) -> None:
    text = BASE.replace("  train:\n", "  train: &train\n")
    text += "  eval:\n    <<: *train\n    source: valid.txt\n"
    config = load(tmp_path, text)
    assert config.data.eval is not None
    assert config.data.eval.options == TinyIterOptions(source="valid.txt")


# --------------------------------------------------------------------------------------------
# File-level errors
# --------------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .*nope\.yaml does not exist"):
        load_config(tmp_path / "nope.yaml", registries=REG)


def test_folder_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory, not a file"):
        load_config(tmp_path, registries=REG)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "ptb.yaml"
    path.write_bytes(b"model: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"ptb\.yaml is not UTF-8"):
        load_config(path, registries=REG)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    message = error(tmp_path, text)
    assert "ptb.yaml is empty" in message
    assert "data.train" in message


def test_top_level_not_a_mapping(tmp_path: Path) -> None:
    message = error(tmp_path, "- model\n- data\n")
    assert "ptb.yaml:1: the top level must be a mapping of sections" in message
    assert "got [" in message and "(list)" in message


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    text = BASE + "fit:\n  num_epoch: [1, 2\n  prefetch: 2\n"
    message = error(tmp_path, text)
    assert message.startswith("ptb.yaml:") or "/ptb.yaml:" in message
    assert f"ptb.yaml:{line_of(text, 'prefetch')}:" in message
    assert "invalid YAML" in message
    assert "flow sequence" in message


def test_bad_indentation_syntax_error(tmp_path: Path) -> None:
    message = error(tmp_path, "model:\n  name: tiny\n   num_hidden: 3\n")
    assert "ptb.yaml:3:" in message and "invalid YAML" in message


def test_duplicate_keys_name_both_lines(tmp_path: Path) -> None:
    text = BASE + "optimizer:\n  learning_rate: 0.1\n  wd: 0.0\n  learning_rate: 0.2\n"
    message = error(tmp_path, text)
    first = line_of(text, "learning_rate: 0.1")
    second = line_of(text, "learning_rate: 0.2")
    assert f"ptb.yaml:{second}: duplicate key 'optimizer.learning_rate'" in message
    assert f"first set at line {first}" in message
    assert "remove one" in message


def test_duplicate_top_level_section(tmp_path: Path) -> None:
    text = BASE + "fit: {num_epoch: 1}\nfit: {num_epoch: 2}\n"
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'fit:', 2)}: duplicate key 'fit'" in message
    assert f"first set at line {line_of(text, 'fit:')}" in message


def test_python_tags_are_refused(tmp_path: Path) -> None:
    text = BASE + "experiment2: !!python/object/apply:os.system ['echo hi']\n"
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'experiment2')}: unsupported YAML tag" in message


def test_non_string_key(tmp_path: Path) -> None:
    text = BASE + "fit:\n  1: 2\n"
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, '1: 2')}: keys must be strings, got 1 (int)" in message


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    text = BASE + "fit: &a\n  metrics: *a\n"
    assert "refers to itself" in error(tmp_path, text)


# --------------------------------------------------------------------------------------------
# Unknown keys, at every level
# --------------------------------------------------------------------------------------------

UNKNOWN_KEYS = [
    # (snippet appended to BASE, dotted key, suggestion, section named in "Valid keys in")
    ("optmizer:\n  name: sgd\n", "optmizer", "optimizer", "at the top level"),
    ("experiment2: 1\n", "experiment2", "experiment", "at the top level"),
    ("fit:\n  num_epochs: 3\n", "fit.num_epochs", "num_epoch", "in 'fit'"),
    ("context:\n  device: gpu\n", "context.device", "devices", "in 'context'"),
    ("kvstore:\n  typ: device\n", "kvstore.typ", "type", "in 'kvstore'"),
    ("checkpoint:\n  perod: 2\n", "checkpoint.perod", "period", "in 'checkpoint'"),
    (
        "optimizer:\n  learnin_rate: 0.1\n",
        "optimizer.learnin_rate",
        "learning_rate",
        "in 'optimizer'",
    ),
    ("optimizer:\n  momentun: 0.9\n", "optimizer.momentun", "momentum", "in 'optimizer'"),
    (
        "optimizer:\n  lr_scheduler:\n    type: factor\n    stepp: 10\n",
        "optimizer.lr_scheduler.stepp",
        "step",
        "in 'optimizer.lr_scheduler'",
    ),
    ("initializer:\n  magnitud: 2\n", "initializer.magnitud", "magnitude", "in 'initializer'"),
]


@pytest.mark.parametrize(("snippet", "key", "suggestion", "section"), UNKNOWN_KEYS)
def test_unknown_key(tmp_path: Path, snippet: str, key: str, suggestion: str, section: str) -> None:
    text = BASE + snippet
    message = error(tmp_path, text)
    line = line_of(text, key.rsplit(".", 1)[-1] + ":")
    assert f"ptb.yaml:{line}: unknown key '{key}'." in message
    assert f"Did you mean '{suggestion}'?" in message
    assert f"Valid keys {section}:" in message


def test_unknown_key_in_model_options(tmp_path: Path) -> None:
    text = BASE.replace("  num_hidden: 300\n", "  num_hidden: 300\n  num_layer: 3\n")
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'num_layer:')}: unknown key 'model.num_layer'." in message
    assert "Did you mean 'num_layers'?" in message
    assert "Valid keys in 'model': name, num_hidden, num_layers, dropout" in message


def test_unknown_key_in_iterator_options(tmp_path: Path) -> None:
    text = BASE + "    batch_sise: 3\n"
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'batch_sise')}: unknown key 'data.train.batch_sise'" in message
    assert "Did you mean 'batch_size'?" in message
    assert "Valid keys in 'data.train': iterator, source, batch_size" in message


def test_unknown_key_in_data(tmp_path: Path) -> None:
    text = BASE + "  evaluate:\n    source: x\n"
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'evaluate')}: unknown key 'data.evaluate'" in message
    assert "Valid keys in 'data': train, eval" in message


def test_parameter_of_another_optimizer(tmp_path: Path) -> None:
    text = BASE + "optimizer:\n  name: sgd\n  beta1: 0.9\n"
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'beta1')}: unknown key 'optimizer.beta1'" in message
    assert "'beta1' is a parameter of" in message and "adam" in message
    assert "not of sgd" in message


def test_parameter_of_another_initializer(tmp_path: Path) -> None:
    text = BASE + "initializer:\n  name: normal\n  scale: 0.1\n"
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'scale')}: unknown key 'initializer.scale'" in message
    assert "'scale' is a parameter of uniform, orthogonal, not of normal" in message
    assert "Valid keys in 'initializer': name, overrides, from, sigma" in message


# --------------------------------------------------------------------------------------------
# Types and choices
# --------------------------------------------------------------------------------------------

TYPE_ERRORS = [
    # (file text, needle on the line, expected message fragment)
    (
        BASE.replace("num_hidden: 300", "num_hidden: abc"),
        "num_hidden",
        "model.num_hidden must be an integer, got 'abc' (str).",
    ),
    (
        BASE.replace("num_hidden: 300", "num_hidden: true"),
        "num_hidden",
        "model.num_hidden must be an integer, got true (bool).",
    ),
    (
        BASE.replace("num_hidden: 300", "num_hidden: 2.5"),
        "num_hidden",
        "model.num_hidden must be an integer, got 2.5 (float).",
    ),
    (
        BASE.replace("num_hidden: 300", "num_hidden: '300'"),
        "num_hidden",
        "model.num_hidden must be an integer, got '300' (str).",
    ),
    (
        BASE + "    shuffle: yes\n",
        "shuffle",
        "data.train.shuffle must be true or false, got 'yes' (str). Write true or false",
    ),
    (
        BASE + "    shuffle: 'true'\n",
        "shuffle",
        "data.train.shuffle must be true or false, got 'true' (str).",
    ),
    (
        BASE + "    buckets: [10, x, 30]\n",
        "buckets",
        "data.train.buckets[1] must be an integer, got 'x' (str).",
    ),
    (
        BASE + "    buckets: sometimes\n",
        "buckets",
        "data.train.buckets must be a list of integers or 'auto', got 'sometimes' (str).",
    ),
    (
        BASE + "    max_vocab: lots\n",
        "max_vocab",
        "data.train.max_vocab must be an integer or null, got 'lots' (str).",
    ),
    (
        BASE + "optimizer:\n  learning_rate: fast\n",
        "learning_rate",
        "optimizer.learning_rate must be a number, got 'fast' (str).",
    ),
    (
        BASE + "optimizer:\n  learning_rate: true\n",
        "learning_rate",
        "optimizer.learning_rate must be a number, got true (bool).",
    ),
    (
        BASE + "optimizer:\n  rescale_grad: half\n",
        "rescale_grad",
        "optimizer.rescale_grad must be a number or 'auto', got 'half' (str).",
    ),
    (
        BASE + "context:\n  omp_threads: atuo\n",
        "omp_threads",
        "context.omp_threads must be an integer or 'auto', got 'atuo' (str). Did you mean 'auto'?",
    ),
    (
        BASE + "context:\n  ids: 0\n",
        "ids",
        "context.ids must be a list of integers or null, got 0 (int).",
    ),
    (
        BASE + "experiment:\n  name: 12\n",
        "name: 12",
        "experiment.name must be a string, got 12 (int). Put it in quotes",
    ),
    (
        BASE + "fit: 3\n",
        "fit: 3",
        "fit must be a mapping of keys to values, got 3 (int).",
    ),
    (
        BASE + "fit:\n  metrics: perplexity\n",
        "metrics",
        "fit.metrics must be a list of strings, got 'perplexity' (str).",
    ),
]


@pytest.mark.parametrize(("text", "needle", "expected"), TYPE_ERRORS)
def test_type_error(tmp_path: Path, text: str, needle: str, expected: str) -> None:
    if text.count("experiment:") == 2:  # duplicate section: keep the test about types
        text = text.replace("experiment:\n  seed: 3\n", "", 1)
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, needle)}: {expected}" in message


CHOICE_ERRORS = [
    (
        BASE + "context:\n  devices: tpu\n",
        "devices",
        "context.devices must be one of 'cpu', 'gpu', got 'tpu' (str).",
        None,
    ),
    (
        BASE + "kvstore:\n  type: dist_snyc\n",
        "type",
        "kvstore.type must be one of 'local', 'device', 'nccl', 'dist_sync'",
        "Did you mean 'dist_sync'?",
    ),
    (
        BASE.replace("num_hidden: 300", "cell: fuse"),
        "cell",
        "model.cell must be one of 'auto', 'fused', 'unfused', got 'fuse' (str).",
        "Did you mean 'fused'?",
    ),
    (
        BASE + "optimizer:\n  name: adamm\n",
        "adamm",
        "unknown optimizer 'adamm' in optimizer.name.",
        "Did you mean 'adam'? MXNet optimizers: sgd, nag",
    ),
    (
        BASE + "initializer:\n  name: xavir\n",
        "xavir",
        "unknown initializer 'xavir' in initializer.name.",
        "Did you mean 'xavier'? MXNet initializers: xavier, uniform",
    ),
    (
        BASE + "initializer:\n  rnd_type: normal\n",
        "rnd_type",
        "initializer.rnd_type must be one of 'uniform', 'gaussian', got 'normal' (str).",
        None,
    ),
    (
        BASE + "optimizer:\n  lr_scheduler: {type: linear, step: 3}\n",
        "lr_scheduler",
        "optimizer.lr_scheduler.type must be one of 'factor', 'multifactor', 'poly', 'cosine'",
        None,
    ),
]


@pytest.mark.parametrize(("text", "needle", "expected", "hint"), CHOICE_ERRORS)
def test_bad_choice(
    tmp_path: Path, text: str, needle: str, expected: str, hint: str | None
) -> None:
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, needle)}: {expected}" in message
    if hint:
        assert hint in message


# --------------------------------------------------------------------------------------------
# Required keys, value checks
# --------------------------------------------------------------------------------------------


def test_missing_data_section(tmp_path: Path) -> None:
    message = error(tmp_path, "model:\n  name: tiny\n")
    assert "ptb.yaml: the config has no data section; data.train is required." in message


def test_missing_data_train(tmp_path: Path) -> None:
    text = "model:\n  name: tiny\ndata:\n  eval:\n    iterator: tiny_iter\n    source: v.txt\n"
    message = error(tmp_path, text)
    assert "ptb.yaml:3: data.train is required" in message


def test_missing_required_option(tmp_path: Path) -> None:
    text = BASE.replace("    source: train.txt\n", "    batch_size: 4\n")
    message = error(tmp_path, text)
    line = line_of(text, "train:")
    assert (
        f"ptb.yaml:{line}: data.train is missing the required key 'source' (text file)." in message
    )
    assert "Add source: ... to data.train." in message


def test_missing_scheduler_type(tmp_path: Path) -> None:
    text = BASE + "optimizer:\n  lr_scheduler:\n    step: 10\n"
    message = error(tmp_path, text)
    line = line_of(text, "lr_scheduler")
    assert f"ptb.yaml:{line}: optimizer.lr_scheduler is missing the required key 'type'" in message


def test_options_value_error_points_at_the_key(tmp_path: Path) -> None:
    text = BASE.replace("num_hidden: 300", "num_hidden: 300\n  dropout: 1.5")
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'dropout')}: model.dropout must be in [0, 1), not 1.5." in (
        message
    )


def test_options_value_error_without_key_points_at_section(tmp_path: Path) -> None:
    text = BASE.replace("num_hidden: 300", "num_hidden: 13")
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'model:')}: model: thirteen hidden units are unlucky." in (
        message
    )


def test_iterator_value_error(tmp_path: Path) -> None:
    text = BASE + "    batch_size: 0\n"
    message = error(tmp_path, text)
    assert (
        f"ptb.yaml:{line_of(text, 'batch_size')}: data.train.batch_size must be a positive "
        "integer, not 0." in message
    )


@pytest.mark.parametrize(
    ("snippet", "needle", "expected"),
    [
        ("fit:\n  num_epoch: 0\n", "num_epoch", "fit.num_epoch must be at least 1, got 0."),
        ("fit:\n  prefetch: -1\n", "prefetch", "fit.prefetch must be at least 0, got -1."),
        ("checkpoint:\n  period: 0\n", "period", "checkpoint.period must be at least 1, got 0."),
        ("checkpoint:\n  prefix: a/b\n", "prefix", "checkpoint.prefix must be a plain file name"),
        ("experiment:\n  name: a/b\n", "name: a/b", "experiment.name is used as a folder name"),
        ("optimizer:\n  learning_rate: 0\n", "learning_rate", "must be greater than 0, got 0.0."),
        ("optimizer:\n  wd: -0.1\n", "wd", "optimizer.wd must be at least 0, got -0.1."),
        ("fit:\n  metrics: [perplexity, perplexity]\n", "metrics", "lists 'perplexity' twice."),
        ("fit:\n  eval_metrics: [accuracy, accuracy]\n", "eval_metrics", "lists 'accuracy' twice"),
        (
            "fit:\n  fixed_params_exclude: [bias]\n",
            "fixed_params_exclude",
            "fit.fixed_params_exclude has no effect without fit.fixed_params",
        ),
        (
            "optimizer:\n  name: groupadagrad\n  wd: 0.1\n",
            "name: groupadagrad",
            "optimizer.name groupadagrad cannot be used: MXNet's groupadagrad only updates 2-D",
        ),
    ],
)
def test_value_checks(tmp_path: Path, snippet: str, needle: str, expected: str) -> None:
    text = BASE + snippet
    if snippet.startswith("experiment:"):
        text = text.replace("experiment:\n  seed: 3\n", "", 1)
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, needle)}: " in message
    assert expected in message


def test_metrics_checked_against_registry(tmp_path: Path) -> None:
    text = BASE + "fit:\n  metrics:\n    - perplexity\n    - acuracy\n"
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'acuracy')}: fit.metrics[1]: unknown metric 'acuracy'." in (
        message
    )
    assert "Did you mean 'accuracy'?" in message
    text = BASE + "fit:\n  eval_metrics:\n    - acuracy\n"
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'acuracy')}: fit.eval_metrics[0]: unknown metric" in message


def test_eval_metrics_default_to_fit_metrics(tmp_path: Path) -> None:
    config = load(tmp_path, BASE + "fit:\n  metrics: [accuracy]\n")
    assert config.fit.eval_metrics is None and config.fit.evaluation_metrics == ("accuracy",)
    config = load(tmp_path, BASE + "fit:\n  metrics: [accuracy]\n  eval_metrics: []\n")
    assert config.fit.evaluation_metrics == ()


# --------------------------------------------------------------------------------------------
# lr_scheduler cross-checks
# --------------------------------------------------------------------------------------------


def sched(body: str) -> str:
    return (
        BASE
        + "optimizer:\n  learning_rate: 0.1\n  lr_scheduler:\n"
        + textwrap.indent(textwrap.dedent(body), "    ")
    )


def test_scheduler_types_resolve(tmp_path: Path) -> None:
    config = load(tmp_path, sched("type: multifactor\nsteps: [100, 200]\nfactor: 0.5\n"))
    assert config.optimizer.lr_scheduler == LrSchedulerSection(
        type="multifactor", steps=(100, 200), factor=0.5
    )
    config = load(tmp_path, sched("type: cosine\nmax_update: 1000\nwarmup_steps: 10\n"))
    assert config.optimizer.lr_scheduler is not None
    assert config.optimizer.lr_scheduler.max_update == 1000


@pytest.mark.parametrize(
    ("body", "needle", "expected"),
    [
        (
            "type: factor\nfactor: 0.5\n",
            "type:",
            "optimizer.lr_scheduler.type 'factor' needs lr_scheduler.step",
        ),
        (
            "type: multifactor\n",
            "type:",
            "optimizer.lr_scheduler.type 'multifactor' needs lr_scheduler.steps",
        ),
        (
            "type: poly\n",
            "lr_scheduler:",
            "optimizer.lr_scheduler.max_update: null follows the run's length, which is known "
            "in epochs only",
        ),
        (
            "type: cosine\n",
            "lr_scheduler:",
            "optimizer.lr_scheduler.max_update: null follows the run's length, which is known "
            "in epochs only",
        ),
        (
            "type: multifactor\nsteps: [200, 100]\n",
            "steps:",
            "optimizer.lr_scheduler.steps must be increasing update counts",
        ),
        (
            "type: multifactor\nsteps: [0.5, 2]\n",
            "steps:",
            "optimizer.lr_scheduler.steps counts updates, so it must list whole numbers",
        ),
        (
            "type: multifactor\nsteps: [0, 2]\nunit: epochs\n",
            "steps:",
            "optimizer.lr_scheduler.steps must be increasing epoch counts (fractions allowed)",
        ),
        ("type: factor\nstep: 0\n", "step:", "optimizer.lr_scheduler.step must be at least 1"),
        (
            "type: factor\nstep: 10\nfactor: 2\n",
            "factor:",
            "optimizer.lr_scheduler.factor must be in (0, 1]",
        ),
        (
            "type: cosine\nmax_update: 100\nwarmup_steps: 100\n",
            "warmup_steps",
            "optimizer.lr_scheduler.warmup_steps (100) must be smaller than max_update (100)",
        ),
        (
            "type: factor\nstep: 10\nwarmup_begin_lr: 0.5\n",
            "warmup_begin_lr",
            "optimizer.lr_scheduler.warmup_begin_lr (0.5) must not exceed learning_rate (0.1)",
        ),
    ],
)
def test_scheduler_checks(tmp_path: Path, body: str, needle: str, expected: str) -> None:
    text = sched(body)
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, needle)}: {expected}" in message


def test_epoch_steps_keep_their_fractions_and_update_steps_stay_whole(tmp_path: Path) -> None:
    config = load(tmp_path, sched("type: multifactor\nsteps: [0.75, 3]\nunit: epochs\n"))
    assert config.optimizer.lr_scheduler.steps == (0.75, 3)
    again = load_config(write(tmp_path, dump_config(config), "again.yaml"), registries=REG)
    assert again == config
    config = load(tmp_path, sched("type: multifactor\nsteps: [100.0, 200]\n"))
    assert config.optimizer.lr_scheduler.steps == (100, 200)
    assert all(type(s) is int for s in config.optimizer.lr_scheduler.steps)


def test_scheduler_key_of_another_type(tmp_path: Path) -> None:
    text = sched("type: factor\nsteps: [10, 20]\n")
    message = error(tmp_path, text)
    assert (
        f"ptb.yaml:{line_of(text, 'steps')}: optimizer.lr_scheduler.steps does not apply to "
        "type 'factor' (it is used by multifactor)." in message
    )
    assert "Did you mean 'step'?" in message
    assert "'factor' requires step." in message


def test_scheduler_base_lr_is_the_learning_rate(tmp_path: Path) -> None:
    doc = dataclasses.fields(OptimizerSection)[1].metadata["doc"]
    assert "schedule's base lr" in doc
    assert "base lr IS ``optimizer.learning_rate``" in (LrSchedulerSection.__doc__ or "")


# --------------------------------------------------------------------------------------------
# context / kvstore cross-checks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("snippet", "needle", "expected"),
    [
        (
            "context:\n  devices: gpu\n  count: 2\n",
            "count",
            "context.count only applies to devices: cpu",
        ),
        (
            "context:\n  ids: [0, 1]\n  count: 2\n",
            "count",
            "context.count and context.ids cannot both be set",
        ),
        (
            "context:\n  devices: gpu\n  ids: [0, 1]\n  work_load: [1, 2, 3]\n",
            "work_load",
            "context.work_load needs one number per device: 2 device(s) are configured, "
            "got 3 number(s).",
        ),
        (
            "context:\n  work_load: [1, 1]\n",
            "work_load",
            "context.work_load needs one number per device: 1 device(s) are configured, got 2",
        ),
        ("context:\n  ids: [1, 1]\n", "ids", "context.ids lists a device twice: [1, 1]."),
        ("context:\n  count: 0\n", "count", "context.count must be at least 1, got 0."),
        (
            "kvstore:\n  type: dist_async\n  update_on_kvstore: false\n",
            "update_on_kvstore",
            "kvstore.update_on_kvstore cannot be false with kvstore.type dist_async",
        ),
        (
            "kvstore:\n  type: horovod\n  update_on_kvstore: true\n",
            "update_on_kvstore",
            "kvstore.update_on_kvstore cannot be true with kvstore.type horovod",
        ),
        (
            "kvstore:\n  type: nccl\n",
            "type: nccl",
            "kvstore.type nccl needs context.devices: gpu",
        ),
    ],
)
def test_context_checks(tmp_path: Path, snippet: str, needle: str, expected: str) -> None:
    text = BASE + snippet
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, needle)}: {expected}" in message


def test_context_valid_combinations(tmp_path: Path) -> None:
    config = load(tmp_path, BASE + "context:\n  count: 2\n  work_load: [1, 3]\n")
    assert config.context.num_devices == 2
    assert config.context.work_load == (1.0, 3.0)
    config = load(tmp_path, BASE + "context:\n  devices: gpu\n  ids: [0, 2]\nkvstore: {type: nccl}")
    assert config.context.ids == (0, 2)
    assert config.context.num_devices == 2


# --------------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------------


def test_overrides_are_typed(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        BASE,
        (
            "fit.num_epoch=2",
            "optimizer.learning_rate=1e-3",
            "data.train.shuffle=false",
            "experiment.name=my run",
            "model.cell=fused",
        ),
    )
    assert config.fit.num_epoch == 2
    assert config.optimizer.learning_rate == 0.001
    assert config.data.train.options.shuffle is False
    assert config.experiment.name == "my run"
    assert config.model.options.cell == "fused"


def test_override_lists_and_null(tmp_path: Path) -> None:
    text = BASE + "  eval:\n    iterator: tiny_iter\n    source: valid.txt\n"
    config = load(
        tmp_path,
        text,
        (
            "context.devices=gpu",
            "context.ids=[0,1]",
            "data.eval=null",
            "data.train.buckets=[5, 10]",
        ),
    )
    assert config.context.ids == (0, 1)
    assert config.data.eval is None
    assert config.data.train.options.buckets == [5, 10]


def test_override_creates_missing_sections(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        BASE,
        (
            "kvstore.type=device",
            "optimizer.lr_scheduler.type=factor",
            "optimizer.lr_scheduler.step=10",
            "data.eval.source=valid.txt",
            "data.eval.iterator=tiny_iter",
        ),
    )
    assert config.kvstore.type == "device"
    assert config.optimizer.lr_scheduler == LrSchedulerSection(type="factor", step=10)
    assert config.data.eval is not None
    assert config.data.eval.options.source == "valid.txt"


def test_override_replaces_a_whole_section(tmp_path: Path) -> None:
    text = BASE + "optimizer:\n  name: sgd\n  momentum: 0.9\n"
    config = load(tmp_path, text, ("optimizer={name: adam, beta1: 0.5}",))
    assert config.optimizer.name == "adam"
    assert config.optimizer.params["beta1"] == 0.5


def test_override_bad_key(tmp_path: Path) -> None:
    message = error(tmp_path, BASE, ("model.num_hiden=300",))
    assert message.startswith("--set model.num_hiden=300: unknown key 'model.num_hiden'.")
    assert "Did you mean 'num_hidden'?" in message


def test_override_bad_section(tmp_path: Path) -> None:
    message = error(tmp_path, BASE, ("optimiser.learning_rate=0.1",))
    assert message.startswith("--set optimiser.learning_rate=0.1: unknown key 'optimiser'.")
    assert "Did you mean 'optimizer'?" in message


def test_override_bad_value(tmp_path: Path) -> None:
    message = error(tmp_path, BASE, ("fit.num_epoch=two",))
    assert message.startswith("--set fit.num_epoch=two: fit.num_epoch must be an integer")
    assert "got 'two' (str)" in message


def test_override_bad_list_value(tmp_path: Path) -> None:
    message = error(tmp_path, BASE, ("context.ids=[0,x]",))
    assert message.startswith("--set context.ids=[0,x]: context.ids[1] must be an integer")


def test_override_invalid_yaml(tmp_path: Path) -> None:
    message = error(tmp_path, BASE, ("context.ids=[0,1",))
    assert message.startswith("--set context.ids=[0,1: column")
    assert "invalid YAML" in message


@pytest.mark.parametrize("text", ["fit.num_epoch", "=3", "fit..num_epoch=3", "fit.=3"])
def test_override_syntax(tmp_path: Path, text: str) -> None:
    message = error(tmp_path, BASE, (text,))
    assert message.startswith(f"--set {text}: expected KEY=VALUE")
    assert "--set fit.num_epoch=2" in message


def test_override_into_a_scalar(tmp_path: Path) -> None:
    message = error(tmp_path, BASE, ("experiment.seed.x=1",))
    assert "--set experiment.seed.x=1: 'experiment.seed' is 3 (int), not a section" in message


def test_overrides_apply_before_cross_checks(tmp_path: Path) -> None:
    text = BASE + "context:\n  devices: gpu\n  count: 2\n"
    assert "count" in error(tmp_path, text)
    config = load(tmp_path, text, ("context.count=null", "context.ids=[0,1]"))
    assert config.context.num_devices == 2
    message = error(tmp_path, text, ("context.count=null", "context.work_load=[1,2,3]"))
    assert message.startswith("--set context.work_load=[1,2,3]: context.work_load needs one")


def test_later_override_wins(tmp_path: Path) -> None:
    config = load(tmp_path, BASE, ("fit.num_epoch=2", "fit.num_epoch=5"))
    assert config.fit.num_epoch == 5


def test_parse_config_with_overrides(tmp_path: Path) -> None:
    config = parse_config(
        BASE, source="<string>", base_dir=tmp_path, overrides=("fit.num_epoch=1",), registries=REG
    )
    assert config.fit.num_epoch == 1
    assert config.experiment.name == "experiment"
    with pytest.raises(ConfigError, match=r"^<string>:5: model.num_hidden must be an integer"):
        parse_config(BASE.replace("300", "x"), source="<string>", base_dir=tmp_path, registries=REG)


# --------------------------------------------------------------------------------------------
# Components: registry names and plugins
# --------------------------------------------------------------------------------------------


def test_misspelled_model_name(tmp_path: Path) -> None:
    text = BASE.replace("name: tiny", "name: tyni")
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'tyni')}: model.name: unknown model 'tyni'." in message
    assert "Did you mean 'tiny'?" in message


def test_misspelled_iterator_name(tmp_path: Path) -> None:
    text = BASE.replace("iterator: tiny_iter", "iterator: tiny_itr")
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'tiny_itr')}: data.train.iterator: unknown iterator" in (
        message
    )
    assert "Did you mean 'tiny_iter'?" in message


PLUGIN = """\
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Options:
    width: int = field(default=8, metadata={"doc": "width of the thing"})
    label: str = "x"


def build_with_options(**kwargs):
    raise AssertionError


build_with_options.Options = Options


def build_plain(data_info, width=8, label="x"):
    raise AssertionError


def build_anything(**kwargs):
    raise AssertionError
"""


def plugin_text(name: str, extra: str = "") -> str:
    return BASE.replace("name: tiny\n  num_hidden: 300\n", f"name: {name}\n{extra}")


def test_plugin_by_file_relative_to_config_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf"
    (conf / "plugins").mkdir(parents=True)
    (conf / "plugins" / "mine.py").write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)  # not the config's folder
    config = load(conf, plugin_text("plugins/mine.py:build_with_options", "  width: 3\n"))
    assert config.model.name == "plugins/mine.py:build_with_options"
    assert dataclasses.is_dataclass(config.model.options)
    assert config.model.options.width == 3
    assert config.model.options.label == "x"
    message = error(conf, plugin_text("plugins/mine.py:build_with_options", "  widht: 3\n"))
    assert "ptb.yaml:5: unknown key 'model.widht'. Did you mean 'width'?" in message
    message = error(conf, plugin_text("plugins/mine.py:build_with_options", "  width: big\n"))
    assert "ptb.yaml:5: model.width must be an integer, got 'big' (str)." in message


def test_plugin_without_options_class(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(PLUGIN)
    config = load(tmp_path, plugin_text("mine.py:build_plain", "  width: 3\n"))
    assert dict(config.model.options) == {"width": 3}
    message = error(tmp_path, plugin_text("mine.py:build_plain", "  widht: 3\n"))
    assert "ptb.yaml:5: unknown key 'model.widht'. Did you mean 'width'?" in message
    assert "Valid keys in 'model': name, width, label." in message
    config = load(tmp_path, plugin_text("mine.py:build_anything", "  whatever: [1, 2]\n"))
    assert dict(config.model.options) == {"whatever": [1, 2]}


def test_plugin_by_module_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "site" / "cfgtest_plugins"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    config = load(tmp_path, plugin_text("cfgtest_plugins.models:build_with_options"))
    assert config.model.options.width == 8


def test_plugin_errors_name_the_line(tmp_path: Path) -> None:
    text = plugin_text("missing.py:build")
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'missing.py')}: model.name: model 'missing.py:build'" in (
        message
    )
    assert "does not exist" in message
    message = error(tmp_path, plugin_text("no_such_pkg_xyz.models:build"))
    assert "ptb.yaml:4: model.name:" in message and "cannot import module" in message


def test_plugin_metric(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(PLUGIN)
    config = load(tmp_path, BASE + "fit:\n  metrics: [perplexity, 'mine.py:build_plain']\n")
    assert config.fit.metrics == ("perplexity", "mine.py:build_plain")


# --------------------------------------------------------------------------------------------
# Dump, round trip, explain
# --------------------------------------------------------------------------------------------

FULL = BASE + textwrap.dedent(
    """\
      eval:
        iterator: tiny_iter
        source: valid.txt
        buckets: [10, 20]
    context: {devices: cpu, count: 2, work_load: [1, 2]}
    kvstore: {type: dist_sync, update_on_kvstore: false}
    optimizer:
      name: adam
      clip_gradient: 5
      lr_scheduler: {type: poly, max_update: 1000, pwr: 1, warmup_steps: 10}
      lazy_update: false
    initializer: {name: orthogonal, rand_type: normal}
    fit: {metrics: [perplexity, accuracy], fixed_params: [embed], max_batches_per_epoch: 5}
    checkpoint: {period: 2}
    """
)


@pytest.mark.parametrize("text", [BASE, FULL], ids=["minimal", "full"])
def test_round_trip(tmp_path: Path, text: str) -> None:
    config = load(tmp_path, text)
    dumped = dump_config(config)
    assert dumped.startswith("# Resolved experiment config written by mxtrain")
    assert mxtrain.__version__ in dumped.splitlines()[0]
    again = load_config(write(tmp_path, dumped, "resolved.yaml"), registries=REG)
    assert again == config
    assert dump_config(again).splitlines()[2:] == dumped.splitlines()[2:]
    assert yaml.safe_load(dumped) == config_to_dict(config)


def test_round_trip_of_tricky_strings(tmp_path: Path) -> None:
    text = BASE.replace("seed: 3", "seed: 3\n  name: '1e3'\n  runs_dir: 'yes'")
    text = text.replace("source: train.txt", "source: '2024-01-01'")
    config = load(tmp_path, text)
    assert config.experiment.name == "1e3"
    again = load_config(write(tmp_path, dump_config(config), "again.yaml"), registries=REG)
    assert again == config


def test_round_trip_of_plugin_options(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(PLUGIN)
    config = load(tmp_path, plugin_text("mine.py:build_anything", "  nested: {a: [1, 2]}\n"))
    again = load_config(write(tmp_path, dump_config(config), "again.yaml"), registries=REG)
    assert again == config


def test_config_to_dict_flattens_components(tmp_path: Path) -> None:
    plain = config_to_dict(load(tmp_path, FULL))
    assert list(plain) == [
        "experiment",
        "model",
        "data",
        "context",
        "kvstore",
        "optimizer",
        "initializer",
        "fit",
        "checkpoint",
        "logging",
        "tracking",
    ]
    assert plain["model"] == {
        "name": "tiny",
        "num_hidden": 300,
        "num_layers": 2,
        "dropout": 0.0,
        "cell": "auto",
        "ignore_padding": True,
    }
    assert plain["data"]["train"]["iterator"] == "tiny_iter"
    assert plain["data"]["eval"]["buckets"] == [10, 20]
    assert plain["context"]["work_load"] == [1.0, 2.0]
    assert plain["optimizer"]["lr_scheduler"] == {
        "type": "poly",
        "max_update": 1000,
        "final_lr": 0.0,
        "pwr": 1.0,
        "warmup_steps": 10,
        "warmup_begin_lr": 0.0,
        "warmup_mode": "linear",
        "unit": "updates",
    }
    assert plain["optimizer"]["beta1"] == 0.9
    assert plain["optimizer"]["lazy_update"] is False
    assert plain["initializer"] == {
        "name": "orthogonal",
        "scale": 1.414,
        "rand_type": "normal",
        "overrides": [],
        "from": None,
    }
    assert plain["fit"]["metrics"] == ["perplexity", "accuracy"]
    assert "source" not in plain and "base_dir" not in plain


def test_explain_rows(tmp_path: Path) -> None:
    config = load(tmp_path, FULL)
    rows = explain_config(config)
    by_key = {key: (value, default, doc) for key, value, default, doc in rows}
    assert len(by_key) == len(rows)

    def leaves(d: dict[str, Any], prefix: str = "") -> list[str]:
        out = []
        for k, v in d.items():
            key = f"{prefix}{k}"
            out += leaves(v, key + ".") if isinstance(v, dict) and v else [key]
        return out

    assert list(by_key) == leaves(config_to_dict(config))
    assert by_key["experiment.name"] == ("ptb", "ptb", by_key["experiment.name"][2])
    assert by_key["model.num_hidden"] == (300, 200, "hidden units per layer")
    assert by_key["optimizer.learning_rate"][:2] == (0.001, 0.001)
    assert by_key["optimizer.clip_gradient"][:2] == (5.0, None)
    assert by_key["optimizer.beta1"][:2] == (0.9, 0.9)
    assert "first-moment" in by_key["optimizer.beta1"][2]
    assert by_key["optimizer.lr_scheduler.type"][:2] == ("poly", REQUIRED)
    assert "optimizer.lr_scheduler.step" not in by_key  # not a key of poly
    assert by_key["data.train.source"][1] is REQUIRED
    assert by_key["fit.metrics"][:2] == (["perplexity", "accuracy"], ["perplexity"])
    schema_rows = [r for r in rows if not r[0].startswith(("model.", "data."))]
    assert all(doc for _, _, _, doc in schema_rows)


def test_explain_without_eval_and_scheduler(tmp_path: Path) -> None:
    by_key = {r[0]: r for r in explain_config(load(tmp_path, BASE))}
    assert by_key["data.eval"][1] is None
    assert by_key["optimizer.lr_scheduler"][1] is None


def test_every_schema_field_is_documented() -> None:
    from mxtrain.config.schema import SECTIONS

    for cls in [*SECTIONS.values(), LrSchedulerSection]:
        for f in dataclasses.fields(cls):
            assert f.metadata.get("doc"), f"{cls.__name__}.{f.name} has no doc"
    for table in (OPTIMIZERS, INITIALIZERS):
        for name, spec in table.items():
            for key, param in spec.params.items():
                assert param.doc, f"{name}.{key} has no doc"


# --------------------------------------------------------------------------------------------
# Import hygiene
# --------------------------------------------------------------------------------------------


def test_config_package_does_not_import_mxnet_or_click(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    code = (
        "import sys\n"
        "from mxtrain.config import load_config\n"
        "sys.path.insert(0, 'tests/unit')\n"
        f"from {__name__} import REG\n"
        f"load_config({str(path)!r}, registries=REG)\n"
        "bad = sorted(m for m in ('mxnet', 'click') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_loading_builtin_components_does_not_import_mxnet(tmp_path: Path) -> None:
    pytest.importorskip("mxtrain.models.language_model_options")
    pytest.importorskip("mxtrain.data.bucket_sentence_options")
    path = write(
        tmp_path,
        "model: {name: lstm_lm}\ndata: {train: {iterator: bucket_sentence, source: t.txt}}\n"
        "fit: {metrics: [perplexity, accuracy]}\n",
    )
    code = (
        "import sys\n"
        "from mxtrain.config import load_config\n"
        f"load_config({str(path)!r})\n"
        "assert 'mxnet' not in sys.modules\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------------------------------
# The static tables against MXNet 1.9.1 itself (skipped only where MXNet cannot be imported)
# --------------------------------------------------------------------------------------------

# handled by OptimizerSection's own fields, or internal to MXNet (not settable from a config)
_OPTIMIZER_OWN = {"learning_rate", "wd", "clip_gradient", "rescale_grad", "lr_scheduler"}
_OPTIMIZER_INTERNAL = {"param_idx2name", "sym", "begin_num_update", "param_dict"}
_NOT_IN_TABLE = {"test", "ccsgd"}  # MXNet's test optimizer; ccsgd is a deprecated SGD alias


@pytest.fixture(scope="module")
def mx() -> Any:
    try:
        import mxnet
    except Exception as exc:  # numpy >= 1.24 makes the import raise AttributeError
        pytest.skip(f"mxnet cannot be imported: {exc}")
    import mxtrain.optimizers  # noqa: F401 - registers mxtrain's own optimizers (adamw)

    return mxnet


def _constructor_params(cls: type) -> dict[str, Any]:
    """Keyword parameters (with defaults) reachable through the __init__ chain and **kwargs."""
    params: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        sig = inspect.signature(init)
        for p in list(sig.parameters.values())[1:]:
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            params.setdefault(p.name, p.default)
        if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            break
    return params


def test_optimizer_table_matches_mxnet(mx: Any) -> None:
    registry = mx.optimizer.Optimizer.opt_registry
    assert set(OPTIMIZERS) == set(registry) - _NOT_IN_TABLE
    for name, spec in OPTIMIZERS.items():
        params = _constructor_params(registry[name])
        lr_default = params["learning_rate"]
        assert spec.learning_rate == (0.01 if lr_default is None else lr_default), name
        expected = {
            k: v for k, v in params.items() if k not in _OPTIMIZER_OWN | _OPTIMIZER_INTERNAL
        }
        assert set(spec.params) == set(expected), name
        for key, param in spec.params.items():
            assert param.default == expected[key], f"{name}.{key}"
            assert type(param.default) is type(expected[key]) or (
                param.type is float and isinstance(expected[key], int)
            ), f"{name}.{key}"


def test_optimizer_table_builds_real_optimizers(mx: Any) -> None:
    for name, spec in OPTIMIZERS.items():
        defaults = {k: p.default for k, p in spec.params.items()}
        opt = mx.optimizer.create(name, learning_rate=spec.learning_rate, **defaults)
        assert opt.learning_rate == spec.learning_rate


def test_initializer_table_matches_mxnet(mx: Any) -> None:
    registry = mx.registry.get_registry(mx.init.Initializer)
    for name, spec in INITIALIZERS.items():
        assert name in registry, name
        params = _constructor_params(registry[name])
        assert set(spec.params) == set(params), name
        for key, param in spec.params.items():
            assert param.default == params[key], f"{name}.{key}"
        registry[name](**{k: p.default for k, p in spec.params.items()})


def test_scheduler_keys_match_mxnet(mx: Any) -> None:
    from mxtrain.config.schema import LR_SCHEDULER_KEYS, LR_WARMUP_KEYS

    classes = {
        "factor": mx.lr_scheduler.FactorScheduler,
        "multifactor": mx.lr_scheduler.MultiFactorScheduler,
        "poly": mx.lr_scheduler.PolyScheduler,
        "cosine": mx.lr_scheduler.CosineScheduler,
    }
    renamed = {"steps": "step"}  # multifactor's list is called step in MXNet
    for kind, cls in classes.items():
        names = set(inspect.signature(cls.__init__).parameters) - {"self", "base_lr"}
        ours = {renamed.get(k, k) if kind == "multifactor" else k for k in LR_SCHEDULER_KEYS[kind]}
        assert ours | set(LR_WARMUP_KEYS) == names, kind
        defaults = LrSchedulerSection(type=kind, step=1, steps=(1,), max_update=10)
        for key in set(LR_SCHEDULER_KEYS[kind]) | set(LR_WARMUP_KEYS):
            mx_default = inspect.signature(cls.__init__).parameters[renamed.get(key, key)].default
            if mx_default is not inspect.Parameter.empty:
                assert getattr(defaults, key) == mx_default, f"{kind}.{key}"


# --------------------------------------------------------------------------------------------
# The real built-in components, once they exist
# --------------------------------------------------------------------------------------------


def test_real_components(tmp_path: Path) -> None:
    lstm_lm = pytest.importorskip("mxtrain.models.language_model_options")
    options = pytest.importorskip("mxtrain.data.bucket_sentence_options")
    text = textwrap.dedent(
        """\
        model:
          name: lstm_lm
          num_hidden: 64
          cell: fused
        data:
          train:
            iterator: bucket_sentence
            source: train.txt
            level: word
            buckets: [10, 20]
          eval:
            source: valid.txt
            level: word
        """
    )
    config = load_config(write(tmp_path, text))
    assert isinstance(config.model.options, lstm_lm.LstmLmOptions)
    assert config.model.options.num_hidden == 64
    assert isinstance(config.data.train.options, options.BucketSentenceOptions)
    assert config.data.train.options.buckets == [10, 20]
    again = load_config(write(tmp_path, dump_config(config), "again.yaml"))
    assert again == config
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text.replace("num_hidden: 64", "num_hiden: 64")))
    message = str(info.value)
    assert "ptb.yaml:3: unknown key 'model.num_hiden'. Did you mean 'num_hidden'?" in message
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text.replace("level: word", "level: wrod", 1)))
    assert "ptb.yaml:9: data.train.level must be one of 'word', 'char'" in str(info.value)


@pytest.mark.parametrize(
    ("optimizer", "kvstore", "key"),
    [
        ("{name: sgd, clip_global_norm: 5.0}", "{type: dist_async}", "optimizer.clip_global_norm"),
        (
            "{name: sgd, lr_scheduler: {type: factor, step: 1, unit: epochs}}",
            "{type: local, update_on_kvstore: true}",
            "optimizer.lr_scheduler.unit",
        ),
    ],
)
def test_worker_only_optimizer_keys_refuse_server_updates(
    tmp_path: Path, optimizer: str, kvstore: str, key: str
) -> None:
    text = BASE + f"optimizer: {optimizer}\nkvstore: {kvstore}\n"
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, 'optimizer:')}" in message
    assert f"{key} needs the updates on the workers" in message
    assert "update_on_kvstore: false" in message
    # the same keys with updates on the workers are fine
    load(tmp_path, text.replace(kvstore, "{type: local, update_on_kvstore: false}"))


# --------------------------------------------------------------------------------------------
# optimizer.lr_mult / optimizer.wd_mult
# --------------------------------------------------------------------------------------------

MULT = (
    BASE
    + """\
optimizer:
  name: sgd
  wd: 0.001
  lr_mult:
    "embed_*": 0.1
    pred_weight: 0
  wd_mult: {"*_bias": 1}
"""
)


def test_multipliers_load_and_survive_a_dump(tmp_path: Path) -> None:
    config = load(tmp_path, MULT)
    assert dict(config.optimizer.lr_mult) == {"embed_*": 0.1, "pred_weight": 0.0}
    assert dict(config.optimizer.wd_mult) == {"*_bias": 1.0}
    again = load_config(write(tmp_path, dump_config(config), "dumped.yaml"), registries=REG)
    assert again == config
    line = line_of(MULT, "pred_weight")
    assert config.where("optimizer", "lr_mult", "pred_weight") == f"{tmp_path / 'ptb.yaml'}:{line}"


@pytest.mark.parametrize(
    ("old", "new", "key", "words"),
    [
        ("pred_weight: 0", "pred_weight: -1", "pred_weight", "a finite number >= 0"),
        ("pred_weight: 0", "pred_weight: .inf", "pred_weight", "a finite number"),
        ("pred_weight: 0", "pred_weight: fast", "pred_weight", "a number"),
        ('"embed_*": 0.1', '"": 0.1', "lr_mult", "empty glob"),
        ("wd: 0.001", "wd: 0", "wd_mult", "no effect while optimizer.wd is 0"),
    ],
)
def test_bad_multipliers_name_file_line_and_key(
    tmp_path: Path, old: str, new: str, key: str, words: str
) -> None:
    text = MULT.replace(old, new)
    message = error(tmp_path, text)
    assert f"ptb.yaml:{line_of(text, key)}:" in message
    assert words in message


def test_multipliers_may_change_on_resume() -> None:
    assert may_change("optimizer.lr_mult") and may_change("optimizer.lr_mult.embed_*")
    assert may_change("optimizer.wd_mult.*_bias")


CHAR_TRAIN_ONLY = """\
data:
  train: {iterator: bucket_sentence, source: train.txt, level: char, lowercase: true}
  eval: {iterator: bucket_sentence, source: valid.txt, shuffle: false}
"""


def test_eval_inherits_how_train_reads_text_when_it_does_not_say(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, CHAR_TRAIN_ONLY))
    assert config.data.eval is not None
    assert config.data.eval.options.level == "char"
    assert config.data.eval.options.lowercase is True
    assert config.data.eval.options.source == "valid.txt"
    assert config.data.eval.options.shuffle is False


def test_eval_that_reads_text_differently_from_train_is_still_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, CHAR_TRAIN_ONLY), ("data.eval.level=word",))
    assert "data.eval.level is 'word' but data.train.level is 'char'" in str(info.value)
