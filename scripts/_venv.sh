# Shared by quickstart.sh and test.sh: create .venv (Python 3.11) and install mxtrain into it.
# Usage: source scripts/_venv.sh [pip extras, e.g. "[test]"]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "error: mxtrain needs Python 3.11 (mxnet 1.9.1 wheels); found $("$PYTHON" --version 2>&1). Set PYTHON=/path/to/python3.11." >&2
  exit 2
fi
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  "$PYTHON" -m venv "$ROOT/.venv"
fi
"$ROOT/.venv/bin/python" -m pip install --quiet --upgrade pip
"$ROOT/.venv/bin/python" -m pip install --quiet -e "$ROOT${1:-}"
# Bytecode for mxtrain's own modules, which an editable install leaves uncompiled: where
# PYTHONDONTWRITEBYTECODE is set (CI machines), every process would compile what it imports.
"$ROOT/.venv/bin/python" -m compileall -q "$ROOT/mxtrain" "$ROOT/scripts"
