"""The executors of every bucket: binding on first use, reshaping, and the bound on what
stays bound (``fit.bucket_memory``).

* The default bucket's executors own the parameters, gradients and auxiliary states (the
  :class:`~mxtrain.engine.parameters.ParameterStore`). Every other bucket aliases those arrays.
* Buckets that fit inside the default bucket are bound with ``shared_exec`` (their intermediate
  memory comes out of the default bucket's pool) and a per-device ``shared_buffer`` (their
  data/label arrays are views of the default bucket's). A bucket larger than the default gets
  its own memory but still binds to the store's parameter arrays.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import mxnet as mx

from mxtrain.engine.allocator import return_freed_memory, trim_heaps
from mxtrain.engine.parameters import ParameterStore
from mxtrain.engine.shapes import (
    ShapeList,
    batch_axis,
    input_elements,
    key_fits,
    shape_signature,
    split_batch,
    to_descs,
)

__all__ = [
    "AUTO_BUCKET_MEMORY",
    "HOST_GROUPS",
    "Bucket",
    "BucketPool",
    "Targets",
    "call_sym_gen",
    "planned_pool_bytes",
]

#: ``sym_gen(bucket_key) -> (symbol, data_names, label_names)``, called in a fresh NameManager
SymGen = Callable[[Any], tuple[Any, Sequence[str] | None, Sequence[str] | None]]

#: ``bucket_memory="auto"``: bound buckets may hold 5 x the largest bucket's input positions.
#: The shipped configs' buckets add up to 4.0 x (PTB words) and 4.2 x (PTB characters), so
#: they stay bound (short last batches' reshaped copies count too: a PTB epoch rebinds about
#: one bucket once), while 32 or 50 buckets stay within 5 largest buckets' memory.
#: Measured on the word LM (400 PTB batches, 2-core EPYC): a bound of 1.0 rebinds about
#: every other batch and costs ~10% of the speed.
AUTO_BUCKET_MEMORY = 5.0

#: how the warning about a bucket bound with memory of its own begins (a filter may match it)
LARGER_BUCKET_WARNING = "bucket %r %s the default bucket %r"

#: context groups whose operators run on the CPU whatever the module's devices (operators that
#: MXNet 1.9.1 has on CPU only, such as the sampled softmax's candidate sampler)
HOST_GROUPS = ("mxtrain_host",)

#: one device's input targets: (batch axis, slice of the batch or None for all, destination)
Targets = list[list[tuple[int, slice | None, Any]]]


def call_sym_gen(
    sym_gen: SymGen, key: Any
) -> tuple[Any, Sequence[str] | None, Sequence[str] | None]:
    """``sym_gen(key)``; a fresh NameManager per call gives auto-named nodes the same names
    in every bucket."""
    with mx.name.NameManager():
        return sym_gen(key)


#: how MXNet 1.9.1's ``Executor.debug_str()`` ends: the memory its plan allocated, in MiB
_PLANNED = re.compile(r"^Total (\d+) MB allocated", re.MULTILINE)


def planned_pool_bytes(executor: Any) -> int:
    """Bytes of the memory pool MXNet planned for ``executor``'s intermediate results
    (rounded down to MiB as MXNet reports it; 0 where it does not say)."""
    found = _PLANNED.search(executor.debug_str())
    return int(found.group(1)) * 2**20 if found else 0


def _host_groups(symbol: Any) -> dict[str, Any] | None:
    """``group2ctx`` for a symbol that has operators in HOST_GROUPS, else None."""
    groups = {attrs.get("ctx_group") for attrs in symbol.attr_dict().values()}
    used = [g for g in HOST_GROUPS if g in groups]
    return {g: mx.cpu() for g in used} or None


@contextmanager
def _without_inference_fusion(off: bool) -> Iterator[None]:
    """Bind with MXNet's oneDNN graph fusion off when ``off``: its fused inference
    FullyConnected copies the weights on first use and never reads them again (MXNet 1.9.1),
    so a module whose parameters another module trains would evaluate stale weights.
    MXNet reads the variable at every bind (and says so on stderr)."""
    if not off:
        yield
        return
    name = "MXNET_SUBGRAPH_BACKEND"
    saved = os.environ.get(name)
    os.environ[name] = "NONE"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def fc_weights_gating_bias(symbol: Any, fixed: frozenset[str]) -> set[str]:
    """Fixed weights of FullyConnected layers whose bias is trained.

    MXNet 1.9.1's oneDNN FullyConnected computes the bias gradient only together with the
    weight's: with the weight's ``grad_req`` null, the bias gradient stays zero and the bias
    silently never trains. Such weights are bound with a gradient buffer that no update
    reads (:meth:`ParameterStore.collect` keeps no gradient for a fixed parameter).
    """
    nodes = json.loads(symbol.tojson())["nodes"]
    gating = set()
    for node in nodes:
        if node["op"] != "FullyConnected" or len(node["inputs"]) < 3:
            continue  # no_bias: nothing gated
        weight, bias = (nodes[i]["name"] for i, *_ in node["inputs"][1:3])
        if weight in fixed and bias not in fixed:
            gating.add(weight)
    return gating


def _described(descs: list[Any]) -> str:
    """``data 64x72, softmax_label 64x72``: each input's name and shape."""
    return ", ".join(f"{d.name} {'x'.join(str(n) for n in d.shape)}" for d in descs)


def _sliced(inputs: list[Any], sl: slice) -> dict[str, tuple[int, ...]]:
    """Input shapes of one device's share ``sl`` of the batch."""
    shapes = {}
    for d in inputs:
        shape = list(d.shape)
        axis = batch_axis(d.layout)
        if axis >= 0:
            shape[axis] = sl.stop - sl.start
        shapes[d.name] = tuple(shape)
    return shapes


def _resized(descs: list[Any], batch_size: int) -> list[Any]:
    """The same descriptors with another batch size."""
    out = []
    for d in descs:
        shape = list(d.shape)
        axis = batch_axis(d.layout)
        if axis >= 0:
            shape[axis] = batch_size
        out.append(mx.io.DataDesc(d.name, tuple(shape), d.dtype, d.layout))
    return out


def reshaped_elements(origin: int, own: int) -> int:
    """Input positions held by a bucket's reshape for ``own`` positions beside its origin's
    ``origin``: a smaller reshape runs in the origin's arrays (MXNet reshapes them in place
    and takes intermediates from the shared pool); a larger one allocates its own beside them
    (``allow_up_sizing``)."""
    return origin + own if own > origin else origin


class Bucket:
    """The executors of one bucket key (one per device) and precomputed views of their arrays."""

    def __init__(
        self,
        key: Any,
        symbol: Any,
        data_descs: list[Any],
        label_descs: list[Any] | None,
        execs: list[Any],
        slices: list[slice],
        batch_size: int,
        shares_memory: bool,
        update_indices: list[int],
        origin: Bucket | None = None,
    ) -> None:
        self.key = key
        self.symbol = symbol
        self.data_descs = data_descs
        self.label_descs = label_descs
        self.execs = execs
        # the bucket first bound for this key: reshapes start from its executors, and the
        # default bucket's are what the other buckets share memory with. Not a reference to
        # self: a cycle would keep unbound executors (and their memory) until the cyclic GC.
        self._origin = origin
        self.base_execs = self.origin.execs
        self.slices = slices
        self.batch_size = batch_size
        self.shares_memory = shares_memory
        self.update_indices = update_indices
        self.watched = False  # whether the pool's output watcher is set on the executors
        # filled by the batch step's update() on first use
        self.device_updates: list[tuple[list[int], list[Any], list[Any]]] | None = None
        self.data_sig = shape_signature(data_descs)
        self.label_sig = shape_signature(label_descs)
        self.data_names = [d.name for d in data_descs]
        self.label_names = [d.name for d in label_descs] if label_descs else []
        self.output_names: list[str] = symbol.list_outputs()
        self.output_axes = [
            batch_axis(symbol[i].attr("__layout__")) for i in range(len(self.output_names))
        ]
        self.data_targets = self._targets(data_descs)
        self.label_targets = self._targets(label_descs) if label_descs else None

    @property
    def origin(self) -> Bucket:
        return self._origin if self._origin is not None else self

    @property
    def elements(self) -> int:
        """Input positions its executors hold memory for, a reshape's origin included."""
        own = input_elements(self.data_descs)
        return own if self.origin is self else reshaped_elements(self.origin.elements, own)

    @property
    def output_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """``(name, shape)`` of every output for the whole batch."""
        shapes = []
        outputs = self.execs[0].outputs
        for name, out, axis in zip(self.output_names, outputs, self.output_axes, strict=True):
            shape = list(out.shape)
            if axis >= 0:
                shape[axis] = self.batch_size
            shapes.append((name, tuple(shape)))
        return shapes

    def _targets(self, descs: list[Any]) -> Targets:
        """Per input, per device: (batch axis, slice of the batch or None for all, dest)."""
        single = len(self.execs) == 1
        out = []
        for d in descs:
            axis = batch_axis(d.layout)
            per_dev = []
            for sl, ex in zip(self.slices, self.execs, strict=True):
                whole = single or axis < 0
                per_dev.append((axis, None if whole else sl, ex.arg_dict[d.name]))
            out.append(per_dev)
        return out

    def matches(self, data_descs: Sequence[Any] | None, label_descs: Sequence[Any] | None) -> bool:
        if data_descs and shape_signature(data_descs) != self.data_sig:
            return False
        return not (
            self.label_descs and label_descs and shape_signature(label_descs) != self.label_sig
        )


class BucketPool:
    """Binds, reshapes and unbinds the buckets' executors over one parameter store.

    ``bucket_memory`` bounds what stays bound. Every bound bucket keeps memory of its own
    that executors cannot share (operator state such as a fused RNN's workspace, which grows
    with the bucket's length), so keeping every bucket bound costs memory in proportion to
    the number of buckets. With ``bucket_memory = f`` the buckets bound at once hold at most
    ``f`` times the default bucket's input positions: binding another one first unbinds the
    buckets used least often so far (then least recently); rebinding later costs a bind and
    a slower first batch. The default bucket's first executors then only hold the parameters
    and the shared memory pool and never run. ``None`` keeps every bucket bound (``"auto"``
    of the module is :data:`AUTO_BUCKET_MEMORY`). ``strict_memory``: freed executor memory
    leaves the process at once (a bound the user set), rather than only when the heaps are
    trimmed after unbinding.
    """

    def __init__(
        self,
        sym_gen: SymGen,
        default_key: Any,
        contexts: list[Any],
        work_load: list[float],
        store: ParameterStore,
        *,
        default_symbol: Any,
        data_names: list[str],
        label_names: list[str],
        state_names: Sequence[str],
        logger: logging.Logger,
        extra_inputs: Sequence[str] = (),
        bucket_memory: float | None,
        strict_memory: bool,
    ) -> None:
        self._sym_gen = sym_gen
        self.default_key = default_key
        self._contexts = contexts
        self._work_load = work_load
        self._store = store
        self._state_names = list(state_names)
        #: inputs neither data, labels nor states that every bucket shares (a softmax head's
        #: gradient input): views of the default bucket's arrays, like the data
        self._extra_inputs = list(extra_inputs)
        self.logger = logger
        self._bucket_memory = bucket_memory
        self._strict_memory = strict_memory
        self.default_symbol = default_symbol
        self.data_names = data_names
        self.label_names = label_names
        #: monitor callback set on every executor a batch runs (see watch_outputs)
        self._output_watcher: Callable[[Any, Any], None] | None = None
        self.reset()

    def watch_outputs(self, callback: Callable[[Any, Any], None]) -> None:
        """Have every executor that runs from now on call ``callback(name, array_handle)``
        for each node's inputs and outputs (MXNet's monitor, ``monitor_all``). Each node
        then waits for the last: for calibration, not for speed."""
        self._output_watcher = callback
        for bucket in self.buckets.values():
            self._watched(bucket)

    def _watched(self, bucket: Bucket) -> Bucket:
        if self._output_watcher is not None and not bucket.watched:
            for ex in bucket.execs:
                ex.set_monitor_callback(self._output_watcher, monitor_all=True)
            bucket.watched = True
        return bucket

    def reset(
        self,
        *,
        for_training: bool = False,
        inputs_need_grad: bool = False,
        grad_req: str | Mapping[str, str] = "write",
        with_labels: bool = False,
        borrows_params: bool = False,
    ) -> None:
        """Drop every executor and set how the next ones are bound."""
        self.binded = False
        self.for_training = for_training
        self.inputs_need_grad = inputs_need_grad
        self._grad_req = grad_req
        self._with_labels = with_labels
        self.buckets: dict[Any, Bucket] = {}  # runnable buckets, least recently used first
        self.curr: Bucket | None = None
        self._budget: int | None = None  # input positions the bound buckets may hold
        self._unbound: set[Any] = set()  # keys unbound for bucket_memory (rebinds are counted)
        self._uses: dict[Any, int] = {}  # times each bucket was asked for (bucket_memory)
        self._bound_told = False  # whether the bound was logged (once a second key binds)
        self.rebinds = 0  # buckets bound again after bucket_memory unbound them
        self.default: Bucket | None = None
        self._shared_buffers: list[dict[str, Any]] = [{} for _ in self._contexts]
        self._borrows_params = borrows_params  # the parameters are another module's
        self._warned_large = False
        self._store.clear()

    def borrow_parameters(self, params: Mapping[str, list[Any]]) -> None:
        """Seed the executors' shared buffers with another store's parameter arrays (one
        per device): simple_bind then binds them (same name, shape and type) instead of
        allocating its own."""
        for i, buffer in enumerate(self._shared_buffers):
            for name, arrays in params.items():
                buffer[name] = arrays[i]

    def bind_default(self, data_shapes: ShapeList, label_shapes: ShapeList | None) -> None:
        """Bind the default bucket's executors, which hold the store and the memory pool."""
        bucket = self._bind_bucket(
            self.default_key, self.default_symbol, data_shapes, label_shapes, default=True
        )
        self.default = self.curr = bucket
        if self._bucket_memory is None:
            self.buckets[self.default_key] = bucket
        else:
            # the first executors only hold the store and the memory pool: a runnable copy of
            # the default bucket is bound on first use and can be unbound like any other
            self._budget = int(self._bucket_memory * bucket.elements)
        self.binded = True

    def set_bound(self, bucket_memory: float | None, *, strict: bool) -> None:
        """Bound the buckets bound at once to ``bucket_memory`` times the default bucket's
        input positions (None: no bound) from the next bucket bound on."""
        self._bucket_memory = bucket_memory
        self._strict_memory = strict
        self._bound_told = False
        if self.default is None:
            return
        if bucket_memory is None:
            self._budget = None
            self.buckets.setdefault(self.default_key, self.default)
            return
        self._budget = int(bucket_memory * self.default.elements)
        if self.buckets.get(self.default_key) is self.default:
            # the first executors hold the store and the pool; under a bound they never run
            del self.buckets[self.default_key]

    def _grad_reqs(self, symbol: Any, data_names: Sequence[str]) -> dict[str, str]:
        req = self._grad_req
        base = req if isinstance(req, str) else "write"
        fixed = self._store.fixed_set
        gating = fc_weights_gating_bias(symbol, fixed) if self.for_training and fixed else set()
        reqs = {}
        for name in symbol.list_arguments():
            if not self.for_training:
                reqs[name] = "null"
            elif name in gating:
                reqs[name] = "write"  # a scratch buffer: "add" would grow it unbounded
            elif name in self._store.names:
                reqs[name] = "null" if name in fixed else base
            elif name in data_names:
                reqs[name] = base if self.inputs_need_grad else "null"
            else:
                reqs[name] = "null"
        if isinstance(req, Mapping) and self.for_training:
            reqs.update({k: v for k, v in req.items() if k in reqs})
        return reqs

    @staticmethod
    def _parse_shapes(
        key: Any,
        data_names: Sequence[str],
        label_names: Sequence[str],
        args: Sequence[str],
        data_shapes: ShapeList,
        label_shapes: ShapeList | None,
    ) -> tuple[list[Any], list[Any] | None]:
        data = to_descs(data_shapes) or []
        if sorted(d.name for d in data) != sorted(data_names):
            raise ValueError(
                f"bucket {key!r}: data shapes {[d.name for d in data]} do not match the "
                f"symbol's data names {list(data_names)}"
            )
        labels = to_descs(label_shapes)
        if labels is not None:
            unknown = [d.name for d in labels if d.name not in args]
            if unknown:
                raise ValueError(
                    f"bucket {key!r}: labels {unknown} are not arguments of the symbol "
                    f"(label names from sym_gen: {list(label_names)})"
                )
        return data, labels

    def _bind_bucket(
        self,
        key: Any,
        symbol: Any,
        data_shapes: ShapeList,
        label_shapes: ShapeList | None,
        *,
        default: bool = False,
        data_names: Sequence[str] | None = None,
        label_names: Sequence[str] | None = None,
    ) -> Bucket:
        if data_names is None:
            data_names, label_names = self.data_names, self.label_names
        store = self._store
        args = symbol.list_arguments()
        data, labels = self._parse_shapes(
            key, data_names, label_names or [], args, data_shapes, label_shapes
        )
        inputs = data + (labels or [])
        batch_size, slices = self._decide_slices(key, inputs)
        names = set(d.name for d in inputs) | set(self._state_names) | set(self._extra_inputs)
        params = [a for a in args if a not in names and a not in (label_names or [])]
        if not default:
            extra = [p for p in params if p not in store.params]
            if extra:
                raise ValueError(
                    f"bucket {key!r} has parameters the default bucket "
                    f"{self.default_key!r} lacks: {extra}"
                )
        reqs = self._grad_reqs(symbol, [d.name for d in data])
        types = {d.name: d.dtype for d in inputs}

        shares = default or self._fits_default(key, inputs)
        if not default:
            self._check_param_shapes(key, symbol, inputs, slices)
        if not shares and not self._warned_large:
            self._warn_larger(key, inputs)
            self._warned_large = True

        with _without_inference_fusion(self._borrows_params):
            execs = self._bind_executors(
                symbol, inputs, slices, types, reqs, params, default, shares
            )

        if default:
            store.collect(execs)
        present = set(params)
        update_indices = [
            i
            for i, n in enumerate(store.names)
            if n in present and self.for_training and store.grads.get(n) is not None
        ]
        return Bucket(key, symbol, data, labels, execs, slices, batch_size, shares, update_indices)

    def _bind_executors(
        self,
        symbol: Any,
        inputs: list[Any],
        slices: list[Any],
        types: dict[str, Any],
        reqs: dict[str, str],
        params: list[str],
        default: bool,
        shares: bool,
    ) -> list[Any]:
        """One executor per device for a bucket (see _bind_bucket)."""
        host_groups = _host_groups(symbol)
        execs = []
        for i, ctx in enumerate(self._contexts):
            shapes = _sliced(inputs, slices[i])
            shapes.update(self._extra_input_shapes(symbol, shapes))
            if default:
                ex = symbol.simple_bind(
                    ctx=ctx,
                    group2ctx=host_groups,
                    grad_req=reqs,
                    type_dict=types,
                    # without a shared_exec, simple_bind takes arrays from shared_buffer only
                    # for the arguments *not* named here (it allocates zeros for those named)
                    shared_arg_names=[] if self._borrows_params else params,
                    shared_buffer=self._shared_buffers[i],
                    **shapes,
                )
            elif shares:
                assert self.default is not None
                ex = symbol.simple_bind(
                    ctx=ctx,
                    group2ctx=host_groups,
                    grad_req=reqs,
                    type_dict=types,
                    shared_arg_names=params,
                    shared_exec=self.default.base_execs[i],
                    shared_buffer=self._shared_buffers[i],
                    **shapes,
                )
            else:
                ex = self._bind_own_memory(symbol, i, shapes, types, reqs, host_groups)
            execs.append(ex)
        return execs

    def _extra_input_shapes(
        self, symbol: Any, shapes: Mapping[str, Any]
    ) -> dict[str, tuple[int, ...]]:
        """The shapes of the extra inputs as the graph infers them from ``shapes``: given
        to simple_bind, which otherwise refuses a shared array whose shape changed."""
        if not self._extra_inputs:
            return {}
        arg_shapes, _, _ = symbol.infer_shape_partial(**shapes)
        inferred = dict(zip(symbol.list_arguments(), arg_shapes or [], strict=False))
        return {n: tuple(inferred[n]) for n in self._extra_inputs if inferred.get(n)}

    def _decide_slices(self, key: Any, inputs: list[Any]) -> tuple[int, list[slice]]:
        batch_size = None
        for d in inputs:
            axis = batch_axis(d.layout)
            if axis < 0:
                continue
            if batch_size is None:
                batch_size = d.shape[axis]
            elif d.shape[axis] != batch_size:
                raise ValueError(
                    f"bucket {key!r}: inputs disagree on the batch size "
                    f"({batch_size} vs {d.name} {tuple(d.shape)})"
                )
        if batch_size is None:
            raise ValueError(f"bucket {key!r}: no input has a batch axis")
        return batch_size, split_batch(batch_size, self._work_load)

    def _fits_default(self, key: Any, inputs: list[Any]) -> bool:
        assert self.default is not None
        default_inputs = self.default.data_descs + (self.default.label_descs or [])
        return key_fits(key, self.default_key) and input_elements(inputs) <= input_elements(
            default_inputs
        )

    def _warn_larger(self, key: Any, inputs: list[Any]) -> None:
        """Say once that a bucket gets memory of its own, and why: a longer key than the
        default's, or (the key fits) inputs of more values, as a larger batch gives."""
        if not key_fits(key, self.default_key):
            verb, why = (
                "is larger than",
                "Make the default bucket the largest one (see largest_key())",
            )
        else:
            assert self.default is not None
            default_inputs = self.default.data_descs + (self.default.label_descs or [])
            verb = "needs more input memory than"
            why = (
                f"Its inputs hold {input_elements(inputs):,} values against the default "
                f"bucket's {input_elements(default_inputs):,} ({_described(inputs)} against "
                f"{_described(default_inputs)}): a larger batch, such as an evaluation batch "
                "size above the training one, or wider inputs. Give every batch at most the "
                "default bucket's size"
            )
        self.logger.warning(
            LARGER_BUCKET_WARNING + ": binding it with its own memory. %s so all buckets share "
            "memory.",
            key,
            verb,
            self.default_key,
            why,
        )

    def _check_param_shapes(self, key: Any, symbol: Any, inputs: list[Any], slices: list) -> None:
        # MXNet's own failure here is a C++ check naming one shape pair ("Inferred shape does
        # not match shared_exec.arg_array's shape"), and the own-memory path would not check at
        # all: say which bucket and which parameters instead
        arg_shapes, _, aux_shapes = symbol.infer_shape(**_sliced(inputs, slices[0]))
        if arg_shapes is None:
            raise ValueError(f"bucket {key!r}: cannot infer shapes from {inputs}")
        params, auxs = self._store.params, self._store.auxs
        wrong = []
        for name, shape in zip(symbol.list_arguments(), arg_shapes, strict=True):
            if name in params and tuple(params[name][0].shape) != tuple(shape):
                wrong.append(f"{name} {tuple(shape)} vs {tuple(params[name][0].shape)}")
        for name, shape in zip(symbol.list_auxiliary_states(), aux_shapes, strict=True):
            if name not in auxs:
                wrong.append(f"{name} (auxiliary state missing from the default bucket)")
            elif tuple(auxs[name][0].shape) != tuple(shape):
                wrong.append(f"{name} {tuple(shape)} vs {tuple(auxs[name][0].shape)}")
        if wrong:
            raise ValueError(
                f"bucket {key!r} cannot share parameters with the default bucket "
                f"{self.default_key!r}: " + "; ".join(wrong)
            )

    def _bind_own_memory(
        self,
        symbol: Any,
        i: int,
        shapes: dict,
        types: dict,
        reqs: dict[str, str],
        host_groups: dict[str, Any] | None,
    ) -> Any:
        """Bind with the store's parameter arrays but freshly allocated inputs and workspace."""
        store = self._store
        ctx = self._contexts[i]
        arg_shapes, _, _ = symbol.infer_shape(**shapes)
        arg_types, _, _ = symbol.infer_type(**types)
        args, grads = {}, {}
        for name, shape, dtype in zip(symbol.list_arguments(), arg_shapes, arg_types, strict=True):
            if name in store.params:
                args[name] = store.params[name][i]
                g = store.grads[name]
                if reqs[name] != "null":
                    # a fixed weight computed only for its bias's sake has no stored gradient
                    grads[name] = g[i] if g is not None else mx.nd.zeros(shape, ctx, dtype=dtype)
            else:
                args[name] = mx.nd.zeros(shape, ctx=ctx, dtype=dtype)
                if reqs[name] != "null":
                    grads[name] = mx.nd.zeros(shape, ctx=ctx, dtype=dtype)
        reqs = {n: (r if n in grads else "null") for n, r in reqs.items()}
        aux = {n: store.auxs[n][i] for n in symbol.list_auxiliary_states()}
        return symbol.bind(
            ctx,
            args=args,
            args_grad=grads,
            grad_req=reqs,
            aux_states=aux,
            group2ctx=host_groups,
        )

    def _reshape_bucket(
        self, bucket: Bucket, data_shapes: ShapeList, label_shapes: ShapeList | None
    ) -> Bucket:
        """Same key, new input shapes (e.g. a short last batch): reshape its first executors."""
        bucket = bucket.origin
        if bucket.matches(data_shapes, label_shapes):
            return bucket  # back to the shapes it was bound with: no reshape needed
        data, labels = self._parse_shapes(
            bucket.key,
            bucket.data_names,
            bucket.label_names,
            bucket.symbol.list_arguments(),
            data_shapes,
            label_shapes,
        )
        if labels is None and bucket.label_descs:
            labels = _resized(bucket.label_descs, self._decide_slices(bucket.key, data)[0])
        inputs = data + (labels or [])
        batch_size, slices = self._decide_slices(bucket.key, inputs)
        # begin states are inputs the batch does not give: their shape follows the batch size
        partial = bool(self._state_names)
        execs = []
        for i, ex in enumerate(bucket.base_execs):
            shapes = _sliced(inputs, slices[i])
            shapes.update(self._extra_input_shapes(bucket.symbol, shapes))
            execs.append(ex.reshape(allow_up_sizing=True, partial_shaping=partial, **shapes))
        return Bucket(
            bucket.key,
            bucket.symbol,
            data,
            labels,
            execs,
            slices,
            batch_size,
            bucket.shares_memory,
            bucket.update_indices,
            origin=bucket,
        )

    def get(
        self,
        key: Any,
        data_shapes: ShapeList | None,
        label_shapes: ShapeList | None,
        keep: Sequence[Any] = (),
    ) -> Bucket:
        """The runnable bucket of ``key`` for these input shapes, bound or reshaped if needed
        (``keep``: keys that must stay bound while making room)."""
        if not self.binded:
            raise RuntimeError("call bind() first")
        if key is None:
            key = self.default_key
        if not self._with_labels:
            label_shapes = None
        bucket = self.buckets.get(key)
        if bucket is not None:
            if bucket.matches(data_shapes, label_shapes):
                self._touch(key)
                return self._watched(bucket)
            assert data_shapes is not None
            wanted = reshaped_elements(bucket.origin.elements, input_elements(data_shapes))
            self._make_room(max(wanted - bucket.elements, 0), keep=(key, *keep))
            bucket = self._reshape_bucket(bucket, data_shapes, label_shapes or None)
        else:
            if data_shapes is None:
                raise ValueError(f"bucket {key!r} is not bound yet: its data shapes are needed")
            if key != self.default_key:
                self._tell_bound()
            self._make_room(input_elements(data_shapes), keep=keep)
            if key in self._unbound:
                self.rebinds += 1
            symbol, data_names, label_names = call_sym_gen(self._sym_gen, key)
            bucket = self._bind_bucket(
                key,
                symbol,
                data_shapes,
                label_shapes,
                data_names=list(data_names or []),
                label_names=list(label_names or []),
            )
        # a reshaped default bucket replaces the entry but not self.default: sharing, size
        # checks and rescale_grad keep referring to the executors bound first
        self.buckets[key] = bucket
        self._touch(key)
        return self._watched(bucket)

    def switch(
        self, key: Any, data_shapes: ShapeList | None, label_shapes: ShapeList | None
    ) -> None:
        """Make ``key`` current, binding it (or reshaping it) if needed."""
        self.curr = self.get(key, data_shapes, label_shapes)

    def for_batch(self, batch: Any, keep: Sequence[Any] = (), ahead: bool = False) -> Bucket | None:
        """The batch's bucket (by its ``bucket_key``, ``provide_data`` and ``provide_label``);
        None when ``ahead`` and it does not fit beside the buckets in ``keep`` yet."""
        key = getattr(batch, "bucket_key", None)
        if key is None:
            key = self.default_key
        bucket = self.buckets.get(key)
        data_descs = getattr(batch, "provide_data", None)
        label_descs = getattr(batch, "provide_label", None)
        if bucket is not None and bucket.matches(data_descs, label_descs):
            self._touch(key)
            return self._watched(bucket)
        if not data_descs:
            names = bucket.data_names if bucket is not None else call_sym_gen(self._sym_gen, key)[1]
            data_descs = [(n, a.shape) for n, a in zip(names or [], batch.data, strict=True)]
        if ahead and not self._room_for(input_elements(data_descs), (key, *keep)):
            return None  # bound by forward(), once the current bucket may go
        return self.get(key, data_descs, label_descs, keep=keep)

    # -- bounded memory (bucket_memory) -----------------------------------------------------

    def _tell_bound(self) -> None:
        """Log the bound once, when a second bucket key binds: with one key (data that is
        not bucketed) there is nothing to bound."""
        if self._budget is None or self._bound_told:
            return
        self._bound_told = True
        self.logger.info(
            "bucket_memory %g: bound buckets hold at most %d input positions (%g x the "
            "largest bucket); beyond that the least used are unbound",
            self._bucket_memory,
            self._budget,
            self._bucket_memory,
        )

    def _touch(self, key: Any) -> None:
        """Count a use of ``key`` and make it the most recently used bucket (the dict keeps
        use order)."""
        if self._budget is not None:
            self.buckets[key] = self.buckets.pop(key)
            self._uses[key] = self._uses.get(key, 0) + 1

    def _room_for(self, needed: int, keep: Sequence[Any]) -> bool:
        """Whether ``needed`` more positions fit once every bucket not in ``keep`` is gone."""
        if self._budget is None:
            return True
        kept = sum(b.elements for k, b in self.buckets.items() if k in keep)
        return kept + needed <= self._budget

    def _make_room(self, needed: int, keep: Sequence[Any] = ()) -> None:
        """Unbind the least used buckets (not those in ``keep``; fewest uses first, then
        least recently used) until ``needed`` more input positions fit in the budget, or
        nothing more can go.

        Shuffled batches draw buckets at the data's frequencies, so keeping the frequent
        ones bound rebinds less than least-recently-used alone: on the default word LM's
        PTB epoch with a bound of 3 x, 68 rebinds instead of 122 (simulated on its order).
        """
        if self._budget is None:
            return
        held = self.bound_positions
        if held + needed <= self._budget:
            return
        # under a bound the user set, freed executor memory must leave the process from the
        # first unbinding on; not before, since the fixed thresholds make every large
        # temporary an mmap (a few percent per batch on the word LM that a run which never
        # unbinds need not pay)
        if self._strict_memory:
            return_freed_memory()
        # let queued work on the executors finish, so their memory is free before the new
        # bucket allocates its own (the engine would otherwise release it later)
        mx.nd.waitall()
        recency = {k: i for i, k in enumerate(self.buckets)}
        candidates = sorted(
            (k for k in self.buckets if k not in keep),
            key=lambda k: (self._uses.get(k, 0), recency[k]),
        )
        for key in candidates:
            if held + needed <= self._budget:
                break
            held -= self.buckets.pop(key).elements
            if not self._unbound:
                self.logger.info(
                    "unbinding bucket %r, the least used: bound buckets may hold "
                    "%d input positions (bucket_memory %g x the default bucket); buckets are "
                    "rebound when needed",
                    key,
                    self._budget,
                    self._bucket_memory,
                )
            self._unbound.add(key)
        trim_heaps()  # the unbound executors' pages, freed into glibc's heaps, leave them

    @property
    def bound_positions(self) -> int:
        """Input positions (batch x length) of every runnable bucket bound now."""
        return sum(b.elements for b in self.buckets.values())

    @property
    def bucket_keys(self) -> list[Any]:
        """Keys of the runnable buckets bound now (least recently used first under a bound,
        else in binding order)."""
        return list(self.buckets)
