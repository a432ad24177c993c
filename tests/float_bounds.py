"""Rounding-error bounds for float32 sums, derived from the computation rather than measured.

Every float32 operation returns the exact result times (1 + d) with |d| <= u = 2**-24 (round
to nearest, no underflow or overflow). A sum of n terms in ANY order or tree, the order a BLAS
kernel picks for its SIMD width, blocking and threads, which differs per CPU, is then within
gamma(n - 1) * (sum of the terms' magnitudes) of the exact sum, where
gamma(n) = n * u / (1 - n * u) (the standard forward bound for recursive summation, which
holds for every summation order; a fused multiply-add only removes roundings).
"""

from __future__ import annotations

import math

#: unit roundoff of float32 (round to nearest)
FLOAT32_U = 2.0**-24


def gamma(n: int, u: float = FLOAT32_U) -> float:
    """n * u / (1 - n * u): the relative bound on n roundings compounded."""
    if n * u >= 1:
        raise ValueError(f"gamma({n}) is unbounded for u={u}")
    return n * u / (1 - n * u)


def chunked_sum_of_squares_bound(size: int, chunk: int) -> float:
    """Relative error bound of a float32 sum of ``size`` squares summed as one dot product
    per ``chunk`` values and the partial sums then added (``bucketing._sum_of_squares``).

    With S the exact sum of squares, m = min(size, chunk) the longest dot and
    k = ceil(size / chunk) the number of partial sums:

    - a chunk's dot rounds each square once (u) and adds at most m squares in some order
      (gamma(m - 1)); since (1 + u)(1 + gamma(m - 1)) <= 1 + gamma(m) and squares are never
      negative, partial sum s_j is off by at most gamma(m) * S_j (S_j: its exact sum);
    - adding the k computed partial sums in any order is off by at most
      gamma(k - 1) * sum(s_j) <= gamma(k - 1) * (1 + gamma(m)) * S.

    Together: |computed - S| <= ((1 + gamma(m)) * (1 + gamma(k - 1)) - 1) * S.
    """
    longest = min(size, chunk)
    parts = math.ceil(size / chunk)
    return (1 + gamma(longest)) * (1 + gamma(parts - 1)) - 1
