"""``mxtrain predict`` for language models (data iterators reporting task ``"lm"``).

One record per input line: the number of predicted tokens, their log-likelihood and
perplexity, and with ``--top-k`` the most likely next tokens after the whole line (see
:func:`mxtrain.inference.predict.predict_run` for their exact meaning). Only per-line sums and
the top-k leave the device, never the whole softmax output.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mxtrain.errors import ConfigError
from mxtrain.inference.open import OpenedRun
from mxtrain.inference.output import finite_or_none, shortest_float32
from mxtrain.inference.predict_loop import predict_batches

log = logging.getLogger("mxtrain")


@dataclass
class LmPredictions:
    """Language-model results per input line (see :func:`predict_run` for their meaning)."""

    tokens: np.ndarray  # int64 [n]: predicted tokens (0 for an empty line)
    log_likelihood: np.ndarray  # float64 [n]: nan for an empty line
    next_ids: np.ndarray  # int64 [n, k]
    next_probs: np.ndarray  # float32 [n, k]: nan for an empty line
    vocab: Sequence[str] | None  # id -> token, or None (ids are written instead)
    top_k: int
    space_token: str = " "  # the char-level word separator, written <space> in csv

    def totals(self) -> tuple[int, int, int, float]:
        done = self.has_prediction()
        return (
            int(self.tokens.size),
            int((~done).sum()),
            int(self.tokens[done].sum()),
            float(self.log_likelihood[done].sum()),
        )

    def has_prediction(self) -> np.ndarray:
        return ~np.isnan(self.log_likelihood)

    def perplexity(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            ppl = np.exp(-self.log_likelihood / self.tokens)
        return np.where(self.tokens > 0, ppl, np.nan)

    def _token(self, token_id: int) -> str:
        return self.vocab[token_id] if self.vocab is not None else str(token_id)

    def _next(self, i: int) -> list[tuple[str, float]] | None:
        if np.isnan(self.log_likelihood[i]):
            return None
        return [
            (self._token(int(t)), shortest_float32(p))
            for t, p in zip(self.next_ids[i], self.next_probs[i], strict=True)
        ]

    def records(self) -> Iterator[dict[str, Any]]:
        ppl = self.perplexity()
        for i in range(self.tokens.size):
            record: dict[str, Any] = {
                "line": i + 1,
                "tokens": int(self.tokens[i]),
                "log_likelihood": finite_or_none(float(self.log_likelihood[i])),
                "perplexity": finite_or_none(float(ppl[i])),
            }
            if self.top_k:
                pairs = self._next(i)
                record["next"] = None if pairs is None else [list(p) for p in pairs]
            yield record

    def csv_header(self) -> list[str]:
        header = ["line", "tokens", "log_likelihood", "perplexity"]
        return [*header, "next"] if self.top_k else header

    def csv_rows(self) -> Iterator[list[Any]]:
        for record in self.records():
            row = [record["line"], record["tokens"], record["log_likelihood"], record["perplexity"]]
            if self.top_k:
                pairs = record["next"]
                row.append(
                    None
                    if pairs is None
                    else " ".join(f"{self._csv_token(t)}:{p}" for t, p in pairs)
                )
            yield row

    def _csv_token(self, token: str) -> str:
        return "<space>" if token == self.space_token else token

    def to_numpy(self) -> np.ndarray:
        n, k = self.tokens.size, self.top_k
        fields: list[tuple[Any, ...]] = [
            ("line", "<i8"),
            ("tokens", "<i8"),
            ("log_likelihood", "<f8"),
            ("perplexity", "<f8"),
        ]
        if k:
            width = max([1, *(len(t) for t in self.vocab or [])]) if self.vocab else 20
            fields += [("next_id", "<i8", (k,)), ("next_prob", "<f4", (k,))]
            fields += [("next_token", f"<U{width}", (k,))]
        out = np.zeros(n, dtype=fields)
        out["line"] = np.arange(1, n + 1)
        out["tokens"] = self.tokens
        out["log_likelihood"] = self.log_likelihood
        out["perplexity"] = self.perplexity()
        if k:
            empty = ~self.has_prediction()
            out["next_id"] = np.where(empty[:, None], -1, self.next_ids)
            out["next_prob"] = self.next_probs
            out["next_token"] = [
                ["" if empty[i] else self._token(int(t)) for t in self.next_ids[i]]
                for i in range(n)
            ]
        return out


def _num_lines(data_iter: Any) -> int | None:
    count = getattr(data_iter, "num_sentences", None)
    if count is None:
        stats = getattr(data_iter, "stats", None)
        count = stats.get("sentences") if isinstance(stats, Mapping) else None
    return int(count) if count is not None else None


def _lm_batch(module: Any, batch: Any, pad: int, top: int) -> list[tuple[int, int, Any, Any, Any]]:
    """Queue the per-row reductions of one forward on each device; nothing is read yet.

    Per device part of the batch: (first row, end row, [log-likelihood, tokens], top-k
    probabilities, top-k ids). Only these small arrays ever leave the device.
    """
    # deferred: MXNet reads its thread settings when it loads (devices.configure_threads first)
    import mxnet as mx

    data, label = batch.data[0], batch.label[0]
    steps = int(data.shape[1])
    parts = []
    lo = 0
    for out in module.get_outputs(merge_multi_context=False)[0]:
        rows = out.shape[0] // steps
        if rows * steps != out.shape[0] or out.ndim != 2:
            raise ConfigError(
                f"The model's output has shape {out.shape}; a language model must output "
                f"(batch * time, vocabulary) probabilities (here time = {steps}).",
                hint="mxtrain predict reads the model as a language model because its data "
                "iterator says task 'lm'.",
            )
        hi = lo + rows
        ctx = out.context
        lab = label[lo:hi].as_in_context(ctx)
        prob = out.reshape((rows, steps, -1))
        picked = mx.nd.pick(prob, lab, axis=2)
        if picked.dtype != np.float32:
            picked = picked.astype(np.float32)
        mask = lab != pad
        # -log(max(p, 1e-10)) per position, as the perplexity metric computes it
        ll = mx.nd.sum(mx.nd.log(mx.nd.maximum(picked, 1e-10)) * mask, axis=1)
        sums = mx.nd.stack(ll, mx.nd.sum(mask, axis=1), axis=1)  # (rows, 2)
        vals = ids = None
        if top:
            real = mx.nd.sum(data[lo:hi].as_in_context(ctx) != pad, axis=1)
            last = mx.nd.maximum(real - 1, 0)
            flat = mx.nd.arange(0, rows, ctx=ctx) * steps + last
            vals, ids = mx.nd.topk(mx.nd.take(out, flat), k=top, ret_typ="both")
        parts.append((lo, hi, sums, vals, ids))
        lo = hi
    return parts


def predict_lm(opened: OpenedRun, top_k: int) -> LmPredictions:
    """Run the predict iterator through the module; per-line results in input order."""
    data_iter = opened.data_iter
    info = data_iter.data_info
    pad = info.pad_id if info.pad_id is not None else -1
    vocab = getattr(data_iter, "vocab", None)
    tokens_of = vocab.tokens if vocab is not None and hasattr(vocab, "tokens") else None
    classes = int(info.num_classes or 0)
    usable = classes - (1 if 0 <= pad < classes else 0)
    if top_k > usable:
        raise ConfigError(
            f"--top-k {top_k} asks for more tokens than the model can predict ({usable}, "
            "<pad> excluded).",
            hint=f"Use --top-k {min(usable, 10)} or less.",
        )
    # one more than asked, so that <pad> (never a real next token) can be dropped
    top = min(top_k + 1, classes) if top_k else 0

    count = _num_lines(data_iter)
    if count is None:
        raise ConfigError(
            "The data iterator does not report how many lines it read (num_sentences), so "
            "predictions cannot be aligned with the input lines."
        )
    ll = np.full(count, np.nan)
    tokens = np.zeros(count, dtype=np.int64)
    next_ids = np.full((count, top), -1, dtype=np.int64)
    next_probs = np.full((count, top), np.nan, dtype=np.float32)
    seen = np.zeros(count, dtype=bool)

    def collect(index: np.ndarray, parts: list[tuple[int, int, Any, Any, Any]]) -> None:
        for lo, hi, sums, vals, ids in parts:
            rows = index[lo:hi]
            real = rows >= 0
            where = rows[real]
            if seen[where].any():
                raise RuntimeError(f"input lines {where[seen[where]].tolist()} came twice")
            seen[where] = True
            host = sums.asnumpy()[real]
            ll[where] = host[:, 0]
            tokens[where] = np.rint(host[:, 1]).astype(np.int64)
            if top:
                next_probs[where] = vals.asnumpy()[real]
                next_ids[where] = np.rint(ids.asnumpy()[real]).astype(np.int64)

    batches = predict_batches(
        opened,
        lambda module, batch: _lm_batch(module, batch, pad, top),
        collect,
        unit="the input line of each row",
    )
    log.debug("predicted %d batches", batches)

    if top:
        next_ids, next_probs = _drop_pad(next_ids, next_probs, pad, top_k)
    else:
        next_ids = np.zeros((count, 0), dtype=np.int64)
        next_probs = np.zeros((count, 0), dtype=np.float32)
    ll[~seen] = np.nan
    return LmPredictions(tokens, ll, next_ids, next_probs, tokens_of, top_k)


def _drop_pad(ids: np.ndarray, probs: np.ndarray, pad: int, k: int) -> tuple[Any, Any]:
    """Keep the k best of k + 1 candidates per row, never ``<pad>``."""
    keep = ids != pad
    over = keep.sum(axis=1) > k
    keep[over, -1] = False  # no <pad> among them: drop the (k+1)-th
    n = ids.shape[0]
    return ids[keep].reshape(n, k), probs[keep].reshape(n, k)
