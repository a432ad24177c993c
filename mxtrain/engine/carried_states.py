"""Recurrent state carried from one batch to the next (truncated backpropagation through
time): a begin-state input of the graph takes the previous batch's final-state output.

The inputs are neither parameters nor data: no gradient, not saved with the parameters.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import mxnet as mx

from mxtrain.engine.bucket_pool import Bucket

__all__ = ["CarriedStates"]


class CarriedStates:
    """``states`` (begin-state input name -> final-state output name) and, per input and
    device, the final state of the last forward (None: zeros).

    Truncated backpropagation through time carries state from one batch to the next
    (MXNet's modules take the input names as ``state_names`` and leave the copying to the
    caller). After each forward, every device's final states are kept on that device and
    become the next batch's begin states, whichever bucket it is. They start from zeros, and
    go back to zeros when a batch has ``reset_states`` set (an iterator's stream restarts),
    when its state shape differs (another batch size) and on :meth:`reset`.
    """

    def __init__(self, states: Mapping[str, str] | None, contexts: list[Any]) -> None:
        self.states = dict(states or {})
        self._contexts = contexts
        self.values: dict[str, list[Any]] = {}

    def __bool__(self) -> bool:
        return bool(self.states)

    @property
    def names(self) -> list[str]:
        """The begin-state inputs."""
        return list(self.states)

    def check(
        self,
        symbol: Any,
        args: Sequence[str],
        data_names: Sequence[str],
        label_names: Sequence[str],
    ) -> None:
        """Raise ``ValueError`` unless every state is an input and its final value an output
        of ``symbol``, and no state is also data or a label."""
        outputs = symbol.list_outputs()
        for name, output in self.states.items():
            if name not in args:
                raise ValueError(f"state {name!r} is not an argument of the symbol: {list(args)}")
            if name in data_names or name in label_names:
                raise ValueError(f"state {name!r} is also a data or label name")
            if output not in outputs:
                raise ValueError(
                    f"state {name!r}: its final value {output!r} is not an output of the "
                    f"symbol: {outputs}"
                )

    def load_into(self, bucket: Bucket, reset: bool) -> None:
        """Copy the kept final states into the bucket's begin-state inputs (zeros when there
        are none, on ``reset``, or when the shape changed)."""
        if reset:
            self.values = {}
        for name in self.states:
            kept = self.values.get(name)
            for k, ex in enumerate(bucket.execs):
                dst = ex.arg_dict[name]
                src = kept[k] if kept is not None else None
                if src is None or src.shape != dst.shape:
                    dst[:] = 0
                else:
                    src.copyto(dst)

    def keep_from(self, bucket: Bucket) -> None:
        """Keep each device's final states (queued copies: nothing waits)."""
        for name, output in self.states.items():
            index = bucket.output_names.index(output)
            kept = self.values.get(name)
            if kept is None:
                kept = self.values[name] = [None] * len(bucket.execs)
            for k, ex in enumerate(bucket.execs):
                out = ex.outputs[index]
                if kept[k] is None or kept[k].shape != out.shape:
                    kept[k] = out.copyto(out.context)
                else:
                    out.copyto(kept[k])

    def reset(self) -> None:
        """The next forward starts from zero states."""
        self.values = {}

    def get(self) -> dict[str, Any]:
        """CPU copies of the kept states, ``NAME@DEVICE`` -> array (empty after a reset)."""
        return {
            f"{name}@{k}": value.copyto(mx.cpu())
            for name, values in self.values.items()
            for k, value in enumerate(values)
            if value is not None
        }

    def set(self, arrays: Mapping[str, Any]) -> None:
        """Put back what :meth:`get` returned (same states and devices), or raise
        ``ValueError`` naming what does not fit."""
        kept: dict[str, list[Any]] = {}
        ndev = len(self._contexts)
        for key, value in arrays.items():
            name, _, device = key.rpartition("@")
            if name not in self.states or not device.isdigit() or int(device) >= ndev:
                raise ValueError(
                    f"recurrent state {key!r} does not fit this module (states "
                    f"{list(self.states)} on {ndev} device(s))"
                )
            values = kept.setdefault(name, [None] * ndev)
            values[int(device)] = value.copyto(self._contexts[int(device)])
        self.values = kept

    @contextmanager
    def separate(self) -> Iterator[None]:
        """Within the block, states start from zeros; the kept ones come back after it."""
        saved = self.values
        self.values = {}
        try:
            yield
        finally:
            self.values = saved
