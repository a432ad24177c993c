"""What MXNet's import may leave out: scikit-learn, which only MXNet's legacy API would use.

MXNet 1.9.1's ``mxnet.model`` imports scikit-learn whenever it is installed, for nothing but
the base class of its legacy ``FeedForward`` estimator, which mxtrain never uses. With
scikit-learn come pandas and SciPy's statistics: where they are installed (MLflow brings
them) that is about 0.4 s of every mxtrain process's start, a seventh of MXNet's import. So
while ``mxnet.model`` is being imported, ``import sklearn`` fails as if the package were
absent (MXNet then falls back to ``object``); at any other time scikit-learn imports as usual.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

#: the module of MXNet that imports scikit-learn, and a name it defines only after doing so
_IMPORTER, _DEFINED_AFTER = "mxnet.model", "FeedForward"


def _importer_running() -> bool:
    """Whether ``mxnet.model`` has started executing and not yet reached ``FeedForward``."""
    module = sys.modules.get(_IMPORTER)
    return module is not None and not hasattr(module, _DEFINED_AFTER)


class _ScikitLearnOutOfMXNet(importlib.abc.MetaPathFinder):
    """Refuses ``sklearn`` to ``mxnet.model``'s own import, finds nothing otherwise."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname == "sklearn" and _importer_running():
            raise ImportError("scikit-learn is left out of MXNet's legacy FeedForward by mxtrain")
        return None


def keep_scikit_learn_out_of_mxnet() -> None:
    """Install the finder once, ahead of the others (a no-op once MXNet is imported)."""
    if "mxnet.model" in sys.modules:
        return
    if not any(isinstance(finder, _ScikitLearnOutOfMXNet) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ScikitLearnOutOfMXNet())
