"""Our bucketing module: one set of parameters, one executor per (bucket, device).

It follows the semantics of MXNet 1.9.1's ``mx.mod.BucketingModule`` (same initialization order,
same optimizer indices, same kvstore calls, so training is numerically identical) but manages its
executors itself instead of stacking ``BucketingModule -> Module -> DataParallelExecutorGroup``.
The module coordinates collaborators with one job each:

* :class:`~mxtrain.engine.bucket_pool.BucketPool` binds, reshapes and unbinds the buckets'
  executors (and bounds their memory, ``bucket_memory``);
* :class:`~mxtrain.engine.parameters.ParameterStore` holds the parameters every bucket aliases
  (the default bucket's arrays), so ``update()`` always works on them whatever bucket ran last;
* :class:`~mxtrain.engine.optimizer_setup.Optimization` is the optimizer, kvstore and updater,
  whose state :mod:`mxtrain.engine.optimizer_state` saves and restores;
* :class:`~mxtrain.engine.step.BatchStep` runs forward, backward and update on a bucket;
* :class:`~mxtrain.engine.carried_states.CarriedStates` carries recurrent state across batches.

Parameters are indexed by the default bucket's parameter order everywhere, so optimizer indices
never depend on which bucket happens to be current. Nothing here knows about YAML, click or
run folders: :meth:`BucketingModule.checkpoint_state` hands a checkpoint writer what to save.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import mxnet as mx

from mxtrain.engine.bucket_pool import (
    AUTO_BUCKET_MEMORY,
    Bucket,
    BucketPool,
    SymGen,
    call_sym_gen,
    planned_pool_bytes,
)
from mxtrain.engine.carried_states import CarriedStates
from mxtrain.engine.optimizer_setup import (
    Optimization,
    create_optimization,
    wait_before_freeing_kvstore,
)
from mxtrain.engine.optimizer_state import (
    capture_optimizer_state,
    optimizer_state_arrays,
    restore_optimizer_state,
)
from mxtrain.engine.parameters import ParameterStore, resolve_fixed
from mxtrain.engine.shapes import ShapeList
from mxtrain.engine.softmax_head import SoftmaxGradientHead, SoftmaxHeadSpec
from mxtrain.engine.step import BatchStep, GradientClipper
from mxtrain.run.checkpoint_state import ModuleCheckpoint
from mxtrain.run.params import ParamShapes

__all__ = ["BucketingModule"]

_LOG = logging.getLogger(__name__)


def _check_bucket_memory(bucket_memory: float | str | None) -> float | None:
    """The bound as a factor (``"auto"``: :data:`AUTO_BUCKET_MEMORY`), or None for none."""
    if bucket_memory == "auto":
        return AUTO_BUCKET_MEMORY
    if bucket_memory is not None and not (
        isinstance(bucket_memory, int | float) and bucket_memory >= 1
    ):
        raise ValueError(
            f"bucket_memory must be at least 1 (the default bucket must fit), not {bucket_memory!r}"
        )
    return bucket_memory


def _devices(
    context: Any | Sequence[Any], work_load_list: Sequence[float] | None
) -> tuple[list[Any], list[float]]:
    """The contexts (default: the CPU) and each one's share of a batch (default: equal)."""
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
    return contexts, list(work_load_list)


class BucketingModule:
    """Train one network unrolled at several sizes ("buckets") with shared parameters.

    ``sym_gen(bucket_key) -> (symbol, data_names, label_names)`` as for MXNet's module.
    ``fixed_param_patterns`` are fnmatch globs of parameters to freeze (minus those matching
    ``fixed_param_exclude``); a glob that matches no parameter raises
    :class:`~mxtrain.engine.parameters.ParamPatternError`.

    ``bucket_memory`` (a factor of at least 1, ``"auto"`` or None) bounds the memory of the
    buckets bound at once (:class:`~mxtrain.engine.bucket_pool.BucketPool`).

    ``states`` (begin-state input name -> final-state output name) makes the module carry
    recurrent state from one batch to the next
    (:class:`~mxtrain.engine.carried_states.CarriedStates`).

    ``softmax_head`` says which output of the symbol holds logits that the module turns into
    a softmax cross-entropy loss itself, writing the logits' gradient in one pass
    (:mod:`mxtrain.engine.softmax_head`); the outputs then hold the loss (and the
    probabilities) in place of the logits.

    Collaborators, for code that needs one job's details: ``pool``, ``store``, ``step``,
    ``carried`` and ``optimization`` (None before :meth:`init_optimizer`).
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
        softmax_head: SoftmaxHeadSpec | None = None,
    ) -> None:
        if default_bucket_key is None:
            raise ValueError("default_bucket_key is required")
        # a bound the user set is kept tightly (freed blocks leave the process at once, at
        # a small cost per batch); the default one only trims the heaps after unbinding
        strict_memory = bucket_memory != "auto"
        bound = _check_bucket_memory(bucket_memory)
        contexts, work_load = _devices(context, work_load_list)
        self._contexts: list[Any] = contexts
        self.logger = logger or _LOG

        symbol, data_names, label_names = call_sym_gen(sym_gen, default_bucket_key)
        data = list(data_names or [])
        labels = list(label_names or [])
        args = symbol.list_arguments()
        missing = [n for n in data if n not in args]
        if missing:
            raise ValueError(f"data names {missing} are not arguments of the symbol: {args}")
        self.carried = CarriedStates(states, contexts)
        self.carried.check(symbol, args, data, labels)
        # the softmax head's gradient buffer, when the graph takes it as an input: shared by
        # every bucket like the data, and not a parameter
        head_inputs = (
            [softmax_head.gradient_input]
            if softmax_head is not None and softmax_head.gradient_input
            else []
        )
        inputs = set(data) | set(labels) | set(self.carried.states) | set(head_inputs)
        param_names = [a for a in args if a not in inputs]
        fixed = resolve_fixed(param_names, fixed_param_patterns, fixed_param_exclude)
        self.store = ParameterStore(param_names, symbol.list_auxiliary_states(), fixed)
        self._default_outputs: list[str] = symbol.list_outputs()
        self.pool = BucketPool(
            sym_gen,
            default_bucket_key,
            contexts,
            work_load,
            self.store,
            default_symbol=symbol,
            data_names=data,
            label_names=labels,
            state_names=self.carried.names,
            logger=self.logger,
            extra_inputs=head_inputs,
            bucket_memory=bound,
            strict_memory=strict_memory,
        )
        head = None
        self._softmax_output: int | None = None
        if softmax_head is not None:
            if not softmax_head.gradient_input:  # else nothing per bucket (softmax_head.py)
                self._softmax_output = softmax_head.output
            if softmax_head.label not in labels:
                raise ValueError(
                    f"the softmax head's label {softmax_head.label!r} is not a label input: "
                    f"{labels}"
                )
            head = SoftmaxGradientHead(softmax_head, len(contexts))
            self._default_outputs = head.output_names(self._default_outputs)
        self.step = BatchStep(contexts, self.store, self.carried, labels, head)
        self.optimization: Optimization | None = None
        self._clipper: GradientClipper | None = None

    def __del__(self) -> None:
        optimization = getattr(self, "optimization", None)
        if optimization is not None and optimization.kvstore is not None:
            wait_before_freeing_kvstore()

    # -- what the rest of mxtrain reads -----------------------------------------------------

    @property
    def param_names(self) -> list[str]:
        """Parameter names in the default bucket's argument order (the optimizer's indices)."""
        return list(self.store.names)

    @property
    def fixed_param_names(self) -> list[str]:
        return list(self.store.fixed)

    @property
    def output_names(self) -> list[str]:
        curr = self.pool.curr
        return self.step.output_names(curr) if curr is not None else list(self._default_outputs)

    @property
    def optimizer(self) -> Any:
        return self.optimization.optimizer if self.optimization is not None else None

    @property
    def optimizer_initialized(self) -> bool:
        return self.optimization is not None

    @property
    def rebinds(self) -> int:
        """Buckets bound again after ``bucket_memory`` unbound them."""
        return self.pool.rebinds

    # -- the module API's views of the current bucket and the optimizer (MXNet BaseModule) ----

    @property
    def symbol(self) -> Any:
        curr = self.pool.curr
        return curr.symbol if curr is not None else self.pool.default_symbol

    @property
    def data_shapes(self) -> list[Any]:
        return list(self._require(params=False).data_descs)

    @property
    def label_shapes(self) -> list[Any] | None:
        descs = self._require(params=False).label_descs
        return list(descs) if descs is not None else None

    @property
    def output_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return self._require(params=False).output_shapes

    @property
    def bucket_keys(self) -> list[Any]:
        """Keys of the buckets bound now (see :attr:`BucketPool.bucket_keys`)."""
        return self.pool.bucket_keys

    @property
    def curr_bucket_key(self) -> Any:
        return self.pool.curr.key if self.pool.curr is not None else None

    @property
    def bound_positions(self) -> int:
        """Input positions (batch x length) of every bucket bound now."""
        return self.pool.bound_positions

    def pending_bytes(self) -> int:
        """Memory the module has allocated or will allocate that the first batches write:
        the default bucket's executors' memory pool (as MXNet planned it), the gradients and
        the optimizer state (created at the first update)."""
        default = self._require(params=False)
        pooled = sum(planned_pool_bytes(e) for e in default.execs)
        trained = [
            arrays[0]
            for name, arrays in self.store.params.items()
            if name not in self.store.fixed_set
        ]
        values = sum(int(a.size) for a in trained) * len(self._contexts)
        state_arrays = 0
        if self.optimization is not None and self.optimization.optimizer is not None:
            state_arrays = optimizer_state_arrays(self.optimization.optimizer)
        return pooled + values * (1 + state_arrays) * 4

    def output_gradient_bytes(self) -> int:
        """Memory every bound bucket of the largest size keeps for the gradients handed to
        its outputs (``softmax_head``'s logits: MXNet copies them into arrays each executor
        allocates of its own); 0 without a head. Smaller buckets keep it in proportion."""
        if self._softmax_output is None:
            return 0
        default = self._require(params=False)
        return sum(int(e.outputs[self._softmax_output].size) * 4 for e in default.execs)

    def set_bucket_memory(self, factor: float | None, *, strict: bool) -> None:
        """Bound the buckets bound at once to ``factor`` times the largest bucket's input
        positions from now on (None: no bound); ``strict``: freed executor memory leaves
        the process at once (:class:`BucketPool`)."""
        self.pool.set_bound(_check_bucket_memory(factor), strict=strict)

    @property
    def kvstore(self) -> Any:
        return self.optimization.kvstore if self.optimization is not None else None

    @property
    def update_on_kvstore(self) -> bool:
        return self.optimization.update_on_kvstore if self.optimization is not None else False

    @property
    def updater(self) -> Any:
        """The updater holding optimizer state (:attr:`Optimization.updater`); None before
        ``init_optimizer`` or when the state lives on the kvstore servers."""
        return self.optimization.updater if self.optimization is not None else None

    @property
    def state_names(self) -> list[str]:
        """The begin-state inputs carried from batch to batch (``states``)."""
        return self.carried.names

    def param_shapes(self) -> ParamShapes:
        """(parameter shapes, auxiliary-state shapes) by name, as bound: what
        :meth:`set_params` accepts (see :func:`mxtrain.run.params.param_problems`)."""
        self._require(params=False)
        return self.store.shapes()

    def param_array(self, name: str, device: int = 0) -> Any:
        """The live weight array of ``name`` on one device (no copy: do not write to it)."""
        self._require(params=True)
        return self.store.params[name][device]

    def grad_array(self, name: str, device: int = 0) -> Any:
        """The live gradient array of ``name`` on one device, or None for a fixed parameter."""
        bucket = self._require(params=True)
        if self.store.grads.get(name) is None:
            return None
        index = self.store.names.index(name)
        return self.store.bucket_grads(bucket.execs, [index])[0][device]  # type: ignore[index]

    def _require(self, params: bool = True, optimizer: bool = False) -> Bucket:
        curr = self.pool.curr
        if curr is None:
            raise RuntimeError("call bind() first")
        if params and not self.store.initialized:
            raise RuntimeError("call init_params() or set_params() first")
        if optimizer and self.optimization is None:
            raise RuntimeError("call init_optimizer() first")
        return curr

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
        largest (see :func:`mxtrain.engine.shapes.largest_key`). With ``force_rebind`` the
        executors are rebuilt and the current parameter values kept (e.g. to switch between
        training and inference).

        ``shared_params``: a bound, initialized module on the same devices whose parameter
        arrays this one uses as its own (an inference module for a model that trains on
        another graph: it sees every update, nothing is copied). Copying values in instead
        does not work: oneDNN's inference FullyConnected keeps its weights in its own layout
        and, in MXNet 1.9.1, ignores a later copy into the array.
        """
        if self.pool.binded and not force_rebind:
            self.logger.warning("already bound, ignoring bind()")
            return
        if not for_training and inputs_need_grad:
            raise ValueError("inputs_need_grad requires for_training=True")
        if not isinstance(grad_req, str | Mapping):
            raise TypeError("grad_req must be a string or a mapping of argument name to string")
        saved = self.get_params() if self.pool.binded and self.store.initialized else None
        self.pool.reset(
            for_training=for_training,
            inputs_need_grad=inputs_need_grad,
            grad_req=grad_req,
            with_labels=label_shapes is not None,
            borrows_params=shared_params is not None,
        )
        if shared_params is not None:
            self._borrow_parameters(shared_params)
        self.pool.bind_default(data_shapes, label_shapes)
        self.store.make_staging()
        if saved is not None:
            self.store.initialized = False
            self.set_params(*saved)
        if shared_params is not None:
            self.store.check_shared(shared_params.store)
            self.store.initialized = True

    def _borrow_parameters(self, other: BucketingModule) -> None:
        """Bind ``other``'s parameter arrays instead of allocating (see :meth:`bind`)."""
        if other.store.aux_names:
            raise ValueError("shared_params: a module with auxiliary states cannot be shared")
        if not (other.pool.binded and other.store.initialized):
            raise RuntimeError("shared_params: the other module must be bound and initialized")
        if [str(c) for c in other._contexts] != [str(c) for c in self._contexts]:
            raise ValueError(
                f"shared_params: the other module runs on {other._contexts}, this one on "
                f"{self._contexts}"
            )
        self.pool.borrow_parameters(other.store.params)

    def prepare(self, data_batch: Any) -> None:
        """Bind the batch's bucket ahead of its forward; the current bucket does not change.

        Under ``bucket_memory`` the current bucket stays bound, and binding waits for the
        forward when it would not fit beside the current bucket.
        """
        curr = self.pool.curr
        keep = () if curr is None or curr is self.pool.default else (curr.key,)
        self.pool.for_batch(data_batch, keep=keep, ahead=True)

    def watch_outputs(self, callback: Callable[[Any, Any], None]) -> None:
        """``callback(name, array_handle)`` for every node input and output of every
        forward from now on (MXNet's monitor): e.g. a calibration's range collector."""
        self.pool.watch_outputs(callback)

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
        if not self.pool.binded:
            raise RuntimeError("call bind() before init_params()")
        if self.store.initialized and not force_init:
            warnings.warn(
                "parameters already initialized and force_init=False: init_params ignored",
                stacklevel=2,
            )
            return
        self.store.initialize(
            initializer,
            arg_params,
            aux_params,
            allow_missing=allow_missing,
            allow_extra=allow_extra,
            attrs=self.pool.default_symbol.attr_dict(),
        )
        if self.optimization is not None:
            self.optimization.refresh_kvstore_weights(self.store)
        self.store.initialized = True

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
        if self.store.initialized and not force_init:
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

    def get_params(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Copies of the parameters on CPU: ``(arg_params, aux_params)``.

        With several devices, copies that differ (auxiliary states such as BatchNorm statistics)
        are averaged, as MXNet does. Identical copies (parameters under data parallelism) are
        returned as they are: averaging n equal float32 values is not exact when n is not a
        power of two, and a checkpoint must hold the very values training continues from.
        """
        if not self.store.initialized:
            raise RuntimeError("parameters are not initialized")
        return self.store.get()

    def zero_grads(self) -> None:
        """Set every parameter gradient to zero on every device.

        Needed when gradients accumulate over several batches (bound with grad_req 'add'):
        after each update the sums start again from zero. All buckets share these arrays.
        """
        self.store.zero_grads()

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
        """Create the optimizer, the kvstore (if any) and the updater: ``kvstore``,
        ``update_on_kvstore``, ``lr_mult`` and ``wd_mult`` as
        :func:`~mxtrain.engine.optimizer_setup.create_optimization` takes them;
        ``clip_global_norm`` as :class:`~mxtrain.engine.step.GradientClipper` applies it
        (:meth:`take_grad_norm` reads the mean norm)."""
        self._require(params=True)
        if self.optimization is not None and not force_init:
            self.logger.warning("optimizer already initialized, ignoring init_optimizer()")
            return
        if not self.pool.for_training:
            raise RuntimeError("the module is bound for inference: bind(for_training=True)")
        assert self.pool.default is not None
        previous = self.optimization.kvstore if self.optimization is not None else None

        def replacing(kv: Any) -> None:
            if previous is not None and previous is not kv:
                wait_before_freeing_kvstore()

        optimization = create_optimization(
            self.store,
            ndev=len(self._contexts),
            batch_size=self.pool.default.batch_size,
            symbol=self.pool.default_symbol,
            kvstore=kvstore,
            optimizer=optimizer,
            optimizer_params=optimizer_params,
            update_on_kvstore=update_on_kvstore,
            clips=clip_global_norm is not None,
            lr_mult=lr_mult,
            wd_mult=wd_mult,
            on_kvstore_ready=replacing,
        )
        self._clipper = None if clip_global_norm is None else GradientClipper(clip_global_norm)
        self.optimization = optimization

    def update_multipliers(self) -> dict[str, tuple[float, float]]:
        """``{parameter: (lr multiplier, wd multiplier)}`` as the optimizer applies them
        (MXNet's defaults included), for every trained parameter."""
        self._require(optimizer=True)
        assert self.optimization is not None
        return self.optimization.update_multipliers(self.store)

    def set_optimizer_states(self, arrays: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        """Restore what :meth:`get_optimizer_states` returned (after ``init_optimizer``);
        ``ValueError`` names what does not fit
        (:func:`~mxtrain.engine.optimizer_state.restore_optimizer_state`)."""
        self._require(optimizer=True)
        assert self.optimization is not None
        restore_optimizer_state(self.optimization, self.store, self._contexts, arrays, meta)

    def take_grad_norm(self) -> float | None:
        """The mean global gradient norm (``clip_global_norm``, before clipping) over the
        updates since the last call, or None when none was computed (synchronises)."""
        return None if self._clipper is None else self._clipper.take_norm()

    # -- checkpoints ------------------------------------------------------------------------

    def checkpoint_state(self) -> ModuleCheckpoint:
        """Everything a checkpoint holds of this module, as CPU arrays and JSON-able data:
        parameters, optimizer state (:meth:`get_optimizer_states`) and the carried recurrent
        states (:meth:`get_states`)."""
        arg, aux = self.get_params()
        optimization = self.optimization
        if optimization is None or optimization.updater is None:
            return ModuleCheckpoint(
                arg,
                aux,
                optimizer_on_servers=optimization is not None,
                recurrent_states=self.get_states(),
            )
        arrays, meta = self.get_optimizer_states()
        return ModuleCheckpoint(arg, aux, arrays, meta, recurrent_states=self.get_states())

    def get_optimizer_states(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The optimizer's state: ``(arrays, meta)``, NDArrays on CPU and a JSON-able dict
        (:func:`~mxtrain.engine.optimizer_state.capture_optimizer_state`); neither format can
        carry code, unlike MXNet's pickled ``.states`` file."""
        self._require(optimizer=True)
        assert self.optimization is not None
        return capture_optimizer_state(self.optimization, self.store, len(self._contexts))

    # -- computation ------------------------------------------------------------------------

    def forward(self, data_batch: Any, is_train: bool | None = None) -> None:
        """Run the batch's bucket forward (binding it on first sight)."""
        if not self.store.initialized:
            raise RuntimeError("call init_params() or set_params() first")
        bucket = self.pool.for_batch(data_batch)
        assert bucket is not None
        self.pool.curr = bucket
        train = self.pool.for_training if is_train is None else is_train
        self.step.forward(bucket, data_batch, train)

    def backward(self, out_grads: Any = None) -> None:
        """Backward through the current bucket; ``out_grads`` only for non-loss outputs."""
        bucket = self._require()
        if not self.pool.for_training:
            raise RuntimeError("the module is bound for inference: bind(for_training=True)")
        self.step.backward(bucket, out_grads)

    def forward_backward(self, data_batch: Any) -> None:
        """``forward(data_batch, is_train=True)`` then ``backward()``."""
        self.forward(data_batch, is_train=True)
        self.backward()

    def update(self) -> None:
        """Apply the optimizer to the gradients of the last backward."""
        bucket = self._require(optimizer=True)
        assert self.optimization is not None
        self.step.update(bucket, self.optimization, self._clipper)

    def progress_marker(self) -> Any:
        """A one-element array summed from the last backward's smallest gradient, or None
        without gradients. Waiting for it waits for that batch's backward (and the update
        queued before it), not for batches queued later: the training loop uses it to keep
        Python at most a few batches ahead of the devices."""
        return self.step.progress_marker(self._require())

    def get_outputs(self, merge_multi_context: bool = True) -> list[Any]:
        """Outputs of the last forward: merged over devices, or ``[output][device]``."""
        return self.step.outputs(self._require(), merge_multi_context)

    def get_input_grads(self, merge_multi_context: bool = True) -> list[Any]:
        """Gradients with respect to the data inputs (needs ``inputs_need_grad``), as MXNet's
        module gives them."""
        bucket = self._require()
        if not self.pool.inputs_need_grad:
            raise RuntimeError("bind with inputs_need_grad=True to get input gradients")
        return self.step.input_grads(bucket, merge_multi_context)

    def update_metric(
        self, eval_metric: Any, labels: Sequence[Any], pre_sliced: bool = False
    ) -> None:
        """Feed the last outputs and ``labels`` to the metric, one call per device.

        Uses ``eval_metric.update_dict(labels, preds)`` when the metric has it (MXNet metrics),
        else ``eval_metric.update(labels, preds)`` with lists of NDArrays.
        """
        self.step.update_metric(self._require(), eval_metric, labels, pre_sliced)

    # -- recurrent state carried across batches (``states``) ---------------------------------

    def reset_states(self) -> None:
        """The next forward starts from zero states."""
        self.carried.reset()

    def get_states(self) -> dict[str, Any]:
        """CPU copies of the kept states, ``NAME@DEVICE`` -> array (empty after a reset)."""
        return self.carried.get()

    def set_states(self, arrays: Mapping[str, Any]) -> None:
        """Put back what :meth:`get_states` returned (same states and devices), or raise
        ``ValueError`` naming what does not fit."""
        self.carried.set(arrays)

    @contextmanager
    def separate_states(self) -> Iterator[None]:
        """Within the block, states start from zeros; the kept ones come back after it (an
        evaluation in the middle of training must not disturb the training streams)."""
        with self.carried.separate():
            yield
