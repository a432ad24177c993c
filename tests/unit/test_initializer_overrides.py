"""initializer.overrides: per-parameter initializers by glob, in the config and in training."""

from __future__ import annotations

from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from mxtrain.build import build_initializer
from mxtrain.config import dump_config, load_config
from mxtrain.errors import ConfigError

OVERRIDES = [
    "initializer.overrides=[{pattern: '*_bias', name: zero}, "
    "{pattern: 'embed_*', name: uniform, scale: 0.5}, {pattern: '*', name: one}]",
]


def test_overrides_round_trip_with_defaults_filled(tiny_config: Path, tmp_path: Path) -> None:
    config = load_config(tiny_config, OVERRIDES)
    overrides = config.initializer.overrides
    assert [(o.pattern, o.name) for o in overrides] == [
        ("*_bias", "zero"),
        ("embed_*", "uniform"),
        ("*", "one"),
    ]
    assert dict(overrides[1].params) == {"scale": 0.5}
    dumped = tmp_path / "again.yaml"
    dumped.write_text(dump_config(config))
    assert load_config(dumped, base_dir=tiny_config.parent) == config


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("[{name: zero}]", "needs a 'pattern'"),
        ("[{pattern: '*', name: zeros}]", "Did you mean 'zero'"),
        ("[{pattern: '*', name: uniform, sigma: 1.0}]", "sigma"),
        ("{pattern: '*'}", "must be a list"),
    ],
)
def test_bad_overrides_are_clear_errors(tiny_config: Path, value: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tiny_config, [f"initializer.overrides={value}"])
    assert needle in str(info.value) and "initializer.overrides" in str(info.value)


def test_first_matching_pattern_wins_in_training_params(tiny_config: Path) -> None:
    from mxtrain.data.base import DataInfo
    from mxtrain.engine.bucketing import BucketingModule
    from mxtrain.models.language_model_options import LstmLmOptions
    from mxtrain.models.language_models import build_lstm_lm

    config = load_config(tiny_config, OVERRIDES)
    sym_gen = build_lstm_lm(
        LstmLmOptions(num_embed=4, num_hidden=5, num_layers=1, cell="unfused"), DataInfo(20, 20, 0)
    )
    module = BucketingModule(sym_gen, 6, [mx.cpu()])
    module.bind([("data", (2, 6))], [("softmax_label", (2, 6))])
    module.init_params(build_initializer(config.initializer))
    params, _ = module.get_params()
    for name, value in params.items():
        array = value.asnumpy()
        if name.startswith("lstm_") and name.endswith("_bias"):
            # MXNet's LSTM cell pins its own bias initializer on the variable (forget gate
            # 1, others 0); a variable's own initializer wins over the global one.
            assert set(np.unique(array)) <= {0.0, 1.0}, name
        elif name.endswith("_bias"):
            assert not array.any(), name
        elif name.startswith("embed_"):
            assert np.abs(array).max() <= 0.5 and array.std() > 0.05, name
        else:
            assert (array == 1).all(), name
    assert not params["pred_bias"].asnumpy().any()
