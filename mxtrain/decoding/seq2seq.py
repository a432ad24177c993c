"""Decoding sequence-to-sequence models step by step: the encoder run once per batch of
sources, the decoder step graph on the carried states (issue 30).

The model's ``sym_gen`` gives an encoder graph and a decoder step graph (``encoder(S,
max_steps)``, ``decoder_step(S, max_steps)``, ``static_names``, ``state_names``,
``input_shapes``: see the issue-30 contract). Per batch of sources the encoder runs once; its
outputs are repeated ``beam`` times along the rows, and the step graph runs once per output
position on the carried states (reordered with ``take`` as hypotheses are kept), never
recomputing earlier positions itself (a Transformer's step reads its key/value caches, which
are states). Both graphs run on one device, bound by :class:`mxtrain.engine.graph_runner.
GraphRunner` with the parameters given to it. ``mxtrain predict`` and the decoding metrics of
fit and score both decode through :func:`decode_sources`.

An **ensemble** of several models (``--ensemble`` of predict and score) decodes with the mean
of their next-token probabilities at each step, ``log((p_1 + ... + p_n) / n)`` (Sockeye's
default "linear" combination): each model runs its own encoder and step graph on its own
states, all reordered together, so the beam search sees one model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mxtrain.decoding.device import DeviceScores, repeat_rows, take_rows
from mxtrain.decoding.search import (
    DecodeOptions,
    Hypothesis,
    decode,
    max_output_lengths,
    rerank,
    rows_per_input,
)
from mxtrain.errors import ConfigError

#: what a seq2seq ``sym_gen`` must have for decoding (the issue-30 contract)
DECODER_PARTS = ("encoder", "decoder_step", "static_names", "state_names", "input_shapes")


@dataclass(frozen=True)
class DecoderModel:
    """One model to decode with: its graphs bound by ``runner`` (a GraphRunner over
    :func:`decoder_graphs` of ``sym_gen``, with the model's parameters)."""

    runner: Any
    sym_gen: Any
    reverse_target: bool = False  # it reads and writes targets last token first


class EncoderDecoderSteps:
    """The :class:`~mxtrain.decoding.search.StepModel` of one batch of sources: the encoder
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
        self.width, self.max_steps, self.rows = width, max_steps, inputs * rows
        self._first = True

    @property
    def key(self) -> tuple[str, int, int, int]:
        """The step graph's key: its executor is bound for this many rows."""
        return ("decoder_step", self.width, self.rows, self.max_steps)

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
        # within their source: only the states follow, unless rows are dropped
        if rows.size != self.rows:
            self.static = take_rows(self.static, rows)
            self.rows = rows.size
            self._first = True  # another executor: give it the static arrays
        self.states = take_rows(self.states, rows)


def mean_probabilities(log_probs: Sequence[Any]) -> Any:
    """``log(mean(exp(log_probs)))`` over the models, elementwise, on their device: the
    log-probabilities of the models' averaged distribution. Shifted by the elementwise
    maximum first, so tokens every model finds unlikely keep finite, exact values."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads)
    import mxnet as mx

    stacked = mx.nd.stack(*log_probs, axis=0)
    top = mx.nd.max(stacked, axis=0)
    shifted = mx.nd.exp(mx.nd.broadcast_sub(stacked, mx.nd.expand_dims(top, axis=0)))
    return top + mx.nd.log(mx.nd.mean(shifted, axis=0))


class EnsembleSteps:
    """The :class:`~mxtrain.decoding.search.StepModel` of several models decoding together:
    each step runs every model's step and scores the mean of their probabilities."""

    def __init__(self, members: Sequence[EncoderDecoderSteps]) -> None:
        self.members = list(members)

    def step(self, prev_tokens: np.ndarray, position: int) -> DeviceScores:
        steps = [member.step(prev_tokens, position) for member in self.members]
        return DeviceScores(mean_probabilities([s.log_probs for s in steps]))

    def reorder(self, rows: np.ndarray) -> None:
        for member in self.members:
            member.reorder(rows)


def decoder_graphs(sym_gen: Any) -> Any:
    """``symbol_for(key)`` of the encoder and step graphs of ``sym_gen``, for a GraphRunner."""

    def symbol_for(key: tuple[Any, ...]) -> Any:
        if key[0] == "encoder":
            return sym_gen.encoder(key[1], key[3])
        return sym_gen.decoder_step(key[1], key[3])

    return symbol_for


def decode_sources(
    models: Sequence[DecoderModel],
    info: Any,
    options: DecodeOptions,
    source: Any,
    lines: Sequence[int] = (),
    rerankers: Sequence[DecoderModel] = (),
) -> list[list[Hypothesis]]:
    """The hypotheses of each row of ``source`` (N, S), ids padded with ``info.pad_id`` (an
    NDArray or a NumPy array), best first, decoded by ``models`` (one, or an ensemble);
    ``lines`` seed the sampler (one per row).

    With ``rerankers`` each of them searches too, with the same beam; every candidate a
    search kept (``beam_size`` each, duplicates once) is then scored by the models and by
    each reranker (teacher-forced, :func:`forced_log_probs`) and ranked by the mean of those
    log-probabilities (:func:`rerank_sources`). The pool holds what either direction found:
    a right-to-left reranker's search finds endings the left-to-right beam dropped early."""
    pad = info.pad_id if info.pad_id is not None else 0
    host = source if isinstance(source, np.ndarray) else source.asnumpy()
    lengths = (host != pad).sum(axis=1)
    ratio = options.max_output_ratio, options.max_output_add
    max_steps = int(max_output_lengths([host.shape[1]], *ratio)[0])
    limits = max_output_lengths(lengths, *ratio)  # <= max_steps
    searched = replace(options, nbest=options.beam_size) if rerankers else options

    def search(searchers: Sequence[DecoderModel]) -> list[list[Hypothesis]]:
        rows = rows_per_input(options)
        steps = [
            EncoderDecoderSteps(m.runner, m.sym_gen, source, rows, max_steps) for m in searchers
        ]
        return decode(
            steps[0] if len(steps) == 1 else EnsembleSteps(steps),
            np.full(host.shape[0], info.bos_id, dtype=np.int64),
            limits,
            searched,
            eos=info.eos_id,
            banned=(pad, info.bos_id),
            lines=list(lines),
        )

    hypotheses = search(models)
    if not rerankers:
        return hypotheses
    ours = reverses(info)
    for reranker in rerankers:
        flip = reranker.reverse_target != ours
        for row, theirs in zip(hypotheses, search([reranker]), strict=True):
            known = {(h.tokens, h.ended) for h in row}
            for h in theirs:
                tokens = h.tokens[::-1] if flip else h.tokens
                if (tokens, h.ended) not in known:
                    known.add((tokens, h.ended))
                    row.append(Hypothesis(tokens, float("nan"), float("nan"), h.ended))
    return rerank_sources(models, rerankers, info, options, source, hypotheses, max_steps)


def reverses(info: Any) -> bool:
    """Whether the data of ``info`` is read right to left (``reverse_target``)."""
    return bool(getattr(info, "reverse_target", False))


def rerank_sources(
    models: Sequence[DecoderModel],
    rerankers: Sequence[DecoderModel],
    info: Any,
    options: DecodeOptions,
    source: Any,
    hypotheses: list[list[Hypothesis]],
    max_steps: int,
) -> list[list[Hypothesis]]:
    """Each row's ``hypotheses`` (a pool: some found by other searches) ranked by the mean of
    the log probabilities ``models`` (the searching model or ensemble) and each of the
    ``rerankers`` give them (teacher-forced: :func:`forced_log_probs`; a right-to-left
    reranker reads each candidate last token first), ``options.nbest`` kept
    (:func:`~mxtrain.decoding.search.rerank`)."""
    rows = max((len(h) for h in hypotheses), default=1)
    candidates = [[h.tokens for h in hyps] for hyps in hypotheses]
    ended = [[h.ended for h in hyps] for hyps in hypotheses]
    ours = reverses(info)
    own = forced_log_probs(models, info, source, candidates, ended, rows, max_steps)
    hypotheses = [
        [replace(h, log_prob=lp) for h, lp in zip(hyps, row, strict=True)]
        for hyps, row in zip(hypotheses, own, strict=True)
    ]
    scores = []
    for reranker in rerankers:
        flip = reranker.reverse_target != ours
        theirs = [[t[::-1] for t in row] for row in candidates] if flip else candidates
        scores.append(forced_log_probs([reranker], info, source, theirs, ended, rows, max_steps))
    return [
        rerank(
            hyps,
            [s[i] for s in scores],
            alpha=options.length_penalty,
            nbest=options.nbest,
        )
        if hyps
        else hyps
        for i, hyps in enumerate(hypotheses)
    ]


def forced_log_probs(
    models: Sequence[DecoderModel],
    info: Any,
    source: Any,
    candidates: Sequence[Sequence[tuple[int, ...]]],
    ended: Sequence[Sequence[bool]],
    rows: int,
    max_steps: int,
) -> list[list[float]]:
    """The log probability ``models`` (one, or an ensemble: the mean of their probabilities
    at each step) give each candidate output of each row of ``source``: the sum of ln p of
    its tokens, and of ``<eos>`` after them where it ``ended``, each read with the
    candidate's own earlier tokens as the decoder's inputs (teacher forcing). At most
    ``rows`` candidates per row, each at most ``max_steps`` positions long (the beam's own
    bounds: the step graphs decoding bound are reused when ``rows`` is the beam)."""
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads)
    import mxnet as mx

    inputs = len(candidates)
    positions = max((len(c) + 1 for row in candidates for c in row), default=1)
    positions = min(positions, max_steps)
    # row r: the labels each position must score, <eos> after an ended candidate
    labels = np.full((inputs * rows, positions), info.eos_id, dtype=np.int64)
    counted = np.zeros(inputs * rows, dtype=np.int64)  # positions that count
    for i, row in enumerate(candidates):
        for k, tokens in enumerate(row[:rows]):
            r = i * rows + k
            labels[r, : len(tokens)] = tokens
            counted[r] = len(tokens) + (1 if ended[i][k] else 0)
    members = [EncoderDecoderSteps(m.runner, m.sym_gen, source, rows, max_steps) for m in models]
    steps = members[0] if len(members) == 1 else EnsembleSteps(members)
    total = np.zeros(inputs * rows, dtype=np.float64)
    previous = np.full(inputs * rows, info.bos_id, dtype=np.int64)
    for position in range(positions):
        log_probs = steps.step(previous, position).log_probs
        index = mx.nd.array(labels[:, position], ctx=log_probs.context)
        picked = mx.nd.pick(log_probs, index, axis=1).asnumpy().astype(np.float64)
        total += np.where(position < counted, picked, 0.0)
        previous = labels[:, position]
    return [
        [float(total[i * rows + k]) for k in range(len(row[:rows]))]
        for i, row in enumerate(candidates)
    ]


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
