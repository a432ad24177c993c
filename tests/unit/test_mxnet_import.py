"""MXNet's import under mxtrain leaves out scikit-learn and setuptools and puts off SciPy's
statistics, requests and onnx, during MXNet's import only; each still works when used."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mxtrain.mxnet_import import _PutOff

HAVE_SCIPY = importlib.util.find_spec("scipy") is not None
HAVE_REQUESTS = importlib.util.find_spec("requests") is not None
HAVE_ONNX = importlib.util.find_spec("onnx") is not None

PROBE = """
import json, sys
{before}
import mxtrain
import mxnet
seen = {{
    "sklearn": "sklearn" in sys.modules,
    "base": mxnet.model.BASE_ESTIMATOR.__module__,
    "setuptools": "setuptools" in sys.modules or "pkg_resources" in sys.modules,
    "distutils": "distutils" in sys.modules,
    "stats_ran": "scipy.stats._stats_py" in sys.modules,
    "requests_ran": "requests.models" in sys.modules,
    "onnx_ran": "onnx.helper" in sys.modules,
    "mxnet_loader": type(mxnet.__loader__).__name__,
    "mxnet_spec_loader": mxnet.__spec__.loader is mxnet.__loader__,
}}
{after}
print(json.dumps(seen))
"""

#: uses of what was put off, in the probe after MXNet's import
USE = """
import threading
stats = sys.modules.get("scipy.stats")
if stats is not None:
    got, barrier = [], threading.Barrier(8)
    def first_use():
        barrier.wait()
        got.append(stats.norm)
    threads = [threading.Thread(target=first_use) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    seen["norm_once"] = len(got) == 8 and all(g is got[0] for g in got)
    seen["cdf"] = float(mxnet.test_utils.ss.norm.cdf(0.0))
    from scipy.stats import entropy
    seen["entropy"] = callable(entropy)
    seen["stats_loader"] = type(stats.__loader__).__name__
if "requests" in sys.modules:
    seen["session"] = mxnet.gluon.utils.requests.Session.__name__
    import requests
    seen["version"] = isinstance(requests.__version__, str)
if "onnx" in sys.modules:
    # a submodule first: the package runs before it, as in a plain import
    from onnx.defs import onnx_opset_version
    seen["opset"] = onnx_opset_version() > 0 and "onnx.helper" in sys.modules
import distutils.version
seen["loose"] = distutils.version.LooseVersion("1.10") > distutils.version.LooseVersion("1.9")
"""


def _probe(before: str = "", after: str = "") -> dict:
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", PROBE.format(before=before, after=after)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_mxnet_imports_without_what_it_does_not_use_and_all_of_it_works_after() -> None:
    seen = _probe(after=USE)
    assert not seen["sklearn"] and seen["base"] == "builtins"
    # setuptools' shim answers `import distutils` with all of setuptools: not during MXNet's
    # import, and the standard library's distutils it took is gone from sys.modules after it
    assert not seen["setuptools"] and not seen["distutils"]
    assert seen["loose"]
    # the package keeps its own loader
    assert seen["mxnet_loader"] == "SourceFileLoader" and seen["mxnet_spec_loader"]
    if HAVE_SCIPY:
        assert not seen["stats_ran"]
        assert seen["norm_once"] and seen["cdf"] == 0.5 and seen["entropy"]
        assert seen["stats_loader"] == "SourceFileLoader"
    if HAVE_REQUESTS:
        assert not seen["requests_ran"]
        assert seen["session"] == "Session" and seen["version"]
    if HAVE_ONNX:
        assert not seen["onnx_ran"] and seen["opset"]


def test_what_was_imported_before_mxtrain_is_used_as_it_is() -> None:
    names = [
        name
        for name in ("scipy.stats", "requests", "sklearn.base")
        if importlib.util.find_spec(name.partition(".")[0]) is not None
    ]
    seen = _probe("import " + ", ".join(names) if names else "")
    if "sklearn.base" in names:
        assert seen["base"].startswith("sklearn")
    if "scipy.stats" in names:
        assert seen["stats_ran"]
    if "requests" in names:
        assert seen["requests_ran"]


def test_nothing_changes_when_mxnet_came_before_mxtrain() -> None:
    code = (
        "import sys, json, mxnet, mxtrain; print(json.dumps([type(f).__name__ for f in "
        "sys.meta_path]))"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "_MXNetImport" not in json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="needs scikit-learn")
def test_scikit_learn_imports_after_mxnet() -> None:
    code = "import mxtrain, mxnet, sklearn.base; print(sklearn.base.BaseEstimator.__name__)"
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "BaseEstimator"


def test_a_put_off_module_executes_once_on_first_use(tmp_path: Path) -> None:
    name, runs = "mxtrain_put_off_probe", tmp_path / "runs"
    (tmp_path / f"{name}.py").write_text(f"open({str(runs)!r}, 'a').write('x')\nVALUE = 3\n")
    spec = importlib.machinery.PathFinder.find_spec(name, [str(tmp_path)])
    assert spec is not None and spec.loader is not None
    real = spec.loader
    spec.loader = _PutOff(real)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        assert "VALUE" not in module.__dict__ and not runs.exists()
        threads = [threading.Thread(target=lambda: module.VALUE) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert module.VALUE == 3 and runs.read_text() == "x"
        assert module.__loader__ is real and "__getattr__" not in module.__dict__
        with pytest.raises(AttributeError, match="MISSING"):
            module.MISSING  # noqa: B018
    finally:
        sys.modules.pop(name, None)
