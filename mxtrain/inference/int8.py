"""``--int8``: predict and score with a model's heavy operators in int8 (CPU, oneDNN).

Which operators: :mod:`mxtrain.engine.quantization` (LSTM layers and FullyConnected layers;
GRU and vanilla RNN layers, embeddings and the softmax stay fp32). Before the first int8 run
of a checkpoint, the fp32 model reads a sample of the training data (``calibration_batches``
batches spread evenly over one pass of ``data.train``, or of another file read the same
way) and records the range of each quantized operator's input. The ranges are kept in
``RUN/int8/<checkpoint>.json`` with the checkpoint's SHA-256, the data and the batch count,
and reused while those agree; a run folder that cannot be written is only warned about
(calibration then runs again next time).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxtrain.errors import ConfigError
from mxtrain.run.atomic import atomic_write_text
from mxtrain.run.checkpoint import file_digest
from mxtrain.run.choose import ChosenCheckpoint
from mxtrain.run.folder import RunFolder

log = logging.getLogger("mxtrain")

#: batches of training data the ranges are measured on unless the command line says otherwise
DEFAULT_CALIBRATION_BATCHES = 20
_FORMAT = 1  # the calibration file's layout version


@dataclass(frozen=True)
class Int8Options:
    """What ``--int8`` was given with: the calibration sample's size and, when not the
    training data, the file it is read from (with the training data's iterator options)."""

    calibration_batches: int = DEFAULT_CALIBRATION_BATCHES
    calibration_data: Path | None = None

    def __post_init__(self) -> None:
        if self.calibration_batches < 1:
            raise ConfigError(
                f"--calibration-batches must be a positive integer, got "
                f"{self.calibration_batches}.",
                hint=f"Give e.g. --calibration-batches {DEFAULT_CALIBRATION_BATCHES}.",
            )


@dataclass(frozen=True)
class Int8Report:
    """What ran in int8 and how its ranges were obtained (logged; in score's report)."""

    operators: list[tuple[str, str]]  # (fp32 operator type, node name)
    calibration_file: Path
    calibration_data: str
    batches: int
    reused: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "operators": [f"{kind} {name}" for kind, name in self.operators],
            "calibration_file": str(self.calibration_file),
            "calibration_data": self.calibration_data,
            "calibration_batches": self.batches,
            "calibration_reused": self.reused,
        }


def check_int8_devices(contexts: list[Any]) -> None:
    """A ConfigError unless every device is a CPU and MXNet has oneDNN."""
    from mxtrain.engine.quantization import int8_available  # deferred: it loads MXNet

    gpus = [str(c) for c in contexts if not str(c).startswith("cpu")]
    if gpus:
        raise ConfigError(
            f"--int8 runs on CPUs through MXNet's oneDNN backend; this run's devices include "
            f"{', '.join(gpus)}.",
            hint="Add --set context.devices=cpu, or leave out --int8.",
        )
    if not int8_available():
        raise ConfigError(
            "--int8 needs MXNet built with oneDNN (MKLDNN); this MXNet is not.",
            hint="Install the mxnet==1.9.1 wheel from PyPI (built with oneDNN), or leave "
            "out --int8.",
        )


def _stored_ranges(
    file: Path, checksum: str, data: str, batches: int
) -> dict[str, tuple[float, float]] | None:
    """The ranges kept in ``file`` when they were measured on this checkpoint, data and
    sample size; None otherwise (or when the file cannot be read)."""
    try:
        kept = json.loads(file.read_text(encoding="utf-8"))
        same = (
            kept.get("format") == _FORMAT
            and kept.get("params_sha256") == checksum
            and kept.get("calibration_data") == data
            and kept.get("calibration_batches") == batches
        )
        if not same:
            return None
        return {str(k): (float(v[0]), float(v[1])) for k, v in kept["ranges"].items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def _evenly_spread(data_iter: Any, wanted: int) -> set[int]:
    """Indices of ``wanted`` batches spread evenly over one pass of ``data_iter`` (all of
    them when it has fewer)."""
    data_iter.reset()
    total = sum(1 for _ in data_iter)
    if total <= wanted:
        return set(range(total))
    return {i * total // wanted for i in range(wanted)}


def measure_ranges(
    module: Any, data_iter: Any, params: tuple[dict[str, Any], dict[str, Any]], batches: int
) -> tuple[dict[str, tuple[float, float]], int]:
    """Run ``batches`` batches of ``data_iter`` through ``module`` (the fused fp32 graph of
    :class:`~mxtrain.engine.quantization.FusedSymGen`) and return the ranges of the outputs
    the int8 graph needs, and the number of batches run. A ConfigError when the model has
    nothing that can run in int8."""
    from mxtrain.engine.quantization import RangeCollector, calibration_layers

    args, auxs = params
    layers = calibration_layers(module.symbol, args)
    if not layers:
        raise ConfigError(
            "--int8: nothing in this model runs in int8 with MXNet 1.9.1's oneDNN backend "
            "(it quantizes LSTM layers, FullyConnected and Convolution layers; GRU and vanilla "
            "RNN layers, embeddings and the softmax stay fp32).",
            hint="Leave out --int8 for this model.",
        )
    collector = RangeCollector(layers)
    module.set_params(args, auxs)
    module.watch_outputs(collector)
    chosen = _evenly_spread(data_iter, batches)
    data_iter.reset()
    module.reset_states()
    ran = 0
    for index, batch in enumerate(data_iter):
        if index in chosen:
            module.forward(batch, is_train=False)
            for output in module.get_outputs():
                output.wait_to_read()
            ran += 1
        if ran == len(chosen):
            break
    missing = [name for name in layers if name not in collector.min_max_dict]
    if ran == 0 or missing:
        raise ConfigError(
            f"--int8: the calibration data gave no batch that reaches "
            f"{', '.join(missing) or 'the model'}, so their ranges cannot be measured.",
            hint="Give --calibration-data a file of the training data's kind with a few "
            "hundred lines or more.",
        )
    return dict(collector.min_max_dict), ran


def int8_module(
    run: RunFolder,
    chosen: ChosenCheckpoint,
    options: Int8Options,
    build: Callable[[Callable[[Any], Any], Any], Any],
    data_iter: Any,
    calibration_iter: Callable[[], Any],
) -> tuple[Any, Int8Report]:
    """The module of ``data_iter`` bound with int8 graphs, its parameters set.

    ``build(graphs, data_iter)`` builds the module as fp32 inference would, with each
    bucket's graph replaced by ``graphs(sym_gen)``'s; ``calibration_iter()`` returns the
    calibration data's iterator (only called when no kept ranges fit).
    """
    from mxtrain.engine.quantization import FusedSymGen, Int8SymGen, MissingRanges

    params = chosen.arrays()
    file = run.int8_calibration_file(chosen.describe())
    checksum = file_digest(chosen.params_file)["sha256"]
    source = str(options.calibration_data) if options.calibration_data is not None else "data.train"
    wanted = options.calibration_batches
    ranges = _stored_ranges(file, checksum, source, wanted)
    reused, batches = ranges is not None, wanted
    made: list[Int8SymGen] = []

    def int8_graphs(sym_gen: Any) -> Any:
        assert ranges is not None
        made.append(Int8SymGen(sym_gen, ranges, params[0]))
        return made[-1]

    for attempt in ("kept", "measured"):
        if ranges is None:
            calibration_data = calibration_iter()
            calibrating = build(FusedSymGen, calibration_data)
            ranges, batches = measure_ranges(calibrating, calibration_data, params, wanted)
            del calibrating
            log.info(
                "int8: measured the ranges of %d inputs on %d batches of %s",
                len(ranges),
                batches,
                source,
            )
            _keep(file, checksum, source, wanted, ranges, chosen)
        try:
            module = build(int8_graphs, data_iter)
            break
        except MissingRanges:  # the kept ranges were measured on another graph
            if attempt != "kept" or not reused:
                raise
            ranges, reused = None, False
    graphs = made[-1]
    assert graphs.params is not None
    module.set_params(graphs.params, params[1])
    report = Int8Report(graphs.operators, file, source, batches, reused)
    log.info(
        "int8: %s in int8 (ranges %s %s)",
        ", ".join(f"{kind} {name}" for kind, name in graphs.operators) or "nothing",
        "kept in" if reused else "written to",
        file,
    )
    return module, report


def _keep(
    file: Path,
    checksum: str,
    data: str,
    batches: int,
    ranges: dict[str, tuple[float, float]],
    chosen: ChosenCheckpoint,
) -> None:
    record = {
        "format": _FORMAT,
        "checkpoint": chosen.describe(),
        "params_sha256": checksum,
        "calibration_data": data,
        "calibration_batches": batches,
        "ranges": {name: [low, high] for name, (low, high) in sorted(ranges.items())},
    }
    try:
        file.parent.mkdir(exist_ok=True)
        atomic_write_text(file, json.dumps(record, indent=1) + "\n")
    except OSError as exc:
        log.warning(
            "int8: the calibrated ranges could not be kept in %s (%s); they are measured "
            "again next time",
            file,
            exc,
        )
