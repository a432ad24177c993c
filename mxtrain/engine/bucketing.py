"""Our bucketing module: one set of parameters, one executor per (bucket, device).

It follows the semantics of MXNet 1.9.1's ``mx.mod.BucketingModule`` (same initialization order,
same optimizer indices, same kvstore calls, so training is numerically identical) but manages its
executors itself instead of stacking ``BucketingModule -> Module -> DataParallelExecutorGroup``:

* The default bucket's executors own the parameters, gradients and auxiliary states (the
  "store"). Every other bucket aliases those arrays, so ``update()`` always works on the store,
  whatever bucket ran last.
* Buckets that fit inside the default bucket are bound with ``shared_exec`` (their intermediate
  memory comes out of the default bucket's pool) and a per-device ``shared_buffer`` (their
  data/label arrays are views of the default bucket's). A bucket larger than the default gets its
  own memory but still binds to the store's parameter arrays.
* Parameters are indexed by the default bucket's parameter order everywhere, so optimizer indices
  never depend on which bucket happens to be current.

Nothing here knows about YAML or click.
"""

from __future__ import annotations

import atexit
import fnmatch
import logging
import os
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np

from mxtrain.engine.allocator import return_freed_memory, trim_heaps
from mxtrain.run.atomic import save_atomically
from mxtrain.run.params import ParamsFileError, ParamShapes, param_problems, read_params

__all__ = ["BucketingModule", "key_fits", "largest_key", "split_batch"]

NDArray = mx.nd.NDArray
SymGen = Callable[[Any], tuple[Any, Sequence[str] | None, Sequence[str] | None]]
ShapeList = Sequence[Any]  # (name, shape) pairs or mx.io.DataDesc

_LOG = logging.getLogger(__name__)

# MXNet's own heuristic: local kvstore updates on the kvstore unless a parameter is this big.
_BIG_PARAM_ELEMENTS = 16 * 1024 * 1024


_INTERPRETER_EXITING = False

#: ``bucket_memory="auto"``: bound buckets may hold 5 x the largest bucket's input positions.
#: The shipped configs' buckets add up to 4.0 x (PTB words) and 4.2 x (PTB characters), so
#: they stay bound (short last batches' reshaped copies count too: a PTB epoch rebinds about
#: one bucket once), while 32 or 50 buckets stay within 5 largest buckets' memory.
#: Measured on the word LM (400 PTB batches, 2-core EPYC): a bound of 1.0 rebinds about
#: every other batch and costs ~10% of the speed.
AUTO_BUCKET_MEMORY = 5.0


@atexit.register
def _note_exit() -> None:  # registered after MXNet's own hook, so it runs before it
    global _INTERPRETER_EXITING
    _INTERPRETER_EXITING = True


def _wait_before_freeing_kvstore() -> None:
    """Let the engine finish before a kvstore this module created can be freed.

    MXNet 1.9.1 deletes a local/device kvstore (and its ``CommCPU``/``CommDevice``) at once, while
    reduce and broadcast operations already queued on the engine still point into it: a
    use-after-free that crashed the process with SIGFPE inside ``CommCPU::ReduceSumCPU`` when a
    multi-device module was dropped right after ``update()``. Waiting costs nothing when idle.
    """
    if _INTERPRETER_EXITING:  # MXNet's exit hook drains the engine itself
        return
    try:
        mx.nd.waitall()
    except Exception:  # never raise from a destructor path
        _LOG.debug("waitall before freeing the kvstore failed", exc_info=True)


# ----------------------------------------------------------------------------- bucket keys


def _key_parts(key: Any) -> tuple[Any, ...] | None:
    """Key as a tuple of comparable numbers, or None when keys of this kind have no order."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int | float | np.integer | np.floating):
        return (key,)
    if isinstance(key, tuple | list) and all(
        isinstance(k, int | float | np.integer | np.floating) and not isinstance(k, bool)
        for k in key
    ):
        return tuple(key)
    return None


def key_fits(key: Any, bound: Any) -> bool:
    """True when bucket ``key`` is no larger than ``bound`` (elementwise for tuples).

    Keys without an order (strings, mixed tuples, tuples of different lengths) are treated as
    fitting: the module then falls back to comparing input sizes.
    """
    a, b = _key_parts(key), _key_parts(bound)
    if a is None or b is None or len(a) != len(b):
        return True
    return all(x <= y for x, y in zip(a, b, strict=True))


def largest_key(keys: Iterable[Any]) -> Any:
    """The key to use as default bucket: the max for ints, the elementwise max for tuples.

    For tuple keys the result may not be one of ``keys`` (``(5, 9)`` and ``(8, 4)`` give
    ``(8, 9)``); it is the smallest key every bucket fits into, which is what the default bucket
    must be for memory sharing.
    """
    keys = list(keys)
    if not keys:
        raise ValueError("largest_key() needs at least one bucket key")
    parts = [_key_parts(k) for k in keys]
    if any(p is None for p in parts) or len({len(p) for p in parts if p is not None}) != 1:
        raise ValueError(f"bucket keys have no common order: {keys!r}")
    if not isinstance(keys[0], tuple | list):
        return max(keys)
    best = tuple(max(col) for col in zip(*[p for p in parts if p is not None], strict=True))
    return type(keys[0])(best) if isinstance(keys[0], tuple) else best


def split_batch(batch_size: int, work_load_list: Sequence[float]) -> list[slice]:
    """Split ``batch_size`` samples across devices in proportion to ``work_load_list``.

    Same split as MXNet's data-parallel executors: each share is rounded, the last device takes
    what rounding left over, and an empty share is an error.
    """
    total = float(sum(work_load_list))
    counts = [round(w * batch_size / total) for w in work_load_list]
    if sum(counts) < batch_size:
        counts[-1] += batch_size - sum(counts)
    slices = []
    end = 0
    for n in counts:
        begin = min(end, batch_size)
        end = min(begin + n, batch_size)
        if begin >= end:
            raise ValueError(
                f"cannot split a batch of {batch_size} over work loads {list(work_load_list)}: "
                "some devices would get no samples"
            )
        slices.append(slice(begin, end))
    return slices


def fewest_rows(devices: int, work_load: Sequence[float] | None) -> int:
    """The smallest batch every device gets a row of (MXNet's split by work load)."""
    loads = list(work_load) if work_load else [1.0] * devices
    for rows in range(devices, 64 * devices + 1):
        try:
            split_batch(rows, loads)
            return rows
        except ValueError:
            continue
    return 64 * devices


# ----------------------------------------------------------------------------- helpers


def _to_descs(shapes: ShapeList | None) -> list[Any] | None:
    if shapes is None:
        return None
    return [s if isinstance(s, mx.io.DataDesc) else mx.io.DataDesc(*s) for s in shapes]


def _signature(descs: Sequence[Any] | None) -> tuple[tuple[str, tuple[int, ...]], ...]:
    if not descs:
        return ()
    return tuple((d[0], tuple(d[1])) for d in descs)


def _batch_axis(layout: str | None) -> int:
    return mx.io.DataDesc.get_batch_axis(layout)


def _elements(descs: Sequence[Any] | None) -> int:
    return sum(int(np.prod(d[1] if isinstance(d, tuple) else d.shape)) for d in descs or ())


def _bucket_elements(bucket: _Bucket) -> int:
    """Input positions a bound bucket's executors were sized for (its reshape's too)."""
    own = _elements(bucket.data_descs)
    return own if bucket.origin is bucket else own + _elements(bucket.origin.data_descs)


class _Bucket:
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
        origin: _Bucket | None = None,
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
        # filled by BucketingModule.update() on first use
        self.device_updates: list[tuple[list[int], list[Any], list[Any]]] | None = None
        self.data_sig = _signature(data_descs)
        self.label_sig = _signature(label_descs)
        self.data_names = [d.name for d in data_descs]
        self.label_names = [d.name for d in label_descs] if label_descs else []
        self.output_names: list[str] = symbol.list_outputs()
        self.output_axes = [
            _batch_axis(symbol[i].attr("__layout__")) for i in range(len(self.output_names))
        ]
        self.data_targets = self._targets(data_descs)
        self.label_targets = self._targets(label_descs) if label_descs else None

    @property
    def origin(self) -> _Bucket:
        return self._origin if self._origin is not None else self

    def _targets(self, descs: list[Any]) -> list[list[tuple[int, slice | None, Any]]]:
        """Per input, per device: (batch axis, slice of the batch or None for all, dest)."""
        single = len(self.execs) == 1
        out = []
        for d in descs:
            axis = _batch_axis(d.layout)
            per_dev = []
            for sl, ex in zip(self.slices, self.execs, strict=True):
                whole = single or axis < 0
                per_dev.append((axis, None if whole else sl, ex.arg_dict[d.name]))
            out.append(per_dev)
        return out

    def matches(self, data_descs: Sequence[Any] | None, label_descs: Sequence[Any] | None) -> bool:
        if data_descs and _signature(data_descs) != self.data_sig:
            return False
        return not (self.label_descs and label_descs and _signature(label_descs) != self.label_sig)


#: context groups whose operators run on the CPU whatever the module's devices (operators that
#: MXNet 1.9.1 has on CPU only, such as the sampled softmax's candidate sampler)
HOST_GROUPS = ("mxtrain_host",)


def _host_groups(symbol: Any) -> dict[str, Any] | None:
    """``group2ctx`` for a symbol that has operators in HOST_GROUPS, else None."""
    groups = {attrs.get("ctx_group") for attrs in symbol.attr_dict().values()}
    used = [g for g in HOST_GROUPS if g in groups]
    return {g: mx.cpu() for g in used} or None


#: values per dot product of :func:`_sum_of_squares`; each chunk is one operator call (~20 us
#: on a Zen 5). In float32 a dot of m values is guaranteed within m*u/(1-m*u) (u = 2**-24,
#: ~1.6e-2 here) of the exact sum of squares, whatever order the BLAS kernel adds in; the
#: error observed against a float64 sum is far smaller and differs per CPU and kernel (3e-7 on
#: a Zen 5, 1.4e-6 on an AVX-512 Xeon), so it is no bound to test against
SQUARES_CHUNK = 262144


def _sum_of_squares(array: Any) -> Any:
    """sum(array ** 2) as a (1,) array, queued: one BLAS dot per chunk of the flattened array,
    added up. On a Zen 5 EPYC, one thread, for a 10,001 x 400 gradient: 0.6 ms, against 19 ms
    for ``sum(square(x))`` (MXNet's reduction), 6 ms for batch_dot over chunks (a GEMM per
    1 x K row, packing included) and 13 ms for ``norm``, which is 4e-3 off a float64 sum;
    one dot over the whole array is 1e-3 off at 40M values."""
    flat = array.reshape(-1)
    size = flat.shape[0]
    parts = [
        mx.nd.dot(flat[start : start + SQUARES_CHUNK], flat[start : start + SQUARES_CHUNK])
        for start in range(0, size, SQUARES_CHUNK)
    ]
    return (parts[0] if len(parts) == 1 else mx.nd.add_n(*parts)).reshape(1)


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


def _same_memory(a: Any, b: Any) -> bool:
    """Whether two NDArray handles hold the same memory (MXNDArrayGetData's pointer)."""
    import ctypes

    pointers = []
    for array in (a, b):
        pointer = ctypes.c_void_p()
        mx.base.check_call(mx.base._LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
        pointers.append(pointer.value)
    return pointers[0] == pointers[1] and pointers[0] is not None


def _copy_in(sources: Sequence[Any], targets: list[list[tuple[int, slice | None, Any]]]) -> None:
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


# ----------------------------------------------------------------------------- optimizer state

OPTIMIZER_STATE_FORMAT = 1

# Optimizer attributes that change while training but live outside the updater's states
# (Nadam's momentum schedule). They are saved with the states so a resumed run continues exactly.
_DYNAMIC_OPTIMIZER_ATTRS = ("m_schedule",)
_SCALARS = (bool, int, float, str)


def _encode_state(state: Any, name: str, arrays: dict[str, Any]) -> Any:
    """JSON description of one updater state; its arrays are copied to CPU into ``arrays``."""
    if state is None:
        return None
    if isinstance(state, NDArray):
        arrays[name] = state.copyto(mx.cpu())
        return {"array": name}
    if isinstance(state, tuple | list):
        kind = "tuple" if isinstance(state, tuple) else "list"
        return {kind: [_encode_state(s, f"{name}.{i}", arrays) for i, s in enumerate(state)]}
    if isinstance(state, _SCALARS):
        return {"value": state}
    raise ValueError(f"optimizer state of type {type(state).__name__} cannot be saved")


def _spec_signature(spec: Any, arrays: Mapping[str, Any], used: set[str]) -> str:
    """Shape/dtype signature of a described state, checking the description as it goes."""
    if spec is None:
        return "None"
    if isinstance(spec, dict) and len(spec) == 1:
        ((kind, value),) = spec.items()
        if kind == "array" and isinstance(value, str):
            if value not in arrays:
                raise ValueError(f"array {value!r} is missing from the optimizer state arrays")
            used.add(value)
            return _state_signature(arrays[value])
        if kind in ("tuple", "list") and isinstance(value, list):
            inner = ", ".join(_spec_signature(v, arrays, used) for v in value)
            return f"({inner})" if kind == "tuple" else f"[{inner}]"
        if kind == "value" and isinstance(value, _SCALARS):
            return type(value).__name__
    raise ValueError(f"malformed optimizer state description {spec!r}")


def _state_signature(state: Any) -> str:
    """What a state looks like (nesting, shapes, dtypes), for comparing saved and expected."""
    if state is None:
        return "None"
    if isinstance(state, NDArray):
        return f"array{tuple(state.shape)} {np.dtype(state.dtype).name}"
    if isinstance(state, tuple | list):
        inner = ", ".join(_state_signature(s) for s in state)
        return f"({inner})" if isinstance(state, tuple) else f"[{inner}]"
    return type(state).__name__


def _hashable(key: Any) -> Any:
    """A key read back from JSON (always int or str here; lists would not be hashable)."""
    return tuple(key) if isinstance(key, list) else key


def _decode_state(spec: Any, arrays: Mapping[str, Any]) -> Any:
    """The state a (checked) description stands for, with arrays copied: the updater changes
    states in place and must not write into the caller's arrays."""
    if spec is None:
        return None
    ((kind, value),) = spec.items()
    if kind == "array":
        return arrays[value].copy()
    if kind == "value":
        return value
    items = [_decode_state(v, arrays) for v in value]
    return tuple(items) if kind == "tuple" else items


# ----------------------------------------------------------------------------- module


class ParamPatternError(ValueError):
    """A glob over parameter names that cannot be applied: it matches no parameter, or a
    parameter matches two multiplier globs. ``option`` is the argument it came from
    (``fixed_param_patterns``, ``fixed_param_exclude``, ``lr_mult``, ``wd_mult``).

    Its own type so that callers can tell a bad pattern (a config key) from a model that does
    not fit its data (every other ValueError of construction and binding).
    """

    def __init__(self, message: str, *, option: str, pattern: str) -> None:
        super().__init__(message)
        self.option = option
        self.pattern = pattern  # the glob at fault


def resolve_multipliers(
    names: Sequence[str], globs: Mapping[str, float], option: str
) -> dict[str, float]:
    """``{parameter: multiplier}`` for the parameters ``globs`` (fnmatch pattern ->
    multiplier) match. Every glob must match a parameter and no parameter two globs, so the
    result never depends on the order the globs were written in."""
    resolved: dict[str, float] = {}
    matched_by: dict[str, str] = {}
    for pattern, value in globs.items():
        hits = fnmatch.filter(names, pattern)
        if not hits:
            raise ParamPatternError(
                f"pattern {pattern!r} matches no parameter; write one that matches some of "
                + ", ".join(names),
                option=option,
                pattern=pattern,
            )
        for name in hits:
            if name in matched_by:
                raise ParamPatternError(
                    f"parameter {name!r} matches both {matched_by[name]!r} and {pattern!r}; "
                    "make the patterns match disjoint parameters",
                    option=option,
                    pattern=pattern,
                )
            matched_by[name] = pattern
            resolved[name] = float(value)
    return resolved


class BucketingModule:
    """Train one network unrolled at several sizes ("buckets") with shared parameters.

    ``sym_gen(bucket_key) -> (symbol, data_names, label_names)`` as for MXNet's module.
    ``fixed_param_patterns`` are fnmatch globs of parameters to freeze (minus those matching
    ``fixed_param_exclude``); a glob that matches no parameter raises
    :class:`ParamPatternError`.

    ``bucket_memory`` bounds what stays bound. Every bound bucket keeps memory of its own
    that executors cannot share (operator state such as a fused RNN's workspace, which grows
    with the bucket's length), so keeping every bucket bound costs memory in proportion to
    the number of buckets. With ``bucket_memory = f`` the buckets bound at once hold at most
    ``f`` times the default bucket's input positions: binding another one first unbinds the
    buckets used least often so far (then least recently); rebinding later costs a bind and
    a slower first batch. The default bucket's first executors then only hold the parameters
    and the shared memory pool and never run. ``"auto"`` is :data:`AUTO_BUCKET_MEMORY`;
    ``None`` keeps every bucket bound.

    ``states`` (begin-state input name -> final-state output name) makes the module carry
    recurrent state from one batch to the next, as truncated backpropagation through time
    needs (MXNet's modules take the input names as ``state_names`` and leave the copying to
    the caller). The inputs are neither parameters nor data: no gradient, not saved with the
    parameters. After each forward, every device's final states are kept on that device and
    become the next batch's begin states, whichever bucket it is. They start from zeros, and
    go back to zeros when a batch has ``reset_states`` set (an iterator's stream restarts),
    when its state shape differs (another batch size) and on :meth:`reset_states`.
    """

    def __init__(
        self,
        sym_gen: SymGen,
        default_bucket_key: Any,
        context: Any | Sequence[Any] = None,
        *,
        work_load_list: Sequence[float] | None = None,
        fixed_param_patterns: Sequence[str] = (),
        fixed_param_exclude: Sequence[str] = (),
        logger: logging.Logger | None = None,
        bucket_memory: float | str | None = None,
        states: Mapping[str, str] | None = None,
    ) -> None:
        if default_bucket_key is None:
            raise ValueError("default_bucket_key is required")
        # a bound the user set is kept tightly (freed blocks leave the process at once, at
        # a small cost per batch); the default one only trims the heaps after unbinding
        self._strict_memory = bucket_memory != "auto"
        if bucket_memory == "auto":
            bucket_memory = AUTO_BUCKET_MEMORY
        if bucket_memory is not None and not (
            isinstance(bucket_memory, int | float) and bucket_memory >= 1
        ):
            raise ValueError(
                f"bucket_memory must be at least 1 (the default bucket must fit), "
                f"not {bucket_memory!r}"
            )
        self._bucket_memory: float | None = bucket_memory
        if context is None:
            context = mx.cpu()
        contexts = [context] if isinstance(context, mx.Context) else list(context)
        if not contexts:
            raise ValueError("at least one context is required")
        if work_load_list is None:
            work_load_list = [1.0] * len(contexts)
        if len(work_load_list) != len(contexts):
            raise ValueError(
                f"work_load_list has {len(work_load_list)} entries for {len(contexts)} contexts"
            )
        self._sym_gen = sym_gen
        self._default_key = default_bucket_key
        self._contexts: list[Any] = contexts
        self._work_load = list(work_load_list)
        self.logger = logger or _LOG

        symbol, data_names, label_names = self._call_sym_gen(default_bucket_key)
        self._default_symbol = symbol
        self._data_names = list(data_names or [])
        self._label_names = list(label_names or [])
        args = symbol.list_arguments()
        missing = [n for n in self._data_names if n not in args]
        if missing:
            raise ValueError(f"data names {missing} are not arguments of the symbol: {args}")
        self._states = dict(states or {})
        self._check_states(symbol, args)
        inputs = set(self._data_names) | set(self._label_names) | set(self._states)
        self._param_names: list[str] = [a for a in args if a not in inputs]
        self._aux_names: list[str] = symbol.list_auxiliary_states()
        self._output_names: list[str] = symbol.list_outputs()
        self._fixed = self._resolve_fixed(fixed_param_patterns, fixed_param_exclude)
        self._fixed_set = frozenset(self._fixed)

        # per state input, per device: the final state of the last forward (None: zeros)
        self._state_values: dict[str, list[Any]] = {}
        self._reset_bind()
        self.params_initialized = False
        self.optimizer_initialized = False
        self._optimizer: Any = None
        self._clip_global_norm: float | None = None
        self._norm_sum: Any = None
        self._norm_count = 0
        self._kvstore: Any = None
        self._update_on_kvstore = False
        self._updater: Any = None

    def __del__(self) -> None:
        if getattr(self, "_kvstore", None) is not None:
            _wait_before_freeing_kvstore()

    # -- construction helpers ---------------------------------------------------------------

    def _call_sym_gen(self, key: Any) -> tuple[Any, Sequence[str] | None, Sequence[str] | None]:
        # a fresh NameManager per call gives auto-named nodes the same names in every bucket
        with mx.name.NameManager():
            return self._sym_gen(key)

    def _check_states(self, symbol: Any, args: Sequence[str]) -> None:
        outputs = symbol.list_outputs()
        for name, output in self._states.items():
            if name not in args:
                raise ValueError(f"state {name!r} is not an argument of the symbol: {list(args)}")
            if name in self._data_names or name in self._label_names:
                raise ValueError(f"state {name!r} is also a data or label name")
            if output not in outputs:
                raise ValueError(
                    f"state {name!r}: its final value {output!r} is not an output of the "
                    f"symbol: {outputs}"
                )

    def _resolve_fixed(self, patterns: Sequence[str], exclude: Sequence[str]) -> list[str]:
        names = self._param_names
        if isinstance(patterns, str) or isinstance(exclude, str):
            raise TypeError("fixed_param_patterns and fixed_param_exclude must be lists of globs")
        for kind, globs in (("fixed_param_patterns", patterns), ("fixed_param_exclude", exclude)):
            for pat in globs:
                if not fnmatch.filter(names, pat):
                    raise ParamPatternError(
                        f"pattern {pat!r} matches no parameter; write one that matches some of "
                        + ", ".join(names),
                        option=kind,
                        pattern=pat,
                    )
        return [
            n
            for n in names
            if any(fnmatch.fnmatchcase(n, p) for p in patterns)
            and not any(fnmatch.fnmatchcase(n, p) for p in exclude)
        ]

    def _reset_bind(self) -> None:
        self.binded = False
        self.for_training = False
        self.inputs_need_grad = False
        self._grad_req: Any = "write"
        self._with_labels = False
        self._buckets: dict[Any, _Bucket] = {}  # runnable buckets, least recently used first
        self._curr: _Bucket | None = None
        self._budget: int | None = None  # input positions the bound buckets may hold
        self._unbound: set[Any] = set()  # keys unbound for bucket_memory (rebinds are counted)
        self._uses: dict[Any, int] = {}  # times each bucket was asked for (bucket_memory)
        self.rebinds = 0  # buckets bound again after bucket_memory unbound them
        self._default: _Bucket | None = None
        self._shared_buffers: list[dict[str, Any]] = []
        self._borrows_params = False  # bind(shared_params=...): the parameters are another's
        self._params: dict[str, list[Any]] = {}
        self._grads: dict[str, list[Any] | None] = {}
        self._auxs: dict[str, list[Any]] = {}
        self._arg_cpu: dict[str, Any] = {}
        self._aux_cpu: dict[str, Any] = {}
        self._warned_large = False

    # -- properties -------------------------------------------------------------------------

    @property
    def default_bucket_key(self) -> Any:
        return self._default_key

    @property
    def contexts(self) -> list[Any]:
        return list(self._contexts)

    @property
    def symbol(self) -> Any:
        """Symbol of the current bucket (the default bucket's before binding)."""
        return self._curr.symbol if self._curr is not None else self._default_symbol

    @property
    def data_names(self) -> list[str]:
        return list(self._curr.data_names) if self._curr is not None else list(self._data_names)

    @property
    def label_names(self) -> list[str]:
        return list(self._curr.label_names) if self._curr is not None else list(self._label_names)

    @property
    def output_names(self) -> list[str]:
        return list(self._curr.output_names) if self._curr is not None else list(self._output_names)

    @property
    def param_names(self) -> list[str]:
        """Parameter names in the default bucket's argument order (the optimizer's indices)."""
        return list(self._param_names)

    @property
    def aux_names(self) -> list[str]:
        return list(self._aux_names)

    def param_shapes(self) -> ParamShapes:
        """(parameter shapes, auxiliary-state shapes) by name, as bound: what
        :meth:`set_params` accepts (see :func:`mxtrain.run.params.param_problems`)."""
        self._require_bucket()
        return (
            {n: tuple(a[0].shape) for n, a in self._params.items()},
            {n: tuple(a[0].shape) for n, a in self._auxs.items()},
        )

    def param_array(self, name: str, device: int = 0) -> Any:
        """The live weight array of ``name`` on one device (no copy: do not write to it)."""
        self._require(params=True)
        return self._params[name][device]

    def grad_array(self, name: str, device: int = 0) -> Any:
        """The live gradient array of ``name`` on one device, or None for a fixed parameter."""
        self._require(params=True)
        grads = self._grads.get(name)
        return None if grads is None else grads[device]

    @property
    def fixed_param_names(self) -> list[str]:
        return list(self._fixed)

    @property
    def data_shapes(self) -> list[Any]:
        return list(self._require_bucket().data_descs)

    @property
    def label_shapes(self) -> list[Any] | None:
        descs = self._require_bucket().label_descs
        return list(descs) if descs is not None else None

    @property
    def output_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        b = self._require_bucket()
        shapes = []
        for name, out, axis in zip(b.output_names, b.execs[0].outputs, b.output_axes, strict=True):
            shape = list(out.shape)
            if axis >= 0:
                shape[axis] = b.batch_size
            shapes.append((name, tuple(shape)))
        return shapes

    @property
    def bucket_keys(self) -> list[Any]:
        """Keys of the buckets bound so far, in binding order."""
        return list(self._buckets)

    @property
    def curr_bucket_key(self) -> Any:
        return self._curr.key if self._curr is not None else None

    @property
    def optimizer(self) -> Any:
        return self._optimizer

    @property
    def kvstore(self) -> Any:
        return self._kvstore

    @property
    def update_on_kvstore(self) -> bool:
        return self._update_on_kvstore

    @property
    def updater(self) -> Any:
        """The ``mx.optimizer.Updater`` holding optimizer state.

        The local one, or the kvstore's when updating on a local/device kvstore; None for a
        distributed kvstore (state lives on the servers) or before ``init_optimizer``.
        """
        if self._updater is not None:
            return self._updater
        if self._kvstore is not None and self._update_on_kvstore:
            return getattr(self._kvstore, "_updater", None)
        return None

    def _require_bucket(self) -> _Bucket:
        if self._curr is None:
            raise RuntimeError("call bind() first")
        return self._curr

    def _require(self, params: bool = True, optimizer: bool = False) -> _Bucket:
        if self._curr is None:
            raise RuntimeError("call bind() first")
        if params and not self.params_initialized:
            raise RuntimeError("call init_params() or set_params() first")
        if optimizer and not self.optimizer_initialized:
            raise RuntimeError("call init_optimizer() first")
        return self._curr

    # -- binding ----------------------------------------------------------------------------

    def bind(
        self,
        data_shapes: ShapeList,
        label_shapes: ShapeList | None = None,
        for_training: bool = True,
        inputs_need_grad: bool = False,
        grad_req: str | Mapping[str, str] = "write",
        *,
        force_rebind: bool = False,
        shared_params: BucketingModule | None = None,
    ) -> None:
        """Allocate the default bucket's executors; other buckets bind on first use.

        ``data_shapes``/``label_shapes`` describe the default bucket, which should be the
        largest (see :func:`largest_key`). With ``force_rebind`` the executors are rebuilt and
        the current parameter values kept (e.g. to switch between training and inference).

        ``shared_params``: a bound, initialized module on the same devices whose parameter
        arrays this one uses as its own (an inference module for a model that trains on
        another graph: it sees every update, nothing is copied). Copying values in instead
        does not work: oneDNN's inference FullyConnected keeps its weights in its own layout
        and, in MXNet 1.9.1, ignores a later copy into the array.
        """
        if self.binded and not force_rebind:
            self.logger.warning("already bound, ignoring bind()")
            return
        if not for_training and inputs_need_grad:
            raise ValueError("inputs_need_grad requires for_training=True")
        if not isinstance(grad_req, str | Mapping):
            raise TypeError("grad_req must be a string or a mapping of argument name to string")
        saved = self.get_params() if self.binded and self.params_initialized else None
        self._reset_bind()
        self.for_training = for_training
        self.inputs_need_grad = inputs_need_grad
        self._grad_req = grad_req
        self._with_labels = label_shapes is not None
        self._shared_buffers = [{} for _ in self._contexts]
        self._borrows_params = shared_params is not None
        if shared_params is not None:
            self._take_parameter_arrays(shared_params)

        bucket = self._bind_bucket(
            self._default_key, self._default_symbol, data_shapes, label_shapes, default=True
        )
        self._default = self._curr = bucket
        if self._bucket_memory is None:
            self._buckets[self._default_key] = bucket
        else:
            # the first executors only hold the store and the memory pool: a runnable copy of
            # the default bucket is bound on first use and can be unbound like any other
            self._budget = int(self._bucket_memory * _bucket_elements(bucket))
            self.logger.info(
                "bucket_memory %g: bound buckets hold at most %d input positions (%g x the "
                "largest bucket); beyond that the least used are unbound",
                self._bucket_memory,
                self._budget,
                self._bucket_memory,
            )
        self.binded = True

        # CPU staging copies, as MXNet's module keeps them: init_params fills these in sorted
        # name order, which is what makes a seeded initializer reproduce stock values.
        self._arg_cpu = {
            n: mx.nd.zeros(a[0].shape, ctx=mx.cpu(), dtype=a[0].dtype)
            for n, a in self._params.items()
        }
        self._aux_cpu = {
            n: mx.nd.zeros(a[0].shape, ctx=mx.cpu(), dtype=a[0].dtype)
            for n, a in self._auxs.items()
        }
        if saved is not None:
            self.params_initialized = False
            self.set_params(*saved)
        if shared_params is not None:
            self._check_shared(shared_params)
            self.params_initialized = True

    def _take_parameter_arrays(self, other: BucketingModule) -> None:
        """Seed the executors' shared buffers with ``other``'s parameter arrays: simple_bind
        then binds them (same name, shape and type) instead of allocating its own."""
        if other._aux_names:
            raise ValueError("shared_params: a module with auxiliary states cannot be shared")
        if not (other.binded and other.params_initialized):
            raise RuntimeError("shared_params: the other module must be bound and initialized")
        if [str(c) for c in other._contexts] != [str(c) for c in self._contexts]:
            raise ValueError(
                f"shared_params: the other module runs on {other._contexts}, this one on "
                f"{self._contexts}"
            )
        for i, buffer in enumerate(self._shared_buffers):
            for name, arrays in other._params.items():
                buffer[name] = arrays[i]

    def _check_shared(self, other: BucketingModule) -> None:
        unshared = [
            name
            for name in self._param_names
            if name not in other._params
            or any(
                not _same_memory(mine, theirs)
                for mine, theirs in zip(self._params[name], other._params[name], strict=True)
            )
        ]
        if unshared or self._aux_names:
            raise ValueError(
                "shared_params: the modules' parameters differ "
                f"({', '.join(unshared + list(self._aux_names))}): they must have the same "
                "parameters, of the same shapes, and no auxiliary states"
            )

    def _grad_reqs(self, symbol: Any, data_names: Sequence[str]) -> dict[str, str]:
        req = self._grad_req
        base = req if isinstance(req, str) else "write"
        reqs = {}
        for name in symbol.list_arguments():
            if not self.for_training:
                reqs[name] = "null"
            elif name in self._param_names:
                reqs[name] = "null" if name in self._fixed_set else base
            elif name in data_names:
                reqs[name] = base if self.inputs_need_grad else "null"
            else:
                reqs[name] = "null"
        if isinstance(req, Mapping) and self.for_training:
            reqs.update({k: v for k, v in req.items() if k in reqs})
        return reqs

    def _parse_shapes(
        self,
        key: Any,
        data_names: Sequence[str],
        label_names: Sequence[str],
        args: Sequence[str],
        data_shapes: ShapeList,
        label_shapes: ShapeList | None,
    ) -> tuple[list[Any], list[Any] | None]:
        data = _to_descs(data_shapes) or []
        if sorted(d.name for d in data) != sorted(data_names):
            raise ValueError(
                f"bucket {key!r}: data shapes {[d.name for d in data]} do not match the "
                f"symbol's data names {list(data_names)}"
            )
        labels = _to_descs(label_shapes)
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
    ) -> _Bucket:
        if data_names is None:
            data_names, label_names = self._data_names, self._label_names
        args = symbol.list_arguments()
        data, labels = self._parse_shapes(
            key, data_names, label_names or [], args, data_shapes, label_shapes
        )
        inputs = data + (labels or [])
        batch_size, slices = self._decide_slices(key, inputs)
        names = set(d.name for d in inputs) | set(self._states)
        params = [a for a in args if a not in names and a not in (label_names or [])]
        if not default:
            extra = [p for p in params if p not in self._params]
            if extra:
                raise ValueError(
                    f"bucket {key!r} has parameters the default bucket "
                    f"{self._default_key!r} lacks: {extra}"
                )
        reqs = self._grad_reqs(symbol, [d.name for d in data])
        types = {d.name: d.dtype for d in inputs}

        shares = default or self._fits_default(key, inputs)
        if not default:
            self._check_param_shapes(key, symbol, inputs, slices)
        if not shares and not self._warned_large:
            self.logger.warning(
                "bucket %r is larger than the default bucket %r: binding it with its own "
                "memory. Make the default bucket the largest one (see largest_key()) so all "
                "buckets share memory.",
                key,
                self._default_key,
            )
            self._warned_large = True

        with _without_inference_fusion(self._borrows_params):
            execs = self._bind_executors(
                symbol, inputs, slices, types, reqs, params, default, shares
            )

        if default:
            self._collect_store(symbol, execs)
        present = set(params)
        update_indices = [
            i
            for i, n in enumerate(self._param_names)
            if n in present and self.for_training and self._grads.get(n) is not None
        ]
        return _Bucket(key, symbol, data, labels, execs, slices, batch_size, shares, update_indices)

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
            shapes = self._sliced(inputs, slices[i])
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
                assert self._default is not None
                ex = symbol.simple_bind(
                    ctx=ctx,
                    group2ctx=host_groups,
                    grad_req=reqs,
                    type_dict=types,
                    shared_arg_names=params,
                    shared_exec=self._default.base_execs[i],
                    shared_buffer=self._shared_buffers[i],
                    **shapes,
                )
            else:
                ex = self._bind_own_memory(symbol, i, shapes, types, reqs, host_groups)
            execs.append(ex)
        return execs

    def _collect_store(self, symbol: Any, execs: list[Any]) -> None:
        missing = [p for p in self._param_names if p not in execs[0].arg_dict]
        if missing:
            raise ValueError(f"default bucket: parameters {missing} are not in the executor")
        self._params = {n: [e.arg_dict[n] for e in execs] for n in self._param_names}
        self._grads = {}
        for n in self._param_names:
            g = [e.grad_dict.get(n) for e in execs]
            self._grads[n] = None if g[0] is None else g
        self._auxs = {n: [e.aux_dict[n] for e in execs] for n in self._aux_names}

    def _decide_slices(self, key: Any, inputs: list[Any]) -> tuple[int, list[slice]]:
        batch_size = None
        for d in inputs:
            axis = _batch_axis(d.layout)
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

    @staticmethod
    def _sliced(inputs: list[Any], sl: slice) -> dict[str, tuple[int, ...]]:
        shapes = {}
        for d in inputs:
            shape = list(d.shape)
            axis = _batch_axis(d.layout)
            if axis >= 0:
                shape[axis] = sl.stop - sl.start
            shapes[d.name] = tuple(shape)
        return shapes

    def _fits_default(self, key: Any, inputs: list[Any]) -> bool:
        assert self._default is not None
        default_inputs = self._default.data_descs + (self._default.label_descs or [])
        return key_fits(key, self._default_key) and _elements(inputs) <= _elements(default_inputs)

    def _check_param_shapes(self, key: Any, symbol: Any, inputs: list[Any], slices: list) -> None:
        # MXNet's own failure here is a C++ check naming one shape pair ("Inferred shape does
        # not match shared_exec.arg_array's shape"), and the own-memory path would not check at
        # all: say which bucket and which parameters instead
        arg_shapes, _, aux_shapes = symbol.infer_shape(**self._sliced(inputs, slices[0]))
        if arg_shapes is None:
            raise ValueError(f"bucket {key!r}: cannot infer shapes from {inputs}")
        wrong = []
        for name, shape in zip(symbol.list_arguments(), arg_shapes, strict=True):
            if name in self._params and tuple(self._params[name][0].shape) != tuple(shape):
                wrong.append(f"{name} {tuple(shape)} vs {tuple(self._params[name][0].shape)}")
        for name, shape in zip(symbol.list_auxiliary_states(), aux_shapes, strict=True):
            if name not in self._auxs:
                wrong.append(f"{name} (auxiliary state missing from the default bucket)")
            elif tuple(self._auxs[name][0].shape) != tuple(shape):
                wrong.append(f"{name} {tuple(shape)} vs {tuple(self._auxs[name][0].shape)}")
        if wrong:
            raise ValueError(
                f"bucket {key!r} cannot share parameters with the default bucket "
                f"{self._default_key!r}: " + "; ".join(wrong)
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
        ctx = self._contexts[i]
        arg_shapes, _, _ = symbol.infer_shape(**shapes)
        arg_types, _, _ = symbol.infer_type(**types)
        args, grads = {}, {}
        for name, shape, dtype in zip(symbol.list_arguments(), arg_shapes, arg_types, strict=True):
            if name in self._params:
                args[name] = self._params[name][i]
                g = self._grads[name]
                if reqs[name] != "null" and g is not None:
                    grads[name] = g[i]
            else:
                args[name] = mx.nd.zeros(shape, ctx=ctx, dtype=dtype)
                if reqs[name] != "null":
                    grads[name] = mx.nd.zeros(shape, ctx=ctx, dtype=dtype)
        reqs = {n: (r if n in grads else "null") for n, r in reqs.items()}
        aux = {n: self._auxs[n][i] for n in symbol.list_auxiliary_states()}
        return symbol.bind(
            ctx,
            args=args,
            args_grad=grads,
            grad_req=reqs,
            aux_states=aux,
            group2ctx=host_groups,
        )

    def _reshape_bucket(
        self, bucket: _Bucket, data_shapes: ShapeList, label_shapes: ShapeList | None
    ) -> _Bucket:
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
            labels = self._resized(bucket.label_descs, self._decide_slices(bucket.key, data)[0])
        inputs = data + (labels or [])
        batch_size, slices = self._decide_slices(bucket.key, inputs)
        # begin states are inputs the batch does not give: their shape follows the batch size
        partial = bool(self._states)
        execs = [
            ex.reshape(
                allow_up_sizing=True, partial_shaping=partial, **self._sliced(inputs, slices[i])
            )
            for i, ex in enumerate(bucket.base_execs)
        ]
        return _Bucket(
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

    @staticmethod
    def _resized(descs: list[Any], batch_size: int) -> list[Any]:
        """The same descriptors with another batch size."""
        out = []
        for d in descs:
            shape = list(d.shape)
            axis = _batch_axis(d.layout)
            if axis >= 0:
                shape[axis] = batch_size
            out.append(mx.io.DataDesc(d.name, tuple(shape), d.dtype, d.layout))
        return out

    def _get_bucket(
        self,
        key: Any,
        data_shapes: ShapeList | None,
        label_shapes: ShapeList | None,
        keep: Sequence[Any] = (),
    ) -> _Bucket:
        if not self.binded:
            raise RuntimeError("call bind() first")
        if key is None:
            key = self._default_key
        if not self._with_labels:
            label_shapes = None
        bucket = self._buckets.get(key)
        if bucket is not None:
            if bucket.matches(data_shapes, label_shapes):
                self._touch(key)
                return bucket
            assert data_shapes is not None
            self._make_room(_elements(data_shapes), keep=(key, *keep))
            bucket = self._reshape_bucket(bucket, data_shapes, label_shapes or None)
        else:
            if data_shapes is None:
                raise ValueError(f"bucket {key!r} is not bound yet: its data shapes are needed")
            self._make_room(_elements(data_shapes), keep=keep)
            if key in self._unbound:
                self.rebinds += 1
            symbol, data_names, label_names = self._call_sym_gen(key)
            bucket = self._bind_bucket(
                key,
                symbol,
                data_shapes,
                label_shapes,
                data_names=list(data_names or []),
                label_names=list(label_names or []),
            )
        # a reshaped default bucket replaces the entry but not self._default: sharing, size
        # checks and rescale_grad keep referring to the executors bound first
        self._buckets[key] = bucket
        self._touch(key)
        return bucket

    # -- bounded memory (bucket_memory) -----------------------------------------------------

    def _touch(self, key: Any) -> None:
        """Count a use of ``key`` and make it the most recently used bucket (the dict keeps
        use order)."""
        if self._budget is not None:
            self._buckets[key] = self._buckets.pop(key)
            self._uses[key] = self._uses.get(key, 0) + 1

    def _room_for(self, needed: int, keep: Sequence[Any]) -> bool:
        """Whether ``needed`` more positions fit once every bucket not in ``keep`` is gone."""
        if self._budget is None:
            return True
        kept = sum(_bucket_elements(b) for k, b in self._buckets.items() if k in keep)
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
        recency = {k: i for i, k in enumerate(self._buckets)}
        candidates = sorted(
            (k for k in self._buckets if k not in keep),
            key=lambda k: (self._uses.get(k, 0), recency[k]),
        )
        for key in candidates:
            if held + needed <= self._budget:
                break
            held -= _bucket_elements(self._buckets.pop(key))
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
        return sum(_bucket_elements(b) for b in self._buckets.values())

    def switch_bucket(
        self, bucket_key: Any, data_shapes: ShapeList | None, label_shapes: ShapeList | None = None
    ) -> None:
        """Make ``bucket_key`` current, binding it (or reshaping it) if needed."""
        self._curr = self._get_bucket(bucket_key, data_shapes, label_shapes)

    def prepare(self, data_batch: Any) -> None:
        """Bind the batch's bucket ahead of its forward; the current bucket does not change.

        Under ``bucket_memory`` the current bucket stays bound, and binding waits for the
        forward when it would not fit beside the current bucket.
        """
        keep = () if self._curr is None or self._curr is self._default else (self._curr.key,)
        self._bucket_for(data_batch, keep=keep, ahead=True)

    def _bucket_for(
        self, batch: Any, keep: Sequence[Any] = (), ahead: bool = False
    ) -> _Bucket | None:
        key = getattr(batch, "bucket_key", None)
        if key is None:
            key = self._default_key
        bucket = self._buckets.get(key)
        data_descs = getattr(batch, "provide_data", None)
        label_descs = getattr(batch, "provide_label", None)
        if bucket is not None and bucket.matches(data_descs, label_descs):
            self._touch(key)
            return bucket
        if not data_descs:
            names = bucket.data_names if bucket is not None else self._call_sym_gen(key)[1]
            data_descs = [(n, a.shape) for n, a in zip(names or [], batch.data, strict=True)]
        if ahead and not self._room_for(_elements(data_descs), (key, *keep)):
            return None  # bound by forward(), once the current bucket may go
        return self._get_bucket(key, data_descs, label_descs, keep=keep)

    # -- parameters -------------------------------------------------------------------------

    def init_params(
        self,
        initializer: Any = mx.init.Uniform(0.01),  # noqa: B008 - MXNet's default, immutable
        arg_params: Mapping[str, Any] | None = None,
        aux_params: Mapping[str, Any] | None = None,
        allow_missing: bool = False,
        force_init: bool = False,
        allow_extra: bool = False,
    ) -> None:
        """Initialize parameters: copy from ``arg_params``/``aux_params``, else ``initializer``.

        Names are visited in sorted order on CPU copies, exactly as MXNet's module does, so a
        seeded initializer gives the same values as stock MXNet. Unlike stock, names in the
        dicts that the network lacks raise ``ValueError`` unless ``allow_extra``.
        """
        if not self.binded:
            raise RuntimeError("call bind() before init_params()")
        if self.params_initialized and not force_init:
            warnings.warn(
                "parameters already initialized and force_init=False: init_params ignored",
                stacklevel=2,
            )
            return
        if not allow_extra:
            extra = sorted(set(arg_params or {}) - set(self._param_names)) + sorted(
                set(aux_params or {}) - set(self._aux_names)
            )
            if extra:
                raise ValueError(f"parameters not in the network: {extra}")

        # a shape that differs is said in words here: MXNet's copyto says it in a C++ traceback
        mismatched = param_problems(
            self.param_shapes(),
            (arg_params or {}, aux_params or {}),
            source="the given values",
            allow_missing=True,
            allow_extra=True,
        )
        if mismatched:
            raise ValueError("; ".join(mismatched))
        attrs = self._default_symbol.attr_dict()

        def fill(name: str, arr: Any, given: Mapping[str, Any] | None) -> bool:
            """Set one staging array; False when it is left alone (missing, no initializer)."""
            if given is not None:
                if name in given:
                    if given[name] is not arr:
                        given[name].copyto(arr)
                    return True
                if not allow_missing:
                    raise RuntimeError(f"{name} is missing from the given parameters")
            if initializer is not None:
                initializer(mx.init.InitDesc(name, attrs.get(name, None)), arr)
                return True
            if given is None:
                raise ValueError("init_params needs an initializer or arg_params")
            return False

        # only what was set goes to the devices: a missing parameter keeps its current value
        # (the staging copy may be stale after training)
        args = {n: a for n, a in sorted(self._arg_cpu.items()) if fill(n, a, arg_params)}
        auxs = {n: a for n, a in sorted(self._aux_cpu.items()) if fill(n, a, aux_params)}
        self._write_to_devices(args, auxs)
        self.params_initialized = True

    def set_params(
        self,
        arg_params: Mapping[str, Any],
        aux_params: Mapping[str, Any] | None,
        allow_missing: bool = False,
        force_init: bool = True,
        allow_extra: bool = False,
    ) -> None:
        """Copy the given values into the parameters (missing ones keep their values if
        ``allow_missing``)."""
        if self.params_initialized and not force_init:
            warnings.warn(
                "parameters already initialized and force_init=False: set_params ignored",
                stacklevel=2,
            )
            return
        self.init_params(
            initializer=None,
            arg_params=arg_params,
            aux_params=aux_params or {},
            allow_missing=allow_missing,
            force_init=True,
            allow_extra=allow_extra,
        )

    def _write_to_devices(self, arg: Mapping[str, Any], aux: Mapping[str, Any]) -> None:
        if aux:
            mx.nd.waitall()  # a pending BatchNorm backward would overwrite them (see get_params)
        for store, values in ((self._params, arg), (self._auxs, aux)):
            for name, src in values.items():
                for dst in store[name]:
                    (src if src.dtype == dst.dtype else src.astype(dst.dtype)).copyto(dst)
        if self.optimizer_initialized and self._kvstore is not None and self._update_on_kvstore:
            self._refresh_kvstore_weights()

    def _refresh_kvstore_weights(self) -> None:
        # The kvstore keeps its own copy of the weights when it runs the optimizer; after
        # set_params that copy is stale and the next pull would undo the change. Overwrite it by
        # pushing the new values through a temporary "copy" updater.
        kv = self._kvstore
        if "dist" in kv.type:
            raise RuntimeError(
                "set_params after init_optimizer is not supported with a distributed kvstore "
                "that updates on the servers: set the parameters before init_optimizer"
            )
        saved = kv._updater

        def overwrite(_key: Any, value: Any, stored: Any) -> None:
            value.copyto(stored)

        kv._set_updater(overwrite)
        try:
            for idx, name in enumerate(self._param_names):
                kv.push(name, self._params[name][0], priority=-idx)
        finally:
            kv._set_updater(saved)

    def get_params(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Copies of the parameters on CPU: ``(arg_params, aux_params)``.

        With several devices, copies that differ (auxiliary states such as BatchNorm statistics)
        are averaged, as MXNet does. Identical copies (parameters under data parallelism) are
        returned as they are: averaging n equal float32 values is not exact when n is not a
        power of two, and a checkpoint must hold the very values training continues from.
        """
        if not self.params_initialized:
            raise RuntimeError("parameters are not initialized")
        if self._aux_names:
            # MXNet 1.9.1's oneDNN BatchNorm updates its moving statistics in the backward
            # pass without declaring them as outputs of it (apache/mxnet#18610), so the engine
            # may let a copy read them before that backward has run: the values would be one
            # batch stale (seen as a rare checkpoint mismatch). Wait for all pending work.
            mx.nd.waitall()
        return (
            {n: self._gather(self._params[n]) for n in self._param_names},
            {n: self._gather(self._auxs[n]) for n in self._aux_names},
        )

    @staticmethod
    def _gather(arrays: list[Any]) -> Any:
        first = arrays[0].copyto(mx.cpu())
        if len(arrays) == 1:
            return first
        copies = [a.copyto(mx.cpu()) for a in arrays[1:]]
        if all(bool((c == first).min().asscalar()) for c in copies):
            return first
        total = first
        for c in copies:
            total = total + c
        return total / len(arrays)

    def save_params(self, fname: str | os.PathLike) -> None:
        """Save parameters in MXNet's format (``arg:NAME``/``aux:NAME``), atomically and
        durably (:func:`mxtrain.run.atomic.save_atomically`: the old file or the whole new one
        survives a crash)."""
        arg, aux = self.get_params()
        data = {f"arg:{k}": v for k, v in arg.items()}
        data.update({f"aux:{k}": v for k, v in aux.items()})
        save_atomically(Path(os.fspath(fname)), lambda tmp: mx.nd.save(str(tmp), data))

    def load_params(self, fname: str | os.PathLike) -> None:
        """Load a file written by :meth:`save_params` (or MXNet's ``save_params``)."""
        try:
            arg, aux = read_params(fname)
        except ParamsFileError as exc:
            raise ValueError(f"{os.fspath(fname)}: {exc.problem}") from exc
        self.set_params(arg, aux)

    # -- optimizer --------------------------------------------------------------------------

    def init_optimizer(
        self,
        kvstore: Any = "local",
        optimizer: Any = "sgd",
        optimizer_params: Mapping[str, Any] | Iterable[tuple[str, Any]] = (
            ("learning_rate", 0.01),
        ),
        force_init: bool = False,
        *,
        update_on_kvstore: bool | None = None,
        clip_global_norm: float | None = None,
        lr_mult: Mapping[str, float] | None = None,
        wd_mult: Mapping[str, float] | None = None,
    ) -> None:
        """Create the optimizer, the kvstore (if any) and the updater.

        ``lr_mult``/``wd_mult``: fnmatch glob -> multiplier of the learning rate / weight
        decay of the parameters it matches (:func:`resolve_multipliers`: a glob matching
        nothing, or a parameter matched twice, raises :class:`ParamPatternError`). They
        replace MXNet's per-name settings on top of its defaults (a symbol's ``__lr_mult__``
        attributes; no weight decay for names not ending in ``_weight``/``_gamma``).

        ``clip_global_norm``: before each update, once the gradients are summed over devices
        (and workers), scale them all by ``min(1, clip_global_norm / norm)`` where ``norm``
        is their global L2 norm times ``rescale_grad`` (the norm of the gradient the
        optimizer applies), so 1 device, N devices and ``dist_sync`` clip alike. It needs
        the updates on the workers (not ``update_on_kvstore``). :meth:`take_grad_norm` reads
        the mean norm.

        ``kvstore`` is a type name, an ``mx.kv.KVStore`` or None. As in MXNet, a single device
        without ``dist`` gets no kvstore; whether updates run on the kvstore follows MXNet
        (``MXNET_UPDATE_ON_KVSTORE``, big-parameter rule for ``local``) unless
        ``update_on_kvstore`` says otherwise. ``rescale_grad`` defaults to 1/batch_size
        (times the number of workers for ``dist_sync``).
        """
        self._require(params=True)
        if self.optimizer_initialized and not force_init:
            self.logger.warning("optimizer already initialized, ignoring init_optimizer()")
            return
        if not self.for_training:
            raise RuntimeError("the module is bound for inference: bind(for_training=True)")
        assert self._default is not None
        lr_by_name = resolve_multipliers(self._param_names, lr_mult or {}, "lr_mult")
        wd_by_name = resolve_multipliers(self._param_names, wd_mult or {}, "wd_mult")
        kv, on_kv = self._create_kvstore(kvstore, update_on_kvstore)

        batch_size = self._default.batch_size
        if kv is not None and "dist" in kv.type and "_sync" in kv.type:
            batch_size *= kv.num_workers
        rescale_grad = 1.0 / batch_size

        ndev = len(self._contexts)
        if on_kv:
            idx2name = dict(enumerate(self._param_names))
        else:
            # the local updater keeps one state per (parameter, device): index i*ndev+k
            idx2name = {
                i * ndev + k: n for i, n in enumerate(self._param_names) for k in range(ndev)
            }
        if isinstance(optimizer, str):
            params = dict(optimizer_params)
            params.setdefault("rescale_grad", rescale_grad)
            optimizer = mx.optimizer.create(
                optimizer, sym=self._default_symbol, param_idx2name=idx2name, **params
            )
        elif isinstance(optimizer, mx.optimizer.Optimizer):
            if optimizer.rescale_grad != rescale_grad:
                warnings.warn(
                    f"optimizer created outside the module has rescale_grad="
                    f"{optimizer.rescale_grad}, not 1/batch_size/num_workers={rescale_grad}",
                    stacklevel=2,
                )
            if not optimizer.idx2name:
                optimizer.idx2name = idx2name.copy()
        else:
            raise TypeError(f"optimizer must be a name or an mx.optimizer.Optimizer: {optimizer!r}")
        if lr_by_name:
            optimizer.set_lr_mult(lr_by_name)  # keeps the symbol's __lr_mult__ attributes
        if wd_by_name:
            optimizer.set_wd_mult(wd_by_name)  # keeps MXNet's no-decay default elsewhere

        if on_kv and (
            clip_global_norm is not None
            or hasattr(getattr(optimizer, "lr_scheduler", None), "set_training_position")
        ):
            raise ValueError(
                "global-norm clipping and epoch-counted lr schedules need the updates on the "
                "workers: the kvstore's servers never see the summed gradients' norm or the "
                "epoch (update_on_kvstore=False)"
            )
        self._clip_global_norm = clip_global_norm
        self._norm_sum = None
        self._norm_count = 0
        self._optimizer = optimizer
        if self._kvstore is not None and self._kvstore is not kv:
            _wait_before_freeing_kvstore()
        self._kvstore = kv
        self._update_on_kvstore = on_kv
        self._updater = None
        if kv is not None:
            if on_kv:
                kv.set_optimizer(optimizer)
            arg, _ = self.get_params()
            # A dist kvstore keeps the values rank 0 initialised: pulling them back makes
            # every worker start from the same weights whatever its own initialisation.
            start_from_store = "dist" in kv.type
            for name in self._param_names:
                if on_kv:
                    kv.broadcast(name, arg[name], out=self._params[name])
                else:
                    kv.init(name, arg[name])
                    if start_from_store:
                        kv.pull(name, out=self._params[name])
        if not on_kv:
            self._updater = mx.optimizer.get_updater(optimizer)
        self.optimizer_initialized = True

    def _create_kvstore(self, kvstore: Any, override: bool | None) -> tuple[Any, bool]:
        ndev = len(self._contexts)
        if kvstore is None:
            kv = None
        elif isinstance(kvstore, mx.kvstore.KVStoreBase):
            kv = kvstore
        elif isinstance(kvstore, str):
            if ndev == 1 and "dist" not in kvstore and not override:
                kv = None  # nothing to aggregate across devices
            else:
                kv = mx.kv.create(kvstore)
        else:
            raise TypeError(f"kvstore must be a name, an mx.kv.KVStore or None: {kvstore!r}")

        if kv is None:
            if override:
                raise ValueError("update_on_kvstore=True needs a kvstore")
            return None, False
        capable = kv.is_capable(mx.kvstore.KVStoreBase.OPTIMIZER)
        if override is not None:
            if override and not capable:
                raise ValueError(f"kvstore {kv.type!r} cannot run the optimizer")
            return kv, override
        on_kv = bool(int(os.environ.get("MXNET_UPDATE_ON_KVSTORE", "1")))
        if kvstore == "local":
            biggest = max((int(np.prod(a[0].shape)) for a in self._params.values()), default=0)
            if biggest > _BIG_PARAM_ELEMENTS:
                on_kv = False
        return kv, on_kv and capable

    # -- optimizer state --------------------------------------------------------------------

    def _state_updater(self) -> Any:
        self._require(optimizer=True)
        updater = self.updater
        if updater is None:
            raise RuntimeError(
                "the optimizer state lives on the kvstore servers (a distributed kvstore that "
                "updates on the servers): it cannot be read or set from a worker"
            )
        return updater

    def _key_owner(self, key: Any) -> tuple[str, int | None]:
        """(parameter name, device slot or None) of an updater key."""
        if self._update_on_kvstore:
            if isinstance(key, str) and key in self._params:
                return key, None
        elif isinstance(key, int) and not isinstance(key, bool):
            i, k = divmod(key, len(self._contexts))
            if i < len(self._param_names):
                return self._param_names[i], k
        raise ValueError(f"optimizer key {key!r} does not belong to any parameter of the module")

    def get_optimizer_states(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The optimizer's state: ``(arrays, meta)``, NDArrays on CPU and a JSON-able dict.

        ``meta`` holds what MXNet's pickled ``.states`` file lacks: the update counters
        (``num_update`` and the per-device, per-key counts that drive the lr scheduler and
        Adam's bias correction), Nadam's momentum schedule, and for every updater key its
        parameter, device slot, update count and state structure (None, an array, or nested
        tuples/lists, e.g. Adam's (mean, var) or multi_precision's fp32 weight copy). Keys are
        ``index * num_device + device`` for the local updater and parameter names when the
        kvstore runs the optimizer. Save ``arrays`` with ``mx.nd.save`` and ``meta`` as JSON:
        neither format can carry code.
        """
        updater = self._state_updater()
        opt = self._optimizer
        if hasattr(opt, "cumgrads"):  # LBSGD accumulates gradients in the optimizer itself
            raise ValueError(f"{type(opt).__name__} keeps state outside its updater: not saved")
        counts: dict[Any, tuple[int, int]] = {}  # key -> (device id, count)
        for dev, per_key in opt._all_index_update_counts.items():
            for key, n in per_key.items():
                if key not in counts or n > counts[key][1]:
                    counts[key] = (int(dev), int(n))
        current = next(
            (
                int(dev)
                for dev, per_key in opt._all_index_update_counts.items()
                if per_key is opt._index_update_count
            ),
            None,
        )
        arrays: dict[str, Any] = {}
        entries = []
        keys = list(updater.states) + [k for k in counts if k not in updater.states]
        for n, key in enumerate(keys):
            name, slot = self._key_owner(key)
            param = self._params[name][0]
            entry: dict[str, Any] = {
                "key": key,
                "param": name,
                "device": slot,
                "shape": list(param.shape),
                "dtype": np.dtype(param.dtype).name,
            }
            if key in counts:
                entry["count_device"], entry["count"] = counts[key]
            if key in updater.states:
                entry["state"] = _encode_state(updater.states[key], f"s{n}", arrays)
            entries.append(entry)
        attributes = {
            a: getattr(opt, a)
            for a in _DYNAMIC_OPTIMIZER_ATTRS
            if isinstance(getattr(opt, a, None), _SCALARS)
        }
        meta = {
            "format": OPTIMIZER_STATE_FORMAT,
            "optimizer": type(opt).__name__,
            "update_on_kvstore": self._update_on_kvstore,
            "key_scheme": "name" if self._update_on_kvstore else "index*num_device+device",
            "num_device": len(self._contexts),
            "num_update": int(opt.num_update),
            "begin_num_update": int(opt.begin_num_update),
            "current_device": current,
            "attributes": attributes,
            "entries": entries,
        }
        return arrays, meta

    def set_optimizer_states(self, arrays: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        """Restore what :meth:`get_optimizer_states` returned (after ``init_optimizer``).

        Raises ``ValueError`` naming what differs when the state does not fit this module:
        another optimizer class, unknown parameters, other shapes, or a state structure the
        optimizer would not create (e.g. momentum switched on or off). When the device count or
        the updater's place (local / kvstore) changed, each parameter's state and update count
        are copied to every key that now holds it (all devices keep identical states).
        """
        updater = self._state_updater()
        opt = self._optimizer
        if meta.get("format") != OPTIMIZER_STATE_FORMAT:
            raise ValueError(
                f"optimizer state format {meta.get('format')!r} is not supported "
                f"(expected {OPTIMIZER_STATE_FORMAT})"
            )
        if meta.get("optimizer") != type(opt).__name__:
            raise ValueError(
                f"the optimizer state was saved for {meta.get('optimizer')!r}, "
                f"the module uses {type(opt).__name__!r}"
            )
        entries = meta.get("entries")
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and "key" in e and "param" in e for e in entries
        ):
            raise ValueError("malformed optimizer state: 'entries' is not a list of key records")

        unknown = sorted({str(e["param"]) for e in entries} - set(self._params))
        if unknown:
            raise ValueError(f"the optimizer state has parameters the module lacks: {unknown}")
        wrong = sorted(
            {
                f"{e['param']} {tuple(e.get('shape') or ())} (module: "
                f"{tuple(self._params[e['param']][0].shape)})"
                for e in entries
                if tuple(e.get("shape") or ()) != tuple(self._params[e["param"]][0].shape)
            }
        )
        if wrong:
            raise ValueError("optimizer state for parameters of another shape: " + "; ".join(wrong))

        # every described array exists, nothing else is in the file, and each state looks like
        # what this optimizer creates for the parameter
        used: set[str] = set()
        expected: dict[str, str] = {}
        for e in entries:
            if "state" not in e:
                continue
            got = _spec_signature(e["state"], arrays, used)
            name = e["param"]
            if name not in expected:
                expected[name] = self._fresh_signature(name)
            if got != expected[name]:
                raise ValueError(
                    f"optimizer state of {name} (key {e['key']!r}) is {got}, but "
                    f"{type(opt).__name__} with these settings keeps {expected[name]}"
                )
        extra = sorted(set(arrays) - used)
        if extra:
            raise ValueError(f"optimizer state arrays not described by the metadata: {extra}")

        ndev = len(self._contexts)
        same_layout = bool(meta.get("update_on_kvstore")) == self._update_on_kvstore and (
            self._update_on_kvstore or meta.get("num_device") == ndev
        )
        by_key = {_hashable(e["key"]): e for e in entries}
        # for another layout: one state per parameter (the first device's) and its top count
        canonical: dict[str, dict[str, Any]] = {}
        for e in sorted(entries, key=lambda e: e.get("device") or 0):
            record = canonical.setdefault(e["param"], {})
            if "state" in e and "state" not in record:
                record["state"] = e["state"]
            if e.get("count") is not None:
                record["count"] = max(int(e["count"]), record.get("count", 0))

        # where the counts go: the local updater counts per device (the weight's device id);
        # the kvstore's updater counts under the device of its stored copy, which Python cannot
        # see, so those counts go under every id it might use (unused entries are harmless)
        kv_devices = {0} | {int(c.device_id) for c in self._contexts}
        kv_devices |= {int(e["count_device"]) for e in entries if e.get("count_device") is not None}
        if self._update_on_kvstore:
            targets: list[tuple[Any, str, int | None]] = [(n, n, None) for n in self._param_names]
        else:
            targets = [
                (i * ndev + k, n, k) for i, n in enumerate(self._param_names) for k in range(ndev)
            ]
        states: dict[Any, Any] = {}
        all_counts: dict[int, dict[Any, int]] = {0: {}}
        for key, name, slot in targets:
            source = by_key.get(key) if same_layout else canonical.get(name)
            if source is None:
                continue
            if "state" in source:
                states[key] = _decode_state(source["state"], arrays)
            if source.get("count") is not None:
                devices = kv_devices if slot is None else {int(self._contexts[slot].device_id)}
                for dev in devices:
                    all_counts.setdefault(dev, {})[key] = int(source["count"])

        updater.states.clear()
        updater.states.update(states)
        # the updater moves each state to its weight's device on first use
        updater.states_synced.clear()
        updater.states_synced.update(dict.fromkeys(states, False))
        opt._all_index_update_counts = all_counts
        current = meta.get("current_device")
        opt._index_update_count = all_counts.setdefault(current if current is not None else 0, {})
        opt.num_update = int(meta.get("num_update", opt.begin_num_update))
        for attr, value in (meta.get("attributes") or {}).items():
            if attr in _DYNAMIC_OPTIMIZER_ATTRS and hasattr(opt, attr):
                setattr(opt, attr, value)

    def _fresh_signature(self, name: str) -> str:
        """The signature of the state this optimizer would create for parameter ``name``."""
        param = self._params[name][0]
        index = self._param_names.index(name)
        key: Any = name if self._update_on_kvstore else index * len(self._contexts)
        weight = mx.nd.zeros(param.shape, ctx=mx.cpu(), dtype=param.dtype)
        with warnings.catch_warnings():  # float16 without multi_precision warns on creation
            warnings.simplefilter("ignore")
            return _state_signature(self._optimizer.create_state_multi_precision(key, weight))

    # -- computation ------------------------------------------------------------------------

    def forward(self, data_batch: Any, is_train: bool | None = None) -> None:
        """Run the batch's bucket forward (binding it on first sight)."""
        if not self.params_initialized:
            raise RuntimeError("call init_params() or set_params() first")
        bucket = self._bucket_for(data_batch)
        assert bucket is not None
        self._curr = bucket
        _copy_in(data_batch.data, bucket.data_targets)
        if bucket.label_targets is not None and data_batch.label:
            _copy_in(data_batch.label, bucket.label_targets)
        if self._states:
            self._states_in(bucket, bool(getattr(data_batch, "reset_states", False)))
        train = self.for_training if is_train is None else is_train
        for ex in bucket.execs:
            ex.forward(is_train=train)
        if self._states:
            self._states_out(bucket)

    # -- recurrent state carried across batches (``states``) ---------------------------------

    @property
    def state_names(self) -> list[str]:
        """The begin-state inputs carried from batch to batch (``states``)."""
        return list(self._states)

    def _states_in(self, bucket: _Bucket, reset: bool) -> None:
        """Copy the kept final states into the bucket's begin-state inputs (zeros when there
        are none, on ``reset``, or when the shape changed)."""
        if reset:
            self._state_values = {}
        for name in self._states:
            kept = self._state_values.get(name)
            for k, ex in enumerate(bucket.execs):
                dst = ex.arg_dict[name]
                src = kept[k] if kept is not None else None
                if src is None or src.shape != dst.shape:
                    dst[:] = 0
                else:
                    src.copyto(dst)

    def _states_out(self, bucket: _Bucket) -> None:
        """Keep each device's final states (queued copies: nothing waits)."""
        for name, output in self._states.items():
            index = bucket.output_names.index(output)
            kept = self._state_values.get(name)
            if kept is None:
                kept = self._state_values[name] = [None] * len(bucket.execs)
            for k, ex in enumerate(bucket.execs):
                out = ex.outputs[index]
                if kept[k] is None or kept[k].shape != out.shape:
                    kept[k] = out.copyto(out.context)
                else:
                    out.copyto(kept[k])

    def reset_states(self) -> None:
        """The next forward starts from zero states."""
        self._state_values = {}

    def get_states(self) -> dict[str, Any]:
        """CPU copies of the kept states, ``NAME@DEVICE`` -> array (empty after a reset)."""
        return {
            f"{name}@{k}": value.copyto(mx.cpu())
            for name, values in self._state_values.items()
            for k, value in enumerate(values)
            if value is not None
        }

    def set_states(self, arrays: Mapping[str, Any]) -> None:
        """Put back what :meth:`get_states` returned (same states and devices), or raise
        ``ValueError`` naming what does not fit."""
        kept: dict[str, list[Any]] = {}
        ndev = len(self._contexts)
        for key, value in arrays.items():
            name, _, device = key.rpartition("@")
            if name not in self._states or not device.isdigit() or int(device) >= ndev:
                raise ValueError(
                    f"recurrent state {key!r} does not fit this module (states "
                    f"{list(self._states)} on {ndev} device(s))"
                )
            values = kept.setdefault(name, [None] * ndev)
            values[int(device)] = value.copyto(self._contexts[int(device)])
        self._state_values = kept

    @contextmanager
    def separate_states(self) -> Iterator[None]:
        """Within the block, states start from zeros; the kept ones come back after it (an
        evaluation in the middle of training must not disturb the training streams)."""
        saved = self._state_values
        self._state_values = {}
        try:
            yield
        finally:
            self._state_values = saved

    def backward(self, out_grads: Any = None) -> None:
        """Backward through the current bucket; ``out_grads`` only for non-loss outputs."""
        bucket = self._require()
        if not self.for_training:
            raise RuntimeError("the module is bound for inference: bind(for_training=True)")
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

    def forward_backward(self, data_batch: Any) -> None:
        """``forward(data_batch, is_train=True)`` then ``backward()``."""
        self.forward(data_batch, is_train=True)
        self.backward()

    def progress_marker(self) -> Any:
        """A one-element array summed from the last backward's smallest gradient, or None
        without gradients. Waiting for it waits for that batch's backward (and the update
        queued before it), not for batches queued later: the training loop uses it to keep
        Python at most a few batches ahead of the devices."""
        bucket = self._require()
        grads = [self._grads[self._param_names[i]] for i in bucket.update_indices]
        if not grads:
            return None
        smallest = min((g[0] for g in grads if g is not None), key=lambda a: a.size)
        return mx.nd.sum(smallest)

    def zero_grads(self) -> None:
        """Set every parameter gradient to zero on every device.

        Needed when gradients accumulate over several batches (bound with grad_req 'add'):
        after each update the sums start again from zero. All buckets share these arrays.
        """
        for grads in self._grads.values():
            for grad in grads or ():
                grad[:] = 0

    def update(self) -> None:
        """Apply the optimizer to the gradients of the last backward."""
        bucket = self._require(optimizer=True)
        names = self._param_names
        kv = self._kvstore
        if self._update_on_kvstore:
            for i in bucket.update_indices:
                name = names[i]
                kv.pushpull(name, self._grads[name], out=self._params[name], priority=-i)
            return
        if kv is not None:
            for i in bucket.update_indices:
                # sum the devices' gradients in place, then every device updates its own copy
                kv.pushpull(names[i], self._grads[names[i]], priority=-i)
        if self._clip_global_norm is not None:
            self._clip_gradients(bucket)
        if bucket.device_updates is None:
            bucket.device_updates = self._device_updates(bucket)
        updater = self._updater
        for indices, grads, weights in bucket.device_updates:
            updater(indices, grads, weights)

    def _clip_gradients(self, bucket: _Bucket) -> None:
        """Scale the summed gradients so that their global norm is at most the bound (queued
        operations only: nothing waits for the device)."""
        names = self._param_names
        grads = [self._grads[names[i]] for i in bucket.update_indices]
        if not grads:
            return
        squares = [_sum_of_squares(g[0]) for g in grads]  # type: ignore[index]
        total = squares[0] if len(squares) == 1 else mx.nd.add_n(*squares)
        norm = mx.nd.sqrt(total) * float(self._optimizer.rescale_grad)
        scale = mx.nd.minimum(self._clip_global_norm / (norm + 1e-6), 1.0)
        self._norm_sum = norm if self._norm_sum is None else self._norm_sum + norm
        self._norm_count += 1
        for k, ctx in enumerate(self._contexts):
            mine = scale.as_in_context(ctx)
            for g in grads:
                grad = g[k]  # type: ignore[index]
                mx.nd.broadcast_mul(grad, mine, out=grad)

    def update_multipliers(self) -> dict[str, tuple[float, float]]:
        """``{parameter: (lr multiplier, wd multiplier)}`` as the optimizer applies them
        (MXNet's defaults included), for every trained parameter."""
        self._require(optimizer=True)
        opt = self._optimizer
        fixed = set(self._fixed)
        return {
            name: (float(opt.lr_mult.get(name, 1.0)), float(opt.wd_mult.get(name, 1.0)))
            for name in self._param_names
            if name not in fixed
        }

    def take_grad_norm(self) -> float | None:
        """The mean global gradient norm (``clip_global_norm``, before clipping) over the
        updates since the last call, or None when none was computed (synchronises)."""
        if self._norm_sum is None or not self._norm_count:
            return None
        value = float(self._norm_sum.asscalar()) / self._norm_count
        self._norm_sum, self._norm_count = None, 0
        return value

    def _device_updates(self, bucket: _Bucket) -> list[tuple[list[int], list[Any], list[Any]]]:
        """Per device: optimizer indices, gradients and weights, built once per bucket."""
        ndev = len(self._contexts)
        names = self._param_names
        out = []
        for k in range(ndev):
            indices = [i * ndev + k for i in bucket.update_indices]
            if indices:
                grads = [self._grads[names[i]][k] for i in bucket.update_indices]  # type: ignore[index]
                weights = [self._params[names[i]][k] for i in bucket.update_indices]
                out.append((indices, grads, weights))
        return out

    def get_outputs(self, merge_multi_context: bool = True) -> list[Any]:
        """Outputs of the last forward: merged over devices, or ``[output][device]``."""
        bucket = self._require()
        per_dev = [[ex.outputs[i] for ex in bucket.execs] for i in range(len(bucket.output_names))]
        if merge_multi_context:
            return _merge(per_dev, bucket.output_axes)
        return per_dev

    def get_input_grads(self, merge_multi_context: bool = True) -> list[Any]:
        """Gradients with respect to the data inputs (needs ``inputs_need_grad``)."""
        bucket = self._require()
        if not self.inputs_need_grad:
            raise RuntimeError("bind with inputs_need_grad=True to get input gradients")
        per_dev = [[ex.grad_dict[n] for ex in bucket.execs] for n in bucket.data_names]
        if merge_multi_context:
            return _merge(per_dev, [_batch_axis(d.layout) for d in bucket.data_descs])
        return per_dev

    def update_metric(
        self, eval_metric: Any, labels: Sequence[Any], pre_sliced: bool = False
    ) -> None:
        """Feed the last outputs and ``labels`` to the metric, one call per device.

        Uses ``eval_metric.update_dict(labels, preds)`` when the metric has it (MXNet metrics),
        else ``eval_metric.update(labels, preds)`` with lists of NDArrays.
        """
        bucket = self._require()
        has_dict = hasattr(eval_metric, "update_dict")
        axes = [_batch_axis(d.layout) for d in bucket.label_descs or []]
        single = len(bucket.execs) == 1
        for k, ex in enumerate(bucket.execs):
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
            preds = ex.outputs
            if has_dict:
                names = bucket.label_names or self._label_names
                eval_metric.update_dict(
                    OrderedDict(zip(names, mine, strict=False)),
                    OrderedDict(zip(bucket.output_names, preds, strict=True)),
                )
            else:
                eval_metric.update(mine, preds)
