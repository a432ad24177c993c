"""Options of the sequence tagger ``rnn_tagger`` (no MXNet import: the config loader and
`mxtrain check` read them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mxtrain.errors import InvalidValue
from mxtrain.models import char_options as chars
from mxtrain.models import recurrent_options as recurrent
from mxtrain.option_checks import check_choice, documented


@dataclass(frozen=True)
class RnnTaggerOptions(recurrent.RecurrentOptions):
    """Sizes and regularisation of the sequence tagger.

    Construction raises ``InvalidValue`` on impossible values; the config loader turns that
    into a ``ConfigError`` pointing at the YAML file and line.
    """

    num_embed: int = recurrent.embed_size(100)
    num_hidden: int = recurrent.state_size(100, "state size of each recurrent layer, per direction")
    num_layers: int = recurrent.layer_count(1)
    bidirectional: bool = documented(
        True,
        "read each sentence left-to-right and right-to-left (each up to its own "
        "length, so padding never changes a prediction) and concatenate the states",
    )
    cell: Literal["lstm", "gru"] = documented("lstm", "recurrent cell")
    fused: Literal["auto", "fused", "unfused"] = documented(
        "auto",
        "fused: RNN operators (fast, CPU and GPU; bidirectional: one per layer and "
        "direction); unfused: one cell per layer and step; auto: fused",
    )
    dropout: float = recurrent.dropout_rate()
    char_embed: int = chars.char_embed_field()
    char_filters: int = chars.char_filters_field()
    char_kernel: int = chars.char_kernel_field()
    char_max_len: int = chars.char_max_len_field()
    word_embed: bool = chars.word_embed_field()
    pretrained_embedding: recurrent.PretrainedEmbedding | None = recurrent.pretrained_field()

    def validate(self) -> None:
        """Raise ``InvalidValue`` naming the first impossible value."""
        recurrent.check_recurrent_sizes(self)
        if not isinstance(self.bidirectional, bool):
            raise InvalidValue(
                "bidirectional", f"must be true or false, not {self.bidirectional!r}"
            )
        check_choice("cell", self.cell, recurrent.MODES)
        check_choice("fused", self.fused, recurrent.CELLS)
        recurrent.check_dropout(self.dropout)
        chars.check_char_options(self)

    @property
    def use_fused(self) -> bool:
        """Whether RNN operators are used (auto picks them: they run on CPU and GPU)."""
        return self.fused in ("auto", "fused")
