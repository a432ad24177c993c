"""The decoding metrics of an eval set (bleu, chrf, wer, per: :mod:`mxtrain.text_metrics`):
its sources decoded by beam search with given parameters and compared with its targets.

What is decoded and what it is compared with:

- **One output per distinct source.** Where the same source appears on several lines of the
  eval files (the same text as the iterator reads it), it is decoded and counted once, and
  the targets of all those lines are its references: an output is right when it matches any
  of them (the G2P convention: a word with several pronunciations). BLEU and chrF take them
  as sacreBLEU's multiple references.
- **The subset:** the first ``max_sentences`` distinct sources in file order (None: all), the
  same ones at every evaluation. Pairs the batches leave out (longer than every bucket) are
  decoded too: decoding needs no bucket.
- **References are the target lines as read**, not the target ids turned back into text: a
  target word missing from the vocabulary stays itself (an output can never match it, which
  is the honest count), where ids would read ``<unk>``. Each line is normalised the way
  outputs are written (:meth:`~mxtrain.data.parallel_text.ParallelTextIter.normalized`:
  whitespace runs as one space, or characters joined; lowercased with ``lowercase``).

Decoding is deterministic: the sources sorted by length (then line) and cut into batches of
:data:`SOURCES_PER_BATCH`, each padded to its longest, on one device, so the same parameters,
sources and beam give the same outputs and values in ``fit`` and ``mxtrain score``, whatever
the eval batch size or device count. Under ``dist_sync`` every worker holds the same
parameters after each update and decodes the same sources: all workers get the same values,
without exchanging any. Nothing here draws random numbers: training's random streams are
untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mxtrain.decoding.search import DEFAULT_LENGTH_PENALTY, DecodeOptions
from mxtrain.decoding.seq2seq import (
    DecoderModel,
    check_decoder,
    decode_sources,
    decoder_graphs,
    reverses,
)
from mxtrain.errors import ConfigError
from mxtrain.text_metrics import decoding_scores

log = logging.getLogger("mxtrain")

#: distinct sources decoded together (a batch has beam_size times as many decoder rows)
SOURCES_PER_BATCH = 64


@dataclass(frozen=True)
class FixedModel:
    """A further model of an ensemble or a reranker, with its own fixed parameters
    (``--ensemble``, ``--rerank``)."""

    sym_gen: Any
    arg_params: dict[str, Any]
    aux_params: dict[str, Any]
    name: str = "model"  # for messages: the model's name in its config
    reverse_target: bool = False  # it reads and writes targets last token first


@dataclass(frozen=True)
class EvalSource:
    """One distinct source of an eval set: its ids, the lines it is on and their targets."""

    source_ids: tuple[int, ...]
    lines: tuple[int, ...]  # 0-based, in file order
    references: tuple[str, ...]  # the targets of those lines, in file order (repeats kept once)


def distinct_sources(pairs: Sequence[Any], max_sentences: int | None = None) -> list[EvalSource]:
    """The distinct sources of ``pairs`` (objects with ``line``, ``source_ids``, ``source``
    and ``target``, in file order) in order of first appearance, the first ``max_sentences``
    of them (None: all), each with every target it has anywhere in ``pairs``."""
    grouped: dict[str, list[Any]] = {}
    for pair in pairs:
        grouped.setdefault(pair.source, []).append(pair)
    chosen = list(grouped.values())
    if max_sentences is not None:
        chosen = chosen[:max_sentences]
    return [
        EvalSource(
            tuple(same[0].source_ids),
            tuple(p.line for p in same),
            tuple(dict.fromkeys(p.target for p in same)),
        )
        for same in chosen
    ]


def padded_batches(sources: Sequence[EvalSource], pad: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(which, ids)`` batches: the positions in ``sources`` of each batch's rows and their ids
    (rows, longest) padded with ``pad``; sources sorted by length, then by first line."""
    order = sorted(range(len(sources)), key=lambda i: (len(sources[i].source_ids), i))
    batches = []
    for start in range(0, len(order), SOURCES_PER_BATCH):
        which = np.asarray(order[start : start + SOURCES_PER_BATCH], dtype=np.int64)
        width = max(len(sources[i].source_ids) for i in which)
        ids = np.full((which.size, width), pad, dtype=np.float32)
        for row, i in enumerate(which):
            ids[row, : len(sources[i].source_ids)] = sources[i].source_ids
        batches.append((which, ids))
    return batches


class DecodingEvaluation:
    """The decoding metrics ``names`` of an eval iterator's pairs (``pairs()``, ``data_info``,
    ``detokenize``: a parallel_text eval iterator) under the parameters given, decoded with
    ``model_sym_gen``'s encoder and step graphs on ``context`` at ``beam_size``, together
    with the ``ensemble`` models when given (the mean of their probabilities at each step),
    the beam's candidates reranked with the ``rerankers`` when given.

    Each call binds the graphs afresh with the parameters it is given and releases them when
    it returns: nothing stays bound between evaluations, and the parameters may change
    between two calls (oneDNN's fused layers keep a copy of the weights they first read).
    Measured on 2 cores (167 sources at beam 5, the 24-unit rnn_seq2seq of the tests):
    0.146 s per call binding afresh against 0.125 s reusing the executors, and the memory of
    decoding does not grow from call to call (1 MB over 200 calls).
    """

    def __init__(
        self,
        model_sym_gen: Any,
        data_iter: Any,
        names: Sequence[str],
        *,
        context: Any,
        beam_size: int = 1,
        length_penalty: float = DEFAULT_LENGTH_PENALTY,
        max_sentences: int | None = None,
        model_name: str = "model",
        ensemble: Sequence[FixedModel] = (),
        rerankers: Sequence[FixedModel] = (),
    ) -> None:
        check_decoder(model_sym_gen, model_name)
        for member in (*ensemble, *rerankers):
            check_decoder(member.sym_gen, member.name)
        self.ensemble, self.rerankers = list(ensemble), list(rerankers)
        if not (hasattr(data_iter, "pairs") and hasattr(data_iter, "detokenize")):
            raise ConfigError(
                f"The decoding metrics {', '.join(names)} need the eval data's sources and "
                f"targets as text, but its iterator {type(data_iter).__name__} has no pairs() "
                "and detokenize(ids).",
                hint="Read the eval data with the parallel_text iterator, or list only device "
                "metrics (perplexity, accuracy) in fit.eval_metrics.",
            )
        self.sym_gen, self.names, self.context = model_sym_gen, list(names), context
        self.info, self.detokenize = data_iter.data_info, data_iter.detokenize
        pairs = data_iter.pairs()
        self.sources = distinct_sources(pairs, max_sentences)
        self.options = DecodeOptions(beam_size=beam_size, length_penalty=length_penalty)
        log.info(
            "decoding metrics %s: %d distinct sources of %d pairs decoded at beam %d per "
            "evaluation%s",
            ", ".join(self.names),
            len(self.sources),
            len(pairs),
            beam_size,
            f", by an ensemble of {len(self.ensemble) + 1} models" if self.ensemble else "",
        )
        if self.rerankers:
            log.info("the beam's candidates reranked with %d more models", len(self.rerankers))

    def outputs(self, arg_params: dict[str, Any], aux_params: dict[str, Any]) -> list[str]:
        """The best output of each source (``self.sources``' order) as text ('' for none)."""
        # deferred: the runner imports MXNet, which reads its thread settings when it loads
        from mxtrain.engine.graph_runner import GraphRunner

        def bound(
            sym_gen: Any, args: dict[str, Any], auxs: dict[str, Any], reverse: bool = False
        ) -> DecoderModel:
            runner = GraphRunner(decoder_graphs(sym_gen), args, auxs, self.context)
            return DecoderModel(runner, sym_gen, reverse_target=reverse)

        models = [bound(self.sym_gen, arg_params, aux_params, reverses(self.info))]
        models += [
            bound(m.sym_gen, m.arg_params, m.aux_params, m.reverse_target) for m in self.ensemble
        ]
        rerankers = [
            bound(m.sym_gen, m.arg_params, m.aux_params, m.reverse_target) for m in self.rerankers
        ]
        texts = [""] * len(self.sources)
        pad = self.info.pad_id if self.info.pad_id is not None else 0
        for which, ids in padded_batches(self.sources, pad):
            hyps = decode_sources(models, self.info, self.options, ids, rerankers=rerankers)
            for i, best in zip(which, hyps, strict=True):
                texts[int(i)] = self.detokenize(list(best[0].tokens)) if best else ""
        return texts

    def scores(self, arg_params: dict[str, Any], aux_params: dict[str, Any]) -> dict[str, float]:
        """The metrics by name, in the order asked, under these parameters."""
        outputs = self.outputs(arg_params, aux_params)
        references = [list(source.references) for source in self.sources]
        return decoding_scores(self.names, outputs, references, self.info.tokens)

    def __call__(self, module: Any) -> dict[str, float]:
        """The metrics under ``module``'s current parameters (copies read with
        ``get_params()``: training's arrays are not touched)."""
        return self.scores(*module.get_params())
