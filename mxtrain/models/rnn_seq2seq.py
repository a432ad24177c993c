"""The attentional LSTM encoder-decoder ``rnn_seq2seq``.

Encoder: source embedding -> ``num_layers`` bidirectional LSTM layers of ``encoder_hidden``
(default ``num_hidden``) units per direction (fused operators; the right-to-left direction
starts at each row's last real token, :func:`rnn_layers`) -> a linear projection of the two
directions to ``num_hidden``: the memory attention reads.
The decoder's initial state: h = tanh(W mean(memory over the real source positions)) for each
layer, c = 0.

Decoder: target embedding -> ``num_layers`` LSTM layers (one fused operator over all target
positions) -> attention over the memory, padding masked out (``dot``: h . m, ``general``:
h . W m, ``mlp``: v . tanh(W h + U m)) -> the attentional state tanh(W_c [context; h]) ->
output layer -> softmax. By default the attentional state is not fed back into the next
step's input, so the recurrent layers of all target positions run as one operator in
training, which makes training fast. With ``input_feeding`` (Luong et al. 2015) each position's
decoder input is [target embedding; previous attentional state] (zeros at the first), so the
decoder knows where it attended; training then runs the recurrent layers and the attention
one position at a time. A decoder step (:meth:`RnnSeq2SeqSymGen.decoder_step`) is the same
fused operator over one position, its begin states the carried ones (and the fed-back
attentional state, ``decoder_feed``) and its final states the new ones, then the same
attention. The recurrent layers are always fused RNN operators (CPU and GPU; no unfused
variant).

Parameters: ``source_embed_weight`` and ``target_embed_weight`` (``embed_weight`` when shared),
``encoder_l{i}_parameters`` / ``encoder_r{i}_parameters`` (each direction of layer i),
``encoder_proj_{weight,bias}``, ``decoder_init_{weight,bias}``, ``decoder_parameters``,
``attention_key_weight`` (general, mlp), ``attention_query_{weight,bias}`` and
``attention_score_weight`` (mlp), ``attention_out_weight``, ``output_bias`` and
``output_weight`` (not when tied: the output layer reads the target embedding).
"""

from __future__ import annotations

from typing import Any

import mxnet as mx

from mxtrain.data.base import DataInfo
from mxtrain.models.rnn_common import RecurrentStack, concat_last_axis, rnn_layers
from mxtrain.models.seq2seq_common import (
    Seq2SeqSymGen,
    masked_softmax,
    real_tokens,
    source_mask_bias,
)
from mxtrain.models.seq2seq_options import RnnSeq2SeqOptions


def tanh(x: Any) -> Any:
    """tanh through ``Activation``, which MXNet 1.9.1 runs with oneDNN's vectorized kernel:
    6.2x faster forward and 2.4x forward and backward than the elementwise ``tanh`` operator's
    scalar loop, on a (320, 1, 9, 256) array on one Zen 3 core (the values agree within
    float32 rounding)."""
    return mx.sym.Activation(x, act_type="tanh")


class RnnSeq2SeqSymGen(Seq2SeqSymGen):
    """``sym_gen`` of ``rnn_seq2seq`` (module docstring). Statics: ``encoder_memory`` (N, S,
    H), ``attention_keys`` (N, S, H; not with dot attention: the memory is the keys) and
    ``source_bias`` (N, S); states ``decoder_hidden`` and ``decoder_cell`` (N, layers, H),
    and with input feeding ``decoder_feed`` (N, output width), the last attentional state."""

    model = "rnn_seq2seq"

    options: RnnSeq2SeqOptions

    def __init__(self, options: RnnSeq2SeqOptions, data_info: DataInfo) -> None:
        # tied: the attentional layer is as wide as the embedding the output layer reads
        width = options.num_embed if options.tie_embeddings else options.num_hidden
        super().__init__(options, data_info, num_embed=options.num_embed, output_width=width)
        keys = () if options.attention == "dot" else ("attention_keys",)
        self.static_names = ("encoder_memory", *keys, "source_bias")
        feed = ("decoder_feed",) if options.input_feeding else ()
        self.state_names = ("decoder_hidden", "decoder_cell", *feed)
        self._variables: dict[str, Any] = {}

    def _dropout(self, x: Any, name: str) -> Any:
        p = self.options.dropout
        return mx.sym.Dropout(x, p=p, name=name) if p > 0 else x

    def encode(self, source: Any, seq_len: int, max_steps: int | None) -> dict[str, Any]:
        opts = self.options
        real = real_tokens(source, self.pad_id)
        lengths = mx.sym.sum(real, axis=1, name="source_lengths")
        x = self._dropout(self.embed(source, "source"), "source_embed_dropout")
        width = opts.encoder_hidden or opts.num_hidden  # per direction
        stack = RecurrentStack(
            "lstm", width, opts.num_layers, opts.dropout, fused=True, prefix="encoder_"
        )
        x = rnn_layers(x, seq_len, stack, bidirectional=True, lengths=lengths)
        memory = mx.sym.FullyConnected(
            x, num_hidden=opts.num_hidden, flatten=False, name="encoder_proj"
        )
        encoded = {"encoder_memory": memory, "source_bias": source_mask_bias(source, self.pad_id)}
        if opts.attention != "dot":
            encoded["attention_keys"] = self._attention_keys(memory)
        # the mean over real positions (an empty source: over none, giving 0, not NaN)
        total = mx.sym.sum(mx.sym.broadcast_mul(memory, mx.sym.expand_dims(real, axis=2)), axis=1)
        mean = mx.sym.broadcast_div(total, mx.sym.reshape(mx.sym.maximum(lengths, 1), (-1, 1)))
        init = mx.sym.FullyConnected(
            mean, num_hidden=opts.num_layers * opts.num_hidden, name="decoder_init"
        )
        hidden = mx.sym.reshape(tanh(init), shape=(0, opts.num_layers, opts.num_hidden))
        encoded["decoder_hidden"] = hidden
        encoded["decoder_cell"] = mx.sym.zeros_like(hidden)
        if opts.input_feeding:
            # (N, output width) zeros, N read from the source
            first = mx.sym.slice_axis(real, axis=1, begin=0, end=1)
            encoded["decoder_feed"] = mx.sym.tile(
                mx.sym.zeros_like(first), reps=(1, self.output_width)
            )
        return encoded

    def _attention_keys(self, memory: Any) -> Any:
        """(N, S, H) memory -> the keys ``general`` and ``mlp`` attention read: U m, doubled for
        ``mlp`` (the sigmoid form of its energies, :meth:`_attentional`), once per batch."""
        keys = mx.sym.FullyConnected(
            memory,
            num_hidden=self.options.num_hidden,
            no_bias=True,
            flatten=False,
            name="attention_key",
        )
        return 2 * keys if self.options.attention == "mlp" else keys

    def _decoder_rnn(self) -> Any:
        """The decoder's fused LSTM layers (one ``decoder_parameters`` array however often
        the cell is unrolled)."""
        opts = self.options
        return mx.rnn.FusedRNNCell(
            opts.num_hidden,
            num_layers=opts.num_layers,
            mode="lstm",
            dropout=opts.dropout,
            get_next_state=True,
            prefix="decoder_",
        )

    def _decoder_layers(
        self, x: Any, seq_len: int, begin: list[Any], rnn: Any = None
    ) -> tuple[Any, Any]:
        """(T, N, E) inputs and [h, c] begin states, (layers, N, H) each -> (N, T, H) outputs
        and the final [h, c], (layers, N, H) each."""
        rnn = rnn or self._decoder_rnn()
        out, finals = rnn.unroll(
            seq_len, inputs=x, begin_state=begin, layout="TNC", merge_outputs=True
        )
        return mx.sym.swapaxes(out, dim1=0, dim2=1), finals

    def _weights(self, *names: str) -> dict[str, Any]:
        """``weight``/``bias`` arguments of a layer the decoder applies at every position: one
        variable of each name, since two of one name would be two parameters to MXNet."""
        for name in names:
            self._variables.setdefault(name, mx.sym.Variable(name))
        return {name.rsplit("_", 1)[1]: self._variables[name] for name in names}

    def _attentional(self, queries: Any, inputs: dict[str, Any]) -> Any:
        """(N, Tq, H) decoder outputs -> (N, Tq, output_width) tanh(W_c [context; h])."""
        opts = self.options
        memory = inputs["encoder_memory"]
        if opts.attention == "mlp":
            projected = mx.sym.FullyConnected(
                queries,
                num_hidden=opts.num_hidden,
                flatten=False,
                name="attention_query",
                **self._weights("attention_query_weight", "attention_query_bias"),
            )
            # v . tanh(x) = 2 v . sigmoid(2 x) - sum(v), and the last term, the same at every
            # source position, leaves the softmax over them unchanged: the sigmoid form is the
            # same attention, and MXNet 1.9.1's oneDNN sigmoid runs 3.5x faster forward and 2x
            # forward and backward than its tanh on one Zen 3 core. The keys come doubled.
            energy = mx.sym.Activation(
                mx.sym.broadcast_add(
                    mx.sym.expand_dims(2 * projected, axis=2),
                    mx.sym.expand_dims(inputs["attention_keys"], axis=1),
                ),
                act_type="sigmoid",
            )  # (N, Tq, S, H)
            scores = mx.sym.FullyConnected(
                energy,
                num_hidden=1,
                no_bias=True,
                flatten=False,
                name="attention_score",
                **self._weights("attention_score_weight"),
            )
            scores = 2 * mx.sym.reshape(scores, shape=(0, 0, 0))
        else:
            keys = memory if opts.attention == "dot" else inputs["attention_keys"]
            scores = mx.sym.batch_dot(queries, keys, transpose_b=True)  # (N, Tq, S)
        weights = masked_softmax(scores, mx.sym.expand_dims(inputs["source_bias"], axis=1))
        context = mx.sym.batch_dot(weights, memory)
        combined = concat_last_axis(context, queries)
        return tanh(
            mx.sym.FullyConnected(
                combined,
                num_hidden=self.output_width,
                no_bias=True,
                flatten=False,
                name="attention_out",
                **self._weights("attention_out_weight"),
            )
        )

    @staticmethod
    def _layers_first(states: dict[str, Any]) -> list[Any]:
        """The carried [h, c], (N, layers, H) each, as the fused operator takes them."""
        return [
            mx.sym.swapaxes(states[n], dim1=0, dim2=1) for n in ("decoder_hidden", "decoder_cell")
        ]

    def decode_all(self, target: Any, seq_len: int, encoded: dict[str, Any]) -> Any:
        x = self._dropout(self.embed(target, "target"), "target_embed_dropout")
        begin = self._layers_first(encoded)
        if self.options.input_feeding:
            hidden = self._decode_fed(x, seq_len, begin, encoded)
        else:
            outputs, _ = self._decoder_layers(mx.sym.swapaxes(x, dim1=0, dim2=1), seq_len, begin)
            hidden = self._attentional(outputs, encoded)
        hidden = mx.sym.reshape(hidden, shape=(-1, self.output_width))
        return self._dropout(hidden, "output_dropout")

    def _decode_fed(self, x: Any, seq_len: int, begin: list[Any], encoded: dict[str, Any]) -> Any:
        """Input feeding in training: (N, T, E) embeddings -> (N, T, output width) attentional
        states, one position at a time, each position's input [embedding; previous state]."""
        rnn = self._decoder_rnn()
        if seq_len > 1:
            steps = mx.sym.split(x, num_outputs=seq_len, axis=1, squeeze_axis=True)
        else:
            steps = [mx.sym.reshape(x, shape=(0, -1))]  # (N, E) each
        feed, states, attended = encoded["decoder_feed"], begin, []
        for t in range(seq_len):
            step_input = mx.sym.concat(steps[t], feed, dim=1)  # 2-D: see concat_last_axis
            step_input = mx.sym.expand_dims(step_input, axis=0)  # (1, N, E + W)
            outputs, states = self._decoder_layers(step_input, 1, states, rnn)
            state = self._attentional(outputs, encoded)  # (N, 1, W)
            feed = mx.sym.reshape(state, shape=(0, -1))
            attended.append(state)
        return mx.sym.concat(*attended, dim=1) if seq_len > 1 else attended[0]

    def decode_one(
        self, prev_token: Any, step: Any, inputs: dict[str, Any], max_steps: int
    ) -> tuple[Any, list[Any]]:
        # the position does not change an RNN's step; reading it (0 * step) keeps the step
        # graph's inputs those of every model
        prev_token = mx.sym.broadcast_add(prev_token, 0 * step)
        x = self.embed(prev_token, "target")  # (N, E)
        if self.options.input_feeding:
            x = mx.sym.concat(x, inputs["decoder_feed"], dim=1)
        x = mx.sym.expand_dims(x, axis=0)  # (1, N, E [+ W])
        outputs, finals = self._decoder_layers(x, 1, self._layers_first(inputs))
        hidden = mx.sym.reshape(self._attentional(outputs, inputs), shape=(-1, self.output_width))
        states = [mx.sym.swapaxes(s, dim1=0, dim2=1) for s in finals]
        return hidden, states + ([hidden] if self.options.input_feeding else [])

    def carried_shapes(self, seq_len: int, batch: int, max_steps: int) -> dict[str, tuple]:
        size, layers = self.options.num_hidden, self.options.num_layers
        shapes = {
            "encoder_memory": (batch, seq_len, size),
            "attention_keys": (batch, seq_len, size),
            "source_bias": (batch, seq_len),
            "decoder_hidden": (batch, layers, size),
            "decoder_cell": (batch, layers, size),
            "decoder_feed": (batch, self.output_width),
        }
        return {n: shapes[n] for n in (*self.static_names, *self.state_names)}


def build_rnn_seq2seq(options: RnnSeq2SeqOptions, data_info: DataInfo) -> RnnSeq2SeqSymGen:
    """The ``sym_gen`` of ``rnn_seq2seq`` (see :class:`RnnSeq2SeqSymGen`)."""
    return RnnSeq2SeqSymGen(options, data_info)
