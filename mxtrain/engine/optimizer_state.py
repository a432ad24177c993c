"""The optimizer's state as NDArrays plus JSON, and back: what a checkpoint keeps so that a
resumed run continues exactly.

MXNet's own ``.states`` file pickles the updater (loading one from elsewhere could run
arbitrary code) and omits the update counters (``num_update`` and the per-device, per-key
counts that drive the lr scheduler and Adam's bias correction): both are kept here.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, TypeAlias

import mxnet as mx
import numpy as np

from mxtrain.engine.optimizer_setup import Optimization
from mxtrain.engine.parameters import ParameterStore

__all__ = [
    "OPTIMIZER_STATE_FORMAT",
    "capture_optimizer_state",
    "optimizer_state_arrays",
    "restore_optimizer_state",
]

NDArray = mx.nd.NDArray

OPTIMIZER_STATE_FORMAT = 1

# Optimizer attributes that change while training but live outside the updater's states
# (Nadam's momentum schedule). They are saved with the states so a resumed run continues exactly.
_DYNAMIC_OPTIMIZER_ATTRS = ("m_schedule",)
_SCALARS = (bool, int, float, str)
#: JSON description of one updater state: None, {"array": name in the arrays file},
#: {"tuple" or "list": [descriptions]} or {"value": a scalar}
StateSpec: TypeAlias = "dict[str, bool | int | float | str | list[StateSpec]] | None"


def _encode_state(state: Any, name: str, arrays: dict[str, Any]) -> StateSpec:
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


def _spec_signature(spec: StateSpec, arrays: Mapping[str, Any], used: set[str]) -> str:
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


def _decode_state(spec: StateSpec, arrays: Mapping[str, Any]) -> Any:
    """The state a (checked) description stands for, with arrays copied: the updater changes
    states in place and must not write into the caller's arrays."""
    if spec is None:
        return None
    ((kind, value),) = spec.items()
    if kind == "array" and isinstance(value, str):
        return arrays[value].copy()
    if not isinstance(value, list):  # {"value": scalar}
        return value
    items = [_decode_state(v, arrays) for v in value]
    return tuple(items) if kind == "tuple" else items


def _updater_of(opt: Optimization) -> Any:
    updater = opt.updater
    if updater is None:
        raise RuntimeError(
            "the optimizer state lives on the kvstore servers (a distributed kvstore that "
            "updates on the servers): it cannot be read or set from a worker"
        )
    return updater


def _key_owner(opt: Optimization, store: ParameterStore, ndev: int, key: Any) -> tuple[str, Any]:
    """(parameter name, device slot or None) of an updater key."""
    if opt.update_on_kvstore:
        if isinstance(key, str) and key in store.params:
            return key, None
    elif isinstance(key, int) and not isinstance(key, bool):
        i, k = divmod(key, ndev)
        if i < len(store.names):
            return store.names[i], k
    raise ValueError(f"optimizer key {key!r} does not belong to any parameter of the module")


def optimizer_state_arrays(optimizer: Any) -> int:
    """How many arrays of a parameter's size ``optimizer`` keeps per parameter (Adam 2,
    SGD with momentum 1), counted on a one-value stand-in; 0 where it cannot say."""
    probe = mx.nd.zeros((1,))
    try:
        state = optimizer.create_state_multi_precision(0, probe)
    except Exception:  # an optimizer that needs more than a plain float32 array to say
        return 0

    def count(item: Any) -> int:
        if isinstance(item, NDArray):
            return 1
        if isinstance(item, list | tuple):
            return sum(count(i) for i in item)
        return 0

    return count(state)


def capture_optimizer_state(
    opt: Optimization, store: ParameterStore, ndev: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The optimizer's state: ``(arrays, meta)``, NDArrays on CPU and a JSON-able dict.

    ``meta`` holds the update counters, Nadam's momentum schedule, and for every updater key
    its parameter, device slot, update count and state structure (None, an array, or nested
    tuples/lists, e.g. Adam's (mean, var) or multi_precision's fp32 weight copy). Keys are
    ``index * num_device + device`` for the local updater and parameter names when the
    kvstore runs the optimizer.
    """
    updater = _updater_of(opt)
    optimizer = opt.optimizer
    if hasattr(optimizer, "cumgrads"):  # LBSGD accumulates gradients in the optimizer itself
        raise ValueError(f"{type(optimizer).__name__} keeps state outside its updater: not saved")
    all_counts = optimizer._all_index_update_counts
    counts: dict[Any, tuple[int, int]] = {}  # key -> (device id, count)
    for dev, per_key in all_counts.items():
        for key, n in per_key.items():
            if key not in counts or n > counts[key][1]:
                counts[key] = (int(dev), int(n))
    current = next(
        (
            int(dev)
            for dev, per_key in all_counts.items()
            if per_key is optimizer._index_update_count
        ),
        None,
    )
    arrays: dict[str, Any] = {}
    entries = []
    keys = list(updater.states) + [k for k in counts if k not in updater.states]
    for n, key in enumerate(keys):
        name, slot = _key_owner(opt, store, ndev, key)
        param = store.params[name][0]
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
        a: getattr(optimizer, a)
        for a in _DYNAMIC_OPTIMIZER_ATTRS
        if isinstance(getattr(optimizer, a, None), _SCALARS)
    }
    meta = {
        "format": OPTIMIZER_STATE_FORMAT,
        "optimizer": type(optimizer).__name__,
        "update_on_kvstore": opt.update_on_kvstore,
        "key_scheme": "name" if opt.update_on_kvstore else "index*num_device+device",
        "num_device": ndev,
        "num_update": int(optimizer.num_update),
        "begin_num_update": int(optimizer.begin_num_update),
        "current_device": current,
        "attributes": attributes,
        "entries": entries,
    }
    return arrays, meta


def _fresh_signature(opt: Optimization, store: ParameterStore, ndev: int, name: str) -> str:
    """The signature of the state this optimizer would create for parameter ``name``."""
    param = store.params[name][0]
    index = store.names.index(name)
    key: Any = name if opt.update_on_kvstore else index * ndev
    weight = mx.nd.zeros(param.shape, ctx=mx.cpu(), dtype=param.dtype)
    with warnings.catch_warnings():  # float16 without multi_precision warns on creation
        warnings.simplefilter("ignore")
        return _state_signature(opt.optimizer.create_state_multi_precision(key, weight))


def _check_meta(opt: Optimization, meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The entries of ``meta``, once its format and optimizer class are this module's."""
    if meta.get("format") != OPTIMIZER_STATE_FORMAT:
        raise ValueError(
            f"optimizer state format {meta.get('format')!r} is not supported "
            f"(expected {OPTIMIZER_STATE_FORMAT})"
        )
    name = type(opt.optimizer).__name__
    if meta.get("optimizer") != name:
        raise ValueError(
            f"the optimizer state was saved for {meta.get('optimizer')!r}, the module uses {name!r}"
        )
    entries = meta.get("entries")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and "key" in e and "param" in e for e in entries
    ):
        raise ValueError("malformed optimizer state: 'entries' is not a list of key records")
    return entries


def _check_entries(
    opt: Optimization,
    store: ParameterStore,
    ndev: int,
    entries: list[dict[str, Any]],
    arrays: Mapping[str, Any],
) -> None:
    """Raise ``ValueError`` unless every entry's parameter exists with its shape, every
    described array exists, nothing else is in ``arrays``, and each state looks like what
    this optimizer creates for the parameter."""
    params = store.params
    unknown = sorted({str(e["param"]) for e in entries} - set(params))
    if unknown:
        raise ValueError(f"the optimizer state has parameters the module lacks: {unknown}")
    wrong = sorted(
        {
            f"{e['param']} {tuple(e.get('shape') or ())} (module: "
            f"{tuple(params[e['param']][0].shape)})"
            for e in entries
            if tuple(e.get("shape") or ()) != tuple(params[e["param"]][0].shape)
        }
    )
    if wrong:
        raise ValueError("optimizer state for parameters of another shape: " + "; ".join(wrong))
    used: set[str] = set()
    expected: dict[str, str] = {}
    for e in entries:
        if "state" not in e:
            continue
        got = _spec_signature(e["state"], arrays, used)
        name = e["param"]
        if name not in expected:
            expected[name] = _fresh_signature(opt, store, ndev, name)
        if got != expected[name]:
            raise ValueError(
                f"optimizer state of {name} (key {e['key']!r}) is {got}, but "
                f"{type(opt.optimizer).__name__} with these settings keeps {expected[name]}"
            )
    extra = sorted(set(arrays) - used)
    if extra:
        raise ValueError(f"optimizer state arrays not described by the metadata: {extra}")


def _states_and_counts(
    opt: Optimization,
    store: ParameterStore,
    contexts: list[Any],
    entries: list[dict[str, Any]],
    meta: Mapping[str, Any],
    arrays: Mapping[str, Any],
) -> tuple[dict[Any, Any], dict[int, dict[Any, int]]]:
    """The updater's states by key and the update counts by device and key, for this
    module's keys (copied to every key that now holds a parameter when the layout changed)."""
    ndev = len(contexts)
    same_layout = bool(meta.get("update_on_kvstore")) == opt.update_on_kvstore and (
        opt.update_on_kvstore or meta.get("num_device") == ndev
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
    kv_devices = {0} | {int(c.device_id) for c in contexts}
    kv_devices |= {int(e["count_device"]) for e in entries if e.get("count_device") is not None}
    if opt.update_on_kvstore:
        targets: list[tuple[Any, str, int | None]] = [(n, n, None) for n in store.names]
    else:
        targets = [(i * ndev + k, n, k) for i, n in enumerate(store.names) for k in range(ndev)]
    states: dict[Any, Any] = {}
    all_counts: dict[int, dict[Any, int]] = {0: {}}
    for key, name, slot in targets:
        source = by_key.get(key) if same_layout else canonical.get(name)
        if source is None:
            continue
        if "state" in source:
            states[key] = _decode_state(source["state"], arrays)
        if source.get("count") is not None:
            devices = kv_devices if slot is None else {int(contexts[slot].device_id)}
            for dev in devices:
                all_counts.setdefault(dev, {})[key] = int(source["count"])
    return states, all_counts


def restore_optimizer_state(
    opt: Optimization,
    store: ParameterStore,
    contexts: list[Any],
    arrays: Mapping[str, Any],
    meta: Mapping[str, Any],
) -> None:
    """Restore what :func:`capture_optimizer_state` returned.

    Raises ``ValueError`` naming what differs when the state does not fit: another optimizer
    class, unknown parameters, other shapes, or a state structure the optimizer would not
    create (e.g. momentum switched on or off). When the device count or the updater's place
    (local / kvstore) changed, each parameter's state and update count are copied to every
    key that now holds it (all devices keep identical states).
    """
    updater = _updater_of(opt)
    entries = _check_meta(opt, meta)
    _check_entries(opt, store, len(contexts), entries, arrays)
    states, all_counts = _states_and_counts(opt, store, contexts, entries, meta, arrays)

    updater.states.clear()
    updater.states.update(states)
    # the updater moves each state to its weight's device on first use
    updater.states_synced.clear()
    updater.states_synced.update(dict.fromkeys(states, False))
    optimizer = opt.optimizer
    optimizer._all_index_update_counts = all_counts
    current = meta.get("current_device")
    optimizer._index_update_count = all_counts.setdefault(current if current is not None else 0, {})
    optimizer.num_update = int(meta.get("num_update", optimizer.begin_num_update))
    for attr, value in (meta.get("attributes") or {}).items():
        if attr in _DYNAMIC_OPTIMIZER_ATTRS and hasattr(optimizer, attr):
            setattr(optimizer, attr, value)
