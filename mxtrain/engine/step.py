"""The per-batch work of the bucketing module on a bound bucket: copy the batch in, forward,
backward, clip and apply the update, read outputs and feed metrics.

Everything here only queues work on MXNet's engine; nothing waits for the devices unless a
docstring says so.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import mxnet as mx

from mxtrain.engine.bucket_pool import Bucket, Targets
from mxtrain.engine.carried_states import CarriedStates
from mxtrain.engine.optimizer_setup import Optimization
from mxtrain.engine.parameters import ParameterStore
from mxtrain.engine.shapes import batch_axis
from mxtrain.engine.softmax_head import SoftmaxGradientHead

__all__ = ["SQUARES_CHUNK", "BatchStep", "GradientClipper", "sum_of_squares"]

NDArray = mx.nd.NDArray

#: values per dot product of :func:`sum_of_squares`; each chunk is one operator call (~20 us
#: on a Zen 5). In float32 a dot of m values is guaranteed within m*u/(1-m*u) (u = 2**-24,
#: ~1.6e-2 here) of the exact sum of squares, whatever order the BLAS kernel adds in; the
#: error observed against a float64 sum is far smaller and differs per CPU and kernel (3e-7 on
#: a Zen 5, 1.4e-6 on an AVX-512 Xeon), so it is no bound to test against
SQUARES_CHUNK = 262144


def _is_sparse(array: Any) -> bool:
    return getattr(array, "stype", "default") != "default"


def sum_of_squares(array: Any) -> Any:
    """sum(array ** 2) as a (1,) array, queued: one BLAS dot per chunk of the flattened array,
    added up. On a Zen 5 EPYC, one thread, for a 10,001 x 400 gradient: 0.6 ms, against 19 ms
    for ``sum(square(x))`` (MXNet's reduction), 6 ms for batch_dot over chunks (a GEMM per
    1 x K row, packing included) and 13 ms for ``norm``, which is 4e-3 off a float64 sum;
    one dot over the whole array is 1e-3 off at 40M values."""
    if _is_sparse(array):  # the stored rows only (reading them waits for the gradient)
        array = array.data
    flat = array.reshape(-1)
    size = flat.shape[0]
    parts = [
        mx.nd.dot(flat[start : start + SQUARES_CHUNK], flat[start : start + SQUARES_CHUNK])
        for start in range(0, size, SQUARES_CHUNK)
    ]
    return (parts[0] if len(parts) == 1 else mx.nd.add_n(*parts)).reshape(1)


def _copy_in(sources: Sequence[Any], targets: Targets) -> None:
    """Copy batch arrays into executor inputs without waiting on the engine."""
    if len(sources) != len(targets):
        raise ValueError(f"batch has {len(sources)} arrays, the executors take {len(targets)}")
    for src, per_dev in zip(sources, targets, strict=True):
        if not isinstance(src, NDArray):
            src = mx.nd.array(src, ctx=mx.cpu(), dtype=per_dev[0][2].dtype)
        for axis, sl, dst in per_dev:
            if sl is None:
                src.copyto(dst)
            elif axis == 0:
                src[sl.start : sl.stop].copyto(dst)  # a view, then an async copy
            elif src.context == dst.context:
                mx.nd.slice_axis(src, axis=axis, begin=sl.start, end=sl.stop, out=dst)
            else:
                mx.nd.slice_axis(src, axis=axis, begin=sl.start, end=sl.stop).copyto(dst)


def _merge(per_dev: list[list[Any]], axes: Sequence[int]) -> list[Any]:
    """Concatenate per-device arrays along their batch axis (first device's context)."""
    merged = []
    for arrays, axis in zip(per_dev, axes, strict=True):
        if len(arrays) == 1 or axis < 0:
            merged.append(arrays[0])
        else:
            ctx = arrays[0].context
            merged.append(mx.nd.concat(*[a.as_in_context(ctx) for a in arrays], dim=axis))
    return merged


class GradientClipper:
    """Clipping by the global norm: before each update, once the gradients are summed over
    devices (and workers), scale them all by ``min(1, bound / norm)`` where ``norm`` is their
    global L2 norm times ``rescale_grad`` (the norm of the gradient the optimizer applies), so
    1 device, N devices and ``dist_sync`` clip alike. Keeps the norms for :meth:`take_norm`."""

    def __init__(self, bound: float) -> None:
        self.bound = bound
        self._norm_sum: Any = None
        self._norm_count = 0

    def clip(self, grads: list[Any], contexts: list[Any], rescale_grad: float) -> None:
        """Clip ``grads`` (per parameter, per device) by their global norm times
        ``rescale_grad`` (queued operations only: nothing waits for the device)."""
        if not grads:
            return
        squares = [sum_of_squares(g[0]) for g in grads]
        total = squares[0] if len(squares) == 1 else mx.nd.add_n(*squares)
        norm = mx.nd.sqrt(total) * rescale_grad
        scale = mx.nd.minimum(self.bound / (norm + 1e-6), 1.0)
        self._norm_sum = norm if self._norm_sum is None else self._norm_sum + norm
        self._norm_count += 1
        # a row_sparse gradient is only scaled by a number in place: that one waits for it
        sparse_scale = None
        for k, ctx in enumerate(contexts):
            mine = scale.as_in_context(ctx)
            for g in grads:
                grad = g[k]
                if not _is_sparse(grad):
                    mx.nd.broadcast_mul(grad, mine, out=grad)
                    continue
                if sparse_scale is None:
                    sparse_scale = float(scale.asscalar())
                if sparse_scale < 1.0:
                    grad *= sparse_scale

    def take_norm(self) -> float | None:
        """The mean norm over the clips since the last call, or None (synchronises)."""
        if self._norm_sum is None or not self._norm_count:
            return None
        value = float(self._norm_sum.asscalar()) / self._norm_count
        self._norm_sum, self._norm_count = None, 0
        return value


class BatchStep:
    """Forward, backward and update of one bucket over the module's parameter store."""

    def __init__(
        self,
        contexts: list[Any],
        store: ParameterStore,
        carried: CarriedStates,
        label_names: list[str],
        head: SoftmaxGradientHead | None = None,
    ) -> None:
        self._contexts = contexts
        self._store = store
        self._carried = carried
        self._label_names = label_names
        self._head = head
        # the head's outputs of the last forward, per device (with a head)
        self._head_outputs: list[list[Any]] = []

    def forward(self, bucket: Bucket, data_batch: Any, train: bool) -> None:
        """Copy the batch in (and the carried states) and run the bucket forward."""
        _copy_in(data_batch.data, bucket.data_targets)
        if bucket.label_targets is not None and data_batch.label:
            _copy_in(data_batch.label, bucket.label_targets)
        carried = self._carried
        if carried:
            carried.load_into(bucket, bool(getattr(data_batch, "reset_states", False)))
        for ex in bucket.execs:
            ex.forward(is_train=train)
        if self._head is not None:
            self._head_outputs = self._run_head(self._head, bucket, data_batch, train)
        if carried:
            carried.keep_from(bucket)

    @staticmethod
    def _run_head(
        head: SoftmaxGradientHead, bucket: Bucket, data_batch: Any, train: bool
    ) -> list[list[Any]]:
        """The head's work after the executors' forward, per device (its labels read from
        the batch on the host, where the rows it touches at backward are found)."""
        name = head.spec.label
        if name not in bucket.label_names or not data_batch.label:
            raise ValueError(f"the softmax head needs the label input {name!r} in every batch")
        host = data_batch.label[bucket.label_names.index(name)]
        if isinstance(host, NDArray):
            host = host.asnumpy()
        single = len(bucket.execs) == 1
        spec = head.spec
        hidden = (
            bucket.output_names.index(spec.gradient_output)
            if spec.gradient_output is not None
            else None
        )
        outs = []
        for k, ex in enumerate(bucket.execs):
            mine = host if single else host[bucket.slices[k].start : bucket.slices[k].stop]
            gradient = ex.arg_dict[spec.gradient_input] if spec.gradient_input else None
            outs.append(
                head.forward(
                    k, ex.outputs, ex.arg_dict[name], mine, train, gradient=gradient, hidden=hidden
                )
            )
        return outs

    def backward(self, bucket: Bucket, out_grads: Any) -> None:
        """Backward through ``bucket``; ``out_grads`` only for non-loss outputs."""
        if self._head is not None:
            if out_grads is not None:
                raise ValueError("a module with a softmax head computes its own out_grads")
            for k, ex in enumerate(bucket.execs):
                gradient = self._head.gradient(k)
                if self._head.spec.gradient_input:
                    ex.backward()  # the gradient is the graph's input, written in place
                else:
                    ex.backward(out_grads=[gradient])
            return
        if out_grads is None:
            for ex in bucket.execs:
                ex.backward()
            return
        if isinstance(out_grads, NDArray):
            out_grads = [out_grads]
        for i, ex in enumerate(bucket.execs):
            sl = bucket.slices[i]
            ctx = self._contexts[i]
            mine = []
            for grad, axis in zip(out_grads, bucket.output_axes, strict=False):
                if axis >= 0 and len(bucket.execs) > 1:
                    part = mx.nd.slice_axis(grad, axis=axis, begin=sl.start, end=sl.stop)
                    mine.append(part.as_in_context(ctx))
                else:
                    mine.append(grad.as_in_context(ctx))
            ex.backward(out_grads=mine)

    def progress_marker(self, bucket: Bucket) -> Any:
        """A one-element array summed from the last backward's smallest gradient, or None
        without gradients."""
        grads = [
            g
            for g in self._store.grad_arrays(bucket.update_indices)
            if g is not None and not _is_sparse(g[0])
        ]
        if not grads:
            return None
        smallest = min((g[0] for g in grads), key=lambda a: a.size)
        return mx.nd.sum(smallest)

    def update(self, bucket: Bucket, opt: Optimization, clipper: GradientClipper | None) -> None:
        """Apply the optimizer to the gradients of the last backward."""
        store = self._store
        names = store.names
        kv = opt.kvstore
        if opt.update_on_kvstore:
            for i in bucket.update_indices:
                name = names[i]
                kv.pushpull(name, store.grads[name], out=store.params[name], priority=-i)
            return
        if kv is not None:
            for i in bucket.update_indices:
                # sum the devices' gradients in place, then every device updates its own copy
                kv.pushpull(names[i], store.grads[names[i]], priority=-i)
        if clipper is not None:
            grads = store.bucket_grads(bucket.execs, bucket.update_indices)
            clipper.clip(grads, self._contexts, float(opt.optimizer.rescale_grad))
        if bucket.device_updates is None:
            bucket.device_updates = self._device_updates(bucket)
        updater = opt.local_updater
        for indices, grads, weights in bucket.device_updates:
            updater(indices, grads, weights)

    def _device_updates(self, bucket: Bucket) -> list[tuple[list[int], list[Any], list[Any]]]:
        """Per device: optimizer indices, gradients and weights, built once per bucket."""
        ndev = len(self._contexts)
        store = self._store
        names = store.names
        out = []
        per_param = store.bucket_grads(bucket.execs, bucket.update_indices)
        for k in range(ndev):
            indices = [i * ndev + k for i in bucket.update_indices]
            if indices:
                grads = [g[k] for g in per_param]  # type: ignore[index]
                weights = [store.params[names[i]][k] for i in bucket.update_indices]
                out.append((indices, grads, weights))
        return out

    def _device_outputs(self, bucket: Bucket) -> list[list[Any]]:
        """``[device][output]`` of the last forward: the executors', or the head's."""
        if self._head is not None:
            return self._head_outputs
        return [ex.outputs for ex in bucket.execs]

    def output_names(self, bucket: Bucket) -> list[str]:
        """The names of :meth:`outputs`, in order."""
        if self._head is not None:
            return self._head.output_names(bucket.output_names)
        return bucket.output_names

    def outputs(self, bucket: Bucket, merge_multi_context: bool) -> list[Any]:
        """Outputs of the last forward: merged over devices, or ``[output][device]``."""
        by_device = self._device_outputs(bucket)
        per_dev = [[outs[i] for outs in by_device] for i in range(len(by_device[0]))]
        if merge_multi_context:
            # every output of a head has its rows on axis 0, as the logits had
            axes = bucket.output_axes if self._head is None else [0] * len(per_dev)
            return _merge(per_dev, axes)
        return per_dev

    @staticmethod
    def input_grads(bucket: Bucket, merge_multi_context: bool = True) -> list[Any]:
        """Gradients with respect to the data inputs (bound with ``inputs_need_grad``)."""
        per_dev = [[ex.grad_dict[n] for ex in bucket.execs] for n in bucket.data_names]
        if merge_multi_context:
            return _merge(per_dev, [batch_axis(d.layout) for d in bucket.data_descs])
        return per_dev

    def update_metric(
        self, bucket: Bucket, eval_metric: Any, labels: Sequence[Any], pre_sliced: bool
    ) -> None:
        """Feed the last outputs and ``labels`` to the metric, one call per device."""
        has_dict = hasattr(eval_metric, "update_dict")
        axes = [batch_axis(d.layout) for d in bucket.label_descs or []]
        single = len(bucket.execs) == 1
        by_device = self._device_outputs(bucket)
        output_names = self.output_names(bucket)
        for k in range(len(bucket.execs)):
            if pre_sliced:
                mine = list(labels[k])
            elif single:
                mine = list(labels)
            else:
                sl = bucket.slices[k]
                mine = []
                for j, label in enumerate(labels):
                    axis = axes[j] if j < len(axes) else 0
                    if axis == 0:
                        mine.append(label[sl.start : sl.stop])
                    elif axis > 0:
                        mine.append(mx.nd.slice_axis(label, axis=axis, begin=sl.start, end=sl.stop))
                    else:
                        mine.append(label)
            preds = by_device[k]
            if has_dict:
                names = bucket.label_names or self._label_names
                eval_metric.update_dict(
                    OrderedDict(zip(names, mine, strict=False)),
                    OrderedDict(zip(output_names, preds, strict=True)),
                )
            else:
                eval_metric.update(mine, preds)
