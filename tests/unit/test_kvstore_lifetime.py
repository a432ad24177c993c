"""Dropping a multi-device module right after update() must not crash the process.

MXNet frees a local kvstore while reduce operations queued on its engine still use it; before our
module waited for the engine, this script died with SIGFPE (exit 136) within a few rounds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import mxnet as mx
    from mxtrain.engine.bucketing import BucketingModule

    def sym_gen(seq_len):
        data, label = mx.sym.Variable("data"), mx.sym.Variable("softmax_label")
        embed = mx.sym.Embedding(data, input_dim=30, output_dim=8, name="embed")
        cell = mx.rnn.LSTMCell(num_hidden=8, prefix="lstm_")
        outputs, _ = cell.unroll(seq_len, inputs=embed, merge_outputs=True)
        pred = mx.sym.FullyConnected(mx.sym.Reshape(outputs, shape=(-1, 8)), num_hidden=30)
        out = mx.sym.SoftmaxOutput(pred, mx.sym.Reshape(label, shape=(-1,)), name="softmax")
        return out, ("data",), ("softmax_label",)

    def module():
        mod = BucketingModule(sym_gen, 9, [mx.cpu(0), mx.cpu(1)])
        mod.bind([("data", (4, 9))], [("softmax_label", (4, 9))])
        mod.init_params(mx.init.Xavier())
        return mod

    batch = mx.io.DataBatch(
        [mx.nd.ones((4, 9))], [mx.nd.ones((4, 9))], bucket_key=9,
        provide_data=[mx.io.DataDesc("data", (4, 9))],
        provide_label=[mx.io.DataDesc("softmax_label", (4, 9))],
    )
    for kvstore, on_kv in [("local", False), ("local", True), ("device", True)] * 6:
        mod = module()
        mod.init_optimizer(kvstore, "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                           update_on_kvstore=on_kv)
        for _ in range(3):
            mod.forward_backward(batch)
            mod.update()
        del mod  # the engine may still be reducing gradients for this module's kvstore
        module()  # new allocations reuse the freed memory, as in the original crash
    print("survived")
    """
)


def test_dropping_a_module_with_pending_kvstore_work_does_not_crash() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MXNET_SUBGRAPH_VERBOSE": "0"}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert result.stdout.strip() == "survived"
