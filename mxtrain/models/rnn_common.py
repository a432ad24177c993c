"""Graph pieces shared by the recurrent models: recurrent layers, the LM graph, the losses.

Their options live in :mod:`mxtrain.models.recurrent_options` and
:mod:`mxtrain.models.language_model_options`, which do not import MXNet.

Parameter names (``p`` is the prefix, ``lstm_`` or ``gru_``):

* one direction, fused: ``{p}parameters`` (one RNN operator for all layers);
* one direction, unfused: ``{p}l{i}_{i2h,h2h}_{weight,bias}`` per layer ``i``, the names of
  ``FusedRNNCell(prefix=p).unfuse()``, so ``unfuse().pack_weights(unpack_weights(...))``
  converts between the two;
* bidirectional: per layer ``i`` a left-to-right part ``{p}l{i}_`` and a right-to-left part
  ``{p}r{i}_``: fused ``{p}l{i}_parameters`` / ``{p}r{i}_parameters`` (one single-layer RNN
  operator each), unfused ``{p}l{i}_i2h_weight`` etc.

The right-to-left direction reads each sentence reversed up to its own length
(``SequenceReverse`` with the lengths), never the padding after it, so a bidirectional model's
outputs at real positions do not depend on how much padding the bucket adds. (The fused
operator's own ``bidirectional`` mode would read the padding first: its ``use_sequence_length``
is silently ignored on CPU in MXNet 1.9.1.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mxnet as mx

from mxtrain.data.base import DataInfo
from mxtrain.errors import InvalidValue
from mxtrain.models.char_words import char_word_vectors
from mxtrain.models.given_gradient import given_gradient_loss
from mxtrain.models.language_model_options import LOSS_FORMULATIONS, LmOptions, check_sampled_count
from mxtrain.models.recurrent_options import MODES
from mxtrain.option_checks import check_choice

#: what masks a sampled word that is also the position's label (an "accidental hit") out of
#: the sampled softmax: far below any logit, far above float32's range limits
ACCIDENTAL_HIT_PENALTY = 1e9
#: Smallest probability ``softmax`` takes the log of: a label probability that underflows to 0
#: (a logit gap over ~87) gives -log(1e-37) = 85.2 and no gradient instead of inf and NaN.
PROBABILITY_FLOOR = 1e-37

#: the training graph's input (``loss: one_pass``) the module's softmax head writes the
#: logits' gradient into
LOGITS_GRADIENT = "pred_logits_gradient"
SymGen = Callable[[Any], tuple[Any, tuple[str, ...], tuple[str, ...]]]


def one_pass_heads(logits: Any, label: Any) -> list[Any]:
    """The outputs of a ``loss: one_pass`` training graph: the logits, the labels (so that
    they stay an input the module's head reads) and the loss that hands the input
    :data:`LOGITS_GRADIENT` to the logits at backward (engine/softmax_head.py)."""
    return [
        mx.sym.BlockGrad(logits, name="pred_logits"),
        mx.sym.BlockGrad(label, name="label_passthrough"),
        given_gradient_loss(logits, mx.sym.Variable(LOGITS_GRADIENT), name=LOGITS_GRADIENT),
    ]


def one_pass_head_spec(label: str, ignore_label: int | None, probabilities: bool) -> dict[str, Any]:
    """The module's softmax head settings (SoftmaxHeadSpec's fields) for those outputs."""
    return {
        "label": label,
        "gradient_input": LOGITS_GRADIENT,
        "gradient_output": f"{LOGITS_GRADIENT}_loss",
        "ignore_label": ignore_label,
        "probability_floor": PROBABILITY_FLOOR,
        "probabilities": probabilities,
    }


def concat_last_axis(*arrays: Any, name: str | None = None) -> Any:
    """3-D arrays (A, B, C_i) joined along their last axis into (A, B, sum C_i).

    Joined as 2-D (A * B, C_i) arrays: MXNet 1.9.1's CPU ``concat`` of 3-D arrays along the
    last axis is 10-25x slower than the same copy along axis 1 of 2-D arrays (forward and
    backward; e.g. 5.7 against 0.24 ms forward for two (128, 8, 256) arrays on one Zen 3
    core), while the values and gradients are the same."""
    flat = [mx.sym.reshape(a, shape=(-3, 0)) for a in arrays]
    joined = mx.sym.concat(*flat, dim=1)
    return mx.sym.reshape_like(
        joined, arrays[0], lhs_begin=0, lhs_end=1, rhs_begin=0, rhs_end=2, name=name
    )


def check_sizes(model: str, data_info: DataInfo) -> tuple[int, int]:
    """(vocab_size, num_classes) from the data, or ``ValueError`` naming the model."""
    vocab_size, num_classes = data_info.vocab_size, data_info.num_classes
    if not vocab_size or not num_classes or vocab_size < 1 or num_classes < 1:
        raise InvalidValue(
            model,
            f"needs a data iterator that reports vocab_size and num_classes "
            f"(got vocab_size={vocab_size}, num_classes={num_classes})",
        )
    return vocab_size, num_classes


def check_bucket_key(model: str, bucket_key: Any) -> int:
    """The sequence length a bucket key stands for, or ``ValueError``."""
    if isinstance(bucket_key, bool) or not isinstance(bucket_key, int) or bucket_key < 1:
        raise InvalidValue(model, f"bucket keys are sequence lengths, got {bucket_key!r}")
    return bucket_key


def _cell(mode: str, num_hidden: int, prefix: str) -> Any:
    if mode == "lstm":
        return mx.rnn.LSTMCell(num_hidden, prefix=prefix)
    return mx.rnn.GRUCell(num_hidden, prefix=prefix)


@dataclass(frozen=True)
class RecurrentStack:
    """Stacked recurrent layers of one kind, as :func:`rnn_layers` and
    :func:`left_to_right_layers` build them."""

    mode: str  # lstm or gru
    num_hidden: int  # each layer's state size (per direction)
    num_layers: int
    dropout: float  # between layers (0: none)
    fused: bool  # one RNN operator, else one cell per layer and step
    prefix: str  # of the parameter and state input names


def rnn_layers(
    x: Any, seq_len: int, stack: RecurrentStack, *, bidirectional: bool = False, lengths: Any = None
) -> Any:
    """Stacked recurrent layers: ``x`` (batch, time, channels) -> (batch, time, hidden * dirs).

    ``lengths`` (batch,) are the real lengths of the rows (padding at the end), used by the
    right-to-left direction; None: the whole rows.
    """
    if not bidirectional:
        x, _ = left_to_right_layers(x, seq_len, stack, state_inputs=False)
        return x
    mode, num_hidden, num_layers = stack.mode, stack.num_hidden, stack.num_layers
    dropout, fused, prefix = stack.dropout, stack.fused, stack.prefix
    check_choice("mode", mode, MODES)

    def one_way(inputs: Any, cell_prefix: str) -> Any:
        if fused:
            cell = mx.rnn.FusedRNNCell(num_hidden, num_layers=1, mode=mode, prefix=cell_prefix)
        else:
            cell = _cell(mode, num_hidden, cell_prefix)
        out, _ = cell.unroll(seq_len, inputs=inputs, layout="TNC", merge_outputs=True)
        return out

    def reverse(seq: Any, name: str) -> Any:
        if lengths is None:
            return mx.sym.SequenceReverse(seq, name=name)
        return mx.sym.SequenceReverse(
            seq, sequence_length=lengths, use_sequence_length=True, name=name
        )

    x = mx.sym.swapaxes(x, dim1=0, dim2=1)  # (time, batch, channel)
    for i in range(num_layers):
        forward = one_way(x, f"{prefix}l{i}_")
        backward = one_way(reverse(x, f"{prefix}r{i}_reverse_in"), f"{prefix}r{i}_")
        backward = reverse(backward, f"{prefix}r{i}_reverse_out")
        x = concat_last_axis(forward, backward, name=f"{prefix}bi{i}_concat")
        if dropout > 0 and i + 1 < num_layers:
            x = mx.sym.Dropout(x, p=dropout, name=f"{prefix}d{i}_dropout")
    return mx.sym.swapaxes(x, dim1=0, dim2=1)


def state_input_names(mode: str, num_layers: int, fused: bool, prefix: str) -> list[str]:
    """The begin-state inputs of :func:`left_to_right_layers` with ``state_inputs``, in its
    order."""
    per_layer = 2 if mode == "lstm" else 1
    if fused:
        return [f"{prefix}begin_state_{j}" for j in range(per_layer)]
    return [f"{prefix}l{i}_begin_state_{j}" for i in range(num_layers) for j in range(per_layer)]


def left_to_right_layers(
    x: Any, seq_len: int, stack: RecurrentStack, *, state_inputs: bool = False
) -> tuple[Any, dict[str, Any]]:
    """One-direction stacked layers: ``x`` (batch, time, channels) -> ((batch, time, hidden),
    {begin-state input name: final-state symbol}).

    Without ``state_inputs`` the begin states are zeros and the mapping is empty. With it
    they are inputs (:func:`state_input_names`): fused ``{prefix}begin_state_0`` (h) and
    ``_1`` (c, LSTM only), (layers, batch, hidden); unfused ``{prefix}l{i}_begin_state_{j}``
    per layer, (batch, hidden). The module carries the final states into the next batch
    (``BucketingModule(states=...)``).
    """
    mode, num_hidden, num_layers = stack.mode, stack.num_hidden, stack.num_layers
    dropout, fused, prefix = stack.dropout, stack.fused, stack.prefix
    check_choice("mode", mode, MODES)
    names = state_input_names(mode, num_layers, fused, prefix) if state_inputs else []
    if fused:
        cell = mx.rnn.FusedRNNCell(
            num_hidden,
            num_layers=num_layers,
            mode=mode,
            dropout=dropout,
            prefix=prefix,
            get_next_state=state_inputs,
        )
        begin = [mx.sym.Variable(n, __layout__="LNC") for n in names] or None
        # the RNN operator wants (time, batch, channel); swap here rather than let the cell
        # do it with a warning
        x = mx.sym.swapaxes(x, dim1=0, dim2=1)
        x, finals = cell.unroll(
            seq_len, inputs=x, begin_state=begin, layout="TNC", merge_outputs=True
        )
        x = mx.sym.swapaxes(x, dim1=0, dim2=1)
    else:
        cells = mx.rnn.SequentialRNNCell()
        for i in range(num_layers):
            cells.add(_cell(mode, num_hidden, f"{prefix}l{i}_"))
            if dropout > 0 and i + 1 < num_layers:
                cells.add(mx.rnn.DropoutCell(dropout, prefix=f"{prefix}d{i}_"))
        # (0: the batch size, inferred from the data)
        begin = [mx.sym.Variable(n, shape=(0, num_hidden), __layout__="NC") for n in names]
        x, finals = cells.unroll(
            seq_len, inputs=x, begin_state=begin or None, layout="NTC", merge_outputs=True
        )
    return x, dict(zip(names, finals, strict=True)) if names else {}


def build_rnn_lm(
    options: LmOptions,
    data_info: DataInfo,
    *,
    model: str,
    mode: str,
    probabilities: bool = True,
    sampled: bool = False,
    logits_only: bool = False,
) -> SymGen:
    """``sym_gen`` of a language model: embedding -> N-layer RNN (``mode``) -> FC -> softmax.

    Inputs are (batch, time) token ids; the first output is (batch * time, num_classes)
    probabilities in batch-major order, named ``softmax_output``. Except with ``loss:
    softmax_output`` a second output, ``nll_output``, holds each position's -log p(label) (0 at
    ignored padding) and is what is trained; metrics read only the first. With
    ``probabilities=False`` (training whose metrics all read the loss) the probabilities are
    not computed where the loss does not need them and ``nll_output`` is the first output;
    ``sym_gen.without_probabilities()`` builds that variant. Parameters: ``embed_weight``, the
    RNN's (module docstring; prefix ``{mode}_``), ``pred_weight`` (not with ``tie_weights``:
    the output layer reads ``embed_weight``), ``pred_bias``.

    With ``sampled_softmax: N`` the full graph above is still what evaluation, score, predict
    and export use; ``sym_gen.training_variant()`` builds the training graph, whose only output
    (``nll_output``) is the sampled softmax's loss (:func:`sampled_softmax_nll`) over the same
    parameters.

    When the data is a stream (``data_info.stream``: each batch continues the rows of the one
    before), the recurrent layers' begin states are inputs and their final states extra
    outputs after the others; ``sym_gen.states`` maps one to the other for the module.

    With ``loss: one_pass``, ``sym_gen.softmax_head_variant(probabilities)`` returns the
    training graph (``logits_only``: its first output the (batch * time, num_classes)
    logits, ``pred_logits_output``, its second the labels, so that they stay an input, its
    third the loss that hands the input :data:`LOGITS_GRADIENT` to the logits) and what
    the module's softmax head needs to know (label input, ignored label, whether the metrics
    read the probabilities).
    """
    vocab_size, num_classes = check_sizes(model, data_info)
    if options.ignore_padding and data_info.pad_id is None:
        raise InvalidValue(
            model,
            "with ignore_padding: true needs the data iterator's pad_id; "
            "set ignore_padding: false for data without padding",
        )
    pad_id = data_info.pad_id
    char_vocab_size = char_inputs_size(model, options, data_info)
    inputs = ("data", "chars") if char_vocab_size else ("data",)

    def sym_gen(bucket_key: Any) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
        seq_len = check_bucket_key(model, bucket_key)
        embed_weight = mx.sym.Variable("embed_weight")
        x = _lm_inputs(options, embed_weight, seq_len, vocab_size, char_vocab_size)
        x, finals = _lm_hidden_states(options, x, seq_len, mode, stateful)
        label = mx.sym.reshape(mx.sym.Variable("softmax_label"), shape=(-1,))
        ignore_label = pad_id if options.ignore_padding else None
        if sampled:
            nll = _sampled_lm_nll(options, num_classes, x, label, embed_weight)
            heads = [trained_loss(nll, label, ignore_label)]
        else:
            tied = {"weight": embed_weight} if options.tie_weights else {}
            x = mx.sym.FullyConnected(x, num_hidden=num_classes, name="pred", **tied)
            if logits_only:
                heads = one_pass_heads(x, label)
            else:
                heads = loss_heads(
                    x, label, options.loss_formulation, ignore_label, probabilities=probabilities
                )
        if not finals:
            out = heads[0] if len(heads) == 1 else mx.sym.Group(heads)
            return out, inputs, ("softmax_label",)
        ends = [mx.sym.BlockGrad(final, name=f"{name}_last") for name, final in finals.items()]
        return mx.sym.Group(heads + ends), inputs, ("softmax_label",)

    stateful = bool(getattr(data_info, "stream", False))
    if options.sampled_softmax:
        check_sampled_count(options.sampled_softmax, num_classes)
    if options.tie_weights and num_classes != vocab_size:
        raise InvalidValue(
            model,
            f"with tie_weights: true needs as many output classes as input tokens "
            f"(got {num_classes} and {vocab_size})",
        )
    if options.word_embed:
        sym_gen.word_embedding = "embed_weight"  # type: ignore[attr-defined]
    if stateful:
        names = state_input_names(mode, options.num_layers, options.fused, f"{mode}_")
        sym_gen.states = {n: f"{n}_last_output" for n in names}  # type: ignore[attr-defined]
    if probabilities:

        def without_probabilities() -> SymGen:
            return build_rnn_lm(options, data_info, model=model, mode=mode, probabilities=False)

        sym_gen.without_probabilities = without_probabilities  # type: ignore[attr-defined]
    if options.loss == "one_pass" and not options.sampled_softmax and not logits_only:

        def softmax_head_variant(probabilities: bool) -> tuple[SymGen, dict[str, Any]]:
            logits = build_rnn_lm(options, data_info, model=model, mode=mode, logits_only=True)
            ignored = pad_id if options.ignore_padding else None
            return logits, one_pass_head_spec("softmax_label", ignored, probabilities)

        sym_gen.softmax_head_variant = softmax_head_variant  # type: ignore[attr-defined]
    if options.sampled_softmax and not sampled:

        def training_variant() -> SymGen:
            return build_rnn_lm(
                options, data_info, model=model, mode=mode, probabilities=False, sampled=True
            )

        sym_gen.training_variant = training_variant  # type: ignore[attr-defined]
    return sym_gen


def char_inputs_size(model: str, options: Any, data_info: DataInfo) -> int | None:
    """The character vocabulary's size when the options ask for character-aware words
    (``char_embed``), else None; InvalidValue when the data carries no characters."""
    if not getattr(options, "char_embed", 0):
        return None
    size = getattr(data_info, "char_vocab_size", None)
    if not size:
        raise InvalidValue(
            "char_embed",
            f"({model}) needs batches that carry each word's characters: the "
            "tagged_sequences and bucket_sentence iterators give them when the model asks",
        )
    return int(size)


def word_features(
    options: Any, embedding: Any | None, seq_len: int, char_vocab_size: int | None
) -> Any:
    """(batch, time, width) features of the input words: the word ``embedding`` (None: not
    used), the character-aware vectors of input ``chars`` (with ``char_vocab_size``), or
    both concatenated."""
    features = [] if embedding is None else [embedding]
    if char_vocab_size:
        chars = mx.sym.Variable("chars")
        features.append(
            char_word_vectors(
                chars, seq_len, char_vocab_size, options.char_embed, options.char_filters,
                options.char_kernel,
            )
        )  # fmt: skip
    return features[0] if len(features) == 1 else mx.sym.concat(*features, dim=2)


def _lm_inputs(
    options: LmOptions,
    embed_weight: Any,
    seq_len: int,
    vocab_size: int,
    char_vocab_size: int | None,
) -> Any:
    embedding = None
    if options.word_embed:
        embedding = mx.sym.Embedding(
            mx.sym.Variable("data"),
            weight=embed_weight,
            input_dim=vocab_size,
            output_dim=options.num_embed,
            name="embed",
            sparse_grad=options.sparse_embedding,
        )
    return word_features(options, embedding, seq_len, char_vocab_size)


def _lm_hidden_states(
    options: LmOptions, x: Any, seq_len: int, mode: str, stateful: bool
) -> tuple[Any, dict[str, Any]]:
    """A language model's graph from its input features ``x`` to the output layer's input,
    (batch * time, num_hidden), and its recurrent final states (stateful streams only)."""
    if options.dropout > 0:
        x = mx.sym.Dropout(x, p=options.dropout, name="embed_dropout")
    stack = RecurrentStack(
        mode,
        options.num_hidden,
        options.num_layers,
        options.dropout,
        fused=options.fused,
        prefix=f"{mode}_",
    )
    x, finals = left_to_right_layers(x, seq_len, stack, state_inputs=stateful)
    x = mx.sym.reshape(x, shape=(-1, options.num_hidden))
    if options.dropout > 0:
        x = mx.sym.Dropout(x, p=options.dropout, name="pred_dropout")
    return x, finals


def _sampled_lm_nll(
    options: LmOptions, num_classes: int, hidden: Any, label: Any, embed_weight: Any
) -> Any:
    """Each position's sampled-softmax -log p(label) over the full graph's output parameters."""
    if options.tie_weights:
        weight = embed_weight
    else:  # the shapes FullyConnected("pred") would infer: the full graph's parameters
        weight = mx.sym.Variable("pred_weight", shape=(num_classes, options.num_hidden))
    bias = mx.sym.Variable("pred_bias", shape=(num_classes,))
    candidates, tries = log_uniform_candidates(options.sampled_softmax, num_classes)
    return sampled_softmax_nll(
        hidden,
        weight,
        bias,
        label,
        candidates,
        tries,
        num_sampled=options.sampled_softmax,
        num_classes=num_classes,
        sparse_rows=options.num_hidden if options.sparse_embedding else None,
    )


#: the context group of the candidate sampler: MXNet 1.9.1 has it on CPU only, so the module
#: binds this group to the CPU whatever the devices (mxtrain.engine.bucketing.HOST_GROUPS)
SAMPLER_GROUP = "mxtrain_host"


def log_uniform_candidates(num_sampled: int, num_classes: int) -> tuple[Any, Any]:
    """Symbols ``(candidates, tries)``: ``num_sampled`` distinct word ids (float, shape
    (num_sampled,)) drawn from a log-uniform (Zipfian) distribution over ``0..num_classes-1``
    (:func:`draw_probability`), and how many draws it took to find them ((1,), float).

    Log-uniform is the shape of word frequencies when ids are in frequency order, as
    mxtrain's vocabularies are. Distinct draws (MXNet's ``_sample_unique_zipfian``, what its
    large-vocabulary LM example used) make every candidate count: 2,048 draws with
    replacement from 10k words hold only ~950 different words. The draws come from MXNet's
    random generator, which training reseeds before every batch, so a resumed run repeats
    them.
    """
    with mx.AttrScope(ctx_group=SAMPLER_GROUP):
        ids, tries = mx.sym._internal._sample_unique_zipfian(
            range_max=num_classes, shape=(1, num_sampled), name="candidate_sampler"
        )
        ids = mx.sym.cast(mx.sym.reshape(ids, (-1,)), dtype="float32")
        tries = mx.sym.cast(tries, dtype="float32")
    return (
        mx.sym.BlockGrad(ids, name="sampled_ids"),
        mx.sym.BlockGrad(tries, name="sampled_tries"),
    )


def draw_probability(ids: Any, num_classes: int) -> Any:
    """The chance one draw of :func:`log_uniform_candidates` gives each id in ``ids``.

    MXNet 1.9.1's sampler draws round(exp(u log V)) - 1 for u uniform in [0, 1), so id c comes
    from exp(...) in [c + 0.5, c + 1.5) clipped to [1, V): P(c) = log(min(c + 1.5, V) /
    max(c + 0.5, 1)) / log V. (Its documentation states floor and log(V + 1); a test measures
    the draws against this formula.) Written with log1p: the ratio is within 1e-5 of 1 for
    ids near 100k, where float32 log loses the difference.
    """
    upper = mx.sym.minimum(ids + 1.5, float(num_classes))
    lower = mx.sym.maximum(ids + 0.5, 1.0)
    return mx.sym.log1p((upper - lower) / lower) / math.log(num_classes)


def log_expected_count(ids: Any, tries: Any, num_classes: int) -> Any:
    """log of the chance that ``tries`` draws include each id in ``ids``: log(1 - (1 -
    P(id))^tries), the correction sampled softmax subtracts from each logit."""
    never = mx.sym.broadcast_mul(mx.sym.log1p(-draw_probability(ids, num_classes)), tries)
    return mx.sym.log(-mx.sym.expm1(never))


def sampled_softmax_nll(
    hidden: Any,
    weight: Any,
    bias: Any,
    label: Any,
    candidates: Any,
    tries: Any,
    *,
    num_sampled: int,
    num_classes: int,
    sparse_rows: int | None = None,
) -> Any:
    """Each row's sampled-softmax loss (N,): -log of the label's share of a softmax over the
    label and the candidate words (Jean et al. 2015; the technique of MXNet's large-vocabulary
    LM example and TensorFlow's ``sampled_softmax_loss``).

    ``sparse_rows`` (the weight's width): the weight's rows are gathered by an Embedding with
    ``sparse_grad``, so its gradient holds only the labels' and candidates' rows (row_sparse)
    instead of a dense vocabulary x width array; the values are the same as ``take``'s.

    ``hidden`` (N, H) is the output layer's input, ``weight`` (V, H) and ``bias`` (V,) its
    parameters, ``label`` (N,) and ``candidates`` (K = ``num_sampled``,) distinct word ids
    (floats) shared by all rows, ``tries`` (1,) the draws it took to find them
    (:func:`log_uniform_candidates`). Every logit has the log of its word's chance of being
    drawn subtracted (so the estimate is not biased towards frequent words), and a candidate
    equal to the row's label is masked out. The output layer
    is computed only for the K candidates and the N labels: (K + N) x H instead of V x H.
    """

    def rows(ids: Any) -> Any:
        if sparse_rows is None:
            return mx.sym.take(weight, ids)
        return mx.sym.Embedding(
            ids, weight=weight, input_dim=num_classes, output_dim=sparse_rows, sparse_grad=True
        )

    label_logit = mx.sym.sum(hidden * rows(label), axis=1) + mx.sym.take(bias, label)
    label_logit = label_logit - log_expected_count(label, tries, num_classes)
    # the correction goes into the candidates' bias: (K,) values, not a pass over (N, K)
    sampled_bias = mx.sym.take(bias, candidates) - log_expected_count(
        candidates, tries, num_classes
    )
    sampled_logits = mx.sym.FullyConnected(
        hidden,
        weight=rows(candidates),
        bias=sampled_bias,
        num_hidden=num_sampled,
        name="pred_sampled",
    )
    hits = mx.sym.broadcast_equal(
        mx.sym.reshape(label, (-1, 1)), mx.sym.reshape(candidates, (1, -1))
    )
    sampled_logits = sampled_logits + mx.sym.BlockGrad(hits * -ACCIDENTAL_HIT_PENALTY)
    logits = mx.sym.concat(mx.sym.reshape(label_logit, (-1, 1)), sampled_logits, dim=1)
    # oneDNN's concat may leave its own memory layout, on which softmax runs oneDNN's reference
    # loop (30 ms instead of 0.5 for 700 x 2049): the reshape gives it the plain layout
    logits = mx.sym.reshape(logits, (-1, num_sampled + 1))
    # the label is column 0; softmax (not log_softmax): oneDNN has a JIT backward for it on
    # every instruction set
    label_share = mx.sym.slice_axis(mx.sym.softmax(logits, axis=-1), axis=1, begin=0, end=1)
    return floored_nll(mx.sym.reshape(label_share, (-1,)))


def floored_nll(probability: Any) -> Any:
    """-log(max(probability, PROBABILITY_FLOOR)): finite loss and gradient when the label's
    probability underflows to 0."""
    return -mx.sym.log(mx.sym.maximum(probability, PROBABILITY_FLOOR))


def trained_loss(nll: Any, label: Any, ignore_label: int | None) -> Any:
    """The per-position loss as the trained output ``nll_output``, zero (and no gradient)
    where ``label == ignore_label``."""
    if ignore_label is not None:
        nll = nll * (label != ignore_label)
    return mx.sym.MakeLoss(nll, name="nll")


def loss_heads(
    logits: Any,
    label: Any,
    formulation: str,
    ignore_label: int | None,
    *,
    probabilities: bool = True,
) -> list[Any]:
    """The outputs of a softmax loss on (N, C) ``logits`` and (N,) labels.

    Every formulation sends ``softmax - onehot(label)`` per row back to ``logits`` (zero where
    ``label == ignore_label``), what ``SoftmaxOutput`` (normalization ``null``, grad_scale 1)
    sends, to float rounding; they differ in speed, and which is fastest depends on the CPU
    (oneDNN has no AVX2 kernel for log_softmax's backward in MXNet 1.9.1, for one):

    * ``softmax``: ``[probabilities, -log(max(pick(softmax), PROBABILITY_FLOOR))]``; the
      probabilities are the softmax the loss needs anyway.
    * ``log_softmax``: ``[probabilities, -pick(log_softmax)]``; the probabilities are a
      separate forward-only softmax, left out with ``probabilities=False``.
    * ``softmax_output``: ``[SoftmaxOutput]`` (its output is the probabilities).

    With ``probabilities=False`` the first output is the per-position loss (``nll_output``)
    wherever the formulation can give it without the probabilities.
    """
    check_choice("loss", formulation, LOSS_FORMULATIONS)
    if formulation == "softmax_output":
        ignore: dict[str, Any] = {}
        if ignore_label is not None:
            ignore = {"use_ignore": True, "ignore_label": ignore_label}
        return [mx.sym.SoftmaxOutput(logits, label, name="softmax", **ignore)]
    if formulation == "softmax":
        probs = mx.sym.softmax(logits, axis=-1)
        nll = floored_nll(mx.sym.pick(probs, label, axis=-1))
    else:
        probs = mx.sym.softmax(logits, axis=-1) if probabilities else None
        nll = -mx.sym.pick(mx.sym.log_softmax(logits, axis=-1), label, axis=-1)
    loss = trained_loss(nll, label, ignore_label)
    if not probabilities:
        return [loss]
    return [mx.sym.BlockGrad(probs, name="softmax"), loss]
