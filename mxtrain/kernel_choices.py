"""``auto`` kernel settings of a config resolved for this machine (mxtrain.engine.kernels).

Fit resolves them before it builds the model: the resolved values go into the config the run
folder records (so resume, score and predict rebuild the same graph, bit for bit), the log
gets one line per choice and the run folder ``kernels.json`` with the figures behind them.
A config loaded back from a run folder has nothing left to resolve.

The engine times and keeps; this module says what to time (the language models' output layer
and loss, their recurrent layers, the OpenMP probe) and is the measuring process's entry
point: ``python -m mxtrain.kernel_choices REQUEST`` prints the figures as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from mxtrain.config.schema import Config
from mxtrain.engine import kernels
from mxtrain.engine.kernels import Choice, GraphBuilder
from mxtrain.models.language_model_options import LOSS_FORMULATIONS, UNMEASURED_LOSS, LmOptions
from mxtrain.run.atomic import atomic_write_text

log = logging.getLogger("mxtrain")
RUN_FILE = "kernels.json"
#: the module the measuring processes run (this one)
ENTRY = "mxtrain.kernel_choices"


def resolve(
    config: Config,
    data_iter: Any,
    contexts: list[Any],
    *,
    probabilities: bool,
    not_measured: str = "",
    remeasure: bool = False,
) -> tuple[Config, list[Choice]]:
    """``config`` with its ``auto`` kernel settings replaced, and what was chosen and why.

    ``probabilities``: whether training computes the softmax probabilities (a metric reads
    them). ``not_measured``: a reason to take the fallback values instead of measuring (a
    distributed run, whose workers must agree on the graph; a resumed one). ``remeasure``:
    measure again what this machine kept (``mxtrain kernels --measure``).
    """
    options = config.model.options
    info = data_iter.data_info
    lm_options = options if isinstance(options, LmOptions) and info.num_classes else None
    is_lm = lm_options is not None
    ctx = contexts[0]
    request: dict[str, Any] = {"device": ctx.device_type, "device_id": ctx.device_id}
    batch = int(data_iter.provide_data[0].shape[0])
    steps = _steps(data_iter)
    head: list[int] = []  # output layer + loss: rows, hidden, classes (language models)
    head_problem = ""
    if lm_options is not None:
        head = [batch * steps, lm_options.num_hidden, int(info.num_classes)]
        head_problem = f"{head[0]} x {head[1]} -> {head[2]} output layer + loss"
    measurer = _Measurer(str(ctx), measure_in_child, remeasure)
    choices: list[Choice] = []

    context = config.context
    buffers: str = context.large_buffers
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
        # a value of kernels.BUFFER_POLICIES; ContextSection checks it again on replace
        context = dataclasses.replace(context, large_buffers=cast(Any, buffers))
        config = dataclasses.replace(config, context=context)
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
    """The choices kept for one machine and device (the cache is read on first use);
    ``measure_one`` runs one request and returns its figures (:func:`measure_in_child`)."""

    def __init__(
        self,
        device: str,
        measure_one: Callable[[Mapping[str, Any]], dict[str, float]],
        remeasure: bool = False,
    ) -> None:
        self.device = device
        self.measure_one = measure_one
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
                figures.update(self.measure_one(request))
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


def apply_process_settings(config: Config) -> None:
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


# ----------------------------------------------------------------------------- measuring
# What the measuring process (measure_in_child) times. MXNet and the graph builders (which
# import it) are imported inside these functions: in the parent MXNet must load only after
# configure_threads set the OpenMP environment, and the child imports it with the settings it
# was started with.


def measure_in_child(
    request: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> dict[str, float]:
    """Run one measurement (``request["kind"]``: loss, cell, buffers or threads) in a fresh
    Python process (:func:`mxtrain.engine.kernels.run_in_child`) and return its figures."""
    return kernels.run_in_child(ENTRY, request, env)


def _output_layer_and_loss(
    x: Any, classes: int, formulation: str | None = None, *, probabilities: bool = False
) -> Any:
    """Output layer (``pred``) on the rows ``x`` and the loss (``formulation``, default the
    unmeasured one) against ``softmax_label``, padding id 0: lstm_lm's head."""
    import mxnet as mx  # deferred: see the section comment

    from mxtrain.models.rnn_common import loss_heads  # deferred: see the section comment

    logits = mx.sym.FullyConnected(x, num_hidden=classes, name="pred")
    label = mx.sym.Variable("softmax_label")
    heads = loss_heads(
        logits, label, formulation or UNMEASURED_LOSS, 0, probabilities=probabilities
    )
    return heads[0] if len(heads) == 1 else mx.sym.Group(heads)


def _head_graph(
    rows: int, hidden: int, classes: int, formulation: str | None = None, **kw: bool
) -> GraphBuilder:
    """The output layer + loss on ``rows`` x ``hidden`` inputs, built when called."""

    def build() -> tuple[Any, dict[str, tuple[int, ...]]]:
        import mxnet as mx  # deferred: see the section comment

        symbol = _output_layer_and_loss(mx.sym.Variable("x"), classes, formulation, **kw)
        return symbol, {"x": (rows, hidden), "softmax_label": (rows,)}

    return build


def measure_loss(
    ctx: Any, rows: int, hidden: int, classes: int, *, probabilities: bool
) -> dict[str, float]:
    """ms per forward+backward of output layer + loss for each formulation, and of the
    output layer with the engine's one-pass softmax head (``one_pass``)."""
    graphs = {
        formulation: _head_graph(rows, hidden, classes, formulation, probabilities=probabilities)
        for formulation in LOSS_FORMULATIONS
    }
    figures = kernels.measure_graphs(ctx, graphs, classes)
    step = _one_pass_step(ctx, rows, hidden, classes, probabilities=probabilities)
    figures["one_pass"] = round(kernels.median_ms(step), 2)
    return figures


def _one_pass_step(
    ctx: Any, rows: int, hidden: int, classes: int, *, probabilities: bool
) -> Callable[[], None]:
    """The output layer's forward+backward with the one-pass head between them, as the
    module runs it (the labels' host copy read once, as a batch brings it)."""
    import mxnet as mx  # deferred: see the section comment

    from mxtrain.engine.softmax_head import (  # deferred: see the section comment
        SoftmaxGradientHead,
        SoftmaxHeadSpec,
    )
    from mxtrain.models.rnn_common import (  # deferred: see the section comment
        LOGITS_GRADIENT,
        one_pass_head_spec,
        one_pass_heads,
    )

    label = mx.sym.Variable("softmax_label")
    logits = mx.sym.FullyConnected(mx.sym.Variable("x"), num_hidden=classes, name="pred")
    symbol = mx.sym.Group(one_pass_heads(logits, label))
    shapes = {"x": (rows, hidden), "softmax_label": (rows,)}
    executor = kernels.bind_random(symbol, ctx, shapes, classes, no_gradient=[LOGITS_GRADIENT])
    head = SoftmaxGradientHead(
        SoftmaxHeadSpec(**one_pass_head_spec("softmax_label", 0, probabilities)), 1
    )
    labels = executor.arg_dict["softmax_label"]
    buffer = executor.arg_dict[LOGITS_GRADIENT]
    host = labels.asnumpy()

    def step() -> None:
        executor.forward(is_train=True)
        head.forward(0, executor.outputs, labels, host, True, gradient=buffer, hidden=2)
        head.gradient(0)  # written into the input the graph's last node hands on
        executor.backward()

    return kernels.waited(step)


def measure_cell(
    ctx: Any, mode: str, batch: int, steps: int, embed: int, hidden: int, layers: int
) -> dict[str, float]:
    """ms per forward+backward of the recurrent layers, fused and unfused."""

    def layers_graph(fused: bool) -> GraphBuilder:
        def build() -> tuple[Any, dict[str, tuple[int, ...]]]:
            import mxnet as mx  # deferred: see the section comment

            from mxtrain.models.rnn_common import (  # deferred: see the section comment
                RecurrentStack,
                left_to_right_layers,
            )

            stack = RecurrentStack(
                mode, hidden, layers, dropout=0.0, fused=fused, prefix=f"{mode}_"
            )
            out, _ = left_to_right_layers(mx.sym.Variable("x"), steps, stack)
            return mx.sym.MakeLoss(mx.sym.mean(out)), {"x": (batch, steps, embed)}

        return build

    graphs = {cell: layers_graph(cell == "fused") for cell in ("fused", "unfused")}
    return kernels.measure_graphs(ctx, graphs)


def measure_buffer_policy(ctx: Any, rows: int, hidden: int, classes: int) -> float:
    """ms per forward+backward of output layer + loss under the allocator policy in force."""
    graphs = {"head": _head_graph(rows, hidden, classes)}
    return kernels.measure_graphs(ctx, graphs, classes)["head"]


#: the fixed workload the OpenMP settings are measured on (chosen before the data is read):
#: the default word LM's output layer + loss and its recurrent layers, one batch
THREAD_PROBE = {"rows": 1120, "hidden": 200, "classes": 10000, "batch": 32, "steps": 35}


def measure_threads(threads: int, policy: str) -> float:
    """ms of the thread probe in a child process with ``threads`` OpenMP threads and wait
    ``policy`` (environment variables OpenMP reads once, at start)."""
    env = {"OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": policy.upper()}
    request = {"kind": "threads", "device": "cpu", "device_id": 0}
    return measure_in_child(request, env)["probe"]


def _thread_probe(ctx: Any) -> float:
    """ms of one forward+backward of :data:`THREAD_PROBE`'s workload."""

    def build() -> tuple[Any, dict[str, tuple[int, ...]]]:
        import mxnet as mx  # deferred: see the section comment

        from mxtrain.models.rnn_common import (  # deferred: see the section comment
            RecurrentStack,
            left_to_right_layers,
        )

        p = THREAD_PROBE
        stack = RecurrentStack("lstm", p["hidden"], 2, dropout=0.0, fused=True, prefix="lstm_")
        seq, _ = left_to_right_layers(mx.sym.Variable("x"), p["steps"], stack)
        rows = mx.sym.reshape(seq, shape=(-1, p["hidden"]))
        symbol = _output_layer_and_loss(rows, p["classes"])
        return symbol, {"x": (p["batch"], p["steps"], p["hidden"]), "softmax_label": (p["rows"],)}

    return kernels.measure_graphs(ctx, {"probe": build}, THREAD_PROBE["classes"])["probe"]


def _measure(request: Mapping[str, Any]) -> dict[str, float]:
    """What the measuring process does with ``request`` (see measure_in_child)."""
    import mxnet as mx  # deferred: see the section comment

    ctx = mx.gpu(request["device_id"]) if request["device"] == "gpu" else mx.cpu()
    policy = str(request.get("large_buffers"))
    if policy in kernels.BUFFER_POLICIES:
        kernels.set_large_buffers(policy)
    kind = request["kind"]
    if kind == "buffers":
        return {policy: measure_buffer_policy(ctx, *request["shape"])}
    if kind == "loss":
        rows, hidden, classes = request["shape"]
        return measure_loss(ctx, rows, hidden, classes, probabilities=request["probabilities"])
    if kind == "cell":
        return measure_cell(ctx, request["mode"], *request["shape"])
    if kind == "threads":
        return {"probe": _thread_probe(ctx)}
    raise ValueError(f"unknown measurement {kind!r}")


if __name__ == "__main__":
    print(json.dumps(_measure(json.loads(sys.argv[1]))))
