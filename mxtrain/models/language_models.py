"""Language models: embedding -> N-layer LSTM or GRU -> fully connected -> softmax.

Both build one graph (:func:`mxtrain.models.rnn_common.build_rnn_lm`) with their own cell.

Their options: :mod:`mxtrain.models.language_model_options`.
"""

from __future__ import annotations

from mxtrain.data.base import DataInfo
from mxtrain.models.language_model_options import GruLmOptions, LstmLmOptions
from mxtrain.models.rnn_common import SymGen, build_rnn_lm


def build_lstm_lm(options: LstmLmOptions, data_info: DataInfo) -> SymGen:
    """Return ``sym_gen(bucket_key) -> (symbol, ("data",), ("softmax_label",))``.

    Inputs are (batch, time) token ids; the output is (batch * time, num_classes)
    probabilities in batch-major order, named ``softmax``. Parameters: ``embed_weight``,
    ``lstm_parameters`` (fused) or ``lstm_l{i}_{i2h,h2h}_{weight,bias}`` (unfused: the
    names of ``FusedRNNCell.unfuse()``, so ``unfuse().pack_weights(unpack_weights(p))``
    converts fused parameters), ``pred_weight``, ``pred_bias``. The graph is built by
    :func:`mxtrain.models.rnn_common.build_rnn_lm`, shared with ``gru_lm``.
    """
    return build_rnn_lm(options, data_info, model="lstm_lm", mode="lstm")


def build_gru_lm(options: GruLmOptions, data_info: DataInfo) -> SymGen:
    """``sym_gen`` of the GRU language model; the same graph as ``lstm_lm`` with GRU layers.

    Parameters: ``embed_weight``, ``gru_parameters`` (fused) or
    ``gru_l{i}_{i2h,h2h}_{weight,bias}`` (unfused; the names of ``FusedRNNCell.unfuse()``),
    ``pred_weight``, ``pred_bias``.
    """
    return build_rnn_lm(options, data_info, model="gru_lm", mode="gru")
