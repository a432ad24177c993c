"""Two-dimensional buckets for (source, target) pairs: which bucket holds a pair, the
automatic choice of buckets, and the rows per batch (numpy only; no MXNet import).

A bucket is a key ``(S, T)``: ``S`` source positions and ``T`` decoder positions; a pair of
``s`` source tokens and ``t`` decoder positions (target tokens + 1) fits it when ``s <= S``
and ``t <= T``. A pair goes to the bucket that holds it with the fewest positions ``S + T``
(ties: the smaller ``T``, then the smaller ``S``), so its padding ``(S - s) + (T - t)`` is
the least the buckets allow. The default bucket is the elementwise maximum of all buckets
and must be one of them: every other bucket binds within its memory.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

log = logging.getLogger(__name__)

#: automatic buckets take each side's lengths from at most this many values (every distinct
#: length when there are fewer, else length quantiles and the longest), which bounds the
#: search to GRID_VALUES**2 candidate buckets
GRID_VALUES = 32

Bucket = tuple[int, int]


def sort_buckets(buckets: Sequence[Sequence[int]]) -> list[Bucket]:
    """The distinct buckets as ``(S, T)`` tuples, in the order pairs look for theirs: fewest
    positions first, then the smaller ``T``, then the smaller ``S``."""
    keys = {(int(b[0]), int(b[1])) for b in buckets}
    return sorted(keys, key=lambda b: (b[0] + b[1], b[1], b[0]))


def largest_bucket(buckets: Sequence[Bucket]) -> Bucket:
    """The elementwise maximum of ``buckets``: the default bucket."""
    return max(b[0] for b in buckets), max(b[1] for b in buckets)


def assign_buckets(
    source_lengths: np.ndarray, decoder_lengths: np.ndarray, buckets: Sequence[Bucket]
) -> np.ndarray:
    """For each pair the index (into ``buckets``, as :func:`sort_buckets` orders them) of
    the first bucket that holds it, or -1 when none does."""
    s = np.asarray(source_lengths, dtype=np.int64)
    t = np.asarray(decoder_lengths, dtype=np.int64)
    if s.size == 0:
        return np.zeros(0, dtype=np.int64)
    combos, inverse = np.unique(np.stack([s, t], axis=1), axis=0, return_inverse=True)
    keys = np.asarray(buckets, dtype=np.int64).reshape(-1, 2)
    fits = (combos[:, None, 0] <= keys[None, :, 0]) & (combos[:, None, 1] <= keys[None, :, 1])
    first = np.where(fits.any(axis=1), fits.argmax(axis=1), -1)
    return first[inverse.reshape(-1)]


def padding_share(
    source_lengths: np.ndarray, decoder_lengths: np.ndarray, buckets: Sequence[Bucket]
) -> float:
    """Share of padded positions (source and decoder together) when each pair that fits is
    padded to its bucket; pairs no bucket holds are not counted."""
    which = assign_buckets(source_lengths, decoder_lengths, buckets)
    held = which >= 0
    if not held.any():
        return 0.0
    keys = np.asarray(buckets, dtype=np.int64).reshape(-1, 2)
    positions = float(keys[which[held]].sum())
    tokens = float(np.asarray(source_lengths)[held].sum() + np.asarray(decoder_lengths)[held].sum())
    return 1.0 - tokens / positions


def _grid(lengths: np.ndarray) -> np.ndarray:
    """The candidate bucket lengths of one side (see :data:`GRID_VALUES`)."""
    values = np.unique(lengths)
    if values.size <= GRID_VALUES:
        return values
    fractions = np.arange(1, GRID_VALUES) / GRID_VALUES
    inner = np.quantile(lengths, fractions, method="inverted_cdf")
    return np.unique(np.concatenate([inner.astype(np.int64), [values[-1]]]))


def auto_pair_buckets(
    source_lengths: np.ndarray,
    decoder_lengths: np.ndarray,
    max_padding: float,
    num_buckets: int | None,
) -> list[Bucket]:
    """``buckets: auto``: few buckets whose padding share stays within ``max_padding``.

    Candidate buckets are the grid of each side's lengths (:data:`GRID_VALUES`); a pair's
    padding in a bucket is ``(S + T) - (s + t)``, so only its bucket's size ``S + T``
    matters and pairs can be counted per grid cell (its lengths rounded up to the grid).
    Starting from the default bucket ``(max s, max t)``, each step adds the candidate that
    removes the most padded positions, until the share is within ``max_padding`` or
    ``num_buckets`` (None: no cap) are reached; then buckets whose removal keeps the share
    within it are dropped again, the least useful first. A greedy search: few buckets, not
    provably the fewest. Each bucket's last-batch filling is not counted here.
    """
    s = np.asarray(source_lengths, dtype=np.int64)
    t = np.asarray(decoder_lengths, dtype=np.int64)
    if s.size == 0:
        raise ValueError("no lengths to derive buckets from")
    grid_s, grid_t = _grid(s), _grid(t)
    cell_s = grid_s[np.searchsorted(grid_s, s, side="left")]
    cell_t = grid_t[np.searchsorted(grid_t, t, side="left")]
    cells, counts = np.unique(np.stack([cell_s, cell_t], axis=1), axis=0, return_counts=True)
    weights = counts.astype(np.float64)
    tokens = float(s.sum() + t.sum())
    limit = max_padding / (1.0 - max_padding) * tokens + 1e-9  # pad <= limit <=> share <= m
    candidates = np.stack(np.meshgrid(grid_s, grid_t, indexing="ij"), axis=-1).reshape(-1, 2)
    size = candidates.sum(axis=1).astype(np.float64)
    # fits[k, i]: candidate k holds cell i
    fits = (cells[None, :, 0] <= candidates[:, None, 0]) & (
        cells[None, :, 1] <= candidates[:, None, 1]
    )
    chosen = [int(np.flatnonzero((candidates == cells.max(axis=0)).all(axis=1))[0])]
    best = np.full(cells.shape[0], size[chosen[0]])  # each cell's bucket size so far
    cap = math.inf if num_buckets is None else num_buckets
    while _padding(best, weights, tokens) > limit and len(chosen) < cap:
        gains = (np.where(fits, np.maximum(best[None, :] - size[:, None], 0.0), 0.0) * weights).sum(
            axis=1
        )
        k = int(np.argmax(gains))
        if gains[k] <= 0:
            break
        chosen.append(k)
        best = np.where(fits[k], np.minimum(best, size[k]), best)
    chosen = _prune(chosen, fits, size, weights, tokens, limit)
    best = np.min(np.where(fits[chosen], size[chosen][:, None], np.inf), axis=0)
    pad = _padding(best, weights, tokens)
    if pad > limit:
        log.warning(
            "buckets: auto: %d buckets leave %.1f%% padding, more than max_padding %.1f%%; "
            "allow more buckets (num_buckets, or null) to lower it",
            len(chosen),
            100 * pad / (tokens + pad),
            100 * max_padding,
        )
    return sort_buckets([(int(candidates[k, 0]), int(candidates[k, 1])) for k in chosen])


def _padding(best: np.ndarray, weights: np.ndarray, tokens: float) -> float:
    """Padded positions when the cells' pairs (``weights`` of them each) are padded to
    bucket sizes ``best``, ``tokens`` being their real positions."""
    return float((weights * best).sum()) - tokens


def _prune(
    chosen: list[int],
    fits: np.ndarray,
    size: np.ndarray,
    weights: np.ndarray,
    tokens: float,
    limit: float,
) -> list[int]:
    """Drop buckets (never the first, the default) while the padding stays within ``limit``,
    each time the one whose removal adds the least padding."""
    chosen = list(chosen)
    while len(chosen) > 1:
        costs = []
        for j in range(1, len(chosen)):
            rest = chosen[:j] + chosen[j + 1 :]
            best = np.min(np.where(fits[rest], size[rest][:, None], np.inf), axis=0)
            costs.append(_padding(best, weights, tokens))
        j = int(np.argmin(costs))
        if costs[j] > limit:
            break
        del chosen[j + 1]
    return chosen


def bucket_rows(bucket: Bucket, default: Bucket, batch_size: int, batch_tokens: int | None) -> int:
    """Pairs per batch in ``bucket``: ``batch_size``, or with ``batch_tokens``
    ``max(1, B // T)`` (rounded down), where ``B`` is ``batch_tokens`` lowered to a multiple
    of the default bucket's ``T`` (at least one row), and at most as many rows as keep the
    bucket's source and target positions within the default bucket's: the module binds the
    default bucket first and every other one shares its memory."""
    if batch_tokens is None:
        return batch_size
    default_rows = max(1, batch_tokens // default[1])
    budget = min(batch_tokens, default_rows * default[1])
    rows = budget // bucket[1]
    rows = min(rows, default_rows * default[0] // bucket[0])
    return max(1, rows)
