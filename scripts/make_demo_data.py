#!/usr/bin/env python3
"""Write small seeded synthetic datasets for the example configs (numpy only, no MXNet).

    python scripts/make_demo_data.py                 # into configs/data/
    python scripts/make_demo_data.py --out /tmp/demo --rows 500

Files (same seed -> same bytes):

* ``features.npy`` / ``labels.npy`` and ``valid_features.npy`` / ``valid_labels.npy``: Gaussian
  blobs, one per class, in ``--dims`` dimensions (float32 features, int64 class ids), for
  ``configs/ndarray_mlp.yaml``. ``blobs.csv`` / ``valid_blobs.csv`` hold the same rows as CSV
  (columns ``x0..x{D-1}`` and ``label``).
* ``tokens_train.npz`` / ``tokens_valid.npz``: rows of token ids 1..``--vocab``-1 right-padded
  with 0 (``data``, int32) and a label (``label``): 1 when token 5 occurs in the row, else 0,
  for ``configs/text_classifier.yaml``.
* ``sparse_train.svm`` / ``sparse_valid.svm``: LibSVM text (1-based indices), 300 features,
  8 non-zeros per row of which 4 come from the features of the row's class, for
  ``configs/libsvm_mlp.yaml``.

The generated files are not committed (configs/data/.gitignore).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

TRIGGER = 5  # the token whose presence makes a text row positive
SPARSE_FEATURES = 300  # columns of the LibSVM demo data


def blobs(
    rng: np.random.Generator, rows: int, dims: int, classes: int, centers: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` points around ``centers`` (one per class), unit variance, classes balanced."""
    labels = np.arange(rows) % classes
    rng.shuffle(labels)
    features = centers[labels] + rng.normal(size=(rows, dims))
    return features.astype(np.float32), labels.astype(np.int64)


def token_rows(
    rng: np.random.Generator, rows: int, max_len: int, vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """Token-id rows of random lengths 3..max_len, about half of them containing TRIGGER."""
    data = np.zeros((rows, max_len), dtype=np.int32)
    labels = np.zeros(rows, dtype=np.int64)
    others = np.array([t for t in range(1, vocab) if t != TRIGGER])
    for i in range(rows):
        length = int(rng.integers(3, max_len + 1))
        ids = rng.choice(others, size=length)
        if rng.random() < 0.5:
            ids[rng.integers(0, length)] = TRIGGER
            labels[i] = 1
        data[i, :length] = ids
    return data, labels


def write_csv(path: Path, features: np.ndarray, labels: np.ndarray) -> None:
    header = ",".join([*(f"x{j}" for j in range(features.shape[1])), "label"])
    lines = [header]
    for row, label in zip(features, labels, strict=True):
        lines.append(",".join([*(f"{v:.6g}" for v in row), str(int(label))]))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def sparse_rows(
    rng: np.random.Generator, rows: int, features: int, classes: int
) -> tuple[list[list[tuple[int, float]]], np.ndarray]:
    """Sparse rows: 4 of 8 non-zeros from the class's own block of features, 4 anywhere."""
    block = features // (2 * classes)  # class c owns features c*block .. (c+1)*block-1
    labels = np.arange(rows) % classes
    rng.shuffle(labels)
    out = []
    for label in labels:
        own = rng.choice(block, size=4, replace=False) + label * block
        noise = rng.choice(features, size=4, replace=False)
        columns = sorted(set(own.tolist()) | set(noise.tolist()))
        out.append([(c, float(rng.uniform(0.5, 1.5))) for c in columns])
    return out, labels.astype(np.int64)


def write_libsvm(path: Path, rows: list[list[tuple[int, float]]], labels: np.ndarray) -> None:
    """LibSVM text: ``label idx:val ...`` with 1-based indices, as the LibSVM tools write."""
    lines = [
        " ".join([str(int(label)), *(f"{c + 1}:{v:.4g}" for c, v in row)])
        for row, label in zip(rows, labels, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def make(out: Path, *, rows: int, dims: int, classes: int, seed: int, vocab: int) -> list[Path]:
    """Write every demo file into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=0.8, size=(classes, dims))  # overlapping a little
    x, y = blobs(rng, rows, dims, classes, centers)
    vx, vy = blobs(rng, max(rows // 4, classes), dims, classes, centers)
    tx, ty = token_rows(rng, rows, 12, vocab)
    vtx, vty = token_rows(rng, max(rows // 4, 2), 12, vocab)
    written = []
    for name, array in (
        ("features.npy", x),
        ("labels.npy", y),
        ("valid_features.npy", vx),
        ("valid_labels.npy", vy),
    ):
        np.save(out / name, array)
        written.append(out / name)
    write_csv(out / "blobs.csv", x, y)
    write_csv(out / "valid_blobs.csv", vx, vy)
    np.savez(out / "tokens_train.npz", data=tx, label=ty)
    np.savez(out / "tokens_valid.npz", data=vtx, label=vty)
    written += [out / n for n in ("blobs.csv", "valid_blobs.csv")]
    written += [out / n for n in ("tokens_train.npz", "tokens_valid.npz")]
    sparse_rng = np.random.default_rng([seed, 1])  # its own stream: other files are unchanged
    for name, count in (("sparse_train.svm", rows), ("sparse_valid.svm", max(rows // 4, 2))):
        write_libsvm(out / name, *sparse_rows(sparse_rng, count, SPARSE_FEATURES, classes))
        written.append(out / name)
    return written


def main() -> None:
    root = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=root / "configs" / "data")
    parser.add_argument("--rows", type=int, default=2000, help="training rows per dataset")
    parser.add_argument("--dims", type=int, default=20, help="feature dimensions of the blobs")
    parser.add_argument("--classes", type=int, default=3, help="number of blobs (classes)")
    parser.add_argument("--vocab", type=int, default=20, help="token ids 0..vocab-1 (0: padding)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.vocab <= TRIGGER + 1:
        parser.error(f"--vocab must be above {TRIGGER + 1}")
    for path in make(
        args.out,
        rows=args.rows,
        dims=args.dims,
        classes=args.classes,
        seed=args.seed,
        vocab=args.vocab,
    ):
        print(path)


if __name__ == "__main__":
    main()
