"""The training loop stays a bounded number of batches ahead of the devices."""

from __future__ import annotations

import mxnet as mx
import numpy as np

from mxtrain.engine.bucketing import BucketingModule
from mxtrain.engine.loop import BatchesInFlight


class _Marker:
    def __init__(self, index: int, waited: list[int]) -> None:
        self.index, self.waited = index, waited

    def wait_to_read(self) -> None:
        self.waited.append(self.index)


def test_waits_for_the_oldest_beyond_the_limit() -> None:
    waited: list[int] = []
    in_flight = BatchesInFlight(2)
    for i in range(5):
        in_flight.add(_Marker(i, waited))
        in_flight.add(None)  # a module without gradients gives no marker
    assert waited == [0, 1, 2]  # after batch i, batches i-1 and i may still be queued


def test_progress_marker_is_computed_from_the_last_backward() -> None:
    def sym_gen(_key: int):  # type: ignore[no-untyped-def]
        data = mx.sym.Variable("data")
        out = mx.sym.FullyConnected(data, num_hidden=2, name="fc")
        return mx.sym.MakeLoss(mx.sym.sum(out), name="loss"), ("data",), ()

    module = BucketingModule(sym_gen, 1, [mx.cpu()])
    module.bind([("data", (3, 4))], None)
    module.init_params(mx.init.Uniform(1.0))

    batch = mx.io.DataBatch(
        data=[mx.nd.array(np.arange(12).reshape(3, 4))],
        label=[],
        bucket_key=1,
        provide_data=[mx.io.DataDesc("data", (3, 4))],
    )
    module.forward_backward(batch)
    marker = module.progress_marker()
    # the smallest gradient is fc_bias's: d(sum of outputs)/d(bias) = rows for each unit
    assert marker.asscalar() == module.grad_array("fc_bias").asnumpy().sum() == 6.0
