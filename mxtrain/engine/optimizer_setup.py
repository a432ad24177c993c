"""The optimizer, the kvstore and the updater of the bucketing module: how they are created
(as MXNet 1.9.1's module does: same indices, same kvstore calls) and kept in step.

Which optimizer and kvstore to use is the caller's choice (mxtrain.optimizers, the config);
this module only wires them to the parameter store.
"""

from __future__ import annotations

import atexit
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import mxnet as mx
import numpy as np

from mxtrain.engine.parameters import ParameterStore, resolve_multipliers

__all__ = ["Optimization", "create_optimization", "wait_before_freeing_kvstore"]

_LOG = logging.getLogger(__name__)

# MXNet's own heuristic: local kvstore updates on the kvstore unless a parameter is this big.
_BIG_PARAM_ELEMENTS = 16 * 1024 * 1024

_INTERPRETER_EXITING = False


@atexit.register
def _note_exit() -> None:  # registered after MXNet's own hook, so it runs before it
    global _INTERPRETER_EXITING
    _INTERPRETER_EXITING = True


def wait_before_freeing_kvstore() -> None:
    """Let the engine finish before a kvstore the module created can be freed.

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


class Optimization:
    """The optimizer, the kvstore (or None) and whether the kvstore runs the optimizer; the
    local updater when it does not."""

    def __init__(self, optimizer: Any, kvstore: Any, update_on_kvstore: bool) -> None:
        self.optimizer = optimizer
        self.kvstore = kvstore
        self.update_on_kvstore = update_on_kvstore
        self.local_updater: Any = None if update_on_kvstore else mx.optimizer.get_updater(optimizer)

    @property
    def updater(self) -> Any:
        """The ``mx.optimizer.Updater`` holding optimizer state: the local one, or the
        kvstore's when updating on a local/device kvstore; None for a distributed kvstore
        (state lives on the servers)."""
        if self.local_updater is not None:
            return self.local_updater
        if self.kvstore is not None and self.update_on_kvstore:
            return getattr(self.kvstore, "_updater", None)
        return None

    def refresh_kvstore_weights(self, store: ParameterStore) -> None:
        """After the parameters were set: overwrite the copy of the weights the kvstore keeps
        when it runs the optimizer (the next pull would undo the change) by pushing the new
        values through a temporary "copy" updater."""
        kv = self.kvstore
        if kv is None or not self.update_on_kvstore:
            return
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
            for idx, name in enumerate(store.names):
                kv.push(name, store.params[name][0], priority=-idx)
        finally:
            kv._set_updater(saved)

    def update_multipliers(self, store: ParameterStore) -> dict[str, tuple[float, float]]:
        """``{parameter: (lr multiplier, wd multiplier)}`` as the optimizer applies them
        (MXNet's defaults included), for every trained parameter."""
        opt = self.optimizer
        fixed = set(store.fixed)
        return {
            name: (float(opt.lr_mult.get(name, 1.0)), float(opt.wd_mult.get(name, 1.0)))
            for name in store.names
            if name not in fixed
        }


def _create_kvstore(
    kvstore: Any, override: bool | None, ndev: int, store: ParameterStore
) -> tuple[Any, bool]:
    """The kvstore (None for a single device without ``dist``) and whether it updates."""
    if kvstore is None:
        kv = None
    elif isinstance(kvstore, mx.kvstore.KVStoreBase):
        kv = kvstore
    elif isinstance(kvstore, str):
        alone = ndev == 1 and "dist" not in kvstore and not override
        kv = None if alone else mx.kv.create(kvstore)  # alone: nothing to aggregate
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
        biggest = max((int(np.prod(a[0].shape)) for a in store.params.values()), default=0)
        if biggest > _BIG_PARAM_ELEMENTS:
            on_kv = False
    return kv, on_kv and capable


def _make_optimizer(
    optimizer: Any,
    optimizer_params: Mapping[str, Any] | Iterable[tuple[str, Any]],
    rescale_grad: float,
    idx2name: dict[int, str],
    symbol: Any,
) -> Any:
    """An optimizer by name (``rescale_grad`` unless given), or the one given, checked."""
    if isinstance(optimizer, str):
        params = dict(optimizer_params)
        params.setdefault("rescale_grad", rescale_grad)
        return mx.optimizer.create(optimizer, sym=symbol, param_idx2name=idx2name, **params)
    if isinstance(optimizer, mx.optimizer.Optimizer):
        if optimizer.rescale_grad != rescale_grad:
            warnings.warn(
                f"optimizer created outside the module has rescale_grad="
                f"{optimizer.rescale_grad}, not 1/batch_size/num_workers={rescale_grad}",
                stacklevel=4,
            )
        if not optimizer.idx2name:
            optimizer.idx2name = idx2name.copy()
        return optimizer
    raise TypeError(f"optimizer must be a name or an mx.optimizer.Optimizer: {optimizer!r}")


def _start_kvstore(kv: Any, on_kv: bool, optimizer: Any, store: ParameterStore) -> None:
    """Give the kvstore the optimizer (when it updates) and the starting weights."""
    if on_kv:
        kv.set_optimizer(optimizer)
    arg, _ = store.get()
    # A dist kvstore keeps the values rank 0 initialised: pulling them back makes
    # every worker start from the same weights whatever its own initialisation.
    start_from_store = "dist" in kv.type
    for name in store.names:
        if on_kv:
            kv.broadcast(name, arg[name], out=store.params[name])
        else:
            kv.init(name, arg[name])
            if start_from_store:
                kv.pull(name, out=store.params[name])


def create_optimization(
    store: ParameterStore,
    *,
    ndev: int,
    batch_size: int,
    symbol: Any,
    kvstore: Any,
    optimizer: Any,
    optimizer_params: Mapping[str, Any] | Iterable[tuple[str, Any]],
    update_on_kvstore: bool | None,
    clips: bool,
    lr_mult: Mapping[str, float] | None,
    wd_mult: Mapping[str, float] | None,
    on_kvstore_ready: Callable[[Any], None] | None = None,
) -> Optimization:
    """The optimizer, kvstore and updater for ``store`` on ``ndev`` devices; ``batch_size``
    is the default bucket's and ``clips`` whether gradients are clipped by their global norm
    (which needs the updates on the workers).

    ``kvstore`` is a type name, an ``mx.kv.KVStore`` or None. As in MXNet, a single device
    without ``dist`` gets no kvstore; whether updates run on the kvstore follows MXNet
    (``MXNET_UPDATE_ON_KVSTORE``, big-parameter rule for ``local``) unless
    ``update_on_kvstore`` says otherwise. ``rescale_grad`` defaults to 1/batch_size (times
    the number of workers for ``dist_sync``).

    ``lr_mult``/``wd_mult``: fnmatch glob -> multiplier of the learning rate / weight decay
    of the parameters it matches (:func:`~mxtrain.engine.parameters.resolve_multipliers`: a
    glob matching nothing, or a parameter matched twice, raises ``ParamPatternError``). They
    replace MXNet's per-name settings on top of its defaults (a symbol's ``__lr_mult__``
    attributes; no weight decay for names not ending in ``_weight``/``_gamma``).

    ``on_kvstore_ready(kv)`` runs once everything is checked and before the kvstore receives
    the weights (the module waits there for an old kvstore it replaces)."""
    lr_by_name = resolve_multipliers(store.names, lr_mult or {}, "lr_mult")
    wd_by_name = resolve_multipliers(store.names, wd_mult or {}, "wd_mult")
    kv, on_kv = _create_kvstore(kvstore, update_on_kvstore, ndev, store)
    if kv is not None and store.sparse_grads:
        raise ValueError(
            f"row_sparse gradients ({', '.join(sorted(store.sparse_grads))}) train on one "
            "device without a kvstore: the module's kvstore calls sum dense gradients only"
        )

    if kv is not None and "dist" in kv.type and "_sync" in kv.type:
        batch_size *= kv.num_workers
    rescale_grad = 1.0 / batch_size

    if on_kv:
        idx2name = dict(enumerate(store.names))
    else:
        # the local updater keeps one state per (parameter, device): index i*ndev+k
        idx2name = {i * ndev + k: n for i, n in enumerate(store.names) for k in range(ndev)}
    optimizer = _make_optimizer(optimizer, optimizer_params, rescale_grad, idx2name, symbol)
    if lr_by_name:
        optimizer.set_lr_mult(lr_by_name)  # keeps the symbol's __lr_mult__ attributes
    if wd_by_name:
        optimizer.set_wd_mult(wd_by_name)  # keeps MXNet's no-decay default elsewhere

    schedule = getattr(optimizer, "lr_scheduler", None)
    if on_kv and (
        clips or hasattr(schedule, "set_training_position") or hasattr(schedule, "reductions")
    ):
        raise ValueError(
            "global-norm clipping, epoch-counted and plateau lr schedules need the updates on "
            "the workers: the kvstore's servers never see the summed gradients' norm, the "
            "epoch or the evaluations (update_on_kvstore=False)"
        )
    if on_kvstore_ready is not None:
        on_kvstore_ready(kv)
    if kv is not None:
        _start_kvstore(kv, on_kv, optimizer, store)
    return Optimization(optimizer, kv, on_kv)
