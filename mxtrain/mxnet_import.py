"""What MXNet's import may skip or put off, so that every mxtrain process starts sooner.

MXNet 1.9.1's ``import mxnet`` pulls in packages that mxtrain never, or only rarely, needs:

- scikit-learn (``mxnet.model``: the base class of the legacy ``FeedForward`` estimator), and
  with it pandas and SciPy's statistics;
- setuptools: MXNet compares version strings with ``distutils.version``, and in an environment
  with setuptools (every venv's default) its ``distutils`` shim answers ``import distutils`` by
  importing all of setuptools and ``pkg_resources``;
- SciPy's statistics (``mxnet.test_utils``, and the entropy calibration of
  ``mxnet.contrib.quantization``), requests (``mxnet.gluon.utils.download``) and onnx (the
  ONNX export), which MXNet only uses inside functions none of which runs at start.

Where these are installed (MLflow brings most of them) they are a large share of MXNet's
import (docs/speed.md has the figure).
So while the ``mxnet`` package executes, and only then: ``import sklearn`` fails as if the
package were absent (MXNet then falls back to ``object``); ``distutils`` is the standard
library's own, taken out of ``sys.modules`` again afterwards; and SciPy's statistics,
requests and onnx are put off: their modules exist at once but execute on first use of one of
their attributes or submodules. Before or after MXNet's import, nothing differs from a plain
import. Nothing is done when MXNet was imported before mxtrain.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import sysconfig
import threading
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

#: modules MXNet imports at start but only uses in functions: executed on first use
PUT_OFF = frozenset({"scipy.stats", "requests", "onnx"})
#: what MXNet's import does without: ``import sklearn`` fails while it runs
LEFT_OUT = frozenset({"sklearn"})
#: loaders of Python code (an extension module would run when it is created)
_PYTHON_CODE = (importlib.machinery.SourceFileLoader, importlib.machinery.SourcelessFileLoader)
#: served from the standard library while MXNet imports, not from setuptools' shim
STANDARD_DISTUTILS = "distutils"


class _MXNetImport(importlib.abc.MetaPathFinder):
    """Wraps the ``mxnet`` package's loader; while that package executes, refuses
    :data:`LEFT_OUT`, puts off :data:`PUT_OFF` and serves the standard library's distutils."""

    def __init__(self) -> None:
        self.running = False
        self.distutils_served = False

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname == "mxnet" and not self.running:
            spec = self._others_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _WithinMXNetImport(self, spec.loader)
            return spec
        if not self.running:
            return None
        if fullname.partition(".")[0] in LEFT_OUT:
            raise ImportError(f"{fullname} is left out of MXNet's import by mxtrain")
        if fullname in PUT_OFF:
            spec = self._others_spec(fullname, path, target)
            if spec is not None and isinstance(spec.loader, _PYTHON_CODE):
                spec.loader = _PutOff(spec.loader)
            return spec
        if fullname == STANDARD_DISTUTILS:
            stdlib = sysconfig.get_paths()["stdlib"]
            spec = importlib.machinery.PathFinder.find_spec(fullname, [stdlib])
            self.distutils_served = spec is not None
            return spec
        return None

    def _others_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> ModuleSpec | None:
        """The spec the finders after this one give ``fullname``."""
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def finished(self) -> None:
        """MXNet's package has executed: later imports of distutils go the usual way (MXNet
        keeps the classes it took from it)."""
        self.running = False
        if self.distutils_served:
            self.distutils_served = False
            for name in [n for n in sys.modules if n.partition(".")[0] == STANDARD_DISTUTILS]:
                del sys.modules[name]


def _hand_back(module: ModuleType, loader: importlib.abc.Loader) -> None:
    """Make ``loader``, the one a wrapper stood in for, the module's and its spec's again."""
    module.__loader__ = loader
    if module.__spec__ is not None:
        module.__spec__.loader = loader


class _WithinMXNetImport(importlib.abc.Loader):
    """The ``mxnet`` package's own loader, run with :class:`_MXNetImport` in force."""

    def __init__(self, finder: _MXNetImport, loader: importlib.abc.Loader) -> None:
        self.finder, self.loader = finder, loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # the package keeps its own loader: nothing outlives the import but what it imported
        _hand_back(module, self.loader)
        self.finder.running = True
        try:
            self.loader.exec_module(module)
        finally:
            self.finder.finished()


class _PutOff(importlib.abc.Loader):
    """Creates the module as its own loader would, and executes it on first attribute use.

    A package's ``__path__`` is held back until then, so that importing one of its submodules
    first executes the package first, in the usual order."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        loader, lock, spec = self.loader, threading.RLock(), module.__spec__
        module.__dict__.pop("__path__", None)
        started: list[bool] = []

        def __getattr__(name: str) -> Any:  # PEP 562: called for names the module lacks
            # other threads wait here while the module executes, then find the name
            with lock:
                if not started:
                    started.append(True)
                    _hand_back(module, loader)
                    if spec is not None and spec.submodule_search_locations is not None:
                        module.__path__ = spec.submodule_search_locations
                    try:
                        loader.exec_module(module)
                    finally:
                        if module.__dict__.get("__getattr__") is __getattr__:
                            del module.__dict__["__getattr__"]
                elif module.__dict__.get("__getattr__") is __getattr__:
                    # the module's own code, while it executes, asks for what it lacks yet
                    raise AttributeError(
                        f"partially initialized module {module.__name__!r} has no attribute "
                        f"{name!r}"
                    )
            return getattr(module, name)

        module.__dict__["__getattr__"] = __getattr__


def lighten_mxnet_import() -> None:
    """Install the finder once, ahead of the others (a no-op once MXNet is imported)."""
    if "mxnet" in sys.modules:
        return
    if not any(isinstance(finder, _MXNetImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MXNetImport())
