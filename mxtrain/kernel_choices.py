"""``auto`` kernel settings of a config resolved for this machine (mxtrain.engine.kernels).

Fit resolves them before it builds the model: the resolved values go into the config the run
folder records (so resume, score and predict rebuild the same graph, bit for bit), the log
gets one line per choice and the run folder ``kernels.json`` with the figures behind them.
A config loaded back from a run folder has nothing left to resolve.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from mxtrain.engine import kernels
from mxtrain.engine.kernels import Choice

log = logging.getLogger("mxtrain")
RUN_FILE = "kernels.json"


def resolve(
    config: Any,
    data_iter: Any,
    contexts: list[Any],
    *,
    probabilities: bool,
    not_measured: str = "",
    remeasure: bool = False,
) -> tuple[Any, list[Choice]]:
    """``config`` with its ``auto`` kernel settings replaced, and what was chosen and why.

    ``probabilities``: whether training computes the softmax probabilities (a metric reads
    them). ``not_measured``: a reason to take the fallback values instead of measuring (a
    distributed run, whose workers must agree on the graph; a resumed one). ``remeasure``:
    measure again what this machine kept (``mxtrain kernels --measure``).
    """
    from mxtrain.models.rnn_common import UNMEASURED_LOSS, LmOptions

    options = config.model.options
    info = data_iter.data_info
    is_lm = isinstance(options, LmOptions) and bool(info.num_classes)
    ctx = contexts[0]
    request: dict[str, Any] = {"device": ctx.device_type, "device_id": ctx.device_id}
    batch = int(data_iter.provide_data[0].shape[0])
    steps = _steps(data_iter)
    head: list[int] = []  # output layer + loss: rows, hidden, classes (language models)
    head_problem = ""
    if is_lm:
        head = [batch * steps, options.num_hidden, int(info.num_classes)]
        head_problem = f"{head[0]} x {head[1]} -> {head[2]} output layer + loss"
    measurer = _Measurer(str(ctx), remeasure)
    choices: list[Choice] = []

    context = config.context
    buffers = context.large_buffers
    if buffers != "auto":
        choices.append(Choice("context.large_buffers", buffers, "config"))
    else:
        why = not_measured
        if context.devices != "cpu":
            why = "GPU run: the large buffers live on the GPU"
        elif not is_lm:
            why = "measured for language models only"
        if why:
            buffers = "release"
            choices.append(Choice("context.large_buffers", buffers, "fallback", why=why))
        else:
            requests = [
                {**request, "kind": "buffers", "large_buffers": p, "shape": head}
                for p in kernels.BUFFER_POLICIES
            ]
            choice = measurer.choose("context.large_buffers", head_problem, requests, "release")
            buffers = choice.value
            choices.append(choice)
        config = dataclasses.replace(
            config, context=dataclasses.replace(context, large_buffers=buffers)
        )
    request["large_buffers"] = buffers

    if isinstance(options, LmOptions):
        changes: dict[str, Any] = {}
        if options.loss != "auto":
            choices.append(Choice("model.loss", options.loss, "config"))
        elif not_measured or not is_lm:
            why = not_measured or "the data reports no classes"
            choices.append(Choice("model.loss", UNMEASURED_LOSS, "fallback", why=why))
        else:
            problem = head_problem + (" (probabilities kept)" if probabilities else "")
            loss_request = {**request, "kind": "loss", "shape": head}
            loss_request["probabilities"] = probabilities
            choices.append(measurer.choose("model.loss", problem, [loss_request], UNMEASURED_LOSS))
        if options.loss == "auto":
            changes["loss"] = choices[-1].value
        if options.cell != "auto":
            choices.append(Choice("model.cell", options.cell, "config"))
        elif not_measured:
            choices.append(Choice("model.cell", "fused", "fallback", why=not_measured))
        else:
            mode = "gru" if config.model.name == "gru_lm" else "lstm"
            steps = min(steps, kernels.CELL_STEPS)
            shape = [batch, steps, options.num_embed, options.num_hidden, options.num_layers]
            problem = (
                f"{options.num_layers} x {options.num_hidden} {mode}, batch {batch}, "
                f"{steps} steps, input {options.num_embed}"
            )
            cell_request = {**request, "kind": "cell", "mode": mode, "shape": shape}
            choices.append(measurer.choose("model.cell", problem, [cell_request], "fused"))
        if options.cell == "auto":
            changes["cell"] = choices[-1].value
        if changes:
            model = dataclasses.replace(
                config.model, options=dataclasses.replace(options, **changes)
            )
            config = dataclasses.replace(config, model=model)
    return config, choices


class _Measurer:
    """The choices kept for one machine and device (the cache is read on first use)."""

    def __init__(self, device: str, remeasure: bool = False) -> None:
        self.device = device
        self.remeasure = remeasure
        self.cache: kernels.KernelCache | None = None
        self.machine = ""

    def choose(
        self, key: str, problem: str, requests: list[dict[str, Any]], fallback: str
    ) -> Choice:
        """The fastest candidate of ``requests`` (each run in a child process) as this machine
        chose it for ``problem`` the first time (kernels.decide); ``fallback`` when measuring
        fails."""
        if self.cache is None:
            self.cache = kernels.KernelCache(kernels.cache_dir() / kernels.CACHE_FILE)
            self.machine = kernels.machine_key(kernels.machine_facts(self.device))

        def measure() -> dict[str, float]:
            figures: dict[str, float] = {}
            for request in requests:
                figures.update(kernels.measure_in_child(request))
            return figures

        decision = kernels.decide(
            self.cache,
            self.machine,
            f"{key}: {problem}",
            measure,
            fallback,
            remeasure=self.remeasure,
        )
        return Choice(
            key, decision.value, decision.source, problem, decision.figures, why=decision.why
        )


def apply_process_settings(config: Any) -> None:
    """Put the process-wide settings of a resolved config in force (the allocator)."""
    policy = config.context.large_buffers
    if policy != "auto" and not kernels.set_large_buffers(policy):
        log.info("context.large_buffers=%s: not a glibc allocator, left as it is", policy)


def log_choices(choices: list[Choice]) -> None:
    """One log line per choice."""
    for choice in choices:
        log.info("kernel choice %s", choice.describe())


def write_run_file(run_dir: Path, choices: list[Choice], device: str) -> None:
    """RUN/kernels.json: the machine and every choice with the figures behind it."""
    from mxtrain.run.atomic import atomic_write_text

    record = {
        "machine": kernels.machine_facts(device),
        "cache": str(kernels.cache_dir() / kernels.CACHE_FILE),
        "choices": [dataclasses.asdict(c) for c in choices],
    }
    atomic_write_text(run_dir / RUN_FILE, json.dumps(record, indent=1) + "\n")


def _steps(data_iter: Any) -> int:
    """A typical sequence length of the data: the middle bucket's (the largest bucket's when
    the iterator lists none; 1 for data without buckets). The middle, not the largest: the
    allocator measures differently above ~64 MB per buffer (glibc's thread heaps)."""
    buckets = [b for b in getattr(data_iter, "buckets", None) or () if isinstance(b, int)]
    if buckets and all(b > 0 for b in buckets):
        return sorted(buckets)[len(buckets) // 2]
    key = getattr(data_iter, "default_bucket_key", None)
    return key if isinstance(key, int) and key > 0 else 1


def _this_machine(machine: str) -> bool:
    """Whether a cache machine key belongs to this machine, CPU, MXNet and mxtrain (any
    device, thread count or core count)."""
    facts = dict(part.split("=", 1) for part in machine.split(" | ") if "=" in part)
    here = kernels.machine_facts("cpu")
    return all(facts.get(name) == here[name] for name in ("cpu", "isa", "mxnet", "mxtrain"))


def kept_choices() -> dict[str, dict[str, Any]]:
    """This machine's kept choices: ``{machine key: {problem: entry}}``."""
    cache = kernels.KernelCache(kernels.cache_dir() / kernels.CACHE_FILE)
    return {m: dict(v) for m, v in cache.entries.items() if _this_machine(m)}


def forget_choices() -> int:
    """Drop this machine's kept choices, so that the next fit of each shape measures again;
    returns how many were dropped. Raises OSError when the cache cannot be written."""
    cache = kernels.KernelCache(kernels.cache_dir() / kernels.CACHE_FILE)
    with cache.locked():
        return sum(cache.forget(m) for m in list(cache.entries) if _this_machine(m))
