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
    per ``chunk`` values and the partial sums then added (``step.sum_of_squares``).

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


def assert_close_at_scale(got: object, want: object, *, roundings: int, err_msg: str = "") -> None:
    """Assert two float32 computations of one function agree where they round differently
    (another kernel, summation order, loss formulation or batch split).

    Each element may differ by 2 * gamma(roundings) times the largest magnitude in ``want``:
    ``roundings`` is the stated condition factor, the roundings compounded along the longest
    chain of the computation, each at most u relative to the magnitudes it combines; those
    magnitudes are assumed no larger than the result's (no catastrophic amplification). The
    scale is the array's, not the element's: an element that cancels to near zero keeps the
    absolute error of the larger terms it was summed from.
    """
    import numpy as np

    got_array = np.asarray(got, dtype=np.float64)
    want_array = np.asarray(want, dtype=np.float64)
    scale = float(np.abs(want_array).max(initial=0.0))
    np.testing.assert_allclose(
        got_array, want_array, rtol=0, atol=2 * gamma(roundings) * scale, err_msg=err_msg
    )


def assert_params_close(got: dict, want: dict, *, roundings: int, context: str = "") -> None:
    """:func:`assert_close_at_scale` for every array of two trainings' parameters (same
    names), each at its own scale: ``roundings`` is the whole training's condition factor,
    typically a step's chain of roundings times the number of update steps."""
    assert got.keys() == want.keys(), f"{context}: {sorted(got)} != {sorted(want)}"
    for name in want:
        assert_close_at_scale(
            got[name], want[name], roundings=roundings, err_msg=f"{context} {name}".strip()
        )


def rnn_chain_roundings(
    steps: int,
    batch: int,
    classes: int,
    *,
    num_embed: int,
    num_hidden: int,
    num_layers: int,
    directions: int = 1,
) -> int:
    """Roundings along the longest chain of a small recurrent network, the condition factor
    for :func:`assert_close_at_scale`: per step, layer and direction a dot over the gates'
    inputs (at most 4 gates: 4 * num_hidden + num_embed values, num_embed standing for a
    lower layer's width too) and the gate nonlinearities (~5), then the output projection
    and softmax over ``classes`` (two passes); a gradient also sums over every position."""
    per_step = 4 * num_hidden + max(num_embed, directions * num_hidden) + 5
    return steps * num_layers * directions * per_step + 2 * classes + steps * batch


def mlp_chain_roundings(features: int, hidden: list[int], classes: int, batch: int) -> int:
    """Roundings along the longest chain of one training step of a small perceptron (the
    ``mlp`` model, softmax output), the condition factor per update for
    :func:`assert_close_at_scale`: forward, a dot and a bias per layer over its input width;
    softmax over ``classes`` (two passes); backward, a dot per layer over its output width;
    the weight gradient's sum over the ``batch`` rows (however it is split over devices or
    workers, the partial sums included); then rescaling and a momentum update (~8)."""
    widths = [features, *hidden, classes]
    forward = sum(width + 1 for width in widths[:-1])
    backward = sum(widths[1:])
    return forward + 2 * classes + backward + batch + 8


def perplexity_rel_bound(perplexity: float, *, roundings: int, tokens: int) -> float:
    """Relative bound between two float32 evaluations of one perplexity, exp(mean negative
    log-likelihood), that round differently (another batch split or device count).

    Each token's likelihood rounds along a chain of ``roundings`` (its magnitudes assumed no
    larger than the mean's, as for :func:`assert_close_at_scale`) and the sum over ``tokens``
    rounds in some order: each side's mean, log(perplexity), is off by at most
    (gamma(roundings) + gamma(tokens)) times itself; exp turns the two sides' absolute
    difference into a relative one."""
    mean_nll = abs(math.log(perplexity))
    return math.expm1(2 * (gamma(roundings) + gamma(tokens)) * mean_nll)


def rescored_rel(
    run: object, perplexity: float, *, steps: int, batch: int, embed: int, hidden: int, layers: int
) -> float:
    """How far a perplexity scored again from ``run``'s checkpoint may be from the one fit
    logged for it: fit evaluates with the training executors, score binds an inference-only
    module (MXNet may fuse its operators for inference), so the two may round differently on
    some CPU even where they agree bit for bit on another. The forward chain of a recurrent
    LM over ``steps`` and the sum over the run's validation tokens (words and one end of
    sentence per line of ``valid.txt`` in the run's config folder)."""
    import json
    from pathlib import Path

    folder = Path(str(run))
    config_dir = Path(json.loads((folder / "run.json").read_text())["config_dir"])
    lines = (config_dir / "valid.txt").read_text().splitlines()
    tokens = sum(len(line.split()) + 1 for line in lines)
    vocab = len(json.loads((folder / "vocab.json").read_text())["tokens"])
    chain = rnn_chain_roundings(
        steps, batch, vocab, num_embed=embed, num_hidden=hidden, num_layers=layers
    )
    return perplexity_rel_bound(perplexity, roundings=chain, tokens=tokens)
