#!/usr/bin/env bash
# Creates .venv, installs mxtrain with its test extras, then runs lint, types and the whole
# test suite. Extra arguments go to pytest, e.g. scripts/test.sh -k config
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/_venv.sh" "[test]"
cd "$ROOT"
# One OpenMP thread per MXNet process keeps the suite predictable on small CI machines.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo "== ruff"
.venv/bin/ruff check mxtrain tests scripts
.venv/bin/ruff format --check mxtrain tests scripts
echo "== mypy"
.venv/bin/mypy mxtrain
# Tests that check machine-wide state (listening ports, every ps-lite process) run alone
# first; the rest run in one process per usable core (nproc follows taskset), or
# MXTRAIN_TEST_WORKERS of them. pytest's exit 5 is "no test selected" (e.g. by -k).
WORKERS="${MXTRAIN_TEST_WORKERS:-$(nproc)}"
echo "== pytest: serial tests"
status=0
.venv/bin/python -m pytest -q -m serial "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
echo "== pytest: the rest, $WORKERS worker(s)"
.venv/bin/python -m pytest -q -n "$WORKERS" -m "not serial" "$@"
