"""fit warns when several CPU contexts would take turns on MXNet's fused RNN operator."""

from __future__ import annotations

import logging

import pytest

from mxtrain.fit.setup import warn_if_contexts_take_turns


def graphs():
    import mxnet as mx

    data = mx.sym.var("data")
    rnn = mx.sym.RNN(data, mx.sym.var("p"), mx.sym.var("s"), mx.sym.var("c"), state_size=4,
                     num_layers=1, mode="lstm")  # fmt: skip
    return rnn, mx.sym.FullyConnected(data, num_hidden=4)


@pytest.mark.parametrize("count", [1, 2])
def test_only_several_cpu_contexts_with_a_fused_rnn_are_warned(
    count: int, caplog: pytest.LogCaptureFixture
) -> None:
    import mxnet as mx

    rnn, dense = graphs()
    contexts = [mx.cpu(i) for i in range(count)]
    with caplog.at_level(logging.WARNING, logger="mxtrain"):
        warn_if_contexts_take_turns(dense, contexts)
        assert not caplog.records
        warn_if_contexts_take_turns(rnn, contexts)
    warned = [r.getMessage() for r in caplog.records]
    if count == 1:
        assert not warned
    else:
        (message,) = warned
        assert "2 CPU contexts" in message and "kvstore.type=dist_sync" in message
