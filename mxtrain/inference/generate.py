"""``mxtrain predict --task generate``: language models continue each prompt (issue 30).

Each input line is a prompt, read by the run's predict iterator (as ``predict`` reads lines
for scoring). The continuation is chosen greedily (``--beam-size 1``, the default), by beam
search (``--beam-size K``) or by sampling (``--sample``, ``--temperature``, ``--top-k``,
``--top-p``, ``--seed``), token by token, until ``<eos>`` or ``--max-tokens`` tokens
(:mod:`mxtrain.decoding.search`).

Recurrent state: the model is built as for a stream (``data_info.stream``), so its recurrent
layers take their begin states as inputs and give their final states as outputs
(``sym_gen.states``; ``lstm_lm`` and ``gru_lm`` do). The prompt but its last token runs once
through the graph of its length; then a one-position graph steps on the carried states, the
first step reading the prompt's last token. Starting from zero states this is the same
computation as the sentence graph the model was trained with. A model that gives no state
outputs (a plugin's) is run on the whole prefix, prompt and output so far, at every step:
correct but slower, binding a graph per length.

Prompts are batched by length (the iterator's batch size, on the run's first device), so no
padding enters a prompt's state. A blank line (no tokens) has nothing to continue: its record
has null values.

One record per input line: ``{"line", "prompt", "output", "tokens", "log_likelihood"}``:
``prompt`` as the model read it (unknown words as ``<unk>``), ``output`` the continuation
without the prompt (and without the ``<eos>`` that ended it), ``tokens`` its number of tokens,
``log_likelihood`` the natural-log probability the model gives them, the final ``<eos>``
included (with sampling too: the model's own probabilities, not the tempered ones). With
beam search and ``--nbest N`` > 1, ``nbest`` lists the N best with their ``score``
(log_likelihood / GNMT length penalty).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from mxtrain.data.base import DataInfo
from mxtrain.decoding.device import DeviceScores, repeat_rows, take_rows
from mxtrain.decoding.search import DecodeOptions, Hypothesis, decode, rows_per_input
from mxtrain.errors import ConfigError
from mxtrain.inference.decode import DecodedLines, batch_lines, graphs_fit
from mxtrain.inference.open import OpenedRun
from mxtrain.inference.output import finite_or_none

log = logging.getLogger("mxtrain")

#: the smallest probability whose log is taken (a probability that underflows to 0)
PROBABILITY_FLOOR = 1e-30
#: prompts per batch when the iterator does not say
DEFAULT_BATCH = 32
LABEL = "softmax_label"  # the LM graph's label input


class GeneratedText(DecodedLines):
    """Continuations per prompt line (see the module docstring)."""

    LINE_FIELDS = (("prompt", "text"),)
    HYPOTHESIS_FIELDS = (
        ("output", "text"),
        ("tokens", "<i8"),
        ("log_likelihood", "<f8"),
        ("score", "<f8"),
    )

    def __init__(
        self,
        prompts: list[str | None],
        hypotheses: list[list[Hypothesis] | None],
        texts: list[list[str] | None],
        nbest: int,
    ) -> None:
        super().__init__(hypotheses, texts, nbest)
        self.prompts = prompts

    def line_fields(self, i: int) -> dict[str, Any]:
        return {"prompt": self.prompts[i]}

    def hypothesis_fields(self, hypothesis: Hypothesis, text: str) -> dict[str, Any]:
        return {
            "output": text,
            "tokens": len(hypothesis.tokens),
            "log_likelihood": finite_or_none(hypothesis.log_prob),
            "score": finite_or_none(hypothesis.score),
        }

    def records(self) -> Iterator[dict[str, Any]]:
        for record in super().records():
            record.pop("score")  # the best's score is in nbest; greedy and sampling have none
            yield record

    def totals(self) -> tuple[int, int, int, float]:
        """(lines, blank lines, generated tokens (<eos> included), their log-likelihood)."""
        done = [h[0] for h in self.hypotheses if h]
        return (
            len(self.hypotheses),
            len(self.hypotheses) - len(done),
            sum(h.length for h in done),
            float(sum(h.log_prob for h in done)),
        )


class StatefulLmSteps:
    """The :class:`~mxtrain.decoding.search.StepModel` of a batch of same-length prompts on a
    model with recurrent state inputs and outputs."""

    def __init__(
        self, runner: Any, states: dict[str, int], axes: dict[str, int], prompts: np.ndarray,
        rows: int,
    ) -> None:  # fmt: skip
        self.runner, self.names = runner, list(states)
        self.outputs = [states[n] for n in self.names]
        self.axes = [axes[n] for n in self.names]
        inputs, length = prompts.shape
        self.rows = inputs * rows
        carried = self._zero_states(inputs)  # given: a bound graph keeps its last inputs
        if length > 1:  # the prompt but its last token: the first step reads that one
            given = lm_inputs(prompts[:, :-1])
            given.update(zip(self.names, carried, strict=True))
            out = runner.forward(("lm", length - 1, inputs), given)
            carried = [out[i] for i in self.outputs]
        self.states = repeat_rows(carried, rows, self.axes)

    def _zero_states(self, inputs: int) -> list[Any]:
        # deferred: MXNet reads its thread settings when it loads (devices.configure_threads)
        import mxnet as mx

        given = {name: a.shape for name, a in lm_inputs(np.zeros((inputs, 1))).items()}
        shapes = self.runner.argument_shapes(("lm", 1, inputs), given)
        return [mx.nd.zeros(shapes[n], ctx=self.runner.context) for n in self.names]

    def step(self, prev_tokens: np.ndarray, position: int) -> DeviceScores:
        inputs = lm_inputs(prev_tokens.reshape(-1, 1))
        inputs.update(zip(self.names, self.states, strict=True))
        out = self.runner.forward(("lm", 1, self.rows), inputs)
        self.states = [out[i] for i in self.outputs]
        return DeviceScores(_log(out[0]))

    def reorder(self, rows: np.ndarray) -> None:
        self.states = take_rows(self.states, rows, self.axes)
        self.rows = rows.size


class PrefixLmSteps:
    """The step model of a language model without state outputs: the whole prefix runs
    through the graph of its length at every step."""

    def __init__(self, runner: Any, prompts: np.ndarray, rows: int) -> None:
        self.runner = runner
        self.prefix = np.repeat(prompts[:, :-1], rows, axis=0).astype(np.float32)

    def step(self, prev_tokens: np.ndarray, position: int) -> DeviceScores:
        self.prefix = np.concatenate([self.prefix, prev_tokens.reshape(-1, 1)], axis=1)
        rows, length = self.prefix.shape
        out = self.runner.forward(("lm", length, rows), lm_inputs(self.prefix))[0]
        # rows are batch-major: row r's last position is r * length + length - 1
        last = out.reshape((rows, length, -1))[:, length - 1, :]
        return DeviceScores(_log(last))

    def reorder(self, rows: np.ndarray) -> None:
        self.prefix = self.prefix[rows]


def lm_inputs(tokens: np.ndarray) -> dict[str, np.ndarray]:
    """A language-model graph's inputs for (rows, length) token ids: the labels are zeros
    (``<pad>``: the loss output is not read)."""
    data = tokens.astype(np.float32)
    return {"data": data, LABEL: np.zeros_like(data)}


def _log(probabilities: Any) -> Any:
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads)
    import mxnet as mx

    return mx.nd.log(mx.nd.maximum(probabilities, PROBABILITY_FLOOR))


def read_prompts(data_iter: Any, pad: int) -> dict[int, np.ndarray]:
    """Each line's token ids (0-based line -> int64 ids), from the predict iterator's rows."""
    prompts: dict[int, np.ndarray] = {}
    data_iter.reset()
    for batch in data_iter:
        lines = batch_lines(batch, "prompt")
        data = np.rint(batch.data[0].asnumpy()).astype(np.int64)
        for row, line in zip(data, lines, strict=True):
            if line >= 0:
                prompts[int(line)] = row[row != pad]
    return prompts


def stateful_sym_gen(opened: OpenedRun, info: Any) -> Any:
    """The run's model built as for a stream (state inputs and outputs) when its data info
    allows it, else as trained."""
    # deferred: import cost (the model registry and builders)
    from mxtrain.build import build_sym_gen

    config = opened.config
    if isinstance(info, DataInfo):
        stream = dataclasses.replace(info, stream=True)
        sym_gen = build_sym_gen(config.model, stream, config.base_dir)
        if getattr(sym_gen, "states", None):
            return sym_gen
    return build_sym_gen(config.model, info, config.base_dir)


class LmGenerator:
    """Continues prompts with one model: its graphs bound by a GraphRunner on one device."""

    def __init__(self, sym_gen: Any, arg_params: Any, aux_params: Any, context: Any) -> None:
        # deferred: MXNet reads its thread settings when it loads (devices.configure_threads)
        from mxtrain.engine.graph_runner import GraphRunner
        from mxtrain.engine.shapes import batch_axis

        self.sym_gen = sym_gen
        names = getattr(sym_gen, "states", None) or {}
        symbol = sym_gen(1)[0]
        outputs = symbol.list_outputs()
        self.states = {n: outputs.index(o) for n, o in names.items()}
        attrs = symbol.attr_dict()
        self.axes = {n: max(batch_axis(attrs.get(n, {}).get("__layout__")), 0) for n in names}

        def symbol_for(key: tuple[Any, ...]) -> Any:
            return sym_gen(key[1])[0]

        self.runner = GraphRunner(symbol_for, arg_params, aux_params, context, zeros=tuple(names))

    @property
    def carries_state(self) -> bool:
        return bool(self.states)

    def steps(self, prompts: np.ndarray, rows: int, carry_state: bool = True) -> Any:
        """The step model of a batch of same-length prompts (N, L), ``rows`` per prompt."""
        if carry_state and self.states:
            return StatefulLmSteps(self.runner, self.states, self.axes, prompts, rows)
        return PrefixLmSteps(self.runner, prompts, rows)

    def continue_prompts(
        self,
        prompts: dict[int, np.ndarray],
        options: DecodeOptions,
        *,
        eos: int,
        banned: Sequence[int],
        batch_size: int,
        carry_state: bool = True,
    ) -> dict[int, list[Hypothesis]]:
        """Hypotheses per line of every non-empty prompt, batched by prompt length."""
        found: dict[int, list[Hypothesis]] = {}
        order = sorted((len(ids), line) for line, ids in prompts.items() if len(ids))
        rows = rows_per_input(options)
        start = 0
        while start < len(order):
            length = order[start][0]
            end = start
            while end < len(order) and order[end][0] == length and end - start < batch_size:
                end += 1
            lines = [line for _, line in order[start:end]]
            batch = np.stack([prompts[line] for line in lines]).astype(np.float32)
            model = self.steps(batch, rows, carry_state)
            hyps = decode(
                model,
                batch[:, -1].astype(np.int64),
                np.full(len(lines), options.max_tokens, dtype=np.int64),
                options,
                eos=eos,
                banned=banned,
                lines=lines,
            )
            found.update(zip(lines, hyps, strict=True))
            start = end
        return found


def generate_text(opened: OpenedRun, options: DecodeOptions) -> GeneratedText:
    """Continue every line of ``opened``'s predict iterator (see the module docstring)."""
    data_iter = opened.data_iter
    info = data_iter.data_info
    vocab = getattr(data_iter, "vocab", None)
    if vocab is None or info.pad_id is None:
        raise ConfigError(
            "--task generate needs the run's data iterator to have a vocabulary and a pad id "
            "(bucket_sentence and bptt_stream do).",
        )
    if getattr(info, "char_vocab_size", None):
        raise ConfigError(
            "--task generate does not run character-aware language models (model.char_embed) "
            "yet: each generated word's characters would have to be fed back.",
            hint="Score or list next words (predict without --task), or generate with a model "
            "trained with char_embed: 0.",
        )
    tokens = vocab.tokens
    joiner = "" if getattr(data_iter, "level", "word") == "char" else " "
    prompts = read_prompts(data_iter, info.pad_id)
    count = int(getattr(data_iter, "num_sentences", None) or max(prompts, default=-1) + 1)

    sym_gen = stateful_sym_gen(opened, info)
    args, auxs = opened.params()
    generator = LmGenerator(sym_gen, args, auxs, opened.contexts[0])
    if not generator.carries_state:
        log.warning(
            "the model gives no recurrent state outputs: every step recomputes the whole "
            "prefix (slower)"
        )
    with graphs_fit(opened.params_file):
        found = generator.continue_prompts(
            prompts,
            options,
            eos=vocab.eos_id,
            banned=(info.pad_id,),
            batch_size=int(getattr(data_iter, "batch_size", None) or DEFAULT_BATCH),
        )

    def text(ids: Sequence[int] | np.ndarray) -> str:
        return joiner.join(tokens[i] for i in ids)

    hypotheses = [found.get(i) for i in range(count)]
    return GeneratedText(
        [text(prompts[i]) if i in prompts and len(prompts[i]) else None for i in range(count)],
        hypotheses,
        [None if h is None else [text(x.tokens) for x in h] for h in hypotheses],
        options.nbest,
    )
