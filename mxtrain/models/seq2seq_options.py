"""Options of the encoder-decoder models ``rnn_seq2seq`` and ``transformer_seq2seq`` (no MXNet
import: the config loader and `mxtrain check` read them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mxtrain.errors import InvalidValue
from mxtrain.models import recurrent_options as recurrent
from mxtrain.option_checks import (
    Bounds,
    CheckedOptions,
    check_bool,
    check_bounds,
    check_choice,
    documented,
)

ATTENTION_TYPES = ("dot", "general", "mlp")

LABEL_SMOOTHING_DOC = (
    "share of each target position's probability mass the loss spreads evenly over the other "
    "target words (MXNet's SoftmaxOutput smooth_alpha): the training target is "
    "1 - label_smoothing for the right word and label_smoothing / (V - 1) for each other one; "
    "0: plain cross-entropy"
)
SHARE_EMBEDDINGS_DOC = (
    "source and target use one embedding matrix (needs the data's shared_vocab: true)"
)


def check_label_smoothing(value: object) -> None:
    """Raise ``InvalidValue`` unless ``value`` is a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidValue("label_smoothing", f"must be a number in [0, 1), not {value!r}")
    check_bounds("label_smoothing", value, Bounds(0.0, 1.0, high_open=True))


def check_switches(options: object, *names: str) -> None:
    """Raise ``InvalidValue`` unless each named option is true or false."""
    for name in names:
        check_bool(name, getattr(options, name))


@dataclass(frozen=True)
class RnnSeq2SeqOptions(recurrent.RecurrentOptions):
    """Sizes and regularisation of the attentional LSTM encoder-decoder.

    Construction raises ``InvalidValue`` on impossible values; the config loader turns that
    into a ``ConfigError`` pointing at the YAML file and line.
    """

    num_embed: int = recurrent.embed_size(128)
    num_hidden: int = recurrent.state_size(
        256,
        "state size of the decoder's LSTM layers and of each direction of the encoder's; the "
        "encoder's two directions (2 * num_hidden) are projected to num_hidden for attention",
    )
    num_layers: int = documented(
        1, "LSTM layers of the encoder (each bidirectional) and of the decoder"
    )
    encoder_hidden: int | None = documented(
        None,
        "state size of each direction of the encoder's LSTM layers; null: num_hidden. "
        "Sockeye's bidirectional encoder runs num_hidden / 2 per direction",
    )
    attention: Literal["dot", "general", "mlp"] = documented(
        "mlp",
        "how a decoder state scores each source position: dot: h . m (Luong); general: "
        "h . W m (Luong); mlp: v . tanh(W h + U m) (Bahdanau)",
    )
    dropout: float = recurrent.dropout_rate(
        "dropout after the embeddings, between recurrent layers and before the output layer"
    )
    input_feeding: bool = documented(
        False,
        "feed each step's attentional state into the next step's decoder input (Luong et al. "
        "2015), so the decoder knows what it attended to; the decoder then runs one position "
        "at a time in training (slower), instead of one fused operator over all positions",
    )
    tie_embeddings: bool = documented(
        False,
        "the output layer uses the target embedding matrix as its weights; the attentional "
        "layer then has num_embed units instead of num_hidden, so any sizes can be tied",
    )
    share_embeddings: bool = documented(False, SHARE_EMBEDDINGS_DOC)
    label_smoothing: float = documented(0.0, LABEL_SMOOTHING_DOC)
    pretrained_embedding: recurrent.PretrainedEmbedding | None = recurrent.pretrained_field()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        recurrent.check_recurrent_sizes(self)
        if self.encoder_hidden is not None:
            recurrent.check_size("encoder_hidden", self.encoder_hidden)
        check_choice("attention", self.attention, ATTENTION_TYPES)
        recurrent.check_dropout(self.dropout)
        check_switches(self, "tie_embeddings", "share_embeddings", "input_feeding")
        check_label_smoothing(self.label_smoothing)


@dataclass(frozen=True)
class TransformerSeq2SeqOptions(CheckedOptions):
    """Sizes and regularisation of the pre-norm Transformer encoder-decoder.

    Construction raises ``InvalidValue`` on impossible values; the config loader turns that
    into a ``ConfigError`` pointing at the YAML file and line.
    """

    model_size: int = documented(
        256, "width of embeddings, attention and layer outputs (even: sinusoid positions)"
    )
    num_heads: int = documented(4, "attention heads per attention layer (divides model_size)")
    ffn_size: int = documented(1024, "hidden units of each position-wise feed-forward layer")
    num_layers: int = documented(3, "encoder layers, and decoder layers unless decoder_layers")
    decoder_layers: int = documented(0, "decoder layers; 0: as many as num_layers")
    dropout: float = documented(
        0.1, "dropout after the embeddings, on each sublayer's output and inside the FFN"
    )
    tie_embeddings: bool = documented(
        True, "the output layer uses the target embedding matrix as its weights"
    )
    share_embeddings: bool = documented(False, SHARE_EMBEDDINGS_DOC)
    label_smoothing: float = documented(0.0, LABEL_SMOOTHING_DOC)

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        recurrent.check_layer_sizes(self, "model_size", "num_heads", "ffn_size", "num_layers")
        if self.model_size % 2:
            raise InvalidValue(
                "model_size",
                f"must be even (sinusoid positions use sin and cos halves), not {self.model_size}",
            )
        if self.model_size % self.num_heads:
            raise InvalidValue(
                "num_heads",
                f"must divide model_size ({self.model_size}) into equal heads, not "
                f"{self.num_heads}; choose a divisor of {self.model_size}",
            )
        if self.decoder_layers != 0:
            recurrent.check_size("decoder_layers", self.decoder_layers)
        recurrent.check_dropout(self.dropout)
        check_switches(self, "tie_embeddings", "share_embeddings")
        check_label_smoothing(self.label_smoothing)
        size, ffn = self.model_size, self.ffn_size
        # attention: 4 d x d matrices (self), 4 more per decoder layer (cross); FFN: 2 d x ffn
        per_layer = 4 * size * size + 2 * size * ffn
        estimate = self.num_layers * per_layer + self.decoders * (per_layer + 4 * size * size)
        recurrent.check_parameter_count("model_size", estimate)

    @property
    def decoders(self) -> int:
        """The number of decoder layers (``decoder_layers``, 0 meaning ``num_layers``)."""
        return self.decoder_layers or self.num_layers
