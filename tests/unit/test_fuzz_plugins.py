"""Plugin code that raises is reported as the plugin's (fuzz classes C12, C13).

Whatever a plugin raises (an Exception, SystemExit, any other BaseException but Ctrl-C),
while its file or module is imported, its options are checked, its factory is called or
mxtrain calls into what it built, the result is one PluginError (exit code 2) naming the
plugin (reference and file), what it was doing and the exception's one-line text.
"""

from __future__ import annotations

import itertools
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mxtrain.build import build_data_iter
from mxtrain.config import load_config
from mxtrain.config.schema import IteratorSection
from mxtrain.data.base import DataContext
from mxtrain.errors import ConfigError, DataError, ExitCode, PluginError
from mxtrain.registry import (
    CALLBACKS,
    ITERATORS,
    METRICS,
    MODELS,
    Registry,
    plugin_failures_named,
)

FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=60,
    suppress_health_check=list(HealthCheck),
)


class OddBaseException(BaseException):
    """Neither an Exception nor SystemExit: still the plugin's to answer for."""


# what a plugin may raise, written as Python source (the plugin file raises it)
RAISED = {
    "SystemExit(7)": SystemExit,
    "SystemExit('bye')": SystemExit,
    "TypeError('bad option')": TypeError,
    "KeyError('missing')": KeyError,
    "ValueError('')": ValueError,
    "RuntimeError('line one\\nline two')": RuntimeError,
    "GeneratorExit()": GeneratorExit,
    "StopIteration()": StopIteration,
    "OddBaseException('odd')": OddBaseException,
}
_names = itertools.count()


def plugin_file(folder: Path, body: str) -> Path:
    """A new plugin file (a new name each time: imported files are cached by path)."""
    path = folder / f"plug_{next(_names)}.py"
    path.write_text(
        "class OddBaseException(BaseException):\n    pass\n\n" + textwrap.dedent(body),
        encoding="utf-8",
    )
    return path


def assert_names_the_plugin(error: BaseException, path: Path, doing: str) -> None:
    assert isinstance(error, ConfigError), repr(error)
    assert error.exit_code == ExitCode.CONFIG
    text = str(error)
    assert "\n" not in text, text  # one paragraph
    assert f"{path.name}:" in text and str(path) in text, text
    assert f"failed while {doing}" in text, text


@pytest.mark.parametrize("raised", list(RAISED))
def test_an_import_that_raises_anything_but_ctrl_c_is_the_plugins(
    tmp_path: Path, raised: str
) -> None:
    path = plugin_file(tmp_path, f"raise {raised}\ndef f(context):\n    pass\n")
    with pytest.raises(PluginError) as caught:
        ITERATORS.get(f"{path.name}:f", base_dir=tmp_path)
    assert_names_the_plugin(caught.value, path, "its file was imported")
    assert f"{RAISED[raised].__name__}" in str(caught.value)
    # a failed import leaves nothing half-imported behind: the next try imports again
    assert not [m for m in sys.modules.values() if getattr(m, "__file__", None) == str(path)]


def test_ctrl_c_and_mxtrains_own_errors_raised_on_import_pass_unchanged(tmp_path: Path) -> None:
    path = plugin_file(tmp_path, "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        MODELS.get(f"{path.name}:f", base_dir=tmp_path)
    path = plugin_file(
        tmp_path, "from mxtrain.errors import DataError\nraise DataError('no data here')\n"
    )
    with pytest.raises(DataError, match="no data here"):
        MODELS.get(f"{path.name}:f", base_dir=tmp_path)


def test_a_module_plugin_that_exits_on_import_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "fuzzpkg_exits"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "hooks.py").write_text("raise SystemExit(7)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError) as caught:
        CALLBACKS.get("fuzzpkg_exits.hooks:Hook")
    text = str(caught.value)
    assert "callback 'fuzzpkg_exits.hooks:Hook' (plugin module fuzzpkg_exits.hooks)" in text
    assert "SystemExit: 7" in text and "\n" not in text


@pytest.mark.parametrize(
    "registry", [MODELS, ITERATORS, METRICS, CALLBACKS, Registry("weights loader")]
)
@pytest.mark.parametrize("raised", list(RAISED))
def test_every_plugin_kind_reports_its_own_failure_the_same_way(
    tmp_path: Path, registry: Registry, raised: str
) -> None:
    path = plugin_file(tmp_path, f"def f(*args, **kwargs):\n    raise {raised}\n")
    entry = registry.get(f"{path.name}:f", base_dir=tmp_path)
    with pytest.raises(PluginError) as caught, entry.calling("it was called", "here"):
        entry.load()()
    assert_names_the_plugin(caught.value, path, "it was called")
    text = str(caught.value)
    assert text.startswith(f"here: the {registry.kind} '{path.name}:f' (plugin file {path})")
    assert "line two" not in text  # the exception's first line only


def test_built_ins_keep_their_failures_as_internal_errors() -> None:
    entry = ITERATORS.get("bucket_sentence")
    with pytest.raises(ZeroDivisionError), entry.calling("it was called"):
        raise ZeroDivisionError("an mxtrain bug")


def test_a_plugin_iterator_passing_a_bad_option_on_is_named(tmp_path: Path) -> None:
    """C12's reproducer: a wrapper iterator gives the built-in options a misspelled key."""
    path = plugin_file(
        tmp_path,
        """
        from mxtrain.data.bucket_sentence_options import BucketSentenceOptions

        def lines(context, path, batch_size=4):
            return BucketSentenceOptions(source=path, batchsize=batch_size)
        """,
    )
    section = IteratorSection(name=f"{path.name}:lines", options={"path": "train.txt"})
    context = DataContext(role="train", seed=1, base_dir=tmp_path)
    with pytest.raises(PluginError) as caught:
        build_data_iter(section, context, tmp_path, "data.train")
    assert_names_the_plugin(caught.value, path, "creating the iterator")
    assert str(caught.value).startswith("data.train: the iterator")
    assert "TypeError" in str(caught.value) and "batchsize" in str(caught.value)


def test_a_plugin_options_class_that_raises_is_named_at_its_line(tmp_path: Path) -> None:
    path = plugin_file(
        tmp_path,
        """
        import dataclasses

        def model(options, data_info):
            pass

        @dataclasses.dataclass
        class Options:
            width: int = 3

            def __post_init__(self):
                raise SystemExit(3)

        model.Options = Options
        """,
    )
    config = tmp_path / "c.yaml"
    config.write_text(f"model: {{name: {path.name}:model, width: 4}}\ndata: {{train: {{}}}}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert_names_the_plugin(caught.value, path, "its options were checked")
    assert str(caught.value).startswith(f"{config}:1: model.name:")


def test_an_exception_raised_inside_plugin_code_at_run_time_is_named(tmp_path: Path) -> None:
    path = plugin_file(
        tmp_path,
        """
        class Batches:
            def next(self):
                return helper()

        def helper():
            raise SystemExit(9)

        def lines(context):
            return Batches()
        """,
    )
    batches = ITERATORS.get(f"{path.name}:lines", base_dir=tmp_path).load()(None)
    with pytest.raises(PluginError) as caught, plugin_failures_named():
        batches.next()
    text = str(caught.value)
    assert f"plugin code in {path} (iterator '{path.name}:lines')" in text
    assert "failed while running Batches.next (line 10 of" in text and "SystemExit: 9" in text
    # exceptions that do not come from plugin code, Ctrl-C and mxtrain's errors pass as they are
    for exc in (ZeroDivisionError("mxtrain bug"), KeyboardInterrupt(), DataError("bad row")):
        with pytest.raises(type(exc)), plugin_failures_named():
            raise exc


@FUZZ
@given(
    raised=st.sampled_from(list(RAISED)),
    phase=st.sampled_from(["import", "factory", "run time"]),
    message=st.text(max_size=80),
)
def test_whatever_a_plugin_raises_is_one_named_paragraph(
    tmp_path_factory: pytest.TempPathFactory, raised: str, phase: str, message: str
) -> None:
    """Property: any exception (type from RAISED, any text) at any phase is a PluginError
    of one paragraph that names the plugin file and the exception type."""
    folder = tmp_path_factory.mktemp("plug")
    kind = RAISED[raised].__name__
    statement = f"raise {kind}({message!r})"
    if phase == "import":
        body = f"{statement}\ndef f(context):\n    pass\n"
    else:
        body = "class It:\n    default_bucket_key = 1\n\n"
        body += f"    def next(self):\n        {statement}\n\n"
        body += "def f(context):\n"
        body += f"    {statement}\n" if phase == "factory" else "    return It()\n"
    path = plugin_file(folder, body)
    section = IteratorSection(name=f"{path.name}:f", options={})
    context = DataContext(role="train", seed=1, base_dir=folder)
    with pytest.raises(ConfigError) as caught, plugin_failures_named():
        build_data_iter(section, context, folder, "data.train").next()
    text = str(caught.value)
    assert caught.value.exit_code == ExitCode.CONFIG
    if phase == "factory" and kind == "ValueError":
        # the contract: a factory's ValueError refuses its options, reported at the section
        assert text.startswith("data.train: "), text
        return
    assert isinstance(caught.value, PluginError)
    assert "\n" not in text and str(path) in text and kind in text, text
