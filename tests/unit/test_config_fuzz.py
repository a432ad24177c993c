"""Property test: no mutated config makes loading crash or stall (issue 10, must-have 3).

Every shipped config (configs/*.yaml) and template (mxtrain/templates/*.yaml) is mutated
(values replaced, deleted or inserted at random keys; wrong types, huge, negative, NaN/inf,
unicode and control characters; deep nesting, many keys, alias bombs; byte-level corruption
and other encodings) and fed through ``load_config``, as a file and as ``--set`` overrides.
The outcome must be a Config or a ConfigError whose message starts with the file or the
``--set`` argument; anything else is a defect. Examples are derandomized, so CI sees the same
ones every run; no verdict depends on time (``deadline=None``): the size, depth and value
limits of the loader keep each example short, and the slowest one is printed.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mxtrain.config import Config, dump_config, explain_config, load_config
from mxtrain.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "configs").glob("*.yaml")) + sorted(
    (ROOT / "mxtrain" / "templates").glob("*.yaml")
)
BASES = [(path, path.read_text(encoding="utf-8")) for path in SHIPPED]
TREES = {path: yaml.safe_load(text) for path, text in BASES}

FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=700,
    suppress_health_check=list(HealthCheck),
)

# Keys that exist somewhere in the schema, so insertions reach real code paths as well as
# the unknown-key one.
KEY_NAMES = sorted(
    {"name", "hidden", "num_hidden", "num_embed", "num_layers", "dropout", "batch_size"}
    | {"iterator", "source", "labels", "label_key", "level", "buckets", "metrics", "type"}
    | {"gradient_compression", "ids", "count", "devices", "num_epoch", "learning_rate"}
    | {"best_metric", "prefix", "seed", "runs_dir", "early_stopping", "overrides", "<<"}
)

TRICKY_STRINGS = [
    "",
    " ",
    ":",
    ".:x",
    "a:b",
    "x.py:y",
    "..:..",
    "os:nope",
    "mxnet.metric:Accuracy",
    "plugin_example.py:nope",
    "../..",
    "/",
    "a/b",
    ".",
    "\x00",
    "a\x01b",
    "\udcff",
    "\ud800",
    "é" * 150,
    "x" * 300,
    "char",
    "word",
    "local",
    "device",
    "nccl",
    "gpu",
    "cpu",
    "accuracy",
    "perplexity",
    "{a: 1}",
    "[1, 2]",
    "*a",
    "&a",
    "!!python/object:os.system",
    "yes",
    "null",
    "1e400",
    ".nan",
]
NUMBERS = [0, -1, 1, 2, 7, 2**31 - 1, 2**31, 2**32, 2**63, 10**10, 10**12, 10**30, -(2**63)]
FLOATS = [math.nan, math.inf, -math.inf, 1e300, -1e-300, 0.5, -0.5, 1e-9]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(NUMBERS),
    st.integers(),
    st.sampled_from(FLOATS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(TRICKY_STRINGS),
    st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=20),
)
values = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(st.sampled_from(KEY_NAMES) | st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=8,
)


def _raw_snippet(kind: str, size: int) -> str:
    """Flow-style YAML text for the structures a value tree cannot express or dump."""
    if kind == "deep_list":
        return "[" * size + "]" * size
    if kind == "deep_map":
        return "{a: " * size + "1" + "}" * size
    if kind == "many_keys":
        return "{" + ", ".join(f"k{i}: {i}" for i in range(size * 10)) + "}"
    if kind == "long_list":
        return "[" + ", ".join("1" for _ in range(size * 10)) + "]"
    if kind == "seq_bomb":
        levels = [f"&l0 [{', '.join(['lol'] * 9)}]"]
        levels += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
        return "[" + ", ".join(levels) + "]"
    if kind == "map_bomb":
        levels = ["a0: &a0 {x: 1, y: 1, z: 1, w: 1, v: 1}"]
        levels += [
            f"a{i}: &a{i} {{x: *a{i - 1}, y: *a{i - 1}, z: *a{i - 1}, w: *a{i - 1}}}"
            for i in range(1, 12)
        ]
        return "{" + ", ".join(levels) + "}"
    if kind == "self_alias":
        return "&s [1, *s]"
    if kind == "merge":
        return "{<<: [{a: 1}, {b: 2}], c: 3}"
    return "*undefined"


raw_snippets = st.builds(
    _raw_snippet,
    st.sampled_from(
        [
            "deep_list",
            "deep_map",
            "many_keys",
            "long_list",
            "seq_bomb",
            "map_bomb",
            "self_alias",
            "merge",
            "undefined",
        ]
    ),
    st.sampled_from([1, 5, 31, 33, 100, 450, 1200]),
)


def _paths(tree: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path in ``tree`` (mapping keys and list indices), the root excluded."""
    out: list[tuple[Any, ...]] = []
    if not isinstance(tree, (dict, list)):
        return out
    items: Any = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, value in items:
        out.append((*prefix, key))
        out.extend(_paths(value, (*prefix, key)))
    return out


PATHS = {path: _paths(tree) for path, tree in TREES.items()}


def _get(tree: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        tree = tree[part]
    return tree


MAPPING_PATHS = {
    path: [()] + [p for p in paths if isinstance(_get(TREES[path], p), dict)]
    for path, paths in PATHS.items()
}


def _copy(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _copy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copy(v) for v in tree]
    return tree


@st.composite
def tree_mutations(draw: st.DrawFn, base: Path) -> tuple[Any, list[str], list[str]]:
    """(mutated tree, raw snippets to splice in, the same mutations as --set overrides)."""
    tree = _copy(TREES[base])
    overrides: list[str] = []
    snippets: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["replace", "delete", "insert", "raw"]))
        if op == "insert":
            parent = draw(st.sampled_from(MAPPING_PATHS[base]))
            path = (*parent, draw(st.sampled_from(KEY_NAMES) | st.text(min_size=1, max_size=8)))
        else:
            candidates = PATHS[base]
            path = draw(st.sampled_from(candidates)) if candidates else ("x",)
        try:
            container = _get(tree, path[:-1])
        except (KeyError, IndexError, TypeError):
            continue  # an earlier operation removed or replaced that part
        if op == "delete":
            if isinstance(container, dict):
                container.pop(path[-1], None)
            elif (
                isinstance(container, list)
                and isinstance(path[-1], int)
                and path[-1] < len(container)
            ):
                del container[path[-1]]
            continue
        if op == "raw":
            text = draw(raw_snippets)
            value: Any = f"__RAW_{len(snippets)}__"
            snippets.append(text)
        else:
            value = draw(values)
            text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
            text = text.removesuffix("\n...").removesuffix("...").strip()
        if isinstance(container, dict) or (
            isinstance(container, list) and isinstance(path[-1], int) and path[-1] < len(container)
        ):
            container[path[-1]] = value
        dotted = ".".join(str(p) for p in path if not isinstance(p, int))
        if dotted:
            overrides.append(f"{dotted}={text}")
    return tree, snippets, overrides


SLOWEST: dict[str, tuple[float, str]] = {}
OUTCOMES: dict[str, int] = {}
WHERE = (
    r"(:\d+| is not UTF-8 text: line \d+| is UTF-16 text| is empty| is larger than"
    r"|: the config has no data section)"
)


def _outcome(config_file: Path, overrides: list[str], label: str) -> None:
    """Load and assert the property; remember the slowest example."""
    start = time.perf_counter()
    try:
        result = load_config(config_file, overrides, base_dir=BASE_DIR[config_file.name])
        assert isinstance(result, Config)
        # what `check` and `check --explain` print must not fail either
        assert dump_config(result).encode("utf-8")
        assert explain_config(result)
        OUTCOMES["config"] = OUTCOMES.get("config", 0) + 1
    except ConfigError as exc:
        message = exc.message
        # the file and a line, or a message about the whole file; or the --set argument
        named = re.match(re.escape(str(config_file)) + WHERE, message)
        assert named or message.startswith("--set "), message
        OUTCOMES["ConfigError"] = OUTCOMES.get("ConfigError", 0) + 1
        assert "Traceback" not in message
        # the CLI prints it: it must be encodable, whatever bytes the input held
        assert (message + (exc.hint or "")).encode("utf-8")
    elapsed = time.perf_counter() - start
    if elapsed > SLOWEST.get("time", (0.0, ""))[0]:
        SLOWEST["time"] = (elapsed, f"{label}: {config_file.name} {overrides[:2]!r:.200}")


BASE_DIR: dict[str, Path] = {}


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fuzz")
    for base, _text in BASES:
        BASE_DIR[f"{base.parent.name}_{base.name}"] = base.parent
        # warm up: the first load of a plugin config imports MXNet (seconds, once)
        load_config(base)
    return folder


def _target(folder: Path, base: Path) -> Path:
    return folder / f"{base.parent.name}_{base.name}"


def _dump(tree: Any, snippets: list[str]) -> str:
    text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=False, width=10**6)
    for i, snippet in enumerate(snippets):
        text = text.replace(f"__RAW_{i}__", snippet)
    return text


@st.composite
def mutated_files(draw: st.DrawFn) -> tuple[Path, Any, list[str], list[str]]:
    base, _text = draw(st.sampled_from(BASES))
    tree, snippets, overrides = draw(tree_mutations(base))
    return base, tree, snippets, overrides


def _report(capsys: pytest.CaptureFixture[str], what: str) -> None:
    elapsed, example = SLOWEST.pop("time", (0.0, ""))
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(OUTCOMES.items()))
    OUTCOMES.clear()
    with capsys.disabled():
        print(f"\n{what}: {counts}; slowest example {elapsed:.3f}s ({example})")


def test_mutated_files_load_or_fail_cleanly(fuzz_dir: Path, capsys) -> None:
    @FUZZ
    @given(mutated_files())
    def check(case: tuple[Path, Any, list[str], list[str]]) -> None:
        base, tree, snippets, _overrides = case
        target = _target(fuzz_dir, base)
        target.write_text(_dump(tree, snippets), encoding="utf-8")
        _outcome(target, [], "file")

    check()
    _report(capsys, "mutated files")


def test_mutations_as_set_overrides_load_or_fail_cleanly(fuzz_dir: Path, capsys) -> None:
    raw_values = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=30)

    @FUZZ
    @given(mutated_files(), st.lists(st.tuples(st.sampled_from(KEY_NAMES), raw_values), max_size=2))
    def check(case: tuple[Path, Any, list[str], list[str]], raw: list[tuple[str, str]]) -> None:
        base, _tree, _snippets, overrides = case
        target = _target(fuzz_dir, base)
        target.write_text(dict(BASES)[base], encoding="utf-8")
        extra = [f"model.{key}={text}" for key, text in raw]
        _outcome(target, overrides + extra, "--set")

    check()
    _report(capsys, "--set overrides")


ENCODINGS = ["utf-16-le", "utf-16-be", "utf-16", "utf-32", "latin-1", "cp1252"]


@st.composite
def corrupted_bytes(draw: st.DrawFn) -> tuple[Path, bytes]:
    base, text = draw(st.sampled_from(BASES))
    data = text.encode("utf-8")
    kind = draw(st.sampled_from(["flip", "insert", "truncate", "encoding", "splice"]))
    if kind == "encoding":
        accented = text.replace("a", draw(st.sampled_from(["a", "é", "ß"])), 3)
        encoding = draw(st.sampled_from(ENCODINGS))
        return base, accented.encode(encoding, errors="replace")
    if kind == "truncate":
        return base, data[: draw(st.integers(0, len(data)))]
    if kind == "splice":
        where = draw(st.integers(0, len(data)))
        return base, data[:where] + draw(st.binary(max_size=40)) + data[where:]
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        where = draw(st.integers(0, len(out) - 1))
        byte = draw(st.integers(0, 255))
        if kind == "flip":
            out[where] = byte
        else:
            out.insert(where, byte)
    return base, bytes(out)


def test_corrupted_bytes_load_or_fail_cleanly(fuzz_dir: Path, capsys) -> None:
    @FUZZ
    @given(corrupted_bytes())
    def check(case: tuple[Path, bytes]) -> None:
        base, data = case
        target = _target(fuzz_dir, base)
        target.write_bytes(data)
        _outcome(target, [], "bytes")

    check()
    _report(capsys, "corrupted bytes")
