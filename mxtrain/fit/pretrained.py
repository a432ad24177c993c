"""``model.pretrained_embedding``: a new run's word embedding starts from word vectors.

The vectors (:mod:`mxtrain.data.word_vectors`) replace the initializer's values in the rows
of the vocabulary words they cover; the other rows keep them. With ``freeze: true`` the whole
embedding is one of the module's fixed parameters (:func:`mxtrain.build.frozen_embedding`).
A resumed run reads its checkpoint instead; ``initializer.from`` is applied afterwards and
wins for the parameters it loads.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from mxtrain.config.schema import Config
from mxtrain.data.vocab import Vocab
from mxtrain.data.word_vectors import map_vectors, vector_size, vector_words
from mxtrain.errors import ConfigError, DataError

if TYPE_CHECKING:  # annotations only: MXNet must load after the run's thread settings
    from mxtrain.engine.bucketing import BucketingModule

log = logging.getLogger("mxtrain")

KEY = "model.pretrained_embedding"


def load_pretrained_embedding(
    module: BucketingModule, config: Config, spec: Any, data_iter: Any, parameter: str
) -> dict[str, Any]:
    """Fill the embedding ``parameter`` of ``module`` from the vectors ``spec``
    (``model.pretrained_embedding``) names, mapped onto ``data_iter``'s vocabulary; returns
    what run.json keeps."""
    import mxnet as mx

    where = config.where("model", "pretrained_embedding", "source")
    vocab = getattr(data_iter, "vocab", None)
    if not isinstance(vocab, Vocab):
        raise ConfigError(
            f"{where}: {KEY} maps words onto the data's token vocabulary, and the "
            f"{type(data_iter).__name__} iterator keeps none.",
            hint="Use it with a text iterator (bucket_sentence, bptt_stream, tagged_sequences, "
            "parallel_text), or remove it.",
        )
    args, _ = module.get_params()
    weight = args[parameter].asnumpy()
    path = config.resolve_path(spec.source)
    dims = vector_size(path)
    if dims != weight.shape[1]:
        raise ConfigError(
            f"{where}: {KEY}.source {path} holds vectors of {dims} numbers, and the model's "
            f"embedding ({parameter}) has {weight.shape[1]} (model.num_embed).",
            hint=f"Set model.num_embed: {dims}, or use vectors of {weight.shape[1]} numbers.",
        )
    mapped = map_vectors(path, vocab)
    if not mapped.rows:
        sample = ", ".join(repr(t) for t in vocab.tokens[len(vocab.tokens) - mapped.words :][:5])
        raise DataError(
            f"None of the {mapped.words:,} vocabulary words ({sample}, ...) has a vector in "
            f"{path} ({mapped.vectors_read:,} vectors).",
            hint="Check that the vectors are of the data's language and casing (a lowercased "
            "vocabulary also takes a word's capitalized vector).",
        )
    for row, vector in mapped.rows.items():
        weight[row] = vector
    module.set_params({parameter: mx.nd.array(weight)}, {}, allow_missing=True)
    log.info(
        "pretrained embedding: %s of %s vocabulary words (%.1f%%) start from the vectors of %s "
        "(%s vectors of %d numbers); the others keep the initializer's values%s",
        f"{len(mapped.rows):,}",
        f"{mapped.words:,}",
        100 * mapped.coverage,
        path,
        f"{mapped.vectors_read:,}",
        dims,
        "; frozen: the embedding is not trained" if spec.freeze else "",
    )
    if spec.freeze and getattr(config.model.options, "tie_weights", False):
        log.warning(
            "%s.freeze with model.tie_weights: the output layer reads the embedding, so it "
            "is not trained either",
            KEY,
        )
    return {**mapped.report(), "parameter": parameter, "freeze": spec.freeze}


def vector_words_to_add(config: Config) -> tuple[str, ...]:
    """The words ``add_words`` asks the training vocabulary to take (empty: none)."""
    spec = getattr(config.model.options, "pretrained_embedding", None)
    if spec is None or spec.add_words is False:
        return ()
    limit = None if spec.add_words is True else int(spec.add_words)
    lowercase = bool(getattr(config.data.train.options, "lowercase", False))
    return tuple(vector_words(config.resolve_path(spec.source), limit, lowercase))


def check_words_added(config: Config, train_iter: Any, added: tuple[str, ...]) -> None:
    """A ConfigError when the training vocabulary did not take the ``added`` words: the
    iterator loads a given vocabulary, or builds none of its own."""
    if not added:
        return
    vocab = getattr(train_iter, "vocab", None)
    if isinstance(vocab, Vocab) and all(word in vocab for word in added):
        log.info(
            "%s.add_words: the vocabulary holds %s words: the training data's and the "
            "vectors' first %s",
            KEY,
            f"{len(vocab):,}",
            f"{len(added):,}",
        )
        return
    given = getattr(config.data.train.options, "vocab", None)
    raise ConfigError(
        f"{config.where('model', 'pretrained_embedding', 'add_words')}: {KEY}.add_words "
        "adds words to the vocabulary the training data builds, and "
        + (
            f"data.train.vocab gives one ({given})."
            if given
            else f"the {config.data.train.name} iterator builds none that takes them."
        ),
        hint="Remove add_words (the vectors still fill the vocabulary's words), or "
        + (
            "remove data.train.vocab."
            if given
            else "use bucket_sentence, bptt_stream or tagged_sequences data."
        ),
    )
