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

``--format onnx`` writes ``model-bucketK.onnx`` instead, through MXNet's own exporter
(``mx.onnx.export_model``, which needs the ``onnx`` package): static shapes (the batch axis
is ``batch_size``), fused RNN layers switched to ``state_outputs`` (the only form it
converts), the file's opset set to 13, the newest its translations write (it would declare
the installed onnx package's newest, whose ``Split`` differs). Operators it cannot convert
are named before anything is written.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mxtrain.build import build_sym_gen
from mxtrain.config import load_config
from mxtrain.data.base import data_info_from
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
) -> list[ExportedGraph]:
    """Export the checkpoint ``ref`` (RUN[:SEL]) into ``out_dir`` (see the module docstring).

    ``buckets``: the bucket keys (sequence lengths) to export; ``all_buckets``: every
    training bucket; neither: the default (largest) bucket. ``batch_size`` is the batch
    axis of the recorded shapes (any batch size runs: MXNet infers shapes at bind).

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
    if all_buckets:
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
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

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
        _check_sizes(key, batch_size, graph_problem(graph, shapes, activations_in_memory=False))
        states = getattr(sym_gen, "states", None) or {}
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
            if n in shapes or n in states
        }
        prefix = f"model-bucket{_key_text(key)}"
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
        if fmt == "onnx":
            plain = {name.partition(":")[2]: value for name, value in params.items()}
            onnx_outputs = write_onnx(graph, plain, inputs, out_dir / f"{prefix}.onnx")
        else:
            graph.save(str(out_dir / f"{prefix}-symbol.json"), remove_amp_cast=True)
            mx.nd.save(str(out_dir / f"{prefix}-0000.params"), params)
        outputs = {n: list(s or ()) for n, s in zip(graph.list_outputs(), out_shapes, strict=True)}
        exported.append(ExportedGraph(key, prefix, inputs, outputs, dropped, onnx_outputs))
    for extra in (run.vocab_file, run.path / "label_vocab.json"):
        if extra.is_file():
            shutil.copy2(extra, out_dir / extra.name)
    manifest = {
        "run": str(run.path),
        "checkpoint": chosen.describe(),
        "epoch": chosen.epoch,
        "format": fmt,
        "graphs": [g.__dict__ | {"bucket_key": g.bucket_key} for g in exported],
    }
    (out_dir / "export.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return exported


#: the ONNX opset MXNet 1.9.1's converters write (their newest translations): the file
#: declares it, not the installed onnx package's newest opset, whose Split and friends differ
ONNX_OPSET = 13


def _onnx_ready(graph: Any) -> Any:
    """``graph`` as MXNet's ONNX exporter takes it: fused RNN layers with state outputs (it
    converts no other form; the extra outputs are not graph outputs)."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    tree = json.loads(graph.tojson())
    for node in tree["nodes"]:
        if node["op"] == "RNN":
            node.setdefault("attrs", {})["state_outputs"] = "True"
    return mx.sym.load_json(json.dumps(tree))


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
    graph = _onnx_ready(graph)
    missing = unsupported_operators(graph)
    if missing:
        raise ConfigError(
            f"MXNet's ONNX exporter cannot convert the operator(s) {', '.join(missing)} of "
            "this model.",
            hint="Export it as MXNet files (the default --format mxnet), or change the model "
            "to use supported operators.",
        )
    names = list(inputs)
    export_model(graph, params, [tuple(inputs[n]) for n in names], [np.float32] * len(names),
                 str(path))  # fmt: skip
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
