"""``mxtrain predict`` for sequence-to-sequence models (data iterators reporting task
``"seq2seq"``): each source line decoded by beam search (:mod:`mxtrain.decoding.seq2seq`:
the encoder once per batch, the step graph on carried states), on the run's first device only,
with the checkpoint's parameters.

One record per input line, in input order: ``{"line", "output", "score", "log_prob"}`` (with
``--nbest N`` > 1 also ``"nbest": [{"output", "score", "log_prob"}, ...]``, best first, the
first being the record's own); ``output`` is detokenized by the iterator (``chars`` joined
without spaces, ``whitespace`` with single spaces). A line the iterator gives no source for
(blank) gets null values.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from mxtrain.decoding.search import DecodeOptions, Hypothesis
from mxtrain.decoding.seq2seq import DecoderModel, check_decoder, decode_sources, decoder_graphs
from mxtrain.errors import ConfigError
from mxtrain.inference.decode import DecodedLines, batch_lines, graphs_fit
from mxtrain.inference.ensemble import reverses_target
from mxtrain.inference.open import OpenedRun
from mxtrain.inference.output import finite_or_none

log = logging.getLogger("mxtrain")


class Seq2SeqPredictions(DecodedLines):
    """Decoded outputs per input line: ``output``, ``score``, ``log_prob`` per hypothesis."""

    HYPOTHESIS_FIELDS = (("output", "text"), ("score", "<f8"), ("log_prob", "<f8"))

    def hypothesis_fields(self, hypothesis: Hypothesis, text: str) -> dict[str, Any]:
        return {
            "output": text,
            "score": finite_or_none(hypothesis.score),
            "log_prob": finite_or_none(hypothesis.log_prob),
        }


def decode_batches(
    batches: Any,
    models: list[DecoderModel],
    info: Any,
    options: DecodeOptions,
    detokenize: Any,
    count: int | None = None,
    rerankers: Sequence[DecoderModel] = (),
) -> Seq2SeqPredictions:
    """Decode every batch (``data[0]``: sources (N, S) padded with ``info.pad_id``; ``index``:
    each row's 0-based line, -1 for padding rows), the candidates reranked with ``rerankers``
    when given; results per line, ``count`` lines (default: up to the last line seen)."""
    found: dict[int, list[Hypothesis]] = {}
    for batch in batches:
        lines = batch_lines(batch, "source")
        hyps = decode_sources(
            models, info, options, batch.data[0], lines.tolist(), rerankers=rerankers
        )
        for line, hyp in zip(lines, hyps, strict=True):
            if line >= 0:
                found[int(line)] = hyp
    total = count if count is not None else max(found, default=-1) + 1
    hypotheses = [found.get(i) for i in range(total)]
    texts = [None if h is None else [detokenize(list(x.tokens)) for x in h] for h in hypotheses]
    return Seq2SeqPredictions(hypotheses, texts, options.nbest)


def predict_seq2seq(
    opened: OpenedRun,
    options: DecodeOptions,
    ensemble: Sequence[OpenedRun] = (),
    rerank: Sequence[OpenedRun] = (),
) -> Seq2SeqPredictions:
    """Decode every line of ``opened``'s predict iterator with ``options``, together with the
    ``ensemble`` runs when given, the candidates reranked with the ``rerank`` runs
    (:mod:`mxtrain.inference.ensemble`)."""
    check_rerank(options, len(rerank))
    data_iter = opened.data_iter
    info = data_iter.data_info
    detokenize = getattr(data_iter, "detokenize", None)
    if detokenize is None:
        raise ConfigError(
            "The data iterator reports task 'seq2seq' but has no detokenize(ids), so decoded "
            "outputs cannot be written as text."
        )
    models = [decoder_model(run, opened.contexts[0]) for run in (opened, *ensemble)]
    rerankers = [decoder_model(run, opened.contexts[0]) for run in rerank]
    log.info(
        "decoding on %s: %s%s%s",
        opened.contexts[0],
        "sampling" if options.sample else f"beam {options.beam_size}",
        f", ensemble of {len(models)} models" if len(models) > 1 else "",
        f", reranked with {len(rerankers)} more" if rerankers else "",
    )
    data_iter.reset()
    count = getattr(data_iter, "num_sentences", None)
    with graphs_fit(opened.params_file):
        return decode_batches(
            data_iter, models, info, options, detokenize, count=count, rerankers=rerankers
        )


def check_rerank(options: DecodeOptions, rerankers: int) -> None:
    """A ConfigError when ``rerankers`` further models are given to a search that leaves
    them nothing to rank (greedy decoding, sampling)."""
    if rerankers and (options.sample or options.beam_size < 2):
        raise ConfigError(
            "--rerank scores the candidates a beam search finished, but "
            f"{'sampling draws one output' if options.sample else 'beam size 1 keeps one'}.",
            hint="Give --beam-size 2 or more (e.g. 5), or leave out --rerank.",
        )


def decoder_model(opened: OpenedRun, context: Any) -> DecoderModel:
    """``opened``'s model bound for step-by-step decoding on ``context`` with its checkpoint."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    from mxtrain.engine.graph_runner import GraphRunner

    sym_gen = opened.sym_gen()
    check_decoder(sym_gen, opened.config.model.name)
    args, auxs = opened.params()
    runner = GraphRunner(decoder_graphs(sym_gen), args, auxs, context)
    return DecoderModel(runner, sym_gen, reverse_target=reverses_target(opened))
