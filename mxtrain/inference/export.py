"""``mxtrain export``: a run's inference graph and weights as MXNet or ONNX files.

The model is rebuilt from the run folder alone (config.yaml, model_inputs.json, a
checkpoint): no data is read. The training loss head is removed: a ``SoftmaxOutput`` becomes
the ``softmax`` it computes forward (``LinearRegressionOutput`` the identity,
``LogisticRegressionOutput`` a sigmoid), and every output that still needs a label (a
``MakeLoss`` of -log p(label), say) is dropped. What is left reads only the data inputs (and
a stateful model's begin states). Each bucket (sequence length) is unrolled separately when
the model needs it; ``export.json`` lists every exported graph with its input and output
names and shapes.

Files, per bucket key K: ``model-bucketK-symbol.json`` and ``model-bucketK-0000.params``
(``arg:``/``aux:`` names): ``mx.mod.Module.load(DIR/model-bucketK, 0, data_names=...,
label_names=None)`` and ``gluon.SymbolBlock.imports(symbol, input names, params)`` load them.
The run's vocabularies are copied beside them.

A sequence-to-sequence run (data task ``seq2seq``) exports, per source length S (``--bucket``
values, every training bucket's S with ``--all-buckets``, else the largest), its encoder
graph ``encoder-sourceS`` (input ``source``; outputs the static arrays, then the initial
states) and its decoder-step graph ``decoder_step-sourceS`` (inputs ``prev_token``, ``step``,
the static arrays and the states; outputs ``log_probs``, then the new states), built for
``--max-steps`` decoder positions (default: the longest output ``mxtrain predict`` allows, by
default, a source of S tokens) instead of the teacher-forced training graph, which
needs the target as an input. export.json gives each graph's ``role``, ``source_length``,
``max_steps`` and ``output_roles`` (``onnx_output_roles`` for ONNX files, whose outputs the
exporter orders its own way) and a ``decoding`` entry: the special ids and how to feed the
graphs step by step. target_vocab.json is copied too.

``--format onnx`` writes ``model-bucketK.onnx`` instead, through MXNet's own exporter
(``mx.onnx.export_model``, which needs the ``onnx`` package): static shapes (the batch axis
is ``batch_size``), fused RNN layers switched to ``state_outputs`` (the only form it
converts), reshapes with codes (-2, -3, -4) and broadcast_to with 0 (keep an axis) written
with the static shapes they give (the exporter mistranslates or refuses them), the file's
opset set to 13, the newest its translations write (it would declare the installed onnx
package's newest, whose ``Split`` and ``ReduceMean`` differ). Operators it cannot convert
are named before anything is written, and any other conversion failure is a ConfigError;
files are written into a staging folder, so a failed export leaves nothing under ``-o``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mxtrain.build import build_sym_gen
from mxtrain.config import load_config
from mxtrain.data.base import TASK_SEQ2SEQ, data_info_from
from mxtrain.data.parallel_text import TARGET_VOCAB_FILE
from mxtrain.decoding.search import (
    DEFAULT_MAX_OUTPUT_ADD,
    DEFAULT_MAX_OUTPUT_RATIO,
    max_output_lengths,
)
from mxtrain.decoding.seq2seq import check_decoder
from mxtrain.errors import ConfigError, InvalidValue, RunFolderError
from mxtrain.graph_sizes import graph_problem, input_problem
from mxtrain.mxnet_errors import mxnet_reason
from mxtrain.run.atomic import temporary_name
from mxtrain.run.bucket_keys import as_tuples, key_problem, read_model_inputs, trained_keys
from mxtrain.run.choose import (
    merge_selectors,
    open_run_folder,
    parse_checkpoint_ref,
    resolve_checkpoint,
)
from mxtrain.run.params import ParamsMismatchError, param_problems, params_mismatch_error
from mxtrain.run.plugin_files import kept_plugins
from mxtrain.user_files import os_error_problem, require_usable_path

log = logging.getLogger("mxtrain")

#: what model_inputs.json must hold for export to rebuild the model

#: loss-head operators and the forward computation that replaces them
_HEADS = ("SoftmaxOutput", "LinearRegressionOutput", "LogisticRegressionOutput",
          "MAERegressionOutput")  # fmt: skip


@dataclass
class ExportedGraph:
    """One exported bucket."""

    bucket_key: Any
    prefix: str  # DIR/<prefix>-symbol.json, DIR/<prefix>-0000.params
    inputs: dict[str, list[int]]
    outputs: dict[str, list[int]]
    dropped: list[str] = field(default_factory=list)  # training-only outputs left out
    onnx_outputs: list[str] | None = None  # --format onnx: the .onnx file's output names
    #: more entries of its export.json record (a seq2seq graph's role, max_steps, ...)
    details: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """Its entry in export.json's ``graphs``."""
        fields = {k: v for k, v in self.__dict__.items() if k != "details"}
        return fields | self.details


def _head_op(out: Any) -> tuple[str, dict[str, str]]:
    node = json.loads(out.tojson())["nodes"][-1]
    return node["op"], dict(node.get("attrs") or {})


def _forward_of(out: Any) -> Any:
    """The inference computation of one output of the training graph."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    op, attrs = _head_op(out)
    if op not in _HEADS:
        return out
    x = out.get_children()[0]
    name = out.name
    if op == "SoftmaxOutput":
        if attrs.get("multi_output", "False").lower() in ("true", "1"):
            return mx.sym.softmax(x, axis=1, name=name)
        if attrs.get("preserve_shape", "False").lower() in ("true", "1"):
            return mx.sym.softmax(x, axis=-1, name=name)
        flat = mx.sym.softmax(mx.sym.flatten(x), axis=-1)
        return mx.sym.reshape_like(flat, x, name=name)
    if op == "LogisticRegressionOutput":
        return mx.sym.sigmoid(x, name=name)
    return mx.sym.identity(x, name=name)


def inference_symbol(symbol: Any, label_names: list[str]) -> tuple[Any, list[str]]:
    """``symbol`` without its loss head; returns it and the names of the outputs dropped
    because they need a label."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    kept, dropped = [], []
    for i, name in enumerate(symbol.list_outputs()):
        forward = _forward_of(symbol[i])
        if set(label_names) & set(forward.list_arguments()):
            dropped.append(name)
        else:
            kept.append(forward)
    if not kept:
        raise ConfigError(
            "Every output of the model needs a label (a loss), so there is nothing to export.",
            hint="Export models whose outputs include a prediction (softmax, regression).",
        )
    return (kept[0] if len(kept) == 1 else mx.sym.Group(kept)), dropped


def _key_shapes(saved: dict[str, Any], key: Any, batch_size: int) -> dict[str, tuple[int, ...]]:
    """Data input shapes for bucket ``key``: the recorded default bucket's, with its
    sequence length replaced by ``key`` and the batch axis by ``batch_size``."""
    default = saved["default_bucket_key"]
    shapes = {}
    for name, shape in saved["provide_data"]:
        dims = [batch_size, *shape[1:]]
        if isinstance(default, int) and isinstance(key, int):
            dims = [dims[0], *(key if d == default else d for d in dims[1:])]
        shapes[name] = tuple(int(d) for d in dims)
    return shapes


def export_run(
    ref: str,
    out_dir: Path,
    *,
    buckets: list[Any] | None = None,
    all_buckets: bool = False,
    batch_size: int = 1,
    force: bool = False,
    fmt: str = "mxnet",
    max_steps: int | None = None,
) -> list[ExportedGraph]:
    """Export the checkpoint ``ref`` (RUN[:SEL]) into ``out_dir`` (see the module docstring).

    ``buckets``: the bucket keys (sequence lengths) to export; ``all_buckets``: every
    training bucket; neither: the default (largest) bucket. ``batch_size`` is the batch
    axis of the recorded shapes (any batch size runs: MXNet infers shapes at bind).
    A sequence-to-sequence run exports its encoder and decoder-step graphs instead (see
    :func:`export_decoder_graphs`): ``buckets`` are then source lengths and ``max_steps``
    the decoder positions its step graph is built for.

    The checkpoint is verified against the model built from config.yaml first, as score
    does; the files are written into a staging folder beside ``out_dir`` and moved in when
    all of them are complete, so a failed (or killed) export leaves nothing under ``out_dir``.
    """

    path, choice = parse_checkpoint_ref(ref)
    run = open_run_folder(path)
    saved = read_model_inputs(run)
    if saved is None:
        raise RunFolderError(
            f"The run folder {run.path} has no {run.model_inputs_file.name}: it was trained "
            "by an mxtrain older than export, which rebuilds the model from that file.",
            hint="Train the run again (or resume it: resume writes nothing new here) with "
            "this mxtrain.",
        )
    if not isinstance(saved.get("data_info"), dict):
        raise RunFolderError(
            f"The model description {run.model_inputs_file} has no data_info, which export "
            "rebuilds the model from.",
            hint="Restore it from a copy of the run folder; `mxtrain fit` writes it.",
        )
    with kept_plugins(run.path):
        config = load_config(run.config_file, base_dir=run.config_dir())
        data_info = data_info_from(saved)
        sym_gen = build_sym_gen(config.model, data_info, config.base_dir)
    chosen = resolve_checkpoint(run, config.checkpoint.prefix, merge_selectors(choice, None, ref))
    arg_params, aux_params = chosen.arrays()
    default = as_tuples(saved["default_bucket_key"])
    decoding = data_info.task == TASK_SEQ2SEQ
    if decoding:
        check_decoder(sym_gen, config.model.name)
        keys = source_lengths(saved, buckets, all_buckets)
    elif max_steps is not None:
        raise ConfigError(
            "--max-steps sizes the decoder-step graph of a sequence-to-sequence model; this "
            f"run's model {config.model.name!r} has none.",
            hint="Leave --max-steps out.",
        )
    elif all_buckets:
        keys = trained_keys(saved)
    else:
        keys = _requested_keys(buckets, default) if buckets else [default]
    _check_out_dir(out_dir, force)
    _verify_checkpoint(sym_gen, saved, default, (arg_params, aux_params), chosen, run)
    staging = temporary_name(Path(os.path.abspath(out_dir)))  # "-o ." has no name of its own
    shutil.rmtree(staging, ignore_errors=True)  # left by a killed export of this process id
    try:
        staging.mkdir(parents=True)
    except OSError as exc:  # a parent that is a file, a file system taking no folders (/proc)
        raise ConfigError(
            f"The export folder {out_dir} cannot be created (its staging folder {staging} "
            f"{os_error_problem(exc)[0]}).",
            hint="Choose an -o folder on a file system you can write to.",
        ) from None
    try:
        if decoding:
            arrays = (arg_params, aux_params)
            files = [GraphFiles("", length, batch_size, fmt, staging) for length in keys]
            exported = export_decoder_graphs(files, max_steps, sym_gen, arrays, chosen)
            manifest = decoding_manifest(sym_gen, data_info, fmt)
            _write_manifest(exported, run, chosen, fmt, staging, decoding=manifest)
        else:
            exported = _export_keys(
                keys, sym_gen, saved, batch_size, arg_params, aux_params, chosen, run, staging, fmt
            )
        _move_into(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return exported


def _requested_keys(buckets: list[Any], default: Any) -> list[Any]:
    """``--bucket`` values as bucket keys: sequence lengths, for a model keyed by them."""
    if not isinstance(default, int):
        raise ConfigError(
            f"--bucket takes sequence lengths, but this model's buckets are keyed by "
            f"{default!r} (a shape), which export takes from the run.",
            hint="Leave --bucket out (or give --all-buckets).",
        )
    for key in buckets:
        problem = key_problem(key)
        if problem is not None or not isinstance(key, int):
            raise ConfigError(
                f"--bucket {key!r}: {problem or 'a sequence length is an integer'}.",
                hint=f"Give the sequence length to unroll the model for, e.g. --bucket {default} "
                "(the run's largest training bucket).",
            )
    return list(buckets)


def source_lengths(saved: dict[str, Any], buckets: list[Any] | None, every: bool) -> list[int]:
    """The source lengths to export a seq2seq run's graphs for: ``buckets`` (``--bucket``),
    every training bucket's (``every``), or the default (largest) bucket's."""
    if buckets:
        return _requested_keys(buckets, 1)
    keys = trained_keys(saved) if every else [as_tuples(saved["default_bucket_key"])]
    return sorted({int(key[0]) for key in keys})


def default_max_steps(source_length: int) -> int:
    """The decoder positions a step graph for sources of ``source_length`` is built for
    without ``--max-steps``: the longest output ``mxtrain predict`` allows such a source
    by default (its --max-output-ratio and --max-output-add)."""
    limit = max_output_lengths([source_length], DEFAULT_MAX_OUTPUT_RATIO, DEFAULT_MAX_OUTPUT_ADD)
    return int(limit[0])


def export_decoder_graphs(
    files: list[GraphFiles],
    max_steps: int | None,
    sym_gen: Any,
    arrays: tuple[dict[str, Any], dict[str, Any]],
    chosen: Any,
) -> list[ExportedGraph]:
    """A seq2seq model's encoder and decoder-step graphs per source length (each of
    ``files``' keys), written as ``encoder-sourceS`` and ``decoder_step-sourceS``; the
    step graph (and a Transformer's encoder, which sizes its caches) built for
    ``max_steps`` decoder positions (default: :func:`default_max_steps`)."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    statics, states = list(sym_gen.static_names), list(sym_gen.state_names)
    exported = []
    for where in files:
        length, batch = where.key, where.batch_size
        steps = max_steps if max_steps is not None else default_max_steps(length)
        carried = sym_gen.input_shapes(length, batch, steps)
        _check_sizes(length, batch, input_problem(carried))  # before building the graphs
        common = {"source_length": length, "max_steps": steps}
        with mx.name.NameManager():  # auto-named nodes numbered from 0 in each graph
            encoder = sym_gen.encoder(length, steps)
        shapes: dict[str, tuple[int, ...]] = {"source": (batch, length)}
        target = replace(where, prefix=f"encoder-source{length}")
        exported.append(target.write(encoder, shapes, set(shapes), arrays, chosen))
        exported[-1].details = {"role": "encoder", **common, "output_roles": statics + states}
        with mx.name.NameManager():
            step = sym_gen.decoder_step(length, steps)
        target = replace(where, prefix=f"decoder_step-source{length}")
        exported.append(target.write(step, carried, set(carried), arrays, chosen))
        roles = ["log_probs", *states]
        exported[-1].details = {"role": "decoder_step", **common, "output_roles": roles}
    for graph in exported:
        if graph.onnx_outputs is not None:  # the exporter names outputs after their nodes
            names = [name.removesuffix("_output") for name in graph.outputs]
            role_of = dict(zip(names, graph.details["output_roles"], strict=True))
            graph.details["onnx_output_roles"] = [role_of[n] for n in graph.onnx_outputs]
    return exported


def decoding_manifest(sym_gen: Any, info: Any, fmt: str) -> dict[str, Any]:
    """export.json's ``decoding`` entry: the special ids, the carried arrays and how to feed
    the graphs, step by step."""
    outputs = "onnx_output_roles" if fmt == "onnx" else "output_roles"
    return {
        "pad_id": info.pad_id,
        "bos_id": info.bos_id,
        "eos_id": info.eos_id,
        "tokens": info.tokens,
        "source_vocab": "vocab.json",
        "target_vocab": TARGET_VOCAB_FILE,
        "static_names": list(sym_gen.static_names),
        "state_names": list(sym_gen.state_names),
        "steps": [
            "source: (N, source_length) ids of the source tokens in source_vocab, padded with "
            "pad_id after them (no bos, no eos); a longer source needs a graph exported for its "
            "length (--bucket).",
            f"Run the encoder once per batch; its outputs ({outputs}) are the static arrays, "
            "then the initial states.",
            "For each position t = 0, 1, ... below max_steps, run the decoder_step graph on: "
            "prev_token (N,) = bos_id at t = 0, then the token chosen at t - 1; step (1,) = t; "
            "every static array as the encoder gave it; every state as the encoder gave it "
            "at t = 0, then as the previous step output it.",
            "log_probs (N, V) is the log-softmax over target_vocab; a row ends with eos_id. "
            "mxtrain predict never picks pad_id or bos_id and stops a source of L tokens after "
            f"ceil({DEFAULT_MAX_OUTPUT_RATIO:g} * L) + {DEFAULT_MAX_OUTPUT_ADD} tokens.",
            "Beam search: reorder every state along axis 0 (take) with the rows kept; batch "
            "is on axis 0 of every array.",
        ],
    }


def _verify_checkpoint(
    sym_gen: Any,
    saved: dict[str, Any],
    default: Any,
    arrays: tuple[dict[str, Any], dict[str, Any]],
    chosen: Any,
    run: Any,
) -> None:
    """The checkpoint's arrays against the model config.yaml builds, checked as score checks
    them (:func:`mxtrain.run.params.param_problems`): a config.yaml edited after training
    builds a model the exported weights would not load into."""
    symbol, data_names, label_names = _symbol_for(sym_gen, default, run.model_inputs_file)
    recorded = [*saved["provide_data"], *(saved.get("provide_label") or [])]
    inputs = {str(name): tuple(shape) for name, shape in recorded}
    arguments = symbol.list_arguments()
    try:
        arg_shapes, _, aux_shapes = symbol.infer_shape_partial(
            **{n: s for n, s in inputs.items() if n in arguments}
        )
    except Exception as exc:  # MXNet raises RuntimeError, and a bare Exception for sizes
        raise ParamsMismatchError(
            f"The model built from {run.config_file} does not take the inputs recorded in "
            f"{run.model_inputs_file} ({mxnet_reason(exc)}).",
            hint="config.yaml or model_inputs.json was changed after training; use the run "
            "folder exactly as `mxtrain fit` wrote it.",
            params_file=chosen.params_file,
            problems=[],
        ) from None
    states = getattr(sym_gen, "states", None) or {}
    not_params = {*inputs, *data_names, *(label_names or ()), *states}

    def known(shapes: Any, names: list[str]) -> dict[str, tuple[int, ...] | None]:
        pairs = zip(names, shapes or [None] * len(names), strict=True)
        return {n: tuple(s) if s and 0 not in s else None for n, s in pairs if n not in not_params}

    model = (known(arg_shapes, arguments), known(aux_shapes, symbol.list_auxiliary_states()))
    problems = param_problems(model, arrays, source="the checkpoint")
    if problems:
        raise params_mismatch_error(chosen.params_file, run.config_file, problems, ())


def _symbol_for(sym_gen: Any, key: Any, model_inputs_file: Path) -> tuple[Any, Any, Any]:
    """``sym_gen(key)``; a model that refuses a key of the run folder names the file."""
    try:
        return sym_gen(key)
    except InvalidValue as exc:
        raise RunFolderError(
            f"{model_inputs_file}: the model refuses the bucket key {key!r}: {exc.problem}.",
            hint="The file was changed after training; restore it or train the run again.",
        ) from None


def _move_into(staging: Path, out_dir: Path) -> None:
    """The complete export from ``staging`` into ``out_dir``: one rename for a new folder;
    into an existing one (empty, or --force), file by file, replacing those of the same
    names."""
    if not out_dir.exists():
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, out_dir)
        return
    for entry in sorted(staging.iterdir()):
        os.replace(entry, out_dir / entry.name)


def _export_keys(
    keys: list[Any],
    sym_gen: Any,
    saved: dict[str, Any],
    batch_size: int,
    arg_params: dict[str, Any],
    aux_params: dict[str, Any],
    chosen: Any,
    run: Any,
    out_dir: Path,
    fmt: str,
) -> list[ExportedGraph]:
    exported = []
    for key in keys:
        shapes = _key_shapes(saved, key, batch_size)
        _check_sizes(key, batch_size, input_problem(shapes))  # before unrolling the graph
        try:
            symbol, _, label_names = sym_gen(key)
        except InvalidValue as exc:  # a plugin model that refuses some lengths
            raise ConfigError(
                f"The model cannot be unrolled for bucket {key!r}: {exc.problem}.",
                hint="Export the buckets it takes (--bucket, or --all-buckets for the run's).",
            ) from None
        graph, dropped = inference_symbol(symbol, list(label_names))
        states = getattr(sym_gen, "states", None) or {}
        written = GraphFiles(f"model-bucket{_key_text(key)}", key, batch_size, fmt, out_dir)
        exported.append(
            written.write(graph, shapes, {*shapes, *states}, (arg_params, aux_params), chosen)
        )
        exported[-1].dropped = dropped
    _write_manifest(exported, run, chosen, fmt, out_dir)
    return exported


@dataclass
class GraphFiles:
    """Where and how one graph is written: ``DIR/<prefix>-symbol.json`` and
    ``-0000.params`` (mxnet) or ``DIR/<prefix>.onnx``, its shapes with ``batch_size`` rows."""

    prefix: str
    key: Any  # the bucket key, named in errors
    batch_size: int
    fmt: str
    out_dir: Path

    def write(
        self,
        graph: Any,
        shapes: dict[str, tuple[int, ...]],
        input_names: set[str],
        arrays: tuple[dict[str, Any], dict[str, Any]],
        chosen: Any,
    ) -> ExportedGraph:
        """Write ``graph`` fed ``shapes``, its inputs those of ``input_names`` it has (the
        other arguments are parameters taken from the checkpoint's ``arrays``)."""
        # deferred: MXNet reads its thread settings when it loads (devices.configure_threads)
        import mxnet as mx

        key, batch_size = self.key, self.batch_size
        _check_sizes(key, batch_size, graph_problem(graph, shapes, activations_in_memory=False))
        try:
            arg_shapes, out_shapes, _ = graph.infer_shape_partial(**shapes)
        except Exception as exc:  # MXNet: a bare Exception for arrays over 2**31 elements
            raise ConfigError(
                f"The graph of bucket {key!r} with --batch-size {batch_size} cannot be built: "
                f"{mxnet_reason(exc)}.",
                hint="Give a smaller --batch-size (the exported graph takes any batch size "
                "when it is bound) or a shorter --bucket.",
            ) from None
        inputs = {
            n: list(s)
            for n, s in zip(graph.list_arguments(), arg_shapes, strict=True)
            if n in input_names
        }
        arg_params, aux_params = arrays
        needed = set(graph.list_arguments()) - set(inputs)
        missing = sorted(needed - set(arg_params))
        if missing:
            raise RunFolderError(
                f"The checkpoint {chosen.params_file} lacks {', '.join(missing)}, which the "
                f"model of bucket {key} needs.",
                hint="Export a checkpoint of this run as it was trained.",
            )
        params = {f"arg:{n}": arg_params[n] for n in sorted(needed)}
        params.update({f"aux:{n}": v for n, v in aux_params.items()
                       if n in graph.list_auxiliary_states()})  # fmt: skip
        onnx_outputs = None
        if self.fmt == "onnx":
            plain = {name.partition(":")[2]: value for name, value in params.items()}
            onnx_outputs = write_onnx(graph, plain, inputs, self.out_dir / f"{self.prefix}.onnx")
        else:
            graph.save(str(self.out_dir / f"{self.prefix}-symbol.json"), remove_amp_cast=True)
            mx.nd.save(str(self.out_dir / f"{self.prefix}-0000.params"), params)
        outputs = {n: list(s or ()) for n, s in zip(graph.list_outputs(), out_shapes, strict=True)}
        return ExportedGraph(key, self.prefix, inputs, outputs, onnx_outputs=onnx_outputs)


def _write_manifest(
    exported: list[ExportedGraph],
    run: Any,
    chosen: Any,
    fmt: str,
    out_dir: Path,
    **extra: Any,
) -> None:
    """export.json (every graph and ``extra`` top-level entries) and the run's vocabularies
    copied beside it."""
    for vocab in (run.vocab_file, run.path / "label_vocab.json", run.path / TARGET_VOCAB_FILE):
        if vocab.is_file():
            shutil.copy2(vocab, out_dir / vocab.name)
    manifest = {
        "run": str(run.path),
        "checkpoint": chosen.describe(),
        "epoch": chosen.epoch,
        "format": fmt,
        "graphs": [g.record() for g in exported],
        **extra,
    }
    (out_dir / "export.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


#: the ONNX opset MXNet 1.9.1's converters write (their newest translations): the file
#: declares it, not the installed onnx package's newest opset, whose Split and friends differ
ONNX_OPSET = 13


def _needs_static_shape(node: dict[str, Any]) -> bool:
    """Whether MXNet's ONNX exporter mistranslates ``node``'s ``shape`` unless it is the
    static one: reshape codes -2 (copy the rest), -3 (merge two axes) and -4 (split one),
    converted only in a few fixed patterns, and broadcast_to's 0 (keep this axis), which it
    writes as a literal 0."""
    shape = node.get("attrs", {}).get("shape", "")
    dims = [d.strip() for d in shape.strip("()[]").split(",") if d.strip()]
    if node["op"] == "Reshape":
        return any(d in ("-2", "-3", "-4") for d in dims)
    return node["op"] == "broadcast_to" and "0" in dims


def _onnx_ready(graph: Any, inputs: dict[str, list[int]] | None = None) -> Any:
    """``graph`` as MXNet's ONNX exporter takes it: fused RNN layers with state outputs (it
    converts no other form; the extra outputs are not graph outputs) and, given the
    ``inputs``' shapes, the shapes it mistranslates (:func:`_needs_static_shape`) written as
    the static shapes they give (an ONNX export fixes every shape anyway)."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    tree = json.loads(graph.tojson())
    static: dict[str, Any] = {}
    if inputs is not None:
        internals = graph.get_internals()
        _, shapes, _ = internals.infer_shape(**{n: tuple(s) for n, s in inputs.items()})
        static = dict(zip(internals.list_outputs(), shapes, strict=True))
    for node in tree["nodes"]:
        attrs = node.setdefault("attrs", {})
        if node["op"] == "RNN":
            attrs["state_outputs"] = "True"
        output = f"{node['name']}_output"
        if output in static and _needs_static_shape(node):
            attrs["shape"] = str(tuple(static[output]))
            if node["op"] == "Reshape":
                attrs["reverse"] = "False"
    return mx.sym.load_json(json.dumps(tree))


@contextlib.contextmanager
def _graph_checked_at_file_opset(onnx: Any) -> Iterator[None]:
    """MXNet's exporter checks the graph it builds against the installed onnx package's
    newest opset, where ReduceMean (LayerNorm's translation) takes its axes as an input, not
    as the attribute the opset-13 translations write; the file declares opset 13 (and is
    checked whole at it afterwards), so the exporter's own check is made at that opset."""
    check_graph = onnx.checker.check_graph

    def at_file_opset(graph: Any, context: Any = None) -> Any:
        context = onnx.checker.C.CheckerContext()
        context.ir_version = onnx.IR_VERSION
        context.opset_imports = {"": ONNX_OPSET}
        return check_graph(graph, context)

    onnx.checker.check_graph = at_file_opset
    try:
        yield
    finally:
        onnx.checker.check_graph = check_graph


def unsupported_operators(graph: Any) -> list[str]:
    """The operators of ``graph`` MXNet's ONNX exporter cannot convert."""
    # deferred: MXNet's ONNX exporter loads onnx (the [onnx] extra)
    from mxnet.onnx.mx2onnx._export_model import get_operator_support

    supported = set(get_operator_support(ONNX_OPSET)) | {"null"}
    used = {node["op"] for node in json.loads(graph.tojson())["nodes"]}
    return sorted(used - supported)


def write_onnx(
    graph: Any, params: dict[str, Any], inputs: dict[str, list[int]], path: Path
) -> list[str]:
    """``graph`` with ``params`` (no arg:/aux: prefixes) as an ONNX model at ``path``;
    returns the ONNX model's output names (MXNet's exporter names them after their nodes)."""
    try:
        import onnx  # optional dependency: onnx (the [onnx] extra)
        from mxnet.onnx import export_model  # optional dependency: onnx (the [onnx] extra)
    except ImportError:
        raise ConfigError(
            "ONNX export needs the onnx package, which is not installed.",
            hint="Install it with: pip install -e '.[onnx]' in the mxtrain checkout.",
        ) from None
    graph = _onnx_ready(graph, inputs)
    missing = unsupported_operators(graph)
    if missing:
        raise ConfigError(
            f"MXNet's ONNX exporter cannot convert the operator(s) {', '.join(missing)} of "
            "this model.",
            hint="Export it as MXNet files (the default --format mxnet), or change the model "
            "to use supported operators.",
        )
    names = [n for n in graph.list_arguments() if n in inputs]  # the order it takes shapes in
    # the exporter prints some nodes' names (print), which would mix into `--json` output
    with _graph_checked_at_file_opset(onnx), contextlib.redirect_stdout(io.StringIO()):
        try:
            export_model(graph, params, [tuple(inputs[n]) for n in names],
                         [np.float32] * len(names), str(path))  # fmt: skip
        except (AttributeError, NotImplementedError, ValueError) as exc:  # what it raises
            reason = " ".join(str(part) for part in exc.args)
            raise ConfigError(
                f"MXNet's ONNX exporter cannot convert the graph {path.stem} of this model: "
                f"{reason}.",
                hint="Export it as MXNet files (the default --format mxnet).",
            ) from None
    model = onnx.load(str(path))
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = ONNX_OPSET
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return [output.name for output in model.graph.output]


def _check_sizes(key: Any, batch_size: int, problem: Any) -> None:
    """A ConfigError naming the arguments when ``problem`` (a graph_sizes.SizeProblem) is."""
    if problem is not None:
        raise ConfigError(
            f"--bucket {_key_text(key)} --batch-size {batch_size}: {problem.describe()}.",
            hint="Export a shorter bucket or a smaller --batch-size.",
        )


def _key_text(key: Any) -> str:
    return "x".join(str(k) for k in key) if isinstance(key, tuple) else str(key)


def _check_out_dir(out_dir: Path, force: bool) -> None:
    require_usable_path(out_dir, "export folder", error=ConfigError, hint="Choose another -o.")
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"The export folder {out_dir} is a file.", hint="Choose another -o.")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ConfigError(
            f"The export folder {out_dir} is not empty; mxtrain export does not overwrite files.",
            hint="Pass --force to write into it anyway, or choose an empty or new folder.",
        )
