"""MXNet's import under mxtrain leaves scikit-learn out, and only MXNet's import."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
{before}
import mxtrain
import mxnet
print(json.dumps({{"sklearn_after_mxnet": "sklearn" in sys.modules,
                  "base": mxnet.model.BASE_ESTIMATOR.__module__}}))
"""


def _probe(before: str = "") -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(before=before)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_mxnet_imports_without_scikit_learn() -> None:
    probe = _probe()
    assert probe == {"sklearn_after_mxnet": False, "base": "builtins"}


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="needs scikit-learn")
def test_scikit_learn_still_imports_after_and_before() -> None:
    # after MXNet: the user's own import works as usual
    probe = _probe()
    code = "import mxtrain, mxnet, sklearn.base; print(sklearn.base.BaseEstimator.__name__)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "BaseEstimator" and not probe["sklearn_after_mxnet"]
    # imported before mxtrain: MXNet finds it and nothing is refused
    assert _probe("import sklearn.base")["base"].startswith("sklearn")
