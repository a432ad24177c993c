"""``mxtrain predict`` for sequence-to-sequence models (data iterators reporting task
``"seq2seq"``): each source line decoded by beam search (:mod:`mxtrain.inference.decode`).

The model's ``sym_gen`` gives an encoder graph and a decoder step graph (``encoder(S, max_steps)``,
``decoder_step(S, max_steps)``, ``static_names``, ``state_names``, ``input_shapes``: see the
issue-30 contract). Per batch of sources the encoder runs once; its outputs are repeated
``beam`` times along the rows, and the step graph runs once per output position on the
carried states (reordered with ``take`` as hypotheses are kept), never recomputing earlier
positions itself (a Transformer's step reads its key/value caches, which are states). Both
graphs run on the run's first device only, bound by :class:`mxtrain.engine.graph_runner.
GraphRunner` with the checkpoint's parameters.

One record per input line, in input order: ``{"line", "output", "score", "log_prob"}`` (with
``--nbest N`` > 1 also ``"nbest": [{"output", "score", "log_prob"}, ...]``, best first, the
first being the record's own); ``output`` is detokenized by the iterator (``chars`` joined
without spaces, ``whitespace`` with single spaces). A line the iterator gives no source for
(blank) gets null values.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from mxtrain.errors import ConfigError
from mxtrain.inference.decode import (
    DecodedLines,
    DecodeOptions,
    DeviceScores,
    Hypothesis,
    batch_lines,
    decode,
    graphs_fit,
    max_output_lengths,
    repeat_rows,
    rows_per_input,
    take_rows,
)
from mxtrain.inference.open import OpenedRun
from mxtrain.inference.output import finite_or_none

log = logging.getLogger("mxtrain")

#: what a seq2seq ``sym_gen`` must have for decoding (the issue-30 contract)
DECODER_PARTS = ("encoder", "decoder_step", "static_names", "state_names", "input_shapes")


class Seq2SeqPredictions(DecodedLines):
    """Decoded outputs per input line: ``output``, ``score``, ``log_prob`` per hypothesis."""

    HYPOTHESIS_FIELDS = (("output", "text"), ("score", "<f8"), ("log_prob", "<f8"))

    def hypothesis_fields(self, hypothesis: Hypothesis, text: str) -> dict[str, Any]:
        return {
            "output": text,
            "score": finite_or_none(hypothesis.score),
            "log_prob": finite_or_none(hypothesis.log_prob),
        }


class EncoderDecoderSteps:
    """The :class:`~mxtrain.inference.decode.StepModel` of one batch of sources: the encoder
    run once, the step graph on the carried states, ``rows`` hypotheses per source."""

    def __init__(self, runner: Any, sym_gen: Any, source: Any, rows: int, max_steps: int) -> None:
        self.runner, self.sym_gen = runner, sym_gen
        inputs, width = source.shape
        self.static_names = list(sym_gen.static_names)
        self.state_names = list(sym_gen.state_names)
        # the encoder's initial states may be sized by max_steps (a Transformer's caches)
        outputs = runner.forward(("encoder", width, inputs, max_steps), {"source": source})
        expected = len(self.static_names) + len(self.state_names)
        if len(outputs) != expected:
            raise ConfigError(
                f"The model's encoder has {len(outputs)} outputs; its static_names and "
                f"state_names name {expected}.",
                hint="A seq2seq model's encoder(S) outputs the static arrays, then the states.",
            )
        split = len(self.static_names)
        self.static = repeat_rows(outputs[:split], rows)
        self.states = repeat_rows(outputs[split:], rows)
        self.key = ("decoder_step", width, inputs * rows, max_steps)
        self._first = True

    def step(self, prev_tokens: np.ndarray, position: int) -> DeviceScores:
        inputs: dict[str, Any] = {
            "prev_token": prev_tokens.astype(np.float32),
            "step": np.array([position], dtype=np.float32),
            **dict(zip(self.state_names, self.states, strict=True)),
        }
        if self._first:  # the encoder's outputs stay in the step executor for the batch
            inputs.update(zip(self.static_names, self.static, strict=True))
            self._first = False
        outputs = self.runner.forward(self.key, inputs)
        # the next forward copies these into its inputs before overwriting them
        self.states = outputs[1:]
        return DeviceScores(outputs[0])

    def reorder(self, rows: np.ndarray) -> None:
        # the static arrays are the same for every row of a source, and rows move only
        # within their source: only the states follow
        self.states = take_rows(self.states, rows)


def decoder_graphs(sym_gen: Any) -> Any:
    """``symbol_for(key)`` of the encoder and step graphs of ``sym_gen``, for a GraphRunner."""

    def symbol_for(key: tuple[Any, ...]) -> Any:
        if key[0] == "encoder":
            return sym_gen.encoder(key[1], key[3])
        return sym_gen.decoder_step(key[1], key[3])

    return symbol_for


def decode_batches(
    batches: Any,
    runner: Any,
    sym_gen: Any,
    info: Any,
    options: DecodeOptions,
    detokenize: Any,
    count: int | None = None,
) -> Seq2SeqPredictions:
    """Decode every batch (``data[0]``: sources (N, S) padded with ``info.pad_id``; ``index``:
    each row's 0-based line, -1 for padding rows); results per line, ``count`` lines (default:
    up to the last line seen)."""
    found: dict[int, list[Hypothesis]] = {}
    rows = rows_per_input(options)
    pad = info.pad_id if info.pad_id is not None else 0
    for batch in batches:
        lines = batch_lines(batch, "source")
        source = batch.data[0]
        host = source.asnumpy()
        lengths = (host != pad).sum(axis=1)
        max_steps = int(max_output_lengths([source.shape[1]], *_ratio(options))[0])
        limits = max_output_lengths(lengths, *_ratio(options))  # <= max_steps
        model = EncoderDecoderSteps(runner, sym_gen, source, rows, max_steps)
        hyps = decode(
            model,
            np.full(len(lines), info.bos_id, dtype=np.int64),
            limits,
            options,
            eos=info.eos_id,
            banned=(pad, info.bos_id),
            lines=lines.tolist(),
        )
        for line, hyp in zip(lines, hyps, strict=True):
            if line >= 0:
                found[int(line)] = hyp
    total = count if count is not None else max(found, default=-1) + 1
    hypotheses = [found.get(i) for i in range(total)]
    texts = [None if h is None else [detokenize(list(x.tokens)) for x in h] for h in hypotheses]
    return Seq2SeqPredictions(hypotheses, texts, options.nbest)


def _ratio(options: DecodeOptions) -> tuple[float, int]:
    return options.max_output_ratio, options.max_output_add


def check_decoder(sym_gen: Any, model: str) -> None:
    """A ConfigError unless ``sym_gen`` has what decoding needs."""
    missing = [part for part in DECODER_PARTS if not hasattr(sym_gen, part)]
    if missing:
        raise ConfigError(
            f"The model {model!r} reports task 'seq2seq' but its sym_gen has no "
            f"{', '.join(missing)}, so it cannot be decoded step by step.",
            hint="A seq2seq model's sym_gen provides encoder(S), decoder_step(S, max_steps), "
            "static_names, state_names and input_shapes (rnn_seq2seq and transformer_seq2seq "
            "do).",
        )


def predict_seq2seq(opened: OpenedRun, options: DecodeOptions) -> Seq2SeqPredictions:
    """Decode every line of ``opened``'s predict iterator with ``options``."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    from mxtrain.build import build_sym_gen
    from mxtrain.engine.graph_runner import GraphRunner

    data_iter = opened.data_iter
    info = data_iter.data_info
    detokenize = getattr(data_iter, "detokenize", None)
    if detokenize is None:
        raise ConfigError(
            "The data iterator reports task 'seq2seq' but has no detokenize(ids), so decoded "
            "outputs cannot be written as text."
        )
    config = opened.config
    sym_gen = build_sym_gen(config.model, info, config.base_dir)
    check_decoder(sym_gen, config.model.name)
    args, auxs = opened.params()
    runner = GraphRunner(decoder_graphs(sym_gen), args, auxs, opened.contexts[0])
    log.info(
        "decoding on %s: %s",
        opened.contexts[0],
        "sampling" if options.sample else f"beam {options.beam_size}",
    )
    data_iter.reset()
    count = getattr(data_iter, "num_sentences", None)
    with graphs_fit(opened.params_file):
        return decode_batches(data_iter, runner, sym_gen, info, options, detokenize, count=count)
