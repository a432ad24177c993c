"""What the encoder-decoder models share: the ``sym_gen`` object with its training, encoder and
decoder-step graphs, embeddings, the output layer and the loss.

A model subclasses :class:`Seq2SeqSymGen` and says how to encode a source, how to decode all
target positions at once (teacher forcing, for training) and how to decode one position from
carried states (for search). The three graphs are built from those same pieces, so they share
every parameter name, and a training checkpoint loads into the encoder and step graphs
unchanged.

Inputs (batch-major): ``source`` (N, S) token ids padded with ``pad_id`` after the tokens,
``target`` (N, T) decoder inputs ``<bos> w1 .. wm``, label ``target_label`` (N, T) ``w1 .. wm
<eos>``. Output 0 of the training graph, ``softmax_output``, is (N * T, V) probabilities (row
n * T + t); positions labelled ``pad_id`` give no gradient. There is no
``without_probabilities`` variant (the language models' graph for metrics that read the loss):
SoftmaxOutput's forward is the probabilities, so leaving them out would save nothing.
"""

from __future__ import annotations

from typing import Any, Protocol

import mxnet as mx

from mxtrain.data.base import DataInfo
from mxtrain.errors import InvalidValue
from mxtrain.models.rnn_common import check_sizes

#: added to the attention score of a position that must get no weight: exp(-1e9 + score)
#: underflows to exactly 0 in float32, so masked positions contribute nothing, not little
MASKED_SCORE = -1e9


def check_seq2seq_key(model: str, bucket_key: Any) -> tuple[int, int]:
    """The (source length, target length) a bucket key stands for, or ``InvalidValue``."""
    if (
        not isinstance(bucket_key, tuple | list)
        or len(bucket_key) != 2
        or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in bucket_key)
    ):
        raise InvalidValue(
            model,
            f"bucket keys are (source length, target length) pairs, got {bucket_key!r} "
            "(use a parallel-data iterator such as parallel_text)",
        )
    return int(bucket_key[0]), int(bucket_key[1])


def real_tokens(ids: Any, pad_id: int) -> Any:
    """1 where ``ids`` holds a token, 0 at padding (same shape, float)."""
    # ids are non-negative, so with pad id 0 clip(ids, 0, 1) is ids != 0, in an operator ONNX
    # export can convert
    return mx.sym.clip(ids, 0, 1) if pad_id == 0 else ids != pad_id


def source_mask_bias(source: Any, pad_id: int) -> Any:
    """(N, S): 0 at the source's tokens, MASKED_SCORE at its padding (added to scores)."""
    return (1 - real_tokens(source, pad_id)) * MASKED_SCORE


def masked_softmax(scores: Any, bias: Any) -> Any:
    """softmax over the last axis of ``scores + bias`` (``bias`` broadcast onto ``scores``)."""
    return mx.sym.softmax(mx.sym.broadcast_add(scores, bias), axis=-1)


def smoothed_softmax_loss(logits: Any, label: Any, pad_id: int, label_smoothing: float) -> Any:
    """SoftmaxOutput over (M, V) ``logits`` and (M,) labels, named ``softmax``.

    Its forward output is the probabilities; backward sends p - q to each row, q the
    smoothed target (1 - alpha at the label, alpha / (V - 1) elsewhere: the gradient of the
    cross-entropy -sum q log p), and nothing to rows labelled ``pad_id``. The loss is summed,
    not divided by each executor's own count of real labels ("valid"), so that a batch split
    over devices or workers sums to the gradient of the whole batch; the optimizer's
    rescale_grad = 1 / (batch x workers) averages it over the pairs, as for the other models.
    """
    return mx.sym.SoftmaxOutput(
        logits,
        label,
        use_ignore=True,
        ignore_label=pad_id,
        smooth_alpha=label_smoothing,
        normalization="null",
        name="softmax",
    )


class Seq2SeqOptions(Protocol):
    """What the options of every encoder-decoder model declare (read-only: frozen
    dataclasses)."""

    @property
    def tie_embeddings(self) -> bool: ...
    @property
    def share_embeddings(self) -> bool: ...
    @property
    def label_smoothing(self) -> float: ...


class Seq2SeqSymGen:
    """``sym_gen`` of an encoder-decoder model, with its inference graphs.

    ``sym_gen((S, T))`` -> ``(symbol, ("source", "target"), ("target_label",))``, the
    teacher-forced graph; :meth:`encoder`, :meth:`decoder_step` and :meth:`input_shapes` give
    what step-by-step decoding binds. Subclasses set ``model``, ``static_names``,
    ``state_names`` and ``output_width`` and implement ``encode``, ``decode_all``,
    ``decode_one`` and ``carried_shapes``.
    """

    model = "seq2seq"
    #: arrays the encoder computes once and every decoder step reads unchanged
    static_names: tuple[str, ...] = ()
    #: arrays the decoder steps carry: the encoder's are the initial ones
    state_names: tuple[str, ...] = ()

    options: Seq2SeqOptions

    def __init__(
        self, options: Seq2SeqOptions, data_info: DataInfo, *, num_embed: int, output_width: int
    ) -> None:
        """``num_embed``: the embeddings' width; ``output_width``: the output layer's input
        width."""
        self.options = options
        self.source_vocab, self.target_vocab = check_sizes(self.model, data_info)
        if data_info.pad_id is None:
            raise InvalidValue(
                self.model, "needs the data iterator's pad_id (use the parallel_text iterator)"
            )
        self.pad_id = int(data_info.pad_id)
        shared = options.share_embeddings
        if shared and (
            not getattr(data_info, "shared_vocab", False) or self.source_vocab != self.target_vocab
        ):
            raise InvalidValue(
                "share_embeddings",
                "needs one vocabulary for source and target: set shared_vocab: true in the "
                "data section, or share_embeddings: false",
            )
        self.num_embed = num_embed
        self.output_width = output_width
        # one variable when shared: two of one name would be two parameters to MXNet
        source = mx.sym.Variable("embed_weight" if shared else "source_embed_weight")
        target = source if shared else mx.sym.Variable("target_embed_weight")
        self.embed_weights = {
            "source": (source, self.source_vocab),
            "target": (target, self.target_vocab),
        }
        #: the parameter that embeds the source words (model.pretrained_embedding fills it)
        self.word_embedding = source.name

    # -- what each model provides ---------------------------------------------------------

    def encode(self, source: Any, seq_len: int, max_steps: int | None) -> dict[str, Any]:
        """{name: symbol} for every name of ``static_names`` and, when ``max_steps`` is given
        (or the model's states do not depend on it), of ``state_names``."""
        raise NotImplementedError

    def decode_all(self, target: Any, seq_len: int, encoded: dict[str, Any]) -> Any:
        """The output layer's input at every target position, (N * T, output_width)."""
        raise NotImplementedError

    def decode_one(
        self, prev_token: Any, step: Any, inputs: dict[str, Any], max_steps: int
    ) -> tuple[Any, list[Any]]:
        """(output layer's input (N, output_width), new states in ``state_names`` order)."""
        raise NotImplementedError

    def carried_shapes(self, seq_len: int, batch: int, max_steps: int) -> dict[str, tuple]:
        """Shapes of every static and state array."""
        raise NotImplementedError

    # -- shared pieces ----------------------------------------------------------------------

    def embed(self, ids: Any, side: str) -> Any:
        """(N, ...) ids of ``side`` (``source`` or ``target``) -> (N, ..., num_embed)."""
        weight, vocab = self.embed_weights[side]
        return mx.sym.Embedding(
            ids, weight=weight, input_dim=vocab, output_dim=self.num_embed, name=f"{side}_embed"
        )

    def output_logits(self, hidden: Any) -> Any:
        """(M, output_width) -> (M, target vocabulary) logits; tied: weights are the target
        embedding's."""
        tied = {"weight": self.embed_weights["target"][0]} if self.options.tie_embeddings else {}
        return mx.sym.FullyConnected(hidden, num_hidden=self.target_vocab, name="output", **tied)

    # -- the contract -------------------------------------------------------------------------

    def __call__(self, bucket_key: Any) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
        source_len, target_len = check_seq2seq_key(self.model, bucket_key)
        encoded = self.encode(mx.sym.Variable("source"), source_len, None)
        hidden = self.decode_all(mx.sym.Variable("target"), target_len, encoded)
        label = mx.sym.reshape(mx.sym.Variable("target_label"), shape=(-1,))
        loss = smoothed_softmax_loss(
            self.output_logits(hidden), label, self.pad_id, self.options.label_smoothing
        )
        return loss, ("source", "target"), ("target_label",)

    def encoder(self, seq_len: int, max_steps: int | None = None) -> Any:
        """The encoder graph for sources of ``seq_len`` positions: input ``source`` (N, S);
        outputs the ``static_names`` arrays, then the initial ``state_names`` arrays.
        ``max_steps``: what :meth:`decoder_step` is built with, for models whose carried
        states are sized by it (the Transformer's caches); the RNN ignores it."""
        encoded = self.encode(mx.sym.Variable("source"), seq_len, max_steps)
        missing = [n for n in self.state_names if n not in encoded]
        if missing:
            raise ValueError(
                f"{self.model}: encoder() needs max_steps to size its states {missing}"
            )
        return mx.sym.Group([encoded[n] for n in (*self.static_names, *self.state_names)])

    def decoder_step(self, seq_len: int, max_steps: int) -> Any:
        """One decoder position for sources of ``seq_len``: inputs ``prev_token`` (N,),
        ``step`` (1,) (0-based position), the static and state arrays; outputs log_probs
        (N, V), then the new states in ``state_names`` order."""
        del seq_len  # the shapes come from the inputs; kept for the contract's signature
        inputs = {n: mx.sym.Variable(n) for n in (*self.static_names, *self.state_names)}
        prev_token, step = mx.sym.Variable("prev_token"), mx.sym.Variable("step")
        hidden, states = self.decode_one(prev_token, step, inputs, max_steps)
        log_probs = mx.sym.log_softmax(self.output_logits(hidden), axis=-1, name="log_probs")
        return mx.sym.Group([log_probs, *states])

    def input_shapes(self, seq_len: int, batch: int, max_steps: int) -> dict[str, tuple]:
        """Shape of every :meth:`decoder_step` input, to bind it before any encoder runs."""
        return {
            "prev_token": (batch,),
            "step": (1,),
            **self.carried_shapes(seq_len, batch, max_steps),
        }
