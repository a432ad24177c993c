"""Config inputs that used to crash or stall the loader: each is exit 2 naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from mxtrain.cli.main import cli
from mxtrain.config import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, MAX_CONFIG_VALUES, MAX_MAPPING_KEYS

ROOT = Path(__file__).resolve().parents[2]
BASE = (ROOT / "configs" / "ndarray_mlp.yaml").read_text(encoding="utf-8")


def check(config: Path, *overrides: str) -> tuple[int, str]:
    args = ["check", str(config)]
    for override in overrides:
        args += ["--set", override]
    result = CliRunner().invoke(cli, args)
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, RecursionError | TypeError | ValueError)
    return result.exit_code, result.output


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(BASE, encoding="utf-8")
    return path


@pytest.mark.parametrize("value", ["\x01", "a\x00b", "\udcff", "\ud800x"])
def test_set_with_unreadable_characters_is_a_config_error(config: Path, value: str) -> None:
    code, output = check(config, f"model.dropout={value}")
    assert code == 2, output
    assert "--set model.dropout=" in output
    assert "is not allowed in a config" in output


def test_control_character_in_file_names_its_line(config: Path) -> None:
    config.write_bytes(BASE.encode().replace(b"seed: 1", b"seed: \x01"))
    code, output = check(config)
    assert code == 2
    line = BASE[: BASE.index("seed: 1")].count("\n") + 1
    assert f"{config}:{line}:" in output and "U+0001" in output
    code, output = check(config, "model.dropout=0.5")
    assert code == 2 and f"{config}:{line}:" in output


def test_utf16_files_with_and_without_bom(config: Path) -> None:
    config.write_bytes(BASE.encode("utf-16"))
    code, output = check(config, "fit.num_epoch=1")
    assert code == 2 and "UTF-16" in output and str(config) in output
    config.write_bytes(BASE.encode("utf-16-le"))
    code, output = check(config)
    assert code == 2 and f"{config}:1:" in output and "UTF-16" in output


def test_non_utf8_bytes_name_the_line(config: Path) -> None:
    config.write_bytes(BASE.encode().replace(b"seed: 1", b"seed: \xff"))
    code, output = check(config)
    line = BASE[: BASE.index("seed: 1")].count("\n") + 1
    assert code == 2 and "is not UTF-8" in output and f"line {line}" in output


@pytest.mark.parametrize("opener,closer", [("[", "]"), ("{a: ", "}")])
def test_deep_nesting_is_refused_with_the_limit(config: Path, opener: str, closer: str) -> None:
    deep = opener * 500 + ("1" if closer == "}" else "") + closer * 500
    config.write_text(BASE + f"logging: {deep}\n", encoding="utf-8")
    code, output = check(config)
    assert code == 2 and f"nested more than {MAX_CONFIG_DEPTH} levels" in output
    assert str(config) in output
    config.write_text(BASE, encoding="utf-8")
    code, output = check(config, f"model.hidden={deep}")
    assert code == 2 and "--set model.hidden=" in output and "nested more than" in output


def test_alias_bomb_is_refused_before_expansion(config: Path) -> None:
    levels = ["a0: &a0 {x: 1, y: 1, z: 1, w: 1, v: 1}"]
    levels += [f"a{i}: &a{i} {{x: *a{i - 1}, y: *a{i - 1}, z: *a{i - 1}}}" for i in range(1, 30)]
    config.write_text("\n".join(levels) + "\n", encoding="utf-8")
    assert len(config.read_bytes()) < 1200
    code, output = check(config)
    assert code == 2 and f"more than {MAX_CONFIG_VALUES:,} values" in output
    assert f"{config}:" in output


def test_many_keys_are_refused_and_unknown_keys_found_fast(config: Path) -> None:
    config.write_text(BASE + "".join(f"k{i}: 1\n" for i in range(1500)), encoding="utf-8")
    code, output = check(config)
    assert code == 2 and f"more than the {MAX_MAPPING_KEYS:,}" in output
    config.write_text(BASE + "".join(f"k{i}: 1\n" for i in range(900)), encoding="utf-8")
    code, output = check(config)
    assert code == 2 and "unknown key 'k0'" in output


def test_oversized_file_is_refused(config: Path) -> None:
    config.write_text(BASE + "#" * MAX_CONFIG_BYTES, encoding="utf-8")
    code, output = check(config)
    assert code == 2 and "too large for a config file" in output and str(config) in output


@pytest.mark.parametrize("name", [".:x", ":x", "a..b:x", "mod:1x", "x.py:"])
def test_malformed_plugin_reference_is_a_config_error(config: Path, name: str) -> None:
    code, output = check(config, f"model.name='{name}'")
    assert code == 2 and "not a valid plugin reference" in output
    assert "model.name" in output
    config.write_text(BASE.replace("name: mlp", f"name: '{name}'"), encoding="utf-8")
    code, output = check(config)
    assert code == 2 and f"{config}:" in output and "model.name" in output


@pytest.mark.parametrize(
    "override,key",
    [
        ("model.hidden=[10000000000]", "model.hidden"),
        ("model.hidden=[1048576, 1048576, 1048576]", "model.hidden"),
    ],
)
def test_model_sizes_fit_would_die_on_are_refused_by_check(
    config: Path, override: str, key: str
) -> None:
    code, output = check(config, override)
    assert code == 2 and f"--set {override}" in output and key in output
    assert "at most" in output or "parameters" in output
    value = override.split("=", 1)[1]
    config.write_text(BASE.replace("hidden: [64, 32]", f"hidden: {value}"), encoding="utf-8")
    code, output = check(config)
    assert code == 2 and f"{config}:" in output and key in output


@pytest.mark.parametrize(
    "model",
    [
        "{name: rnn_classifier, num_hidden: 100000000000}",
        "{name: rnn_classifier, num_hidden: 100000, num_layers: 100}",
        "{name: lenet, channels: [100000, 100000], kernel: 5}",
    ],
)
def test_recurrent_and_conv_sizes_are_bounded(config: Path, model: str) -> None:
    code, output = check(config, f"model={model}")
    assert code == 2 and "--set model=" in output
    assert "at most" in output or "parameters" in output


def test_ndarray_label_column_suggests_label_key(config: Path) -> None:
    code, output = check(config, "data.train.label_column=3")
    assert code == 2 and "unknown key 'data.train.label_column'" in output
    assert "Did you mean 'label_key'?" in output


@pytest.mark.parametrize("key,value", [("level", "word"), ("lowercase", "true")])
def test_eval_must_read_text_like_train(tmp_path: Path, key: str, value: str) -> None:
    config = tmp_path / "char.yaml"
    config.write_text(
        (ROOT / "configs" / "ptb_char_lstm.yaml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    code, output = check(config, f"data.eval.{key}={value}")
    assert code == 2, output
    assert f"--set data.eval.{key}={value}" in output and f"data.train.{key}" in output
    text = config.read_text(encoding="utf-8")
    eval_at = text.index("  eval:")
    head, tail = text[:eval_at], text[eval_at:]
    if key == "level":
        tail = tail.replace("level: char", "level: word", 1)
    else:
        tail = tail.replace("  eval:\n", "  eval:\n    lowercase: true\n", 1)
    config.write_text(head + tail, encoding="utf-8")
    code, output = check(config)
    assert code == 2 and f"{config}:" in output and f"data.eval.{key}" in output


def test_eval_that_omits_the_text_keys_reads_text_like_train(tmp_path: Path) -> None:
    config = tmp_path / "char.yaml"
    text = (ROOT / "configs" / "ptb_char_lstm.yaml").read_text(encoding="utf-8")
    eval_at = text.index("  eval:")
    head, tail = text[:eval_at], text[eval_at:]
    config.write_text(head + tail.replace("    level: char\n", "", 1), encoding="utf-8")
    assert "level" not in config.read_text(encoding="utf-8")[eval_at:]
    code, output = check(config, "data.train.lowercase=true")
    assert code == 0, output
    eval_part = output[output.index("  eval:") :]
    assert "level: char" in eval_part and "lowercase: true" in eval_part


def test_gradient_compression_with_local_kvstore_is_refused_by_check(config: Path) -> None:
    code, output = check(config, "kvstore.gradient_compression={type: 2bit}")
    assert code == 2 and "--set kvstore.gradient_compression=" in output
    assert "not supported by kvstore.type local" in output
    config.write_text(
        BASE + "kvstore:\n  type: local\n  gradient_compression: {type: 2bit}\n", encoding="utf-8"
    )
    code, output = check(config)
    line = BASE.count("\n") + 3
    assert code == 2 and f"{config}:{line}:" in output and "kvstore.gradient_compression" in output
    code, _ = check(config, "kvstore.type=device")
    assert code == 0


@pytest.mark.parametrize("escape", ["\\0", "\\ud800", "\\udcff"])
def test_nul_and_lone_surrogates_in_any_string_are_refused(config: Path, escape: str) -> None:
    code, output = check(config, f'data.train.source="x{escape}.npy"')
    assert code == 2 and "--set data.train.source=" in output and "not valid text" in output
    config.write_text(
        BASE.replace("source: data/features.npy", f'source: "x{escape}.npy"'), encoding="utf-8"
    )
    code, output = check(config)
    line = BASE[: BASE.index("source: data/features.npy")].count("\n") + 1
    assert code == 2 and f"{config}:{line}: data.train.source" in output


def test_checkpoint_prefix_follows_the_run_name_rules(config: Path) -> None:
    code, output = check(config, 'checkpoint.prefix="a\\x01"')
    assert code == 2 and "checkpoint.prefix cannot contain control characters" in output


def test_dist_kvstore_with_an_iterator_that_cannot_be_sharded_is_refused_by_check(
    tmp_path: Path,
) -> None:
    """fit refuses data.train that cannot be split between workers; check says so first."""
    tagger = tmp_path / "tagger.yaml"
    tagger.write_text(
        (ROOT / "configs" / "conll_tagger.yaml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    code, output = check(tagger, "kvstore.type=dist_sync")
    assert code == 2, output
    assert "'tagged_sequences' cannot be sharded" in output and "num_parts" in output
    assert f"{tagger}:" in output and "data.train.iterator" in output
    code, output = check(tagger, "kvstore.type=device")
    assert code == 0, output


def test_dist_kvstore_with_a_shardable_iterator_passes_check(config: Path) -> None:
    code, output = check(config, "kvstore.type=dist_sync")
    assert code == 0, output
