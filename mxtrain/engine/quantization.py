"""int8 inference graphs through MXNet 1.9.1's oneDNN quantization (CPU only).

A bucket's fp32 graph is fused for quantization (``MKLDNN_QUANTIZE``), the operators oneDNN
runs in int8 are replaced by their quantized forms (``quantize_mode="smart"``: LSTM ``RNN``
layers as ``_contrib_quantized_rnn``; ``FullyConnected`` (fused with a following activation)
as int8 ``_sg_mkldnn_fully_connected`` whose output leaves in fp32), and each quantized
operator's input is quantized with a range measured beforehand on sample batches (``naive``
calibration: the smallest and largest value seen). Everything else (embeddings, GRU and
vanilla RNN layers, softmax, losses) stays fp32.

CPUs without VNNI (AVX2, AVX-512 before Cascade Lake) sum pairs of uint8 x int8 products in
int16, which saturates when both use their full range (outputs then off by far more than
the rounding: measured up to 60% of an LSTM's output on a Zen 3). There the FullyConnected
weights use 7 bits (-63..63) and an LSTM's uint8 inputs 7 bits (0..127): a bit of precision
for results within the quantization error (tests/unit/test_quantization.py bounds both).

The calibrated layers are named by the fused graph's node names; ``call_sym_gen`` builds every
bucket in a fresh NameManager, so one set of ranges measured on some buckets applies to all.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable, Mapping
from typing import Any

import mxnet as mx
from mxnet.contrib import quantization

from mxtrain.run.environment import cpu_flags

__all__ = [
    "FUSION_BACKEND",
    "GRANULARITY",
    "FusedSymGen",
    "Int8SymGen",
    "MissingRanges",
    "RangeCollector",
    "calibration_layers",
    "fused_graph",
    "has_vnni",
    "int8_available",
    "int8_graph",
    "quantized_operators",
]

#: the subgraph backend that fuses operators for (and after) quantization
FUSION_BACKEND = "MKLDNN_QUANTIZE"
#: one scale per weight tensor: the weights are quantized here (see _weights_in_int8), so
#: their range can be halved where the CPU needs it
GRANULARITY = "tensor-wise"
#: quantized inputs: uint8 where the calibrated range is non-negative, else int8
QUANTIZED_DTYPE = "auto"

#: quantized operator types and the fp32 operator each stands for, for reports
_QUANTIZED_FORMS = {
    "_contrib_quantized_rnn": "RNN",
    "_sg_mkldnn_fully_connected": "FullyConnected",
    "_sg_mkldnn_conv": "Convolution",
    "_contrib_quantized_fully_connected": "FullyConnected",
    "_contrib_quantized_conv": "Convolution",
    "_contrib_quantized_embedding": "Embedding",
}


def int8_available() -> bool:
    """Whether this MXNet has the oneDNN backend that runs int8 graphs."""
    return bool(mx.runtime.Features().is_enabled("MKLDNN"))


def fused_graph(symbol: Any) -> Any:
    """``symbol`` with the operator fusions quantization expects (still fp32): calibration
    runs this graph, whose node names the ranges are keyed by."""
    return symbol.get_backend_symbol(FUSION_BACKEND)


def _quantize(fused: Any, params: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """The quantized (uncalibrated) graph of ``fused`` and the outputs it needs ranges of;
    ``params`` are quantized offline (their names are what matters)."""
    qsym, _, _, collector = quantization.quantize_graph(
        fused,
        dict(params),
        {},
        mx.cpu(),
        calib_mode="naive",
        quantized_dtype=QUANTIZED_DTYPE,
        quantize_mode="smart",
        quantize_granularity=GRANULARITY,
    )
    return qsym, list(collector.include_layer)


def calibration_layers(fused: Any, params: Mapping[str, Any]) -> list[str]:
    """The outputs of ``fused`` (from :func:`fused_graph`) whose value ranges the int8 graph
    needs, in graph order; empty when nothing in it can run in int8."""
    return _quantize(fused, params)[1]


class MissingRanges(Exception):
    """A graph needs ranges that were not measured (ranges kept for another graph). Not a
    ValueError: building a module explains those as faults of the model."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(f"no calibrated range for {', '.join(names)}")
        self.names = names


class RangeCollector:
    """The smallest and largest value of named outputs over the batches an executor runs:
    a monitor callback (``Executor.set_monitor_callback(collector, monitor_all=True)``)."""

    def __init__(self, names: list[str]) -> None:
        self.names = set(names)
        #: output name -> (min, max) so far (the attribute MXNet's calibration reads)
        self.min_max_dict: dict[str, tuple[float, float]] = {}

    def __call__(self, name: Any, handle: Any) -> None:
        name = name.decode() if isinstance(name, bytes) else str(name)
        if name not in self.names:
            return
        array = mx.nd.NDArray(ctypes.cast(handle, mx.base.NDArrayHandle), writable=False)
        low, high = float(array.min().asscalar()), float(array.max().asscalar())
        seen = self.min_max_dict.get(name)
        if seen is not None:
            low, high = min(low, seen[0]), max(high, seen[1])
        self.min_max_dict[name] = (low, high)


class _Ranges:
    """Measured ranges in the form ``calib_graph`` reads them."""

    def __init__(self, ranges: Mapping[str, tuple[float, float]]) -> None:
        self.min_max_dict = {k: (float(v[0]), float(v[1])) for k, v in ranges.items()}


def int8_graph(
    symbol: Any,
    ranges: Mapping[str, tuple[float, float]],
    arg_params: Mapping[str, Any],
) -> tuple[Any, dict[str, Any]]:
    """The int8 graph of the fp32 ``symbol`` with the calibrated ``ranges`` and its
    parameters: ``arg_params`` (fp32) with each quantized weight replaced by its int8 values
    and their range. MissingRanges names the layers that have no range."""
    fused = fused_graph(symbol)
    qsym, needed = _quantize(fused, arg_params)
    missing = [name for name in needed if name not in ranges]
    if missing:
        raise MissingRanges(missing)
    used = {name: ranges[name] for name in needed}
    narrow = not has_vnni()
    for name in _recurrent_inputs(qsym, needed):
        # oneDNN's int8 LSTM quantizes its recurrent state h (within -1..1) with its input's
        # scale and every layer's input with the first's: a range narrower than h clips it.
        # Its uint8 values times int8 weights saturate int16 pair sums without VNNI: there
        # the range doubles upwards, so that the values lie within 0..127.
        low, high = min(used[name][0], -1.0), max(used[name][1], 1.0)
        used[name] = (low, high + (high - low) if narrow else high)
    qsym, qargs, _ = quantization.calib_graph(
        qsym,
        dict(arg_params),
        {},
        _Ranges(used),
        calib_mode="naive",
        quantized_dtype=QUANTIZED_DTYPE,
        logger=None,
    )
    for name in list(qargs):
        if name.endswith("weight_quantize"):
            weights = arg_params[name[: -len("_quantize")]]
            qargs.update(_weights_in_int8(name, weights, halved=narrow))
    return fused_graph(qsym), qargs


def has_vnni() -> bool:
    """Whether the CPU has AVX512-VNNI or AVX-VNNI (int8 products summed in int32). Without
    it oneDNN sums pairs of uint8 x int8 products in int16 (``vpmaddubsw``), which saturates
    when both factors use their full range; False where the CPU's flags cannot be read."""
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni"})


def _weights_in_int8(name: str, weights: Any, *, halved: bool) -> dict[str, Any]:
    """``weights`` as int8 with one symmetric scale; ``halved``: within -63..63 (a range
    twice theirs), so that two uint8 x int8 products (255 x 63 x 2 = 32,130) fit in int16."""
    bound = float(weights.abs().max().asscalar()) or 1.0
    if halved:
        bound *= 2
    values, low, high = mx.nd.contrib.quantize(
        weights, mx.nd.array([-bound]), mx.nd.array([bound]), out_type="int8"
    )
    return {name: values, f"{name}_min": low, f"{name}_max": high}


def _recurrent_inputs(qsym: Any, layers: list[str]) -> list[str]:
    """Those of ``layers`` (outputs of the fp32 graph) that a quantized LSTM reads."""
    nodes = json.loads(qsym.tojson())["nodes"]
    found = []
    for node in nodes:
        if node["op"] != "_contrib_quantized_rnn":
            continue
        quantizer = nodes[node["inputs"][0][0]]
        if not quantizer["op"].startswith("_contrib_quantize"):
            continue
        source = nodes[quantizer["inputs"][0][0]]["name"]
        # an operator's output is named NAME_output[N], a graph input by its name
        found += [n for n in layers if n == source or n.startswith(f"{source}_output")]
    return found


def quantized_operators(qsym: Any) -> list[tuple[str, str]]:
    """(fp32 operator type, layer) of each operator ``qsym`` runs in int8; the layer is named
    by its parameters (``pred`` for ``pred_bias``), fused nodes having names of their own."""
    nodes = json.loads(qsym.tojson())["nodes"]
    found = []
    for node in nodes:
        kind = _QUANTIZED_FORMS.get(node["op"])
        quantized = str(node.get("attrs", {}).get("quantized", "true")).lower() == "true"
        if kind is None or not quantized:
            continue
        found.append((kind, _layer_name(node, nodes)))
    return found


def _layer_name(node: dict[str, Any], nodes: list[dict[str, Any]]) -> str:
    inputs = [nodes[i[0]]["name"] for i in node.get("inputs", []) if nodes[i[0]]["op"] == "null"]
    for suffix in ("_bias_quantize", "_bias", "_weight_quantize", "_weight", "_parameters"):
        for name in inputs:
            if name.endswith(suffix):
                return name[: -len(suffix)]
    return str(node["name"])


class _WrappedSymGen:
    """A model's ``sym_gen`` whose graphs are changed; its other attributes (``states``,
    ``without_probabilities``, ...) are the model's."""

    def __init__(self, base: Callable[[Any], tuple[Any, Any, Any]]) -> None:
        self.base = base

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # not set yet (copying, unpickling)
            raise AttributeError(name)
        return getattr(self.base, name)


class FusedSymGen(_WrappedSymGen):
    """Each bucket's fp32 graph fused as quantization fuses it: the graph calibration runs."""

    def __call__(self, key: Any) -> tuple[Any, Any, Any]:
        symbol, data_names, label_names = self.base(key)
        return fused_graph(symbol), data_names, label_names


class Int8SymGen(_WrappedSymGen):
    """Each bucket's graph in int8 with the calibrated ``ranges``; ``params`` holds the
    parameters the graphs read (after the first call)."""

    def __init__(
        self,
        base: Callable[[Any], tuple[Any, Any, Any]],
        ranges: Mapping[str, tuple[float, float]],
        arg_params: Mapping[str, Any],
    ) -> None:
        super().__init__(base)
        self.ranges = dict(ranges)
        self.arg_params = dict(arg_params)
        self.params: dict[str, Any] | None = None
        self.operators: list[tuple[str, str]] = []

    def __call__(self, key: Any) -> tuple[Any, Any, Any]:
        symbol, data_names, label_names = self.base(key)
        qsym, qargs = int8_graph(symbol, self.ranges, self.arg_params)
        if self.params is None:
            self.params = qargs
            self.operators = quantized_operators(qsym)
        return qsym, data_names, label_names
