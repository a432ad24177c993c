"""Parameter storage of the bucketing module: the arrays every bucket binds, their
initialization, copies in and out, and the globs that pick parameters by name.

The default bucket's executors own the parameters, gradients and auxiliary states; every
other bucket aliases them. This store keeps those arrays per name and device, and the CPU
staging copies that initialization fills (in MXNet's order, so seeded initializers reproduce
stock values).
"""

from __future__ import annotations

import ctypes
import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

import mxnet as mx

from mxtrain.run.params import ParamShapes, param_problems

__all__ = ["ParamPatternError", "ParameterStore", "resolve_fixed", "resolve_multipliers"]


class ParamPatternError(ValueError):
    """A glob over parameter names that cannot be applied: it matches no parameter, or a
    parameter matches two multiplier globs. ``option`` is the argument it came from
    (``fixed_param_patterns``, ``fixed_param_exclude``, ``lr_mult``, ``wd_mult``).

    Its own type so that callers can tell a bad pattern (a config key) from a model that does
    not fit its data (every other ValueError of construction and binding).
    """

    def __init__(self, message: str, *, option: str, pattern: str) -> None:
        super().__init__(message)
        self.option = option
        self.pattern = pattern  # the glob at fault


def _matches_nothing(names: Sequence[str], pattern: str, option: str) -> ParamPatternError:
    return ParamPatternError(
        f"pattern {pattern!r} matches no parameter; write one that matches some of "
        + ", ".join(names),
        option=option,
        pattern=pattern,
    )


def resolve_multipliers(
    names: Sequence[str], globs: Mapping[str, float], option: str
) -> dict[str, float]:
    """``{parameter: multiplier}`` for the parameters ``globs`` (fnmatch pattern ->
    multiplier) match. Every glob must match a parameter and no parameter two globs, so the
    result never depends on the order the globs were written in."""
    resolved: dict[str, float] = {}
    matched_by: dict[str, str] = {}
    for pattern, value in globs.items():
        hits = fnmatch.filter(names, pattern)
        if not hits:
            raise _matches_nothing(names, pattern, option)
        for name in hits:
            if name in matched_by:
                raise ParamPatternError(
                    f"parameter {name!r} matches both {matched_by[name]!r} and {pattern!r}; "
                    "make the patterns match disjoint parameters",
                    option=option,
                    pattern=pattern,
                )
            matched_by[name] = pattern
            resolved[name] = float(value)
    return resolved


def resolve_fixed(
    names: Sequence[str], patterns: Sequence[str], exclude: Sequence[str]
) -> list[str]:
    """The parameters to freeze: those a glob of ``patterns`` matches and none of ``exclude``
    (every glob must match some parameter)."""
    if isinstance(patterns, str) or isinstance(exclude, str):
        raise TypeError("fixed_param_patterns and fixed_param_exclude must be lists of globs")
    for kind, globs in (("fixed_param_patterns", patterns), ("fixed_param_exclude", exclude)):
        for pat in globs:
            if not fnmatch.filter(names, pat):
                raise _matches_nothing(names, pat, kind)
    return [
        n
        for n in names
        if any(fnmatch.fnmatchcase(n, p) for p in patterns)
        and not any(fnmatch.fnmatchcase(n, p) for p in exclude)
    ]


def _same_memory(a: Any, b: Any) -> bool:
    """Whether two NDArray handles hold the same memory (MXNDArrayGetData's pointer)."""
    pointers = []
    for array in (a, b):
        pointer = ctypes.c_void_p()
        mx.base.check_call(mx.base._LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
        pointers.append(pointer.value)
    return pointers[0] == pointers[1] and pointers[0] is not None


def _gather(arrays: list[Any]) -> Any:
    """One CPU copy of a parameter's per-device arrays: the first when all are equal (as
    under data parallelism: averaging n equal float32 values is not exact when n is not a
    power of two), else their mean (auxiliary states such as BatchNorm statistics)."""
    first = arrays[0].copyto(mx.cpu())
    if len(arrays) == 1:
        return first
    copies = [a.copyto(mx.cpu()) for a in arrays[1:]]
    if all(bool((c == first).min().asscalar()) for c in copies):
        return first
    total = first
    for c in copies:
        total = total + c
    return total / len(arrays)


class ParameterStore:
    """Parameters, gradients and auxiliary states by name, one array per device.

    ``names`` is the default bucket's parameter order (the optimizer's indices); ``fixed``
    the frozen ones (no gradient). The arrays are the default bucket's executors' own,
    collected at each bind.
    """

    def __init__(self, names: list[str], aux_names: list[str], fixed: list[str]) -> None:
        self.names = names
        self.aux_names = aux_names
        self.fixed = fixed
        self.fixed_set = frozenset(fixed)
        self.initialized = False
        self.clear()

    def clear(self) -> None:
        """Forget the arrays (a new bind collects them again)."""
        self.params: dict[str, list[Any]] = {}
        self.grads: dict[str, list[Any] | None] = {}
        self.sparse_grads: frozenset[str] = frozenset()
        self.auxs: dict[str, list[Any]] = {}
        self.arg_cpu: dict[str, Any] = {}
        self.aux_cpu: dict[str, Any] = {}

    def collect(self, execs: list[Any]) -> None:
        """Take the arrays of the default bucket's executors (one per device)."""
        missing = [p for p in self.names if p not in execs[0].arg_dict]
        if missing:
            raise ValueError(f"default bucket: parameters {missing} are not in the executor")
        self.params = {n: [e.arg_dict[n] for e in execs] for n in self.names}
        self.grads = {}
        for n in self.names:
            g = [e.grad_dict.get(n) for e in execs]
            # a fixed parameter may have a buffer (see fc_weights_gating_bias): never updated
            self.grads[n] = None if g[0] is None or n in self.fixed_set else g
        self.auxs = {n: [e.aux_dict[n] for e in execs] for n in self.aux_names}
        # row_sparse gradients (an Embedding's sparse_grad) are the one kind MXNet never
        # shares between executors: each bucket writes its own, read from the bucket that ran
        self.sparse_grads = frozenset(
            n for n, g in self.grads.items() if g is not None and g[0].stype == "row_sparse"
        )

    def bucket_grads(self, execs: list[Any], indices: Sequence[int]) -> list[list[Any] | None]:
        """The per-device gradients of the parameters at ``indices`` of :attr:`names` as
        the executors ``execs`` (a bucket's) write them: the shared arrays, and the bucket's
        own row_sparse ones."""
        grads = self.grad_arrays(indices)
        if not self.sparse_grads:
            return grads
        return [
            [e.grad_dict[self.names[i]] for e in execs] if self.names[i] in self.sparse_grads else g
            for i, g in zip(indices, grads, strict=True)
        ]

    def make_staging(self) -> None:
        """CPU staging copies, as MXNet's module keeps them: initialization fills these in
        sorted name order, which is what makes a seeded initializer reproduce stock values."""
        self.arg_cpu = {
            n: mx.nd.zeros(a[0].shape, ctx=mx.cpu(), dtype=a[0].dtype)
            for n, a in self.params.items()
        }
        self.aux_cpu = {
            n: mx.nd.zeros(a[0].shape, ctx=mx.cpu(), dtype=a[0].dtype) for n, a in self.auxs.items()
        }

    def shapes(self) -> ParamShapes:
        """(parameter shapes, auxiliary-state shapes) by name, as bound."""
        return (
            {n: tuple(a[0].shape) for n, a in self.params.items()},
            {n: tuple(a[0].shape) for n, a in self.auxs.items()},
        )

    def check_shared(self, other: ParameterStore) -> None:
        """Raise ``ValueError`` unless every parameter is ``other``'s very memory."""
        unshared = [
            name
            for name in self.names
            if name not in other.params
            or any(
                not _same_memory(mine, theirs)
                for mine, theirs in zip(self.params[name], other.params[name], strict=True)
            )
        ]
        if unshared or self.aux_names:
            raise ValueError(
                "shared_params: the modules' parameters differ "
                f"({', '.join(unshared + list(self.aux_names))}): they must have the same "
                "parameters, of the same shapes, and no auxiliary states"
            )

    def initialize(
        self,
        initializer: Any,
        arg_params: Mapping[str, Any] | None,
        aux_params: Mapping[str, Any] | None,
        *,
        allow_missing: bool,
        allow_extra: bool,
        attrs: Mapping[str, Any],
    ) -> None:
        """Copy from ``arg_params``/``aux_params``, else run ``initializer`` (``attrs``: the
        symbol's attributes by name), in sorted name order on the CPU copies; then write what
        was set to the devices."""
        if not allow_extra:
            extra = sorted(set(arg_params or {}) - set(self.names)) + sorted(
                set(aux_params or {}) - set(self.aux_names)
            )
            if extra:
                raise ValueError(f"parameters not in the network: {extra}")

        # a shape that differs is said in words here: MXNet's copyto says it in a C++ traceback
        mismatched = param_problems(
            self.shapes(),
            (arg_params or {}, aux_params or {}),
            source="the given values",
            allow_missing=True,
            allow_extra=True,
        )
        if mismatched:
            raise ValueError("; ".join(mismatched))

        def fill(name: str, arr: Any, given: Mapping[str, Any] | None) -> bool:
            """Set one staging array; False when it is left alone (missing, no initializer)."""
            if given is not None:
                if name in given:
                    if given[name] is not arr:
                        given[name].copyto(arr)
                    return True
                if not allow_missing:
                    raise RuntimeError(f"{name} is missing from the given parameters")
            if initializer is not None:
                initializer(mx.init.InitDesc(name, attrs.get(name, None)), arr)
                return True
            if given is None:
                raise ValueError("init_params needs an initializer or arg_params")
            return False

        # only what was set goes to the devices: a missing parameter keeps its current value
        # (the staging copy may be stale after training)
        args = {n: a for n, a in sorted(self.arg_cpu.items()) if fill(n, a, arg_params)}
        auxs = {n: a for n, a in sorted(self.aux_cpu.items()) if fill(n, a, aux_params)}
        self.write(args, auxs)
        self.initialized = True

    def write(self, arg: Mapping[str, Any], aux: Mapping[str, Any]) -> None:
        """Copy the given CPU values into every device's array (cast to its type)."""
        if aux:
            mx.nd.waitall()  # a pending BatchNorm backward would overwrite them (see get)
        for store, values in ((self.params, arg), (self.auxs, aux)):
            for name, src in values.items():
                for dst in store[name]:
                    (src if src.dtype == dst.dtype else src.astype(dst.dtype)).copyto(dst)

    def get(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Copies of the parameters on CPU: ``(arg_params, aux_params)`` (see :func:`_gather`)."""
        if self.aux_names:
            # MXNet 1.9.1's oneDNN BatchNorm updates its moving statistics in the backward
            # pass without declaring them as outputs of it (apache/mxnet#18610), so the engine
            # may let a copy read them before that backward has run: the values would be one
            # batch stale (seen as a rare checkpoint mismatch). Wait for all pending work.
            mx.nd.waitall()
        return (
            {n: _gather(self.params[n]) for n in self.names},
            {n: _gather(self.auxs[n]) for n in self.aux_names},
        )

    def grad_arrays(self, indices: Sequence[int]) -> list[list[Any] | None]:
        """The per-device gradients of the parameters at ``indices`` of :attr:`names`."""
        return [self.grads[self.names[i]] for i in indices]

    def zero_grads(self) -> None:
        """Set every parameter gradient to zero on every device."""
        for grads in self.grads.values():
            for grad in grads or ():
                grad[:] = 0
