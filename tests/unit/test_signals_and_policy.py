"""Stop requests from signals, and the resume policy's diff."""

from __future__ import annotations

import os
import signal

import pytest

from mxtrain.config import config_to_dict, load_config
from mxtrain.config.resume_policy import diff_configs, may_change
from mxtrain.signals import StopRequests


def test_first_signal_requests_a_stop_second_interrupts() -> None:
    before = signal.getsignal(signal.SIGINT)
    with StopRequests() as stops:
        assert not stops.requested()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stops.requested()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize(
    ("key", "allowed"),
    [
        ("fit.num_epoch", True),
        ("optimizer.learning_rate", True),
        ("data.eval.batch_size", True),
        ("checkpoint.keep_last", True),
        ("model.num_hidden", False),
        ("data.train.batch_size", False),
        ("data.train.buckets", False),
        ("experiment.seed", False),
        ("optimizer.name", False),
        ("checkpoint.prefix", False),
    ],
)
def test_policy_marks_keys(key: str, allowed: bool) -> None:
    assert may_change(key) is allowed


def test_diff_reports_changed_and_section_level_keys(tiny_config) -> None:
    saved = config_to_dict(load_config(tiny_config))
    requested = config_to_dict(
        load_config(tiny_config, ["fit.num_epoch=4", "model.num_hidden=3", "data.eval=null"])
    )
    changes = {c.key: c for c in diff_configs(saved, requested)}
    assert set(changes) == {"fit.num_epoch", "model.num_hidden", "data.eval"}
    assert changes["fit.num_epoch"].allowed and not changes["model.num_hidden"].allowed
    assert changes["data.eval"].requested is None and changes["data.eval"].saved["batch_size"] == 8
    assert diff_configs(saved, saved) == []
