"""What iterators tell the rest of mxtrain, and what they are told. No MXNet import here."""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxtrain.run.bucket_keys import BucketKeys, as_tuples

TASK_LM = "lm"  # next-token prediction: one softmax over the vocabulary per input position
TASK_TAG = "tag"  # sequence labelling: one softmax over the labels per input token
TASK_SEQ2SEQ = "seq2seq"  # source sequence -> target sequence (encoder-decoder)


@dataclass(frozen=True)
class DataInfo:
    """Facts about a dataset that model builders need (sizes of inputs and outputs).

    ``task`` says what the model's output means, so that ``mxtrain predict`` knows how to turn
    it into records: ``"lm"`` (a language model: at every input position a softmax over the
    vocabulary for the next token; labels are the inputs shifted by one) or ``None`` when the
    iterator does not say. ``"tag"``: a sequence labeller, one softmax over the labels per input
    token. Other tasks (e.g. classifiers) can be added with their own name.
    """

    vocab_size: int | None = None  # number of input token ids, padding and specials included
    num_classes: int | None = None  # number of output classes (= vocab_size for a language model)
    pad_id: int | None = None  # id used for padding inputs and ignored labels
    task: str | None = None  # what the output means: "lm", or None if not said
    #: each batch continues the rows of the batch before it (``bptt_stream``): recurrent
    #: models carry their state from batch to batch instead of starting from zeros
    stream: bool = False
    #: the character vocabulary's size when batches also carry each word's characters
    #: (input ``chars``, (batch, length, characters); DataContext.char_max_len), else None
    char_vocab_size: int | None = None


@dataclass(frozen=True)
class Seq2SeqInfo(DataInfo):
    """What an encoder-decoder model needs from parallel (source, target) data.

    ``vocab_size`` is the source vocabulary's size, ``num_classes`` the target's (the
    decoder's softmax); with ``shared_vocab`` they are one vocabulary. In both vocabularies
    ``<pad>`` is ``pad_id`` (0); the target vocabulary also holds ``bos_id`` (the decoder's
    first input) and ``eos_id`` (its last label). ``tokens`` says how lines were split
    (``"whitespace"`` or ``"chars"``), so that outputs are joined back the same way.
    ``reverse_target``: the model reads and writes target sequences last token first (a
    right-to-left model); its outputs are turned back into reading order as text.
    """

    task: str | None = TASK_SEQ2SEQ
    eos_id: int = 2  # Vocab's fixed <eos> id
    bos_id: int = 3  # <bos>: the first extra special of the target vocabulary
    shared_vocab: bool = False
    tokens: str = "whitespace"
    reverse_target: bool = False


@dataclass(frozen=True)
class DataContext:
    """How an iterator is being built.

    ``role`` is ``"train"``, ``"eval"`` or ``"predict"``. An eval iterator receives the train
    iterator as ``train`` so it can reuse its vocabulary and buckets. A ``"predict"`` iterator
    reads its data in file order, never shuffles and keeps every line whole: a sentence longer
    than every bucket gets a bucket of its own instead of being split, truncated or dropped
    (``mxtrain predict`` writes one record per input line). ``base_dir`` is the folder relative
    paths in the config are resolved against (the config file's folder). ``vocab_file``, when
    set, is a saved vocabulary to load instead of building one. ``buckets``, when set, are the
    bucket keys the model was trained with, for iterators built without ``train`` (scoring or
    predicting from a run folder) and for a resumed run's train iterator. ``artifacts_dir``,
    when set, is the folder (the run folder) holding the extra files a train iterator wrote
    through its optional ``artifacts()`` method (``{file name: save(path)}``, e.g. a tagger's
    ``label_vocab.json``); when it is None, iterators look for them beside ``vocab_file``.
    """

    role: str
    seed: int
    base_dir: Path
    train: Any = None
    vocab_file: Path | None = None
    buckets: BucketKeys | None = None
    artifacts_dir: Path | None = None
    #: the fewest rows a batch may have: a batch is split over the devices, one row at least
    #: each (iterators that size some batches to their content, as predict's long lines)
    min_batch: int = 1
    #: a resumed run's recorded ``last_batch`` rule, which wins over the options (a
    #: checkpoint of a version without the rule padded its last batches: "pad")
    last_batch: str | None = None
    #: the model reads each word's characters too (character-aware words): iterators that
    #: can give every batch a ``chars`` input of at most this many characters per word do
    char_max_len: int | None = None
    #: words a train iterator that builds its vocabulary adds after the counted ones
    #: (``model.pretrained_embedding.add_words``: the vectors' words)
    extra_words: tuple[str, ...] = ()

    def artifact(self, name: str) -> Path | None:
        """Where a file a train iterator wrote through ``artifacts()`` is, for an iterator
        built from a run folder (``artifacts_dir``, else beside ``vocab_file``); None when
        there is neither."""
        folder = self.artifacts_dir
        if folder is None and self.vocab_file is not None:
            vocab_file = Path(self.vocab_file)
            if not vocab_file.is_absolute():
                vocab_file = self.base_dir / vocab_file
            folder = vocab_file.parent
        return None if folder is None else Path(folder) / name


def resolve_source(name: str, base_dir: Path) -> Path:
    """A file a data section names: ``~`` expanded, relative to the config file's folder
    (``base_dir``) unless absolute."""
    path = Path(name).expanduser()
    return path if path.is_absolute() else base_dir / path


def model_inputs(data_iter: Any) -> dict[str, Any]:
    """What a model is built from, as JSON: the iterator's ``data_info`` (its class and
    fields), its default bucket key, buckets and input/label shapes (batch axis first).
    ``mxtrain export`` rebuilds the model from this without reading any data."""
    info = data_iter.data_info
    is_record = dataclasses.is_dataclass(info) and not isinstance(info, type)
    fields = dataclasses.asdict(info) if is_record else dict(vars(info))
    kind = type(info)

    def shapes(descs: Any) -> list[list[Any]]:
        return [[d[0], list(d[1])] for d in descs or ()]

    key = data_iter.default_bucket_key
    buckets = getattr(data_iter, "buckets", None)
    return {
        "data_info": {"class": f"{kind.__module__}:{kind.__qualname__}", "fields": fields},
        "default_bucket_key": key,
        "buckets": list(buckets) if buckets is not None else None,
        "provide_data": shapes(data_iter.provide_data),
        "provide_label": shapes(data_iter.provide_label),
    }


def data_info_from(saved: dict[str, Any]) -> Any:
    """The ``data_info`` object of :func:`model_inputs`' record: its own class when that
    can be imported (a plugin's kept file is), else :class:`DataInfo` with the fields it
    knows."""
    record = saved["data_info"]
    module, _, name = str(record.get("class", "")).partition(":")
    fields = {k: as_tuples(v) for k, v in (record.get("fields") or {}).items()}
    try:
        kind = getattr(importlib.import_module(module), name)
        return kind(**fields)
    except Exception:  # a vanished plugin class: the built-in one serves
        known = {f.name for f in dataclasses.fields(DataInfo)}
        return DataInfo(**{k: v for k, v in fields.items() if k in known})
