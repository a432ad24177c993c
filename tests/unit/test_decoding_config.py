"""The config side of the decoding metrics (bleu, chrf, wer, per): where a config may name
them, fit.decode_eval, and the errors (with the key's line) where it may not.

The seq2seq models are registered in a test registry under their built-in names, so these
checks do not need the real builders (they never call a factory)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mxtrain.config import Config, Registries, load_config, parse_config
from mxtrain.config.loader import dump_config
from mxtrain.config.resume_policy import may_change
from mxtrain.config.schema import DecodeEvalSection, FitSection
from mxtrain.errors import ConfigError, InvalidValue
from mxtrain.registry import DECODING_MODELS, Registry


@dataclass(frozen=True)
class _ModelOptions:
    num_hidden: int = field(default=8, metadata={"doc": "hidden units"})


@dataclass(frozen=True)
class _IterOptions:
    source: str = field(metadata={"doc": "text file"})


def _never_called() -> None:  # the config layer imports factories, never calls them
    raise AssertionError


def _registries() -> Registries:
    models = Registry("model")
    for name in (*sorted(DECODING_MODELS), "tiny_lm"):
        models.register(name, f"{__name__}:_never_called", options=f"{__name__}:_ModelOptions")
    iterators = Registry("iterator")
    iterators.register("lines", f"{__name__}:_never_called", options=f"{__name__}:_IterOptions")
    metrics = Registry("metric")
    for name in ("perplexity", "accuracy"):
        metrics.register(name, f"{__name__}:_never_called")
    return Registries(models=models, iterators=iterators, metrics=metrics)


REG = _registries()

SEQ2SEQ = """\
model:
  name: {model}
data:
  train: {{iterator: lines, source: train.txt}}
  eval: {{iterator: lines, source: dev.txt}}
fit:
  metrics: [perplexity]
  eval_metrics: [perplexity, bleu, wer]
{extra}"""


def _text(model: str = "rnn_seq2seq", extra: str = "") -> str:
    return SEQ2SEQ.format(model=model, extra=textwrap.dedent(extra))


def _load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "g2p.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, registries=REG)


def _error(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    assert "\n" not in str(info.value)  # one paragraph
    return info.value


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize("model", sorted(DECODING_MODELS))
def test_seq2seq_runs_may_evaluate_and_pick_checkpoints_by_decoding_metrics(
    tmp_path: Path, model: str
) -> None:
    extra = """\
      early_stopping: {metric: wer, patience: 2}
      decode_eval: {beam_size: 5, max_sentences: 200}
    checkpoint:
      best_metric: bleu
    """
    config = _load(tmp_path, _text(model, extra))
    fit = config.fit
    assert fit.decoding_metrics == ("bleu", "wer")
    assert fit.device_evaluation_metrics == ("perplexity",)
    assert fit.decoding == DecodeEvalSection(beam_size=5, max_sentences=200)
    assert config.checkpoint.best_metric == "bleu" and fit.early_stopping is not None
    # the dump reads back as the same config (a run folder's config.yaml)
    again = parse_config(dump_config(config), source="saved", base_dir=tmp_path, registries=REG)
    assert again == config


def test_decode_eval_defaults_to_greedy_over_every_sentence(tmp_path: Path) -> None:
    config = _load(tmp_path, _text())
    assert config.fit.decode_eval is None
    assert config.fit.decoding == DecodeEvalSection(beam_size=1, max_sentences=None)


def test_other_models_cannot_evaluate_decoding_metrics(tmp_path: Path) -> None:
    text = _text(model="tiny_lm")
    error = _error(tmp_path, text)
    line = _line(text, "eval_metrics:")
    assert str(error.message).startswith(f"{tmp_path / 'g2p.yaml'}:{line}: fit.eval_metrics[1]")
    assert "'bleu' is scored on decoded output" in error.message
    assert "rnn_seq2seq, transformer_seq2seq" in error.message and "'tiny_lm'" in error.message


def test_decoding_metrics_are_not_training_metrics(tmp_path: Path) -> None:
    text = _text().replace("metrics: [perplexity]", "metrics: [perplexity, chrf]")
    error = _error(tmp_path, text)
    line = _line(text, "  metrics: [perplexity, chrf]")
    assert error.message.startswith(f"{tmp_path / 'g2p.yaml'}:{line}: fit.metrics[1]: 'chrf'")
    assert "every training batch" in error.message
    assert error.hint is not None and "fit.eval_metrics" in error.hint


def test_a_watched_decoding_metric_must_be_one_of_the_eval_metrics(tmp_path: Path) -> None:
    text = _text(extra="checkpoint:\n  best_metric: per\n")
    error = _error(tmp_path, text)
    line = _line(text, "best_metric:")
    assert error.message.startswith(f"{tmp_path / 'g2p.yaml'}:{line}: checkpoint.best_metric")
    assert error.hint is not None and "eval_metrics: [perplexity, bleu]" in error.hint


def test_decode_eval_needs_a_decoding_metric(tmp_path: Path) -> None:
    text = _text().replace(", bleu, wer]", "]\n  decode_eval: {beam_size: 2}")
    error = _error(tmp_path, text)
    assert error.message.startswith(f"{tmp_path / 'g2p.yaml'}:{_line(text, 'decode_eval')}:")
    assert "no effect without a decoding metric (bleu, chrf, wer, per)" in error.message


@pytest.mark.parametrize(
    ("options", "key"), [({"beam_size": 0}, "beam_size"), ({"max_sentences": 0}, "max_sentences")]
)
def test_decode_eval_values_are_checked(options: dict[str, int], key: str) -> None:
    with pytest.raises(InvalidValue) as info:
        DecodeEvalSection(**options)
    assert info.value.key == key


def test_decode_eval_may_change_on_resume() -> None:
    assert may_change("fit.decode_eval") and may_change("fit.decode_eval.max_sentences")


def test_fit_section_splits_device_and_decoding_metrics() -> None:
    fit = FitSection(metrics=("accuracy",), eval_metrics=("per", "perplexity", "chrf"))
    assert fit.decoding_metrics == ("per", "chrf")
    assert fit.device_evaluation_metrics == ("perplexity",)
    assert FitSection(metrics=("accuracy",)).decoding_metrics == ()
