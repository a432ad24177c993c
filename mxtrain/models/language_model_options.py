"""Options of the recurrent language models ``lstm_lm`` and ``gru_lm`` (no MXNet import:
the config loader and `mxtrain check` read them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mxtrain.errors import InvalidValue
from mxtrain.models import char_options as chars
from mxtrain.models.recurrent_options import (
    CELLS,
    PretrainedEmbedding,
    RecurrentOptions,
    check_dropout,
    check_recurrent_sizes,
    dropout_rate,
    embed_size,
    layer_count,
    pretrained_field,
    state_size,
)
from mxtrain.option_checks import check_choice, documented

#: the loss formulations a language model can train on; ``auto`` is measured per machine
#: (mxtrain.engine.kernels) among LOSS_FORMULATIONS; ``nll`` is the old name of log_softmax;
#: ``one_pass`` trains on a graph that ends at the logits, the engine's softmax head doing the
#: rest (mxtrain.engine.softmax_head), and evaluates with the ``softmax`` graph
LOSSES = ("auto", "softmax", "log_softmax", "softmax_output", "one_pass", "nll")
LOSS_FORMULATIONS = ("softmax", "log_softmax", "softmax_output")
#: the graph formulation ``one_pass`` builds where the graph itself computes the loss
#: (score, predict, export): the same ops as the head's forward
ONE_PASS_GRAPH = "softmax"
#: what an unresolved ``auto`` builds (a library call that skipped the measurement)
UNMEASURED_LOSS = "softmax"
LOSS_DOC = (
    "how the softmax loss is computed (all give the same gradients, softmax - onehot, to float "
    "rounding): softmax: -log(pick(softmax)); log_softmax (old name nll): -pick(log_softmax); "
    "softmax_output: MXNet's classic SoftmaxOutput layer; one_pass: training ends the graph at "
    "the logits and mxtrain writes softmax - onehot into their gradient in one pass (score, "
    "predict and export use the softmax graph); auto: the fastest on this machine, "
    "measured once per CPU and kept, so runs on one machine round alike (the run folder's "
    "kernels.json says which and why; `mxtrain kernels --measure` measures again)"
)
SPARSE_EMBEDDING_DOC = (
    "true: the input word embedding's gradient holds only the rows of the batch's words "
    "(row_sparse), and with sampled_softmax the output layer's weight gradient only the "
    "labels' and sampled words' rows; the optimizer updates only those rows "
    "(optimizer.lazy_update; sgd, adam, adagrad or ftrl). For large vocabularies; needs "
    "tie_weights: false and one device. Plain sgd (no momentum, no weight decay) trains as "
    "with dense gradients; adam's lazy updates leave the moments of absent rows alone"
)
SAMPLED_SOFTMAX_DOC = (
    "0: train with the full softmax; N: train with a sampled softmax over each position's label "
    "and N words drawn per batch (log-uniform: word ids are in frequency order), the opt-in "
    "speed-up for large vocabularies (50k and more); evaluation, score and predict always use "
    "the full softmax, and the training perplexity is the sampled softmax's (not comparable "
    "with the full one's)"
)


@dataclass(frozen=True)
class LmOptions(RecurrentOptions):
    """Sizes and regularisation of a recurrent language model (``lstm_lm``, ``gru_lm``).

    Construction raises ``InvalidValue`` on impossible values; the config loader turns that
    into a ``ConfigError`` pointing at the YAML file and line.
    """

    num_embed: int = embed_size(200)
    num_hidden: int = state_size(200)
    num_layers: int = layer_count(2)
    dropout: float = dropout_rate(
        "dropout after the embedding, between recurrent layers and before the output"
    )
    cell: Literal["auto", "fused", "unfused"] = documented(
        "auto",
        "fused: one RNN operator (CPU and GPU); unfused: one cell per layer and "
        "step; auto: the faster on this machine, measured once per CPU and kept (the two "
        "round differently: runs on one machine match, runs on two CPUs may not; a run "
        "that skipped the measurement: fused)",
    )
    ignore_padding: bool = documented(
        True, "padding positions get no gradient (SoftmaxOutput ignore_label = pad id)"
    )
    loss: Literal["auto", "softmax", "log_softmax", "softmax_output", "one_pass", "nll"] = (
        documented("auto", LOSS_DOC)
    )
    sampled_softmax: int = documented(0, SAMPLED_SOFTMAX_DOC)
    tie_weights: bool = documented(
        False,
        "the output layer uses the embedding matrix as its weights (Press & Wolf "
        "2017: fewer parameters, often a lower perplexity); needs num_embed == num_hidden",
    )
    sparse_embedding: bool = documented(False, SPARSE_EMBEDDING_DOC)
    char_embed: int = chars.char_embed_field()
    char_filters: int = chars.char_filters_field()
    char_kernel: int = chars.char_kernel_field()
    char_max_len: int = chars.char_max_len_field()
    word_embed: bool = chars.word_embed_field()
    pretrained_embedding: PretrainedEmbedding | None = pretrained_field()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        check_recurrent_sizes(self)
        check_dropout(self.dropout)
        check_choice("cell", self.cell, CELLS)
        check_choice("loss", self.loss, LOSSES)
        value = self.sampled_softmax
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidValue(
                "sampled_softmax",
                f"must be 0 (the full softmax) or a number of sampled words, not {value!r}",
            )
        if not isinstance(self.tie_weights, bool):
            raise InvalidValue("tie_weights", f"must be true or false, not {self.tie_weights!r}")
        if self.tie_weights and self.num_embed != self.num_hidden:
            raise InvalidValue(
                "tie_weights",
                f"needs num_embed == num_hidden (the output layer reads num_hidden "
                f"({self.num_hidden}) values per position and the embedding has "
                f"{self.num_embed}); set both to the same size or tie_weights: false",
            )
        chars.check_char_options(self)
        if not isinstance(self.sparse_embedding, bool):
            raise InvalidValue(
                "sparse_embedding", f"must be true or false, not {self.sparse_embedding!r}"
            )
        if self.sparse_embedding and self.tie_weights:
            raise InvalidValue(
                "sparse_embedding",
                "cannot be true with tie_weights: true: the output layer's gradient of the "
                "shared matrix is dense in every row; set tie_weights: false",
            )
        if self.sparse_embedding and not self.word_embed:
            raise InvalidValue(
                "sparse_embedding",
                "needs the word embedding (word_embed: true), which it makes sparse",
            )
        if self.tie_weights and not self.word_embed:
            raise InvalidValue(
                "tie_weights",
                "needs the word embedding (word_embed: true): the output layer reads its matrix",
            )

    @property
    def fused(self) -> bool:
        """Whether the fused RNN operator is used (an unresolved auto: fused, as before
        measuring existed, so old run folders keep their parameter names)."""
        return self.cell in ("auto", "fused")

    @property
    def loss_formulation(self) -> str:
        """The formulation the graph uses: ``loss`` with ``nll`` read as ``log_softmax`` and an
        unresolved ``auto`` as UNMEASURED_LOSS."""
        if self.loss == "nll":
            return "log_softmax"
        if self.loss == "one_pass":
            return ONE_PASS_GRAPH
        return UNMEASURED_LOSS if self.loss == "auto" else self.loss


def check_sampled_count(num_sampled: int, num_classes: int) -> None:
    """Raise ``InvalidValue`` unless ``num_sampled`` words can be drawn from ``num_classes``
    with a saving: fewer than the vocabulary."""
    if num_sampled >= num_classes:
        raise InvalidValue(
            "sampled_softmax",
            f"must be smaller than the vocabulary it samples from ({num_classes:,} words), not "
            f"{num_sampled:,}: set it to a fraction of the vocabulary (a few thousand words "
            f"for 50k and more), or 0 for the full softmax",
        )


@dataclass(frozen=True)
class LstmLmOptions(LmOptions):
    """Sizes and regularisation of the LSTM language model (see :class:`LmOptions`)."""


@dataclass(frozen=True)
class GruLmOptions(LmOptions):
    """Sizes and regularisation of the GRU language model (the options of ``lstm_lm``)."""
