"""MXNet's error text in mxtrain's words: the one-line reason, never MXNet's traceback.

MXNet 1.9.1 raises ``MXNetError`` (a ``RuntimeError``) whose text is a C++ "traceback":
``Traceback (most recent call last):``, ``File "../src/...", line N`` frames (or, in other
builds, ``Stack trace:`` and ``[bt] (0) ...`` lines), a ``[hh:mm:ss] file:line:`` stamp and
``MXNetError: Check failed: <C++ expression>: <what went wrong>``. Every user message that
mentions an MXNet failure takes :func:`mxnet_reason` of it, which keeps only the last part.
No MXNet import here: this is text processing.
"""

from __future__ import annotations

import re

#: lines of MXNet's own traceback: frame headers, frames, stack-trace markers
_FRAME = re.compile(r'^(Traceback \(most recent call last\):|File "|Stack trace:|\[bt\] )')
#: the ``[12:34:56] ../src/ndarray/ndarray.cc:1854: `` stamp before a C++ check's message
_STAMP = re.compile(r"^\[\d{1,2}:\d{2}:\d{2}\]\s+\S+:\d+:\s*")
_OPERATOR = re.compile(r"Error in operator (\S+):\s*")


def mxnet_reason(exc: BaseException) -> str:
    """The one line an MXNet error says went wrong, without traceback, stamps or the C++
    expression: "operator pool2: kernel size (3) exceeds input (2 padded to 2)",
    "Invalid NDArray file format". Plain exceptions give their first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    lines = [line for line in lines if not _FRAME.match(line)]
    if not lines:
        return type(exc).__name__
    marked = [line for line in lines if line.startswith("MXNetError:") or "Check failed:" in line]
    line = marked[-1] if marked else lines[0]
    line = _STAMP.sub("", line.removeprefix("MXNetError:").strip())
    operator = _OPERATOR.search(line)
    if operator:
        line = line[operator.end() :]
    _, failed, check = line.partition("Check failed: ")
    if failed:
        # "<C++ expression>: <message>": the expression means nothing to a user
        line = check.partition(": ")[2] or check
    line = line.strip().rstrip(".") or type(exc).__name__
    return f"operator {operator.group(1)}: {line}" if operator else line


def exception_summary(exc: BaseException) -> str:
    """``TypeName: reason`` for a message about a failure in code that is not mxtrain's (a
    plugin, a callback): one line, MXNet's traceback left out."""
    return f"{type(exc).__name__}: {mxnet_reason(exc)}"
