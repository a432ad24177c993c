"""``mxtrain predict`` for sequence taggers (data iterators reporting task ``"tag"``).

One record per input sentence, in input order: its tokens as written in the file, the
predicted label of each token and that label's probability (with ``--top-k K`` also the K
most likely labels of each token). The label with the highest probability among the real
labels is chosen: ``<pad>`` and ``<unk>`` are never predicted. Only the chosen labels and
their probabilities (and the top-k) leave the device, never the whole softmax output.

No click here; MXNet is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mxtrain.errors import ConfigError
from mxtrain.inference.output import shortest_float32
from mxtrain.inference.predict_loop import predict_batches

if TYPE_CHECKING:
    from mxtrain.data.conll import TaggedSentence
    from mxtrain.inference.open import OpenedRun

SPECIALS = 2  # <pad> and <unk>: the first label ids, never predicted


@dataclass
class TagPredictions:
    """Per-sentence tagger results (see the module docstring); arrays are per sentence."""

    sentences: Sequence[TaggedSentence]
    label_ids: list[np.ndarray]  # int64 [tokens]
    probs: list[np.ndarray]  # float32 [tokens]: probability of the chosen label
    top_ids: list[np.ndarray] | None  # int64 [tokens, k] with top_k
    top_probs: list[np.ndarray] | None  # float32 [tokens, k]
    labels: Sequence[str]  # label id -> label
    top_k: int

    def totals(self) -> tuple[int, int, int, float]:
        """(sentences, 0, tokens, sum of ln p(chosen label))."""
        tokens = sum(int(p.size) for p in self.probs)
        total = sum(
            float(np.log(np.maximum(p.astype(np.float64), 1e-10)).sum()) for p in self.probs
        )
        return len(self.sentences), 0, tokens, total

    def _top(self, i: int) -> list[list[list[Any]]]:
        assert self.top_ids is not None and self.top_probs is not None
        return [
            [[self.labels[int(t)], shortest_float32(p)] for t, p in zip(ids, probs, strict=True)]
            for ids, probs in zip(self.top_ids[i], self.top_probs[i], strict=True)
        ]

    def records(self) -> Iterator[dict[str, Any]]:
        for i, sentence in enumerate(self.sentences):
            record: dict[str, Any] = {
                "sentence": i + 1,
                "line": sentence.line,
                "tokens": list(sentence.tokens),
                "labels": [self.labels[int(t)] for t in self.label_ids[i]],
                "probs": [shortest_float32(p) for p in self.probs[i]],
            }
            if self.top_k:
                record["top"] = self._top(i)
            yield record

    def csv_header(self) -> list[str]:
        header = ["sentence", "line", "position", "token", "label", "prob"]
        return [*header, "top"] if self.top_k else header

    def csv_rows(self) -> Iterator[list[Any]]:
        """One row per token (position counts from 1 within the sentence)."""
        for record in self.records():
            for j, token in enumerate(record["tokens"]):
                row = [
                    record["sentence"],
                    record["line"],
                    j + 1,
                    token,
                    record["labels"][j],
                    record["probs"][j],
                ]
                if self.top_k:
                    row.append(" ".join(f"{label}:{p}" for label, p in record["top"][j]))
                yield row

    def to_numpy(self) -> np.ndarray:
        """One row per token: sentence, line, position, token, label, label_id, prob (+ top)."""
        k = self.top_k
        lengths = [len(s.tokens) for s in self.sentences]
        n = sum(lengths)
        token_width = max([1, *(len(t) for s in self.sentences for t in s.tokens)])
        label_width = max([1, *(len(label) for label in self.labels)])
        fields: list[tuple[Any, ...]] = [
            ("sentence", "<i8"),
            ("line", "<i8"),
            ("position", "<i8"),
            ("token", f"<U{token_width}"),
            ("label", f"<U{label_width}"),
            ("label_id", "<i8"),
            ("prob", "<f4"),
        ]
        if k:
            fields += [("top_id", "<i8", (k,)), ("top_prob", "<f4", (k,))]
            fields += [("top_label", f"<U{label_width}", (k,))]
        out = np.zeros(n, dtype=fields)
        if n == 0:
            return out
        out["sentence"] = np.repeat(np.arange(1, len(lengths) + 1), lengths)
        out["line"] = np.repeat([s.line for s in self.sentences], lengths)
        out["position"] = np.concatenate([np.arange(1, m + 1) for m in lengths])
        out["token"] = [t for s in self.sentences for t in s.tokens]
        ids = np.concatenate(self.label_ids)
        out["label_id"] = ids
        out["label"] = [self.labels[int(t)] for t in ids]
        out["prob"] = np.concatenate(self.probs)
        if k:
            assert self.top_ids is not None and self.top_probs is not None
            top = np.concatenate(self.top_ids)
            out["top_id"] = top
            out["top_prob"] = np.concatenate(self.top_probs)
            out["top_label"] = [[self.labels[int(t)] for t in row] for row in top]
        return out


def _tag_batch(module: Any, steps: int, top: int) -> list[tuple[int, int, Any, Any, Any, Any]]:
    """Queue per-position reductions of one forward on each device; nothing is read yet.

    Per device part: (first row, end row, chosen label ids, their probabilities, top-k
    probabilities, top-k ids), all (rows, time[, k]), label ids counted from 0 = the first
    real label.
    """
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    parts = []
    lo = 0
    for out in module.get_outputs(merge_multi_context=False)[0]:
        rows = out.shape[0] // steps
        if rows * steps != out.shape[0] or out.ndim != 2 or out.shape[1] <= SPECIALS:
            raise ConfigError(
                f"The model's output has shape {out.shape}; a tagger must output "
                f"(batch * time, labels) probabilities (here time = {steps}).",
                hint="mxtrain predict reads the model as a tagger because its data iterator "
                "says task 'tag'.",
            )
        real = mx.nd.slice_axis(out.reshape((rows, steps, -1)), axis=2, begin=SPECIALS, end=None)
        best = mx.nd.argmax(real, axis=2)
        prob = mx.nd.max(real, axis=2)
        vals = ids = None
        if top:
            vals, ids = mx.nd.topk(real, axis=2, k=top, ret_typ="both")
        parts.append((lo, lo + rows, best, prob, vals, ids))
        lo += rows
    return parts


def predict_tags(opened: OpenedRun, top_k: int) -> TagPredictions:
    """Run the predict iterator through the module; per-sentence results in input order."""
    data_iter = opened.data_iter
    label_vocab = getattr(data_iter, "label_vocab", None)
    sentences = getattr(data_iter, "sentences", None)
    if label_vocab is None or sentences is None:
        raise ConfigError(
            "The data iterator reports task 'tag' but has no label_vocab and sentences, so "
            "predictions cannot be written.",
            hint="Use the tagged_sequences iterator (or give yours label_vocab and sentences).",
        )
    labels = label_vocab.labels
    usable = len(labels) - SPECIALS
    if top_k > usable:
        raise ConfigError(
            f"--top-k {top_k} asks for more labels than the model has ({usable}).",
            hint=f"Use --top-k {usable} or less.",
        )
    count = len(sentences)
    label_ids: list[np.ndarray | None] = [None] * count
    probs: list[np.ndarray | None] = [None] * count
    top_ids: list[np.ndarray | None] = [None] * count
    top_probs: list[np.ndarray | None] = [None] * count

    def collect(index: np.ndarray, parts: list[tuple[int, int, Any, Any, Any, Any]]) -> None:
        for lo, hi, best, prob, vals, ids in parts:
            rows = index[lo:hi]
            best_h, prob_h = best.asnumpy(), prob.asnumpy()
            vals_h = vals.asnumpy() if vals is not None else None
            ids_h = ids.asnumpy() if ids is not None else None
            for r, i in enumerate(rows):
                if i < 0:
                    continue
                if label_ids[i] is not None:
                    raise RuntimeError(f"sentence {i + 1} came twice")
                n = len(sentences[i].tokens)
                label_ids[i] = np.rint(best_h[r, :n]).astype(np.int64) + SPECIALS
                probs[i] = prob_h[r, :n].astype(np.float32)
                if vals_h is not None and ids_h is not None:
                    top_probs[i] = vals_h[r, :n].astype(np.float32)
                    top_ids[i] = np.rint(ids_h[r, :n]).astype(np.int64) + SPECIALS

    predict_batches(
        opened,
        lambda module, batch: _tag_batch(module, int(batch.data[0].shape[1]), top_k),
        collect,
        unit="the sentence of each row",
    )
    missing = [i + 1 for i, ids in enumerate(label_ids) if ids is None]
    if missing:
        raise RuntimeError(f"no prediction for sentences {missing[:10]}")
    return TagPredictions(
        sentences,
        [a for a in label_ids if a is not None],
        [a for a in probs if a is not None],
        [a for a in top_ids if a is not None] if top_k else None,
        [a for a in top_probs if a is not None] if top_k else None,
        labels,
        top_k,
    )
