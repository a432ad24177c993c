"""Gluon models: a model plugin may return a ``HybridBlock`` instead of a ``sym_gen``.

mxtrain traces the block to a symbol for each bucket key (its ``hybrid_forward`` called with
``F = mx.sym``, on a ``data`` variable; a ``hybrid_forward`` with a parameter named
``seq_len`` or ``bucket_key`` after its input also gets the bucket key), then adds the loss
head the data's task needs to the block's output (its first one, if it returns several):

* ``lm`` and ``tag`` (per-token outputs ``(batch, length, classes)``): a softmax over the last
  axis, padding labels ignored, named ``softmax`` as the built-in models' (so every metric
  and ``predict`` read it the same way);
* ``classify`` (``(batch, classes)``): a softmax, named ``softmax``;
* ``regress``: a linear regression output reshaped to the label's shape, NaN targets (padding
  rows) passing no gradient, named ``regression``.

From there it is an ordinary mxtrain model: the symbol's variables are the block's parameters
under their Gluon names (``dense0_weight``...), which ``lr_mult``, ``fixed_params``,
``initializer.overrides`` and ``initializer.from`` match; a parameter's own initializer
(``weight_initializer=...``) travels with its variable and is used unless an
``initializer.overrides`` pattern matches it. The block is built under a fresh name scope
each time, so its parameter names are the same in ``fit``, ``resume``, ``score`` and
``predict`` whatever else the process built. A block starts each batch from its own initial
state (no state carried between ``bptt_stream`` batches).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import mxnet as mx

from mxtrain.data.base import TASK_LM, TASK_TAG, DataInfo
from mxtrain.errors import ConfigError, MxtrainError
from mxtrain.models.classifiers import regression_output
from mxtrain.models.gluon_options import GluonOptions

#: names of a ``hybrid_forward`` parameter that receives the bucket key
KEY_PARAMETERS = ("seq_len", "bucket_key")

TRACE_HINT = (
    "mxtrain traces a HybridBlock's hybrid_forward with symbols (F = mx.sym): use F's "
    "operators only, no NDArray methods (.asnumpy(), .shape), no Python branches on values; "
    "block.hybridize() in Gluon fails on the same code."
)


def is_block(value: Any) -> bool:
    """Whether a model factory returned a Gluon block rather than a ``sym_gen``."""
    return isinstance(value, mx.gluon.Block)


def build_gluon(
    options: GluonOptions, data_info: DataInfo, make_block: Callable[..., Any]
) -> Callable[..., Any]:
    """The ``gluon`` model: ``make_block(**options.options)`` (the loaded ``options.block``),
    traced by :func:`block_sym_gen`."""
    block = make_block(**{k: _data_fact(v, data_info) for k, v in options.options.items()})
    if not is_block(block):
        raise ConfigError(
            f"model.block {options.block!r} returned {type(block).__name__}, not a Gluon "
            "HybridBlock.",
            hint="Name a HybridBlock class or a function that returns one (e.g. "
            "'gluoncv.model_zoo:get_model' with options {name: resnet18_v1, classes: 10}).",
        )
    return block_sym_gen(block, data_info, options.block, layout=options.layout)


#: option values that stand for a fact of the data (``options: {classes: $num_classes}``)
DATA_FACTS = {"$vocab_size": "vocab_size", "$num_classes": "num_classes"}


def _data_fact(value: Any, data_info: DataInfo) -> Any:
    if isinstance(value, str) and value in DATA_FACTS:
        fact = getattr(data_info, DATA_FACTS[value], None)
        if fact is None:
            raise ConfigError(
                f"model.options: {value} stands for the data's {DATA_FACTS[value]}, which "
                "its iterator does not report.",
                hint="Write the number instead.",
            )
        return int(fact)
    return value


def block_sym_gen(
    block: Any, data_info: DataInfo, model: str, layout: str = "NT"
) -> Callable[..., Any]:
    """``sym_gen(bucket_key) -> (symbol, (data,), (label,))`` of ``block`` with the loss head
    of ``data_info``'s task; ``model`` names the plugin in errors; ``layout`` ``TN``: a
    sequence block reads and returns time-major arrays."""
    if not isinstance(block, mx.gluon.HybridBlock):
        raise ConfigError(
            f"model {model!r} returned the Gluon block {type(block).__name__}, which is not a "
            "HybridBlock, so it cannot be traced to a symbol.",
            hint="Derive it from mx.gluon.HybridBlock and write hybrid_forward(self, F, x, ...) "
            "with F's operators.",
        )
    task = data_info.task or "classify"
    if task not in (TASK_LM, TASK_TAG, "classify", "regress"):
        raise ConfigError(
            f"model {model!r}: a Gluon block gets a loss head for language models, taggers, "
            f"classifiers and regressors; the data's task is {task!r}.",
            hint="Use a built-in model for this task (e.g. rnn_seq2seq), or a sym_gen plugin.",
        )
    passes_key = _takes_bucket_key(block)
    time_major = layout == "TN" and task in (TASK_LM, TASK_TAG)
    data_name = str(getattr(data_info, "data_name", "data"))
    label_name = str(getattr(data_info, "label_name", "softmax_label"))

    def sym_gen(bucket_key: Any) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
        data = mx.sym.var(data_name)
        x = mx.sym.swapaxes(data, dim1=0, dim2=1) if time_major else data
        out = _trace(block, model, (x, bucket_key) if passes_key else (x,))
        if time_major:
            out = mx.sym.swapaxes(out, dim1=0, dim2=1)
        label = mx.sym.var(label_name)
        return _loss_head(out, label, data_info, task), (data_name,), (label_name,)

    return sym_gen


def _takes_bucket_key(block: Any) -> bool:
    try:
        parameters = list(inspect.signature(block.hybrid_forward).parameters)
    except (TypeError, ValueError):
        return False
    # (F, x, <key>, ...): the bound method's parameters, self left out
    return len(parameters) > 2 and parameters[2] in KEY_PARAMETERS


def _trace(block: Any, model: str, inputs: tuple[Any, ...]) -> Any:
    try:
        out = block(*inputs)
    except MxtrainError:
        raise
    except Exception as exc:
        reason = " ".join(str(exc).split())[:300]
        raise ConfigError(
            f"model {model!r}: the Gluon block {type(block).__name__} cannot be traced to a "
            f"symbol: {type(exc).__name__}: {reason}",
            hint=TRACE_HINT,
        ) from None
    if isinstance(out, list | tuple):
        out = out[0] if out else None
    if not isinstance(out, mx.sym.Symbol):
        raise ConfigError(
            f"model {model!r}: the Gluon block {type(block).__name__} returned "
            f"{type(out).__name__} for a symbol input, not a symbol.",
            hint=TRACE_HINT,
        )
    return out


def _loss_head(out: Any, label: Any, data_info: DataInfo, task: str) -> Any:
    pad = data_info.pad_id
    ignore: dict[str, Any] = {} if pad is None else {"use_ignore": True, "ignore_label": pad}
    if task in (TASK_LM, TASK_TAG):
        classes = int(data_info.num_classes or 0)
        logits = mx.sym.reshape(out, shape=(-1, classes))
        return mx.sym.SoftmaxOutput(
            logits, mx.sym.reshape(label, shape=(-1,)), name="softmax", **ignore
        )
    if task == "classify":
        return mx.sym.SoftmaxOutput(out, label, name="softmax", **ignore)
    return regression_output(out, label, tuple(getattr(data_info, "label_shape", ()) or ()))
