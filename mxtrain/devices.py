"""Devices and threads: ``context:`` into OpenMP/engine thread settings and MXNet contexts.

Every run uses these, on one device or many; kvstores and distributed runs are distributed.py.
"""

from __future__ import annotations

import os
from typing import Any

from mxtrain.errors import ConfigError


def configure_threads(context_cfg: Any) -> dict[str, str]:
    """Set OMP/engine threads (and MXNet's verbosity) in the environment before MXNet loads.

    ``auto`` keeps a value the user exported and otherwise uses every core for OpenMP
    (measured on a 2-core CPU: the fused LSTM trains 1.5x faster with 2 OMP threads than
    with MXNet's default of half the cores). An explicit number in the config always wins.
    Returns the values now in force, for the log.
    """
    omp = context_cfg.omp_threads
    if omp != "auto":
        os.environ["OMP_NUM_THREADS"] = str(omp)
    elif "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
    # MXNet prints "Subgraph backend MKLDNN is activated" from C++ for every bucket it
    # binds, straight to stderr, which tears progress bars; it carries no information.
    os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")
    engine = context_cfg.engine_threads
    if engine != "auto":
        os.environ["MXNET_CPU_WORKER_NTHREADS"] = str(engine)
    return {
        key: os.environ[key]
        for key in ("OMP_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS")
        if key in os.environ
    }


def build_contexts(context_cfg: Any) -> list[Any]:
    """The list of ``mx.Context`` the config asks for, with clear errors for impossible ones."""
    import mxnet as mx

    if context_cfg.devices == "cpu":
        if context_cfg.ids:
            return [mx.cpu(i) for i in context_cfg.ids]
        return [mx.cpu(i) for i in range(context_cfg.count or 1)]
    ids = list(context_cfg.ids) if context_cfg.ids else [0]
    try:
        visible = mx.context.num_gpus()
    except mx.base.MXNetError:
        visible = 0
    if visible == 0:
        features = getattr(mx, "runtime", None)
        cuda = bool(features and features.Features().is_enabled("CUDA"))
        if not cuda:
            raise ConfigError(
                "context.devices is 'gpu' but the installed MXNet is a CPU-only build.",
                hint="Install the GPU wheel matching your CUDA version instead of 'mxnet' "
                "(for example `pip install mxnet-cu112==1.9.1` for CUDA 11.2), or set "
                "context.devices: cpu.",
            )
        raise ConfigError(
            "context.devices is 'gpu' but no GPU is visible to MXNet.",
            hint="Check the driver with nvidia-smi and CUDA_VISIBLE_DEVICES, or set "
            "context.devices: cpu.",
        )
    too_high = [i for i in ids if i >= visible]
    if too_high:
        raise ConfigError(
            f"context.ids asks for GPU {too_high[0]} but only {visible} GPU(s) are visible "
            f"(ids 0..{visible - 1}; CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}).",
            hint="Use ids below the number of visible GPUs.",
        )
    return [mx.gpu(i) for i in ids]
