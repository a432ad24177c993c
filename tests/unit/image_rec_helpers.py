"""Tiny RecordIO image files for tests, written without OpenCV or PIL.

Images are encoded as PNG by hand (zlib + struct) and packed with ``mx.recordio``; MXNet's
``ImageRecordIter`` decodes them with its built-in OpenCV.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np


def png_bytes(image: np.ndarray) -> bytes:
    """PNG encoding of an ``(H, W)`` gray or ``(H, W, 3)`` RGB uint8 image."""
    image = np.ascontiguousarray(image, dtype=np.uint8)
    height, width = image.shape[:2]
    color = 0 if image.ndim == 2 else 2  # gray or truecolour
    raw = b"".join(b"\x00" + image[r].tobytes() for r in range(height))  # filter 0 per row

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def write_image_rec(
    folder: Path, name: str, images: list[np.ndarray], labels: list[float]
) -> tuple[Path, Path]:
    """Write ``name.rec`` and ``name.idx`` in ``folder``: one PNG record per image."""
    import mxnet as mx

    rec, idx = folder / f"{name}.rec", folder / f"{name}.idx"
    writer = mx.recordio.MXIndexedRecordIO(str(idx), str(rec), "w")
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        header = mx.recordio.IRHeader(0, float(label), i, 0)
        writer.write_idx(i, mx.recordio.pack(header, png_bytes(image)))
    writer.close()
    return rec, idx


def bright_dark_images(
    count: int, *, size: int = 8, seed: int = 0
) -> tuple[list[np.ndarray], list[float]]:
    """RGB images: label 1 is bright (values 160..255), label 0 dark (0..95), alternating."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for i in range(count):
        label = i % 2
        low, high = (160, 256) if label else (0, 96)
        images.append(rng.integers(low, high, size=(size, size, 3), dtype=np.uint8))
        labels.append(float(label))
    return images, labels
