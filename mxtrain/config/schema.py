"""The experiment file's schema: one frozen dataclass per YAML section, defaults explained.

Read this file like the top of nanoGPT's ``train.py``: every field says what it does and what
its default means; ``mxtrain check --explain`` prints the same text next to the resolved values.
Sections check their own values in ``__post_init__`` and raise :class:`InvalidValue` naming the
key, so the loader can point at the YAML line. Checks that span sections live in the loader.

Optimizer and initializer parameters are checked against static tables of MXNet 1.9.1's
constructors (:data:`OPTIMIZERS`, :data:`INITIALIZERS`); a unit test compares them with the real
signatures. Nothing here imports MXNet, click or YAML.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Literal, Protocol, TypeAlias

from mxtrain.config.names import run_name_problem
from mxtrain.errors import InvalidValue
from mxtrain.option_checks import (
    Bounds,
    check_at_least,
    check_bounds,
    check_choice,
    check_float32,
    check_greater_than_zero,
    check_thread_count,
    documented,
    show_number,
)
from mxtrain.registry import DECODING_MODELS, ITERATORS, MODELS, PARALLEL_ITERATORS
from mxtrain.text_metrics import DECODING_METRICS, is_decoding_metric


class _Required:
    """Marks a field with no default (``explain_config`` shows it as ``required``)."""

    _instance: ClassVar[_Required | None] = None

    def __new__(cls) -> _Required:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "required"

    def __reduce__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


def _frozen_mapping(values: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(values or {}))


# --------------------------------------------------------------------------------------------
# experiment
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExperimentSection:
    """Who this run is and where its folder goes."""

    name: str = documented(
        "",
        "name of the experiment and of its run folder; defaults to the config file's "
        "name without .yaml (ptb.yaml -> ptb)",
    )
    seed: int = documented(
        1,
        "seed of every random choice (initial weights, dropout, shuffling) in Python, "
        "NumPy and MXNet; the same seed and config give the same run",
    )
    runs_dir: str = documented(
        "runs", "folder that holds one sub-folder per run (relative to the current directory)"
    )

    def __post_init__(self) -> None:
        problem = run_name_problem(self.name)
        if problem is not None:
            raise InvalidValue("name", problem)
        if not 0 <= self.seed < 2**31:
            raise InvalidValue("seed", f"must be between 0 and 2**31 - 1, got {self.seed}.")
        if not self.runs_dir.strip():
            raise InvalidValue("runs_dir", "must not be empty.")
        if "\0" in self.runs_dir or any(0xD800 <= ord(c) <= 0xDFFF for c in self.runs_dir):
            raise InvalidValue("runs_dir", f"is not a path the OS accepts, got {self.runs_dir!r}.")


# --------------------------------------------------------------------------------------------
# model / data: components picked from a registry by name, options checked by their dataclass
# --------------------------------------------------------------------------------------------


class OptionsDataclass(Protocol):
    """An instance of a component's options dataclass (a built-in's or a plugin's)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


#: a component's options: its options dataclass, or a plugin's keywords as written
ComponentOptions: TypeAlias = OptionsDataclass | Mapping[str, Any] | None


@dataclass(frozen=True)
class ComponentSection:
    """A registered component (or a plugin) and its options.

    ``options`` is an instance of the component's options dataclass, or, for a plugin without
    one, a read-only mapping of the keys given in the file.
    """

    selector: ClassVar[str] = "name"

    name: str = documented(
        "", "registered name, or a plugin: 'package.module:attr' / 'file.py:attr'"
    )
    options: ComponentOptions = documented(
        None, "the component's own options (the other keys of the section)"
    )


@dataclass(frozen=True)
class CallbackSection(ComponentSection):
    """One ``fit.callbacks`` entry: a callback plugin and its options."""

    selector: ClassVar[str] = "name"

    name: str = documented("", "the callback: 'package.module:attr' / 'file.py:attr'")


@dataclass(frozen=True)
class ModelSection(ComponentSection):
    """The network. ``name`` picks a model builder; the other keys are its options."""

    selector: ClassVar[str] = "name"

    name: str = documented(
        "lstm_lm",
        f"model builder: a built-in ({', '.join(MODELS.available())}; see "
        "`mxtrain list models`), or your own as 'package.module:attr' or "
        "'path/to/file.py:attr' (relative to the config file's folder)",
    )
    options: ComponentOptions = documented(
        None, "options of that model (the other keys of the model section)"
    )


@dataclass(frozen=True)
class IteratorSection(ComponentSection):
    """One data iterator. ``iterator`` picks the implementation; other keys are its options."""

    selector: ClassVar[str] = "iterator"

    name: str = documented(
        "bucket_sentence",
        f"data iterator: a built-in ({', '.join(ITERATORS.available())}; see "
        "`mxtrain list iterators`), or your own as 'package.module:attr' or "
        "'path/to/file.py:attr'",
    )
    options: ComponentOptions = documented(
        None, "options of that iterator (the other keys of the section)"
    )


@dataclass(frozen=True)
class DataSection:
    """Training data (required) and evaluation data (optional)."""

    train: IteratorSection = documented(
        REQUIRED, "iterator that feeds training batches (required); its vocabulary is saved"
    )
    eval: IteratorSection | None = documented(
        None,
        "iterator scored after every epoch (null: no evaluation); it reuses the "
        "training vocabulary and buckets. Several sets: a mapping of names to iterator "
        "sections ({valid: {...}, test: {...}}), each scored at every evaluation, their "
        "metrics named set.metric (valid.perplexity); this key then holds the first set",
    )
    eval_sets: tuple[tuple[str, IteratorSection], ...] = documented(
        (), "the named sets of a data.eval mapping, in file order (empty: one unnamed set)"
    )

    @property
    def eval_set_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.eval_sets)


# --------------------------------------------------------------------------------------------
# context / kvstore
# --------------------------------------------------------------------------------------------

Devices = Literal["cpu", "gpu"]
KVStoreType = Literal[
    "local", "device", "nccl", "dist_sync", "dist_device_sync", "dist_async", "horovod"
]


@dataclass(frozen=True)
class ContextSection:
    """Which devices compute, and how many threads the CPU side gets."""

    devices: Devices = documented("cpu", "cpu or gpu")
    ids: tuple[int, ...] | None = documented(
        None,
        "device ids to use, e.g. [0, 1] for two GPUs (null: device 0); each batch is "
        "split across them",
    )
    count: int | None = documented(
        None,
        "cpu only: number of CPU contexts to split each batch over (null: 1); use ids "
        "or count, not both",
    )
    work_load: tuple[float, ...] | None = documented(
        None, "relative share of each batch per device, one number per device (null: equal shares)"
    )
    omp_threads: int | Literal["auto"] = documented(
        "auto",
        "OpenMP threads per operator; auto: an exported OMP_NUM_THREADS, else the "
        "fastest count measured once per machine and kept, like the other kernel choices "
        "(the count changes float rounding, so it does not follow the load; distributed "
        "processes take the free cores; MXNet itself would use half the cores); at most "
        "1024",
    )
    omp_wait_policy: Literal["auto", "active", "passive"] = documented(
        "auto",
        "OMP_WAIT_POLICY: whether idle OpenMP threads spin (active) or sleep "
        "(passive); auto: an exported OMP_WAIT_POLICY, else measured with the thread count "
        "once per machine and cached (see omp_threads)",
    )
    engine_threads: int | Literal["auto"] = documented(
        "auto",
        "MXNet engine worker threads per device (MXNET_CPU_WORKER_NTHREADS / "
        "MXNET_GPU_WORKER_NTHREADS), at most 1024; auto: MXNet's default",
    )
    large_buffers: Literal["auto", "reuse", "release"] = documented(
        "auto",
        "reuse: freed memory stays in the process (glibc: no mmap, no trimming, one "
        "arena), so "
        "the tens of MB some operators allocate every batch are not page-faulted in again; "
        "release: glibc's default; auto: the faster on this machine, measured once and "
        "cached (GPU runs: release)",
    )

    def __post_init__(self) -> None:
        if self.ids is not None:
            if not self.ids:
                raise InvalidValue("ids", "must list at least one device id (or be null).")
            if any(i < 0 for i in self.ids):
                raise InvalidValue("ids", f"must not be negative, got {list(self.ids)}.")
            if len(set(self.ids)) != len(self.ids):
                raise InvalidValue("ids", f"lists a device twice: {list(self.ids)}.")
        if self.count is not None:
            if self.devices != "cpu":
                raise InvalidValue(
                    "count",
                    "only applies to devices: cpu (it is the number of CPU contexts); "
                    "for GPUs list the devices in context.ids.",
                )
            if self.ids is not None:
                raise InvalidValue("count", "and context.ids cannot both be set: give one of them.")
            check_at_least("count", self.count, 1)
        if self.work_load is not None:
            if len(self.work_load) != self.num_devices:
                raise InvalidValue(
                    "work_load",
                    f"needs one number per device: {self.num_devices} device(s) are "
                    f"configured, got {len(self.work_load)} number(s).",
                )
            if any(not w > 0 for w in self.work_load):
                raise InvalidValue(
                    "work_load", f"must be positive numbers, got {list(self.work_load)}."
                )
        for key in ("omp_threads", "engine_threads"):
            if getattr(self, key) != "auto":
                check_thread_count(key, getattr(self, key))
        check_choice("large_buffers", self.large_buffers, ("auto", "reuse", "release"))
        check_choice("omp_wait_policy", self.omp_wait_policy, ("auto", "active", "passive"))

    @property
    def num_devices(self) -> int:
        """How many contexts a batch is split over."""
        if self.ids is not None:
            return len(self.ids)
        return self.count if self.count is not None else 1


@dataclass(frozen=True)
class GradientCompressionSection:
    """Low-bit gradient compression (kvstore device and dist_*)."""

    type: Literal["2bit", "1bit"] = documented(
        "2bit",
        "2bit: each gradient value is sent as -threshold, 0 or +threshold, the "
        "rest is kept and added to the next gradient (MXNet 1.9.1 has no 1bit)",
    )
    threshold: float = documented(0.5, "quantization threshold (greater than 0)")

    def __post_init__(self) -> None:
        if self.type == "1bit":
            raise InvalidValue(
                "type",
                "1bit is not available in MXNet 1.9.1 (its kvstores only know 2bit); "
                "use type: 2bit.",
            )
        check_greater_than_zero("threshold", self.threshold)


COMPRESSION_HINT = (
    "Use kvstore.type device (several devices) or a dist_* kvstore, or remove gradient_compression."
)


def gradient_compression_problem(kv_type: str) -> str | None:
    """Why kvstore ``kv_type`` cannot compress gradients, or None (checked by check and fit)."""
    if kv_type in ("local", "nccl", "horovod"):
        return (
            f"kvstore.gradient_compression is not supported by kvstore.type {kv_type}: MXNet "
            "compresses gradients only for the device and dist_* kvstores."
        )
    return None


SHARDING_HINT = (
    "Use an iterator that supports num_parts/part_index (ndarray, csv, libsvm, "
    "bucket_sentence, image_record, ...), or give your plugin iterator those options."
)


def sharding_problem(kv_type: str, iterator: str, options: ComponentOptions) -> str | None:
    """Why data.train cannot be split between the workers of a ``dist_*`` kvstore, or None.

    Each worker reads one part (``num_parts``/``part_index``, set by fit from its rank); a
    plugin iterator (options as a mapping) must list ``num_parts`` in its section. Checked by
    check and by fit.
    """
    if not kv_type.startswith("dist"):
        return None
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        shardable = {"num_parts", "part_index"} <= {f.name for f in dataclasses.fields(options)}
    else:
        shardable = isinstance(options, Mapping) and "num_parts" in options
    if shardable:
        return None
    return (
        f"the iterator {iterator!r} cannot be sharded between distributed workers (it has no "
        f"num_parts/part_index options), which kvstore.type {kv_type} needs."
    )


@dataclass(frozen=True)
class KVStoreSection:
    """How gradients from several devices or machines are combined."""

    type: KVStoreType = documented(
        "local",
        "local (aggregate on CPU), device (aggregate on GPUs), nccl (GPUs), dist_sync / "
        "dist_device_sync / dist_async (several machines, see mxtrain launch), horovod",
    )
    update_on_kvstore: bool | Literal["auto"] = documented(
        "auto",
        "true: the kvstore runs the optimizer; false: each device updates its own copy; "
        "auto: MXNet's choice (dist_async always updates on the kvstore)",
    )

    gradient_compression: GradientCompressionSection | None = documented(
        None,
        "e.g. {type: 2bit, threshold: 0.5}: send gradients in 2 bits per value "
        "(device and dist_* kvstores; null: full precision)",
    )
    watchdog_seconds: float | None = documented(
        600.0,
        "dist_* only: a worker that makes no progress (no log interval, epoch "
        "start or end) for this long exits with an error so the job ends instead of "
        "hanging; keep it above the time of one log interval plus one evaluation "
        "(null: no watchdog)",
    )

    def __post_init__(self) -> None:
        check_greater_than_zero("watchdog_seconds", self.watchdog_seconds)
        if self.type in ("dist_sync", "dist_device_sync") and self.update_on_kvstore is True:
            raise InvalidValue(
                "update_on_kvstore",
                f"cannot be true with kvstore.type {self.type} in mxtrain: workers agree on "
                "batch counts and stops through the servers, which must therefore only sum "
                "what workers push (not run the optimizer); with false each worker runs the "
                "same update on the summed gradients, so training is identical and rank 0 can "
                "checkpoint the optimizer state. Set it to false or auto.",
            )
        if self.type == "dist_async" and self.update_on_kvstore is False:
            raise InvalidValue(
                "update_on_kvstore",
                "cannot be false with kvstore.type dist_async: asynchronous training "
                "updates on the servers. Set it to true or auto.",
            )
        if self.type == "horovod" and self.update_on_kvstore is True:
            raise InvalidValue(
                "update_on_kvstore",
                "cannot be true with kvstore.type horovod: horovod only all-reduces "
                "gradients. Set it to false or auto.",
            )


# --------------------------------------------------------------------------------------------
# optimizer
# --------------------------------------------------------------------------------------------

LrSchedulerType = Literal["factor", "multifactor", "poly", "cosine", "plateau"]

#: learning rates and weight decay (0 aside): MXNet multiplies them by the multipliers, bias
#: corrections and schedules before its operators take them as 32-bit floats, which refuse
#: magnitudes below 1.2e-38 or above 3.4e38; within these bounds every product stays
#: representable (a rate below 1e-20 would not move a float32 weight anyway)
MIN_RATE = 1e-20
RATE = Bounds(MIN_RATE, 1e6)
#: lr_mult / wd_mult values (0 aside), for the same reason
MULTIPLIER = Bounds(1e-6, 1e6)
#: update (or epoch) counts of a schedule: MXNet's schedulers compute with them as floats,
#: which are exact up to 2**53 (about 9e15) and overflow on much larger integers
MAX_SCHEDULE_COUNT = 10**15
UNIT_INTERVAL = Bounds(0.0, 1.0, high_open=True)
POSITIVE = Bounds(0.0, low_open=True)
NON_NEGATIVE = Bounds(0.0)


def check_rate(key: str, value: float | None, bounds: Bounds = RATE) -> None:
    """Refuse a rate (or multiplier) other than 0 outside ``bounds`` (None: not set)."""
    if value is not None and value != 0 and value not in bounds:
        raise InvalidValue(key, f"must be 0 or {bounds.describe()}, got {show_number(value)}.")


#: Keys of ``optimizer.lr_scheduler`` that apply to each scheduler type (``type`` aside).
LR_SCHEDULER_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "factor": ("step", "factor", "stop_factor_lr"),
        "multifactor": ("steps", "factor"),
        "poly": ("max_update", "final_lr", "pwr"),
        "cosine": ("max_update", "final_lr"),
        "plateau": ("metric", "mode", "factor", "patience", "cooldown", "min_lr", "min_delta"),
    }
)
LR_WARMUP_KEYS = ("warmup_steps", "warmup_begin_lr", "warmup_mode")
#: keys that apply to every scheduler type
LR_COMMON_KEYS = (*LR_WARMUP_KEYS, "unit")
LR_REQUIRED_KEYS: Mapping[str, str] = MappingProxyType(
    {"factor": "step", "multifactor": "steps", "plateau": "metric"}
)
#: scheduler types whose max_update may be null: the run's length (fit.num_epoch epochs)
LR_HORIZON_TYPES = ("poly", "cosine")


#: an epoch-counted schedule resolves epochs to 1/1000 (EpochSchedule scales by 1000)
EPOCH_RESOLUTION_MIN = 0.001


@dataclass(frozen=True)
class LrSchedulerSection:
    """Learning-rate schedule, counted in updates (batches), starting from the optimizer's
    ``learning_rate``: the schedule's base lr IS ``optimizer.learning_rate``, so there is
    exactly one place to set it and MXNet never overrides one with the other."""

    type: LrSchedulerType = documented(
        REQUIRED,
        "factor: multiply by factor every step updates; multifactor: at each of steps; "
        "poly / cosine: decay to final_lr over max_update updates; plateau: multiply by "
        "factor when the eval metric has not improved for patience evaluations",
    )
    step: int | None = documented(None, "factor: updates between two decays (required for factor)")
    steps: tuple[int | float, ...] | None = documented(
        None,
        "multifactor: increasing update counts at which lr is multiplied by factor "
        "(with unit: epochs, epoch counts, fractions allowed: [0.75, 3] decays three "
        "quarters into the first epoch and when the fourth starts)",
    )
    factor: float | None = documented(
        None,
        "multiplier applied at each decay: factor / multifactor (<= 1; null: 1), plateau "
        "(< 1; null: 0.5)",
    )
    stop_factor_lr: float = documented(1e-8, "factor: the lr never decays below this")
    max_update: int | None = documented(
        None,
        "poly / cosine: update count at which lr reaches final_lr; null: the run's length "
        "(fit.num_epoch, with unit: epochs)",
    )
    final_lr: float = documented(0.0, "poly / cosine: lr at max_update and after")
    pwr: float = documented(2.0, "poly: power of the polynomial (1 = linear decay)")
    warmup_steps: int = documented(
        0, "updates spent warming up before the schedule starts (0 = none)"
    )
    warmup_begin_lr: float = documented(0.0, "lr at update 0 of the warmup")
    warmup_mode: Literal["linear", "constant"] = documented(
        "linear", "warmup: ramp linearly to the base lr, or hold warmup_begin_lr constant"
    )
    metric: str | None = documented(
        None, "plateau: the eval metric watched (one of the evaluations' metrics)"
    )
    mode: Literal["auto", "min", "max"] = documented(
        "auto", "plateau: lower or higher is better; auto: as the metric declares"
    )
    patience: int = documented(
        2, "plateau: evaluations without improvement tolerated; the next one decays the lr"
    )
    cooldown: int = documented(
        0, "plateau: evaluations after a decay during which no improvement is counted"
    )
    min_lr: float = documented(0.0, "plateau: the lr never decays below this")
    min_delta: float = documented(
        0.0, "plateau: smallest change of the metric that counts as an improvement"
    )
    unit: Literal["updates", "epochs"] = documented(
        "updates",
        "what step, steps, max_update and warmup_steps count: updates, or epochs "
        "(the lr follows the epochs trained so far, fractions included: multifactor "
        "steps: [4] decays when the fifth epoch starts; updates run on the workers)",
    )

    def _check_steps(self, steps: tuple[int | float, ...]) -> None:
        increasing = all(a < b for a, b in itertools.pairwise(steps))
        if self.unit == "epochs":
            if not steps or steps[0] < EPOCH_RESOLUTION_MIN or not increasing:
                raise InvalidValue(
                    "steps",
                    "must be increasing epoch counts (fractions allowed) of at least "
                    f"{EPOCH_RESOLUTION_MIN:g}, got {list(steps)}.",
                )
            return
        if any(isinstance(s, float) and not s.is_integer() for s in steps):
            raise InvalidValue(
                "steps",
                f"counts updates, so it must list whole numbers, got {list(steps)}; fractions "
                "need unit: epochs.",
            )
        if not steps or steps[0] < 1 or not increasing:
            raise InvalidValue(
                "steps", f"must be increasing update counts of at least 1, got {list(steps)}."
            )
        object.__setattr__(self, "steps", tuple(int(s) for s in steps))  # 100.0 -> 100

    def __post_init__(self) -> None:
        check_choice("unit", self.unit, ("updates", "epochs"))
        if self.factor is None:
            object.__setattr__(self, "factor", 0.5 if self.type == "plateau" else 1.0)
        required = LR_REQUIRED_KEYS.get(self.type)
        if required is not None and getattr(self, required) is None:
            raise InvalidValue(
                "type",
                f"{self.type!r} needs lr_scheduler.{required}: "
                + {
                    "step": "the number of updates between two decays, e.g. step: 1000.",
                    "steps": "the update counts at which to decay, e.g. steps: [1000, 2000].",
                    "metric": "the eval metric to watch, e.g. metric: perplexity.",
                }[required],
            )
        for key in ("step", "max_update", "warmup_steps"):
            check_bounds(key, getattr(self, key), Bounds(high=MAX_SCHEDULE_COUNT))
        if self.step is not None:
            check_at_least("step", self.step, 1)
        if self.steps is not None:
            self._check_steps(self.steps)
            check_bounds("steps", max(self.steps), Bounds(high=MAX_SCHEDULE_COUNT))
        factor = float(self.factor or 0.0)  # resolved above
        if self.type in ("factor", "multifactor") and not 0 < factor <= 1:
            raise InvalidValue(
                "factor", f"must be in (0, 1] so the lr decreases, got {self.factor!r}."
            )
        if self.type == "plateau":
            if not 0 < factor < 1:
                raise InvalidValue(
                    "factor", f"must be in (0, 1) so the lr decreases, got {self.factor!r}."
                )
            check_choice("mode", self.mode, ("auto", "min", "max"))
            for key in ("patience", "cooldown"):
                check_at_least(key, getattr(self, key), 0)
            check_at_least("min_delta", self.min_delta, 0.0)
            check_at_least("min_lr", self.min_lr, 0)
            check_rate("min_lr", self.min_lr)
        check_at_least("stop_factor_lr", self.stop_factor_lr, 0)
        check_at_least("final_lr", self.final_lr, 0)
        # a negative power divides by zero when the schedule ends (0 ** pwr)
        check_bounds("pwr", self.pwr, POSITIVE)
        if self.max_update is not None:
            check_at_least("max_update", self.max_update, 1)
            if self.type in ("poly", "cosine") and self.warmup_steps >= self.max_update:
                raise InvalidValue(
                    "warmup_steps",
                    f"({self.warmup_steps}) must be smaller than max_update "
                    f"({self.max_update}): the decay happens after the warmup.",
                )
        check_at_least("warmup_steps", self.warmup_steps, 0)
        check_at_least("warmup_begin_lr", self.warmup_begin_lr, 0)
        for key in ("stop_factor_lr", "final_lr", "warmup_begin_lr"):
            check_rate(key, getattr(self, key))

    def applicable_keys(self) -> tuple[str, ...]:
        """The keys that mean something for this ``type``, in schema order."""
        keys = {"type", *LR_SCHEDULER_KEYS[self.type], *LR_COMMON_KEYS}
        return tuple(f.name for f in dataclasses.fields(self) if f.name in keys)


@dataclass(frozen=True)
class ParamSpec:
    """One keyword parameter of an MXNet optimizer or initializer constructor."""

    type: Any  # annotation the loader checks values against (float, bool, Literal[...], ...)
    default: Any
    doc: str
    #: the numbers the constructor accepts (None: any the type allows); every float is also
    #: checked to fit a 32-bit float, as MXNet's operators take it
    bounds: Bounds | None = None


@dataclass(frozen=True)
class OptimizerSpec:
    """What the config layer knows about one MXNet optimizer (its registry name is the key)."""

    learning_rate: float  # the optimizer's own default learning rate
    params: Mapping[str, ParamSpec]
    summary: str
    #: why mxtrain refuses this optimizer (None: supported); ``mxtrain check`` says it
    refusal: str | None = None


def _params(**specs: tuple[Any, ...]) -> Mapping[str, ParamSpec]:
    """Parameter specs from ``(type, default, doc[, bounds])`` tuples."""
    return MappingProxyType({k: ParamSpec(*spec) for k, spec in specs.items()})


def resolve_params(
    kind: str, name: str, given: Mapping[str, Any], specs: Mapping[str, ParamSpec]
) -> Mapping[str, Any]:
    """Every parameter of optimizer or initializer ``name`` (``kind``), the defaults filled in
    (so equal configs compare equal), each checked against what the constructor accepts."""
    unknown = sorted(set(given) - set(specs))
    if unknown:
        raise InvalidValue(unknown[0], f"is not a parameter of the {name} {kind}.")
    resolved = {k: given.get(k, p.default) for k, p in specs.items()}
    for key, value in resolved.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        bounds = specs[key].bounds
        if bounds is not None and value not in bounds:
            raise InvalidValue(
                key, f"must be {bounds.describe()} for the {name} {kind}, got {show_number(value)}."
            )
        if isinstance(value, float):
            check_float32(key, value)
    return _frozen_mapping(resolved)


_MULTI_PRECISION = (
    bool,
    False,
    "keep float32 master weights and optimizer state for float16 weights",
)
_LAZY = (bool, True, "with row_sparse weights and gradients, update only the rows in the gradient")
_MOMENTUM0 = (float, 0.0, "momentum factor (0 = none)", UNIT_INTERVAL)
_BETA1 = (float, 0.9, "decay rate of the first-moment (mean) estimate", UNIT_INTERVAL)
_BETA2 = (float, 0.999, "decay rate of the second-moment (variance) estimate", UNIT_INTERVAL)
# epsilons must be above 0: the first update divides 0 by 0 for a gradient that is still 0
_EPSILON8 = (float, 1e-8, "small constant added to the denominator for stability", POSITIVE)

#: MXNet 1.9.1 optimizers (registry name -> constructor keywords beyond the common ones that
#: the schema has its own fields for: learning_rate, wd, clip_gradient, rescale_grad,
#: lr_scheduler). ``multi_precision`` is accepted by all of them.
OPTIMIZERS: Mapping[str, OptimizerSpec] = MappingProxyType(
    {
        "sgd": OptimizerSpec(
            0.01,
            _params(momentum=_MOMENTUM0, lazy_update=_LAZY, multi_precision=_MULTI_PRECISION),
            "stochastic gradient descent, optionally with momentum",
        ),
        "nag": OptimizerSpec(
            0.01,
            _params(momentum=_MOMENTUM0, multi_precision=_MULTI_PRECISION),
            "Nesterov accelerated gradient",
        ),
        "signum": OptimizerSpec(
            0.01,
            _params(
                momentum=(float, 0.9, "momentum factor of the sign of the gradient", UNIT_INTERVAL),
                wd_lh=(
                    float,
                    0.0,
                    "decoupled weight decay applied to the weight directly",
                    NON_NEGATIVE,
                ),
                multi_precision=_MULTI_PRECISION,
            ),
            "signSGD with momentum (updates by the sign of the gradient)",
        ),
        "ftml": OptimizerSpec(
            0.01,
            _params(
                beta1=(float, 0.6, "decay rate of the first-moment estimate", UNIT_INTERVAL),
                beta2=_BETA2,
                epsilon=_EPSILON8,
                multi_precision=_MULTI_PRECISION,
            ),
            "follow the moving leader",
        ),
        "lars": OptimizerSpec(
            0.01,
            _params(
                momentum=_MOMENTUM0,
                lazy_update=_LAZY,
                eta=(
                    float,
                    0.001,
                    "LARS coefficient that scales each layer's learning rate",
                    POSITIVE,
                ),
                eps=(
                    float,
                    0.0,
                    "added to the norm ratio's denominator for tiny gradients",
                    NON_NEGATIVE,
                ),
                momentum_correction=(
                    bool,
                    True,
                    "rescale the momentum when the lr scheduler changes the learning rate",
                ),
                multi_precision=_MULTI_PRECISION,
            ),
            "layer-wise adaptive rate scaling (large batches)",
        ),
        "lbsgd": OptimizerSpec(
            0.01,
            _params(
                momentum=_MOMENTUM0,
                multi_precision=_MULTI_PRECISION,
                warmup_strategy=(
                    Literal["linear", "power2", "sqrt", "lars"],
                    "linear",
                    "how the large-batch lr multiplier ramps up during warmup",
                ),
                warmup_epochs=(int, 5, "epochs of warmup"),
                batch_scale=(int, 1, "batch size multiple relative to the base batch size"),
                updates_per_epoch=(int, 32, "updates per epoch, used to time the warmup"),
                begin_epoch=(int, 0, "epoch the warmup counts from"),
                num_epochs=(int, 60, "total epochs, used by the lars warmup strategy"),
            ),
            "large-batch SGD with warmup",
            refusal="it accumulates gradients inside the optimizer object, outside the state "
            "mxtrain checkpoints, so no checkpoint could be resumed; fit.grad_accumulation, "
            "optimizer.lr_scheduler.warmup_steps and optimizer.name: lars do what it does.",
        ),
        "lamb": OptimizerSpec(
            0.001,
            _params(
                beta1=_BETA1,
                beta2=_BETA2,
                epsilon=(
                    float,
                    1e-6,
                    "small constant added to the denominator for stability",
                    POSITIVE,
                ),
                lower_bound=(
                    float | None,
                    None,
                    "lower clip of the trust ratio (null: none)",
                    NON_NEGATIVE,
                ),
                upper_bound=(
                    float | None,
                    None,
                    "upper clip of the trust ratio (null: none)",
                    POSITIVE,
                ),
                bias_correction=(bool, True, "correct the moment estimates' bias toward 0"),
                multi_precision=_MULTI_PRECISION,
            ),
            "layer-wise adaptive moments (large batches)",
        ),
        "dcasgd": OptimizerSpec(
            0.01,
            _params(
                momentum=_MOMENTUM0,
                lamda=(float, 0.04, "strength of the delay compensation", NON_NEGATIVE),
                multi_precision=_MULTI_PRECISION,
            ),
            "delay-compensated asynchronous SGD",
        ),
        "sgld": OptimizerSpec(
            0.01,
            _params(multi_precision=_MULTI_PRECISION),
            "stochastic gradient Langevin dynamics",
        ),
        "adam": OptimizerSpec(
            0.001,
            _params(
                beta1=_BETA1,
                beta2=_BETA2,
                epsilon=_EPSILON8,
                lazy_update=_LAZY,
                multi_precision=_MULTI_PRECISION,
            ),
            "adaptive moment estimation",
        ),
        "adamw": OptimizerSpec(
            0.001,
            _params(
                beta1=_BETA1,
                beta2=_BETA2,
                epsilon=_EPSILON8,
                correct_bias=(bool, True, "correct the moment estimates' bias toward 0"),
                multi_precision=_MULTI_PRECISION,
            ),
            "Adam with decoupled weight decay (mxtrain's, on MXNet's fused adamw_update)",
        ),
        "adagrad": OptimizerSpec(
            0.01,
            _params(
                eps=(
                    float,
                    1e-7,
                    "small constant added to the denominator for stability",
                    POSITIVE,
                ),
                multi_precision=_MULTI_PRECISION,
            ),
            "adaptive subgradient",
        ),
        "rmsprop": OptimizerSpec(
            0.001,
            _params(
                gamma1=(float, 0.9, "decay rate of the squared-gradient average", UNIT_INTERVAL),
                gamma2=(
                    float,
                    0.9,
                    "centered only: decay rate of the gradient average",
                    UNIT_INTERVAL,
                ),
                epsilon=_EPSILON8,
                centered=(bool, False, "centered RMSProp (Graves 2013) instead of Tieleman's"),
                clip_weights=(
                    float | None,
                    None,
                    "clip weights into [-clip_weights, clip_weights] (null: no clipping)",
                    POSITIVE,
                ),
                multi_precision=_MULTI_PRECISION,
            ),
            "RMSProp",
        ),
        "adadelta": OptimizerSpec(
            0.01,
            _params(
                rho=(float, 0.9, "decay rate of the running averages", UNIT_INTERVAL),
                epsilon=(float, 1e-5, "small constant added for stability", POSITIVE),
                multi_precision=_MULTI_PRECISION,
            ),
            "AdaDelta",
        ),
        "ftrl": OptimizerSpec(
            0.1,
            _params(
                lamda1=(float, 0.01, "L1 regularization strength", NON_NEGATIVE),
                beta=(
                    float,
                    1.0,
                    "smoothing term of the per-coordinate learning rate",
                    POSITIVE,
                ),
                multi_precision=_MULTI_PRECISION,
            ),
            "follow the regularized leader (sparse models)",
        ),
        "adamax": OptimizerSpec(
            0.002,
            _params(beta1=_BETA1, beta2=_BETA2, multi_precision=_MULTI_PRECISION),
            "Adam with the infinity norm",
        ),
        "nadam": OptimizerSpec(
            0.001,
            _params(
                beta1=_BETA1,
                beta2=_BETA2,
                epsilon=_EPSILON8,
                schedule_decay=(float, 0.004, "decay of the momentum schedule", NON_NEGATIVE),
                multi_precision=_MULTI_PRECISION,
            ),
            "Adam with Nesterov momentum",
        ),
        "groupadagrad": OptimizerSpec(
            0.01,
            _params(
                eps=(
                    float,
                    1e-5,
                    "small constant added to the denominator for stability",
                    POSITIVE,
                ),
                multi_precision=_MULTI_PRECISION,
            ),
            "AdaGrad with one history per row (embeddings); no weight decay",
            refusal="MXNet's groupadagrad only updates 2-D weights (one history per row, for "
            "embedding matrices) and stops at the first bias or convolution kernel; use "
            "adagrad.",
        ),
    }
)
#: the optimizers mxtrain trains with (the others say why not when named)
SUPPORTED_OPTIMIZERS = tuple(sorted(n for n, spec in OPTIMIZERS.items() if spec.refusal is None))
#: the optimizers MXNet 1.9.1 updates row by row from a row_sparse gradient (the LMs'
#: model.sparse_embedding)
SPARSE_OPTIMIZERS = ("sgd", "adam", "adagrad", "ftrl")


@dataclass(frozen=True)
class OptimizerSection:
    """How parameters are updated. Keys other than the ones below are the chosen optimizer's
    own parameters (``momentum`` for sgd, ``beta1`` for adam, ...); every one of them is
    checked and its MXNet default written into the resolved config."""

    name: str = documented("sgd", "MXNet optimizer: " + ", ".join(SUPPORTED_OPTIMIZERS))
    learning_rate: float = documented(
        0.01,
        "base learning rate; default: the optimizer's own (sgd 0.01, adam 0.001, ...); "
        "with an lr_scheduler it is the schedule's base lr",
    )
    wd: float = documented(0.0, "L2 weight decay added to every gradient (0 = none)")
    clip_gradient: float | None = documented(
        None, "clip each gradient element into [-clip_gradient, clip_gradient] (null: no clipping)"
    )
    clip_global_norm: float | None = documented(
        None,
        "scale all gradients down together when their global L2 norm (after the "
        "sum over devices and workers, rescale_grad applied) exceeds this; the norm is "
        "logged as grad_norm; updates run on the workers (null: no clipping)",
    )
    rescale_grad: float | Literal["auto"] = documented(
        "auto",
        "gradients are multiplied by this before the update; auto: 1 / batch size, so "
        "the lr does not depend on the batch size",
    )
    lr_scheduler: LrSchedulerSection | None = documented(
        None, "learning-rate schedule (null: constant learning_rate)"
    )
    lr_mult: Mapping[str, float] = field(
        default_factory=_frozen_mapping,
        metadata={
            "doc": "learning-rate multipliers by parameter-name glob, e.g. {'embed_*': 0.1} "
            "(0 stops updates); each glob must match a parameter and no parameter two globs; "
            "the rest keep 1"
        },
    )
    wd_mult: Mapping[str, float] = field(
        default_factory=_frozen_mapping,
        metadata={
            "doc": "weight-decay multipliers by parameter-name glob, as lr_mult; without one, "
            "MXNet decays only parameters named *_weight or *_gamma (biases are not decayed)"
        },
    )
    params: Mapping[str, Any] = field(
        default_factory=_frozen_mapping,
        metadata={"doc": "the optimizer's own parameters, all of them, defaults filled in"},
    )

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise InvalidValue(
                "name", f"must be one of {', '.join(sorted(OPTIMIZERS))}, got {self.name!r}."
            )
        refusal = OPTIMIZERS[self.name].refusal
        if refusal is not None:
            raise InvalidValue(
                "name",
                f"{self.name} cannot be used: {refusal} Supported optimizers: "
                f"{', '.join(SUPPORTED_OPTIMIZERS)}.",
            )
        params = resolve_params("optimizer", self.name, self.params, OPTIMIZERS[self.name].params)
        object.__setattr__(self, "params", params)
        _check_optimizer_combinations(self.name, params)
        check_greater_than_zero("learning_rate", self.learning_rate)
        check_bounds("learning_rate", self.learning_rate, RATE)
        check_at_least("wd", self.wd, 0)
        check_rate("wd", self.wd)
        check_greater_than_zero("clip_gradient", self.clip_gradient)
        check_float32("clip_gradient", self.clip_gradient)
        check_greater_than_zero("clip_global_norm", self.clip_global_norm)
        check_float32("clip_global_norm", self.clip_global_norm)
        if self.rescale_grad != "auto":
            check_greater_than_zero("rescale_grad", self.rescale_grad)
            check_float32("rescale_grad", self.rescale_grad)
        for key in ("lr_mult", "wd_mult"):
            _check_multipliers(key, getattr(self, key))
        if self.wd_mult and self.wd == 0:
            raise InvalidValue(
                "wd_mult",
                "has no effect while optimizer.wd is 0: it multiplies the weight decay. Set "
                "optimizer.wd or remove wd_mult.",
            )
        sched = self.lr_scheduler
        if sched is not None and sched.warmup_begin_lr > self.learning_rate:
            raise InvalidValue(
                "lr_scheduler.warmup_begin_lr",
                f"({sched.warmup_begin_lr:g}) must not exceed learning_rate "
                f"({self.learning_rate:g}): the warmup ramps up to the learning rate.",
            )


def _check_optimizer_combinations(name: str, params: Mapping[str, Any]) -> None:
    """Parameter values MXNet 1.9.1's optimizer fails with together, each fine alone."""
    if name == "signum" and params["wd_lh"] and not params["momentum"]:
        # without momentum MXNet runs signsgd_update, which has no wd_lh
        raise InvalidValue(
            "wd_lh", "needs momentum above 0 with signum (without momentum it is not applied)."
        )
    if name == "dcasgd" and params["momentum"]:
        # its update tests ``if mom:`` on the momentum array, which NDArray refuses
        raise InvalidValue(
            "momentum",
            "must be 0 with dcasgd: MXNet 1.9.1's dcasgd fails at its first update with "
            f"momentum, got {params['momentum']!r}.",
        )
    bounds = (params.get("lower_bound"), params.get("upper_bound"))
    if None not in bounds and bounds[0] > bounds[1]:  # type: ignore[operator]
        raise InvalidValue("lower_bound", f"must not exceed upper_bound, got {list(bounds)}.")


def _check_multipliers(key: str, multipliers: Mapping[str, float]) -> None:
    for pattern, value in multipliers.items():
        if not pattern:
            raise InvalidValue(key, "has an empty glob; write a pattern such as 'embed_*'.")
        # the glob as the key's last part: the error points at its own line
        if not math.isfinite(value) or value < 0:
            raise InvalidValue(
                f"{key}.{pattern}", f"must be a finite number >= 0 (a multiplier), got {value!r}."
            )
        check_rate(f"{key}.{pattern}", value, MULTIPLIER)


def worker_update_keys(optimizer: OptimizerSection) -> list[tuple[str, ...]]:
    """The optimizer keys in use that need the updates on the workers: the kvstore's servers
    never see the summed gradients' norm (``clip_global_norm``) nor the epoch
    (``lr_scheduler.unit: epochs``)."""
    keys: list[tuple[str, ...]] = []
    if optimizer.clip_global_norm is not None:
        keys.append(("optimizer", "clip_global_norm"))
    if optimizer.lr_scheduler is not None and optimizer.lr_scheduler.unit == "epochs":
        keys.append(("optimizer", "lr_scheduler", "unit"))
    if optimizer.lr_scheduler is not None and optimizer.lr_scheduler.type == "plateau":
        keys.append(("optimizer", "lr_scheduler", "type"))  # the servers never see evaluations
    return keys


def updates_on_servers(kv_type: str, update_on_kvstore: bool | str) -> bool:
    """Whether the kvstore settings make the servers run the optimizer whatever the model:
    ``update_on_kvstore: true``, or dist_async (asynchronous updates only exist there)."""
    return update_on_kvstore is True or (kv_type == "dist_async" and update_on_kvstore == "auto")


# --------------------------------------------------------------------------------------------
# initializer
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InitializerSpec:
    """What the config layer knows about one MXNet initializer."""

    params: Mapping[str, ParamSpec]
    summary: str


#: MXNet 1.9.1 initializers (registry name -> constructor keywords).
INITIALIZERS: Mapping[str, InitializerSpec] = MappingProxyType(
    {
        "xavier": InitializerSpec(
            _params(
                rnd_type=(
                    Literal["uniform", "gaussian"],
                    "uniform",
                    "draw from a uniform or a gaussian distribution",
                ),
                factor_type=(
                    Literal["avg", "in", "out"],
                    "avg",
                    "scale by the average of fan-in and fan-out, by fan-in or by fan-out",
                ),
                magnitude=(
                    float,
                    3.0,
                    "scale of the distribution: sqrt(magnitude / factor)",
                    POSITIVE,
                ),
            ),
            "Glorot/Xavier: variance scaled by the layer's fan-in/fan-out",
        ),
        "uniform": InitializerSpec(
            _params(scale=(float, 0.07, "weights are drawn from U(-scale, scale)", POSITIVE)),
            "uniform distribution",
        ),
        "normal": InitializerSpec(
            _params(sigma=(float, 0.01, "standard deviation of N(0, sigma^2)", POSITIVE)),
            "normal distribution",
        ),
        "orthogonal": InitializerSpec(
            _params(
                scale=(float, 1.414, "the orthogonal matrix is multiplied by this", POSITIVE),
                rand_type=(
                    Literal["uniform", "normal"],
                    "uniform",
                    "distribution of the random matrix that is orthogonalized",
                ),
            ),
            "orthogonal matrices (Saxe et al.), good for recurrent weights",
        ),
        "zero": InitializerSpec(_params(), "all zeros"),
        "one": InitializerSpec(_params(), "all ones"),
    }
)


@dataclass(frozen=True)
class InitializerOverride:
    """A different initializer for the parameters whose names match ``pattern``."""

    pattern: str = documented("", "glob (fnmatch) over parameter names, e.g. '*_bias'")
    name: str = documented("zero", "MXNet initializer for those parameters")
    params: Mapping[str, Any] = field(
        default_factory=_frozen_mapping, metadata={"doc": "that initializer's parameters"}
    )

    def __post_init__(self) -> None:
        if not self.pattern:
            raise InvalidValue("pattern", "must be a non-empty glob such as '*_bias'.")
        _check_initializer(self)


def _check_initializer(section: InitializerOverride | InitializerSection) -> None:
    """The initializer name and its parameters, defaults filled in (an initializer section
    and each of its overrides)."""
    if section.name not in INITIALIZERS:
        raise InvalidValue(
            "name", f"must be one of {', '.join(INITIALIZERS)}, got {section.name!r}."
        )
    params = resolve_params(
        "initializer", section.name, section.params, INITIALIZERS[section.name].params
    )
    object.__setattr__(section, "params", params)


@dataclass(frozen=True)
class WarmStartSection:
    """``initializer.from``: start from trained weights instead of random ones."""

    source: str = field(
        metadata={
            "doc": "a run folder with an optional checkpoint (RUN, RUN:best, RUN:3, RUN:TAG), "
            "an MXNet .params file, or a loader plugin ('file.py:attr' / 'package.module:attr' "
            "returning {parameter name: array})"
        }
    )
    allow_missing: bool = documented(
        False,
        "parameters the source lacks get the initializer (listed in the log); "
        "false: an error naming them",
    )
    allow_extra: bool = documented(
        False,
        "parameters of the source the model lacks are ignored (listed); false: an "
        "error naming them",
    )
    rename: Mapping[str, str] = field(
        default_factory=_frozen_mapping,
        metadata={
            "doc": "source name glob -> model name, '*' carried over in order, e.g. "
            "{'tagger_embed_*': 'embed_*'} (renamed layers)"
        },
    )
    exclude: tuple[str, ...] = documented(
        (),
        "globs of source parameters not to load, e.g. ['pred_*'] for an output "
        "layer trained anew (with allow_missing)",
    )

    def __post_init__(self) -> None:
        if not self.source.strip():
            raise InvalidValue("source", "must name a run folder, a .params file or a loader.")
        if any(not pattern for pattern in self.exclude):
            raise InvalidValue("exclude", "must not contain empty strings.")
        for pattern, target in self.rename.items():
            if not pattern or not target:
                raise InvalidValue("rename", "has an empty pattern or name.")
            if target.count("*") > pattern.count("*") or "?" in target or "[" in target:
                raise InvalidValue(
                    f"rename.{pattern}",
                    f"{target!r}: the new name may use '*' (each one carries over what a "
                    f"'*' of the pattern matched, in order), at most {pattern.count('*')} "
                    "here, and no other wildcard.",
                )


@dataclass(frozen=True)
class InitializerSection:
    """How weights are initialized before the first batch. Keys other than ``name`` are the
    initializer's own parameters (``magnitude`` for xavier, ``sigma`` for normal, ...)."""

    name: str = documented("xavier", "MXNet initializer: " + ", ".join(INITIALIZERS))
    params: Mapping[str, Any] = field(
        default_factory=_frozen_mapping,
        metadata={"doc": "the initializer's own parameters, all of them, defaults filled in"},
    )
    overrides: tuple[InitializerOverride, ...] = documented(
        (),
        "per-parameter exceptions, first match wins: a list of {pattern, name, "
        "...params}, e.g. [{pattern: '*_bias', name: zero}]",
    )
    #: written ``from:`` in the file (a Python keyword, so not the field's name)
    warm_start: WarmStartSection | None = field(
        default=None,
        metadata={
            "doc": "start from trained weights: a run folder (RUN:best), a .params file or a "
            "loader plugin, or {source, allow_missing, allow_extra, rename}; the initializer "
            "covers only what the source lacks (null: random initialization)",
            "key": "from",
        },
    )

    def __post_init__(self) -> None:
        _check_initializer(self)


# --------------------------------------------------------------------------------------------
# fit / checkpoint
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EarlyStoppingSection:
    """Stop training when an eval metric stops improving."""

    metric: str = documented("perplexity", "eval metric to watch (one of fit.metrics)")
    patience: int = documented(3, "evaluations in a row without improvement before training stops")
    mode: Literal["auto", "min", "max"] = documented(
        "auto",
        "lower or higher is better; auto: as the metric declares, else lower for "
        "perplexity/loss/errors",
    )
    min_delta: float = documented(0.0, "smallest change that counts as an improvement")

    def __post_init__(self) -> None:
        check_at_least("patience", self.patience, 1)
        check_at_least("min_delta", self.min_delta, 0.0)


@dataclass(frozen=True)
class MonitorSection:
    """Log weight and gradient statistics of some parameters while training."""

    pattern: str = documented(
        ".*", "regular expression searched in parameter names, e.g. 'weight$' or 'lstm'"
    )
    interval: int = documented(
        100, "batches between two records (each record reads the arrays back: a sync point)"
    )

    def __post_init__(self) -> None:
        check_at_least("interval", self.interval, 1)
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise InvalidValue(
                "pattern", f"is not a valid regular expression ({exc}): {self.pattern!r}."
            ) from None


@dataclass(frozen=True)
class DecodeEvalSection:
    """How evaluations decode the eval set for the decoding metrics of ``fit.eval_metrics``
    (bleu, chrf, wer, per: scored on output text, not on the teacher-forced softmax)."""

    beam_size: int = documented(
        1,
        "beams of the search that decodes the eval set at each evaluation; 1 (greedy) "
        "keeps evaluations cheap, each more beam is one more decoder row per step "
        "(mxtrain predict searches 5 by default)",
    )
    max_sentences: int | None = documented(
        None,
        "decode only the first N sentences of the eval set, the same ones at every "
        "evaluation so their scores compare (null: all); device metrics still read every "
        "eval batch (or eval_max_batches)",
    )

    def __post_init__(self) -> None:
        check_at_least("beam_size", self.beam_size, 1)
        check_at_least("max_sentences", self.max_sentences, 1)


DECODING_METRIC_HINT = (
    "List decoding metrics in fit.eval_metrics beside the device ones, e.g. eval_metrics: "
    "[perplexity, bleu]; `mxtrain list metrics` marks which are which."
)


def training_metric_problem(name: str) -> str | None:
    """Why ``fit.metrics`` cannot list ``name``, or None: a decoding metric needs decoded
    output, which only evaluations make (fit.metrics are computed on every training batch)."""
    if not is_decoding_metric(name):
        return None
    return (
        f"{name!r} is scored on decoded output, which only the evaluations make; fit.metrics "
        "are computed on every training batch."
    )


SEQ2SEQ_HINT = (
    "Remove it from fit.eval_metrics, or train a sequence-to-sequence model (`mxtrain list "
    "models`) on parallel data: `mxtrain init --template seq2seq` writes such a config."
)


def decoding_model_problem(metric: str, model: str) -> str | None:
    """Why the evaluations of ``model`` cannot compute ``metric``, a decoding metric, or None
    (they can, or it is none): only sequence-to-sequence models (an encoder and a decoder
    step) decode."""
    if model in DECODING_MODELS or not is_decoding_metric(metric):
        return None
    return (
        f"{metric!r} is scored on decoded output, which only sequence-to-sequence models "
        f"make ({', '.join(sorted(DECODING_MODELS))}); model.name is {model!r}."
    )


def pairing_problem(model: str, iterator: str) -> str | None:
    """Why ``model`` cannot train on ``iterator``'s batches, or None: a sequence-to-sequence
    model takes (source, target) pairs, which only the parallel-data iterators make, and no
    other built-in model takes them. An iterator or model of a plugin is not judged."""
    builtin_model, builtin_iterator = model in MODELS.available(), iterator in ITERATORS.available()
    if not (builtin_model and builtin_iterator):
        return None
    pairs, needs_pairs = iterator in PARALLEL_ITERATORS, model in DECODING_MODELS
    if needs_pairs and not pairs:
        return (
            f"model {model} trains on (source, target) pairs, which data.train.iterator "
            f"{iterator} does not make; use {', '.join(sorted(PARALLEL_ITERATORS))} (source and "
            "target files)"
        )
    if pairs and not needs_pairs:
        return (
            f"data.train.iterator {iterator} makes (source, target) pairs, which model {model} "
            "does not take; use a sequence-to-sequence model "
            f"({', '.join(sorted(DECODING_MODELS))})"
        )
    return None


def evaluation_metric_names(data: DataSection, fit: FitSection) -> tuple[str, ...]:
    """What an evaluation reports, by name: ``fit``'s evaluation metrics, or with several eval
    sets each set's device metrics as ``set.metric`` and the decoding metrics (scored on the
    first set) as ``first.metric``."""
    names = data.eval_set_names
    if not names:
        return fit.evaluation_metrics
    device = [f"{n}.{m}" for n in names for m in fit.device_evaluation_metrics]
    return (*device, *(f"{names[0]}.{m}" for m in fit.decoding_metrics))


def metric_of_set(metric: str, set_names: tuple[str, ...]) -> tuple[str | None, str]:
    """(set name or None, metric name) of an evaluation value's name (``valid.perplexity``)."""
    head, dot, rest = metric.partition(".")
    if dot and head in set_names:
        return head, rest
    return None, metric


#: the largest fit.bucket_memory: far more buckets than any iterator makes (null: no bound)
MAX_BUCKET_MEMORY = 1e6


@dataclass(frozen=True)
class FitSection:
    """The training loop."""

    num_epoch: int = documented(10, "passes over the training data")
    log_interval: int = documented(
        50, "batches between two progress lines / metrics.jsonl records (metrics are read then)"
    )
    metrics: tuple[str, ...] = documented(
        ("perplexity",),
        "metrics computed on the device and logged: perplexity, accuracy, or your own "
        "'package.module:attr' / 'file.py:attr'",
    )
    callbacks: tuple[CallbackSection, ...] = documented(
        (),
        "callback plugins called at batch end, log interval, evaluation, epoch end "
        "and checkpoint: a list of 'file.py:attr' or {name: 'file.py:attr', ...options}",
    )
    eval_metrics: tuple[str, ...] | None = documented(
        None,
        "metrics of the evaluations (data.eval, eval_interval, mxtrain score), the "
        "ones checkpoint.best_metric and early_stopping watch; null: fit.metrics; "
        f"seq2seq models may add metrics of decoded output ({', '.join(DECODING_METRICS)})",
    )
    decode_eval: DecodeEvalSection | None = documented(
        None,
        "how evaluations decode the eval set for decoding metrics in eval_metrics, e.g. "
        "{beam_size: 5, max_sentences: 500}; null: greedy (beam 1) over every eval sentence",
    )
    fixed_params: tuple[str, ...] = documented(
        (),
        "glob patterns (fnmatch) of parameter names that are not trained, e.g. "
        "'embed_*'; a pattern that matches nothing is an error",
    )
    fixed_params_exclude: tuple[str, ...] = documented(
        (),
        "glob patterns of parameters to train even though fixed_params matches "
        "them (un-freezes part of fixed_params)",
    )
    prefetch: int = documented(2, "batches prepared ahead while the current one computes (0 = off)")
    max_batches_per_epoch: int | None = documented(
        None, "stop each epoch after this many batches (null: the whole data; quick runs)"
    )
    eval_max_batches: int | None = documented(
        None, "score at most this many eval batches after each epoch (null: all of them)"
    )

    grad_accumulation: int = documented(
        1,
        "update once every K batches with their gradients summed (an effective "
        "batch K times larger without its memory); the last group of an epoch may be "
        "shorter",
    )
    eval_interval: int | None = documented(
        None,
        "also evaluate every N training batches (null: only after each epoch); "
        "each evaluation is a metrics.jsonl 'eval' record and counts for early_stopping",
    )
    early_stopping: EarlyStoppingSection | None = documented(
        None, "stop when an eval metric stops improving (needs data.eval)"
    )
    max_updates: int | None = documented(
        None,
        "stop after this many parameter updates in all (a checkpoint of that point "
        "is saved; resume with a larger value continues)",
    )
    max_time: float | None = documented(
        None, "stop after this many seconds of training in all (resumes included)"
    )
    profile: int | None = documented(
        None,
        "record this many training batches (after the first) with MXNet's profiler "
        "into RUN/profile/ (trace.json for chrome://tracing, summary.txt per operator)",
    )
    monitor: MonitorSection | None = documented(
        None,
        "log norms of matching weights and gradients every interval batches, also "
        "to RUN/monitor.jsonl",
    )
    bucket_memory: float | Literal["auto"] | None = documented(
        "auto",
        "bound buckets may hold at most this many times the largest bucket's "
        "input positions: beyond it the least used are unbound and rebound when needed "
        "(each bucket keeps memory of its own, e.g. a fused RNN's workspace, so memory "
        "would grow with their number); auto: 5, which keeps the shipped configs' "
        "buckets all bound, or less where the memory available at start cannot take it "
        "(the largest bound whose estimate fits in 80% of it); 1.0: the tightest bound "
        "(rebinds cost time); null: no bound. fit logs the estimated peak before the "
        "first batch and warns when it exceeds the available memory",
    )

    @property
    def evaluation_metrics(self) -> tuple[str, ...]:
        """The metrics evaluations compute: ``eval_metrics``, else ``metrics``."""
        return self.metrics if self.eval_metrics is None else self.eval_metrics

    @property
    def decoding_metrics(self) -> tuple[str, ...]:
        """The evaluations' metrics of decoded output (bleu, chrf, wer, per), in order."""
        return tuple(n for n in self.evaluation_metrics if is_decoding_metric(n))

    @property
    def device_evaluation_metrics(self) -> tuple[str, ...]:
        """The evaluations' other metrics: computed batch by batch on the device."""
        return tuple(n for n in self.evaluation_metrics if not is_decoding_metric(n))

    @property
    def decoding(self) -> DecodeEvalSection:
        """How the decoding metrics decode: ``decode_eval``, else its defaults."""
        return self.decode_eval if self.decode_eval is not None else DecodeEvalSection()

    def __post_init__(self) -> None:
        check_at_least("num_epoch", self.num_epoch, 1)
        if self.bucket_memory != "auto":
            check_at_least("bucket_memory", self.bucket_memory, 1)
            # the bound counts input positions in an integer; null is "no bound"
            check_bounds("bucket_memory", self.bucket_memory, Bounds(high=MAX_BUCKET_MEMORY))
        check_at_least("profile", self.profile, 1)
        check_at_least("eval_interval", self.eval_interval, 1)
        check_at_least("grad_accumulation", self.grad_accumulation, 1)
        if self.eval_interval is not None and self.eval_interval % self.grad_accumulation:
            raise InvalidValue(
                "eval_interval",
                f"must be a multiple of grad_accumulation ({self.grad_accumulation}) so that "
                f"evaluations fall between two updates, got {self.eval_interval}.",
            )
        check_at_least("max_updates", self.max_updates, 1)
        check_at_least("max_time", self.max_time, 0.001)
        check_at_least("log_interval", self.log_interval, 1)
        check_at_least("prefetch", self.prefetch, 0)
        check_at_least("max_batches_per_epoch", self.max_batches_per_epoch, 1)
        check_at_least("eval_max_batches", self.eval_max_batches, 1)
        for key in ("metrics", "eval_metrics"):
            seen: set[str] = set()
            for name in getattr(self, key) or ():
                if name in seen:
                    raise InvalidValue(key, f"lists {name!r} twice.")
                seen.add(name)
        if self.decode_eval is not None and not self.decoding_metrics:
            raise InvalidValue(
                "decode_eval",
                "has no effect without a decoding metric "
                f"({', '.join(DECODING_METRICS)}) in fit.eval_metrics.",
            )
        if self.fixed_params_exclude and not self.fixed_params:
            raise InvalidValue(
                "fixed_params_exclude",
                "has no effect without fit.fixed_params: it only un-freezes parameters "
                "that fixed_params froze.",
            )
        for key in ("fixed_params", "fixed_params_exclude"):
            if any(not s for s in getattr(self, key)):
                raise InvalidValue(key, "must not contain empty strings (they match everything).")


@dataclass(frozen=True)
class CheckpointSection:
    """What is saved in the run folder, and when."""

    prefix: str = documented("model", "file name prefix of the saved symbol and parameters")
    period: int = documented(
        1, "save parameters and training state every N epochs (the last epoch is always saved)"
    )

    keep_last: int | None = documented(
        None,
        "keep only the newest N checkpoints (older ones and their params files "
        "are deleted, a damaged one is set aside as checkpoints/damaged-<tag>-<n>; the "
        "best one is always kept); null keeps all",
    )
    best_metric: str | None = documented(
        None,
        "eval metric that picks the best checkpoint (needs data.eval), e.g. "
        "perplexity; its tag is written to checkpoints/best",
    )
    best_mode: Literal["auto", "min", "max"] = documented(
        "auto",
        "whether lower or higher best_metric is better; auto: as the metric declares "
        "(lower_is_better), else lower for perplexity, loss, error, mae, mse, rmse, "
        "cross-entropy; higher otherwise",
    )

    def __post_init__(self) -> None:
        if not self.prefix.strip() or "/" in self.prefix or "\\" in self.prefix:
            raise InvalidValue(
                "prefix", f"must be a plain file name prefix without slashes, got {self.prefix!r}."
            )
        problem = run_name_problem(self.prefix)  # the same OS rules as run folder names
        if problem is not None:
            raise InvalidValue("prefix", problem)
        check_at_least("period", self.period, 1)
        if self.keep_last is not None:
            check_at_least("keep_last", self.keep_last, 1)


@dataclass(frozen=True)
class LoggingSection:
    """Extra records of a run, beside train.log and metrics.jsonl (which are always written)."""

    tensorboard: bool = documented(
        False,
        "also write TensorBoard event files to RUN/tensorboard/ (needs "
        "`pip install 'mxtrain[tensorboard]'`); view with `tensorboard --logdir runs`",
    )


@dataclass(frozen=True)
class MlflowSection:
    """An MLflow run that follows the mxtrain run (``pip install 'mxtrain[mlflow]'``)."""

    uri: str = documented(
        REQUIRED,
        "the tracking URI: a folder (file store, e.g. mlruns or file:///abs/mlruns) or a "
        "server (http://host:5000)",
    )
    experiment: str = documented("mxtrain", "the MLflow experiment the run goes in")

    def __post_init__(self) -> None:
        for key in ("uri", "experiment"):
            if not str(getattr(self, key)).strip():
                raise InvalidValue(key, "must not be empty.")


@dataclass(frozen=True)
class TrackingSection:
    """Experiment trackers that receive a run's parameters, metrics and best checkpoint."""

    mlflow: MlflowSection | None = documented(
        None,
        "{uri, experiment}: the resolved config as parameters, every metrics.jsonl value as "
        "metrics, tags, the best checkpoint as artifacts; a resumed run continues its MLflow run",
    )


# --------------------------------------------------------------------------------------------
# the whole file
# --------------------------------------------------------------------------------------------

#: Top-level sections in file order, with the dataclass of each.
SECTIONS: Mapping[str, type] = MappingProxyType(
    {
        "experiment": ExperimentSection,
        "model": ModelSection,
        "data": DataSection,
        "context": ContextSection,
        "kvstore": KVStoreSection,
        "optimizer": OptimizerSection,
        "initializer": InitializerSection,
        "fit": FitSection,
        "checkpoint": CheckpointSection,
        "logging": LoggingSection,
        "tracking": TrackingSection,
    }
)


@dataclass(frozen=True)
class Config:
    """A resolved experiment: every section, defaults filled in, values checked.

    ``source`` (the file name or ``<string>``) and ``base_dir`` (the folder relative paths in
    the config are resolved against: the config file's folder) say where it came from; they
    are not dumped and not compared, so a config equals its own dump loaded back elsewhere.
    """

    experiment: ExperimentSection
    model: ModelSection
    data: DataSection
    context: ContextSection
    kvstore: KVStoreSection
    optimizer: OptimizerSection
    initializer: InitializerSection
    fit: FitSection
    checkpoint: CheckpointSection
    logging: LoggingSection = field(default_factory=LoggingSection)
    tracking: TrackingSection = field(default_factory=TrackingSection)
    source: str = field(default="<string>", compare=False)
    base_dir: Path = field(default_factory=Path.cwd, compare=False)
    #: the loader's ``file:line`` finder for a key path (None: no file)
    #: what the loader wants the user to know about a valid config (check prints them, fit
    #: logs them), e.g. a schedule that ends before or after the run
    notes: tuple[str, ...] = field(default=(), compare=False)
    locate: Callable[[tuple[str | int, ...]], str] | None = field(
        default=None, compare=False, repr=False
    )
    #: the loader's finder for where a key itself was written (None: not written, a default)
    origin: Callable[[tuple[str | int, ...]], str | None] | None = field(
        default=None, compare=False, repr=False
    )

    def where(self, *path: str | int) -> str:
        """``file:line`` of the key at ``path`` (or of the nearest enclosing key that was
        written; the ``--set`` that changed it), for errors found after loading."""
        return self.locate(path) if self.locate is not None else self.source

    def resolve_path(self, path: str | Path) -> Path:
        """``path`` relative to the config file's folder (absolute paths are kept)."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else self.base_dir / p
