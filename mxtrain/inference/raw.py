"""``mxtrain predict --outputs raw``: every output of the model, per input, in input order.

For any model, whatever its data iterator's task: the outputs are not interpreted. Each
batch's outputs are cut into per-input rows: an output whose first axis is the batch size
gives row ``r`` its ``r``-th slice; one whose first axis is ``k`` times the batch size (a
sequence model's ``(batch * steps, classes)``, reshaped batch-major from ``(batch, steps,
...)``) gives row ``r`` the ``k`` slices ``r*k .. r*k+k-1``. Padding rows of a batch (index -1)
are dropped.

Rows never reach the host all at once: each batch's rows are appended to a spill file in
arrival (bucket) order, then copied into their input positions of an array on disk (a
memory map), which is written out in bounded chunks. The temporary files live in the system's
temporary folder (``TMPDIR``) and take about twice the output's size.

Formats:

* ``npz``: for each output ``NAME``, ``NAME``: ``(inputs, *row shape)``, rows shorter than
  the longest (sequences in shorter buckets) padded with NaN (0 for integer outputs), and
  ``NAME.shape``: ``(inputs, ndim)`` int64, each row's own shape; plus ``predicted``:
  ``(inputs,)`` bool, False for inputs that no batch held (e.g. a language model's blank
  lines), whose rows are all padding.
* ``npy``: one array ``(inputs, *row shape)``, only for a model with one output whose rows
  all have the same shape and cover every input (otherwise the error says to use npz).
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from mxtrain.errors import ConfigError
from mxtrain.inference.predict_loop import predict_batches

RAW_FORMATS = ("npz", "npy")


@dataclass
class _Spill:
    """One output's rows in arrival order: values in a file, shapes and inputs in memory."""

    path: Path
    dtype: Any = None
    inputs: list[int] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)


@dataclass
class RawOutputs:
    """What :func:`predict_raw` wrote."""

    inputs: int  # rows of every array (the input's lines, sentences or rows)
    predicted: int  # inputs that a batch held
    shapes: dict[str, tuple[int, ...]]  # output name -> written array shape


def _rows_of(name: str, value: np.ndarray, batch_rows: int) -> np.ndarray:
    """``value`` as ``(batch_rows, *row shape)``: see the module docstring."""
    if value.ndim == 0 or value.shape[0] % batch_rows:
        raise ConfigError(
            f"The model's output {name!r} has shape {value.shape}, which is not split by "
            f"input: its first axis is not a multiple of the batch size ({batch_rows}).",
            hint="--outputs raw writes outputs whose first axis is the batch (or batch x "
            "steps, batch-major); `mxtrain score` works for any model.",
        )
    steps = value.shape[0] // batch_rows
    if steps == 1:
        return value
    return value.reshape(batch_rows, steps, *value.shape[1:])


class _Collector:
    """Appends each batch's rows to the spill files (one per output)."""

    def __init__(self, names: list[str], folder: Path) -> None:
        self.names = names
        self.spills = [_Spill(folder / f"spill{i}.bin") for i in range(len(names))]
        self.handles = [open(s.path, "wb") for s in self.spills]  # noqa: SIM115 (closed below)

    def reduce(self, module: Any, batch: Any) -> list[Any]:
        # copies: the next batch's forward overwrites the executor's own output arrays
        # before these are read back (one batch later)
        return [output.copy() for output in module.get_outputs()]

    def collect(self, index: np.ndarray, outputs: list[Any]) -> None:
        real = np.flatnonzero(index >= 0)
        for name, spill, handle, output in zip(
            self.names, self.spills, self.handles, outputs, strict=True
        ):
            rows = _rows_of(name, output.asnumpy(), len(index))
            if spill.dtype is None:
                spill.dtype = rows.dtype
            for r in real:
                row = np.ascontiguousarray(rows[r], dtype=spill.dtype)
                handle.write(row.tobytes())
                spill.shapes.append(row.shape)
                spill.inputs.append(int(index[r]))

    def close(self) -> None:
        for handle in self.handles:
            handle.close()


def _padding(dtype: Any) -> Any:
    return np.nan if np.issubdtype(dtype, np.floating) else 0


def _assemble(spill: _Spill, inputs: int, path: Path, name: str) -> tuple[Path, np.ndarray]:
    """The spilled rows in input order, as an .npy file on disk; returns it and the row
    shapes ``(inputs, ndim)`` (zeros for inputs no batch held)."""
    ndim = len(spill.shapes[0])
    if any(len(s) != ndim for s in spill.shapes):
        raise ConfigError(
            f"The model's output {name!r} has rows of different ranks, which one array cannot hold."
        )
    longest = tuple(int(n) for n in np.max(np.array(spill.shapes, dtype=np.int64), axis=0))
    array = np.lib.format.open_memmap(path, mode="w+", dtype=spill.dtype, shape=(inputs, *longest))
    array[...] = _padding(spill.dtype)
    shapes = np.zeros((inputs, ndim), dtype=np.int64)
    values = np.memmap(spill.path, dtype=spill.dtype, mode="r") if spill.inputs else None
    offset = 0
    for target, shape in zip(spill.inputs, spill.shapes, strict=True):
        size = int(np.prod(shape))
        assert values is not None
        row = values[offset : offset + size].reshape(shape)
        array[(target, *(slice(0, n) for n in shape))] = row
        shapes[target] = shape
        offset += size
    array.flush()
    del array, values
    return path, shapes


def predict_raw(
    opened: Any, fmt: str, write: Callable[[Callable[[IO[bytes]], None]], None]
) -> RawOutputs:
    """Forward every batch of ``opened`` and hand ``write`` a function that writes the raw
    outputs as ``fmt`` (``npz`` or ``npy``) to a binary handle."""
    names = list(opened.module.output_names)
    num_rows = getattr(opened.data_iter, "num_rows", None)
    with tempfile.TemporaryDirectory(prefix="mxtrain-raw-") as tmp:
        folder = Path(tmp)
        collector = _Collector(names, folder)
        try:
            predict_batches(
                opened, collector.reduce, collector.collect, unit="the input of each batch row"
            )
        finally:
            collector.close()
        held = collector.spills[0].inputs
        inputs = int(num_rows) if num_rows is not None else (max(held) + 1 if held else 0)
        predicted = np.zeros(inputs, dtype=bool)
        if held:
            targets = np.asarray(held)
            if targets.max() >= inputs or len(np.unique(targets)) != len(targets):
                raise RuntimeError("the data iterator gave an input row twice or out of range")
            predicted[targets] = True
        if not predicted.any():
            raise ConfigError("The input has nothing to predict (no batch held an input).")
        assembled = {
            name: _assemble(spill, inputs, folder / f"output{i}.npy", name)
            for i, (name, spill) in enumerate(zip(names, collector.spills, strict=True))
        }
        if fmt == "npy":
            _check_one_array(names, assembled, predicted)
        write(_writer(fmt, names, assembled, predicted))
        shapes = {n: tuple(np.load(p, mmap_mode="r").shape) for n, (p, _) in assembled.items()}
    return RawOutputs(inputs, int(predicted.sum()), shapes)


def _check_one_array(
    names: list[str], assembled: dict[str, tuple[Path, np.ndarray]], predicted: np.ndarray
) -> None:
    if len(names) != 1:
        raise ConfigError(
            f"The model has {len(names)} outputs ({', '.join(names)}); an .npy file holds one "
            "array.",
            hint="Use --format npz (one array per output).",
        )
    shapes = assembled[names[0]][1]
    if not predicted.all() or (shapes != shapes[0]).any():
        raise ConfigError(
            f"The output {names[0]!r} has rows of different shapes (sequences of different "
            "lengths) or inputs without a prediction; an .npy array cannot say which.",
            hint="Use --format npz: it pads the rows and records each row's shape and "
            "whether it was predicted.",
        )


def _writer(
    fmt: str,
    names: list[str],
    assembled: dict[str, tuple[Path, np.ndarray]],
    predicted: np.ndarray,
) -> Callable[[IO[bytes]], None]:
    def npy(handle: IO[bytes]) -> None:
        with open(assembled[names[0]][0], "rb") as source:
            shutil.copyfileobj(source, handle, 16 << 20)

    def npz(handle: IO[bytes]) -> None:
        # ZIP_STORED as np.savez; each entry streamed from its memory map in bounded chunks
        with zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, (path, shapes) in assembled.items():
                _entry(archive, name, np.load(path, mmap_mode="r"))
                _entry(archive, f"{name}.shape", shapes)
            _entry(archive, "predicted", predicted)

    return npy if fmt == "npy" else npz


def _entry(archive: zipfile.ZipFile, key: str, array: np.ndarray) -> None:
    with archive.open(f"{key}.npy", "w", force_zip64=True) as entry:
        np.lib.format.write_array(entry, np.asanyarray(array), allow_pickle=False)
